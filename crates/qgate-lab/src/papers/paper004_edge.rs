//! Paper 004 **in the product** (issue 13 item 5): the real `qgate gateway` shapes its backhaul
//! egress through a queue discipline (decision L8), so the standing queue forms in the gateway
//! under an AQM instead of in a bloated modem. Real time through `qgate-lab linkem`, real processes,
//! real UDP. Needs root.
//!
//! One emulated path is the backhaul's access link: 10 Mbit/s, 20 ms each way, a 1000-packet
//! drop-tail buffer (the modem: about 1.2 s of queue at that rate). `qgate server` runs outside;
//! inside, `qgate gateway` with that path, `bulk` best-effort devices posting 256 KiB records back
//! to back, and after the warm-up one priority device posting a 200-byte record every 100 ms.
//! Schemes: the path unshaped, or shaped to `SHAPE_PER_MILLE` of the link's rate (so the modem's
//! buffer stays empty) through PID-Delay, our stable PID-Delay, FQ-CoDel or PIE (decision L13).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use qgate_linkem::config::{ChangeSpec, LinkemConfig, PathConfig};
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

/// The access link's rate (both directions), kbit/s.
pub const LINK_KBPS: u64 = 10_000;
/// Its one-way delay, ms.
pub const LINK_DELAY_MS: u64 = 20;
/// Its drop-tail buffer, packets: the bloated modem.
pub const MODEM_PACKETS: u64 = 1000;
/// What the gateway shapes to, per mille of the link's rate: a little under it, so the
/// gateway's queue is the one that fills (the SQM rule of thumb).
pub const SHAPE_PER_MILLE: u64 = 950;
/// Priority records in flight at most (and the gateway's per-device limit in this lab): enough
/// that records start on schedule even while the modem holds a second of queue.
pub const PRIORITY_INFLIGHT: usize = 64;

/// linkem's text for the access link.
pub fn link() -> String {
    format!("rate={LINK_KBPS}kbit,delay={LINK_DELAY_MS}ms,queue=droptail:packets={MODEM_PACKETS}")
}

/// The rate the gateway shapes to, as the shape text says it.
fn shape_rate() -> String {
    format!("{}kbit", LINK_KBPS * SHAPE_PER_MILLE / 1000)
}

/// `s` as one single-quoted shell word.
fn sh(s: &impl std::fmt::Display) -> String {
    format!("'{}'", s.to_string().replace('\'', r"'\''"))
}
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
        "[gateway]\nlisten = \"127.0.0.1:4443\"\nserver = \"{peer}:4433\"\n\
         max_inflight_per_device = {PRIORITY_INFLIGHT}\n\n\
         [[gateway.paths]]\nlocal = \"{local}:0\"\n"
    );
    if scheme != "unshaped" {
        let _ = writeln!(s, "shape = \"rate={},queue={scheme}\"", shape_rate());
    }
    s
}

/// The inside command: the gateway, then the bulk devices, then after the warm-up the priority
/// device (open loop: each record starts on schedule, answered or not); the bulk devices keep
/// sending until 2 s after the priority device's last record is due; then the gateway is
/// stopped. Exits non-zero if any device failed.
fn inside_script(cfg: &EdgeConfig, dir: &Path) -> String {
    let q = sh(&cfg.qgate.display());
    let f = |name: &str| sh(&dir.join(name).display());
    let bulk_for = cfg.warmup + cfg.seconds + 2;
    // As many records as the whole link could carry for that long: never the limit.
    let bulk_count = (bulk_for * LINK_KBPS * 1000 / 8).div_ceil(BULK_BYTES as u64) + 1;
    let count = (cfg.seconds as f64 * PRIORITY_RATE) as usize;
    let mut s = format!(
        "export QGATE_HOME={home}; status=0; \
         wait_for() {{ i=0; until grep -q listening \"$1\" 2>/dev/null; do i=$((i+1)); \
           [ $i -gt 400 ] && echo \"$1: not listening after 20 s\" >&2 && exit 1; sleep 0.05; done; }}; \
         wait_for {server_log}; \
         {q} --config {cfg_file} gateway > {gw_log} 2>&1 & GW=$!; \
         wait_for {gw_log}; PIDS=''; ",
        home = f("home"),
        server_log = f("server.log"),
        cfg_file = f("gateway.toml"),
        gw_log = f("gateway.log"),
    );
    for n in 1..=cfg.bulk {
        let _ = write!(
            s,
            "{q} device https://localhost:4443 --count {bulk_count} --for {bulk_for}s \
             --size {BULK_BYTES} --stream bulk --delays {} > {} 2>&1 & PIDS=\"$PIDS $!\"; ",
            f(&format!("bulk{n}.csv")),
            f(&format!("bulk{n}.log"))
        );
    }
    let _ = write!(
        s,
        "sleep {w}; {q} device https://localhost:4443 --priority --rate {PRIORITY_RATE} \
         --inflight {PRIORITY_INFLIGHT} --count {count} --size {PRIORITY_BYTES} --stream priority \
         --delays {} > {} 2>&1 || status=1; \
         for p in $PIDS; do wait $p || status=1; done; \
         kill -TERM $GW; wait $GW; exit $status",
        f("priority.csv"),
        f("priority.log"),
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
                    link: ChangeSpec::Text(link()),
                    uplink: None,
                    downlink: None,
                }],
                outside: Some(format!(
                    "QGATE_HOME={} exec {} server --listen 0.0.0.0:4433 > {} 2>&1",
                    sh(&dir.join("home").display()),
                    sh(&cfg.qgate.display()),
                    sh(&dir.join("server.log").display())
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
                let bulk: String = (1..=cfg.bulk)
                    .map(|n| log(&format!("bulk{n}.log")))
                    .collect();
                return Err(format!(
                    "{scheme} rep {rep}: a device or the gateway failed (status {}); logs in {}:\n{}{bulk}{}",
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

/// The runs of a results.csv that [`csv`] wrote.
pub fn parse_csv(text: &str) -> Result<Vec<EdgeRun>, String> {
    super::parse_rows(text, 9, |f| {
        Some(EdgeRun {
            scheme: f[0].into(),
            rep: f[1].parse().ok()?,
            priority_n: f[2].parse().ok()?,
            priority_mean_ms: f[3].parse().ok()?,
            priority_p50_ms: f[4].parse().ok()?,
            priority_p99_ms: f[5].parse().ok()?,
            bulk_goodput_mbps: f[6].parse().ok()?,
            modem_queue_ms: f[7].parse().ok()?,
            lateness_p99_us: f[8].parse().ok()?,
        })
    })
}

/// results.csv: one row per run.
pub fn csv(runs: &[EdgeRun]) -> String {
    let mut s = String::from(
        "scheme,rep,priority_n,priority_mean_ms,priority_p50_ms,priority_p99_ms,bulk_goodput_mbps,modem_queue_ms,lateness_p99_us\n",
    );
    for r in runs {
        let _ = writeln!(
            s,
            "{},{},{},{:.3},{:.3},{:.3},{:.4},{:.3},{}",
            r.scheme,
            r.rep,
            r.priority_n,
            r.priority_mean_ms,
            r.priority_p50_ms,
            r.priority_p99_ms,
            r.bulk_goodput_mbps,
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
    let link_mbps = LINK_KBPS as f64 / 1000.0;
    let _ = writeln!(
        s,
        "`qgate server` outside `qgate-lab linkem`; inside, `qgate gateway` with one backhaul path over \
         the emulated access link (`{}`: {:.1} s of drop-tail buffer at its rate for 1500-byte \
         packets, a bloated modem), {} best-effort devices posting {} KiB records back to back, \
         and after {} s one priority device starting a {PRIORITY_BYTES}-byte record every {:.0} ms \
         for {} s, each on schedule whether or not earlier ones were answered (up to \
         {PRIORITY_INFLIGHT} in flight). Shaped schemes: `[[gateway.paths]] shape = \
         \"rate={},queue=…\"` ({:.1} % of the link's rate, through that discipline). \
         Repetitions: {} (linkem seeds 1–{}; real time, so no two runs repeat exactly). \
         Priority delay: from a record's start to its answer. Bulk goodput: the bulk records' \
         bytes answered while the priority device sent, against the link's {link_mbps} Mbit/s \
         (one record more or less is {:.2} Mbit/s). Modem queue: time in the link's upstream \
         buffer per packet, after the warm-up.\n\nReproduce: `{command}`\n",
        link(),
        MODEM_PACKETS as f64 * 1500.0 * 8.0 / (LINK_KBPS as f64 * 1000.0),
        cfg.bulk,
        BULK_BYTES / 1024,
        cfg.warmup,
        1000.0 / PRIORITY_RATE,
        cfg.seconds,
        shape_rate(),
        SHAPE_PER_MILLE as f64 / 10.0,
        cfg.reps,
        cfg.reps,
        BULK_BYTES as f64 * 8.0 / 1e6 / cfg.seconds as f64
    );
    let _ = writeln!(
        s,
        "| scheme | priority delay mean, ms | p50, ms | p99, ms | bulk goodput, Mbit/s | modem queue, ms | lateness p99, µs (max) |\n|---|---|---|---|---|---|---|"
    );
    let pick = |scheme: &str, f: fn(&EdgeRun) -> f64| -> Vec<f64> {
        runs.iter().filter(|r| r.scheme == scheme).map(f).collect()
    };
    let mean = |scheme: &str, f: fn(&EdgeRun) -> f64| Summary::of(&pick(scheme, f));
    for scheme in &cfg.schemes {
        let these: Vec<&EdgeRun> = runs.iter().filter(|r| &r.scheme == scheme).collect();
        if these.is_empty() {
            continue;
        }
        let (m, p50, p99, good, modem) = (
            mean(scheme, |r| r.priority_mean_ms),
            mean(scheme, |r| r.priority_p50_ms),
            mean(scheme, |r| r.priority_p99_ms),
            mean(scheme, |r| r.bulk_goodput_mbps),
            mean(scheme, |r| r.modem_queue_ms),
        );
        let late = these.iter().map(|r| r.lateness_p99_us).max().unwrap_or(0);
        // Real-time runs rarely repeat exactly; say how many different outcomes there were.
        let distinct = these
            .iter()
            .map(|r| format!("{:.3}", r.priority_mean_ms))
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        let _ = writeln!(
            s,
            "| {scheme} | {:.1} ± {:.1} (n = {}, {distinct} distinct) | {:.1} ± {:.1} | {:.1} ± {:.1} | {:.2} ± {:.2} | {:.1} ± {:.1} | {late} |",
            m.mean, m.std, these.len(), p50.mean, p50.std, p99.mean, p99.std, good.mean, good.std,
            modem.mean, modem.std
        );
    }
    let base = pick("unshaped", |r| r.priority_mean_ms);
    if base.is_empty() {
        return s;
    }
    let (mb, p99b, goodb, modemb) = (
        Summary::of(&base).mean,
        mean("unshaped", |r| r.priority_p99_ms).mean,
        mean("unshaped", |r| r.bulk_goodput_mbps).mean,
        mean("unshaped", |r| r.modem_queue_ms).mean,
    );
    let mut lines = Vec::new();
    for scheme in cfg.schemes.iter().filter(|s| *s != "unshaped") {
        let d = pick(scheme, |r| r.priority_mean_ms);
        if d.is_empty() {
            continue;
        }
        let md = Summary::of(&d).mean;
        let times = |a: f64, b: f64| {
            if a <= b {
                format!("{:.1}× lower", b / a.max(1e-9))
            } else {
                format!("{:.1}× higher", a / b.max(1e-9))
            }
        };
        let (p99, good, modem) = (
            mean(scheme, |r| r.priority_p99_ms).mean,
            mean(scheme, |r| r.bulk_goodput_mbps).mean,
            mean(scheme, |r| r.modem_queue_ms).mean,
        );
        lines.push(format!(
            "- **{scheme}**: priority delay {md:.1} ms against {mb:.1} ms ({}, {}), p99 {p99:.1} \
             against {p99b:.1} ms ({}); bulk goodput {good:.2} against {goodb:.2} Mbit/s \
             ({:+.1} %); modem queue {modem:.1} against {modemb:.1} ms.",
            times(md, mb),
            Welch::p_label(Welch::test(&d, &base)),
            times(p99, p99b),
            (good / goodb.max(1e-9) - 1.0) * 100.0
        ));
    }
    if !lines.is_empty() {
        let _ = writeln!(
            s,
            "\nEach shaped scheme against the unshaped path (means over the repetitions, Welch's p \
             on the priority delay):\n\n{}",
            lines.join("\n")
        );
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
            t.contains("queue=fq-codel") && t.contains("rate=9500kbit"),
            "{t}"
        );
        let v: toml::Value = toml::from_str(&t).unwrap();
        assert_eq!(
            v["gateway"]["paths"][0]["local"].as_str(),
            Some("10.77.1.1:0")
        );
    }

    #[test]
    fn results_csv_reads_back() {
        let r = EdgeRun {
            scheme: "pie".into(),
            rep: 2,
            priority_n: 150,
            priority_mean_ms: 70.125,
            priority_p50_ms: 70.0,
            priority_p99_ms: 84.5,
            bulk_goodput_mbps: 8.95,
            modem_queue_ms: 0.6,
            lateness_p99_us: 222,
        };
        let back = parse_csv(&csv(std::slice::from_ref(&r))).unwrap();
        assert_eq!(back.len(), 1);
        assert_eq!((back[0].scheme.as_str(), back[0].rep), ("pie", 2));
        assert_eq!(back[0].priority_mean_ms, 70.125);
        assert_eq!(back[0].lateness_p99_us, 222);
        assert!(parse_csv("h\npie,1,2").is_err());
    }

    #[test]
    fn quantiles_take_the_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 50.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&[7.0], 0.99), 7.0);
        assert_eq!(
            link(),
            "rate=10000kbit,delay=20ms,queue=droptail:packets=1000"
        );
        assert_eq!(sh(&"a b'c"), r"'a b'\''c'");
    }
}
