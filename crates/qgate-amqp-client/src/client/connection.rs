//! An open AMQP connection with one session: opening it, its links, and a close that neither
//! busy-loops nor resets the socket.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use fe2o3_amqp::connection::ConnectionHandle;
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::sasl_profile::SaslProfile;
use fe2o3_amqp::types::definitions::{ReceiverSettleMode, SenderSettleMode};
use fe2o3_amqp::{Receiver, Sender, Session};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::connector::{Connector, StreamInfo};
use super::error::ClientError;
use crate::transport::BoxStream;

impl Connector {
    /// Open an AMQP connection and one session.
    pub async fn open(&self) -> Result<(Client, StreamInfo), ClientError> {
        let (io, info) = self.stream().await?;
        let closing = Arc::new(CloseState::default());
        let io = Closing {
            inner: io,
            state: closing.clone(),
        };
        let profile = match &self.sasl {
            Some((u, p)) => SaslProfile::Plain {
                username: u.clone(),
                password: p.clone(),
            },
            None => SaslProfile::Anonymous,
        };
        let mut conn = fe2o3_amqp::Connection::builder()
            .container_id(format!("qgate-{}", std::process::id()))
            .hostname(self.server_name.as_str())
            .max_frame_size(65_536)
            .sasl_profile(profile)
            .open_with_stream(io)
            .await
            .map_err(|e| ClientError::Open(e.to_string()))?;
        let session = Session::builder()
            .incoming_window(65_536)
            .outgoing_window(65_536)
            .begin(&mut conn)
            .await
            .map_err(|e| ClientError::Begin(e.to_string()))?;
        Ok((
            Client {
                conn,
                session,
                closing,
            },
            info,
        ))
    }
}

/// An open AMQP connection with one session.
pub struct Client {
    conn: ConnectionHandle<()>,
    session: fe2o3_amqp::session::SessionHandle<()>,
    closing: Arc<CloseState>,
}

/// When a client closes, its read side ends as soon as its AMQP close has been flushed.
/// fe2o3-amqp 0.18's engines busy-loop from sending their end or close until the peer's
/// arrives (their internal channel reports closed on every poll): a core for a round trip per
/// close on real links, and a frozen clock in virtual time. Ending the read side stops the
/// engine at once; the peer still gets our close, and the links were detached before (every
/// transfer and outcome already exchanged), so nothing is lost.
#[derive(Debug, Default)]
struct CloseState {
    armed: AtomicBool,
    ended: AtomicBool,
    reader: Mutex<Option<Waker>>,
    /// The engine let go of the stream and its linger is over.
    released: tokio::sync::Notify,
}

#[derive(Debug)]
struct Closing {
    inner: BoxStream,
    state: Arc<CloseState>,
}

/// How long a closed client keeps reading (and discarding) what the broker still sends.
const LINGER: Duration = Duration::from_secs(2);

/// Once the engine lets go of a cleanly closed stream, end our sending side and read until the
/// broker's end of stream (at most [`LINGER`]) instead of dropping it. A TCP socket closed with
/// unread bytes — the broker's last flow or disposition frames — sends RST, and RST makes the
/// broker's kernel discard what it had received and not yet read: our last dispositions and
/// our close (decision M24).
/// [`Client::close`] waits for it, so a command that drops its runtime right after still
/// lingers.
impl Drop for Closing {
    fn drop(&mut self) {
        let state = self.state.clone();
        let rt = tokio::runtime::Handle::try_current();
        let (true, Ok(rt)) = (state.ended.load(Ordering::Acquire), rt) else {
            state.released.notify_one();
            return;
        };
        let mut io = std::mem::replace(&mut self.inner, Box::new(tokio::io::empty()));
        rt.spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let drain = async {
                let _ = io.shutdown().await;
                let mut sink = [0u8; 4096];
                while matches!(io.read(&mut sink).await, Ok(n) if n > 0) {}
            };
            let _ = tokio::time::timeout(LINGER, drain).await;
            drop(io);
            state.released.notify_one();
        });
    }
}

impl AsyncRead for Closing {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.state.ended.load(Ordering::Acquire) {
            return Poll::Ready(Ok(()));
        }
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if r.is_pending() {
            *self.state.reader.lock().expect("no panics under this lock") =
                Some(cx.waker().clone());
            if self.state.ended.load(Ordering::Acquire) {
                return Poll::Ready(Ok(()));
            }
        }
        r
    }
}

impl AsyncWrite for Closing {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        if matches!(r, Poll::Ready(Ok(()))) && self.state.armed.load(Ordering::Acquire) {
            self.state.ended.store(true, Ordering::Release);
            if let Some(w) = self
                .state
                .reader
                .lock()
                .expect("no panics under this lock")
                .take()
            {
                w.wake();
            }
        }
        r
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl Client {
    /// A sender on `address`; `settled` sends pre-settled (at-most-once).
    pub async fn sender(
        &mut self,
        name: &str,
        address: &str,
        settled: bool,
    ) -> Result<Sender, ClientError> {
        Sender::builder()
            .name(name)
            .target(address)
            .sender_settle_mode(if settled {
                SenderSettleMode::Settled
            } else {
                SenderSettleMode::Unsettled
            })
            .attach(&mut self.session)
            .await
            .map_err(|e| ClientError::Attach {
                address: address.to_string(),
                msg: e.to_string(),
            })
    }

    /// A receiver on `address` with `credit` (refilled as messages are accepted); `settled`
    /// asks the broker to send pre-settled.
    pub async fn receiver(
        &mut self,
        name: &str,
        address: &str,
        settled: bool,
        credit: u32,
    ) -> Result<Receiver, ClientError> {
        Receiver::builder()
            .name(name)
            .source(address)
            .sender_settle_mode(if settled {
                SenderSettleMode::Settled
            } else {
                SenderSettleMode::Unsettled
            })
            .receiver_settle_mode(ReceiverSettleMode::First)
            .credit_mode(CreditMode::Auto(credit.max(1)))
            .attach(&mut self.session)
            .await
            .map_err(|e| ClientError::Attach {
                address: address.to_string(),
                msg: e.to_string(),
            })
    }

    /// Resolves once the connection's engine has stopped (the broker closed it, or the
    /// transport failed). fe2o3-amqp 0.18 does not wake a sender waiting for link credit when
    /// that happens, so a send races this (looked at every 200 ms).
    pub async fn ended(&self) {
        while !self.conn.is_closed() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Close the connection (which ends its session, AMQP 1.0 §2.4.3) without waiting for the
    /// broker's close: fe2o3-amqp's engines would busy-loop for that round trip (decision
    /// M15). Detach the links first.
    pub async fn close(mut self) {
        self.closing.armed.store(true, Ordering::Release);
        let _ = self.conn.close().await;
        drop(self.session);
        // The engine drops the stream as it ends; its linger (M24) is over within LINGER.
        let released = self.closing.released.notified();
        let _ = tokio::time::timeout(LINGER + Duration::from_millis(100), released).await;
    }
}

/// `fut` (a close), given at most 5 s: a close must never hold a long-lived task (fe2o3 waits
/// for a peer's close that a dead peer never sends).
pub async fn bounded(fut: impl std::future::Future<Output = ()>) {
    let _ = tokio::time::timeout(Duration::from_secs(5), fut).await;
}

/// Resolves when the QUIC connection closes; never for TCP (fe2o3 reports its end itself).
pub async fn quic_closed(quic: Option<&quinn::Connection>) -> quinn::ConnectionError {
    match quic {
        Some(c) => c.closed().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_closed_client_ends_with_fin_not_reset_when_bytes_are_unread() {
        // The broker wrote frames the client never read; dropping the socket as it is would
        // answer with RST and the broker's kernel would discard the client's last frames.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        let (mut broker, _) = l.accept().await.unwrap();
        let state = Arc::new(CloseState::default());
        let mut io = Closing {
            inner: Box::new(client),
            state: state.clone(),
        };
        broker.write_all(&[7u8; 1000]).await.unwrap();
        io.write_all(b"close").await.unwrap();
        state.armed.store(true, Ordering::Release);
        io.flush().await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(io);
        let mut got = Vec::new();
        broker.read_to_end(&mut got).await.expect("FIN, not RST");
        assert_eq!(got, b"close");
        // The broker answers and closes; the lingering client reads it to the end.
        broker.write_all(b"closed").await.unwrap();
        broker.shutdown().await.unwrap();
    }
}
