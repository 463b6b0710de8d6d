//! `qgate-lab demo`: the whole pipeline on the simulated network — ten devices, the gateway with
//! three backhaul paths, the ingest server, our AMQP broker and a consumer — in real time by
//! default, with a live view of the path table, each class's response delay and the pipeline's
//! counts. The server answers a device only once the broker accepted its body (the queue sink),
//! so at the end every answered request has reached the consumer exactly once by request id.
//! Halfway through, path 1 slows from 10 to 80 ms one way, so the scheduler can be seen moving
//! the priority devices.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use qgate_netsim::topology::LinkChange;
use qgate_netsim::{LossModel, World};

use crate::plan::spec::{Classes, GatewayLoad};
use crate::plan::workload::{gateway, Setup};
use crate::stats::Summary;

/// What the demo runs.
#[derive(Debug, Clone)]
pub struct GatewayDemo {
    /// Devices (half priority).
    pub devices: usize,
    /// How long devices send.
    pub duration: Duration,
    /// Time between a device's requests.
    pub interval: Duration,
    /// Bytes per request.
    pub body_bytes: usize,
    /// A scheduler by name (`qgate_forward::scheduler::SCHEDULERS`).
    pub scheduler: &'static str,
    /// Random loss on every path.
    pub loss: f64,
    /// Seed.
    pub seed: u64,
}

impl Default for GatewayDemo {
    fn default() -> Self {
        GatewayDemo {
            devices: 10,
            duration: Duration::from_secs(10),
            interval: Duration::from_millis(100),
            body_bytes: 1024,
            scheduler: qgate_forward::scheduler::DEFAULT_SCHEDULER,
            loss: 0.0,
            seed: 1,
        }
    }
}

/// The pipeline's counts at the end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PipelineCounts {
    /// Requests the devices sent.
    pub sent: u64,
    /// Requests answered 201.
    pub answered: u64,
    /// Bodies the server stored (a retried copy answered from its table is not stored again).
    pub stored: u64,
    /// Messages the broker accepted from the server.
    pub queued: u64,
    /// Messages the consumer received.
    pub consumed: u64,
    /// Distinct request ids among them.
    pub distinct: u64,
    /// Answered bodies the consumer never received (must be 0).
    pub missing: u64,
    /// Bodies received whose device saw a failure (its answer was lost after the body was
    /// stored: at least once).
    pub extra: u64,
}

impl PipelineCounts {
    /// Every answered body reached the consumer (at least once: a body whose answer was lost,
    /// or that reached the broker after its request timed out, may arrive too, and a message
    /// the broker redelivered may arrive twice — those are counted, not failures).
    pub fn adds_up(&self) -> bool {
        self.missing == 0
    }
}

/// What the demo measured.
#[derive(Debug, Clone)]
pub struct DemoOutcome {
    /// Priority devices' response delays, ms.
    pub priority_ms: Vec<f64>,
    /// Best-effort devices' response delays, ms.
    pub best_effort_ms: Vec<f64>,
    /// Requests not answered.
    pub failed: usize,
    /// Requests per path.
    pub per_path: Vec<u64>,
    /// Devices → gateway → server → broker → consumer.
    pub pipeline: PipelineCounts,
}

fn describe(label: &str, v: &[f64]) -> String {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        return format!("{label:<12} no answers");
    }
    let q = |f: f64| s[((s.len() as f64 * f) as usize).min(s.len() - 1)];
    format!(
        "{label:<12} {:>6} answers, mean {:7.2} ms, p50 {:7.2} ms, p99 {:7.2} ms",
        s.len(),
        Summary::of(&s).mean,
        q(0.5),
        q(0.99)
    )
}

impl DemoOutcome {
    /// The final summary.
    pub fn summary(&self) -> String {
        let p = &self.pipeline;
        format!(
            "{}\n{}\nfailed       {}\nper path     {}\npipeline     {} sent → {} answered → {} stored by the server → {} accepted by the broker → {} received by the consumer ({} distinct request ids; {} answered but not received, {} received though the device saw a failure): {}",
            describe("priority", &self.priority_ms),
            describe("best effort", &self.best_effort_ms),
            self.failed,
            self.per_path
                .iter()
                .enumerate()
                .map(|(i, n)| format!("path {}: {n}", i + 1))
                .collect::<Vec<_>>()
                .join(", "),
            p.sent,
            p.answered,
            p.stored,
            p.queued,
            p.consumed,
            p.distinct,
            p.missing,
            p.extra,
            if p.adds_up() {
                "adds up"
            } else {
                "DOES NOT ADD UP"
            }
        )
    }
}

/// Run the demo; `view` gets a rendered live view once a second.
pub async fn run(cfg: GatewayDemo, view: impl Fn(String)) -> DemoOutcome {
    // Paper 000's paths at 10/20/30 ms (paths d, 2d, 3d), built like any plan's.
    let topology = crate::papers::paper000::three_paths(LossModel::Bernoulli { p: cfg.loss });
    let load = GatewayLoad {
        name: "demo".into(),
        start_s: 0.0,
        gateway: "gateway".into(),
        server: "server".into(),
        paths: vec!["p1".into(), "p2".into(), "p3".into()],
        scheduler: Some(cfg.scheduler.into()),
        request_timeout_ms: Some(2000.0),
        devices: cfg.devices,
        access: LinkChange {
            rate_mbps: Some(1000.0),
            delay_ms: Some(1.0),
            ..Default::default()
        },
        priority_fraction: 0.5,
        classes: Classes::Device,
        file_bytes: None,
        interval_ms: Some(cfg.interval.as_secs_f64() * 1000.0),
        body_bytes: cfg.body_bytes,
        pipelining: 1,
        start_jitter_ms: 0.0,
        history: crate::plan::spec::backhaul_history(),
        congestion: None,
        connections_per_path: None,
        spool: false,
    };
    let mut world = World::build(&topology, cfg.seed).expect("a valid topology");
    let link0 = world.link("p1").expect("built").id;
    let setup = Setup {
        seed: cfg.seed,
        index: 0,
        pki: std::sync::Arc::new(qgate_transport::DevPki::generate(&[]).expect("PKI")),
    };
    let cloud = Cloud::start(&mut world, &setup).expect("the broker starts");
    let w = gateway::prepare(&load, &mut world, &setup, cloud.sink())
        .await
        .expect("the demo world starts");
    let consumer = cloud.consume();
    let body = Bytes::from(vec![b'd'; cfg.body_bytes]);
    // Priority delays, best-effort delays, failures, (time, class, delay), answered bodies' keys.
    let log = Arc::new(Mutex::new((
        Vec::new(),
        Vec::new(),
        0usize,
        Vec::<(f64, bool, f64)>::new(),
        std::collections::HashSet::<Bytes>::new(),
    )));
    let start = Instant::now();
    // One session per device (`classes = "device"`).
    let sends = w.devices.iter().enumerate().map(|(i, sessions)| {
        let (d, prio) = &sessions[0];
        let (body, log) = (body.clone(), log.clone());
        let n = (cfg.duration.as_secs_f64() / cfg.interval.as_secs_f64()) as u64;
        async move {
            let offset = cfg.interval.mul_f64(i as f64 / cfg.devices.max(1) as f64);
            for k in 0..n {
                tokio::time::sleep_until(start + offset + cfg.interval * k as u32).await;
                let t = start.elapsed().as_secs_f64();
                let body = keyed(&body, i, k);
                match d.send("/ingest/demo", body.clone()).await {
                    Ok(s) => {
                        let v = s.delay.as_secs_f64() * 1000.0;
                        let mut l = log.lock().expect("lock");
                        if *prio {
                            l.0.push(v)
                        } else {
                            l.1.push(v)
                        }
                        l.4.insert(body.slice(..KEY));
                        l.3.push((t, *prio, v));
                    }
                    _ => log.lock().expect("lock").2 += 1,
                }
            }
        }
    });
    let (net, gw) = (world.net.clone(), w.running.gateway.clone());
    let (server_stats, received) = (w.server.stats.clone(), consumer.received.clone());
    let broker_accepted = || cloud.accepted();
    let live = async {
        let mut slowed = false;
        for sec in 1..=cfg.duration.as_secs() {
            tokio::time::sleep_until(start + Duration::from_secs(sec)).await;
            if !slowed && sec * 2 >= cfg.duration.as_secs() {
                net.update_both(link0, |l| l.delay = Duration::from_millis(80))
                    .expect("valid");
                slowed = true;
            }
            let table = gw.paths().table();
            let mut v = format!(
                "t = {sec:>3} s   scheduler {}{}\n  path   RTT ms   hits   up\n",
                cfg.scheduler,
                if slowed {
                    "   (path 1 slowed to 80 ms one way)"
                } else {
                    ""
                }
            );
            for p in table.paths() {
                v.push_str(&format!(
                    "  {:>4}  {:>7}  {:>5}  {}\n",
                    p.id.0 + 1,
                    p.rtt
                        .map_or("-".into(), |r| format!("{:.1}", r.as_secs_f64() * 1000.0)),
                    p.hits,
                    if p.up { "yes" } else { "NO" }
                ));
            }
            let l = log.lock().expect("lock");
            let last = |prio: bool| {
                Summary::of(
                    &l.3.iter()
                        .filter(|x| x.1 == prio && x.0 > (sec - 1) as f64)
                        .map(|x| x.2)
                        .collect::<Vec<_>>(),
                )
                .mean
            };
            v.push_str(&format!(
                "  last second: priority {:.1} ms, best effort {:.1} ms; failed so far {}\n  pipeline: server stored {}, broker accepted {}, consumer received {}",
                last(true),
                last(false),
                l.2,
                server_stats.ingested.load(std::sync::atomic::Ordering::Relaxed),
                broker_accepted(),
                received.lock().expect("lock").len(),
            ));
            drop(l);
            view(v);
        }
    };
    futures_util::future::join(futures_util::future::join_all(sends), live).await;
    // Every answered body is on the queue already; let the consumer catch up.
    let consumed = consumer.finish().await;
    let l = log.lock().expect("lock");
    let answered = (l.0.len() + l.1.len()) as u64;
    let sent = answered + l.2 as u64;
    let ids: std::collections::HashSet<&String> = consumed.iter().map(|(id, _)| id).collect();
    let keys: std::collections::HashSet<&Bytes> = consumed.iter().map(|(_, k)| k).collect();
    let pipeline = PipelineCounts {
        sent,
        answered,
        stored: w
            .server
            .stats
            .ingested
            .load(std::sync::atomic::Ordering::Relaxed),
        queued: cloud.accepted(),
        consumed: consumed.len() as u64,
        distinct: ids.len() as u64,
        missing: l.4.iter().filter(|k| !keys.contains(k)).count() as u64,
        extra: keys.iter().filter(|k| !l.4.contains(**k)).count() as u64,
    };
    DemoOutcome {
        pipeline,
        priority_ms: l.0.clone(),
        best_effort_ms: l.1.clone(),
        failed: l.2,
        per_path: w
            .running
            .gateway
            .per_path
            .iter()
            .map(|a| a.load(std::sync::atomic::Ordering::Relaxed))
            .collect(),
    }
}

/// Length of the key at the start of every demo body: device and sequence number.
const KEY: usize = 14;

/// `body` with device `i`'s request `k` written at its start (`d0001-00000042`), so the
/// consumer can tell which answered request each message is.
fn keyed(body: &Bytes, i: usize, k: u64) -> Bytes {
    let mut b = body.to_vec();
    b.resize(b.len().max(KEY), b'd');
    b[..KEY].copy_from_slice(format!("d{:04}-{:08}", i % 10_000, k % 100_000_000).as_bytes());
    Bytes::from(b)
}

/// The cloud side behind the server: our broker on its own host, one hop from the server, and
/// a consumer beside it.
struct Cloud {
    net: qgate_netsim::Network,
    server: qgate_netsim::HostId,
    server_ip: std::net::IpAddr,
    broker_addr: std::net::SocketAddr,
    pki: Arc<qgate_transport::DevPki>,
    seed: u64,
    running: qgate_amqp::builder::RunningBroker,
}

/// The queue the server ingests into.
const QUEUE: &str = "ingest";

impl Cloud {
    fn start(world: &mut World, s: &Setup) -> Result<Cloud, String> {
        use qgate_netsim::topology::LinkSpec;
        world.add_host("broker", false).map_err(|e| e.to_string())?;
        let l = world
            .add_link(&LinkSpec::new(
                "cloud",
                "server",
                "broker",
                LinkChange {
                    rate_mbps: Some(1000.0),
                    delay_ms: Some(0.5),
                    ..Default::default()
                },
            ))
            .map_err(|e| e.to_string())?;
        let net = world.net.clone();
        let opts = qgate_amqp::transport::broker_options(&Default::default());
        let scfg = qgate_transport::server_config(
            &s.pki.server,
            &[qgate_amqp::transport::ALPN_AMQP],
            &opts,
        )
        .map_err(|e| e.to_string())?;
        let broker_addr = std::net::SocketAddr::new(l.b.1, 5671);
        let sock = net.bind(l.b.0, broker_addr).map_err(|e| e.to_string())?;
        let ep = qgate_transport::endpoint(
            qgate_transport::Socket::from(sock),
            Some(scfg),
            Some(s.seed),
        )
        .map_err(|e| e.to_string())?;
        let running = qgate_amqp::broker::Broker::builder()
            .quic(ep)
            .start()
            .map_err(|e| e.to_string())?;
        Ok(Cloud {
            net,
            server: l.a.0,
            server_ip: l.a.1,
            broker_addr,
            pki: s.pki.clone(),
            seed: s.seed,
            running,
        })
    }

    /// A connector from the server's host to the broker, on a seeded endpoint.
    fn connector(&self, side: u64) -> qgate_amqp::client::Connector {
        let sock = self
            .net
            .bind(self.server, std::net::SocketAddr::new(self.server_ip, 0))
            .expect("a free port");
        let ep = qgate_transport::endpoint(
            qgate_transport::Socket::from(sock),
            None,
            Some(self.seed * 7 + side),
        )
        .expect("an endpoint");
        let opts =
            qgate_amqp::client::with_idle_timeout(&Default::default(), Duration::from_secs(5));
        qgate_amqp::client::Connector::on_endpoint(
            ep,
            self.broker_addr,
            "localhost",
            &self.pki.trust(),
            None,
            &opts,
        )
        .expect("a connector")
    }

    /// The server's sink: the broker's ingest queue.
    fn sink(&self) -> std::sync::Arc<dyn qgate_server::Sink> {
        std::sync::Arc::new(qgate_server::QueueSink::start(
            qgate_server::Upstream::Connector(self.connector(1)),
            QUEUE,
            &format!("amqp+quic://{}/{QUEUE}", self.broker_addr),
            qgate_server::QueueSinkConfig::default(),
            1,
        ))
    }

    /// Messages the broker has accepted into the queue.
    fn accepted(&self) -> u64 {
        self.running
            .broker()
            .queue_stats()
            .iter()
            .filter(|q| q.name == QUEUE)
            .map(|q| q.stats.enqueued)
            .sum()
    }

    /// Start the consumer: it receives and accepts every message, noting its message-id and
    /// body key.
    fn consume(&self) -> Consumer {
        let received = Arc::new(Mutex::new(Vec::new()));
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        let connector = self.connector(2);
        let r = received.clone();
        let task = tokio::spawn(async move {
            use fe2o3_amqp::types::messaging::{Body, MessageId};
            use fe2o3_amqp::types::primitives::Value;
            let (mut client, _) = connector.open().await.map_err(|e| e.to_string())?;
            let mut rx = client
                .receiver("demo-consumer", QUEUE, false, 200)
                .await
                .map_err(|e| e.to_string())?;
            // Waits end only while nothing arrives, so no delivery is cut off half-way; once
            // told to stop, it drains until the queue has been quiet for a second.
            let tick = Duration::from_millis(250);
            let mut quiet = Duration::ZERO;
            loop {
                let d = match tokio::time::timeout(tick, rx.recv::<Body<Value>>()).await {
                    Ok(Ok(d)) => d,
                    Ok(Err(e)) => return Err(e.to_string()),
                    Err(_) => {
                        if *stop.borrow() {
                            quiet += tick;
                            if quiet >= Duration::from_secs(1) {
                                break;
                            }
                        }
                        continue;
                    }
                };
                quiet = Duration::ZERO;
                let id = match d
                    .message()
                    .properties
                    .as_ref()
                    .and_then(|p| p.message_id.clone())
                {
                    Some(MessageId::String(s)) => s,
                    other => format!("{other:?}"),
                };
                let key = match d.body() {
                    Body::Data(b) => b
                        .iter()
                        .next()
                        .map(|x| Bytes::copy_from_slice(&x.0[..x.0.len().min(KEY)]))
                        .unwrap_or_default(),
                    _ => Bytes::new(),
                };
                rx.accept(&d).await.map_err(|e| e.to_string())?;
                r.lock().expect("lock").push((id, key));
            }
            let _ = rx.close().await;
            client.close().await;
            Ok(())
        });
        Consumer {
            received,
            stop: stop_tx,
            task,
        }
    }
}

/// The demo's consumer.
struct Consumer {
    /// (message-id, body key) of every message received.
    received: Arc<Mutex<Vec<(String, Bytes)>>>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), String>>,
}

impl Consumer {
    /// Stop once the queue is drained; what it received.
    async fn finish(self) -> Vec<(String, Bytes)> {
        let _ = self.stop.send(true);
        match self.task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "the demo consumer failed"),
            Err(e) => tracing::warn!(error = %e, "the demo consumer panicked"),
        }
        std::mem::take(&mut *self.received.lock().expect("lock"))
    }
}
