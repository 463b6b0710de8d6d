//! `qgate demo`: a server, the gateway with three backhaul paths and ten devices on the
//! simulated network, in real time by default, with a live view of the path table and of each
//! class's response delay. Halfway through, path 1 slows from 10 to 80 ms one way, so the
//! adaptive scheduler can be seen moving the priority devices.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::proxy::{build, Point};
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
    /// adaptive, round-robin or single.
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
    let ms = Duration::from_millis;
    let point = Point {
        sweep: "demo",
        x: 0.0,
        delays: [ms(10), ms(20), ms(30)],
        loss: cfg.loss,
        devices: cfg.devices,
        file_bytes: 0,
        all_priority: false,
        scheme: cfg.scheduler,
        seed: cfg.seed,
    };
    let w = build(&point).await;
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
    let (net, link0, gw) = (w.net.clone(), w.links[0], w.gateway.gateway.clone());
    let live = async {
        let mut slowed = false;
        for sec in 1..=cfg.duration.as_secs() {
            tokio::time::sleep_until(start + Duration::from_secs(sec)).await;
            if !slowed && sec * 2 >= cfg.duration.as_secs() {
                net.update_both(link0, |l| l.delay = ms(80)).expect("valid");
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
            .gateway
            .gateway
            .per_path
            .iter()
            .map(|a| a.load(std::sync::atomic::Ordering::Relaxed))
            .collect(),
    }
}
