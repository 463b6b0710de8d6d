//! Appends: a record is queued, written with others in one group and synced; only then is it
//! answered as stored.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use qgate_core::sync::lock;
use qgate_forward::scheduler::Priority;
use tokio::sync::oneshot;

use crate::config::MAX_RECORD;
use crate::frame::{Entry, HEADER};
use crate::ledger::{class_index, Admit, Refusal};
use crate::segment::{self, Segment};

use super::read::remove_segment;
use super::{
    class_dir, Inner, NewRecord, Pending, Spool, SpoolError, State, Tail, Wrote, BROKEN_FOR,
    CLASSES,
};

/// Bytes a group commit writes at most (one record more if a single record is larger): what
/// the spool holds in memory however much is waiting.
const GROUP_BYTES: u64 = 1 << 20;

impl Spool {
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

    /// Drop the oldest best-effort record to make room; whether there was one.
    pub(super) async fn drop_oldest(&self, now_ms: u64) -> bool {
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
}

/// Write what waits, a group at a time, until nothing does.
pub(super) async fn flush(inner: Arc<Inner>) {
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

pub(super) fn apply(s: &mut State, ev: Wrote) {
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
pub(super) struct Written {
    events: Vec<Wrote>,
    stored: Vec<bool>,
    error: Option<std::io::Error>,
}

/// Write `entries` (in sequence order) to their classes' tails, rolling to new segments as
/// they fill, and sync each run of records written to one file: an entry is stored once its
/// run is synced, and only then. A failure stops its class; the other class goes on. Blocking.
pub(super) fn write_group(inner: &Inner, entries: &[Entry]) -> Written {
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
pub(super) fn write_class(
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
