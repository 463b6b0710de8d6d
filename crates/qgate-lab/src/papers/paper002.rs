//! `qgate-lab history`: paper 002's experiments, run from the shipped plans
//! `lab/plans/paper002-history.toml` (simple topology), `paper002-dumbbell.toml` (competing
//! flows), `paper002-change.toml` (good → bad, beyond the paper) and `paper002-congested.toml`
//! (loss from competing flows, not from a coin: issue 16 item 3), with the paper's claims held
//! against the same runs. The paper's unit is the download, so its comparisons pool the
//! downloads of every seed (Welch's test over them); the plan tables compare per-seed means.

use std::fmt::Write as _;
use std::path::Path;

use crate::plan::run::Record;
use crate::plan::{Loaded, PlanError};
use crate::stats::{Summary, Welch};

/// The simple-topology plan.
pub const PLAN: &str = include_str!("../../../../lab/plans/paper002-history.toml");
/// The dumbbell plan.
pub const DUMBBELL_PLAN: &str = include_str!("../../../../lab/plans/paper002-dumbbell.toml");
/// The good → bad plan.
pub const CHANGE_PLAN: &str = include_str!("../../../../lab/plans/paper002-change.toml");
/// The congested-bottleneck plan.
pub const CONGESTED_PLAN: &str = include_str!("../../../../lab/plans/paper002-congested.toml");

/// The four plans, parsed, with the directory each writes below `results/history`.
pub fn plans() -> Result<Vec<(Loaded, &'static str)>, PlanError> {
    Ok(vec![
        (
            Loaded::parse(PLAN, Path::new("lab/plans/paper002-history.toml"))?,
            "",
        ),
        (
            Loaded::parse(DUMBBELL_PLAN, Path::new("lab/plans/paper002-dumbbell.toml"))?,
            "dumbbell",
        ),
        (
            Loaded::parse(CHANGE_PLAN, Path::new("lab/plans/paper002-change.toml"))?,
            "change",
        ),
        (
            Loaded::parse(
                CONGESTED_PLAN,
                Path::new("lab/plans/paper002-congested.toml"),
            )?,
            "congested",
        ),
    ])
}

/// Every download's value of sample `metric` at (sweep, point index) for `scheme`, all seeds.
fn pooled(records: &[Record], at: Option<(&str, usize)>, scheme: &str, metric: &str) -> Vec<f64> {
    records
        .iter()
        .filter(|r| r.scheme == scheme)
        .filter(|r| match (at, &r.point) {
            (Some((sw, i)), Some(p)) => p.sweep == sw && p.index == i,
            (None, None) => true,
            _ => false,
        })
        .flat_map(|r| r.samples.get(metric).into_iter().flatten().map(|s| s.1))
        .collect()
}

/// Download latency of history (EWMA, mean, EWMA with the seeded RTT, careful resume) against
/// the default window at one sweep point: the EWMA change in percent, its Welch test, and the
/// four cells ("−12.3 % (p = 0.004, n = 147 / 147)"); `None` if the point did not run.
fn against_default(
    records: &[Record],
    at: (&str, usize),
) -> Option<(f64, Option<Welch>, [String; 4])> {
    let latency = |scheme| pooled(records, Some(at), scheme, "dl.latency_s");
    let base = latency("default");
    if base.is_empty() {
        return None;
    }
    let (pct, w, ewma) = change(&base, &latency("history-ewma"));
    let (_, _, mean) = change(&base, &latency("history-mean"));
    let (_, _, rtt) = change(&base, &latency("ewma+rtt"));
    let (_, _, careful) = change(&base, &latency("careful"));
    Some((pct, w, [ewma, mean, rtt, careful]))
}

/// Mean over every download of `scheme` at `at` of sample `metric`.
fn pooled_mean(records: &[Record], at: (&str, usize), scheme: &str, metric: &str) -> Summary {
    Summary::of(&pooled(records, Some(at), scheme, metric))
}

fn change(a: &[f64], b: &[f64]) -> (f64, Option<Welch>, String) {
    let (ma, mb) = (Summary::of(a).mean, Summary::of(b).mean);
    let pct = (mb / ma - 1.0) * 100.0;
    let w = Welch::test(a, b);
    let p = Welch::p_label(w);
    (
        pct,
        w,
        format!("{pct:+.1} % ({p}, n = {} / {})", a.len(), b.len()),
    )
}

/// A claimed reduction holds if ours is a reduction with p < 0.05; "≈ unchanged" if p ≥ 0.05
/// or the change is under 5 %.
fn verdict(claim_pct: f64, pct: f64, w: Option<Welch>) -> &'static str {
    let significant = w.is_some_and(|w| w.p < 0.05 && w.ci95.0 != w.ci95.1);
    if claim_pct == 0.0 {
        if !significant || pct.abs() < 5.0 {
            "agrees"
        } else {
            "**differs**"
        }
    } else if pct < 0.0 && significant {
        if (pct - claim_pct).abs() <= claim_pct.abs() * 0.5 {
            "agrees"
        } else {
            "agrees in direction, **not in size**"
        }
    } else if pct < 0.0 {
        "agrees in direction, **not significant**"
    } else {
        "**differs**"
    }
}

/// The section appended to the simple plan's summary: each of the paper's claims against the
/// four plans' runs.
pub fn against_paper(
    simple: &[Record],
    dumbbell: &[Record],
    change_runs: &[Record],
    congested: &[Record],
) -> String {
    let mut s = String::from("## Against paper 002\n\n");
    let _ = writeln!(
        s,
        "Download time of history (EWMA and mean: the paper's window-only scheme; EWMA + RTT: \
         ours, each connection's RTT estimate seeded from the last smoothed RTT, decision H8; \
         careful: ours, RFC 9959 careful resume towards the recorded capacity, decision H9) \
         against the default initial window; every download after the first of each series, \
         all seeds pooled; Welch's t-test.\n"
    );
    let _ = writeln!(
        s,
        "| claim | paper | ours: EWMA | ours: mean | verdict (EWMA) | ours: EWMA + RTT | ours: careful |\n|---|---|---|---|---|---|---|"
    );
    let nets = [(0, "good"), (1, "average"), (2, "bad")];
    let claims: [(&str, usize, f64); 6] = [
        ("1MB", 0, -31.0),
        ("1MB", 1, -38.0),
        ("1MB", 2, 0.0),
        ("10MB", 0, -13.0),
        ("10MB", 1, -9.0),
        ("10MB", 2, 0.0),
    ];
    for (size, i, paper) in claims {
        let Some((pct, w, [ewma, mean, rtt, careful])) = against_default(simple, (size, i)) else {
            continue;
        };
        let claim = if paper == 0.0 {
            "≈ unchanged (history below default)".to_string()
        } else {
            format!("{paper:+.0} %")
        };
        let _ = writeln!(
            s,
            "| {size} {} network | {claim} | {ewma} | {mean} | {} | {rtt} | {careful} |",
            nets[i].1,
            verdict(paper, pct, w)
        );
    }
    for (sweep, paper) in [("good", -22.0), ("average", -31.0)] {
        for i in 0..4 {
            let Some((pct, w, [ewma, mean, rtt, careful])) = against_default(dumbbell, (sweep, i))
            else {
                continue;
            };
            let _ = writeln!(
                s,
                "| dumbbell 1MB {sweep}, {} competing flow(s) | {paper:+.0} % | {ewma} | {mean} | {} | {rtt} | {careful} |",
                i + 1,
                verdict(paper, pct, w)
            );
        }
    }
    s.push('\n');
    if !change_runs.is_empty() {
        let loss = |scheme: &str| -> Summary {
            let v: Vec<f64> = change_runs
                .iter()
                .filter(|r| r.scheme == scheme)
                .filter_map(|r| r.scalars.get("dl.loss_ratio_mean@bad").copied())
                .collect();
            Summary::of(&v)
        };
        let fell: f64 = change_runs
            .iter()
            .filter(|r| r.scheme == "ewma+safeguard")
            .filter_map(|r| r.scalars.get("dl.fell_back").copied())
            .sum();
        let (d, e, g, r, c) = (
            loss("default"),
            loss("history-ewma"),
            loss("ewma+safeguard"),
            loss("ewma+rtt"),
            loss("careful"),
        );
        let _ = writeln!(
            s,
            "Good → bad (beyond the paper): in the bad phase the loss ratio was {:.4} (default), \
             {:.4} (EWMA history from the good network), {:.4} (with the safeguard), {:.4} \
             (EWMA with the seeded RTT) and {:.4} (careful resume), means over {} seeds; the \
             safeguard reset the window to the default on {fell:.0} connection(s). A loss storm \
             would show as a loss ratio well above the default's.\n",
            d.mean, e.mean, g.mean, r.mean, c.mean, d.n
        );
    }
    s.push_str(&congested_section(congested));
    s
}

/// Scalar `metric` of each seed's run of `scheme` at `at`.
fn per_seed(records: &[Record], at: (&str, usize), scheme: &str, metric: &str) -> Vec<f64> {
    records
        .iter()
        .filter(|r| r.scheme == scheme)
        .filter(|r| {
            r.point
                .as_ref()
                .is_some_and(|p| p.sweep == at.0 && p.index == at.1)
        })
        .filter_map(|r| r.scalars.get(metric).copied())
        .collect()
}

/// "3/3 distinct": how many different mean download times the seeds of `scheme` gave at `at`.
fn distinct(records: &[Record], at: (&str, usize), scheme: &str) -> String {
    let v = per_seed(records, at, scheme, "dl.latency_s_mean");
    let mut bits: Vec<u64> = v.iter().map(|x| x.to_bits()).collect();
    bits.sort_unstable();
    bits.dedup();
    format!("{}/{} distinct", bits.len(), v.len())
}

/// Paper 002's downloads where the loss comes from competing flows (`paper002-congested.toml`):
/// each history scheme's download time and loss ratio against the default's, per point.
fn congested_section(records: &[Record]) -> String {
    let mut s = String::new();
    if records.is_empty() {
        return s;
    }
    let _ = writeln!(
        s,
        "### At a congested bottleneck (loss from competing flows, not from a coin)\n\n\
         `lab/plans/paper002-congested.toml`: the loss comes from a 200-packet drop-tail queue \
         that 1–4 competing CUBIC flows load, not from a coin; the default column gives, from \
         the same runs, the competing flows' utilisation of the bottleneck (after their 3 s \
         warm-up) and the packets its queue dropped. Download time against the default (all \
         downloads of all seeds pooled; Welch's t-test), each scheme's mean loss ratio over its \
         downloads with the change from the default's in points, and how many distinct outcomes \
         (mean download time) its seeds gave.\n"
    );
    let schemes = ["history-mean", "history-ewma", "careful"];
    let _ = writeln!(
        s,
        "| network, competing flows | default: time (s), loss | {} |\n|---|---|---|---|---|",
        schemes.join(" | ")
    );
    for (sweep, net) in [("good", "good (38 ms)"), ("average", "average (50 ms)")] {
        for i in 0..4 {
            let at = (sweep, i);
            let base = pooled(records, Some(at), "default", "dl.latency_s");
            if base.is_empty() {
                continue;
            }
            let loss0 = pooled_mean(records, at, "default", "dl.loss_ratio");
            let util = Summary::of(&per_seed(records, at, "default", "bg.utilisation"));
            let drops = Summary::of(&per_seed(records, at, "default", "bg.queue_drops"));
            let mut row = format!(
                "| {net}, {} | {:.3}, {:.2} %; flows' utilisation {:.1} %, {:.0} queue drops; {} |",
                i + 1,
                Summary::of(&base).mean,
                loss0.mean * 100.0,
                util.mean * 100.0,
                drops.mean,
                distinct(records, at, "default")
            );
            for scheme in schemes {
                let (_, _, cell) =
                    change(&base, &pooled(records, Some(at), scheme, "dl.latency_s"));
                let loss = pooled_mean(records, at, scheme, "dl.loss_ratio");
                let _ = write!(
                    row,
                    " {cell}; loss {:.2} % ({:+.2} points); {} |",
                    loss.mean * 100.0,
                    (loss.mean - loss0.mean) * 100.0,
                    distinct(records, at, scheme)
                );
            }
            let _ = writeln!(s, "{row}");
        }
    }
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_shipped_plans_parse() {
        let p = super::plans().unwrap();
        assert_eq!(p.len(), 4);
        assert_eq!(p[0].0.plan.plan.name, "history");
    }

    #[test]
    fn verdicts() {
        use super::verdict;
        let w = |p: f64| {
            Some(crate::stats::Welch {
                diff: -1.0,
                ci95: (-2.0, -0.5),
                p,
            })
        };
        assert_eq!(verdict(-31.0, -35.0, w(0.001)), "agrees");
        assert_eq!(
            verdict(-38.0, -10.0, w(0.01)),
            "agrees in direction, **not in size**"
        );
        assert_eq!(
            verdict(-38.0, -10.0, w(0.2)),
            "agrees in direction, **not significant**"
        );
        assert_eq!(verdict(-13.0, 2.0, w(0.5)), "**differs**");
        assert_eq!(verdict(0.0, 1.0, w(0.5)), "agrees");
        assert_eq!(verdict(0.0, -20.0, w(0.001)), "**differs**");
    }
}
