//! Accept loops: every QUIC stream and every TCP (or TLS) connection a listener takes in is
//! served as an AMQP connection.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::state::Broker;
use crate::shim;

/// What each QUIC connection's own configuration is derived from (a qlog file each).
pub struct PerConnection {
    /// The endpoint's server configuration.
    pub base: quinn::ServerConfig,
    /// The options it was built from.
    pub opts: qgate_transport::TransportOptions,
}

/// Serve AMQP on every bidirectional stream of every connection `endpoint` accepts.
pub async fn serve_quic(broker: Broker, endpoint: quinn::Endpoint, own: Option<PerConnection>) {
    let own = own.map(Arc::new);
    while let Some(incoming) = endpoint.accept().await {
        let broker = broker.clone();
        let own = own.clone();
        tokio::spawn(async move {
            let peer = incoming.remote_address().to_string();
            let cfg = own.as_ref().and_then(|p| {
                qgate_transport::server_config_for(&p.base, &p.opts, &peer)
                    .inspect_err(|e| tracing::warn!(target: "qgate_amqp::broker", %peer, error = %e, "per-connection config"))
                    .ok()
                    .flatten()
            });
            let conn = match cfg {
                Some(cfg) => incoming.accept_with(cfg),
                None => incoming.accept(),
            };
            let conn = match conn {
                Ok(c) => c,
                Err(_) => return,
            };
            // 0-RTT: streams opened in early data are served before the handshake completes
            // (decision M2 says what may ride in them).
            // A stream accepted before the handshake completes was opened in 0-RTT data.
            let handshaken = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let conn = match conn.into_0rtt() {
                Ok((c, done)) => {
                    let h = handshaken.clone();
                    tokio::spawn(async move {
                        done.await;
                        h.store(true, Ordering::Release);
                    });
                    c
                }
                Err(connecting) => match connecting.await {
                    Ok(c) => {
                        handshaken.store(true, Ordering::Release);
                        c
                    }
                    Err(e) => {
                        tracing::debug!(target: "qgate_amqp::broker", error = %e, "QUIC handshake failed");
                        return;
                    }
                },
            };
            let peer = conn.remote_address().ip();
            // AMQP rides on bidirectional streams only: grant no more unidirectional ones
            // than the listener's options did (transport::broker_options grants none).
            conn.set_max_concurrent_uni_streams(0u32.into());
            while let Ok((send, recv)) = conn.accept_bi().await {
                let broker = broker.clone();
                let early = !handshaken.load(Ordering::Acquire);
                if early {
                    broker
                        .inner
                        .counters
                        .connections_early
                        .fetch_add(1, Ordering::Relaxed);
                }
                // Every stream is an AMQP connection and takes a place of its address (M16)
                // and of the broker's (M33);
                // the first one refused closes the QUIC connection, so a peer cannot open and
                // drop streams at line rate against the limit (decision M25).
                let t = match broker.tenancy(Some(peer), "quic") {
                    Ok(t) => t,
                    Err(refused) => {
                        conn.close(1u32.into(), refused.reason());
                        break;
                    }
                };
                tokio::spawn(async move {
                    broker
                        .serve_guarded(tokio::io::join(recv, send), true, t)
                        .await
                });
            }
        });
    }
}

/// Serve AMQP on every TCP connection `listener` accepts, with TLS when `tls` is given.
pub async fn serve_tcp(
    broker: Broker,
    listener: tokio::net::TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
) {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(target: "qgate_amqp::broker", error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let broker = broker.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let kind = if acceptor.is_some() { "tls" } else { "tcp" };
            let Ok(tenancy) = broker.tenancy(Some(peer.ip()), kind) else {
                return;
            };
            match acceptor {
                None => broker.serve_guarded(tcp, false, tenancy).await,
                // The TLS handshake is part of the handshake deadline (M16).
                Some(a) => {
                    match tokio::time::timeout(broker.inner.cfg.handshake_timeout, a.accept(tcp))
                        .await
                    {
                        Ok(Ok(tls)) => broker.serve_guarded(tls, false, tenancy).await,
                        Ok(Err(e)) => {
                            tracing::info!(target: "qgate_amqp::broker", %peer, error = %e, "TLS handshake failed")
                        }
                        Err(_) => {
                            shim::Watch::timed_out(&*tenancy, shim::Deadline::Handshake);
                            tracing::info!(target: "qgate_amqp::broker", %peer, "TLS handshake timed out");
                        }
                    }
                }
            }
        });
    }
}
