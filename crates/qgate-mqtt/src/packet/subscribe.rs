//! SUBSCRIBE (spec §3.8; 3.1.1 §3.8): topic filters with their options. The codec reads them as
//! sent; whether a filter is well formed ([`crate::topic::is_valid_filter`]) is answered per
//! filter in SUBACK, not by refusing the packet.

use bytes::{BufMut, BytesMut};

use super::{put_packet_id, ProtocolVersion, QoS};
use crate::error::{DecodeError, EncodeError};
use crate::properties::{Properties, PropertyContext};
use crate::reader::Reader;
use crate::writer::put_string;

const NO_LOCAL: u8 = 0b0000_0100;
const RETAIN_AS_PUBLISHED: u8 = 0b0000_1000;
const RETAIN_HANDLING_SHIFT: u8 = 4;

/// A SUBSCRIBE packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscribe {
    pub packet_id: u16,
    /// Always empty in 3.1.1.
    pub properties: Properties,
    /// At least one.
    pub filters: Vec<Subscription>,
}

/// One topic filter of a SUBSCRIBE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    pub filter: String,
    pub options: SubscriptionOptions,
}

/// The options byte (spec §3.8.3.1); in 3.1.1 only the QoS exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubscriptionOptions {
    pub qos: QoS,
    pub no_local: bool,
    pub retain_as_published: bool,
    pub retain_handling: RetainHandling,
}

/// When retained messages are sent on subscribing (spec §3.8.3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetainHandling {
    OnSubscribe = 0,
    OnNewSubscribe = 1,
    Never = 2,
}

impl SubscriptionOptions {
    fn parse(byte: u8, version: ProtocolVersion) -> Result<Self, DecodeError> {
        let reserved = match version {
            ProtocolVersion::V311 => 0b1111_1100,
            ProtocolVersion::V5 => 0b1100_0000,
        };
        if byte & reserved != 0 {
            return Err(DecodeError::InvalidSubscriptionOptions(byte));
        }
        let retain_handling = match (byte >> RETAIN_HANDLING_SHIFT) & 0b11 {
            0 => RetainHandling::OnSubscribe,
            1 => RetainHandling::OnNewSubscribe,
            2 => RetainHandling::Never,
            _ => return Err(DecodeError::InvalidRetainHandling),
        };
        Ok(SubscriptionOptions {
            qos: QoS::from_bits(byte & 0b11)?,
            no_local: byte & NO_LOCAL != 0,
            retain_as_published: byte & RETAIN_AS_PUBLISHED != 0,
            retain_handling,
        })
    }

    fn to_byte(self, version: ProtocolVersion) -> u8 {
        let mut byte = self.qos as u8;
        if version == ProtocolVersion::V5 {
            byte |= (self.retain_handling as u8) << RETAIN_HANDLING_SHIFT;
            if self.no_local {
                byte |= NO_LOCAL;
            }
            if self.retain_as_published {
                byte |= RETAIN_AS_PUBLISHED;
            }
        }
        byte
    }
}

impl Subscribe {
    pub(super) fn parse(r: &mut Reader, version: ProtocolVersion) -> Result<Self, DecodeError> {
        let packet_id = r.packet_id()?;
        let properties = match version {
            ProtocolVersion::V5 => Properties::parse(r, PropertyContext::Subscribe)?,
            ProtocolVersion::V311 => Properties::default(),
        };
        let mut filters = Vec::new();
        while r.remaining() > 0 {
            let filter = r.string()?;
            let options = SubscriptionOptions::parse(r.u8()?, version)?;
            filters.push(Subscription { filter, options });
        }
        if filters.is_empty() {
            return Err(DecodeError::NoTopicFilters);
        }
        Ok(Subscribe {
            packet_id,
            properties,
            filters,
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
        for sub in &self.filters {
            put_string(out, &sub.filter)?;
            out.put_u8(sub.options.to_byte(version));
        }
        Ok(())
    }
}
