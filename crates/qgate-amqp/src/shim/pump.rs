//! The shim's two tasks: they carry a connection's bytes between the peer and the broker
//! through a [`Rewriter`] each way, and end it when a rule or a deadline is broken.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use fe2o3_amqp::types::definitions::{AmqpError, ConnectionError, ErrorCondition};
use futures_util::FutureExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
// tokio's clock: the shim's deadlines run in virtual time on the simulator.
use tokio::time::Instant;

use super::rewrite::{error_close, Direction, Pipeline, Rewriter};

/// How the inbound pump asks the outbound one to end the connection.
#[derive(Debug)]
enum Fail {
    /// Before AMQP frames: our protocol header, if not sent yet (§2.2), then close.
    Header,
    /// After: an open if none was sent (§2.4.1 says close follows open), then a close with
    /// this condition and description (none if the broker already sent its close).
    Close(ErrorCondition, String),
}

/// A minimal open frame for answering a peer that broke framing before the broker opened.
fn open_frame() -> Vec<u8> {
    // The spec's default frame size (§2.7.1: no limit).
    crate::wire::amqp_frame(&crate::wire::open("qgate-broker", u32::MAX), &[])
}

/// The limits and deadlines the shim enforces on one connection (decision M16).
#[derive(Debug, Clone, Copy)]
pub struct ShimConfig {
    /// Largest inbound frame.
    pub max_frame: u32,
    /// Bytes of the in-memory pipe to the broker, each way.
    pub buffer: usize,
    /// Header → SASL → open must be done within this; it also bounds a frame held for
    /// credit and the wait for the peer's close after the broker's.
    pub handshake_timeout: Duration,
    /// Nothing received for this long closes the connection, and a peer that takes no bytes
    /// for this long too; half of it is announced in the broker's open (AMQP 1.0 §2.4.5).
    /// Zero: never.
    pub idle_timeout: Duration,
    /// Most sessions at once.
    pub max_sessions: usize,
}

/// Which deadline ended a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    /// No open within the handshake timeout.
    Handshake,
    /// Nothing received within the idle timeout.
    Idle,
    /// A frame held for credit that did not come.
    Held,
    /// No close from the peer after the broker's.
    Close,
    /// The peer took no bytes within the idle timeout.
    Write,
}

/// What the shim tells the connection's owner. The shim's two pumps each hold the watch and
/// drop it when they end, so its `Drop` marks the moment the connection's state is freed.
pub trait Watch: Send + Sync + 'static {
    /// The connection is being closed because `what` passed.
    fn timed_out(&self, what: Deadline) {
        let _ = what;
    }

    /// Resolves when the connection is to be closed from outside (the admin port's close):
    /// the peer is sent `amqp:connection:forced` and both pumps end.
    fn forced(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(std::future::pending())
    }
}

impl Watch for () {}

/// State both pumps share.
struct Shared {
    /// The broker's side has ended (the inbound pump stops).
    broker_gone: AtomicBool,
    /// Something the broker said may have let held frames go, or changed a deadline.
    granted: tokio::sync::Notify,
    /// When the broker's close went out.
    closing: Mutex<Option<Instant>>,
}

/// Put the shim between `peer` and the broker: returns the broker's end. Two tasks pump bytes
/// through a bounded in-memory pipe of `cfg.buffer` bytes each way; bad framing from the peer
/// ends the connection with a framing-error close (or, before AMQP starts, the broker's
/// protocol header, AMQP 1.0 §2.2), and so does every deadline of [`ShimConfig`]. When the
/// peer's socket closes, or a deadline passes, both pumps end and the broker's end sees EOF:
/// no state outlives its socket by more than a deadline (decision M16).
pub fn shim<S>(peer: S, cfg: ShimConfig, watch: Arc<dyn Watch>) -> tokio::io::DuplexStream
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (broker_end, ours) = tokio::io::duplex(cfg.buffer);
    let (mut peer_rd, mut peer_wr) = tokio::io::split(peer);
    let (mut ours_rd, mut ours_wr) = tokio::io::split(ours);
    // The failure to tell the peer, with the peer's read half: it stays open until the close
    // is written, so the peer's transport does not fail (QUIC STOP_SENDING, a TCP reset) before
    // it has read why.
    let (fail_tx, mut fail_rx) = tokio::sync::oneshot::channel::<(Fail, tokio::io::ReadHalf<S>)>();
    let pipeline = Arc::new(Mutex::new(Pipeline::default()));
    let pipeline_out = pipeline.clone();
    let shared = Arc::new(Shared {
        broker_gone: AtomicBool::new(false),
        granted: tokio::sync::Notify::new(),
        closing: Mutex::new(None),
    });
    let shared_out = shared.clone();
    let watch_out = watch.clone();
    // Peer → broker.
    tokio::spawn(async move {
        let mut rw = Rewriter::new(Direction::Inbound, cfg.max_frame)
            .with_pipeline(pipeline)
            .with_max_sessions(cfg.max_sessions);
        let mut input = BytesMut::with_capacity(16 * 1024);
        let mut out = BytesMut::with_capacity(16 * 1024);
        let mut eof = false;
        let start = Instant::now();
        let mut last_read = start;
        let mut held_since: Option<Instant> = None;
        let fail = loop {
            if !rw.release_held(&mut input) {
                if (eof && rw.held() == 0) || shared.broker_gone.load(Ordering::Acquire) {
                    break None;
                }
                // The earliest deadline now in force (M16): every wait on the peer is bounded.
                let closing = *shared.closing.lock().unwrap_or_else(|e| e.into_inner());
                let due = [
                    (!rw.opened()).then_some((start + cfg.handshake_timeout, Deadline::Handshake)),
                    (!cfg.idle_timeout.is_zero() && !eof)
                        .then_some((last_read + cfg.idle_timeout, Deadline::Idle)),
                    held_since.map(|t| (t + cfg.handshake_timeout, Deadline::Held)),
                    closing.map(|t| (t + cfg.handshake_timeout, Deadline::Close)),
                ]
                .into_iter()
                .flatten()
                .min_by_key(|(t, _)| *t);
                let at = due.map_or(start + Duration::from_secs(365 * 86_400), |(t, _)| t);
                // A deadline other than idleness goes before the peer's bytes: a peer that keeps
                // its socket full must not hold a handshake, a held frame or a close open (M16).
                let urgent = due.is_some_and(|(_, w)| w != Deadline::Idle);
                let expired = || {
                    let what = due.map_or(Deadline::Idle, |(_, w)| w);
                    watch.timed_out(what);
                    tracing::info!(target: "qgate_amqp::shim", deadline = ?what, "closing connection: deadline passed");
                    deadline_fail(what, &rw, &cfg)
                };
                tokio::select! {
                    // In this order: the operator, a deadline that bytes do not lift, the peer's
                    // bytes, the broker's grant, then the idle deadline (bytes that arrive as it
                    // passes keep the connection).
                    biased;
                    _ = watch.forced() => {
                        tracing::info!(target: "qgate_amqp::shim", "closing connection: closed by the operator");
                        break Some(if rw.in_amqp() {
                            Fail::Close(ConnectionError::ConnectionForced.into(), "closed by the operator".into())
                        } else {
                            Fail::Header
                        });
                    }
                    _ = tokio::time::sleep_until(at), if urgent => break expired(),
                    r = peer_rd.read_buf(&mut input), if !eof => match r {
                        Ok(0) | Err(_) => eof = true,
                        Ok(_) => last_read = Instant::now(),
                    },
                    _ = shared.granted.notified() => {}
                    _ = tokio::time::sleep_until(at), if due.is_some() && !urgent => break expired(),
                }
                if eof && rw.held() == 0 && input.is_empty() {
                    break None;
                }
            }
            let result = rw.process(&mut input, &mut out);
            if !out.is_empty() {
                // The broker may have stopped reading because its side has ended (e.g. the
                // peer took no bytes, M16): a write into the full pipe then waits for that end
                // too, or nothing would ever free this connection.
                let gone = async {
                    while !shared.broker_gone.load(Ordering::Acquire) {
                        shared.granted.notified().await;
                    }
                };
                tokio::select! {
                    biased;
                    r = ours_wr.write_all(&out) => if r.is_err() { break None },
                    _ = gone => break None,
                    // The broker may not read for a while (a producer held by back-pressure):
                    // an operator's close does not wait for it.
                    _ = watch.forced() => break Some(Fail::Close(
                        ConnectionError::ConnectionForced.into(),
                        "closed by the operator".into(),
                    )),
                }
            }
            out.clear();
            held_since = match (rw.held() == 0, held_since) {
                (true, _) => None,
                (false, None) => Some(Instant::now()),
                (false, since) => since,
            };
            if let Err(e) = result {
                tracing::warn!(target: "qgate_amqp::shim", error = %e, "closing connection: bad framing");
                break Some(if rw.in_amqp() {
                    Fail::Close(e.condition(), e.to_string())
                } else {
                    Fail::Header
                });
            }
            if input.capacity() - input.len() < 4096 {
                input.reserve(16 * 1024);
            }
        };
        if let Some(f) = fail {
            let _ = fail_tx.send((f, peer_rd));
        }
        let _ = ours_wr.shutdown().await;
    });
    // Broker → peer.
    tokio::spawn(async move {
        let watch = watch_out;
        let shared = shared_out;
        let announce = u32::try_from((cfg.idle_timeout / 2).as_millis()).unwrap_or(u32::MAX);
        let mut rw = Rewriter::new(Direction::Outbound, u32::MAX)
            .with_pipeline(pipeline_out)
            .with_announced_idle(announce);
        let mut input = BytesMut::with_capacity(16 * 1024);
        let mut out = BytesMut::with_capacity(16 * 1024);
        // A peer that takes no bytes is as idle as one that sends none (M16).
        let write = |n: Duration| if n.is_zero() { Duration::MAX } else { n };
        let write_limit = write(cfg.idle_timeout);
        // The stream was ended already (after an error close).
        let mut shut = false;
        // The inbound pump ended without a failure (seen by `try_recv`): `fail_rx` is spent.
        let mut rx_done = false;
        loop {
            let failed = tokio::select! {
                biased;
                reply = &mut fail_rx, if !rx_done => Some(reply.ok()),
                r = ours_rd.read_buf(&mut input) => match r {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        gather(&mut ours_rd, &mut input).await;
                        // The peer's failure may have come while the broker's bytes were
                        // gathered: they answer the end of its stream (a plain close), and the
                        // failure's close must reach the peer instead.
                        match fail_rx.try_recv() {
                            Ok(f) => Some(Some(f)),
                            Err(tokio::sync::oneshot::error::TryRecvError::Empty) => None,
                            // Ended without a failure: what was gathered still goes out, then
                            // the pump ends as it did when it saw that end first.
                            Err(tokio::sync::oneshot::error::TryRecvError::Closed) => {
                                rx_done = true;
                                None
                            }
                        }
                    }
                },
            };
            if let Some(reply) = failed {
                if let Some((reply, mut rd)) = reply {
                    // Only an operator's close lingers (M29): a peer that broke a rule or
                    // a deadline loses its read side at once, as before.
                    let forced = matches!(&reply, Fail::Close(c, _)
                            if *c == ErrorCondition::from(ConnectionError::ConnectionForced));
                    let bytes = match reply {
                        Fail::Header if rw.sent_header() => Vec::new(),
                        Fail::Header => b"AMQP\x03\x01\x00\x00".to_vec(),
                        Fail::Close(..) if rw.closed() => Vec::new(),
                        Fail::Close(c, why) if rw.opened() => error_close(c, &why),
                        Fail::Close(c, why) => [open_frame(), error_close(c, &why)].concat(),
                    };
                    if forced {
                        // Write the close and end the stream while reading (and dropping)
                        // what the peer still sends — a peer blocked writing to us could
                        // not read our close otherwise — for at most CLOSE_LINGER, the
                        // write within the handshake deadline.
                        let tell = async {
                            if send(&mut peer_wr, &bytes).await.is_ok() {
                                let _ = peer_wr.shutdown().await;
                            }
                        };
                        let mut sink = [0u8; 4096];
                        let drain = tokio::time::timeout(CLOSE_LINGER, async {
                            while matches!(rd.read(&mut sink).await, Ok(n) if n > 0) {}
                        });
                        let both = async { tokio::join!(tell, drain) };
                        let _ = tokio::time::timeout(cfg.handshake_timeout.max(CLOSE_LINGER), both)
                            .await;
                        shut = true;
                    } else {
                        drop(rd);
                        let _ = tokio::time::timeout(write_limit, send(&mut peer_wr, &bytes)).await;
                    }
                }
                break;
            }
            if rw.process(&mut input, &mut out).is_err() {
                break;
            }
            if rw.closed() {
                let mut c = shared.closing.lock().unwrap_or_else(|e| e.into_inner());
                c.get_or_insert_with(Instant::now);
            }
            // Whatever the broker said may have let held transfers go.
            shared.granted.notify_one();
            if !out.is_empty() {
                match tokio::time::timeout(write_limit, send(&mut peer_wr, &out)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => break,
                    Err(_) => {
                        watch.timed_out(Deadline::Write);
                        tracing::info!(target: "qgate_amqp::shim", "closing connection: the peer takes no bytes");
                        break;
                    }
                }
            }
            out.clear();
            if rx_done {
                break;
            }
            if input.capacity() - input.len() < 4096 {
                input.reserve(16 * 1024);
            }
        }
        if !shut {
            let _ = tokio::time::timeout(cfg.handshake_timeout, peer_wr.shutdown()).await;
        }
        shared.broker_gone.store(true, Ordering::Release);
        shared.granted.notify_one();
    });
    broker_end
}

/// The most rounds of other ready tasks [`gather`] lets run while the broker keeps writing.
const GATHER_ROUNDS: usize = 8;
/// [`gather`] stops once it holds this many bytes.
const GATHER_MAX: usize = 64 * 1024;

/// Let the broker finish what it is saying before it goes to the peer (decision M31): after
/// a read, yield to the tasks ready at this instant, the broker's among them, and take what they
/// wrote, until a round adds nothing. fe2o3-amqp writes each frame on its own, and quinn sends
/// what a stream holds when its connection task next runs, so without this every frame of an
/// answer left in its own packet (a one-message connection's opening answer in 5 datagrams).
/// It waits for no timer, only for at most [`GATHER_ROUNDS`] turns of the scheduler; on a
/// multi-threaded runtime the broker's tasks may run on another worker meanwhile, so it
/// gathers what it can, not always everything.
async fn gather<R: AsyncRead + Unpin>(rd: &mut R, input: &mut BytesMut) {
    for _ in 0..GATHER_ROUNDS {
        if input.len() >= GATHER_MAX {
            return;
        }
        tokio::task::yield_now().await;
        match rd.read_buf(input).now_or_never() {
            Some(Ok(n)) if n > 0 => {}
            _ => return,
        }
    }
}

/// How long a connection the operator closed waits for the peer to read why and hang up.
const CLOSE_LINGER: Duration = Duration::from_secs(2);

/// Write `bytes` to the peer and flush them. A TLS stream (tokio-rustls) may keep records it
/// could not write yet in its own buffer and return: without the flush the broker's last
/// frames — a detach echo, the tail of a batch of transfers — waited for a next write that
/// never came (decision M23).
async fn send<W: AsyncWrite + Unpin>(w: &mut W, bytes: &[u8]) -> std::io::Result<()> {
    w.write_all(bytes).await?;
    w.flush().await
}

/// The broker's end of the shim with bytes already read from it put back in front: the
/// broker reads the protocol header to choose its acceptor, then hands the acceptor this.
#[derive(Debug)]
pub struct Replayed {
    head: [u8; 8],
    at: usize,
    inner: tokio::io::DuplexStream,
}

impl Replayed {
    /// `inner`, whose first bytes `head` were already read.
    pub fn new(head: [u8; 8], inner: tokio::io::DuplexStream) -> Self {
        Replayed { head, at: 0, inner }
    }
}

impl AsyncRead for Replayed {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.at < self.head.len() {
            let n = (self.head.len() - self.at).min(buf.remaining());
            let at = self.at;
            buf.put_slice(&self.head[at..at + n]);
            self.at += n;
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Replayed {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// What to tell the peer when `what` passed.
fn deadline_fail(what: Deadline, rw: &Rewriter, cfg: &ShimConfig) -> Option<Fail> {
    let why = match what {
        Deadline::Handshake => format!("no open within {:?}", cfg.handshake_timeout),
        Deadline::Idle => format!(
            "idle timeout: nothing received for {:?} (AMQP 1.0 §2.4.5)",
            cfg.idle_timeout
        ),
        Deadline::Held => format!(
            "a transfer waited {:?} for link credit that never came",
            cfg.handshake_timeout
        ),
        Deadline::Close | Deadline::Write => return None,
    };
    Some(if rw.in_amqp() {
        Fail::Close(AmqpError::ResourceLimitExceeded.into(), why)
    } else {
        Fail::Header
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    /// A peer's transport that counts the writes it is given (each is a packet on QUIC).
    struct Counting {
        inner: tokio::io::DuplexStream,
        writes: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl AsyncRead for Counting {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for Counting {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            self.writes.fetch_add(1, Ordering::Relaxed);
            std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
        }

        fn poll_flush(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.inner).poll_flush(cx)
        }

        fn poll_shutdown(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }

    #[tokio::test]
    async fn frames_the_broker_writes_one_after_another_reach_the_peer_in_one_write() {
        // fe2o3-amqp writes an answer frame by frame, its tasks taking turns in between
        // (decision M31): the shim passes them on together, so QUIC sends one packet.
        use tokio::io::AsyncReadExt;
        let (peer_side, mut peer) = tokio::io::duplex(64 * 1024);
        let writes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let cfg = ShimConfig {
            max_frame: 65_536,
            buffer: 64 * 1024,
            handshake_timeout: Duration::from_secs(5),
            idle_timeout: Duration::ZERO,
            max_sessions: 1,
        };
        let counting = Counting {
            inner: peer_side,
            writes: writes.clone(),
        };
        let mut broker = shim(counting, cfg, Arc::new(()));
        // The header, then three empty frames (AMQP 1.0 §2.3.1), each after a turn of the
        // other tasks.
        let empty = [0u8, 0, 0, 8, 2, 0, 0, 0];
        broker.write_all(b"AMQP\x00\x01\x00\x00").await.unwrap();
        for _ in 0..3 {
            tokio::task::yield_now().await;
            broker.write_all(&empty).await.unwrap();
        }
        let mut got = [0u8; 32];
        tokio::time::timeout(Duration::from_secs(5), peer.read_exact(&mut got))
            .await
            .expect("everything reached the peer")
            .unwrap();
        assert_eq!(&got[8..16], &empty);
        assert_eq!(writes.load(Ordering::Relaxed), 1);
        // A broker that keeps talking for more rounds than the shim waits is not held back:
        // what it said so far goes out after GATHER_ROUNDS turns.
        let rounds = 3 * GATHER_ROUNDS;
        for _ in 0..rounds {
            tokio::task::yield_now().await;
            broker.write_all(&empty).await.unwrap();
        }
        let mut rest = vec![0u8; 8 * rounds];
        tokio::time::timeout(Duration::from_secs(5), peer.read_exact(&mut rest))
            .await
            .expect("everything reached the peer")
            .unwrap();
        assert!(rest.chunks(8).all(|f| f == empty));
        let more = writes.load(Ordering::Relaxed) - 1;
        assert!((2..rounds).contains(&more), "{more} writes");
    }

    #[tokio::test]
    async fn what_the_broker_says_is_flushed_to_a_buffering_peer() {
        // tokio-rustls buffers records its socket did not take; a BufWriter holds everything
        // until flushed, so the broker's header reaches the peer only if the shim flushes.
        use tokio::io::AsyncReadExt;
        let (peer_side, mut peer) = tokio::io::duplex(64 * 1024);
        let cfg = ShimConfig {
            max_frame: 65_536,
            buffer: 64 * 1024,
            handshake_timeout: Duration::from_secs(5),
            idle_timeout: Duration::ZERO,
            max_sessions: 1,
        };
        let mut broker = shim(tokio::io::BufWriter::new(peer_side), cfg, Arc::new(()));
        broker.write_all(b"AMQP\x03\x01\x00\x00").await.unwrap();
        let mut head = [0u8; 8];
        tokio::time::timeout(Duration::from_secs(5), peer.read_exact(&mut head))
            .await
            .expect("the header reached the peer")
            .unwrap();
        assert_eq!(&head, b"AMQP\x03\x01\x00\x00");
    }
}
