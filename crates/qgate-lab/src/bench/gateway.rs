//! `qgate-lab bench gateway`: the gateway's cost on real loopback UDP, measured against talking to the
//! server directly in the same run.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use qgate_gateway::device::Device;
use qgate_transport::http3::{H3Client, ALPN_H3};
use qgate_transport::{client_config, connect, endpoint, DevPki, Socket, TransportOptions};

use crate::stats::Summary;

/// Throughput and latency of one configuration.
#[derive(Debug, Clone)]
pub struct Load {
    /// Requests answered per second.
    pub rps: f64,
    /// Median request latency, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// CPU time of the whole process (devices, gateway, server) per answered request, µs.
    pub cpu_us_per_req: f64,
}

/// Benchmark results.
#[derive(Debug, Clone)]
pub struct GatewayBench {
    /// Through the gateway, closed loop (as fast as it answers), per repeat.
    pub via_gateway: Vec<Load>,
    /// Straight to the server, closed loop, per repeat.
    pub direct: Vec<Load>,
    /// Through the gateway at the fixed offered load, per repeat (empty when not measured).
    pub via_gateway_paced: Vec<Load>,
    /// Straight to the server at the fixed offered load, per repeat.
    pub direct_paced: Vec<Load>,
    /// Through the gateway, closed loop, while its admin port is read once a second as the
    /// dashboard does, per repeat (empty when not measured).
    pub via_gateway_scraped: Vec<Load>,
    /// Through a second gateway whose paths are shaped, closed loop, per repeat (empty when
    /// not measured).
    pub via_gateway_shaped: Vec<Load>,
    /// Through a second gateway that sends every record alone (no batches, decision G23),
    /// closed loop, per repeat (empty when not measured).
    pub via_gateway_unbatched: Vec<Load>,
    /// The measured gateway's batches over the whole run, and the records they carried.
    pub batches: (u64, u64),
}

/// What the devices send.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Concurrent devices.
    pub devices: usize,
    /// Request body, bytes.
    pub body: usize,
    /// Seconds per measurement.
    pub secs: f64,
    /// Alternating (gateway, direct) pairs.
    pub repeats: usize,
    /// Offered load of the latency measurement, requests/s over all devices (0 skips it).
    /// Closed-loop latency at saturation is queueing (Little's law: devices / throughput), not
    /// the gateway's cost; the gateway's added latency is measured below saturation (G8).
    pub paced_rps: f64,
    /// Also measure a second gateway whose backhaul paths' egress is shaped with these
    /// parameters (rate and queue discipline), taking turns with the unshaped one.
    pub shape: Option<qgate_link::LinkParams>,
    /// Also measure the gateway while its admin port is scraped every second.
    pub scrape: bool,
    /// Also measure a second gateway that sends every record alone (decision G23), taking
    /// turns with the one that batches.
    pub unbatched: bool,
}

impl GatewayBench {
    /// Per repeat: requests/s while scraped ÷ requests/s not scraped (closed loop).
    pub fn scraped_ratio(&self) -> Summary {
        rps_ratio(&self.via_gateway_scraped, &self.via_gateway)
    }

    /// Per pair: the shaped gateway's own CPU per forwarded request ÷ the unshaped one's (each
    /// minus direct's, as [`Self::gateway_cpu_us_per_req`]); a pair whose unshaped difference
    /// is not positive (noise larger than the gateway's cost) is left out.
    pub fn shaped_cpu_ratio(&self) -> Summary {
        Summary::of(
            &self
                .via_gateway_shaped
                .iter()
                .zip(&self.via_gateway)
                .zip(&self.direct)
                .filter(|((_, g), d)| g.cpu_us_per_req > d.cpu_us_per_req)
                .map(|((s, g), d)| {
                    (s.cpu_us_per_req - d.cpu_us_per_req) / (g.cpu_us_per_req - d.cpu_us_per_req)
                })
                .collect::<Vec<_>>(),
        )
    }

    /// The unbatched gateway's own CPU per forwarded request, µs, per pair.
    pub fn unbatched_cpu_us_per_req(&self) -> Summary {
        cpu_beyond(&self.via_gateway_unbatched, &self.direct)
    }

    /// Per pair: requests/s through the gateway that batches ÷ through the one that does not.
    pub fn batched_rps_ratio(&self) -> Summary {
        rps_ratio(&self.via_gateway, &self.via_gateway_unbatched)
    }

    /// The shaped gateway's own CPU per forwarded request, µs, per pair.
    pub fn shaped_cpu_us_per_req(&self) -> Summary {
        cpu_beyond(&self.via_gateway_shaped, &self.direct)
    }

    /// Requests/s through the gateway (mean ± std).
    pub fn gateway_rps(&self) -> Summary {
        rps(&self.via_gateway)
    }
    /// Requests/s direct.
    pub fn direct_rps(&self) -> Summary {
        rps(&self.direct)
    }
    /// The gateway's own CPU time per forwarded request, µs: the process's CPU per request
    /// through the gateway minus per request direct (devices and server do the same work in
    /// both), closed loop, per pair.
    pub fn gateway_cpu_us_per_req(&self) -> Summary {
        cpu_beyond(&self.via_gateway, &self.direct)
    }
    /// Added median latency at saturation, ms (mean ± std over repeats).
    pub fn added_p50_ms(&self) -> Summary {
        added(&self.via_gateway, &self.direct)
    }
    /// Added median latency at the fixed offered load, ms (mean ± std over repeats).
    pub fn added_p50_paced_ms(&self) -> Summary {
        added(&self.via_gateway_paced, &self.direct_paced)
    }
}

/// Requests/s of each load (mean ± std).
pub fn rps(loads: &[Load]) -> Summary {
    Summary::of(&loads.iter().map(|l| l.rps).collect::<Vec<_>>())
}

/// Requests/s of `a` ÷ requests/s of `b`, per pair.
fn rps_ratio(a: &[Load], b: &[Load]) -> Summary {
    Summary::of(
        &a.iter()
            .zip(b)
            .map(|(x, y)| x.rps / y.rps.max(1e-9))
            .collect::<Vec<_>>(),
    )
}

/// CPU per request through a gateway minus direct, µs, per pair.
fn cpu_beyond(via: &[Load], direct: &[Load]) -> Summary {
    Summary::of(
        &via.iter()
            .zip(direct)
            .map(|(g, d)| g.cpu_us_per_req - d.cpu_us_per_req)
            .collect::<Vec<_>>(),
    )
}

fn added(via: &[Load], direct: &[Load]) -> Summary {
    Summary::of(
        &via.iter()
            .zip(direct)
            .map(|(g, d)| g.p50_ms - d.p50_ms)
            .collect::<Vec<_>>(),
    )
}

/// One sender per client posting its body straight to the server's `/ingest/bench`: the
/// baseline the gateway and spool benches measure against.
pub(crate) fn direct_senders(direct: &[Arc<H3Client>]) -> Vec<SendFn> {
    direct
        .iter()
        .map(|h| {
            let h = h.clone();
            Arc::new(move |b: Bytes| {
                let h = h.clone();
                Box::pin(async move {
                    let req = http::Request::post("https://localhost/ingest/bench")
                        .body(())
                        .expect("valid");
                    h.request(req, b, 4096)
                        .await
                        .is_ok_and(|r| r.status.is_success())
                }) as futures_util::future::BoxFuture<'static, bool>
            }) as SendFn
        })
        .collect()
}

pub(crate) type SendFn =
    Arc<dyn Fn(Bytes) -> futures_util::future::BoxFuture<'static, bool> + Send + Sync>;

fn sa(s: &str) -> SocketAddr {
    s.parse().expect("valid address")
}

/// One sender per client, `body` bytes per request, for `secs`: closed loop (the next request
/// when the last is answered) when `rps` is 0, else each client sends at `rps / clients`
/// requests/s, the clients' start times spread evenly over one interval.
pub(crate) async fn drive(clients: Vec<SendFn>, body: usize, secs: f64, rps: f64) -> Load {
    let n = clients.len();
    let stop = Arc::new(AtomicBool::new(false));
    let lat = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let cpu0 = process_cpu_seconds();
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, send)| {
            let (stop, lat) = (stop.clone(), lat.clone());
            let payload = Bytes::from(vec![b'x'; body]);
            tokio::spawn(async move {
                let mut mine = Vec::new();
                let mut pace = (rps > 0.0).then(|| {
                    let every = Duration::from_secs_f64(n as f64 / rps);
                    let first = tokio::time::Instant::now() + every.mul_f64(i as f64 / n as f64);
                    let mut t = tokio::time::interval_at(first, every);
                    t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    t
                });
                while !stop.load(Ordering::Relaxed) {
                    if let Some(p) = pace.as_mut() {
                        p.tick().await;
                    }
                    let t = Instant::now();
                    if send(payload.clone()).await {
                        mine.push(t.elapsed().as_secs_f64() * 1000.0);
                    }
                }
                lat.lock().expect("lock").extend(mine);
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = process_cpu_seconds() - cpu0;
    let mut l = std::mem::take(&mut *lat.lock().expect("lock"));
    l.sort_by(|a, b| a.total_cmp(b));
    let q = |f: f64| {
        l.get(((l.len() as f64 * f) as usize).min(l.len().saturating_sub(1)))
            .copied()
            .unwrap_or(f64::NAN)
    };
    Load {
        rps: l.len() as f64 / elapsed,
        p50_ms: q(0.5),
        p99_ms: q(0.99),
        cpu_us_per_req: cpu * 1e6 / l.len().max(1) as f64,
    }
}

/// User + system CPU time of this process (all threads) so far, seconds.
fn process_cpu_seconds() -> f64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a whole rusage into the pointer it is given; RUSAGE_SELF is
    // always valid, so it cannot fail.
    let ru = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr());
        ru.assume_init()
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(ru.ru_utime) + secs(ru.ru_stime)
}

/// Run `repeats` alternating pairs (gateway, direct), closed loop and then at the fixed offered
/// load, `secs` each.
pub fn run(cfg: BenchConfig, progress: impl Fn(usize)) -> GatewayBench {
    let BenchConfig {
        devices,
        body,
        secs,
        repeats,
        paced_rps,
        shape,
        scrape,
        unbatched,
    } = cfg;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let pki = DevPki::generate(&[]).expect("PKI");
        let opts = TransportOptions::default();
        let ccfg = client_config(&pki.trust(), &[ALPN_H3], &opts).expect("config");
        let server = qgate_server::Server::builder()
            .socket(Socket::bind_udp(sa("127.0.0.1:0")).expect("bind"))
            .identity(&pki.server)
            .transport(opts.clone())
            .start()
            .expect("server");
        let server_addr = server.addr();
        let running = super::loopback_gateway(&opts, &pki, server_addr, None, true).await;
        let (gw, gw_addr) = (running.gateway.clone(), running.addr());
        let shaped_running = match &shape {
            Some(params) => {
                Some(super::loopback_gateway(&opts, &pki, server_addr, Some(params), true).await)
            }
            None => None,
        };
        let unbatched_running = match unbatched {
            true => Some(super::loopback_gateway(&opts, &pki, server_addr, None, false).await),
            false => None,
        };
        let client_ep = endpoint(
            Socket::bind_udp(sa("127.0.0.1:0")).expect("bind"),
            None,
            None,
        )
        .expect("endpoint");
        let mut via = Vec::new();
        let mut via_shaped = Vec::new();
        let mut via_unbatched = Vec::new();
        let mut direct = Vec::new();
        for i in 0..devices {
            let mut gateways = vec![(gw_addr, &mut via)];
            if let Some(r) = &shaped_running {
                gateways.push((r.addr(), &mut via_shaped));
            }
            if let Some(r) = &unbatched_running {
                gateways.push((r.addr(), &mut via_unbatched));
            }
            for (addr, list) in gateways {
                let c = connect(&client_ep, &ccfg, addr, "localhost", false)
                    .await
                    .expect("connect");
                list.push(Arc::new(
                    Device::register(
                        H3Client::new(c.connection().clone()).await.expect("h3"),
                        i % 2 == 0,
                    )
                    .await
                    .expect("register"),
                ));
            }
            let c = connect(&client_ep, &ccfg, server_addr, "localhost", false)
                .await
                .expect("connect");
            direct.push(Arc::new(
                H3Client::new(c.connection().clone()).await.expect("h3"),
            ));
        }
        let senders_to = |devices: &Vec<Arc<Device>>| -> Vec<SendFn> {
            devices
                .iter()
                .map(|d| {
                    let d = d.clone();
                    Arc::new(move |b: Bytes| {
                        let d = d.clone();
                        Box::pin(async move { d.send("/ingest/bench", b).await.is_ok() })
                            as futures_util::future::BoxFuture<'static, bool>
                    }) as SendFn
                })
                .collect()
        };
        let via_senders = || senders_to(&via);
        let direct_senders = || direct_senders(&direct);
        let mut out = GatewayBench {
            via_gateway: Vec::new(),
            direct: Vec::new(),
            via_gateway_paced: Vec::new(),
            direct_paced: Vec::new(),
            via_gateway_scraped: Vec::new(),
            via_gateway_shaped: Vec::new(),
            via_gateway_unbatched: Vec::new(),
            batches: (0, 0),
        };
        // The admin port with the gateway's registry; the scraper reads it as Prometheus and
        // the dashboard would, once a second: the metrics over HTTP, and the dashboard's three
        // API reads (paths, delay, scheduler) plus the session list, as direct calls.
        let admin = qgate_admin::Admin::builder()
            .metrics(gw.collector())
            .bind(sa("127.0.0.1:0"))
            .await
            .expect("admin port");
        let scraper = {
            let client =
                qgate_admin::AdminClient::new(&admin.addr().to_string(), None).expect("address");
            let gw = gw.clone();
            move || {
                let (client, gw) = (client.clone(), gw.clone());
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(Duration::from_secs(1));
                    loop {
                        tick.tick().await;
                        let (status, _) = client
                            .request(http::Method::GET, "/metrics", None)
                            .await
                            .expect("scrape");
                        assert!(status.is_success());
                        std::hint::black_box((
                            gw.path_views(),
                            gw.session_views(1000),
                            gw.stats.delay_priority.count(),
                            gw.scheduler_name(),
                        ));
                    }
                })
            }
        };
        for r in 0..repeats {
            // Scraped and unscraped take turns going first, so a drift over the run does not
            // land on one side.
            let scraped_first = scrape && r % 2 == 1;
            let scraped = || {
                let task = scraper();
                async move {
                    let load = drive(via_senders(), body, secs, 0.0).await;
                    task.abort();
                    load
                }
            };
            if scraped_first {
                out.via_gateway_scraped.push(scraped().await);
            }
            // Shaped and unshaped take turns going first, likewise.
            let shaped_first = r % 2 == 1;
            if !via_shaped.is_empty() && shaped_first {
                out.via_gateway_shaped
                    .push(drive(senders_to(&via_shaped), body, secs, 0.0).await);
            }
            // Batching and not take turns going first, likewise.
            if !via_unbatched.is_empty() && shaped_first {
                out.via_gateway_unbatched
                    .push(drive(senders_to(&via_unbatched), body, secs, 0.0).await);
            }
            out.via_gateway
                .push(drive(via_senders(), body, secs, 0.0).await);
            if !via_unbatched.is_empty() && !shaped_first {
                out.via_gateway_unbatched
                    .push(drive(senders_to(&via_unbatched), body, secs, 0.0).await);
            }
            if !via_shaped.is_empty() && !shaped_first {
                out.via_gateway_shaped
                    .push(drive(senders_to(&via_shaped), body, secs, 0.0).await);
            }
            if scrape && !scraped_first {
                out.via_gateway_scraped.push(scraped().await);
            }
            out.direct
                .push(drive(direct_senders(), body, secs, 0.0).await);
            if paced_rps > 0.0 {
                out.via_gateway_paced
                    .push(drive(via_senders(), body, secs, paced_rps).await);
                out.direct_paced
                    .push(drive(direct_senders(), body, secs, paced_rps).await);
            }
            progress(r + 1);
        }
        let b = &gw.batch_stats;
        out.batches = (
            b.batches.load(std::sync::atomic::Ordering::Relaxed),
            b.batched.load(std::sync::atomic::Ordering::Relaxed),
        );
        out
    })
}

/// Resident memory of process `pid`, bytes (Linux `/proc`).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()
        .map(|kb| kb * 1024)
}

/// Open `n` idle registered device connections to the gateway at `gw`; returns them (keep them
/// alive while measuring).
pub async fn idle_devices(
    gw: SocketAddr,
    trust: &qgate_transport::TrustRoots,
    n: usize,
) -> Vec<Device> {
    let opts = TransportOptions {
        idle_timeout_ms: 600_000,
        ..Default::default()
    };
    let ccfg = client_config(trust, &[ALPN_H3], &opts).expect("config");
    let ep = endpoint(
        Socket::bind_udp(sa("127.0.0.1:0")).expect("bind"),
        None,
        None,
    )
    .expect("endpoint");
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let c = connect(&ep, &ccfg, gw, "localhost", false)
            .await
            .expect("connect");
        out.push(
            Device::register(
                H3Client::new(c.connection().clone()).await.expect("h3"),
                i % 2 == 0,
            )
            .await
            .expect("register"),
        );
    }
    std::mem::forget(ep);
    out
}
