//! One spooled record on disk: a frame with its length and checksum first, so a scan finds
//! where a torn or corrupted tail begins (parse/emit, smoltcp style).
//!
//! ```text
//! u32 LE  len      bytes after this 8-byte header
//! u32 LE  crc      CRC-32C of those bytes
//! u64 LE  seq      the spool's sequence number
//! u64 LE  at_ms    when it was spooled, ms since the Unix epoch (the shell's clock)
//! u8      class    0 best effort, 1 priority
//! u16 LE + bytes   owner      whose share it counts against
//! u16 LE + bytes   device     the device, as forwarded (`qgate-device`)
//! u16 LE + bytes   target     path and query it was posted to
//! u16 LE + bytes   request id its id on the wire, kept so a record sent twice is stored once
//! rest             body
//! ```

use bytes::{BufMut, Bytes};
use qgate_forward::scheduler::Priority;

use crate::crc::crc32c;

/// Bytes before a frame's content.
pub const HEADER: usize = 8;

/// A record as the spool keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its place in the spool, assigned when it was appended: order within a class.
    pub seq: u64,
    /// When it was spooled, ms since the Unix epoch.
    pub at_ms: u64,
    /// Its class.
    pub class: Priority,
    /// Whose share of the spool it counts against (the device's address without its port,
    /// until devices have identities).
    pub owner: String,
    /// The device, as forwarded to the server.
    pub device: String,
    /// The path and query it was posted to.
    pub target: String,
    /// Its request id on the wire.
    pub request_id: String,
    /// Its body.
    pub body: Bytes,
}

/// Why bytes are not a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Fewer bytes than the frame says it has: a torn write, or the end of what was written.
    #[error("truncated frame")]
    Truncated,
    /// The checksum does not match: a torn or corrupted write.
    #[error("frame checksum mismatch")]
    Checksum,
    /// The content is not a record (a field overruns the frame, a bad class, or a length past
    /// the largest frame the spool writes).
    #[error("malformed frame")]
    Malformed,
}

impl Entry {
    /// The bytes this record takes on disk, header included.
    pub fn frame_len(&self) -> usize {
        HEADER
            + 8
            + 8
            + 1
            + 2 * 4
            + self.owner.len()
            + self.device.len()
            + self.target.len()
            + self.request_id.len()
            + self.body.len()
    }

    /// Append this record's frame to `out`. Strings longer than 65,535 bytes are cut (the
    /// gateway's own limits keep them far shorter).
    pub fn emit(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.put_u32_le(0);
        out.put_u32_le(0);
        out.put_u64_le(self.seq);
        out.put_u64_le(self.at_ms);
        out.put_u8(u8::from(self.class == Priority::Priority));
        for s in [&self.owner, &self.device, &self.target, &self.request_id] {
            let b = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
            out.put_u16_le(b.len() as u16);
            out.put_slice(b);
        }
        out.put_slice(&self.body);
        let len = (out.len() - start - HEADER) as u32;
        let crc = crc32c(&out[start + HEADER..]);
        out[start..start + 4].copy_from_slice(&len.to_le_bytes());
        out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    }

    /// The record at the start of `buf` and the bytes its frame took. `max_len` bounds a
    /// frame's content, so a garbage length is malformed rather than a wait for more bytes.
    pub fn parse(buf: &Bytes, max_len: usize) -> Result<(Entry, usize), FrameError> {
        if buf.len() < HEADER {
            return Err(FrameError::Truncated);
        }
        let len = u32::from_le_bytes(buf[0..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
        if len > max_len {
            return Err(FrameError::Malformed);
        }
        if buf.len() < HEADER + len {
            return Err(FrameError::Truncated);
        }
        let content = buf.slice(HEADER..HEADER + len);
        if crc32c(&content) != crc {
            return Err(FrameError::Checksum);
        }
        let mut r = Reader {
            buf: &content,
            at: 0,
        };
        let seq = r.u64()?;
        let at_ms = r.u64()?;
        let class = match r.u8()? {
            0 => Priority::BestEffort,
            1 => Priority::Priority,
            _ => return Err(FrameError::Malformed),
        };
        let owner = r.string()?;
        let device = r.string()?;
        let target = r.string()?;
        let request_id = r.string()?;
        let body = content.slice(r.at..);
        Ok((
            Entry {
                seq,
                at_ms,
                class,
                owner,
                device,
                target,
                request_id,
                body,
            },
            HEADER + len,
        ))
    }
}

/// A cursor over a frame's content.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], FrameError> {
        let end = self.at.checked_add(n).ok_or(FrameError::Malformed)?;
        let s = self.buf.get(self.at..end).ok_or(FrameError::Malformed)?;
        self.at = end;
        Ok(s)
    }

    fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.take(1)?[0])
    }

    fn u64(&mut self) -> Result<u64, FrameError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn string(&mut self) -> Result<String, FrameError> {
        let n = u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")) as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| FrameError::Malformed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn entry(seq: u64, body: &[u8]) -> Entry {
        Entry {
            seq,
            at_ms: 1_700_000_000_000 + seq,
            class: Priority::BestEffort,
            owner: "10.0.0.1".into(),
            device: "10.0.0.1:4000".into(),
            target: "/ingest/t".into(),
            request_id: format!("gw-{seq}"),
            body: Bytes::copy_from_slice(body),
        }
    }

    #[test]
    fn a_torn_or_flipped_frame_is_told_apart() {
        let mut out = Vec::new();
        entry(7, b"hello").emit(&mut out);
        let all = Bytes::from(out.clone());
        assert_eq!(Entry::parse(&all, 1 << 20).unwrap().1, out.len());
        for cut in 0..out.len() {
            let torn = Bytes::copy_from_slice(&out[..cut]);
            assert_eq!(Entry::parse(&torn, 1 << 20), Err(FrameError::Truncated));
        }
        for i in HEADER..out.len() {
            let mut bad = out.clone();
            bad[i] ^= 0x20;
            assert_eq!(
                Entry::parse(&Bytes::from(bad), 1 << 20),
                Err(FrameError::Checksum),
                "byte {i}"
            );
        }
        assert_eq!(Entry::parse(&all, 10), Err(FrameError::Malformed));
    }

    proptest! {
        #[test]
        fn what_is_emitted_parses_back(
            seq in any::<u64>(), at in any::<u64>(), prio in any::<bool>(),
            owner in ".{0,20}", device in ".{0,30}", target in "/[a-z/]{0,30}",
            rid in "[0-9a-f-]{0,40}", body in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let e = Entry {
                seq, at_ms: at,
                class: if prio { Priority::Priority } else { Priority::BestEffort },
                owner, device, target, request_id: rid, body: Bytes::from(body),
            };
            let mut out = Vec::new();
            e.emit(&mut out);
            prop_assert_eq!(out.len(), e.frame_len());
            let (back, n) = Entry::parse(&Bytes::from(out.clone()), 1 << 20).unwrap();
            prop_assert_eq!(n, out.len());
            prop_assert_eq!(back, e);
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Entry::parse(&Bytes::from(bytes), 1 << 16);
        }
    }
}
