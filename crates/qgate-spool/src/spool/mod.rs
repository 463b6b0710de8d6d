//! The spool: two append-only logs (priority, best effort) of segment files on the gateway's
//! disk, written by group commit, read back oldest first, and given back to the disk a
//! segment at a time (decision K1).
//!
//! A record is answered as stored only after its frame is synced (`append` returns). Disk work
//! runs on the blocking pool, never on a runtime thread, unless the spool is given a runner (a
//! simulation in virtual time runs it in place, so one seed gives one result: decision U12).
//!
//! A record taken to be sent ([`Spool::take`]) is in flight until the shell says it is
//! [`finish`](Spool::finish)ed or gives it [`back`](Spool::back); a record given back is taken
//! again first. After a crash everything not known to be done is sent again under its request
//! id, which the server stores once.
//!
//! - [`open`]: opening a spool, reading what an earlier run left.
//! - [`write`]: appends, group-committed.
//! - [`read`]: taking records oldest first, and their ends (finished, given back, expired).
//! - [`purges`]: purging a device's or a class's records.
//! - [`view`]: the spool seen from outside.

mod open;
mod purges;
mod read;
mod view;
mod write;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use qgate_core::sync::lock;
use qgate_forward::scheduler::Priority;
use tokio::sync::oneshot;

use crate::config::SpoolConfig;
use crate::frame::Entry;
use crate::ledger::{class_index, Ledger};
use crate::segment::Segment;
use crate::stats::SpoolStats;

pub use view::{ClassView, DeviceView, SpoolView};

/// How long the spool stays off after a disk error before it tries again.
const BROKEN_FOR: Duration = Duration::from_secs(10);

/// The classes in the order they drain.
pub const CLASSES: [Priority; 2] = [Priority::Priority, Priority::BestEffort];

/// Why a record was not spooled.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpoolError {
    /// The spool is full (and its class refuses when full).
    #[error("the gateway's spool is full")]
    Full,
    /// Its device holds its whole share of the spool.
    #[error("this device holds its whole share of the gateway's spool")]
    Share,
    /// Larger than the spool or a device's share of it could ever hold.
    #[error("too large for the gateway's spool")]
    TooLarge,
    /// The spool is off: its disk failed, or keeps too little free.
    #[error("the gateway's spool is unavailable: {0}")]
    Unavailable(String),
}

/// How a taken record ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Done {
    /// The server has it.
    Delivered,
    /// The server refused it for good.
    Rejected,
}

/// A record to spool, as the shell has it.
#[derive(Debug, Clone)]
pub struct NewRecord {
    /// Its class.
    pub class: Priority,
    /// Whose share it counts against.
    pub owner: String,
    /// The device, as forwarded.
    pub device: String,
    /// Its path and query.
    pub target: String,
    /// Its request id on the wire.
    pub request_id: String,
    /// Its body.
    pub body: Bytes,
}

/// One class's log.
#[derive(Debug)]
struct Log {
    dir: PathBuf,
    segments: VecDeque<Segment>,
    /// The segment being appended to, by its first sequence number.
    tail: Option<u64>,
    /// Where the next read starts: a segment and an offset in it.
    read: (u64, u64),
    /// The last sequence number read.
    last_read: Option<u64>,
    /// Records below this were done before a restart: skipped when read.
    done_below: u64,
    /// Records given back, taken again first (oldest first).
    retry: BTreeMap<u64, Entry>,
    in_flight: BTreeSet<u64>,
    /// The lowest sequence number not done, as last written to its `cursor` file.
    cursor_written: u64,
}

impl Log {
    fn segment_mut(&mut self, seq: u64) -> Option<&mut Segment> {
        let i = self.segments.partition_point(|s| s.first_seq <= seq);
        self.segments.get_mut(i.checked_sub(1)?)
    }

    /// The lowest sequence number that may not be done: what a restart must send again.
    fn cursor(&self) -> u64 {
        let read = self.last_read.map_or(0, |s| s + 1);
        [
            self.in_flight.first().copied(),
            self.retry.keys().next().copied(),
        ]
        .into_iter()
        .flatten()
        .fold(read, u64::min)
    }
}

/// A purge: `owner`'s records of `class` below `below` are skipped, already uncounted.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Purge {
    class: Priority,
    owner: String,
    below: u64,
}

#[derive(Debug)]
struct Pending {
    entry: Entry,
    tx: oneshot::Sender<Result<u64, SpoolError>>,
}

#[derive(Debug)]
struct State {
    ledger: Ledger,
    logs: [Log; 2],
    next_seq: u64,
    pending: Vec<Pending>,
    /// Why the spool is off, and from when (ms).
    broken: Option<(String, u64)>,
    purges: Vec<Purge>,
}

impl State {
    fn purged(&self, e: &Entry) -> bool {
        self.purges
            .iter()
            .any(|p| p.class == e.class && e.seq < p.below && p.owner == e.owner)
    }
}

/// The segment a flush appends to.
#[derive(Debug)]
struct Tail {
    file: File,
    first_seq: u64,
    len: u64,
}

/// What a flush did to a class's log.
#[derive(Debug)]
enum Wrote {
    Opened {
        class: Priority,
        first_seq: u64,
        path: PathBuf,
        at_ms: u64,
    },
    Appended {
        class: Priority,
        first_seq: u64,
        bytes: u64,
        records: u64,
    },
}

#[derive(Debug)]
struct Inner {
    cfg: SpoolConfig,
    state: Mutex<State>,
    /// The segments being appended to: used by the one flush under way.
    tails: Mutex<[Option<Tail>; 2]>,
    flushing: AtomicBool,
    /// One reader per class at a time.
    readers: [tokio::sync::Mutex<()>; 2],
    stats: SpoolStats,
    /// The directory's lock, held while the spool is open: one gateway per spool.
    _lock: File,
    /// Where its disk work runs: tokio's blocking pool unless given (U12).
    disk: Option<Arc<dyn qgate_core::disk::DiskRunner>>,
}

/// The spool. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Spool {
    inner: Arc<Inner>,
}

fn class_dir(c: Priority) -> &'static str {
    match c {
        Priority::Priority => "priority",
        Priority::BestEffort => "best-effort",
    }
}

impl Spool {
    /// Its counters.
    pub fn stats(&self) -> &SpoolStats {
        &self.inner.stats
    }

    /// Its settings.
    pub fn config(&self) -> &SpoolConfig {
        &self.inner.cfg
    }

    /// Whether `owner` holds records of `class`: its new ones must queue behind them, so the
    /// server gets a device's records in the order it sent them.
    pub fn holds(&self, owner: &str, class: Priority) -> bool {
        lock(&self.inner.state).ledger.owner(owner)[class_index(class)].records > 0
    }

    /// Whether anything of `class` waits to be taken (held and not in flight).
    pub fn waiting(&self, class: Priority) -> bool {
        let s = lock(&self.inner.state);
        let log = &s.logs[class_index(class)];
        s.ledger.class(class).records > log.in_flight.len() as u64
    }

    /// Records of all classes in flight.
    pub fn in_flight(&self) -> usize {
        let s = lock(&self.inner.state);
        s.logs.iter().map(|l| l.in_flight.len()).sum()
    }

    /// Why the spool is off at `now_ms`, if it is (it tries its disk again once the pause
    /// after a failure is over).
    pub fn unavailable(&self, now_ms: u64) -> Option<String> {
        lock(&self.inner.state)
            .broken
            .as_ref()
            .filter(|(_, at)| now_ms < at.saturating_add(BROKEN_FOR.as_millis() as u64))
            .map(|b| b.0.clone())
    }

    fn count(&self, f: impl Fn(&SpoolStats) -> &std::sync::atomic::AtomicU64) {
        f(&self.inner.stats).fetch_add(1, Ordering::Relaxed);
    }

    fn refresh(&self, s: &State) {
        let st = &self.inner.stats;
        st.held_priority.store(
            s.ledger.class(Priority::Priority).records,
            Ordering::Relaxed,
        );
        st.held_best_effort.store(
            s.ledger.class(Priority::BestEffort).records,
            Ordering::Relaxed,
        );
        st.held_bytes
            .store(s.ledger.total().bytes, Ordering::Relaxed);
    }
}
