//! The door's TLS: the one place its rustls configurations are made, for TLS on TCP and for
//! QUIC, so that a client-certificate verifier (issue 49) is plugged in once for both.

use std::sync::Arc;

use qgate_transport::tls::{key_log, provider};
use qgate_transport::{Identity, TlsError, TransportError, TransportOptions};

/// ALPN of MQTT over QUIC, as EMQX and NanoMQ serve it.
pub const ALPN_MQTT: &[u8] = b"mqtt";

/// The door's server configuration for TLS on TCP: TLS 1.3 and 1.2 (MQTT devices' embedded
/// stacks often stop at 1.2), and no ALPN, so a client that offers one (`mqtt`, a cloud
/// vendor's) is not refused for it.
pub fn tcp(identity: &Identity) -> Result<Arc<rustls::ServerConfig>, TransportError> {
    server(
        identity,
        &[&rustls::version::TLS13, &rustls::version::TLS12],
        &[],
    )
    .map(Arc::new)
}

/// The door's QUIC configuration: TLS 1.3 with ALPN `mqtt`, no 0-RTT (a replayed PUBLISH
/// would get a new request id and be stored twice), and `opts` with room for exactly the
/// streams single-stream mode allows a client: its one bidirectional stream and a second,
/// which is seen and refused rather than left blocked; no unidirectional ones. Its idle
/// timeout is `idle`, the longest MQTT keep-alive's: MQTT's own keep-alive decides when a
/// quiet client is gone, and QUIC's default (30 s) would close a client that pings every 60.
pub fn quic(
    identity: &Identity,
    opts: &TransportOptions,
    idle: std::time::Duration,
) -> Result<quinn::ServerConfig, TransportError> {
    let tls = server(identity, &[&rustls::version::TLS13], &[ALPN_MQTT])?;
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
        .map_err(|e| TlsError::Rustls(rustls::Error::General(e.to_string())))?;
    let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    let opts = TransportOptions {
        max_concurrent_bidi_streams: 2,
        max_concurrent_uni_streams: 0,
        idle_timeout_ms: u64::try_from(idle.as_millis()).unwrap_or(u64::MAX),
        ..opts.clone()
    };
    cfg.transport_config(Arc::new(opts.to_quinn()?));
    Ok(cfg)
}

fn server(
    identity: &Identity,
    versions: &[&'static rustls::SupportedProtocolVersion],
    alpn: &[&[u8]],
) -> Result<rustls::ServerConfig, TransportError> {
    // Client certificates (issue 49) go here, for both transports.
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)?
        .with_no_client_auth()
        .with_single_cert(identity.chain.clone(), identity.key.clone_key())?;
    tls.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    tls.key_log = key_log();
    Ok(tls)
}
