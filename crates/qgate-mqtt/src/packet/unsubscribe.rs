//! UNSUBSCRIBE (spec §3.10; 3.1.1 §3.10): topic filters to drop.

use bytes::BytesMut;

use super::{put_packet_id, ProtocolVersion};
use crate::error::{DecodeError, EncodeError};
use crate::properties::{Properties, PropertyContext};
use crate::reader::Reader;
use crate::writer::put_string;

/// An UNSUBSCRIBE packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsubscribe {
    pub packet_id: u16,
    /// Always empty in 3.1.1.
    pub properties: Properties,
    /// At least one.
    pub filters: Vec<String>,
}

impl Unsubscribe {
    pub(super) fn parse(r: &mut Reader, version: ProtocolVersion) -> Result<Self, DecodeError> {
        let packet_id = r.packet_id()?;
        let properties = match version {
            ProtocolVersion::V5 => Properties::parse(r, PropertyContext::Unsubscribe)?,
            ProtocolVersion::V311 => Properties::default(),
        };
        let mut filters = Vec::new();
        while r.remaining() > 0 {
            filters.push(r.string()?);
        }
        if filters.is_empty() {
            return Err(DecodeError::NoTopicFilters);
        }
        Ok(Unsubscribe {
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
        for filter in &self.filters {
            put_string(out, filter)?;
        }
        Ok(())
    }
}
