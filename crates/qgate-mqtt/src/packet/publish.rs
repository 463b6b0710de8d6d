//! PUBLISH (spec §3.3; 3.1.1 §3.3): an application message. The payload is a slice of the
//! received packet, never copied.

use bytes::{BufMut, Bytes, BytesMut};

use super::{put_packet_id, ProtocolVersion, QoS};
use crate::error::{DecodeError, EncodeError};
use crate::properties::{Properties, PropertyContext};
use crate::reader::Reader;
use crate::topic;
use crate::writer::put_string;

const DUP: u8 = 0b1000;
const RETAIN: u8 = 0b0001;

/// A PUBLISH packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publish {
    pub dup: bool,
    pub qos: QoS,
    pub retain: bool,
    /// As sent: empty when a 5.0 sender relies on a topic alias (`properties.topic_alias`).
    pub topic: String,
    /// Present exactly when `qos` is 1 or 2.
    pub packet_id: Option<u16>,
    /// Always empty in 3.1.1.
    pub properties: Properties,
    pub payload: Bytes,
}

impl Publish {
    pub(super) fn parse(
        flags: u8,
        r: &mut Reader,
        version: ProtocolVersion,
    ) -> Result<Self, DecodeError> {
        let qos = QoS::from_bits((flags >> 1) & 0b11)?;
        let topic = r.string()?;
        if !topic::is_valid_name(&topic) {
            return Err(DecodeError::TopicNameHasWildcard);
        }
        let packet_id = match qos {
            QoS::AtMostOnce => None,
            QoS::AtLeastOnce | QoS::ExactlyOnce => Some(r.packet_id()?),
        };
        let properties = match version {
            ProtocolVersion::V5 => Properties::parse(r, PropertyContext::Publish)?,
            ProtocolVersion::V311 => Properties::default(),
        };
        Ok(Publish {
            dup: flags & DUP != 0,
            qos,
            retain: flags & RETAIN != 0,
            topic,
            packet_id,
            properties,
            payload: r.rest(),
        })
    }

    /// Writes the variable header and payload; returns the fixed header's flags.
    pub(super) fn emit(
        &self,
        out: &mut BytesMut,
        version: ProtocolVersion,
    ) -> Result<u8, EncodeError> {
        put_string(out, &self.topic)?;
        match (self.qos, self.packet_id) {
            (QoS::AtMostOnce, None) => {}
            (QoS::AtLeastOnce | QoS::ExactlyOnce, Some(id)) => put_packet_id(out, id)?,
            _ => return Err(EncodeError::PacketIdMismatch),
        }
        if version == ProtocolVersion::V5 {
            self.properties.emit(out)?;
        }
        out.put_slice(&self.payload);
        let mut flags = (self.qos as u8) << 1;
        if self.dup {
            flags |= DUP;
        }
        if self.retain {
            flags |= RETAIN;
        }
        Ok(flags)
    }
}
