//! UNSUBACK (spec §3.11; 3.1.1 §3.11): in 5.0 one reason a topic filter, in 3.1.1 just the id.

use bytes::{BufMut, BytesMut};

use super::{put_packet_id, PacketType, ProtocolVersion};
use crate::error::{DecodeError, EncodeError};
use crate::properties::{Properties, PropertyContext};
use crate::reader::Reader;
use crate::reason::ReasonCode;

/// An UNSUBACK packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsubAck {
    pub packet_id: u16,
    /// Always empty in 3.1.1.
    pub properties: Properties,
    /// Always empty in 3.1.1.
    pub reasons: Vec<ReasonCode>,
}

impl UnsubAck {
    pub(super) fn parse(r: &mut Reader, version: ProtocolVersion) -> Result<Self, DecodeError> {
        let packet_id = r.packet_id()?;
        let mut ack = UnsubAck {
            packet_id,
            properties: Properties::default(),
            reasons: Vec::new(),
        };
        if version == ProtocolVersion::V5 {
            ack.properties = Properties::parse(r, PropertyContext::UnsubAck)?;
            while r.remaining() > 0 {
                ack.reasons
                    .push(ReasonCode::parse_for(r.u8()?, PacketType::UnsubAck)?);
            }
        }
        Ok(ack)
    }

    pub(super) fn emit(
        &self,
        out: &mut BytesMut,
        version: ProtocolVersion,
    ) -> Result<(), EncodeError> {
        put_packet_id(out, self.packet_id)?;
        if version == ProtocolVersion::V5 {
            self.properties.emit(out)?;
            for &reason in &self.reasons {
                out.put_u8(reason as u8);
            }
        }
        Ok(())
    }
}
