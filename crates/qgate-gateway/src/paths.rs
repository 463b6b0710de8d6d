//! The path manager's shell (paper 000 §3.2): one QUIC connection per backhaul path, bound to
//! the path's local address; Path Request / ACK Response probes as QUIC datagrams when the
//! sans-IO [`Forwarder`] (its path table) asks for them; QUIC's own RTT estimate between
//! probes; a closed connection reported at once; reconnection attempts as the probes of a path
//! without one. It holds the forwarder under the gateway's one lock.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use qgate_core::forwarder::Forwarder;
use qgate_core::path::{PathId, PathTable};
use qgate_core::probe::ProbeMsg;
use qgate_transport::{connect, Congestion, Socket, TransportError, TransportOptions};
use tokio::sync::Notify;
use tokio::time::Instant;

/// One backhaul path: the endpoint bound to its local address, and where the server is.
pub struct Backhaul {
    /// A client endpoint bound to the path's local address.
    pub endpoint: quinn::Endpoint,
    /// The server's address on this path.
    pub server: SocketAddr,
    /// The name the server's certificate carries.
    pub server_name: String,
    /// This path's congestion controller, if not the gateway transport's (decision G16).
    pub congestion: Option<Congestion>,
}

impl Backhaul {
    /// A path whose endpoint is built on `socket` (a netsim interface or a UDP socket bound to
    /// the path's local address).
    pub fn new(
        socket: Socket,
        server: SocketAddr,
        server_name: &str,
        seed: Option<u64>,
    ) -> Result<Backhaul, TransportError> {
        Ok(Backhaul {
            endpoint: qgate_transport::endpoint(socket, None, seed)?,
            server,
            server_name: server_name.to_string(),
            congestion: None,
        })
    }
}

struct Shared {
    /// The forwarding core: sessions, paths, scheduler, requests (the one lock).
    core: Mutex<Forwarder>,
    conns: Vec<Mutex<Option<quinn::Connection>>>,
    connecting: Vec<Mutex<bool>>,
    wake: Notify,
}

/// The running path manager. Dropping it stops its tasks.
pub struct PathManager {
    shared: Arc<Shared>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for PathManager {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Congestion-window history for the backhaul connections (paper 002; decision H6: on by
/// default for the gateway).
#[derive(Clone)]
pub struct BackhaulHistory {
    /// The store.
    pub store: Arc<qgate_transport::history::HistoryStore>,
    /// Careful-resume factor, if on.
    pub safeguard: Option<f64>,
}

impl PathManager {
    /// Start managing `paths` for `core` (one path each) with client configuration `cfg` (it
    /// must offer the server's ALPN).
    pub fn start(paths: Vec<Backhaul>, cfg: quinn::ClientConfig, core: Forwarder) -> PathManager {
        Self::start_with_history(paths, cfg, TransportOptions::default(), core, None)
    }

    /// [`PathManager::start`], each backhaul connection starting from its path's window history
    /// and recording into it (the key is `server-name@server via local-address`, one per path).
    /// `opts` are those `cfg` was built from; each connection's configuration is built from
    /// them when it needs one of its own (history, a qlog file).
    pub fn start_with_history(
        paths: Vec<Backhaul>,
        cfg: quinn::ClientConfig,
        opts: TransportOptions,
        core: Forwarder,
        history: Option<BackhaulHistory>,
    ) -> PathManager {
        let n = paths.len();
        assert_eq!(
            core.paths().paths().len(),
            n,
            "one backhaul per path of the core"
        );
        let shared = Arc::new(Shared {
            core: Mutex::new(core),
            conns: (0..n).map(|_| Mutex::new(None)).collect(),
            connecting: (0..n).map(|_| Mutex::new(false)).collect(),
            wake: Notify::new(),
        });
        let paths = Arc::new(paths);
        let driver = tokio::spawn(drive(shared.clone(), paths, (cfg, opts), history));
        PathManager {
            shared,
            tasks: vec![driver],
        }
    }

    /// A copy of the path table now.
    pub fn table(&self) -> PathTable {
        lock(&self.shared.core).paths().clone()
    }

    /// The live connection of `path`, if any.
    pub fn connection(&self, path: PathId) -> Option<quinn::Connection> {
        lock(self.shared.conns.get(path.0)?).clone()
    }

    /// Apply `f` to the forwarder under its lock (decision G17); if that brought its next timeout forward,
    /// the driver re-plans (most requests leave it where it was, and cost no wake-up).
    pub fn with_core<R>(&self, f: impl FnOnce(&mut Forwarder) -> R) -> R {
        let mut core = lock(&self.shared.core);
        let before = core.poll_timeout();
        let r = f(&mut core);
        let after = core.poll_timeout();
        drop(core);
        if after.is_some_and(|a| before.is_none_or(|b| a < b)) {
            self.shared.wake.notify_one();
        }
        r
    }
}

async fn drive(
    shared: Arc<Shared>,
    paths: Arc<Vec<Backhaul>>,
    cfg: (quinn::ClientConfig, TransportOptions),
    history: Option<BackhaulHistory>,
) {
    loop {
        let now = Instant::now();
        let probes = lock(&shared.core).poll(now.into_std());
        for probe in probes {
            let conn = lock(&shared.conns[probe.path.0]).clone();
            match conn {
                Some(c) => {
                    // Between probes, QUIC's own estimate refines the path's RTT (§3.2).
                    // Under the core's lock, as the gateway's samples (in order).
                    lock(&shared.core)
                        .on_connection_sample(probe.path, crate::gateway::connection_sample(&c));
                    let _ = c.send_datagram(Bytes::copy_from_slice(
                        &ProbeMsg::Request(probe.seq).encode(),
                    ));
                }
                None => reconnect(&shared, &paths, &cfg, &history, probe.path),
            }
        }
        let next = lock(&shared.core).poll_timeout();
        match next {
            Some(t) => {
                let at = Instant::from_std(t);
                tokio::select! {
                    _ = tokio::time::sleep_until(at.max(now + Duration::from_millis(1))) => {}
                    _ = shared.wake.notified() => {}
                }
            }
            None => shared.wake.notified().await,
        }
    }
}

/// Connect `path` unless an attempt is under way; on success, read its probe answers until the
/// connection closes, then report the loss.
fn reconnect(
    shared: &Arc<Shared>,
    paths: &Arc<Vec<Backhaul>>,
    (cfg, opts): &(quinn::ClientConfig, TransportOptions),
    history: &Option<BackhaulHistory>,
    path: PathId,
) {
    {
        let mut busy = lock(&shared.connecting[path.0]);
        if *busy {
            return;
        }
        *busy = true;
    }
    let p = &paths[path.0];
    let local = p
        .endpoint
        .local_addr()
        .map_or("?".to_string(), |a| a.ip().to_string());
    let key = format!("{}@{} via {local}", p.server_name, p.server);
    // A path with a controller of its own gets a transport configuration of its own.
    let own = p
        .congestion
        .filter(|c| *c != opts.congestion)
        .map(|congestion| TransportOptions {
            congestion,
            ..opts.clone()
        });
    let opts = own.as_ref().unwrap_or(opts);
    let cfg = match history {
        Some(h) => h
            .store
            .client_config(cfg, opts, &key, h.safeguard)
            .map(|(c, _)| c),
        None if own.is_some() => opts
            .connection_transport(qgate_transport::qlog::Vantage::Client, &key)
            .map(|t| {
                let mut c = cfg.clone();
                c.transport_config(Arc::new(t));
                c
            }),
        None => qgate_transport::client_config_for(cfg, opts, &key),
    }
    .unwrap_or_else(|e| {
        tracing::warn!(path = path.0, error = %e, "per-connection config failed; the shared one");
        cfg.clone()
    });
    let (shared, paths) = (shared.clone(), paths.clone());
    tokio::spawn(async move {
        let p = &paths[path.0];
        let result = tokio::time::timeout(
            Duration::from_secs(5),
            connect(&p.endpoint, &cfg, p.server, &p.server_name, false),
        )
        .await;
        *lock(&shared.connecting[path.0]) = false;
        let conn = match result {
            Ok(Ok(c)) => c.connection().clone(),
            Ok(Err(e)) => {
                tracing::debug!(path = path.0, error = %e, "backhaul connect failed");
                return;
            }
            Err(_) => return,
        };
        *lock(&shared.conns[path.0]) = Some(conn.clone());
        shared.wake.notify_one(); // probe the new connection now rather than at the next timer
        while let Ok(d) = conn.read_datagram().await {
            if let Ok(ProbeMsg::Response(seq)) = ProbeMsg::decode(&d) {
                lock(&shared.core).on_probe_ack(path, seq, Instant::now().into_std());
            }
        }
        // The connection is gone: the path is down until a reconnection succeeds.
        *lock(&shared.conns[path.0]) = None;
        lock(&shared.core).on_connection_lost(path, Instant::now().into_std());
        shared.wake.notify_one();
    });
}
