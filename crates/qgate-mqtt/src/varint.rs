//! The Variable Byte Integer (spec §1.5.5): seven bits a byte, least significant group first,
//! the top bit saying another byte follows; at most four bytes, so at most 268 435 455.

use bytes::BufMut;

use crate::error::{DecodeError, EncodeError};

/// The largest value four bytes hold.
pub const MAX: u32 = 268_435_455;

/// Reads a Variable Byte Integer from the start of `buf`: `Ok(None)` when `buf` ends before its
/// last byte (read more), otherwise the value and how many bytes it took. A fifth byte, or a
/// longer form than the value needs, is an error: both are malformed, and refusing the second
/// keeps one value to one encoding.
pub fn decode(buf: &[u8]) -> Result<Option<(u32, usize)>, DecodeError> {
    let mut value = 0u32;
    for (i, &byte) in buf.iter().enumerate() {
        if i == 4 {
            return Err(DecodeError::InvalidVarint);
        }
        value |= u32::from(byte & 0x7F) << (7 * i);
        if byte & 0x80 == 0 {
            if i > 0 && byte == 0 {
                return Err(DecodeError::InvalidVarint);
            }
            return Ok(Some((value, i + 1)));
        }
    }
    if buf.len() >= 4 {
        return Err(DecodeError::InvalidVarint);
    }
    Ok(None)
}

/// How many bytes `value` takes (1 to 4; values over [`MAX`] count as 4, [`encode`] refuses them).
pub fn encoded_len(value: u32) -> usize {
    match value {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    }
}

/// Appends `value` in its shortest form.
pub fn encode(value: u32, out: &mut impl BufMut) -> Result<(), EncodeError> {
    if value > MAX {
        return Err(EncodeError::VarintOutOfRange(value));
    }
    let mut rest = value;
    loop {
        let byte = (rest & 0x7F) as u8;
        rest >>= 7;
        if rest == 0 {
            out.put_u8(byte);
            return Ok(());
        }
        out.put_u8(byte | 0x80);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The boundaries of spec §1.5.5's table (Table 1-1 Size of Variable Byte Integer).
    const SPEC_TABLE: &[(u32, &[u8])] = &[
        (0, &[0x00]),
        (127, &[0x7F]),
        (128, &[0x80, 0x01]),
        (16_383, &[0xFF, 0x7F]),
        (16_384, &[0x80, 0x80, 0x01]),
        (2_097_151, &[0xFF, 0xFF, 0x7F]),
        (2_097_152, &[0x80, 0x80, 0x80, 0x01]),
        (268_435_455, &[0xFF, 0xFF, 0xFF, 0x7F]),
    ];

    #[test]
    fn spec_table_encodes_and_decodes() {
        for &(value, bytes) in SPEC_TABLE {
            let mut out = Vec::new();
            encode(value, &mut out).expect("in range");
            assert_eq!(out, bytes, "{value}");
            assert_eq!(encoded_len(value), bytes.len());
            assert_eq!(decode(bytes), Ok(Some((value, bytes.len()))));
        }
    }

    #[test]
    fn fifth_byte_and_long_forms_are_refused() {
        assert_eq!(
            decode(&[0xFF, 0xFF, 0xFF, 0xFF, 0x01]),
            Err(DecodeError::InvalidVarint)
        );
        assert_eq!(
            decode(&[0x80, 0x80, 0x80, 0x80]),
            Err(DecodeError::InvalidVarint)
        );
        assert_eq!(decode(&[0x80, 0x00]), Err(DecodeError::InvalidVarint));
        assert_eq!(decode(&[0xFF, 0xFF]), Ok(None));
        assert_eq!(decode(&[]), Ok(None));
        assert_eq!(
            encode(MAX + 1, &mut Vec::new()),
            Err(EncodeError::VarintOutOfRange(MAX + 1))
        );
    }

    proptest! {
        #[test]
        fn round_trip(value in 0..=MAX, tail in proptest::collection::vec(any::<u8>(), 0..4)) {
            let mut out = Vec::new();
            encode(value, &mut out).expect("in range");
            let len = out.len();
            out.extend(tail);
            prop_assert_eq!(decode(&out), Ok(Some((value, len))));
        }
    }
}
