//! `qgate demo`: a server, the gateway with three backhaul paths and ten devices on the
//! simulated network, in real time by default, with a live view of the path table and of each
//! class's response delay. Halfway through, path 1 slows from 10 to 80 ms one way, so the
//! adaptive scheduler can be seen moving the priority devices.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use qgate_netsim::topology::LinkChange;
use qgate_netsim::{LossModel, World};

use crate::plan::spec::GatewayLoad;
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
    /// adaptive, completion, round-robin or single.
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
            scheduler: "adaptive",
            loss: 0.0,
            seed: 1,
        }
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
        format!(
            "{}\n{}\nfailed       {}\nper path     {}",
            describe("priority", &self.priority_ms),
            describe("best effort", &self.best_effort_ms),
            self.failed,
            self.per_path
                .iter()
                .enumerate()
                .map(|(i, n)| format!("path {}: {n}", i + 1))
                .collect::<Vec<_>>()
                .join(", ")
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
        file_bytes: None,
        interval_ms: Some(cfg.interval.as_secs_f64() * 1000.0),
        body_bytes: cfg.body_bytes,
        pipelining: 1,
        start_jitter_ms: 0.0,
    };
    let mut world = World::build(&topology, cfg.seed).expect("a valid topology");
    let link0 = world.link("p1").expect("built").id;
    let setup = Setup {
        seed: cfg.seed,
        index: 0,
        pki: std::sync::Arc::new(qgate_transport::DevPki::generate(&[]).expect("PKI")),
    };
    let w = gateway::prepare(&load, &mut world, &setup)
        .await
        .expect("the demo world starts");
    let body = Bytes::from(vec![b'd'; cfg.body_bytes]);
    let log = Arc::new(Mutex::new((
        Vec::new(),
        Vec::new(),
        0usize,
        Vec::<(f64, bool, f64)>::new(),
    )));
    let start = Instant::now();
    let sends = w.devices.iter().enumerate().map(|(i, (d, prio))| {
        let (body, log) = (body.clone(), log.clone());
        let n = (cfg.duration.as_secs_f64() / cfg.interval.as_secs_f64()) as u64;
        async move {
            let offset = cfg.interval.mul_f64(i as f64 / cfg.devices.max(1) as f64);
            for k in 0..n {
                tokio::time::sleep_until(start + offset + cfg.interval * k as u32).await;
                let t = start.elapsed().as_secs_f64();
                match d.send("/ingest/demo", body.clone()).await {
                    Ok(s) => {
                        let v = s.delay.as_secs_f64() * 1000.0;
                        let mut l = log.lock().expect("lock");
                        if *prio {
                            l.0.push(v)
                        } else {
                            l.1.push(v)
                        }
                        l.3.push((t, *prio, v));
                    }
                    Err(_) => log.lock().expect("lock").2 += 1,
                }
            }
        }
    });
    let (net, gw) = (world.net.clone(), w.running.gateway.clone());
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
                "  last second: priority {:.1} ms, best effort {:.1} ms; failed so far {}",
                last(true),
                last(false),
                l.2
            ));
            drop(l);
            view(v);
        }
    };
    futures_util::future::join(futures_util::future::join_all(sends), live).await;
    let l = log.lock().expect("lock");
    DemoOutcome {
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
