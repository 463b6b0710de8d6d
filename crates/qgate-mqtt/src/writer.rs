//! Writing the spec's data types (§1.5) and framing a packet: the body is built first, then the
//! fixed header is written with its remaining length in front of it.

use bytes::{BufMut, BytesMut};

use crate::error::EncodeError;
use crate::varint;

/// Binary Data (§1.5.6): a two-byte length, then the bytes.
pub(crate) fn put_binary(out: &mut BytesMut, data: &[u8]) -> Result<(), EncodeError> {
    let len = u16::try_from(data.len()).map_err(|_| EncodeError::FieldTooLong(data.len()))?;
    out.put_u16(len);
    out.put_slice(data);
    Ok(())
}

/// A UTF-8 Encoded String (§1.5.4). A Rust `str` is well-formed UTF-8 already; U+0000 is the
/// caller's to avoid (the parser refuses it).
pub(crate) fn put_string(out: &mut BytesMut, text: &str) -> Result<(), EncodeError> {
    put_binary(out, text.as_bytes())
}

/// Writes the fixed header (first byte, remaining length) and then `body`.
pub(crate) fn put_packet(
    first_byte: u8,
    body: &[u8],
    out: &mut impl BufMut,
) -> Result<(), EncodeError> {
    let len = u32::try_from(body.len())
        .ok()
        .filter(|&len| len <= varint::MAX)
        .ok_or(EncodeError::PacketTooLarge(body.len()))?;
    out.put_u8(first_byte);
    varint::encode(len, out)?;
    out.put_slice(body);
    Ok(())
}
