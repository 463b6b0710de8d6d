//! What a client did that ends its connection, beyond malformed bytes: each maps to the MQTT
//! 5.0 reason the server's DISCONNECT carries.

use crate::error::DecodeError;
use crate::packet::PacketType;
use crate::reason::ReasonCode;

/// A client's breach of the protocol or of the server's announced limits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// Bytes that are not a valid packet (or a packet over the maximum size).
    #[error("{0}")]
    Decode(DecodeError),
    /// The first packet was not CONNECT (spec §3.1).
    #[error("first packet is {0:?}, not CONNECT")]
    FirstPacketNotConnect(PacketType),
    /// A second CONNECT (spec §3.1: a Protocol Error).
    #[error("second CONNECT")]
    SecondConnect,
    /// A packet only a server sends, an acknowledgement of a PUBLISH the server never sent, or
    /// AUTH when no authentication method was agreed.
    #[error("unexpected {0:?} from a client")]
    UnexpectedPacket(PacketType),
    /// A packet identifier reused while it is in flight for another QoS, or PUBREL before PUBREC.
    #[error("packet identifier {0} used out of order")]
    PacketIdOutOfOrder(u16),
    /// More unacknowledged QoS 1/2 publishes than the Receive Maximum.
    #[error("receive maximum exceeded")]
    ReceiveMaximumExceeded,
    /// A topic alias of 0 or above the Topic Alias Maximum.
    #[error("topic alias {0} out of range")]
    TopicAliasInvalid(u16),
    /// An empty topic name with an alias that has no topic yet.
    #[error("topic alias {0} has no topic")]
    TopicAliasUnknown(u16),
    /// An empty topic name without an alias.
    #[error("empty topic name")]
    EmptyTopic,
    /// A PUBLISH from the client carrying a Subscription Identifier (spec §3.3.4).
    #[error("subscription identifier in a client's PUBLISH")]
    SubscriptionIdentifierInPublish,
    /// DISCONNECT setting a session expiry when CONNECT had none (spec §3.14.2.2.2).
    #[error("session expiry set on DISCONNECT after 0 on CONNECT")]
    SessionExpiryAfterZero,
    /// More than a packet's worth of input while the shell was deciding on CONNECT.
    #[error("input before CONNACK exceeds the maximum packet size")]
    InputBeforeConnAck,
}

impl Violation {
    /// The reason the server's DISCONNECT (5.0) carries.
    pub fn reason_code(&self) -> ReasonCode {
        match self {
            Violation::Decode(error) => error.reason_code(),
            Violation::ReceiveMaximumExceeded => ReasonCode::ReceiveMaximumExceeded,
            Violation::TopicAliasInvalid(_) => ReasonCode::TopicAliasInvalid,
            Violation::InputBeforeConnAck => ReasonCode::QuotaExceeded,
            Violation::FirstPacketNotConnect(_)
            | Violation::SecondConnect
            | Violation::UnexpectedPacket(_)
            | Violation::PacketIdOutOfOrder(_)
            | Violation::TopicAliasUnknown(_)
            | Violation::EmptyTopic
            | Violation::SubscriptionIdentifierInPublish
            | Violation::SessionExpiryAfterZero => ReasonCode::ProtocolError,
        }
    }
}
