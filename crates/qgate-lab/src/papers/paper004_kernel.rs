//! Paper 004's operating point with **real kernel TCP flows** (CUBIC, BBR) through `qgate-lab
//! linkem` in real time: the six disciplines where the simulator cannot go (it has no kernel
//! TCP) and mahimahi cannot either (no RED, FQ-CoDel or PID-Delay). Needs root.
//!
//! One path: the bottleneck (10 Mbit/s, 51 ms each way = the paper's 50 ms plus the 1 ms access
//! link, 1 % random loss on the data direction only, each discipline at its default 1000-packet
//! limit); `flows` bulk TCP flows from inside to a sink outside, started 10 ms apart.
//! Statistics leave out a warm-up (linkem's `warmup`).

use std::fmt::Write as _;
use std::path::Path;

use qgate_linkem::config::{ChangeSpec, LinkemConfig, PathConfig};
use qgate_linkem::report::delivered_mbps;
use qgate_linkem::Way;

use crate::stats::Summary;

/// The disciplines compared, as the simulated lab names them.
pub const DISCIPLINES: &[&str] = &["droptail", "red", "pie", "codel", "fq-codel", "pid-delay"];

/// What to run.
#[derive(Debug, Clone)]
pub struct KernelAqmConfig {
    /// Congestion controls (kernel names).
    pub ccs: Vec<String>,
    /// Disciplines.
    pub disciplines: Vec<String>,
    /// Repetitions of each (seeds 1..=reps for the loss draws).
    pub reps: u64,
    /// Seconds of traffic per run, warm-up included.
    pub seconds: u64,
    /// Seconds left out at the start.
    pub warmup: u64,
    /// Bulk flows.
    pub flows: usize,
}

impl Default for KernelAqmConfig {
    fn default() -> Self {
        KernelAqmConfig {
            ccs: vec!["cubic".into(), "bbr".into()],
            disciplines: DISCIPLINES.iter().map(|d| d.to_string()).collect(),
            reps: 3,
            seconds: 40,
            warmup: 10,
            flows: 10,
        }
    }
}

/// One run's measurements.
#[derive(Debug, Clone)]
pub struct KernelRun {
    /// Congestion control.
    pub cc: String,
    /// Discipline.
    pub discipline: String,
    /// Repetition (the linkem seed).
    pub rep: u64,
    /// Bottleneck utilisation: IP bytes delivered on the data direction ÷ capacity.
    pub utilisation: f64,
    /// Mean queueing delay of the data direction, ms.
    pub queue_delay_mean_ms: f64,
    /// Its 99th percentile, ms.
    pub queue_delay_p99_ms: f64,
    /// Packets the discipline dropped (overflow + AQM) per second.
    pub queue_drops_per_s: f64,
    /// Relay lateness p99 on the data direction, µs (how far to trust the run's timing).
    pub lateness_p99_us: u64,
}

/// Run every (cc, discipline, rep) in turn; `progress` hears each finished run.
pub fn run(
    cfg: &KernelAqmConfig,
    work_dir: &Path,
    mut progress: impl FnMut(&KernelRun, usize, usize),
) -> Result<Vec<KernelRun>, String> {
    std::fs::create_dir_all(work_dir).map_err(|e| format!("{}: {e}", work_dir.display()))?;
    let tools = work_dir.join("traffic.py");
    std::fs::write(&tools, qgate_linkem::TRAFFIC_PY)
        .map_err(|e| format!("{}: {e}", tools.display()))?;
    let total = cfg.ccs.len() * cfg.disciplines.len() * cfg.reps as usize;
    let mut out = Vec::new();
    for rep in 1..=cfg.reps {
        for cc in &cfg.ccs {
            for d in &cfg.disciplines {
                let linkem = LinkemConfig {
                    paths: vec![PathConfig {
                        link: ChangeSpec::Text(format!("rate=10mbit,delay=51ms,queue={d}")),
                        uplink: Some(ChangeSpec::Text("loss=1%".into())),
                        downlink: None,
                    }],
                    outside: Some(format!("exec python3 {} sink 5001", tools.display())),
                    seed: Some(rep),
                    warmup: Some(format!("{}s", cfg.warmup)),
                    ..Default::default()
                };
                let command = vec![
                    "sh".to_string(),
                    "-c".into(),
                    format!(
                        "python3 {} flows {} 5001 {} {} {cc} > /dev/null",
                        tools.display(),
                        netns_peer(),
                        cfg.flows,
                        cfg.seconds
                    ),
                ];
                let outcome = qgate_linkem::run(&linkem, &command).map_err(|e| e.to_string())?;
                if let Some(sig) = outcome.interrupted_by {
                    return Err(format!("interrupted by signal {sig}"));
                }
                if outcome.exit_code != 0 {
                    return Err(format!(
                        "{cc} / {d}: the flows exited with status {}",
                        outcome.exit_code
                    ));
                }
                let up = outcome
                    .reports
                    .iter()
                    .find(|r| r.way == Way::Uplink)
                    .ok_or("no uplink report")?;
                let secs = up.elapsed.as_secs_f64().max(1e-9);
                let r = KernelRun {
                    cc: cc.clone(),
                    discipline: d.clone(),
                    rep,
                    utilisation: delivered_mbps(up) / 10.0,
                    queue_delay_mean_ms: up.queue_delay_us.mean() / 1000.0,
                    queue_delay_p99_ms: up.queue_delay_us.value_at_quantile(0.99) as f64 / 1000.0,
                    queue_drops_per_s: up.stats.dropped_queue as f64 / secs,
                    lateness_p99_us: up.lateness_us.value_at_quantile(0.99),
                };
                out.push(r.clone());
                progress(&r, out.len(), total);
            }
        }
    }
    Ok(out)
}

/// The far end of path 1 as linkem names it (COMMAND reads it from its environment; the
/// address is fixed, decision L4).
fn netns_peer() -> String {
    qgate_linkem::netns::address(1, 2).to_string()
}

/// results.csv: one row per run.
pub fn csv(runs: &[KernelRun]) -> String {
    let mut s = String::from(
        "cc,discipline,rep,utilisation,queue_delay_mean_ms,queue_delay_p99_ms,queue_drops_per_s,lateness_p99_us\n",
    );
    for r in runs {
        let _ = writeln!(
            s,
            "{},{},{},{:.4},{:.3},{:.3},{:.2},{}",
            r.cc,
            r.discipline,
            r.rep,
            r.utilisation,
            r.queue_delay_mean_ms,
            r.queue_delay_p99_ms,
            r.queue_drops_per_s,
            r.lateness_p99_us
        );
    }
    s
}

/// summary.md: per congestion control, a table of the disciplines (mean ± sd, n), and what the
/// numbers say, computed from them.
pub fn summary(cfg: &KernelAqmConfig, runs: &[KernelRun], command: &str) -> String {
    let mut s = String::from("# Paper 004 with kernel TCP flows through `qgate-lab linkem`\n\n");
    let _ = writeln!(
        s,
        "Bottleneck 10 Mbit/s, 51 ms each way, 1 % random loss on the data direction, each \
         discipline at its defaults (1000-packet limit); {} bulk kernel TCP flows started 10 ms \
         apart; {} s per run, the first {} s left out; {} repetitions (linkem seeds 1–{}: the \
         loss draws differ, and real-time runs never repeat exactly). Real time on this machine: \
         the relay's lateness p99 is reported per run (results.csv).\n\nReproduce: `{command}`\n",
        cfg.flows, cfg.seconds, cfg.warmup, cfg.reps, cfg.reps
    );
    for cc in &cfg.ccs {
        let _ = writeln!(s, "## {cc}\n");
        let _ = writeln!(
            s,
            "| discipline | utilisation | queue delay mean, ms | queue delay p99, ms | queue drops/s | lateness p99, µs (max) |\n|---|---|---|---|---|---|"
        );
        let mut rows = Vec::new();
        for d in &cfg.disciplines {
            let these: Vec<&KernelRun> = runs
                .iter()
                .filter(|r| &r.cc == cc && &r.discipline == d)
                .collect();
            if these.is_empty() {
                continue;
            }
            let of = |f: fn(&KernelRun) -> f64| {
                Summary::of(&these.iter().map(|r| f(r)).collect::<Vec<_>>())
            };
            let util = of(|r| r.utilisation);
            let delay = of(|r| r.queue_delay_mean_ms);
            let p99 = of(|r| r.queue_delay_p99_ms);
            let drops = of(|r| r.queue_drops_per_s);
            let late = these.iter().map(|r| r.lateness_p99_us).max().unwrap_or(0);
            let _ =
                writeln!(
                s,
                "| {d} | {:.3} ± {:.3} | {:.2} ± {:.2} | {:.1} ± {:.1} | {:.1} ± {:.1} | {late} |",
                util.mean, util.std, delay.mean, delay.std, p99.mean, p99.std, drops.mean, drops.std
            );
            rows.push((d.clone(), util, delay));
        }
        let _ = writeln!(s, "\nn = {} per row.\n", cfg.reps);
        if let (Some(low), Some(high)) = (
            rows.iter().min_by(|a, b| a.2.mean.total_cmp(&b.2.mean)),
            rows.iter().max_by(|a, b| a.2.mean.total_cmp(&b.2.mean)),
        ) {
            let _ = writeln!(
                s,
                "Lowest mean queue delay: {} ({:.2} ms, utilisation {:.3}); highest: {} ({:.2} ms, \
                 utilisation {:.3}).",
                low.0, low.2.mean, low.1.mean, high.0, high.2.mean, high.1.mean
            );
        }
        if let Some(pid) = rows.iter().find(|r| r.0 == "pid-delay") {
            let better: Vec<&str> = rows
                .iter()
                .filter(|r| r.0 != "pid-delay" && r.2.mean < pid.2.mean)
                .map(|r| r.0.as_str())
                .collect();
            let _ = writeln!(
                s,
                "PID-Delay: queue delay {:.2} ms at utilisation {:.3}; disciplines with a lower \
                 mean queue delay: {}.\n",
                pid.2.mean,
                pid.1.mean,
                if better.is_empty() {
                    "none".to_string()
                } else {
                    better.join(", ")
                }
            );
        }
    }
    s
}
