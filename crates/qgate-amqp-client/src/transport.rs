//! The byte streams AMQP runs on: a QUIC bidirectional stream (one per AMQP connection), plain
//! TCP, or TCP with TLS 1.3 (TLS 1.2 selectable, as in paper 003's baseline). Everything above
//! sees one boxed stream type, so broker and client have one code path for all of them.

use std::net::SocketAddr;
use std::sync::Arc;

use qgate_transport::tls::provider;
use qgate_transport::{Identity, TrustRoots};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// ALPN for AMQP 1.0 over QUIC. No code point is registered; we use the protocol's own name and
/// version (decision M1).
pub const ALPN_AMQP: &[u8] = b"amqp/1.0";

/// IANA port for AMQP over TCP and over TLS (AMQP 1.0 §2.2, §5.2).
pub const AMQP_PORT: u16 = 5672;
/// IANA port for AMQPS.
pub const AMQPS_PORT: u16 = 5671;

/// The QUIC transport options of a broker's listener: `opts` with no unidirectional streams
/// granted (AMQP rides on bidirectional ones; a unidirectional stream would hold bytes
/// nobody reads, decision M25).
pub fn broker_options(
    opts: &qgate_transport::TransportOptions,
) -> qgate_transport::TransportOptions {
    qgate_transport::TransportOptions {
        max_concurrent_uni_streams: 0,
        ..opts.clone()
    }
}

/// A byte stream fe2o3-amqp can run on.
pub trait Stream: AsyncRead + AsyncWrite + Send + Unpin + std::fmt::Debug + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + std::fmt::Debug + 'static> Stream for T {}

/// Any of the streams.
pub type BoxStream = Box<dyn Stream>;

/// How AMQP is carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scheme {
    /// One QUIC bidirectional stream per AMQP connection (TLS 1.3 inside QUIC).
    #[default]
    Quic,
    /// One long-lived QUIC connection per client, each AMQP connection a bidirectional stream
    /// on it: a device that sends now and then pays no handshake after its first (decision
    /// M25). The connection is opened again (0-RTT when a ticket is held) once it has closed.
    QuicMux,
    /// TCP with TLS.
    TcpTls(TlsVersion),
    /// Plain TCP (for interop tests and trusted networks).
    Tcp,
}

/// TLS version for the TCP scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TlsVersion {
    /// TLS 1.3 (the default).
    #[default]
    V13,
    /// TLS 1.2 (paper 003's baseline).
    V12,
}

impl std::str::FromStr for Scheme {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "quic" => Ok(Scheme::Quic),
            "quic-mux" => Ok(Scheme::QuicMux),
            "tcp-tls" | "tls" | "tcp-tls13" => Ok(Scheme::TcpTls(TlsVersion::V13)),
            "tcp-tls12" => Ok(Scheme::TcpTls(TlsVersion::V12)),
            "tcp" => Ok(Scheme::Tcp),
            o => Err(format!(
                "unknown transport '{o}' (known: quic, quic-mux, tcp-tls, tcp-tls12, tcp)"
            )),
        }
    }
}

impl Scheme {
    /// AMQP rides on QUIC streams.
    pub fn is_quic(self) -> bool {
        matches!(self, Scheme::Quic | Scheme::QuicMux)
    }
}

impl std::fmt::Display for Scheme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Scheme::Quic => "quic",
            Scheme::QuicMux => "quic-mux",
            Scheme::TcpTls(TlsVersion::V13) => "tcp-tls",
            Scheme::TcpTls(TlsVersion::V12) => "tcp-tls12",
            Scheme::Tcp => "tcp",
        })
    }
}

/// Setting up a stream failed; the message names the peer and the step.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// TCP connect.
    #[error("connecting to {addr}: {source}")]
    Tcp {
        /// Peer.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
    /// TLS handshake or configuration.
    #[error("TLS with {addr}: {msg}")]
    Tls {
        /// Peer.
        addr: SocketAddr,
        /// Cause.
        msg: String,
    },
    /// QUIC connection or stream.
    #[error("QUIC with {addr}: {msg}")]
    Quic {
        /// Peer.
        addr: SocketAddr,
        /// Cause.
        msg: String,
    },
}

/// A TLS client configuration for the TCP scheme, presenting `client` if given.
pub fn tls_client_config(
    trust: &TrustRoots,
    version: TlsVersion,
    client: Option<&Identity>,
) -> Result<Arc<rustls::ClientConfig>, String> {
    let versions: &[&rustls::SupportedProtocolVersion] = match version {
        TlsVersion::V13 => &[&rustls::version::TLS13],
        TlsVersion::V12 => &[&rustls::version::TLS12],
    };
    let b = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .map_err(|e| e.to_string())?
        .with_root_certificates(trust.store().map_err(|e| e.to_string())?);
    let mut cfg = match client {
        None => b.with_no_client_auth(),
        Some(id) => b
            .with_client_auth_cert(id.chain.clone(), id.key.clone_key())
            .map_err(|e| format!("client certificate: {e}"))?,
    };
    cfg.key_log = qgate_transport::tls::key_log();
    Ok(Arc::new(cfg))
}

/// A TLS server configuration for the TCP scheme: TLS 1.2 and 1.3 (the client picks); with
/// `client_ca`, clients must present a certificate signed by it.
pub fn tls_server_config(
    identity: &Identity,
    client_ca: Option<&TrustRoots>,
) -> Result<Arc<rustls::ServerConfig>, String> {
    let b = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| e.to_string())?;
    let b = match client_ca {
        None => b.with_no_client_auth(),
        Some(ca) => {
            let v = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(ca.store().map_err(|e| e.to_string())?),
                provider(),
            )
            .build()
            .map_err(|e| e.to_string())?;
            b.with_client_cert_verifier(v)
        }
    };
    let mut cfg = b
        .with_single_cert(identity.chain.clone(), identity.key.clone_key())
        .map_err(|e| e.to_string())?;
    cfg.key_log = qgate_transport::tls::key_log();
    Ok(Arc::new(cfg))
}

/// Open a TCP connection to `addr` with Nagle off (with it on, small AMQP frames wait for ACKs:
/// a pre-settled stream fell ~10× in references/libraries.md's measurement).
pub async fn tcp(addr: SocketAddr) -> Result<TcpStream, TransportError> {
    let s = TcpStream::connect(addr)
        .await
        .map_err(|source| TransportError::Tcp { addr, source })?;
    s.set_nodelay(true)
        .map_err(|source| TransportError::Tcp { addr, source })?;
    Ok(s)
}

/// TLS over a fresh TCP connection to `addr`, verifying `server_name`.
pub async fn tcp_tls(
    addr: SocketAddr,
    server_name: &str,
    cfg: Arc<rustls::ClientConfig>,
) -> Result<BoxStream, TransportError> {
    tls_over(tcp(addr).await?, addr, server_name, cfg).await
}

/// A TCP connection made some other way than the kernel's (a user-space stack on the
/// simulated network): `dial(addr)` returns the connected byte stream.
pub type Dialer = Arc<
    dyn Fn(SocketAddr) -> futures_util::future::BoxFuture<'static, std::io::Result<BoxStream>>
        + Send
        + Sync,
>;

/// The TLS client handshake over an established byte stream to `addr`.
pub async fn tls_over<S: Stream>(
    tcp: S,
    addr: SocketAddr,
    server_name: &str,
    cfg: Arc<rustls::ClientConfig>,
) -> Result<BoxStream, TransportError> {
    let name = rustls::pki_types::ServerName::try_from(server_name.to_string()).map_err(|e| {
        TransportError::Tls {
            addr,
            msg: format!("server name '{server_name}': {e}"),
        }
    })?;
    let tls = tokio_rustls::TlsConnector::from(cfg)
        .connect(name, tcp)
        .await
        .map_err(|e| TransportError::Tls {
            addr,
            msg: e.to_string(),
        })?;
    Ok(Box::new(tls))
}

/// One bidirectional stream on an established QUIC connection, as a byte stream.
pub async fn quic_stream(conn: &quinn::Connection) -> Result<BoxStream, TransportError> {
    let (send, recv) = conn.open_bi().await.map_err(|e| TransportError::Quic {
        addr: conn.remote_address(),
        msg: e.to_string(),
    })?;
    Ok(Box::new(tokio::io::join(recv, send)))
}
