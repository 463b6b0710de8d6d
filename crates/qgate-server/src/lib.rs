//! qgate's cloud-side ingest server: HTTP/3 over QUIC; POSTed bodies are counted and, with a
//! directory sink, stored durably before they are acknowledged.
//!
//! Routes:
//! - `POST /ingest` or `POST /ingest/<name>`: store the body; `201 Created` with
//!   `{"id":N,"bytes":B}` once it is on disk (or counted, with no sink).
//! - `POST /batch`: several records a gateway forwards at once (`qgate_forward::batch`), each
//!   stored as its own `POST /ingest/<name>` would be; `200 OK` with an answer per record.
//! - `POST /upload/<name>`, `PUT /upload/<name>/<chunk>`: the two-ended multi-homed upload
//!   (paper 001; [`upload_receiver`] and `qgate_chunks`), when an upload directory is set.
//! - `GET /health`: `ok` (503 while a queue sink's broker is unreachable).
//!
//! Counters and metrics are on the admin port (`qgate_admin`), not here: a device must not
//! read them.

mod builder;
mod dedup;
mod dedup_store;
pub mod disk;
mod ingested;
mod probe_answer;
pub mod room;
pub mod sink;
pub mod upload_receiver;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use qgate_core::metrics;
use qgate_core::quota::Quota;
use qgate_forward::forwarded::Forwarded;
use qgate_forward::protocol as wire;
use qgate_transport::http3::{self, Handler, ServeLimits};

pub use builder::{
    BuildError, RunningServer, Server, ServerBuilder, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
};
pub use dedup_store::{DedupStore, DedupStoreError};
pub use ingested::Ingested;
pub use probe_answer::answer_probes;
pub use sink::{
    CountSink, DirSink, QueueSink, QueueSinkConfig, QueueSinkStats, Record, Sink, SinkError,
    Upstream, UpstreamView,
};
pub use upload_receiver::{UploadLimits, Uploads, EXPIRE_CHECK_EVERY};

qgate_core::counters! {
    /// Counters of what the server has done.
    pub struct ServerStats => StatsSnapshot {
        /// QUIC connections accepted.
        connections: counter "qgate_server_connections", "QUIC connections accepted";
        /// QUIC connections refused: every place taken, or the client's share (S10).
        connections_refused: counter "qgate_server_connections_refused",
            "QUIC connections refused: the server's limit, or the client's (address, or IPv6 /64) share";
        /// Retry packets sent: a client asked to prove its address while places are scarce (S10).
        retries: counter "qgate_server_retries",
            "QUIC Retry packets sent: a client asked to prove its address while half the connection places or more are held";
        /// All requests.
        requests: counter "qgate_server_requests", "HTTP/3 requests received";
        /// Ingest requests stored.
        ingested: counter "qgate_server_ingested", "ingest requests stored";
        /// Ingest bytes stored.
        ingested_bytes: counter "qgate_server_ingested_bytes", "ingest bytes stored";
        /// Batches of records received (`POST /batch`; their records count in `ingested`).
        batches: counter "qgate_server_batches",
            "batches of records received from gateways (their records count in qgate_server_ingested)";
        /// Retried copies of requests already stored (answered, not stored again).
        duplicates: counter "qgate_server_duplicates",
            "retried copies of stored requests (answered, not stored again)";
        /// Requests answered with an error status.
        errors: counter "qgate_server_errors", "requests answered with an error status";
        /// Upload chunks written.
        upload_chunks: counter "qgate_server_upload_chunks", "upload chunks written";
        /// Upload bytes written.
        upload_bytes: counter "qgate_server_upload_bytes", "upload bytes written";
        /// Uploads completed (verified and durable).
        uploads_completed: counter "qgate_server_uploads_completed",
            "uploads completed, verified and durable";
        /// Path probes answered.
        probes: counter "qgate_server_probes", "path probes answered";
        /// Datagrams that were not valid probes (ignored).
        bad_probes: counter "qgate_server_bad_probes", "datagrams that were not valid probes";
    }
    extra {
        /// Requests being handled now (a gauge: a graceful stop waits for it to reach 0).
        pub in_flight: AtomicU64,
    }
}

/// Counts a request in [`ServerStats::in_flight`] until dropped (also when its task is
/// cancelled).
struct InFlight<'a>(&'a AtomicU64);

impl<'a> InFlight<'a> {
    fn new(n: &'a AtomicU64) -> Self {
        n.fetch_add(1, Ordering::Relaxed);
        InFlight(n)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The ingest service: a sink and counters, answering HTTP/3 requests.
pub struct IngestService {
    sink: Arc<dyn Sink>,
    uploads: Option<Arc<Uploads>>,
    stats: Arc<ServerStats>,
    dedup: dedup::Dedup,
    durable: Option<DedupStore>,
    disk: Option<Arc<dyn disk::DiskRunner>>,
}

impl IngestService {
    /// A service storing into `sink`.
    pub fn new(sink: Arc<dyn Sink>) -> IngestService {
        IngestService {
            sink,
            uploads: None,
            stats: Arc::new(ServerStats::default()),
            // Enough for every request a gateway can retry within its timeouts.
            dedup: dedup::Dedup::new(1 << 16),
            durable: None,
            disk: None,
        }
    }

    /// Run the upload receiver's disk work through `runner` instead of tokio's blocking pool.
    pub fn with_disk_runner(mut self, runner: Arc<dyn disk::DiskRunner>) -> IngestService {
        self.disk = Some(runner);
        self
    }

    /// `f` (disk work) on the blocking pool, or through the disk runner if one was given.
    async fn storage<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, tokio::task::JoinError> {
        qgate_core::disk::run(self.disk.as_ref(), f).await
    }

    /// Also remember stored request ids in `store`, so de-duplication survives a restart.
    pub fn with_dedup_store(mut self, store: DedupStore) -> IngestService {
        self.durable = Some(store);
        self
    }

    /// Also receive uploads into `uploads`.
    pub fn with_uploads(mut self, uploads: Arc<Uploads>) -> IngestService {
        self.uploads = Some(uploads);
        self
    }

    /// The service's counters.
    pub fn stats(&self) -> Arc<ServerStats> {
        self.stats.clone()
    }

    /// The service's metrics as a registry collector (decision O1).
    pub fn collector(&self) -> ServerMetrics {
        ServerMetrics {
            stats: self.stats.clone(),
            sink: self.sink.clone(),
            budget: None,
        }
    }
}

/// Reads the ingest counters (and the queue sink's) at scrape time.
#[derive(Clone)]
pub struct ServerMetrics {
    stats: Arc<ServerStats>,
    sink: Arc<dyn Sink>,
    /// The request-body budget its connections share.
    budget: Option<http3::BodyBudget>,
}

impl std::fmt::Debug for ServerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerMetrics")
    }
}

impl ServerMetrics {
    /// Also report on `budget`, the request-body budget the server's connections share.
    pub fn with_budget(mut self, budget: http3::BodyBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Request-body bytes held now: taken from the body budget and not yet given back.
    pub fn bodies_held(&self) -> usize {
        self.budget
            .as_ref()
            .map_or(0, |b| b.total().saturating_sub(b.available()))
    }

    /// The ingest counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// The sink's upstream (the queue sink's broker), when it has one.
    pub fn upstream(&self) -> Option<UpstreamView> {
        self.sink.upstream()
    }
}

impl metrics::Collector for ServerMetrics {
    fn encode(&self, mut e: metrics::DescriptorEncoder) -> std::fmt::Result {
        self.stats.snapshot().encode(&mut e)?;
        if let Some(b) = &self.budget {
            metrics::counter(
                &mut e,
                "qgate_server_bodies_gave_way",
                "request bodies cut off (503) to make room for another client's, their client holding the most of the body budget (decision T13)",
                b.gave_way(),
            )?;
        }
        if let Some(u) = self.sink.upstream() {
            metrics::counter(
                &mut e,
                "qgate_server_queue_accepted",
                "messages the AMQP broker accepted",
                u.accepted,
            )?;
            metrics::counter(
                &mut e,
                "qgate_server_queue_failed",
                "messages the AMQP sink could not deliver (answered 503)",
                u.failed,
            )?;
            metrics::counter(
                &mut e,
                "qgate_server_queue_connects",
                "connections opened to the AMQP broker",
                u.connects,
            )?;
            metrics::gauge(
                &mut e,
                "qgate_server_queue_up",
                "1 while the link to the AMQP broker is attached",
                u64::from(u.up),
            )?;
        }
        Ok(())
    }
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Bytes> {
    Response::builder()
        .status(status)
        .header("content-type", "text/plain; charset=utf-8")
        .body(body.into())
        .expect("valid response")
}

fn json(status: StatusCode, body: String) -> Response<Bytes> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Bytes::from(body))
        .expect("valid response")
}

/// The answer to a forwarded record whose facts do not parse. A value present but malformed is
/// the sender's error: a request id ignored instead would store the record without its
/// de-duplication, and a retried copy twice (decision S7).
fn refused(e: qgate_forward::protocol::ProtocolError) -> String {
    format!("{e}\n")
}

/// The sink's record for `f` (an ingest record, its stream checked), the device being the peer
/// when no hop named one.
fn record<'a>(
    f: &Forwarded<&'a str>,
    body: &'a Bytes,
    peer: &'a str,
) -> Result<Record<'a>, String> {
    let stream = match wire::ingest_stream(f.target) {
        Some(s) => s.map_err(refused)?,
        None => return Err("a batch carries POST /ingest[/<name>] records only\n".into()),
    };
    Ok(Record {
        stream,
        body,
        request_id: f.request_id,
        device: f.device.unwrap_or(peer),
        path: f.path,
        class: f.class,
    })
}

impl Handler for IngestService {
    async fn handle(&self, req: Request<()>, body: Bytes, peer: SocketAddr) -> Response<Bytes> {
        self.stats.requests.fetch_add(1, Ordering::Relaxed);
        let _in_flight = InFlight::new(&self.stats.in_flight);
        let path = req.uri().path();
        let resp = match (req.method(), path) {
            (&Method::GET, "/health") => match self.sink.upstream() {
                Some(u) if !u.up => text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the queue sink's broker is unreachable\n",
                ),
                _ => text(StatusCode::OK, "ok\n"),
            },
            (&Method::POST, p) if wire::is_record("POST", p) => {
                let h = req.headers();
                let peer_name = peer.to_string();
                match Forwarded::parse_headers(p, |n| h.get(n).map(|v| v.as_bytes()))
                    .map_err(refused)
                    .and_then(|f| record(&f, &body, &peer_name))
                {
                    Ok(rec) => self.ingest(&rec, peer).await.to_response(),
                    Err(why) => text(StatusCode::BAD_REQUEST, why),
                }
            }
            (&Method::POST, qgate_forward::batch::BATCH_PATH) => self.batch(&body, peer).await,
            (_, qgate_forward::batch::BATCH_PATH) => {
                text(StatusCode::METHOD_NOT_ALLOWED, "use POST\n")
            }
            (m, p) if p.starts_with("/upload/") => self.upload(m, p, &req, body, peer).await,
            (_, "/health") => text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n"),
            (_, p) if p.starts_with("/ingest") => {
                text(StatusCode::METHOD_NOT_ALLOWED, "use POST\n")
            }
            _ => text(StatusCode::NOT_FOUND, format!("no route {path}\n")),
        };
        if resp.status().is_client_error() || resp.status().is_server_error() {
            self.stats.errors.fetch_add(1, Ordering::Relaxed);
        }
        resp
    }
}

impl IngestService {
    /// `POST /batch`: a gateway's records, each stored as its own `POST /ingest/<name>` would
    /// be (de-duplicated by its request id, the same header checks) and answered as that
    /// request would be, in order (decision G23): a record whose target is not an ingest stream
    /// gets that request's `400`, and the others are stored. A batch that does not parse, or
    /// has no entry, is refused whole with `400`: nothing of it is stored.
    async fn batch(&self, body: &Bytes, peer: SocketAddr) -> Response<Bytes> {
        use qgate_forward::batch;
        let entries = match batch::parse_entries(body) {
            Ok(e) if e.is_empty() => {
                return text(
                    StatusCode::BAD_REQUEST,
                    "a batch needs at least one entry\n",
                )
            }
            Ok(e) => e,
            Err(e) => return text(StatusCode::BAD_REQUEST, format!("{e}\n")),
        };
        let peer_name = peer.to_string();
        // Each record's body is a view of the batch's, not a copy.
        let bodies: Vec<Bytes> = entries.iter().map(|e| body.slice_ref(e.body)).collect();
        let records = entries.iter().zip(&bodies).map(|(e, entry_body)| {
            Forwarded::parse_entry(e)
                .map_err(refused)
                .and_then(|f| record(&f, entry_body, &peer_name))
        });
        let records: Vec<Result<Record<'_>, String>> = records.collect();
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        let answers = futures_util::future::join_all(records.iter().map(|r| async move {
            match r {
                Ok(r) => self.ingest(r, peer).await,
                Err(why) => Ingested::refused(StatusCode::BAD_REQUEST, why.clone()),
            }
        }))
        .await;
        let mut out = Vec::with_capacity(4 + answers.len() * 40);
        batch::start_results(&mut out);
        for a in &answers {
            if a.is_error() {
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
            }
            a.emit_result(&mut out);
        }
        Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/octet-stream")
            .body(Bytes::from(out))
            .expect("valid response")
    }

    /// Store one body, at most once per request id.
    async fn ingest(&self, rec: &Record<'_>, peer: SocketAddr) -> Ingested {
        let duplicate = |id: u64, bytes: usize| {
            self.stats.duplicates.fetch_add(1, Ordering::Relaxed);
            Ingested::Stored {
                id,
                bytes,
                duplicate: true,
            }
        };
        // Keyed by stream and id: the same id on another stream is another request.
        let key = rec.request_id.map(|r| format!("{}/{r}", rec.stream));
        let rid = key.as_deref();
        let mut claim = None;
        if let Some(rid) = rid {
            let c = loop {
                match self.dedup.admit(rid) {
                    dedup::Admission::Store(c) => break c,
                    dedup::Admission::Duplicate(id, n) => return duplicate(id, n),
                    dedup::Admission::Wait(w) => self.dedup.wait(rid, w).await,
                }
            };
            // Stored before a restart: the durable table remembers it.
            if let Some(d) = &self.durable {
                match d.lookup(rid) {
                    Ok(Some((id, n))) => {
                        c.finish(Some((id, n)));
                        return duplicate(id, n);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        c.finish(None);
                        tracing::error!(error = %e, "de-duplication lookup failed");
                        return Ingested::refused(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            format!("{e}\n"),
                        );
                    }
                }
            }
            claim = Some(c);
        }
        let len = rec.body.len();
        let result = self.sink.store(rec).await;
        // Settled before the durable record's await: a task cancelled there must not forget an
        // id whose body is stored (a cancelled store forgets it, so a retry is not stuck).
        if let Some(c) = claim {
            c.finish(result.as_ref().ok().map(|id| (*id, len)));
        }
        if let (Some(rid), Ok(id), Some(d)) = (rid, &result, &self.durable) {
            // The body is stored either way; a failed record only weakens de-duplication
            // across a restart, so the request is still acknowledged.
            if let Err(e) = d.record(rid, *id, len).await {
                tracing::error!(error = %e, "could not record a request id");
            }
        }
        match result {
            Ok(id) => {
                self.stats.ingested.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .ingested_bytes
                    .fetch_add(len as u64, Ordering::Relaxed);
                Ingested::Stored {
                    id,
                    bytes: len,
                    duplicate: false,
                }
            }
            Err(e) => {
                match &e {
                    SinkError::Io { .. } | SinkError::Refused(_) => {
                        tracing::error!(%peer, error = %e, "could not store an ingest body")
                    }
                    SinkError::Unavailable(_) | SinkError::TooLarge(_) => {
                        tracing::debug!(%peer, error = %e, "the queue did not take a body")
                    }
                    SinkError::Full(_) => {
                        tracing::debug!(%peer, error = %e, "a body refused for the disk's room")
                    }
                }
                Ingested::of_sink_error(&e)
            }
        }
    }
}

impl IngestService {
    /// `POST /upload/<name>` (announce) and `PUT /upload/<name>/<chunk>` (store a chunk); the
    /// disk work runs on the blocking pool (or inline, [`Self::with_disk_runner`]).
    async fn upload(
        &self,
        method: &Method,
        path: &str,
        req: &Request<()>,
        body: Bytes,
        peer: SocketAddr,
    ) -> Response<Bytes> {
        use qgate_chunks::{FileInfo, HELD_HEADER};
        let Some(uploads) = self.uploads.clone() else {
            return text(
                StatusCode::NOT_FOUND,
                "this server takes no uploads (start it with --uploads DIR)\n",
            );
        };
        let rest = &path["/upload/".len()..];
        let (name, chunk) = match rest.split_once('/') {
            Some((n, c)) => (n.to_string(), Some(c)),
            None => (rest.to_string(), None),
        };
        if !upload_receiver::valid_name(&name) {
            return text(
                StatusCode::BAD_REQUEST,
                "upload names are 1-128 characters of A-Z a-z 0-9 . _ - and do not start with '.'\n",
            );
        }
        if *method != Method::POST && *method != Method::PUT {
            return text(StatusCode::METHOD_NOT_ALLOWED, "use POST or PUT\n");
        }
        let info = match FileInfo::parse(|h| req.headers().get(h).map(|v| v.as_bytes())) {
            Ok(i) => i,
            Err(e) => return text(StatusCode::BAD_REQUEST, format!("{e}\n")),
        };
        let stats = self.stats.clone();
        let answer =
            match (method, chunk) {
                (&Method::POST, None) => {
                    self.storage(move || {
                        uploads.announce(peer.ip(), &name, &info).map(|a| match a {
                            upload_receiver::Announced::Complete => Response::builder()
                                .status(StatusCode::CREATED)
                                .body(Bytes::from("{\"complete\":true}"))
                                .expect("valid response"),
                            upload_receiver::Announced::InProgress(held) => Response::builder()
                                .status(StatusCode::OK)
                                .header(HELD_HEADER, held.to_string())
                                .body(Bytes::from(format!(
                                    "{{\"complete\":false,\"held\":{}}}",
                                    held.count()
                                )))
                                .expect("valid response"),
                        })
                    })
                    .await
                }
                (&Method::PUT, Some(c)) => {
                    let Some(index) = c
                        .parse::<usize>()
                        .ok()
                        .filter(|_| c.len() <= 9 && c.bytes().all(|b| b.is_ascii_digit()))
                    else {
                        return text(
                            StatusCode::BAD_REQUEST,
                            "the chunk number must be a decimal number\n",
                        );
                    };
                    self.storage(move || {
                        // Counted under the upload's lock, before the file can be answered
                        // complete.
                        let stored =
                            uploads.put_counting(peer.ip(), &name, &info, index, &body, |len| {
                                stats.upload_chunks.fetch_add(1, Ordering::Relaxed);
                                stats.upload_bytes.fetch_add(len as u64, Ordering::Relaxed);
                            })?;
                        Ok(match stored {
                            upload_receiver::Stored::Complete => {
                                stats.uploads_completed.fetch_add(1, Ordering::Relaxed);
                                json(StatusCode::CREATED, "{\"complete\":true}".into())
                            }
                            upload_receiver::Stored::Written => {
                                json(StatusCode::OK, "{\"stored\":true}".into())
                            }
                            upload_receiver::Stored::Duplicate => json(
                                StatusCode::OK,
                                "{\"stored\":true,\"duplicate\":true}".into(),
                            ),
                            // A copy that crossed the completing chunk (U11's end game): the file
                            // is complete, and this answer says so as well (U12).
                            upload_receiver::Stored::AlreadyComplete => json(
                                StatusCode::CREATED,
                                "{\"complete\":true,\"duplicate\":true}".into(),
                            ),
                        })
                    })
                    .await
                }
                (&Method::POST, Some(_)) | (&Method::PUT, None) => return text(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "announce with POST /upload/NAME, send chunks with PUT /upload/NAME/CHUNK\n",
                ),
                _ => return text(StatusCode::METHOD_NOT_ALLOWED, "use POST or PUT\n"),
            };
        match answer {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                if let upload_receiver::UploadFailure::Io { .. } = e {
                    tracing::error!(error = %e, "upload storage failed");
                }
                text(e.status(), format!("{e}\n"))
            }
            Err(e) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("upload task failed: {e}\n"),
            ),
        }
    }
}

/// What each incoming connection's configuration is derived from when it needs one of its own
/// (via `Incoming::accept_with`): the initial window from that client's congestion-window
/// history (paper 002), a qlog file (`opts.qlog_dir`).
pub struct PerConnection {
    /// The server configuration every connection's is derived from.
    pub base: quinn::ServerConfig,
    /// Transport settings.
    pub opts: qgate_transport::TransportOptions,
    /// The history store and the careful-resume RTT factor, if the safeguard is on.
    pub history: Option<(
        std::sync::Arc<qgate_transport::window_history::HistoryStore>,
        Option<f64>,
    )>,
}

impl PerConnection {
    /// Accept `incoming` with its own configuration; on a failure to build it (logged), with
    /// the endpoint's.
    fn accept(
        &self,
        incoming: quinn::Incoming,
    ) -> Result<quinn::Connecting, quinn::ConnectionError> {
        let peer = incoming.remote_address();
        let own = match &self.history {
            Some((store, safeguard)) => {
                let key = qgate_transport::window_history::server_peer_key(peer);
                store
                    .server_config(&self.base, &self.opts, &key, *safeguard)
                    .map(|(cfg, _)| Some(cfg))
            }
            None => qgate_transport::server_config_for(&self.base, &self.opts, &peer.to_string()),
        };
        match own {
            Ok(Some(cfg)) => incoming.accept_with(cfg),
            Ok(None) => incoming.accept(),
            Err(e) => {
                tracing::warn!(%peer, error = %e, "per-connection config failed; the endpoint's");
                incoming.accept()
            }
        }
    }
}

/// Accept QUIC connections on `endpoint` and serve HTTP/3 on each until the endpoint closes.
///
/// Requests are handled only once the handshake has completed (`incoming.await`, not
/// `into_0rtt`): an ingest POST is not idempotent, and a replayed 0-RTT flight can never complete
/// a handshake, so a replay never stores a body twice (RFC 9001 §9.2).
pub async fn serve(
    endpoint: quinn::Endpoint,
    service: Arc<IngestService>,
    limits: ServeLimits,
    per_connection: Option<Arc<PerConnection>>,
    places: Quota,
) {
    let stats = service.stats();
    serve_with(endpoint, service, stats, limits, per_connection, places).await
}

/// [`serve`] with any HTTP/3 handler in front of (or instead of) the ingest service, counting
/// connections and probes in `stats` (the lab wraps the service to observe what it stored).
pub async fn serve_with<H: Handler>(
    endpoint: quinn::Endpoint,
    service: Arc<H>,
    stats: Arc<ServerStats>,
    limits: ServeLimits,
    per_connection: Option<Arc<PerConnection>>,
    places: Quota,
) {
    while let Some(incoming) = endpoint.accept().await {
        let peer = incoming.remote_address();
        // A client that holds a place already, or any client once half the places are held,
        // first proves its address with a (stateless) Retry: Initials sent from a victim's
        // address, never completed, cannot take its share or everyone's (decision S10).
        if incoming.may_retry()
            && (places.held_by(peer.ip()) > 0 || places.held() >= places.max_total() / 2)
        {
            stats.retries.fetch_add(1, Ordering::Relaxed);
            let _ = incoming.retry();
            continue;
        }
        // A place for the whole connection, handshake included, or a refusal before any
        // state is made (decision S10).
        let place = match places.take(peer.ip()) {
            Ok(p) => p,
            Err(why) => {
                stats.connections_refused.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%peer, %why, "connection refused");
                incoming.refuse();
                continue;
            }
        };
        let (service, limits) = (service.clone(), limits.clone());
        let stats = stats.clone();
        let per_connection = per_connection.clone();
        let tasks = limits.tasks.clone();
        tasks.clone().spawn(async move {
            let _place = place;
            let connecting = match &per_connection {
                Some(p) => p.accept(incoming),
                None => incoming.accept(),
            };
            let connecting = match connecting {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "refused");
                    return;
                }
            };
            let conn = match connecting.await {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "handshake failed");
                    return;
                }
            };
            stats.connections.fetch_add(1, Ordering::Relaxed);
            tasks.spawn(answer_probes(conn.clone(), stats));
            if let Err(e) = http3::serve_connection(conn, service, limits).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}
