//! Where and how to connect: a [`Connector`] makes the byte streams (QUIC, quic-mux, TCP,
//! TCP+TLS) AMQP connections ride on.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use qgate_transport::window_history::{client_peer_key, HistoryStore};
use qgate_transport::{
    client_config, connect, constrained_endpoint, endpoint, one_connection_endpoint, Socket,
    TransportOptions, TrustRoots,
};

use super::error::ClientError;
use crate::transport::{self, BoxStream, Scheme, TransportError, ALPN_AMQP};

/// Where and how to connect.
#[derive(Clone)]
pub struct Connector {
    scheme: Scheme,
    addr: SocketAddr,
    pub(super) server_name: String,
    pub(super) sasl: Option<(String, String)>,
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
