//! Every `tokio::select!` in the workspace's sources is `biased;` (decision U12). An unbiased
//! one picks among branches ready at the same instant with tokio's own generator, which no
//! seed reaches, so a simulated run could come out differently for the same plan and seed
//! (it did: a taken-over upload chunk's request against its cancel). Tests are exempt.

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_select_in_the_sources_is_biased() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for c in std::fs::read_dir(&crates).unwrap().flatten() {
        let src = c.path().join("src");
        if src.is_dir() {
            sources(&src, &mut files);
        }
    }
    assert!(files.len() > 50, "found only {} source files", files.len());
    let mut unbiased = Vec::new();
    let mut seen = 0;
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if !l.contains("select! {") || l.trim_start().starts_with("//") {
                continue;
            }
            seen += 1;
            // `biased;` comes first, after any comment lines.
            let first = lines[i + 1..]
                .iter()
                .map(|l| l.trim())
                .find(|l| !l.starts_with("//"));
            if first != Some("biased;") {
                unbiased.push(format!("{}:{}", f.display(), i + 1));
            }
        }
    }
    assert!(seen > 10, "found only {seen} select!s: is the scan broken?");
    assert!(unbiased.is_empty(), "unbiased select!: {unbiased:#?}");
}
