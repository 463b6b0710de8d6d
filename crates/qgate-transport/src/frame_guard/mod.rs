//! Every stream a peer sends HTTP/3 on, watched by [`scan::FrameGuard`]: a frame other than DATA
//! announced longer than the limit stops the stream before h3 buffers it (decision T12). The shell
//! wraps any QUIC connection h3 runs on (quinn's, the shared driver's) and hands h3 the same
//! streams, each chunk checked on its way through. More that h3 would otherwise hold: bytes it
//! buffers reach it gathered into whole frames, copied out of the datagrams they came in (one byte
//! per padded datagram pinned ~1 KB each, and h3 keeps and sums every chunk it is given); the
//! peer's QPACK streams, which h3 never reads after their type, are read here and dropped (up to
//! [`MAX_DRAINED`]); an empty DATA frame, which h3 takes for the end of a body, is dropped.

pub mod scan;

use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use h3::quic::{self, ConnectionErrorIncoming, StreamErrorIncoming, StreamId, WriteBuf};

use scan::{FrameGuard, Segment, StreamKind, TooLong};

/// The longest frame other than DATA a peer may send us (HEADERS, SETTINGS, a reserved type),
/// and the header block we decode: h3 holds such a frame whole (decision T12). Far above any
/// request or response qgate exchanges (a few hundred bytes of headers).
pub const MAX_HELD_FRAME: u64 = 16 * 1024;

/// QPACK encoder and decoder stream types (RFC 9204 §4.2): h3 keeps them and never reads.
const QPACK_STREAMS: [u64; 2] = [0x02, 0x03];
/// HTTP/3 control stream type.
const CONTROL: u64 = 0x00;
/// Chunks a drained stream is read per turn before others get theirs.
const DRAIN_TURN: usize = 64;

/// A QUIC connection whose incoming streams are watched.
#[derive(Clone)]
pub struct Guarded<C> {
    inner: C,
    limit: u64,
    /// The peer's QPACK streams, read and dropped whenever h3 looks for new streams.
    drains: Drains,
}

type Drains = Arc<Mutex<Vec<Box<dyn Drain>>>>;

/// A stream whose bytes nobody wants, read until it ends.
trait Drain: Send {
    /// Ready once the stream has ended.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<()>;
}

/// Most bytes read from a peer's QPACK stream: with no dynamic table, its encoder stream
/// carries next to nothing and its decoder stream a few bytes per cancelled request. Past
/// this the stream is stopped (the peer is not speaking QPACK as we set it up).
const MAX_DRAINED: u64 = 4 << 20;

/// A QPACK stream drained up to [`MAX_DRAINED`].
struct Capped<S> {
    stream: S,
    read: u64,
}

impl<S> Capped<S> {
    fn new(stream: S) -> Capped<S> {
        Capped { stream, read: 0 }
    }
}

impl<S: quic::RecvStream + Send> Drain for Capped<S> {
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        for _ in 0..DRAIN_TURN {
            match ready!(self.stream.poll_data(cx)) {
                Ok(Some(b)) => {
                    self.read += b.remaining() as u64;
                    if self.read > MAX_DRAINED {
                        self.stream
                            .stop_sending(h3::error::Code::H3_EXCESSIVE_LOAD.value());
                        return Poll::Ready(());
                    }
                }
                Ok(None) | Err(_) => return Poll::Ready(()),
            }
        }
        // A peer that never stops sending: the next turn comes at once, after the others.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl<C> Guarded<C> {
    /// Watch `inner`'s streams with the limit [`MAX_HELD_FRAME`].
    pub fn new(inner: C) -> Guarded<C> {
        Guarded {
            inner,
            limit: MAX_HELD_FRAME,
            drains: Arc::default(),
        }
    }
}

/// A stream that ended inside a DATA frame, this many of its bytes missing.
#[derive(Debug)]
struct CutShort(u64);

impl std::fmt::Display for CutShort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the stream ended {} bytes into a DATA frame's payload",
            self.0
        )
    }
}

impl std::error::Error for CutShort {}

/// A stream (or a bidirectional stream's receiving half) under watch.
pub struct Watched<S> {
    /// `None` once a QPACK stream has gone to be drained (h3 keeps this husk).
    inner: Option<S>,
    id: StreamId,
    guard: FrameGuard,
    /// Where a unidirectional stream goes if it turns out to be a QPACK stream.
    drains: Option<Drains>,
    /// Bytes h3 will hold, gathered until they end a frame: h3 keeps each chunk it is given
    /// as one allocation and sums them all on every arrival, so a frame cut into one-byte
    /// pieces would cost far more than its length. A frame whole in one chunk goes as it is.
    held: BytesMut,
    /// The rest of the peer's last chunk, not yet sorted.
    rest: Bytes,
    /// The peer finished the stream.
    ended: bool,
}

impl<S: quic::RecvStream> Watched<S> {
    fn new(inner: S, kind: StreamKind, limit: u64, drains: Option<Drains>) -> Watched<S> {
        Watched {
            id: inner.recv_id(),
            inner: Some(inner),
            guard: FrameGuard::new(kind, limit),
            drains,
            held: BytesMut::new(),
            rest: Bytes::new(),
            ended: false,
        }
    }
}

impl<B, C> quic::Connection<B> for Guarded<C>
where
    B: Buf,
    C: quic::Connection<B>,
    C::RecvStream: quic::RecvStream<Buf = Bytes> + Send + 'static,
    C::BidiStream: quic::RecvStream<Buf = Bytes> + Send + 'static,
{
    type RecvStream = Watched<C::RecvStream>;
    type OpenStreams = Guarded<C::OpenStreams>;

    fn poll_accept_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::RecvStream, ConnectionErrorIncoming>> {
        // Here h3 looks for new streams every time it wakes: the drained ones get their turn.
        self.drains
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain_mut(|d| d.poll_drain(cx).is_pending());
        let s = ready!(self.inner.poll_accept_recv(cx))?;
        Poll::Ready(Ok(Watched::new(
            s,
            StreamKind::Unidirectional,
            self.limit,
            Some(self.drains.clone()),
        )))
    }

    fn poll_accept_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::BidiStream, ConnectionErrorIncoming>> {
        let s = ready!(self.inner.poll_accept_bidi(cx))?;
        Poll::Ready(Ok(Watched::new(s, StreamKind::Request, self.limit, None)))
    }

    fn opener(&self) -> Self::OpenStreams {
        Guarded {
            inner: self.inner.opener(),
            limit: self.limit,
            drains: self.drains.clone(),
        }
    }
}

impl<B, C> quic::OpenStreams<B> for Guarded<C>
where
    B: Buf,
    C: quic::OpenStreams<B>,
    C::BidiStream: quic::RecvStream<Buf = Bytes> + Send + 'static,
{
    type BidiStream = Watched<C::BidiStream>;
    type SendStream = C::SendStream;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::BidiStream, StreamErrorIncoming>> {
        // A response comes back on the request's stream: the same frames, the same watch.
        let s = ready!(self.inner.poll_open_bidi(cx))?;
        Poll::Ready(Ok(Watched::new(s, StreamKind::Request, self.limit, None)))
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::SendStream, StreamErrorIncoming>> {
        self.inner.poll_open_send(cx)
    }

    fn close(&mut self, code: h3::error::Code, reason: &[u8]) {
        self.inner.close(code, reason)
    }
}

impl<S: quic::RecvStream<Buf = Bytes> + Send + 'static> Watched<S> {
    /// Stop the stream for `e` and say so to h3.
    fn refuse(&mut self, e: TooLong) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        tracing::debug!(stream = ?self.id, error = %e, "stream stopped");
        if let Some(s) = self.inner.as_mut() {
            s.stop_sending(h3::error::Code::H3_EXCESSIVE_LOAD.value());
        }
        Poll::Ready(Err(StreamErrorIncoming::Unknown(Box::new(e))))
    }

    /// A unidirectional stream's first bytes: its type goes to h3 (then the control stream's
    /// frames are sorted as a request stream's; a QPACK stream is drained; other types' bytes
    /// are dropped, as h3 stops those streams). `None` while the type is incomplete.
    fn typed(&mut self, mut b: Bytes, cx: &mut Context<'_>) -> Option<Bytes> {
        let Some(n) = self.guard.take_stream_type(&b) else {
            self.held.extend_from_slice(&b);
            return None;
        };
        self.held.extend_from_slice(&b.split_to(n));
        let head = self.held.split().freeze();
        let t = self.guard.stream_type().expect("read");
        if QPACK_STREAMS.contains(&t) {
            if let (Some(s), Some(d)) = (self.inner.take(), &self.drains) {
                // Polled once here, so its next bytes wake this (the connection's) task.
                let mut s = Capped::new(s);
                if s.poll_drain(cx).is_pending() {
                    d.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(Box::new(s));
                }
            }
        } else if t == CONTROL {
            self.rest = b;
        }
        Some(head)
    }
}

impl<S: quic::RecvStream<Buf = Bytes> + Send + 'static> quic::RecvStream for Watched<S> {
    type Buf = Bytes;

    /// The peer's bytes as h3 gets them: DATA's payload as it came; everything else whole
    /// frames, copied out of the datagrams they came in when gathered from several; an empty
    /// DATA frame dropped (h3 would take it for the body's end); a frame announced too long
    /// refused once what came before it is handed on.
    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        loop {
            if self.rest.is_empty() {
                if self.ended {
                    return Poll::Ready(Ok(None));
                }
                // A QPACK stream's husk: its bytes are drained elsewhere, and h3 wants none.
                let Some(s) = self.inner.as_mut() else {
                    return Poll::Pending;
                };
                match ready!(s.poll_data(cx))? {
                    Some(b) if self.drains.is_some() && self.guard.stream_type().is_none() => {
                        if let Some(head) = self.typed(b, cx) {
                            return Poll::Ready(Ok(Some(head)));
                        }
                        continue;
                    }
                    Some(b) => self.rest = b,
                    None => {
                        // A DATA frame cut short by the stream's end is an incomplete request
                        // (RFC 9114 §7.1), not a shorter body: h3 0.0.8 took what came for
                        // the whole, and the server stored and acknowledged it.
                        if self.guard.data_ahead() > 0 {
                            self.ended = true;
                            return Poll::Ready(Err(StreamErrorIncoming::Unknown(Box::new(
                                CutShort(self.guard.data_ahead()),
                            ))));
                        }
                        // What is gathered is an incomplete frame: h3 says so.
                        self.ended = true;
                        if !self.held.is_empty() {
                            return Poll::Ready(Ok(Some(self.held.split().freeze())));
                        }
                        continue;
                    }
                }
            }
            match self.guard.segment(&self.rest) {
                Err(e) => {
                    self.held.clear();
                    self.rest.clear();
                    return self.refuse(e);
                }
                Ok(Segment::Data(n)) => return Poll::Ready(Ok(Some(self.rest.split_to(n)))),
                Ok(Segment::Held {
                    len,
                    complete,
                    empty_data,
                }) => {
                    let frame = if complete && self.held.is_empty() {
                        // Whole in this chunk: h3 decodes it at once, so no copy.
                        self.rest.split_to(len)
                    } else {
                        self.held.extend_from_slice(&self.rest.split_to(len));
                        if !complete {
                            continue;
                        }
                        self.held.split().freeze()
                    };
                    if !empty_data {
                        return Poll::Ready(Ok(Some(frame)));
                    }
                }
            }
        }
    }

    fn stop_sending(&mut self, error_code: u64) {
        if let Some(s) = self.inner.as_mut() {
            s.stop_sending(error_code)
        }
    }

    fn recv_id(&self) -> StreamId {
        self.id
    }
}

/// A bidirectional stream's sending side: never drained, so always there.
impl<B: Buf, S: quic::SendStream<B>> quic::SendStream<B> for Watched<S> {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.sending().poll_ready(cx)
    }

    fn send_data<T: Into<WriteBuf<B>>>(&mut self, data: T) -> Result<(), StreamErrorIncoming> {
        self.sending().send_data(data)
    }

    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.sending().poll_finish(cx)
    }

    fn reset(&mut self, reset_code: u64) {
        self.sending().reset(reset_code)
    }

    fn send_id(&self) -> StreamId {
        self.id
    }
}

impl<S> Watched<S> {
    fn sending(&mut self) -> &mut S {
        self.inner
            .as_mut()
            .expect("only unidirectional streams are drained")
    }
}

impl<B, S> quic::BidiStream<B> for Watched<S>
where
    B: Buf,
    S: quic::BidiStream<B> + quic::RecvStream<Buf = Bytes> + Send + 'static,
    S::RecvStream: quic::RecvStream<Buf = Bytes> + Send + 'static,
{
    type SendStream = S::SendStream;
    type RecvStream = Watched<S::RecvStream>;

    fn split(self) -> (Self::SendStream, Self::RecvStream) {
        let (send, recv) = self
            .inner
            .expect("only unidirectional streams are drained")
            .split();
        (
            send,
            Watched {
                inner: Some(recv),
                id: self.id,
                guard: self.guard,
                drains: None,
                held: self.held,
                rest: self.rest,
                ended: self.ended,
            },
        )
    }
}
