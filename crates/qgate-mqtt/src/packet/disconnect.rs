//! DISCONNECT (spec §3.14; 3.1.1 §3.14): in 5.0 either side's last word, with a reason; in 3.1.1
//! the client's only, and empty.

use bytes::{BufMut, BytesMut};

use super::{PacketType, ProtocolVersion};
use crate::error::{DecodeError, EncodeError};
use crate::properties::{Properties, PropertyContext};
use crate::reader::Reader;
use crate::reason::ReasonCode;

/// A DISCONNECT packet. Success is "Normal disconnection".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disconnect {
    /// Always Success in 3.1.1.
    pub reason: ReasonCode,
    /// Always empty in 3.1.1.
    pub properties: Properties,
}

impl Disconnect {
    /// A DISCONNECT with `reason` and no properties.
    pub fn new(reason: ReasonCode) -> Self {
        Disconnect {
            reason,
            properties: Properties::default(),
        }
    }

    pub(super) fn parse(r: &mut Reader, version: ProtocolVersion) -> Result<Self, DecodeError> {
        if version == ProtocolVersion::V311 || r.remaining() == 0 {
            return Ok(Disconnect::new(ReasonCode::Success));
        }
        let reason = ReasonCode::parse_for(r.u8()?, PacketType::Disconnect)?;
        let properties = if r.remaining() == 0 {
            Properties::default()
        } else {
            Properties::parse(r, PropertyContext::Disconnect)?
        };
        Ok(Disconnect { reason, properties })
    }

    pub(super) fn emit(
        &self,
        out: &mut BytesMut,
        version: ProtocolVersion,
    ) -> Result<(), EncodeError> {
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
