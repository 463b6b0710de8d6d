//! `qgate-lab demo`: an ingest server and several HTTP/3 clients on the simulated network, in
//! virtual time, with a summary of response delays and throughput.
//!
//! Topology: client i —(access link)— router —(backbone link)— server.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hdrhistogram::Histogram;
use qgate_netsim::{Direction, LinkParams, LinkStats, Network};
use qgate_server::StatsSnapshot;
use qgate_transport::http3::{H3Client, ALPN_H3};
use qgate_transport::{client_config, connect, endpoint, DevPki, Socket, TransportOptions};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::stats::Summary;

/// What the demo runs. Every field has a default; a TOML `[demo]` table may override any.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DemoConfig {
    /// Number of clients (1–1000).
    pub clients: usize,
    /// Requests each client sends.
    pub requests: usize,
    /// Body bytes per request.
    pub body_bytes: usize,
    /// Time between a client's request starts, ms (requests overlap when responses are slow).
    pub interval_ms: u64,
    /// Each client's access link (both directions).
    pub access: LinkParams,
    /// The router–server link (both directions).
    pub backbone: LinkParams,
    /// Seed for every random choice.
    pub seed: u64,
    /// QUIC settings for clients and server.
    pub transport: TransportOptions,
}

impl Default for DemoConfig {
    fn default() -> Self {
        DemoConfig {
            clients: 8,
            requests: 50,
            body_bytes: 1024,
            interval_ms: 20,
            access: LinkParams::new(20_000_000, Duration::from_millis(5)),
            backbone: LinkParams::new(50_000_000, Duration::from_millis(20)),
            seed: 1,
            transport: TransportOptions::default(),
        }
    }
}

impl DemoConfig {
    /// Check ranges; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=1000).contains(&self.clients) {
            return Err(format!("demo.clients = {} must be 1..=1000", self.clients));
        }
        if !(1..=100_000).contains(&self.requests) {
            return Err(format!(
                "demo.requests = {} must be 1..=100000",
                self.requests
            ));
        }
        if self.body_bytes > 16 * 1024 * 1024 {
            return Err(format!(
                "demo.body_bytes = {} exceeds 16 MiB",
                self.body_bytes
            ));
        }
        if self.interval_ms == 0 {
            return Err("demo.interval_ms must be positive".into());
        }
        self.access
            .validate()
            .map_err(|e| format!("demo.access: {e}"))?;
        self.backbone
            .validate()
            .map_err(|e| format!("demo.backbone: {e}"))?;
        self.transport
            .validate()
            .map_err(|e| format!("demo.transport: {e}"))
    }
}

/// What the demo measured.
#[derive(Debug, Clone)]
pub struct DemoReport {
    /// The configuration run.
    pub config: DemoConfig,
    /// Requests answered 201.
    pub ok: u64,
    /// Requests that failed or got another status.
    pub failed: u64,
    /// Response delay (request sent → response received), ms.
    pub delay_ms: Summary,
    /// Median response delay, ms.
    pub delay_p50_ms: f64,
    /// 99th percentile response delay, ms.
    pub delay_p99_ms: f64,
    /// Largest response delay, ms.
    pub delay_max_ms: f64,
    /// QUIC + HTTP/3 setup time per client, ms.
    pub handshake_ms: Summary,
    /// Virtual time from the first request to the last response, s.
    pub virtual_secs: f64,
    /// Body bytes acknowledged by the server.
    pub bytes: u64,
    /// The backbone link toward the server.
    pub backbone_up: LinkStats,
    /// The server's counters.
    pub server: StatsSnapshot,
}

impl DemoReport {
    /// Acknowledged body bytes per virtual second, in Mbit/s.
    pub fn goodput_mbps(&self) -> f64 {
        self.bytes as f64 * 8.0 / self.virtual_secs / 1e6
    }
}

fn addr(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

/// Run the demo on a fresh simulated network. Call it inside a runtime with a paused clock
/// (see [`crate::virtual_time`]) for virtual time, or a normal one for real time.
pub async fn run(config: DemoConfig) -> Result<DemoReport, String> {
    config.validate()?;
    let net = Network::new(config.seed);
    let router = net.add_host("router");
    net.set_forwarding(router, true);
    let server_host = net.add_host("server");
    let r0 = net
        .add_interface(router, addr(10, 0, 0, 1))
        .map_err(|e| e.to_string())?;
    let s0 = net
        .add_interface(server_host, addr(10, 0, 0, 2))
        .map_err(|e| e.to_string())?;
    let backbone = net
        .connect_symmetric(r0, s0, config.backbone.clone())
        .map_err(|e| e.to_string())?;

    let pki = DevPki::generate(&[]).map_err(|e| e.to_string())?;
    let server_addr = SocketAddr::new(addr(10, 0, 0, 2), 443);
    let server = qgate_server::Server::builder()
        .socket(Socket::from(
            net.bind(server_host, server_addr)
                .map_err(|e| e.to_string())?,
        ))
        .identity(&pki.server)
        .transport(config.transport.clone())
        .seed(config.seed)
        .start()
        .map_err(|e| e.to_string())?;
    let server_stats = server.stats.clone();
    let ccfg =
        client_config(&pki.trust(), &[ALPN_H3], &config.transport).map_err(|e| e.to_string())?;

    let delays = Arc::new(Mutex::new(
        Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds"),
    ));
    let mut clients = Vec::new();
    let t0 = Instant::now();
    for i in 0..config.clients {
        let (hi, lo) = ((1 + i / 200) as u8, (i % 200) as u8);
        let host = net.add_host(&format!("client{i}"));
        let ci = net
            .add_interface(host, addr(10, hi, lo, 1))
            .map_err(|e| e.to_string())?;
        let ri = net
            .add_interface(router, addr(10, hi, lo, 2))
            .map_err(|e| e.to_string())?;
        net.connect_symmetric(ci, ri, config.access.clone())
            .map_err(|e| e.to_string())?;
        let sock = net
            .bind(host, SocketAddr::new(addr(10, hi, lo, 1), 0))
            .map_err(|e| e.to_string())?;
        let ep = endpoint(Socket::from(sock), None, Some(config.seed + 1 + i as u64))
            .map_err(|e| e.to_string())?;
        let (ccfg, delays, cfg) = (ccfg.clone(), delays.clone(), config.clone());
        clients.push(tokio::spawn(async move {
            client(ep, ccfg, server_addr, cfg, delays).await
        }));
    }
    let mut handshakes = Vec::new();
    let (mut ok, mut failed, mut bytes) = (0, 0, 0);
    for c in clients {
        match c.await {
            Ok(Ok(r)) => {
                handshakes.push(r.handshake_ms);
                ok += r.ok;
                failed += r.failed;
                bytes += r.bytes;
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "a demo client failed");
                failed += config.requests as u64;
            }
            Err(e) => return Err(format!("a demo client panicked: {e}")),
        }
    }
    let virtual_secs = t0.elapsed().as_secs_f64();
    server.endpoint.close(0u32.into(), b"demo over");
    server.task.abort();
    let h = delays.lock().expect("histogram lock");
    let us = |v: u64| v as f64 / 1000.0;
    let all: Vec<f64> = h
        .iter_recorded()
        .flat_map(|v| std::iter::repeat_n(us(v.value_iterated_to()), v.count_at_value() as usize))
        .collect();
    Ok(DemoReport {
        ok,
        failed,
        delay_ms: Summary::of(&all),
        delay_p50_ms: us(h.value_at_quantile(0.5)),
        delay_p99_ms: us(h.value_at_quantile(0.99)),
        delay_max_ms: us(h.max()),
        handshake_ms: Summary::of(&handshakes),
        virtual_secs,
        bytes,
        backbone_up: net.stats(backbone, Direction::BtoA),
        server: server_stats.snapshot(),
        config,
    })
}

struct ClientResult {
    handshake_ms: f64,
    ok: u64,
    failed: u64,
    bytes: u64,
}

async fn client(
    ep: quinn::Endpoint,
    cfg: quinn::ClientConfig,
    server: SocketAddr,
    config: DemoConfig,
    delays: Arc<Mutex<Histogram<u64>>>,
) -> Result<ClientResult, String> {
    let start = Instant::now();
    let conn = connect(&ep, &cfg, server, "localhost", false)
        .await
        .map_err(|e| e.to_string())?;
    let h3 = Arc::new(
        H3Client::new(conn.connection().clone())
            .await
            .map_err(|e| e.to_string())?,
    );
    let handshake_ms = start.elapsed().as_secs_f64() * 1000.0;
    let body = Bytes::from(vec![0x5au8; config.body_bytes]);
    let begin = Instant::now();
    let requests = (0..config.requests).map(|k| {
        let (h3, body, delays) = (h3.clone(), body.clone(), delays.clone());
        async move {
            tokio::time::sleep_until(begin + Duration::from_millis(config.interval_ms * k as u64))
                .await;
            let sent = Instant::now();
            let req = http::Request::post("https://localhost/ingest/demo")
                .body(())
                .expect("valid request");
            let len = body.len() as u64;
            match h3.request(req, body, 64 * 1024).await {
                Ok(r) if r.status == http::StatusCode::CREATED => {
                    let us = sent.elapsed().as_micros().max(1) as u64;
                    delays.lock().expect("histogram lock").saturating_record(us);
                    Some(len)
                }
                Ok(r) => {
                    tracing::warn!(status = %r.status, "demo request refused");
                    None
                }
                Err(e) => {
                    tracing::warn!(error = %e, "demo request failed");
                    None
                }
            }
        }
    });
    let results = futures_util::future::join_all(requests).await;
    h3.close();
    let ok = results.iter().flatten().count() as u64;
    Ok(ClientResult {
        handshake_ms,
        ok,
        failed: results.len() as u64 - ok,
        bytes: results.iter().flatten().sum(),
    })
}

impl fmt::Display for DemoReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        let mbps = |p: &LinkParams| {
            p.rate_bps.map_or("unlimited".to_string(), |r| {
                format!("{} Mbit/s", r as f64 / 1e6)
            })
        };
        writeln!(
            f,
            "qgate-lab demo — {} HTTP/3 clients → router → ingest server (simulated network, seed {})",
            c.clients, c.seed
        )?;
        writeln!(
            f,
            "  access   {} / {:?} one-way, loss {:.2} %",
            mbps(&c.access),
            c.access.delay,
            c.access.loss.mean_loss() * 100.0
        )?;
        writeln!(
            f,
            "  backbone {} / {:?} one-way, loss {:.2} %, queue {}",
            mbps(&c.backbone),
            c.backbone.delay,
            c.backbone.loss.mean_loss() * 100.0,
            c.backbone.queue
        )?;
        writeln!(
            f,
            "  load     {} requests × {} B per client, one every {} ms",
            c.requests, c.body_bytes, c.interval_ms
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "  requests answered    {} of {} ({} failed)",
            self.ok,
            self.ok + self.failed,
            self.failed
        )?;
        writeln!(f, "  handshake (QUIC+H3)  {:.1} ms", self.handshake_ms)?;
        writeln!(f, "  response delay       {:.2} ms", self.delay_ms)?;
        writeln!(
            f,
            "                       p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            self.delay_p50_ms, self.delay_p99_ms, self.delay_max_ms
        )?;
        writeln!(
            f,
            "  throughput           {:.3} Mbit/s of request bodies ({} bytes in {:.3} s virtual)",
            self.goodput_mbps(),
            self.bytes,
            self.virtual_secs
        )?;
        let b = &self.backbone_up;
        writeln!(f, "  backbone → server    {} packets sent, {} delivered, {} lost, {} queue drops, max queue {} packets", b.sent, b.delivered, b.dropped_loss, b.dropped_queue, b.max_queue_packets)?;
        write!(
            f,
            "  server               {} connections, {} requests, {} stored, {} errors",
            self.server.connections, self.server.requests, self.server.ingested, self.server.errors
        )
    }
}
