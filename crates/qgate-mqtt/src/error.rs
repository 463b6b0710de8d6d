//! What can go wrong reading a peer's bytes ([`DecodeError`]) and writing ours ([`EncodeError`]).
//!
//! Every decode error names the MQTT 5.0 reason a server sends in DISCONNECT before closing
//! ([`DecodeError::reason_code`]); MQTT 3.1.1 has no such packet and closes the connection
//! silently, except for the protocol level, which it answers with a CONNACK
//! ([`DecodeError::v311_return_code`]).

use crate::packet::PacketType;
use crate::reason::{ConnectReturnCode, ReasonCode};

/// A peer's bytes that are not an MQTT packet this crate accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// A Variable Byte Integer with a fifth byte (spec §1.5.5 allows four) or not in its
    /// shortest form (§1.5.5 requires it).
    #[error("variable byte integer over 4 bytes or not minimal")]
    InvalidVarint,
    /// The packet ended inside a field.
    #[error("packet ends inside a field")]
    Truncated,
    /// Bytes left after the last field the packet type has.
    #[error("{0} bytes after the last field")]
    TrailingBytes(usize),
    /// Packet type 0, or 15 (AUTH) on a 3.1.1 connection.
    #[error("packet type {0} is reserved")]
    ReservedPacketType(u8),
    /// The fixed header's flag bits are not those the packet type requires.
    #[error("flags 0x{flags:X} invalid for {packet_type:?}")]
    InvalidFlags { packet_type: PacketType, flags: u8 },
    /// QoS 3, in PUBLISH, a will or a subscription.
    #[error("QoS 3")]
    InvalidQos,
    /// DUP set on a QoS 0 PUBLISH.
    #[error("DUP set on a QoS 0 PUBLISH")]
    DupWithQos0,
    /// A string that is not UTF-8 (surrogates included) or holds U+0000.
    #[error("string not well-formed UTF-8 or contains U+0000")]
    InvalidUtf8,
    /// Packet identifier 0 where one is required.
    #[error("packet identifier 0")]
    ZeroPacketId,
    /// A property identifier MQTT 5.0 does not define.
    #[error("unknown property identifier 0x{0:02X}")]
    UnknownProperty(u32),
    /// A property this packet type may not carry.
    #[error("property 0x{0:02X} not allowed in this packet")]
    PropertyNotAllowed(u8),
    /// A property that may appear once appeared twice.
    #[error("property 0x{0:02X} appears more than once")]
    DuplicateProperty(u8),
    /// A property value out of its range (a 0/1 byte that is 2, a zero Receive Maximum…).
    #[error("property 0x{0:02X} has a value out of range")]
    InvalidPropertyValue(u8),
    /// CONNECT's protocol name is not "MQTT".
    #[error("protocol name is not MQTT")]
    InvalidProtocolName,
    /// CONNECT's protocol level is neither 4 (3.1.1) nor 5 (5.0).
    #[error("protocol level {0} not supported")]
    UnsupportedProtocolVersion(u8),
    /// CONNECT flags: reserved bit set, or will QoS/retain without a will, or (3.1.1) a
    /// password without a user name.
    #[error("CONNECT flags 0x{0:02X} invalid")]
    InvalidConnectFlags(u8),
    /// A reason (or 3.1.1 return) code not defined for this packet.
    #[error("reason code 0x{0:02X} invalid here")]
    InvalidReasonCode(u8),
    /// A PUBLISH topic name with `+` or `#` in it.
    #[error("topic name contains a wildcard")]
    TopicNameHasWildcard,
    /// SUBSCRIBE or UNSUBSCRIBE without a single topic filter.
    #[error("SUBSCRIBE or UNSUBSCRIBE without topic filters")]
    NoTopicFilters,
    /// Subscription options with reserved bits set.
    #[error("subscription options 0x{0:02X} have reserved bits set")]
    InvalidSubscriptionOptions(u8),
    /// Subscription options with Retain Handling 3.
    #[error("retain handling 3")]
    InvalidRetainHandling,
    /// The fixed header announces a packet larger than the receiver accepts.
    #[error("packet of {size} bytes exceeds the maximum of {max}")]
    PacketTooLarge { size: u64, max: u32 },
}

impl DecodeError {
    /// The MQTT 5.0 reason for the DISCONNECT (or CONNACK) this error closes the connection
    /// with: structure errors are Malformed Packet (0x81); a well-formed packet breaking a rule
    /// is Protocol Error (0x82), where the spec says so (§2.2.2.2, §3.3.2.3.4, §3.8.3…).
    pub fn reason_code(&self) -> ReasonCode {
        use DecodeError as E;
        match self {
            E::InvalidVarint
            | E::Truncated
            | E::TrailingBytes(_)
            | E::ReservedPacketType(_)
            | E::InvalidFlags { .. }
            | E::InvalidQos
            | E::DupWithQos0
            | E::InvalidUtf8
            | E::UnknownProperty(_)
            | E::PropertyNotAllowed(_)
            | E::InvalidProtocolName
            | E::InvalidConnectFlags(_)
            | E::InvalidReasonCode(_)
            | E::InvalidSubscriptionOptions(_) => ReasonCode::MalformedPacket,
            E::ZeroPacketId
            | E::DuplicateProperty(_)
            | E::InvalidPropertyValue(_)
            | E::NoTopicFilters
            | E::InvalidRetainHandling => ReasonCode::ProtocolError,
            E::UnsupportedProtocolVersion(_) => ReasonCode::UnsupportedProtocolVersion,
            E::TopicNameHasWildcard => ReasonCode::TopicNameInvalid,
            E::PacketTooLarge { .. } => ReasonCode::PacketTooLarge,
        }
    }

    /// What a 3.1.1 server answers before closing: a CONNACK only for an unsupported protocol
    /// level (spec 3.1.1 §3.1.2.2); every other error closes without a packet.
    pub fn v311_return_code(&self) -> Option<ConnectReturnCode> {
        match self {
            DecodeError::UnsupportedProtocolVersion(_) => {
                Some(ConnectReturnCode::UnacceptableProtocolVersion)
            }
            _ => None,
        }
    }
}

/// A value this crate cannot put on the wire: the caller built a packet the format cannot hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// A string or binary field over 65 535 bytes.
    #[error("field of {0} bytes exceeds 65535")]
    FieldTooLong(usize),
    /// A packet whose remaining length exceeds 268 435 455 bytes.
    #[error("remaining length {0} exceeds 268435455")]
    PacketTooLarge(usize),
    /// A QoS 0 PUBLISH with a packet identifier, or a QoS 1/2 one without.
    #[error("packet identifier does not match the QoS")]
    PacketIdMismatch,
    /// Packet identifier 0, which no packet may carry.
    #[error("packet identifier 0")]
    ZeroPacketId,
    /// A Variable Byte Integer property over 268 435 455.
    #[error("value {0} does not fit a variable byte integer")]
    VarintOutOfRange(u32),
}
