//! The checks a plan gets beyond its types, as read and again with every override applied
//! (names that exist and are unique, limits, sweeps and figures that fit together): what would
//! otherwise fail half-way through a run fails before the first.

use qgate_netsim::topology::LinkChange;

use super::spec::{self, Plan};
use super::workload;

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

/// Semantic checks the types cannot express; `context` prefixes messages.
pub(super) fn check(p: &Plan, context: &str) -> Result<(), String> {
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
            None if c.set != LinkChange::default() || c.a_to_b.is_some() || c.b_to_a.is_some() => {
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
            let forwards = |h: &str| p.topology.hosts.iter().any(|x| x.name == h && x.forwarding);
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

#[cfg(test)]
mod tests {
    use crate::plan::testing::{load, PLAN};
    use crate::plan::{Options, MAX_SEEDS};

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
    fn the_book_example_plan_is_valid_as_written_and_quick() {
        let chapter = include_str!("../../../../docs/book/src/lab/plans.md");
        let from = chapter.find("## A complete example").expect("the section");
        let block = chapter[from..]
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
