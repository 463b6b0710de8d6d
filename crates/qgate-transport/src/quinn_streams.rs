//! quinn's connections and streams as h3 sees them (its `quic` traits), with one addition
//! h3-quinn lacks: a request stream is opened at the urgency of the request that opens it
//! (decision G24), so quinn sends a priority request's bytes before a best-effort one's on the
//! same connection; HTTP/3's own unidirectional streams go before any request.
//!
//! h3 opens a request's stream inside `SendRequest::send_request`, with no say in how; the
//! urgency reaches the opener as a task-local set around that call ([`at_urgency`]).

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use h3::quic::{self, ConnectionErrorIncoming, StreamErrorIncoming, StreamId};

use crate::h3_adapter::{self, connection_error, stream_error, stream_id, varint, Write};

tokio::task_local! {
    /// The urgency of the streams opened in this scope (quinn's `set_priority`: higher first).
    static URGENCY: i32;
}

/// Run `f` with streams it opens sent at `urgency` (quinn: higher is sent first; 0 is the
/// default every other stream has).
pub async fn at_urgency<F: Future>(urgency: i32, f: F) -> F::Output {
    URGENCY.scope(urgency, f).await
}

type Pending<T> = Pin<Box<dyn Future<Output = Result<T, quinn::ConnectionError>> + Send + Sync>>;

/// A quinn connection for h3.
pub struct Connection {
    conn: quinn::Connection,
    opener: Opener,
    accepting_uni: Option<Pending<quinn::RecvStream>>,
    accepting_bi: Option<Pending<(quinn::SendStream, quinn::RecvStream)>>,
}

impl Connection {
    /// h3's view of `conn`.
    pub fn new(conn: quinn::Connection) -> Connection {
        Connection {
            opener: Opener::new(conn.clone()),
            conn,
            accepting_uni: None,
            accepting_bi: None,
        }
    }
}

/// Opens a connection's streams, request streams at the urgency in scope.
pub struct Opener {
    conn: quinn::Connection,
    opening_bi: Option<Pending<(quinn::SendStream, quinn::RecvStream)>>,
    opening_uni: Option<Pending<quinn::SendStream>>,
}

impl Opener {
    fn new(conn: quinn::Connection) -> Opener {
        Opener {
            conn,
            opening_bi: None,
            opening_uni: None,
        }
    }
}

impl Clone for Opener {
    /// A fresh opener on the same connection (what it is opening stays with the original).
    fn clone(&self) -> Opener {
        Opener::new(self.conn.clone())
    }
}

/// Poll the future in `slot`, made by `start` on `conn` if there is none; the slot is empty
/// again once it is ready.
fn poll_slot<T, F>(
    slot: &mut Option<Pending<T>>,
    cx: &mut Context<'_>,
    conn: &quinn::Connection,
    start: impl FnOnce(quinn::Connection) -> F,
) -> Poll<Result<T, quinn::ConnectionError>>
where
    F: Future<Output = Result<T, quinn::ConnectionError>> + Send + Sync + 'static,
{
    let out = ready!(slot
        .get_or_insert_with(|| Box::pin(start(conn.clone())))
        .as_mut()
        .poll(cx));
    *slot = None;
    Poll::Ready(out)
}

fn bidi<B: Buf>((send, recv): (quinn::SendStream, quinn::RecvStream)) -> BidiStream<B> {
    BidiStream::new(SendStream::new(send), RecvStream(recv))
}

impl<B: Buf> quic::Connection<B> for Connection {
    type RecvStream = RecvStream;
    type OpenStreams = Opener;

    fn poll_accept_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<RecvStream, ConnectionErrorIncoming>> {
        poll_slot(&mut self.accepting_uni, cx, &self.conn, |c| async move {
            c.accept_uni().await
        })
        .map_ok(RecvStream)
        .map_err(connection_error)
    }

    fn poll_accept_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<BidiStream<B>, ConnectionErrorIncoming>> {
        poll_slot(&mut self.accepting_bi, cx, &self.conn, |c| async move {
            c.accept_bi().await
        })
        .map_ok(bidi)
        .map_err(connection_error)
    }

    fn opener(&self) -> Opener {
        self.opener.clone()
    }
}

impl<B: Buf> quic::OpenStreams<B> for Connection {
    type BidiStream = BidiStream<B>;
    type SendStream = SendStream<B>;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<BidiStream<B>, StreamErrorIncoming>> {
        quic::OpenStreams::<B>::poll_open_bidi(&mut self.opener, cx)
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<SendStream<B>, StreamErrorIncoming>> {
        quic::OpenStreams::<B>::poll_open_send(&mut self.opener, cx)
    }

    fn close(&mut self, code: h3::error::Code, reason: &[u8]) {
        quic::OpenStreams::<B>::close(&mut self.opener, code, reason)
    }
}

impl<B: Buf> quic::OpenStreams<B> for Opener {
    type BidiStream = BidiStream<B>;
    type SendStream = SendStream<B>;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<BidiStream<B>, StreamErrorIncoming>> {
        let (send, recv) = ready!(poll_slot(&mut self.opening_bi, cx, &self.conn, |c| {
            async move { c.open_bi().await }
        }))
        .map_err(stream_error)?;
        if let Ok(urgency) = URGENCY.try_with(|u| *u) {
            // Only fails on a stream already closed, which the request then finds out.
            let _ = send.set_priority(urgency);
        }
        Poll::Ready(Ok(bidi((send, recv))))
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<SendStream<B>, StreamErrorIncoming>> {
        let send = ready!(poll_slot(&mut self.opening_uni, cx, &self.conn, |c| {
            async move { c.open_uni().await }
        }))
        .map_err(stream_error)?;
        // HTTP/3's control and QPACK streams: a few bytes that must never wait behind requests.
        let _ = send.set_priority(i32::MAX);
        Poll::Ready(Ok(SendStream::new(send)))
    }

    fn close(&mut self, code: h3::error::Code, reason: &[u8]) {
        self.conn.close(varint(code.value()), reason);
    }
}

/// A stream's receiving half.
pub struct RecvStream(quinn::RecvStream);

impl quic::RecvStream for RecvStream {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        // quinn's chunk read is cancel-safe: a fresh one per poll is its own poll.
        let read = self.0.read_chunk(usize::MAX, true);
        let chunk = ready!(std::pin::pin!(read).poll(cx)).map_err(|e| match e {
            quinn::ReadError::Reset(code) => StreamErrorIncoming::StreamTerminated {
                error_code: code.into_inner(),
            },
            quinn::ReadError::ConnectionLost(c) => stream_error(c),
            other => StreamErrorIncoming::Unknown(Box::new(other)),
        })?;
        Poll::Ready(Ok(chunk.map(|c| c.bytes)))
    }

    fn stop_sending(&mut self, error_code: u64) {
        // Already stopped or finished: nothing left to stop.
        let _ = self.0.stop(varint(error_code));
    }

    fn recv_id(&self) -> StreamId {
        stream_id(self.0.id())
    }
}

/// A stream's sending half.
pub type SendStream<B> = h3_adapter::SendStream<quinn::SendStream, B>;

fn write_error(e: quinn::WriteError) -> StreamErrorIncoming {
    match e {
        quinn::WriteError::Stopped(code) => StreamErrorIncoming::StreamTerminated {
            error_code: code.into_inner(),
        },
        quinn::WriteError::ConnectionLost(c) => stream_error(c),
        other => StreamErrorIncoming::Unknown(Box::new(other)),
    }
}

impl Write for quinn::SendStream {
    fn poll_write_all(
        &mut self,
        cx: &mut Context<'_>,
        data: &mut impl Buf,
    ) -> Poll<Result<(), StreamErrorIncoming>> {
        while data.has_remaining() {
            let write = quinn::SendStream::poll_write(Pin::new(&mut *self), cx, data.chunk());
            let n = ready!(write).map_err(write_error)?;
            data.advance(n);
        }
        Poll::Ready(Ok(()))
    }

    fn finish(&mut self) -> Result<(), StreamErrorIncoming> {
        quinn::SendStream::finish(self).map_err(|e| StreamErrorIncoming::Unknown(Box::new(e)))
    }

    fn reset(&mut self, code: quinn::VarInt) {
        // Already reset or finished and acknowledged: nothing left to reset.
        let _ = quinn::SendStream::reset(self, code);
    }

    fn id(&self) -> quinn::StreamId {
        quinn::SendStream::id(self)
    }
}

/// A bidirectional stream: a request's, as a client opens it.
pub type BidiStream<B> = h3_adapter::BidiStream<SendStream<B>, RecvStream>;
