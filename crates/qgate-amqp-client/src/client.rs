//! Senders and receivers: connect over any [`Scheme`], send or receive counted messages, and
//! report startup latency, total time and throughput (the quantities paper 003 compares).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
// tokio's clock: the same code measures real time on sockets and virtual time on netsim.
use tokio::time::Instant;

use fe2o3_amqp::connection::ConnectionHandle;
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::sasl_profile::SaslProfile;
use fe2o3_amqp::types::definitions::{ReceiverSettleMode, SenderSettleMode};
use fe2o3_amqp::types::messaging::{Body, Data, Message, MessageId, Outcome, Properties};
use fe2o3_amqp::types::primitives::{Binary, Value};
use fe2o3_amqp::{Receiver, Sender, Session};
use futures_util::stream::{FuturesUnordered, StreamExt};
use qgate_transport::history::{client_peer_key, HistoryStore};
use qgate_transport::{
    client_config, connect, constrained_endpoint, endpoint, one_connection_endpoint, Socket,
    TransportOptions, TrustRoots,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::transport::{self, BoxStream, Scheme, TransportError, ALPN_AMQP};

/// A client-side failure; the message names the step.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Setting up the byte stream.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// Configuration.
    #[error("{0}")]
    Config(String),
    /// AMQP open (including SASL).
    #[error("AMQP open: {0}")]
    Open(String),
    /// AMQP begin.
    #[error("AMQP begin: {0}")]
    Begin(String),
    /// Link attach (e.g. unknown address).
    #[error("attaching to '{address}': {msg}")]
    Attach {
        /// The address.
        address: String,
        /// Cause.
        msg: String,
    },
    /// Sending or receiving after attach.
    #[error("{0}")]
    Link(String),
}

/// Where and how to connect.
#[derive(Clone)]
pub struct Connector {
    scheme: Scheme,
    addr: SocketAddr,
    server_name: String,
    sasl: Option<(String, String)>,
    tls: Option<Arc<rustls::ClientConfig>>,
    quic: Option<(Endpoints, quinn::ClientConfig)>,
    dial: Option<transport::Dialer>,
    opts: TransportOptions,
    zero_rtt: bool,
    /// quic-mux: the connection every stream is opened on, while it is open.
    shared: Arc<tokio::sync::Mutex<Option<quinn::Connection>>>,
    /// Start new QUIC connections from this history of the broker, with this safeguard.
    history: Option<(Arc<HistoryStore>, Option<f64>)>,
    /// QUIC handshakes started, shared by clones.
    handshakes: Arc<AtomicU64>,
}

/// Makes the endpoint one new QUIC connection leaves from ([`Connector::per_connection`]).
pub type EndpointMaker = Arc<dyn Fn() -> Result<quinn::Endpoint, String> + Send + Sync>;

/// Where a connector's QUIC connections leave from.
#[derive(Clone)]
enum Endpoints {
    /// One endpoint for all of them.
    Shared(quinn::Endpoint),
    /// A new endpoint (socket) each (decision T10).
    PerConnection(EndpointMaker),
}

/// How a stream came up.
#[derive(Debug, Clone)]
pub struct StreamInfo {
    /// The QUIC connection was resumed with 0-RTT (AMQP bytes went in the first flight).
    pub zero_rtt: bool,
    /// The QUIC connection under the stream (None for TCP), for its statistics.
    pub quic: Option<quinn::Connection>,
    /// quic-mux: the stream was opened on a connection an earlier AMQP connection opened.
    pub reused: bool,
}

impl StreamInfo {
    /// The transport's smoothed RTT now (QUIC only: TCP's is the kernel's).
    pub fn rtt(&self) -> Option<Duration> {
        self.quic.as_ref().map(|c| c.rtt())
    }

    /// Packets the QUIC connection has declared lost so far (QUIC only). On a link that
    /// drops nothing, every one is a spurious retransmission.
    pub fn lost_packets(&self) -> Option<u64> {
        self.quic.as_ref().map(|c| c.stats().path.lost_packets)
    }
}

impl Connector {
    /// A connector to `addr` (certificate checked against `server_name` and `trust`).
    /// `sasl` = Some((user, password)) uses PLAIN, None ANONYMOUS. For QUIC, `socket` is the
    /// local socket (real UDP or simulated); without one, a UDP socket is bound, or, for
    /// per-connection QUIC on a declared radio (`opts.link_kbps`), one for each connection
    /// (decision T10). 0-RTT is used when `zero_rtt` and a ticket is held.
    pub fn new(
        scheme: Scheme,
        addr: SocketAddr,
        server_name: &str,
        trust: &TrustRoots,
        sasl: Option<(String, String)>,
        quic_socket: Option<Socket>,
        opts: &TransportOptions,
    ) -> Result<Connector, ClientError> {
        let mut c = Connector {
            scheme,
            addr,
            server_name: server_name.to_string(),
            sasl,
            tls: None,
            quic: None,
            dial: None,
            opts: opts.clone(),
            zero_rtt: true,
            shared: Arc::default(),
            history: None,
            handshakes: Arc::default(),
        };
        match scheme {
            Scheme::Quic | Scheme::QuicMux => {
                let any: SocketAddr = if addr.is_ipv4() {
                    "0.0.0.0:0".parse().expect("addr")
                } else {
                    "[::]:0".parse().expect("addr")
                };
                if scheme == Scheme::Quic && opts.link_kbps.is_some() && quic_socket.is_none() {
                    // Its short connections each from a socket of their own (T10).
                    let make: EndpointMaker = Arc::new(move || {
                        let s = Socket::bind_udp(any).map_err(|e| e.to_string())?;
                        one_connection_endpoint(s, None).map_err(|e| e.to_string())
                    });
                    return Connector::per_connection(make, addr, server_name, trust, c.sasl, opts);
                }
                let socket = match quic_socket {
                    Some(s) => s,
                    None => {
                        Socket::bind_udp(any).map_err(|e| ClientError::Config(e.to_string()))?
                    }
                };
                // A device that declares its radio's rate is on a constrained link (T6).
                let ep = if opts.link_kbps.is_some() {
                    constrained_endpoint(socket, None)
                } else {
                    endpoint(socket, None, None)
                }
                .map_err(|e| ClientError::Config(e.to_string()))?;
                let c = Connector::on_endpoint(ep, addr, server_name, trust, c.sasl, opts)?;
                return Ok(if scheme == Scheme::QuicMux {
                    c.multiplexed()
                } else {
                    c
                });
            }
            Scheme::TcpTls(v) => {
                c.tls = Some(
                    transport::tls_client_config(trust, v, None).map_err(ClientError::Config)?,
                );
            }
            Scheme::Tcp => {}
        }
        Ok(c)
    }

    /// A QUIC connector on an endpoint the caller made (a seeded one on a simulated socket,
    /// for deterministic experiments).
    pub fn on_endpoint(
        ep: quinn::Endpoint,
        addr: SocketAddr,
        server_name: &str,
        trust: &TrustRoots,
        sasl: Option<(String, String)>,
        opts: &TransportOptions,
    ) -> Result<Connector, ClientError> {
        Connector::quic(Endpoints::Shared(ep), addr, server_name, trust, sasl, opts)
    }

    /// A per-connection QUIC connector that opens each connection on a new endpoint from
    /// `make` (decision T10): with [`qgate_transport::one_connection_endpoint`], no connection
    /// IDs of its own and no drained connection's packets on the next. It cannot be
    /// [`multiplexed`](Self::multiplexed), which needs one endpoint.
    pub fn per_connection(
        make: EndpointMaker,
        addr: SocketAddr,
        server_name: &str,
        trust: &TrustRoots,
        sasl: Option<(String, String)>,
        opts: &TransportOptions,
    ) -> Result<Connector, ClientError> {
        Connector::quic(
            Endpoints::PerConnection(make),
            addr,
            server_name,
            trust,
            sasl,
            opts,
        )
    }

    fn quic(
        eps: Endpoints,
        addr: SocketAddr,
        server_name: &str,
        trust: &TrustRoots,
        sasl: Option<(String, String)>,
        opts: &TransportOptions,
    ) -> Result<Connector, ClientError> {
        let cfg = client_config(trust, &[ALPN_AMQP], opts)
            .map_err(|e| ClientError::Config(e.to_string()))?;
        Ok(Connector {
            scheme: Scheme::Quic,
            addr,
            server_name: server_name.to_string(),
            sasl,
            tls: None,
            quic: Some((eps, cfg)),
            dial: None,
            opts: opts.clone(),
            zero_rtt: true,
            shared: Arc::default(),
            history: None,
            handshakes: Arc::default(),
        })
    }

    /// Carry every AMQP connection as a stream of one long-lived QUIC connection (quic-mux,
    /// decision M25); a no-op for TCP and for a [`per_connection`](Self::per_connection)
    /// connector. Its idle timeout and keep-alive are the transport options'.
    pub fn multiplexed(mut self) -> Self {
        if matches!(self.quic, Some((Endpoints::Shared(_), _))) {
            self.scheme = Scheme::QuicMux;
        }
        self
    }

    /// Start each new QUIC connection from `store`'s history of this broker — its window
    /// (paper 002) and its last smoothed RTT (decision H8) — and record each connection there
    /// when it ends; `safeguard` as `[history] safeguard` (H4). A no-op for TCP.
    pub fn with_history(mut self, store: Arc<HistoryStore>, safeguard: Option<f64>) -> Self {
        self.history = Some((store, safeguard));
        self
    }

    /// QUIC handshakes this connector and its clones have started (None for TCP): with
    /// quic-mux, one per shared connection.
    pub fn quic_handshakes(&self) -> Option<u64> {
        self.quic
            .as_ref()
            .map(|_| self.handshakes.load(Ordering::Relaxed))
    }

    /// Close quic-mux's shared connection now (it also closes when the connector is
    /// dropped, or after the idle timeout) and wait, at most a second, until the broker has
    /// been told.
    pub async fn close_shared(&self) {
        if let Some(c) = self.shared.lock().await.take() {
            c.close(0u32.into(), b"");
            if let Some((Endpoints::Shared(ep), _)) = &self.quic {
                let _ = tokio::time::timeout(Duration::from_secs(1), ep.wait_idle()).await;
            }
        }
    }

    /// quic-mux: an AMQP connection on `conn` failed, so the shared connection may be dead
    /// (a restarted broker, a server-side idle timeout) although opening a stream on it still
    /// succeeds: close it, and the next AMQP connection opens a new one (decision M25).
    pub async fn forget_shared(&self, conn: &quinn::Connection) {
        let mut shared = self.shared.lock().await;
        if shared
            .as_ref()
            .is_some_and(|c| c.stable_id() == conn.stable_id())
        {
            *shared = None;
            conn.close(0u32.into(), b"");
        }
    }

    /// Present `identity` as a TLS client certificate (QUIC or TCP+TLS; brokers may require
    /// one).
    pub fn with_client_identity(
        mut self,
        trust: &TrustRoots,
        identity: &qgate_transport::Identity,
    ) -> Result<Self, ClientError> {
        match self.scheme {
            Scheme::TcpTls(v) => {
                self.tls = Some(
                    transport::tls_client_config(trust, v, Some(identity))
                        .map_err(ClientError::Config)?,
                );
            }
            Scheme::Quic | Scheme::QuicMux => {
                let cfg = qgate_transport::client_config_with_identity(
                    trust,
                    &[ALPN_AMQP],
                    &self.opts,
                    Some(identity),
                )
                .map_err(|e| ClientError::Config(e.to_string()))?;
                if let Some((_, c)) = self.quic.as_mut() {
                    *c = cfg;
                }
            }
            Scheme::Tcp => {
                return Err(ClientError::Config(
                    "a client certificate needs TLS: use quic or tcp-tls".into(),
                ))
            }
        }
        Ok(self)
    }

    /// Make TCP connections with `dial` instead of the kernel's TCP (TCP schemes only).
    pub fn with_dialer(mut self, dial: transport::Dialer) -> Self {
        self.dial = Some(dial);
        self
    }

    async fn tcp(&self) -> Result<BoxStream, TransportError> {
        match &self.dial {
            Some(d) => d(self.addr).await.map_err(|source| TransportError::Tcp {
                addr: self.addr,
                source,
            }),
            None => Ok(Box::new(transport::tcp(self.addr).await?)),
        }
    }

    /// Use 0-RTT when a session ticket is cached (default true).
    pub fn with_zero_rtt(mut self, on: bool) -> Self {
        self.zero_rtt = on;
        self
    }

    /// SASL PLAIN credentials, if any (None: ANONYMOUS).
    pub fn sasl(&self) -> Option<(String, String)> {
        self.sasl.clone()
    }

    /// The scheme.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// A fresh byte stream to the broker: a new QUIC connection (0-RTT when possible) with one
    /// bidirectional stream, or a new TCP (+TLS) connection.
    pub async fn stream(&self) -> Result<(BoxStream, StreamInfo), ClientError> {
        match self.scheme {
            Scheme::Quic => self.quic_connection().await,
            Scheme::QuicMux => {
                let mut shared = self.shared.lock().await;
                // A connection found closed (between the check and the stream) is not tried
                // twice; one another caller opened meanwhile is.
                let mut tried: Option<usize> = None;
                while let Some(c) = shared
                    .as_ref()
                    .filter(|c| c.close_reason().is_none() && tried != Some(c.stable_id()))
                {
                    let c = c.clone();
                    drop(shared);
                    if let Ok(s) = transport::quic_stream(&c).await {
                        let info = StreamInfo {
                            zero_rtt: false,
                            quic: Some(c),
                            reused: true,
                        };
                        return Ok((s, info));
                    }
                    tried = Some(c.stable_id());
                    shared = self.shared.lock().await;
                }
                let (s, info) = self.quic_connection().await?;
                *shared = info.quic.clone();
                Ok((s, info))
            }
            Scheme::TcpTls(_) => {
                let tls = self.tls.clone().expect("built for TLS");
                let tcp = self.tcp().await?;
                let s = transport::tls_over(tcp, self.addr, &self.server_name, tls).await?;
                Ok((
                    s,
                    StreamInfo {
                        zero_rtt: false,
                        quic: None,
                        reused: false,
                    },
                ))
            }
            Scheme::Tcp => {
                let s = self.tcp().await?;
                Ok((
                    s,
                    StreamInfo {
                        zero_rtt: false,
                        quic: None,
                        reused: false,
                    },
                ))
            }
        }
    }

    /// A new QUIC connection (0-RTT when a ticket is held) and a stream on it.
    async fn quic_connection(&self) -> Result<(BoxStream, StreamInfo), ClientError> {
        let (eps, cfg) = self.quic.as_ref().expect("built for QUIC");
        let own;
        let ep = match eps {
            Endpoints::Shared(ep) => ep,
            Endpoints::PerConnection(make) => {
                // Dropping this handle leaves the endpoint to its connection, which keeps it
                // until it has drained.
                own = make().map_err(ClientError::Config)?;
                &own
            }
        };
        let peer = client_peer_key(&self.server_name, self.addr);
        let cfg = match &self.history {
            Some((store, safeguard)) => store
                .client_config(cfg, &self.opts, &peer, *safeguard)
                .map(|(c, _)| c),
            None => qgate_transport::client_config_for(cfg, &self.opts, &peer),
        }
        .map_err(|e| ClientError::Config(e.to_string()))?;
        self.handshakes.fetch_add(1, Ordering::Relaxed);
        let c = connect(ep, &cfg, self.addr, &self.server_name, self.zero_rtt)
            .await
            .map_err(|e| TransportError::Quic {
                addr: self.addr,
                msg: e.to_string(),
            })?;
        let info = StreamInfo {
            zero_rtt: c.is_0rtt(),
            quic: Some(c.connection().clone()),
            reused: false,
        };
        let s = transport::quic_stream(c.connection()).await?;
        Ok((s, info))
    }

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

/// What to send.
#[derive(Debug, Clone)]
pub struct SendSpec {
    /// Queue address.
    pub address: String,
    /// Pre-settled (at-most-once) instead of waiting for the broker's accept.
    pub settled: bool,
    /// Most unsettled messages in flight.
    pub window: usize,
    /// Messages per second (None: as fast as credit allows).
    pub rate: Option<f64>,
    /// Link name.
    pub link_name: String,
}

/// What a run measured.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Messages sent and accepted (or received).
    pub messages: u64,
    /// Body bytes.
    pub bytes: u64,
    /// Messages the broker rejected.
    pub rejected: u64,
    /// Connection start → first message written (paper 003's startup latency).
    pub startup: Duration,
    /// Connection start → last outcome (or message) in.
    pub total: Duration,
    /// The stream came up with 0-RTT.
    pub zero_rtt: bool,
    /// The transport's smoothed RTT at the end (QUIC only).
    pub rtt: Option<Duration>,
    /// Packets QUIC declared lost while this AMQP connection was open (pipelined clients on
    /// QUIC only).
    pub lost_packets: Option<u64>,
    /// The first rejection's reason.
    pub first_error: Option<String>,
}

impl Report {
    /// Messages per second over the whole run.
    pub fn rate(&self) -> f64 {
        self.messages as f64 / self.total.as_secs_f64().max(1e-9)
    }
}

/// A message with a data body and a numeric message-id.
pub fn message(id: u64, body: Vec<u8>) -> Message<Body<Value>> {
    message_with_id(MessageId::Ulong(id), body)
}

/// A message with a data body and `id`.
pub fn message_with_id(id: MessageId, body: Vec<u8>) -> Message<Body<Value>> {
    Message::builder()
        .properties(Properties {
            message_id: Some(id),
            ..Default::default()
        })
        .body(Body::Data(vec![Data(Binary::from(body))].into()))
        .build()
}

/// A random 64-bit run id: message-ids `RUN-N` are unique across runs, so the broker's 0-RTT
/// replay guard (which keys on message-id and bytes) never mistakes a new run for a replay.
pub fn run_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish()
}

/// How long a client waits on a silent QUIC broker before it gives up (with keep-alives every
/// third of it, so a live but idle broker is never taken for dead): a few seconds, not quinn's
/// 30, so `qgate send` notices a dead broker quickly (decision M20).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(5);

/// `opts` with `idle` as the QUIC idle timeout and keep-alives at least every third of it.
pub fn with_idle_timeout(opts: &TransportOptions, idle: Duration) -> TransportOptions {
    let ms = (idle.as_millis() as u64).max(1);
    let keep = (ms / 3).max(1);
    TransportOptions {
        idle_timeout_ms: ms,
        keep_alive_ms: Some(opts.keep_alive_ms.map_or(keep, |k| k.min(keep))),
        ..opts.clone()
    }
}

/// Open a connection and send every body `bodies` yields on one link; the report's clock starts
/// before the connection is opened.
pub async fn send(
    connector: &Connector,
    spec: &SendSpec,
    bodies: impl IntoIterator<Item = Vec<u8>>,
) -> Result<Report, ClientError> {
    let mut report = Report::default();
    send_into(connector, spec, bodies, &mut report).await?;
    Ok(report)
}

/// [`send`], counting into `report` as outcomes arrive: when it fails (or its future is
/// dropped), `report` still says how many messages the broker accepted (decision M20).
pub async fn send_into(
    connector: &Connector,
    spec: &SendSpec,
    bodies: impl IntoIterator<Item = Vec<u8>>,
    report: &mut Report,
) -> Result<(), ClientError> {
    let start = Instant::now();
    let (mut client, info) = connector.open().await?;
    let mut sender = client
        .sender(&spec.link_name, &spec.address, spec.settled)
        .await?;
    report.zero_rtt = info.zero_rtt;
    let mut pace = spec.rate.filter(|r| *r > 0.0).map(|r| {
        let mut t = tokio::time::interval(Duration::from_secs_f64(1.0 / r));
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        t
    });
    let mut inflight = FuturesUnordered::new();
    let mut first = true;
    let run = run_id();
    let quic = info.quic.as_ref();
    for (i, body) in bodies.into_iter().enumerate() {
        if let Some(p) = pace.as_mut() {
            p.tick().await;
        }
        while inflight.len() >= spec.window.max(1) {
            if let Some(r) = unless_closed(&client, quic, &spec.address, inflight.next()).await? {
                tally(report, r).map_err(|e| link_gone(&spec.address, e))?;
                report.total = start.elapsed();
            }
        }
        let len = body.len() as u64;
        let send = sender.send_batchable(message_with_id(
            MessageId::String(format!("{run:016x}-{i}")),
            body,
        ));
        let fut = unless_closed(&client, quic, &spec.address, send)
            .await?
            .map_err(|e| ClientError::Link(format!("sending: {e}")))?;
        if first {
            report.startup = start.elapsed();
            first = false;
        }
        inflight.push(async move { (len, fut.await) });
    }
    while let Some(r) = unless_closed(&client, quic, &spec.address, inflight.next()).await? {
        tally(report, r).map_err(|e| link_gone(&spec.address, e))?;
        report.total = start.elapsed();
    }
    report.total = start.elapsed();
    report.rtt = info.rtt();
    let _ = sender.close().await;
    client.close().await;
    Ok(())
}

/// Count one outcome. Err when the link itself is gone (the broker closed it, e.g. an unknown
/// address refused just after the attach): that is the run's failure, not one rejection.
fn tally(
    report: &mut Report,
    (len, r): (u64, Result<Outcome, fe2o3_amqp::link::SendError>),
) -> Result<(), String> {
    use fe2o3_amqp::link::SendError;
    match r {
        Ok(Outcome::Accepted(_)) => {
            report.messages += 1;
            report.bytes += len;
        }
        Ok(Outcome::Rejected(rej)) => {
            report.rejected += 1;
            if report.first_error.is_none() {
                report.first_error = Some(
                    rej.error
                        .map(|e| {
                            format!("{:?}: {}", e.condition, e.description.unwrap_or_default())
                        })
                        .unwrap_or_else(|| "rejected".into()),
                );
            }
        }
        Ok(other) => {
            report.rejected += 1;
            report
                .first_error
                .get_or_insert_with(|| format!("{other:?}"));
        }
        Err(e @ (SendError::LinkStateError(_) | SendError::Detached(_))) => {
            return Err(e.to_string())
        }
        Err(e) => {
            report.rejected += 1;
            report.first_error.get_or_insert_with(|| e.to_string());
        }
    }
    Ok(())
}

/// `fut`, unless the QUIC connection under the link closes first: fe2o3 leaves a delivery's
/// outcome pending for ever when its transport dies (found by `qgate-lab faults`), so a sender
/// would hang on a dead broker with messages in flight (decision M20).
async fn unless_closed<T>(
    client: &Client,
    quic: Option<&quinn::Connection>,
    address: &str,
    fut: impl std::future::Future<Output = T>,
) -> Result<T, ClientError> {
    tokio::select! {
        biased;
        r = fut => Ok(r),
        e = quic_closed(quic) => Err(link_gone(address, format!("the QUIC connection closed: {e}"))),
        _ = client.ended() => Err(link_gone(address, "the broker closed the connection".into())),
    }
}

fn link_gone(address: &str, e: String) -> ClientError {
    ClientError::Link(format!("sending to '{address}': the link ended: {e}"))
}

/// What to receive.
#[derive(Debug, Clone)]
pub struct RecvSpec {
    /// Queue address.
    pub address: String,
    /// Ask for pre-settled delivery.
    pub settled: bool,
    /// Stop after this many (None: until `idle` passes without a message).
    pub count: Option<u64>,
    /// Give up waiting after this long without a message.
    pub idle: Duration,
    /// Link credit.
    pub credit: u32,
    /// Link name.
    pub link_name: String,
}

/// Open a connection and receive from `spec.address`, calling `each` with every body.
pub async fn receive(
    connector: &Connector,
    spec: &RecvSpec,
    mut each: impl FnMut(&[u8]),
) -> Result<Report, ClientError> {
    let start = Instant::now();
    let (mut client, info) = connector.open().await?;
    let mut receiver = client
        .receiver(&spec.link_name, &spec.address, spec.settled, spec.credit)
        .await?;
    let mut report = Report {
        zero_rtt: info.zero_rtt,
        startup: start.elapsed(),
        ..Default::default()
    };
    while spec.count.is_none_or(|n| report.messages < n) {
        let d = match tokio::time::timeout(spec.idle, receiver.recv::<Body<Value>>()).await {
            Ok(Ok(d)) => d,
            Ok(Err(e)) => {
                // fe2o3 says only that its session stopped; the QUIC close says why.
                let why = match info.quic.as_ref().and_then(|c| c.close_reason()) {
                    Some(reason) => format!("the connection closed: {reason}"),
                    None => e.to_string(),
                };
                return Err(ClientError::Link(format!(
                    "receiving from '{}': {why}",
                    spec.address
                )));
            }
            Err(_) => break,
        };
        let mut len = 0;
        if let Body::Data(batch) = d.body() {
            for data in batch.iter() {
                len += data.0.len();
                each(&data.0);
            }
        }
        receiver
            .accept(&d)
            .await
            .map_err(|e| ClientError::Link(format!("accepting: {e}")))?;
        report.messages += 1;
        report.bytes += len as u64;
        report.total = start.elapsed();
    }
    report.rtt = info.rtt();
    let _ = receiver.close().await;
    client.close().await;
    Ok(report)
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
