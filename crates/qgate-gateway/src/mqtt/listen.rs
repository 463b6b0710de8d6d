//! Where the door listens: any of TCP, TLS on TCP and QUIC, bound when the gateway starts and
//! served under one [`MqttDoor`], so its limits hold across transports.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use qgate_transport::{Identity, Socket, TransportOptions};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use super::connection::drive;
use super::{open_to_anyone, MqttDoor};
use crate::builder::BuildError;

/// A TCP listener to open: an address, or a listener the caller bound (tests; systemd
/// sockets).
#[derive(Debug)]
pub enum TcpListen {
    /// Bind this address.
    Addr(SocketAddr),
    /// Use this listener.
    Listener(std::net::TcpListener),
}

/// The door's listeners; each transport is optional.
#[derive(Debug, Default)]
pub struct Listen {
    /// MQTT over TCP (1883).
    pub tcp: Option<TcpListen>,
    /// MQTT over TLS on TCP (8883), with the gateway's device-facing certificate.
    pub tls: Option<TcpListen>,
    /// MQTT over QUIC, ALPN `mqtt` (EMQX uses 14567), with the same certificate.
    pub quic: Option<SocketAddr>,
}

impl Listen {
    /// Whether it names no listener.
    pub fn is_empty(&self) -> bool {
        self.tcp.is_none() && self.tls.is_none() && self.quic.is_none()
    }
}

/// The listeners, bound and configured, not yet served.
pub(crate) struct Bound {
    tcp: Option<(TcpListener, SocketAddr)>,
    tls: Option<(TcpListener, SocketAddr, TlsAcceptor)>,
    quic: Option<(quinn::Endpoint, SocketAddr)>,
}

/// Bind `listen`'s listeners for a door configured by `cfg`; TLS and QUIC present `identity`,
/// QUIC with `opts` (seeded by `seed`, as every endpoint).
pub(crate) fn bind(
    listen: Listen,
    cfg: &super::MqttConfig,
    identity: &Identity,
    opts: &TransportOptions,
    seed: Option<u64>,
) -> Result<Bound, BuildError> {
    let tcp = listen.tcp.map(bind_tcp).transpose()?;
    let tls = match listen.tls {
        None => None,
        Some(l) => {
            let (l, addr) = bind_tcp(l)?;
            Some((l, addr, TlsAcceptor::from(super::tls::tcp(identity)?)))
        }
    };
    let quic = match listen.quic {
        None => None,
        Some(a) => {
            // The codec closes a client silent for 1.5 keep-alives.
            let idle = Duration::from_millis(u64::from(cfg.max_keep_alive.max(1)) * 1500);
            let cfg = super::tls::quic(identity, opts, idle)?;
            let socket = Socket::bind_udp(a)?;
            let ep = qgate_transport::endpoint(socket, Some(cfg), seed)?;
            let addr = ep.local_addr().map_err(|e| BuildError::Mqtt(a, e))?;
            Some((ep, addr))
        }
    };
    Ok(Bound { tcp, tls, quic })
}

fn bind_tcp(l: TcpListen) -> Result<(TcpListener, SocketAddr), BuildError> {
    let l = match l {
        TcpListen::Listener(l) => l,
        TcpListen::Addr(a) => std::net::TcpListener::bind(a).map_err(|e| BuildError::Mqtt(a, e))?,
    };
    let addr = l
        .local_addr()
        .map_err(|e| BuildError::Mqtt(([0, 0, 0, 0], 0).into(), e))?;
    l.set_nonblocking(true)
        .and_then(|()| TcpListener::from_std(l))
        .map(|l| (l, addr))
        .map_err(|e| BuildError::Mqtt(addr, e))
}

impl Bound {
    /// Serve every listener with `door`; the first log lines say which are open to anyone.
    pub(crate) fn serve(self, door: &Arc<MqttDoor>) -> Running {
        let warn = |what: &str, addr: SocketAddr| {
            if open_to_anyone(addr) {
                tracing::warn!(
                    %addr,
                    "the MQTT door is OPEN TO ANYONE who reaches {what}/{addr}: it has no authentication yet and takes any client id; bind it to loopback (127.0.0.1) unless a firewall keeps others out"
                );
            }
        };
        let mut tasks = Vec::new();
        let tcp = self.tcp.map(|(l, addr)| {
            warn("tcp", addr);
            tasks.push(tokio::spawn(serve_tcp(door.clone(), l, None)));
            addr
        });
        let tls = self.tls.map(|(l, addr, acceptor)| {
            warn("tls", addr);
            tasks.push(tokio::spawn(serve_tcp(door.clone(), l, Some(acceptor))));
            addr
        });
        let quic = self.quic.map(|(ep, addr)| {
            warn("quic", addr);
            tasks.push(tokio::spawn(super::quic::serve(door.clone(), ep.clone())));
            (ep, addr)
        });
        Running {
            tcp,
            tls,
            quic,
            tasks,
        }
    }
}

/// The door's listeners, serving.
pub(crate) struct Running {
    pub(crate) tcp: Option<SocketAddr>,
    pub(crate) tls: Option<SocketAddr>,
    pub(crate) quic: Option<(quinn::Endpoint, SocketAddr)>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Take no more connections (open ones carry on until they close).
    pub(crate) fn stop(&self) {
        for t in &self.tasks {
            t.abort();
        }
        if let Some((ep, _)) = &self.quic {
            // Refuse new QUIC connections rather than leave them queued unanswered.
            ep.set_server_config(None);
        }
    }
}

/// Take TCP connections on `listener`, each through a TLS handshake if `tls` is given, until
/// the task is dropped.
async fn serve_tcp(door: Arc<MqttDoor>, listener: TcpListener, tls: Option<TlsAcceptor>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of file descriptors and the like: wait rather than spin.
                tracing::warn!(error = %e, "MQTT accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let accepted = Instant::now();
        door.stats.connections.fetch_add(1, Ordering::Relaxed);
        if tls.is_some() {
            door.stats.connections_tls.fetch_add(1, Ordering::Relaxed);
        }
        let Some(slot) = door.slot(peer.ip()) else {
            door.stats
                .connections_refused
                .fetch_add(1, Ordering::Relaxed);
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (door, tls) = (door.clone(), tls.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let Some(acceptor) = tls else {
                return drive(&door, stream, peer, accepted).await;
            };
            // The handshake spends the CONNECT's time: a client that never finishes it is
            // closed at the same deadline.
            let deadline = accepted + door.cfg.connect_timeout;
            match tokio::time::timeout_at(deadline, acceptor.accept(stream)).await {
                Ok(Ok(s)) => drive(&door, s, peer, accepted).await,
                _ => {
                    door.stats.handshakes_failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
}
