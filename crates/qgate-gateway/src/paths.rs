//! The path manager's shell (paper 000 §3.2): one QUIC connection per backhaul path (or a few,
//! decision G21), bound to the path's local address; Path Request / ACK Response probes as
//! QUIC datagrams when the sans-IO [`Forwarder`] (its path table) asks for them; QUIC's own RTT
//! estimate between probes; a closed connection reported at once; reconnection attempts as the
//! probes of a path without one. It holds the forwarder under the gateway's one lock.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use qgate_core::sync::lock;
use qgate_forward::forwarder::Forwarder;
use qgate_forward::path::{ConnectionSample, PathId, PathTable};
use qgate_forward::probe::ProbeMsg;
use qgate_transport::{connect, Congestion, Socket, TransportError, TransportOptions};

use crate::reachability::{Reachability, Say};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Backhaul connections per path unless a path says otherwise (decision G21).
pub const DEFAULT_CONNECTIONS_PER_PATH: usize = 1;
/// The most connections one path may have (each holds its own QUIC state at both ends).
pub const MAX_CONNECTIONS_PER_PATH: usize = 16;

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
    /// Its QUIC connections to the server (1 to [`MAX_CONNECTIONS_PER_PATH`], a value outside
    /// taken as the nearest; decision G21): each request goes on the one with the fewest out.
    pub connections: usize,
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
            connections: DEFAULT_CONNECTIONS_PER_PATH,
        })
    }
}

/// One of a path's backhaul connections.
#[derive(Default)]
struct Lane {
    conn: Mutex<Option<quinn::Connection>>,
    connecting: Mutex<bool>,
    /// Requests out on this lane now ([`Lease`]s).
    busy: AtomicUsize,
}

struct Shared {
    /// The forwarding core: sessions, paths, scheduler, requests (the one lock).
    core: Mutex<Forwarder>,
    /// Each path's lanes. Never locked while the core's lock is wanted (the core's lock may
    /// be held while a lane's is taken).
    lanes: Vec<Vec<Lane>>,
    /// Per path with several lanes: packet counters summed over its connections so far, so
    /// they only grow when one of them is replaced (the path table reads their differences).
    totals: Vec<Mutex<Totals>>,
    /// Per path: what the log has said of its server's reachability.
    reach: Vec<Mutex<Reachability>>,
    wake: Notify,
}

/// A path's counters over all its connections, and what each lane's connection had counted at
/// the last sample (the connection, sent, lost, congestion events). The connection is held,
/// not its stable id alone: an id is an address, and a replacement allocated where a freed
/// connection was would take its id and be read as the same connection (its counters lost).
#[derive(Default)]
struct Totals {
    sent: u64,
    lost: u64,
    events: u64,
    seen: Vec<Option<(quinn::Connection, u64, u64, u64)>>,
}

impl Shared {
    /// What QUIC says about `path` now, with `own`'s connection standing for its lane (the
    /// connection a request was answered on). One connection: its sample, as before G21.
    /// Several (decision G21): the path as one pipe, windows summed, smoothed RTTs averaged,
    /// the smallest minimum RTT, and packet counters that only grow (see [`Totals`]).
    fn sample(&self, path: PathId, own: Option<&Lease>) -> Option<ConnectionSample> {
        let lanes = self.lanes.get(path.0)?;
        if lanes.len() == 1 {
            // Every answered request samples its path: no collection for the common case.
            return match own {
                Some(o) => Some(connection_sample(&o.conn)),
                None => lock(&lanes[0].conn).as_ref().map(connection_sample),
            };
        }
        let conns: Vec<(usize, quinn::Connection)> = lanes
            .iter()
            .enumerate()
            .filter_map(|(i, l)| match own {
                Some(o) if o.lane == i => Some((i, o.conn.clone())),
                _ => lock(&l.conn).clone().map(|c| (i, c)),
            })
            .collect();
        let mut t = lock(&self.totals[path.0]);
        t.seen.resize(lanes.len(), None);
        let mut sum: Option<ConnectionSample> = None;
        for (i, c) in &conns {
            let s = connection_sample(c);
            let (sent, lost, events) = match &t.seen[*i] {
                Some((seen, a, b, e)) if seen.stable_id() == c.stable_id() => (
                    s.sent_packets.saturating_sub(*a),
                    s.lost_packets.saturating_sub(*b),
                    s.congestion_events.saturating_sub(*e),
                ),
                _ => (s.sent_packets, s.lost_packets, s.congestion_events),
            };
            t.seen[*i] = Some((
                c.clone(),
                s.sent_packets,
                s.lost_packets,
                s.congestion_events,
            ));
            t.sent += sent;
            t.lost += lost;
            t.events += events;
            sum = Some(match sum {
                None => s,
                Some(a) => ConnectionSample {
                    rtt: a.rtt + s.rtt,
                    cwnd: a.cwnd + s.cwnd,
                    min_rtt: a.min_rtt.min(s.min_rtt),
                    ..a
                },
            });
        }
        sum.map(|s| ConnectionSample {
            rtt: s.rtt / conns.len() as u32,
            sent_packets: t.sent,
            lost_packets: t.lost,
            congestion_events: t.events,
            ..s
        })
    }

    fn live(&self, path: PathId) -> impl Iterator<Item = (usize, quinn::Connection)> + '_ {
        self.lanes
            .get(path.0)
            .into_iter()
            .flatten()
            .enumerate()
            .filter_map(|(i, l)| lock(&l.conn).clone().map(|c| (i, c)))
    }
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

/// Congestion-window history for the backhaul connections (paper 002; decision H6: on by
/// default for the gateway).
#[derive(Clone)]
pub struct BackhaulHistory {
    /// The store.
    pub store: Arc<qgate_transport::window_history::HistoryStore>,
    /// Careful-resume factor, if on.
    pub safeguard: Option<f64>,
}

/// A request's use of one backhaul connection: counted against its lane until dropped, so the
/// next request picks the lane with the fewest out.
pub struct Lease {
    shared: Arc<Shared>,
    path: PathId,
    lane: usize,
    conn: quinn::Connection,
}

impl Lease {
    /// The lane (which of its path's connections), from 0.
    pub fn lane(&self) -> usize {
        self.lane
    }

    /// The connection.
    pub fn connection(&self) -> &quinn::Connection {
        &self.conn
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.shared.lanes[self.path.0][self.lane]
            .busy
            .fetch_sub(1, Ordering::Relaxed);
    }
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
        assert_eq!(
            core.paths().paths().len(),
            paths.len(),
            "one backhaul per path of the core"
        );
        let shared = Arc::new(Shared {
            core: Mutex::new(core),
            lanes: paths
                .iter()
                .map(|p| {
                    let n = p.connections.clamp(1, MAX_CONNECTIONS_PER_PATH);
                    (0..n).map(|_| Lane::default()).collect()
                })
                .collect(),
            totals: paths.iter().map(|_| Mutex::default()).collect(),
            reach: paths.iter().map(|_| Mutex::default()).collect(),
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

    /// A live connection of `path` (its first live lane's), if any.
    pub fn connection(&self, path: PathId) -> Option<quinn::Connection> {
        self.shared.live(path).next().map(|(_, c)| c)
    }

    /// `path`'s live connections, in lane order.
    pub fn live(&self, path: PathId) -> impl Iterator<Item = quinn::Connection> + '_ {
        self.shared.live(path).map(|(_, c)| c)
    }

    /// How many connections `path` keeps (its lanes).
    pub fn lanes(&self, path: PathId) -> usize {
        self.shared.lanes.get(path.0).map_or(0, Vec::len)
    }

    /// How many of `path`'s connections are up.
    pub fn live_connections(&self, path: PathId) -> usize {
        self.shared.live(path).count()
    }

    /// The live connection of `path` with the fewest requests out (the first such lane on a
    /// tie), leased for one request.
    pub fn lease(&self, path: PathId) -> Option<Lease> {
        let lanes = self.shared.lanes.get(path.0)?;
        // With several, not one that is closing (its slot is cleared a moment later).
        let (lane, conn) = self
            .shared
            .live(path)
            .filter(|(_, c)| lanes.len() == 1 || c.close_reason().is_none())
            .min_by_key(|(i, _)| lanes[*i].busy.load(Ordering::Relaxed))?;
        lanes[lane].busy.fetch_add(1, Ordering::Relaxed);
        Some(Lease {
            shared: self.shared.clone(),
            path,
            lane,
            conn,
        })
    }

    /// What QUIC says about `path` now: with one connection its sample; with several, the
    /// path as one pipe (decision G21): their windows summed, their smoothed RTTs averaged,
    /// the smallest minimum RTT, packet counters summed over every connection so far.
    pub fn sample(&self, path: PathId) -> Option<ConnectionSample> {
        self.shared.sample(path, None)
    }

    /// [`PathManager::sample`] with `lease`'s connection for its lane (the one that answered).
    pub fn sample_for(&self, lease: &Lease) -> Option<ConnectionSample> {
        self.shared.sample(lease.path, Some(lease))
    }

    /// Whether `path` has a connection open besides `lane`'s.
    pub fn others_live(&self, path: PathId, lane: Option<usize>) -> bool {
        self.shared
            .live(path)
            .any(|(i, c)| Some(i) != lane && c.close_reason().is_none())
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

/// A backhaul connection attempt that takes longer than this fails.
const CONNECT_WITHIN: Duration = Duration::from_secs(5);

impl Shared {
    /// Tell `path`'s reachability what happened (`event`) and write the line it says, if any;
    /// `why` is the cause of a failure or loss.
    fn tell(
        &self,
        p: &Backhaul,
        path: PathId,
        event: impl FnOnce(&mut Reachability, std::time::Instant) -> Option<Say>,
        why: &str,
    ) {
        let Some(say) = event(&mut lock(&self.reach[path.0]), Instant::now().into_std()) else {
            return;
        };
        let local = p
            .endpoint
            .local_addr()
            .map_or_else(|_| "?".to_string(), |a| a.to_string());
        let (path, server) = (path.0, p.server);
        match say {
            Say::Up {
                again: true,
                after_failures,
            } => tracing::warn!(path, %local, %server, after_failures, "backhaul path back up"),
            Say::Up { again: false, .. } => {
                tracing::info!(path, %local, %server, "backhaul path up")
            }
            Say::Down => tracing::warn!(
                path, %local, %server, error = why,
                "backhaul path down: the server does not answer on it (is a qgate server listening there?); retrying with the probes"
            ),
            Say::StillDown { failures } => tracing::warn!(
                path, %local, %server, failures, error = why,
                "backhaul path still down"
            ),
        }
    }
}

/// What QUIC says about one backhaul connection now.
fn connection_sample(c: &quinn::Connection) -> ConnectionSample {
    let p = c.stats().path;
    ConnectionSample {
        rtt: p.rtt,
        cwnd: p.cwnd,
        sent_packets: p.sent_packets,
        lost_packets: p.lost_packets,
        congestion_events: p.congestion_events,
        min_rtt: p.min_rtt,
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
            let live: Vec<(usize, quinn::Connection)> = shared.live(probe.path).collect();
            // A lane that lost its connection while others kept theirs reconnects with the
            // path's probes; a path with none left is down until one comes back.
            for lane in 0..shared.lanes[probe.path.0].len() {
                if !live.iter().any(|(i, _)| *i == lane) {
                    reconnect(&shared, &paths, &cfg, &history, probe.path, lane);
                }
            }
            if let Some((_, c)) = live.first() {
                // Between probes, QUIC's own estimate refines the path's RTT (§3.2).
                // Under the core's lock, as the gateway's samples (in order).
                let mut core = lock(&shared.core);
                if let Some(s) = shared.sample(probe.path, None) {
                    core.on_connection_sample(probe.path, s);
                }
                drop(core);
                let _ = c.send_datagram(Bytes::copy_from_slice(
                    &ProbeMsg::Request(probe.seq).encode(),
                ));
            }
        }
        let next = lock(&shared.core).poll_timeout();
        match next {
            Some(t) => {
                let at = Instant::from_std(t);
                tokio::select! {
                    biased;
                    _ = tokio::time::sleep_until(at.max(now + Duration::from_millis(1))) => {}
                    _ = shared.wake.notified() => {}
                }
            }
            None => shared.wake.notified().await,
        }
    }
}

/// Connect `lane` of `path` unless an attempt is under way; on success, read its probe
/// answers until the connection closes, then report the loss if it was the path's last.
fn reconnect(
    shared: &Arc<Shared>,
    paths: &Arc<Vec<Backhaul>>,
    (cfg, opts): &(quinn::ClientConfig, TransportOptions),
    history: &Option<BackhaulHistory>,
    path: PathId,
    lane: usize,
) {
    {
        let mut busy = lock(&shared.lanes[path.0][lane].connecting);
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
    // One key per path: its lanes share the path's history.
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
        let slot = &shared.lanes[path.0][lane];
        let result = tokio::time::timeout(
            CONNECT_WITHIN,
            connect(&p.endpoint, &cfg, p.server, &p.server_name, false),
        )
        .await;
        *lock(&slot.connecting) = false;
        let conn = match result {
            Ok(Ok(c)) => c.connection().clone(),
            Ok(Err(e)) => {
                tracing::debug!(path = path.0, lane, error = %e, "backhaul connect failed");
                shared.tell(p, path, |r, now| r.on_failure(now), &e.to_string());
                return;
            }
            Err(_) => {
                let why = format!("no answer within {CONNECT_WITHIN:?}");
                shared.tell(p, path, |r, now| r.on_failure(now), &why);
                return;
            }
        };
        shared.tell(p, path, |r, _| r.on_up(), "");
        *lock(&slot.conn) = Some(conn.clone());
        shared.wake.notify_one(); // probe the new connection now rather than at the next timer
        while let Ok(d) = conn.read_datagram().await {
            if let Ok(ProbeMsg::Response(seq)) = ProbeMsg::decode(&d) {
                lock(&shared.core).on_probe_ack(path, seq, Instant::now().into_std());
            }
        }
        // The connection is gone; with it the path's last, the path is down until a
        // reconnection succeeds.
        {
            let mut held = lock(&slot.conn);
            if held
                .as_ref()
                .is_some_and(|c| c.stable_id() == conn.stable_id())
            {
                *held = None;
            }
        }
        if shared.live(path).next().is_none() {
            lock(&shared.core).on_connection_lost(path, Instant::now().into_std());
            let why = conn
                .close_reason()
                .map_or_else(String::new, |e| e.to_string());
            shared.tell(p, path, |r, now| r.on_lost(now), &why);
        }
        shared.wake.notify_one();
    });
}
