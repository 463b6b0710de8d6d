//! Device-facing side of the gateway (paper 000 §3.3–3.4): registration (Hash IDs), the
//! connection manager (scheduler + hits) and forwarding over the chosen backhaul path, retried
//! on another path with the same request id when a path fails.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use qgate_core::path::PathId;
use qgate_core::scheduler::{Priority, Scheduler};
use qgate_core::session::{HashId, SessionError, SessionTable};
use qgate_transport::http3::{self, H3Client, Handler, ServeLimits};
use qgate_transport::{compact, server_config, Identity, Socket, TransportError, TransportOptions};
use tokio::time::Instant;

use crate::paths::PathManager;

/// Header carrying a device's Hash ID on every data request.
pub const HASH_ID_HEADER: &str = "qgate-hash-id";
/// Header carrying the class on registration (`0` best effort, `1` priority).
pub const PRIORITY_HEADER: &str = "qgate-priority";

/// Gateway limits and timeouts.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Most devices registered at once.
    pub max_devices: usize,
    /// Most requests one device may have in flight.
    pub max_inflight_per_device: usize,
    /// Give up on a forwarded request on one path after this long, and retry on another.
    pub request_timeout: Duration,
    /// Paths tried per request.
    pub attempts: usize,
    /// Largest request body.
    pub max_body: usize,
    /// The server's authority in forwarded URIs.
    pub server_authority: String,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            max_devices: 10_000,
            max_inflight_per_device: 8,
            request_timeout: Duration::from_secs(5),
            attempts: 3,
            max_body: 1 << 20,
            server_authority: "localhost".into(),
        }
    }
}

impl GatewayConfig {
    /// The device-facing endpoint on `socket`: HTTP/3 with `identity` and the
    /// [`device_transport`](Self::device_transport) limits, on a [`compact::Endpoint`] (one
    /// driver task for all device connections, decision G9). It holds at most `max_devices`
    /// plus an eighth (and 16) connections, room for devices reconnecting while their old
    /// connection times out; more are refused during the handshake.
    pub fn device_endpoint(
        &self,
        socket: Socket,
        identity: &Identity,
        base: &TransportOptions,
        seed: Option<u64>,
    ) -> Result<compact::Endpoint, TransportError> {
        let scfg = server_config(identity, &[http3::ALPN_H3], &self.device_transport(base))?;
        let max = self.max_devices + self.max_devices / 8 + 16;
        compact::Endpoint::server(socket, scfg, seed, max)
    }

    /// Transport options for the device-facing endpoint: `base` with the QUIC stream limits cut
    /// to what one device may use, so flow control enforces the in-flight limit and an idle
    /// device's connection does not pre-allocate 100 + 100 stream slots (~8 KiB, decision G7).
    pub fn device_transport(&self, base: &TransportOptions) -> TransportOptions {
        TransportOptions {
            // One stream per request in flight (registration and /metrics count too).
            max_concurrent_bidi_streams: u32::try_from(self.max_inflight_per_device)
                .unwrap_or(u32::MAX)
                .clamp(1, base.max_concurrent_bidi_streams.max(1)),
            // HTTP/3 needs the peer's control, QPACK encoder and QPACK decoder streams
            // (RFC 9114 §6.2, RFC 9204 §4.2), plus one for a grease or extension stream.
            max_concurrent_uni_streams: base.max_concurrent_uni_streams.clamp(3, 4),
            ..base.clone()
        }
    }
}

/// Upper bounds of the response-delay histogram buckets, seconds.
const DELAY_BUCKETS: [f64; 12] = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
];

/// A fixed-bucket histogram of response delays for one class (Prometheus cumulative buckets).
#[derive(Debug, Default)]
pub struct DelayHistogram {
    buckets: [AtomicU64; 12],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl DelayHistogram {
    fn record(&self, d: Duration) {
        let secs = d.as_secs_f64();
        for (b, le) in self.buckets.iter().zip(DELAY_BUCKETS) {
            if secs <= le {
                b.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }
}

/// What the gateway has done.
#[derive(Debug, Default)]
pub struct GatewayStats {
    /// Devices registered.
    pub registered: AtomicU64,
    /// Requests answered by the server.
    pub forwarded: AtomicU64,
    /// Forwarding attempts that failed and were retried on another path.
    pub retried: AtomicU64,
    /// Requests refused: unknown, forged or malformed Hash ID.
    pub refused: AtomicU64,
    /// Requests that failed on every path.
    pub failed: AtomicU64,
    /// Response delay (device request in → response out) of priority devices.
    pub delay_priority: DelayHistogram,
    /// Response delay of best-effort devices.
    pub delay_best_effort: DelayHistogram,
}

/// The gateway.
pub struct Gateway {
    paths: PathManager,
    sessions: Mutex<SessionTable>,
    scheduler: Mutex<Box<dyn Scheduler>>,
    clients: Vec<tokio::sync::Mutex<Option<CachedClient>>>,
    inflight: Mutex<HashMap<HashId, usize>>,
    instance: u64,
    next_rid: AtomicU64,
    cfg: GatewayConfig,
    /// Counters.
    pub stats: GatewayStats,
    /// Requests forwarded per path.
    pub per_path: Vec<AtomicU64>,
    /// Request body bytes forwarded per path.
    pub per_path_bytes: Vec<AtomicU64>,
}

/// A path's HTTP/3 client and the id of the QUIC connection it runs on.
type CachedClient = (usize, Arc<H3Client>);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Bytes> {
    Response::builder()
        .status(status)
        .body(body.into())
        .expect("valid response")
}

impl Gateway {
    /// A gateway over `paths`, choosing with `scheduler`, Hash IDs from `seed`.
    pub fn new(
        paths: PathManager,
        scheduler: Box<dyn Scheduler>,
        cfg: GatewayConfig,
        seed: [u8; 32],
    ) -> Gateway {
        let n = paths.table().paths().len();
        Gateway {
            sessions: Mutex::new(SessionTable::new(cfg.max_devices, seed)),
            scheduler: Mutex::new(scheduler),
            clients: (0..n).map(|_| tokio::sync::Mutex::new(None)).collect(),
            inflight: Mutex::new(HashMap::new()),
            instance: u64::from_le_bytes(seed[..8].try_into().expect("8 bytes")),
            next_rid: AtomicU64::new(1),
            per_path: (0..n).map(|_| AtomicU64::new(0)).collect(),
            per_path_bytes: (0..n).map(|_| AtomicU64::new(0)).collect(),
            stats: GatewayStats::default(),
            cfg,
            paths,
        }
    }

    /// The path manager.
    pub fn paths(&self) -> &PathManager {
        &self.paths
    }

    /// Serve devices on `endpoint` until it closes; a device's sessions end with its connection.
    pub async fn serve_devices(self: Arc<Self>, endpoint: compact::Endpoint) {
        let limits = ServeLimits {
            max_body: self.cfg.max_body,
        };
        while let Some(conn) = endpoint.accept().await {
            let gw = self.clone();
            tokio::spawn(async move {
                let device = conn.remote_address();
                let _ = http3::serve_quic(conn, device, gw.clone(), limits).await;
                let gone = lock(&gw.sessions).remove_device(device);
                gw.paths.with_table(|t| {
                    for s in gone.iter().filter_map(|s| s.path) {
                        t.remove_hit(s);
                    }
                });
            });
        }
    }

    fn register(&self, req: &Request<()>, device: SocketAddr) -> Response<Bytes> {
        let priority = match req.headers().get(PRIORITY_HEADER).map(|v| v.as_bytes()) {
            Some(b"1") => Priority::Priority,
            Some(b"0") | None => Priority::BestEffort,
            Some(_) => {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("{PRIORITY_HEADER} must be 0 or 1\n"),
                )
            }
        };
        let now = Instant::now().into_std();
        match lock(&self.sessions).register(device, device, priority, now) {
            Ok(h) => {
                self.stats.registered.fetch_add(1, Ordering::Relaxed);
                text(StatusCode::CREATED, format!("{{\"hash_id\":\"{h}\"}}"))
            }
            Err(e) => {
                tracing::warn!(%device, error = %e, "registration refused");
                text(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n"))
            }
        }
    }

    /// The H3 client on `path`'s current backhaul connection (made on first use per connection).
    async fn client(&self, path: PathId) -> Option<Arc<H3Client>> {
        let conn = self.paths.connection(path)?;
        let mut slot = self.clients[path.0].lock().await;
        if let Some((id, c)) = slot.as_ref() {
            if *id == conn.stable_id() {
                return Some(c.clone());
            }
        }
        let c = Arc::new(H3Client::new(conn.clone()).await.ok()?);
        *slot = Some((conn.stable_id(), c.clone()));
        Some(c)
    }

    /// Choose (and record) the device's path for this request.
    fn assign(&self, hash: &HashId, device: SocketAddr) -> Result<Option<PathId>, SessionError> {
        let now = Instant::now().into_std();
        let mut sessions = lock(&self.sessions);
        let s = sessions.lookup(hash, device, now)?;
        let table = self.paths.table();
        let pick = lock(&self.scheduler).pick(&table, s.priority, s.path);
        if pick != s.path {
            let old = s.path;
            s.path = pick;
            drop(sessions);
            self.paths.with_table(|t| {
                if let Some(o) = old {
                    t.remove_hit(o);
                }
                if let Some(p) = pick {
                    t.add_hit(p);
                }
            });
        }
        Ok(pick)
    }

    async fn forward(&self, req: Request<()>, body: Bytes, device: SocketAddr) -> Response<Bytes> {
        let hash = match req
            .headers()
            .get(HASH_ID_HEADER)
            .map(|v| v.to_str().unwrap_or("").parse::<HashId>())
        {
            Some(Ok(h)) => h,
            Some(Err(e)) => {
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%device, error = %e, "refused: malformed Hash ID");
                return text(StatusCode::BAD_REQUEST, format!("{e}\n"));
            }
            None => {
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%device, "refused: no Hash ID");
                return text(
                    StatusCode::UNAUTHORIZED,
                    format!("register first: POST /register, then send {HASH_ID_HEADER}\n"),
                );
            }
        };
        // Bound what one device can have in flight.
        {
            let mut inflight = lock(&self.inflight);
            let n = inflight.entry(hash).or_insert(0);
            if *n >= self.cfg.max_inflight_per_device {
                tracing::warn!(%device, "refused: too many requests in flight");
                return text(
                    StatusCode::TOO_MANY_REQUESTS,
                    "too many requests in flight for this device\n",
                );
            }
            *n += 1;
        }
        let resp = self.forward_inner(req, body, device, hash).await;
        if let Some(n) = lock(&self.inflight).get_mut(&hash) {
            *n = n.saturating_sub(1);
        }
        resp
    }

    async fn forward_inner(
        &self,
        req: Request<()>,
        body: Bytes,
        device: SocketAddr,
        hash: HashId,
    ) -> Response<Bytes> {
        let rid = format!(
            "{:016x}-{}",
            self.instance,
            self.next_rid.fetch_add(1, Ordering::Relaxed)
        );
        let path_and_query = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        // The request's whole budget; while no path is up it waits for probing to find one.
        let deadline = Instant::now() + self.cfg.request_timeout * self.cfg.attempts.max(1) as u32;
        let mut attempts = 0;
        while attempts < self.cfg.attempts.max(1) && Instant::now() < deadline {
            let path = match self.assign(&hash, device) {
                Ok(Some(p)) => p,
                Ok(None) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                Err(e) => {
                    self.stats.refused.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%device, error = %e, "request refused");
                    let status = if e == SessionError::Forged {
                        StatusCode::FORBIDDEN
                    } else {
                        StatusCode::UNAUTHORIZED
                    };
                    return text(status, format!("{e}\n"));
                }
            };
            attempts += 1;
            let Some(client) = self.client(path).await else {
                self.paths
                    .with_table(|t| t.on_connection_lost(path, Instant::now().into_std()));
                continue;
            };
            let out = Request::builder()
                .method(req.method().clone())
                .uri(format!(
                    "https://{}{}",
                    self.cfg.server_authority, path_and_query
                ))
                .header("qgate-request-id", rid.as_str())
                .body(())
                .expect("valid request");
            self.paths
                .with_table(|t| t.on_request_sent(path, Instant::now().into_std()));
            // Boxed: the HTTP/3 exchange is a multi-KB future; inline, every enclosing future
            // (and the per-request task) grows by it and is copied around with it.
            match tokio::time::timeout(
                self.cfg.request_timeout,
                Box::pin(client.request(out, body.clone(), 1 << 20)),
            )
            .await
            {
                Ok(Ok(r)) => {
                    // Every answer refreshes the path's RTT from QUIC's estimate (§3.2), so a
                    // path that slows down is seen between the 30 s probes.
                    let rtt = client.connection().rtt();
                    self.paths.with_table(|t| {
                        t.on_heard(path);
                        t.on_rtt_estimate(path, rtt);
                    });
                    self.stats.forwarded.fetch_add(1, Ordering::Relaxed);
                    self.per_path[path.0].fetch_add(1, Ordering::Relaxed);
                    self.per_path_bytes[path.0].fetch_add(body.len() as u64, Ordering::Relaxed);
                    let mut resp = text(r.status, r.body);
                    resp.headers_mut()
                        .insert("qgate-path", http::HeaderValue::from(path.0));
                    return resp;
                }
                _ => {
                    // The path failed this request: take it out until probing says otherwise,
                    // and retry on another with the same request id (the server stores it once).
                    self.stats.retried.fetch_add(1, Ordering::Relaxed);
                    *self.clients[path.0].lock().await = None;
                    self.paths
                        .with_table(|t| t.on_connection_lost(path, Instant::now().into_std()));
                }
            }
        }
        self.stats.failed.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(%device, request = %rid, "failed on every backhaul path");
        text(
            StatusCode::BAD_GATEWAY,
            "the server is unreachable on every backhaul path\n",
        )
    }
}

impl Gateway {
    /// Prometheus text: the path table, per-path traffic, sessions, counters, delay histograms.
    pub fn metrics(&self) -> String {
        use std::fmt::Write;
        let mut o = String::new();
        let table = self.paths.table();
        let _ = writeln!(o, "# HELP qgate_gateway_path_rtt_seconds smoothed RTT of each backhaul path\n# TYPE qgate_gateway_path_rtt_seconds gauge");
        for p in table.paths() {
            if let Some(r) = p.rtt {
                let _ = writeln!(
                    o,
                    "qgate_gateway_path_rtt_seconds{{path=\"{}\"}} {}",
                    p.id.0,
                    r.as_secs_f64()
                );
            }
        }
        let _ = writeln!(o, "# HELP qgate_gateway_path_hits devices assigned to each path\n# TYPE qgate_gateway_path_hits gauge");
        for p in table.paths() {
            let _ = writeln!(
                o,
                "qgate_gateway_path_hits{{path=\"{}\"}} {}",
                p.id.0, p.hits
            );
        }
        let _ = writeln!(o, "# HELP qgate_gateway_path_up whether each path is up\n# TYPE qgate_gateway_path_up gauge");
        for p in table.paths() {
            let _ = writeln!(
                o,
                "qgate_gateway_path_up{{path=\"{}\"}} {}",
                p.id.0,
                u8::from(p.up)
            );
        }
        let _ = writeln!(o, "# HELP qgate_gateway_path_requests_total requests forwarded on each path\n# TYPE qgate_gateway_path_requests_total counter");
        for (i, n) in self.per_path.iter().enumerate() {
            let _ = writeln!(
                o,
                "qgate_gateway_path_requests_total{{path=\"{i}\"}} {}",
                n.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(o, "# HELP qgate_gateway_path_bytes_total request body bytes forwarded on each path\n# TYPE qgate_gateway_path_bytes_total counter");
        for (i, n) in self.per_path_bytes.iter().enumerate() {
            let _ = writeln!(
                o,
                "qgate_gateway_path_bytes_total{{path=\"{i}\"}} {}",
                n.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(o, "# HELP qgate_gateway_sessions registered devices\n# TYPE qgate_gateway_sessions gauge\nqgate_gateway_sessions {}", lock(&self.sessions).len());
        let st = &self.stats;
        for (name, help, v) in [
            ("registered", "devices registered", &st.registered),
            (
                "forwarded",
                "requests answered by the server",
                &st.forwarded,
            ),
            (
                "retried",
                "forwarding attempts retried on another path",
                &st.retried,
            ),
            ("refused", "requests refused for their Hash ID", &st.refused),
            ("failed", "requests that failed on every path", &st.failed),
        ] {
            let _ = writeln!(o, "# HELP qgate_gateway_{name}_total {help}\n# TYPE qgate_gateway_{name}_total counter\nqgate_gateway_{name}_total {}", v.load(Ordering::Relaxed));
        }
        let _ = writeln!(o, "# HELP qgate_gateway_response_delay_seconds device request in to response out\n# TYPE qgate_gateway_response_delay_seconds histogram");
        for (class, h) in [
            ("priority", &st.delay_priority),
            ("best_effort", &st.delay_best_effort),
        ] {
            for (b, le) in h.buckets.iter().zip(DELAY_BUCKETS) {
                let _ = writeln!(o, "qgate_gateway_response_delay_seconds_bucket{{class=\"{class}\",le=\"{le}\"}} {}", b.load(Ordering::Relaxed));
            }
            let count = h.count.load(Ordering::Relaxed);
            let _ = writeln!(o, "qgate_gateway_response_delay_seconds_bucket{{class=\"{class}\",le=\"+Inf\"}} {count}");
            let _ = writeln!(
                o,
                "qgate_gateway_response_delay_seconds_sum{{class=\"{class}\"}} {}",
                h.sum_us.load(Ordering::Relaxed) as f64 / 1e6
            );
            let _ = writeln!(
                o,
                "qgate_gateway_response_delay_seconds_count{{class=\"{class}\"}} {count}"
            );
        }
        o
    }
}

impl Handler for Gateway {
    async fn handle(&self, req: Request<()>, body: Bytes, peer: SocketAddr) -> Response<Bytes> {
        match (req.method().as_str(), req.uri().path()) {
            ("POST", "/register") => self.register(&req, peer),
            ("GET", "/metrics") => text(StatusCode::OK, self.metrics()),
            _ => {
                let start = Instant::now();
                let class = req
                    .headers()
                    .get(HASH_ID_HEADER)
                    .and_then(|v| v.to_str().ok()?.parse::<HashId>().ok())
                    .and_then(|h| {
                        lock(&self.sessions)
                            .lookup(&h, peer, start.into_std())
                            .ok()
                            .map(|s| s.priority)
                    });
                let resp = self.forward(req, body, peer).await;
                if resp.status().is_success() {
                    match class {
                        Some(Priority::Priority) => {
                            self.stats.delay_priority.record(start.elapsed())
                        }
                        Some(Priority::BestEffort) => {
                            self.stats.delay_best_effort.record(start.elapsed())
                        }
                        None => {}
                    }
                }
                resp
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_transport_bounds_streams_to_what_a_device_may_use() {
        let base = TransportOptions::default();
        let cfg = GatewayConfig::default();
        let t = cfg.device_transport(&base);
        assert_eq!(t.max_concurrent_bidi_streams, 8);
        assert_eq!(t.max_concurrent_uni_streams, 4);
        assert_eq!(t.receive_window, base.receive_window);
        // Never below what HTTP/3 needs, never above what the operator configured.
        let tight = TransportOptions {
            max_concurrent_bidi_streams: 8,
            max_concurrent_uni_streams: 1,
            ..base
        };
        let t = cfg.device_transport(&tight);
        assert_eq!(t.max_concurrent_bidi_streams, 8);
        assert_eq!(t.max_concurrent_uni_streams, 3);
        let one = GatewayConfig {
            max_inflight_per_device: 0,
            ..cfg
        };
        assert_eq!(one.device_transport(&tight).max_concurrent_bidi_streams, 1);
    }
}
