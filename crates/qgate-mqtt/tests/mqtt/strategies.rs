//! proptest strategies for packets a version can represent exactly, so emit → parse is the
//! identity on them.

use bytes::Bytes;
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use proptest::sample::select;
use qgate_mqtt::packet::{
    Auth, ConnAck, Connect, Disconnect, PubResponse, Publish, RetainHandling, SubAck, Subscribe,
    Subscription, SubscriptionOptions, UnsubAck, Unsubscribe, Will,
};
use qgate_mqtt::properties::PropertyContext;
use qgate_mqtt::{Packet, PacketType, Properties, ProtocolVersion, QoS, ReasonCode};

pub fn string() -> impl Strategy<Value = String> {
    "[^\\x00]{0,6}"
}

pub fn topic_name() -> impl Strategy<Value = String> {
    "[a-z/é]{0,6}"
}

fn bytes() -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..8).prop_map(Bytes::from)
}

fn qos() -> impl Strategy<Value = QoS> {
    select(vec![QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce])
}

fn packet_id() -> impl Strategy<Value = u16> {
    1..=u16::MAX
}

/// Every reason a packet of this type may carry in `version`.
fn reason(packet: PacketType, version: ProtocolVersion) -> impl Strategy<Value = ReasonCode> {
    let all: Vec<ReasonCode> = (0..=255u8)
        .filter_map(|b| ReasonCode::try_from(b).ok())
        .filter(|r| r.allowed_in(packet))
        .filter(|r| match (version, packet) {
            (ProtocolVersion::V5, _) => true,
            (ProtocolVersion::V311, PacketType::ConnAck) => matches!(
                r,
                ReasonCode::Success
                    | ReasonCode::UnsupportedProtocolVersion
                    | ReasonCode::ClientIdentifierNotValid
                    | ReasonCode::ServerUnavailable
                    | ReasonCode::BadUserNameOrPassword
                    | ReasonCode::NotAuthorized
            ),
            (ProtocolVersion::V311, PacketType::SubAck) => matches!(
                r,
                ReasonCode::Success
                    | ReasonCode::GrantedQos1
                    | ReasonCode::GrantedQos2
                    | ReasonCode::UnspecifiedError
            ),
            (ProtocolVersion::V311, _) => *r == ReasonCode::Success,
        })
        .collect();
    select(all)
}

/// Properties a packet in `context` may carry (none in 3.1.1).
pub fn properties(context: PropertyContext, version: ProtocolVersion) -> BoxedStrategy<Properties> {
    if version == ProtocolVersion::V311 {
        return Just(Properties::default()).boxed();
    }
    let a = (
        option::of(any::<bool>()),
        option::of(any::<u32>()),
        option::of(string()),
        option::of(string()),
        option::of(bytes()),
        vec(1..=qgate_mqtt::varint::MAX, 0..3),
        option::of(any::<u32>()),
        option::of(string()),
        option::of(any::<u16>()),
    );
    let b = (
        option::of(string()),
        option::of(bytes()),
        option::of(any::<bool>()),
        option::of(any::<u32>()),
        option::of(any::<bool>()),
        option::of(string()),
        option::of(string()),
        option::of(string()),
        option::of(1..=u16::MAX),
    );
    let c = (
        option::of(any::<u16>()),
        option::of(any::<u16>()),
        option::of(0..=1u8),
        option::of(any::<bool>()),
        vec((string(), string()), 0..3),
        option::of(1..=u32::MAX),
        option::of(any::<bool>()),
        option::of(any::<bool>()),
        option::of(any::<bool>()),
    );
    (a, b, c)
        .prop_map(move |(a, b, c)| {
            let mut p = Properties {
                payload_format_utf8: a.0,
                message_expiry_interval: a.1,
                content_type: a.2,
                response_topic: a.3,
                correlation_data: a.4,
                subscription_identifiers: a.5,
                session_expiry_interval: a.6,
                assigned_client_identifier: a.7,
                server_keep_alive: a.8,
                authentication_method: b.0,
                authentication_data: b.1,
                request_problem_information: b.2,
                will_delay_interval: b.3,
                request_response_information: b.4,
                response_information: b.5,
                server_reference: b.6,
                reason_string: b.7,
                receive_maximum: b.8,
                topic_alias_maximum: c.0,
                topic_alias: c.1,
                maximum_qos: c.2,
                retain_available: c.3,
                user_properties: c.4,
                maximum_packet_size: c.5,
                wildcard_subscription_available: c.6,
                subscription_identifier_available: c.7,
                shared_subscription_available: c.8,
            };
            keep_allowed(&mut p, context);
            p
        })
        .boxed()
}

/// Clears what `context` may not carry.
fn keep_allowed(p: &mut Properties, context: PropertyContext) {
    fn clear<T>(slot: &mut Option<T>, context: PropertyContext, id: u8) {
        if !context.allows(id) {
            *slot = None;
        }
    }
    clear(&mut p.payload_format_utf8, context, 0x01);
    clear(&mut p.message_expiry_interval, context, 0x02);
    clear(&mut p.content_type, context, 0x03);
    clear(&mut p.response_topic, context, 0x08);
    clear(&mut p.correlation_data, context, 0x09);
    match context {
        PropertyContext::Publish => {}
        PropertyContext::Subscribe => p.subscription_identifiers.truncate(1),
        _ => p.subscription_identifiers.clear(),
    }
    clear(&mut p.session_expiry_interval, context, 0x11);
    clear(&mut p.assigned_client_identifier, context, 0x12);
    clear(&mut p.server_keep_alive, context, 0x13);
    clear(&mut p.authentication_method, context, 0x15);
    clear(&mut p.authentication_data, context, 0x16);
    clear(&mut p.request_problem_information, context, 0x17);
    clear(&mut p.will_delay_interval, context, 0x18);
    clear(&mut p.request_response_information, context, 0x19);
    clear(&mut p.response_information, context, 0x1A);
    clear(&mut p.server_reference, context, 0x1C);
    clear(&mut p.reason_string, context, 0x1F);
    clear(&mut p.receive_maximum, context, 0x21);
    clear(&mut p.topic_alias_maximum, context, 0x22);
    clear(&mut p.topic_alias, context, 0x23);
    clear(&mut p.maximum_qos, context, 0x24);
    clear(&mut p.retain_available, context, 0x25);
    clear(&mut p.maximum_packet_size, context, 0x27);
    clear(&mut p.wildcard_subscription_available, context, 0x28);
    clear(&mut p.subscription_identifier_available, context, 0x29);
    clear(&mut p.shared_subscription_available, context, 0x2A);
}

fn connect(v: ProtocolVersion) -> impl Strategy<Value = Packet> {
    let will = (
        qos(),
        any::<bool>(),
        properties(PropertyContext::Will, v),
        topic_name(),
        bytes(),
    )
        .prop_map(|(qos, retain, properties, topic, payload)| Will {
            qos,
            retain,
            properties,
            topic,
            payload,
        });
    (
        any::<bool>(),
        any::<u16>(),
        properties(PropertyContext::Connect, v),
        string(),
        option::of(will),
        option::of(string()),
        option::of(bytes()),
    )
        .prop_map(
            move |(clean_start, keep_alive, properties, client_id, will, username, password)| {
                // 3.1.1 has no password without a user name.
                let password = password.filter(|_| v == ProtocolVersion::V5 || username.is_some());
                Packet::Connect(Box::new(Connect {
                    protocol: v,
                    clean_start,
                    keep_alive,
                    properties,
                    client_id,
                    will,
                    username,
                    password,
                }))
            },
        )
}

fn publish(v: ProtocolVersion) -> impl Strategy<Value = Packet> {
    (
        qos(),
        any::<bool>(),
        any::<bool>(),
        topic_name(),
        packet_id(),
        properties(PropertyContext::Publish, v),
        bytes(),
    )
        .prop_map(|(qos, dup, retain, topic, id, properties, payload)| {
            let at_most_once = qos == QoS::AtMostOnce;
            Packet::Publish(Publish {
                dup: dup && !at_most_once,
                qos,
                retain,
                topic,
                packet_id: (!at_most_once).then_some(id),
                properties,
                payload,
            })
        })
}

fn response(packet: PacketType, v: ProtocolVersion) -> impl Strategy<Value = PubResponse> {
    (
        packet_id(),
        reason(packet, v),
        properties(PropertyContext::PubResponse, v),
    )
        .prop_map(|(packet_id, reason, properties)| PubResponse {
            packet_id,
            reason,
            properties,
        })
}

fn subscribe(v: ProtocolVersion) -> impl Strategy<Value = Packet> {
    let options =
        (qos(), any::<bool>(), any::<bool>(), 0..3u8).prop_map(move |(qos, nl, rap, rh)| {
            let v5 = v == ProtocolVersion::V5;
            SubscriptionOptions {
                qos,
                no_local: nl && v5,
                retain_as_published: rap && v5,
                retain_handling: match rh {
                    1 if v5 => RetainHandling::OnNewSubscribe,
                    2 if v5 => RetainHandling::Never,
                    _ => RetainHandling::OnSubscribe,
                },
            }
        });
    let filters = vec(
        (string(), options).prop_map(|(filter, options)| Subscription { filter, options }),
        1..4,
    );
    (
        packet_id(),
        properties(PropertyContext::Subscribe, v),
        filters,
    )
        .prop_map(|(packet_id, properties, filters)| {
            Packet::Subscribe(Subscribe {
                packet_id,
                properties,
                filters,
            })
        })
}

/// Any packet `version` can carry, with values it represents exactly.
pub fn packet(v: ProtocolVersion) -> BoxedStrategy<Packet> {
    let acks = prop_oneof![
        response(PacketType::PubAck, v).prop_map(Packet::PubAck),
        response(PacketType::PubRec, v).prop_map(Packet::PubRec),
        response(PacketType::PubRel, v).prop_map(Packet::PubRel),
        response(PacketType::PubComp, v).prop_map(Packet::PubComp),
    ];
    let suback = (
        packet_id(),
        properties(PropertyContext::SubAck, v),
        vec(reason(PacketType::SubAck, v), 0..4),
    )
        .prop_map(|(packet_id, properties, reasons)| {
            Packet::SubAck(SubAck {
                packet_id,
                properties,
                reasons,
            })
        });
    let unsubscribe = (
        packet_id(),
        properties(PropertyContext::Unsubscribe, v),
        vec(string(), 1..4),
    )
        .prop_map(|(packet_id, properties, filters)| {
            Packet::Unsubscribe(Unsubscribe {
                packet_id,
                properties,
                filters,
            })
        });
    let unsuback_reasons = match v {
        ProtocolVersion::V5 => vec(reason(PacketType::UnsubAck, v), 0..4).boxed(),
        ProtocolVersion::V311 => Just(Vec::new()).boxed(),
    };
    let unsuback = (
        packet_id(),
        properties(PropertyContext::UnsubAck, v),
        unsuback_reasons,
    )
        .prop_map(|(packet_id, properties, reasons)| {
            Packet::UnsubAck(UnsubAck {
                packet_id,
                properties,
                reasons,
            })
        });
    let connack = (
        any::<bool>(),
        reason(PacketType::ConnAck, v),
        properties(PropertyContext::ConnAck, v),
    )
        .prop_map(|(session_present, reason, properties)| {
            Packet::ConnAck(ConnAck {
                session_present,
                reason,
                properties,
            })
        });
    let disconnect = (
        reason(PacketType::Disconnect, v),
        properties(PropertyContext::Disconnect, v),
    )
        .prop_map(|(reason, properties)| Packet::Disconnect(Disconnect { reason, properties }));
    let common = prop_oneof![
        connect(v),
        connack,
        publish(v),
        acks,
        subscribe(v),
        suback,
        unsubscribe,
        unsuback,
        Just(Packet::PingReq),
        Just(Packet::PingResp),
        disconnect,
    ];
    match v {
        ProtocolVersion::V311 => common.boxed(),
        ProtocolVersion::V5 => {
            let auth = (
                reason(PacketType::Auth, v),
                properties(PropertyContext::Auth, v),
            )
                .prop_map(|(reason, properties)| Packet::Auth(Auth { reason, properties }));
            prop_oneof![10 => common, 1 => auth].boxed()
        }
    }
}
