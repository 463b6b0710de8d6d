//! Result files of `qgate-lab amqp`: results.csv, summary.md and SVG figures.

use std::fmt::Write as _;
use std::path::Path;

use crate::papers::paper003::{
    channel_label, Case, Point, Rep, Side, Testbed, Transport, MESSAGE_BYTES,
};
use crate::plan::spec::Radio;
use crate::stats::Summary;
use crate::svg::{bar_chart, line_chart, Bar, Series as Line};

/// Wire throughput of a side, kbit/s (NaN where bytes are unknown).
fn kbps(s: &Side) -> f64 {
    s.wire_bytes * 8.0 / 1000.0 / s.total_s.max(1e-12)
}

fn sides(rep: &Rep) -> impl Iterator<Item = (&'static str, &Side)> {
    std::iter::once(("send", &rep.send)).chain(rep.recv.iter().map(|r| ("recv", r)))
}

/// results.csv: one row per repetition and side.
pub fn results_csv(points: &[Point], results: &[Vec<Rep>]) -> String {
    let mut s = String::from("case,sweep,rate_bps,delay_ms,loss,transport,testbed,messages_per_rep,rep,seed,side,messages,failed,zero_rtt,total_s,startup_ms,rtt_ms,wire_bytes,throughput_kbps,energy_j\n");
    for (p, reps) in points.iter().zip(results) {
        for r in reps {
            for (side, x) in sides(r) {
                let _ = writeln!(
                    s,
                    "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.6},{:.4},{:.4},{},{:.3},{:.6}",
                    p.case.name(),
                    p.sweep,
                    p.channel.rate_bps,
                    p.channel.delay.as_millis(),
                    p.channel.loss,
                    p.transport.name(),
                    p.testbed.name(),
                    p.messages,
                    r.rep,
                    r.seed,
                    side,
                    x.messages,
                    x.failed,
                    x.zero_rtt,
                    x.total_s,
                    x.startup_ms,
                    x.rtt_ms,
                    x.wire_bytes,
                    kbps(x),
                    x.energy_j
                );
            }
        }
    }
    s
}

fn summary(reps: &[Rep], side: &str, f: impl Fn(&Side) -> f64) -> Summary {
    Summary::of(
        &reps
            .iter()
            .flat_map(sides)
            .filter(|(s, _)| *s == side)
            .map(|(_, x)| f(x))
            .filter(|v| v.is_finite())
            .collect::<Vec<_>>(),
    )
}

/// How many different values `f` took over the repetitions (seeds that agree exactly count
/// once), with n.
fn outcomes(reps: &[Rep], side: &str, f: impl Fn(&Side) -> f64) -> String {
    let mut v: Vec<u64> = reps
        .iter()
        .flat_map(sides)
        .filter(|(s, _)| *s == side)
        .map(|(_, x)| f(x).to_bits())
        .collect();
    let n = v.len();
    v.sort_unstable();
    v.dedup();
    format!("n = {n}, {} distinct", v.len())
}

fn find<'a>(
    points: &[Point],
    results: &'a [Vec<Rep>],
    f: impl Fn(&Point) -> bool,
) -> Option<(&'a [Rep], usize)> {
    points
        .iter()
        .position(f)
        .map(|i| (results[i].as_slice(), points[i].messages))
}

fn cell(s: &Summary, precision: usize) -> String {
    if s.n == 0 {
        "—".into()
    } else {
        format!(
            "{:.p$} ± {:.p$} (n = {})",
            s.mean,
            s.std,
            s.n,
            p = precision
        )
    }
}

/// `x` against `b` in percent ("—" without both).
fn vs(x: &Summary, b: Option<Summary>) -> String {
    b.filter(|b| b.n > 0 && x.n > 0)
        .map(|b| format!("{:+.0} %", (x.mean / b.mean - 1.0) * 100.0))
        .unwrap_or_else(|| "—".into())
}

/// One row of a per-case table: a case, side and transport that ran, its repetitions, total
/// time and the TCP+TLS 1.2 and 1.3 totals to compare it with.
struct Row<'a> {
    case: Case,
    side: &'static str,
    transport: Transport,
    reps: &'a [Rep],
    messages: usize,
    total: Summary,
    b12: Option<Summary>,
    b13: Option<Summary>,
}

/// The rows of a per-case table on `testbed`: every case, side and transport with runs
/// (`at` finds a default-channel point), total time scaled by `scale`.
fn rows<'a>(
    at: &impl Fn(Case, Testbed, Transport) -> Option<(&'a [Rep], usize)>,
    testbed: Testbed,
    cases: &[Case],
    scale: f64,
) -> Vec<Row<'a>> {
    let mut out = Vec::new();
    for &case in cases {
        for side in ["send", "recv"] {
            let total =
                |t| at(case, testbed, t).map(|(r, _)| summary(r, side, |x| x.total_s * scale));
            let (b12, b13) = (total(Transport::TcpTls12), total(Transport::TcpTls13));
            for transport in crate::papers::paper003::TRANSPORTS {
                let Some((reps, messages)) = at(case, testbed, transport) else {
                    continue;
                };
                let total = summary(reps, side, |x| x.total_s * scale);
                if total.n == 0 {
                    continue;
                }
                out.push(Row {
                    case,
                    side,
                    transport,
                    reps,
                    messages,
                    total,
                    b12,
                    b13,
                });
            }
        }
    }
    out
}

fn failures(reps: &[Rep]) -> usize {
    reps.iter().flat_map(sides).map(|(_, x)| x.failed).sum()
}

/// The setup's sentence on how repetitions without loss differ, with the widest time spread
/// measured: QUIC's random draws change a few bytes, and with delayed ACKs (T9) the time too.
fn lossless_spread(points: &[Point], results: &[Vec<Rep>]) -> String {
    let widest = points
        .iter()
        .zip(results)
        .filter(|(p, _)| p.testbed == Testbed::Netsim && p.channel.loss == 0.0)
        // Only the schemes whose ACKs T9 delays (the constrained profile).
        .filter(|(p, _)| matches!(p.transport, Transport::QuicConstrained | Transport::QuicMux))
        .map(|(p, r)| (p, r, summary(r, "send", |x| x.total_s)))
        .max_by(|a, b| a.2.std.total_cmp(&b.2.std));
    let draws = "Without loss, repetitions differ only in QUIC's own random draws (connection ids and a grease transport parameter, so a few bytes on the wire)";
    match widest {
        Some((p, r, t)) if t.std > 0.0 => format!(
            "{draws}. Where ACKs are delayed (the constrained profile, decision T9) times differ too on slow links (the mechanism is not traced): the widest spread is {:.3} s (std dev; {}) for {}; elsewhere less.",
            t.std,
            outcomes(r, "send", |x| x.total_s),
            p.label()
        ),
        _ => format!("{draws}; their times agree exactly (std dev 0)."),
    }
}

/// summary.md.
pub fn summary_md(points: &[Point], results: &[Vec<Rep>], command: &str) -> String {
    let mut s =
        String::from("# qgate-lab amqp — AMQP 1.0 over QUIC vs over TCP+TLS (paper 003)\n\n");
    let _ = writeln!(
        s,
        "Reproduce: `{command}` (the netsim rows come from `lab/plans/paper003-{{multi,single,energy,sweep}}.toml` and are deterministic for the same options; each plan's own results are in the subdirectory of its name; the loopback rows are real-time measurements).\n"
    );
    let default_channel = points
        .iter()
        .find(|p| p.testbed == Testbed::Netsim && p.sweep == "default")
        .map_or_else(|| "none ran".to_string(), |p| channel_label(&p.channel));
    let radio = Radio::default();
    let _ = writeln!(
        s,
        "Setup. **netsim** (virtual time): sender and receiver each on a Wi-Fi-like link to an access point ({}; sweeps change it, both directions), the broker wired to the access point (1 Gbit/s, 0.1 ms). **quic**: AMQP 1.0 on one QUIC bidirectional stream per connection (quinn, TLS 1.3, CUBIC, default options), 0-RTT once the client holds a ticket. **tcp-tls13 / tcp-tls12**: AMQP 1.0 over rustls over a user-space TCP (smoltcp 0.14, CUBIC, Nagle off, minimum RTO 1 s, no SACK) whose IP packets cross the same simulated links (the simulator has no kernel TCP); rustls resumes TLS sessions on later connections. **quic-pmtud-off**: QUIC with quinn's path-MTU discovery off at both ends (netsim only). **quic-constrained** (netsim only): per-connection QUIC with the constrained-link profile at both ends (decision T6): the RTT assumed before the first sample is at least the handshake's serialisation time at the device's radio rate, neither end probes for a larger MTU, and each connection leaves from a socket of its own with no connection IDs of its own (decision T10). **quic-mux**: every AMQP connection a stream of one long-lived QUIC connection (decision M25), with the constrained profile on netsim and default options on loopback; not the paper's scheme, so it is its own row. **loopback**: the same clients and broker on 127.0.0.1 with the kernel's TCP, real time, no channel. On every transport the broker passes the frames of one answer on together (decision M31). Every message has a {MESSAGE_BYTES}-byte body and a message-id; at-least-once (the sender waits for the broker's accept, as the paper's Go sender). Per-connection cases use our pipelined clients (SASL, open, begin, attach and the first transfer or credit in one flight, for every transport); the single-connection case sends each message once the one before is accepted. {}\n",
        default_channel,
        lossless_spread(points, results)
    );
    let _ = writeln!(
        s,
        "Metrics. Total communication time: first connection start → last connection closed (client clock). Startup latency: connection start → first application payload written (mean over a repetition's connections). RTT: QUIC's smoothed RTT at each connection's end (TCP's is the kernel's and not read). Bytes on the wire: every packet on the device's link, both directions, IP and UDP headers included (those lost on the wire too). Throughput: bytes on the wire × 8 ÷ total time. Energy (sender): {} V × (tx {} A × time its packets serialise + rx {} A × time packets for it serialise + idle {} A × the rest of the total time), from the link's byte counters; the radio does not sleep during a run (ns-3's Wi-Fi radio without power save).\n",
        radio.volts, radio.tx_amps, radio.rx_amps, radio.idle_amps
    );

    const ALL: [Transport; 7] = crate::papers::paper003::TRANSPORTS;
    let at = |case: Case, testbed: Testbed, t: Transport| {
        find(points, results, |p| {
            p.case == case && p.testbed == testbed && p.transport == t && p.sweep == "default"
        })
    };

    // The default channel on netsim.
    let _ = writeln!(s, "## The Wi-Fi-like channel (netsim)\n");
    let _ = writeln!(s, "| case | side | transport | messages/rep | total time (s) | vs tcp-tls12 | vs tcp-tls13 | startup (ms) | RTT (ms) | bytes on the wire | throughput (kbit/s) | energy (J) | 0-RTT conns (all reps) | failed conns (all reps) |");
    let _ = writeln!(
        s,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for r in rows(
        &at,
        Testbed::Netsim,
        &[Case::Multi, Case::Single, Case::Energy],
        1.0,
    ) {
        let (reps, side) = (r.reps, r.side);
        let z: usize = reps
            .iter()
            .flat_map(sides)
            .filter(|(sd, _)| *sd == side)
            .map(|(_, x)| x.zero_rtt)
            .sum();
        let _ = writeln!(
            s,
            "| {} | {side} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {z} | {} |",
            r.case.name(),
            r.transport.name(),
            r.messages,
            cell(&r.total, 3),
            vs(&r.total, r.b12),
            vs(&r.total, r.b13),
            cell(&summary(reps, side, |x| x.startup_ms), 2),
            cell(&summary(reps, side, |x| x.rtt_ms), 1),
            cell(&summary(reps, side, |x| x.wire_bytes), 0),
            cell(&summary(reps, side, kbps), 1),
            if side == "send" {
                cell(&summary(reps, side, |x| x.energy_j), 3)
            } else {
                "—".into()
            },
            failures(reps)
        );
    }
    let _ = writeln!(
        s,
        "\nBytes on the wire per one-message connection (energy case):"
    );
    for t in ALL {
        if let Some((reps, m)) = at(Case::Energy, Testbed::Netsim, t) {
            let b = summary(reps, "send", |x| x.wire_bytes / m as f64);
            let _ = write!(s, " {} {};", t.name(), cell(&b, 0));
        }
    }
    s.push_str("\n\n");

    // Loopback: QUIC against TCP+TLS on the same footing, real time.
    let _ = writeln!(
        s,
        "## Loopback (real sockets, kernel TCP, real time, no channel)\n"
    );
    let _ = writeln!(s, "| case | side | transport | total time (ms) | vs tcp-tls12 | vs tcp-tls13 | startup (ms) | failed |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
    for r in rows(&at, Testbed::Loopback, &[Case::Multi, Case::Single], 1e3) {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            r.case.name(),
            r.side,
            r.transport.name(),
            cell(&r.total, 2),
            vs(&r.total, r.b12),
            vs(&r.total, r.b13),
            cell(&summary(r.reps, r.side, |x| x.startup_ms), 3),
            failures(r.reps)
        );
    }

    // Sweeps.
    for (sweep, what) in [
        ("bandwidth", "channel rate"),
        ("delay", "one-way delay (the channel's own + added)"),
        ("loss", "random loss, each direction"),
    ] {
        let channels = sweep_channels(points, sweep);
        if channels.is_empty() {
            continue;
        }
        let _ = writeln!(
            s,
            "\n## Sweep: {what} (netsim, 10 connections × one message per repetition)\n"
        );
        let _ = writeln!(s, "| channel | transport | total time (s) | vs first point | vs tcp-tls12 | startup (ms) | bytes on the wire | energy (J) | failed |");
        let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
        for c in &channels {
            let b12 = sweep_point(points, results, sweep, c, Transport::TcpTls12)
                .map(|r| summary(r, "send", |x| x.total_s));
            for t in ALL {
                let Some(reps) = sweep_point(points, results, sweep, c, t) else {
                    continue;
                };
                let first = sweep_point(points, results, sweep, &channels[0], t)
                    .map(|r| summary(r, "send", |x| x.total_s).mean)
                    .unwrap_or(f64::NAN);
                let total = summary(reps, "send", |x| x.total_s);
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | ×{:.2} | {} | {} | {} | {} | {} |",
                    channel_label(c),
                    t.name(),
                    cell(&total, 3),
                    total.mean / first,
                    vs(&total, b12),
                    cell(&summary(reps, "send", |x| x.startup_ms), 1),
                    cell(&summary(reps, "send", |x| x.wire_bytes), 0),
                    cell(&summary(reps, "send", |x| x.energy_j), 3),
                    failures(reps)
                );
            }
        }
    }
    s.push_str(&claims(points, results));
    s.push_str(&beyond(points, results));
    s
}

/// Our own schemes against the baselines (issue 16's goals), from this run's numbers.
fn beyond(points: &[Point], results: &[Vec<Rep>]) -> String {
    let mut s = String::from(
        "\n## Beyond the paper: the constrained-link profile and quic-mux (netsim)\n\n",
    );
    let total = |sweep: &str, c: &crate::papers::paper003::Channel, t: Transport| {
        sweep_point(points, results, sweep, c, t).map(|r| summary(r, "send", |x| x.total_s))
    };
    // quic-mux against both TCP+TLS baselines at every sweep point.
    let (mut n, mut wins, mut losses) = (0, 0, Vec::new());
    for sweep in ["bandwidth", "delay", "loss"] {
        for c in sweep_channels(points, sweep) {
            let Some(m) = total(sweep, &c, Transport::QuicMux) else {
                continue;
            };
            for b in [Transport::TcpTls12, Transport::TcpTls13] {
                let Some(t) = total(sweep, &c, b) else {
                    continue;
                };
                n += 1;
                if m.mean < t.mean {
                    wins += 1;
                } else {
                    losses.push(format!(
                        "{} vs {}: {:.3} s against {:.3} s",
                        channel_label(&c),
                        b.name(),
                        m.mean,
                        t.mean
                    ));
                }
            }
        }
    }
    if n > 0 {
        let lost = if losses.is_empty() {
            String::new()
        } else {
            format!(" Slower at: {}.", losses.join("; "))
        };
        let _ = writeln!(s, "- **quic-mux against TCP+TLS 1.2 and 1.3, total time at every sweep point**: faster at {wins} of {n} comparisons (means over each point's seeds; the table above gives n and std dev).{lost} One QUIC handshake carries all ten AMQP connections; each later one costs its AMQP frames and one round trip.");
    }
    // The client's connection history (H8) against plain per-connection QUIC.
    let mut rows = Vec::new();
    // A channel in several sweeps (their shared base point) is listed once.
    let mut seen = std::collections::BTreeSet::new();
    for sweep in ["bandwidth", "delay", "loss"] {
        for c in sweep_channels(points, sweep) {
            if !seen.insert(channel_label(&c)) {
                continue;
            }
            let times = |t| {
                sweep_point(points, results, sweep, &c, t)
                    .map(|r| r.iter().map(|x| x.send.total_s).collect::<Vec<f64>>())
            };
            let (Some(q), Some(h)) = (times(Transport::Quic), times(Transport::QuicHistory)) else {
                continue;
            };
            let (mq, mh) = (Summary::of(&q).mean, Summary::of(&h).mean);
            let p = crate::stats::Welch::p_label(crate::stats::Welch::test(&q, &h));
            let distinct = sweep_point(points, results, sweep, &c, Transport::QuicHistory)
                .map(|r| outcomes(r, "send", |x| x.total_s))
                .unwrap_or_default();
            rows.push(format!(
                "{} {mq:.3} → {mh:.3} s ({:+.0} %, {p}; quic-history {distinct})",
                channel_label(&c),
                (mh / mq - 1.0) * 100.0
            ));
        }
    }
    if !rows.is_empty() {
        // What the seeded RTT saves on the slowest link, in this run: bytes sent again.
        let slowest = sweep_channels(points, "bandwidth").into_iter().next();
        let bytes = |t| {
            slowest.as_ref().and_then(|c| {
                sweep_point(points, results, "bandwidth", c, t)
                    .map(|r| summary(r, "send", |x| x.wire_bytes).mean)
            })
        };
        let why = match (slowest.as_ref(), bytes(Transport::Quic), bytes(Transport::QuicHistory)) {
            (Some(c), Some(q), Some(h)) => format!(
                " At {}, where quinn's 333 ms is shorter than one full datagram's serialisation, the ten connections put {h:.0} bytes on the wire against quic's {q:.0}: fewer packets were taken for lost and sent again.",
                channel_label(c)
            ),
            _ => String::new(),
        };
        let _ = writeln!(s, "- **quic-history against quic**, total time (means over each point's seeds and Welch's p, \"no spread\" where every seed gave the same time; the tables above give n and std dev): {}. From the second connection on, the client starts from the history of the ones before: their window and the last one's smoothed RTT instead of quinn's 333 ms (decision H8).{why}", rows.join("; "));
    }
    // Bytes per one-message connection.
    let per_conn = |t: Transport| {
        let (reps, p) = find(points, results, |p| {
            p.case == Case::Energy
                && p.testbed == Testbed::Netsim
                && p.transport == t
                && p.sweep == "default"
        })?;
        Some((
            summary(reps, "send", |x| x.wire_bytes).mean / p.max(1) as f64,
            outcomes(reps, "send", |x| x.wire_bytes),
        ))
    };
    if let Some((b12, _)) = per_conn(Transport::TcpTls12) {
        let rows: Vec<String> = [
            Transport::Quic,
            Transport::QuicPmtudOff,
            Transport::QuicConstrained,
            Transport::QuicMux,
        ]
        .into_iter()
        .filter_map(|t| {
            per_conn(t).map(|(b, o)| format!("{} {:.0} (×{:.2}; {o})", t.name(), b, b / b12))
        })
        .collect();
        let _ = writeln!(s, "- **Bytes on the wire per one-message connection** (energy case, 54 Mbit/s) against tcp-tls12's {b12:.0}: {}. Three datagrams of any new QUIC connection are padded to 1200 bytes (the client's Initial, the server's first flight, the client's Initial ACK with its Finished): {} bytes with IP and UDP headers by construction (3 × 1,228, RFC 9000 §14.1), already ×{:.2} of tcp-tls12's whole connection, so per-connection QUIC cannot reach ×2 with quinn 0.11; quic-mux pays them once.", rows.join("; "), 3 * 1228, 3.0 * 1228.0 / b12);
    }
    // What a slow link adds: the same ten connections at the slowest and the fastest rate.
    let ch = sweep_channels(points, "bandwidth");
    if let (Some(slow), Some(fast)) = (ch.first(), ch.last()) {
        let bytes = |c: &crate::papers::paper003::Channel, t: Transport| {
            sweep_point(points, results, "bandwidth", c, t).map(|r| {
                (
                    summary(r, "send", |x| x.wire_bytes).mean,
                    outcomes(r, "send", |x| x.wire_bytes),
                )
            })
        };
        let rows: Vec<String> = [
            Transport::Quic,
            Transport::QuicPmtudOff,
            Transport::QuicConstrained,
            Transport::QuicHistory,
            Transport::QuicMux,
            Transport::TcpTls12,
        ]
        .into_iter()
        .filter_map(|t| {
            let ((a, oa), (b, ob)) = (bytes(slow, t)?, bytes(fast, t)?);
            Some(format!("{} {:+.0} ({oa} / {ob})", t.name(), a - b))
        })
        .collect();
        let _ = writeln!(s, "- **Bytes a slow link adds** (the same ten connections at {} kbit/s minus at {} kbit/s; on a link that drops nothing, these are retransmissions and probes sent because a packet's serialisation outlasted the timer): {}. With quinn's 333 ms initial RTT a 1,228-byte datagram that takes 1.2 s to serialise at 8 kbit/s looks lost; the constrained profile starts from the handshake's serialisation time on the radio (decision T6).", slow.rate_bps / 1000, fast.rate_bps / 1000, rows.join("; "));
    }
    s
}

/// The channels of a sweep, in plan order.
fn sweep_channels(points: &[Point], sweep: &str) -> Vec<crate::papers::paper003::Channel> {
    let mut v: Vec<crate::papers::paper003::Channel> = Vec::new();
    for p in points.iter().filter(|p| p.sweep == sweep) {
        if !v.contains(&p.channel) {
            v.push(p.channel);
        }
    }
    v
}

fn sweep_point<'a>(
    points: &[Point],
    results: &'a [Vec<Rep>],
    sweep: &str,
    c: &crate::papers::paper003::Channel,
    t: Transport,
) -> Option<&'a [Rep]> {
    find(points, results, |p| {
        p.sweep == sweep && p.channel == *c && p.transport == t
    })
    .map(|(r, _)| r)
}

/// The paper's claims against this run (netsim: the same channel for both transports).
fn claims(points: &[Point], results: &[Vec<Rep>]) -> String {
    let mut s = String::from("\n## Against the paper's claims (netsim, QUIC vs TCP+TLS 1.2 as in the paper; TLS 1.3 in brackets)\n\n");
    let net = |case: Case, t: Transport| {
        find(points, results, |p| {
            p.case == case
                && p.testbed == Testbed::Netsim
                && p.transport == t
                && p.sweep == "default"
        })
        .map(|(r, _)| r)
    };
    let change = |case: Case, side: &str, f: fn(&Side) -> f64| -> Option<(f64, f64)> {
        let q = summary(net(case, Transport::Quic)?, side, f).mean;
        let t12 = summary(net(case, Transport::TcpTls12)?, side, f).mean;
        let t13 = summary(net(case, Transport::TcpTls13)?, side, f).mean;
        Some(((q / t12 - 1.0) * 100.0, (q / t13 - 1.0) * 100.0))
    };
    let line = |s: &mut String, claim: &str, v: Option<(f64, f64)>, note: &str| {
        if let Some((a, b)) = v {
            let _ = writeln!(
                s,
                "- **{claim}**: here {a:+.0} % ({b:+.0} % vs TLS 1.3). {note}"
            );
        }
    };
    line(&mut s, "Startup latency −62 %", change(Case::Single, "send", |x| x.startup_ms), "The first connection has no ticket: QUIC's first application byte goes after 1 RTT, TCP+TLS's after the TCP handshake and the TLS handshake (2 RTTs with TLS 1.3, 3 with TLS 1.2).");
    // The paper's sizes in its claims; ours as run (a --quick run sends fewer).
    let ran = |case: Case| {
        points
            .iter()
            .find(|p| p.case == case && p.testbed == Testbed::Netsim)
            .map_or(0, |p| p.messages)
    };
    let (multi, single) = (ran(Case::Multi), ran(Case::Single));
    line(&mut s, "Total time, 100 connections, send −22 %", change(Case::Multi, "send", |x| x.total_s), &format!("With {multi} connections here. QUIC resumes with 0-RTT on every connection after the first; rustls resumes TLS too (1 RTT saved with TLS 1.2), but TCP's handshake remains."));
    line(
        &mut s,
        "Total time, 100 connections, receive −15 %",
        change(Case::Multi, "recv", |x| x.total_s),
        &format!("With {multi} connections here."),
    );
    line(&mut s, "Total time, single connection −21 %", change(Case::Single, "send", |x| x.total_s), &format!("{single} messages one at a time here: each costs one RTT on either transport, so only the handshake differs."));
    line(
        &mut s,
        "Energy −31 %",
        change(Case::Energy, "send", |x| x.energy_j),
        "The radio never sleeps during a run, so energy follows total time.",
    );
    if let Some((a, b)) = change(Case::Energy, "send", |x| x.wire_bytes) {
        let _ = writeln!(s, "- **QUIC sends 3.5× the bytes**: here ×{:.2} (×{:.2} vs TLS 1.3) for one-message connections. QUIC pads every client Initial to 1200 bytes, and its short connections also carry path-MTU probes, ACK-only and close packets; TCP's segments are 40 bytes plus payload.", a / 100.0 + 1.0, b / 100.0 + 1.0);
    }
    if let (Some(on), Some(off)) = (
        net(Case::Energy, Transport::Quic),
        net(Case::Energy, Transport::QuicPmtudOff),
    ) {
        let (on, off) = (
            summary(on, "send", |x| x.wire_bytes).mean,
            summary(off, "send", |x| x.wire_bytes).mean,
        );
        let _ = writeln!(s, "- **Where QUIC's bytes go**: with path-MTU discovery off at both ends (`quic-pmtud-off`; quinn probes by default) a one-message connection puts {:.0} % fewer bytes on the wire ({:.0} instead of {:.0} per 10 connections). Short-lived IoT connections gain nothing from a larger MTU; the bandwidth sweep shows what the probes cost on slow channels.", (1.0 - off / on) * 100.0, off, on);
    }
    let growth = |sweep: &str, t: Transport| -> Option<f64> {
        let ch = sweep_channels(points, sweep);
        let first = summary(
            sweep_point(points, results, sweep, ch.first()?, t)?,
            "send",
            |x| x.total_s,
        )
        .mean;
        let last = summary(
            sweep_point(points, results, sweep, ch.last()?, t)?,
            "send",
            |x| x.total_s,
        )
        .mean;
        Some(last / first)
    };
    if let (Some(q), Some(t12), Some(t13)) = (
        growth("loss", Transport::Quic),
        growth("loss", Transport::TcpTls12),
        growth("loss", Transport::TcpTls13),
    ) {
        let _ = writeln!(s, "- **At 15 % loss TCP's time ×2, QUIC's ×1.5**: here QUIC ×{q:.2}, TCP+TLS 1.2 ×{t12:.2} (TLS 1.3 ×{t13:.2}) from 0 % to the highest loss. With 10 one-message connections most of the time is handshakes; a lost handshake packet costs QUIC a PTO (initial RTT 333 ms, doubling) and TCP an RTO (1 s minimum in smoltcp, doubling), so the growth factors are large for both and vary from seed to seed.");
    }
    let ch = sweep_channels(points, "bandwidth");
    let mut wins = Vec::new();
    let time = |c: &crate::papers::paper003::Channel, t: Transport| {
        sweep_point(points, results, "bandwidth", c, t)
            .map(|r| summary(r, "send", |x| x.total_s).mean)
    };
    for c in &ch {
        if let (Some(q), Some(off), Some(t)) = (
            time(c, Transport::Quic),
            time(c, Transport::QuicPmtudOff),
            time(c, Transport::TcpTls12),
        ) {
            let yes = |x: f64| if t < x { "yes" } else { "no" };
            wins.push(format!(
                "{} kbit/s: {} / {}",
                c.rate_bps / 1000,
                yes(q),
                yes(off)
            ));
        }
    }
    if !wins.is_empty() {
        let _ = writeln!(s, "- **TCP wins below 32 kbit/s**: does TCP+TLS 1.2 finish sooner than quic / than quic-pmtud-off? {}; at the default 54 Mbit/s QUIC is faster (table above). QUIC's extra bytes per connection cost time wherever serialisation, not round trips, dominates.", wins.join("; "));
    }
    s
}

/// SVG figures.
pub fn figures(points: &[Point], results: &[Vec<Rep>]) -> Vec<(String, String)> {
    const ALL: [Transport; 7] = crate::papers::paper003::TRANSPORTS;
    let mut out = Vec::new();
    let at = |case: Case, testbed: Testbed, t: Transport| {
        find(points, results, |p| {
            p.case == case && p.testbed == testbed && p.transport == t && p.sweep == "default"
        })
        .map(|(r, _)| r)
    };
    let bar = |label: String, x: Summary| Bar {
        label,
        value: x.mean,
        err: x.std,
    };
    let bars_of =
        |case: Case, testbed: Testbed, sides: &[&str], scale: f64, f: fn(&Side) -> f64| {
            let mut bars = Vec::new();
            for side in sides {
                for t in ALL {
                    if let Some(reps) = at(case, testbed, t) {
                        let x = summary(reps, side, f);
                        if x.n > 0 {
                            bars.push(bar(
                                format!("{} {side}", t.name()),
                                Summary {
                                    mean: x.mean * scale,
                                    std: x.std * scale,
                                    n: x.n,
                                },
                            ));
                        }
                    }
                }
            }
            bars
        };
    let mut push = |name: &str, title: &str, y: &str, bars: Vec<Bar>| {
        if !bars.is_empty() {
            out.push((name.to_string(), bar_chart(title, y, &bars)));
        }
    };
    push(
        "fig6-7_multi_total.svg",
        "100 connections × one message: total communication time (netsim)",
        "seconds",
        bars_of(Case::Multi, Testbed::Netsim, &["send", "recv"], 1.0, |x| {
            x.total_s
        }),
    );
    push(
        "fig8_single_total.svg",
        "1000 messages on one connection: total communication time (netsim)",
        "seconds",
        bars_of(Case::Single, Testbed::Netsim, &["send"], 1.0, |x| x.total_s),
    );
    push(
        "fig9_startup.svg",
        "Single connection: startup latency (netsim)",
        "milliseconds",
        bars_of(Case::Single, Testbed::Netsim, &["send"], 1.0, |x| {
            x.startup_ms
        }),
    );
    push(
        "fig10-11_energy.svg",
        "10 one-message connections: sender energy (netsim)",
        "joules",
        bars_of(Case::Energy, Testbed::Netsim, &["send"], 1.0, |x| {
            x.energy_j
        }),
    );
    push(
        "fig16_bytes.svg",
        "10 one-message connections: bytes on the wire (netsim)",
        "kB",
        bars_of(Case::Energy, Testbed::Netsim, &["send"], 1e-3, |x| {
            x.wire_bytes
        }),
    );
    push(
        "loopback_total.svg",
        "100 connections × one message on loopback (kernel TCP, real time)",
        "milliseconds",
        bars_of(
            Case::Multi,
            Testbed::Loopback,
            &["send", "recv"],
            1e3,
            |x| x.total_s,
        ),
    );
    for (sweep, file, x_label, x_of) in [
        (
            "delay",
            "fig12_delay.svg",
            "added one-way delay (ms)",
            (|c: &crate::papers::paper003::Channel, base_ms: f64| {
                c.delay.as_secs_f64() * 1e3 - base_ms
            }) as fn(&crate::papers::paper003::Channel, f64) -> f64,
        ),
        ("loss", "fig13_loss.svg", "loss (%)", |c, _| c.loss * 100.0),
        (
            "bandwidth",
            "fig14_bandwidth.svg",
            "channel rate (kbit/s)",
            |c, _| c.rate_bps as f64 / 1000.0,
        ),
    ] {
        let chs = sweep_channels(points, sweep);
        // The delay sweep adds to the channel's own delay: its smallest point.
        let base_ms = chs
            .iter()
            .map(|c| c.delay.as_secs_f64() * 1e3)
            .fold(f64::INFINITY, f64::min);
        let x_of = |c: &crate::papers::paper003::Channel| x_of(c, base_ms);
        let lines: Vec<Line> = ALL
            .iter()
            .map(|&t| Line {
                name: t.name().into(),
                points: chs
                    .iter()
                    .filter_map(|c| {
                        sweep_point(points, results, sweep, c, t)
                            .map(|r| (x_of(c), summary(r, "send", |x| x.total_s).mean))
                    })
                    .collect(),
            })
            .filter(|l| !l.points.is_empty())
            .collect();
        if !lines.is_empty() {
            out.push((
                file.into(),
                line_chart(
                    &format!("10 one-message connections: total time vs {sweep} (netsim)"),
                    x_label,
                    "seconds",
                    &lines,
                ),
            ));
        }
    }
    let chs = sweep_channels(points, "bandwidth");
    let lines: Vec<Line> = ALL
        .iter()
        .map(|&t| Line {
            name: t.name().into(),
            points: chs
                .iter()
                .filter_map(|c| {
                    sweep_point(points, results, "bandwidth", c, t).map(|r| {
                        (
                            c.rate_bps as f64 / 1000.0,
                            summary(r, "send", |x| x.wire_bytes).mean / 1000.0,
                        )
                    })
                })
                .collect(),
        })
        .filter(|l| !l.points.is_empty())
        .collect();
    if !lines.is_empty() {
        out.push((
            "fig15_bytes_vs_bandwidth.svg".into(),
            line_chart(
                "10 one-message connections: bytes on the wire vs channel rate (netsim)",
                "channel rate (kbit/s)",
                "kB",
                &lines,
            ),
        ));
    }
    out
}

/// Write results.csv, summary.md and the figures into `dir`.
pub fn write_all(
    dir: &Path,
    points: &[Point],
    results: &[Vec<Rep>],
    command: &str,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("results.csv"), results_csv(points, results))?;
    std::fs::write(dir.join("summary.md"), summary_md(points, results, command))?;
    for (name, svg) in figures(points, results) {
        std::fs::write(dir.join(name), svg)?;
    }
    Ok(())
}
