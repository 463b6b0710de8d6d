//! PUBACK, PUBREC, PUBREL and PUBCOMP (spec §3.4–3.7): one shape, a packet identifier and, in
//! 5.0, a reason and properties that may be left off when they are Success and empty.

use bytes::{BufMut, BytesMut};

use super::{put_packet_id, PacketType, ProtocolVersion};
use crate::error::{DecodeError, EncodeError};
use crate::properties::{Properties, PropertyContext};
use crate::reader::Reader;
use crate::reason::ReasonCode;

/// The body of a PUBACK, PUBREC, PUBREL or PUBCOMP; [`super::Packet`]'s variant says which.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PubResponse {
    pub packet_id: u16,
    /// Always Success in 3.1.1.
    pub reason: ReasonCode,
    /// Always empty in 3.1.1.
    pub properties: Properties,
}

impl PubResponse {
    /// A response with Success and no properties.
    pub fn success(packet_id: u16) -> Self {
        PubResponse {
            packet_id,
            reason: ReasonCode::Success,
            properties: Properties::default(),
        }
    }

    pub(super) fn parse(
        packet_type: PacketType,
        r: &mut Reader,
        version: ProtocolVersion,
    ) -> Result<Self, DecodeError> {
        let packet_id = r.packet_id()?;
        if version == ProtocolVersion::V311 || r.remaining() == 0 {
            return Ok(PubResponse::success(packet_id));
        }
        let reason = ReasonCode::parse_for(r.u8()?, packet_type)?;
        let properties = if r.remaining() == 0 {
            Properties::default()
        } else {
            Properties::parse(r, PropertyContext::PubResponse)?
        };
        Ok(PubResponse {
            packet_id,
            reason,
            properties,
        })
    }

    pub(super) fn emit(
        &self,
        out: &mut BytesMut,
        version: ProtocolVersion,
    ) -> Result<(), EncodeError> {
        put_packet_id(out, self.packet_id)?;
        if version == ProtocolVersion::V5 {
            let bare = self.properties.is_empty();
            if !(bare && self.reason == ReasonCode::Success) {
                out.put_u8(self.reason as u8);
                if !bare {
                    self.properties.emit(out)?;
                }
            }
        }
        Ok(())
    }
}
