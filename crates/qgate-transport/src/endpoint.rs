//! QUIC endpoints on a real UDP socket or on any [`quinn::AsyncUdpSocket`] (a netsim interface),
//! with qgate's TLS 1.3 configuration and 0-RTT enabled.

use std::net::SocketAddr;
use std::sync::Arc;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{
    AsyncUdpSocket, ClientConfig, Endpoint, EndpointConfig, Runtime, ServerConfig, TokioRuntime,
};

use crate::tls::{provider, Identity, TlsError, TrustRoots};
use crate::{OptionError, TransportOptions};

/// Errors setting up or using a QUIC endpoint; each message says what failed.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// TLS material or configuration.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// A transport option.
    #[error(transparent)]
    Option(#[from] OptionError),
    /// Binding or using a socket.
    #[error("socket {addr}: {source}")]
    Io {
        /// The address involved.
        addr: String,
        /// The error.
        source: std::io::Error,
    },
    /// quinn refused to start a connection.
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        /// The peer.
        addr: SocketAddr,
        /// Why.
        source: quinn::ConnectError,
    },
    /// Egress shaping parameters that cannot be used.
    #[error("shaping: {0}")]
    Shape(String),
    /// The connection failed or was closed.
    #[error("connection to {addr} failed: {source}")]
    Connection {
        /// The peer.
        addr: SocketAddr,
        /// Why.
        source: quinn::ConnectionError,
    },
}

impl From<rustls::Error> for TransportError {
    fn from(e: rustls::Error) -> Self {
        TransportError::Tls(TlsError::Rustls(e))
    }
}

/// A server configuration: TLS 1.3 with `identity`, the given ALPN protocols, 0-RTT accepted.
pub fn server_config(
    identity: &Identity,
    alpn: &[&[u8]],
    opts: &TransportOptions,
) -> Result<ServerConfig, TransportError> {
    server_config_with_client_auth(identity, alpn, opts, None)
}

/// [`server_config`] that, with `client_ca`, requires every client to present a certificate
/// signed by it (WebPKI rules; the handshake fails otherwise).
pub fn server_config_with_client_auth(
    identity: &Identity,
    alpn: &[&[u8]],
    opts: &TransportOptions,
    client_ca: Option<&TrustRoots>,
) -> Result<ServerConfig, TransportError> {
    let auth = client_ca.map_or(ClientAuth::Off, ClientAuth::Required);
    server_config_inner(identity, alpn, opts, auth, None)
}

/// Whether a server asks its clients for certificates, and signed by whom.
#[derive(Debug, Clone, Copy)]
pub enum ClientAuth<'a> {
    /// It does not ask.
    Off,
    /// Every client must present one its CA signed (the handshake fails otherwise).
    Required(&'a TrustRoots),
    /// A client may present one (checked against the CA if it does) or none: it proves who it
    /// is some other way, e.g. a token (decision G33).
    Optional(&'a TrustRoots),
}

/// [`server_config`] that remembers the resumption tickets of up to `clients` clients (one
/// ticket per connection, in a [`TicketStore`](crate::tickets::TicketStore)), so that many
/// returning clients may resume with 0-RTT; rustls's default store holds 256. Each ticket is
/// taken when used: a replayed first flight finds none and gets a full handshake with its early
/// data discarded (RFC 8446 §8.1; decision G18). Clients authenticate as `auth` says; a resumed
/// session keeps the certificate of the one it resumes.
pub fn server_config_resuming(
    identity: &Identity,
    alpn: &[&[u8]],
    opts: &TransportOptions,
    clients: usize,
    auth: ClientAuth<'_>,
) -> Result<ServerConfig, TransportError> {
    server_config_inner(identity, alpn, opts, auth, Some(clients))
}

fn server_config_inner(
    identity: &Identity,
    alpn: &[&[u8]],
    opts: &TransportOptions,
    auth: ClientAuth<'_>,
    tickets: Option<usize>,
) -> Result<ServerConfig, TransportError> {
    let b = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?;
    let b = match auth {
        ClientAuth::Off => b.with_no_client_auth(),
        ClientAuth::Required(ca) | ClientAuth::Optional(ca) => {
            let v = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(ca.store()?),
                provider(),
            );
            let v = if matches!(auth, ClientAuth::Optional(_)) {
                v.allow_unauthenticated()
            } else {
                v
            };
            let v = v
                .build()
                .map_err(|e| TlsError::Rustls(rustls::Error::General(e.to_string())))?;
            b.with_client_cert_verifier(v)
        }
    };
    let mut tls = b.with_single_cert(identity.chain.clone(), identity.key.clone_key())?;
    tls.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    // QUIC requires max_early_data_size to be 0 or u32::MAX (RFC 9001 §4.6.1); MAX enables 0-RTT.
    tls.max_early_data_size = u32::MAX;
    if let Some(n) = tickets {
        // No pass over the store per resumption, however many slots (decision G18).
        tls.session_storage = Arc::new(crate::tickets::TicketStore::new(n));
        tls.send_tls13_tickets = 1;
    }
    tls.key_log = crate::tls::key_log();
    let crypto = QuicServerConfig::try_from(tls)
        .map_err(|e| TlsError::Rustls(rustls::Error::General(e.to_string())))?;
    let mut cfg = ServerConfig::with_crypto(Arc::new(crypto));
    cfg.transport_config(Arc::new(opts.to_quinn()?));
    Ok(cfg)
}

/// A client configuration trusting `trust`, offering the given ALPN protocols, with 0-RTT
/// enabled. Clone it for every connection to the same servers: the session-ticket cache that
/// 0-RTT needs lives inside it.
pub fn client_config(
    trust: &TrustRoots,
    alpn: &[&[u8]],
    opts: &TransportOptions,
) -> Result<ClientConfig, TransportError> {
    client_config_with_identity(trust, alpn, opts, None)
}

/// [`client_config`] presenting `identity` as a TLS client certificate, if given.
pub fn client_config_with_identity(
    trust: &TrustRoots,
    alpn: &[&[u8]],
    opts: &TransportOptions,
    identity: Option<&Identity>,
) -> Result<ClientConfig, TransportError> {
    let b = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(trust.store()?);
    let mut tls = match identity {
        None => b.with_no_client_auth(),
        Some(id) => b.with_client_auth_cert(id.chain.clone(), id.key.clone_key())?,
    };
    tls.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    tls.enable_early_data = true;
    tls.key_log = crate::tls::key_log();
    let crypto = QuicClientConfig::try_from(tls)
        .map_err(|e| TlsError::Rustls(rustls::Error::General(e.to_string())))?;
    let mut cfg = ClientConfig::new(Arc::new(crypto));
    cfg.transport_config(Arc::new(opts.to_quinn()?));
    Ok(cfg)
}

/// `base` for one connection to `peer`: the same configuration (sharing its 0-RTT tickets),
/// with a qlog file of its own when `opts.qlog_dir` is set.
pub fn client_config_for(
    base: &ClientConfig,
    opts: &TransportOptions,
    peer: &str,
) -> Result<ClientConfig, crate::OptionError> {
    let mut cfg = base.clone();
    if opts.qlog_dir.is_some() {
        cfg.transport_config(Arc::new(
            opts.connection_transport(crate::qlog::Vantage::Client, peer)?,
        ));
    }
    Ok(cfg)
}

/// A configuration for one incoming connection from `peer` (for `accept_with`) when it needs
/// one of its own (a qlog file, when `opts.qlog_dir` is set); `None`: the endpoint's.
pub fn server_config_for(
    base: &ServerConfig,
    opts: &TransportOptions,
    peer: &str,
) -> Result<Option<Arc<ServerConfig>>, crate::OptionError> {
    if opts.qlog_dir.is_none() {
        return Ok(None);
    }
    let mut cfg = base.clone();
    cfg.transport_config(Arc::new(
        opts.connection_transport(crate::qlog::Vantage::Server, peer)?,
    ));
    Ok(Some(Arc::new(cfg)))
}

/// Where an endpoint sends and receives datagrams.
pub enum Socket {
    /// A real UDP socket.
    Udp(std::net::UdpSocket),
    /// Any other datagram socket, e.g. a simulated interface.
    Abstract(Arc<dyn AsyncUdpSocket>),
}

impl Socket {
    /// Bind a real UDP socket.
    pub fn bind_udp(addr: SocketAddr) -> Result<Socket, TransportError> {
        std::net::UdpSocket::bind(addr)
            .map(Socket::Udp)
            .map_err(|source| TransportError::Io {
                addr: addr.to_string(),
                source,
            })
    }
}

impl Socket {
    /// This socket with its sending shaped to `params` (a rate and a queue discipline,
    /// [`crate::shaped`]); `seed` seeds the queue's random choices. Must be called inside a
    /// tokio runtime. The handle reads the shaper's counters.
    pub fn shaped(
        self,
        params: qgate_link::LinkParams,
        seed: u64,
    ) -> Result<(Socket, crate::shaped::ShapeHandle), TransportError> {
        let inner = self.into_async()?;
        let (shaped, handle) =
            crate::shaped::ShapedSocket::new(inner, params, seed).map_err(TransportError::Shape)?;
        Ok((Socket::Abstract(shaped), handle))
    }
}

impl Socket {
    /// The socket as quinn drives it (a real one registered with tokio), e.g. for
    /// `Endpoint::rebind_abstract`. Must be called inside a tokio runtime.
    pub fn into_async(self) -> Result<Arc<dyn AsyncUdpSocket>, TransportError> {
        match self {
            Socket::Udp(s) => {
                let addr = s
                    .local_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_else(|_| "?".into());
                quinn::Runtime::wrap_udp_socket(&TokioRuntime, s)
                    .map_err(|source| TransportError::Io { addr, source })
            }
            Socket::Abstract(s) => Ok(s),
        }
    }
}

impl<S: AsyncUdpSocket> From<Arc<S>> for Socket {
    fn from(s: Arc<S>) -> Self {
        Socket::Abstract(s)
    }
}

/// Expand a 64-bit seed into quinn's 32-byte RNG seed (splitmix64).
pub(crate) fn seed_bytes(seed: u64) -> [u8; 32] {
    let mut out = [0u8; 32];
    let mut x = seed;
    for chunk in out.chunks_mut(8) {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        chunk.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out
}

/// A QUIC endpoint on `socket`; a server if `server` is given. `seed` makes quinn's own random
/// choices (connection IDs, …) reproducible, as simulations need.
pub fn endpoint(
    socket: Socket,
    server: Option<ServerConfig>,
    seed: Option<u64>,
) -> Result<Endpoint, TransportError> {
    let mut cfg = EndpointConfig::default();
    cfg.rng_seed(seed.map(seed_bytes));
    on_socket(socket, cfg, server)
}

/// A server endpoint whose stateless-reset key is derived from `identity`'s private key
/// (decision T11). quinn's default key is random per process, so a restarted server could not
/// end the connections its previous run held: their peers (a gateway's backhaul, a device)
/// kept sending into them until their idle timeout, 30 s by default. With the same identity the
/// restarted server's resets are valid for them (RFC 9000 §10.3), and they reconnect at once.
/// The keys depend on the bound address too, so only a restart on the same address shares them.
pub fn server_endpoint(
    socket: Socket,
    server: ServerConfig,
    identity: &Identity,
    seed: Option<u64>,
    tasks: &crate::tasks::Tasks,
) -> Result<Endpoint, TransportError> {
    use ring::hmac;
    // The address is in both labels: endpoints that share an identity on other addresses (a
    // server and a broker on the dev PKI) must not accept each other's connection IDs, or one
    // would hand out valid resets for the other's connections (RFC 9000 §21.11).
    let at = match &socket {
        Socket::Udp(s) => s.local_addr().map(|a| a.to_string()),
        Socket::Abstract(s) => s.local_addr().map(|a| a.to_string()),
    }
    .unwrap_or_default();
    let label = |what: &str| format!("qgate {what} key v1 {at}");
    let secret = hmac::Key::new(hmac::HMAC_SHA256, identity.key.secret_der());
    let derived = hmac::sign(&secret, label("stateless reset").as_bytes());
    let mut cfg = EndpointConfig::new(Arc::new(hmac::Key::new(
        hmac::HMAC_SHA256,
        derived.as_ref(),
    )));
    // quinn drops a packet whose connection ID its generator did not sign before it would
    // reset it: the restarted server must recognise its previous run's IDs too.
    let cid_key = hmac::sign(&secret, label("connection id").as_bytes());
    let cid_key = u64::from_le_bytes(cid_key.as_ref()[..8].try_into().expect("8 bytes"));
    cfg.cid_generator(move || {
        Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key))
    });
    cfg.rng_seed(seed.map(seed_bytes));
    on_runtime(socket, cfg, Some(server), tasks.runtime())
}

/// A client endpoint for a device on a constrained link (decision T6). It asks every peer, in
/// its max_udp_payload_size transport parameter (RFC 9000 §18.2), for no UDP payload over
/// 1200 bytes, so a peer has no larger MTU to probe for on the device's link. (Zero-length
/// connection IDs would save 8 bytes a packet but route by address, and then a new
/// connection's packets reach the previous one while it drains: 10 sequential connections
/// took 30 s instead of 0.44 s at 1 Mbit/s; [`one_connection_endpoint`] has them, for an
/// endpoint that carries one connection.)
pub fn constrained_endpoint(socket: Socket, seed: Option<u64>) -> Result<Endpoint, TransportError> {
    on_socket(socket, constrained_config(seed), None)
}

/// A client endpoint for *one* connection of a device on a constrained link (decision T10):
/// [`constrained_endpoint`]'s, with zero-length connection IDs of its own. With one connection
/// on the socket its address alone routes the peer's packets, so an ID would only add 8 bytes
/// to every packet the peer sends; and quinn issues a peer 4 spare IDs, and a 5th once the
/// peer retires the first, in datagrams of their own. With zero-length IDs this end issues
/// none and asks the peer for the fewest (active_connection_id_limit 2, RFC 9000 §18.2), so
/// the peer issues one. This end cannot move to another address (RFC 9000 §9.5): use it for
/// short connections, one socket each.
pub fn one_connection_endpoint(
    socket: Socket,
    seed: Option<u64>,
) -> Result<Endpoint, TransportError> {
    let mut cfg = constrained_config(seed);
    cfg.cid_generator(|| Box::new(quinn_proto::RandomConnectionIdGenerator::new(0)));
    on_socket(socket, cfg, None)
}

fn constrained_config(seed: Option<u64>) -> EndpointConfig {
    let mut cfg = EndpointConfig::default();
    cfg.rng_seed(seed.map(seed_bytes));
    cfg.max_udp_payload_size(1200).expect("QUIC's minimum");
    cfg
}

fn on_socket(
    socket: Socket,
    cfg: EndpointConfig,
    server: Option<ServerConfig>,
) -> Result<Endpoint, TransportError> {
    on_runtime(socket, cfg, server, Arc::new(TokioRuntime))
}

fn on_runtime(
    socket: Socket,
    cfg: EndpointConfig,
    server: Option<ServerConfig>,
    runtime: Arc<dyn Runtime>,
) -> Result<Endpoint, TransportError> {
    match socket {
        Socket::Udp(s) => {
            let addr = s
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "?".into());
            Endpoint::new(cfg, server, s, runtime)
                .map_err(|source| TransportError::Io { addr, source })
        }
        Socket::Abstract(s) => {
            let addr = s
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_else(|_| "?".into());
            Endpoint::new_with_abstract_socket(cfg, server, s, runtime)
                .map_err(|source| TransportError::Io { addr, source })
        }
    }
}

/// A connection attempt's outcome as to early data.
pub enum Connected {
    /// The client had a session ticket and may send 0-RTT data at once; `accepted` resolves
    /// to whether the server accepted that data (if not, the streams opened in it are gone:
    /// quinn-proto discards them, and the application must send again).
    ZeroRtt {
        /// The connection, usable immediately.
        conn: quinn::Connection,
        /// Whether the server accepted the early data.
        accepted: quinn::ZeroRttAccepted,
    },
    /// A full handshake completed.
    OneRtt(quinn::Connection),
}

impl Connected {
    /// The connection, whichever way it came.
    pub fn connection(&self) -> &quinn::Connection {
        match self {
            Connected::ZeroRtt { conn, .. } | Connected::OneRtt(conn) => conn,
        }
    }

    /// Whether data may be sent in the first flight.
    pub fn is_0rtt(&self) -> bool {
        matches!(self, Connected::ZeroRtt { .. })
    }
}

/// Connect, using 0-RTT when a session ticket for `server_name` is cached in `cfg`.
pub async fn connect(
    endpoint: &Endpoint,
    cfg: &ClientConfig,
    addr: SocketAddr,
    server_name: &str,
    allow_0rtt: bool,
) -> Result<Connected, TransportError> {
    let connecting = endpoint
        .connect_with(cfg.clone(), addr, server_name)
        .map_err(|source| TransportError::Connect { addr, source })?;
    if allow_0rtt {
        match connecting.into_0rtt() {
            Ok((conn, accepted)) => return Ok(Connected::ZeroRtt { conn, accepted }),
            Err(connecting) => {
                return connecting
                    .await
                    .map(Connected::OneRtt)
                    .map_err(|source| TransportError::Connection { addr, source })
            }
        }
    }
    connecting
        .await
        .map(Connected::OneRtt)
        .map_err(|source| TransportError::Connection { addr, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_expand_deterministically() {
        assert_eq!(seed_bytes(1), seed_bytes(1));
        assert_ne!(seed_bytes(1), seed_bytes(2));
    }
}
