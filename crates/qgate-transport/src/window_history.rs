//! Congestion-window history for QUIC connections (paper 002): a persistent, crash-safe store
//! of per-peer averages (redb), and a congestion controller wrapper that starts a connection
//! from the history, records its window when it ends, and falls back to the default window if
//! the path turned out much worse than when the history was recorded.
//!
//! Peers: a client keys by `server-name@address`; a server keys by the client's IP address (a
//! client's port changes every connection). See docs/decisions.md H1–H8.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use qgate_history::careful_resume::{self, CarefulResume, Handover, Outcome};
use qgate_history::{path_changed, Decision, Entry, HistoryConfig, HistoryTable, Observed};
use quinn::congestion::{Controller, ControllerFactory};
use quinn_proto::RttEstimator;
use redb::{ReadableDatabase, ReadableTable, TableDefinition};

use crate::delegate::{Layer, Wrapped};
use crate::TransportOptions;

const TABLE: TableDefinition<&str, &[u8]> = TableDefinition::new("cwnd_history");

/// Log target: the module's name before it was renamed, which operators filter on
/// (`RUST_LOG=qgate_transport::history=debug`).
const LOG_TARGET: &str = "qgate_transport::history";

/// The RTT ratio above which a connection started from history falls back to the default
/// window (decision H4: twice the recorded minimum RTT).
pub const DEFAULT_SAFEGUARD_FACTOR: f64 = 2.0;

/// Opening or writing the store failed; the message names the file.
#[derive(Debug, thiserror::Error)]
#[error("history store {path}: {problem}")]
pub struct HistoryError {
    /// The database file.
    pub path: PathBuf,
    /// What went wrong.
    pub problem: String,
}

/// An entry on disk: 64 bytes (40 before the smoothed RTT was kept, 48 before the capacity and
/// recent RTT were; such entries read with those unknown).
fn encode(e: &Entry) -> [u8; 64] {
    let mut b = [0u8; 64];
    b[0..8].copy_from_slice(&e.avg_cwnd.to_le_bytes());
    b[8..16].copy_from_slice(&e.count.to_le_bytes());
    b[16..24].copy_from_slice(&e.min_rtt_us.to_le_bytes());
    b[24..32].copy_from_slice(&e.updated_ms.to_le_bytes());
    b[32..40].copy_from_slice(&e.used_ms.to_le_bytes());
    b[40..48].copy_from_slice(&e.srtt_us.to_le_bytes());
    b[48..56].copy_from_slice(&e.capacity.to_le_bytes());
    b[56..64].copy_from_slice(&e.recent_rtt_us.to_le_bytes());
    b
}

fn decode(b: &[u8]) -> Option<Entry> {
    if ![40, 48, 64].contains(&b.len()) {
        return None;
    }
    let u = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    let f = |i: usize| f64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    let sane = |x: f64| x.is_finite() && x >= 0.0;
    let (avg, capacity) = (f(0), if b.len() == 64 { f(48) } else { 0.0 });
    (sane(avg) && sane(capacity)).then(|| Entry {
        avg_cwnd: avg,
        count: u(8),
        min_rtt_us: u(16),
        updated_ms: u(24),
        used_ms: u(32),
        srtt_us: if b.len() >= 48 { u(40) } else { 0 },
        capacity,
        recent_rtt_us: if b.len() == 64 { u(56) } else { 0 },
    })
}

/// Why a store file did not open.
#[derive(Debug)]
enum LoadError {
    /// The content is not a valid store: move it aside and start afresh.
    Corrupt(String),
    /// Anything else (locked by another process, permissions, I/O): report, touch nothing.
    Fatal(String),
}

impl LoadError {
    fn from_open(e: redb::DatabaseError) -> LoadError {
        use redb::{DatabaseError as D, StorageError as S};
        match e {
            D::DatabaseAlreadyOpen | D::LockProtocolMismatch => LoadError::Fatal(
                "is in use by another process (a running qgate server or client?)".into(),
            ),
            D::Storage(S::Corrupted(m)) => LoadError::Corrupt(m),
            D::UpgradeRequired(v) => {
                LoadError::Corrupt(format!("file format version {v} is not ours"))
            }
            D::Storage(S::Io(io))
                if matches!(
                    io.kind(),
                    std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof
                ) =>
            {
                LoadError::Corrupt(io.to_string())
            }
            other => LoadError::Fatal(other.to_string()),
        }
    }
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Corrupt(m) | LoadError::Fatal(m) => f.write_str(m),
        }
    }
}

/// Milliseconds of wall-clock time; simulations substitute virtual time.
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// The system clock in Unix milliseconds.
pub fn system_clock() -> Clock {
    Arc::new(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    })
}

/// A history table, optionally persisted in a redb database (every record is one committed,
/// crash-safe transaction: a torn write never corrupts it).
pub struct HistoryStore {
    table: Mutex<HistoryTable>,
    db: Option<(redb::Database, PathBuf)>,
    clock: Clock,
    write_errors: AtomicU64,
}

impl std::fmt::Debug for HistoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HistoryStore")
            .field("path", &self.db.as_ref().map(|(_, p)| p))
            .finish()
    }
}

impl HistoryStore {
    /// A store that lives only in memory.
    pub fn in_memory(config: HistoryConfig, clock: Clock) -> Arc<HistoryStore> {
        Arc::new(HistoryStore {
            table: Mutex::new(HistoryTable::new(config)),
            db: None,
            clock,
            write_errors: AtomicU64::new(0),
        })
    }

    /// Open (or create) the store at `path`. A file that is not a valid store is moved aside to
    /// `<path>.corrupt-<unix ms>` and a fresh store is created: the returned warning says so.
    pub fn open(
        path: &Path,
        config: HistoryConfig,
        clock: Clock,
    ) -> Result<(Arc<HistoryStore>, Option<String>), HistoryError> {
        let fail = |problem: String| HistoryError {
            path: path.to_path_buf(),
            problem,
        };
        config.validate().map_err(&fail)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| fail(format!("cannot create {}: {e}", dir.display())))?;
        }
        let mut warning = None;
        let (db, entries) = match Self::load(path) {
            Ok(x) => x,
            // Locked by another process, or unreadable for a reason that is not the file's
            // content (permissions, I/O): an error, and the file is left alone.
            Err(LoadError::Fatal(problem)) => return Err(fail(problem)),
            Err(LoadError::Corrupt(problem)) => {
                let aside = PathBuf::from(format!("{}.corrupt-{}", path.display(), (clock)()));
                std::fs::rename(path, &aside).map_err(|e| {
                    fail(format!(
                        "unreadable ({problem}) and cannot be moved aside: {e}"
                    ))
                })?;
                warning = Some(format!(
                    "history store {} was unreadable ({problem}); moved it to {} and started a fresh one",
                    path.display(),
                    aside.display()
                ));
                Self::load(path).map_err(|e| fail(e.to_string()))?
            }
        };
        let store = HistoryStore {
            table: Mutex::new(HistoryTable::with_entries(config, entries)),
            db: Some((db, path.to_path_buf())),
            clock,
            write_errors: AtomicU64::new(0),
        };
        Ok((Arc::new(store), warning))
    }

    fn load(path: &Path) -> Result<(redb::Database, Vec<(String, Entry)>), LoadError> {
        let db = redb::Database::create(path).map_err(LoadError::from_open)?;
        let corrupt = |e: redb::Error| LoadError::Corrupt(e.to_string());
        let txn = db.begin_write().map_err(|e| corrupt(e.into()))?;
        txn.open_table(TABLE).map_err(|e| corrupt(e.into()))?;
        txn.commit().map_err(|e| corrupt(e.into()))?;
        let read = db.begin_read().map_err(|e| corrupt(e.into()))?;
        let table = read.open_table(TABLE).map_err(|e| corrupt(e.into()))?;
        let mut entries = Vec::new();
        for row in table.iter().map_err(|e| corrupt(e.into()))? {
            let (k, v) = row.map_err(|e| corrupt(e.into()))?;
            let entry = decode(v.value())
                .ok_or_else(|| LoadError::Corrupt(format!("entry '{}' is malformed", k.value())))?;
            entries.push((k.value().to_string(), entry));
        }
        drop(table);
        drop(read);
        Ok((db, entries))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HistoryTable> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Now, by the store's clock.
    pub fn now_ms(&self) -> u64 {
        (self.clock)()
    }

    /// Record a window for `peer`, with the RTTs its connection saw, and persist it.
    pub fn record(&self, peer: &str, cwnd: u64, rtt: Observed) -> Entry {
        let now = self.now_ms();
        let (entry, evicted) = self.lock().record(peer, cwnd, rtt, now);
        if let Some((db, path)) = &self.db {
            let write = || -> Result<(), redb::Error> {
                let txn = db.begin_write()?;
                {
                    let mut t = txn.open_table(TABLE)?;
                    t.insert(peer, encode(&entry).as_slice())?;
                    for k in &evicted {
                        t.remove(k.as_str())?;
                    }
                }
                txn.commit()?;
                Ok(())
            };
            if let Err(e) = write() {
                self.write_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(target: LOG_TARGET, path = %path.display(), error = %e, "could not persist a history entry");
            }
        }
        entry
    }

    /// The initial window for a new connection to `peer` (max(default, average), clamped).
    pub fn decide(&self, peer: &str, default: u64) -> Decision {
        let now = self.now_ms();
        self.lock().initial_window(peer, default, now)
    }

    /// Every entry, most recently used first.
    pub fn entries(&self) -> Vec<(String, Entry)> {
        self.lock()
            .entries()
            .into_iter()
            .map(|(k, e)| (k.to_string(), *e))
            .collect()
    }

    /// The entry for one peer.
    pub fn get(&self, peer: &str) -> Option<Entry> {
        self.lock().get(peer).copied()
    }

    /// Forget every peer (and persist that).
    pub fn clear(&self) -> Result<usize, HistoryError> {
        let n = self.lock().len();
        self.lock().clear();
        if let Some((db, path)) = &self.db {
            let fail = |e: redb::Error| HistoryError {
                path: path.clone(),
                problem: e.to_string(),
            };
            let txn = db.begin_write().map_err(|e| fail(e.into()))?;
            txn.delete_table(TABLE).map_err(|e| fail(e.into()))?;
            txn.open_table(TABLE).map_err(|e| fail(e.into()))?;
            txn.commit().map_err(|e| fail(e.into()))?;
        }
        Ok(n)
    }

    /// Writes that failed (logged; the in-memory table still has them).
    pub fn write_errors(&self) -> u64 {
        self.write_errors.load(Ordering::Relaxed)
    }

    /// A client configuration for one connection to `peer`, with the history's initial window
    /// and initial RTT (H8) and a recording controller. Clone `base` from one config per server so that 0-RTT
    /// session tickets are shared.
    pub fn client_config(
        self: &Arc<Self>,
        base: &quinn::ClientConfig,
        opts: &TransportOptions,
        peer: &str,
        safeguard: Option<f64>,
    ) -> Result<(quinn::ClientConfig, Arc<ConnHistory>), crate::OptionError> {
        let (transport, conn) =
            self.transport_config(opts, peer, safeguard, crate::qlog::Vantage::Client)?;
        let mut cfg = base.clone();
        cfg.transport_config(Arc::new(transport));
        Ok((cfg, conn))
    }

    /// A server configuration for one incoming connection from `peer` (use with
    /// `Incoming::accept_with`).
    pub fn server_config(
        self: &Arc<Self>,
        base: &quinn::ServerConfig,
        opts: &TransportOptions,
        peer: &str,
        safeguard: Option<f64>,
    ) -> Result<(Arc<quinn::ServerConfig>, Arc<ConnHistory>), crate::OptionError> {
        let (transport, conn) =
            self.transport_config(opts, peer, safeguard, crate::qlog::Vantage::Server)?;
        let mut cfg = base.clone();
        cfg.transport_config(Arc::new(transport));
        Ok((Arc::new(cfg), conn))
    }

    fn transport_config(
        self: &Arc<Self>,
        opts: &TransportOptions,
        peer: &str,
        safeguard: Option<f64>,
        vantage: crate::qlog::Vantage,
    ) -> Result<(quinn::TransportConfig, Arc<ConnHistory>), crate::OptionError> {
        let mut default_opts = opts.clone();
        default_opts.initial_window = None;
        let default_window = opts.initial_window.unwrap_or_else(|| {
            default_opts
                .controller_factory()
                .build(Instant::now(), 1200)
                .initial_window()
        });
        let decision = self.decide(peer, default_window);
        let conn = Arc::new(ConnHistory {
            peer: peer.to_string(),
            decision,
            fell_back: AtomicBool::new(false),
            careful: Mutex::new(Outcome::None),
        });
        let mut start_opts = opts.clone();
        start_opts.initial_window = Some(decision.window);
        let factory = Arc::new(HistoryFactory {
            start: start_opts.controller_factory(),
            fallback: opts.controller_factory(),
            opts: opts.clone(),
            careful_started: AtomicBool::new(false),
            store: self.clone(),
            conn: conn.clone(),
            safeguard,
        });
        let mut t = opts.connection_transport(vantage, peer)?;
        t.congestion_controller_factory(factory);
        if let Some(ms) = seeded_rtt_ms(&decision, opts) {
            t.initial_rtt(std::time::Duration::from_secs_f64(ms / 1000.0));
        }
        Ok((t, conn))
    }
}

/// The least RTT a connection is seeded with, ms: the handshake's round trip also carries the
/// peer's certificate work, which a LAN's data-packet RTT does not show (decision H8).
pub const MIN_SEEDED_RTT_MS: f64 = 10.0;

/// A seed above this many times the peer's smallest RTT is the last connection's own
/// queueing, not the path: it is cut there (when that is above the configured initial RTT).
pub const SEED_OVER_MIN_RTT: f64 = 4.0;

/// The initial RTT for a connection the history decided on (decision H8): the peer's last
/// smoothed RTT (RFC 9002 §6.2.2), at least [`MIN_SEEDED_RTT_MS`] (or the configured initial
/// RTT where that is smaller), at most
/// max(configured initial RTT, [`SEED_OVER_MIN_RTT`] × its smallest RTT); the options' own
/// rules then apply (a declared slow link's floor, T6, and the one-minute cap). `None`: no seed.
pub fn seeded_rtt_ms(decision: &Decision, opts: &TransportOptions) -> Option<f64> {
    if decision.initial_rtt_us == 0 {
        return None;
    }
    // An operator's configured initial RTT under 10 ms (a LAN) is not raised to that floor.
    let floor = MIN_SEEDED_RTT_MS.min(opts.initial_rtt_ms);
    let cap = (decision.reference_rtt_us as f64 / 1000.0 * SEED_OVER_MIN_RTT)
        .max(opts.initial_rtt_ms)
        .max(floor);
    let seeded = TransportOptions {
        initial_rtt_ms: (decision.initial_rtt_us as f64 / 1000.0).clamp(floor, cap),
        ..opts.clone()
    };
    Some(seeded.effective_initial_rtt_ms())
}

/// What the history did for one connection.
#[derive(Debug)]
pub struct ConnHistory {
    /// The peer key.
    pub peer: String,
    /// The initial window chosen.
    pub decision: Decision,
    fell_back: AtomicBool,
    careful: Mutex<Outcome>,
}

impl ConnHistory {
    /// Whether the safeguard dropped the window back to the default, or careful resume found
    /// the path changed or retreated from its jump.
    pub fn fell_back(&self) -> bool {
        self.fell_back.load(Ordering::Relaxed)
    }

    /// How careful resume ended (decision H9); [`Outcome::None`] without it or while it runs.
    pub fn careful_outcome(&self) -> Outcome {
        *self.careful.lock().unwrap_or_else(|e| e.into_inner())
    }
}

struct HistoryFactory {
    start: Arc<dyn ControllerFactory + Send + Sync>,
    fallback: Arc<dyn ControllerFactory + Send + Sync>,
    /// The connection's options, to build the controller careful resume hands over to.
    opts: TransportOptions,
    /// Careful resume runs once per connection: quinn builds a controller again for a new path
    /// (migration), which the saved state does not describe (RFC 9959 §3.2).
    careful_started: AtomicBool,
    store: Arc<HistoryStore>,
    conn: Arc<ConnHistory>,
    safeguard: Option<f64>,
}

impl ControllerFactory for HistoryFactory {
    fn build(self: Arc<Self>, now: Instant, current_mtu: u16) -> Box<dyn Controller> {
        let inner = self.start.clone().build(now, current_mtu);
        let first = !self.careful_started.swap(true, Ordering::Relaxed);
        let careful = self.conn.decision.careful.filter(|_| first).map(|saved| {
            CarefulResume::new(
                saved,
                careful_resume::Params {
                    initial_window: inner.initial_window(),
                    rtt_factor: self.safeguard.unwrap_or(careful_resume::RFC_RTT_FACTOR),
                    min_window: 2 * u64::from(current_mtu),
                },
            )
        });
        Box::new(Wrapped(HistoryController {
            inner,
            factory: self,
            mtu: current_mtu,
            checked: false,
            acks_ended: 0,
            rtt: Observed::default(),
            delivery: Delivery::default(),
            careful,
            published: Outcome::None,
            original: true,
        }))
    }
}

/// The most bytes a connection delivered per minimum RTT (RFC 9959 §3.1: "the volume of data
/// acknowledged in one RTT"): acknowledged bytes are counted over rounds of at least one
/// smoothed RTT and scaled to the minimum RTT, so a standing queue does not count as capacity.
#[derive(Debug, Clone, Copy, Default)]
struct Delivery {
    round_start: Option<Instant>,
    round_bytes: u64,
    best: u64,
}

impl Delivery {
    fn on_ack(&mut self, bytes: u64) {
        self.round_bytes += bytes;
    }

    /// An acknowledgement batch ended at `now`, with the connection's RTTs (µs).
    fn on_end_acks(&mut self, now: Instant, rtt: Observed) {
        let Some(start) = self.round_start else {
            self.round_start = Some(now);
            self.round_bytes = 0;
            return;
        };
        let elapsed = now.saturating_duration_since(start).as_micros() as u64;
        if rtt.min_us == 0 || elapsed < rtt.srtt_us.max(rtt.min_us) {
            return;
        }
        let per_min_rtt = (self.round_bytes as u128 * rtt.min_us as u128 / elapsed as u128) as u64;
        self.best = self.best.max(per_min_rtt);
        self.round_start = Some(now);
        self.round_bytes = 0;
    }
}

/// Delegates to the configured controller; records its window when the connection's controller
/// is dropped (the connection ended); applies the safeguard at the first RTT sample, or runs
/// careful resume (H9), whose phases own the window while they last (the controller runs in
/// the shadow, fed every event, and is rebuilt at the hand-over).
struct HistoryController {
    inner: Box<dyn Controller>,
    factory: Arc<HistoryFactory>,
    mtu: u16,
    checked: bool,
    /// ACK frames fully processed: quinn updates its RTT estimator after a frame's `on_ack`
    /// calls, so the estimator has a sample only once one has been.
    acks_ended: u64,
    /// The connection's minimum and smoothed RTTs as of the previous ACK frame (unknown until
    /// the estimator has a sample: a connection with one ACK records none).
    rtt: Observed,
    /// The capacity estimate.
    delivery: Delivery,
    /// Careful resume, when the history decided on it.
    careful: Option<CarefulResume>,
    /// The outcome last published to [`ConnHistory`].
    published: Outcome,
    /// Copies made by `clone_box` (quinn's `congestion_state()`) do not record.
    original: bool,
}

impl HistoryController {
    /// A careful phase ended: the controller takes over at the hand-over's window, given its
    /// congestion event if there is one (RFC 9959 §3.5: its own decrease from the pipe size).
    fn hand_over(&mut self, now: Instant, h: Handover) {
        tracing::debug!(
            target: LOG_TARGET,
            peer = %self.factory.conn.peer,
            window = h.window,
            congestion = ?h.congestion,
            jump = self.careful.as_ref().map(CarefulResume::jump_window),
            outcome = ?self.careful.as_ref().map(CarefulResume::outcome),
            "careful resume hands over"
        );
        let opts = TransportOptions {
            initial_window: Some(h.window),
            ..self.factory.opts.clone()
        };
        self.inner = opts.controller_factory().build(now, self.mtu);
        if let Some(persistent) = h.congestion {
            self.inner.on_congestion_event(now, now, persistent, 0);
        }
    }

    /// Publish how careful resume ended, when that changes.
    fn note_careful(&mut self) {
        let Some(c) = self.careful.as_ref().filter(|_| self.original) else {
            return;
        };
        let outcome = c.outcome();
        if outcome == self.published {
            return;
        }
        self.published = outcome;
        if matches!(outcome, Outcome::PathChanged | Outcome::Retreated) {
            self.factory.conn.fell_back.store(true, Ordering::Relaxed);
        }
        *self
            .factory
            .conn
            .careful
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = outcome;
    }
}

impl Layer for HistoryController {
    fn inner(&self) -> &dyn Controller {
        self.inner.as_ref()
    }

    fn inner_mut(&mut self) -> &mut dyn Controller {
        self.inner.as_mut()
    }

    fn copy(&self) -> HistoryController {
        HistoryController {
            inner: self.inner.clone_box(),
            factory: self.factory.clone(),
            mtu: self.mtu,
            checked: self.checked,
            acks_ended: self.acks_ended,
            rtt: self.rtt,
            delivery: self.delivery,
            careful: self.careful.clone(),
            published: self.published,
            original: false,
        }
    }

    fn on_sent(&mut self, now: Instant, bytes: u64, last_packet_number: u64) {
        self.inner.on_sent(now, bytes, last_packet_number);
        if let Some(h) = self
            .careful
            .as_mut()
            .and_then(|c| c.on_sent(now, last_packet_number))
        {
            self.hand_over(now, h);
            self.note_careful();
        }
    }

    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        rtt: &RttEstimator,
    ) {
        if self.acks_ended > 0 {
            self.rtt = Observed {
                min_us: rtt.min().as_micros() as u64,
                srtt_us: rtt.get().as_micros() as u64,
                capacity: 0,
            };
        }
        self.delivery.on_ack(bytes);
        if let Some(c) = &mut self.careful {
            c.on_ack(now, sent, bytes, app_limited);
        }
        // Careful resume checks the path itself (reconnaissance).
        if !self.checked && self.careful.is_none() {
            self.checked = true;
            let f = &self.factory;
            if let Some(factor) = f.safeguard {
                let d = f.conn.decision;
                // Careful resume: the first acknowledged packet's RTT validates the history's
                // path. (quinn's estimator still reports its configured initial RTT until its
                // first sample, so the packet's own send → ack time is used.)
                let sample = now.saturating_duration_since(sent).as_micros() as u64;
                if d.from_history && path_changed(d.reference_rtt_us, sample, factor) {
                    self.inner = f.fallback.clone().build(now, self.mtu);
                    f.conn.fell_back.store(true, Ordering::Relaxed);
                    tracing::debug!(target: LOG_TARGET, peer = %f.conn.peer, "path slower than its history: default window");
                }
            }
        }
        self.inner.on_ack(now, sent, bytes, app_limited, rtt)
    }

    fn on_end_acks(
        &mut self,
        now: Instant,
        in_flight: u64,
        app_limited: bool,
        largest: Option<u64>,
    ) {
        self.acks_ended += 1;
        self.delivery.on_end_acks(now, self.rtt);
        self.inner.on_end_acks(now, in_flight, app_limited, largest);
        let srtt = std::time::Duration::from_micros(self.rtt.srtt_us);
        let before = self.careful.as_ref().map(CarefulResume::phase);
        let own = self.inner.window();
        if let Some(h) = self
            .careful
            .as_mut()
            .and_then(|c| c.on_end_acks(now, in_flight, largest, own, srtt))
        {
            self.hand_over(now, h);
        }
        if let Some(c) = self.careful.as_ref().filter(|c| Some(c.phase()) != before) {
            tracing::debug!(
                target: LOG_TARGET,
                peer = %self.factory.conn.peer,
                phase = ?c.phase(),
                window = self.window(),
                in_flight,
                srtt_us = self.rtt.srtt_us,
                "careful resume"
            );
        }
        self.note_careful();
    }

    fn on_congestion_event(
        &mut self,
        now: Instant,
        sent: Instant,
        persistent: bool,
        lost_bytes: u64,
    ) {
        self.inner
            .on_congestion_event(now, sent, persistent, lost_bytes);
        if let Some(h) = self
            .careful
            .as_mut()
            .and_then(|c| c.on_congestion(persistent))
        {
            self.hand_over(now, h);
        }
        self.note_careful();
    }

    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.mtu = new_mtu;
        self.inner.on_mtu_update(new_mtu)
    }

    fn window(&self) -> u64 {
        self.careful
            .as_ref()
            .and_then(CarefulResume::window)
            .unwrap_or_else(|| self.inner.window())
    }

    fn metrics(&self) -> quinn::congestion::ControllerMetrics {
        let mut m = self.inner.metrics();
        m.congestion_window = self.window();
        m
    }
}

impl Drop for HistoryController {
    fn drop(&mut self) {
        if self.original {
            // Paper 002 Algorithm 1: record the window when a connection closes.
            let f = &self.factory;
            let seen = Observed {
                capacity: self.delivery.best,
                ..self.rtt
            };
            f.store.record(&f.conn.peer, self.window(), seen);
        }
    }
}

/// Record the live window of `conn` for `peer` now — for the paper's second recording point,
/// when a 0-RTT resumption completes its handshake.
pub fn record_now(store: &HistoryStore, peer: &str, conn: &quinn::Connection) -> Entry {
    let s = conn.stats();
    let rtt = conn.rtt().as_micros() as u64;
    store.record(
        peer,
        s.path.cwnd,
        Observed {
            min_us: rtt,
            srtt_us: rtt,
            capacity: 0,
        },
    )
}

/// A client's history key for a server.
pub fn client_peer_key(server_name: &str, addr: std::net::SocketAddr) -> String {
    format!("{server_name}@{addr}")
}

/// A server's history key for a client.
pub fn server_peer_key(addr: std::net::SocketAddr) -> String {
    addr.ip().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_older_ones_read_without_the_newer_fields() {
        let e = Entry {
            avg_cwnd: 123_456.5,
            count: 7,
            min_rtt_us: 20_000,
            srtt_us: 31_000,
            capacity: 250_000.25,
            recent_rtt_us: 22_000,
            updated_ms: 1_700_000_000_000,
            used_ms: 1_700_000_000_001,
        };
        assert_eq!(decode(&encode(&e)), Some(e));
        // Stores written before the capacity (48 bytes) and the smoothed RTT (40) were kept.
        let unknown = Entry {
            capacity: 0.0,
            recent_rtt_us: 0,
            ..e
        };
        assert_eq!(decode(&encode(&e)[..48]), Some(unknown));
        assert_eq!(
            decode(&encode(&e)[..40]),
            Some(Entry {
                srtt_us: 0,
                ..unknown
            })
        );
        assert_eq!(decode(&encode(&e)[..47]), None);
        assert_eq!(decode(&encode(&e)[..56]), None);
        let mut bad = encode(&e);
        bad[48..56].copy_from_slice(&f64::NAN.to_le_bytes());
        assert_eq!(
            decode(&bad),
            None,
            "a capacity that is not a number is corrupt"
        );
    }

    #[test]
    fn the_seed_is_the_last_smoothed_rtt_within_its_bounds() {
        let opts = TransportOptions::default(); // 333 ms configured
        let seed = |srtt_ms: u64, min_ms: u64, opts: &TransportOptions| {
            let d = Decision {
                window: 14_720,
                from_history: false,
                reference_rtt_us: min_ms * 1000,
                initial_rtt_us: srtt_ms * 1000,
                careful: None,
            };
            seeded_rtt_ms(&d, opts)
        };
        assert_eq!(seed(0, 40, &opts), None, "no smoothed RTT: no seed");
        assert_eq!(seed(42, 40, &opts), Some(42.0));
        assert_eq!(
            seed(1, 1, &opts),
            Some(MIN_SEEDED_RTT_MS),
            "a LAN's RTT is raised"
        );
        // Queueing of the last connection: at most max(333 ms, 4 × its smallest RTT).
        assert_eq!(seed(1_700, 50, &opts), Some(333.0));
        assert_eq!(seed(1_700, 200, &opts), Some(800.0));
        // A declared slow link's floor (T6) still applies; the one-minute cap too.
        let slow = TransportOptions {
            link_kbps: Some(8.0),
            ..Default::default()
        };
        assert!(seed(42, 40, &slow).unwrap() >= slow.initial_rtt_floor_ms());
        // A configured initial RTT under the floor (a LAN) is the floor instead.
        let lan = TransportOptions {
            initial_rtt_ms: 5.0,
            ..Default::default()
        };
        assert_eq!(seed(1, 1, &lan), Some(5.0));
        assert_eq!(seed(8, 4, &lan), Some(8.0));
        assert_eq!(seed(900_000, 900_000, &opts), Some(60_000.0));
    }
}
