//! MQTT 5.0 properties (spec §2.2.2): the optional, identified fields after a packet's variable
//! header. One struct holds every property; which ones a packet may carry is checked on parse
//! against its [`PropertyContext`] (a property outside its packet's list is malformed, §2.2.2.2),
//! and so is "at most once" for every property but User Property and, in PUBLISH, Subscription
//! Identifier.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::{DecodeError, EncodeError};
use crate::reader::Reader;
use crate::varint;
use crate::writer::{put_binary, put_string};

const PAYLOAD_FORMAT_INDICATOR: u8 = 0x01;
const MESSAGE_EXPIRY_INTERVAL: u8 = 0x02;
const CONTENT_TYPE: u8 = 0x03;
const RESPONSE_TOPIC: u8 = 0x08;
const CORRELATION_DATA: u8 = 0x09;
const SUBSCRIPTION_IDENTIFIER: u8 = 0x0B;
const SESSION_EXPIRY_INTERVAL: u8 = 0x11;
const ASSIGNED_CLIENT_IDENTIFIER: u8 = 0x12;
const SERVER_KEEP_ALIVE: u8 = 0x13;
const AUTHENTICATION_METHOD: u8 = 0x15;
const AUTHENTICATION_DATA: u8 = 0x16;
const REQUEST_PROBLEM_INFORMATION: u8 = 0x17;
const WILL_DELAY_INTERVAL: u8 = 0x18;
const REQUEST_RESPONSE_INFORMATION: u8 = 0x19;
const RESPONSE_INFORMATION: u8 = 0x1A;
const SERVER_REFERENCE: u8 = 0x1C;
const REASON_STRING: u8 = 0x1F;
const RECEIVE_MAXIMUM: u8 = 0x21;
const TOPIC_ALIAS_MAXIMUM: u8 = 0x22;
const TOPIC_ALIAS: u8 = 0x23;
const MAXIMUM_QOS: u8 = 0x24;
const RETAIN_AVAILABLE: u8 = 0x25;
const USER_PROPERTY: u8 = 0x26;
const MAXIMUM_PACKET_SIZE: u8 = 0x27;
const WILDCARD_SUBSCRIPTION_AVAILABLE: u8 = 0x28;
const SUBSCRIPTION_IDENTIFIER_AVAILABLE: u8 = 0x29;
const SHARED_SUBSCRIPTION_AVAILABLE: u8 = 0x2A;

/// Where a property list sits, which decides the identifiers it may hold (spec §2.2.2.2,
/// Table 2-4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PropertyContext {
    Connect,
    Will,
    ConnAck,
    Publish,
    /// PUBACK, PUBREC, PUBREL and PUBCOMP.
    PubResponse,
    Subscribe,
    SubAck,
    Unsubscribe,
    UnsubAck,
    Disconnect,
    Auth,
}

impl PropertyContext {
    /// The identifiers a packet of this kind may carry.
    pub fn allowed(self) -> &'static [u8] {
        match self {
            PropertyContext::Connect => &[
                SESSION_EXPIRY_INTERVAL,
                AUTHENTICATION_METHOD,
                AUTHENTICATION_DATA,
                REQUEST_PROBLEM_INFORMATION,
                REQUEST_RESPONSE_INFORMATION,
                RECEIVE_MAXIMUM,
                TOPIC_ALIAS_MAXIMUM,
                USER_PROPERTY,
                MAXIMUM_PACKET_SIZE,
            ],
            PropertyContext::Will => &[
                PAYLOAD_FORMAT_INDICATOR,
                MESSAGE_EXPIRY_INTERVAL,
                CONTENT_TYPE,
                RESPONSE_TOPIC,
                CORRELATION_DATA,
                WILL_DELAY_INTERVAL,
                USER_PROPERTY,
            ],
            PropertyContext::ConnAck => &[
                SESSION_EXPIRY_INTERVAL,
                ASSIGNED_CLIENT_IDENTIFIER,
                SERVER_KEEP_ALIVE,
                AUTHENTICATION_METHOD,
                AUTHENTICATION_DATA,
                RESPONSE_INFORMATION,
                SERVER_REFERENCE,
                REASON_STRING,
                RECEIVE_MAXIMUM,
                TOPIC_ALIAS_MAXIMUM,
                MAXIMUM_QOS,
                RETAIN_AVAILABLE,
                USER_PROPERTY,
                MAXIMUM_PACKET_SIZE,
                WILDCARD_SUBSCRIPTION_AVAILABLE,
                SUBSCRIPTION_IDENTIFIER_AVAILABLE,
                SHARED_SUBSCRIPTION_AVAILABLE,
            ],
            PropertyContext::Publish => &[
                PAYLOAD_FORMAT_INDICATOR,
                MESSAGE_EXPIRY_INTERVAL,
                CONTENT_TYPE,
                RESPONSE_TOPIC,
                CORRELATION_DATA,
                SUBSCRIPTION_IDENTIFIER,
                TOPIC_ALIAS,
                USER_PROPERTY,
            ],
            PropertyContext::PubResponse | PropertyContext::SubAck | PropertyContext::UnsubAck => {
                &[REASON_STRING, USER_PROPERTY]
            }
            PropertyContext::Subscribe => &[SUBSCRIPTION_IDENTIFIER, USER_PROPERTY],
            PropertyContext::Unsubscribe => &[USER_PROPERTY],
            PropertyContext::Disconnect => &[
                SESSION_EXPIRY_INTERVAL,
                SERVER_REFERENCE,
                REASON_STRING,
                USER_PROPERTY,
            ],
            PropertyContext::Auth => &[
                AUTHENTICATION_METHOD,
                AUTHENTICATION_DATA,
                REASON_STRING,
                USER_PROPERTY,
            ],
        }
    }

    /// Whether a packet of this kind may carry property `id`.
    pub fn allows(self, id: u8) -> bool {
        self.allowed().contains(&id)
    }
}

/// Every MQTT 5.0 property, each `None` (or empty) when absent. Field docs give the identifier;
/// the spec's §3.x.2.x sections give the meaning. The 0/1 bytes are `bool`s.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Properties {
    /// 0x01: `true` when the payload is UTF-8 text.
    pub payload_format_utf8: Option<bool>,
    /// 0x02, seconds.
    pub message_expiry_interval: Option<u32>,
    /// 0x03.
    pub content_type: Option<String>,
    /// 0x08.
    pub response_topic: Option<String>,
    /// 0x09.
    pub correlation_data: Option<Bytes>,
    /// 0x0B: several in a server's PUBLISH, at most one in SUBSCRIBE; never 0.
    pub subscription_identifiers: Vec<u32>,
    /// 0x11, seconds.
    pub session_expiry_interval: Option<u32>,
    /// 0x12.
    pub assigned_client_identifier: Option<String>,
    /// 0x13, seconds.
    pub server_keep_alive: Option<u16>,
    /// 0x15.
    pub authentication_method: Option<String>,
    /// 0x16.
    pub authentication_data: Option<Bytes>,
    /// 0x17.
    pub request_problem_information: Option<bool>,
    /// 0x18, seconds.
    pub will_delay_interval: Option<u32>,
    /// 0x19.
    pub request_response_information: Option<bool>,
    /// 0x1A.
    pub response_information: Option<String>,
    /// 0x1C.
    pub server_reference: Option<String>,
    /// 0x1F.
    pub reason_string: Option<String>,
    /// 0x21: never 0.
    pub receive_maximum: Option<u16>,
    /// 0x22.
    pub topic_alias_maximum: Option<u16>,
    /// 0x23: parsed as sent; 0 and values over the announced maximum are the connection's to
    /// refuse (with Topic Alias invalid, not Malformed Packet).
    pub topic_alias: Option<u16>,
    /// 0x24: 0 or 1.
    pub maximum_qos: Option<u8>,
    /// 0x25.
    pub retain_available: Option<bool>,
    /// 0x26: name/value pairs in the order sent; names may repeat.
    pub user_properties: Vec<(String, String)>,
    /// 0x27: never 0.
    pub maximum_packet_size: Option<u32>,
    /// 0x28.
    pub wildcard_subscription_available: Option<bool>,
    /// 0x29.
    pub subscription_identifier_available: Option<bool>,
    /// 0x2A.
    pub shared_subscription_available: Option<bool>,
}

fn set_once<T>(slot: &mut Option<T>, id: u8, value: T) -> Result<(), DecodeError> {
    if slot.is_some() {
        return Err(DecodeError::DuplicateProperty(id));
    }
    *slot = Some(value);
    Ok(())
}

fn flag(byte: u8, id: u8) -> Result<bool, DecodeError> {
    match byte {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(DecodeError::InvalidPropertyValue(id)),
    }
}

fn non_zero<T: Default + PartialEq>(value: T, id: u8) -> Result<T, DecodeError> {
    if value == T::default() {
        return Err(DecodeError::InvalidPropertyValue(id));
    }
    Ok(value)
}

impl Properties {
    /// Whether no property is set (what a 3.1.1 packet carries).
    pub fn is_empty(&self) -> bool {
        *self == Properties::default()
    }

    /// Reads a property list: its length, then properties until that length is used.
    pub(crate) fn parse(r: &mut Reader, context: PropertyContext) -> Result<Self, DecodeError> {
        let len = r.varint()?;
        let mut r = Reader::new(r.take(len as usize)?);
        let mut p = Properties::default();
        while r.remaining() > 0 {
            let raw_id = r.varint()?;
            let id = u8::try_from(raw_id).map_err(|_| DecodeError::UnknownProperty(raw_id))?;
            if !context.allows(id) {
                // Together these four lists name every identifier MQTT 5.0 defines.
                let known = [
                    PropertyContext::ConnAck,
                    PropertyContext::Will,
                    PropertyContext::Publish,
                    PropertyContext::Connect,
                ]
                .iter()
                .any(|c| c.allows(id));
                return Err(if known {
                    DecodeError::PropertyNotAllowed(id)
                } else {
                    DecodeError::UnknownProperty(raw_id)
                });
            }
            match id {
                PAYLOAD_FORMAT_INDICATOR => {
                    set_once(&mut p.payload_format_utf8, id, flag(r.u8()?, id)?)?
                }
                MESSAGE_EXPIRY_INTERVAL => set_once(&mut p.message_expiry_interval, id, r.u32()?)?,
                CONTENT_TYPE => set_once(&mut p.content_type, id, r.string()?)?,
                RESPONSE_TOPIC => set_once(&mut p.response_topic, id, r.string()?)?,
                CORRELATION_DATA => set_once(&mut p.correlation_data, id, r.binary()?)?,
                SUBSCRIPTION_IDENTIFIER => {
                    let value = non_zero(r.varint()?, id)?;
                    if context != PropertyContext::Publish && !p.subscription_identifiers.is_empty()
                    {
                        return Err(DecodeError::DuplicateProperty(id));
                    }
                    p.subscription_identifiers.push(value);
                }
                SESSION_EXPIRY_INTERVAL => set_once(&mut p.session_expiry_interval, id, r.u32()?)?,
                ASSIGNED_CLIENT_IDENTIFIER => {
                    set_once(&mut p.assigned_client_identifier, id, r.string()?)?
                }
                SERVER_KEEP_ALIVE => set_once(&mut p.server_keep_alive, id, r.u16()?)?,
                AUTHENTICATION_METHOD => set_once(&mut p.authentication_method, id, r.string()?)?,
                AUTHENTICATION_DATA => set_once(&mut p.authentication_data, id, r.binary()?)?,
                REQUEST_PROBLEM_INFORMATION => {
                    set_once(&mut p.request_problem_information, id, flag(r.u8()?, id)?)?
                }
                WILL_DELAY_INTERVAL => set_once(&mut p.will_delay_interval, id, r.u32()?)?,
                REQUEST_RESPONSE_INFORMATION => {
                    set_once(&mut p.request_response_information, id, flag(r.u8()?, id)?)?
                }
                RESPONSE_INFORMATION => set_once(&mut p.response_information, id, r.string()?)?,
                SERVER_REFERENCE => set_once(&mut p.server_reference, id, r.string()?)?,
                REASON_STRING => set_once(&mut p.reason_string, id, r.string()?)?,
                RECEIVE_MAXIMUM => set_once(&mut p.receive_maximum, id, non_zero(r.u16()?, id)?)?,
                TOPIC_ALIAS_MAXIMUM => set_once(&mut p.topic_alias_maximum, id, r.u16()?)?,
                TOPIC_ALIAS => set_once(&mut p.topic_alias, id, r.u16()?)?,
                MAXIMUM_QOS => {
                    let qos = r.u8()?;
                    if qos > 1 {
                        return Err(DecodeError::InvalidPropertyValue(id));
                    }
                    set_once(&mut p.maximum_qos, id, qos)?
                }
                RETAIN_AVAILABLE => set_once(&mut p.retain_available, id, flag(r.u8()?, id)?)?,
                USER_PROPERTY => {
                    let name = r.string()?;
                    let value = r.string()?;
                    p.user_properties.push((name, value));
                }
                MAXIMUM_PACKET_SIZE => {
                    set_once(&mut p.maximum_packet_size, id, non_zero(r.u32()?, id)?)?
                }
                WILDCARD_SUBSCRIPTION_AVAILABLE => set_once(
                    &mut p.wildcard_subscription_available,
                    id,
                    flag(r.u8()?, id)?,
                )?,
                SUBSCRIPTION_IDENTIFIER_AVAILABLE => set_once(
                    &mut p.subscription_identifier_available,
                    id,
                    flag(r.u8()?, id)?,
                )?,
                SHARED_SUBSCRIPTION_AVAILABLE => {
                    set_once(&mut p.shared_subscription_available, id, flag(r.u8()?, id)?)?
                }
                _ => return Err(DecodeError::UnknownProperty(raw_id)),
            }
        }
        Ok(p)
    }

    /// Writes the property list (its length, then every property set, in identifier order).
    /// The caller keeps to what its packet may carry; nothing here checks the context.
    pub(crate) fn emit(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        let mut body = BytesMut::new();
        let b = &mut body;
        if let Some(v) = self.payload_format_utf8 {
            b.put_slice(&[PAYLOAD_FORMAT_INDICATOR, u8::from(v)]);
        }
        if let Some(v) = self.message_expiry_interval {
            b.put_u8(MESSAGE_EXPIRY_INTERVAL);
            b.put_u32(v);
        }
        if let Some(v) = &self.content_type {
            b.put_u8(CONTENT_TYPE);
            put_string(b, v)?;
        }
        if let Some(v) = &self.response_topic {
            b.put_u8(RESPONSE_TOPIC);
            put_string(b, v)?;
        }
        if let Some(v) = &self.correlation_data {
            b.put_u8(CORRELATION_DATA);
            put_binary(b, v)?;
        }
        for &v in &self.subscription_identifiers {
            b.put_u8(SUBSCRIPTION_IDENTIFIER);
            varint::encode(v, b)?;
        }
        if let Some(v) = self.session_expiry_interval {
            b.put_u8(SESSION_EXPIRY_INTERVAL);
            b.put_u32(v);
        }
        if let Some(v) = &self.assigned_client_identifier {
            b.put_u8(ASSIGNED_CLIENT_IDENTIFIER);
            put_string(b, v)?;
        }
        if let Some(v) = self.server_keep_alive {
            b.put_u8(SERVER_KEEP_ALIVE);
            b.put_u16(v);
        }
        if let Some(v) = &self.authentication_method {
            b.put_u8(AUTHENTICATION_METHOD);
            put_string(b, v)?;
        }
        if let Some(v) = &self.authentication_data {
            b.put_u8(AUTHENTICATION_DATA);
            put_binary(b, v)?;
        }
        if let Some(v) = self.request_problem_information {
            b.put_slice(&[REQUEST_PROBLEM_INFORMATION, u8::from(v)]);
        }
        if let Some(v) = self.will_delay_interval {
            b.put_u8(WILL_DELAY_INTERVAL);
            b.put_u32(v);
        }
        if let Some(v) = self.request_response_information {
            b.put_slice(&[REQUEST_RESPONSE_INFORMATION, u8::from(v)]);
        }
        if let Some(v) = &self.response_information {
            b.put_u8(RESPONSE_INFORMATION);
            put_string(b, v)?;
        }
        if let Some(v) = &self.server_reference {
            b.put_u8(SERVER_REFERENCE);
            put_string(b, v)?;
        }
        if let Some(v) = &self.reason_string {
            b.put_u8(REASON_STRING);
            put_string(b, v)?;
        }
        if let Some(v) = self.receive_maximum {
            b.put_u8(RECEIVE_MAXIMUM);
            b.put_u16(v);
        }
        if let Some(v) = self.topic_alias_maximum {
            b.put_u8(TOPIC_ALIAS_MAXIMUM);
            b.put_u16(v);
        }
        if let Some(v) = self.topic_alias {
            b.put_u8(TOPIC_ALIAS);
            b.put_u16(v);
        }
        if let Some(v) = self.maximum_qos {
            b.put_slice(&[MAXIMUM_QOS, v]);
        }
        if let Some(v) = self.retain_available {
            b.put_slice(&[RETAIN_AVAILABLE, u8::from(v)]);
        }
        for (name, value) in &self.user_properties {
            b.put_u8(USER_PROPERTY);
            put_string(b, name)?;
            put_string(b, value)?;
        }
        if let Some(v) = self.maximum_packet_size {
            b.put_u8(MAXIMUM_PACKET_SIZE);
            b.put_u32(v);
        }
        if let Some(v) = self.wildcard_subscription_available {
            b.put_slice(&[WILDCARD_SUBSCRIPTION_AVAILABLE, u8::from(v)]);
        }
        if let Some(v) = self.subscription_identifier_available {
            b.put_slice(&[SUBSCRIPTION_IDENTIFIER_AVAILABLE, u8::from(v)]);
        }
        if let Some(v) = self.shared_subscription_available {
            b.put_slice(&[SHARED_SUBSCRIPTION_AVAILABLE, u8::from(v)]);
        }
        let len = u32::try_from(body.len()).map_err(|_| EncodeError::PacketTooLarge(body.len()))?;
        varint::encode(len, out)?;
        out.put_slice(&body);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8], context: PropertyContext) -> Result<Properties, DecodeError> {
        let mut r = Reader::new(Bytes::copy_from_slice(bytes));
        let p = Properties::parse(&mut r, context)?;
        r.finish()?;
        Ok(p)
    }

    #[test]
    fn spec_connect_example_session_expiry() {
        // §3.1.2.11 example: Properties Length 5, Session Expiry Interval 10.
        let p = parse(
            &[0x05, 0x11, 0x00, 0x00, 0x00, 0x0A],
            PropertyContext::Connect,
        );
        assert_eq!(p.map(|p| p.session_expiry_interval), Ok(Some(10)));
    }

    #[test]
    fn duplicates_foreign_and_unknown_identifiers_are_refused() {
        let truncated = [0x04, 0x21, 0x00, 0x01];
        assert_eq!(
            parse(&truncated, PropertyContext::Connect),
            Err(DecodeError::Truncated)
        );
        let twice = [0x06, 0x21, 0x00, 0x01, 0x21, 0x00, 0x02];
        assert_eq!(
            parse(&twice, PropertyContext::Connect),
            Err(DecodeError::DuplicateProperty(RECEIVE_MAXIMUM))
        );
        let alias_in_connect = [0x03, 0x23, 0x00, 0x01];
        assert_eq!(
            parse(&alias_in_connect, PropertyContext::Connect),
            Err(DecodeError::PropertyNotAllowed(TOPIC_ALIAS))
        );
        assert_eq!(
            parse(&[0x02, 0x04, 0x00], PropertyContext::Publish),
            Err(DecodeError::UnknownProperty(0x04))
        );
        assert_eq!(
            parse(&[0x02, 0x01, 0x02], PropertyContext::Publish),
            Err(DecodeError::InvalidPropertyValue(PAYLOAD_FORMAT_INDICATOR))
        );
        assert_eq!(
            parse(&[0x03, 0x21, 0x00, 0x00], PropertyContext::Connect),
            Err(DecodeError::InvalidPropertyValue(RECEIVE_MAXIMUM))
        );
    }

    #[test]
    fn user_properties_repeat_and_keep_their_order() {
        let mut out = BytesMut::new();
        let p = Properties {
            user_properties: vec![("a".into(), "1".into()), ("a".into(), "2".into())],
            subscription_identifiers: vec![5, 300],
            ..Properties::default()
        };
        p.emit(&mut out).expect("fits");
        assert_eq!(parse(&out, PropertyContext::Publish), Ok(p));
        assert_eq!(
            parse(&out, PropertyContext::Subscribe),
            Err(DecodeError::DuplicateProperty(SUBSCRIPTION_IDENTIFIER))
        );
    }
}
