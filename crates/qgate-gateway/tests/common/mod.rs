//! Test worlds: devices → gateway → three backhaul paths → server, over netsim in virtual time,
//! and the same on loopback UDP in real time (shared by the gateway's test files).
#![allow(dead_code)] // each test binary uses its own part

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use qgate_gateway::builder::{GatewayBuilder, RunningGateway};
use qgate_gateway::gateway::{Gateway, GatewayConfig, HASH_ID_HEADER, PRIORITY_HEADER};
use qgate_netsim::topology::{LinkChange, LinkSpec};
use qgate_netsim::{LinkId, Network, World as SimWorld};
use qgate_server::ServerStats;
use qgate_transport::http3::{self, H3Client, Handler, ServeLimits, ALPN_H3};
use qgate_transport::{
    client_config, connect, endpoint, server_config, DevPki, Socket, TransportOptions,
};

/// A gateway builder with the test PKI on both sides.
fn builder(
    cfg: GatewayConfig,
    sched: &str,
    pki: &DevPki,
    opts: &TransportOptions,
) -> GatewayBuilder {
    Gateway::builder()
        .with_config(cfg)
        .with_scheduler(sched)
        .unwrap()
        .with_transport(opts.clone())
        .with_identity(pki.server.clone())
        .with_server_trust(pki.trust())
}

pub struct World {
    pub net: Network,
    pub backhaul: Vec<LinkId>,
    pub gateway: Arc<Gateway>,
    _running: RunningGateway,
    pub server: Arc<ServerStats>,
    pub devices: Vec<Arc<H3Client>>,
    /// The devices' client configuration (its ticket cache lets them come back in 0-RTT) and
    /// each device's endpoint.
    pub device_cfg: quinn::ClientConfig,
    pub device_eps: Vec<quinn::Endpoint>,
    /// Each device's host (device i is 10.8.i.2, the gateway 10.8.i.1 on its link).
    pub device_hosts: Vec<qgate_netsim::HostId>,
}

/// The server at the far end of the backhaul.
pub enum Far {
    /// qgate's counting ingest server.
    Counting,
    /// A server that holds `/ingest/slow` for a minute and answers the rest at once (201);
    /// it counts the requests it saw cancelled.
    Slow(Arc<Slow>),
}

/// See [`Far::Slow`].
#[derive(Default)]
pub struct Slow {
    pub answered: AtomicU64,
}

impl Handler for Slow {
    async fn handle(&self, req: Request<()>, _body: Bytes, _peer: SocketAddr) -> Response<Bytes> {
        if req.uri().path() == "/ingest/slow" {
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
        self.answered.fetch_add(1, Ordering::Relaxed);
        Response::builder()
            .status(StatusCode::CREATED)
            .body(Bytes::new())
            .unwrap()
    }
}

/// `n` devices (even ones priority) on their own 1 Gbit/s / 1 ms links to the gateway; three
/// backhaul paths of 100/75/50 Mbit/s with 10/20/30 ms one-way delay; the gateway configured
/// by `cfg` (request timeout 500 ms unless `cfg` says otherwise).
pub async fn world_with(n: usize, sched: &str, cfg: GatewayConfig, far: Far) -> World {
    world_with_lanes(n, sched, cfg, far, 1).await
}

/// [`world_with`], each backhaul path with `lanes` QUIC connections (decision G21).
pub async fn world_with_lanes(
    n: usize,
    sched: &str,
    cfg: GatewayConfig,
    far: Far,
    lanes: usize,
) -> World {
    world_built(n, sched, cfg, far, lanes, None).await
}

/// [`world`] with the gateway keeping what no path can take in `spool` (issue 50).
pub async fn world_spooled(n: usize, sched: &str, spool: qgate_spool::Spool) -> World {
    let cfg = GatewayConfig {
        request_timeout: Duration::from_millis(500),
        ..Default::default()
    };
    world_built(n, sched, cfg, Far::Counting, 1, Some(spool)).await
}

async fn world_built(
    n: usize,
    sched: &str,
    cfg: GatewayConfig,
    far: Far,
    lanes: usize,
    spool: Option<qgate_spool::Spool>,
) -> World {
    // Built through qgate_netsim's World (the plans' assembly path): paths 1–3 get the
    // automatic addresses 10.0.k.1 (gateway) and 10.0.k.2 (server).
    let mut sim = SimWorld::new(7);
    let g = sim.add_host("gateway", false).unwrap();
    let s = sim.add_host("server", false).unwrap();
    let pki = DevPki::generate(&[]).unwrap();
    let opts = TransportOptions {
        keep_alive_ms: Some(1000),
        ..Default::default()
    };
    let mut backhaul = Vec::new();
    for (k, rate_mbps) in [(1u8, 100.0), (2, 75.0), (3, 50.0)] {
        let link = LinkChange {
            rate_mbps: Some(rate_mbps),
            delay_ms: Some(10.0 * f64::from(k)),
            ..Default::default()
        };
        let spec = LinkSpec::new(&format!("path{k}"), "gateway", "server", link);
        backhaul.push(sim.add_link(&spec).unwrap().id);
    }
    let net = sim.net.clone();
    let server_socket = Socket::from(net.bind(s, "0.0.0.0:443".parse().unwrap()).unwrap());
    let server = match far {
        Far::Counting => {
            qgate_server::Server::builder()
                .socket(server_socket)
                .identity(&pki.server)
                .transport(opts.clone())
                .seed(1)
                .start()
                .unwrap()
                .stats
        }
        Far::Slow(handler) => {
            let stats = Arc::new(ServerStats::default());
            let probe_stats = stats.clone();
            let ep = endpoint(
                server_socket,
                Some(server_config(&pki.server, &[ALPN_H3], &opts).unwrap()),
                Some(1),
            )
            .unwrap();
            tokio::spawn(async move {
                while let Some(inc) = ep.accept().await {
                    let (handler, stats) = (handler.clone(), probe_stats.clone());
                    tokio::spawn(async move {
                        if let Ok(c) = inc.await {
                            tokio::spawn(qgate_server::answer_probes(c.clone(), stats));
                            let _ =
                                http3::serve_connection(c, handler, ServeLimits::default()).await;
                        }
                    });
                }
            });
            stats
        }
    };

    let mut builder = builder(cfg, sched, &pki, &opts)
        .with_seed(1)
        .with_device_socket(Socket::from(
            net.bind(g, "0.0.0.0:443".parse().unwrap()).unwrap(),
        ));
    for k in 1..=3u8 {
        let local: SocketAddr = format!("10.0.{k}.1:0").parse().unwrap();
        let remote: SocketAddr = format!("10.0.{k}.2:443").parse().unwrap();
        let options = qgate_gateway::builder::PathOptions {
            connections: Some(lanes),
            ..Default::default()
        };
        builder = builder.with_backhaul(Socket::from(net.bind(g, local).unwrap()), remote, options);
    }
    if let Some(s) = spool {
        builder = builder.with_spool(s);
    }
    let running = builder.start().unwrap();
    let gateway = running.gateway.clone();
    tokio::time::sleep(Duration::from_secs(1)).await; // paths measured

    let dcfg = client_config(&pki.trust(), &[ALPN_H3], &opts).unwrap();
    let mut devices = Vec::new();
    let mut device_eps = Vec::new();
    let mut device_hosts = Vec::new();
    for i in 0..n {
        let name = format!("dev{i}");
        let h = sim.add_host(&name, false).unwrap();
        device_hosts.push(h);
        let access = LinkChange {
            rate_mbps: Some(1000.0),
            delay_ms: Some(1.0),
            ..Default::default()
        };
        let mut spec = LinkSpec::new(&format!("{name}-access"), &name, "gateway", access);
        spec.a_addr = Some(format!("10.8.{i}.2").parse().unwrap());
        spec.b_addr = Some(format!("10.8.{i}.1").parse().unwrap());
        sim.add_link(&spec).unwrap();
        let ep = endpoint(
            Socket::from(
                net.bind(h, format!("10.8.{i}.2:0").parse().unwrap())
                    .unwrap(),
            ),
            None,
            Some(100 + i as u64),
        )
        .unwrap();
        let gw_addr: SocketAddr = format!("10.8.{i}.1:443").parse().unwrap();
        let conn = connect(&ep, &dcfg, gw_addr, "localhost", false)
            .await
            .unwrap();
        devices.push(Arc::new(
            H3Client::new(conn.connection().clone()).await.unwrap(),
        ));
        device_eps.push(ep);
    }
    World {
        net,
        backhaul,
        gateway,
        _running: running,
        server,
        devices,
        device_cfg: dcfg,
        device_eps,
        device_hosts,
    }
}

/// [`world_with`] the counting server and a 500 ms request timeout.
pub async fn world(n: usize, sched: &str) -> World {
    let cfg = GatewayConfig {
        request_timeout: Duration::from_millis(500),
        ..Default::default()
    };
    world_with(n, sched, cfg, Far::Counting).await
}

/// Register; the status and the Hash ID (empty when refused).
pub async fn try_register(d: &H3Client, priority: u8) -> (StatusCode, String) {
    let r = d
        .request(
            Request::post("https://gw/register")
                .header(PRIORITY_HEADER, priority.to_string())
                .body(())
                .unwrap(),
            Bytes::new(),
            4096,
        )
        .await
        .unwrap();
    let body = String::from_utf8_lossy(&r.body).to_string();
    let hash = if r.status == StatusCode::CREATED {
        body.split('"').nth(3).unwrap().to_string()
    } else {
        String::new()
    };
    (r.status, hash)
}

/// Register, which must succeed; the Hash ID.
pub async fn register(d: &H3Client, priority: u8) -> String {
    let (status, hash) = try_register(d, priority).await;
    assert_eq!(status, 201);
    hash
}

/// Send 1 KiB to `/ingest/data`; the status and the path the gateway used.
pub async fn send(d: &H3Client, hash: &str) -> (StatusCode, Option<usize>) {
    send_to(d, hash, "/ingest/data").await
}

/// Send 1 KiB to `target`; the status and the path the gateway used.
pub async fn send_to(d: &H3Client, hash: &str, target: &str) -> (StatusCode, Option<usize>) {
    let r = d
        .request(
            Request::post(format!("https://gw{target}"))
                .header(HASH_ID_HEADER, hash)
                .body(())
                .unwrap(),
            Bytes::from(vec![1u8; 1024]),
            4096,
        )
        .await
        .unwrap();
    (
        r.status,
        r.headers
            .get("qgate-path")
            .and_then(|v| v.to_str().ok()?.parse().ok()),
    )
}

/// The gateway's metrics text, as its admin port serves it.
pub async fn metrics(w: &World) -> String {
    w.gateway.metrics()
}

/// Panic unless every line of `want` is in `metrics`.
pub fn assert_metrics(metrics: &str, want: &[&str]) {
    for line in want {
        assert!(metrics.contains(line), "missing '{line}' in:\n{metrics}");
    }
}

/// A gateway on loopback UDP: the server on 127.0.0.1, backhaul paths bound to local addresses,
/// the device listener on 127.0.0.1.
pub struct Loopback {
    pub gw: Arc<Gateway>,
    _running: RunningGateway,
    pub addr: SocketAddr,
    pub trust: qgate_transport::TrustRoots,
    pub stats: Arc<ServerStats>,
    /// Where MQTT clients reach the gateway, if it has an MQTT door.
    pub mqtt: Option<SocketAddr>,
    /// The door's TLS and QUIC listeners, if it has a door.
    pub mqtt_tls: Option<SocketAddr>,
    pub mqtt_quic: Option<SocketAddr>,
}

/// [`Loopback`] with one backhaul path per address in `paths` (e.g. "127.0.0.2:0") and scheduler
/// `sched`; returns once every path is connected and measured.
pub async fn loopback(cfg: GatewayConfig, paths: &[&str], sched: &str) -> Loopback {
    loopback_shaped(cfg, paths, sched, None).await
}

/// [`loopback`] with every path's egress shaped to `shape`, if given.
pub async fn loopback_shaped(
    cfg: GatewayConfig,
    paths: &[&str],
    sched: &str,
    shape: Option<qgate_link::LinkParams>,
) -> Loopback {
    loopback_with(cfg, paths, sched, shape, None).await
}

/// [`loopback`] with an MQTT door configured by `mqtt` on 127.0.0.1 (any port) over TCP, TLS
/// and QUIC.
pub async fn loopback_mqtt(paths: &[&str], mqtt: qgate_gateway::mqtt::MqttConfig) -> Loopback {
    loopback_with(
        GatewayConfig::default(),
        paths,
        "round-robin",
        None,
        Some(mqtt),
    )
    .await
}

async fn loopback_with(
    cfg: GatewayConfig,
    paths: &[&str],
    sched: &str,
    shape: Option<qgate_link::LinkParams>,
    mqtt: Option<qgate_gateway::mqtt::MqttConfig>,
) -> Loopback {
    let pki = DevPki::generate(&[]).unwrap();
    let opts = TransportOptions::default();
    let sa = |s: &str| -> SocketAddr { s.parse().unwrap() };
    let server = qgate_server::Server::builder()
        .socket(Socket::bind_udp(sa("127.0.0.1:0")).unwrap())
        .identity(&pki.server)
        .transport(opts.clone())
        .start()
        .unwrap();
    let mut builder = builder(cfg, sched, &pki, &opts)
        .with_device_socket(Socket::bind_udp(sa("127.0.0.1:0")).unwrap());
    for l in paths {
        let socket = Socket::bind_udp(sa(l)).unwrap();
        builder = match &shape {
            Some(p) => builder.with_shaped_path(socket, server.addr(), p.clone()),
            None => builder.with_path(socket, server.addr()),
        };
    }
    if let Some(m) = mqtt {
        builder = builder
            .with_mqtt(sa("127.0.0.1:0"), m)
            .with_mqtt_tls(sa("127.0.0.1:0"))
            .with_mqtt_quic(sa("127.0.0.1:0"));
    }
    let running = builder.start().unwrap();
    assert!(running.paths_measured(Duration::from_secs(10)).await);
    let (gw, addr) = (running.gateway.clone(), running.addr());
    Loopback {
        gw,
        mqtt: running.mqtt_addr(),
        mqtt_tls: running.mqtt_tls_addr(),
        mqtt_quic: running.mqtt_quic_addr(),
        _running: running,
        addr,
        trust: pki.trust(),
        stats: server.stats.clone(),
    }
}
