//! Segment files: a class's log is a run of files, each named by the sequence number of its
//! first record, appended to and synced by group, deleted whole once every record in it is
//! done. A drained spool gives its disk back a segment at a time.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::config::MAX_RECORD;
use crate::frame::{Entry, FrameError, HEADER};

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
///
/// Read a frame at a time, so what a scan holds is one record, whatever the segment's size.
pub fn scan(
    path: &Path,
    mut each: impl FnMut(&Entry, u64),
) -> std::io::Result<(u64, Option<FrameError>)> {
    let mut r = std::io::BufReader::with_capacity(64 << 10, File::open(path)?);
    let mut at = 0u64;
    loop {
        let mut header = [0u8; HEADER];
        match read_full(&mut r, &mut header)? {
            0 => return Ok((at, None)),
            n if n < HEADER => return Ok((at, Some(FrameError::Truncated))),
            _ => {}
        }
        let len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes")) as usize;
        if len > MAX_RECORD {
            return Ok((at, Some(FrameError::Malformed)));
        }
        let mut frame = vec![0u8; HEADER + len];
        frame[..HEADER].copy_from_slice(&header);
        if read_full(&mut r, &mut frame[HEADER..])? < len {
            return Ok((at, Some(FrameError::Truncated)));
        }
        match Entry::parse(&Bytes::from(frame), MAX_RECORD) {
            Ok((e, n)) => {
                each(&e, n as u64);
                at += n as u64;
            }
            Err(e) => return Ok((at, Some(e))),
        }
    }
}

/// Fill `buf` from `r` unless the file ends first; the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
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
