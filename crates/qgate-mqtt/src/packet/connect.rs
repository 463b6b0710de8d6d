//! CONNECT (spec §3.1; 3.1.1 §3.1): the client's first packet, which fixes the protocol version.

use bytes::{BufMut, Bytes, BytesMut};

use super::{ProtocolVersion, QoS};
use crate::error::{DecodeError, EncodeError};
use crate::properties::{Properties, PropertyContext};
use crate::reader::Reader;
use crate::topic;
use crate::writer::{put_binary, put_string};

const RESERVED: u8 = 0b0000_0001;
const CLEAN_START: u8 = 0b0000_0010;
const WILL: u8 = 0b0000_0100;
const WILL_QOS_SHIFT: u8 = 3;
const WILL_RETAIN: u8 = 0b0010_0000;
const PASSWORD: u8 = 0b0100_0000;
const USERNAME: u8 = 0b1000_0000;

/// A CONNECT packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connect {
    pub protocol: ProtocolVersion,
    /// Clean Start (5.0) or Clean Session (3.1.1).
    pub clean_start: bool,
    /// Seconds; 0 turns keep-alive off.
    pub keep_alive: u16,
    /// Always empty in 3.1.1.
    pub properties: Properties,
    /// May be empty: the server then assigns one (or, in 3.1.1 without Clean Session, refuses).
    pub client_id: String,
    pub will: Option<Will>,
    pub username: Option<String>,
    pub password: Option<Bytes>,
}

/// The will message a CONNECT registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Will {
    pub qos: QoS,
    pub retain: bool,
    /// Always empty in 3.1.1.
    pub properties: Properties,
    pub topic: String,
    pub payload: Bytes,
}

impl Connect {
    pub(super) fn parse(r: &mut Reader) -> Result<Self, DecodeError> {
        let name = r.binary()?;
        let level = r.u8()?;
        // "MQIsdp" is MQTT 3.1's name: such a client is told its level is unsupported (3.1.1
        // §3.1.2.2) rather than dropped.
        if &name[..] != b"MQTT" && &name[..] != b"MQIsdp" {
            return Err(DecodeError::InvalidProtocolName);
        }
        let protocol = match (&name[..], level) {
            (b"MQTT", 4) => ProtocolVersion::V311,
            (b"MQTT", 5) => ProtocolVersion::V5,
            _ => return Err(DecodeError::UnsupportedProtocolVersion(level)),
        };
        let flags = r.u8()?;
        let will_qos = QoS::from_bits((flags >> WILL_QOS_SHIFT) & 0b11)?;
        let has_will = flags & WILL != 0;
        let flags_ok = flags & RESERVED == 0
            && (has_will || (will_qos == QoS::AtMostOnce && flags & WILL_RETAIN == 0))
            && (protocol == ProtocolVersion::V5 || flags & PASSWORD == 0 || flags & USERNAME != 0);
        if !flags_ok {
            return Err(DecodeError::InvalidConnectFlags(flags));
        }
        let keep_alive = r.u16()?;
        let properties = match protocol {
            ProtocolVersion::V5 => Properties::parse(r, PropertyContext::Connect)?,
            ProtocolVersion::V311 => Properties::default(),
        };
        let client_id = r.string()?;
        let will = if has_will {
            let properties = match protocol {
                ProtocolVersion::V5 => Properties::parse(r, PropertyContext::Will)?,
                ProtocolVersion::V311 => Properties::default(),
            };
            let topic = r.string()?;
            if !topic::is_valid_name(&topic) {
                return Err(DecodeError::TopicNameHasWildcard);
            }
            let payload = r.binary()?;
            Some(Will {
                qos: will_qos,
                retain: flags & WILL_RETAIN != 0,
                properties,
                topic,
                payload,
            })
        } else {
            None
        };
        let username = if flags & USERNAME != 0 {
            Some(r.string()?)
        } else {
            None
        };
        let password = if flags & PASSWORD != 0 {
            Some(r.binary()?)
        } else {
            None
        };
        Ok(Connect {
            protocol,
            clean_start: flags & CLEAN_START != 0,
            keep_alive,
            properties,
            client_id,
            will,
            username,
            password,
        })
    }

    pub(super) fn emit(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        put_string(out, "MQTT")?;
        out.put_u8(self.protocol.level());
        let mut flags = 0;
        if self.clean_start {
            flags |= CLEAN_START;
        }
        if let Some(will) = &self.will {
            flags |= WILL | (will.qos as u8) << WILL_QOS_SHIFT;
            if will.retain {
                flags |= WILL_RETAIN;
            }
        }
        if self.username.is_some() {
            flags |= USERNAME;
        }
        if self.password.is_some() {
            flags |= PASSWORD;
        }
        out.put_u8(flags);
        out.put_u16(self.keep_alive);
        let v5 = self.protocol == ProtocolVersion::V5;
        if v5 {
            self.properties.emit(out)?;
        }
        put_string(out, &self.client_id)?;
        if let Some(will) = &self.will {
            if v5 {
                will.properties.emit(out)?;
            }
            put_string(out, &will.topic)?;
            put_binary(out, &will.payload)?;
        }
        if let Some(username) = &self.username {
            put_string(out, username)?;
        }
        if let Some(password) = &self.password {
            put_binary(out, password)?;
        }
        Ok(())
    }
}
