//! CONNACK (spec §3.2; 3.1.1 §3.2): the server's answer to CONNECT.

use bytes::{BufMut, BytesMut};

use super::{PacketType, ProtocolVersion};
use crate::error::{DecodeError, EncodeError};
use crate::properties::{Properties, PropertyContext};
use crate::reader::Reader;
use crate::reason::{ConnectReturnCode, ReasonCode};

/// A CONNACK packet. In 3.1.1 the reason travels as the nearest return code
/// ([`ConnectReturnCode::from_reason`]) and the properties are left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnAck {
    pub session_present: bool,
    pub reason: ReasonCode,
    pub properties: Properties,
}

impl ConnAck {
    pub(super) fn parse(r: &mut Reader, version: ProtocolVersion) -> Result<Self, DecodeError> {
        let flags = r.u8()?;
        if flags & !1 != 0 {
            return Err(DecodeError::InvalidFlags {
                packet_type: PacketType::ConnAck,
                flags,
            });
        }
        let code = r.u8()?;
        let (reason, properties) = match version {
            ProtocolVersion::V311 => {
                let code =
                    ConnectReturnCode::try_from(code).map_err(DecodeError::InvalidReasonCode)?;
                (code.to_reason(), Properties::default())
            }
            ProtocolVersion::V5 => (
                ReasonCode::parse_for(code, PacketType::ConnAck)?,
                Properties::parse(r, PropertyContext::ConnAck)?,
            ),
        };
        Ok(ConnAck {
            session_present: flags & 1 != 0,
            reason,
            properties,
        })
    }

    pub(super) fn emit(
        &self,
        out: &mut BytesMut,
        version: ProtocolVersion,
    ) -> Result<(), EncodeError> {
        out.put_u8(u8::from(self.session_present));
        match version {
            ProtocolVersion::V311 => out.put_u8(ConnectReturnCode::from_reason(self.reason) as u8),
            ProtocolVersion::V5 => {
                out.put_u8(self.reason as u8);
                self.properties.emit(out)?;
            }
        }
        Ok(())
    }
}
