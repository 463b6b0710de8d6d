//! Every `tokio::select!` in the workspace's sources is `biased;` (decision U12). An unbiased
//! one picks among branches ready at the same instant with tokio's own generator, which no
//! seed reaches, so a simulated run could come out differently for the same plan and seed
//! (it did: a taken-over upload chunk's request against its cancel). Code under `tests/` is
//! exempt; `#[cfg(test)]` modules in `src` are not.

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
        for (at, _) in text.match_indices("select!") {
            let line = text[..at].matches('\n').count() + 1;
            let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
            if text[start..at].trim_start().starts_with("//") {
                continue;
            }
            // The macro's opening delimiter, then `biased;` before anything but comments.
            let rest = text[at + "select!".len()..].trim_start();
            let Some(body) = rest.strip_prefix('{').or_else(|| rest.strip_prefix('(')) else {
                continue;
            };
            seen += 1;
            let mut body = body.trim_start();
            while body.starts_with("//") {
                body = body[body.find('\n').unwrap_or(body.len())..].trim_start();
            }
            if !body.starts_with("biased;") {
                unbiased.push(format!("{}:{line}", f.display()));
            }
        }
    }
    assert!(seen > 10, "found only {seen} select!s: is the scan broken?");
    assert!(unbiased.is_empty(), "unbiased select!: {unbiased:#?}");
}
