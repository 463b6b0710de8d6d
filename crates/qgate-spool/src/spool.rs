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

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use qgate_core::sync::lock;
use qgate_forward::scheduler::Priority;
use tokio::sync::oneshot;

use crate::config::{SpoolConfig, MAX_RECORD};
use crate::frame::{Entry, HEADER};
use crate::ledger::{class_index, Admit, Held, Ledger, Refusal};
use crate::segment::{self, Segment};
use crate::stats::SpoolStats;

/// Bytes read from a segment at a time when draining.
const READ_CHUNK: u64 = 256 << 10;

/// Bytes a group commit writes at most (one record more if a single record is larger): what
/// the spool holds in memory however much is waiting.
const GROUP_BYTES: u64 = 1 << 20;

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

/// What the spool holds in one class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClassView {
    /// Records and bytes held.
    pub held: Held,
    /// Records taken and not yet finished.
    pub in_flight: u64,
    /// When the oldest segment holding undone records began, ms since the Unix epoch.
    pub oldest_at_ms: Option<u64>,
}

/// One device's holding.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeviceView {
    /// Its owner key (the device's address without its port).
    pub owner: String,
    /// Priority records and bytes.
    pub priority: Held,
    /// Best-effort records and bytes.
    pub best_effort: Held,
}

/// The spool seen from outside: depth by class and device.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SpoolView {
    /// Its directory.
    pub dir: String,
    /// Why it is off, if it is.
    pub unavailable: Option<String>,
    /// Priority's holding.
    pub priority: ClassView,
    /// Best effort's holding.
    pub best_effort: ClassView,
    /// The devices holding most bytes, most first (at most 100).
    pub devices: Vec<DeviceView>,
    /// Bytes held at most.
    pub max_bytes: u64,
    /// Records held at most.
    pub max_records: u64,
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
    /// Open the spool in `cfg.dir` (made if missing) and lock it for this process, reading what
    /// an earlier run left: a torn or corrupted tail is cut at its last good record, a cursor or
    /// purge list that cannot be right is ignored (everything is sent again), each logged and
    /// counted. Refused only if the directory cannot be made, locked or listed. Blocking (it
    /// reads every segment once): call it at start.
    pub fn open(cfg: SpoolConfig) -> std::io::Result<Spool> {
        Spool::open_with(cfg, None)
    }

    /// [`open`](Self::open), its disk work run by `disk` (a simulation in virtual time runs it
    /// in place, decision U12).
    pub fn open_with(
        cfg: SpoolConfig,
        disk: Option<Arc<dyn qgate_core::disk::DiskRunner>>,
    ) -> std::io::Result<Spool> {
        std::fs::create_dir_all(&cfg.dir)?;
        let lock_file = lock_dir(&cfg.dir)?;
        let stats = SpoolStats::default();
        let mut ledger = Ledger::new(cfg.limits);
        let purges = read_purges(&cfg.dir.join("purges"));
        let mut next_seq = 0u64;
        let mut logs = Vec::new();
        for c in [Priority::BestEffort, Priority::Priority] {
            let dir = cfg.dir.join(class_dir(c));
            std::fs::create_dir_all(&dir)?;
            let mut cursor = read_cursor(&dir.join("cursor"));
            let mut loaded = load_class(&dir, c, cursor, &purges, &stats)?;
            match loaded.max_seq {
                // A cursor past every record written cannot be right: trusted, it would take
                // every record for done.
                Some(m) if cursor > m + 1 => {
                    stats.torn.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        target: "qgate_spool",
                        class = class_dir(c), cursor, last = m,
                        "spool cursor is past every record: ignored, everything held is sent again"
                    );
                    cursor = 0;
                    loaded = load_class(&dir, c, 0, &purges, &stats)?;
                }
                Some(_) => {}
                // Nothing held: a stale cursor must not hide the records to come.
                None => {
                    if cursor != 0 {
                        if let Err(e) = std::fs::remove_file(dir.join("cursor")) {
                            tracing::warn!(target: "qgate_spool", error = %e, "could not remove an old spool cursor");
                        }
                    }
                    cursor = 0;
                }
            }
            next_seq = next_seq.max(loaded.max_seq.map_or(0, |m| m + 1));
            for (owner, held) in &loaded.held {
                ledger.add_held(owner, c, *held);
            }
            let mut segments = VecDeque::new();
            for s in loaded.segments {
                if s.finished() {
                    if let Err(e) = std::fs::remove_file(&s.path) {
                        tracing::warn!(target: "qgate_spool", segment = %s.path.display(), error = %e, "could not remove a drained spool segment");
                    }
                } else {
                    segments.push_back(s);
                }
            }
            let read = segments.front().map_or((0, 0), |s| (s.first_seq, 0));
            logs.push(Log {
                dir,
                segments,
                tail: None,
                read,
                last_read: cursor.checked_sub(1),
                done_below: cursor,
                retry: BTreeMap::new(),
                in_flight: BTreeSet::new(),
                cursor_written: cursor,
            });
        }
        let logs: [Log; 2] = logs.try_into().expect("two classes");
        // Purges below every record left have done their work; one past every record written
        // cannot be right.
        let oldest = logs
            .iter()
            .filter_map(|l| l.segments.front().map(|s| s.first_seq))
            .min()
            .unwrap_or(next_seq);
        let kept: Vec<Purge> = purges
            .iter()
            .filter(|p| p.below > oldest && p.below <= next_seq)
            .cloned()
            .collect();
        if kept != purges {
            if let Err(e) = write_purges(&cfg.dir.join("purges"), &kept) {
                tracing::warn!(target: "qgate_spool", error = %e, "could not rewrite the spool's purge list");
            }
        }
        let held = ledger.total();
        if held.records > 0 {
            tracing::info!(
                target: "qgate_spool",
                records = held.records, bytes = held.bytes, dir = %cfg.dir.display(),
                "spool holds records from an earlier run: they drain when a path is up"
            );
        }
        if let Ok(s) = rustix::fs::statvfs(&cfg.dir) {
            let free = s.f_bavail.saturating_mul(s.f_frsize);
            if free < cfg.keep_free {
                tracing::warn!(
                    target: "qgate_spool",
                    free, keep_free = cfg.keep_free, dir = %cfg.dir.display(),
                    "the spool's disk has less free than it keeps free: the spool refuses records until there is room (lower [gateway.spool] keep_free on a small disk)"
                );
            }
        }
        let spool = Spool {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    ledger,
                    logs,
                    next_seq,
                    pending: Vec::new(),
                    broken: None,
                    purges: kept,
                }),
                tails: Mutex::new([None, None]),
                flushing: AtomicBool::new(false),
                readers: [tokio::sync::Mutex::new(()), tokio::sync::Mutex::new(())],
                stats,
                _lock: lock_file,
                disk,
                cfg,
            }),
        };
        spool.refresh(&lock(&spool.inner.state));
        Ok(spool)
    }

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

    /// Spool `r` at `now_ms` (ms since the Unix epoch): its sequence number once it is on disk
    /// and synced, the moment the gateway may answer it as stored.
    pub async fn append(&self, r: NewRecord, now_ms: u64) -> Result<u64, SpoolError> {
        let mut entry = Entry {
            seq: 0,
            at_ms: now_ms,
            class: r.class,
            owner: r.owner,
            device: r.device,
            target: r.target,
            request_id: r.request_id,
            body: r.body,
        };
        let bytes = entry.frame_len() as u64;
        if bytes as usize > MAX_RECORD + HEADER {
            return Err(SpoolError::TooLarge);
        }
        let rx = loop {
            let made_room = {
                let mut s = lock(&self.inner.state);
                if let Some((why, at)) = &s.broken {
                    if now_ms < at.saturating_add(BROKEN_FOR.as_millis() as u64) {
                        let why = why.clone();
                        self.count(|st| &st.refused_unavailable);
                        return Err(SpoolError::Unavailable(why));
                    }
                    s.broken = None;
                    tracing::info!(target: "qgate_spool", "spool tries its disk again");
                }
                if !s.ledger.fits(bytes) {
                    self.count(|st| &st.refused_share);
                    return Err(SpoolError::TooLarge);
                }
                match s.ledger.admit(&entry.owner, entry.class, bytes) {
                    Admit::Yes => {
                        entry.seq = s.next_seq;
                        s.next_seq += 1;
                        let (tx, rx) = oneshot::channel();
                        s.pending.push(Pending { entry, tx });
                        break rx;
                    }
                    Admit::MakeRoom => false,
                    Admit::No(Refusal::Share) => {
                        self.count(|st| &st.refused_share);
                        return Err(SpoolError::Share);
                    }
                    Admit::No(Refusal::Full) => {
                        self.count(|st| &st.refused_full);
                        return Err(SpoolError::Full);
                    }
                }
            };
            if !made_room && !self.drop_oldest(now_ms).await {
                self.count(|st| &st.refused_full);
                return Err(SpoolError::Full);
            }
        };
        if !self.inner.flushing.swap(true, Ordering::AcqRel) {
            tokio::spawn(flush(self.inner.clone()));
        }
        rx.await
            .unwrap_or_else(|_| Err(SpoolError::Unavailable("the spool stopped".into())))
    }

    fn count(&self, f: impl Fn(&SpoolStats) -> &std::sync::atomic::AtomicU64) {
        f(&self.inner.stats).fetch_add(1, Ordering::Relaxed);
    }

    /// Drop the oldest best-effort record to make room; whether there was one.
    async fn drop_oldest(&self, now_ms: u64) -> bool {
        let taken = self.take(Priority::BestEffort, 1, u64::MAX, now_ms).await;
        let Some(e) = taken.into_iter().next() else {
            return false;
        };
        let mut s = lock(&self.inner.state);
        let c = class_index(e.class);
        s.logs[c].in_flight.remove(&e.seq);
        self.consume(&mut s, &e, &self.inner.stats.dropped);
        true
    }

    /// Up to `max` records of `class` (and about `max_bytes`), oldest first, now in flight.
    /// Records past the age limit are dropped on the way (counted as expired), and purged ones
    /// skipped.
    pub async fn take(
        &self,
        class: Priority,
        max: usize,
        max_bytes: u64,
        now_ms: u64,
    ) -> Vec<Entry> {
        let c = class_index(class);
        let _reader = self.inner.readers[c].lock().await;
        let max_age = self.inner.cfg.limits.max_age.as_millis() as u64;
        let mut out = Vec::new();
        let mut bytes = 0u64;
        loop {
            let next = {
                let mut s = lock(&self.inner.state);
                while out.len() < max && bytes < max_bytes {
                    let Some((_, e)) = s.logs[c].retry.pop_first() else {
                        break;
                    };
                    if let Some(e) = self.admit_taken(&mut s, e, now_ms, max_age) {
                        bytes += e.frame_len() as u64;
                        out.push(e);
                    }
                }
                if out.len() >= max || bytes >= max_bytes {
                    break;
                }
                next_range(&mut s.logs[c])
            };
            let Some((path, first_seq, offset, end)) = next else {
                break;
            };
            let read = qgate_core::disk::run(self.inner.disk.as_ref(), move || {
                read_frames(&path, offset, end)
            })
            .await;
            let mut s = lock(&self.inner.state);
            let (found, used, bad) = match read {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => (Vec::new(), 0, Some(e.to_string())),
                Err(e) => (Vec::new(), 0, Some(e.to_string())),
            };
            // Nothing read and nothing wrong cannot happen within synced bytes; stop rather
            // than spin if it does.
            let stuck = found.is_empty() && bad.is_none();
            let log = &mut s.logs[c];
            if log.read.0 == first_seq {
                log.read.1 = offset + used;
            }
            if let Some(why) = bad {
                // The disk changed under us: what is left of this segment cannot be read.
                self.inner.stats.torn.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    target: "qgate_spool",
                    segment = first_seq, offset = offset + used, error = %why,
                    "spool segment unreadable past this point: its remaining records are lost"
                );
                if let Some(seg) = log.segment_mut(first_seq) {
                    seg.len = offset + used;
                }
            }
            for (e, _) in found {
                if e.seq < s.logs[c].done_below {
                    continue;
                }
                s.logs[c].last_read = Some(e.seq);
                if out.len() >= max || bytes >= max_bytes {
                    s.logs[c].retry.insert(e.seq, e);
                } else if let Some(e) = self.admit_taken(&mut s, e, now_ms, max_age) {
                    bytes += e.frame_len() as u64;
                    out.push(e);
                }
            }
            self.refresh(&s);
            if stuck {
                break;
            }
        }
        out
    }

    /// A record read or taken back: in flight, or done with now (purged or expired).
    fn admit_taken(&self, s: &mut State, e: Entry, now_ms: u64, max_age: u64) -> Option<Entry> {
        if s.purged(&e) {
            self.consume_uncounted(s, &e);
            return None;
        }
        if now_ms.saturating_sub(e.at_ms) > max_age {
            self.consume(s, &e, &self.inner.stats.expired);
            return None;
        }
        s.logs[class_index(e.class)].in_flight.insert(e.seq);
        Some(e)
    }

    /// Taken records are over: the server has them, or refused them for good.
    pub fn finish(&self, done: &[Entry], how: Done) {
        let mut s = lock(&self.inner.state);
        let counter = match how {
            Done::Delivered => &self.inner.stats.drained,
            Done::Rejected => &self.inner.stats.rejected,
        };
        for e in done {
            if s.logs[class_index(e.class)].in_flight.remove(&e.seq) {
                self.consume(&mut s, e, counter);
            }
        }
        self.refresh(&s);
    }

    /// Taken records were not delivered: they are taken again first.
    pub fn back(&self, entries: Vec<Entry>) {
        let mut s = lock(&self.inner.state);
        for e in entries {
            let log = &mut s.logs[class_index(e.class)];
            if log.in_flight.remove(&e.seq) {
                log.retry.insert(e.seq, e);
            }
        }
    }

    /// Done with `e` (counted in `counter`): uncounted, and its segment given back once every
    /// record in it is done.
    fn consume(&self, s: &mut State, e: &Entry, counter: &std::sync::atomic::AtomicU64) {
        if s.purged(e) {
            self.consume_uncounted(s, e);
            return;
        }
        counter.fetch_add(1, Ordering::Relaxed);
        s.ledger.remove(&e.owner, e.class, e.frame_len() as u64);
        self.consume_uncounted(s, e);
    }

    /// Done with `e`, already uncounted (purged).
    fn consume_uncounted(&self, s: &mut State, e: &Entry) {
        let log = &mut s.logs[class_index(e.class)];
        let tail = log.tail;
        let Some(seg) = log.segment_mut(e.seq) else {
            return;
        };
        seg.done += 1;
        if seg.finished() && tail != Some(seg.first_seq) {
            let first = seg.first_seq;
            remove_segment(log, first);
        }
    }

    /// Purge what `owner` (or every device) holds in `class` (or both): skipped when read,
    /// uncounted now. Returns the records purged.
    pub async fn purge(
        &self,
        owner: Option<&str>,
        class: Option<Priority>,
    ) -> std::io::Result<u64> {
        let (purges, n) = {
            let mut s = lock(&self.inner.state);
            let below = s.next_seq;
            let owners: Vec<String> = match owner {
                Some(o) => vec![o.to_owned()],
                None => s.ledger.owners().map(|(o, _)| o.to_owned()).collect(),
            };
            let mut n = 0;
            for c in CLASSES
                .into_iter()
                .filter(|c| class.is_none_or(|k| k == *c))
            {
                for o in &owners {
                    let gone = s.ledger.forget(o, c);
                    if gone.records > 0 {
                        n += gone.records;
                        s.purges.push(Purge {
                            class: c,
                            owner: o.clone(),
                            below,
                        });
                    }
                }
            }
            self.inner.stats.purged.fetch_add(n, Ordering::Relaxed);
            self.refresh(&s);
            (s.purges.clone(), n)
        };
        let path = self.inner.cfg.dir.join("purges");
        qgate_core::disk::run(self.inner.disk.as_ref(), move || {
            write_purges(&path, &purges)
        })
        .await
        .map_err(std::io::Error::other)??;
        Ok(n)
    }

    /// Drop what has waited past the age limit, in both classes (reading from the oldest on),
    /// so expired records leave even while no path is up.
    pub async fn expire(&self, now_ms: u64) {
        for c in CLASSES {
            // Taking one drops every expired record before the first live one.
            let live = self.take(c, 1, u64::MAX, now_ms).await;
            self.back(live);
        }
    }

    /// Write each class's cursor (the lowest sequence number not done) if it moved, so a
    /// restart sends again only what may not have arrived. Not synced: a lost cursor sends
    /// more again, which the server stores once.
    pub async fn checkpoint(&self) -> std::io::Result<()> {
        let writes: Vec<(PathBuf, u64)> = {
            let mut s = lock(&self.inner.state);
            let mut w = Vec::new();
            for log in &mut s.logs {
                let cur = log.cursor();
                if cur != log.cursor_written {
                    log.cursor_written = cur;
                    w.push((log.dir.join("cursor"), cur));
                }
            }
            w
        };
        if writes.is_empty() {
            return Ok(());
        }
        qgate_core::disk::run(self.inner.disk.as_ref(), move || {
            for (path, cur) in writes {
                let tmp = path.with_extension("tmp");
                std::fs::write(&tmp, cur.to_le_bytes())?;
                std::fs::rename(&tmp, &path)?;
            }
            Ok(())
        })
        .await
        .map_err(std::io::Error::other)?
    }

    /// Depth by class and device.
    pub fn view(&self) -> SpoolView {
        let s = lock(&self.inner.state);
        let class = |c: Priority| {
            let log = &s.logs[class_index(c)];
            ClassView {
                held: s.ledger.class(c),
                in_flight: log.in_flight.len() as u64,
                oldest_at_ms: log
                    .segments
                    .iter()
                    .find(|g| !g.finished())
                    .map(|g| g.first_at_ms),
            }
        };
        let mut devices: Vec<DeviceView> = s
            .ledger
            .owners()
            .map(|(o, h)| DeviceView {
                owner: o.to_owned(),
                best_effort: h[0],
                priority: h[1],
            })
            .collect();
        devices.sort_by_key(|d| std::cmp::Reverse(d.best_effort.bytes + d.priority.bytes));
        devices.truncate(100);
        SpoolView {
            dir: self.inner.cfg.dir.display().to_string(),
            unavailable: s.broken.as_ref().map(|b| b.0.clone()),
            priority: class(Priority::Priority),
            best_effort: class(Priority::BestEffort),
            devices,
            max_bytes: self.inner.cfg.limits.max_bytes,
            max_records: self.inner.cfg.limits.max_records,
        }
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

/// The next range of committed bytes to read in `log`, moving past segments read to their
/// end: the file, its first sequence number, and the range.
fn next_range(log: &mut Log) -> Option<(PathBuf, u64, u64, u64)> {
    loop {
        let (first, offset) = log.read;
        // The segment being read, or (given back to the disk meanwhile) the next one.
        let i = log.segments.partition_point(|s| s.first_seq < first);
        let seg = log.segments.get(i)?;
        if seg.first_seq != first {
            log.read = (seg.first_seq, 0);
            continue;
        }
        if offset < seg.len {
            return Some((seg.path.clone(), seg.first_seq, offset, seg.len));
        }
        if log.tail == Some(first) {
            return None;
        }
        let next = log.segments.get(i + 1)?;
        log.read = (next.first_seq, 0);
    }
}

/// Give back the segment starting at `first`.
fn remove_segment(log: &mut Log, first: u64) {
    if let Some(i) = log.segments.iter().position(|s| s.first_seq == first) {
        let seg = log.segments.remove(i).expect("found");
        if let Err(e) = std::fs::remove_file(&seg.path) {
            tracing::warn!(target: "qgate_spool", segment = %seg.path.display(), error = %e, "could not remove a drained spool segment");
        }
    }
}

/// Read whole frames from `offset` up to `end` in `path` (a chunk, or one larger frame).
#[allow(clippy::type_complexity)]
fn read_frames(
    path: &Path,
    offset: u64,
    end: u64,
) -> std::io::Result<(Vec<(Entry, u64)>, u64, Option<String>)> {
    let mut f = File::open(path)?;
    f.seek(SeekFrom::Start(offset))?;
    let mut want = (end - offset).min(READ_CHUNK);
    let mut buf = vec![0u8; want as usize];
    f.read_exact(&mut buf)?;
    if buf.len() >= HEADER {
        // A frame larger than a chunk: read it whole.
        let len = u32::from_le_bytes(buf[0..4].try_into().expect("4 bytes")) as u64;
        let need = (HEADER as u64 + len).min(end - offset);
        if need > want {
            buf.resize(need as usize, 0);
            f.read_exact(&mut buf[want as usize..])?;
            want = need;
        }
    }
    debug_assert_eq!(buf.len() as u64, want);
    let data = Bytes::from(buf);
    let (found, used, bad) = segment::frames(&data);
    Ok((found, used as u64, bad.map(|e| e.to_string())))
}

/// Write what waits, a group at a time, until nothing does.
async fn flush(inner: Arc<Inner>) {
    loop {
        let batch: Vec<Pending> = {
            let mut s = lock(&inner.state);
            // Oldest first, up to a group's bytes; the rest waits for the next sync.
            let mut bytes = 0u64;
            let n = s
                .pending
                .iter()
                .take_while(|p| {
                    let first = bytes == 0;
                    bytes += p.entry.frame_len() as u64;
                    first || bytes <= GROUP_BYTES
                })
                .count();
            s.pending.drain(..n).collect()
        };
        if batch.is_empty() {
            inner.flushing.store(false, Ordering::Release);
            // An append may have queued after the take and seen a flush still running.
            if lock(&inner.state).pending.is_empty() || inner.flushing.swap(true, Ordering::AcqRel)
            {
                return;
            }
            continue;
        }
        let frames: Vec<Entry> = batch.iter().map(|p| p.entry.clone()).collect();
        let inner2 = inner.clone();
        let n = frames.len();
        let wrote =
            qgate_core::disk::run(inner.disk.as_ref(), move || write_group(&inner2, &frames))
                .await
                .unwrap_or_else(|e| Written {
                    events: Vec::new(),
                    stored: vec![false; n],
                    error: Some(std::io::Error::other(e)),
                });
        let mut s = lock(&inner.state);
        for ev in wrote.events {
            apply(&mut s, ev);
        }
        let why = wrote.error.map(|e| e.to_string());
        if let Some(why) = &why {
            tracing::error!(
                target: "qgate_spool",
                error = %why, dir = %inner.cfg.dir.display(),
                "spool write failed: the spool is off for {}s, devices get 503 meanwhile",
                BROKEN_FOR.as_secs()
            );
            let at = batch.iter().map(|p| p.entry.at_ms).max().unwrap_or(0);
            s.broken = Some((why.clone(), at));
        }
        for (p, stored) in batch.into_iter().zip(wrote.stored) {
            if stored {
                inner.stats.spooled.fetch_add(1, Ordering::Relaxed);
                let _ = p.tx.send(Ok(p.entry.seq));
            } else {
                s.ledger
                    .remove(&p.entry.owner, p.entry.class, p.entry.frame_len() as u64);
                inner
                    .stats
                    .refused_unavailable
                    .fetch_add(1, Ordering::Relaxed);
                let why = why.clone().unwrap_or_else(|| "not written".into());
                let _ = p.tx.send(Err(SpoolError::Unavailable(why)));
            }
        }
        Spool {
            inner: inner.clone(),
        }
        .refresh(&s);
    }
}

fn apply(s: &mut State, ev: Wrote) {
    match ev {
        Wrote::Opened {
            class,
            first_seq,
            path,
            at_ms,
        } => {
            let log = &mut s.logs[class_index(class)];
            let old = log.tail.replace(first_seq);
            log.segments.push_back(Segment {
                first_seq,
                path,
                len: 0,
                records: 0,
                done: 0,
                first_at_ms: at_ms,
            });
            if log.segments.len() == 1 {
                log.read = (first_seq, 0);
            }
            // The segment it replaces may be done with already.
            if let Some(old) = old {
                if log
                    .segments
                    .iter()
                    .any(|g| g.first_seq == old && g.finished())
                {
                    remove_segment(log, old);
                }
            }
        }
        Wrote::Appended {
            class,
            first_seq,
            bytes,
            records,
        } => {
            let log = &mut s.logs[class_index(class)];
            if let Some(seg) = log.segments.iter_mut().find(|g| g.first_seq == first_seq) {
                seg.len += bytes;
                seg.records += records;
            }
        }
    }
}

/// What a group's write did: the changes to the logs, which entries are on disk and synced,
/// and why the others are not.
struct Written {
    events: Vec<Wrote>,
    stored: Vec<bool>,
    error: Option<std::io::Error>,
}

/// Write `entries` (in sequence order) to their classes' tails, rolling to new segments as
/// they fill, and sync each run of records written to one file: an entry is stored once its
/// run is synced, and only then. A failure stops its class; the other class goes on. Blocking.
fn write_group(inner: &Inner, entries: &[Entry]) -> Written {
    let mut out = Written {
        events: Vec::new(),
        stored: vec![false; entries.len()],
        error: None,
    };
    let need: u64 = entries.iter().map(|e| e.frame_len() as u64).sum();
    if let Ok(s) = rustix::fs::statvfs(&inner.cfg.dir) {
        let free = s.f_bavail.saturating_mul(s.f_frsize);
        if free < inner.cfg.keep_free.saturating_add(need) {
            out.error = Some(std::io::Error::other(format!(
                "its disk keeps too little free ({} free, {} kept free)",
                qgate_core::units::format_bytes(free),
                qgate_core::units::format_bytes(inner.cfg.keep_free)
            )));
            return out;
        }
    }
    let mut tails = lock(&inner.tails);
    for c in CLASSES {
        let mine: Vec<usize> = (0..entries.len())
            .filter(|&i| entries[i].class == c)
            .collect();
        if mine.is_empty() {
            continue;
        }
        let slot = &mut tails[class_index(c)];
        if let Err(e) = write_class(inner, c, slot, entries, &mine, &mut out) {
            // Whatever of the failed run reached the file is cut off again, and the class's
            // next group starts a new segment: a segment the spool does not know of is never
            // appended to.
            if let Some(t) = slot.take() {
                let _ = t.file.set_len(t.len);
            }
            out.error = Some(e);
        }
    }
    out
}

/// Write class `c`'s entries (`mine`, indexes into `entries`) run by run; each run's entries
/// are marked stored once it is synced.
fn write_class(
    inner: &Inner,
    c: Priority,
    slot: &mut Option<Tail>,
    entries: &[Entry],
    mine: &[usize],
    out: &mut Written,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut i = 0;
    while i < mine.len() {
        let first = &entries[mine[i]];
        let roll = slot.as_ref().is_none_or(|t| {
            t.len > 0 && t.len + first.frame_len() as u64 > inner.cfg.segment_bytes
        });
        if roll {
            // The segment it leaves was synced with its last run.
            *slot = None;
            let dir = inner.cfg.dir.join(class_dir(c));
            let path = dir.join(segment::file_name(first.seq));
            let file = OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .open(&path)?;
            // The new file's name must survive a crash as well as its bytes.
            File::open(&dir)?.sync_all()?;
            out.events.push(Wrote::Opened {
                class: c,
                first_seq: first.seq,
                path,
                at_ms: first.at_ms,
            });
            *slot = Some(Tail {
                file,
                first_seq: first.seq,
                len: 0,
            });
        }
        let tail = slot.as_mut().expect("a tail");
        buf.clear();
        let start = i;
        while i < mine.len()
            && (i == start
                || tail.len + buf.len() as u64 + entries[mine[i]].frame_len() as u64
                    <= inner.cfg.segment_bytes)
        {
            entries[mine[i]].emit(&mut buf);
            i += 1;
        }
        tail.file.write_all(&buf)?;
        tail.file.sync_data()?;
        out.events.push(Wrote::Appended {
            class: c,
            first_seq: tail.first_seq,
            bytes: buf.len() as u64,
            records: (i - start) as u64,
        });
        tail.len += buf.len() as u64;
        for &k in &mine[start..i] {
            out.stored[k] = true;
        }
    }
    Ok(())
}

/// One class's segments as found at start.
struct Loaded {
    segments: Vec<Segment>,
    /// What each owner holds (not done, not purged).
    held: std::collections::HashMap<String, Held>,
    /// The highest sequence number found.
    max_seq: Option<u64>,
}

/// Read one class's segment files, cutting torn tails; records below `cursor` are done.
fn load_class(
    dir: &Path,
    c: Priority,
    cursor: u64,
    purges: &[Purge],
    stats: &SpoolStats,
) -> std::io::Result<Loaded> {
    let mut names: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)?
        .filter_map(|d| d.ok())
        .filter(|d| d.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|d| {
            let n = segment::parse_name(d.file_name().to_str()?)?;
            Some((n, d.path()))
        })
        .collect();
    names.sort();
    let mut out = Loaded {
        segments: Vec::new(),
        held: std::collections::HashMap::new(),
        max_seq: None,
    };
    for (first_seq, path) in names {
        let mut s = Segment {
            first_seq,
            path: path.clone(),
            len: 0,
            records: 0,
            done: 0,
            first_at_ms: 0,
        };
        let scanned = segment::scan(&path, |e, n| {
            if s.records == 0 {
                s.first_at_ms = e.at_ms;
            }
            s.records += 1;
            out.max_seq = Some(out.max_seq.map_or(e.seq, |m| m.max(e.seq)));
            let purged = purges
                .iter()
                .any(|p| p.class == e.class && e.seq < p.below && p.owner == e.owner);
            // Below the cursor: done before the restart (and skipped when read). Purged:
            // done when read, never counted.
            if e.seq < cursor {
                s.done += 1;
            } else if !purged {
                let h = out.held.entry(e.owner.clone()).or_default();
                h.records += 1;
                h.bytes += n;
            }
        });
        let (good, bad) = match scanned {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(target: "qgate_spool", segment = %path.display(), error = %e, "spool segment unreadable: skipped");
                stats.torn.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        s.len = good;
        if let Some(why) = bad {
            stats.torn.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                target: "qgate_spool",
                class = class_dir(c), segment = %path.display(), kept = good, records = s.records, error = %why,
                "spool segment cut at its last good record (a torn write or a bad disk): what followed is lost"
            );
            if let Err(e) = OpenOptions::new()
                .write(true)
                .open(&path)
                .and_then(|f| f.set_len(good))
            {
                tracing::warn!(target: "qgate_spool", segment = %path.display(), error = %e, "could not cut the spool segment (it is read up to the cut only)");
            }
        }
        out.segments.push(s);
    }
    Ok(out)
}

/// Lock `dir` for this process (`flock` on `dir/lock`): a second gateway on the same spool
/// would send and delete the first one's records.
fn lock_dir(dir: &Path) -> std::io::Result<File> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("lock"))?;
    rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(|e| {
        std::io::Error::other(format!(
            "{} is in use by another gateway ({e}): each gateway needs its own spool directory",
            dir.display()
        ))
    })?;
    Ok(f)
}

/// The cursor in `path`, 0 (send everything again) if missing or unreadable.
fn read_cursor(path: &Path) -> u64 {
    match std::fs::read(path) {
        Ok(b) if b.len() == 8 => u64::from_le_bytes(b.try_into().expect("8 bytes")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        _ => {
            tracing::warn!(target: "qgate_spool", cursor = %path.display(), "spool cursor unreadable: everything held is sent again");
            0
        }
    }
}

/// The purges in `path`; lines that are not one are ignored (their records are sent).
fn read_purges(path: &Path) -> Vec<Purge> {
    let text = match std::fs::read(path) {
        Ok(t) => String::from_utf8_lossy(&t).into_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            tracing::warn!(target: "qgate_spool", error = %e, "spool purge list unreadable: ignored");
            return Vec::new();
        }
    };
    text.lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ' ');
            let class = match it.next()? {
                "priority" => Priority::Priority,
                "best-effort" => Priority::BestEffort,
                _ => return None,
            };
            let below = it.next()?.parse().ok()?;
            let owner = it.next()?.to_owned();
            Some(Purge {
                class,
                owner,
                below,
            })
        })
        .collect()
}

fn write_purges(path: &Path, purges: &[Purge]) -> std::io::Result<()> {
    let mut text = String::new();
    for p in purges {
        text.push_str(&format!("{} {} {}\n", class_dir(p.class), p.below, p.owner));
    }
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}
