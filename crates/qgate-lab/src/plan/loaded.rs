//! A plan file as read and checked: its text (hashed for provenance, searched for error lines),
//! its TOML document (what overrides change) and its parsed form.

use std::path::{Path, PathBuf};

use super::check::check;
use super::error::{find_line, key_on_line, line_of, plain, PlanError};
use super::spec::Plan;

/// A plan file as read: its text, its document (for overrides) and its parsed form.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// Where it came from.
    pub file: PathBuf,
    /// Its text (hashed for provenance).
    pub text: String,
    /// The document overrides are applied to.
    pub doc: toml::Table,
    /// As parsed, before any override.
    pub plan: Plan,
}

impl Loaded {
    /// Read and check a plan file.
    pub fn read(path: &Path) -> Result<Loaded, PlanError> {
        let text = std::fs::read_to_string(path).map_err(|e| PlanError {
            file: path.display().to_string(),
            line: None,
            message: format!("cannot read: {e}"),
        })?;
        Loaded::parse(&text, path)
    }

    /// Check a plan's text; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Loaded, PlanError> {
        let file = path.display().to_string();
        let fail = |e: toml::de::Error| {
            let at = e.span().map(|s| line_of(text, s.start));
            // Errors inside a table are reported at the table; point at the key or value the
            // message names, from there on.
            let line = at.map(|from| find_line(text, e.message(), from).unwrap_or(from));
            // Name the key the value is at, unless the message does already.
            let mut message = plain(e.message());
            if let Some(k) = line.and_then(|l| key_on_line(text, l)) {
                if !message.contains(&format!("`{k}`")) && !message.contains(&format!("'{k}'")) {
                    message = format!("'{k}': {message}");
                }
            }
            PlanError {
                file: file.clone(),
                line,
                message,
            }
        };
        let doc: toml::Table = toml::from_str(text).map_err(fail)?;
        let plan: Plan = toml::from_str(text).map_err(fail)?;
        let loaded = Loaded {
            file: path.to_path_buf(),
            text: text.to_string(),
            doc,
            plan,
        };
        check(&loaded.plan, "").map_err(|m| loaded.error(m))?;
        Ok(loaded)
    }

    pub(super) fn error(&self, message: String) -> PlanError {
        PlanError {
            file: self.file.display().to_string(),
            line: find_line(&self.text, &message, 1),
            message,
        }
    }

    /// Scheme names in order (one called "base" when the plan has none).
    pub fn scheme_names(&self) -> Vec<String> {
        if self.plan.schemes.is_empty() {
            vec!["base".into()]
        } else {
            self.plan.schemes.iter().map(|s| s.name.clone()).collect()
        }
    }
}
