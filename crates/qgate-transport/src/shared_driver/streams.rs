//! Stream handles of a shared-driver connection, and h3's QUIC traits on them (RFC 9114 runs on any
//! QUIC that offers these: accept/open streams, ordered reads, writes with backpressure).

use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use h3::quic::{self, ConnectionErrorIncoming, StreamErrorIncoming};
use quinn_proto::{self as proto, Dir, StreamId, VarInt};

use super::{Conn, Connection, Waiter};
use crate::h3_adapter::{self, connection_error, stream_error, stream_id, varint, Write};

impl Connection {
    /// Accept (`open == false`) or open a stream of `dir`, or wait until one can be.
    fn poll_stream(
        &self,
        cx: &mut Context<'_>,
        dir: Dir,
        open: bool,
    ) -> Poll<Result<StreamId, proto::ConnectionError>> {
        self.with(|c, s| {
            let p = match alive(c) {
                Ok(p) => p,
                Err(e) => return Poll::Ready(Err(e)),
            };
            let id = if open {
                p.streams().open(dir)
            } else {
                p.streams().accept(dir)
            };
            match id {
                Some(id) => {
                    s.touch();
                    Poll::Ready(Ok(id))
                }
                None => {
                    let w = if open {
                        Waiter::Open(dir)
                    } else {
                        Waiter::Accept(dir)
                    };
                    c.wait(w, cx.waker());
                    Poll::Pending
                }
            }
        })
    }

    /// A stream half goes away: forget its waiter and, unless it already ended, `end` it
    /// (finish a send half, stop a receive half) as quinn's streams do when dropped.
    fn drop_half(&self, waiter: Waiter, ended: bool, end: impl FnOnce(&mut Conn)) {
        self.with(|c, s| {
            c.waiters.retain(|(w, _)| *w != waiter);
            if !ended {
                end(c);
                s.touch();
            }
        })
    }
}

/// The connection's state machine, or the error every operation on it reports once it ended.
fn alive(c: &mut Conn) -> Result<&mut proto::Connection, proto::ConnectionError> {
    if let Some(e) = &c.error {
        return Err(e.clone());
    }
    c.proto
        .as_mut()
        .ok_or(proto::ConnectionError::LocallyClosed)
}

impl quic::Connection<Bytes> for Connection {
    type RecvStream = RecvStream;
    // The connection opens streams itself; h3 keeps a clone of it apart.
    type OpenStreams = Connection;

    fn poll_accept_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<RecvStream, ConnectionErrorIncoming>> {
        self.poll_stream(cx, Dir::Uni, false)
            .map_err(connection_error)
            .map_ok(|id| RecvStream::new(self.clone(), id))
    }

    fn poll_accept_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<BidiStream, ConnectionErrorIncoming>> {
        self.poll_stream(cx, Dir::Bi, false)
            .map_err(connection_error)
            .map_ok(|id| bidi(self, id))
    }

    fn opener(&self) -> Connection {
        self.clone()
    }
}

impl quic::OpenStreams<Bytes> for Connection {
    type BidiStream = BidiStream;
    type SendStream = SendStream;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<BidiStream, StreamErrorIncoming>> {
        self.poll_stream(cx, Dir::Bi, true)
            .map_err(stream_error)
            .map_ok(|id| bidi(self, id))
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<SendStream, StreamErrorIncoming>> {
        self.poll_stream(cx, Dir::Uni, true)
            .map_err(stream_error)
            .map_ok(|id| SendStream::new(SendHalf::new(self.clone(), id)))
    }

    fn close(&mut self, code: h3::error::Code, reason: &[u8]) {
        // h3 closes with H3_NO_ERROR when its connection is dropped, right after the last
        // request ended: that close waits for the answers to arrive (G19).
        if code == h3::error::Code::H3_NO_ERROR {
            self.close_gracefully(varint(code.value()), reason);
        } else {
            self.close_with(varint(code.value()), reason);
        }
    }
}

/// The sending half of a stream. A bidirectional one dropped before it is finished or reset
/// finishes, or resets if the peer stopped it (as quinn's streams do, T14); a unidirectional one
/// is left open (G19).
pub type SendStream = h3_adapter::SendStream<SendHalf, Bytes>;

/// What a [`SendStream`] writes to.
pub struct SendHalf {
    conn: Connection,
    id: StreamId,
    ended: bool,
}

impl SendHalf {
    fn new(conn: Connection, id: StreamId) -> Self {
        SendHalf {
            conn,
            id,
            ended: false,
        }
    }
}

impl Write for SendHalf {
    fn poll_write_all(
        &mut self,
        cx: &mut Context<'_>,
        data: &mut impl Buf,
    ) -> Poll<Result<(), StreamErrorIncoming>> {
        let id = self.id;
        self.conn.with(|c, s| {
            if let Err(e) = alive(c) {
                return Poll::Ready(Err(stream_error(e)));
            }
            let mut wrote = false;
            let r = loop {
                if !data.has_remaining() {
                    break Poll::Ready(Ok(()));
                }
                let p = c.proto.as_mut().expect("checked");
                let res = p.send_stream(id).write(data.chunk());
                match res {
                    Ok(n) => {
                        data.advance(n);
                        wrote = true;
                    }
                    Err(proto::WriteError::Blocked) => {
                        c.wait(Waiter::Write(id), cx.waker());
                        break Poll::Pending;
                    }
                    Err(proto::WriteError::Stopped(code)) => {
                        break Poll::Ready(Err(StreamErrorIncoming::StreamTerminated {
                            error_code: code.into_inner(),
                        }))
                    }
                    Err(e @ proto::WriteError::ClosedStream) => {
                        break Poll::Ready(Err(StreamErrorIncoming::Unknown(Box::new(e))))
                    }
                }
            };
            if wrote {
                s.touch();
            }
            r
        })
    }

    fn finish(&mut self) -> Result<(), StreamErrorIncoming> {
        let id = self.id;
        self.ended = true;
        self.conn.with(|c, s| {
            let p = alive(c).map_err(stream_error)?;
            let res = p.send_stream(id).finish();
            s.touch();
            match res {
                Ok(()) => {
                    c.finished(id);
                    Ok(())
                }
                Err(proto::FinishError::Stopped(code)) => {
                    // Reset, or quinn-proto never frees the stream and the peer never gets its
                    // credit back (decision T14).
                    let _ = p.send_stream(id).reset(code);
                    c.acked(id);
                    Err(StreamErrorIncoming::StreamTerminated {
                        error_code: code.into_inner(),
                    })
                }
                Err(e) => Err(StreamErrorIncoming::Unknown(Box::new(e))),
            }
        })
    }

    fn reset(&mut self, code: VarInt) {
        let id = self.id;
        self.ended = true;
        self.conn.with(|c, s| {
            if let Some(p) = c.proto.as_mut() {
                let _ = p.send_stream(id).reset(code);
            }
            // A reset stream (even one finished before) is not waited for: quinn-proto reports
            // no `Finished` for it.
            c.acked(id);
            s.touch();
        });
    }

    fn id(&self) -> StreamId {
        self.id
    }
}

impl Drop for SendHalf {
    fn drop(&mut self) {
        let id = self.id;
        // A unidirectional stream of ours is one of HTTP/3's critical streams (control, QPACK;
        // h3 finishes its grease stream itself), whose end the peer takes as a connection
        // error: it is left open for the connection's close to end (G19).
        let ended = self.ended || id.dir() == Dir::Uni;
        self.conn.drop_half(Waiter::Write(id), ended, |c| {
            if let Some(p) = c.proto.as_mut() {
                match p.send_stream(id).finish() {
                    Ok(()) => c.finished(id),
                    // Stopped by the peer: a stream neither finished nor reset is never freed,
                    // so the peer would never get its credit back (decision T14).
                    Err(proto::FinishError::Stopped(code)) => {
                        let _ = p.send_stream(id).reset(code);
                    }
                    Err(proto::FinishError::ClosedStream) => {}
                }
            }
        });
    }
}

/// The receiving half of a stream. Dropped before its end, it asks the peer to stop sending.
pub struct RecvStream {
    conn: Connection,
    id: StreamId,
    ended: bool,
}

impl RecvStream {
    fn new(conn: Connection, id: StreamId) -> Self {
        RecvStream {
            conn,
            id,
            ended: false,
        }
    }
}

impl quic::RecvStream for RecvStream {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        let id = self.id;
        let (r, ended) = self.conn.with(|c, s| {
            let p = match alive(c) {
                Ok(p) => p,
                Err(e) => return (Poll::Ready(Err(stream_error(e))), true),
            };
            let mut stream = p.recv_stream(id);
            let mut chunks = match stream.read(true) {
                Ok(ch) => ch,
                Err(e) => {
                    return (
                        Poll::Ready(Err(StreamErrorIncoming::Unknown(Box::new(e)))),
                        true,
                    )
                }
            };
            let res = chunks.next(usize::MAX);
            // A stream read to its end or reset is freed: the driver's turn announces the
            // credit (decision T14).
            if chunks.finalize().should_transmit()
                || matches!(res, Ok(None) | Err(proto::ReadError::Reset(_)))
            {
                s.touch();
            }
            match res {
                Ok(Some(chunk)) => (Poll::Ready(Ok(Some(chunk.bytes))), false),
                Ok(None) => (Poll::Ready(Ok(None)), true),
                Err(proto::ReadError::Blocked) => {
                    c.wait(Waiter::Read(id), cx.waker());
                    (Poll::Pending, false)
                }
                Err(proto::ReadError::Reset(code)) => (
                    Poll::Ready(Err(StreamErrorIncoming::StreamTerminated {
                        error_code: code.into_inner(),
                    })),
                    true,
                ),
            }
        });
        self.ended |= ended;
        r
    }

    fn stop_sending(&mut self, error_code: u64) {
        let id = self.id;
        self.ended = true;
        self.conn.apply(|p| {
            let _ = p.recv_stream(id).stop(varint(error_code));
        });
    }

    fn recv_id(&self) -> quic::StreamId {
        stream_id(self.id)
    }
}

impl Drop for RecvStream {
    fn drop(&mut self) {
        let id = self.id;
        self.conn.drop_half(Waiter::Read(id), self.ended, |c| {
            if let Some(p) = c.proto.as_mut() {
                let _ = p.recv_stream(id).stop(0u32.into());
            }
        });
    }
}

/// Both halves of a bidirectional stream.
pub type BidiStream = h3_adapter::BidiStream<SendStream, RecvStream>;

fn bidi(conn: &Connection, id: StreamId) -> BidiStream {
    BidiStream::new(
        SendStream::new(SendHalf::new(conn.clone(), id)),
        RecvStream::new(conn.clone(), id),
    )
}
