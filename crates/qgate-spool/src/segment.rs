//! Segment files: a class's log is a run of files, each named by the sequence number of its
//! first record, appended to and synced by group, deleted whole once every record in it is
//! done. A drained spool gives its disk back a segment at a time.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::config::MAX_RECORD;
use crate::frame::{Entry, FrameError};

/// A segment as the spool tracks it.
#[derive(Debug)]
pub struct Segment {
    /// The sequence number of its first record (its name).
    pub first_seq: u64,
    /// Its file.
    pub path: PathBuf,
    /// Bytes written and synced: a reader never reads past them.
    pub len: u64,
    /// Records in it.
    pub records: u64,
    /// Records done with (delivered, refused, expired, dropped or purged).
    pub done: u64,
    /// When its first record was spooled, ms since the Unix epoch.
    pub first_at_ms: u64,
}

impl Segment {
    /// Whether every record in it is done with.
    pub fn finished(&self) -> bool {
        self.done >= self.records
    }
}

/// The file name of the segment starting at `first_seq`.
pub fn file_name(first_seq: u64) -> String {
    format!("{first_seq:020}.seg")
}

/// The first sequence number a segment file's name gives, if it is one.
pub fn parse_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".seg")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// A segment's records read at start: each record's frame length is given to `each`; the
/// length of the good frames and, if the file goes on past them, why it stops there.
pub fn scan(
    path: &Path,
    mut each: impl FnMut(&Entry, u64),
) -> std::io::Result<(u64, Option<FrameError>)> {
    let mut data = Vec::new();
    File::open(path)?.read_to_end(&mut data)?;
    let data = Bytes::from(data);
    let mut at = 0usize;
    while at < data.len() {
        match Entry::parse(&data.slice(at..), MAX_RECORD) {
            Ok((e, n)) => {
                each(&e, n as u64);
                at += n;
            }
            Err(e) => return Ok((at as u64, Some(e))),
        }
    }
    Ok((at as u64, None))
}

/// The frames in `data` (a read from a segment starting at a frame boundary): the records and
/// their frame lengths, and whether the bytes stopped at a bad frame rather than the end.
pub fn frames(data: &Bytes) -> (Vec<(Entry, u64)>, usize, Option<FrameError>) {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < data.len() {
        match Entry::parse(&data.slice(at..), MAX_RECORD) {
            Ok((e, n)) => {
                out.push((e, n as u64));
                at += n;
            }
            Err(FrameError::Truncated) => return (out, at, None),
            Err(e) => return (out, at, Some(e)),
        }
    }
    (out, at, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_strangers_are_ignored() {
        assert_eq!(parse_name(&file_name(42)), Some(42));
        assert_eq!(parse_name(&file_name(u64::MAX)), Some(u64::MAX));
        for n in [
            "42.seg",
            "cursor",
            "000000000000000000x1.seg",
            "+0000000000000000001.seg",
        ] {
            assert_eq!(parse_name(n), None, "{n}");
        }
    }
}
