//! `qgate-lab bench pipeline`: the whole pipeline on loopback — devices → gateway (two paths) →
//! server → our broker → one consumer — against the same stack whose server only counts, in the
//! same run. Every device sends one record after another (closed loop); the consumer checks that
//! it receives every answered record exactly once by request id and measures each record's
//! device-to-consumer latency (the send time rides in the body).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fe2o3_amqp::link::delivery::DeliveryInfo;
use fe2o3_amqp::types::messaging::{Body, MessageId};
use fe2o3_amqp::types::primitives::Value;
use qgate_amqp::broker::{Broker, BrokerConfig};
use qgate_amqp::client::Connector;
use qgate_amqp::transport::{self, Scheme, ALPN_AMQP};
use qgate_gateway::device::Device;
use qgate_server::{CountSink, DedupStore, QueueSink, QueueSinkConfig, Sink, Upstream};
use qgate_transport::{endpoint, server_config, DevPki, Socket, TransportOptions};

use crate::stats::Summary;

/// What the benchmark runs.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// Devices, each sending one record after another.
    pub devices: usize,
    /// Bytes per record (at least 16: the send time and the record's key).
    pub body: usize,
    /// Seconds of sending per measurement.
    pub secs: f64,
    /// Alternating (queue, count-only) pairs.
    pub repeats: usize,
    /// Keep queued messages in the broker's durable store (fsynced before accepting).
    pub durable: bool,
    /// How the server and the consumer reach the broker: QUIC or plain TCP.
    pub scheme: Scheme,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            devices: 100,
            body: 1024,
            secs: 5.0,
            repeats: 3,
            durable: true,
            scheme: Scheme::Quic,
        }
    }
}

/// One measurement.
#[derive(Debug, Clone, Default)]
pub struct PipelineRun {
    /// Records answered 201 per second.
    pub rps: f64,
    /// Records answered.
    pub answered: u64,
    /// Messages the consumer received (0 for the count-only stack).
    pub consumed: u64,
    /// Distinct request ids among them.
    pub distinct: u64,
    /// Answered records the consumer did not receive within 10 s of the end.
    pub missing: u64,
    /// Device-to-answer latency p50 / p99, ms.
    pub answer_p50_ms: f64,
    /// See `answer_p50_ms`.
    pub answer_p99_ms: f64,
    /// Device-to-consumer latency p50 / p99, ms (NaN for the count-only stack).
    pub consumer_p50_ms: f64,
    /// See `consumer_p50_ms`.
    pub consumer_p99_ms: f64,
}

/// The benchmark's results.
#[derive(Debug, Clone, Default)]
pub struct PipelineBench {
    /// Into the broker, per repeat.
    pub queue: Vec<PipelineRun>,
    /// The same stack with a count-only server, per repeat.
    pub count_only: Vec<PipelineRun>,
}

impl PipelineBench {
    /// Records/s into the broker (mean ± std over repeats).
    pub fn queue_rps(&self) -> Summary {
        Summary::of(&self.queue.iter().map(|r| r.rps).collect::<Vec<_>>())
    }
    /// Records/s with the count-only server.
    pub fn count_rps(&self) -> Summary {
        Summary::of(&self.count_only.iter().map(|r| r.rps).collect::<Vec<_>>())
    }
    /// Per pair: records/s into the broker ÷ records/s count-only.
    pub fn ratio(&self) -> Summary {
        Summary::of(
            &self
                .queue
                .iter()
                .zip(&self.count_only)
                .map(|(q, c)| q.rps / c.rps.max(1e-9))
                .collect::<Vec<_>>(),
        )
    }
    /// Every answered record reached the consumer, each request id once, in every repeat.
    pub fn exactly_once(&self) -> bool {
        self.queue
            .iter()
            .all(|r| r.missing == 0 && r.consumed == r.distinct)
    }
}

fn sa(s: &str) -> SocketAddr {
    s.parse().expect("valid address")
}

fn quantile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(((v.len() as f64 * q) as usize).min(v.len().saturating_sub(1)))
        .copied()
        .unwrap_or(f64::NAN)
}

/// Run the benchmark on a 2-worker runtime; `progress` hears after each pair.
pub fn run(cfg: PipelineConfig, progress: impl Fn(usize)) -> PipelineBench {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut out = PipelineBench::default();
        for r in 0..cfg.repeats {
            out.queue.push(one(&cfg, true).await);
            out.count_only.push(one(&cfg, false).await);
            progress(r + 1);
        }
        out
    })
}

/// One measurement on a fresh stack: into the broker when `queue`, else count-only.
async fn one(cfg: &PipelineConfig, queue: bool) -> PipelineRun {
    let dir = std::env::temp_dir().join(format!(
        "qgate-bench-pipeline-{}-{}",
        std::process::id(),
        unique()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let pki = DevPki::generate(&[]).expect("PKI");
    let opts = TransportOptions::default();

    // The broker and the consumer (queue runs only).
    let base = Instant::now();
    // (message-id, record key, device-to-consumer latency ms) of every message received.
    let received = Arc::new(Mutex::new(Vec::<(String, u64, f64)>::new()));
    let mut broker = None;
    let mut consumer = None;
    let stop = Arc::new(AtomicBool::new(false));
    let (sink, dedup): (Arc<dyn Sink>, _) = if queue {
        let scfg = server_config(&pki.server, &[ALPN_AMQP], &transport::broker_options(&opts))
            .expect("config");
        let ep = endpoint(
            Socket::bind_udp(sa("127.0.0.1:0")).expect("bind"),
            Some(scfg),
            None,
        )
        .expect("endpoint");
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let running = Broker::builder()
            .config(BrokerConfig {
                store: cfg.durable.then(|| dir.join("broker.redb")),
                ..Default::default()
            })
            .quic(ep)
            .tcp(tcp, None)
            .start()
            .expect("broker");
        let addr = match cfg.scheme {
            Scheme::Tcp => running.tcp_addrs()[0],
            _ => running.quic_addrs()[0],
        };
        broker = Some(running);
        let scheme = cfg.scheme;
        let connector = || {
            Connector::new(scheme, addr, "localhost", &pki.trust(), None, None, &opts)
                .expect("connector")
        };
        let c = connector();
        let (received, stop) = (received.clone(), stop.clone());
        consumer = Some(tokio::spawn(async move {
            let (mut client, _) = c.open().await.expect("consumer connects");
            let mut rx = client
                .receiver("bench-consumer", "ingest", false, 500)
                .await
                .expect("consumer attaches");
            let mut quiet = Duration::ZERO;
            let tick = Duration::from_millis(250);
            // Accepted together, as a consumer that keeps up would: one disposition for all
            // that arrived within a millisecond (or 64 of them).
            let mut unacked = Vec::new();
            loop {
                let wait = if unacked.is_empty() {
                    tick
                } else {
                    Duration::from_millis(1)
                };
                match tokio::time::timeout(wait, rx.recv::<Body<Value>>()).await {
                    Ok(Ok(d)) => {
                        quiet = Duration::ZERO;
                        let now = base.elapsed().as_secs_f64();
                        let id = match d
                            .message()
                            .properties
                            .as_ref()
                            .and_then(|p| p.message_id.clone())
                        {
                            Some(MessageId::String(s)) => s,
                            other => format!("{other:?}"),
                        };
                        let word = |at: usize| match d.body() {
                            Body::Data(b) => b
                                .iter()
                                .next()
                                .and_then(|x| x.0.get(at..at + 8))
                                .map(|t| u64::from_be_bytes(t.try_into().expect("8 bytes"))),
                            _ => None,
                        };
                        let lat = word(0).map_or(f64::NAN, |ns| (now - ns as f64 / 1e9) * 1000.0);
                        let key = word(8).unwrap_or(u64::MAX);
                        unacked.push(DeliveryInfo::from(&d));
                        if unacked.len() >= 64 {
                            let _ = rx.accept_all(std::mem::take(&mut unacked)).await;
                        }
                        received.lock().expect("lock").push((id, key, lat));
                    }
                    Ok(Err(_)) => {
                        unacked.clear(); // the link is gone: nothing left to settle
                        break;
                    }
                    Err(_) if !unacked.is_empty() => {
                        let _ = rx.accept_all(std::mem::take(&mut unacked)).await;
                    }
                    Err(_) => {
                        if stop.load(Ordering::Relaxed) {
                            quiet += tick;
                            if quiet >= Duration::from_secs(1) {
                                break;
                            }
                        }
                    }
                }
            }
            if !unacked.is_empty() {
                let _ = rx.accept_all(unacked).await;
            }
            let _ = rx.close().await;
            client.close().await;
        }));
        let (dedup, _) = DedupStore::open(&dir.join("dedup.redb"), 1 << 20).expect("dedup store");
        (
            Arc::new(QueueSink::start(
                Upstream::Connector(connector()),
                "ingest",
                "bench",
                QueueSinkConfig::default(),
                1,
            )),
            Some(dedup),
        )
    } else {
        (Arc::new(CountSink::new()), None)
    };

    let mut server = qgate_server::Server::builder()
        .socket(Socket::bind_udp(sa("127.0.0.1:0")).expect("bind"))
        .identity(&pki.server)
        .transport(opts.clone())
        .sink(sink);
    if let Some(d) = dedup {
        server = server.dedup_store(d);
    }
    let server = server.start().expect("server");
    let gateway = super::loopback_gateway(&opts, &pki, server.addr(), None, true).await;
    let devices: Vec<Arc<Device>> =
        crate::bench::gateway::idle_devices(gateway.addr(), &pki.trust(), cfg.devices)
            .await
            .into_iter()
            .map(Arc::new)
            .collect();

    // Closed loop for `secs`.
    // Each body: the send time (ns since `base`) and a key (device << 32 | sequence number).
    let go = Arc::new(AtomicBool::new(true));
    let answered_keys = Arc::new(Mutex::new(HashSet::new()));
    let lat = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let tasks: Vec<_> = devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let (d, go, keys, lat) = (d.clone(), go.clone(), answered_keys.clone(), lat.clone());
            let body = cfg.body.max(16);
            tokio::spawn(async move {
                let (mut mine, mut acked) = (Vec::new(), Vec::new());
                let mut k = 0u64;
                while go.load(Ordering::Relaxed) {
                    let key = (i as u64) << 32 | k;
                    k += 1;
                    let mut b = vec![b'r'; body];
                    let t = Instant::now();
                    b[..8].copy_from_slice(&(base.elapsed().as_nanos() as u64).to_be_bytes());
                    b[8..16].copy_from_slice(&key.to_be_bytes());
                    if d.send("/ingest/bench", Bytes::from(b)).await.is_ok() {
                        mine.push(t.elapsed().as_secs_f64() * 1000.0);
                        acked.push(key);
                    }
                }
                keys.lock().expect("lock").extend(acked);
                lat.lock().expect("lock").extend(mine);
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(cfg.secs)).await;
    go.store(false, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let answered_keys = std::mem::take(&mut *answered_keys.lock().expect("lock"));
    let answered = answered_keys.len() as u64;
    let mut lat = std::mem::take(&mut *lat.lock().expect("lock"));

    // Let the consumer drain (at most 10 s), then check.
    let mut run = PipelineRun {
        rps: answered as f64 / elapsed,
        answered,
        answer_p50_ms: quantile(&mut lat, 0.5),
        answer_p99_ms: quantile(&mut lat, 0.99),
        consumer_p50_ms: f64::NAN,
        consumer_p99_ms: f64::NAN,
        ..Default::default()
    };
    if let Some(c) = consumer {
        let deadline = Instant::now() + Duration::from_secs(10);
        while (received.lock().expect("lock").len() as u64) < answered && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.store(true, Ordering::Relaxed);
        let _ = c.await;
        let got = std::mem::take(&mut *received.lock().expect("lock"));
        let ids: HashSet<&String> = got.iter().map(|(id, _, _)| id).collect();
        let keys: HashSet<u64> = got.iter().map(|(_, k, _)| *k).collect();
        let mut l: Vec<f64> = got.iter().map(|(_, _, l)| *l).collect();
        run.consumed = got.len() as u64;
        run.distinct = ids.len() as u64;
        run.missing = answered_keys.iter().filter(|k| !keys.contains(k)).count() as u64;
        run.consumer_p50_ms = quantile(&mut l, 0.5);
        run.consumer_p99_ms = quantile(&mut l, 0.99);
    }
    drop(devices);
    drop(gateway);
    server.shutdown(Duration::from_millis(200)).await;
    drop(broker);
    let _ = std::fs::remove_dir_all(&dir);
    run
}

/// A number unique in this process (temporary directory names).
fn unique() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}
