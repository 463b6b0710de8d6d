//! AUTH (spec §3.15): MQTT 5.0's enhanced authentication exchange. Parsed so a client sending it
//! gets a precise answer; the connection offers no authentication method.

use bytes::{BufMut, BytesMut};

use super::PacketType;
use crate::error::{DecodeError, EncodeError};
use crate::properties::{Properties, PropertyContext};
use crate::reader::Reader;
use crate::reason::ReasonCode;

/// An AUTH packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Auth {
    pub reason: ReasonCode,
    pub properties: Properties,
}

impl Auth {
    pub(super) fn parse(r: &mut Reader) -> Result<Self, DecodeError> {
        if r.remaining() == 0 {
            return Ok(Auth {
                reason: ReasonCode::Success,
                properties: Properties::default(),
            });
        }
        let reason = ReasonCode::parse_for(r.u8()?, PacketType::Auth)?;
        let properties = Properties::parse(r, PropertyContext::Auth)?;
        Ok(Auth { reason, properties })
    }

    pub(super) fn emit(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        if self.reason != ReasonCode::Success || !self.properties.is_empty() {
            out.put_u8(self.reason as u8);
            self.properties.emit(out)?;
        }
        Ok(())
    }
}
