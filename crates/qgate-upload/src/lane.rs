//! The lanes at work: what they share, how each sends its chunks, fails over and reconnects,
//! and how the upload is confirmed.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt};
use qgate_chunks::{FileInfo, Held, Planner, HELD_HEADER};
use qgate_transport::http3::{H3Client, H3Error};
use qgate_transport::{connect, TransportOptions};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::{Progress, Source, UploadError, CONNECT_TIMEOUT, FAILOVER_FLOOR, RETRY_PRIMARY};

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// How often a lane with requests out looks whether its congestion window has room for more
/// chunks: a quarter of its round trip, within these bounds (decision U4).
const RECHECK_MIN: Duration = Duration::from_millis(5);
const RECHECK_MAX: Duration = Duration::from_millis(100);

/// What every lane shares.
pub(crate) struct Shared {
    pub(crate) name: String,
    pub(crate) info: FileInfo,
    pub(crate) source: Arc<dyn Source>,
    pub(crate) ccfg: quinn::ClientConfig,
    /// What `ccfg` was built from (each connection's own, with a qlog file, is built from it).
    pub(crate) transport: TransportOptions,
    pub(crate) server_name: String,
    pub(crate) planner: Mutex<Planner>,
    /// Woken when the planner changes in a way that may give a waiting lane work (a chunk
    /// given back, a lane down) or when the upload ends.
    pub(crate) news: Notify,
    /// The error that stops every lane.
    pub(crate) stop: Mutex<Option<UploadError>>,
    /// The server answered that the file is complete.
    pub(crate) confirmed: AtomicBool,
    /// When it first did (the upload's end, whatever lanes still do before they stop).
    pub(crate) confirmed_at: Mutex<Option<Instant>>,
    /// No announcement answered yet (what it reports held was there before this run).
    pub(crate) first_announce: AtomicBool,
    /// The server's "busy" answer was shown.
    pub(crate) busy_said: AtomicBool,
    pub(crate) progress: Arc<Progress>,
    pub(crate) request_timeout: Duration,
    /// Most chunks in flight per lane: the send window's worth (at least 2).
    pub(crate) in_flight: usize,
    pub(crate) chunk: usize,
    pub(crate) steal: bool,
    pub(crate) failover_after: Option<Duration>,
}

/// Rounds of sending before an upload whose chunks the server keeps losing gives up.
pub(crate) const MAX_ROUNDS: usize = 5;

/// A lane's two sockets: its own interface's and the backup's.
#[derive(Clone)]
pub(crate) struct Paths {
    pub(crate) primary: Arc<dyn quinn::AsyncUdpSocket>,
    pub(crate) backup: Option<Arc<dyn quinn::AsyncUdpSocket>>,
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
    pub(crate) async fn lane(
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
    pub(crate) async fn confirm_complete(
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
