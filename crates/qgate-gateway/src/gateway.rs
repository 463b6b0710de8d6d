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
            max_inflight_per_device: 32,
            request_timeout: Duration::from_secs(5),
            attempts: 3,
            max_body: 1 << 20,
            server_authority: "localhost".into(),
        }
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
    pub async fn serve_devices(self: Arc<Self>, endpoint: quinn::Endpoint) {
        let limits = ServeLimits {
            max_body: self.cfg.max_body,
        };
        while let Some(incoming) = endpoint.accept().await {
            let gw = self.clone();
            tokio::spawn(async move {
                let Ok(conn) = incoming.await else { return };
                let device = conn.remote_address();
                let _ = http3::serve_connection(conn, gw.clone(), limits).await;
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
            Err(e) => text(StatusCode::SERVICE_UNAVAILABLE, format!("{e}\n")),
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
                return text(StatusCode::BAD_REQUEST, format!("{e}\n"));
            }
            None => {
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
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
        for _ in 0..self.cfg.attempts.max(1) {
            let path = match self.assign(&hash, device) {
                Ok(Some(p)) => p,
                Ok(None) => break,
                Err(e) => {
                    self.stats.refused.fetch_add(1, Ordering::Relaxed);
                    let status = if e == SessionError::Forged {
                        StatusCode::FORBIDDEN
                    } else {
                        StatusCode::UNAUTHORIZED
                    };
                    return text(status, format!("{e}\n"));
                }
            };
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
            match tokio::time::timeout(
                self.cfg.request_timeout,
                client.request(out, body.clone(), 1 << 20),
            )
            .await
            {
                Ok(Ok(r)) => {
                    self.paths.with_table(|t| t.on_heard(path));
                    self.stats.forwarded.fetch_add(1, Ordering::Relaxed);
                    self.per_path[path.0].fetch_add(1, Ordering::Relaxed);
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
        text(
            StatusCode::BAD_GATEWAY,
            "the server is unreachable on every backhaul path\n",
        )
    }
}

impl Handler for Gateway {
    async fn handle(&self, req: Request<()>, body: Bytes, peer: SocketAddr) -> Response<Bytes> {
        match (req.method().as_str(), req.uri().path()) {
            ("POST", "/register") => self.register(&req, peer),
            _ => self.forward(req, body, peer).await,
        }
    }
}
