//! Opening a spool: its directory locked, each class's segments scanned and torn tails cut,
//! cursors and purges that cannot be right ignored.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use qgate_core::sync::lock;
use qgate_forward::scheduler::Priority;

use crate::config::SpoolConfig;
use crate::ledger::{Held, Ledger};
use crate::segment::{self, Segment};
use crate::stats::SpoolStats;

use super::purges::{read_purges, write_purges};
use super::{class_dir, Inner, Log, Purge, Spool, State};

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
}

/// One class's segments as found at start.
pub(super) struct Loaded {
    segments: Vec<Segment>,
    /// What each owner holds (not done, not purged).
    held: std::collections::HashMap<String, Held>,
    /// The highest sequence number found.
    max_seq: Option<u64>,
}

/// Read one class's segment files, cutting torn tails; records below `cursor` are done.
pub(super) fn load_class(
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
pub(super) fn lock_dir(dir: &Path) -> std::io::Result<File> {
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
pub(super) fn read_cursor(path: &Path) -> u64 {
    match std::fs::read(path) {
        Ok(b) if b.len() == 8 => u64::from_le_bytes(b.try_into().expect("8 bytes")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        _ => {
            tracing::warn!(target: "qgate_spool", cursor = %path.display(), "spool cursor unreadable: everything held is sent again");
            0
        }
    }
}
