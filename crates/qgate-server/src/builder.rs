//! `Server::builder()`: the one way an ingest server is put together — by `qgate server`, the
//! plans, the demos, the benchmarks and the tests alike (decision X10). Every knob has its
//! default here; a caller sets only what it changes.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use qgate_core::quota::Quota;
use qgate_transport::http3::{ServeLimits, ALPN_H3};
use qgate_transport::window_history::HistoryStore;
use qgate_transport::{
    server_config, server_endpoint, Identity, Socket, TransportError, TransportOptions,
};

use crate::{serve, DedupStore, IngestService, PerConnection, ServerStats, Sink, Uploads};

/// The ingest server (HTTP/3 over QUIC); see [`Server::builder`].
pub struct Server;

impl Server {
    /// A builder with the defaults: count-only sink, [`ServeLimits::default`], default
    /// transport options, no history, quinn's own randomness.
    pub fn builder<'a>() -> ServerBuilder<'a> {
        ServerBuilder {
            socket: None,
            identity: None,
            transport: TransportOptions::default(),
            sink: Arc::new(crate::CountSink::new()),
            limits: ServeLimits::default(),
            history: None,
            seed: None,
            uploads: None,
            dedup_store: None,
            disk: None,
            connections: (DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_CLIENT),
        }
    }
}

/// QUIC connections a server holds at once, handshakes included (decision S10): as many as a
/// gateway holds devices by default.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// QUIC connections one client (an IPv4 address, or an IPv6 /64) may hold at once (S10): a
/// gateway needs a few per backhaul path (at most 16 per path, G21).
pub const DEFAULT_MAX_CONNECTIONS_PER_CLIENT: usize = 256;

/// What [`ServerBuilder::start`] can fail on.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A required part was not given.
    #[error("the server needs {0}")]
    Missing(&'static str),
    /// The TLS configuration or the endpoint could not be made.
    #[error(transparent)]
    Transport(#[from] TransportError),
}

/// Assembles a [`RunningServer`].
pub struct ServerBuilder<'a> {
    socket: Option<Socket>,
    identity: Option<&'a Identity>,
    transport: TransportOptions,
    sink: Arc<dyn Sink>,
    limits: ServeLimits,
    history: Option<(Arc<HistoryStore>, Option<f64>)>,
    seed: Option<u64>,
    uploads: Option<Uploads>,
    dedup_store: Option<DedupStore>,
    disk: Option<Arc<dyn crate::disk::DiskRunner>>,
    connections: (usize, usize),
}

impl<'a> ServerBuilder<'a> {
    /// The UDP (or simulated) socket to listen on. Required.
    pub fn socket(mut self, socket: Socket) -> Self {
        self.socket = Some(socket);
        self
    }

    /// The certificate chain and key it presents. Required.
    pub fn identity(mut self, identity: &'a Identity) -> Self {
        self.identity = Some(identity);
        self
    }

    /// QUIC transport options.
    pub fn transport(mut self, transport: TransportOptions) -> Self {
        self.transport = transport;
        self
    }

    /// Where ingested bodies go.
    pub fn sink(mut self, sink: Arc<dyn Sink>) -> Self {
        self.sink = sink;
        self
    }

    /// Request limits.
    pub fn limits(mut self, limits: ServeLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Start each client's connection from its window history in `store` (paper 002), with
    /// the careful-resume RTT factor `safeguard` if given.
    pub fn history(mut self, store: Arc<HistoryStore>, safeguard: Option<f64>) -> Self {
        self.history = Some((store, safeguard));
        self
    }

    /// Receive two-ended uploads (paper 001) into this directory.
    pub fn uploads(mut self, uploads: Uploads) -> Self {
        self.uploads = Some(uploads);
        self
    }

    /// Run the upload receiver's disk work through `runner`, not tokio's blocking pool
    /// ([`crate::disk`]).
    pub fn disk_runner(mut self, runner: Arc<dyn crate::disk::DiskRunner>) -> Self {
        self.disk = Some(runner);
        self
    }

    /// Remember stored request ids in this durable table too, so a copy retried after a
    /// restart is not stored twice.
    pub fn dedup_store(mut self, store: DedupStore) -> Self {
        self.dedup_store = Some(store);
        self
    }

    /// Seed quinn's choices (connection IDs, packet-number skips), so a simulation repeats.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// At most `total` QUIC connections at once, `per_client` of them from one client (an IPv4
    /// address or an IPv6 /64); more are refused before their handshake (decision S10).
    pub fn connection_limits(mut self, total: usize, per_client: usize) -> Self {
        self.connections = (total, per_client);
        self
    }

    /// Bind the endpoint and spawn the accept loop. Needs a tokio runtime.
    pub fn start(self) -> Result<RunningServer, BuildError> {
        let socket = self.socket.ok_or(BuildError::Missing("a socket"))?;
        let identity = self.identity.ok_or(BuildError::Missing("an identity"))?;
        let cfg = server_config(identity, &[ALPN_H3], &self.transport)?;
        let per_connection =
            (self.history.is_some() || self.transport.qlog_dir.is_some()).then(|| {
                Arc::new(PerConnection {
                    base: cfg.clone(),
                    opts: self.transport.clone(),
                    history: self.history,
                })
            });
        // Its stateless-reset key from its identity, so a restart resets old connections (T11).
        let endpoint = server_endpoint(socket, cfg, identity, self.seed, &self.transport.tasks)?;
        let mut service = IngestService::new(self.sink);
        let max_body = self.limits.max_body as u64;
        let uploads = self.uploads.map(|mut u| {
            // A chunk must fit one request body, or its upload could never finish.
            u.cap_chunk(max_body);
            Arc::new(u)
        });
        if let Some(u) = &uploads {
            service = service.with_uploads(u.clone());
        }
        if let Some(d) = self.dedup_store {
            service = service.with_dedup_store(d);
        }
        if let Some(r) = self.disk {
            service = service.with_disk_runner(r);
        }
        let metrics = service
            .collector()
            .with_budget(self.limits.buffered.clone());
        let service = Arc::new(service);
        let stats = service.stats();
        // Every task the server spawns goes through the transport's task provider, if any
        // (a measurement hook, decision U14).
        let tasks = self.transport.tasks.clone();
        let mut limits = self.limits;
        limits.tasks = tasks.clone();
        let task = tasks.spawn_root(serve(
            endpoint.clone(),
            service,
            limits,
            per_connection,
            Quota::new(self.connections.0, self.connections.1),
        ));
        Ok(RunningServer {
            endpoint,
            stats,
            metrics,
            task,
            uploads,
        })
    }
}

/// A running ingest server.
pub struct RunningServer {
    /// Its QUIC endpoint.
    pub endpoint: quinn::Endpoint,
    /// Its counters.
    pub stats: Arc<ServerStats>,
    /// Its metrics (for the admin port's registry) and status.
    pub metrics: crate::ServerMetrics,
    /// The accept loop.
    pub task: tokio::task::JoinHandle<()>,
    /// The upload receiver, if on.
    pub uploads: Option<Arc<Uploads>>,
}

impl RunningServer {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.endpoint
            .local_addr()
            .expect("a bound endpoint has an address")
    }

    /// Stop gracefully: refuse new connections, let the requests being handled finish (up to
    /// `grace`), then close every connection and wait up to a second for the peers to hear it.
    /// Returns how many requests were still being handled when the connections closed.
    pub async fn shutdown(self, grace: Duration) -> u64 {
        self.endpoint.set_server_config(None);
        let deadline = tokio::time::Instant::now() + grace;
        let busy = || self.stats.in_flight.load(Ordering::Relaxed);
        while busy() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let left = busy();
        self.endpoint.close(0u32.into(), b"server shutting down");
        let _ = tokio::time::timeout(Duration::from_secs(1), self.endpoint.wait_idle()).await;
        self.task.abort();
        if let Some(u) = self.uploads {
            // What uploads in progress received is on disk and reported held at restart.
            if let Err(e) = tokio::task::spawn_blocking(move || u.flush())
                .await
                .unwrap_or(Ok(()))
            {
                tracing::error!(error = %e, "could not flush the uploads in progress");
            }
        }
        left
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_part_is_named() {
        let pki = qgate_transport::DevPki::generate(&[]).unwrap();
        let err = Server::builder()
            .identity(&pki.server)
            .start()
            .err()
            .unwrap();
        assert_eq!(err.to_string(), "the server needs a socket");
        let socket = Socket::bind_udp("127.0.0.1:0".parse().unwrap()).unwrap();
        let err = Server::builder().socket(socket).start().err().unwrap();
        assert_eq!(err.to_string(), "the server needs an identity");
    }
}
