//! The fixed header (spec §2.1): packet type and flags in one byte, then the remaining length.
//! It is all a receiver needs to know how many bytes the packet takes, so it is parsed from
//! whatever prefix of the stream has arrived, before the body.

use crate::error::DecodeError;
use crate::varint;

/// The control packet type, the fixed header's upper four bits (spec §2.1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PacketType {
    Connect = 1,
    ConnAck = 2,
    Publish = 3,
    PubAck = 4,
    PubRec = 5,
    PubRel = 6,
    PubComp = 7,
    Subscribe = 8,
    SubAck = 9,
    Unsubscribe = 10,
    UnsubAck = 11,
    PingReq = 12,
    PingResp = 13,
    Disconnect = 14,
    Auth = 15,
}

impl PacketType {
    fn from_nibble(nibble: u8) -> Result<Self, DecodeError> {
        use PacketType as T;
        Ok(match nibble {
            1 => T::Connect,
            2 => T::ConnAck,
            3 => T::Publish,
            4 => T::PubAck,
            5 => T::PubRec,
            6 => T::PubRel,
            7 => T::PubComp,
            8 => T::Subscribe,
            9 => T::SubAck,
            10 => T::Unsubscribe,
            11 => T::UnsubAck,
            12 => T::PingReq,
            13 => T::PingResp,
            14 => T::Disconnect,
            15 => T::Auth,
            other => return Err(DecodeError::ReservedPacketType(other)),
        })
    }
}

/// A parsed fixed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedHeader {
    pub packet_type: PacketType,
    /// The lower four bits of the first byte: DUP, QoS and RETAIN for PUBLISH, fixed otherwise.
    pub flags: u8,
    /// Bytes after the fixed header.
    pub remaining_length: u32,
    /// Bytes the fixed header itself takes (2 to 5).
    pub header_len: usize,
}

impl FixedHeader {
    /// Reads the fixed header from the start of `buf`, which may hold just a prefix of the
    /// packet: `Ok(None)` until the remaining length is complete. The flags are checked here
    /// (spec §2.1.3: fixed values are 0b0010 for PUBREL, SUBSCRIBE and UNSUBSCRIBE, 0 for the
    /// rest; PUBLISH's QoS is not 3 and DUP is clear at QoS 0), so a bad first byte is refused
    /// before the body is waited for.
    pub fn parse(buf: &[u8]) -> Result<Option<FixedHeader>, DecodeError> {
        let Some(&first) = buf.first() else {
            return Ok(None);
        };
        let packet_type = PacketType::from_nibble(first >> 4)?;
        let flags = first & 0x0F;
        match packet_type {
            PacketType::Publish => {
                let qos = (flags >> 1) & 0b11;
                if qos == 3 {
                    return Err(DecodeError::InvalidQos);
                }
                if qos == 0 && flags & 0b1000 != 0 {
                    return Err(DecodeError::DupWithQos0);
                }
            }
            PacketType::PubRel | PacketType::Subscribe | PacketType::Unsubscribe => {
                if flags != 0b0010 {
                    return Err(DecodeError::InvalidFlags { packet_type, flags });
                }
            }
            _ => {
                if flags != 0 {
                    return Err(DecodeError::InvalidFlags { packet_type, flags });
                }
            }
        }
        let Some((remaining_length, len)) = varint::decode(&buf[1..])? else {
            return Ok(None);
        };
        Ok(Some(FixedHeader {
            packet_type,
            flags,
            remaining_length,
            header_len: 1 + len,
        }))
    }

    /// The whole packet's length, fixed header included: what MQTT 5.0's Maximum Packet Size
    /// limits (spec §3.1.2.11.4).
    pub fn packet_len(&self) -> usize {
        self.header_len + self.remaining_length as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_read_from_a_prefix() {
        assert_eq!(FixedHeader::parse(&[]), Ok(None));
        assert_eq!(FixedHeader::parse(&[0x30]), Ok(None));
        assert_eq!(FixedHeader::parse(&[0x30, 0x80]), Ok(None));
        let header = FixedHeader::parse(&[0x32, 0x80, 0x01])
            .expect("valid")
            .expect("complete");
        assert_eq!(header.packet_type, PacketType::Publish);
        assert_eq!(header.flags, 0b0010);
        assert_eq!(header.remaining_length, 128);
        assert_eq!(header.packet_len(), 131);
    }

    #[test]
    fn bad_first_bytes_and_long_lengths_are_refused() {
        assert_eq!(
            FixedHeader::parse(&[0x00, 0x00]),
            Err(DecodeError::ReservedPacketType(0))
        );
        assert_eq!(
            FixedHeader::parse(&[0x36, 0x00]),
            Err(DecodeError::InvalidQos)
        );
        assert_eq!(
            FixedHeader::parse(&[0x38, 0x00]),
            Err(DecodeError::DupWithQos0)
        );
        assert_eq!(
            FixedHeader::parse(&[0x60, 0x02]),
            Err(DecodeError::InvalidFlags {
                packet_type: PacketType::PubRel,
                flags: 0
            })
        );
        assert_eq!(
            FixedHeader::parse(&[0xC1, 0x00]),
            Err(DecodeError::InvalidFlags {
                packet_type: PacketType::PingReq,
                flags: 1
            })
        );
        assert_eq!(
            FixedHeader::parse(&[0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]),
            Err(DecodeError::InvalidVarint)
        );
    }
}
