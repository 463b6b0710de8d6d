//! `qgate-lab proxy`: paper 000's experiments, run from the shipped plan
//! `lab/plans/paper000-proxy.toml` by the plan runner, with a closing section that holds the
//! results against the paper's claim. Every sentence in that section quotes numbers of the same
//! run (decision X4).

use std::fmt::Write as _;
use std::path::Path;

use super::sweep_points as points;
use crate::plan::run::Record;
use crate::plan::{Loaded, PlanError};
use crate::stats::{Summary, Welch};

/// The shipped plan (also in `lab/plans/`, where a reader can copy and change it).
pub const PLAN: &str = include_str!("../../../../lab/plans/paper000-proxy.toml");

/// Where the shipped plan lives in the repository (named in errors and provenance).
pub const PLAN_PATH: &str = "lab/plans/paper000-proxy.toml";

/// The shipped plan, parsed.
pub fn plan() -> Result<Loaded, PlanError> {
    Loaded::parse(PLAN, Path::new(PLAN_PATH))
}

/// Paper 000's gateway and server joined by paths p1–p3 of 100/75/50 Mbit/s at 10/20/30 ms one
/// way (the heterogeneous paths, d = 10 ms), each losing packets by `loss`: the network of the
/// gateway demo and of the faults lab.
pub fn three_paths(loss: qgate_netsim::LossModel) -> qgate_netsim::Topology {
    use qgate_netsim::topology::{HostSpec, LinkChange, LinkSpec};
    let path = |k: u32, rate: f64| {
        LinkSpec::new(
            &format!("p{k}"),
            "gateway",
            "server",
            LinkChange {
                rate_mbps: Some(rate),
                delay_ms: Some(10.0 * f64::from(k)),
                loss: Some(loss),
                ..Default::default()
            },
        )
    };
    qgate_netsim::Topology {
        hosts: ["gateway", "server"]
            .map(|h| HostSpec {
                name: h.into(),
                forwarding: false,
            })
            .to_vec(),
        links: vec![path(1, 100.0), path(2, 75.0), path(3, 50.0)],
    }
}

const SCHEMES: [&str; 5] = [
    "single",
    "round-robin",
    "adaptive",
    "adaptive-packets",
    "completion",
];

/// Sweeps whose devices send one request per interval for a fixed time (their total
/// transmission delay is that time).
const OPEN_LOOP: [&str; 2] = ["dynamic", "flapping"];

/// Sweeps of ours, not the paper's: a run whose paths change, and topologies its sweeps do not
/// cover.
const OURS: [&str; 4] = ["dynamic", "reversed", "disagree", "flapping"];

/// The two readings of the paper's adaptive scheme (what hits count, decision G15); its claim
/// is tested for each against single and round-robin.
const ADAPTIVE: [&str; 2] = ["adaptive", "adaptive-packets"];

/// The scenario variants `qgate-lab proxy` runs: the value of `workloads.gw.classes` and the
/// results' subdirectory (none: the plan's own directory).
pub const SCENARIOS: [(&str, Option<&str>); 2] = [("device", None), ("both", Some("both-classes"))];

fn values(records: &[Record], sweep: &str, index: usize, scheme: &str, metric: &str) -> Vec<f64> {
    records
        .iter()
        .filter(|r| {
            r.scheme == scheme
                && r.point
                    .as_ref()
                    .is_some_and(|p| p.sweep == sweep && p.index == index)
        })
        .filter_map(|r| r.scalars.get(metric).copied())
        .collect()
}

fn mean(records: &[Record], sweep: &str, index: usize, scheme: &str, metric: &str) -> f64 {
    Summary::of(&values(records, sweep, index, scheme, metric)).mean
}

/// The section appended to `summary.md`: the paper's claim against these results.
pub fn against_paper(loaded: &Loaded, records: &[Record]) -> String {
    let mut s = String::from("## Against paper 000\n\n");
    // `loaded` is the plan as run (overrides applied).
    let both = loaded.plan.workloads.iter().any(|w| {
        matches!(w, crate::plan::spec::Workload::Gateway(g) if g.classes == crate::plan::spec::Classes::Both)
    });
    let _ = writeln!(
        s,
        "Scenario: {}\n",
        if both {
            "**every device sends both classes** (a priority and a best-effort session on its \
             connection, requests alternating; paper §4.1)"
        } else {
            "**one class per device**, half the devices priority (results/proxy/both-classes has \
             every device sending both, as the paper's clients do)"
        }
    );
    let _ = writeln!(
        s,
        "The paper claims adaptive < round-robin ≈ single on both metrics at every point, with \
         gaps growing with delay, loss and file size. Its adaptive scheme is run in two readings: \
         `adaptive` (hits = devices on a path, Table 1) and `adaptive-packets` (hits = data \
         packets forwarded, §3.4 step 11). Per sweep and reading, among the paper's schemes \
         (single, round-robin and that reading; ours, `completion`, has its own section below): \
         at how many points the reading had the lowest mean, and at how many it was lower than \
         each other scheme with p < 0.05 (Welch).\n"
    );
    let _ = writeln!(
        s,
        "| sweep | metric | reading | points | lowest | < single (p < 0.05) | < round-robin (p < 0.05) |\n|---|---|---|---|---|---|---|"
    );
    let mut tally = Vec::new();
    for ad in ADAPTIVE {
        let (mut lowest_all, mut total_points) = (0, 0);
        for sw in &loaded.plan.sweep {
            // The paper's claim covers its own sweeps, not ours.
            if OURS.contains(&sw.name.as_str()) {
                continue;
            }
            let pts = points(records, &sw.name);
            if pts.is_empty() {
                continue;
            }
            for (metric, what) in [
                ("gw.response_ms_mean", "response delay"),
                ("gw.total_s", "total transmission delay"),
            ] {
                let (mut lowest, mut below) = (0, [0, 0]);
                for &(i, _) in &pts {
                    let m = |sc: &str| mean(records, &sw.name, i, sc, metric);
                    if m(ad) < m("single") && m(ad) < m("round-robin") {
                        lowest += 1;
                    }
                    let mine = values(records, &sw.name, i, ad, metric);
                    for (k, other) in ["single", "round-robin"].iter().enumerate() {
                        let o = values(records, &sw.name, i, other, metric);
                        if Welch::test(&o, &mine).is_some_and(|w| w.diff < 0.0 && w.p < 0.05) {
                            below[k] += 1;
                        }
                    }
                }
                lowest_all += lowest;
                total_points += pts.len();
                let _ = writeln!(
                    s,
                    "| {} | {what} | {ad} | {} | {lowest} | {} | {} |",
                    sw.label,
                    pts.len(),
                    below[0],
                    below[1]
                );
            }
        }
        tally.push((ad, lowest_all, total_points));
    }
    for (ad, lowest_all, total_points) in tally {
        let _ = writeln!(
            s,
            "\nAgainst single and round-robin, {ad} had the lowest mean at {lowest_all} of {total_points} (point, metric) pairs: \
             **the paper's claim {}.**",
            if lowest_all == total_points {
                "holds here"
            } else if lowest_all * 2 >= total_points {
                "holds at most points, not all"
            } else {
                "holds only in part here"
            }
        );
    }
    s.push('\n');
    s.push_str(&completion(loaded, records));
    s.push_str(&mechanisms(records));
    s
}

/// The per-request scheduler against every other scheme: where it had the lowest mean, where
/// it was significantly lower than all others, and each point where another scheme did better,
/// with the difference's interval.
fn completion(loaded: &Loaded, records: &[Record]) -> String {
    let ours = "completion";
    let others: Vec<&str> = SCHEMES.iter().copied().filter(|s| *s != ours).collect();
    let mut s = String::from(
        "## Ours: `completion` (per request, decisions G13, G14, G20, G24)\n\n\
         Per sweep: at how many points `completion` had the lowest mean, at how many it was lower \
         than every other scheme with p < 0.05 (Welch), and at how many another scheme was lower \
         with p < 0.05 (the open-loop runs' total transmission delay, their fixed duration, is left \
         out).\n\n\
         | sweep | metric | points | lowest | lower than all (p < 0.05) | beaten (p < 0.05) |\n|---|---|---|---|---|---|\n",
    );
    let mut misses = Vec::new();
    let (mut lowest_all, mut beaten_all, mut total) = (0, 0, 0);
    for sw in &loaded.plan.sweep {
        let pts = points(records, &sw.name);
        for (metric, what) in [
            ("gw.response_ms_mean", "response delay"),
            ("gw.total_s", "total transmission delay"),
        ] {
            // An open-loop run's total is its fixed duration, not a result.
            if OPEN_LOOP.contains(&sw.name.as_str()) && metric == "gw.total_s" {
                continue;
            }
            let (mut lowest, mut below_all, mut beaten, mut n) = (0, 0, 0, 0);
            for &(i, x) in &pts {
                let mine = values(records, &sw.name, i, ours, metric);
                if mine.is_empty() {
                    continue;
                }
                n += 1;
                let m = Summary::of(&mine).mean;
                let rivals: Vec<(&str, Vec<f64>)> = others
                    .iter()
                    .map(|o| (*o, values(records, &sw.name, i, o, metric)))
                    .filter(|(_, v)| !v.is_empty())
                    .collect();
                let best = rivals
                    .iter()
                    .map(|(o, v)| (*o, Summary::of(v).mean, v))
                    .min_by(|a, b| a.1.total_cmp(&b.1));
                if best.is_none_or(|b| m < b.1) {
                    lowest += 1;
                }
                let significant = |v: &[f64], lower: bool| {
                    Welch::test(v, &mine).is_some_and(|w| (w.diff < 0.0) == lower && w.p < 0.05)
                };
                if !rivals.is_empty() && rivals.iter().all(|(_, v)| significant(v, true)) {
                    below_all += 1;
                }
                // Beaten: any scheme significantly lower, not only the one with the lowest mean.
                if rivals.iter().any(|(_, v)| significant(v, false)) {
                    beaten += 1;
                }
                if let Some((o, bm, v)) = best.filter(|b| b.1 < m) {
                    let w = Welch::test(v, &mine);
                    misses.push(format!(
                        "| {} = {x} | {what} | {o} {bm:.4} | {m:.4} | {} | {} |",
                        sw.label,
                        w.as_ref().map_or("–".into(), |w| format!(
                            "{:+.4} [{:+.4}, {:+.4}]",
                            w.diff, w.ci95.0, w.ci95.1
                        )),
                        w.as_ref().map_or("–".into(), |w| if w.p < 0.001 {
                            "< 0.001".into()
                        } else {
                            format!("{:.3}", w.p)
                        }),
                    ));
                }
            }
            if n == 0 {
                continue;
            }
            lowest_all += lowest;
            beaten_all += beaten;
            total += n;
            let _ = writeln!(
                s,
                "| {} | {what} | {n} | {lowest} | {below_all} | {beaten} |",
                sw.label
            );
        }
    }
    let _ = writeln!(
        s,
        "\n`completion` had the lowest mean at {lowest_all} of {total} (point, metric) pairs and \
         was beaten with p < 0.05 at {beaten_all}.\n"
    );
    // Paper 000's guarantee: priority requests never slower than best-effort ones.
    let mut guarantee = Vec::new();
    for sc in ["adaptive", "adaptive-packets", ours] {
        let (mut above, mut n) = (0, 0);
        for sw in &loaded.plan.sweep {
            for &(i, _) in &points(records, &sw.name) {
                let p = values(records, &sw.name, i, sc, "gw.priority_ms_mean");
                let b = values(records, &sw.name, i, sc, "gw.best_effort_ms_mean");
                if p.is_empty() || b.is_empty() {
                    continue;
                }
                n += 1;
                if Summary::of(&p).mean > Summary::of(&b).mean {
                    above += 1;
                }
            }
        }
        guarantee.push(format!("{sc} at {above} of {n} points"));
    }
    let _ = writeln!(
        s,
        "Priority requests' mean response delay above best-effort requests' (the paper's \
         guarantee broken): {}.\n",
        guarantee.join(", ")
    );
    if !misses.is_empty() {
        let _ = writeln!(
            s,
            "Where another scheme had a lower mean (difference = completion − best other, its \
             95 % interval and p):\n\n\
             | point | metric | best other | completion | difference | p |\n|---|---|---|---|---|---|\n{}\n",
            misses.join("\n")
        );
    }
    s
}

/// Sentences on where each scheduler sent traffic, each quoting this run's numbers.
fn mechanisms(records: &[Record]) -> String {
    let mut s = String::from("What the schedulers did (means over seeds, this run):\n\n");
    let pct = |v: f64| format!("{:.0} %", v * 100.0);
    if let Some(&(i, x)) = points(records, "delay-hetero").first() {
        let m = |sc: &str, k: &str| mean(records, "delay-hetero", i, sc, k);
        let _ = writeln!(
            s,
            "- Paths {x}/{}/{} ms: adaptive sent {} of its priority requests and {} of all requests \
             on path 1 (the lowest RTT); completion {} of all; round-robin {} of all; single {}. \
             Mean response delay: adaptive {:.1} ms, completion {:.1} ms, round-robin {:.1} ms, \
             single {:.1} ms; path 1 ran at {} of its capacity under single.",
            2.0 * x,
            3.0 * x,
            pct(m("adaptive", "gw.path1_priority_share")),
            pct(m("adaptive", "gw.path1_share")),
            pct(m("completion", "gw.path1_share")),
            pct(m("round-robin", "gw.path1_share")),
            pct(m("single", "gw.path1_share")),
            m("adaptive", "gw.response_ms_mean"),
            m("completion", "gw.response_ms_mean"),
            m("round-robin", "gw.response_ms_mean"),
            m("single", "gw.response_ms_mean"),
            pct(m("single", "gw.path1_util")),
        );
    }
    if let Some(&(i, x)) = points(records, "loss").last() {
        let m = |sc: &str, k: &str| mean(records, "loss", i, sc, k);
        let _ = writeln!(
            s,
            "- At {x} % loss on every path: response delay p99 single {:.0} ms, round-robin {:.0} ms, \
             adaptive {:.0} ms, completion {:.0} ms; adaptive sent {} of priority requests on path 1.",
            m("single", "gw.response_ms_p99"),
            m("round-robin", "gw.response_ms_p99"),
            m("adaptive", "gw.response_ms_p99"),
            m("completion", "gw.response_ms_p99"),
            pct(m("adaptive", "gw.path1_priority_share")),
        );
    }
    if let Some(&(i, _)) = points(records, "dynamic").first() {
        let m = |sc: &str, k: &str| mean(records, "dynamic", i, sc, k);
        for sc in SCHEMES {
            let _ = writeln!(
                s,
                "- Dynamic, {sc}: priority response delay {:.1} ms before path 1 slowed, {:.1} ms \
                 while it was slow, {:.1} ms once path 2 was down; {:.0} requests failed.",
                m(sc, "gw.priority_ms_mean@before"),
                m(sc, "gw.priority_ms_mean@p1-slow"),
                m(sc, "gw.priority_ms_mean@p2-down"),
                m(sc, "gw.failed"),
            );
        }
    }
    let failed: f64 = records
        .iter()
        .filter_map(|r| r.scalars.get("gw.failed"))
        .sum();
    let _ = writeln!(
        s,
        "- Requests that failed in all {} runs: {failed:.0}.",
        records.len()
    );
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_shipped_plan_parses() {
        let p = super::plan().unwrap();
        assert_eq!(p.plan.plan.name, "proxy");
        assert_eq!(p.scheme_names(), super::SCHEMES);
        assert!(super::ADAPTIVE.iter().all(|a| super::SCHEMES.contains(a)));
    }
}
