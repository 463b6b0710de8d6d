//! HTTP/3 client and server helpers on h3 (clients on our `quinn_streams`, servers on
//! h3-quinn), with bounded bodies.

use crate::frame_guard::{Guarded, MAX_HELD_FRAME};
use crate::holdings::{BodyId, Holdings};
use crate::quinn_streams;
use qgate_core::quota::client_key;
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::{Request, Response, StatusCode};
use qgate_core::sync::lock;

/// ALPN for HTTP/3 (RFC 9114 §3.1).
pub const ALPN_H3: &[u8] = b"h3";

/// An HTTP/3 failure; the message says at which step.
#[derive(Debug, Clone, thiserror::Error)]
pub enum H3Error {
    /// The HTTP/3 connection could not be set up or broke.
    #[error("HTTP/3 connection: {0}")]
    Connection(String),
    /// A request or response stream failed.
    #[error("HTTP/3 stream: {0}")]
    Stream(String),
    /// No response within the time allowed; the request's stream was cancelled.
    #[error("no response within {0:?}; request cancelled")]
    TimedOut(std::time::Duration),
    /// The caller cancelled the request; its stream was reset.
    #[error("request cancelled")]
    Cancelled,
    /// A body exceeded its limit.
    #[error("{what} body exceeds the limit of {limit} bytes")]
    TooLarge {
        /// "request" or "response".
        what: &'static str,
        /// The limit.
        limit: usize,
    },
    /// The server's budget of buffered request bytes is spent (or this body, waiting for
    /// room, was told to give way to another client's). No read of the body is in flight.
    #[error("the server holds too many request bytes now")]
    Busy,
    /// This body was told to give way to another client's (decision T13) while its next chunk
    /// was awaited: a read of it may be in flight, so its stream cannot be stopped with
    /// h3-quinn.
    #[error("the server needed this body's bytes for another client's")]
    GaveWay,
}

fn stream_err(e: h3::error::StreamError) -> H3Error {
    H3Error::Stream(e.to_string())
}

/// A response with its whole body.
#[derive(Debug, Clone)]
pub struct H3Response {
    /// Status code.
    pub status: StatusCode,
    /// Headers.
    pub headers: http::HeaderMap,
    /// Body.
    pub body: Bytes,
}

/// Read a body of at most `limit` bytes from a receiving stream's `poll_recv_data`.
async fn read_body<B: Buf>(
    poll: impl FnMut(&mut Context<'_>) -> Poll<Result<Option<B>, h3::error::StreamError>>,
    limit: usize,
    what: &'static str,
) -> Result<Bytes, H3Error> {
    read_body_within(poll, limit, what, None).await
}

/// [`read_body`], taking each chunk's bytes from the server's budget through `share` when one
/// is given: `H3Error::Busy` when a chunk finds no room (or the body is told to give way while
/// it waits for room), `H3Error::GaveWay` when it is told to give way to another client's
/// while waiting for its next chunk (T13).
async fn read_body_within<B: Buf>(
    mut poll: impl FnMut(&mut Context<'_>) -> Poll<Result<Option<B>, h3::error::StreamError>>,
    limit: usize,
    what: &'static str,
    mut share: Option<&mut Share<'_>>,
) -> Result<Bytes, H3Error> {
    let mut body = BytesMut::new();
    let deadline = tokio::time::Instant::now() + BODY_DEADLINE;
    loop {
        let next = std::future::poll_fn(&mut poll);
        // A server does not let a stalled or trickling body hold its budget (T7), nor one that
        // must give way to another client (T13); a client waits.
        let stall = tokio::time::Instant::now() + BODY_STALL;
        let next = match share.as_deref().map(|sh| sh.told()) {
            Some(Some(told)) => tokio::select! {
                // Told first: its bytes already count as on their way back.
                biased;
                _ = told.notified() => return Err(H3Error::GaveWay),
                r = tokio::time::timeout_at(stall.min(deadline), next) => {
                    r.map_err(|_| H3Error::TimedOut(BODY_STALL))?
                }
            },
            Some(None) => tokio::time::timeout_at(stall.min(deadline), next)
                .await
                .map_err(|_| H3Error::TimedOut(BODY_STALL))?,
            None => next.await,
        };
        let Some(mut chunk) = next.map_err(stream_err)? else {
            break;
        };
        if body.len() + chunk.remaining() > limit {
            return Err(H3Error::TooLarge { what, limit });
        }
        if let Some(sh) = share.as_deref_mut() {
            sh.take(u32::try_from(chunk.remaining()).unwrap_or(u32::MAX))
                .await?;
        }
        while chunk.has_remaining() {
            let c = chunk.chunk();
            body.extend_from_slice(c);
            let n = c.len();
            chunk.advance(n);
        }
    }
    Ok(body.freeze())
}

impl From<h3::error::StreamError> for H3Error {
    fn from(e: h3::error::StreamError) -> Self {
        stream_err(e)
    }
}

/// An HTTP/3 client on one QUIC connection. Requests may be issued concurrently (`&self`).
pub struct H3Client {
    send: h3::client::SendRequest<Guarded<quinn_streams::Opener>, Bytes>,
    conn: quinn::Connection,
    driver: tokio::task::JoinHandle<()>,
}

impl H3Client {
    /// Start HTTP/3 on an established (or 0-RTT) QUIC connection.
    pub async fn new(conn: quinn::Connection) -> Result<H3Client, H3Error> {
        // No GREASE (decision T8): aioquic never sees a body end after a trailing reserved frame.
        // The server's frames are watched as a client's are (decision T12).
        let (mut driver, send) = h3::client::builder()
            .send_grease(false)
            .max_field_section_size(MAX_HELD_FRAME)
            .build(Guarded::new(quinn_streams::Connection::new(conn.clone())))
            .await
            .map_err(|e| H3Error::Connection(e.to_string()))?;
        let driver = tokio::spawn(async move {
            let e = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
            if !e.is_h3_no_error() {
                tracing::debug!(error = %e, "HTTP/3 client connection closed");
            }
        });
        Ok(H3Client { send, conn, driver })
    }

    /// The QUIC connection underneath.
    pub fn connection(&self) -> &quinn::Connection {
        &self.conn
    }

    /// Send `req` with `body`; read the response, refusing a body over `max_response` bytes.
    pub async fn request(
        &self,
        req: Request<()>,
        body: Bytes,
        max_response: usize,
    ) -> Result<H3Response, H3Error> {
        let mut send = self.send.clone();
        let mut stream = send.send_request(req).await.map_err(stream_err)?;
        exchange(&mut stream, body, max_response).await
    }

    /// [`request`](Self::request) within `timeout`. On time-out only this request's stream is
    /// cancelled (reset and stopped with `H3_REQUEST_CANCELLED`, RFC 9114 §4.1.1): the
    /// connection and every other request on it carry on.
    pub async fn request_within(
        &self,
        req: Request<()>,
        body: Bytes,
        max_response: usize,
        timeout: std::time::Duration,
    ) -> Result<H3Response, H3Error> {
        self.request_cancellable(req, body, max_response, timeout, std::future::pending())
            .await
    }

    /// [`request_within`](Self::request_within), the request's stream sent at `urgency`
    /// before the connection's less urgent streams (quinn's stream priority: higher first;
    /// every other stream has 0). The gateway sends priority requests this way (decision G24).
    pub async fn request_within_at(
        &self,
        urgency: i32,
        req: Request<()>,
        body: Bytes,
        max_response: usize,
        timeout: std::time::Duration,
    ) -> Result<H3Response, H3Error> {
        quinn_streams::at_urgency(
            urgency,
            self.request_within(req, body, max_response, timeout),
        )
        .await
    }

    /// [`request_within`](Self::request_within) that also gives up when `cancel` completes:
    /// the stream is reset and stopped (H3_REQUEST_CANCELLED), so whatever of the body is still
    /// unsent is dropped, not sent, and the server stops sending its answer.
    pub async fn request_cancellable(
        &self,
        req: Request<()>,
        body: Bytes,
        max_response: usize,
        timeout: std::time::Duration,
        cancel: impl Future<Output = ()>,
    ) -> Result<H3Response, H3Error> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut send = self.send.clone();
        tokio::pin!(cancel);
        // Biased, here and below: the request's own progress before the cancel, so a request
        // whose answer is in is never reported cancelled, and simulated runs repeat exactly
        // (an unbiased select! draws its order from tokio's unseeded generator; decision U12).
        let mut stream = tokio::select! {
            biased;
            s = tokio::time::timeout_at(deadline, send.send_request(req)) => s
                .map_err(|_| H3Error::TimedOut(timeout))?
                .map_err(stream_err)?,
            () = &mut cancel => return Err(H3Error::Cancelled),
        };
        let outcome = tokio::select! {
            biased;
            r = tokio::time::timeout_at(deadline, exchange(&mut stream, body, max_response)) => {
                match r {
                    Ok(r) => return r,
                    Err(_) => H3Error::TimedOut(timeout),
                }
            }
            () = &mut cancel => H3Error::Cancelled,
        };
        // Both directions end with H3_REQUEST_CANCELLED. (Our client streams, `quinn_streams`,
        // hold no read across polls, so stopping one with a read pending is safe; h3-quinn
        // 0.0.10 panicked there, and this side used to go with code 0 when the stream dropped.)
        stream.stop_sending(h3::error::Code::H3_REQUEST_CANCELLED);
        stream.stop_stream(h3::error::Code::H3_REQUEST_CANCELLED);
        Err(outcome)
    }

    /// Whether this client can carry no more requests: its QUIC connection closed, or its
    /// HTTP/3 connection ended (e.g. the server's GOAWAY or a critical stream's error).
    pub fn is_closed(&self) -> bool {
        self.driver.is_finished() || self.conn.close_reason().is_some()
    }

    /// Close the connection gracefully (HTTP/3 no-error).
    pub fn close(&self) {
        self.conn.close(0x100u32.into(), b"done");
    }
}

/// Upload `body` on a request stream and read the whole response (at most `max_response`).
async fn exchange<S>(
    stream: &mut h3::client::RequestStream<S, Bytes>,
    body: Bytes,
    max_response: usize,
) -> Result<H3Response, H3Error>
where
    S: h3::quic::BidiStream<Bytes>,
{
    let mut upload = Ok(());
    if !body.is_empty() {
        upload = stream.send_data(body).await;
    }
    if upload.is_ok() {
        upload = stream.finish().await;
    }
    // A server may stop the upload and still answer (e.g. 413 with STOP_SENDING,
    // RFC 9114 §4.1.1): read the response; if there is none, report the upload's error.
    let resp = match stream.recv_response().await {
        Ok(r) => r,
        Err(e) => return Err(stream_err(upload.err().unwrap_or(e))),
    };
    let body = read_body(|cx| stream.poll_recv_data(cx), max_response, "response").await?;
    let (parts, ()) = resp.into_parts();
    Ok(H3Response {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}

impl Drop for H3Client {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// Answers HTTP/3 requests. The body arrives whole (bounded by [`ServeLimits::max_body`]).
pub trait Handler: Send + Sync + 'static {
    /// Produce the response to `req` with `body` from `peer`.
    fn handle(
        &self,
        req: Request<()>,
        body: Bytes,
        peer: SocketAddr,
    ) -> impl Future<Output = Response<Bytes>> + Send;
}

/// The largest HTTP/3 body accepted when none is configured: a request body on the server, a
/// response body in `qgate get/post`.
pub const DEFAULT_MAX_BODY: usize = 16 << 20;

/// A request body that sends nothing for this long is dropped (its bytes given back).
pub const BODY_STALL: std::time::Duration = std::time::Duration::from_secs(30);

/// A request body not complete this long after it started is dropped: a client trickling a byte
/// now and then must not hold its share of the budget for ever. Bodies too large to arrive in
/// time over a slow radio belong in the chunked upload (paper 001).
pub const BODY_DEADLINE: std::time::Duration = std::time::Duration::from_secs(300);

/// One connection's requests, by whether their headers came (see [`serve_quic`]).
#[derive(Default)]
struct HeadersSeen {
    failed: std::sync::atomic::AtomicU64,
    resolved: std::sync::atomic::AtomicU64,
}

impl HeadersSeen {
    /// More failed than an honest client's cancellations explain: 256, plus a quarter of the
    /// requests that got through.
    fn too_many_failed(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        self.failed.load(Relaxed) > 256 + self.resolved.load(Relaxed) / 4
    }
}

/// A request stream whose headers are not complete this long after it opened is dropped: a
/// stream that sends a byte and stalls must not hold its state for as long as the connection
/// lives (headers are a few hundred bytes, under a second at 8 kbit/s).
pub const HEADERS_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// An answer its peer has not taken this long after it was ready is reset (H3_REQUEST_CANCELLED)
/// and its request's task ends: a peer that grants no flow control must not keep that task,
/// and what it holds, for the connection's life.
pub const ANSWER_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// How long a request body waits for room in the budget before its request gets 503.
const BUDGET_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The request bytes a server holds at once, over all its connections, when none is
/// configured: sixteen of the largest default bodies.
pub const DEFAULT_MAX_BUFFERED: usize = 16 * DEFAULT_MAX_BODY;

/// A budget of request-body bytes shared by every connection of one server (clones share it):
/// a body's bytes are taken as they arrive and given back once its request is answered, so
/// many connections each sending a large body cannot exhaust memory (T7). A body that finds it
/// spent takes room back from the client holding the most (T13).
#[derive(Debug, Clone)]
pub struct BodyBudget {
    bytes: Arc<tokio::sync::Semaphore>,
    total: usize,
    ledger: Arc<Mutex<Ledger>>,
    gave_way: Arc<AtomicU64>,
}

/// Who holds the budget, and how to tell a body to give way.
#[derive(Debug, Default)]
struct Ledger {
    holdings: Holdings<IpAddr>,
    told: HashMap<BodyId, Arc<tokio::sync::Notify>>,
}

/// One request body's part of a [`BodyBudget`]: the bytes it took, given back (and its line in
/// the ledger closed) when it is dropped. A body enters the ledger with its first bytes, so a
/// request without a body costs the ledger nothing.
struct Share<'a> {
    budget: &'a BodyBudget,
    peer: SocketAddr,
    /// Its line in the ledger, and what tells it to give way to another client's body.
    entry: Option<(BodyId, Arc<tokio::sync::Notify>)>,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Share<'_> {
    /// Take `n` more bytes. A short wait, not none, when they are not free: bodies arriving
    /// together would otherwise all fail at once, each holding a part of the budget, and the
    /// first to give up frees the rest; bodies of a heavier client are told to give way first.
    async fn take(&mut self, n: u32) -> Result<(), H3Error> {
        use tokio::sync::TryAcquireError;
        if self.entry.is_none() {
            self.entry = Some(self.budget.enter(self.peer));
        }
        let id = self.entry.as_ref().expect("entered").0;
        let more = match self.budget.bytes.clone().try_acquire_many_owned(n) {
            Ok(p) => p,
            Err(TryAcquireError::Closed) => return Err(H3Error::Busy),
            Err(TryAcquireError::NoPermits) => {
                self.budget.make_room(id, n);
                let told = self.entry.as_ref().expect("entered").1.clone();
                let bytes = self.budget.bytes.clone();
                tokio::select! {
                    biased;
                    _ = told.notified() => return Err(H3Error::Busy),
                    r = tokio::time::timeout(BUDGET_WAIT, bytes.acquire_many_owned(n)) => {
                        r.map_err(|_| H3Error::Busy)?.map_err(|_| H3Error::Busy)?
                    }
                }
            }
        };
        match self.permit.as_mut() {
            Some(p) => p.merge(more),
            None => self.permit = Some(more),
        }
        lock(&self.budget.ledger)
            .holdings
            .took(id, u64::from(n), now());
        Ok(())
    }

    /// What tells this body to give way, once it is in the ledger (from its first bytes).
    fn told(&self) -> Option<&tokio::sync::Notify> {
        self.entry.as_ref().map(|(_, t)| &**t)
    }

    /// The whole body has arrived: it no longer gives way. False if it was told to before it
    /// could say so: its bytes already count as on their way back, so it must not be handled.
    fn arrived(&self) -> bool {
        match &self.entry {
            Some((id, _)) => lock(&self.budget.ledger).holdings.arrived(*id),
            None => true,
        }
    }
}

impl Drop for Share<'_> {
    fn drop(&mut self) {
        if let Some((id, _)) = &self.entry {
            let mut l = lock(&self.budget.ledger);
            l.holdings.close(*id);
            l.told.remove(id);
            // Given back under the ledger's lock: room is never looked for while these bytes
            // are neither free (or a waiter's) nor counted as leaving.
            drop(self.permit.take());
        }
    }
}

/// The ledger's clock: the runtime's, so virtual time drives it in the simulator.
fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

impl BodyBudget {
    /// A budget of `total` bytes.
    pub fn new(total: usize) -> BodyBudget {
        let total = total.clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        BodyBudget {
            bytes: Arc::new(tokio::sync::Semaphore::new(total)),
            total,
            ledger: Arc::default(),
            gave_way: Arc::default(),
        }
    }

    /// A share for a body from `peer`, holding nothing yet.
    fn share(&self, peer: SocketAddr) -> Share<'_> {
        Share {
            budget: self,
            peer,
            entry: None,
            permit: None,
        }
    }

    /// A line in the ledger for a body from `peer`.
    fn enter(&self, peer: SocketAddr) -> (BodyId, Arc<tokio::sync::Notify>) {
        let told = Arc::new(tokio::sync::Notify::new());
        let mut l = lock(&self.ledger);
        let id = l.holdings.open(client_key(peer.ip()), now());
        l.told.insert(id, told.clone());
        (id, told)
    }

    /// Body `id` needs `n` bytes that are not free: tell the bodies that must give way.
    fn make_room(&self, id: BodyId, n: u32) {
        let mut l = lock(&self.ledger);
        let free = self.bytes.available_permits() as u64;
        let victims = l.holdings.give_way(id, u64::from(n), free);
        for v in &victims {
            if let Some(t) = l.told.get(v) {
                t.notify_one();
            }
        }
        self.gave_way
            .fetch_add(victims.len() as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Bodies told to give way to another client's so far (T13).
    pub fn gave_way(&self) -> u64 {
        self.gave_way.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Its size.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Bytes not taken now.
    pub fn available(&self) -> usize {
        self.bytes.available_permits()
    }
}

impl Default for BodyBudget {
    fn default() -> Self {
        BodyBudget::new(DEFAULT_MAX_BUFFERED)
    }
}

/// Limits a server applies to requests.
#[derive(Debug, Clone)]
pub struct ServeLimits {
    /// Largest request body accepted; larger ones get 413.
    pub max_body: usize,
    /// Request-body bytes held at once over every connection; a request that would exceed it
    /// gets 503, unless bodies of a client holding more give way (T13).
    pub buffered: BodyBudget,
    /// How request tasks are spawned (a measurement hook; unset in the product).
    pub tasks: crate::tasks::Tasks,
}

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits {
            max_body: DEFAULT_MAX_BODY,
            buffered: BodyBudget::default(),
            tasks: crate::tasks::Tasks::default(),
        }
    }
}

/// Serve HTTP/3 on one QUIC connection until the peer closes it. Concurrency is bounded by the
/// QUIC stream limit (`max_concurrent_bidi_streams`).
pub async fn serve_connection<H: Handler>(
    conn: quinn::Connection,
    handler: Arc<H>,
    limits: ServeLimits,
) -> Result<(), H3Error> {
    let peer = conn.remote_address();
    serve_quic(h3_quinn::Connection::new(conn), peer, handler, limits).await
}

/// [`serve_connection`] on any QUIC connection h3 can use (e.g. a
/// [`shared_driver`](crate::shared_driver) one).
pub async fn serve_quic<C, H>(
    quic: C,
    peer: SocketAddr,
    handler: Arc<H>,
    limits: ServeLimits,
) -> Result<(), H3Error>
where
    C: h3::quic::Connection<Bytes> + Send + 'static,
    C::BidiStream: h3::quic::RecvStream<Buf = Bytes> + Send + 'static,
    C::SendStream: Send + 'static,
    C::RecvStream: h3::quic::RecvStream<Buf = Bytes> + Send + 'static,
    C::OpenStreams: Send + 'static,
    H: Handler,
{
    // The handshake future is ~4 KB and only lives until the settings are exchanged; boxing it
    // keeps it out of this future, which stays alive (one per idle device) for the connection's
    // whole life (measured: 8.1 → ~2.6 KB per connection task).
    // No GREASE (decision T8): aioquic never sees a body end after a trailing reserved frame.
    // Every stream watched: a frame h3 would hold whole is refused when announced too long
    // (decision T12).
    let mut h3c: h3::server::Connection<Guarded<C>, Bytes> = Box::pin(
        h3::server::builder()
            .send_grease(false)
            .max_field_section_size(MAX_HELD_FRAME)
            .build(Guarded::new(quic)),
    )
    .await
    .map_err(|e| H3Error::Connection(e.to_string()))?;
    // Requests that failed before their headers, and those that got past them: h3 keeps a
    // record of each failed one for the connection's life (and waits on it at a graceful
    // close), so a peer failing streams on purpose is cut off (decision T12).
    let headers = Arc::new(HeadersSeen::default());
    loop {
        // Polled here rather than through `accept()`, whose future (~850 bytes, sized by the
        // GOAWAY it sends at the end) would sit in every idle connection's task (decision G7).
        match std::future::poll_fn(|cx| h3c.poll_accept_request_stream(cx)).await {
            Ok(Some(_)) if headers.too_many_failed() => {
                tracing::debug!(%peer, "closed: too many requests failed before their headers");
                // Dropping h3's connection closes it.
                return Err(H3Error::Connection(
                    "too many requests failed before their headers".into(),
                ));
            }
            Ok(Some(stream)) => {
                // As `accept()` builds it; `accept()` also clears h3's grease flag after the
                // first request, which `send_grease(false)` above leaves clear from the start.
                let resolver = h3c.create_resolver(h3::frame::FrameStream::new(
                    h3::stream::BufRecvStream::new(stream),
                ));
                let (handler, limits) = (handler.clone(), limits.clone());
                let headers = headers.clone();
                // Boxed: a handler's future is several KB, and a task's future is copied into
                // its cell and again over it when it ends; a box makes both copies a pointer.
                let tasks = limits.tasks.clone();
                tasks.spawn(Box::pin(async move {
                    if let Err(e) = serve_request(resolver, handler, limits, peer, &headers).await {
                        tracing::debug!(%peer, error = %e, "request failed");
                    }
                }));
            }
            Ok(None) => {
                // The peer said GOAWAY and every request is done: our last GOAWAY, as
                // `accept()` sends it (an error sending it ends the connection all the same).
                let _ = Box::pin(h3c.shutdown(0)).await;
                return Ok(());
            }
            Err(e) if e.is_h3_no_error() => return Ok(()),
            Err(e) => {
                // A peer that closes with a QUIC-level no-error or times out ends the loop too.
                return match e {
                    h3::error::ConnectionError::Timeout => Ok(()),
                    e => Err(H3Error::Connection(e.to_string())),
                };
            }
        }
    }
}

/// Whether `req` declares a body of `len` bytes, or no length at all.
fn declares(req: &Request<()>, len: usize) -> bool {
    req.headers()
        .get_all(http::header::CONTENT_LENGTH)
        .iter()
        .all(|v| content_length(v) == Some(len as u64))
}

/// A `content-length` value: digits only (RFC 9110 §8.6; Rust's parser would also take "+40").
fn content_length(v: &http::HeaderValue) -> Option<u64> {
    let v = v.to_str().ok()?.trim();
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse().ok()
}

async fn serve_request<C, H>(
    resolver: h3::server::RequestResolver<C, Bytes>,
    handler: Arc<H>,
    limits: ServeLimits,
    peer: SocketAddr,
    headers: &HeadersSeen,
) -> Result<(), H3Error>
where
    C: h3::quic::Connection<Bytes>,
    H: Handler,
{
    let resolved = tokio::time::timeout(HEADERS_DEADLINE, resolver.resolve_request())
        .await
        .map_err(|_| H3Error::TimedOut(HEADERS_DEADLINE))
        .and_then(|r| r.map_err(stream_err));
    let counter = if resolved.is_ok() {
        &headers.resolved
    } else {
        &headers.failed
    };
    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (req, mut stream) = resolved?;
    // The access log (`-vv`): taken only when it is written, so a quiet server copies nothing.
    let logged = tracing::enabled!(tracing::Level::DEBUG)
        .then(|| (req.method().clone(), req.uri().path().to_string()));
    // The body's share of the server's budget, held until the request is answered.
    let mut share = limits.buffered.share(peer);
    // A body declared too long is refused before any of it is read.
    let declared = req
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(content_length);
    let read = match declared {
        Some(n) if n > limits.max_body as u64 => Err(H3Error::TooLarge {
            what: "request",
            limit: limits.max_body,
        }),
        _ => {
            read_body_within(
                |cx| stream.poll_recv_data(cx),
                limits.max_body,
                "request",
                Some(&mut share),
            )
            .await
        }
    };
    let resp = match read {
        // A body that is not the length its request declares is malformed (RFC 9114 §4.1.2):
        // one cut short must not be stored as whole.
        Ok(body) if !declares(&req, body.len()) => Response::builder()
            .status(StatusCode::BAD_REQUEST)
            .body(Bytes::from(format!(
                "the request's content-length does not match its {}-byte body\n",
                body.len()
            )))
            .expect("static response"),
        Ok(body) if share.arrived() => handler.handle(req, body, peer).await,
        // Told to give way between its last byte and its handler: refused as promised.
        Ok(_) => busy(),
        Err(e @ (H3Error::Busy | H3Error::GaveWay)) => {
            // A body that gave way was told while its next chunk was awaited: h3-quinn cannot
            // stop a stream while a read is in flight (it panics), so that one stops when the
            // request stream is dropped, after the answer.
            // No read is in flight after `Busy` (nor after `TooLarge` below) only because the
            // frame guard (T12) hands h3 each DATA header alone and no more payload than is
            // left: h3 0.0.8 would otherwise hand out buffered bytes with a read pending.
            if matches!(e, H3Error::Busy) {
                stream.stop_sending(h3::error::Code::H3_NO_ERROR);
            }
            busy()
        }
        Err(H3Error::TooLarge { limit, .. }) => {
            // Stop the peer from sending the rest (RFC 9114 §4.1.1 H3_REQUEST_REJECTED-like).
            stream.stop_sending(h3::error::Code::H3_NO_ERROR);
            Response::builder()
                .status(StatusCode::PAYLOAD_TOO_LARGE)
                .body(Bytes::from(format!("request body exceeds {limit} bytes\n")))
                .expect("static response")
        }
        Err(e @ H3Error::Stream(_)) => {
            // The body broke off (a DATA frame cut short, a reset): no answer to it but this.
            stream.stop_stream(h3::error::Code::H3_REQUEST_INCOMPLETE);
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    // The budget is given back once the handler is done with the body (or the body was
    // refused), before the answer: a peer that reads it slowly, or grants no room for it, must
    // not keep the bytes (decision T13).
    drop(share);
    if let Some((method, path)) = logged {
        let (status, bytes) = (resp.status().as_u16(), resp.body().len());
        tracing::debug!(%peer, %method, path, status, bytes, "request");
    }
    let (parts, body) = resp.into_parts();
    let answer = async {
        stream
            .send_response(Response::from_parts(parts, ()))
            .await
            .map_err(stream_err)?;
        if !body.is_empty() {
            stream.send_data(body).await.map_err(stream_err)?;
        }
        stream.finish().await.map_err(stream_err)
    };
    match tokio::time::timeout(ANSWER_DEADLINE, answer).await {
        Ok(sent) => sent,
        Err(_) => {
            // Reset, so that the peer does not take what was sent for a whole answer and quinn
            // drops what was not.
            stream.stop_stream(h3::error::Code::H3_REQUEST_CANCELLED);
            Err(H3Error::TimedOut(ANSWER_DEADLINE))
        }
    }
}

/// The answer to a body refused for want of room in the budget.
fn busy() -> Response<Bytes> {
    Response::builder()
        .status(StatusCode::SERVICE_UNAVAILABLE)
        .header(http::header::RETRY_AFTER, "1")
        .body(Bytes::from_static(
            b"the server holds too many request bytes now; try again later\n",
        ))
        .expect("static response")
}
