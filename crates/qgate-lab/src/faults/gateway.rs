//! The gateway under faults and hostile peers: devices —(1 Gbit/s, 1 ms)— gateway ==three
//! backhaul paths (100/75/50 Mbit/s, 10/20/30 ms)== ingest server, all real components on the
//! simulated network in virtual time. Each device sends one numbered record every 200 ms to its
//! own stream and retries a record until the gateway answers 201 (a device keeps what was not
//! acknowledged). The server is the real ingest service; a tap in front of it notes which
//! records its sink stored (a duplicate answered from its de-duplication table is not stored
//! again), and it survives the server's restart as a disk would. A record can be stored twice
//! when the server's de-duplication cannot see the copy: across a restart (its table is in
//! memory), or when the gateway gave up on a request the server had stored and the device's
//! retry came as a new request with a new id. Lost (acknowledged, never stored) checks that the
//! chain device → gateway → server acknowledges only what was stored.
//!
//! Timeline (s from the start of the workload): path 1 flaps 10–20 (down 2 s, up 2 s); every
//! path loses 15 % of its packets 25–30; the server restarts at 35 (back at 37); hostile peers
//! 40–50 (a connection registering every 10 ms, 2 000 garbage datagrams/s at the device port);
//! records stop at 60; devices retry what is pending for up to 10 s more.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use qgate_forward::batch;
use qgate_gateway::device::Device;
use qgate_gateway::gateway::{Gateway, GatewayConfig};
use qgate_netsim::topology::{LinkChange, LinkSpec};
use qgate_netsim::{HostId, LinkId, LossModel, Network, World};
use qgate_server::{CountSink, IngestService, ServerStats};
use qgate_transport::http3::{H3Client, Handler, ServeLimits, ALPN_H3};
use qgate_transport::{
    client_config, connect, endpoint, server_endpoint, DevPki, Identity, Socket, TransportOptions,
};
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::{recovered_after, Outcome, Recovery};

/// A record is sent every this long by each device.
const PERIOD: Duration = Duration::from_millis(200);
/// Records are offered for this long.
const WORKLOAD: Duration = Duration::from_secs(60);
/// Then devices retry what is pending for at most this long.
const DRAIN: Duration = Duration::from_secs(10);
/// The server is down this long when it restarts.
const RESTART_GAP: Duration = Duration::from_secs(2);

fn s(x: f64) -> Duration {
    Duration::from_secs_f64(x)
}

/// Records the ingest service stored, per (stream, record number), across server restarts.
type Stored = Arc<Mutex<HashMap<(String, u64), u32>>>;

/// The real ingest service with an observer in front: a 201 that is not a de-duplicated copy
/// means the sink stored the body.
struct Tap {
    service: Arc<IngestService>,
    stored: Stored,
}

impl Handler for Tap {
    async fn handle(&self, req: Request<()>, body: Bytes, peer: SocketAddr) -> Response<Bytes> {
        let number = |b: &[u8]| std::str::from_utf8(b).ok()?.parse::<u64>().ok();
        // A gateway's batch (decision G23): each entry as the request it stands for.
        let records: Vec<(String, Option<u64>)> = if req.uri().path() == batch::BATCH_PATH {
            batch::parse_entries(&body)
                .map(|es| {
                    es.iter()
                        .map(|e| {
                            (
                                String::from_utf8_lossy(e.target).into_owned(),
                                number(e.body),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default()
        } else {
            vec![(req.uri().path().to_string(), number(&body))]
        };
        let batched = req.uri().path() == batch::BATCH_PATH;
        let resp = self.service.handle(req, body, peer).await;
        let answers: Vec<(u16, &[u8])> = if batched {
            batch::parse_results(resp.body(), records.len())
                .map(|rs| rs.iter().map(|r| (r.status, r.body)).collect())
                .unwrap_or_default()
        } else {
            vec![(resp.status().as_u16(), &resp.body()[..])]
        };
        let mut stored = self.stored.lock().expect("tap");
        for ((stream, n), (status, answer)) in records.into_iter().zip(answers) {
            let duplicate = answer.windows(9).any(|w| w == b"duplicate");
            if let (201, false, Some(n)) = (status, duplicate, n) {
                *stored.entry((stream, n)).or_insert(0) += 1;
            }
        }
        drop(stored);
        resp
    }
}

/// One run of the server: its endpoint and accept loop.
struct ServerRun {
    endpoint: quinn::Endpoint,
    task: tokio::task::JoinHandle<()>,
}

/// Start the ingest server (a fresh process: new de-duplication table, new connections) on
/// `host` port 443; waits for the port while a previous run still holds it.
async fn start_server(
    net: &Network,
    host: HostId,
    identity: &Identity,
    opts: &TransportOptions,
    stored: &Stored,
    seed: u64,
) -> ServerRun {
    let socket = loop {
        match net.bind(host, "0.0.0.0:443".parse().expect("addr")) {
            Ok(sock) => break sock,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let cfg = qgate_transport::server_config(identity, &[ALPN_H3], opts).expect("server config");
    // As `qgate server` makes it: a restart resets the previous run's connections (T11).
    let endpoint = server_endpoint(
        Socket::from(socket),
        cfg,
        identity,
        Some(seed),
        &Default::default(),
    )
    .expect("endpoint");
    let service = Arc::new(IngestService::new(Arc::new(CountSink::new())));
    let stats: Arc<ServerStats> = service.stats();
    let tap = Arc::new(Tap {
        service,
        stored: stored.clone(),
    });
    let task = tokio::spawn(qgate_server::serve_with(
        endpoint.clone(),
        tap,
        stats,
        ServeLimits::default(),
        None,
        qgate_core::quota::Quota::new(
            qgate_server::DEFAULT_MAX_CONNECTIONS,
            qgate_server::DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
        ),
    ));
    ServerRun { endpoint, task }
}

impl ServerRun {
    /// Stop as a process would: its connections close, its state is gone.
    fn stop(self) {
        self.endpoint.close(0u32.into(), b"restarting");
        self.task.abort();
    }
}

/// Run the scenario with `seed`; `quick` has 10 devices instead of 50.
pub async fn run(seed: u64, quick: bool) -> Outcome {
    let n = if quick { 10 } else { 50 };
    // Paper 000's three backhaul paths, built like any plan's network (decision X6).
    let topology = crate::papers::paper000::three_paths(LossModel::None);
    let mut world = World::build(&topology, seed).expect("a valid topology");
    let net = world.net.clone();
    let (g, srv) = (
        world.host("gateway").expect("built"),
        world.host("server").expect("built"),
    );
    let pki = DevPki::generate(&[]).expect("PKI");
    let opts = TransportOptions {
        keep_alive_ms: Some(1000),
        ..Default::default()
    };
    let paths: Vec<LinkId> = ["p1", "p2", "p3"]
        .iter()
        .map(|p| world.link(p).expect("built").id)
        .collect();
    let stored: Stored = Arc::default();
    let server = start_server(&net, srv, &pki.server, &opts, &stored, seed).await;
    let mut builder = Gateway::builder()
        .with_config(GatewayConfig {
            request_timeout: Duration::from_secs(2),
            ..Default::default()
        })
        .with_transport(opts.clone())
        .with_identity(pki.server.clone())
        .with_server_trust(pki.trust())
        .with_seed(seed)
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
    let gw = running.gateway.clone();
    let ccfg = client_config(&pki.trust(), &[ALPN_H3], &opts).expect("config");
    tokio::time::sleep(Duration::from_secs(1)).await; // paths connected and measured

    // Devices and the hostile host, each on its own link to the gateway.
    let mut access = |name: &str, k: usize| {
        let (hi, lo) = (8 + (k / 200) as u8, (k % 200) as u8);
        let mut spec = LinkSpec::new(
            &format!("access-{name}"),
            name,
            "gateway",
            LinkChange {
                rate_mbps: Some(1000.0),
                delay_ms: Some(1.0),
                ..Default::default()
            },
        );
        spec.a_addr = Some(IpAddr::V4(Ipv4Addr::new(10, hi, lo, 2)));
        spec.b_addr = Some(IpAddr::V4(Ipv4Addr::new(10, hi, lo, 1)));
        world.add_host(name, false).expect("fresh");
        let l = world.add_link(&spec).expect("fresh");
        (
            l.a.0,
            SocketAddr::new(l.a.1, 0),
            SocketAddr::new(l.b.1, 443),
        )
    };
    let mut keep = Vec::new();
    let mut devices = Vec::new();
    for i in 0..n {
        let (h, local, gw_addr) = access(&format!("dev{i}"), i);
        let ep = endpoint(
            Socket::from(net.bind(h, local).expect("port")),
            None,
            Some(seed * 1000 + i as u64),
        )
        .expect("endpoint");
        let conn = connect(&ep, &ccfg, gw_addr, "localhost", false)
            .await
            .expect("device connects");
        let h3 = H3Client::new(conn.connection().clone())
            .await
            .expect("HTTP/3");
        devices.push(Device::register(h3, i % 2 == 0).await.expect("registers"));
        keep.push(ep);
    }
    let (mallory, mallory_local, mallory_gw) = access("mallory", n);

    let start = Instant::now();
    let at = move |x: f64| start + s(x);
    let mut recoveries = vec![
        Recovery {
            kind: "path 1 flaps (down 2 s, up 2 s)",
            fault: "path 1 flaps (down 2 s, up 2 s)".into(),
            start_s: 10.0,
            end_s: 20.0,
            recovery_s: None,
        },
        Recovery {
            kind: "15 % loss on every path",
            fault: "15 % loss on every path".into(),
            start_s: 25.0,
            end_s: 30.0,
            recovery_s: None,
        },
        Recovery {
            kind: "server restart",
            fault: "server restart".into(),
            start_s: 35.0,
            end_s: 35.0 + RESTART_GAP.as_secs_f64(),
            recovery_s: None,
        },
        Recovery {
            kind: "hostile peers (registration loop, garbage datagrams)",
            fault: "hostile peers (registration loop, garbage datagrams)".into(),
            start_s: 40.0,
            end_s: 50.0,
            recovery_s: None,
        },
    ];

    // Faults.
    let faults = {
        let (net, paths, stored) = (net.clone(), paths.clone(), stored.clone());
        let (identity, opts) = (pki.server.clone(), opts.clone());
        tokio::spawn(async move {
            for k in 0..5 {
                let t = 10.0 + 4.0 * f64::from(k);
                tokio::time::sleep_until(at(t)).await;
                net.update_both(paths[0], |l| l.up = false).expect("link");
                tokio::time::sleep_until(at(t + 2.0)).await;
                net.update_both(paths[0], |l| l.up = true).expect("link");
            }
            tokio::time::sleep_until(at(25.0)).await;
            for p in &paths {
                net.update_both(*p, |l| l.loss = LossModel::Bernoulli { p: 0.15 })
                    .expect("link");
            }
            tokio::time::sleep_until(at(30.0)).await;
            for p in &paths {
                net.update_both(*p, |l| l.loss = LossModel::None)
                    .expect("link");
            }
            tokio::time::sleep_until(at(35.0)).await;
            server.stop();
            tokio::time::sleep(RESTART_GAP).await;
            start_server(&net, srv, &identity, &opts, &stored, seed + 7).await
        })
    };
    let hostile = {
        let (net, ccfg) = (net.clone(), ccfg.clone());
        tokio::spawn(async move {
            tokio::time::sleep_until(at(40.0)).await;
            let ep = endpoint(
                Socket::from(net.bind(mallory, mallory_local).expect("port")),
                None,
                Some(seed + 99),
            )
            .expect("endpoint");
            let garbage = net
                .bind(mallory, SocketAddr::new(mallory_local.ip(), 9))
                .expect("port");
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let mut refused = 0u64;
            let mut registered = 0u64;
            let conn = connect(&ep, &ccfg, mallory_gw, "localhost", false)
                .await
                .ok()
                .map(|c| c.connection().clone());
            let h3 = match conn {
                Some(c) => H3Client::new(c).await.ok(),
                None => None,
            };
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            while Instant::now() < at(50.0) {
                tick.tick().await;
                // 20 garbage datagrams per 10 ms: 2 000/s.
                for _ in 0..20 {
                    let len = rng.random_range(1..1300);
                    let junk: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                    let _ = garbage.send_to(&junk, mallory_gw);
                }
                if let Some(h3) = &h3 {
                    let req = Request::post("https://gw/register")
                        .body(())
                        .expect("request");
                    match h3.request(req, Bytes::new(), 4096).await {
                        Ok(r) if r.status == StatusCode::CREATED => registered += 1,
                        Ok(_) => refused += 1,
                        Err(_) => {}
                    }
                }
            }
            drop(ep);
            (registered, refused)
        })
    };

    // The workload: every device, one record per period, each retried until acknowledged.
    let acked: Arc<Mutex<Vec<(usize, u64, f64)>>> = Arc::default();
    let offered = Arc::new(Mutex::new(0u64));
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
    let sends = devices.iter().enumerate().map(|(i, d)| {
        let phase = s(rng.random_range(0.0..PERIOD.as_secs_f64()));
        let (acked, offered) = (acked.clone(), offered.clone());
        async move {
            let stream = format!("/ingest/d{i}");
            let mut seq = 0u64;
            loop {
                let due = start + phase + PERIOD * seq as u32;
                if due >= start + WORKLOAD {
                    break;
                }
                tokio::time::sleep_until(due).await;
                *offered.lock().expect("offered") += 1;
                while Instant::now() < start + WORKLOAD + DRAIN {
                    let sent = d.send(&stream, Bytes::from(seq.to_string()));
                    match tokio::time::timeout(Duration::from_secs(10), sent).await {
                        Ok(Ok(_)) => {
                            let t = start.elapsed().as_secs_f64();
                            acked.lock().expect("acked").push((i, seq, t));
                            break;
                        }
                        _ => tokio::time::sleep(PERIOD).await,
                    }
                }
                seq += 1;
            }
        }
    });
    futures_util::future::join_all(sends).await;
    let server = faults.await.expect("faults ran");
    let (registered, refused) = hostile.await.expect("hostile ran");

    // What arrived.
    let acked = std::mem::take(&mut *acked.lock().expect("acked"));
    let stored = std::mem::take(&mut *stored.lock().expect("tap"));
    let offered = *offered.lock().expect("offered");
    let mut lost = 0u64;
    for (i, seq, _) in &acked {
        if !stored.contains_key(&(format!("/ingest/d{i}"), *seq)) {
            lost += 1;
        }
    }
    let duplicated: u64 = stored.values().map(|c| u64::from(c - 1)).sum();
    let mut ok: Vec<f64> = acked.iter().map(|a| a.2).collect();
    ok.sort_by(f64::total_cmp);
    // Recovered: a 1 s window with at least 80 % of the offered rate answered.
    let need = ((n as f64 / PERIOD.as_secs_f64()) * 0.8).floor() as usize;
    let mut counters = Vec::new();
    for r in &mut recoveries {
        r.recovery_s = recovered_after(&ok, r.end_s, 1.0, need);
        let during = ok
            .iter()
            .filter(|t| **t >= r.start_s && **t < r.end_s)
            .count() as f64;
        let rate = during / (r.end_s - r.start_s) / (n as f64 / PERIOD.as_secs_f64());
        counters.push((
            format!("answered during \"{}\", % of offered", r.fault),
            100.0 * rate,
        ));
    }
    let st = &gw.stats;
    let load =
        |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed) as f64;
    counters.extend([
        ("devices".to_string(), n as f64),
        ("hostile registrations accepted".into(), registered as f64),
        ("hostile registrations refused".into(), refused as f64),
        ("gateway: attempts retried".into(), load(&st.retried)),
        ("gateway: attempts timed out".into(), load(&st.timeouts)),
        (
            "gateway: requests failed on every path".into(),
            load(&st.failed),
        ),
        (
            "gateway: batches to the server (G23)".into(),
            load(&gw.batch_stats.batches),
        ),
        (
            "gateway: records in those batches".into(),
            load(&gw.batch_stats.batched),
        ),
        (
            "gateway: sessions".into(),
            gw.metrics()
                .lines()
                .find_map(|l| l.strip_prefix("qgate_gateway_sessions ")?.parse().ok())
                .unwrap_or(f64::NAN),
        ),
    ]);
    server.stop();
    drop(keep);
    Outcome {
        scenario: "gateway",
        seed,
        accepted: acked.len() as u64,
        delivered: acked.len() as u64 - lost,
        lost,
        duplicated,
        pending: offered - acked.len() as u64,
        recoveries,
        counters,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn quick_run_loses_nothing_and_recovers_from_every_fault() {
        let o = crate::virtual_time(super::run(1, true));
        eprintln!("{o:#?}");
        assert!(o.accepted > 2000, "{o:?}");
        assert_eq!(o.lost, 0, "{o:?}");
        assert_eq!(o.delivered, o.accepted);
        for r in &o.recoveries {
            assert!(r.recovery_s.is_some(), "{r:?}");
        }
    }
}
