//! A plan's errors as its author reads them: the file, the line the problem is on and the key,
//! in words (toml points at the enclosing table and names Rust types).

/// A plan that cannot be used; the message names the file, and the line and key when known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}{}: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct PlanError {
    /// The plan file.
    pub file: String,
    /// The line, when the problem has one.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

/// The line an error is about: the first line from `from` on that holds a value the message
/// quotes (`"snik"`), else one that sets a key it quotes (`delay_ms =`, also the last part of a
/// dotted key). Messages quote names and values in '…', "…" or `…`.
pub(super) fn find_line(text: &str, message: &str, from: usize) -> Option<usize> {
    let mut quoted = Vec::new();
    for q in ['\'', '"', '`'] {
        quoted.extend(
            message
                .split(q)
                .skip(1)
                .step_by(2)
                .filter(|s| !s.is_empty()),
        );
    }
    let lines: Vec<&str> = text.lines().collect();
    let search = |pred: &dyn Fn(&str) -> bool| {
        (from.max(1) - 1..lines.len())
            .chain(0..from.max(1) - 1)
            .find(|&i| pred(lines[i].trim_start()))
            .map(|i| i + 1)
    };
    for q in &quoted {
        let value = format!("\"{q}\"");
        if let Some(l) = search(&|l: &str| !l.starts_with('#') && l.contains(&value)) {
            return Some(l);
        }
    }
    // A bare value the message quotes (`30.5`), as a key's value.
    for q in &quoted {
        let bare = format!("= {q}");
        if let Some(l) = search(&|l: &str| {
            !l.starts_with('#')
                && l.split_once(&bare)
                    .is_some_and(|(_, r)| r.is_empty() || r.starts_with([' ', ',', '}']))
        }) {
            return Some(l);
        }
    }
    for q in &quoted {
        let leaf = q.rsplit('.').next().unwrap_or(q);
        let set = |l: &str| {
            l.strip_prefix(leaf)
                .is_some_and(|r| r.trim_start().starts_with('='))
                || l.contains(&format!(" {leaf} ="))
                || l.contains(&format!("{{{leaf} ="))
                || l.contains(&format!("\"{q}\" ="))
                || l.starts_with(&format!("[{q}]"))
                || l.starts_with(&format!("[[{q}]]"))
        };
        if let Some(l) = search(&set) {
            return Some(l);
        }
    }
    None
}

/// A deserialisation message in words a plan's author reads: Rust's type names become kinds
/// of value (`expected usize` → `expected a whole number`, `struct LinkSpec` → `a table`).
pub(super) fn plain(message: &str) -> String {
    let mut m = message.to_string();
    for (rust, words) in [
        ("usize", "a whole number"),
        ("u64", "a whole number"),
        ("u32", "a whole number"),
        ("u16", "a whole number"),
        ("u8", "a whole number"),
        ("i64", "an integer"),
        ("i32", "an integer"),
        ("f64", "a number"),
        ("f32", "a number"),
    ] {
        m = m.replace(&format!("expected {rust}"), &format!("expected {words}"));
    }
    while let Some(i) = m.find("expected struct ") {
        let name = i + "expected struct ".len();
        let end = m[name..]
            .find(|c: char| !c.is_ascii_alphanumeric())
            .map_or(m.len(), |j| name + j);
        m.replace_range(i..end, "expected a table");
    }
    m
}

/// [`plain`], led by the key toml says the error is at (it does when the document it read was
/// built, not parsed: the plan with its overrides), when that says more than a top-level table
/// (toml's path stops at an array such as `workloads`).
pub(super) fn described(e: &toml::de::Error) -> String {
    let m = plain(e.message());
    let shown = e.to_string();
    match shown
        .lines()
        .find_map(|l| l.strip_prefix("in `").and_then(|k| k.strip_suffix('`')))
    {
        Some(keys) if keys.contains('.') => format!("'{keys}': {m}"),
        _ => m,
    }
}

/// The key a `key = value` line sets, if line `line` (1-based) is one.
pub(super) fn key_on_line(text: &str, line: usize) -> Option<&str> {
    let l = text.lines().nth(line.checked_sub(1)?)?.trim_start();
    if l.starts_with('[') || l.starts_with('#') {
        return None;
    }
    let (k, _) = l.split_once('=')?;
    let k = k.trim().trim_matches('"');
    (!k.is_empty() && !k.contains(' ')).then_some(k)
}

pub(super) fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

#[cfg(test)]
mod tests {
    use crate::plan::testing::{load, PLAN};
    use crate::plan::Options;

    #[test]
    fn a_value_of_the_wrong_type_names_its_key_and_line_in_plain_words() {
        let e = load(&PLAN.replace("runs = 3", "runs = \"three\"")).unwrap_err();
        assert_eq!(e.line, Some(22), "{e}");
        assert!(
            e.message
                .starts_with("'runs': invalid type: string \"three\", expected a whole number"),
            "{e}"
        );
        // A float where a whole number goes: toml points at the table; the value's line is found.
        let e = load(&PLAN.replace("bytes = 100000", "bytes = 1.5")).unwrap_err();
        assert_eq!(e.line, Some(21), "{e}");
        assert!(
            e.message.starts_with(
                "'bytes': invalid type: floating point `1.5`, expected a whole number"
            ),
            "{e}"
        );
        // --set: the command line's error, no line of the file.
        let o = Options {
            set: vec![("workloads.dl.runs".into(), toml::Value::Integer(-1))],
            ..Default::default()
        };
        let e = load(PLAN).unwrap().variants(&o).unwrap_err();
        assert_eq!(e.line, None);
        assert!(
            e.message.starts_with(
                "--set workloads.dl.runs: invalid value: integer `-1`, expected a whole number"
            ),
            "{e}"
        );
    }

    #[test]
    fn errors_name_file_line_and_key() {
        let e = load(&PLAN.replace("delay_ms = 5", "dealy_ms = 5")).unwrap_err();
        assert_eq!(e.file, "p.toml");
        assert_eq!(e.line, Some(14), "{e}");
        assert!(e.message.contains("dealy_ms"), "{e}");

        let e = load(&PLAN.replace("b = \"s\"", "b = \"x\"")).unwrap_err();
        assert!(
            e.message.contains("link 'x'") || e.message.contains("host"),
            "{e}"
        );

        let e = load(&PLAN.replace("client = \"c\"", "client = \"nobody\"")).unwrap_err();
        assert!(e.to_string().starts_with("p.toml:"), "{e}");
        assert!(e.message.contains("'nobody'"), "{e}");

        let e = load(&PLAN.replace(
            "\"workloads.dl.history\" = \"ewma\"",
            "\"workloads.dl.history\" = \"fast\"",
        ))
        .unwrap()
        .variants(&Options::default())
        .unwrap_err();
        assert!(e.message.starts_with("scheme 'ewma' at sweep = 5: "), "{e}");
        assert!(e.message.contains("fast"), "{e}");

        let e = load(&PLAN.replace("workloads.dl.history", "workloads.dlx.history"))
            .unwrap()
            .variants(&Options::default())
            .unwrap_err();
        assert!(e.message.contains("dlx"), "{e}");
    }
}
