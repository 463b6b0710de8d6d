//! MQTT control packets as values, read from and written to the wire (spec §2, §3).
//!
//! A stream is cut into packets by their fixed header alone ([`FixedHeader::parse`]), which
//! says how long the packet is before any of its body has arrived: a receiver refuses an
//! oversized packet there, without buffering it. [`Packet::parse`] then reads one whole packet;
//! [`Packet::emit`] writes one. Both take the connection's [`ProtocolVersion`], as nothing after
//! CONNECT says which version it is written in.

mod ack;
mod auth;
mod connack;
mod connect;
mod disconnect;
mod fixed_header;
mod publish;
mod suback;
mod subscribe;
mod unsuback;
mod unsubscribe;

use bytes::{BufMut, Bytes, BytesMut};

pub use ack::PubResponse;
pub use auth::Auth;
pub use connack::ConnAck;
pub use connect::{Connect, Will};
pub use disconnect::Disconnect;
pub use fixed_header::{FixedHeader, PacketType};
pub use publish::Publish;
pub use suback::SubAck;
pub use subscribe::{RetainHandling, Subscribe, Subscription, SubscriptionOptions};
pub use unsuback::UnsubAck;
pub use unsubscribe::Unsubscribe;

use crate::error::{DecodeError, EncodeError};
use crate::reader::Reader;
use crate::writer::put_packet;

/// The protocol a connection speaks, fixed by its CONNECT's protocol level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProtocolVersion {
    /// MQTT 3.1.1, protocol level 4.
    V311,
    /// MQTT 5.0, protocol level 5.
    V5,
}

impl ProtocolVersion {
    /// The CONNECT protocol level byte.
    pub fn level(self) -> u8 {
        match self {
            ProtocolVersion::V311 => 4,
            ProtocolVersion::V5 => 5,
        }
    }
}

/// Quality of service of a PUBLISH, a will or a subscription (spec §4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QoS {
    AtMostOnce = 0,
    AtLeastOnce = 1,
    ExactlyOnce = 2,
}

impl QoS {
    /// The QoS of two bits; 3 is malformed.
    pub fn from_bits(bits: u8) -> Result<Self, DecodeError> {
        match bits {
            0 => Ok(QoS::AtMostOnce),
            1 => Ok(QoS::AtLeastOnce),
            2 => Ok(QoS::ExactlyOnce),
            _ => Err(DecodeError::InvalidQos),
        }
    }
}

/// One MQTT control packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Packet {
    Connect(Box<Connect>),
    ConnAck(ConnAck),
    Publish(Publish),
    PubAck(PubResponse),
    PubRec(PubResponse),
    PubRel(PubResponse),
    PubComp(PubResponse),
    Subscribe(Subscribe),
    SubAck(SubAck),
    Unsubscribe(Unsubscribe),
    UnsubAck(UnsubAck),
    PingReq,
    PingResp,
    Disconnect(Disconnect),
    /// MQTT 5.0 only.
    Auth(Auth),
}

impl Packet {
    /// The packet's type.
    pub fn packet_type(&self) -> PacketType {
        match self {
            Packet::Connect(_) => PacketType::Connect,
            Packet::ConnAck(_) => PacketType::ConnAck,
            Packet::Publish(_) => PacketType::Publish,
            Packet::PubAck(_) => PacketType::PubAck,
            Packet::PubRec(_) => PacketType::PubRec,
            Packet::PubRel(_) => PacketType::PubRel,
            Packet::PubComp(_) => PacketType::PubComp,
            Packet::Subscribe(_) => PacketType::Subscribe,
            Packet::SubAck(_) => PacketType::SubAck,
            Packet::Unsubscribe(_) => PacketType::Unsubscribe,
            Packet::UnsubAck(_) => PacketType::UnsubAck,
            Packet::PingReq => PacketType::PingReq,
            Packet::PingResp => PacketType::PingResp,
            Packet::Disconnect(_) => PacketType::Disconnect,
            Packet::Auth(_) => PacketType::Auth,
        }
    }

    /// Reads exactly one packet, fixed header included, from `packet`. A CONNECT is read in the
    /// version its protocol level names, whatever `version` says. Strings are copied out;
    /// payloads, passwords and other binary fields are slices of `packet`.
    pub fn parse(packet: Bytes, version: ProtocolVersion) -> Result<Packet, DecodeError> {
        let header = FixedHeader::parse(&packet)?.ok_or(DecodeError::Truncated)?;
        let len = header.packet_len();
        if packet.len() < len {
            return Err(DecodeError::Truncated);
        }
        if packet.len() > len {
            return Err(DecodeError::TrailingBytes(packet.len() - len));
        }
        let mut r = Reader::new(packet.slice(header.header_len..));
        let v = version;
        let parsed = match header.packet_type {
            PacketType::Connect => Packet::Connect(Box::new(Connect::parse(&mut r)?)),
            PacketType::ConnAck => Packet::ConnAck(ConnAck::parse(&mut r, v)?),
            PacketType::Publish => Packet::Publish(Publish::parse(header.flags, &mut r, v)?),
            PacketType::PubAck => {
                Packet::PubAck(PubResponse::parse(PacketType::PubAck, &mut r, v)?)
            }
            PacketType::PubRec => {
                Packet::PubRec(PubResponse::parse(PacketType::PubRec, &mut r, v)?)
            }
            PacketType::PubRel => {
                Packet::PubRel(PubResponse::parse(PacketType::PubRel, &mut r, v)?)
            }
            PacketType::PubComp => {
                Packet::PubComp(PubResponse::parse(PacketType::PubComp, &mut r, v)?)
            }
            PacketType::Subscribe => Packet::Subscribe(Subscribe::parse(&mut r, v)?),
            PacketType::SubAck => Packet::SubAck(SubAck::parse(&mut r, v)?),
            PacketType::Unsubscribe => Packet::Unsubscribe(Unsubscribe::parse(&mut r, v)?),
            PacketType::UnsubAck => Packet::UnsubAck(UnsubAck::parse(&mut r, v)?),
            PacketType::PingReq => Packet::PingReq,
            PacketType::PingResp => Packet::PingResp,
            PacketType::Disconnect => Packet::Disconnect(Disconnect::parse(&mut r, v)?),
            PacketType::Auth => match v {
                ProtocolVersion::V5 => Packet::Auth(Auth::parse(&mut r)?),
                ProtocolVersion::V311 => return Err(DecodeError::ReservedPacketType(15)),
            },
        };
        r.finish()?;
        Ok(parsed)
    }

    /// Appends the packet in `version`'s encoding (a CONNECT in its own). Fields 3.1.1 lacks
    /// (properties, most reason codes) are left out there; a failure reason becomes the nearest
    /// 3.1.1 code where the packet has one (CONNACK, SUBACK).
    pub fn emit(&self, version: ProtocolVersion, out: &mut impl BufMut) -> Result<(), EncodeError> {
        let mut body = BytesMut::new();
        let b = &mut body;
        let v = version;
        let flags = match self {
            Packet::Connect(p) => p.emit(b).map(|()| 0)?,
            Packet::ConnAck(p) => p.emit(b, v).map(|()| 0)?,
            Packet::Publish(p) => p.emit(b, v)?,
            Packet::PubAck(p) | Packet::PubRec(p) | Packet::PubComp(p) => {
                p.emit(b, v).map(|()| 0)?
            }
            Packet::PubRel(p) => p.emit(b, v).map(|()| 0b0010)?,
            Packet::Subscribe(p) => p.emit(b, v).map(|()| 0b0010)?,
            Packet::SubAck(p) => p.emit(b, v).map(|()| 0)?,
            Packet::Unsubscribe(p) => p.emit(b, v).map(|()| 0b0010)?,
            Packet::UnsubAck(p) => p.emit(b, v).map(|()| 0)?,
            Packet::PingReq | Packet::PingResp => 0,
            Packet::Disconnect(p) => p.emit(b, v).map(|()| 0)?,
            Packet::Auth(p) => p.emit(b).map(|()| 0)?,
        };
        put_packet((self.packet_type() as u8) << 4 | flags, &body, out)
    }

    /// The packet as a fresh buffer, for tests and for shells that want one allocation a packet.
    pub fn to_bytes(&self, version: ProtocolVersion) -> Result<Bytes, EncodeError> {
        let mut out = BytesMut::new();
        self.emit(version, &mut out)?;
        Ok(out.freeze())
    }
}

/// Writes a packet identifier, which is never 0 on the wire.
pub(crate) fn put_packet_id(out: &mut BytesMut, id: u16) -> Result<(), EncodeError> {
    if id == 0 {
        return Err(EncodeError::ZeroPacketId);
    }
    out.put_u16(id);
    Ok(())
}
