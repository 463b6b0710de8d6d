//! `results/faults/`: results.csv (one row per run and fault), summary.md.

use std::fmt::Write as _;
use std::path::Path;

use super::Outcome;
use crate::stats::Summary;

/// Write results.csv and summary.md into `out`; `command` reproduces them.
pub fn write_all(out: &Path, runs: &[Outcome], command: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(out)?;
    let mut csv = String::from(
        "scenario,seed,accepted,delivered,lost,duplicated,pending,fault,fault_start_s,fault_end_s,recovery_s\n",
    );
    for o in runs {
        let head = format!(
            "{},{},{},{},{},{},{}",
            o.scenario, o.seed, o.accepted, o.delivered, o.lost, o.duplicated, o.pending
        );
        if o.recoveries.is_empty() {
            let _ = writeln!(csv, "{head},,,,");
        }
        for r in &o.recoveries {
            let _ = writeln!(
                csv,
                "{head},\"{}\",{:.3},{:.3},{}",
                r.fault.replace('"', "'"),
                r.start_s,
                r.end_s,
                r.recovery_s.map_or("never".into(), |x| format!("{x:.3}"))
            );
        }
    }
    std::fs::write(out.join("results.csv"), csv)?;
    std::fs::write(out.join("summary.md"), summary(runs, command))
}

fn summary(runs: &[Outcome], command: &str) -> String {
    let mut md = String::from("# Faults and hostile peers (issue 18)\n\n");
    let _ = writeln!(
        md,
        "Reproduce: `{command}`. Virtual time on the simulated network; the real gateway, ingest \
         server, broker and clients. Lost = acknowledged to its source but never delivered; it \
         must be 0. Pending = offered but never acknowledged (its source still holds it). \
         Recovery = from the fault's end until service is back (see each scenario).\n"
    );
    let lost: u64 = runs.iter().map(|o| o.lost).sum();
    let _ = writeln!(
        md,
        "**Lost over every run: {lost}** ({} runs).\n",
        runs.len()
    );
    let mut scenarios: Vec<&str> = runs.iter().map(|o| o.scenario).collect();
    scenarios.dedup();
    for sc in scenarios {
        let rs: Vec<&Outcome> = runs.iter().filter(|o| o.scenario == sc).collect();
        let col = |f: &dyn Fn(&Outcome) -> u64| {
            Summary::of(&rs.iter().map(|o| f(o) as f64).collect::<Vec<_>>())
        };
        let _ = writeln!(md, "## {sc}\n");
        let _ = writeln!(md, "| | mean ± sd (n) | per seed |\n|---|---|---|");
        for (name, f) in [
            (
                "accepted",
                &(|o: &Outcome| o.accepted) as &dyn Fn(&Outcome) -> u64,
            ),
            ("delivered", &|o: &Outcome| o.delivered),
            ("lost", &|o: &Outcome| o.lost),
            ("duplicated", &|o: &Outcome| o.duplicated),
            ("pending", &|o: &Outcome| o.pending),
        ] {
            let per: Vec<String> = rs.iter().map(|o| f(o).to_string()).collect();
            let _ = writeln!(md, "| {name} | {:.1} | {} |", col(f), per.join(", "));
        }
        // Do the seeds really differ? Compare everything a run measured but its seed.
        let key = |o: &Outcome| {
            format!(
                "{:?}",
                (
                    o.accepted,
                    o.duplicated,
                    o.pending,
                    &o.recoveries,
                    &o.counters
                )
            )
        };
        let distinct = {
            let mut k: Vec<String> = rs.iter().map(|o| key(o)).collect();
            k.sort();
            k.dedup();
            k.len()
        };
        let _ = writeln!(
            md,
            "\n{}\n",
            match (rs.len(), distinct) {
                (1, _) => "One seed: no spread.".to_string(),
                (n, 1) =>
                    format!("All {n} seeds gave the same outcome: one outcome, not a spread."),
                (n, d) => format!("{d} distinct outcomes over {n} seeds."),
            }
        );
        let _ = writeln!(
            md,
            "| fault | at (s) | recovery (s), mean ± sd (n) | never recovered |\n|---|---|---|---|"
        );
        // One row per kind of fault, over every seed and every fault of that kind.
        let mut kinds: Vec<&str> = Vec::new();
        for r in rs.iter().flat_map(|o| &o.recoveries) {
            if !kinds.contains(&r.kind) {
                kinds.push(r.kind);
            }
        }
        for kind in kinds {
            let all: Vec<&super::Recovery> = rs
                .iter()
                .flat_map(|o| &o.recoveries)
                .filter(|r| r.kind == kind)
                .collect();
            let rec: Vec<f64> = all.iter().filter_map(|r| r.recovery_s).collect();
            let never = all.iter().filter(|r| r.recovery_s.is_none()).count();
            let first = all[0];
            let when = if all
                .iter()
                .all(|r| r.start_s == first.start_s && r.end_s == first.end_s)
            {
                format!("{:.1}–{:.1}", first.start_s, first.end_s)
            } else {
                format!("{} times, seeded", all.len())
            };
            let _ = writeln!(
                md,
                "| {kind} | {when} | {:.2} | {never} |",
                Summary::of(&rec)
            );
        }
        let names: Vec<String> = rs
            .first()
            .map(|o| o.counters.iter().map(|c| c.0.clone()).collect())
            .unwrap_or_default();
        if !names.is_empty() {
            let _ = writeln!(md, "\n| counter | mean ± sd (n) |\n|---|---|");
            for name in names {
                let v: Vec<f64> = rs
                    .iter()
                    .filter_map(|o| o.counters.iter().find(|c| c.0 == name).map(|c| c.1))
                    .collect();
                let _ = writeln!(md, "| {name} | {:.1} |", Summary::of(&v));
            }
        }
        md.push('\n');
    }
    md
}
