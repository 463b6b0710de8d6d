//! A cursor over one packet's bytes reading the spec's data types (§1.5): integers, Variable
//! Byte Integers, length-prefixed strings and binary data. Slices are `Bytes` views of the packet,
//! so a payload or a password is never copied. Running out is [`DecodeError::Truncated`].

use bytes::{Buf, Bytes};

use crate::error::DecodeError;
use crate::varint;

pub(crate) struct Reader {
    buf: Bytes,
}

impl Reader {
    pub(crate) fn new(buf: Bytes) -> Self {
        Reader { buf }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        self.need(1)?;
        Ok(self.buf.get_u8())
    }

    pub(crate) fn u16(&mut self) -> Result<u16, DecodeError> {
        self.need(2)?;
        Ok(self.buf.get_u16())
    }

    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        self.need(4)?;
        Ok(self.buf.get_u32())
    }

    /// A packet identifier where the spec requires a non-zero one.
    pub(crate) fn packet_id(&mut self) -> Result<u16, DecodeError> {
        match self.u16()? {
            0 => Err(DecodeError::ZeroPacketId),
            id => Ok(id),
        }
    }

    pub(crate) fn varint(&mut self) -> Result<u32, DecodeError> {
        let (value, len) = varint::decode(&self.buf)?.ok_or(DecodeError::Truncated)?;
        self.buf.advance(len);
        Ok(value)
    }

    pub(crate) fn take(&mut self, len: usize) -> Result<Bytes, DecodeError> {
        self.need(len)?;
        Ok(self.buf.split_to(len))
    }

    /// Binary Data (§1.5.6): a two-byte length, then that many bytes.
    pub(crate) fn binary(&mut self) -> Result<Bytes, DecodeError> {
        let len = self.u16()?;
        self.take(usize::from(len))
    }

    /// A UTF-8 Encoded String (§1.5.4): well-formed UTF-8 (which excludes surrogates) without
    /// U+0000. The other code points the spec says SHOULD NOT appear are accepted.
    pub(crate) fn string(&mut self) -> Result<String, DecodeError> {
        let raw = self.binary()?;
        let text = std::str::from_utf8(&raw).map_err(|_| DecodeError::InvalidUtf8)?;
        if text.contains('\0') {
            return Err(DecodeError::InvalidUtf8);
        }
        Ok(text.to_owned())
    }

    /// Everything left: the payload of a PUBLISH or a will.
    pub(crate) fn rest(&mut self) -> Bytes {
        self.buf.split_off(0)
    }

    /// Ends the packet: bytes left over are malformed.
    pub(crate) fn finish(self) -> Result<(), DecodeError> {
        match self.buf.len() {
            0 => Ok(()),
            n => Err(DecodeError::TrailingBytes(n)),
        }
    }

    fn need(&self, len: usize) -> Result<(), DecodeError> {
        if self.buf.len() < len {
            return Err(DecodeError::Truncated);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_string_example_reads() {
        // §1.5.4, Figure 1-1: "A𪛔" (U+0041, U+2A6D4).
        let mut r = Reader::new(Bytes::from_static(&[
            0x00, 0x05, 0x41, 0xF0, 0xAA, 0x9B, 0x94,
        ]));
        assert_eq!(r.string().as_deref(), Ok("A\u{2A6D4}"));
        assert!(r.finish().is_ok());
    }

    #[test]
    fn strings_refuse_nul_surrogates_and_short_reads() {
        let nul = [0x00, 0x02, b'a', 0x00];
        assert_eq!(
            Reader::new(Bytes::copy_from_slice(&nul)).string(),
            Err(DecodeError::InvalidUtf8)
        );
        // U+D800 encoded as if it were a scalar value.
        let surrogate = [0x00, 0x03, 0xED, 0xA0, 0x80];
        assert_eq!(
            Reader::new(Bytes::copy_from_slice(&surrogate)).string(),
            Err(DecodeError::InvalidUtf8)
        );
        let short = [0x00, 0x04, b'a'];
        assert_eq!(
            Reader::new(Bytes::copy_from_slice(&short)).string(),
            Err(DecodeError::Truncated)
        );
    }
}
