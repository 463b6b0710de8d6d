//! summary.md: the setup, the per-case tables on netsim and loopback, the sweeps, then the
//! paper's claims and our own schemes against this run.

use std::fmt::Write as _;

use super::beyond::beyond;
use super::claims::claims;
use super::reps::{failures, find, kbps, outcomes, sides, summary, sweep_channels, sweep_point};
use crate::papers::paper003::{channel_label, Case, Point, Rep, Testbed, Transport, MESSAGE_BYTES};
use crate::plan::spec::Radio;
use crate::stats::Summary;

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
