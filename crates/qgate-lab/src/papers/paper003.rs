//! `qgate lab amqp`: paper 003's experiments. An AMQP 1.0 sender and receiver talk to the qgate
//! broker, over QUIC or over TCP+TLS, and we measure total communication time, startup latency,
//! RTT, bytes on the wire, throughput and the sender radio's energy.
//!
//! Where a case runs is a [`Testbed`], the seam between the experiment and the network:
//! - [`Testbed::Netsim`]: the simulated network in virtual time, with the Wi-Fi-like channel
//!   and every sweep. Only UDP exists there, so only QUIC runs on it.
//! - [`Testbed::Loopback`]: real sockets on 127.0.0.1 in real time, no channel emulation: the
//!   TCP+TLS baseline (TLS 1.3 and 1.2), with QUIC beside it on the same footing.
//!
//! An emulated-link testbed (TUN + namespaces, kernel TCP) adds a third variant; the cases are
//! written once against [`Bed`] and do not change.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use fe2o3_amqp::types::messaging::MessageId;
use qgate_amqp::broker::{serve_quic, serve_tcp, Broker, BrokerConfig};
use qgate_amqp::client::{self, Connector, Report};
use qgate_amqp::oneshot::{receive_one, send_in_turn, send_one};
use qgate_amqp::transport::{self, BoxStream, Dialer, Scheme, TlsVersion, ALPN_AMQP};
use qgate_netsim::{Direction, LinkId, LinkParams, LossModel, Network, TraceEvent};
use qgate_transport::{endpoint, server_config, DevPki, Socket, TransportOptions};
use tokio::time::Instant;

use qgate_netsim::tcp::TcpHost;

/// Paper 003 §4.3's sample message: 138 bytes (used as the body in every case, *decided*).
pub const MESSAGE_BYTES: usize = 138;
/// Supply voltage of the radio model (paper 003 §3.2).
pub const VOLTS: f64 = 3.0;
/// Radio currents, amperes: ns-3 `WifiRadioEnergyModel` defaults (EXPERIMENTS.md, *decided*).
pub const TX_AMPS: f64 = 0.38;
/// Receive current.
pub const RX_AMPS: f64 = 0.313;
/// Idle (listening) current.
pub const IDLE_AMPS: f64 = 0.273;

const QUEUE: &str = "iot";
/// Longest a single connection may take before it counts as failed (virtual time at 8 kbit/s
/// and 15 % loss stays far below this).
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(300);
const TRACE_LIMIT: usize = 4_000_000;

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

impl Channel {
    /// The default Wi-Fi-like link (EXPERIMENTS.md, *decided*): 54 Mbit/s, 2 ms, no loss.
    pub const WIFI: Channel = Channel {
        rate_bps: 54_000_000,
        delay: Duration::from_millis(2),
        loss: 0.0,
    };

    fn params(&self) -> LinkParams {
        let p = LinkParams::new(self.rate_bps, self.delay);
        if self.loss > 0.0 {
            p.with_loss(LossModel::Bernoulli { p: self.loss })
        } else {
            p
        }
    }
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

/// Transport under AMQP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// One QUIC bidirectional stream per AMQP connection; 0-RTT once a ticket is held.
    Quic,
    /// The same with path-MTU discovery off at both ends (netsim only): a one-message
    /// connection never profits from a larger MTU, and the probes cost it bytes and airtime.
    QuicPmtudOff,
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
            Transport::TcpTls13 => "tcp-tls13",
            Transport::TcpTls12 => "tcp-tls12",
        }
    }

    fn scheme(self) -> Scheme {
        match self {
            Transport::Quic | Transport::QuicPmtudOff => Scheme::Quic,
            Transport::TcpTls13 => Scheme::TcpTls(TlsVersion::V13),
            Transport::TcpTls12 => Scheme::TcpTls(TlsVersion::V12),
        }
    }
}

/// Every transport, in table order.
pub const TRANSPORTS: [Transport; 4] = [
    Transport::Quic,
    Transport::QuicPmtudOff,
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
    pub sweep: &'static str,
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
    /// Seed of the first repetition.
    pub seed: u64,
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

/// The simulated network's view of one device, for bytes and energy.
struct Probe {
    net: Network,
    link: LinkId,
    rate_bps: u64,
}

impl Probe {
    /// Bytes on the device's link and the device radio's energy over `[from, to]` (network
    /// time), from the packet trace: transmitting while its packets serialise (lost ones too),
    /// receiving while packets for it serialise, idle otherwise (ns-3's Wi-Fi radio does not
    /// sleep without power save).
    fn account(&self, from: Duration, to: Duration) -> (f64, f64) {
        let trace = self.net.take_trace();
        let (mut bytes, mut tx, mut rx) = (0.0, 0.0, 0.0);
        for r in trace.records.iter().filter(|r| {
            r.link == self.link
                && r.at >= from
                && r.at <= to
                && matches!(r.event, TraceEvent::Deliver | TraceEvent::DropLoss)
        }) {
            let secs = r.size as f64 * 8.0 / self.rate_bps as f64;
            bytes += r.size as f64;
            match (r.dir, r.event) {
                (Direction::AtoB, _) => tx += secs,
                (Direction::BtoA, TraceEvent::Deliver) => rx += secs,
                _ => {}
            }
        }
        let span = (to - from).as_secs_f64();
        let idle = (span - tx - rx).max(0.0);
        let joules = VOLTS * (TX_AMPS * tx + RX_AMPS * rx + IDLE_AMPS * idle);
        (bytes, joules)
    }
}

/// A broker and a sender and receiver that reach it, on some testbed.
pub struct Bed {
    sender: Connector,
    receiver: Connector,
    /// The sender's and the receiver's device links (netsim only).
    probes: Option<(Probe, Probe)>,
    _broker: Broker,
}

fn ip(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

fn broker() -> Broker {
    Broker::start(BrokerConfig::default()).expect("a memory broker starts")
}

impl Bed {
    /// The simulated network: sender and receiver each on a `channel` link to an access point,
    /// the broker wired to it (1 Gbit/s, 0.1 ms). QUIC runs on the simulator's UDP; TCP+TLS on
    /// a user-space TCP ([`qgate_netsim::tcp`]) over the same links.
    pub fn netsim(channel: Channel, transport: Transport, seed: u64) -> Bed {
        let net = Network::new(seed);
        let ap = net.add_host("ap");
        net.set_forwarding(ap, true);
        let host = |name: &str, n: u8, params: LinkParams| {
            let h = net.add_host(name);
            let i = net.add_interface(h, ip(10, 0, n, 1)).expect("address");
            let a = net.add_interface(ap, ip(10, 0, n, 2)).expect("address");
            // The device is side A: AtoB is what it transmits.
            let link = net.connect_symmetric(i, a, params).expect("link");
            (h, link)
        };
        let (bh, _) = host(
            "broker",
            0,
            LinkParams::new(1_000_000_000, Duration::from_micros(100)),
        );
        let (sh, slink) = host("sender", 1, channel.params());
        let (rh, rlink) = host("receiver", 2, channel.params());
        net.enable_trace(TRACE_LIMIT);
        let pki = DevPki::generate(&[]).expect("PKI");
        let opts = TransportOptions {
            mtu_discovery: transport != Transport::QuicPmtudOff,
            ..Default::default()
        };
        let baddr = SocketAddr::new(ip(10, 0, 0, 1), 5671);
        let probe = |link| Probe {
            net: net.clone(),
            link,
            rate_bps: channel.rate_bps,
        };
        let b = broker();
        if matches!(transport, Transport::TcpTls13 | Transport::TcpTls12) {
            let stack =
                |h, n: u8| TcpHost::new(&net, h, Ipv4Addr::new(10, 0, n, 1)).expect("stack");
            let listener = stack(bh, 0).listen(baddr.port()).expect("listen");
            let tls = transport::tls_server_config(&pki.server, None).expect("TLS config");
            let served = b.clone();
            tokio::spawn(async move {
                loop {
                    let s = listener.accept().await;
                    let (b, tls) = (served.clone(), tls.clone());
                    tokio::spawn(async move { b.serve_tls(s, tls).await });
                }
            });
            let client = |h, n: u8| {
                let host = stack(h, n);
                let dial: Dialer = Arc::new(move |addr| {
                    let host = host.clone();
                    Box::pin(
                        async move { host.connect(addr).await.map(|s| Box::new(s) as BoxStream) },
                    )
                });
                Connector::new(
                    transport.scheme(),
                    baddr,
                    "localhost",
                    &pki.trust(),
                    None,
                    None,
                    &opts,
                )
                .expect("connector")
                .with_dialer(dial)
            };
            return Bed {
                sender: client(sh, 1),
                receiver: client(rh, 2),
                probes: Some((probe(slink), probe(rlink))),
                _broker: b,
            };
        }
        let scfg = server_config(&pki.server, &[ALPN_AMQP], &opts).expect("server config");
        let ep = endpoint(
            Socket::from(net.bind(bh, baddr).expect("port")),
            Some(scfg),
            Some(seed),
        )
        .expect("endpoint");
        tokio::spawn(serve_quic(b.clone(), ep));
        let client = |h, n: u8, s: u64| {
            let sock = net
                .bind(h, SocketAddr::new(ip(10, 0, n, 1), 0))
                .expect("port");
            let ep = endpoint(Socket::from(sock), None, Some(s)).expect("endpoint");
            Connector::on_endpoint(ep, baddr, "localhost", &pki.trust(), None, &opts)
                .expect("connector")
        };
        Bed {
            sender: client(sh, 1, seed.wrapping_mul(31).wrapping_add(1)),
            receiver: client(rh, 2, seed.wrapping_mul(31).wrapping_add(2)),
            probes: Some((probe(slink), probe(rlink))),
            _broker: b,
        }
    }

    /// Real sockets on 127.0.0.1 (no channel emulation): the TCP+TLS baseline, and QUIC for a
    /// like-for-like comparison.
    pub async fn loopback(transport: Transport) -> Bed {
        let pki = DevPki::generate(&[]).expect("PKI");
        let opts = TransportOptions {
            mtu_discovery: transport != Transport::QuicPmtudOff,
            ..Default::default()
        };
        let b = broker();
        let addr = match transport {
            Transport::Quic | Transport::QuicPmtudOff => {
                let scfg = server_config(&pki.server, &[ALPN_AMQP], &opts).expect("server config");
                let ep = endpoint(
                    Socket::bind_udp("127.0.0.1:0".parse().expect("addr")).expect("UDP socket"),
                    Some(scfg),
                    None,
                )
                .expect("endpoint");
                let a = ep.local_addr().expect("bound");
                tokio::spawn(serve_quic(b.clone(), ep));
                a
            }
            Transport::TcpTls13 | Transport::TcpTls12 => {
                let l = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("TCP listener");
                let a = l.local_addr().expect("bound");
                let tls = transport::tls_server_config(&pki.server, None).expect("TLS config");
                tokio::spawn(serve_tcp(b.clone(), l, Some(tls)));
                a
            }
        };
        let client = || {
            let sock = (transport.scheme() == Scheme::Quic).then(|| {
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
        Bed {
            sender: client(),
            receiver: client(),
            probes: None,
            _broker: b,
        }
    }

    fn now(&self) -> Option<Duration> {
        self.probes.as_ref().map(|(p, _)| p.net.elapsed())
    }

    /// Run one side's connections and summarise them; `sender` picks whose link is probed.
    async fn side<F>(&self, sender: bool, run: F) -> Side
    where
        F: std::future::Future<Output = Vec<Result<Report, String>>>,
    {
        if let Some((p, _)) = &self.probes {
            let _ = p.net.take_trace(); // start this side's trace empty
        }
        let (t0, n0) = (Instant::now(), self.now());
        let reports = run.await;
        let total = t0.elapsed();
        let mut side = Side {
            total_s: total.as_secs_f64(),
            wire_bytes: f64::NAN,
            energy_j: f64::NAN,
            ..Default::default()
        };
        if let (Some((s, r)), Some(from), Some(to)) = (&self.probes, n0, self.now()) {
            let p = if sender { s } else { r };
            (side.wire_bytes, side.energy_j) = p.account(from, to);
        }
        let ok: Vec<&Report> = reports.iter().filter_map(|r| r.as_ref().ok()).collect();
        side.failed = reports.len() - ok.len();
        side.messages = ok.iter().map(|r| r.messages as usize).sum();
        side.zero_rtt = ok.iter().filter(|r| r.zero_rtt).count();
        side.startup_ms = mean(ok.iter().map(|r| r.startup.as_secs_f64() * 1e3));
        side.rtt_ms = mean(
            ok.iter()
                .filter_map(|r| r.rtt)
                .map(|d| d.as_secs_f64() * 1e3),
        );
        side
    }
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let (mut sum, mut n) = (0.0, 0usize);
    for x in xs {
        sum += x;
        n += 1;
    }
    if n == 0 {
        f64::NAN
    } else {
        sum / n as f64
    }
}

fn body(i: usize) -> Vec<u8> {
    let mut b = vec![0x42u8; MESSAGE_BYTES];
    b[..8].copy_from_slice(&(i as u64).to_be_bytes());
    b
}

/// `n` messages, each on a new pipelined connection (0-RTT once a ticket is held), each
/// waiting for the broker's accept (at-least-once, as the paper's Go sender).
async fn send_each(c: &Connector, n: usize, tag: u64) -> Vec<Result<Report, String>> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        out.push(
            send_one(c, QUEUE, &message(tag, i), false, CONNECTION_TIMEOUT)
                .await
                .map_err(|e| e.to_string()),
        );
    }
    out
}

/// `n` messages, each received on a new pipelined connection.
async fn receive_each(c: &Connector, n: usize) -> Vec<Result<Report, String>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(
            receive_one(c, QUEUE, CONNECTION_TIMEOUT)
                .await
                .map_err(|e| e.to_string()),
        );
    }
    out
}

/// `n` messages on one connection, each sent once the one before is accepted (the paper's Go
/// sender waits for each settlement too).
async fn send_on_one(c: &Connector, n: usize, tag: u64) -> Vec<Result<Report, String>> {
    let msgs: Vec<_> = (0..n).map(|i| message(tag, i)).collect();
    vec![send_in_turn(c, QUEUE, &msgs, false, CONNECTION_TIMEOUT)
        .await
        .map_err(|e| e.to_string())]
}

/// Message `i` of a run: a 138-byte body and an id unique in the run (the broker's 0-RTT
/// replay guard must see every message as new).
fn message(tag: u64, i: usize) -> qgate_amqp::broker::AmqpMessage {
    client::message_with_id(MessageId::String(format!("{tag:x}-{i}")), body(i))
}

/// One repetition of `p` on `bed`.
pub async fn run_rep(p: &Point, bed: &Bed, rep: usize, seed: u64) -> Rep {
    let (send, recv) = match p.case {
        Case::Multi => {
            let send = bed
                .side(true, send_each(&bed.sender, p.messages, seed))
                .await;
            let recv = bed
                .side(false, receive_each(&bed.receiver, send.messages))
                .await;
            (send, Some(recv))
        }
        Case::Single => (
            bed.side(true, send_on_one(&bed.sender, p.messages, seed))
                .await,
            None,
        ),
        Case::Energy | Case::Sweep => (
            bed.side(true, send_each(&bed.sender, p.messages, seed))
                .await,
            None,
        ),
    };
    Rep {
        rep,
        seed,
        send,
        recv,
    }
}

fn rep_seed(p: &Point, rep: usize) -> u64 {
    p.seed.wrapping_add(rep as u64 * 7919)
}

/// Run every repetition of a point: on netsim in virtual time (deterministic per seed), on
/// loopback in real time.
pub fn run_point(p: &Point) -> Vec<Rep> {
    match p.testbed {
        Testbed::Netsim => (0..p.reps)
            .map(|rep| {
                let seed = rep_seed(p, rep);
                crate::virtual_time(async {
                    let bed = Bed::netsim(p.channel, p.transport, seed);
                    run_rep(p, &bed, rep, seed).await
                })
            })
            .collect(),
        Testbed::Loopback => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime")
            .block_on(async {
                let mut out = Vec::with_capacity(p.reps);
                for rep in 0..p.reps {
                    let bed = Bed::loopback(p.transport).await;
                    out.push(run_rep(p, &bed, rep, rep_seed(p, rep)).await);
                }
                out
            }),
    }
}

/// Table 3's sweeps: bandwidth (kbit/s), added one-way delay (ms), loss (%).
pub const BANDWIDTHS_KBPS: [u64; 5] = [8, 16, 32, 512, 1024];
/// Delay sweep.
pub const DELAYS_MS: [u64; 4] = [0, 200, 400, 600];
/// Loss sweep.
pub const LOSSES_PCT: [u64; 4] = [0, 5, 10, 15];

/// How big the plan is.
#[derive(Debug, Clone, Copy)]
pub struct PlanSize {
    /// Repetitions of the multi-connection case (paper: 30).
    pub multi_reps: usize,
    /// Messages per multi-connection repetition (paper: 100).
    pub multi_messages: usize,
    /// Messages of the single-connection case (paper: 1000).
    pub single_messages: usize,
    /// Repetitions of the single-connection case (paper: not stated; *decided* 5).
    pub single_reps: usize,
    /// Repetitions of the energy case (paper: 15).
    pub energy_reps: usize,
    /// Repetitions per sweep point (paper: 5, of 10 connections each).
    pub sweep_reps: usize,
    /// Run the loopback baseline.
    pub loopback: bool,
    /// Fewer sweep points (smoke runs).
    pub quick: bool,
}

impl PlanSize {
    /// The paper's sizes.
    pub fn paper() -> PlanSize {
        PlanSize {
            multi_reps: 30,
            multi_messages: 100,
            single_messages: 1000,
            single_reps: 5,
            energy_reps: 15,
            sweep_reps: 5,
            loopback: true,
            quick: false,
        }
    }

    /// A smoke run.
    pub fn quick() -> PlanSize {
        PlanSize {
            multi_reps: 2,
            multi_messages: 5,
            single_messages: 20,
            single_reps: 1,
            energy_reps: 2,
            sweep_reps: 1,
            loopback: true,
            quick: true,
        }
    }
}

/// The experiment's points: every case on netsim (QUIC), the sweeps on netsim (QUIC), and
/// the default cases on loopback for every transport.
pub fn plan(size: &PlanSize) -> Vec<Point> {
    let mut v = Vec::new();
    let base = |case, messages, reps, transport, testbed| Point {
        case,
        sweep: "default",
        channel: Channel::WIFI,
        transport,
        testbed,
        messages,
        reps,
        seed: 0,
    };
    let cases = [
        (Case::Multi, size.multi_messages, size.multi_reps),
        (Case::Single, size.single_messages, size.single_reps),
        (Case::Energy, 10, size.energy_reps),
    ];
    for (case, m, r) in cases {
        for t in TRANSPORTS {
            v.push(base(case, m, r, t, Testbed::Netsim));
        }
    }
    let pick = |all: &[u64], quick: &[u64]| -> Vec<u64> {
        if size.quick {
            quick.to_vec()
        } else {
            all.to_vec()
        }
    };
    let mut sweep = |name: &'static str, channel: Channel| {
        for t in TRANSPORTS {
            v.push(Point {
                case: Case::Sweep,
                sweep: name,
                channel,
                ..base(Case::Sweep, 10, size.sweep_reps, t, Testbed::Netsim)
            });
        }
    };
    for k in pick(&BANDWIDTHS_KBPS, &[32, 1024]) {
        sweep(
            "bandwidth",
            Channel {
                rate_bps: k * 1000,
                ..Channel::WIFI
            },
        );
    }
    for d in pick(&DELAYS_MS, &[0, 200]) {
        sweep(
            "delay",
            Channel {
                delay: Channel::WIFI.delay + Duration::from_millis(d),
                ..Channel::WIFI
            },
        );
    }
    for l in pick(&LOSSES_PCT, &[0, 15]) {
        sweep(
            "loss",
            Channel {
                loss: l as f64 / 100.0,
                ..Channel::WIFI
            },
        );
    }
    if size.loopback {
        for t in TRANSPORTS
            .into_iter()
            .filter(|&t| t != Transport::QuicPmtudOff)
        {
            for (case, m, r) in cases.iter().take(2) {
                v.push(base(*case, *m, *r, t, Testbed::Loopback));
            }
        }
    }
    // Every point's seed from its label: adding a point does not change the others.
    for p in &mut v {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in p.label().bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        p.seed = h % 1_000_000 + 1;
    }
    v
}

/// Run the plan: loopback points one at a time first (real time, nothing else running), then
/// the netsim points two at a time; `progress(label)` after each point.
pub fn run_all(points: &[Point], progress: impl Fn(&str) + Sync) -> Vec<Vec<Rep>> {
    let mut out: Vec<Option<Vec<Rep>>> = vec![None; points.len()];
    for (i, p) in points.iter().enumerate() {
        if p.testbed == Testbed::Loopback {
            out[i] = Some(run_point(p));
            progress(&p.label());
        }
    }
    let sim: Vec<usize> = (0..points.len())
        .filter(|&i| points[i].testbed == Testbed::Netsim)
        .collect();
    let results = crate::pool::run_each(
        &sim,
        crate::pool::default_jobs(),
        |&i| run_point(&points[i]),
        |&i| progress(&points[i].label()),
    );
    for (i, r) in sim.into_iter().zip(results) {
        out[i] = Some(r);
    }
    out.into_iter()
        .map(|r| r.expect("every point ran"))
        .collect()
}
