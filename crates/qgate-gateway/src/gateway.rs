//! Device-facing side of the gateway (paper 000 §3.3–3.4): the shell of the sans-IO
//! [`Forwarder`](qgate_core::forwarder::Forwarder) (registration, sessions, the scheduler, hits, retries and request ids, under
//! one lock) that carries each request over the path it chose, and again on another path with
//! the same request id when that one fails.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use qgate_core::forwarder::{Attempt, ForwarderConfig, Outcome, RequestId, Step};
use qgate_core::loggate::LogGate;
use qgate_core::metrics;
use qgate_core::path::{PathConfig, PathId};
use qgate_core::scheduler::Priority;
use qgate_core::session::{ConnId, HashId, SessionError, SessionLimits};
use qgate_transport::http3::{self, H3Client, H3Error, Handler, ServeLimits};
use qgate_transport::shared_driver::EndpointStats;
use qgate_transport::{
    server_config_resuming, shared_driver, Identity, Socket, TransportError, TransportOptions,
};
use tokio::time::Instant;

use crate::answer::Answer;
use crate::batch::{self, BatchStats, Batcher};
use crate::paths::{Lease, PathManager};
use qgate_core::sync::lock;

use crate::outbound::{self, Facts};
use qgate_core::protocol::{self as wire, Registered, REQUEST_ID_HEADER};
pub use qgate_core::protocol::{HASH_ID_HEADER, PRIORITY_HEADER};

/// Gateway limits and timeouts, and the `[gateway]` keys of a config file that set them
/// (durations as `"5s"`). The defaults live here (and in [`SessionLimits::DEFAULT`] and
/// [`shared_driver::Limits::DEFAULT`]); the CLI composes this type and its help reads them from here.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    /// Most devices registered at once.
    pub max_devices: usize,
    /// Most requests one device may have in flight.
    pub max_inflight_per_device: usize,
    /// Most sessions one device connection may register (decision G10).
    pub max_sessions_per_connection: usize,
    /// Most sessions registered from one source IP address (decision G10).
    pub max_sessions_per_address: usize,
    /// A session with nothing in flight and no request for this long expires (decision G10).
    #[serde(with = "qgate_core::units::duration")]
    pub session_idle_timeout: Duration,
    /// Most device handshakes in progress, a budget apart from `max_devices` (decision G12).
    pub max_handshakes: usize,
    /// With this many device handshakes in progress, new devices must prove their address
    /// with a QUIC Retry first (decision G12).
    pub retry_above: usize,
    /// A device handshake not finished within this long is closed (decision G12).
    #[serde(with = "qgate_core::units::duration")]
    pub handshake_timeout: Duration,
    /// Give up on a forwarded request on one path after this long, and retry on another.
    #[serde(with = "qgate_core::units::duration")]
    pub request_timeout: Duration,
    /// Paths tried per request.
    pub attempts: usize,
    /// Largest request body.
    pub max_body: usize,
    /// The server's authority in forwarded URIs, and the name its certificate must carry.
    #[serde(rename = "server_name")]
    pub server_authority: String,
    /// Ingest records of at most this many bytes, of one class, that are ready for the same
    /// backhaul connection at once go in one request to the server's `/batch` (decision G23);
    /// 0: one request per record, as a server from before batches needs (one that answers
    /// `/batch` otherwise still gets every record, alone, after each refused batch).
    pub batch_max_record: usize,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        let s = SessionLimits::DEFAULT;
        let h = shared_driver::Limits::DEFAULT;
        GatewayConfig {
            max_devices: s.max_devices,
            max_inflight_per_device: s.max_inflight,
            max_sessions_per_connection: s.per_connection,
            max_sessions_per_address: s.per_address,
            session_idle_timeout: s.idle,
            max_handshakes: h.max_handshakes,
            retry_above: h.retry_above,
            handshake_timeout: h.handshake_timeout,
            request_timeout: Duration::from_secs(5),
            attempts: 3,
            max_body: 1 << 20,
            server_authority: "localhost".into(),
            batch_max_record: batch::DEFAULT_MAX_RECORD,
        }
    }
}

impl GatewayConfig {
    /// The session table's bounds.
    pub fn session_limits(&self) -> SessionLimits {
        SessionLimits {
            max_devices: self.max_devices,
            per_connection: self.max_sessions_per_connection,
            per_address: self.max_sessions_per_address,
            max_inflight: self.max_inflight_per_device,
            idle: self.session_idle_timeout,
        }
    }

    /// The forwarding core's bounds, with probing as `paths` says.
    pub fn forwarder_config(&self, paths: PathConfig) -> ForwarderConfig {
        ForwarderConfig {
            sessions: self.session_limits(),
            paths,
            attempts: self.attempts,
            attempt_timeout: self.request_timeout,
        }
    }

    /// The device-facing endpoint on `socket`: HTTP/3 with `identity` and the
    /// [`device_transport`](Self::device_transport) limits, on a [`shared_driver::Endpoint`] (one
    /// driver task for all device connections, decision G9). It holds at most `max_devices`
    /// plus an eighth (and 16) established connections, room for devices reconnecting while
    /// their old connection times out; more are refused during the handshake. Handshakes have
    /// their own budget and address validation (decision G12).
    pub fn device_endpoint(
        &self,
        socket: Socket,
        identity: &Identity,
        base: &TransportOptions,
        seed: Option<u64>,
    ) -> Result<shared_driver::Endpoint, TransportError> {
        let opts = self.device_transport(base);
        let limits = shared_driver::Limits {
            max_connections: self.max_devices + self.max_devices / 8 + 16,
            max_handshakes: self.max_handshakes,
            retry_above: self.retry_above,
            handshake_timeout: self.handshake_timeout,
            ..shared_driver::Limits::DEFAULT
        };
        // A resumption ticket for every device it may serve, so returning devices use 0-RTT
        // (decision G18).
        let scfg =
            server_config_resuming(identity, &[http3::ALPN_H3], &opts, limits.max_connections)?;
        shared_driver::Endpoint::server(socket, scfg, &opts, seed, limits)
    }

    /// Transport options for the device-facing endpoint: `base` with the QUIC stream limits cut
    /// to what one device may use, so flow control enforces the in-flight limit and an idle
    /// device's connection does not pre-allocate 100 + 100 stream slots (~8 KiB, decision G7).
    pub fn device_transport(&self, base: &TransportOptions) -> TransportOptions {
        TransportOptions {
            // One stream per request in flight (registration counts too).
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

/// Response delays of one class: the exposed histogram, and its count and sum for the admin
/// API (the library reads those back only in its tests).
#[derive(Debug)]
pub struct DelayHistogram {
    hist: metrics::Histogram,
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Default for DelayHistogram {
    fn default() -> Self {
        DelayHistogram {
            hist: metrics::Histogram::new(DELAY_BUCKETS),
            count: AtomicU64::new(0),
            sum_us: AtomicU64::new(0),
        }
    }
}

impl DelayHistogram {
    fn record(&self, d: Duration) {
        self.hist.observe(d.as_secs_f64());
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// Responses recorded.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Their delays added up, seconds.
    pub fn sum_s(&self) -> f64 {
        self.sum_us.load(Ordering::Relaxed) as f64 / 1e6
    }
}

qgate_core::counters! {
    /// What the gateway has done.
    pub struct GatewayStats => StatsSnapshot {
        /// Devices registered.
        registered: counter "qgate_gateway_registered", "devices registered";
        /// Requests answered by the server.
        forwarded: counter "qgate_gateway_forwarded", "requests answered by the server";
        /// Forwarding attempts that failed and were retried on another path.
        retried: counter "qgate_gateway_retried", "forwarding attempts retried on another path";
        /// Requests refused: unknown, forged or malformed Hash ID, or too many in flight.
        refused: counter "qgate_gateway_refused",
            "requests refused for their Hash ID or in-flight limit";
        /// Registrations refused: the gateway, the connection or the address is full.
        registrations_refused: counter "qgate_gateway_registrations_refused",
            "registrations refused: gateway, connection or address full";
        /// Sessions ended for being idle.
        sessions_expired: counter "qgate_gateway_sessions_expired", "sessions ended for being idle";
        /// Forwarding attempts that timed out (their stream cancelled, the connection kept).
        timeouts: counter "qgate_gateway_timeouts",
            "forwarding attempts timed out (stream cancelled, connection kept)";
        /// Requests that failed on every path.
        failed: counter "qgate_gateway_failed", "requests that failed on every path";
        /// Requests handled before their connection's handshake finished (they came in 0-RTT).
        early: counter "qgate_gateway_early_requests",
            "requests handled before their connection's handshake finished (0-RTT)";
        /// Of those, refused (425): no device request id, or not a record.
        too_early: counter "qgate_gateway_too_early",
            "of those, refused with 425: no device request id, or not a record";
    }
    extra {
        /// Response delay (device request in → response out) of priority devices.
        pub delay_priority: DelayHistogram,
        /// Response delay of best-effort devices.
        pub delay_best_effort: DelayHistogram,
    }
}

/// Kinds of log line that a peer can cause at will, each rate-limited (decision G11).
#[derive(Debug, Clone, Copy)]
enum Noise {
    Registration,
    Refused,
    Failed,
}

/// The log gates, one per [`Noise`]: each kind of line at most 10 times a minute.
struct LogGates([LogGate; 3]);

impl Default for LogGates {
    fn default() -> Self {
        LogGates([const { LogGate::new(10, Duration::from_secs(60)) }; 3])
    }
}

/// A warning a peer can provoke: written if its kind's gate admits it (with the count of lines
/// left out before it), otherwise only counted.
macro_rules! noisy_warn {
    ($gw:expr, $kind:expr, $($arg:tt)+) => {
        if let Some(suppressed) = $gw.admit_log($kind) {
            tracing::warn!(suppressed, $($arg)+);
        }
    };
}

/// The gateway.
pub struct Gateway {
    /// The backhaul paths' shell, holding the forwarding core.
    paths: PathManager,
    /// Each path's lanes' HTTP/3 clients (decision G21).
    clients: Vec<Vec<tokio::sync::Mutex<Option<CachedClient>>>>,
    logs: Mutex<LogGates>,
    /// The device endpoint's handshake counters, once serving.
    endpoint: std::sync::OnceLock<Arc<EndpointStats>>,
    next_conn: AtomicU64,
    /// Device connections being served, for the admin port's list and close.
    conns: Mutex<std::collections::HashMap<ConnId, shared_driver::Connection>>,
    /// One attempt's limit: the core's, which also sets the retry budget from it.
    attempt_timeout: Duration,
    cfg: GatewayConfig,
    /// Counters.
    pub stats: GatewayStats,
    /// Requests forwarded per path.
    pub per_path: Vec<AtomicU64>,
    /// Request body bytes forwarded per path.
    pub per_path_bytes: Vec<AtomicU64>,
    /// Each path's egress shaper, if it has one (set by the builder).
    pub(crate) shapers: Vec<Option<qgate_transport::shaped::ShapeHandle>>,
    /// What the lanes' batchers sent (decision G23).
    pub batch_stats: Arc<BatchStats>,
    /// The request-body budget devices' connections share (T7, T13).
    bodies: http3::BodyBudget,
}

/// A lane's HTTP/3 client, the id of the QUIC connection it runs on, and its batcher.
struct CachedClient {
    id: usize,
    client: Arc<H3Client>,
    /// Best effort's and priority's (G23: priority records never wait behind others' bytes).
    batchers: Option<[Batcher; 2]>,
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Bytes> {
    Response::builder()
        .status(status)
        .body(body.into())
        .expect("valid response")
}

impl Gateway {
    /// A gateway over `paths` (and the forwarding core they hold).
    pub fn new(paths: PathManager, cfg: GatewayConfig) -> Gateway {
        let (n, attempt_timeout) =
            paths.with_core(|f| (f.paths().paths().len(), f.config().attempt_timeout));
        Gateway {
            attempt_timeout,
            clients: (0..n)
                .map(|i| {
                    (0..paths.lanes(PathId(i)))
                        .map(|_| tokio::sync::Mutex::new(None))
                        .collect()
                })
                .collect(),
            logs: Mutex::default(),
            endpoint: std::sync::OnceLock::new(),
            next_conn: AtomicU64::new(0),
            conns: Mutex::default(),
            per_path: (0..n).map(|_| AtomicU64::new(0)).collect(),
            per_path_bytes: (0..n).map(|_| AtomicU64::new(0)).collect(),
            shapers: Vec::new(),
            stats: GatewayStats::default(),
            batch_stats: Arc::default(),
            bodies: http3::BodyBudget::default(),
            cfg,
            paths,
        }
    }

    /// The path manager.
    pub fn paths(&self) -> &PathManager {
        &self.paths
    }

    /// Serve devices on `endpoint` until it closes. A device's sessions are bound to its
    /// connection (not its address, so it may migrate) and end with it; idle ones expire.
    pub async fn serve_devices(self: Arc<Self>, endpoint: shared_driver::Endpoint) {
        let _ = self.endpoint.set(endpoint.stats());
        let limits = ServeLimits {
            max_body: self.cfg.max_body,
            buffered: self.bodies.clone(),
            ..ServeLimits::default()
        };
        // Idle sessions are looked for every quarter of the idle timeout (at most every 10 s).
        let sweep = (self.cfg.session_idle_timeout / 4)
            .clamp(Duration::from_millis(100), Duration::from_secs(10));
        let mut ticker = tokio::time::interval(sweep);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let conn = tokio::select! {
                // The sweep first: a flood of connections must not starve session expiry.
                biased;
                _ = ticker.tick() => {
                    self.expire_sessions();
                    continue;
                }
                c = endpoint.accept() => match c {
                    Some(c) => c,
                    None => return,
                },
            };
            let id = self.next_conn.fetch_add(1, Ordering::Relaxed);
            let handler = Arc::new(DeviceConnection {
                gw: self.clone(),
                id,
                conn: conn.clone(),
            });
            let limits = limits.clone();
            lock(&self.conns).insert(id, conn.clone());
            let listed = Listed {
                gw: self.clone(),
                id,
            };
            tokio::spawn(async move {
                let device = conn.remote_address();
                let _ = http3::serve_quic(conn, device, handler.clone(), limits).await;
                drop(listed);
                handler.gw.end_sessions(id);
            });
        }
    }

    /// Connection `conn` closed: its sessions end.
    fn end_sessions(&self, conn: ConnId) {
        self.paths.with_core(|f| f.end_connection(conn));
    }

    /// End idle sessions (decision G10).
    pub fn expire_sessions(&self) {
        let n = self
            .paths
            .with_core(|f| f.expire(Instant::now().into_std()));
        if n > 0 {
            self.stats
                .sessions_expired
                .fetch_add(n as u64, Ordering::Relaxed);
            tracing::debug!(n, "idle sessions expired");
        }
    }

    /// Whether a log line of `kind` may be written now, with the count left out before it.
    fn admit_log(&self, kind: Noise) -> Option<u64> {
        lock(&self.logs).0[kind as usize].admit(Instant::now().into_std())
    }

    fn register(&self, req: &Request<()>, conn: &DeviceConnection) -> Response<Bytes> {
        // The address now, not at accept: the device may have migrated.
        let device = conn.conn.remote_address();
        let priority =
            match wire::parse_priority(req.headers().get(PRIORITY_HEADER).map(|v| v.as_bytes())) {
                Ok(p) => p,
                Err(e) => return text(StatusCode::BAD_REQUEST, format!("{e}\n")),
            };
        // Checked under the core's lock: once the connection has closed, its sessions are
        // removed (`end_sessions`, after this lock) and none may be added.
        let registered = self.paths.with_core(|f| {
            let now = Instant::now().into_std();
            (!conn.conn.is_closed()).then(|| f.register(conn.id, device, priority, now))
        });
        let Some(registered) = registered else {
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                "the connection is closing\n",
            );
        };
        match registered {
            Ok(h) => {
                self.stats.registered.fetch_add(1, Ordering::Relaxed);
                text(StatusCode::CREATED, Registered { hash: h }.to_string())
            }
            Err(e) => self.registration_refused(device, e),
        }
    }

    /// Count a refused registration and answer it.
    fn registration_refused(&self, device: SocketAddr, e: SessionError) -> Response<Bytes> {
        self.stats
            .registrations_refused
            .fetch_add(1, Ordering::Relaxed);
        noisy_warn!(self, Noise::Registration, %device, error = %e, "registration refused");
        let status = match e {
            SessionError::Full(_) => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::TOO_MANY_REQUESTS,
        };
        text(status, format!("{e}\n"))
    }

    /// The session a request names: its Hash ID, or (no Hash ID, a class instead) the session
    /// of that class its connection registered on first use (decision G18), and whether it was
    /// registered now. `Err` is the answer.
    fn session_of(
        &self,
        req: &Request<()>,
        dc: &DeviceConnection,
        device: SocketAddr,
    ) -> Result<(HashId, bool), Box<Response<Bytes>>> {
        let conn = dc.id;
        if let Some(v) = req.headers().get(HASH_ID_HEADER) {
            return match v.to_str().unwrap_or("").parse::<HashId>() {
                Ok(h) => Ok((h, false)),
                Err(e) => Err(Box::new(self.refuse(conn, device, e))),
            };
        }
        let Some(p) = req.headers().get(PRIORITY_HEADER) else {
            return Err(Box::new(self.refuse(conn, device, SessionError::Unknown)));
        };
        let priority = wire::parse_priority(Some(p.as_bytes()))
            .map_err(|e| Box::new(text(StatusCode::BAD_REQUEST, format!("{e}\n"))))?;
        // As at registration: a closed connection's sessions are gone and none may be added.
        let made = self.paths.with_core(|f| {
            let now = Instant::now().into_std();
            (!dc.conn.is_closed()).then(|| f.session_for(conn, device, priority, now))
        });
        match made {
            None => Err(Box::new(text(
                StatusCode::SERVICE_UNAVAILABLE,
                "the connection is closing\n",
            ))),
            Some(Ok(made)) => Ok(made),
            Some(Err(e)) => Err(Box::new(self.registration_refused(device, e))),
        }
    }

    /// The H3 client on the backhaul connection of `path` with the fewest requests out (made
    /// on first use per connection), leased for one request; else the lane whose HTTP/3 setup
    /// failed, or `None` when the path has no connection.
    #[allow(clippy::type_complexity)]
    async fn client(
        &self,
        path: PathId,
    ) -> Result<(Arc<H3Client>, Option<[Batcher; 2]>, Lease), Option<usize>> {
        let lease = self.paths.lease(path).ok_or(None)?;
        let conn = lease.connection();
        let mut slot = self.clients[path.0][lease.lane()].lock().await;
        if let Some(c) = slot.as_ref() {
            if c.id == conn.stable_id() {
                return Ok((c.client.clone(), c.batchers.clone(), lease));
            }
        }
        let c = Arc::new(
            H3Client::new(conn.clone())
                .await
                .map_err(|_| Some(lease.lane()))?,
        );
        let batchers = (self.cfg.batch_max_record > 0).then(|| {
            [(); 2].map(|()| {
                Batcher::new(
                    c.clone(),
                    self.cfg.server_authority.clone(),
                    self.attempt_timeout,
                    self.batch_stats.clone(),
                )
            })
        });
        *slot = Some(CachedClient {
            id: conn.stable_id(),
            client: c.clone(),
            batchers: batchers.clone(),
        });
        drop(slot);
        Ok((c, batchers, lease))
    }

    /// Count a refused request and answer it.
    fn refuse(&self, conn: ConnId, device: SocketAddr, e: SessionError) -> Response<Bytes> {
        self.stats.refused.fetch_add(1, Ordering::Relaxed);
        noisy_warn!(self, Noise::Refused, %device, conn, error = %e, "request refused");
        let status = match e {
            SessionError::Malformed(_) => StatusCode::BAD_REQUEST,
            SessionError::Forged => StatusCode::FORBIDDEN,
            SessionError::InFlight(_) => StatusCode::TOO_MANY_REQUESTS,
            _ => StatusCode::UNAUTHORIZED,
        };
        let mut body = format!("{e}\n");
        if e == SessionError::Unknown {
            body.push_str(&format!(
                "register first: POST /register, then send {HASH_ID_HEADER}; or send {PRIORITY_HEADER} to register on first use\n"
            ));
        }
        text(status, body)
    }

    /// Forward one device request: the core admits it (its session bound to `conn`, with
    /// room in flight) and plans its attempts; each goes out on its path here. A request that
    /// arrived in 0-RTT goes on only under the device's own request id, so a replay of it is
    /// stored once (decision G18).
    async fn forward(
        &self,
        req: Request<()>,
        body: Bytes,
        dc: &DeviceConnection,
        device: SocketAddr,
    ) -> Response<Bytes> {
        let start = Instant::now();
        let conn = dc.id;
        let device_rid = match req.headers().get(REQUEST_ID_HEADER) {
            None => None,
            Some(v) => match wire::parse_device_request_id(v.as_bytes()) {
                Ok(id) => Some(id),
                Err(e) => return text(StatusCode::BAD_REQUEST, format!("{e}\n")),
            },
        };
        // Before the handshake finishes the request may have come in 0-RTT, and a copy of it
        // too: it goes on only under the device's own id, to a route the server de-duplicates.
        // (Early data read after the handshake is safe: a copy never completes one.)
        if !dc.conn.is_established() {
            self.stats.early.fetch_add(1, Ordering::Relaxed);
            let record = wire::is_record(req.method().as_str(), req.uri().path());
            if device_rid.is_none() || !record {
                self.stats.too_early.fetch_add(1, Ordering::Relaxed);
                // RFC 8470 §5.2: the device sends it again once the handshake is done.
                return text(
                    StatusCode::from_u16(425).expect("valid status"),
                    format!(
                        "before the handshake finishes only POST /ingest/... with {REQUEST_ID_HEADER} (32 hex digits) is taken; send it again after the handshake\n"
                    ),
                );
            }
        }
        let named = req.headers().get(HASH_ID_HEADER).is_some();
        let (hash, registered) = match self.session_of(&req, dc, device) {
            Ok(s) => s,
            Err(resp) => return *resp,
        };
        if registered {
            self.stats.registered.fetch_add(1, Ordering::Relaxed);
        }
        let bytes = body.len() as u64;
        let begun = self
            .paths
            .with_core(|f| f.begin(&hash, conn, bytes, Instant::now().into_std()));
        let (id, class, step) = match begun {
            Ok(b) => b,
            Err(e) => return self.refuse(conn, device, e),
        };
        // Handed back however this future ends, dropped mid-way included.
        let mut admitted = Admitted {
            gw: self,
            id,
            // The id it goes under: the device's if it named one, else the gateway's.
            rid: device_rid
                .map_or_else(|| id.to_string(), |d| wire::forwarded_device_request_id(&d)),
            over: false,
        };
        let mut resp = self
            .carry(&mut admitted, step, req, body, conn, device, class)
            .await;
        // The Hash ID of a session made on first use, for the device's next requests.
        if !named {
            if let Ok(v) = http::HeaderValue::from_str(&hash.to_string()) {
                resp.headers_mut().insert(HASH_ID_HEADER, v);
            }
        }
        if resp.status().is_success() {
            match class {
                Priority::Priority => self.stats.delay_priority.record(start.elapsed()),
                Priority::BestEffort => self.stats.delay_best_effort.record(start.elapsed()),
            }
        }
        resp
    }

    /// Carry out the core's steps for request `admitted` until one is final.
    #[allow(clippy::too_many_arguments)]
    async fn carry(
        &self,
        admitted: &mut Admitted<'_>,
        mut step: Step,
        req: Request<()>,
        body: Bytes,
        conn: ConnId,
        device: SocketAddr,
        class: Priority,
    ) -> Response<Bytes> {
        let rid: Arc<str> = std::mem::take(&mut admitted.rid).into();
        // Built once for every attempt (only the path and urgency change). Who sent it and
        // which path carried it are for the server's sink (S7).
        let mut facts = Facts {
            target: req
                .uri()
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .into(),
            request_id: Some(rid.clone()),
            device: Some(device.to_string().into()),
            path: None,
            class: Some(class),
        };
        let batchable = req.uri().query().is_none()
            && body.len() <= self.cfg.batch_max_record
            && wire::is_record(req.method().as_str(), req.uri().path());
        loop {
            step = match step {
                Step::Send(a) => {
                    facts.path = Some(a.path.0);
                    let record = batch::Record {
                        urgent: a.urgent,
                        facts: facts.clone(),
                        body: body.clone(),
                    };
                    match self.attempt(a, req.method(), record, batchable).await {
                        Ok(resp) => {
                            admitted.over = true;
                            return resp;
                        }
                        Err(next) => next,
                    }
                }
                Step::Wait(w) => {
                    tokio::time::sleep_until(Instant::from_std(w.until)).await;
                    self.paths
                        .with_core(|f| f.resume(w, Instant::now().into_std()))
                }
                // An answer comes back from `attempt`, never as a step here.
                Step::Answered(_) | Step::Failed => {
                    debug_assert!(matches!(step, Step::Failed), "{step:?}");
                    admitted.over = true;
                    self.stats.failed.fetch_add(1, Ordering::Relaxed);
                    noisy_warn!(self, Noise::Failed, %device, request = %rid, "failed on every backhaul path");
                    return text(
                        StatusCode::BAD_GATEWAY,
                        "the server is unreachable on every backhaul path\n",
                    );
                }
                // The session ended meanwhile (its connection closed, or it expired).
                Step::Refused(e) => {
                    admitted.over = true;
                    return self.refuse(conn, device, e);
                }
            };
        }
    }

    /// One attempt on its path: the answer to hand the device, or the core's next step.
    async fn attempt(
        &self,
        a: Attempt,
        method: &http::Method,
        record: batch::Record,
        batchable: bool,
    ) -> Result<Response<Bytes>, Step> {
        let (path, bytes) = (a.path, record.body.len() as u64);
        // The outcome (with QUIC's sample of the path) and the clock are read under the core's
        // lock, so concurrent answers reach it in the order they were taken and time never
        // goes back for it.
        let finish = |a: Attempt, outcome: &dyn Fn() -> Outcome| {
            self.paths
                .with_core(|f| f.finish(a, outcome(), Instant::now().into_std()))
                // `None`: abandoned meanwhile, which this task alone does, on drop.
                .unwrap_or(Step::Failed)
        };
        let (client, batchers, lease) = match self.client(path).await {
            Ok(c) => c,
            // One of several connections failed (decision G21): the path stays in on the
            // others. Its last: the path is out until probing brings it back.
            Err(lane) if self.paths.others_live(path, lane) => {
                return Err(finish(a, &|| Outcome::Unanswered));
            }
            Err(_) => return Err(finish(a, &|| Outcome::ConnectionLost)),
        };
        // Boxed: the HTTP/3 exchange is a multi-KB future; inline, every enclosing future (and
        // the per-request task) grows by it and is copied around with it.
        let outcome = match batchers {
            Some(b) if batchable => b[usize::from(record.urgent)].send(record).await,
            _ => Box::pin(client.request_within_at(
                outbound::urgency(record.urgent),
                outbound::request(method, &self.cfg.server_authority, &record.facts),
                record.body,
                1 << 20,
                self.attempt_timeout,
            ))
            .await
            .map(Answer::of_response),
        };
        match outcome {
            Ok(r) => {
                // Every answer refreshes the path's RTT, window and loss from QUIC (§3.2), so a
                // path that slows down is seen between the 30 s probes.
                let success = r.status.is_success();
                finish(a, &|| Outcome::Answered {
                    success,
                    sample: self.paths.sample_for(&lease),
                });
                self.stats.forwarded.fetch_add(1, Ordering::Relaxed);
                self.per_path[path.0].fetch_add(1, Ordering::Relaxed);
                self.per_path_bytes[path.0].fetch_add(bytes, Ordering::Relaxed);
                // With the server's Retry-After: a server whose queue is down says when to try
                // again (decision S5).
                Ok(r.to_response(path.0))
            }
            Err(e) => {
                self.stats.retried.fetch_add(1, Ordering::Relaxed);
                let closed = client.is_closed();
                if closed {
                    let mut cached = self.clients[path.0][lease.lane()].lock().await;
                    if cached
                        .as_ref()
                        .is_some_and(|c| Arc::ptr_eq(&c.client, &client))
                    {
                        *cached = None;
                    }
                }
                let outcome = if closed && !self.paths.others_live(path, Some(lease.lane())) {
                    // The path's connection (QUIC or HTTP/3) is gone: the core takes the path
                    // out until probing brings it back (the next use reconnects).
                    Outcome::ConnectionLost
                } else if closed {
                    // One of several connections is gone (decision G21): the path stays in
                    // on the others, and its probes reconnect this one (closed here if only
                    // its HTTP/3 ended, so that it is replaced).
                    lease.connection().close(0u32.into(), b"HTTP/3 ended");
                    Outcome::Unanswered
                } else {
                    // Only this request's stream was cancelled (decision G5): the connection
                    // and the other devices' requests on it carry on; the path table probes
                    // the path because this request got no answer.
                    if matches!(e, H3Error::TimedOut(_)) {
                        self.stats.timeouts.fetch_add(1, Ordering::Relaxed);
                    }
                    Outcome::Unanswered
                };
                // Retried on another path with the same request id (the server stores it once).
                Err(finish(a, &|| outcome))
            }
        }
    }
}

/// A request admitted by the core, abandoned on drop unless it is over (its task was dropped
/// mid-way: the device went away, or the gateway stopped).
struct Admitted<'a> {
    gw: &'a Gateway,
    id: RequestId,
    /// Its id on the wire.
    rid: String,
    over: bool,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        if !self.over {
            let id = self.id;
            self.gw
                .paths
                .with_core(|f| f.abandon(id, Instant::now().into_std()));
        }
    }
}

/// A device connection's entry in the admin port's list, removed on drop (also if its task
/// panics or is aborted), so the list never holds a handle keeping a connection open.
struct Listed {
    gw: Arc<Gateway>,
    id: ConnId,
}

impl Drop for Listed {
    fn drop(&mut self) {
        lock(&self.gw.conns).remove(&self.id);
    }
}

/// One device connection's view of the gateway: its requests carry the connection's id, to
/// which its sessions are bound.
struct DeviceConnection {
    gw: Arc<Gateway>,
    id: ConnId,
    conn: shared_driver::Connection,
}

impl Gateway {
    /// The gateway's metrics text (OpenMetrics), as the admin port serves it.
    pub fn metrics(self: &Arc<Self>) -> String {
        metrics::render(self.collector())
    }

    /// The gateway's metrics as a registry collector (decision O1).
    pub fn collector(self: &Arc<Self>) -> GatewayMetrics {
        GatewayMetrics(self.clone())
    }
}

/// Reads the path table, per-path traffic, sessions, counters and delay histograms at scrape
/// time.
#[derive(Clone)]
pub struct GatewayMetrics(Arc<Gateway>);

impl std::fmt::Debug for GatewayMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GatewayMetrics")
    }
}

impl metrics::Collector for GatewayMetrics {
    fn encode(&self, mut e: metrics::DescriptorEncoder) -> std::fmt::Result {
        let gw = &self.0;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let table = gw.paths.table();
        // Path ids are their places in the table and in the per-path counters.
        let ids: Vec<String> = (0..gw.per_path.len().max(table.paths().len()))
            .map(|i| i.to_string())
            .collect();
        let per_path = |i: usize| [("path", ids.get(i).map_or("?", String::as_str))];
        metrics::gauges(
            &mut e,
            "qgate_gateway_path_rtt_seconds",
            "smoothed RTT of each backhaul path",
            table
                .paths()
                .iter()
                .enumerate()
                .filter_map(|(i, p)| p.rtt.map(|rtt| (per_path(i), rtt.as_secs_f64()))),
        )?;
        metrics::gauges(
            &mut e,
            "qgate_gateway_path_hits",
            "devices assigned to each path",
            table
                .paths()
                .iter()
                .enumerate()
                .map(|(i, p)| (per_path(i), p.hits as u64)),
        )?;
        metrics::gauges(
            &mut e,
            "qgate_gateway_path_up",
            "whether each path is up",
            table
                .paths()
                .iter()
                .enumerate()
                .map(|(i, p)| (per_path(i), u64::from(p.up))),
        )?;
        metrics::gauges(
            &mut e,
            "qgate_gateway_path_connections",
            "live QUIC connections of each path (decision G21)",
            (0..table.paths().len()).map(|i| {
                let live = gw.paths.live_connections(PathId(i)) as u64;
                (per_path(i), live)
            }),
        )?;
        metrics::counters(
            &mut e,
            "qgate_gateway_path_requests",
            "requests forwarded on each path",
            gw.per_path
                .iter()
                .enumerate()
                .map(|(i, n)| (per_path(i), r(n))),
        )?;
        metrics::counters(
            &mut e,
            "qgate_gateway_path_bytes",
            "request body bytes forwarded on each path",
            gw.per_path_bytes
                .iter()
                .enumerate()
                .map(|(i, n)| (per_path(i), r(n))),
        )?;
        let shaped: Vec<(usize, qgate_link::LinkStats, u64)> = gw
            .shapers
            .iter()
            .enumerate()
            .filter_map(|(i, h)| {
                h.as_ref()
                    .map(|h| (i, h.stats(), h.backlog_packets() as u64))
            })
            .collect();
        let by_shaper = |f: fn(&qgate_link::LinkStats, u64) -> u64| {
            shaped.iter().map(move |(i, s, b)| (per_path(*i), f(s, *b)))
        };
        metrics::counters(
            &mut e,
            "qgate_gateway_shaper_dropped",
            "packets the path's egress shaper dropped (queue limit or AQM)",
            by_shaper(|s, _| s.dropped_queue),
        )?;
        metrics::counters(
            &mut e,
            "qgate_gateway_shaper_marked",
            "packets the path's egress shaper marked CE",
            by_shaper(|s, _| s.marked),
        )?;
        metrics::counters(
            &mut e,
            "qgate_gateway_shaper_sent",
            "packets offered to the path's egress shaper",
            by_shaper(|s, _| s.sent),
        )?;
        metrics::gauges(
            &mut e,
            "qgate_gateway_shaper_queue_packets",
            "packets queued in the path's egress shaper",
            by_shaper(|_, b| b),
        )?;
        let (sessions, (conns, addrs)) = gw.paths.with_core(|f| {
            let t = f.sessions();
            (t.len(), t.owners())
        });
        metrics::gauge(
            &mut e,
            "qgate_gateway_sessions",
            "registered devices",
            sessions as u64,
        )?;
        metrics::gauge(
            &mut e,
            "qgate_gateway_session_connections",
            "device connections holding sessions",
            conns as u64,
        )?;
        metrics::gauge(
            &mut e,
            "qgate_gateway_session_addresses",
            "source addresses holding sessions",
            addrs as u64,
        )?;
        let limits = gw.cfg.session_limits();
        for (name, v) in [
            ("qgate_gateway_limit_max_devices", limits.max_devices),
            (
                "qgate_gateway_limit_max_sessions_per_connection",
                limits.per_connection,
            ),
            (
                "qgate_gateway_limit_max_sessions_per_address",
                limits.per_address,
            ),
            (
                "qgate_gateway_limit_max_inflight_per_device",
                limits.max_inflight,
            ),
            ("qgate_gateway_limit_max_handshakes", gw.cfg.max_handshakes),
            ("qgate_gateway_limit_retry_above", gw.cfg.retry_above),
        ] {
            metrics::gauge(&mut e, name, "configured limit", v as u64)?;
        }
        if let Some(ep) = gw.endpoint.get() {
            metrics::gauge(
                &mut e,
                "qgate_gateway_handshakes",
                "device handshakes in progress",
                ep.handshaking.load(Ordering::Relaxed) as u64,
            )?;
            metrics::gauge(
                &mut e,
                "qgate_gateway_device_connections",
                "established device connections",
                ep.established.load(Ordering::Relaxed) as u64,
            )?;
            for (name, help, v) in [
                (
                    "qgate_gateway_retries_sent",
                    "QUIC Retry packets sent to unproved device addresses",
                    &ep.retries,
                ),
                (
                    "qgate_gateway_connections_refused",
                    "device connections refused: every slot taken",
                    &ep.refused_full,
                ),
                (
                    "qgate_gateway_handshakes_ignored",
                    "device Initials ignored: handshake budget spent",
                    &ep.ignored_busy,
                ),
                (
                    "qgate_gateway_handshake_timeouts",
                    "device handshakes closed at their deadline",
                    &ep.handshake_timeouts,
                ),
            ] {
                metrics::counter(&mut e, name, help, r(v))?;
            }
        }
        metrics::counter(
            &mut e,
            "qgate_gateway_bodies_gave_way",
            "device request bodies cut off (503) to make room for another address's, theirs holding the most of the body budget (decision T13)",
            gw.bodies.gave_way(),
        )?;
        let suppressed: u64 = lock(&gw.logs).0.iter().map(LogGate::suppressed).sum();
        metrics::counter(
            &mut e,
            "qgate_gateway_log_lines_suppressed",
            "warnings left out by the log rate limit",
            suppressed,
        )?;
        let st = &gw.stats;
        st.snapshot().encode(&mut e)?;
        gw.batch_stats.snapshot().encode(&mut e)?;
        metrics::histograms(
            &mut e,
            "qgate_gateway_response_delay_seconds",
            "device request in to response out",
            [
                ([("class", "priority")], &st.delay_priority.hist),
                ([("class", "best_effort")], &st.delay_best_effort.hist),
            ],
        )
    }
}

impl Handler for DeviceConnection {
    async fn handle(&self, req: Request<()>, body: Bytes, peer: SocketAddr) -> Response<Bytes> {
        match (req.method().as_str(), req.uri().path()) {
            ("POST", "/register") => self.gw.register(&req, self),
            // The gateway's own route to the server: a device's batch would name other
            // devices and request ids, and could take ids the gateway's records need (G23).
            (_, qgate_core::batch::BATCH_PATH) => text(
                StatusCode::NOT_FOUND,
                format!("no route {} for devices\n", qgate_core::batch::BATCH_PATH),
            ),
            _ => self.gw.forward(req, body, self, peer).await,
        }
    }
}

mod view;
pub use view::{ConnectionView, PathView, SessionView};

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
