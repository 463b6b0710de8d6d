//! quinn's connections and streams as h3 sees them (its `quic` traits), with one addition
//! h3-quinn lacks: a request stream is opened at the urgency of the request that opens it
//! (decision G24), so quinn sends a priority request's bytes before a best-effort one's on the
//! same connection; HTTP/3's own unidirectional streams go before any request.
//!
//! h3 opens a request's stream inside `SendRequest::send_request`, with no say in how; the
//! urgency reaches the opener as a task-local set around that call ([`at_urgency`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use h3::quic::{self, ConnectionErrorIncoming, StreamErrorIncoming, StreamId, WriteBuf};

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

/// Poll the future in `slot`, made by `start` if there is none; the slot is empty again once
/// it is ready.
fn poll_slot<T>(
    slot: &mut Option<Pending<T>>,
    cx: &mut Context<'_>,
    start: impl FnOnce() -> Pending<T>,
) -> Poll<Result<T, quinn::ConnectionError>> {
    let out = ready!(slot.get_or_insert_with(start).as_mut().poll(cx));
    *slot = None;
    Poll::Ready(out)
}

fn connection_error(e: quinn::ConnectionError) -> ConnectionErrorIncoming {
    match e {
        quinn::ConnectionError::ApplicationClosed(c) => ConnectionErrorIncoming::ApplicationClose {
            error_code: c.error_code.into_inner(),
        },
        quinn::ConnectionError::TimedOut => ConnectionErrorIncoming::Timeout,
        other => ConnectionErrorIncoming::Undefined(Arc::new(other)),
    }
}

fn stream_error(e: quinn::ConnectionError) -> StreamErrorIncoming {
    StreamErrorIncoming::ConnectionErrorIncoming {
        connection_error: connection_error(e),
    }
}

fn stream_id(id: quinn::StreamId) -> StreamId {
    StreamId::try_from(u64::from(id)).expect("a QUIC stream id is a varint")
}

impl<B: Buf> quic::Connection<B> for Connection {
    type RecvStream = RecvStream;
    type OpenStreams = Opener;

    fn poll_accept_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<RecvStream, ConnectionErrorIncoming>> {
        let conn = &self.conn;
        let s = ready!(poll_slot(&mut self.accepting_uni, cx, || {
            let c = conn.clone();
            Box::pin(async move { c.accept_uni().await })
        }))
        .map_err(connection_error)?;
        Poll::Ready(Ok(RecvStream(s)))
    }

    fn poll_accept_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<BidiStream<B>, ConnectionErrorIncoming>> {
        let conn = &self.conn;
        let (send, recv) = ready!(poll_slot(&mut self.accepting_bi, cx, || {
            let c = conn.clone();
            Box::pin(async move { c.accept_bi().await })
        }))
        .map_err(connection_error)?;
        Poll::Ready(Ok(BidiStream {
            send: SendStream::new(send),
            recv: RecvStream(recv),
        }))
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
        let conn = &self.conn;
        let (send, recv) = ready!(poll_slot(&mut self.opening_bi, cx, || {
            let c = conn.clone();
            Box::pin(async move { c.open_bi().await })
        }))
        .map_err(stream_error)?;
        if let Ok(urgency) = URGENCY.try_with(|u| *u) {
            // Only fails on a stream already closed, which the request then finds out.
            let _ = send.set_priority(urgency);
        }
        Poll::Ready(Ok(BidiStream {
            send: SendStream::new(send),
            recv: RecvStream(recv),
        }))
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<SendStream<B>, StreamErrorIncoming>> {
        let conn = &self.conn;
        let send = ready!(poll_slot(&mut self.opening_uni, cx, || {
            let c = conn.clone();
            Box::pin(async move { c.open_uni().await })
        }))
        .map_err(stream_error)?;
        // HTTP/3's control and QPACK streams: a few bytes that must never wait behind requests.
        let _ = send.set_priority(i32::MAX);
        Poll::Ready(Ok(SendStream::new(send)))
    }

    fn close(&mut self, code: h3::error::Code, reason: &[u8]) {
        let code = quinn::VarInt::from_u64(code.value()).unwrap_or(quinn::VarInt::MAX);
        self.conn.close(code, reason);
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
        let code = quinn::VarInt::from_u64(error_code).unwrap_or(quinn::VarInt::MAX);
        // Already stopped or finished: nothing left to stop.
        let _ = self.0.stop(code);
    }

    fn recv_id(&self) -> StreamId {
        stream_id(self.0.id())
    }
}

/// A stream's sending half: h3 hands it one buffer at a time, written out by `poll_ready`.
pub struct SendStream<B: Buf> {
    stream: quinn::SendStream,
    writing: Option<WriteBuf<B>>,
}

impl<B: Buf> SendStream<B> {
    fn new(stream: quinn::SendStream) -> SendStream<B> {
        SendStream {
            stream,
            writing: None,
        }
    }
}

/// Take `data` as a send stream's one buffer being written: h3 waits for `poll_ready` between
/// buffers, so a second one while the first is unwritten is a bug in the stack (it would
/// reorder bytes). Shared by every send stream we give h3.
pub(crate) fn hold_one<B: Buf, T: Into<WriteBuf<B>>>(
    writing: &mut Option<WriteBuf<B>>,
    data: T,
) -> Result<(), StreamErrorIncoming> {
    if writing.is_some() {
        return Err(StreamErrorIncoming::ConnectionErrorIncoming {
            connection_error: ConnectionErrorIncoming::InternalError(
                "send_data before the previous buffer was written".into(),
            ),
        });
    }
    *writing = Some(data.into());
    Ok(())
}

fn write_error(e: quinn::WriteError) -> StreamErrorIncoming {
    match e {
        quinn::WriteError::Stopped(code) => StreamErrorIncoming::StreamTerminated {
            error_code: code.into_inner(),
        },
        quinn::WriteError::ConnectionLost(c) => stream_error(c),
        other => StreamErrorIncoming::Unknown(Box::new(other)),
    }
}

impl<B: Buf> quic::SendStream<B> for SendStream<B> {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        if let Some(data) = self.writing.as_mut() {
            while data.has_remaining() {
                let n = ready!(Pin::new(&mut self.stream).poll_write(cx, data.chunk()))
                    .map_err(write_error)?;
                data.advance(n);
            }
        }
        self.writing = None;
        Poll::Ready(Ok(()))
    }

    fn send_data<T: Into<WriteBuf<B>>>(&mut self, data: T) -> Result<(), StreamErrorIncoming> {
        hold_one(&mut self.writing, data)
    }

    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        ready!(quic::SendStream::<B>::poll_ready(self, cx))?;
        self.stream
            .finish()
            .map_err(|e| StreamErrorIncoming::Unknown(Box::new(e)))?;
        Poll::Ready(Ok(()))
    }

    fn reset(&mut self, reset_code: u64) {
        let code = quinn::VarInt::from_u64(reset_code).unwrap_or(quinn::VarInt::MAX);
        // Already reset or finished and acknowledged: nothing left to reset.
        let _ = self.stream.reset(code);
    }

    fn send_id(&self) -> StreamId {
        stream_id(self.stream.id())
    }
}

/// A bidirectional stream: a request's, as a client opens it.
pub struct BidiStream<B: Buf> {
    send: SendStream<B>,
    recv: RecvStream,
}

impl<B: Buf> quic::BidiStream<B> for BidiStream<B> {
    type SendStream = SendStream<B>;
    type RecvStream = RecvStream;

    fn split(self) -> (SendStream<B>, RecvStream) {
        (self.send, self.recv)
    }
}

impl<B: Buf> quic::RecvStream for BidiStream<B> {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        self.recv.poll_data(cx)
    }

    fn stop_sending(&mut self, error_code: u64) {
        self.recv.stop_sending(error_code)
    }

    fn recv_id(&self) -> StreamId {
        self.recv.recv_id()
    }
}

impl<B: Buf> quic::SendStream<B> for BidiStream<B> {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.send.poll_ready(cx)
    }

    fn send_data<T: Into<WriteBuf<B>>>(&mut self, data: T) -> Result<(), StreamErrorIncoming> {
        self.send.send_data(data)
    }

    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.send.poll_finish(cx)
    }

    fn reset(&mut self, reset_code: u64) {
        self.send.reset(reset_code)
    }

    fn send_id(&self) -> StreamId {
        self.send.send_id()
    }
}
