//! One AMQP connection: the ways in, the shim in front, SASL or plain AMQP, and its sessions.

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use fe2o3_amqp::acceptor::{
    ConnectionAcceptor, LinkAcceptor, LinkEndpoint, ListenerSessionHandle, SessionAcceptor,
};

use super::state::{Broker, Tenancy};
use crate::shim;
use crate::transport::Stream;

impl Broker {
    /// Serve one AMQP connection on `io` until it closes. Bad framing, failed SASL or a
    /// protocol error end this connection only.
    pub async fn serve<S: Stream>(&self, io: S) {
        self.serve_from(io, None).await
    }

    /// [`Broker::serve`] for a connection from `peer`, counted against its address's limit.
    pub async fn serve_from<S: Stream>(&self, io: S, peer: Option<IpAddr>) {
        if let Ok(t) = self.tenancy(peer, "tcp") {
            self.serve_guarded(io, false, t).await
        }
    }

    /// [`Broker::serve`] for a QUIC stream, whose first bytes may be 0-RTT data and so may be
    /// replayed: its transfers must carry a message-id, and a repeat of one is settled without
    /// queueing it again (decision M9). `early_hint`: the stream was accepted while the
    /// handshake was still running (counted; quinn cannot tell a server for certain, so every
    /// QUIC connection is guarded).
    pub async fn serve_quic_stream<S: Stream>(&self, io: S, early_hint: bool) {
        self.serve_quic_stream_from(io, early_hint, None).await
    }

    /// [`Broker::serve_quic_stream`] for a stream from `peer`, counted against its limit.
    pub async fn serve_quic_stream_from<S: Stream>(
        &self,
        io: S,
        early_hint: bool,
        peer: Option<IpAddr>,
    ) {
        if early_hint {
            self.inner
                .counters
                .connections_early
                .fetch_add(1, Ordering::Relaxed);
        }
        if let Ok(t) = self.tenancy(peer, "quic") {
            self.serve_guarded(io, true, t).await
        }
    }

    fn shim_config(&self) -> shim::ShimConfig {
        let cfg = &self.inner.cfg;
        shim::ShimConfig {
            max_frame: cfg.max_frame_size,
            buffer: 256 * 1024,
            handshake_timeout: cfg.handshake_timeout,
            idle_timeout: cfg.idle_timeout,
            max_sessions: cfg.max_sessions.max(1),
        }
    }

    /// Serve an in-process connection (a [bridge](crate::bridge)'s own consumer): admitted as
    /// ANONYMOUS whatever the credentials, since it never leaves the process, and never
    /// counted against an address.
    pub(crate) async fn serve_trusted<S: Stream>(&self, io: S) {
        if let Ok(t) = self.tenancy(None, "bridge") {
            self.serve_as(io, false, t, true).await
        }
    }

    pub(super) async fn serve_guarded<S: Stream>(&self, io: S, early: bool, tenancy: Arc<Tenancy>) {
        self.serve_as(io, early, tenancy, false).await
    }

    async fn serve_as<S: Stream>(&self, io: S, early: bool, tenancy: Arc<Tenancy>, trusted: bool) {
        let c = &self.inner.counters;
        // The shim holds the tenancy until both its pumps end (M16).
        let mut io = shim::shim(io, self.shim_config(), tenancy.clone());
        // The peer's protocol header picks the layer (the shim has checked it, and bounds the
        // wait for it): SASL, or, while anonymous peers are admitted, plain AMQP (M19).
        let mut head = [0u8; 8];
        if tokio::io::AsyncReadExt::read_exact(&mut io, &mut head)
            .await
            .is_err()
        {
            c.connections_failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let io = shim::Replayed::new(head, io);
        let cfg = &self.inner.cfg;
        let builder = ConnectionAcceptor::builder()
            .container_id(cfg.container_id.clone())
            .max_frame_size(cfg.max_frame_size);
        let plain = cfg.plain_amqp && cfg.credentials.admits_anonymous();
        let credentials = if trusted {
            crate::auth::Credentials::anonymous()
        } else {
            cfg.credentials.clone()
        };
        let accepted = if plain && head == *b"AMQP\x00\x01\x00\x00" {
            builder.build().accept(io).await
        } else {
            builder.sasl_acceptor(credentials).build().accept(io).await
        };
        let mut conn = match accepted {
            Ok(conn) => conn,
            Err(e) => {
                c.connections_failed.fetch_add(1, Ordering::Relaxed);
                tracing::info!(target: "qgate_amqp::broker", error = %e, "AMQP connection refused");
                return;
            }
        };
        let sessions = SessionAcceptor::builder()
            .incoming_window(65_536)
            .outgoing_window(65_536)
            .build();
        while let Ok(session) = sessions.accept(&mut conn).await {
            let broker = self.clone();
            tokio::spawn(async move { broker.serve_session(session, early).await });
        }
        let _ = conn.close().await;
        drop(tenancy);
    }

    async fn serve_session(&self, mut session: ListenerSessionHandle, early: bool) {
        // Decision M26: every link announces the largest message the shim lets through, so a
        // sender refuses a larger one itself instead of streaming it into a closed connection.
        let links = LinkAcceptor::builder()
            .max_message_size(crate::shim::MAX_PARTIAL as u64)
            .build();
        loop {
            match links.accept(&mut session).await {
                Ok(LinkEndpoint::Sender(s)) => {
                    let b = self.clone();
                    tokio::spawn(async move { b.consumer(s).await });
                }
                Ok(LinkEndpoint::Receiver(r)) => {
                    let b = self.clone();
                    tokio::spawn(async move { b.producer(r, early).await });
                }
                Err(e) => {
                    // The session ended, or one attach was bad (fe2o3 answered it).
                    tracing::debug!(target: "qgate_amqp::broker", error = ?e, "link accept ended");
                    if session.is_ended() {
                        break;
                    }
                }
            }
        }
        let _ = session.end().await;
    }

    /// The TLS server handshake on `io` (any byte stream: a user-space TCP on the simulated
    /// network, say), then serve the AMQP connection over it.
    pub async fn serve_tls<S: Stream>(&self, io: S, tls: Arc<rustls::ServerConfig>) {
        let Ok(tenancy) = self.tenancy(None, "tls") else {
            return;
        };
        let accept = tokio_rustls::TlsAcceptor::from(tls).accept(io);
        match tokio::time::timeout(self.inner.cfg.handshake_timeout, accept).await {
            Ok(Ok(s)) => self.serve_guarded(s, false, tenancy).await,
            Ok(Err(e)) => {
                tracing::info!(target: "qgate_amqp::broker", error = %e, "TLS handshake failed")
            }
            Err(_) => shim::Watch::timed_out(&*tenancy, shim::Deadline::Handshake),
        }
    }
}
