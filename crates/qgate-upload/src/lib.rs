//! The device side of qgate's multi-homed two-ended upload (paper 001): one QUIC connection per
//! interface ("lane"), each bound to its own local address; the sans-IO
//! [`Planner`](qgate_core::upload::Planner) says which chunk each lane sends next, lane 0
//! from the front of the file and lane 1 from the back, until they meet. Each chunk is one
//! HTTP/3 request to `qgate server` (protocol: `qgate_core::upload`, decision U1), read from
//! the file when it is sent. A lane whose connection fails gives its unconfirmed chunks back
//! to the planner and reconnects; an upload that was interrupted resumes with what the server
//! already holds.
//!
//! `Upload::builder()` is the one way to run one: `qgate upload`, the lab and the tests.

mod source;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use qgate_core::upload::{FileInfo, Held, Planner, HELD_HEADER, MAX_LANES};
use qgate_transport::http3::{H3Client, H3Error, ALPN_H3};
use qgate_transport::{client_config, connect, endpoint, Socket, TransportOptions, TrustRoots};
use tokio::sync::Notify;
use tokio::time::Instant;

pub use source::{sha256, Source};

/// Why an upload failed; the message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    /// The upload was not set up right.
    #[error("{0}")]
    Setup(String),
    /// The server refused it (a different file under the name, a chunk outside the file, over
    /// its limits, a checksum mismatch, …).
    #[error("the server answered {status}: {message}")]
    Refused {
        /// The status.
        status: http::StatusCode,
        /// The server's explanation.
        message: String,
    },
    /// Reading the file failed.
    #[error("reading the file: {0}")]
    Source(std::io::Error),
    /// No lane could reach the server.
    #[error("no interface reached the server: {0}")]
    Unreachable(String),
    /// Every chunk was accepted but the server did not confirm the file.
    #[error("every chunk was sent but the server did not confirm the file: {0}")]
    Unconfirmed(String),
}

/// One lane: the socket bound to one interface's address, and the server's address as seen
/// through that interface.
pub struct Lane {
    /// The socket (bound to the interface's address).
    pub socket: Socket,
    /// The server.
    pub server: SocketAddr,
    /// A socket on another interface: when this lane's path stalls, its connection migrates
    /// there (QUIC connection migration, RFC 9000 §9) and later tries its own path again.
    pub backup: Option<Socket>,
}

/// Live counters of an upload, readable while it runs (progress bars, the lab's series).
#[derive(Debug, Default)]
pub struct Progress {
    lanes: [LaneCounters; MAX_LANES],
    held_at_start: AtomicU64,
}

/// One lane's counters.
#[derive(Debug, Default)]
pub struct LaneCounters {
    /// Chunks the server confirmed from this lane.
    pub chunks: AtomicU64,
    /// Their bytes.
    pub bytes: AtomicU64,
    /// Whether the lane's connection is up.
    pub up: AtomicBool,
    /// Connections made (1 + reconnections).
    pub connects: AtomicU64,
    /// Requests that failed and were given back to the planner.
    pub failed: AtomicU64,
    /// Connection attempts that failed.
    pub connect_failures: AtomicU64,
    /// Migrations to the backup interface.
    pub migrations: AtomicU64,
    /// Whether the lane's connection is on its backup interface now.
    pub on_backup: AtomicBool,
    /// Requests cancelled because another lane took their chunk over, or because another
    /// lane's copy of it arrived first.
    pub taken_away: AtomicU64,
    /// End-game copies of another lane's last chunk this lane sent (decision U11).
    pub copies: AtomicU64,
}

impl Progress {
    /// Lane `i`'s counters.
    pub fn lane(&self, i: usize) -> &LaneCounters {
        &self.lanes[i]
    }

    /// Bytes the server held before this run (a resumed upload).
    pub fn held_at_start(&self) -> u64 {
        self.held_at_start.load(Ordering::Relaxed)
    }

    /// Bytes confirmed by all lanes in this run.
    pub fn bytes(&self) -> u64 {
        self.lanes
            .iter()
            .map(|l| l.bytes.load(Ordering::Relaxed))
            .sum()
    }
}

/// What a finished upload did.
#[derive(Debug, Clone)]
pub struct Report {
    /// Connections up → the server confirmed the file.
    pub elapsed: Duration,
    /// Bytes the server already held when it started (resumed), not sent again.
    pub resumed_bytes: u64,
    /// Per lane: chunks and bytes confirmed, requests failed, connections made.
    pub lanes: Vec<LaneReport>,
}

/// One lane's part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneReport {
    /// Chunks confirmed.
    pub chunks: u64,
    /// Bytes confirmed.
    pub bytes: u64,
    /// Requests that failed (their chunks went back to the planner).
    pub failed: u64,
    /// Connections made.
    pub connects: u64,
    /// Migrations to the backup interface.
    pub migrations: u64,
}

/// Entry point: [`Upload::builder`].
pub struct Upload;

impl Upload {
    /// A builder; name, file, lanes and trust are required.
    pub fn builder() -> UploadBuilder {
        UploadBuilder {
            lanes: Vec::new(),
            server_name: "localhost".into(),
            trust: None,
            transport: TransportOptions::default(),
            name: None,
            file: None,
            seed: None,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            progress: Arc::new(Progress::default()),
            steal: true,
            failover_after: None,
        }
    }
}

/// A chunk request that takes longer than this is given back to the planner.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// A handshake that takes longer than this (or the request timeout, if shorter) fails.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The shortest stall that moves a lane to its backup interface.
pub const FAILOVER_FLOOR: Duration = Duration::from_secs(1);
/// How long a lane stays on its backup before it tries its own interface again (doubling
/// while that keeps failing, up to 30 s).
pub const RETRY_PRIMARY: Duration = Duration::from_secs(5);

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Most chunk requests one lane keeps in flight; below that, one congestion window plus one
/// chunk, and the transport's send window (`send_window / chunk`, at least 2), bound them.
pub const MAX_IN_FLIGHT: usize = 64;

/// How often a lane with requests out looks whether its congestion window has room for more
/// chunks: a quarter of its round trip, within these bounds (decision U4).
const RECHECK_MIN: Duration = Duration::from_millis(5);
const RECHECK_MAX: Duration = Duration::from_millis(100);

/// Assembles an upload.
pub struct UploadBuilder {
    lanes: Vec<Lane>,
    server_name: String,
    trust: Option<TrustRoots>,
    transport: TransportOptions,
    name: Option<String>,
    file: Option<(FileInfo, Arc<dyn Source>)>,
    seed: Option<u64>,
    request_timeout: Duration,
    progress: Arc<Progress>,
    steal: bool,
    failover_after: Option<Duration>,
}

impl UploadBuilder {
    /// Move a lane to its backup interface when no chunk of it has been confirmed for this
    /// long while some are in flight [default: max(1 s, 8 × the connection's smoothed RTT),
    /// decision U7].
    pub fn failover_after(mut self, t: Duration) -> Self {
        self.failover_after = Some(t);
        self
    }

    /// Whether a lane with nothing left takes over the chunks another lane has queued where
    /// they meet (decision U6; default on). Off is paper 001's literal scheme.
    pub fn steal(mut self, on: bool) -> Self {
        self.steal = on;
        self
    }

    /// Add a lane (interface); lane 0 sends from the front of the file, lane 1 from the back.
    pub fn lane(mut self, lane: Lane) -> Self {
        self.lanes.push(lane);
        self
    }

    /// The name the server's certificate must carry.
    pub fn server_name(mut self, name: &str) -> Self {
        self.server_name = name.into();
        self
    }

    /// The certificate authorities to trust.
    pub fn trust(mut self, trust: TrustRoots) -> Self {
        self.trust = Some(trust);
        self
    }

    /// QUIC settings of every lane's connection (send fairness is turned off: a lane's chunks
    /// leave in order, decision U4).
    pub fn transport(mut self, transport: TransportOptions) -> Self {
        self.transport = transport;
        self
    }

    /// The file's name on the server.
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The file: its description and where to read it.
    pub fn file(mut self, info: FileInfo, source: Arc<dyn Source>) -> Self {
        self.file = Some((info, source));
        self
    }

    /// Seed quinn's choices, so a simulation repeats.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Give a chunk back to the planner when its request takes longer than this.
    pub fn request_timeout(mut self, t: Duration) -> Self {
        self.request_timeout = t;
        self
    }

    /// The live counters (keep a clone before [`UploadBuilder::run`]).
    pub fn progress(&self) -> Arc<Progress> {
        self.progress.clone()
    }

    /// Upload the file; returns when the server has confirmed it complete, verified and
    /// durable, or on the first refusal.
    pub async fn run(self) -> Result<Report, UploadError> {
        let name = self
            .name
            .ok_or(UploadError::Setup("the upload needs a name".into()))?;
        let (info, source) = self
            .file
            .ok_or(UploadError::Setup("the upload needs a file".into()))?;
        let trust = self
            .trust
            .ok_or(UploadError::Setup("the upload needs trust roots".into()))?;
        if self.lanes.is_empty() || self.lanes.len() > MAX_LANES {
            return Err(UploadError::Setup(format!(
                "an upload needs 1 to {MAX_LANES} interfaces, not {}",
                self.lanes.len()
            )));
        }
        let mut transport = self.transport;
        transport.send_fairness = false;
        let ccfg = client_config(&trust, &[ALPN_H3], &transport)
            .map_err(|e| UploadError::Setup(e.to_string()))?;
        let planner = Planner::new(info.layout, self.lanes.len())
            .map_err(|e| UploadError::Setup(e.to_string()))?;
        let chunk = info.layout.chunk_size().max(1) as usize;
        let shared = Arc::new(Shared {
            name,
            info,
            source,
            ccfg,
            transport: transport.clone(),
            server_name: self.server_name,
            planner: Mutex::new(planner),
            news: Notify::new(),
            stop: Mutex::new(None),
            confirmed: AtomicBool::new(false),
            confirmed_at: Mutex::new(None),
            first_announce: AtomicBool::new(true),
            busy_said: AtomicBool::new(false),
            progress: self.progress.clone(),
            request_timeout: self.request_timeout,
            in_flight: (transport.send_window as usize / chunk).clamp(2, MAX_IN_FLIGHT),
            chunk,
            steal: self.steal,
            failover_after: self.failover_after,
        });
        let start = Instant::now();
        let mut endpoints = Vec::new();
        let mut paths = Vec::new();
        for (i, lane) in self.lanes.into_iter().enumerate() {
            let setup = |e: qgate_transport::TransportError| {
                UploadError::Setup(format!("interface {}: {e}", i + 1))
            };
            let seed = self.seed.map(|s| s.wrapping_mul(31).wrapping_add(i as u64));
            let primary = lane.socket.into_async().map_err(setup)?;
            let backup = lane
                .backup
                .map(Socket::into_async)
                .transpose()
                .map_err(setup)?;
            let ep = endpoint(Socket::Abstract(primary.clone()), None, seed).map_err(setup)?;
            endpoints.push((ep, lane.server));
            paths.push(Paths { primary, backup });
        }
        // Rounds: the lanes send until every chunk is confirmed; if the server then does not
        // hold them all (it crashed and lost what it had not made durable), they send what it
        // lacks again.
        let mut rounds = 0;
        loop {
            let lanes = endpoints.iter().zip(paths.iter().cloned()).enumerate().map(
                |(i, ((ep, server), paths))| shared.clone().lane(i, ep.clone(), *server, paths),
            );
            futures_util::future::join_all(lanes).await;
            if let Some(e) = shared.stop.lock().expect("lock").take() {
                return Err(e);
            }
            if shared.confirmed.load(Ordering::Relaxed)
                || shared.confirm_complete(&endpoints).await?
            {
                break;
            }
            rounds += 1;
            if rounds >= MAX_ROUNDS {
                return Err(UploadError::Unconfirmed(format!(
                    "after {rounds} rounds the server still lacks chunks it had confirmed"
                )));
            }
        }
        for (ep, _) in &endpoints {
            ep.close(0u32.into(), b"done");
        }
        let p = &self.progress;
        // To the confirmation, not to when the last lane stopped (a lane in the middle of a
        // reconnection finishes its handshake first; U12).
        let confirmed_at = *shared.confirmed_at.lock().expect("lock");
        Ok(Report {
            elapsed: confirmed_at.map_or_else(|| start.elapsed(), |t| t.duration_since(start)),
            resumed_bytes: p.held_at_start(),
            lanes: (0..endpoints.len())
                .map(|i| {
                    let l = p.lane(i);
                    LaneReport {
                        chunks: l.chunks.load(Ordering::Relaxed),
                        bytes: l.bytes.load(Ordering::Relaxed),
                        failed: l.failed.load(Ordering::Relaxed),
                        connects: l.connects.load(Ordering::Relaxed),
                        migrations: l.migrations.load(Ordering::Relaxed),
                    }
                })
                .collect(),
        })
    }
}

/// What every lane shares.
struct Shared {
    name: String,
    info: FileInfo,
    source: Arc<dyn Source>,
    ccfg: quinn::ClientConfig,
    /// What `ccfg` was built from (each connection's own, with a qlog file, is built from it).
    transport: TransportOptions,
    server_name: String,
    planner: Mutex<Planner>,
    /// Woken when the planner changes in a way that may give a waiting lane work (a chunk
    /// given back, a lane down) or when the upload ends.
    news: Notify,
    /// The error that stops every lane.
    stop: Mutex<Option<UploadError>>,
    /// The server answered that the file is complete.
    confirmed: AtomicBool,
    /// When it first did (the upload's end, whatever lanes still do before they stop).
    confirmed_at: Mutex<Option<Instant>>,
    /// No announcement answered yet (what it reports held was there before this run).
    first_announce: AtomicBool,
    /// The server's "busy" answer was shown.
    busy_said: AtomicBool,
    progress: Arc<Progress>,
    request_timeout: Duration,
    /// Most chunks in flight per lane: the send window's worth (at least 2).
    in_flight: usize,
    chunk: usize,
    steal: bool,
    failover_after: Option<Duration>,
}

/// Rounds of sending before an upload whose chunks the server keeps losing gives up.
const MAX_ROUNDS: usize = 5;

/// A lane's two sockets: its own interface's and the backup's.
#[derive(Clone)]
struct Paths {
    primary: Arc<dyn quinn::AsyncUdpSocket>,
    backup: Option<Arc<dyn quinn::AsyncUdpSocket>>,
}

/// Where a lane's connection runs, and when to try its own path again.
struct Failover {
    on_backup: bool,
    /// On the backup: when to try the primary again.
    retry_at: Instant,
    /// The wait before the next retry (doubles while the primary stays dead, up to 30 s).
    retry_every: Duration,
}

/// How a chunk request ended.
enum Outcome {
    Stored {
        complete: bool,
    },
    GiveBack,
    /// Another lane took the chunk over; the request was cancelled.
    TakenAway,
    ConnectionLost,
    Refused(UploadError),
}

impl Shared {
    fn finished(&self) -> bool {
        self.stop.lock().expect("lock").is_some()
            || self.planner.lock().expect("lock").is_complete()
    }

    /// The server confirmed the file: the upload's end.
    fn mark_confirmed(&self) {
        self.confirmed.store(true, Ordering::Relaxed);
        self.confirmed_at
            .lock()
            .expect("lock")
            .get_or_insert_with(Instant::now);
    }

    fn fail(&self, e: UploadError) {
        self.stop.lock().expect("lock").get_or_insert(e);
        self.news.notify_waiters();
    }

    fn request(&self, method: http::Method, path: String) -> http::Request<()> {
        let mut b = http::Request::builder()
            .method(method)
            .uri(format!("https://{}{path}", self.server_name));
        for (k, v) in self.info.headers() {
            b = b.header(k, v);
        }
        b.body(()).expect("valid request")
    }

    /// Announce the file on `h3`: learn what the server holds (resume) or that it is done.
    async fn announce(&self, h3: &H3Client) -> Result<(), Outcome> {
        // Chunks confirmed before the question are on the server when it answers (it syncs
        // first); one confirmed meanwhile may be missing from the answer without being lost.
        let done_before: Vec<bool> = {
            let p = self.planner.lock().expect("lock");
            (0..self.info.layout.chunks())
                .map(|i| p.is_done(i))
                .collect()
        };
        let req = self.request(http::Method::POST, format!("/upload/{}", self.name));
        let r = h3
            .request_within(req, Bytes::new(), 1 << 16, self.request_timeout)
            .await
            .map_err(|_| Outcome::ConnectionLost)?;
        match r.status {
            http::StatusCode::CREATED => {
                self.mark_confirmed();
                let mut p = self.planner.lock().expect("lock");
                let mut bytes = 0;
                for i in 0..self.info.layout.chunks() {
                    if !p.is_done(i) {
                        p.confirm(i).expect("in the file");
                        bytes += self.info.layout.range(i).expect("in the file").1 as u64;
                    }
                }
                self.progress
                    .held_at_start
                    .fetch_add(bytes, Ordering::Relaxed);
                drop(p);
                self.news.notify_waiters();
                Ok(())
            }
            http::StatusCode::OK => {
                let n = self.info.layout.chunks();
                let held = r
                    .headers
                    .get(HELD_HEADER)
                    .map(|v| Held::parse(v.as_bytes(), n))
                    .unwrap_or(Ok(Held::default()))
                    .map_err(|e| {
                        Outcome::Refused(UploadError::Unconfirmed(format!(
                            "its list of held chunks is unreadable: {e}"
                        )))
                    })?;
                let mut p = self.planner.lock().expect("lock");
                let mut bytes = 0;
                let mut have = vec![false; n];
                for i in held.iter() {
                    have[i] = true;
                    if !p.is_done(i) {
                        p.confirm(i).expect("parsed below n");
                        bytes += self.info.layout.range(i).expect("in the file").1 as u64;
                    }
                }
                // The held list is what is durable: a chunk confirmed before and missing now
                // was lost (a crash) and goes out again.
                for (i, h) in have.iter().enumerate() {
                    if !h && done_before[i] && p.is_done(i) {
                        p.unconfirm(i).expect("in the file");
                    }
                }
                if self.first_announce.swap(false, Ordering::Relaxed) {
                    self.progress
                        .held_at_start
                        .fetch_add(bytes, Ordering::Relaxed);
                }
                // Lanes waiting for work see chunks the server lost (a crash), or the end.
                drop(p);
                self.news.notify_waiters();
                Ok(())
            }
            // Busy, or no disk room (S11): say why once, try again later.
            http::StatusCode::SERVICE_UNAVAILABLE | http::StatusCode::INSUFFICIENT_STORAGE => {
                if !self.busy_said.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "the server cannot take it now ({}); trying again",
                        String::from_utf8_lossy(&r.body).trim()
                    );
                }
                Err(Outcome::GiveBack)
            }
            status => Err(Outcome::Refused(refused(status, &r.body))),
        }
    }

    /// Completes when the upload is finished (complete or stopped).
    async fn until_finished(&self) {
        loop {
            let news = self.news.notified();
            tokio::pin!(news);
            news.as_mut().enable();
            if self.finished() {
                return;
            }
            news.await;
        }
    }

    /// Completes when `lane` no longer sends `chunk` (another lane stole it, another lane's
    /// copy of it arrived first, or it failed).
    async fn taken_away(&self, lane: usize, chunk: usize) {
        loop {
            let news = self.news.notified();
            tokio::pin!(news);
            news.as_mut().enable();
            if !self.planner.lock().expect("lock").sends(lane, chunk) {
                return;
            }
            news.await;
        }
    }

    async fn put(&self, h3: &H3Client, lane: usize, chunk: usize, data: Bytes) -> Outcome {
        let req = self.request(http::Method::PUT, format!("/upload/{}/{chunk}", self.name));
        match h3
            .request_cancellable(
                req,
                data,
                1 << 16,
                self.request_timeout,
                self.taken_away(lane, chunk),
            )
            .await
        {
            Err(H3Error::Cancelled) => Outcome::TakenAway,
            Ok(r) if r.status == http::StatusCode::OK => Outcome::Stored { complete: false },
            Ok(r) if r.status == http::StatusCode::CREATED => Outcome::Stored { complete: true },
            Ok(r)
                if r.status == http::StatusCode::SERVICE_UNAVAILABLE
                    || r.status == http::StatusCode::INSUFFICIENT_STORAGE =>
            {
                Outcome::GiveBack
            }
            Ok(r) => Outcome::Refused(refused(r.status, &r.body)),
            Err(_) if h3.is_closed() => Outcome::ConnectionLost,
            // No answer for the whole timeout: treat the connection as dead, so other lanes
            // take its chunks while this one reconnects.
            Err(H3Error::TimedOut(_)) => Outcome::ConnectionLost,
            Err(_) => Outcome::GiveBack,
        }
    }

    /// Lane `i`: connect, send what the planner gives it, reconnect after a failure, until
    /// the file is complete or the upload stops.
    async fn lane(
        self: Arc<Self>,
        i: usize,
        ep: quinn::Endpoint,
        server: SocketAddr,
        paths: Paths,
    ) {
        let mut failover = Failover {
            on_backup: false,
            retry_at: Instant::now(),
            retry_every: RETRY_PRIMARY,
        };
        let counters = self.progress.lane(i);
        let mut backoff = Duration::from_millis(250);
        // Since when this lane has failed to reach the server, said once as it starts (a
        // server gone mid-upload is retried without end, so the user must hear of it).
        let mut down_since: Option<Instant> = None;
        while !self.finished() {
            let news = self.news.notified();
            tokio::pin!(news);
            news.as_mut().enable();
            // A lane still connecting when the others finish the file stops at once.
            let attempt = tokio::select! {
                biased;
                r = self.connect(&ep, server) => r,
                () = self.until_finished() => break,
            };
            let h3 = match attempt {
                Ok(h3) => h3,
                Err(e) => {
                    if down_since.is_none() {
                        tracing::warn!(lane = i + 1, error = %e, "cannot reach the server; retrying");
                        down_since = Some(Instant::now());
                    }
                    counters.connect_failures.fetch_add(1, Ordering::Relaxed);
                    self.planner.lock().expect("lock").fail(i).expect("lane");
                    self.news.notify_waiters();
                    if self.never_reached() {
                        self.fail(UploadError::Unreachable(e));
                        return;
                    }
                    tokio::select! {
                        biased;
                        _ = tokio::time::sleep(backoff) => {}
                        _ = &mut news => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(4));
                    continue;
                }
            };
            if let Some(t) = down_since.take() {
                if counters.connects.load(Ordering::Relaxed) > 0 {
                    tracing::warn!(lane = i + 1, after = ?t.elapsed(), "reached the server again");
                }
            }
            counters.connects.fetch_add(1, Ordering::Relaxed);
            counters.up.store(true, Ordering::Relaxed);
            self.planner.lock().expect("lock").restore(i).expect("lane");
            if !self.first_announce.load(Ordering::Relaxed) {
                // Another lane's announcement was answered in this run, so this one only
                // refreshes the held list: send meanwhile (chunks carry the file's
                // description), which saves a long path a round trip (decision U3).
                let refresh = async {
                    tokio::select! {
                        biased;
                        r = self.announce(&h3) => {
                            if let Err(Outcome::Refused(e)) = r {
                                self.fail(e);
                            }
                        }
                        () = self.until_finished() => {}
                    }
                };
                backoff = Duration::from_millis(250);
                tokio::join!(refresh, self.send(i, &h3, &ep, &paths, &mut failover));
                counters.up.store(false, Ordering::Relaxed);
                h3.close();
                continue;
            }
            let announced = tokio::select! {
                biased;
                r = self.announce(&h3) => r,
                () = self.until_finished() => break,
            };
            if let Err(o) = announced {
                match o {
                    Outcome::Refused(e) => return self.fail(e),
                    _ => {
                        counters.up.store(false, Ordering::Relaxed);
                        h3.close();
                        tokio::select! {
                            biased;
                            _ = tokio::time::sleep(backoff) => {}
                            () = self.until_finished() => break,
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(4));
                        continue;
                    }
                }
            }
            // Answered: the next failure starts its backoff afresh (a busy server that accepts
            // connections is not retried every 250 ms).
            backoff = Duration::from_millis(250);
            self.send(i, &h3, &ep, &paths, &mut failover).await;
            counters.up.store(false, Ordering::Relaxed);
            h3.close();
        }
        self.news.notify_waiters();
    }

    /// Whether every lane has tried to connect, failed, and none ever connected: the server
    /// is out of reach, not one path.
    fn never_reached(&self) -> bool {
        let n = self.planner.lock().expect("lock").lanes();
        (0..n).all(|l| {
            let c = self.progress.lane(l);
            c.connects.load(Ordering::Relaxed) == 0
                && c.connect_failures.load(Ordering::Relaxed) > 0
        })
    }

    async fn connect(&self, ep: &quinn::Endpoint, server: SocketAddr) -> Result<H3Client, String> {
        let limit = self.request_timeout.min(CONNECT_TIMEOUT);
        let peer = format!("{}@{server}", self.server_name);
        let ccfg = qgate_transport::client_config_for(&self.ccfg, &self.transport, &peer)
            .map_err(|e| e.to_string())?;
        let c = tokio::time::timeout(limit, connect(ep, &ccfg, server, &self.server_name, false))
            .await
            .map_err(|_| format!("no handshake with {server} within {limit:?}"))?
            .map_err(|e| e.to_string())?;
        H3Client::new(c.connection().clone())
            .await
            .map_err(|e| e.to_string())
    }

    /// Send chunks on `h3` until the planner has none for this lane and none are in flight,
    /// or the connection is lost.
    async fn send(
        &self,
        i: usize,
        h3: &H3Client,
        ep: &quinn::Endpoint,
        paths: &Paths,
        failover: &mut Failover,
    ) {
        let counters = self.progress.lane(i);
        let mut flight = FuturesUnordered::new();
        let mut last_progress = Instant::now();
        loop {
            // Listen before asking the planner, so news between the two is not missed.
            let news = self.news.notified();
            tokio::pin!(news);
            news.as_mut().enable();
            // Claim chunks only as the path takes them: one congestion window plus one chunk
            // in flight, within the send window (decision U4). A chunk claimed early would sit
            // in this lane's send buffer while the other lane could have sent it.
            let cwnd = h3.connection().stats().path.cwnd as usize;
            let cap = (cwnd.div_ceil(self.chunk) + 1).min(self.in_flight);
            // Whether the window, not the planner, stopped the claims.
            let mut capped = true;
            while flight.len() < cap && self.stop.lock().expect("lock").is_none() {
                let (next, stolen) = {
                    let mut p = self.planner.lock().expect("lock");
                    match p.next(i).expect("lane") {
                        Some(c) => (Some(c), false),
                        None if self.steal => match p.steal(i).expect("lane") {
                            Some(c) => (Some(c), true),
                            // Nothing to steal: the end game, a copy of the chunk another
                            // lane will finish last (decision U11).
                            None => {
                                let copy = p.copy(i).expect("lane");
                                if copy.is_some() {
                                    counters.copies.fetch_add(1, Ordering::Relaxed);
                                }
                                (copy, false)
                            }
                        },
                        None => (None, false),
                    }
                };
                let Some(c) = next else {
                    capped = false;
                    break;
                };
                if stolen {
                    // The victim's request watches for this.
                    self.news.notify_waiters();
                }
                let (off, len) = self.info.layout.range(c).expect("planned chunks exist");
                let data = match self.source.read_at(off, len) {
                    Ok(d) => d,
                    Err(e) => return self.fail(UploadError::Source(e)),
                };
                flight.push(async move { (c, len, self.put(h3, i, c, data).await) });
            }
            if flight.is_empty() {
                if self.finished() {
                    return;
                }
                news.await;
                last_progress = Instant::now();
                continue;
            }
            // Stalled on its own path: migrate to the backup. On the backup: try the own path
            // again from time to time (decision U7).
            let stall = self
                .failover_after
                .unwrap_or_else(|| (h3.connection().rtt() * 8).max(FAILOVER_FLOOR));
            let switch_at = match (&paths.backup, failover.on_backup) {
                (Some(_), false) => Some(last_progress + stall),
                (Some(_), true) => Some(failover.retry_at),
                (None, _) => None,
            };
            // The window grows while requests are out (slow start doubles it every round
            // trip): look again a few times per round trip, or the lane would wait for a
            // whole chunk's answer, run dry and stop the window's growth.
            let recheck = (capped && flight.len() < self.in_flight).then(|| {
                Instant::now() + (h3.connection().rtt() / 4).clamp(RECHECK_MIN, RECHECK_MAX)
            });
            let next = tokio::select! {
                biased;
                n = flight.next() => n,
                _ = sleep_until_opt(recheck) => continue,
                _ = sleep_until_opt(switch_at) => {
                    let backup = paths.backup.clone().expect("a switch needs a backup");
                    if failover.on_backup {
                        tracing::info!(lane = i + 1, "trying the lane's own interface again");
                        if ep.rebind_abstract(paths.primary.clone()).is_ok() {
                            failover.on_backup = false;
                            counters.on_backup.store(false, Ordering::Relaxed);
                        }
                    } else {
                        tracing::info!(lane = i + 1, ?stall, "no progress: moving to the backup interface");
                        if ep.rebind_abstract(backup).is_ok() {
                            // A primary that failed right after a retry waits longer next time.
                            let recent = failover.retry_at + stall * 2 > Instant::now();
                            failover.retry_every = if recent {
                                (failover.retry_every * 2).min(Duration::from_secs(30))
                            } else {
                                RETRY_PRIMARY
                            };
                            failover.on_backup = true;
                            failover.retry_at = Instant::now() + failover.retry_every;
                            counters.migrations.fetch_add(1, Ordering::Relaxed);
                            counters.on_backup.store(true, Ordering::Relaxed);
                        }
                    }
                    last_progress = Instant::now();
                    continue;
                }
            };
            let Some((c, len, outcome)) = next else {
                continue;
            };
            last_progress = Instant::now();
            match outcome {
                Outcome::Stored { complete } => {
                    let (first, shared) = {
                        let mut p = self.planner.lock().expect("lock");
                        let first = !p.is_done(c);
                        // Another lane sending it too (a copy) stops at this news.
                        let shared = (0..p.lanes()).any(|l| l != i && p.sends(l, c));
                        p.confirm(c).expect("chunk");
                        (first, shared)
                    };
                    if shared {
                        self.news.notify_waiters();
                    }
                    // A chunk another lane already had confirmed (a take-over that crossed the
                    // original's answer) counts once, for the first.
                    if first {
                        counters.chunks.fetch_add(1, Ordering::Relaxed);
                        counters.bytes.fetch_add(len as u64, Ordering::Relaxed);
                    }
                    if complete {
                        self.mark_confirmed();
                    }
                    if self.finished() {
                        self.news.notify_waiters();
                    }
                }
                Outcome::GiveBack => {
                    counters.failed.fetch_add(1, Ordering::Relaxed);
                    self.planner
                        .lock()
                        .expect("lock")
                        .release(i, c)
                        .expect("lane");
                    self.news.notify_waiters();
                    if h3.is_closed() {
                        return self.lost(i);
                    }
                }
                Outcome::ConnectionLost => {
                    counters.failed.fetch_add(1, Ordering::Relaxed);
                    return self.lost(i);
                }
                Outcome::TakenAway => {
                    counters.taken_away.fetch_add(1, Ordering::Relaxed);
                }
                Outcome::Refused(e) => return self.fail(e),
            }
        }
    }

    /// The lane's connection is gone: its unconfirmed chunks go back to the planner.
    fn lost(&self, i: usize) {
        self.planner.lock().expect("lock").fail(i).expect("lane");
        self.news.notify_waiters();
    }

    /// Ask the server, on any lane, whether the file is complete.
    async fn confirm_complete(
        &self,
        endpoints: &[(quinn::Endpoint, SocketAddr)],
    ) -> Result<bool, UploadError> {
        let mut last = String::from("no interface reached it");
        for (ep, server) in endpoints {
            let h3 = match self.connect(ep, *server).await {
                Ok(h) => h,
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            let answer = self.announce(&h3).await;
            h3.close();
            match answer {
                Ok(()) if self.confirmed.load(Ordering::Relaxed) => return Ok(true),
                // It answered which chunks it holds; the planner now lacks the others.
                Ok(()) => return Ok(false),
                Err(Outcome::Refused(e)) => return Err(e),
                Err(_) => last = "no answer to the announcement".into(),
            }
        }
        Err(UploadError::Unconfirmed(last))
    }
}

fn body_text(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(500)])
        .trim()
        .to_string()
}

fn refused(status: http::StatusCode, body: &[u8]) -> UploadError {
    UploadError::Refused {
        status,
        message: body_text(body),
    }
}
