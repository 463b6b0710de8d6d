//! `qgate-lab amqp`: paper 003's experiments. An AMQP 1.0 sender and receiver talk to the qgate
//! broker, over QUIC or over TCP+TLS, and we measure total communication time, startup latency,
//! RTT, bytes on the wire, throughput and the sender radio's energy.
//!
//! Where a case runs is a [`Testbed`]:
//! - [`Testbed::Netsim`]: the shipped plans `lab/plans/paper003-{multi,single,energy,sweep}.toml`
//!   (workload `kind = "amqp"`) on the simulated network in virtual time, every transport and
//!   sweep. TCP+TLS runs there on the user-space TCP.
//! - [`Testbed::Loopback`]: the same workload (the multi and single plans' `amqp` workload, as
//!   run) on real sockets on 127.0.0.1 in real time, no channel emulation: the kernel's TCP
//!   beside QUIC. It is not a simulated world, so it is not a plan (decision X11).

use std::path::Path;
use std::time::Duration;

use qgate_amqp::broker::Broker;
use qgate_amqp::builder::RunningBroker;
use qgate_amqp::client::Connector;
use qgate_amqp::transport::{self, Scheme, TlsVersion, ALPN_AMQP};
use qgate_transport::{endpoint, server_config, DevPki, Socket, TransportOptions};
use tokio::time::Instant;

use crate::plan::run::{collect, Record};
use crate::plan::spec::{AmqpLoad, AmqpTransport, Workload};
use crate::plan::workload::{amqp, Measurements};
use crate::plan::{Loaded, PlanError, Variant};

pub use crate::plan::spec::DEFAULT_AMQP_BODY as MESSAGE_BYTES;

/// A shipped plan of this lab: its case, results subdirectory, path and text.
pub struct Shipped {
    /// What it measures.
    pub case: Case,
    /// Its results go to `<out>/<sub>`.
    pub sub: &'static str,
    /// Its path in the repository.
    pub path: &'static str,
    text: &'static str,
}

/// The shipped plans, in run order.
pub const PLANS: [Shipped; 4] = [
    Shipped {
        case: Case::Multi,
        sub: "multi",
        path: "lab/plans/paper003-multi.toml",
        text: include_str!("../../../../lab/plans/paper003-multi.toml"),
    },
    Shipped {
        case: Case::Single,
        sub: "single",
        path: "lab/plans/paper003-single.toml",
        text: include_str!("../../../../lab/plans/paper003-single.toml"),
    },
    Shipped {
        case: Case::Energy,
        sub: "energy",
        path: "lab/plans/paper003-energy.toml",
        text: include_str!("../../../../lab/plans/paper003-energy.toml"),
    },
    Shipped {
        case: Case::Sweep,
        sub: "sweep",
        path: "lab/plans/paper003-sweep.toml",
        text: include_str!("../../../../lab/plans/paper003-sweep.toml"),
    },
];

impl Shipped {
    /// The plan, parsed.
    pub fn load(&self) -> Result<Loaded, PlanError> {
        Loaded::parse(self.text, Path::new(self.path))
    }
}

/// The workload these plans measure.
const WORKLOAD: &str = "amqp";
/// The sender's link in these plans (its parameters are the point's channel).
const CHANNEL_LINK: &str = "channel";

/// The device's access channel: rate, added one-way delay and random loss, both directions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Channel {
    /// Bits per second.
    pub rate_bps: u64,
    /// One-way propagation delay.
    pub delay: Duration,
    /// Bernoulli loss probability per packet, each direction.
    pub loss: f64,
}

/// What a run does (paper 003 §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    /// §4.1: N messages, each on a new connection, sent then received (Figs. 6, 7).
    Multi,
    /// §4.2: N messages on one connection, each waiting for its accept (Figs. 8, 9).
    Single,
    /// §4.3: 10 connections × one 138-byte message; the sender's energy (Figs. 10, 11).
    Energy,
    /// §4.4: 10 connections × one message under one channel setting (Figs. 12–15).
    Sweep,
}

impl Case {
    /// Its name in results.
    pub fn name(self) -> &'static str {
        match self {
            Case::Multi => "multi",
            Case::Single => "single",
            Case::Energy => "energy",
            Case::Sweep => "sweep",
        }
    }
}

/// Transport under AMQP, as the plans' schemes name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// One QUIC bidirectional stream per AMQP connection; 0-RTT once a ticket is held.
    Quic,
    /// The same with path-MTU discovery off at both ends (netsim only): a one-message
    /// connection never profits from a larger MTU, and the probes cost it bytes and airtime.
    QuicPmtudOff,
    /// One QUIC connection per AMQP connection with the constrained-link profile (decision
    /// T6: initial RTT from the radio's rate, no path-MTU probing by either end; netsim only).
    QuicConstrained,
    /// Per-connection QUIC with the client's connection history (decision H8; netsim only):
    /// each new connection starts from the window and the last smoothed RTT of the ones
    /// before it, as `qgate device` does, so a lost handshake packet is resent after ~3 RTTs,
    /// not quinn's 1 s. Not the paper's scheme.
    QuicHistory,
    /// Every AMQP connection a stream of one long-lived QUIC connection (decision M25), with
    /// the constrained-link profile on netsim: the handshake is paid once, not per message.
    /// Not the paper's scheme; it changes what is compared, so it is its own row.
    QuicMux,
    /// TCP + TLS 1.3 (the fair modern baseline).
    TcpTls13,
    /// TCP + TLS 1.2 (the paper's).
    TcpTls12,
}

impl Transport {
    /// Its name in results.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Quic => "quic",
            Transport::QuicPmtudOff => "quic-pmtud-off",
            Transport::QuicConstrained => "quic-constrained",
            Transport::QuicHistory => "quic-history",
            Transport::QuicMux => "quic-mux",
            Transport::TcpTls13 => "tcp-tls13",
            Transport::TcpTls12 => "tcp-tls12",
        }
    }

    /// The transport a plan's scheme called `name` runs.
    pub fn from_name(name: &str) -> Option<Transport> {
        TRANSPORTS.into_iter().find(|t| t.name() == name)
    }

    fn scheme(self) -> Scheme {
        match self {
            Transport::Quic
            | Transport::QuicPmtudOff
            | Transport::QuicConstrained
            | Transport::QuicHistory => Scheme::Quic,
            Transport::QuicMux => Scheme::QuicMux,
            Transport::TcpTls13 => Scheme::TcpTls(TlsVersion::V13),
            Transport::TcpTls12 => Scheme::TcpTls(TlsVersion::V12),
        }
    }

    fn amqp(self) -> AmqpTransport {
        match self {
            Transport::Quic
            | Transport::QuicPmtudOff
            | Transport::QuicConstrained
            | Transport::QuicHistory => AmqpTransport::Quic,
            Transport::QuicMux => AmqpTransport::QuicMux,
            Transport::TcpTls13 => AmqpTransport::TcpTls13,
            Transport::TcpTls12 => AmqpTransport::TcpTls12,
        }
    }
}

/// Every transport, in table order.
pub const TRANSPORTS: [Transport; 7] = [
    Transport::Quic,
    Transport::QuicPmtudOff,
    Transport::QuicConstrained,
    Transport::QuicHistory,
    Transport::QuicMux,
    Transport::TcpTls13,
    Transport::TcpTls12,
];

/// Where a run executes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Testbed {
    /// The simulated network, virtual time, the channel applied.
    Netsim,
    /// Real loopback sockets, real time, no channel emulation.
    Loopback,
}

impl Testbed {
    /// Its name in results.
    pub fn name(self) -> &'static str {
        match self {
            Testbed::Netsim => "netsim",
            Testbed::Loopback => "loopback",
        }
    }
}

/// One point of the plan: a case on a testbed with a transport and a channel, repeated.
#[derive(Debug, Clone)]
pub struct Point {
    /// The case.
    pub case: Case,
    /// "default", "bandwidth", "delay" or "loss".
    pub sweep: String,
    /// The channel (ignored on loopback).
    pub channel: Channel,
    /// The transport.
    pub transport: Transport,
    /// The testbed.
    pub testbed: Testbed,
    /// Messages (= connections for the per-connection cases) per repetition.
    pub messages: usize,
    /// Repetitions, each on a fresh network and broker.
    pub reps: usize,
}

impl Point {
    /// A label for progress and tables.
    pub fn label(&self) -> String {
        format!(
            "{} {} {} {} {}",
            self.case.name(),
            self.sweep,
            channel_label(&self.channel),
            self.transport.name(),
            self.testbed.name()
        )
    }
}

/// "54Mbit/s 2ms 0%" style names.
pub fn channel_label(c: &Channel) -> String {
    let rate = if c.rate_bps >= 1_000_000 {
        format!("{}Mbit/s", c.rate_bps / 1_000_000)
    } else {
        format!("{}kbit/s", c.rate_bps / 1000)
    };
    format!(
        "{rate} {}ms {}%",
        c.delay.as_millis(),
        (c.loss * 100.0).round()
    )
}

/// What one side (sender or receiver) of one repetition measured.
#[derive(Debug, Clone, Default)]
pub struct Side {
    /// First connection start → last connection closed, seconds.
    pub total_s: f64,
    /// Mean over connections of connection start → first message written, ms.
    pub startup_ms: f64,
    /// Mean over connections of QUIC's smoothed RTT at the end, ms (NaN for TCP).
    pub rtt_ms: f64,
    /// Bytes on the device's link, both directions, IP headers included (NaN on loopback).
    pub wire_bytes: f64,
    /// Sender radio energy over `total_s`, joules (NaN on loopback).
    pub energy_j: f64,
    /// Messages that made it (accepted by the broker, or received).
    pub messages: usize,
    /// Connections that failed.
    pub failed: usize,
    /// Connections that used 0-RTT.
    pub zero_rtt: usize,
}

/// One repetition.
#[derive(Debug, Clone)]
pub struct Rep {
    /// Repetition index.
    pub rep: usize,
    /// Its seed.
    pub seed: u64,
    /// The sender's side.
    pub send: Side,
    /// The receiver's side (multi case only).
    pub recv: Option<Side>,
}

impl Side {
    /// A side's metrics from a record (`side`: "send" or "recv"); None if it did not run.
    fn from_record(r: &Record, side: &str) -> Option<Side> {
        let get = |k: &str| r.scalars.get(&format!("{WORKLOAD}.{side}_{k}")).copied();
        let nan = f64::NAN;
        Some(Side {
            total_s: get("total_s")?,
            startup_ms: get("startup_ms_mean").unwrap_or(nan),
            rtt_ms: get("rtt_ms_mean").unwrap_or(nan),
            wire_bytes: get("wire_bytes").unwrap_or(nan),
            energy_j: get("energy_j").unwrap_or(nan),
            messages: get("messages").unwrap_or(0.0) as usize,
            failed: get("failed").unwrap_or(0.0) as usize,
            zero_rtt: get("zero_rtt").unwrap_or(0.0) as usize,
        })
    }
}

impl Rep {
    fn from_record(rep: usize, r: &Record) -> Result<Rep, String> {
        Ok(Rep {
            rep,
            seed: r.seed,
            send: Side::from_record(r, "send").ok_or("no sender measurements")?,
            recv: Side::from_record(r, "recv"),
        })
    }
}

/// The `amqp` workload of a plan.
pub fn workload(loaded: &Loaded) -> Result<&AmqpLoad, String> {
    loaded
        .plan
        .workloads
        .iter()
        .find_map(|w| match w {
            Workload::Amqp(a) if a.name == WORKLOAD => Some(a),
            _ => None,
        })
        .ok_or_else(|| format!("{}: no amqp workload '{WORKLOAD}'", loaded.file.display()))
}

/// The point a variant of a shipped plan runs, in the report's terms (read from the plan as
/// run, so the report cannot disagree with it).
fn point(case: Case, v: &Variant) -> Result<Point, String> {
    let transport = Transport::from_name(&v.scheme)
        .ok_or_else(|| format!("scheme '{}' is not a transport this report knows", v.scheme))?;
    let link = v
        .plan
        .topology
        .links
        .iter()
        .find(|l| l.name == CHANNEL_LINK)
        .ok_or_else(|| format!("no link '{CHANNEL_LINK}'"))?;
    let p = link
        .params(qgate_netsim::Direction::AtoB)
        .map_err(|e| format!("{CHANNEL_LINK}: {e}"))?;
    let messages = v
        .plan
        .workloads
        .iter()
        .find_map(|w| match w {
            Workload::Amqp(a) => Some(a.messages),
            _ => None,
        })
        .ok_or("no amqp workload")?;
    Ok(Point {
        case,
        sweep: v
            .point
            .as_ref()
            .map_or_else(|| "default".to_string(), |a| a.sweep.clone()),
        channel: Channel {
            rate_bps: p.rate_bps.ok_or("the channel needs a rate")?,
            delay: p.delay,
            loss: p.loss.mean_loss(),
        },
        transport,
        testbed: Testbed::Netsim,
        messages,
        reps: 0,
    })
}

/// A shipped plan's runs as the report's points, each with its repetitions (seeds), in the
/// order the variants came.
pub fn netsim_points(
    case: Case,
    variants: &[Variant],
    records: &[Record],
) -> Result<Vec<(Point, Vec<Rep>)>, String> {
    let mut out: Vec<(Point, Vec<Rep>)> = Vec::new();
    for (v, r) in variants.iter().zip(records) {
        let p = point(case, v).map_err(|e| format!("{}: {e}", v.label()))?;
        let i = match out.iter().position(|(q, _)| {
            q.sweep == p.sweep && q.channel == p.channel && q.transport == p.transport
        }) {
            Some(i) => i,
            None => {
                out.push((p, Vec::new()));
                out.len() - 1
            }
        };
        let (q, reps) = &mut out[i];
        reps.push(Rep::from_record(reps.len(), r).map_err(|e| format!("{}: {e}", v.label()))?);
        q.reps = reps.len();
    }
    Ok(out)
}

/// The loopback baseline of one case: `a` (a shipped plan's workload, as run) over
/// `transport` on 127.0.0.1, `reps` times, each with a fresh broker, in real time.
pub fn loopback(case: Case, a: &AmqpLoad, transport: Transport, reps: usize) -> (Point, Vec<Rep>) {
    let spec = AmqpLoad {
        transport: transport.amqp(),
        mtu_discovery: transport != Transport::QuicPmtudOff,
        ..a.clone()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let out = rt.block_on(async {
        let mut out = Vec::with_capacity(reps);
        for rep in 0..reps {
            let bed = LoopBed::start(transport).await;
            let start = Instant::now();
            let far = start + Duration::from_secs(86_400);
            let mut m = Measurements::default();
            let t0 = Instant::now();
            let sent = amqp::send(&bed.sender, &spec, amqp_tag(rep), start, far).await;
            let span = t0.elapsed().as_secs_f64();
            let n = amqp::record("send", spec.messages, &sent, span, None, &mut m);
            if spec.receiver.is_some() {
                let t0 = Instant::now();
                let got = amqp::receive(&bed.receiver, &spec, n, start, far).await;
                let span = t0.elapsed().as_secs_f64();
                amqp::record("recv", n, &got, span, None, &mut m);
            }
            let mut r = collect([(WORKLOAD.to_string(), m)], &[]);
            r.seed = rep as u64 + 1;
            out.push(Rep::from_record(rep, &r).expect("the sender ran"));
        }
        out
    });
    let point = Point {
        case,
        sweep: "default".into(),
        channel: Channel {
            rate_bps: 0,
            delay: Duration::ZERO,
            loss: 0.0,
        },
        transport,
        testbed: Testbed::Loopback,
        messages: a.messages,
        reps,
    };
    (point, out)
}

/// Message ids of a loopback repetition (each broker is fresh, so they only differ by rep).
fn amqp_tag(rep: usize) -> u64 {
    0x100 + rep as u64
}

/// A memory broker on 127.0.0.1 and a sender and receiver that reach it.
struct LoopBed {
    sender: Connector,
    receiver: Connector,
    _broker: RunningBroker,
}

impl LoopBed {
    async fn start(transport: Transport) -> LoopBed {
        let pki = DevPki::generate(&[]).expect("PKI");
        let opts = TransportOptions {
            mtu_discovery: transport != Transport::QuicPmtudOff,
            ..Default::default()
        };
        let running = match transport {
            Transport::Quic
            | Transport::QuicPmtudOff
            | Transport::QuicConstrained
            | Transport::QuicHistory
            | Transport::QuicMux => {
                let scfg = server_config(&pki.server, &[ALPN_AMQP], &opts).expect("server config");
                let ep = endpoint(
                    Socket::bind_udp("127.0.0.1:0".parse().expect("addr")).expect("UDP socket"),
                    Some(scfg),
                    None,
                )
                .expect("endpoint");
                Broker::builder().quic(ep).start()
            }
            Transport::TcpTls13 | Transport::TcpTls12 => {
                let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("TCP listener");
                let tls = transport::tls_server_config(&pki.server, None).expect("TLS config");
                Broker::builder().tcp(l, Some(tls)).start()
            }
        }
        .expect("a memory broker starts");
        let addr = running
            .quic_addrs()
            .iter()
            .chain(running.tcp_addrs())
            .copied()
            .next()
            .expect("one listener");
        let client = || {
            let sock = transport.scheme().is_quic().then(|| {
                Socket::bind_udp("127.0.0.1:0".parse().expect("addr")).expect("UDP socket")
            });
            Connector::new(
                transport.scheme(),
                addr,
                "localhost",
                &pki.trust(),
                None,
                sock,
                &opts,
            )
            .expect("connector")
        };
        LoopBed {
            sender: client(),
            receiver: client(),
            _broker: running,
        }
    }
}

/// The cases the loopback baseline runs, and the transports (path-MTU discovery is a netsim
/// variant only).
pub const LOOPBACK_CASES: [Case; 2] = [Case::Multi, Case::Single];
/// See [`LOOPBACK_CASES`].
pub const LOOPBACK_TRANSPORTS: [Transport; 4] = [
    Transport::Quic,
    Transport::QuicMux,
    Transport::TcpTls13,
    Transport::TcpTls12,
];
