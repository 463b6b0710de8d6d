//! `qgate-lab run PLAN.toml`: scenarios as data. A plan file describes a network, timed changes,
//! workloads of the real components, variants to compare, a sweep, and figures; the runner
//! builds each (point, scheme, seed) run on the simulated network in virtual time, on every core
//! it is given, and writes `results.csv`, `summary.md` (with confidence intervals and p-values)
//! and SVG figures.

pub mod overrides;
pub mod report;
pub mod run;
pub mod spec;
pub(crate) mod workload;

use std::path::{Path, PathBuf};

use qgate_netsim::topology::LinkChange;

pub use spec::Plan;

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

/// What the command line changes.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Seeds per run (instead of the plan's).
    pub seeds: Option<u64>,
    /// Use `[plan.quick]`.
    pub quick: bool,
    /// `--set key=value` overrides, applied before the sweep point's and the scheme's.
    pub set: Vec<(String, toml::Value)>,
    /// Only these schemes (all when empty).
    pub schemes: Vec<String>,
    /// Only these points of each sweep, by position (all when `None`).
    pub points: Option<Vec<usize>>,
}

/// A sweep point: which sweep, its position in it, its x.
#[derive(Debug, Clone, PartialEq)]
pub struct At {
    /// The sweep's name.
    pub sweep: String,
    /// Position in the sweep.
    pub index: usize,
    /// The x value.
    pub x: f64,
}

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} = {}", self.sweep, self.x)
    }
}

/// One run to make.
#[derive(Debug, Clone)]
pub struct Variant {
    /// Scheme name.
    pub scheme: String,
    /// Sweep point, if the plan sweeps.
    pub point: Option<At>,
    /// Seed.
    pub seed: u64,
    /// The plan with every override applied.
    pub plan: Plan,
}

/// A sweep value's x: the number itself, or its position.
fn sweep_x(v: &toml::Value, i: usize) -> f64 {
    v.as_float()
        .or(v.as_integer().map(|i| i as f64))
        .unwrap_or(i as f64)
}

/// Whether a scheme, sweep or phase name can stand in CSV, tables, metric and file names.
fn valid_label(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 100
        && !n
            .chars()
            .any(|c| c.is_control() || matches!(c, ',' | '/' | '\\' | '|' | '"' | '@' | '`'))
}

/// A scheme's or sweep point's `set` changes one run, so it cannot reach keys that shape the
/// whole plan (its runs, seeds, figures or name): those would be silently ignored.
fn per_run_keys(set: &toml::Table) -> Result<(), String> {
    const WHOLE_PLAN: [&str; 3] = ["sweep", "schemes", "figures"];
    const WHOLE_PLAN_FIELDS: [&str; 4] = ["seeds", "name", "quick", "metrics"];
    for (key, value) in set {
        let mut parts = key.split('.');
        let first = parts.next().unwrap_or_default();
        let plan_fields: Vec<&str> = match (first, parts.next()) {
            ("plan", Some(field)) => vec![field],
            ("plan", None) => value
                .as_table()
                .map(|t| t.keys().map(String::as_str).collect())
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        if WHOLE_PLAN.contains(&first) || plan_fields.iter().any(|f| WHOLE_PLAN_FIELDS.contains(f))
        {
            return Err(format!(
                "'{key}' applies to the whole plan, not one run: set it in the plan or with --set"
            ));
        }
    }
    Ok(())
}

/// Whether a plan name is safe as a directory name under `results/`.
fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 100
        && !n.starts_with('.')
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Most seeds per (point, scheme).
pub const MAX_SEEDS: u64 = 10_000;
/// Longest simulated run, s (a day).
pub const MAX_DURATION_S: f64 = 86_400.0;
/// Most runs in one plan invocation (each holds its own copy of the plan until it runs).
pub const MAX_RUNS: u64 = 20_000;

/// The line an error is about: the first line from `from` on that holds a value the message
/// quotes (`"snik"`), else one that sets a key it quotes (`delay_ms =`, also the last part of a
/// dotted key). Messages quote names and values in '…', "…" or `…`.
fn find_line(text: &str, message: &str, from: usize) -> Option<usize> {
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

impl Variant {
    /// "scheme at sweep = x seed n", for progress and errors.
    pub fn label(&self) -> String {
        match &self.point {
            Some(p) => format!("{} at {p} seed {}", self.scheme, self.seed),
            None => format!("{} seed {}", self.scheme, self.seed),
        }
    }
}

/// A deserialisation message in words a plan's author reads: Rust's type names become kinds
/// of value (`expected usize` → `expected a whole number`, `struct LinkSpec` → `a table`).
fn plain(message: &str) -> String {
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
fn described(e: &toml::de::Error) -> String {
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
fn key_on_line(text: &str, line: usize) -> Option<&str> {
    let l = text.lines().nth(line.checked_sub(1)?)?.trim_start();
    if l.starts_with('[') || l.starts_with('#') {
        return None;
    }
    let (k, _) = l.split_once('=')?;
    let k = k.trim().trim_matches('"');
    (!k.is_empty() && !k.contains(' ')).then_some(k)
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
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
        loaded
            .check(&loaded.plan, "")
            .map_err(|m| loaded.error(m))?;
        Ok(loaded)
    }

    fn error(&self, message: String) -> PlanError {
        PlanError {
            file: self.file.display().to_string(),
            line: find_line(&self.text, &message, 1),
            message,
        }
    }

    /// Semantic checks the types cannot express; `context` prefixes messages.
    fn check(&self, p: &Plan, context: &str) -> Result<(), String> {
        let fail = |m: String| Err(format!("{context}{m}"));
        if !(p.plan.duration_s > 0.0 && p.plan.duration_s <= MAX_DURATION_S) {
            return fail(format!(
                "'plan.duration_s' must be a number of seconds in (0, {MAX_DURATION_S}]"
            ));
        }
        if p.plan.seeds == 0 || p.plan.seeds > MAX_SEEDS {
            return fail(format!("'plan.seeds' must be in 1..={MAX_SEEDS}"));
        }
        let hosts: Vec<&str> = p.topology.hosts.iter().map(|h| h.name.as_str()).collect();
        let links: Vec<&str> = p.topology.links.iter().map(|l| l.name.as_str()).collect();
        let host = |what: &str, h: &str| {
            if hosts.contains(&h) {
                Ok(())
            } else {
                Err(format!(
                    "'{what}' names host '{h}', which is not in topology.hosts"
                ))
            }
        };
        let link = |what: &str, l: &str| {
            if links.contains(&l) {
                Ok(())
            } else {
                Err(format!(
                    "'{what}' names link '{l}', which is not in topology.links"
                ))
            }
        };
        if !valid_name(&p.plan.name) {
            return fail(format!(
                "'plan.name' '{}' must be letters, digits, '.', '_' or '-' (it names the results \
                 directory), not starting with '.'",
                p.plan.name
            ));
        }
        for (i, h) in hosts.iter().enumerate() {
            if hosts[..i].contains(h) {
                return fail(format!("'topology.hosts.name' '{h}' is used twice"));
            }
        }
        let mut addrs = Vec::new();
        for (i, l) in p.topology.links.iter().enumerate() {
            if links[..i].contains(&l.name.as_str()) {
                return fail(format!("'topology.links.name' '{}' is used twice", l.name));
            }
            host("topology.links.a", &l.a).or_else(fail)?;
            host("topology.links.b", &l.b).or_else(fail)?;
            for d in [qgate_netsim::Direction::AtoB, qgate_netsim::Direction::BtoA] {
                l.params(d)
                    .map_err(|e| format!("{context}link '{}': {e}", l.name))?;
            }
            for a in [l.a_addr, l.b_addr].into_iter().flatten() {
                if addrs.contains(&a) {
                    return fail(format!("link '{}': address '{a}' is used twice", l.name));
                }
                addrs.push(a);
            }
        }
        for c in &p.timeline {
            if !(c.at_s.is_finite() && c.at_s >= 0.0) {
                return fail("'timeline.at_s' must be a time ≥ 0".into());
            }
            match &c.link {
                Some(l) => {
                    link("timeline.link", l).or_else(fail)?;
                    let mut probe = qgate_netsim::LinkParams::default();
                    for o in [Some(&c.set), c.a_to_b.as_ref(), c.b_to_a.as_ref()]
                        .into_iter()
                        .flatten()
                    {
                        o.apply(&mut probe).map_err(|e| {
                            format!("{context}timeline at {} s, link '{l}': {e}", c.at_s)
                        })?;
                    }
                }
                None if c.set != LinkChange::default()
                    || c.a_to_b.is_some()
                    || c.b_to_a.is_some() =>
                {
                    return fail(format!(
                        "timeline at {} s changes a link but names none ('link')",
                        c.at_s
                    ));
                }
                None => {}
            }
            if c.at_s > p.plan.duration_s {
                return fail(format!(
                    "timeline at {} s is after the run ends ('plan.duration_s' = {})",
                    c.at_s, p.plan.duration_s
                ));
            }
        }
        let mut names = Vec::new();
        // A host has one user-space TCP stack: two TCP+TLS amqp workloads cannot share one.
        let mut tcp_hosts: Vec<&str> = Vec::new();
        for w in &p.workloads {
            if let spec::Workload::Amqp(a) = w {
                if !a.transport.is_quic() {
                    for h in [Some(&a.broker), Some(&a.sender), a.receiver.as_ref()]
                        .into_iter()
                        .flatten()
                    {
                        if tcp_hosts.contains(&h.as_str()) {
                            return fail(format!(
                                "workload '{}': host '{h}' already runs another TCP+TLS amqp workload (one user-space TCP stack per host)",
                                a.name
                            ));
                        }
                        tcp_hosts.push(h);
                    }
                }
            }
        }
        for w in &p.workloads {
            if names.contains(&w.name()) {
                return fail(format!("'workloads.name' '{}' is used twice", w.name()));
            }
            if w.name().is_empty() || w.name().contains(['.', '@', ',']) {
                return fail(format!(
                    "'workloads.name' '{}' must be non-empty without '.', '@' or ','",
                    w.name()
                ));
            }
            names.push(w.name());
            if !(w.start_s() >= 0.0 && w.start_s() <= MAX_DURATION_S) {
                return fail(format!(
                    "workload '{}': 'start_s' must be in [0, {MAX_DURATION_S}]",
                    w.name()
                ));
            }
            let named = |m: String| format!("workload '{}': {m}", w.name());
            workload::check(
                w,
                p.plan.duration_s,
                &p.topology,
                &|what, h| host(what, h).map_err(named),
                &|what, l| link(what, l).map_err(named),
            )
            .or_else(fail)?;
            if let spec::Workload::Bulk(b) = w {
                // New sources reach the sink through their attach host only if it forwards.
                let forwards =
                    |h: &str| p.topology.hosts.iter().any(|x| x.name == h && x.forwarding);
                if let Some(a) = b
                    .attach
                    .as_deref()
                    .filter(|a| b.sources > 0 && *a != b.sink)
                {
                    if !forwards(a) {
                        return fail(format!(
                            "workload '{}': 'attach' host '{a}' must be a router (forwarding = true) to carry the new sources' traffic on to '{}'",
                            b.name, b.sink
                        ));
                    }
                }
            }
        }
        let labels = p
            .schemes
            .iter()
            .map(|s| ("schemes.name", &s.name))
            .chain(p.sweep.iter().map(|s| ("sweep.name", &s.name)))
            .chain(
                p.timeline
                    .iter()
                    .filter_map(|c| Some(("timeline.phase", c.phase.as_ref()?))),
            );
        for (what, n) in labels {
            if !valid_label(n) {
                return fail(format!(
                    "'{what}' '{n}' must be 1–100 characters without , / \\ | \" @ ` or control characters"
                ));
            }
        }
        for f in &p.figures {
            if let Some(file) = &f.file {
                if !valid_name(file) {
                    return fail(format!(
                        "'figures.file' '{file}' must be letters, digits, '.', '_' or '-'"
                    ));
                }
            }
        }
        let mut schemes = Vec::new();
        for s in &p.schemes {
            if schemes.contains(&s.name.as_str()) {
                return fail(format!("'schemes.name' '{}' is used twice", s.name));
            }
            schemes.push(s.name.as_str());
        }
        let mut sweeps = Vec::new();
        for s in &p.sweep {
            let usable = match (&s.key, s.points.is_empty()) {
                (Some(_), true) => !s.values.is_empty(),
                (None, false) => true,
                _ => false,
            };
            if !usable {
                let why = match (&s.key, s.points.is_empty()) {
                    (Some(_), true) => "its 'values' list is empty",
                    (Some(_), false) => "it has both 'key' and 'points': give one",
                    _ => "it has neither",
                };
                return fail(format!(
                    "sweep '{}' needs either 'key' and 'values', or 'points': {why}",
                    s.name
                ));
            }
            if sweeps.contains(&s.name.as_str()) {
                return fail(format!(
                    "'sweep.name' '{}' is used twice (name each sweep)",
                    s.name
                ));
            }
            // The sweep's `set` goes under each point's own keys; one key in both (or one
            // inside the other) would make the order of a merge decide.
            let overlaps = |a: &str, b: &str| {
                a == b || a.starts_with(&format!("{b}.")) || b.starts_with(&format!("{a}."))
            };
            let point_keys = s
                .key
                .iter()
                .cloned()
                .chain(s.points.iter().flat_map(|p| p.set.keys().cloned()));
            for k in point_keys {
                if let Some(o) = s.set.keys().find(|o| overlaps(o, &k)) {
                    return fail(format!(
                        "sweep '{}': its 'set' has '{o}' and its points set '{k}': give each key in one place",
                        s.name
                    ));
                }
            }
            sweeps.push(s.name.as_str());
            let xs: Vec<f64> = if s.points.is_empty() {
                s.values
                    .iter()
                    .enumerate()
                    .map(|(i, v)| sweep_x(v, i))
                    .collect()
            } else {
                s.points.iter().map(|p| p.x).collect()
            };
            for (i, x) in xs.iter().enumerate() {
                if !x.is_finite() || xs[..i].contains(x) {
                    return fail(format!(
                        "sweep '{}': x = {x} is not finite or used twice (each point needs its own x)",
                        s.name
                    ));
                }
            }
        }
        let q = &p.plan.quick;
        if let Some(bad) = q
            .sweeps
            .iter()
            .flatten()
            .find(|n| !sweeps.contains(&n.as_str()))
        {
            return fail(format!("'plan.quick.sweeps' names no sweep '{bad}'"));
        }
        let most = p
            .sweep
            .iter()
            .map(|s| s.values.len().max(s.points.len()))
            .max();
        if let Some(&bad) = q
            .sweep_points
            .iter()
            .flatten()
            .find(|&&i| most.is_none_or(|m| i >= m))
        {
            return fail(format!(
                "'plan.quick.sweep_points' has {bad}: no sweep has that many points"
            ));
        }
        for f in &p.figures {
            if let Some(sw) = &f.sweep {
                if !sweeps.contains(&sw.as_str()) {
                    return fail(format!("'figures.sweep' '{sw}' is not a sweep's name"));
                }
            }
            let prefix = f.metric.split('.').next().unwrap_or("");
            if !names.contains(&prefix) {
                return fail(format!(
                    "'figures.metric' '{}' must start with a workload name ({})",
                    f.metric,
                    names.join(", ")
                ));
            }
        }
        for m in &p.plan.metrics {
            let prefix = m.split('.').next().unwrap_or("");
            if !names.contains(&prefix) {
                return fail(format!(
                    "'plan.metrics' '{m}' must start with a workload name ({})",
                    names.join(", ")
                ));
            }
        }
        Ok(())
    }

    /// Scheme names in order (one called "base" when the plan has none).
    pub fn scheme_names(&self) -> Vec<String> {
        if self.plan.schemes.is_empty() {
            vec!["base".into()]
        } else {
            self.plan.schemes.iter().map(|s| s.name.clone()).collect()
        }
    }

    /// Every run: for each sweep point, each scheme, each seed.
    /// The plan with `[plan.quick]` (when asked) and the `--set` overrides applied: what the
    /// runs, the summary and the figures use (seeds, sweeps, schemes, figures, name included).
    pub fn overridden(&self, opts: &Options) -> Result<Loaded, PlanError> {
        let mut doc = self.doc.clone();
        let err = |m: String| self.error(m);
        if opts.quick {
            let q = &self.plan.plan.quick;
            if let Some(d) = q.duration_s {
                overrides::apply(&mut doc, "plan.duration_s", toml::Value::Float(d))
                    .map_err(|m| err(format!("plan.quick.duration_s: {m}")))?;
            }
            overrides::apply_table(&mut doc, &q.set)
                .map_err(|m| err(format!("plan.quick.set: {m}")))?;
        }
        // Each --set is tried as it is applied: an error is the command line's, not a line of
        // the file's.
        let cli = |m: String| PlanError {
            file: self.file.display().to_string(),
            line: None,
            message: m,
        };
        for (k, v) in &opts.set {
            overrides::apply(&mut doc, k, v.clone()).map_err(|m| cli(format!("--set {k}: {m}")))?;
            if let Err(e) = toml::Value::Table(doc.clone()).try_into::<Plan>() {
                return Err(cli(format!("--set {k}: {}", plain(e.message()))));
            }
        }
        let plan: Plan = toml::Value::Table(doc.clone())
            .try_into()
            .map_err(|e: toml::de::Error| err(format!("with the overrides: {}", described(&e))))?;
        self.check(&plan, "with the overrides: ").map_err(err)?;
        Ok(Loaded {
            file: self.file.clone(),
            text: self.text.clone(),
            doc,
            plan,
        })
    }

    /// Every run: for each sweep point, each scheme, each seed.
    pub fn variants(&self, opts: &Options) -> Result<Vec<Variant>, PlanError> {
        let eff = self.overridden(opts)?;
        let base = eff.doc.clone();
        let err = |m: String| self.error(m);
        let quick = &eff.plan.plan.quick;
        let seeds = opts.seeds.unwrap_or(if opts.quick {
            quick.seeds.unwrap_or(1)
        } else {
            eff.plan.plan.seeds
        });
        if seeds == 0 || seeds > MAX_SEEDS {
            return Err(err(format!(
                "seeds must be in 1..={MAX_SEEDS}, not {seeds}"
            )));
        }
        let mut points: Vec<(Option<At>, toml::Table)> = Vec::new();
        for s in &eff.plan.sweep {
            if opts.quick && quick.sweeps.as_ref().is_some_and(|k| !k.contains(&s.name)) {
                continue;
            }
            let keep = |i: usize| {
                (!opts.quick || quick.sweep_points.as_ref().is_none_or(|k| k.contains(&i)))
                    && opts.points.as_ref().is_none_or(|k| k.contains(&i))
            };
            let at = |index: usize, x: f64| At {
                sweep: s.name.clone(),
                index,
                x,
            };
            if let Some(key) = &s.key {
                for (i, v) in s.values.iter().enumerate().filter(|(i, _)| keep(*i)) {
                    let x = v
                        .as_float()
                        .or(v.as_integer().map(|i| i as f64))
                        .unwrap_or(i as f64);
                    let mut t = s.set.clone();
                    t.insert(key.clone(), v.clone());
                    points.push((Some(at(i, x)), t));
                }
            } else {
                for (i, p) in s.points.iter().enumerate().filter(|(i, _)| keep(*i)) {
                    let mut t = s.set.clone();
                    t.extend(p.set.clone());
                    points.push((Some(at(i, p.x)), t));
                }
            }
        }
        if eff.plan.sweep.is_empty() {
            points.push((None, toml::Table::new()));
        }
        let schemes: Vec<(String, toml::Table)> = if eff.plan.schemes.is_empty() {
            vec![("base".into(), toml::Table::new())]
        } else {
            eff.plan
                .schemes
                .iter()
                .map(|s| (s.name.clone(), s.set.clone()))
                .collect()
        };
        let known = eff.scheme_names();
        if let Some(bad) = opts.schemes.iter().find(|s| !known.contains(s)) {
            return Err(err(format!(
                "no scheme '{bad}' (the plan has: {})",
                known.join(", ")
            )));
        }
        let schemes: Vec<(String, toml::Table)> = schemes
            .into_iter()
            .filter(|(name, _)| opts.schemes.is_empty() || opts.schemes.contains(name))
            .collect();
        // A scheme's `set` is applied last and wins: a key every scheme sets cannot be varied
        // by a sweep or --set, which would silently change nothing.
        let overridden_by_all = |key: &str| {
            !eff.plan.schemes.is_empty()
                && schemes.iter().all(|(_, set)| {
                    set.keys().any(|k| {
                        key == k
                            || key
                                .strip_prefix(k.as_str())
                                .is_some_and(|r| r.starts_with('.'))
                    })
                })
        };
        for sw in &eff.plan.sweep {
            let keys = sw
                .key
                .iter()
                .chain(sw.set.keys())
                .chain(sw.points.iter().flat_map(|p| p.set.keys()));
            for k in keys {
                if overridden_by_all(k) {
                    return Err(err(format!(
                        "sweep '{}' sets '{k}', which every scheme sets too, and a scheme's value wins: the sweep would change nothing (vary it in the schemes, or drop it from them)",
                        sw.name
                    )));
                }
            }
        }
        for (k, _) in &opts.set {
            if overridden_by_all(k) {
                return Err(err(format!(
                    "--set {k}: every scheme sets '{k}' itself, and a scheme's value wins: the override would change nothing"
                )));
            }
        }
        let runs = points.len() as u64 * schemes.len() as u64 * seeds;
        if runs > MAX_RUNS {
            return Err(err(format!(
                "{runs} runs ({} point(s) × {} scheme(s) × {seeds} seed(s)): at most {MAX_RUNS}",
                points.len(),
                schemes.len()
            )));
        }
        let mut out = Vec::new();
        for (point, pset) in &points {
            for (scheme, sset) in &schemes {
                let with_set = if opts.set.is_empty() {
                    ""
                } else {
                    " (with --set)"
                };
                let at = match point {
                    Some(p) => format!("scheme '{scheme}' at {p}{with_set}: "),
                    None => format!("scheme '{scheme}'{with_set}: "),
                };
                per_run_keys(pset)
                    .and_then(|_| per_run_keys(sset))
                    .map_err(|m| err(format!("{at}{m}")))?;
                let mut doc = base.clone();
                overrides::apply_table(&mut doc, pset)
                    .and_then(|_| overrides::apply_table(&mut doc, sset))
                    .map_err(|m| err(format!("{at}{m}")))?;
                let plan: Plan = toml::Value::Table(doc)
                    .try_into()
                    .map_err(|e: toml::de::Error| err(format!("{at}{}", described(&e))))?;
                self.check(&plan, &at).map_err(err)?;
                for seed in 1..=seeds {
                    out.push(Variant {
                        scheme: scheme.clone(),
                        point: point.clone(),
                        seed,
                        plan: plan.clone(),
                    });
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAN: &str = r#"
[plan]
name = "t"
duration_s = 10
seeds = 2

[topology]
hosts = [{ name = "c" }, { name = "s" }]
[[topology.links]]
name = "l"
a = "c"
b = "s"
rate_mbps = 10
delay_ms = 5

[[workloads]]
kind = "downloads"
name = "dl"
client = "c"
server = "s"
bytes = 100000
runs = 3

[[schemes]]
name = "off"
[[schemes]]
name = "ewma"
set = { "workloads.dl.history" = "ewma" }

[sweep]
label = "delay (ms)"
key = "topology.links.l.delay_ms"
values = [5, 50]
"#;

    fn load(text: &str) -> Result<Loaded, PlanError> {
        Loaded::parse(text, Path::new("p.toml"))
    }

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
    fn a_sweep_or_set_of_a_key_every_scheme_sets_is_refused() {
        // Both schemes set the history: a sweep over it would change nothing.
        let plan = PLAN
            .replace(
                "name = \"off\"\n",
                "name = \"off\"\nset = { \"workloads.dl.history\" = \"off\" }\n",
            )
            .replace(
                "key = \"topology.links.l.delay_ms\"\nvalues = [5, 50]",
                "key = \"workloads.dl.history\"\nvalues = [\"off\", \"ewma\"]",
            );
        let e = load(&plan)
            .unwrap()
            .variants(&Options::default())
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("sweep 'sweep' sets 'workloads.dl.history', which every scheme sets too"),
            "{e}"
        );
        // A scheme setting a whole table covers the keys under it.
        let plan = PLAN.replace(
            "name = \"off\"\n",
            "name = \"off\"\nset = { \"topology.links.l\" = { name = \"l\", a = \"c\", b = \"s\", rate_mbps = 10 } }\n",
        ).replace("set = { \"workloads.dl.history\" = \"ewma\" }", "set = { \"workloads.dl.history\" = \"ewma\", \"topology.links.l.delay_ms\" = 5 }");
        let e = load(&plan)
            .unwrap()
            .variants(&Options::default())
            .unwrap_err();
        assert!(
            e.to_string().contains("sets 'topology.links.l.delay_ms'"),
            "{e}"
        );
        // --set of a key only one scheme sets is fine; of one both set, refused.
        let l = load(PLAN).unwrap();
        let set = |k: &str, v: toml::Value| Options {
            set: vec![(k.into(), v)],
            ..Default::default()
        };
        assert!(l
            .variants(&set("workloads.dl.history", "mean".into()))
            .is_ok());
        let plan = PLAN.replace(
            "name = \"off\"\n",
            "name = \"off\"\nset = { \"workloads.dl.history\" = \"off\" }\n",
        );
        let e = load(&plan)
            .unwrap()
            .variants(&set("workloads.dl.history", "mean".into()))
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("--set workloads.dl.history: every scheme sets"),
            "{e}"
        );
    }

    #[test]
    fn expands_points_schemes_and_seeds_with_overrides() {
        let l = load(PLAN).unwrap();
        let v = l.variants(&Options::default()).unwrap();
        assert_eq!(v.len(), 2 * 2 * 2);
        let last = v.last().unwrap();
        assert_eq!(last.scheme, "ewma");
        assert_eq!(last.seed, 2);
        assert_eq!(
            last.point,
            Some(At {
                sweep: "sweep".into(),
                index: 1,
                x: 50.0
            })
        );
        assert_eq!(last.plan.topology.links[0].both.delay_ms, Some(50.0));
        let spec::Workload::Downloads(d) = &last.plan.workloads[0] else {
            panic!()
        };
        assert_eq!(d.history, spec::HistoryMode::Ewma);
        let spec::Workload::Downloads(d) = &v[0].plan.workloads[0] else {
            panic!()
        };
        assert_eq!(d.history, spec::HistoryMode::Off);
        let q = l
            .variants(&Options {
                quick: true,
                seeds: None,
                set: vec![("plan.duration_s".into(), toml::Value::Float(3.0))],
                ..Default::default()
            })
            .unwrap();
        assert_eq!(q.len(), 2 * 2);
        assert_eq!(q[0].plan.plan.duration_s, 3.0);
    }

    #[test]
    fn a_sweep_set_applies_to_each_of_its_points_under_the_points_own() {
        let grid = PLAN.replace(
            "values = [5, 50]",
            "values = [5, 50]\nset = { \"topology.links.l.rate_mbps\" = 2 }",
        );
        let v = load(&grid).unwrap().variants(&Options::default()).unwrap();
        let link = |i: usize| &v[i].plan.topology.links[0].both;
        // The sweep's `set` reaches every point beside its own key.
        assert_eq!(
            (link(0).delay_ms, link(0).rate_mbps),
            (Some(5.0), Some(2.0))
        );
        let last = v.len() - 1;
        assert_eq!(
            (link(last).delay_ms, link(last).rate_mbps),
            (Some(50.0), Some(2.0))
        );
        let bad = PLAN.replace(
            "values = [5, 50]",
            "values = [5, 50]\nset = { \"plan.seeds\" = 3 }",
        );
        let e = load(&bad)
            .unwrap()
            .variants(&Options::default())
            .unwrap_err();
        assert!(e.to_string().contains("whole plan"), "{e}");
        let both = PLAN.replace(
            "values = [5, 50]",
            "values = [5, 50]\nset = { \"topology.links.l\" = { rate_mbps = 3 } }",
        );
        let e = load(&both).unwrap_err();
        assert!(e.to_string().contains("give each key in one place"), "{e}");
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

    #[test]
    fn check_catches_what_would_fail_mid_run() {
        let cases: &[(&str, &str, &str)] = &[
            ("name = \"t\"", "name = \"../x\"", "'plan.name'"),
            ("rate_mbps = 10", "rate_mbps = -1", "rate_mbps = -1"),
            ("rate_mbps = 10", "rate_mbps = 1e-9", "below 1 bit/s"),
            (
                "rate_mbps = 10",
                "rate_mbps = 10\nqueue = \"codle\"",
                "unknown discipline 'codle'",
            ),
            ("server = \"s\"", "server = \"c\"", "same host"),
            ("values = [5, 50]", "values = [5, 5]", "used twice"),
            ("duration_s = 10", "duration_s = 1e9", "'plan.duration_s'"),
            ("seeds = 2", "seeds = 1000000", "'plan.seeds'"),
            (
                "[[schemes]]\nname = \"off\"",
                "[[timeline]]\nat_s = 1\nset = { delay_ms = 1 }\n\n[[schemes]]\nname = \"off\"",
                "names none",
            ),
            (
                "[[schemes]]\nname = \"off\"",
                "[[timeline]]\nat_s = 99\nphase = \"late\"\n\n[[schemes]]\nname = \"off\"",
                "after the run ends",
            ),
        ];
        for (from, to, want) in cases {
            assert!(PLAN.contains(from), "{from}");
            let e = load(&PLAN.replacen(from, to, 1)).unwrap_err();
            assert!(e.message.contains(want), "{to}: {e}");
            assert!(
                e.line.is_some() || e.message.contains("names none"),
                "{to}: {e}"
            );
        }
        let runs = load(PLAN).unwrap().variants(&Options {
            seeds: Some(MAX_SEEDS),
            set: vec![(
                "sweep.values".into(),
                toml::Value::Array((0..10).map(toml::Value::Integer).collect()),
            )],
            ..Default::default()
        });
        assert!(runs.unwrap_err().message.contains("at most 20000"));
    }

    #[test]
    fn set_reaches_plan_level_keys() {
        let l = load(PLAN).unwrap();
        let opts = Options {
            set: vec![
                ("plan.seeds".into(), 1.into()),
                ("sweep.values".into(), toml::Value::Array(vec![7.into()])),
            ],
            ..Default::default()
        };
        let v = l.variants(&opts).unwrap();
        assert_eq!(v.len(), 2, "one point × two schemes × one seed");
        assert_eq!(v[0].point.as_ref().unwrap().x, 7.0);
        assert_eq!(l.overridden(&opts).unwrap().plan.plan.seeds, 1);
        let bad = Options {
            set: vec![("schemes.ewma.name".into(), "a,b".into())],
            ..Default::default()
        };
        assert!(l
            .variants(&bad)
            .unwrap_err()
            .message
            .contains("'schemes.name'"));
        // A scheme renamed with --set runs under its new name (the report reads the same list).
        let renamed = Options {
            set: vec![("schemes.ewma.name".into(), "avg".into())],
            ..Default::default()
        };
        let names: Vec<String> = l
            .variants(&renamed)
            .unwrap()
            .iter()
            .map(|v| v.scheme.clone())
            .collect();
        assert!(names.contains(&"avg".to_string()) && !names.contains(&"ewma".to_string()));
        // A scheme cannot change what shapes the whole plan: it would be ignored.
        for key in ["plan.seeds", "sweep.values", "figures"] {
            let l = load(&PLAN.replacen(
                "set = { \"workloads.dl.history\" = \"ewma\" }",
                &format!("set = {{ \"{key}\" = 3 }}"),
                1,
            ))
            .unwrap();
            let e = l.variants(&Options::default()).unwrap_err();
            assert!(
                e.message.contains("applies to the whole plan"),
                "{key}: {e}"
            );
        }
    }

    #[test]
    fn amqp_workloads_are_checked_before_anything_runs() {
        let amqp = |extra: &str| {
            PLAN.replace(
                "kind = \"downloads\"\nname = \"dl\"\nclient = \"c\"\nserver = \"s\"\nbytes = 100000\nruns = 3",
                &format!("kind = \"amqp\"\nname = \"dl\"\nbroker = \"s\"\nsender = \"c\"\nmessages = 5\n{extra}"),
            )
            .replace("set = { \"workloads.dl.history\" = \"ewma\" }", "set = { \"workloads.dl.transport\" = \"tcp-tls13\" }")
        };
        let l = load(&amqp("")).unwrap();
        assert_eq!(l.variants(&Options::default()).unwrap().len(), 8);
        for (extra, want) in [
            ("receiver = \"s\"", "must be different hosts"),
            ("receiver = \"x\"", "'x'"),
            ("body_bytes = 0", "'body_bytes'"),
            ("timeout_s = -1", "'timeout_s'"),
            ("radio = { volts = -3 }", "'radio'"),
            ("transport = \"udp\"", "unknown variant"),
            ("ack_eliciting_threshold = 1001", "at most 1000"),
        ] {
            let e = load(&amqp(extra))
                .and_then(|l| l.variants(&Options::default()).map(|_| ()))
                .unwrap_err();
            assert!(e.message.contains(want), "{extra}: {e}");
        }
        // A client the broker cannot be reached from (x's only link goes to c, which does
        // not forward).
        let island = amqp("receiver = \"x\"")
            .replace(
                "hosts = [{ name = \"c\" }, { name = \"s\" }]",
                "hosts = [{ name = \"c\" }, { name = \"s\" }, { name = \"x\" }]",
            )
            .replace(
                "[[workloads]]",
                "[[topology.links]]\nname = \"xc\"\na = \"x\"\nb = \"c\"\n\n[[workloads]]",
            );
        let e = load(&island).unwrap_err();
        assert!(e.message.contains("no path from 'x'"), "{e}");
        // Two TCP+TLS workloads cannot share a host's user-space TCP stack.
        let twice = amqp("").replace(
            "[[schemes]]",
            "[[workloads]]\nkind = \"amqp\"\nname = \"dl2\"\nbroker = \"s\"\nsender = \"c\"\nmessages = 1\ntransport = \"tcp-tls12\"\n\n[[schemes]]",
        );
        let e = load(&twice)
            .and_then(|l| l.variants(&Options::default()).map(|_| ()))
            .unwrap_err();
        assert!(e.message.contains("one user-space TCP stack"), "{e}");
        // Path-MTU discovery is a QUIC setting: the TCP scheme refuses it.
        let e = load(&amqp("mtu_discovery = false"))
            .and_then(|l| l.variants(&Options::default()).map(|_| ()))
            .unwrap_err();
        assert!(e.message.contains("'mtu_discovery'"), "{e}");
        // So is the connection history.
        let e = load(&amqp("history = true"))
            .and_then(|l| l.variants(&Options::default()).map(|_| ()))
            .unwrap_err();
        assert!(e.message.contains("'history'"), "{e}");
        // So is the ACK frequency asked of the peer.
        let e = load(&amqp("ack_eliciting_threshold = 10"))
            .and_then(|l| l.variants(&Options::default()).map(|_| ()))
            .unwrap_err();
        assert!(e.message.contains("'ack_eliciting_threshold'"), "{e}");
    }

    #[test]
    fn the_readme_example_plan_is_valid_as_written_and_quick() {
        let readme = include_str!("../../../../README.md");
        let from = readme.find("## Plan files").expect("the section");
        let block = readme[from..]
            .split("```toml\n")
            .nth(1)
            .and_then(|b| b.split("```").next())
            .expect("a complete example");
        let l = load(block).unwrap();
        for quick in [false, true] {
            let v = l
                .variants(&Options {
                    quick,
                    ..Default::default()
                })
                .unwrap_or_else(|e| panic!("quick = {quick}: {e}"));
            assert!(!v.is_empty());
        }
        // A backhaul path must join the gateway and the server.
        let stray = block
            .replace("paths = [\"p1\", \"p2\"]", "paths = [\"p1\", \"p3\"]")
            .replacen(
                "[[timeline]]",
                "[[topology.links]]\nname = \"p3\"\na = \"gateway\"\nb = \"router\"\n\n[[timeline]]",
                1,
            );
        let e = load(&stray).unwrap_err();
        assert!(e.message.contains("path 'p3' joins"), "{e}");
    }
}
