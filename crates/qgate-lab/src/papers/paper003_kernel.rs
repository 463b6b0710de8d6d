//! Paper 003 with the **kernel's TCP** (issue 13 item 3): `qgate broker` and `qgate send`
//! through `qgate-lab linkem` in real time, AMQP over QUIC (quinn on real UDP sockets) against AMQP
//! over TLS 1.2 and 1.3 on the kernel's TCP (the host's congestion control, named in the
//! summary), on the same emulated channel. The simulated lab (`qgate-lab amqp`) runs the same cases over a user-space TCP,
//! because the simulator has no kernel; this is the check that its TCP baseline is not a
//! straw man. Needs root.
//!
//! Per run: the broker (memory queues) outside, the sender inside, ten one-message connections
//! in turn (`qgate send --one-per-connection`: each opening pipelined in one flight, 0-RTT or
//! TLS resumption once a ticket is held), 138-byte bodies; the channel is path 1 of linkem, its
//! settings in both directions.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use qgate_linkem::config::{ChangeSpec, LinkemConfig, PathConfig};
use qgate_linkem::Way;

use crate::stats::{Summary, Welch};

/// The transports compared, as `qgate send --transport` names them.
pub const TRANSPORTS: &[&str] = &["quic", "tcp-tls12", "tcp-tls"];

/// Repetitions of each case unless asked otherwise.
pub const DEFAULT_REPS: u64 = 5;

/// Body bytes of each message (paper 003 §4.3's sample message).
pub const BODY: usize = crate::plan::spec::DEFAULT_AMQP_BODY;

/// One emulated channel: a label and linkem's link text.
#[derive(Debug, Clone, PartialEq)]
pub struct Channel {
    /// As the report prints it (no commas: it is a CSV field).
    pub label: String,
    /// linkem's `--link` text (both directions).
    pub link: String,
    /// The same channel in the simulated lab's results.csv: its sweep, rate (bit/s), delay
    /// (ms), loss (fraction). A channel in two sweeps is taken from one, so no run counts twice.
    pub netsim: (&'static str, u64, u64, f64),
}

impl Channel {
    fn new(label: &str, link: &str, netsim: (&'static str, u64, u64, f64)) -> Channel {
        debug_assert!(!label.contains(','), "a label is a CSV field");
        Channel {
            label: label.into(),
            link: link.into(),
            netsim,
        }
    }
}

/// The simulated lab's transport name for one of ours (`tcp-tls` is TLS 1.3 there).
fn netsim_name(t: &str) -> &str {
    if t == "tcp-tls" {
        "tcp-tls13"
    } else {
        t
    }
}

/// Mean total time (s) and n of the simulated lab's sweep runs (results/amqp/results.csv) for
/// `transport` on `ch`; None if that file has none.
fn netsim_total(netsim_csv: &str, ch: &Channel, transport: &str) -> Option<Summary> {
    let mut lines = netsim_csv.lines();
    let header: Vec<&str> = lines.next()?.split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name);
    let (case, sweep, rate, delay, loss, tr, testbed, side, total) = (
        col("case")?,
        col("sweep")?,
        col("rate_bps")?,
        col("delay_ms")?,
        col("loss")?,
        col("transport")?,
        col("testbed")?,
        col("side")?,
        col("total_s")?,
    );
    let (sw, r, d, l) = ch.netsim;
    let v: Vec<f64> = lines
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|f| f.len() == header.len())
        .filter(|f| f[case] == "sweep" && f[sweep] == sw)
        .filter(|f| f[testbed] == "netsim" && f[side] == "send")
        .filter(|f| f[tr] == netsim_name(transport))
        .filter(|f| {
            f[rate].parse() == Ok(r)
                && f[delay].parse() == Ok(d)
                && f[loss].parse::<f64>().is_ok_and(|x| (x - l).abs() < 1e-9)
        })
        .filter_map(|f| f[total].parse().ok())
        .collect();
    (!v.is_empty()).then(|| Summary::of(&v))
}

/// What to run.
#[derive(Debug, Clone)]
pub struct KernelAmqpConfig {
    /// Transports.
    pub transports: Vec<String>,
    /// Channels.
    pub channels: Vec<Channel>,
    /// Repetitions of each (linkem seeds 1..=reps).
    pub reps: u64,
    /// One-message connections per run.
    pub messages: u64,
    /// The qgate binary that runs the broker and the sender.
    pub qgate: PathBuf,
}

impl KernelAmqpConfig {
    /// The default cases: the Wi-Fi-like channel of the simulated lab, then its rate, delay
    /// and loss sweeps at points that run in seconds.
    pub fn new(qgate: PathBuf) -> KernelAmqpConfig {
        KernelAmqpConfig {
            transports: TRANSPORTS.iter().map(|t| t.to_string()).collect(),
            channels: vec![
                Channel::new(
                    "54 Mbit/s 2 ms",
                    "rate=54mbit,delay=2ms",
                    ("delay", 54_000_000, 2, 0.0),
                ),
                Channel::new(
                    "1024 kbit/s 2 ms",
                    "rate=1024kbit,delay=2ms",
                    ("bandwidth", 1_024_000, 2, 0.0),
                ),
                Channel::new(
                    "54 Mbit/s 202 ms",
                    "rate=54mbit,delay=202ms",
                    ("delay", 54_000_000, 202, 0.0),
                ),
                Channel::new(
                    "54 Mbit/s 2 ms 5 % loss",
                    "rate=54mbit,delay=2ms,loss=0.05",
                    ("loss", 54_000_000, 2, 0.05),
                ),
            ],
            reps: DEFAULT_REPS,
            messages: 10,
            qgate,
        }
    }
}

/// One run's measurements.
#[derive(Debug, Clone)]
pub struct KernelRun {
    /// Transport.
    pub transport: String,
    /// Channel label.
    pub channel: String,
    /// Repetition (the linkem seed).
    pub rep: u64,
    /// First connection start → last connection closed, s (the sender's clock).
    pub total_s: f64,
    /// Mean connection start → first message written, ms.
    pub startup_ms: f64,
    /// IP bytes on the channel, both directions, lost ones included.
    pub wire_bytes: u64,
    /// Packets the channel dropped (loss), both directions.
    pub lost_packets: u64,
    /// Relay lateness p99 of the two directions' worse one, µs.
    pub lateness_p99_us: u64,
}

/// Run every (channel, transport, rep) in turn, reps outermost so a drift of the machine spreads
/// over every case; `progress` hears each finished run.
pub fn run(
    cfg: &KernelAmqpConfig,
    work_dir: &Path,
    mut progress: impl FnMut(&KernelRun, usize, usize),
) -> Result<Vec<KernelRun>, String> {
    std::fs::create_dir_all(work_dir).map_err(|e| format!("{}: {e}", work_dir.display()))?;
    let q = cfg.qgate.display();
    let total = cfg.channels.len() * cfg.transports.len() * cfg.reps as usize;
    let mut out = Vec::new();
    for rep in 1..=cfg.reps {
        for ch in &cfg.channels {
            for t in &cfg.transports {
                let port = if t == "quic" { 5671 } else { 5672 };
                let log = work_dir.join("send.log");
                let broker_log = work_dir.join("broker.log");
                let _ = std::fs::remove_file(&broker_log);
                let linkem = LinkemConfig {
                    paths: vec![PathConfig {
                        link: ChangeSpec::Text(ch.link.clone()),
                        uplink: None,
                        downlink: None,
                    }],
                    outside: Some(format!(
                        "exec '{q}' broker --memory --quic 0.0.0.0:5671 --tls 0.0.0.0:5672 > '{}' 2>&1",
                        broker_log.display()
                    )),
                    settle: Some("1s".into()),
                    seed: Some(rep),
                    ..Default::default()
                };
                let command = vec![
                    "sh".to_string(),
                    "-c".into(),
                    // Once the broker says it listens (at most 20 s), so a slow start is not
                    // timed; `qgate send` measures from its first connection.
                    format!(
                        "i=0; until grep -q listening '{b}' 2>/dev/null; do i=$((i+1)); \
                         [ $i -gt 400 ] && echo 'the broker did not start' > '{l}' && exit 1; \
                         sleep 0.05; done; \
                         exec '{q}' send $QGATE_LINKEM_PEER:{port} iot --transport {t} --count {} \
                         --size {BODY} --one-per-connection > '{l}' 2>&1",
                        cfg.messages,
                        b = broker_log.display(),
                        l = log.display()
                    ),
                ];
                let outcome = qgate_linkem::run(&linkem, &command).map_err(|e| e.to_string())?;
                if let Some(sig) = outcome.interrupted_by {
                    return Err(format!("interrupted by signal {sig}"));
                }
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                if let Some(code) = outcome.outside_ended_early {
                    let b = std::fs::read_to_string(&broker_log).unwrap_or_default();
                    return Err(format!("the broker ended early (status {code}):\n{b}"));
                }
                if outcome.exit_code != 0 {
                    return Err(format!(
                        "{t} over {}: qgate send exited with status {}:\n{text}",
                        ch.label, outcome.exit_code
                    ));
                }
                let (total_s, startup_ms) = qgate::parse_send_line(&text)
                    .ok_or_else(|| format!("no summary line from qgate send:\n{text}"))?;
                let way = |w: Way| outcome.reports.iter().find(|r| r.way == w);
                let (Some(up), Some(down)) = (way(Way::Uplink), way(Way::Downlink)) else {
                    return Err("linkem reported no path 1".into());
                };
                let bytes = |r: &qgate_linkem::RelayReport| {
                    r.stats.delivered_bytes + r.stats.dropped_loss_bytes
                };
                let r = KernelRun {
                    transport: t.clone(),
                    channel: ch.label.clone(),
                    rep,
                    total_s,
                    startup_ms,
                    wire_bytes: bytes(up) + bytes(down),
                    lost_packets: up.stats.dropped_loss + down.stats.dropped_loss,
                    lateness_p99_us: up
                        .lateness_us
                        .value_at_quantile(0.99)
                        .max(down.lateness_us.value_at_quantile(0.99)),
                };
                out.push(r.clone());
                progress(&r, out.len(), total);
            }
        }
    }
    Ok(out)
}

/// results.csv: one row per run.
pub fn csv(runs: &[KernelRun]) -> String {
    let mut s = String::from(
        "transport,channel,rep,total_s,startup_ms,wire_bytes,lost_packets,lateness_p99_us\n",
    );
    for r in runs {
        let _ = writeln!(
            s,
            "{},{},{},{:.4},{:.3},{},{},{}",
            r.transport,
            r.channel,
            r.rep,
            r.total_s,
            r.startup_ms,
            r.wire_bytes,
            r.lost_packets,
            r.lateness_p99_us
        );
    }
    s
}

/// summary.md: per channel, each transport's total time, startup and bytes (mean ± sd, n) and
/// QUIC against TLS 1.2 with Welch's test, beside the simulated lab's total time for the same
/// channel and transport (from its results.csv, `netsim_csv`, when given); then what the numbers
/// say, computed from them.
pub fn summary(
    cfg: &KernelAmqpConfig,
    runs: &[KernelRun],
    netsim_csv: Option<&str>,
    command: &str,
) -> String {
    let mut s = String::from("# Paper 003 with the kernel's TCP through `qgate-lab linkem`\n\n");
    let _ = writeln!(
        s,
        "`qgate broker` (memory queues) outside the emulated channel, `qgate send` inside: {} \
         one-message connections in turn ({BODY}-byte bodies, each opening pipelined in one \
         flight; QUIC in 0-RTT and TLS resumed once a ticket is held), AMQP over QUIC (quinn) \
         against AMQP over TLS 1.2 and 1.3 on the **kernel's TCP** ({}), the channel's settings \
         in both directions. {} repetitions per case (linkem seeds 1–{}: loss draws differ, and \
         real-time runs never repeat exactly). Bytes: IP packets on the channel, both \
         directions, lost ones included. The simulated lab runs the same cases over a \
         user-space TCP: `results/amqp/summary.md`.\n\nReproduce: `{command}`\n",
        cfg.messages,
        std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
            .map(|c| c.trim().to_string())
            .unwrap_or_else(|_| "the host's congestion control".into()),
        cfg.reps,
        cfg.reps
    );
    let _ = writeln!(
        s,
        "| channel | transport | total time, s | vs tcp-tls12 | simulated lab (user-space TCP), s | startup, ms | bytes on the wire | lost packets | lateness p99, µs (max) |\n|---|---|---|---|---|---|---|---|---|"
    );
    let mut findings = Vec::new();
    let mut sim_rows = Vec::new();
    for ch in &cfg.channels {
        let of = |t: &str, f: fn(&KernelRun) -> f64| -> Vec<f64> {
            runs.iter()
                .filter(|r| r.channel == ch.label && r.transport == t)
                .map(f)
                .collect()
        };
        let base = of("tcp-tls12", |r| r.total_s);
        for t in &cfg.transports {
            let total = of(t, |r| r.total_s);
            if total.is_empty() {
                continue;
            }
            let (tt, st, by, lost) = (
                Summary::of(&total),
                Summary::of(&of(t, |r| r.startup_ms)),
                Summary::of(&of(t, |r| r.wire_bytes as f64)),
                Summary::of(&of(t, |r| r.lost_packets as f64)),
            );
            let late = runs
                .iter()
                .filter(|r| r.channel == ch.label && &r.transport == t)
                .map(|r| r.lateness_p99_us)
                .max()
                .unwrap_or(0);
            let vs = if t == "tcp-tls12" || base.is_empty() {
                "—".to_string()
            } else {
                let b = Summary::of(&base).mean;
                format!(
                    "{:+.0} % ({})",
                    (tt.mean / b - 1.0) * 100.0,
                    Welch::p_label(Welch::test(&base, &total))
                )
            };
            let sim = netsim_csv.and_then(|c| netsim_total(c, ch, t));
            let sim_cell = sim.as_ref().map_or("—".to_string(), |m| {
                format!("{:.3} ± {:.3} (n = {})", m.mean, m.std, m.n)
            });
            if let Some(m) = &sim {
                sim_rows.push(format!(
                    "{} {t} ×{:.2}",
                    ch.label,
                    tt.mean / m.mean.max(1e-9)
                ));
            }
            let _ = writeln!(
                s,
                "| {} | {t} | {:.3} ± {:.3} (n = {}) | {vs} | {sim_cell} | {:.2} ± {:.2} | {:.0} ± {:.0} | {:.1} ± {:.1} | {late} |",
                ch.label, tt.mean, tt.std, tt.n, st.mean, st.std, by.mean, by.std, lost.mean, lost.std
            );
            if t == "quic" {
                let against: Vec<String> = [("tcp-tls12", "TLS 1.2"), ("tcp-tls", "TLS 1.3")]
                    .into_iter()
                    .filter_map(|(name, label)| {
                        let other = of(name, |r| r.total_s);
                        let w = Welch::test(&other, &total)?;
                        let o = Summary::of(&other).mean;
                        Some(if w.p < 0.05 && w.ci95.0 != w.ci95.1 {
                            format!(
                                "{} than {label} ({:.3} s, {:+.0} %, {})",
                                if tt.mean < o { "faster" } else { "slower" },
                                o,
                                (tt.mean / o - 1.0) * 100.0,
                                Welch::p_label(Some(w))
                            )
                        } else {
                            format!(
                                "no significant difference from {label} ({:.3} s, {})",
                                o,
                                Welch::p_label(Some(w))
                            )
                        })
                    })
                    .collect();
                if !against.is_empty() {
                    findings.push(format!(
                        "{}: QUIC {:.3} s, {}",
                        ch.label,
                        tt.mean,
                        against.join(", ")
                    ));
                }
            }
        }
    }
    if !findings.is_empty() {
        let _ = writeln!(
            s,
            "\nTotal time of the {} connections, QUIC against TCP+TLS on the kernel's TCP: {}.",
            cfg.messages,
            findings.join("; ")
        );
    }
    if !sim_rows.is_empty() {
        let _ = writeln!(
            s,
            "\nReal (kernel TCP, real UDP) total time ÷ the simulated lab's for the same channel \
             and transport: {}. The simulated lab's TCP is smoltcp (1 s minimum RTO, no SACK; \
             decision X11), the kernel's has a 200 ms minimum RTO and SACK.",
            sim_rows.join("; ")
        );
    }
    let late: Vec<&KernelRun> = runs.iter().filter(|r| r.lateness_p99_us > 1000).collect();
    let _ = writeln!(
        s,
        "\nRelay lateness p99 above 1 ms (the emulated link's timing off by more than that for 1 % \
         of packets): {} of {} runs{}.",
        late.len(),
        runs.len(),
        late.iter()
            .map(|r| format!(" ({} over {} rep {}: {} µs)", r.transport, r.channel, r.rep, r.lateness_p99_us))
            .collect::<String>()
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_simulated_labs_runs_of_a_channel_are_found() {
        let csv = "case,sweep,rate_bps,delay_ms,loss,transport,testbed,side,total_s\n\
                   sweep,loss,54000000,2,0.05,quic,netsim,send,1.0\n\
                   sweep,loss,54000000,2,0.05,quic,netsim,send,3.0\n\
                   sweep,loss,54000000,2,0.05,quic,netsim,recv,9.0\n\
                   sweep,loss,54000000,2,0.1,quic,netsim,send,9.0\n\
                   sweep,loss,54000000,2,0.05,tcp-tls13,netsim,send,5.0\n\
                   multi,default,54000000,2,0.05,quic,netsim,send,9.0\n";
        let ch = Channel::new(
            "x",
            "rate=54mbit,delay=2ms,loss=0.05",
            ("loss", 54_000_000, 2, 0.05),
        );
        let q = netsim_total(csv, &ch, "quic").unwrap();
        assert_eq!((q.mean, q.n), (2.0, 2));
        assert_eq!(netsim_total(csv, &ch, "tcp-tls").unwrap().mean, 5.0);
        assert!(netsim_total(csv, &ch, "tcp-tls12").is_none());
    }
}
