//! Device-facing side of the gateway (paper 000 §3.3–3.4): the shell of the sans-IO
//! [`Forwarder`](qgate_forward::forwarder::Forwarder) (registration, sessions, the scheduler, hits, retries and request ids, under
//! one lock) that carries each request over the path it chose, and again on another path with
//! the same request id when that one fails.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use qgate_core::loggate::LogGate;
use qgate_forward::forwarder::{Attempt, Outcome, RequestId, Step};
use qgate_forward::path::PathId;
use qgate_forward::session::{ConnId, HashId, SessionError};
use qgate_transport::http3::{self, H3Client, H3Error, Handler, ServeLimits};
use qgate_transport::peer_id;
use qgate_transport::shared_driver::{self, EndpointStats};
use tokio::time::Instant;

use crate::answer::Answer;
use crate::batcher::{self, BatchStats, Batcher};
use crate::paths::{Lease, PathManager};
use qgate_core::sync::lock;

use crate::outbound::{self, Facts};
use qgate_forward::protocol::{self as wire, Registered, REQUEST_ID_HEADER};
pub use qgate_forward::protocol::{HASH_ID_HEADER, PRIORITY_HEADER};

/// Kinds of log line that a peer can cause at will, each rate-limited (decision G11).
#[derive(Debug, Clone, Copy)]
enum Noise {
    Registration,
    Refused,
    Failed,
    /// Refused for want of a usable identity: its own budget, so a flood of bad credentials
    /// hides no other refusal.
    Unauthenticated,
}

/// The log gates, one per [`Noise`]: each kind of line at most 10 times a minute.
struct LogGates([LogGate; 4]);

impl Default for LogGates {
    fn default() -> Self {
        LogGates([const { LogGate::new(10, Duration::from_secs(60)) }; 4])
    }
}

/// Before this (2025-01-01, Unix seconds) the gateway's clock cannot be right: credential
/// expiries are not checked against it.
const SANE_CLOCK: u64 = 1_735_689_600;

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
    conns: Mutex<std::collections::HashMap<ConnId, (shared_driver::Connection, Known)>>,
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
    /// Where records go when no path can take them (issue 50), if the gateway has one.
    pub(crate) spool: Option<qgate_spool::Spool>,
    /// The MQTT door's counters, once it has one (issue 51).
    mqtt: std::sync::OnceLock<Arc<crate::mqtt::MqttStats>>,
    /// Whether devices authenticate with certificates (set by the builder, decision G30).
    pub(crate) devices_authenticated: bool,
    /// Whether devices may present certificates (a device CA is set, decision G30).
    pub(crate) devices_by_certificate: bool,
    /// The key device tokens are checked with, if devices may use tokens (decision G33).
    pub(crate) device_tokens: Option<qgate_transport::token::TokenKey>,
    /// The wall clock at start (ms since the Unix epoch) and the runtime's clock then: spooled
    /// records' ages follow the runtime's clock, so they run in virtual time too.
    epoch: (Instant, u64),
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
            bodies: http3::BodyBudget::new(cfg.max_buffered),
            spool: None,
            mqtt: std::sync::OnceLock::new(),
            devices_authenticated: false,
            devices_by_certificate: false,
            device_tokens: None,
            epoch: (
                Instant::now(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64),
            ),
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
            let known = Known::default();
            let handler = Arc::new(DeviceConnection {
                gw: self.clone(),
                id,
                conn: conn.clone(),
                identity: known.clone(),
            });
            let limits = limits.clone();
            lock(&self.conns).insert(id, (conn.clone(), known));
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

    /// Its limits and timeouts.
    pub fn config(&self) -> &GatewayConfig {
        &self.cfg
    }

    /// An id for a new door connection (any door's): sessions are bound to it.
    pub fn next_connection_id(&self) -> ConnId {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    /// A door's connection `conn` closed: its sessions end.
    pub fn end_connection(&self, conn: ConnId) {
        self.end_sessions(conn);
    }

    /// The MQTT door's counters (made on first use; on `/metrics` from then on).
    pub fn mqtt_stats(&self) -> Arc<crate::mqtt::MqttStats> {
        self.mqtt.get_or_init(Arc::default).clone()
    }

    /// The MQTT door's counters, if it has one.
    pub(crate) fn mqtt_stats_if_any(&self) -> Option<&Arc<crate::mqtt::MqttStats>> {
        self.mqtt.get()
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
        self.registration_refusal(device, e).into_response()
    }

    /// Count a refused registration (or first-use session) and say why.
    pub fn registration_refusal(&self, device: SocketAddr, e: SessionError) -> Refusal {
        self.stats
            .registrations_refused
            .fetch_add(1, Ordering::Relaxed);
        noisy_warn!(self, Noise::Registration, %device, error = %e, "registration refused");
        let status = match e {
            SessionError::Full(_) => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::TOO_MANY_REQUESTS,
        };
        Refusal {
            status,
            reason: format!("{e}\n"),
            retry_after: None,
            session: Some(e),
        }
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
        self.refusal(conn, device, e).into_response()
    }

    /// Count a refused request and say why.
    pub(crate) fn refusal(&self, conn: ConnId, device: SocketAddr, e: SessionError) -> Refusal {
        self.stats.refused.fetch_add(1, Ordering::Relaxed);
        noisy_warn!(self, Noise::Refused, %device, conn, error = %e, "request refused");
        let status = match e {
            SessionError::Malformed(_) => StatusCode::BAD_REQUEST,
            SessionError::Forged => StatusCode::FORBIDDEN,
            SessionError::InFlight(_) => StatusCode::TOO_MANY_REQUESTS,
            _ => StatusCode::UNAUTHORIZED,
        };
        let mut reason = format!("{e}\n");
        if e == SessionError::Unknown {
            reason.push_str(&format!(
                "register first: POST /register, then send {HASH_ID_HEADER}; or send {PRIORITY_HEADER} to register on first use\n"
            ));
        }
        Refusal {
            status,
            reason,
            retry_after: None,
            session: Some(e),
        }
    }

    /// Forward one device request: its session (named, or made on first use) and the 0-RTT
    /// rule here, then the one record pipeline ([`Gateway::ingest`]). A request that arrived
    /// in 0-RTT goes on only under the device's own request id, so a replay of it is stored
    /// once (decision G18).
    async fn forward(
        &self,
        req: Request<()>,
        body: Bytes,
        dc: &DeviceConnection,
        device: SocketAddr,
        identity: Option<Arc<str>>,
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
        let rec = DoorRecord {
            conn,
            session: hash,
            device,
            owner: identity
                .as_deref()
                .map_or_else(|| device.ip().to_string(), str::to_owned),
            identity,
            method: req.method().clone(),
            target: req
                .uri()
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .into(),
            // The id it goes under: the device's if it named one, else the gateway's.
            request_id: device_rid.map(|d| wire::forwarded_device_request_id(&d).into()),
            body,
            received: start,
        };
        let mut resp = self.ingest(rec).await.into_response();
        // The Hash ID of a session made on first use, for the device's next requests.
        if !named {
            if let Ok(v) = http::HeaderValue::from_str(&hash.to_string()) {
                resp.headers_mut().insert(HASH_ID_HEADER, v);
            }
        }
        resp
    }

    /// Carry out the core's steps for request `admitted` until one is final. With
    /// `spool_on_wait`, a request that finds no path up ends there ([`Carried::NoPath`]) instead
    /// of waiting for one: the spool takes it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn carry(
        &self,
        admitted: &mut Admitted<'_>,
        mut step: Step,
        method: &http::Method,
        mut facts: Facts,
        body: Bytes,
        batchable: bool,
        spool_on_wait: bool,
    ) -> Carried {
        loop {
            step = match step {
                Step::Send(a) => {
                    facts.path = Some(a.path.0);
                    let record = batcher::Record {
                        urgent: a.urgent,
                        facts: facts.clone(),
                        body: body.clone(),
                    };
                    match self.attempt(a, method, record, batchable).await {
                        Ok(resp) => {
                            admitted.over = true;
                            return Carried::Answered(resp);
                        }
                        Err(next) => next,
                    }
                }
                // Left to `admitted`'s drop to hand back to the core.
                Step::Wait(_) if spool_on_wait => return Carried::NoPath,
                Step::Wait(w) => {
                    tokio::time::sleep_until(Instant::from_std(w.until)).await;
                    self.paths
                        .with_core(|f| f.resume(w, Instant::now().into_std()))
                }
                // An answer comes back from `attempt`, never as a step here.
                Step::Answered(_) | Step::Failed => {
                    debug_assert!(matches!(step, Step::Failed), "{step:?}");
                    admitted.over = true;
                    return Carried::Failed;
                }
                // The session ended meanwhile (its connection closed, or it expired).
                Step::Refused(e) => {
                    admitted.over = true;
                    return Carried::Refused(e);
                }
            };
        }
    }

    /// One attempt on its path: the answer to hand the device, or the core's next step.
    async fn attempt(
        &self,
        a: Attempt,
        method: &http::Method,
        record: batcher::Record,
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

/// How carrying a request ended.
pub(crate) enum Carried {
    /// The server answered (on the path the response names).
    Answered(Response<Bytes>),
    /// No path was up (asked to stop there rather than wait).
    NoPath,
    /// Every attempt failed, or its budget ran out.
    Failed,
    /// Its session ended meanwhile.
    Refused(SessionError),
}

/// Statuses that say the server side is busy or down now, not that the record is wrong: a
/// gateway with a spool keeps the record rather than hand the failure to the device.
fn spoolable_status(s: StatusCode) -> bool {
    matches!(
        s,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    )
}

/// A request admitted by the core, abandoned on drop unless it is over (its task was dropped
/// mid-way: the device went away, or the gateway stopped).
pub(crate) struct Admitted<'a> {
    pub(crate) gw: &'a Gateway,
    pub(crate) id: RequestId,
    pub(crate) over: bool,
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

/// A device connection's identity once known (its certificate's or token's name), and until
/// when its credential holds (Unix seconds); shared with the admin port's list.
pub(crate) type Known = Arc<std::sync::OnceLock<(Arc<str>, u64)>>;

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
    /// The identity its certificate or token names, once read, and until when.
    identity: Known,
}

impl DeviceConnection {
    /// The device's identity when the gateway authenticates devices (decisions G30, G33):
    /// `Ok(None)` when it does not, `Err` (the answer) when this connection has no usable
    /// identity now. A connection's identity is its certificate's, else that of the first valid
    /// token it sends, and stays; it is checked against the credential's end on every request
    /// (a resumed TLS session keeps a certificate TLS does not check again, and a connection
    /// may outlive a token).
    fn identity(&self, req: &Request<()>) -> Result<Option<Arc<str>>, Box<Response<Bytes>>> {
        if !self.gw.devices_authenticated {
            return Ok(None);
        }
        let tokens = self.gw.device_tokens.as_ref();
        let refuse = |status: StatusCode, why: &str| {
            let device = self.conn.remote_address();
            noisy_warn!(self.gw, Noise::Unauthenticated, %device, error = %why, "device refused: no usable identity");
            self.gw
                .stats
                .unauthenticated
                .fetch_add(1, Ordering::Relaxed);
            let mut r = text(status, format!("{why}\n"));
            if status == StatusCode::UNAUTHORIZED && tokens.is_some() {
                r.headers_mut().insert(
                    http::header::WWW_AUTHENTICATE,
                    http::HeaderValue::from_static("Bearer error=\"invalid_token\""),
                );
            }
            Err(Box::new(r))
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if now < SANE_CLOCK {
            // Every expiry would pass: fail closed until the clock is set.
            return refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "the gateway's clock is not set: it cannot check credentials",
            );
        }
        let keep = |id: peer_id::Identified| {
            let (name, _) = self.identity.get_or_init(|| (id.name.into(), id.until));
            Ok(Some(name.clone()))
        };
        if let Some((name, until)) = self.identity.get() {
            return if now < *until {
                Ok(Some(name.clone()))
            } else {
                refuse(
                    StatusCode::UNAUTHORIZED,
                    "this connection's credential has expired: connect again with a valid one",
                )
            };
        }
        match peer_id::peer_identity(self.conn.peer_identity()) {
            Some(Ok(id)) if now < id.until => return keep(id),
            Some(Ok(_)) => {
                return refuse(
                    StatusCode::UNAUTHORIZED,
                    "the client certificate has expired",
                )
            }
            Some(Err(e)) => return refuse(StatusCode::FORBIDDEN, &e.to_string()),
            None => {}
        }
        if let Some(key) = tokens {
            let bearer = req
                .headers()
                .get(http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split_once(' '))
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"));
            if let Some((_, token)) = bearer {
                return match key.verify(token.trim(), now) {
                    Ok(id) => keep(id),
                    Err(e) => refuse(StatusCode::UNAUTHORIZED, &e.to_string()),
                };
            }
            return refuse(
                StatusCode::UNAUTHORIZED,
                if self.gw.devices_by_certificate {
                    "this gateway takes devices with a client certificate or a token (authorization: Bearer) only"
                } else {
                    "this gateway takes devices with a token (authorization: Bearer) only"
                },
            );
        }
        if !self.conn.is_established() {
            // Early data on a connection that is not resuming an authenticated session: the
            // certificate comes with the end of the handshake (RFC 8446 §4.4.2).
            return Err(Box::new(text(
                StatusCode::from_u16(425).expect("valid status"),
                "send it again once the handshake is done: the gateway authenticates devices\n",
            )));
        }
        refuse(
            StatusCode::FORBIDDEN,
            "this gateway takes devices with a client certificate only",
        )
    }
}

impl Handler for DeviceConnection {
    async fn handle(&self, req: Request<()>, body: Bytes, peer: SocketAddr) -> Response<Bytes> {
        let identity = match self.identity(&req) {
            Ok(i) => i,
            Err(resp) => return *resp,
        };
        match (req.method().as_str(), req.uri().path()) {
            ("POST", "/register") => self.gw.register(&req, self),
            // The gateway's own route to the server: a device's batch would name other
            // devices and request ids, and could take ids the gateway's records need (G23).
            (_, qgate_forward::batch::BATCH_PATH) => text(
                StatusCode::NOT_FOUND,
                format!(
                    "no route {} for devices\n",
                    qgate_forward::batch::BATCH_PATH
                ),
            ),
            _ => self.gw.forward(req, body, self, peer, identity).await,
        }
    }
}

mod config;
mod ingest;
mod metrics;
mod spooling;
mod stats;
mod view;
pub use config::GatewayConfig;
pub use ingest::{DoorRecord, Ingested, Refusal};
pub use metrics::GatewayMetrics;
pub use stats::{DelayHistogram, GatewayStats, StatsSnapshot};
pub use view::{ConnectionView, PathView, SessionView};

#[cfg(test)]
mod tests {
    use super::*;
    use qgate_transport::TransportOptions;

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
