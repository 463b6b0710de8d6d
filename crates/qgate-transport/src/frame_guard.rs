//! Every stream a peer sends HTTP/3 on, watched by [`qgate_core::frame_guard`]: a frame other
//! than DATA announced longer than the limit stops the stream before h3 buffers it (decision
//! T12). The shell wraps any QUIC connection h3 runs on (quinn's, the shared driver's) and
//! hands h3 the same streams, each chunk checked on its way through.

use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use h3::quic::{self, ConnectionErrorIncoming, StreamErrorIncoming, StreamId, WriteBuf};
use qgate_core::frame_guard::{FrameGuard, StreamKind};

/// The longest frame other than DATA a peer may send us (HEADERS, SETTINGS, a reserved type),
/// and the header block we decode: h3 holds such a frame whole (decision T12). Far above any
/// request or response qgate exchanges (a few hundred bytes of headers).
pub const MAX_HELD_FRAME: u64 = 16 * 1024;

/// A QUIC connection whose incoming streams are watched.
#[derive(Clone)]
pub struct Guarded<C> {
    inner: C,
    limit: u64,
}

impl<C> Guarded<C> {
    /// Watch `inner`'s streams with the limit [`MAX_HELD_FRAME`].
    pub fn new(inner: C) -> Guarded<C> {
        Guarded {
            inner,
            limit: MAX_HELD_FRAME,
        }
    }
}

/// A stream (or a bidirectional stream's receiving half) under watch.
pub struct Watched<S> {
    inner: S,
    guard: FrameGuard,
}

impl<S> Watched<S> {
    fn new(inner: S, kind: StreamKind, limit: u64) -> Watched<S> {
        Watched {
            inner,
            guard: FrameGuard::new(kind, limit),
        }
    }
}

impl<B, C> quic::Connection<B> for Guarded<C>
where
    B: Buf,
    C: quic::Connection<B>,
    C::RecvStream: quic::RecvStream<Buf = Bytes>,
    C::BidiStream: quic::RecvStream<Buf = Bytes>,
{
    type RecvStream = Watched<C::RecvStream>;
    type OpenStreams = Guarded<C::OpenStreams>;

    fn poll_accept_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::RecvStream, ConnectionErrorIncoming>> {
        let s = ready!(self.inner.poll_accept_recv(cx))?;
        Poll::Ready(Ok(Watched::new(s, StreamKind::Unidirectional, self.limit)))
    }

    fn poll_accept_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::BidiStream, ConnectionErrorIncoming>> {
        let s = ready!(self.inner.poll_accept_bidi(cx))?;
        Poll::Ready(Ok(Watched::new(s, StreamKind::Request, self.limit)))
    }

    fn opener(&self) -> Self::OpenStreams {
        Guarded {
            inner: self.inner.opener(),
            limit: self.limit,
        }
    }
}

impl<B, C> quic::OpenStreams<B> for Guarded<C>
where
    B: Buf,
    C: quic::OpenStreams<B>,
    C::BidiStream: quic::RecvStream<Buf = Bytes>,
{
    type BidiStream = Watched<C::BidiStream>;
    type SendStream = C::SendStream;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::BidiStream, StreamErrorIncoming>> {
        // A response comes back on the request's stream: the same frames, the same watch.
        let s = ready!(self.inner.poll_open_bidi(cx))?;
        Poll::Ready(Ok(Watched::new(s, StreamKind::Request, self.limit)))
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

impl<S: quic::RecvStream<Buf = Bytes>> quic::RecvStream for Watched<S> {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        let chunk = ready!(self.inner.poll_data(cx))?;
        if let Some(b) = &chunk {
            if let Err(e) = self.guard.scan(b) {
                tracing::debug!(stream = ?self.inner.recv_id(), error = %e, "stream stopped");
                self.inner
                    .stop_sending(h3::error::Code::H3_EXCESSIVE_LOAD.value());
                return Poll::Ready(Err(StreamErrorIncoming::Unknown(Box::new(e))));
            }
        }
        Poll::Ready(Ok(chunk))
    }

    fn stop_sending(&mut self, error_code: u64) {
        self.inner.stop_sending(error_code)
    }

    fn recv_id(&self) -> StreamId {
        self.inner.recv_id()
    }
}

impl<B: Buf, S: quic::SendStream<B>> quic::SendStream<B> for Watched<S> {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.inner.poll_ready(cx)
    }

    fn send_data<T: Into<WriteBuf<B>>>(&mut self, data: T) -> Result<(), StreamErrorIncoming> {
        self.inner.send_data(data)
    }

    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.inner.poll_finish(cx)
    }

    fn reset(&mut self, reset_code: u64) {
        self.inner.reset(reset_code)
    }

    fn send_id(&self) -> StreamId {
        self.inner.send_id()
    }
}

impl<B, S> quic::BidiStream<B> for Watched<S>
where
    B: Buf,
    S: quic::BidiStream<B>,
    S::RecvStream: quic::RecvStream<Buf = Bytes>,
    S: quic::RecvStream<Buf = Bytes>,
{
    type SendStream = S::SendStream;
    type RecvStream = Watched<S::RecvStream>;

    fn split(self) -> (Self::SendStream, Self::RecvStream) {
        let (send, recv) = self.inner.split();
        (
            send,
            Watched {
                inner: recv,
                guard: self.guard,
            },
        )
    }
}
