//! `kind = "gateway"`: the ingest server, the gateway (built by [`Gateway::builder`]) over the
//! named backhaul links, and devices on their own access links, each registered and sending
//! request bodies: a file in closed loop, or one request per interval.
//!
//! Samples: `response_ms`, `priority_ms`, `best_effort_ms` (request sent → response). Scalars:
//! `requests`, `failed`, `unfinished`, `total_s` (first request → last response, closed loop),
//! and per path k: `path<k>_share` (of answered requests), `path<k>_priority_share` (of the
//! priority class's), `path<k>_util` (bytes the link carried gateway → server ÷ its capacity, second by second
//! as the timeline changes it, from the start of the run),
//! `path<k>_rtt_ms` (the gateway's mean RTT estimate). Series: `path<k>_rtt_ms`.
//!
//! With `spool = true`: scalars `spooled`, `drained` (records the spool took and sent on),
//! `spool_left` (held at the end), `spool_empty_s` (when it last became empty after holding
//! records; the run waits for it until the deadline), series `spool_held` (records, each second).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use qgate_gateway::builder::{PathOptions, RunningGateway};
use qgate_gateway::device::Device;
use qgate_gateway::gateway::{Gateway, GatewayConfig};
use qgate_gateway::paths::BackhaulHistory;
use qgate_history::HistoryConfig;
use qgate_netsim::topology::{LinkSpec, Topology};
use qgate_netsim::{Direction, LinkId, Network, World};
use qgate_server::RunningServer;
use qgate_transport::http3::{H3Client, ALPN_H3};
use qgate_transport::window_history::DEFAULT_SAFEGUARD_FACTOR;
use qgate_transport::Congestion;
use qgate_transport::{client_config, connect, endpoint, Socket, TransportOptions};
use rand::Rng;
use tokio::time::Instant;

use super::{rng, secs, Clock, Measurements, Setup};
use crate::plan::spec::{Classes, GatewayLoad};

pub(super) fn check(
    g: &GatewayLoad,
    topology: &Topology,
    host: &dyn Fn(&str, &str) -> Result<(), String>,
    link: &dyn Fn(&str, &str) -> Result<(), String>,
) -> Result<(), String> {
    host("workloads.gateway", &g.gateway)?;
    host("workloads.server", &g.server)?;
    if g.gateway == g.server {
        return Err(format!(
            "workload '{}': 'gateway' and 'server' are the same host",
            g.name
        ));
    }
    if g.file_bytes == Some(0) {
        return Err(format!("workload '{}': 'file_bytes' must be > 0", g.name));
    }
    if g.request_timeout_ms
        .is_some_and(|t| !(t > 0.0 && t <= 3_600_000.0))
    {
        return Err(format!(
            "workload '{}': 'request_timeout_ms' must be in (0, 3600000]",
            g.name
        ));
    }
    if g.paths.is_empty() {
        return Err(format!("workload '{}': 'paths' lists no link", g.name));
    }
    for (i, p) in g.paths.iter().enumerate() {
        link("workloads.paths", p)?;
        if let Some(l) = topology.links.iter().find(|l| l.name == *p) {
            let ends = [l.a.as_str(), l.b.as_str()];
            if !(ends.contains(&g.gateway.as_str()) && ends.contains(&g.server.as_str())) {
                return Err(format!(
                    "workload '{}': path '{p}' joins '{}' and '{}', not the gateway '{}' and the server '{}'",
                    g.name, l.a, l.b, g.gateway, g.server
                ));
            }
        }
        if g.paths[..i].contains(p) {
            return Err(format!(
                "workload '{}': 'paths' lists link '{p}' twice",
                g.name
            ));
        }
    }
    if let Some(s) = &g.scheduler {
        qgate_forward::scheduler::by_name(s)
            .map_err(|e| format!("workload '{}': 'scheduler': {e}", g.name))?;
    }
    if g.file_bytes.is_none() && g.interval_ms.is_none() {
        return Err(format!(
            "workload '{}': give 'file_bytes' (closed loop) and/or 'interval_ms' (open loop)",
            g.name
        ));
    }
    if g.interval_ms.is_some_and(|i| !(i.is_finite() && i > 0.0)) {
        return Err(format!("workload '{}': 'interval_ms' must be > 0", g.name));
    }
    if !(0.0..=1.0).contains(&g.priority_fraction) {
        return Err(format!(
            "workload '{}': 'priority_fraction' must be in [0, 1]",
            g.name
        ));
    }
    let max_body = GatewayConfig::default().max_body;
    if g.body_bytes > max_body {
        return Err(format!(
            "workload '{}': 'body_bytes' must be at most the gateway's max_body ({max_body})",
            g.name
        ));
    }
    // The gateway bounds sessions: a device sending both classes holds two.
    let per_device = match g.classes {
        Classes::Device => 1,
        Classes::Both => 2,
    };
    let max_devices = GatewayConfig::default().max_devices / per_device;
    if g.devices > max_devices || g.pipelining > 64 {
        return Err(format!(
            "workload '{}': at most {max_devices} 'devices' (the gateway's max_devices sessions, {per_device} per device) and 64 'pipelining'",
            g.name
        ));
    }
    if g.body_bytes == 0 || g.pipelining == 0 || g.devices == 0 {
        return Err(format!(
            "workload '{}': 'devices', 'body_bytes' and 'pipelining' must be at least 1",
            g.name
        ));
    }
    if let Some(c) = &g.congestion {
        c.parse::<Congestion>()
            .map_err(|e| format!("workload '{}': 'congestion': {e}", g.name))?;
    }
    let max = qgate_gateway::paths::MAX_CONNECTIONS_PER_PATH;
    if g.connections_per_path
        .is_some_and(|n| !(1..=max).contains(&n))
    {
        return Err(format!(
            "workload '{}': 'connections_per_path' must be 1 to {max}",
            g.name
        ));
    }
    if !(g.start_jitter_ms.is_finite() && g.start_jitter_ms >= 0.0) {
        return Err(format!(
            "workload '{}': 'start_jitter_ms' must be ≥ 0",
            g.name
        ));
    }
    Ok(())
}

/// A backhaul link as the gateway sees it.
struct PathLink {
    id: LinkId,
    /// The gateway → server direction.
    up: Direction,
}

/// The server, the gateway and registered devices (with their class), ready to send.
pub(crate) struct Prepared {
    spec: GatewayLoad,
    net: Network,
    paths: Vec<PathLink>,
    /// Each device's sessions with their class (priority = true): one, or with
    /// `classes = "both"` a priority and a best-effort one its requests alternate between.
    pub(crate) devices: Vec<Vec<(Device, bool)>>,
    jitter: Vec<Duration>,
    pub(crate) running: RunningGateway,
    pub(crate) server: RunningServer,
    _keep: Vec<quinn::Endpoint>,
    /// The gateway's spool and its directory, removed after the run.
    spool: Option<(qgate_spool::Spool, std::path::PathBuf)>,
}

/// Device `i` of `n` is priority when `i × fraction` has a fractional part below `fraction`:
/// 0.5 makes devices 0, 2, 4, … priority, 1 all, 0 none.
fn is_priority(i: usize, fraction: f64) -> bool {
    (i as f64 * fraction).fract() < fraction
}

/// Start the server (storing into `sink`) and the gateway over the named paths, and register
/// the devices.
pub(crate) async fn prepare(
    g: &GatewayLoad,
    world: &mut World,
    s: &Setup,
    sink: std::sync::Arc<dyn qgate_server::Sink>,
) -> Result<Prepared, String> {
    let gw_host = world.host(&g.gateway).ok_or("no gateway host")?;
    let srv_host = world.host(&g.server).ok_or("no server host")?;
    let net = world.net.clone();
    let opts = TransportOptions {
        keep_alive_ms: Some(1000),
        ..Default::default()
    };
    // The controller is the sender's: the gateway's (requests flow gateway → server).
    let gw_opts = TransportOptions {
        congestion: match &g.congestion {
            Some(c) => c.parse()?,
            None => Congestion::default(),
        },
        ..opts.clone()
    };
    let history = g.history.averaging().map(|averaging| BackhaulHistory {
        store: super::virtual_history(HistoryConfig {
            averaging,
            ..Default::default()
        }),
        safeguard: Some(DEFAULT_SAFEGUARD_FACTOR),
    });
    let server = qgate_server::Server::builder()
        .socket(Socket::from(
            net.bind(srv_host, SocketAddr::from(([0, 0, 0, 0], 443)))
                .map_err(|e| e.to_string())?,
        ))
        .identity(&s.pki.server)
        .transport(opts.clone())
        .sink(sink)
        .seed(s.seed)
        .start()
        .map_err(|e| e.to_string())?;
    let mut cfg = GatewayConfig::default();
    if let Some(ms) = g.request_timeout_ms {
        cfg.request_timeout = secs(ms / 1000.0);
    }
    let mut builder = Gateway::builder()
        .with_config(cfg)
        .with_transport(gw_opts)
        .with_history(history)
        .with_identity(s.pki.server.clone())
        .with_server_trust(s.pki.trust())
        .with_seed(s.seed)
        .with_device_socket(Socket::from(
            net.bind(gw_host, SocketAddr::from(([0, 0, 0, 0], 443)))
                .map_err(|e| e.to_string())?,
        ));
    if let Some(name) = &g.scheduler {
        builder = builder.with_scheduler(name).map_err(|e| e.to_string())?;
    }
    let mut paths = Vec::new();
    for name in &g.paths {
        let l = world.link(name).map_err(|e| e.to_string())?;
        let (local, remote, up) = if l.a.0 == gw_host && l.b.0 == srv_host {
            (l.a.1, l.b.1, Direction::AtoB)
        } else if l.b.0 == gw_host && l.a.0 == srv_host {
            (l.b.1, l.a.1, Direction::BtoA)
        } else {
            return Err(format!(
                "path '{name}' does not join '{}' and '{}'",
                g.gateway, g.server
            ));
        };
        let sock = net
            .bind(gw_host, SocketAddr::new(local, 0))
            .map_err(|e| e.to_string())?;
        let options = PathOptions {
            connections: g.connections_per_path,
            ..Default::default()
        };
        builder = builder.with_backhaul(Socket::from(sock), SocketAddr::new(remote, 443), options);
        paths.push(PathLink { id: l.id, up });
    }
    let spool = if g.spool {
        let dir = std::env::temp_dir().join(format!(
            "qgate-lab-spool-{}-{}-{}-{}",
            std::process::id(),
            g.name,
            s.seed,
            s.index
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let cfg = qgate_spool::SpoolConfig {
            keep_free: 0,
            ..qgate_spool::SpoolConfig::new(&dir)
        };
        // Disk work in place: a blocking-pool thread would finish at no fixed point of
        // virtual time (U12).
        let spool = qgate_spool::Spool::open_with(
            cfg,
            Some(std::sync::Arc::new(crate::providers::InlineDisk)),
        )
        .map_err(|e| format!("spool: {e}"))?;
        builder = builder.with_spool(spool.clone());
        Some((spool, dir))
    } else {
        None
    };
    let running = builder.start().map_err(|e| e.to_string())?;
    // Connect and measure the paths before the devices come.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let ccfg = client_config(&s.pki.trust(), &[ALPN_H3], &opts).map_err(|e| e.to_string())?;
    let mut devices = Vec::with_capacity(g.devices);
    let mut keep = Vec::with_capacity(g.devices);
    for i in 0..g.devices {
        let dev = format!("{}.dev{i}", g.name);
        world.add_host(&dev, false).map_err(|e| e.to_string())?;
        let l = world
            .add_link(&LinkSpec::new(
                &format!("{}.access{i}", g.name),
                &dev,
                &g.gateway,
                g.access.clone(),
            ))
            .map_err(|e| e.to_string())?;
        let ep = endpoint(
            Socket::from(
                net.bind(l.a.0, SocketAddr::new(l.a.1, 0))
                    .map_err(|e| e.to_string())?,
            ),
            None,
            Some(s.seed * 1000 + i as u64),
        )
        .map_err(|e| e.to_string())?;
        let conn = connect(&ep, &ccfg, SocketAddr::new(l.b.1, 443), "localhost", false)
            .await
            .map_err(|e| format!("device {i} cannot connect: {e}"))?;
        let h3 = H3Client::new(conn.connection().clone())
            .await
            .map_err(|e| format!("device {i}: {e}"))?;
        let priority = match g.classes {
            Classes::Device => is_priority(i, g.priority_fraction),
            Classes::Both => true,
        };
        let d = Device::register(h3, priority)
            .await
            .map_err(|e| format!("device {i} cannot register: {e}"))?;
        let mut sessions = vec![(d, priority)];
        if g.classes == Classes::Both {
            let other =
                sessions[0].0.also(false).await.map_err(|e| {
                    format!("device {i} cannot register its best-effort class: {e}")
                })?;
            sessions.push((other, false));
        }
        devices.push(sessions);
        keep.push(ep);
    }
    // Seeded start jitter: every seed changes the run (decision X4).
    let mut r = rng(s.seed, s.index);
    let jitter = (0..g.devices)
        .map(|_| secs(r.random::<f64>() * g.start_jitter_ms / 1000.0))
        .collect();
    Ok(Prepared {
        spec: g.clone(),
        net,
        paths,
        devices,
        jitter,
        running,
        server,
        _keep: keep,
        spool,
    })
}

/// One answered request: when it was sent (s), its delay (ms), class, path.
type Answer = (f64, f64, bool, Option<usize>);

#[derive(Default)]
struct Log {
    answers: Vec<Answer>,
    failed: usize,
    unfinished: usize,
    first_sent: Option<f64>,
    last_done: f64,
}

impl Prepared {
    pub(super) async fn run(self, clock: Clock) -> Measurements {
        let clock = &clock;
        let g = &self.spec;
        let begin = clock.start + secs(g.start_s);
        let body = Bytes::from(vec![0x5au8; g.body_bytes]);
        let log = Arc::new(Mutex::new(Log::default()));
        let before: Vec<u64> = self
            .paths
            .iter()
            .map(|p| self.net.stats(p.id, p.up).delivered_bytes)
            .collect();
        let sends =
            self.devices
                .iter()
                .zip(&self.jitter)
                .enumerate()
                .map(|(i, (sessions, jitter))| {
                    // Request k of device i goes on session (i + k) mod sessions: with both classes,
                    // half the devices start with a priority request and half with a best-effort
                    // one, so neither class alone pays for the cold start of the first requests.
                    let session = move |k: usize| &sessions[(i + k) % sessions.len()];
                    let (body, log) = (body.clone(), log.clone());
                    async move {
                        tokio::time::sleep_until(begin + *jitter).await;
                        let requests = g.file_bytes.map(|b| (b as usize).div_ceil(g.body_bytes));
                        match (requests, g.interval_ms) {
                            (Some(n), None) => {
                                let next = AtomicUsize::new(0);
                                let lanes = (0..g.pipelining.min(n.max(1))).map(|_| async {
                                    loop {
                                        let k = next.fetch_add(1, Ordering::Relaxed);
                                        if k >= n {
                                            break;
                                        }
                                        if Instant::now() >= clock.deadline {
                                            // This request and every one not yet claimed.
                                            let rest =
                                                n.saturating_sub(next.swap(n, Ordering::Relaxed));
                                            log.lock().expect("lock").unfinished += 1 + rest;
                                            break;
                                        }
                                        send(session(k), body.clone(), &log, clock).await;
                                    }
                                });
                                futures_util::future::join_all(lanes).await;
                            }
                            (_, Some(every_ms)) => {
                                let every = secs(every_ms / 1000.0);
                                let mut k = 0u32;
                                loop {
                                    let at = begin + *jitter + every * k;
                                    // A device sends at its next slot once its previous request
                                    // is answered (one in flight); nothing after the deadline.
                                    if at >= clock.deadline
                                        || Instant::now() >= clock.deadline
                                        || requests.is_some_and(|n| k as usize >= n)
                                    {
                                        break;
                                    }
                                    tokio::time::sleep_until(at).await;
                                    send(session(k as usize), body.clone(), &log, clock).await;
                                    k += 1;
                                }
                            }
                            (None, None) => {}
                        }
                    }
                });
        let gw = self.running.gateway.clone();
        let n = self.paths.len();
        let done = std::sync::atomic::AtomicBool::new(false);
        let spool = self.spool.as_ref().map(|s| s.0.clone());
        let held = |s: &qgate_spool::Spool| {
            let v = s.view();
            v.priority.held.records + v.best_effort.held.records
        };
        let all_sent = async {
            futures_util::future::join_all(sends).await;
            // What the spool holds is not delivered yet: wait for it, until the deadline.
            if let Some(s) = &spool {
                while held(s) > 0 && Instant::now() < clock.deadline {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            done.store(true, Ordering::Relaxed);
            clock.t()
        };
        let net = self.net.clone();
        let paths = &self.paths;
        // A path's capacity now, bit/s (its rate may change on the timeline; down = none).
        let capacity = move |p: &PathLink| {
            let params = net.params(p.id, p.up);
            match (params.up, params.rate_bps) {
                (false, _) => 0.0,
                (true, Some(r)) => r as f64,
                (true, None) => f64::NAN,
            }
        };
        // The paths' RTT estimates, and their capacity summed, once a second until every
        // device is done.
        let sampler = async {
            let mut spool_series = Vec::new();
            let mut series = vec![Vec::new(); n];
            let mut bits = vec![0.0f64; n];
            let mut last = 0.0;
            for sec in 1u64.. {
                let at = clock.start + Duration::from_secs(sec);
                if at > clock.deadline {
                    break;
                }
                tokio::time::sleep_until(at).await;
                if done.load(Ordering::Relaxed) {
                    break;
                }
                for (k, p) in paths.iter().enumerate() {
                    bits[k] += capacity(p);
                }
                last = sec as f64;
                if let Some(s) = &spool {
                    spool_series.push((sec as f64, held(s) as f64));
                }
                let table = gw.paths().table();
                for (k, p) in table.paths().iter().enumerate().take(n) {
                    if let Some(rtt) = p.rtt {
                        series[k].push((sec as f64, rtt.as_secs_f64() * 1000.0));
                    }
                }
            }
            (series, bits, last, spool_series)
        };
        let (end, (rtts, mut bits, last, spool_series)) = tokio::join!(all_sent, sampler);
        for (k, p) in self.paths.iter().enumerate() {
            bits[k] += capacity(p) * (end - last).max(0.0);
        }
        let log = std::mem::take(&mut *log.lock().expect("lock"));
        let mut m = Measurements::default();
        let sample = |f: &dyn Fn(&Answer) -> bool| -> Vec<(f64, f64)> {
            log.answers
                .iter()
                .filter(|a| f(a))
                .map(|a| (a.0, a.1))
                .collect()
        };
        m.samples.push(("response_ms".into(), sample(&|_| true)));
        m.samples.push(("priority_ms".into(), sample(&|a| a.2)));
        m.samples.push(("best_effort_ms".into(), sample(&|a| !a.2)));
        m.scalars
            .push(("requests".into(), log.answers.len() as f64));
        m.scalars.push(("failed".into(), log.failed as f64));
        m.scalars.push(("unfinished".into(), log.unfinished as f64));
        if let (true, Some(first), false) = (
            g.file_bytes.is_some(),
            log.first_sent,
            log.answers.is_empty(),
        ) {
            m.scalars.push(("total_s".into(), log.last_done - first));
        }
        let answered = log.answers.len().max(1) as f64;
        let prio = log.answers.iter().filter(|a| a.2).count().max(1) as f64;
        let table = self.running.gateway.paths().table();
        for (k, p) in self.paths.iter().enumerate() {
            let on = |a: &&Answer| a.3 == Some(k);
            let share = log.answers.iter().filter(on).count() as f64 / answered;
            let pshare = log.answers.iter().filter(on).filter(|a| a.2).count() as f64 / prio;
            m.scalars.push((format!("path{}_share", k + 1), share));
            m.scalars
                .push((format!("path{}_priority_share", k + 1), pshare));
            if bits[k].is_finite() && bits[k] > 0.0 {
                let bytes = self.net.stats(p.id, p.up).delivered_bytes - before[k];
                let util = bytes as f64 * 8.0 / bits[k];
                m.scalars.push((format!("path{}_util", k + 1), util));
            }
            let series = rtts[k].clone();
            let mean = if series.is_empty() {
                table.paths()[k].rtt.map(|r| r.as_secs_f64() * 1000.0)
            } else {
                Some(series.iter().map(|x| x.1).sum::<f64>() / series.len() as f64)
            };
            if let Some(mean) = mean {
                m.scalars.push((format!("path{}_rtt_ms", k + 1), mean));
            }
            m.series.push((format!("path{}_rtt_ms", k + 1), series));
        }
        if let Some((s, dir)) = &self.spool {
            let snap = s.stats().snapshot();
            m.scalars.push(("spooled".into(), snap.spooled as f64));
            m.scalars.push(("drained".into(), snap.drained as f64));
            m.scalars.push(("spool_left".into(), held(s) as f64));
            // The last second the spool went from holding records to empty (at the end, if
            // it emptied after the sampler stopped).
            let peak = spool_series.iter().any(|x| x.1 > 0.0);
            let empty = spool_series
                .windows(2)
                .filter(|w| w[0].1 > 0.0 && w[1].1 == 0.0)
                .map(|w| w[1].0)
                .next_back()
                .or((peak && held(s) == 0).then_some(end));
            if let Some(t) = empty {
                m.scalars.push(("spool_empty_s".into(), t));
            }
            m.series.push(("spool_held".into(), spool_series));
            let _ = std::fs::remove_dir_all(dir);
        }
        m
    }
}

/// Send one request on session `(d, prio)` and log its outcome.
async fn send((d, prio): &(Device, bool), body: Bytes, log: &Mutex<Log>, clock: &Clock) {
    let t = clock.t();
    {
        let mut l = log.lock().expect("lock");
        l.first_sent = Some(l.first_sent.map_or(t, |f| f.min(t)));
    }
    let r = d.send("/ingest/plan", body).await;
    let mut l = log.lock().expect("lock");
    match r {
        Ok(s) => {
            l.answers
                .push((t, s.delay.as_secs_f64() * 1000.0, *prio, s.path));
            l.last_done = l.last_done.max(clock.t());
        }
        Err(_) => l.failed += 1,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn priority_fraction_spreads_the_class() {
        let pick = |f: f64| {
            (0..8)
                .filter(|&i| super::is_priority(i, f))
                .collect::<Vec<_>>()
        };
        assert_eq!(pick(0.5), [0, 2, 4, 6]);
        assert_eq!(pick(1.0), [0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(pick(0.0), Vec::<usize>::new());
        assert_eq!(pick(0.25), [0, 4]);
    }
}
