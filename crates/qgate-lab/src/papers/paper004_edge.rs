//! Paper 004 **in the product** (issue 13 item 5): the real `qgate gateway` shapes its backhaul
//! egress through a queue discipline (decision L8), so the standing queue forms in the gateway
//! under an AQM instead of in a bloated modem. Real time through `qgate linkem`, real processes,
//! real UDP. Needs root.
//!
//! One emulated path is the backhaul's access link: 10 Mbit/s, 20 ms each way, a 1000-packet
//! drop-tail buffer (the modem: about 1.2 s of queue at that rate). `qgate server` runs outside;
//! inside, `qgate gateway` with that path, `bulk` best-effort devices posting 256 KiB records back
//! to back, and after the warm-up one priority device posting a 200-byte record every 100 ms.
//! Schemes: the path unshaped, or shaped to `SHAPE_RATE` (below the link's rate, so the modem's
//! buffer stays empty) through PID-Delay, our stable PID-Delay, FQ-CoDel or PIE (decision L13).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use qgate_linkem::config::{ChangeSpec, LinkemConfig, PathConfig};
use qgate_linkem::report::delivered_mbps;
use qgate_linkem::Way;

use crate::stats::{Summary, Welch};

/// The schemes: `unshaped`, or the queue discipline the gateway shapes through.
pub const SCHEMES: &[&str] = &[
    "unshaped",
    "pid-delay",
    "pid-delay-stable",
    "fq-codel",
    "pie",
];

/// The access link (both directions): the modem's rate and its large drop-tail buffer.
pub const LINK: &str = "rate=10mbit,delay=20ms,queue=droptail:packets=1000";
/// The link's rate, Mbit/s (utilisation is measured against it).
pub const LINK_MBPS: f64 = 10.0;
/// What the gateway shapes to: 95 % of the link, so the gateway's queue is the one that fills.
pub const SHAPE_RATE: &str = "9500kbit";
/// Bytes of each bulk record.
pub const BULK_BYTES: usize = 256 * 1024;
/// Bytes of each priority record.
pub const PRIORITY_BYTES: usize = 200;
/// Priority records per second.
pub const PRIORITY_RATE: f64 = 10.0;

/// What to run.
#[derive(Debug, Clone)]
pub struct EdgeConfig {
    /// Schemes, from [`SCHEMES`].
    pub schemes: Vec<String>,
    /// Repetitions of each (linkem seeds 1..=reps).
    pub reps: u64,
    /// Best-effort bulk devices.
    pub bulk: usize,
    /// Seconds before the priority device starts (the bulk flows fill the queue).
    pub warmup: u64,
    /// Seconds the priority device sends for.
    pub seconds: u64,
    /// The qgate binary.
    pub qgate: PathBuf,
}

impl EdgeConfig {
    /// The defaults.
    pub fn new(qgate: PathBuf) -> EdgeConfig {
        EdgeConfig {
            schemes: SCHEMES.iter().map(|s| s.to_string()).collect(),
            reps: 3,
            bulk: 8,
            warmup: 5,
            seconds: 15,
            qgate,
        }
    }
}

/// One run's measurements.
#[derive(Debug, Clone)]
pub struct EdgeRun {
    /// Scheme.
    pub scheme: String,
    /// Repetition (the linkem seed).
    pub rep: u64,
    /// Priority records answered.
    pub priority_n: usize,
    /// Their response delay, ms: mean, p50, p99.
    pub priority_mean_ms: f64,
    /// Median.
    pub priority_p50_ms: f64,
    /// 99th percentile.
    pub priority_p99_ms: f64,
    /// Bulk records' bytes answered while the priority device sent, Mbit/s.
    pub bulk_goodput_mbps: f64,
    /// IP bytes the link delivered upstream after the warm-up ÷ its rate.
    pub utilisation: f64,
    /// Mean time in the modem's (the link's) queue upstream, ms.
    pub modem_queue_ms: f64,
    /// Relay lateness p99 of the two directions' worse one, µs.
    pub lateness_p99_us: u64,
}

/// One device's `--delays` CSV: (sent_s, delay_ms, bytes) per record.
fn read_delays(path: &Path) -> Result<Vec<(f64, f64, usize)>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            match (
                f.get(1).and_then(|v| v.parse().ok()),
                f.get(2).and_then(|v| v.parse().ok()),
                f.get(4).and_then(|v| v.parse().ok()),
            ) {
                (Some(s), Some(d), Some(b)) => Ok((s, d, b)),
                _ => Err(format!("{}: bad line '{l}'", path.display())),
            }
        })
        .collect()
}

/// The value at quantile `q` of sorted `v` (nearest rank).
fn quantile(v: &[f64], q: f64) -> f64 {
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// The gateway's configuration file for `scheme`.
fn gateway_toml(scheme: &str) -> String {
    let peer = qgate_linkem::netns::address(1, 2);
    let local = qgate_linkem::netns::address(1, 1);
    let mut s = format!(
        "[gateway]\nlisten = \"127.0.0.1:4443\"\nserver = \"{peer}:4433\"\n\n\
         [[gateway.paths]]\nlocal = \"{local}:0\"\n"
    );
    if scheme != "unshaped" {
        let _ = writeln!(s, "shape = \"rate={SHAPE_RATE},queue={scheme}\"");
    }
    s
}

/// The inside command: the gateway, then the bulk devices, then after the warm-up the priority
/// device; then the gateway is stopped. Exits non-zero if any device failed.
fn inside_script(cfg: &EdgeConfig, dir: &Path) -> String {
    let q = cfg.qgate.display();
    let d = dir.display();
    let bulk_for = cfg.warmup + cfg.seconds + 1;
    let count = (cfg.seconds as f64 * PRIORITY_RATE) as usize;
    let mut s = format!(
        "export QGATE_HOME='{d}/home'; status=0; \
         wait_for() {{ i=0; until grep -q listening \"$1\" 2>/dev/null; do i=$((i+1)); \
           [ $i -gt 400 ] && echo \"$1: not listening after 20 s\" >&2 && exit 1; sleep 0.05; done; }}; \
         wait_for '{d}/server.log'; \
         '{q}' --config '{d}/gateway.toml' gateway > '{d}/gateway.log' 2>&1 & GW=$!; \
         wait_for '{d}/gateway.log'; PIDS=''; "
    );
    for n in 1..=cfg.bulk {
        let _ = write!(
            s,
            "'{q}' device https://localhost:4443 --count 1000000 --for {bulk_for}s --size {BULK_BYTES} \
             --stream bulk --delays '{d}/bulk{n}.csv' > '{d}/bulk{n}.log' 2>&1 & PIDS=\"$PIDS $!\"; "
        );
    }
    let _ = write!(
        s,
        "sleep {w}; '{q}' device https://localhost:4443 --priority --rate {PRIORITY_RATE} \
         --count {count} --size {PRIORITY_BYTES} --stream priority --delays '{d}/priority.csv' \
         > '{d}/priority.log' 2>&1 || status=1; \
         for p in $PIDS; do wait $p || status=1; done; \
         kill -TERM $GW; wait $GW; exit $status",
        w = cfg.warmup
    );
    s
}

/// Run every (scheme, rep), repetitions outermost so a drift of the machine spreads over every
/// scheme; `progress` hears each finished run.
pub fn run(
    cfg: &EdgeConfig,
    work_dir: &Path,
    mut progress: impl FnMut(&EdgeRun, usize, usize),
) -> Result<Vec<EdgeRun>, String> {
    let total = cfg.schemes.len() * cfg.reps as usize;
    let mut out = Vec::new();
    for rep in 1..=cfg.reps {
        for scheme in &cfg.schemes {
            let dir = work_dir.join(format!("{scheme}-{rep}"));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(dir.join("home"))
                .map_err(|e| format!("{}: {e}", dir.display()))?;
            std::fs::write(dir.join("gateway.toml"), gateway_toml(scheme))
                .map_err(|e| format!("{}: {e}", dir.display()))?;
            let linkem = LinkemConfig {
                paths: vec![PathConfig {
                    link: ChangeSpec::Text(LINK.into()),
                    uplink: None,
                    downlink: None,
                }],
                outside: Some(format!(
                    "QGATE_HOME='{d}/home' exec '{q}' server --listen 0.0.0.0:4433 > '{d}/server.log' 2>&1",
                    q = cfg.qgate.display(),
                    d = dir.display()
                )),
                seed: Some(rep),
                warmup: Some(format!("{}s", cfg.warmup)),
                ..Default::default()
            };
            let command = vec!["sh".to_string(), "-c".into(), inside_script(cfg, &dir)];
            let outcome = qgate_linkem::run(&linkem, &command).map_err(|e| e.to_string())?;
            if let Some(sig) = outcome.interrupted_by {
                return Err(format!("interrupted by signal {sig}"));
            }
            let log = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
            if let Some(code) = outcome.outside_ended_early {
                return Err(format!(
                    "the server ended early (status {code}):\n{}",
                    log("server.log")
                ));
            }
            if outcome.exit_code != 0 {
                return Err(format!(
                    "{scheme} rep {rep}: a device or the gateway failed (status {}); logs in {}:\n{}{}",
                    outcome.exit_code,
                    dir.display(),
                    log("priority.log"),
                    log("gateway.log")
                ));
            }
            let prio = read_delays(&dir.join("priority.csv"))?;
            if prio.is_empty() {
                return Err(format!("{scheme} rep {rep}: no priority record answered"));
            }
            let mut delays: Vec<f64> = prio.iter().map(|r| r.1).collect();
            delays.sort_by(f64::total_cmp);
            // Bulk bytes answered while the priority device sent (each device's clock starts
            // with its process, within milliseconds of the others).
            let (from, to) = (cfg.warmup as f64, (cfg.warmup + cfg.seconds) as f64);
            let mut bulk_bytes = 0usize;
            for n in 1..=cfg.bulk {
                for (sent, delay, bytes) in read_delays(&dir.join(format!("bulk{n}.csv")))? {
                    let answered = sent + delay / 1000.0;
                    if answered >= from && answered < to {
                        bulk_bytes += bytes;
                    }
                }
            }
            let way = |w: Way| outcome.reports.iter().find(|r| r.way == w);
            let (Some(up), Some(down)) = (way(Way::Uplink), way(Way::Downlink)) else {
                return Err("linkem reported no path 1".into());
            };
            let r = EdgeRun {
                scheme: scheme.clone(),
                rep,
                priority_n: delays.len(),
                priority_mean_ms: Summary::of(&delays).mean,
                priority_p50_ms: quantile(&delays, 0.5),
                priority_p99_ms: quantile(&delays, 0.99),
                bulk_goodput_mbps: bulk_bytes as f64 * 8.0 / 1e6 / (to - from),
                utilisation: delivered_mbps(up) / LINK_MBPS,
                modem_queue_ms: up.queue_delay_us.mean() / 1000.0,
                lateness_p99_us: up
                    .lateness_us
                    .value_at_quantile(0.99)
                    .max(down.lateness_us.value_at_quantile(0.99)),
            };
            out.push(r.clone());
            progress(&r, out.len(), total);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    Ok(out)
}

/// results.csv: one row per run.
pub fn csv(runs: &[EdgeRun]) -> String {
    let mut s = String::from(
        "scheme,rep,priority_n,priority_mean_ms,priority_p50_ms,priority_p99_ms,bulk_goodput_mbps,utilisation,modem_queue_ms,lateness_p99_us\n",
    );
    for r in runs {
        let _ = writeln!(
            s,
            "{},{},{},{:.3},{:.3},{:.3},{:.4},{:.4},{:.3},{}",
            r.scheme,
            r.rep,
            r.priority_n,
            r.priority_mean_ms,
            r.priority_p50_ms,
            r.priority_p99_ms,
            r.bulk_goodput_mbps,
            r.utilisation,
            r.modem_queue_ms,
            r.lateness_p99_us
        );
    }
    s
}

/// summary.md: per scheme, mean ± sd (n) of each measure, each shaped scheme against unshaped
/// (Welch's test on the priority delay, the goodput cost), all computed from `runs`.
pub fn summary(cfg: &EdgeConfig, runs: &[EdgeRun], command: &str) -> String {
    let mut s =
        String::from("# Paper 004 at the gateway's edge: shaping the backhaul through an AQM\n\n");
    let _ = writeln!(
        s,
        "`qgate server` outside `qgate linkem`; inside, `qgate gateway` with one backhaul path over \
         the emulated access link (`{LINK}`: about {:.1} s of drop-tail buffer at its rate, a \
         bloated modem), {} best-effort devices posting {} KiB records back to back, and after \
         {} s one priority device posting a {PRIORITY_BYTES}-byte record every {:.0} ms for {} s. \
         Shaped schemes: `[[gateway.paths]] shape = \"rate={SHAPE_RATE},queue=…\"` (the gateway \
         releases the path's datagrams at 95 % of the link's rate through that discipline, so \
         the standing queue forms in the gateway). {} repetitions (linkem seeds 1–{}; real time, \
         so no two runs repeat exactly). Bulk goodput counts the bulk records answered while the \
         priority device sent; utilisation and the modem's queue are the link's upstream \
         direction after the warm-up.\n\nReproduce: `{command}`\n",
        1000.0 * 1500.0 * 8.0 / (LINK_MBPS * 1e6),
        cfg.bulk,
        BULK_BYTES / 1024,
        cfg.warmup,
        1000.0 / PRIORITY_RATE,
        cfg.seconds,
        cfg.reps,
        cfg.reps
    );
    let _ = writeln!(
        s,
        "| scheme | priority delay mean, ms | p50, ms | p99, ms | bulk goodput, Mbit/s | link utilisation | modem queue, ms | lateness p99, µs (max) |\n|---|---|---|---|---|---|---|---|"
    );
    let pick = |scheme: &str, f: fn(&EdgeRun) -> f64| -> Vec<f64> {
        runs.iter().filter(|r| r.scheme == scheme).map(f).collect()
    };
    for scheme in &cfg.schemes {
        let these: Vec<&EdgeRun> = runs.iter().filter(|r| &r.scheme == scheme).collect();
        if these.is_empty() {
            continue;
        }
        let f = |g: fn(&EdgeRun) -> f64| Summary::of(&pick(scheme, g));
        let (m, p50, p99, good, util, modem) = (
            f(|r| r.priority_mean_ms),
            f(|r| r.priority_p50_ms),
            f(|r| r.priority_p99_ms),
            f(|r| r.bulk_goodput_mbps),
            f(|r| r.utilisation),
            f(|r| r.modem_queue_ms),
        );
        let late = these.iter().map(|r| r.lateness_p99_us).max().unwrap_or(0);
        let _ = writeln!(
            s,
            "| {scheme} | {:.1} ± {:.1} (n = {}) | {:.1} ± {:.1} | {:.1} ± {:.1} | {:.2} ± {:.2} | {:.3} ± {:.3} | {:.1} ± {:.1} | {late} |",
            m.mean, m.std, these.len(), p50.mean, p50.std, p99.mean, p99.std, good.mean, good.std,
            util.mean, util.std, modem.mean, modem.std
        );
    }
    let base = pick("unshaped", |r| r.priority_mean_ms);
    let base_good = Summary::of(&pick("unshaped", |r| r.bulk_goodput_mbps)).mean;
    if !base.is_empty() {
        let mut lines = Vec::new();
        for scheme in cfg.schemes.iter().filter(|s| *s != "unshaped") {
            let d = pick(scheme, |r| r.priority_mean_ms);
            if d.is_empty() {
                continue;
            }
            let good = Summary::of(&pick(scheme, |r| r.bulk_goodput_mbps)).mean;
            let (md, mb) = (Summary::of(&d).mean, Summary::of(&base).mean);
            lines.push(format!(
                "- **{scheme}**: priority delay {md:.1} ms against {mb:.1} ms unshaped ({:.1}× lower, {}); bulk goodput {good:.2} against {base_good:.2} Mbit/s ({:+.1} %).",
                mb / md.max(1e-9),
                Welch::p_label(Welch::test(&d, &base)),
                (good / base_good.max(1e-9) - 1.0) * 100.0
            ));
        }
        let _ = writeln!(
            s,
            "\nAgainst the unshaped path (means over the repetitions, Welch's p):\n\n{}",
            lines.join("\n")
        );
        let modem_base = Summary::of(&pick("unshaped", |r| r.modem_queue_ms)).mean;
        let modem_shaped: Vec<f64> = runs
            .iter()
            .filter(|r| r.scheme != "unshaped")
            .map(|r| r.modem_queue_ms)
            .collect();
        if !modem_shaped.is_empty() {
            let mx = modem_shaped.iter().cloned().fold(0.0, f64::max);
            let _ = writeln!(
                s,
                "\nWhere the queue is: unshaped, packets waited {modem_base:.1} ms on average in the \
                 modem's buffer; shaped, at most {mx:.2} ms in any run — the queue moved into the \
                 gateway, where the discipline keeps it short."
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_config_shapes_only_shaped_schemes_and_parses() {
        assert!(!gateway_toml("unshaped").contains("shape"));
        let t = gateway_toml("fq-codel");
        assert!(
            t.contains("queue=fq-codel") && t.contains(SHAPE_RATE),
            "{t}"
        );
        let v: toml::Value = toml::from_str(&t).unwrap();
        assert_eq!(
            v["gateway"]["paths"][0]["local"].as_str(),
            Some("10.77.1.1:0")
        );
    }

    #[test]
    fn quantiles_take_the_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&[7.0], 0.99), 7.0);
    }
}
