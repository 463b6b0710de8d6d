//! Reading records back oldest first, and how a taken record ends: finished, given back, or
//! dropped as expired; segments given back to the disk once every record in them is done.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use bytes::Bytes;
use qgate_core::sync::lock;
use qgate_forward::scheduler::Priority;

use crate::frame::{Entry, HEADER};
use crate::ledger::class_index;
use crate::segment;

use super::{Done, Log, Spool, State, CLASSES};

/// Bytes read from a segment at a time when draining.
const READ_CHUNK: u64 = 256 << 10;

impl Spool {
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
    pub(super) fn admit_taken(
        &self,
        s: &mut State,
        e: Entry,
        now_ms: u64,
        max_age: u64,
    ) -> Option<Entry> {
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
    pub(super) fn consume(&self, s: &mut State, e: &Entry, counter: &std::sync::atomic::AtomicU64) {
        if s.purged(e) {
            self.consume_uncounted(s, e);
            return;
        }
        counter.fetch_add(1, Ordering::Relaxed);
        s.ledger.remove(&e.owner, e.class, e.frame_len() as u64);
        self.consume_uncounted(s, e);
    }

    /// Done with `e`, already uncounted (purged).
    pub(super) fn consume_uncounted(&self, s: &mut State, e: &Entry) {
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
}

/// The next range of committed bytes to read in `log`, moving past segments read to their
/// end: the file, its first sequence number, and the range.
pub(super) fn next_range(log: &mut Log) -> Option<(PathBuf, u64, u64, u64)> {
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
pub(super) fn remove_segment(log: &mut Log, first: u64) {
    if let Some(i) = log.segments.iter().position(|s| s.first_seq == first) {
        let seg = log.segments.remove(i).expect("found");
        if let Err(e) = std::fs::remove_file(&seg.path) {
            tracing::warn!(target: "qgate_spool", segment = %seg.path.display(), error = %e, "could not remove a drained spool segment");
        }
    }
}

/// Read whole frames from `offset` up to `end` in `path` (a chunk, or one larger frame).
#[allow(clippy::type_complexity)]
pub(super) fn read_frames(
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
