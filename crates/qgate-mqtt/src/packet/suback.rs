//! SUBACK (spec §3.9; 3.1.1 §3.9): one reason a topic filter of the SUBSCRIBE, in order.

use bytes::{BufMut, BytesMut};

use super::{put_packet_id, PacketType, ProtocolVersion};
use crate::error::{DecodeError, EncodeError};
use crate::properties::{Properties, PropertyContext};
use crate::reader::Reader;
use crate::reason::ReasonCode;

/// A SUBACK packet. 3.1.1 knows granted QoS 0–2 and failure (0x80): any other failure reason is
/// written as 0x80 there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubAck {
    pub packet_id: u16,
    /// Always empty in 3.1.1.
    pub properties: Properties,
    pub reasons: Vec<ReasonCode>,
}

impl SubAck {
    pub(super) fn parse(r: &mut Reader, version: ProtocolVersion) -> Result<Self, DecodeError> {
        let packet_id = r.packet_id()?;
        let properties = match version {
            ProtocolVersion::V5 => Properties::parse(r, PropertyContext::SubAck)?,
            ProtocolVersion::V311 => Properties::default(),
        };
        let mut reasons = Vec::with_capacity(r.remaining());
        while r.remaining() > 0 {
            let byte = r.u8()?;
            let reason = match (version, byte) {
                (ProtocolVersion::V311, 0x00..=0x02 | 0x80) | (ProtocolVersion::V5, _) => {
                    ReasonCode::parse_for(byte, PacketType::SubAck)?
                }
                (ProtocolVersion::V311, _) => return Err(DecodeError::InvalidReasonCode(byte)),
            };
            reasons.push(reason);
        }
        Ok(SubAck {
            packet_id,
            properties,
            reasons,
        })
    }

    pub(super) fn emit(
        &self,
        out: &mut BytesMut,
        version: ProtocolVersion,
    ) -> Result<(), EncodeError> {
        put_packet_id(out, self.packet_id)?;
        if version == ProtocolVersion::V5 {
            self.properties.emit(out)?;
        }
        for &reason in &self.reasons {
            let byte = match version {
                ProtocolVersion::V311 if reason.is_error() => ReasonCode::UnspecifiedError as u8,
                _ => reason as u8,
            };
            out.put_u8(byte);
        }
        Ok(())
    }
}
