//! `qgate lab aqm`: paper 004's experiment. N QUIC bulk flows → access links → gateway →
//! bottleneck (the discipline under test) → sink, on the simulated network in virtual time.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use qgate_aqm::DisciplineSpec;
use qgate_netsim::{Direction, LinkParams, LossModel, Network};
use qgate_transport::{
    client_config, connect, endpoint, server_config, DevPki, Socket, TransportOptions,
};
use tokio::time::Instant;

use crate::stats::Summary;

const ALPN: &[u8] = b"qgate-aqm";

/// The experiment's settings.
#[derive(Debug, Clone)]
pub struct AqmConfig {
    /// A short key for the operating point (CSV column `point`).
    pub key: String,
    /// A name for the operating point (used in titles).
    pub label: String,
    /// Bulk flows, one per source.
    pub flows: usize,
    /// Access link rate, bit/s.
    pub access_rate_bps: u64,
    /// Access link one-way delay.
    pub access_delay: Duration,
    /// Bottleneck rate, bit/s.
    pub bottleneck_rate_bps: u64,
    /// Bottleneck one-way delay.
    pub bottleneck_delay: Duration,
    /// Random loss on the bottleneck's data direction.
    pub loss: f64,
    /// Packet limit of every queue.
    pub limit: usize,
    /// IP packet size (QUIC datagrams are this minus 28 bytes of IP + UDP).
    pub packet_bytes: usize,
    /// Simulated time per run.
    pub duration: Duration,
    /// Statistics skip this initial period (slow start).
    pub warmup: Duration,
    /// One run per seed and discipline.
    pub seeds: Vec<u64>,
    /// The disciplines on the bottleneck.
    pub disciplines: Vec<DisciplineSpec>,
}

impl AqmConfig {
    /// Paper 004's setup (Table II; EXPERIMENTS.md "aqm"): 10 flows, 50 Mbit/s / 1 ms access,
    /// 10 Mbit/s / 50 ms / 1 % bottleneck, 1000 packets of 1440 B, 100 s, 5 seeds.
    pub fn paper() -> AqmConfig {
        AqmConfig {
            key: "paper".into(),
            label: "paper 004 (10 Mbit/s, 50 ms, 10 flows)".into(),
            flows: 10,
            access_rate_bps: 50_000_000,
            access_delay: Duration::from_millis(1),
            bottleneck_rate_bps: 10_000_000,
            bottleneck_delay: Duration::from_millis(50),
            loss: 0.01,
            limit: 1000,
            packet_bytes: 1440,
            duration: Duration::from_secs(100),
            warmup: Duration::from_secs(10),
            seeds: (1..=5).collect(),
            disciplines: disciplines(1000, None),
        }
    }

    /// The second operating point: 50 Mbit/s, 20 ms, 30 flows, otherwise as the paper.
    pub fn second_point() -> AqmConfig {
        AqmConfig {
            key: "second".into(),
            label: "second point (50 Mbit/s, 20 ms, 30 flows)".into(),
            flows: 30,
            bottleneck_rate_bps: 50_000_000,
            bottleneck_delay: Duration::from_millis(20),
            access_rate_bps: 100_000_000,
            ..AqmConfig::paper()
        }
    }

    /// A short smoke run: one seed, 20 s.
    pub fn quick(mut self) -> AqmConfig {
        self.seeds = vec![1];
        self.duration = Duration::from_secs(20);
        self.warmup = Duration::from_secs(5);
        self
    }
}

/// The six disciplines with the scenario's limit; PID-Delay with τ0 = `tau0_ms` if given.
/// ECN is off everywhere (ns-3's defaults; the paper's QUIC does not negotiate it).
pub fn disciplines(limit: usize, tau0_ms: Option<f64>) -> Vec<DisciplineSpec> {
    let pid = match tau0_ms {
        Some(t) => format!("pid-delay:limit={limit},target_ms={t}"),
        None => format!("pid-delay:limit={limit}"),
    };
    [
        format!("droptail:packets={limit}"),
        format!("red:limit={limit}"),
        format!("pie:limit={limit}"),
        format!("codel:limit={limit}"),
        format!("fq-codel:limit={limit},ecn=false"),
        pid,
    ]
    .iter()
    .map(|s| s.parse().expect("valid built-in spec"))
    .collect()
}

/// One second of a run.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Second {
    /// End of the second, s.
    pub t: f64,
    /// Goodput of all flows in that second, Mbit/s.
    pub goodput_mbps: f64,
    /// Mean queueing delay of packets leaving the bottleneck in that second, ms.
    pub qdelay_ms: f64,
    /// Mean of the senders' smoothed RTTs at the end of the second, ms.
    pub rtt_ms: f64,
}

/// What one run measured (statistics after the warm-up).
#[derive(Debug, Clone)]
pub struct RunResult {
    /// Discipline name.
    pub discipline: String,
    /// The spec as run.
    pub spec: String,
    /// Seed.
    pub seed: u64,
    /// Sum of all flows' goodput, Mbit/s.
    pub total_goodput_mbps: f64,
    /// Each flow's goodput, Mbit/s.
    pub flow_goodput_mbps: Vec<f64>,
    /// Bytes the bottleneck delivered after the warm-up ÷ its capacity over that time.
    pub utilisation: f64,
    /// Queueing delay at the bottleneck, ms.
    pub qdelay_ms: Summary,
    /// 99th percentile queueing delay, ms.
    pub qdelay_p99_ms: f64,
    /// Each sender's mean smoothed RTT, ms.
    pub flow_rtt_ms: Vec<f64>,
    /// Packets the bottleneck queue dropped (overflow + AQM).
    pub queue_drops: u64,
    /// Of which the AQM chose.
    pub aqm_drops: u64,
    /// Packets lost to random loss on the bottleneck.
    pub random_losses: u64,
    /// Packets the bottleneck delivered to the sink.
    pub received_packets: u64,
    /// Per-second series over the whole run.
    pub series: Vec<Second>,
}

fn ip(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

/// Run one discipline with one seed, in virtual time on this thread.
pub fn run_one(cfg: &AqmConfig, spec: &DisciplineSpec, seed: u64) -> RunResult {
    crate::virtual_time(simulate(cfg.clone(), spec.clone(), seed))
}

async fn simulate(cfg: AqmConfig, spec: DisciplineSpec, seed: u64) -> RunResult {
    let net = Network::new(seed);
    let gw = net.add_host("gateway");
    net.set_forwarding(gw, true);
    let sink = net.add_host("sink");
    let g0 = net
        .add_interface(gw, ip(10, 0, 0, 1))
        .expect("fresh address");
    let s0 = net
        .add_interface(sink, ip(10, 0, 0, 2))
        .expect("fresh address");
    let tail = format!("droptail:packets={}", cfg.limit)
        .parse::<DisciplineSpec>()
        .expect("valid");
    let fwd = LinkParams::new(cfg.bottleneck_rate_bps, cfg.bottleneck_delay)
        .with_loss(LossModel::Bernoulli { p: cfg.loss })
        .with_queue(spec.clone());
    let rev =
        LinkParams::new(cfg.bottleneck_rate_bps, cfg.bottleneck_delay).with_queue(tail.clone());
    let bottleneck = net.connect(g0, s0, fwd, rev).expect("valid link");
    net.log_sojourns(bottleneck, Direction::AtoB, 20_000_000);

    let pki = DevPki::generate(&[]).expect("dev PKI");
    let opts = TransportOptions {
        max_udp_payload: Some((cfg.packet_bytes - qgate_netsim::IPV4_UDP_OVERHEAD) as u16),
        // Room for the largest BDP + buffer in these scenarios, so flow control never limits.
        stream_receive_window: 16 << 20,
        receive_window: 32 << 20,
        send_window: 16 << 20,
        ..TransportOptions::default()
    };
    let sink_addr = SocketAddr::new(ip(10, 0, 0, 2), 443);
    let server = endpoint(
        Socket::from(net.bind(sink, sink_addr).expect("free port")),
        Some(server_config(&pki.server, &[ALPN], &opts).expect("server config")),
        Some(seed),
    )
    .expect("endpoint");
    let received: Arc<Vec<AtomicU64>> =
        Arc::new((0..cfg.flows).map(|_| AtomicU64::new(0)).collect());
    let sink_task = tokio::spawn(sink_loop(server.clone(), received.clone()));

    let ccfg = client_config(&pki.trust(), &[ALPN], &opts).expect("client config");
    let conns = Arc::new(Mutex::new(vec![None; cfg.flows]));
    let mut writers = Vec::new();
    let access = LinkParams::new(cfg.access_rate_bps, cfg.access_delay).with_queue(tail.clone());
    for i in 0..cfg.flows {
        let (hi, lo) = (1 + (i / 200) as u8, (i % 200) as u8);
        let h = net.add_host(&format!("source{i}"));
        let hi_if = net
            .add_interface(h, ip(10, hi, lo, 1))
            .expect("fresh address");
        let gi = net
            .add_interface(gw, ip(10, hi, lo, 2))
            .expect("fresh address");
        net.connect_symmetric(hi_if, gi, access.clone())
            .expect("valid link");
        let ep = endpoint(
            Socket::from(
                net.bind(h, SocketAddr::new(ip(10, hi, lo, 1), 0))
                    .expect("free port"),
            ),
            None,
            Some(seed * 1000 + i as u64 + 1),
        )
        .expect("endpoint");
        let (ccfg, conns) = (ccfg.clone(), conns.clone());
        writers.push(tokio::spawn(async move {
            // Stagger starts by 10 ms so the handshakes do not collide exactly.
            tokio::time::sleep(Duration::from_millis(10 * i as u64)).await;
            let Ok(c) = connect(&ep, &ccfg, sink_addr, "localhost", false).await else {
                return;
            };
            let conn = c.connection().clone();
            conns.lock().expect("lock")[i] = Some(conn.clone());
            let Ok(mut st) = conn.open_uni().await else {
                return;
            };
            let chunk = Bytes::from(vec![0x42u8; 64 * 1024]);
            while st.write_chunk(chunk.clone()).await.is_ok() {}
            drop(ep);
        }));
    }

    // Sample once a virtual second.
    let start = Instant::now();
    let mut series = Vec::new();
    let mut last_bytes = vec![0u64; cfg.flows];
    let mut flow_bytes_after_warmup = vec![0u64; cfg.flows];
    let mut rtt_sums = vec![(0.0f64, 0u32); cfg.flows];
    let secs = cfg.duration.as_secs().max(1);
    let mut sojourn_cursor = Vec::new();
    let mut delivered_at_warmup = 0u64;
    for s in 1..=secs {
        tokio::time::sleep_until(start + Duration::from_secs(s)).await;
        let mut total = 0u64;
        for (i, b) in received.iter().enumerate() {
            let now = b.load(Ordering::Relaxed);
            let d = now - last_bytes[i];
            last_bytes[i] = now;
            total += d;
            if Duration::from_secs(s) > cfg.warmup {
                flow_bytes_after_warmup[i] += d;
            }
        }
        let mut rtts = Vec::new();
        for (i, c) in conns.lock().expect("lock").iter().enumerate() {
            if let Some(c) = c {
                let r = c.rtt().as_secs_f64() * 1000.0;
                rtts.push(r);
                if Duration::from_secs(s) > cfg.warmup {
                    rtt_sums[i].0 += r;
                    rtt_sums[i].1 += 1;
                }
            }
        }
        let log = net.take_sojourns(bottleneck, Direction::AtoB);
        let qd: Vec<f64> = log
            .samples
            .iter()
            .map(|(_, d)| d.as_secs_f64() * 1000.0)
            .collect();
        series.push(Second {
            t: s as f64,
            goodput_mbps: total as f64 * 8.0 / 1e6,
            qdelay_ms: if qd.is_empty() {
                0.0
            } else {
                qd.iter().sum::<f64>() / qd.len() as f64
            },
            rtt_ms: if rtts.is_empty() {
                f64::NAN
            } else {
                rtts.iter().sum::<f64>() / rtts.len() as f64
            },
        });
        if Duration::from_secs(s) > cfg.warmup {
            sojourn_cursor.extend(qd);
        }
        if Duration::from_secs(s) == cfg.warmup {
            delivered_at_warmup = net.stats(bottleneck, Direction::AtoB).delivered_bytes;
        }
    }
    let fwd_stats = net.stats(bottleneck, Direction::AtoB);
    let qstats = net.queue_stats(bottleneck, Direction::AtoB);
    for w in &writers {
        w.abort();
    }
    sink_task.abort();
    server.close(0u32.into(), b"done");

    let measured = (cfg.duration.saturating_sub(cfg.warmup))
        .as_secs_f64()
        .max(1e-9);
    let flow_goodput_mbps: Vec<f64> = flow_bytes_after_warmup
        .iter()
        .map(|b| *b as f64 * 8.0 / measured / 1e6)
        .collect();
    let mut sorted = sojourn_cursor.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let p99 = sorted
        .get(((sorted.len() as f64 * 0.99) as usize).min(sorted.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0.0);
    RunResult {
        discipline: spec.kind().to_string(),
        spec: spec.to_string(),
        seed,
        total_goodput_mbps: flow_goodput_mbps.iter().sum(),
        utilisation: (fwd_stats.delivered_bytes - delivered_at_warmup) as f64 * 8.0
            / (cfg.bottleneck_rate_bps as f64 * measured),
        flow_goodput_mbps,
        qdelay_ms: Summary::of(&sojourn_cursor),
        qdelay_p99_ms: p99,
        flow_rtt_ms: rtt_sums
            .iter()
            .map(|(s, n)| if *n == 0 { f64::NAN } else { s / *n as f64 })
            .collect(),
        queue_drops: fwd_stats.dropped_queue,
        aqm_drops: qstats.dropped_aqm,
        random_losses: fwd_stats.dropped_loss,
        received_packets: fwd_stats.delivered,
        series,
    }
}

async fn sink_loop(server: quinn::Endpoint, received: Arc<Vec<AtomicU64>>) {
    while let Some(incoming) = server.accept().await {
        let received = received.clone();
        tokio::spawn(async move {
            let Ok(conn) = incoming.await else { return };
            // Source i sends from 10.(1 + i/200).(i%200).1.
            let idx = match conn.remote_address().ip() {
                IpAddr::V4(v4) => {
                    let o = v4.octets();
                    (o[1] as usize - 1) * 200 + o[2] as usize
                }
                IpAddr::V6(_) => return,
            };
            while let Ok(mut rx) = conn.accept_uni().await {
                let received = received.clone();
                tokio::spawn(async move {
                    while let Ok(Some(c)) = rx.read_chunk(1 << 20, false).await {
                        if let Some(b) = received.get(idx) {
                            b.fetch_add(c.bytes.len() as u64, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
    }
}

/// Run every (discipline, seed) pair, two at a time (one per core); `progress(label)` after each.
pub fn run_all(cfg: &AqmConfig, progress: impl Fn(&str) + Sync) -> Vec<RunResult> {
    let jobs: Vec<(&DisciplineSpec, u64)> = cfg
        .disciplines
        .iter()
        .flat_map(|d| cfg.seeds.iter().map(move |s| (d, *s)))
        .collect();
    crate::pool::run_each(
        &jobs,
        crate::pool::default_jobs(),
        |(spec, seed)| run_one(cfg, spec, *seed),
        |(spec, seed)| progress(&format!("{} seed {seed}", spec.kind())),
    )
}
