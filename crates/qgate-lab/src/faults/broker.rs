//! The broker under faults: producers and consumers on the real `qgate_amqp` broker over QUIC,
//! all on the simulated network in virtual time, with the same code as a deployment (the
//! broker's `serve_quic`, its redb store, `client::Connector` / `Client` with the CLI's 5 s idle
//! timeout).
//!
//! Topology: broker —(1 Gbit/s, 0.5 ms)— switch —(20 Mbit/s, 10 ms)— each producer and each
//! consumer on its own host and link. One queue, `telemetry`, durable (a redb store in a fresh
//! temporary directory, removed at the end).
//!
//! - Producers (4; 2 quick) each offer a message every 50 ms (20/s) for the workload (60 s;
//!   30 s quick), message-id `p{k}-{seq}`, unsettled, up to [`WINDOW`] in flight. A producer
//!   keeps every message not yet accepted and sends it again on its next connection
//!   (at-least-once); after the workload it keeps trying for up to [`FLUSH`].
//! - Consumers (2; 1 quick) receive and accept, noting every message-id and how often.
//! - Every client reconnects after a failure (connect and attach bounded by [`OP_TIMEOUT`]),
//!   with a backoff from 200 ms doubling to 2 s.
//!
//! Faults, drawn from the seed:
//! - link cuts (6; 4 quick): a random client's link goes down, half of the time for 1–3 s
//!   (QUIC rides it out: the 5 s idle timeout has not passed), half of the time for 6–9 s (the
//!   connection dies of the idle timeout and the client reconnects). Cuts avoid the restart.
//! - a broker restart at 40 % of the workload: its endpoint is closed and the broker dropped
//!   (its store closes when the last task serving it ends), and 2 s later a new broker starts on
//!   the same store file and the same address. Consumers take nothing for the 3 s before it, so
//!   the broker stops holding a backlog, ready and delivered-unsettled, that the new broker must
//!   recover from the store.
//!
//! Recovery: after a cut, from the link coming back until that client's next success (an
//! accepted outcome for a producer, a message for a consumer); after the restart, from the new
//! broker's start until a 1 s window holds 80 % of the offered rate of accepted outcomes.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fe2o3_amqp::types::messaging::{Body, MessageId, Outcome as Settled};
use fe2o3_amqp::types::primitives::Value;
use futures_util::stream::{FuturesUnordered, StreamExt};
use qgate_amqp::broker::{serve_quic, Broker, BrokerConfig, BrokerError};
use qgate_amqp::client::{self, Connector};
use qgate_amqp::store::StoreError;
use qgate_amqp::transport::ALPN_AMQP;
use qgate_netsim::{HostId, LinkId, LinkParams, Network};
use qgate_transport::{endpoint, server_config, DevPki, Socket, TransportOptions};
use rand::{Rng, SeedableRng};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{sleep, sleep_until, timeout, Instant};

use super::{recovered_after, Outcome, Recovery};

const QUEUE: &str = "telemetry";
/// Messages per second per producer.
const RATE: f64 = 20.0;
/// One message per producer every this long.
const PERIOD: Duration = Duration::from_millis(50);
/// Body bytes per message.
const BODY: usize = 100;
/// Most unsettled messages per producer.
const WINDOW: usize = 64;
/// After the workload, producers retry what is not accepted for at most this long.
const FLUSH: Duration = Duration::from_secs(15);
/// Then consumers get at most this long to receive every accepted message.
const DRAIN: Duration = Duration::from_secs(20);
/// The broker is down this long when it restarts.
const RESTART_GAP: Duration = Duration::from_secs(2);
/// Consumers take nothing for this long before the restart, so that the broker holds a
/// backlog (ready and delivered-unsettled messages) when it stops.
const PAUSE: f64 = 3.0;
/// Connect + attach, one send, one accept: each at most this long.
const OP_TIMEOUT: Duration = Duration::from_secs(10);
/// A producer with messages in flight and no outcome for this long drops the connection.
const STALL: Duration = Duration::from_secs(10);
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Link of every client to the switch.
const CLIENT_BPS: u64 = 20_000_000;
const CLIENT_DELAY: Duration = Duration::from_millis(10);

fn ip(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

/// What every client saw, shared by their tasks.
#[derive(Default)]
struct Tally {
    offered: u64,
    /// Message-id → when its producer first saw `accepted` (s from the workload's start).
    accepted: HashMap<String, f64>,
    /// Every accepted outcome, s.
    accept_times: Vec<f64>,
    /// Message-id → how many times a consumer received it.
    deliveries: HashMap<String, u32>,
    /// Per client (producers first): when it succeeded (accepted outcome / message in), s.
    ok: Vec<Vec<f64>>,
    /// Messages offered and never accepted at the end.
    pending: u64,
    producer_connects: u64,
    consumer_connects: u64,
    connect_failures: u64,
    zero_rtt_rejected: u64,
    zero_rtt: u64,
    resent: u64,
    not_accepted: u64,
    stalls: u64,
    connections_lost: u64,
    redeliveries: u64,
}

type Shared = Arc<Mutex<Tally>>;

fn tally(t: &Shared) -> std::sync::MutexGuard<'_, Tally> {
    t.lock().unwrap_or_else(|e| e.into_inner())
}

/// Virtual seconds since the workload started.
#[derive(Clone, Copy)]
struct Clock(Instant);

impl Clock {
    fn s(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
    fn at(&self, s: f64) -> Instant {
        self.0 + Duration::from_secs_f64(s)
    }
}

/// The broker: started, stopped, started again on the same store and address.
struct BrokerSide {
    net: Network,
    host: HostId,
    addr: SocketAddr,
    cfg: BrokerConfig,
    pki: DevPki,
    seed: u64,
    starts: u64,
    running: Option<(Broker, quinn::Endpoint, JoinHandle<()>)>,
}

/// Open the broker (and its store) on a blocking thread. The old broker's store file stays
/// locked until its writer task has ended and its last commit (on a blocking thread, in real
/// time) is done; waiting for that here, where virtual time stands still, keeps the run
/// deterministic.
fn start_blocking(rt: &tokio::runtime::Handle, cfg: &BrokerConfig) -> Result<Broker, BrokerError> {
    let _in = rt.enter();
    let mut tries = 0;
    loop {
        match Broker::start(cfg.clone()) {
            Err(BrokerError::Store(StoreError::Open { .. })) if tries < 400 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            r => return r,
        }
    }
}

impl BrokerSide {
    async fn start(&mut self) -> Result<(), String> {
        let mut last = String::new();
        let mut broker = None;
        // If the store is still held after the blocking wait, something in virtual time holds
        // it (a task still serving the old broker): let time pass and try again.
        for _ in 0..50 {
            let (rt, cfg) = (tokio::runtime::Handle::current(), self.cfg.clone());
            match tokio::task::spawn_blocking(move || start_blocking(&rt, &cfg)).await {
                Ok(Ok(b)) => {
                    broker = Some(b);
                    break;
                }
                Ok(Err(e)) => last = e.to_string(),
                Err(e) => last = e.to_string(),
            }
            sleep(Duration::from_millis(100)).await;
        }
        let broker = broker.ok_or_else(|| format!("broker start: {last}"))?;
        // The old endpoint holds the address until its connections have drained.
        let mut sock = None;
        for _ in 0..100 {
            match self.net.bind(self.host, self.addr) {
                Ok(s) => {
                    sock = Some(s);
                    break;
                }
                Err(e) => last = e.to_string(),
            }
            sleep(Duration::from_millis(100)).await;
        }
        let sock = sock.ok_or_else(|| format!("broker bind: {last}"))?;
        let scfg = server_config(&self.pki.server, &[ALPN_AMQP], &TransportOptions::default())
            .map_err(|e| e.to_string())?;
        let ep = endpoint(
            Socket::from(sock),
            Some(scfg),
            Some(self.seed.wrapping_mul(7919).wrapping_add(self.starts)),
        )
        .map_err(|e| e.to_string())?;
        self.starts += 1;
        let serve = tokio::spawn(serve_quic(broker.clone(), ep.clone(), None));
        self.running = Some((broker, ep, serve));
        Ok(())
    }

    /// Stop as a killed process would, as far as clients can tell: every connection closed at
    /// once, nothing more answered. The store closes when the last task serving it ends.
    fn stop(&mut self) {
        if let Some((broker, ep, serve)) = self.running.take() {
            ep.close(0u32.into(), b"broker restart");
            serve.abort();
            drop(broker);
        }
    }

    fn broker(&self) -> Option<&Broker> {
        self.running.as_ref().map(|(b, _, _)| b)
    }
}

/// A client's link goes down at `start` for `len` s.
#[derive(Debug, Clone)]
struct Cut {
    /// Client index: producers first, then consumers.
    victim: usize,
    start: f64,
    len: f64,
}

/// `n` cuts at random: each within [2, workload − 3] s, not overlapping `[lo, hi]` (the
/// restart) nor another cut of the same client.
fn plan_cuts(
    rng: &mut rand_chacha::ChaCha8Rng,
    n: usize,
    clients: usize,
    workload: f64,
    (lo, hi): (f64, f64),
) -> Vec<Cut> {
    let mut cuts: Vec<Cut> = Vec::new();
    let mut tries = 0;
    while cuts.len() < n && tries < 10_000 {
        tries += 1;
        let victim = rng.random_range(0..clients);
        let len = if rng.random_bool(0.5) {
            rng.random_range(1.0..3.0)
        } else {
            rng.random_range(6.0..9.0)
        };
        let start: f64 = rng.random_range(2.0..workload - 3.0);
        let start = (start * 10.0).round() / 10.0;
        let len = (len * 10.0_f64).round() / 10.0;
        let end = start + len;
        let overlaps = |a: f64, b: f64| start < b && a < end;
        if end > workload - 3.0
            || overlaps(lo, hi)
            || cuts
                .iter()
                .any(|c| c.victim == victim && overlaps(c.start - 1.0, c.start + c.len + 1.0))
        {
            continue;
        }
        cuts.push(Cut { victim, start, len });
    }
    cuts.sort_by(|a, b| a.start.total_cmp(&b.start));
    cuts
}

fn message(k: usize, seq: u64) -> qgate_amqp::broker::AmqpMessage {
    let mut body = vec![0x5au8; BODY];
    body[..8].copy_from_slice(&seq.to_be_bytes());
    client::message_with_id(MessageId::String(format!("p{k}-{seq}")), body)
}

/// Count a failed connect (and attach); `None`: it timed out.
fn connect_failed(t: &Shared, e: Option<&client::ClientError>) {
    let mut g = tally(t);
    g.connect_failures += 1;
    // The connector does not fall back to 1-RTT when the broker refuses 0-RTT (a restarted
    // broker has new ticket keys): each ticket held costs one failed attempt.
    if e.is_some_and(|e| e.to_string().contains("ZeroRttRejected")) {
        g.zero_rtt_rejected += 1;
    }
}

/// Resolves when the client's QUIC connection has closed, for whatever reason.
fn connection_gone(info: &client::StreamInfo) -> impl std::future::Future<Output = ()> {
    let q = info.quic.clone();
    async move {
        match q {
            Some(q) => {
                q.closed().await;
            }
            None => std::future::pending().await,
        }
    }
}

enum End {
    /// Everything offered was accepted.
    Done,
    /// The connection failed: reconnect.
    Failed,
    /// Out of time.
    GaveUp,
}

/// Producer `k` (client index `k`): offers `total` messages, one every [`PERIOD`] from `clock`'s
/// start, until each is accepted or `give_up`.
async fn produce(k: usize, c: Connector, clock: Clock, total: u64, give_up: Instant, t: Shared) {
    let mut unsent: BTreeSet<u64> = BTreeSet::new();
    let mut generated = 0u64;
    let mut attempts = vec![0u32; total as usize];
    let mut backoff = BACKOFF_MIN;
    let mut connections = 0u64;
    let due = |n: u64| clock.0 + PERIOD * n as u32;
    let generate = |generated: &mut u64, unsent: &mut BTreeSet<u64>| {
        while *generated < total && due(*generated) <= Instant::now() {
            unsent.insert(*generated);
            *generated += 1;
        }
    };
    loop {
        generate(&mut generated, &mut unsent);
        if generated == total && unsent.is_empty() {
            break;
        }
        if Instant::now() >= give_up {
            break;
        }
        let name = format!("p{k}-{connections}");
        let opened = timeout(OP_TIMEOUT, async {
            let (mut cl, info) = c.open().await?;
            let s = cl.sender(&name, QUEUE, false).await?;
            Ok::<_, client::ClientError>((cl, s, info))
        })
        .await;
        let (cl, mut sender, info) = match opened {
            Ok(Ok(x)) => x,
            Ok(Err(e)) => {
                connect_failed(&t, Some(&e));
                sleep_until((Instant::now() + backoff).min(give_up)).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
            Err(_) => {
                connect_failed(&t, None);
                sleep_until((Instant::now() + backoff).min(give_up)).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        backoff = BACKOFF_MIN;
        connections += 1;
        {
            let mut g = tally(&t);
            g.producer_connects += 1;
            g.zero_rtt += info.zero_rtt as u64;
        }
        let mut in_flight: BTreeSet<u64> = BTreeSet::new();
        let mut outcomes = FuturesUnordered::new();
        let mut progress = Instant::now();
        // The outcomes of messages in flight do not resolve when the QUIC connection dies
        // (fe2o3's sender keeps their settlement channels): watch the connection itself.
        let dead = connection_gone(&info);
        tokio::pin!(dead);
        let end = loop {
            generate(&mut generated, &mut unsent);
            if generated == total && unsent.is_empty() && in_flight.is_empty() {
                break End::Done;
            }
            if Instant::now() >= give_up {
                break End::GaveUp;
            }
            let mut failed = false;
            while in_flight.len() < WINDOW {
                let Some(seq) = unsent.pop_first() else { break };
                match timeout(OP_TIMEOUT, sender.send_batchable(message(k, seq))).await {
                    Ok(Ok(fut)) => {
                        if in_flight.is_empty() {
                            progress = Instant::now();
                        }
                        attempts[seq as usize] += 1;
                        in_flight.insert(seq);
                        outcomes.push(async move { (seq, fut.await) });
                    }
                    _ => {
                        unsent.insert(seq);
                        failed = true;
                        break;
                    }
                }
            }
            if failed {
                break End::Failed;
            }
            let next = if generated < total {
                due(generated)
            } else {
                give_up
            };
            tokio::select! {
                biased;
                Some((seq, r)) = outcomes.next(), if !outcomes.is_empty() => {
                    in_flight.remove(&seq);
                    progress = Instant::now();
                    match r {
                        Ok(Settled::Accepted(_)) => {
                            let now = clock.s();
                            let mut g = tally(&t);
                            g.accepted.entry(format!("p{k}-{seq}")).or_insert(now);
                            g.accept_times.push(now);
                            g.ok[k].push(now);
                        }
                        Ok(_) => {
                            tally(&t).not_accepted += 1;
                            unsent.insert(seq);
                        }
                        Err(_) => {
                            unsent.insert(seq);
                            break End::Failed;
                        }
                    }
                }
                _ = sleep_until(next.min(give_up)) => {}
                _ = &mut dead => {
                    tally(&t).connections_lost += 1;
                    break End::Failed;
                }
                _ = sleep_until(progress + STALL), if !in_flight.is_empty() => {
                    tally(&t).stalls += 1;
                    break End::Failed;
                }
            }
        };
        drop(outcomes);
        unsent.extend(std::mem::take(&mut in_flight));
        match end {
            End::Done => {
                let _ = timeout(OP_TIMEOUT, sender.close()).await;
                let _ = timeout(OP_TIMEOUT, cl.close()).await;
                break;
            }
            End::Failed | End::GaveUp => {
                // Abandon the connection at once (a real producer would not wait on it).
                if let Some(q) = &info.quic {
                    q.close(0u32.into(), b"producer gave up on the connection");
                }
                drop(sender);
                drop(cl);
                if matches!(end, End::GaveUp) {
                    break;
                }
                sleep_until((Instant::now() + backoff).min(give_up)).await;
            }
        }
    }
    let mut g = tally(&t);
    g.offered += total;
    g.pending += unsent.len() as u64 + (total - generated);
    g.resent += attempts
        .iter()
        .map(|a| a.saturating_sub(1) as u64)
        .sum::<u64>();
}

/// Consumer (client index `k`): receives and accepts until `done`, except during `pause` (s):
/// then it takes nothing (what the broker already pushed waits in the link, unsettled).
async fn consume(
    k: usize,
    c: Connector,
    clock: Clock,
    pause: (f64, f64),
    mut done: watch::Receiver<bool>,
    t: Shared,
) {
    let mut backoff = BACKOFF_MIN;
    let mut connections = 0u64;
    loop {
        if *done.borrow() {
            return;
        }
        let name = format!("c{k}-{connections}");
        let opened = tokio::select! {
                biased;
            r = timeout(OP_TIMEOUT, async {
                let (mut cl, info) = c.open().await?;
                let r = cl.receiver(&name, QUEUE, false, 100).await?;
                Ok::<_, client::ClientError>((cl, r, info))
            }) => r,
            _ = done.wait_for(|d| *d) => return,
        };
        let (cl, mut receiver, info) = match opened {
            Ok(Ok(x)) => x,
            r => {
                connect_failed(&t, r.ok().and_then(|r| r.err()).as_ref());
                tokio::select! {
                biased;
                    _ = sleep(backoff) => {}
                    _ = done.wait_for(|d| *d) => return,
                }
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        backoff = BACKOFF_MIN;
        connections += 1;
        {
            let mut g = tally(&t);
            g.consumer_connects += 1;
            g.zero_rtt += info.zero_rtt as u64;
        }
        let dead = connection_gone(&info);
        tokio::pin!(dead);
        let finished = loop {
            let now = clock.s();
            if now >= pause.0 && now < pause.1 {
                tokio::select! {
                    biased;
                    _ = sleep_until(clock.at(pause.1)) => continue,
                    _ = done.wait_for(|d| *d) => break true,
                    _ = &mut dead => break false,
                }
            }
            let d = tokio::select! {
                biased;
                d = receiver.recv::<Body<Value>>() => d,
                _ = done.wait_for(|d| *d) => break true,
                _ = &mut dead => break false,
            };
            let Ok(d) = d else { break false };
            let m = d.message();
            let id = match m.properties.as_ref().and_then(|p| p.message_id.as_ref()) {
                Some(MessageId::String(s)) => s.clone(),
                other => format!("{other:?}"),
            };
            let redelivered = m.header.as_ref().is_some_and(|h| h.delivery_count > 0);
            {
                let now = clock.s();
                let mut g = tally(&t);
                *g.deliveries.entry(id).or_insert(0) += 1;
                g.redeliveries += redelivered as u64;
                g.ok[k].push(now);
            }
            if !matches!(timeout(OP_TIMEOUT, receiver.accept(&d)).await, Ok(Ok(()))) {
                break false;
            }
        };
        if finished {
            let _ = timeout(OP_TIMEOUT, receiver.close()).await;
            let _ = timeout(OP_TIMEOUT, cl.close()).await;
            return;
        }
        if let Some(q) = &info.quic {
            q.close(0u32.into(), b"consumer gave up on the connection");
        }
        drop(receiver);
        drop(cl);
        tokio::select! {
                biased;
            _ = sleep(backoff) => {}
            _ = done.wait_for(|d| *d) => return,
        }
    }
}

/// A fresh directory for this run's store.
fn store_dir(seed: u64) -> PathBuf {
    static RUN: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!(
        "qgate-faults-broker-{}-{seed}-{}",
        std::process::id(),
        RUN.fetch_add(1, Ordering::Relaxed)
    ))
}

/// The scenario (see the module's documentation).
pub async fn run(seed: u64, quick: bool) -> Outcome {
    let (producers, consumers, workload, n_cuts) = if quick {
        (2usize, 1usize, 30.0_f64, 4)
    } else {
        (4, 2, 60.0, 6)
    };
    let dir = store_dir(seed);
    let _ = std::fs::remove_dir_all(&dir);

    // The network: every host on its own link to a switch.
    let net = Network::new(seed);
    let switch = net.add_host("switch");
    net.set_forwarding(switch, true);
    let attach = |name: &str, n: u8, params: LinkParams| {
        let h = net.add_host(name);
        let i = net.add_interface(h, ip(10, 0, n, 1)).expect("address");
        let s = net.add_interface(switch, ip(10, 0, n, 2)).expect("address");
        (h, net.connect_symmetric(i, s, params).expect("link"))
    };
    let (bhost, _) = attach(
        "broker",
        0,
        LinkParams::new(1_000_000_000, Duration::from_micros(500)),
    );
    let baddr = SocketAddr::new(ip(10, 0, 0, 1), qgate_amqp::transport::AMQPS_PORT);
    let pki = DevPki::generate(&[]).expect("PKI");
    let trust = pki.trust();
    let mut side = BrokerSide {
        net: net.clone(),
        host: bhost,
        addr: baddr,
        cfg: BrokerConfig {
            store: Some(dir.join("broker.redb")),
            ..BrokerConfig::default()
        },
        pki,
        seed,
        starts: 0,
        running: None,
    };
    side.start().await.expect("the broker starts");

    // The clients: the CLI's transport settings (a dead broker noticed within 5 s).
    let copts =
        client::with_idle_timeout(&TransportOptions::default(), client::DEFAULT_IDLE_TIMEOUT);
    let clients = producers + consumers;
    let mut links: Vec<LinkId> = Vec::new();
    let mut connectors: Vec<Connector> = Vec::new();
    for i in 0..clients {
        let name = if i < producers {
            format!("producer{i}")
        } else {
            format!("consumer{}", i - producers)
        };
        let n = 1 + i as u8;
        let (h, link) = attach(&name, n, LinkParams::new(CLIENT_BPS, CLIENT_DELAY));
        let sock = net
            .bind(h, SocketAddr::new(ip(10, 0, n, 1), 0))
            .expect("port");
        let ep = endpoint(
            Socket::from(sock),
            None,
            Some(seed.wrapping_mul(31).wrapping_add(n as u64)),
        )
        .expect("endpoint");
        connectors.push(
            Connector::on_endpoint(ep, baddr, "localhost", &trust, None, &copts)
                .expect("connector"),
        );
        links.push(link);
    }

    // The faults.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x0b10_ce12);
    let restart_at = (workload * 0.4).round();
    let gap = RESTART_GAP.as_secs_f64();
    let cuts = plan_cuts(
        &mut rng,
        n_cuts,
        clients,
        workload,
        (restart_at - PAUSE - 1.0, restart_at + gap + 5.0),
    );

    let t: Shared = Arc::new(Mutex::new(Tally {
        ok: vec![Vec::new(); clients],
        ..Default::default()
    }));
    let clock = Clock(Instant::now());
    let total = (workload * RATE) as u64;
    let give_up = clock.at(workload) + FLUSH;
    let (done_tx, done_rx) = watch::channel(false);
    let mut producing = Vec::new();
    let mut consuming = Vec::new();
    for (i, c) in connectors.into_iter().enumerate() {
        let t = t.clone();
        if i < producers {
            producing.push(tokio::spawn(produce(i, c, clock, total, give_up, t)));
        } else {
            consuming.push(tokio::spawn(consume(
                i,
                c,
                clock,
                (restart_at - PAUSE, restart_at),
                done_rx.clone(),
                t,
            )));
        }
    }

    // Cuts and the restart, in time order.
    let fault_net = net.clone();
    let fault_cuts = cuts.clone();
    let faults = tokio::spawn(async move {
        let mut events: Vec<(f64, usize, bool)> = Vec::new();
        for c in &fault_cuts {
            events.push((c.start, c.victim, false));
            events.push((c.start + c.len, c.victim, true));
        }
        events.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut restart: Option<(f64, Option<f64>, String)> = None;
        let mut recovered = 0usize;
        let mut ev = events.into_iter().peekable();
        loop {
            let next_cut = ev.peek().map(|e| e.0);
            let restart_due = restart.is_none().then_some(restart_at);
            match (next_cut, restart_due) {
                (Some(a), r) if r.is_none_or(|r| a < r) => {
                    let (at, victim, up) = ev.next().expect("peeked");
                    sleep_until(clock.at(at)).await;
                    let _ = fault_net.update_both(links[victim], |l| l.up = up);
                }
                (_, Some(r)) => {
                    sleep_until(clock.at(r)).await;
                    let stopped = clock.s();
                    side.stop();
                    sleep(RESTART_GAP).await;
                    let (back, err) = match side.start().await {
                        Ok(()) => (Some(clock.s()), String::new()),
                        Err(e) => (None, e),
                    };
                    recovered = side.broker().map_or(0, |b| {
                        b.queue_stats().iter().map(|q| q.depth).sum::<usize>()
                    });
                    restart = Some((stopped, back, err));
                }
                _ => break,
            }
        }
        (side, restart.expect("the restart ran"), recovered)
    });

    for p in producing {
        let _ = p.await;
    }
    let producers_done = Instant::now();
    // Drain: until every accepted message has been received, or DRAIN has passed.
    loop {
        let all_in = {
            let g = tally(&t);
            g.accepted.keys().all(|id| g.deliveries.contains_key(id))
        };
        if all_in || Instant::now() >= producers_done + DRAIN {
            break;
        }
        sleep(Duration::from_millis(100)).await;
    }
    let _ = done_tx.send(true);
    for c in consuming {
        let _ = timeout(OP_TIMEOUT * 3, c).await;
    }
    let (mut side, (stopped, back, restart_error), recovered) =
        faults.await.expect("the fault task");
    let depth = side
        .broker()
        .map(|b| b.queue_stats().iter().map(|q| q.depth).sum::<usize>())
        .unwrap_or(0);
    side.stop();
    let _ = std::fs::remove_dir_all(&dir);

    let g = tally(&t);
    let accepted = g.accepted.len() as u64;
    let delivered = g
        .accepted
        .keys()
        .filter(|id| g.deliveries.contains_key(*id))
        .count() as u64;
    let duplicated: u64 = g
        .deliveries
        .values()
        .map(|n| (*n as u64).saturating_sub(1))
        .sum();
    let unacknowledged = g
        .deliveries
        .keys()
        .filter(|id| !g.accepted.contains_key(*id))
        .count();
    let mut recoveries: Vec<Recovery> = cuts
        .iter()
        .map(|c| {
            let end = c.start + c.len;
            let who = if c.victim < producers {
                format!("producer {}", c.victim)
            } else {
                format!("consumer {}", c.victim - producers)
            };
            Recovery {
                kind: "a client's link down, then its next success",
                fault: format!("{who} link down {:.1} s", c.len),
                start_s: c.start,
                end_s: end,
                recovery_s: g.ok[c.victim].iter().find(|x| **x >= end).map(|x| x - end),
            }
        })
        .collect();
    let mut times = g.accept_times.clone();
    times.sort_by(f64::total_cmp);
    let need = (0.8 * RATE * producers as f64).ceil() as usize;
    recoveries.push(Recovery {
        kind: "broker restart (2 s down, same store)",
        fault: if restart_error.is_empty() {
            "broker restart".into()
        } else {
            format!("broker restart (failed: {restart_error})")
        },
        start_s: stopped,
        end_s: back.unwrap_or(stopped),
        recovery_s: back.and_then(|b| recovered_after(&times, b, 1.0, need)),
    });
    recoveries.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    let counters = vec![
        ("offered".to_string(), g.offered as f64),
        (
            "producer reconnects".into(),
            g.producer_connects.saturating_sub(producers as u64) as f64,
        ),
        (
            "consumer reconnects".into(),
            g.consumer_connects.saturating_sub(consumers as u64) as f64,
        ),
        (
            "failed connection attempts".into(),
            g.connect_failures as f64,
        ),
        ("connections in 0-RTT".into(), g.zero_rtt as f64),
        (
            "attempts failed: 0-RTT rejected".into(),
            g.zero_rtt_rejected as f64,
        ),
        ("resent".into(), g.resent as f64),
        ("outcomes not accepted".into(), g.not_accepted as f64),
        (
            "producer connections found closed".into(),
            g.connections_lost as f64,
        ),
        ("producer stalls".into(), g.stalls as f64),
        ("redeliveries".into(), g.redeliveries as f64),
        (
            "delivered, never acknowledged".into(),
            unacknowledged as f64,
        ),
        (
            "messages the restarted broker recovered".into(),
            recovered as f64,
        ),
        ("queue depth at end".into(), depth as f64),
    ];
    Outcome {
        scenario: "broker",
        seed,
        accepted,
        delivered,
        lost: accepted - delivered,
        duplicated,
        pending: g.pending,
        recoveries,
        counters,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_run_loses_nothing_and_recovers_from_the_restart() {
        let o = crate::virtual_time(run(1, true));
        assert!(o.accepted > 0, "{o:?}");
        assert_eq!(o.lost, 0, "{o:?}");
        assert_eq!(o.delivered, o.accepted, "{o:?}");
        let restart = o
            .recoveries
            .iter()
            .find(|r| r.fault.starts_with("broker restart"))
            .expect("a restart");
        assert!(restart.recovery_s.is_some(), "{o:?}");
    }
}
