//! `qgate lab proxy`: paper 000's experiments. N devices —(1 Gbit/s, 1 ms)— gateway ==three
//! backhaul paths (100/75/50 Mbit/s)== server, with the real gateway, server and devices on the
//! simulated network in virtual time.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use qgate_gateway::builder::RunningGateway;
use qgate_gateway::device::Device;
use qgate_gateway::gateway::{Gateway, GatewayConfig};
use qgate_netsim::{LinkId, LinkParams, LossModel, Network};
use qgate_transport::http3::{H3Client, ALPN_H3};
use qgate_transport::{client_config, connect, endpoint, DevPki, Socket, TransportOptions};
use tokio::time::Instant;

use crate::stats::Summary;

/// Records are 50 bytes (paper 000 §4); they travel batched into request bodies of this size
/// (decision X1: one request per record would be ~21 000 requests per device at 1 MB).
pub const BODY_BYTES: usize = 16 * 1024;
const RATES: [u64; 3] = [100_000_000, 75_000_000, 50_000_000];

/// One run's settings.
#[derive(Debug, Clone)]
pub struct Point {
    /// Which sweep: delay-equal, delay-hetero, loss, size, all-priority, devices, dynamic.
    pub sweep: &'static str,
    /// The swept value (ms, %, KB or devices) for tables and plots.
    pub x: f64,
    /// One-way delay of each path.
    pub delays: [Duration; 3],
    /// Random loss on every path (both directions).
    pub loss: f64,
    /// Devices.
    pub devices: usize,
    /// File bytes per device.
    pub file_bytes: usize,
    /// Whether every device is priority (else even-numbered ones are).
    pub all_priority: bool,
    /// Scheduler name.
    pub scheme: &'static str,
    /// Seed.
    pub seed: u64,
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The settings.
    pub point: Point,
    /// Response delay of every request, ms.
    pub delays_ms: Vec<f64>,
    /// Of priority devices, ms.
    pub priority_ms: Vec<f64>,
    /// First request sent → last file completely received, s.
    pub total_s: f64,
    /// Requests that failed (never answered 201).
    pub failed: usize,
    /// Per-second (t, mean response delay ms of priority devices, of best effort) — dynamic only.
    pub series: Vec<(f64, f64, f64)>,
}

fn ms(x: u64) -> Duration {
    Duration::from_millis(x)
}

/// A built scenario: the network, the backhaul links, registered devices (with their class)
/// and the gateway.
pub(crate) struct World {
    pub(crate) net: Network,
    pub(crate) links: Vec<LinkId>,
    pub(crate) devices: Vec<(Device, bool)>,
    pub(crate) gateway: RunningGateway,
    _keep: Vec<quinn::Endpoint>,
}

pub(crate) async fn build(p: &Point) -> World {
    let net = Network::new(p.seed);
    let (g, s) = (net.add_host("gateway"), net.add_host("server"));
    let pki = DevPki::generate(&[]).expect("PKI");
    let opts = TransportOptions {
        keep_alive_ms: Some(1000),
        ..Default::default()
    };
    let mut links = Vec::new();
    for (i, rate) in RATES.iter().enumerate() {
        let k = i as u8 + 1;
        let gi = net
            .add_interface(g, format!("10.0.{k}.1").parse().expect("address"))
            .expect("fresh");
        let si = net
            .add_interface(s, format!("10.0.{k}.2").parse().expect("address"))
            .expect("fresh");
        let params =
            LinkParams::new(*rate, p.delays[i]).with_loss(LossModel::Bernoulli { p: p.loss });
        links.push(net.connect_symmetric(gi, si, params).expect("link"));
    }
    let _server = qgate_server::CountingServer::start(
        Socket::from(
            net.bind(s, "0.0.0.0:443".parse().expect("addr"))
                .expect("port"),
        ),
        &pki.server,
        &opts,
        Some(p.seed),
    )
    .expect("server");
    let mut builder = Gateway::builder()
        .with_config(GatewayConfig {
            request_timeout: Duration::from_secs(2),
            max_body: 1 << 20,
            ..Default::default()
        })
        .with_scheduler(p.scheme)
        .expect("known scheme")
        .with_transport(opts.clone())
        .with_identity(pki.server.clone())
        .with_server_trust(pki.trust())
        .with_seed(p.seed)
        .with_device_socket(Socket::from(
            net.bind(g, "0.0.0.0:443".parse().expect("addr"))
                .expect("port"),
        ));
    for k in 1..=3u8 {
        let local: SocketAddr = format!("10.0.{k}.1:0").parse().expect("addr");
        let remote: SocketAddr = format!("10.0.{k}.2:443").parse().expect("addr");
        builder = builder.with_path(Socket::from(net.bind(g, local).expect("port")), remote);
    }
    let running = builder.start().expect("gateway");
    let ccfg = client_config(&pki.trust(), &[ALPN_H3], &opts).expect("config");
    tokio::time::sleep(Duration::from_secs(1)).await; // connect and measure the paths

    let mut devices = Vec::new();
    let mut keep = Vec::new();
    for i in 0..p.devices {
        let (hi, lo) = (8 + (i / 200) as u8, (i % 200) as u8);
        let h = net.add_host(&format!("dev{i}"));
        let di = net
            .add_interface(h, format!("10.{hi}.{lo}.2").parse().expect("addr"))
            .expect("fresh");
        let gi = net
            .add_interface(g, format!("10.{hi}.{lo}.1").parse().expect("addr"))
            .expect("fresh");
        net.connect_symmetric(di, gi, LinkParams::new(1_000_000_000, ms(1)))
            .expect("link");
        let ep = endpoint(
            Socket::from(
                net.bind(h, format!("10.{hi}.{lo}.2:0").parse().expect("addr"))
                    .expect("port"),
            ),
            None,
            Some(p.seed * 1000 + i as u64),
        )
        .expect("endpoint");
        let gw_addr: SocketAddr = format!("10.{hi}.{lo}.1:443").parse().expect("addr");
        let conn = connect(&ep, &ccfg, gw_addr, "localhost", false)
            .await
            .expect("device connects");
        let h3 = H3Client::new(conn.connection().clone())
            .await
            .expect("HTTP/3");
        let priority = p.all_priority || i % 2 == 0;
        devices.push((
            Device::register(h3, priority).await.expect("registers"),
            priority,
        ));
        keep.push(ep);
    }
    World {
        net,
        links,
        devices,
        gateway: running,
        _keep: keep,
    }
}

/// Run one point in virtual time on this thread.
pub fn run(p: &Point) -> Outcome {
    crate::virtual_time(async {
        if p.sweep == "dynamic" {
            dynamic(p).await
        } else {
            transfer(p).await
        }
    })
}

/// Every device sends its file, request after request; all devices at once.
async fn transfer(p: &Point) -> Outcome {
    let w = build(p).await;
    let body = Bytes::from(vec![0x5au8; BODY_BYTES]);
    let nreq = p.file_bytes.div_ceil(BODY_BYTES);
    let start = Instant::now();
    let results = Arc::new(Mutex::new((Vec::new(), Vec::new(), 0usize)));
    let sends = w.devices.iter().map(|(d, prio)| {
        let (body, results) = (body.clone(), results.clone());
        async move {
            for _ in 0..nreq {
                match d.send("/ingest/file", body.clone()).await {
                    Ok(s) => {
                        let ms = s.delay.as_secs_f64() * 1000.0;
                        let mut r = results.lock().expect("lock");
                        r.0.push(ms);
                        if *prio {
                            r.1.push(ms);
                        }
                    }
                    Err(_) => results.lock().expect("lock").2 += 1,
                }
            }
        }
    });
    futures_util::future::join_all(sends).await;
    let total_s = start.elapsed().as_secs_f64();
    let (delays_ms, priority_ms, failed) = std::mem::take(&mut *results.lock().expect("lock"));
    drop(w);
    Outcome {
        point: p.clone(),
        delays_ms,
        priority_ms,
        total_s,
        failed,
        series: Vec::new(),
    }
}

/// 60 s of one request per device every 200 ms; path 1's delay 10 → 80 ms at 20 s, path 2 dark
/// at 40 s.
async fn dynamic(p: &Point) -> Outcome {
    let w = build(p).await;
    let body = Bytes::from(vec![0x5au8; BODY_BYTES]);
    let start = Instant::now();
    let log = Arc::new(Mutex::new(Vec::<(f64, bool, f64)>::new()));
    let failed = Arc::new(Mutex::new(0usize));
    let (net, links) = (w.net.clone(), w.links.clone());
    let changes = tokio::spawn(async move {
        tokio::time::sleep_until(start + Duration::from_secs(20)).await;
        net.update_both(links[0], |l| l.delay = ms(80))
            .expect("valid");
        tokio::time::sleep_until(start + Duration::from_secs(40)).await;
        net.update_both(links[1], |l| l.up = false).expect("valid");
    });
    let sends = w.devices.iter().enumerate().map(|(i, (d, prio))| {
        let (body, log, failed) = (body.clone(), log.clone(), failed.clone());
        async move {
            let offset = Duration::from_millis(200 * i as u64 / p.devices.max(1) as u64);
            for k in 0..300u64 {
                tokio::time::sleep_until(start + offset + Duration::from_millis(200 * k)).await;
                let t = start.elapsed().as_secs_f64();
                match d.send("/ingest/live", body.clone()).await {
                    Ok(s) => {
                        log.lock()
                            .expect("lock")
                            .push((t, *prio, s.delay.as_secs_f64() * 1000.0))
                    }
                    Err(_) => *failed.lock().expect("lock") += 1,
                }
            }
        }
    });
    futures_util::future::join_all(sends).await;
    changes.abort();
    let log = std::mem::take(&mut *log.lock().expect("lock"));
    let mut series = Vec::new();
    for sec in 0..60 {
        let mean = |prio: bool| {
            let v: Vec<f64> = log
                .iter()
                .filter(|(t, p, _)| *p == prio && *t >= sec as f64 && *t < sec as f64 + 1.0)
                .map(|x| x.2)
                .collect();
            Summary::of(&v).mean
        };
        series.push((sec as f64 + 1.0, mean(true), mean(false)));
    }
    let failed = *failed.lock().expect("lock");
    Outcome {
        point: p.clone(),
        delays_ms: log.iter().map(|x| x.2).collect(),
        priority_ms: log.iter().filter(|x| x.1).map(|x| x.2).collect(),
        total_s: start.elapsed().as_secs_f64(),
        failed,
        series,
    }
}

/// Every point of every sweep (EXPERIMENTS.md "proxy"), `seeds` seeds each. `quick`: one point
/// per sweep at its default, one seed, and a 1 s dynamic check skipped.
pub fn plan(seeds: u64, quick: bool) -> Vec<Point> {
    let schemes = ["single", "round-robin", "adaptive"];
    let base = Point {
        sweep: "",
        x: 0.0,
        delays: [ms(10); 3],
        loss: 0.0,
        devices: 10,
        file_bytes: 512 * 1024,
        all_priority: false,
        scheme: "",
        seed: 0,
    };
    let mut points: Vec<Point> = Vec::new();
    let delays: &[u64] = if quick {
        &[10, 30]
    } else {
        &[10, 20, 30, 40, 50]
    };
    for &d in delays {
        points.push(Point {
            sweep: "delay-equal",
            x: d as f64,
            delays: [ms(d); 3],
            ..base.clone()
        });
        points.push(Point {
            sweep: "delay-hetero",
            x: d as f64,
            delays: [ms(d), ms(2 * d), ms(3 * d)],
            ..base.clone()
        });
    }
    let losses: &[f64] = if quick {
        &[0.05]
    } else {
        &[0.0, 0.05, 0.10, 0.15]
    };
    for &l in losses {
        points.push(Point {
            sweep: "loss",
            x: l * 100.0,
            delays: [ms(10), ms(20), ms(30)],
            loss: l,
            ..base.clone()
        });
    }
    if !quick {
        for kb in [128usize, 256, 512, 1024] {
            points.push(Point {
                sweep: "size",
                x: kb as f64,
                file_bytes: kb * 1024,
                ..base.clone()
            });
        }
        for n in [10usize, 20, 30, 40, 50] {
            points.push(Point {
                sweep: "devices",
                x: n as f64,
                devices: n,
                ..base.clone()
            });
        }
        points.push(Point {
            sweep: "dynamic",
            x: 0.0,
            ..base.clone()
        });
    }
    points.push(Point {
        sweep: "all-priority",
        x: 10.0,
        all_priority: true,
        delays: [ms(10), ms(20), ms(30)],
        ..base.clone()
    });
    let mut out = Vec::new();
    for p in points {
        for s in schemes {
            for seed in 1..=seeds {
                out.push(Point {
                    scheme: s,
                    seed,
                    ..p.clone()
                });
            }
        }
    }
    out
}

/// Run the plan, two at a time.
pub fn run_all(points: &[Point], progress: impl Fn(&str) + Sync) -> Vec<Outcome> {
    crate::pool::run_each(points, crate::pool::default_jobs(), run, |p| {
        progress(&format!("{} {} {} seed {}", p.sweep, p.x, p.scheme, p.seed))
    })
}
