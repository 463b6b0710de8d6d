//! The chunks of qgate's two-ended upload, sans-IO: used by both ends, qgate-upload (the
//! client's lanes) and qgate-server (the receiver), and by the CLI and the lab.
//!
//! Multi-homed two-ended upload (paper 001): the file's layout in chunks, the sans-IO chunk
//! planner, and the HTTP/3 protocol values both ends read and write (parse untrusted bytes,
//! emit, in one place).
//!
//! The protocol (decision U1), on any HTTP/3 connection to `qgate server`:
//! - `POST /upload/<name>` with [`SIZE_HEADER`], [`CHUNK_HEADER`] and [`SHA256_HEADER`]
//!   announces the file; the answer's [`HELD_HEADER`] says which chunks the server already
//!   holds durably ([`Held`], `200`), or the file is complete (`201`).
//! - `PUT /upload/<name>/<index>` with the same three headers carries chunk `index` (bytes
//!   `index × chunk .. min((index + 1) × chunk, size)`); `200` once written at its offset, `201`
//!   when it was the last one and the whole file is verified and durable.

pub mod planner;

#[cfg(test)]
mod tests;

use std::fmt;

pub use planner::{Direction, PlanError, Planner, MAX_LANES};

/// The file's size in bytes.
pub const SIZE_HEADER: &str = "qgate-upload-size";
/// The chunk size in bytes.
pub const CHUNK_HEADER: &str = "qgate-upload-chunk";
/// The SHA-256 of the whole file, 64 lowercase hex digits.
pub const SHA256_HEADER: &str = "qgate-upload-sha256";
/// The chunks the server holds durably, on its answer to an announcement ([`Held`]).
pub const HELD_HEADER: &str = "qgate-upload-held";
/// The chunk size unless told (EXPERIMENTS.md "upload": 64 KB, *decided*).
pub const DEFAULT_CHUNK: u64 = 64 * 1024;
/// Smallest chunk size accepted.
pub const MIN_CHUNK: u64 = 1024;
/// Largest chunk size accepted (a chunk is one request body).
pub const MAX_CHUNK: u64 = 16 << 20;
/// Most chunks one file may have (the planner and the server keep a byte per chunk).
pub const MAX_CHUNKS: u64 = 1 << 24;

/// Why an upload's description was refused; the text says what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UploadError {
    /// A header is missing.
    #[error("header {0} is missing")]
    Missing(&'static str),
    /// A size or chunk header that is not a decimal number.
    #[error("header {0} must be a decimal number of bytes")]
    Number(&'static str),
    /// A chunk size out of range.
    #[error("the chunk size must be {MIN_CHUNK} to {MAX_CHUNK} bytes, not {0}")]
    Chunk(u64),
    /// Too many chunks.
    #[error("{size} bytes in chunks of {chunk} would be more than {MAX_CHUNKS} chunks: use larger chunks")]
    TooManyChunks {
        /// The file size.
        size: u64,
        /// The chunk size.
        chunk: u64,
    },
    /// The checksum is not 64 lowercase hex digits.
    #[error("header {SHA256_HEADER} must be 64 lowercase hex digits")]
    Sha256,
    /// A held-chunks list that does not parse.
    #[error("the held-chunks list must be ascending ranges like 0-4,7,9-12 below {0}")]
    Held(usize),
}

/// A file cut into chunks: chunk `i` is bytes `i × chunk .. min((i + 1) × chunk, size)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    size: u64,
    chunk: u64,
}

impl Layout {
    /// `size` bytes in chunks of `chunk` bytes (checked against [`MIN_CHUNK`], [`MAX_CHUNK`] and
    /// [`MAX_CHUNKS`]).
    pub fn new(size: u64, chunk: u64) -> Result<Layout, UploadError> {
        if !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk) {
            return Err(UploadError::Chunk(chunk));
        }
        if size.div_ceil(chunk) > MAX_CHUNKS {
            return Err(UploadError::TooManyChunks { size, chunk });
        }
        Ok(Layout { size, chunk })
    }

    /// The file size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The chunk size.
    pub fn chunk_size(&self) -> u64 {
        self.chunk
    }

    /// How many chunks (the last may be short; an empty file has none).
    pub fn chunks(&self) -> usize {
        self.size.div_ceil(self.chunk) as usize
    }

    /// Offset and length of chunk `i`, if it exists.
    pub fn range(&self, i: usize) -> Option<(u64, usize)> {
        let off = (i as u64)
            .checked_mul(self.chunk)
            .filter(|&o| o < self.size)?;
        Some((off, (self.size - off).min(self.chunk) as usize))
    }
}

/// What an upload announces about its file: size, chunk size and checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileInfo {
    /// Its chunks.
    pub layout: Layout,
    /// SHA-256 of the whole file.
    pub sha256: [u8; 32],
}

impl FileInfo {
    /// Read the three headers with `get(name)`.
    pub fn parse<'a>(get: impl Fn(&str) -> Option<&'a [u8]>) -> Result<FileInfo, UploadError> {
        let num = |h: &'static str| -> Result<u64, UploadError> {
            let v = get(h).ok_or(UploadError::Missing(h))?;
            if v.is_empty() || v.len() > 20 || !v.iter().all(u8::is_ascii_digit) {
                return Err(UploadError::Number(h));
            }
            std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or(UploadError::Number(h))
        };
        let layout = Layout::new(num(SIZE_HEADER)?, num(CHUNK_HEADER)?)?;
        let hex = get(SHA256_HEADER).ok_or(UploadError::Missing(SHA256_HEADER))?;
        Ok(FileInfo {
            layout,
            sha256: parse_sha256(hex)?,
        })
    }

    /// The three headers as (name, value).
    pub fn headers(&self) -> [(&'static str, String); 3] {
        [
            (SIZE_HEADER, self.layout.size.to_string()),
            (CHUNK_HEADER, self.layout.chunk.to_string()),
            (SHA256_HEADER, hex(&self.sha256)),
        ]
    }
}

/// 64 lowercase hex digits → 32 bytes.
pub fn parse_sha256(v: &[u8]) -> Result<[u8; 32], UploadError> {
    if v.len() != 64 {
        return Err(UploadError::Sha256);
    }
    let mut out = [0u8; 32];
    for (i, pair) in v.chunks(2).enumerate() {
        let d = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        out[i] = d(pair[0])
            .zip(d(pair[1]))
            .map(|(h, l)| h << 4 | l)
            .ok_or(UploadError::Sha256)?;
    }
    Ok(out)
}

/// Bytes as lowercase hex.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The chunks a server holds, as ascending ranges (`0-4,7,9-12`; empty: none): the body of
/// its answer to an announcement.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Held(pub Vec<(usize, usize)>);

impl Held {
    /// The ranges (inclusive) of the indices where `has(i)` is true, for `i < n`.
    pub fn from_fn(n: usize, has: impl Fn(usize) -> bool) -> Held {
        let mut out: Vec<(usize, usize)> = Vec::new();
        for i in (0..n).filter(|&i| has(i)) {
            match out.last_mut() {
                Some((_, hi)) if *hi + 1 == i => *hi = i,
                _ => out.push((i, i)),
            }
        }
        Held(out)
    }

    /// Every index held.
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().flat_map(|&(lo, hi)| lo..=hi)
    }

    /// How many indices are held.
    pub fn count(&self) -> usize {
        self.0.iter().map(|(lo, hi)| hi - lo + 1).sum()
    }

    /// Parse a list of a file of `n` chunks: ranges ascending, disjoint, below `n`.
    pub fn parse(v: &[u8], n: usize) -> Result<Held, UploadError> {
        let bad = || UploadError::Held(n);
        let text = std::str::from_utf8(v).map_err(|_| bad())?.trim();
        let mut out: Vec<(usize, usize)> = Vec::new();
        if text.is_empty() {
            return Ok(Held(out));
        }
        let num = |s: &str| -> Result<usize, UploadError> {
            if s.is_empty() || s.len() > 9 || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            s.parse().map_err(|_| bad())
        };
        for part in text.split(',') {
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (num(a)?, num(b)?),
                None => (num(part)?, num(part)?),
            };
            let after_last = out.last().is_none_or(|&(_, h)| lo > h + 1);
            if lo > hi || hi >= n || !after_last {
                return Err(bad());
            }
            out.push((lo, hi));
        }
        Ok(Held(out))
    }
}

impl fmt::Display for Held {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, &(lo, hi)) in self.0.iter().enumerate() {
            if k > 0 {
                f.write_str(",")?;
            }
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}
