//! h3's QUIC stream traits written once for the two QUIC stacks we hand h3: quinn's streams
//! (clients, [`crate::quinn_streams`]) and the shared driver's (the gateway,
//! [`crate::shared_driver`]). Each stack implements [`Write`] for its sending half and h3's
//! `RecvStream` for its receiving half; holding h3's buffer, the bidirectional pair and the
//! error and id conversions are here.

use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Buf;
use h3::quic::{self, ConnectionErrorIncoming, StreamErrorIncoming, WriteBuf};
use quinn_proto::{ConnectionError, StreamId, VarInt};

/// A connection's end as h3 reports it.
pub(crate) fn connection_error(e: ConnectionError) -> ConnectionErrorIncoming {
    match e {
        ConnectionError::ApplicationClosed(c) => ConnectionErrorIncoming::ApplicationClose {
            error_code: c.error_code.into_inner(),
        },
        ConnectionError::TimedOut => ConnectionErrorIncoming::Timeout,
        other => ConnectionErrorIncoming::Undefined(Arc::new(other)),
    }
}

/// A connection's end as a stream operation reports it.
pub(crate) fn stream_error(e: ConnectionError) -> StreamErrorIncoming {
    StreamErrorIncoming::ConnectionErrorIncoming {
        connection_error: connection_error(e),
    }
}

pub(crate) fn stream_id(id: StreamId) -> quic::StreamId {
    quic::StreamId::try_from(u64::from(id)).expect("a QUIC stream id is a varint")
}

/// h3's error codes are u64; one too large for QUIC goes as the largest there is.
pub(crate) fn varint(code: u64) -> VarInt {
    VarInt::from_u64(code).unwrap_or(VarInt::MAX)
}

/// What a QUIC stack's sending half does itself.
pub trait Write {
    /// Write all of `data`, or wait until more can be written; an error ends the write.
    fn poll_write_all(
        &mut self,
        cx: &mut Context<'_>,
        data: &mut impl Buf,
    ) -> Poll<Result<(), StreamErrorIncoming>>;

    /// End the stream once what was written is sent.
    fn finish(&mut self) -> Result<(), StreamErrorIncoming>;

    fn reset(&mut self, code: VarInt);

    fn id(&self) -> StreamId;
}

/// A stream's sending half: h3 hands it one buffer at a time, written out by `poll_ready`.
pub struct SendStream<W, B: Buf> {
    half: W,
    writing: Option<WriteBuf<B>>,
}

impl<W, B: Buf> SendStream<W, B> {
    pub(crate) fn new(half: W) -> SendStream<W, B> {
        SendStream {
            half,
            writing: None,
        }
    }
}

impl<W: Write, B: Buf> quic::SendStream<B> for SendStream<W, B> {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        let Some(data) = self.writing.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let r = ready!(self.half.poll_write_all(cx, data));
        // Written, or never will be: either way the buffer is done with.
        self.writing = None;
        Poll::Ready(r)
    }

    /// Take `data` as the one buffer being written: h3 waits for `poll_ready` between buffers,
    /// so a second one while the first is unwritten is a bug in the stack (it would reorder
    /// bytes).
    fn send_data<T: Into<WriteBuf<B>>>(&mut self, data: T) -> Result<(), StreamErrorIncoming> {
        if self.writing.is_some() {
            return Err(StreamErrorIncoming::ConnectionErrorIncoming {
                connection_error: ConnectionErrorIncoming::InternalError(
                    "send_data before the previous buffer was written".into(),
                ),
            });
        }
        self.writing = Some(data.into());
        Ok(())
    }

    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        ready!(self.poll_ready(cx))?;
        Poll::Ready(self.half.finish())
    }

    fn reset(&mut self, reset_code: u64) {
        // What was not written never will be.
        self.writing = None;
        self.half.reset(varint(reset_code));
    }

    fn send_id(&self) -> quic::StreamId {
        stream_id(self.half.id())
    }
}

/// Both halves of a bidirectional stream.
pub struct BidiStream<S, R> {
    send: S,
    recv: R,
}

impl<S, R> BidiStream<S, R> {
    pub(crate) fn new(send: S, recv: R) -> BidiStream<S, R> {
        BidiStream { send, recv }
    }
}

impl<B: Buf, S: quic::SendStream<B>, R: quic::RecvStream> quic::BidiStream<B> for BidiStream<S, R> {
    type SendStream = S;
    type RecvStream = R;

    fn split(self) -> (S, R) {
        (self.send, self.recv)
    }
}

impl<B: Buf, S: quic::SendStream<B>, R> quic::SendStream<B> for BidiStream<S, R> {
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

    fn send_id(&self) -> quic::StreamId {
        self.send.send_id()
    }
}

impl<S, R: quic::RecvStream> quic::RecvStream for BidiStream<S, R> {
    type Buf = R::Buf;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<R::Buf>, StreamErrorIncoming>> {
        self.recv.poll_data(cx)
    }

    fn stop_sending(&mut self, error_code: u64) {
        self.recv.stop_sending(error_code)
    }

    fn recv_id(&self) -> quic::StreamId {
        self.recv.recv_id()
    }
}
