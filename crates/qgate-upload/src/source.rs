//! Where the uploaded bytes come from: positional reads (paper 001 Alg. 1 `pread`), so a lane
//! reads each chunk when it sends it and the device never holds the file.

use std::io;
use std::os::unix::fs::FileExt;

use bytes::Bytes;

/// Bytes read at an offset.
pub trait Source: Send + Sync + 'static {
    /// `len` bytes at `offset` (the caller stays within the file).
    fn read_at(&self, offset: u64, len: usize) -> io::Result<Bytes>;
}

impl Source for std::fs::File {
    fn read_at(&self, offset: u64, len: usize) -> io::Result<Bytes> {
        let mut buf = vec![0u8; len];
        self.read_exact_at(&mut buf, offset)?;
        Ok(buf.into())
    }
}

impl Source for Bytes {
    fn read_at(&self, offset: u64, len: usize) -> io::Result<Bytes> {
        let start = usize::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
        let end = start.checked_add(len).filter(|&e| e <= self.len());
        match end {
            Some(end) => Ok(self.slice(start..end)),
            None => Err(io::ErrorKind::UnexpectedEof.into()),
        }
    }
}

/// SHA-256 of `size` bytes of `source`, read in 1 MiB blocks; `progress(done)` after each.
pub fn sha256(
    source: &dyn Source,
    size: u64,
    mut progress: impl FnMut(u64),
) -> io::Result<[u8; 32]> {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut at = 0u64;
    while at < size {
        let n = (size - at).min(1 << 20) as usize;
        ctx.update(&source.read_at(at, n)?);
        at += n as u64;
        progress(at);
    }
    Ok(ctx.finish().as_ref().try_into().expect("32 bytes"))
}
