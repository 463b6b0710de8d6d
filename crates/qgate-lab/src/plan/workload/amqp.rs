//! `kind = "amqp"`: paper 003's measurement. A sender puts messages on a queue of the real
//! broker, each on a new connection (0-RTT once QUIC holds a ticket) or all on one; then a
//! receiver, if any, takes every accepted message off, one connection each. QUIC runs on the
//! simulator's UDP, TCP+TLS on the user-space TCP ([`qgate_netsim::tcp`]) over the same links.
//!
//! Per side (`send_`, `recv_`): scalars `total_s` (first connection start → last closed),
//! `messages` (accepted by the broker, or received, also on a connection that failed later),
//! `missing` (the rest: failed, or cut by the run's deadline), `failed` (connections), `zero_rtt`
//! (connections that used it), `wire_bytes` (the host's link toward the broker, both directions, IP headers
//! and lost packets included) and `energy_j` (its radio over `total_s`: transmitting while its
//! packets serialise, lost ones too, receiving while packets for it serialise, idle otherwise);
//! samples (t = the connection's start) `startup_ms` (start → first message written) and, for
//! QUIC, `rtt_ms` (smoothed RTT at the end); for QUIC also the scalar `lost_packets` (packets
//! declared lost while the side's AMQP connections were open: on a link that drops nothing,
//! spurious retransmissions).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use fe2o3_amqp::types::messaging::MessageId;
use qgate_amqp::broker::{AmqpMessage, Broker};
use qgate_amqp::builder::RunningBroker;
use qgate_amqp::client::{self, Connector, Report};
use qgate_amqp::oneshot::{receive_one, send_in_turn_into, send_one};
use qgate_amqp::transport::{self, BoxStream, Dialer, Scheme, TlsVersion, ALPN_AMQP};
use qgate_netsim::tcp::TcpHost;
use qgate_netsim::topology::Topology;
use qgate_netsim::{Direction, LinkId, Network, World};
use qgate_transport::window_history::DEFAULT_SAFEGUARD_FACTOR;
use qgate_transport::{
    constrained_endpoint, endpoint, one_connection_endpoint, server_config, Socket,
    TransportOptions,
};
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
    topology: &Topology,
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
    for client in std::iter::once(&a.sender).chain(&a.receiver) {
        if !topology.connects(client, &a.broker) {
            return fail(&format!(
                "no path from '{client}' to the broker '{}' (links through forwarding hosts)",
                a.broker
            ));
        }
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
    if !a.mtu_discovery && !a.transport.is_quic() {
        return fail("'mtu_discovery' is a QUIC setting: leave it out for TCP+TLS");
    }
    if a.constrained && !a.transport.is_quic() {
        return fail("'constrained' is a QUIC profile: leave it out for TCP+TLS");
    }
    if a.ack_eliciting_threshold.is_some() && !a.transport.is_quic() {
        return fail("'ack_eliciting_threshold' is a QUIC setting: leave it out for TCP+TLS");
    }
    let quic = TransportOptions {
        ack_eliciting_threshold: a.ack_eliciting_threshold,
        ..Default::default()
    };
    if let Err(e) = quic.validate() {
        return fail(&e.to_string());
    }
    if a.history && !a.transport.is_quic() {
        return fail("'history' is a QUIC setting: leave it out for TCP+TLS");
    }
    Ok(())
}

/// A host's radio: its link toward the broker, the direction it transmits on, and its energy model.
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
    _broker: RunningBroker,
}

/// Makes the connector (and the radio probe) of a named client host; the number tells the
/// sides' endpoint seeds apart.
type ClientFn<'a> = dyn Fn(&str, u64) -> Result<(Connector, Probe), String> + 'a;

fn unspecified(like: IpAddr) -> IpAddr {
    match like {
        IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
    }
}

fn v4(ip: IpAddr, what: &str) -> Result<std::net::Ipv4Addr, String> {
    match ip {
        IpAddr::V4(v) => Ok(v),
        IpAddr::V6(_) => Err(format!("{what}: TCP on the simulated network is IPv4 only")),
    }
}

pub(super) fn prepare(a: &AmqpLoad, world: &World, s: &Setup) -> Result<Prepared, String> {
    let net = world.net.clone();
    let port = PORT + s.index as u16;
    let bh = world
        .host(&a.broker)
        .ok_or_else(|| format!("no host '{}'", a.broker))?;
    // A client and the broker each use their address on the path between them: a multi-homed
    // host's packets leave by the interface of their source address.
    let on = |name: &str| -> Result<(qgate_netsim::HostId, IpAddr, SocketAddr, Probe), String> {
        let h = world
            .host(name)
            .ok_or_else(|| format!("no host '{name}'"))?;
        let (Some(ip), Some(to)) = (world.address_toward(h, bh), world.address_toward(bh, h))
        else {
            return Err(format!(
                "no path from '{name}' to the broker '{}' (through forwarding hosts)",
                a.broker
            ));
        };
        // Its radio: the link it reaches the broker by.
        let (link, tx) = world.link_at(ip).expect("an address is a link's end");
        let probe = Probe {
            net: world.net.clone(),
            link,
            tx,
            radio: a.radio,
        };
        Ok((h, ip, SocketAddr::new(to, port), probe))
    };
    let targets: Vec<SocketAddr> = std::iter::once(&a.sender)
        .chain(a.receiver.as_ref())
        .map(|n| on(n).map(|x| x.2))
        .collect::<Result<_, _>>()?;
    let opts = TransportOptions {
        mtu_discovery: a.mtu_discovery,
        ack_eliciting_threshold: a.ack_eliciting_threshold,
        ..Default::default()
    };
    let trust = s.pki.trust();
    // Client endpoints' seeds: distinct per run, per workload and per side.
    let seed = |side: u64| {
        s.seed
            .wrapping_mul(31)
            .wrapping_add(side)
            .wrapping_add(s.index as u64 * 1000)
    };
    let (broker, client): (RunningBroker, Box<ClientFn<'_>>) = match a.transport {
        AmqpTransport::Quic | AmqpTransport::QuicMux => {
            let mux = a.transport == AmqpTransport::QuicMux;
            // Constrained: the broker knows the radio its devices use (the sender's) too.
            let radio_kbps = |probe: &Probe| {
                let bps = probe.net.params(probe.link, probe.tx).rate_bps;
                bps.filter(|r| *r > 0).map(|r| r as f64 / 1000.0)
            };
            let mut server_opts = opts.clone();
            if a.constrained {
                server_opts.link_kbps = radio_kbps(&on(&a.sender)?.3);
                server_opts.mtu_discovery = false;
            }
            let scfg = server_config(&s.pki.server, &[ALPN_AMQP], &server_opts)
                .map_err(|e| e.to_string())?;
            // Any of its addresses: each client reaches it by the one facing it.
            let any = SocketAddr::new(unspecified(targets[0].ip()), port);
            let sock = net.bind(bh, any).map_err(|e| e.to_string())?;
            let ep = endpoint(Socket::from(sock), Some(scfg), Some(s.seed))
                .map_err(|e| e.to_string())?;
            let broker = Broker::builder()
                .quic(ep)
                .start()
                .map_err(|e| e.to_string())?;
            let client = move |name: &str, side: u64| {
                let (h, ip, baddr, probe) = on(name)?;
                let mut opts = opts.clone();
                if a.constrained {
                    // The device knows its radio: the rate it transmits at toward the broker.
                    opts.link_kbps = radio_kbps(&probe);
                    opts.mtu_discovery = false;
                }
                let mut c = if a.constrained && !mux {
                    // Each connection from a socket of its own, as TCP takes a port each (T10).
                    let net = net.clone();
                    let base = seed(side);
                    let made = std::sync::atomic::AtomicU64::new(0);
                    let make: client::EndpointMaker = Arc::new(move || {
                        let k = made.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                        let sock = net
                            .bind(h, SocketAddr::new(ip, 0))
                            .map_err(|e| e.to_string())?;
                        let seed = base.wrapping_add(k.wrapping_mul(0x9e37_79b9_7f4a_7c15));
                        one_connection_endpoint(Socket::from(sock), Some(seed))
                            .map_err(|e| e.to_string())
                    });
                    Connector::per_connection(make, baddr, "localhost", &trust, None, &opts)
                } else {
                    let sock = net
                        .bind(h, SocketAddr::new(ip, 0))
                        .map_err(|e| e.to_string())?;
                    let ep = if a.constrained {
                        constrained_endpoint(Socket::from(sock), Some(seed(side)))
                    } else {
                        endpoint(Socket::from(sock), None, Some(seed(side)))
                    }
                    .map_err(|e| e.to_string())?;
                    Connector::on_endpoint(ep, baddr, "localhost", &trust, None, &opts)
                }
                .map_err(|e| e.to_string())?;
                if a.history {
                    // Each client its own store, as each device has (H6).
                    let store = super::virtual_history(Default::default());
                    c = c.with_history(store, Some(DEFAULT_SAFEGUARD_FACTOR));
                }
                Ok((if mux { c.multiplexed() } else { c }, probe))
            };
            (broker, Box::new(client))
        }
        AmqpTransport::TcpTls13 | AmqpTransport::TcpTls12 => {
            let version = if a.transport == AmqpTransport::TcpTls13 {
                TlsVersion::V13
            } else {
                TlsVersion::V12
            };
            // A user-space TCP stack has one address: one per address the clients reach.
            let mut addrs: Vec<IpAddr> = targets.iter().map(|t| t.ip()).collect();
            addrs.dedup();
            let tls =
                transport::tls_server_config(&s.pki.server, None).map_err(|e| e.to_string())?;
            let mut builder = Broker::builder();
            for ip in addrs {
                let stack = TcpHost::new(&net, bh, v4(ip, "broker")?).map_err(|e| e.to_string())?;
                let listener = stack.listen(port).map_err(|e| e.to_string())?;
                let incoming = futures_util::stream::unfold(listener, |l| async move {
                    let s = l.accept().await;
                    Some((s, l))
                });
                builder = builder.accepted(incoming, tls.clone());
            }
            let broker = builder.start().map_err(|e| e.to_string())?;
            let client = move |name: &str, _side: u64| {
                let (h, ip, baddr, probe) = on(name)?;
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
            (broker, Box::new(client))
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

/// One connection: when it started (s from `start`), what the broker settled on it, and why
/// it failed (if it did).
pub(crate) struct Outcome {
    at: f64,
    report: Report,
    error: Option<String>,
}

impl Prepared {
    pub(super) async fn run(self, clock: Clock) -> Measurements {
        let a = &self.spec;
        tokio::time::sleep_until(clock.start + secs(a.start_s)).await;
        let mut m = Measurements::default();
        let (conn, probe) = &self.sender;
        let sent = measure(probe, "send", a.messages, &mut m, async {
            send(conn, a, self.tag, clock.start, clock.deadline).await
        })
        .await;
        if let Some((conn, probe)) = &self.receiver {
            measure(probe, "recv", sent, &mut m, async {
                receive(conn, a, sent, clock.start, clock.deadline).await
            })
            .await;
        }
        m
    }
}

/// A connection's time limit: `timeout_s`, cut at `deadline`; none once it has passed.
fn limit(a: &AmqpLoad, deadline: Instant) -> Option<Duration> {
    let left = deadline.checked_duration_since(Instant::now())?;
    (!left.is_zero()).then(|| secs(a.timeout_s).min(left))
}

/// One connection's whole life bounded by `limit`: its handshake, every message, its close
/// (the client bounds each wait on its own; this bounds their sum).
async fn bounded<F>(limit: Duration, f: F) -> Option<String>
where
    F: std::future::Future<Output = Result<(), qgate_amqp::client::ClientError>>,
{
    match tokio::time::timeout(limit, f).await {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some(format!("the connection took longer than {limit:?}")),
    }
}

/// Send `a.messages` as `a.connections` says; nothing runs past `deadline`.
pub(crate) async fn send(
    conn: &Connector,
    a: &AmqpLoad,
    tag: u64,
    start: Instant,
    deadline: Instant,
) -> Vec<Outcome> {
    let t = || start.elapsed().as_secs_f64();
    let mut out = Vec::new();
    match a.connections {
        AmqpConnections::PerMessage => {
            for i in 0..a.messages {
                let Some(timeout) = limit(a, deadline) else {
                    break;
                };
                let msg = message(tag, i, a.body_bytes);
                let at = t();
                let mut report = Report::default();
                let error = bounded(timeout, async {
                    report = send_one(conn, QUEUE, &msg, false, timeout).await?;
                    Ok(())
                })
                .await;
                out.push(Outcome { at, report, error });
            }
        }
        AmqpConnections::One => {
            let Some(timeout) = limit(a, deadline) else {
                return out;
            };
            let msgs: Vec<_> = (0..a.messages)
                .map(|i| message(tag, i, a.body_bytes))
                .collect();
            let at = t();
            let mut report = Report::default();
            // What was settled before a failure or the limit stays counted in `report`.
            let error = bounded(
                timeout,
                send_in_turn_into(conn, QUEUE, &msgs, false, timeout, &mut report),
            )
            .await;
            out.push(Outcome { at, report, error });
        }
    }
    out
}

/// Receive `n` messages, each on a new connection; nothing runs past `deadline`.
pub(crate) async fn receive(
    conn: &Connector,
    a: &AmqpLoad,
    n: usize,
    start: Instant,
    deadline: Instant,
) -> Vec<Outcome> {
    let mut out = Vec::new();
    for _ in 0..n {
        let Some(timeout) = limit(a, deadline) else {
            break;
        };
        let at = start.elapsed().as_secs_f64();
        let mut report = Report::default();
        let error = bounded(timeout, async {
            report = receive_one(conn, QUEUE, timeout).await?;
            Ok(())
        })
        .await;
        out.push(Outcome { at, report, error });
    }
    out
}

/// Run one side's connections, record `<side>_…` metrics into `m`, and return how many
/// messages made it.
async fn measure(
    probe: &Probe,
    side: &str,
    wanted: usize,
    m: &mut Measurements,
    run: impl std::future::Future<Output = Vec<Outcome>>,
) -> usize {
    let (t0, c0) = (Instant::now(), probe.count());
    let outcomes = run.await;
    let span = t0.elapsed().as_secs_f64();
    let wire = probe.account(c0, probe.count(), span);
    record(side, wanted, &outcomes, span, Some(wire), m)
}

/// Record one side's `<side>_…` metrics (`wanted`: messages it was to move; `wire`: bytes on
/// its link and its radio's energy, when measured) into `m`; returns how many made it.
pub(crate) fn record(
    side: &str,
    wanted: usize,
    outcomes: &[Outcome],
    span: f64,
    wire: Option<(f64, f64)>,
    m: &mut Measurements,
) -> usize {
    // Messages settled on a connection that failed later still made it.
    let messages: usize = outcomes.iter().map(|o| o.report.messages as usize).sum();
    let ok: Vec<&Outcome> = outcomes.iter().filter(|o| o.error.is_none()).collect();
    for (o, e) in outcomes.iter().filter_map(|o| Some((o, o.error.as_ref()?))) {
        // Counted in `failed`; the reason is for whoever reads the log (`-v`).
        tracing::info!(side, at_s = o.at, error = %e, "amqp connection failed");
    }
    let key = |k: &str| format!("{side}_{k}");
    m.scalars.push((key("total_s"), span));
    m.scalars.push((key("messages"), messages as f64));
    m.scalars
        .push((key("missing"), wanted.saturating_sub(messages) as f64));
    m.scalars
        .push((key("failed"), (outcomes.len() - ok.len()) as f64));
    m.scalars.push((
        key("zero_rtt"),
        ok.iter().filter(|o| o.report.zero_rtt).count() as f64,
    ));
    if let Some((bytes, joules)) = wire {
        m.scalars.push((key("wire_bytes"), bytes));
        m.scalars.push((key("energy_j"), joules));
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    m.samples.push((
        key("startup_ms"),
        ok.iter().map(|o| (o.at, ms(o.report.startup))).collect(),
    ));
    let rtt: Vec<(f64, f64)> = ok
        .iter()
        .filter_map(|o| Some((o.at, ms(o.report.rtt?))))
        .collect();
    if !rtt.is_empty() {
        m.samples.push((key("rtt_ms"), rtt));
    }
    let lost: Vec<u64> = outcomes
        .iter()
        .filter_map(|o| o.report.lost_packets)
        .collect();
    if !lost.is_empty() {
        m.scalars
            .push((key("lost_packets"), lost.iter().sum::<u64>() as f64));
    }
    messages
}
