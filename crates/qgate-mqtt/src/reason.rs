//! Reason codes: MQTT 5.0's one-byte outcome in every acknowledgement and in DISCONNECT, and
//! MQTT 3.1.1's CONNACK return codes. The crate speaks [`ReasonCode`] everywhere and maps it to a
//! [`ConnectReturnCode`] only when a 3.1.1 CONNACK is written, so a shell refuses a client the
//! same way whatever its protocol version.

use std::fmt;

use crate::error::DecodeError;
use crate::packet::PacketType;

macro_rules! reason_codes {
    ($( $(#[$doc:meta])* $name:ident = $value:literal, $text:literal; )*) => {
        /// An MQTT 5.0 reason code (spec §2.4). Values below 0x80 report success, 0x80 and up
        /// failure. One value has several names in the spec (0x00 is Success, Normal
        /// disconnection and Granted QoS 0); the variant takes the most general one.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum ReasonCode {
            $( $(#[$doc])* $name = $value, )*
        }

        impl ReasonCode {
            /// The spec's name for the code, for logs and metrics labels.
            pub fn name(self) -> &'static str {
                match self { $( ReasonCode::$name => $text, )* }
            }
        }

        impl TryFrom<u8> for ReasonCode {
            type Error = u8;
            /// The code for a byte, or the byte back when MQTT 5.0 defines no code with it.
            fn try_from(value: u8) -> Result<Self, u8> {
                match value {
                    $( $value => Ok(ReasonCode::$name), )*
                    other => Err(other),
                }
            }
        }
    };
}

reason_codes! {
    /// Success; also Normal disconnection and Granted QoS 0.
    Success = 0x00, "Success";
    GrantedQos1 = 0x01, "Granted QoS 1";
    GrantedQos2 = 0x02, "Granted QoS 2";
    DisconnectWithWillMessage = 0x04, "Disconnect with Will Message";
    NoMatchingSubscribers = 0x10, "No matching subscribers";
    NoSubscriptionExisted = 0x11, "No subscription existed";
    ContinueAuthentication = 0x18, "Continue authentication";
    ReAuthenticate = 0x19, "Re-authenticate";
    UnspecifiedError = 0x80, "Unspecified error";
    MalformedPacket = 0x81, "Malformed Packet";
    ProtocolError = 0x82, "Protocol Error";
    ImplementationSpecificError = 0x83, "Implementation specific error";
    UnsupportedProtocolVersion = 0x84, "Unsupported Protocol Version";
    ClientIdentifierNotValid = 0x85, "Client Identifier not valid";
    BadUserNameOrPassword = 0x86, "Bad User Name or Password";
    NotAuthorized = 0x87, "Not authorized";
    ServerUnavailable = 0x88, "Server unavailable";
    ServerBusy = 0x89, "Server busy";
    Banned = 0x8A, "Banned";
    ServerShuttingDown = 0x8B, "Server shutting down";
    BadAuthenticationMethod = 0x8C, "Bad authentication method";
    KeepAliveTimeout = 0x8D, "Keep Alive timeout";
    SessionTakenOver = 0x8E, "Session taken over";
    TopicFilterInvalid = 0x8F, "Topic Filter invalid";
    TopicNameInvalid = 0x90, "Topic Name invalid";
    PacketIdentifierInUse = 0x91, "Packet Identifier in use";
    PacketIdentifierNotFound = 0x92, "Packet Identifier not found";
    ReceiveMaximumExceeded = 0x93, "Receive Maximum exceeded";
    TopicAliasInvalid = 0x94, "Topic Alias invalid";
    PacketTooLarge = 0x95, "Packet too large";
    MessageRateTooHigh = 0x96, "Message rate too high";
    QuotaExceeded = 0x97, "Quota exceeded";
    AdministrativeAction = 0x98, "Administrative action";
    PayloadFormatInvalid = 0x99, "Payload format invalid";
    RetainNotSupported = 0x9A, "Retain not supported";
    QosNotSupported = 0x9B, "QoS not supported";
    UseAnotherServer = 0x9C, "Use another server";
    ServerMoved = 0x9D, "Server moved";
    SharedSubscriptionsNotSupported = 0x9E, "Shared Subscriptions not supported";
    ConnectionRateExceeded = 0x9F, "Connection rate exceeded";
    MaximumConnectTime = 0xA0, "Maximum connect time";
    SubscriptionIdentifiersNotSupported = 0xA1, "Subscription Identifiers not supported";
    WildcardSubscriptionsNotSupported = 0xA2, "Wildcard Subscriptions not supported";
}

impl ReasonCode {
    /// Whether the code reports a failure (0x80 and up).
    pub fn is_error(self) -> bool {
        self as u8 >= 0x80
    }

    /// Whether MQTT 5.0 lets a packet of this type carry this code (the per-packet tables of
    /// §3.2.2.2, §3.4.2.1, §3.5.2.1, §3.6.2.1, §3.7.2.1, §3.9.3, §3.11.3, §3.14.2.1, §3.15.2.1).
    /// Packets without a reason code allow none.
    pub fn allowed_in(self, packet: PacketType) -> bool {
        use ReasonCode as R;
        match packet {
            PacketType::ConnAck => matches!(
                self,
                R::Success
                    | R::UnspecifiedError
                    | R::MalformedPacket
                    | R::ProtocolError
                    | R::ImplementationSpecificError
                    | R::UnsupportedProtocolVersion
                    | R::ClientIdentifierNotValid
                    | R::BadUserNameOrPassword
                    | R::NotAuthorized
                    | R::ServerUnavailable
                    | R::ServerBusy
                    | R::Banned
                    | R::BadAuthenticationMethod
                    | R::TopicNameInvalid
                    | R::PacketTooLarge
                    | R::QuotaExceeded
                    | R::PayloadFormatInvalid
                    | R::RetainNotSupported
                    | R::QosNotSupported
                    | R::UseAnotherServer
                    | R::ServerMoved
                    | R::ConnectionRateExceeded
            ),
            PacketType::PubAck | PacketType::PubRec => matches!(
                self,
                R::Success
                    | R::NoMatchingSubscribers
                    | R::UnspecifiedError
                    | R::ImplementationSpecificError
                    | R::NotAuthorized
                    | R::TopicNameInvalid
                    | R::PacketIdentifierInUse
                    | R::QuotaExceeded
                    | R::PayloadFormatInvalid
            ),
            PacketType::PubRel | PacketType::PubComp => {
                matches!(self, R::Success | R::PacketIdentifierNotFound)
            }
            PacketType::SubAck => matches!(
                self,
                R::Success
                    | R::GrantedQos1
                    | R::GrantedQos2
                    | R::UnspecifiedError
                    | R::ImplementationSpecificError
                    | R::NotAuthorized
                    | R::TopicFilterInvalid
                    | R::PacketIdentifierInUse
                    | R::QuotaExceeded
                    | R::SharedSubscriptionsNotSupported
                    | R::SubscriptionIdentifiersNotSupported
                    | R::WildcardSubscriptionsNotSupported
            ),
            PacketType::UnsubAck => matches!(
                self,
                R::Success
                    | R::NoSubscriptionExisted
                    | R::UnspecifiedError
                    | R::ImplementationSpecificError
                    | R::NotAuthorized
                    | R::TopicFilterInvalid
                    | R::PacketIdentifierInUse
            ),
            PacketType::Disconnect => !matches!(
                self,
                R::GrantedQos1
                    | R::GrantedQos2
                    | R::NoMatchingSubscribers
                    | R::NoSubscriptionExisted
                    | R::ContinueAuthentication
                    | R::ReAuthenticate
                    | R::UnsupportedProtocolVersion
                    | R::ClientIdentifierNotValid
                    | R::BadUserNameOrPassword
                    | R::ServerUnavailable
                    | R::Banned
                    | R::BadAuthenticationMethod
                    | R::PacketIdentifierInUse
                    | R::PacketIdentifierNotFound
            ),
            PacketType::Auth => {
                matches!(
                    self,
                    R::Success | R::ContinueAuthentication | R::ReAuthenticate
                )
            }
            _ => false,
        }
    }

    /// Reads a reason code byte for a packet of type `packet`, refusing codes it may not carry.
    pub(crate) fn parse_for(byte: u8, packet: PacketType) -> Result<Self, DecodeError> {
        ReasonCode::try_from(byte)
            .ok()
            .filter(|code| code.allowed_in(packet))
            .ok_or(DecodeError::InvalidReasonCode(byte))
    }
}

impl fmt::Display for ReasonCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (0x{:02X})", self.name(), *self as u8)
    }
}

/// MQTT 3.1.1's CONNACK return code (spec 3.1.1 §3.2.2.3): the only outcome 3.1.1 reports; every
/// other failure there closes the connection without a word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ConnectReturnCode {
    Accepted = 0,
    UnacceptableProtocolVersion = 1,
    IdentifierRejected = 2,
    ServerUnavailable = 3,
    BadUserNameOrPassword = 4,
    NotAuthorized = 5,
}

impl ConnectReturnCode {
    /// The spec's name for the code.
    pub fn name(self) -> &'static str {
        match self {
            ConnectReturnCode::Accepted => "Connection Accepted",
            ConnectReturnCode::UnacceptableProtocolVersion => "unacceptable protocol version",
            ConnectReturnCode::IdentifierRejected => "identifier rejected",
            ConnectReturnCode::ServerUnavailable => "Server unavailable",
            ConnectReturnCode::BadUserNameOrPassword => "bad user name or password",
            ConnectReturnCode::NotAuthorized => "not authorized",
        }
    }

    /// The 3.1.1 code closest to a 5.0 reason: the six with a counterpart map to it, any other
    /// failure to "Server unavailable" (busy, shutting down, moved…) or "not authorized" (banned,
    /// quota…), whichever tells a 3.1.1 client more truthfully whether to retry.
    pub fn from_reason(reason: ReasonCode) -> Self {
        use ReasonCode as R;
        match reason {
            R::Success => ConnectReturnCode::Accepted,
            R::UnsupportedProtocolVersion => ConnectReturnCode::UnacceptableProtocolVersion,
            R::ClientIdentifierNotValid => ConnectReturnCode::IdentifierRejected,
            R::BadUserNameOrPassword | R::BadAuthenticationMethod => {
                ConnectReturnCode::BadUserNameOrPassword
            }
            R::NotAuthorized | R::Banned | R::QuotaExceeded | R::PayloadFormatInvalid => {
                ConnectReturnCode::NotAuthorized
            }
            _ => ConnectReturnCode::ServerUnavailable,
        }
    }

    /// The 5.0 reason with the same meaning, so a parsed 3.1.1 CONNACK reads like a 5.0 one.
    pub fn to_reason(self) -> ReasonCode {
        match self {
            ConnectReturnCode::Accepted => ReasonCode::Success,
            ConnectReturnCode::UnacceptableProtocolVersion => {
                ReasonCode::UnsupportedProtocolVersion
            }
            ConnectReturnCode::IdentifierRejected => ReasonCode::ClientIdentifierNotValid,
            ConnectReturnCode::ServerUnavailable => ReasonCode::ServerUnavailable,
            ConnectReturnCode::BadUserNameOrPassword => ReasonCode::BadUserNameOrPassword,
            ConnectReturnCode::NotAuthorized => ReasonCode::NotAuthorized,
        }
    }
}

impl TryFrom<u8> for ConnectReturnCode {
    type Error = u8;
    fn try_from(value: u8) -> Result<Self, u8> {
        Ok(match value {
            0 => ConnectReturnCode::Accepted,
            1 => ConnectReturnCode::UnacceptableProtocolVersion,
            2 => ConnectReturnCode::IdentifierRejected,
            3 => ConnectReturnCode::ServerUnavailable,
            4 => ConnectReturnCode::BadUserNameOrPassword,
            5 => ConnectReturnCode::NotAuthorized,
            other => return Err(other),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_parses_to_its_own_code_or_back_to_itself() {
        for b in 0..=255u8 {
            match ReasonCode::try_from(b) {
                Ok(code) => assert_eq!(code as u8, b),
                Err(back) => assert_eq!(back, b),
            }
        }
        assert_eq!(
            ReasonCode::try_from(0x93),
            Ok(ReasonCode::ReceiveMaximumExceeded)
        );
        assert_eq!(ReasonCode::try_from(0x03), Err(0x03));
    }

    #[test]
    fn v311_return_codes_round_trip_through_reasons() {
        for b in 0..=5u8 {
            let code = ConnectReturnCode::try_from(b).expect("defined");
            assert_eq!(ConnectReturnCode::from_reason(code.to_reason()), code);
        }
        assert_eq!(
            ConnectReturnCode::from_reason(ReasonCode::Banned),
            ConnectReturnCode::NotAuthorized
        );
    }

    #[test]
    fn display_names_the_code() {
        assert_eq!(
            ReasonCode::PacketTooLarge.to_string(),
            "Packet too large (0x95)"
        );
        assert!(ReasonCode::MalformedPacket.is_error());
        assert!(!ReasonCode::NoSubscriptionExisted.is_error());
    }
}
