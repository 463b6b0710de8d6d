//! `kind = "amqp"`: paper 003's measurement. A sender puts messages on a queue of the real
//! broker, each on a new connection (0-RTT once QUIC holds a ticket) or all on one; then a
//! receiver, if any, takes every accepted message off, one connection each. QUIC runs on the
//! simulator's UDP, TCP+TLS on the user-space TCP ([`qgate_netsim::tcp`]) over the same links.
//!
//! Per side (`send_`, `recv_`): scalars `total_s` (first connection start → last closed),
//! `messages` (accepted by the broker, or received), `failed` (connections), `zero_rtt`
//! (connections that used it), `wire_bytes` (the host's first link, both directions, IP headers
//! and lost packets included) and `energy_j` (its radio over `total_s`: transmitting while its
//! packets serialise, lost ones too, receiving while packets for it serialise, idle otherwise);
//! samples (t = the connection's start) `startup_ms` (start → first message written) and, for
//! QUIC, `rtt_ms` (smoothed RTT at the end).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use fe2o3_amqp::types::messaging::MessageId;
use qgate_amqp::broker::{serve_quic, AmqpMessage, Broker, BrokerConfig};
use qgate_amqp::client::{self, Connector, Report};
use qgate_amqp::oneshot::{receive_one, send_in_turn, send_one};
use qgate_amqp::transport::{self, BoxStream, Dialer, Scheme, TlsVersion, ALPN_AMQP};
use qgate_netsim::tcp::TcpHost;
use qgate_netsim::{Direction, LinkId, Network, World};
use qgate_transport::{endpoint, server_config, Socket, TransportOptions};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{secs, Clock, Measurements, Setup};
use crate::plan::spec::{AmqpConnections, AmqpLoad, AmqpTransport, Radio};

/// The queue every message goes through.
const QUEUE: &str = "iot";
/// The broker's port (plus the workload's index).
const PORT: u16 = 5671;
/// Largest body a plan may ask for (the broker's default message limit is larger).
const MAX_BODY: usize = 1 << 20;
/// Most messages a plan may ask for.
const MAX_MESSAGES: usize = 1_000_000;

pub(super) fn check(
    a: &AmqpLoad,
    host: &dyn Fn(&str, &str) -> Result<(), String>,
) -> Result<(), String> {
    let fail = |e: &str| Err(format!("workload '{}': {e}", a.name));
    host("workloads.broker", &a.broker)?;
    host("workloads.sender", &a.sender)?;
    let mut hosts = vec![&a.broker, &a.sender];
    if let Some(r) = &a.receiver {
        host("workloads.receiver", r)?;
        hosts.push(r);
    }
    hosts.sort();
    if hosts.windows(2).any(|w| w[0] == w[1]) {
        return fail("'broker', 'sender' and 'receiver' must be different hosts");
    }
    if !(1..=MAX_MESSAGES).contains(&a.messages) {
        return fail(&format!("'messages' must be in [1, {MAX_MESSAGES}]"));
    }
    if !(1..=MAX_BODY).contains(&a.body_bytes) {
        return fail(&format!("'body_bytes' must be in [1, {MAX_BODY}]"));
    }
    if !(a.timeout_s > 0.0 && a.timeout_s <= 86_400.0) {
        return fail("'timeout_s' must be in (0, 86400]");
    }
    let r = &a.radio;
    if ![r.volts, r.tx_amps, r.rx_amps, r.idle_amps]
        .iter()
        .all(|x| x.is_finite() && *x >= 0.0)
    {
        return fail("'radio' values must be finite and not negative");
    }
    if !a.mtu_discovery && a.transport != AmqpTransport::Quic {
        return fail("'mtu_discovery' is a QUIC setting: leave it out for TCP+TLS");
    }
    Ok(())
}

/// A host's radio: its first link, the direction it transmits on, and its energy model.
struct Probe {
    net: Network,
    link: LinkId,
    tx: Direction,
    radio: Radio,
}

/// Bytes counted on a probe's link at one moment.
#[derive(Clone, Copy)]
struct Count {
    /// Bytes the host transmitted (delivered or lost on the wire).
    tx: u64,
    /// Bytes delivered to the host.
    rx: u64,
    /// Bytes lost on the way to it.
    rx_lost: u64,
}

impl Probe {
    fn count(&self) -> Count {
        let up = self.net.stats(self.link, self.tx);
        let down = self.net.stats(self.link, self.tx.reverse());
        Count {
            tx: up.delivered_bytes + up.dropped_loss_bytes,
            rx: down.delivered_bytes,
            rx_lost: down.dropped_loss_bytes,
        }
    }

    /// Seconds to serialise `bytes` in direction `dir` at the link's rate now (0 unlimited).
    fn airtime(&self, dir: Direction, bytes: u64) -> f64 {
        match self.net.params(self.link, dir).rate_bps {
            Some(r) if r > 0 => bytes as f64 * 8.0 / r as f64,
            _ => 0.0,
        }
    }

    /// Bytes on the link and the radio's energy between two counts `span` apart.
    fn account(&self, from: Count, to: Count, span: f64) -> (f64, f64) {
        let (tx, rx) = (to.tx - from.tx, to.rx - from.rx);
        let bytes = tx + rx + (to.rx_lost - from.rx_lost);
        let tx_s = self.airtime(self.tx, tx);
        let rx_s = self.airtime(self.tx.reverse(), rx);
        let idle = (span - tx_s - rx_s).max(0.0);
        let r = &self.radio;
        let joules = r.volts * (r.tx_amps * tx_s + r.rx_amps * rx_s + r.idle_amps * idle);
        (bytes as f64, joules)
    }
}

pub(crate) struct Prepared {
    spec: AmqpLoad,
    tag: u64,
    sender: (Connector, Probe),
    receiver: Option<(Connector, Probe)>,
    _broker: Broker,
    serving: JoinHandle<()>,
}

impl Drop for Prepared {
    fn drop(&mut self) {
        self.serving.abort();
    }
}

/// Makes the connector (and the radio probe) of a named client host; the number tells the
/// sides' endpoint seeds apart.
type ClientFn<'a> = dyn Fn(&str, u64) -> Result<(Connector, Probe), String> + 'a;

fn v4(ip: IpAddr, what: &str) -> Result<std::net::Ipv4Addr, String> {
    match ip {
        IpAddr::V4(v) => Ok(v),
        IpAddr::V6(_) => Err(format!("{what}: TCP on the simulated network is IPv4 only")),
    }
}

pub(super) fn prepare(a: &AmqpLoad, world: &World, s: &Setup) -> Result<Prepared, String> {
    let net = world.net.clone();
    let on = |name: &str| -> Result<(qgate_netsim::HostId, IpAddr, Probe), String> {
        let h = world
            .host(name)
            .ok_or_else(|| format!("no host '{name}'"))?;
        let ip = world
            .address_of(h)
            .ok_or_else(|| format!("host '{name}' has no link"))?;
        let (link, tx) = world.uplink(h).expect("a host with an address has a link");
        let probe = Probe {
            net: world.net.clone(),
            link,
            tx,
            radio: a.radio,
        };
        Ok((h, ip, probe))
    };
    let (bh, bip, _) = on(&a.broker)?;
    let baddr = SocketAddr::new(bip, PORT + s.index as u16);
    let opts = TransportOptions {
        mtu_discovery: a.mtu_discovery,
        ..Default::default()
    };
    let broker = Broker::start(BrokerConfig::default()).map_err(|e| e.to_string())?;
    let trust = s.pki.trust();
    // Client endpoints' seeds: distinct per run, per workload and per side.
    let seed = |side: u64| {
        s.seed
            .wrapping_mul(31)
            .wrapping_add(side)
            .wrapping_add(s.index as u64 * 1000)
    };
    let (serving, client): (JoinHandle<()>, Box<ClientFn<'_>>) = match a.transport {
        AmqpTransport::Quic => {
            let scfg =
                server_config(&s.pki.server, &[ALPN_AMQP], &opts).map_err(|e| e.to_string())?;
            let sock = net.bind(bh, baddr).map_err(|e| e.to_string())?;
            let ep = endpoint(Socket::from(sock), Some(scfg), Some(s.seed))
                .map_err(|e| e.to_string())?;
            let serving = tokio::spawn(serve_quic(broker.clone(), ep));
            let client = move |name: &str, side: u64| {
                let (h, ip, probe) = on(name)?;
                let sock = net
                    .bind(h, SocketAddr::new(ip, 0))
                    .map_err(|e| e.to_string())?;
                let ep = endpoint(Socket::from(sock), None, Some(seed(side)))
                    .map_err(|e| e.to_string())?;
                let c = Connector::on_endpoint(ep, baddr, "localhost", &trust, None, &opts)
                    .map_err(|e| e.to_string())?;
                Ok((c, probe))
            };
            (serving, Box::new(client))
        }
        AmqpTransport::TcpTls13 | AmqpTransport::TcpTls12 => {
            let version = if a.transport == AmqpTransport::TcpTls13 {
                TlsVersion::V13
            } else {
                TlsVersion::V12
            };
            let stack = TcpHost::new(&net, bh, v4(bip, "broker")?).map_err(|e| e.to_string())?;
            let listener = stack.listen(baddr.port()).map_err(|e| e.to_string())?;
            let tls =
                transport::tls_server_config(&s.pki.server, None).map_err(|e| e.to_string())?;
            let served = broker.clone();
            let serving = tokio::spawn(async move {
                let mut conns = tokio::task::JoinSet::new();
                loop {
                    let s = listener.accept().await;
                    let (b, tls) = (served.clone(), tls.clone());
                    conns.spawn(async move { b.serve_tls(s, tls).await });
                    while conns.try_join_next().is_some() {}
                }
            });
            let client = move |name: &str, _side: u64| {
                let (h, ip, probe) = on(name)?;
                let host = TcpHost::new(&net, h, v4(ip, name)?).map_err(|e| e.to_string())?;
                let dial: Dialer = Arc::new(move |addr| {
                    let host = host.clone();
                    Box::pin(
                        async move { host.connect(addr).await.map(|s| Box::new(s) as BoxStream) },
                    )
                });
                let c = Connector::new(
                    Scheme::TcpTls(version),
                    baddr,
                    "localhost",
                    &trust,
                    None,
                    None,
                    &opts,
                )
                .map_err(|e| e.to_string())?
                .with_dialer(dial);
                Ok((c, probe))
            };
            (serving, Box::new(client))
        }
    };
    let sender = client(&a.sender, 1)?;
    let receiver = a.receiver.as_deref().map(|r| client(r, 2)).transpose()?;
    Ok(Prepared {
        spec: a.clone(),
        tag: s.seed ^ ((s.index as u64) << 48),
        sender,
        receiver,
        _broker: broker,
        serving,
    })
}

/// Message `i` of a run: `body_bytes` bytes (the first 8 its index) and an id unique in the
/// run (the broker's 0-RTT replay guard must see every message as new).
fn message(tag: u64, i: usize, body_bytes: usize) -> AmqpMessage {
    let mut b = vec![0x42u8; body_bytes];
    let idx = (i as u64).to_be_bytes();
    let n = idx.len().min(body_bytes);
    b[..n].copy_from_slice(&idx[..n]);
    client::message_with_id(MessageId::String(format!("{tag:x}-{i}")), b)
}

/// One connection's outcome, with its start (s from `start`).
pub(crate) type Outcome = (f64, Result<Report, String>);

impl Prepared {
    pub(super) async fn run(self, clock: Clock) -> Measurements {
        let a = &self.spec;
        tokio::time::sleep_until(clock.start + secs(a.start_s)).await;
        let mut m = Measurements::default();
        let (conn, probe) = &self.sender;
        let sent = measure(probe, "send", &mut m, async {
            send(conn, a, self.tag, clock.start, clock.deadline).await
        })
        .await;
        if let Some((conn, probe)) = &self.receiver {
            measure(probe, "recv", &mut m, async {
                receive(conn, a, sent, clock.start, clock.deadline).await
            })
            .await;
        }
        m
    }
}

/// Send `a.messages` as `a.connections` says; no new connection after `deadline`.
pub(crate) async fn send(
    conn: &Connector,
    a: &AmqpLoad,
    tag: u64,
    start: Instant,
    deadline: Instant,
) -> Vec<Outcome> {
    let timeout = secs(a.timeout_s);
    let t = || start.elapsed().as_secs_f64();
    let mut out = Vec::new();
    match a.connections {
        AmqpConnections::PerMessage => {
            for i in 0..a.messages {
                if Instant::now() >= deadline {
                    break;
                }
                let msg = message(tag, i, a.body_bytes);
                let at = t();
                let r = send_one(conn, QUEUE, &msg, false, timeout).await;
                out.push((at, r.map_err(|e| e.to_string())));
            }
        }
        AmqpConnections::One => {
            let msgs: Vec<_> = (0..a.messages)
                .map(|i| message(tag, i, a.body_bytes))
                .collect();
            let at = t();
            let r = send_in_turn(conn, QUEUE, &msgs, false, timeout).await;
            out.push((at, r.map_err(|e| e.to_string())));
        }
    }
    out
}

/// Receive `n` messages, each on a new connection; none started after `deadline`.
pub(crate) async fn receive(
    conn: &Connector,
    a: &AmqpLoad,
    n: usize,
    start: Instant,
    deadline: Instant,
) -> Vec<Outcome> {
    let mut out = Vec::new();
    for _ in 0..n {
        if Instant::now() >= deadline {
            break;
        }
        let at = start.elapsed().as_secs_f64();
        let r = receive_one(conn, QUEUE, secs(a.timeout_s)).await;
        out.push((at, r.map_err(|e| e.to_string())));
    }
    out
}

/// Run one side's connections, record `<side>_…` metrics into `m`, and return how many
/// messages made it.
async fn measure(
    probe: &Probe,
    side: &str,
    m: &mut Measurements,
    run: impl std::future::Future<Output = Vec<Outcome>>,
) -> usize {
    let (t0, c0) = (Instant::now(), probe.count());
    let outcomes = run.await;
    let span = t0.elapsed().as_secs_f64();
    let wire = probe.account(c0, probe.count(), span);
    record(side, &outcomes, span, Some(wire), m)
}

/// Record one side's `<side>_…` metrics (`wire`: bytes on its link and its radio's energy,
/// when measured) into `m`; returns how many messages made it.
pub(crate) fn record(
    side: &str,
    outcomes: &[Outcome],
    span: f64,
    wire: Option<(f64, f64)>,
    m: &mut Measurements,
) -> usize {
    let ok: Vec<(f64, &Report)> = outcomes
        .iter()
        .filter_map(|(t, r)| Some((*t, r.as_ref().ok()?)))
        .collect();
    let messages: usize = ok.iter().map(|(_, r)| r.messages as usize).sum();
    let key = |k: &str| format!("{side}_{k}");
    m.scalars.push((key("total_s"), span));
    m.scalars.push((key("messages"), messages as f64));
    m.scalars
        .push((key("failed"), (outcomes.len() - ok.len()) as f64));
    m.scalars.push((
        key("zero_rtt"),
        ok.iter().filter(|(_, r)| r.zero_rtt).count() as f64,
    ));
    if let Some((bytes, joules)) = wire {
        m.scalars.push((key("wire_bytes"), bytes));
        m.scalars.push((key("energy_j"), joules));
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    m.samples.push((
        key("startup_ms"),
        ok.iter().map(|(t, r)| (*t, ms(r.startup))).collect(),
    ));
    let rtt: Vec<(f64, f64)> = ok
        .iter()
        .filter_map(|(t, r)| Some((*t, ms(r.rtt?))))
        .collect();
    if !rtt.is_empty() {
        m.samples.push((key("rtt_ms"), rtt));
    }
    messages
}
