//! The connection state machine: handshake, limits, QoS exchanges, and input split anywhere.

use std::time::Duration;

use bytes::Bytes;
use proptest::collection::vec;
use proptest::prelude::*;
use qgate_mqtt::packet::{
    ConnAck, Disconnect, PubResponse, Publish, RetainHandling, Subscribe, Subscription,
    SubscriptionOptions, Unsubscribe,
};
use qgate_mqtt::{
    Accept, ActionError, Closed, Config, DecodeError, Event, Packet, Properties, ProtocolVersion,
    QoS, ReasonCode, Violation,
};

use crate::harness::{connect, publish, Harness};

const V5: ProtocolVersion = ProtocolVersion::V5;
const V311: ProtocolVersion = ProtocolVersion::V311;

fn disconnect(reason: ReasonCode) -> Packet {
    Packet::Disconnect(Disconnect::new(reason))
}

#[test]
fn v5_connect_is_offered_to_the_shell_and_connack_announces_the_limits() {
    let mut h = Harness::new(Config::default(), V5);
    let mut c = connect(V5, 30);
    c.properties.session_expiry_interval = Some(60);
    c.properties.receive_maximum = Some(5);
    c.properties.user_properties = vec![("site".into(), "north".into())];
    h.feed(&Packet::Connect(Box::new(c)));
    let events = h.events();
    let [Event::Connect(req)] = &events[..] else {
        panic!("{events:?}")
    };
    assert_eq!(req.protocol, V5);
    assert_eq!(
        (req.client_id.as_str(), req.keep_alive, req.session_expiry),
        ("sensor-1", 30, 60)
    );
    assert_eq!(
        (req.username.as_deref(), req.password.as_deref()),
        (Some("user"), Some(&b"secret"[..]))
    );
    assert_eq!((req.receive_maximum, req.maximum_packet_size), (5, None));
    assert_eq!(
        req.user_properties,
        [("site".to_owned(), "north".to_owned())]
    );
    assert!(h.sent().is_empty(), "no CONNACK before the shell decides");

    h.conn.accept(Accept::default()).expect("accept");
    let sent = h.sent();
    let [Packet::ConnAck(ConnAck {
        session_present: false,
        reason: ReasonCode::Success,
        properties: p,
    })] = &sent[..]
    else {
        panic!("{sent:?}")
    };
    assert_eq!(p.receive_maximum, Some(32));
    assert_eq!(p.maximum_packet_size, Some(256 * 1024));
    assert_eq!(p.topic_alias_maximum, Some(16));
    assert_eq!(p.server_keep_alive, None, "30 s is within the maximum");
    assert_eq!(p.wildcard_subscription_available, Some(false));
    assert_eq!(p.shared_subscription_available, Some(false));
    assert_eq!(p.subscription_identifier_available, Some(false));
    assert_eq!(
        h.conn.accept(Accept::default()),
        Err(ActionError::NotAwaitingAccept)
    );
}

#[test]
fn v311_connack_is_the_four_spec_bytes() {
    let mut h = Harness::new(Config::default(), V311);
    h.feed(&Packet::Connect(Box::new(connect(V311, 0))));
    assert!(matches!(h.events()[..], [Event::Connect(_)]));
    h.conn
        .accept(Accept {
            session_present: false,
            ..Accept::default()
        })
        .expect("accept");
    assert_eq!(
        h.conn.poll_transmit().as_deref(),
        Some(&[0x20, 0x02, 0x00, 0x00][..])
    );
}

#[test]
fn refusals_before_and_by_the_shell() {
    // The shell refuses; a 3.1.1 client gets the nearest return code.
    let mut h = Harness::new(Config::default(), V311);
    h.feed(&Packet::Connect(Box::new(connect(V311, 0))));
    h.events();
    assert_eq!(
        h.conn.refuse(ReasonCode::Success),
        Err(ActionError::ReasonNotAllowed(ReasonCode::Success))
    );
    h.conn
        .refuse(ReasonCode::BadUserNameOrPassword)
        .expect("refuse");
    assert_eq!(
        h.conn.poll_transmit().as_deref(),
        Some(&[0x20, 0x02, 0x00, 0x04][..])
    );
    assert_eq!(
        h.events(),
        [Event::Closed(Closed::Refused(
            ReasonCode::BadUserNameOrPassword
        ))]
    );
    assert!(h.conn.is_closed());

    // 3.1.1: an empty client identifier needs Clean Session.
    let mut h = Harness::new(Config::default(), V311);
    let mut c = connect(V311, 0);
    c.client_id.clear();
    c.clean_start = false;
    h.feed(&Packet::Connect(Box::new(c)));
    assert_eq!(
        h.conn.poll_transmit().as_deref(),
        Some(&[0x20, 0x02, 0x00, 0x02][..])
    );
    assert_eq!(
        h.events(),
        [Event::Closed(Closed::Refused(
            ReasonCode::ClientIdentifierNotValid
        ))]
    );

    // MQTT 3.1 ("MQIsdp", level 3) is told its level is not supported.
    let mut h = Harness::new(Config::default(), V311);
    let mut mqisdp = vec![0x10, 0x12, 0x00, 0x06];
    mqisdp.extend(b"MQIsdp");
    mqisdp.extend([0x03, 0x02, 0x00, 0x3C, 0x00, 0x04]);
    mqisdp.extend(b"abcd");
    h.feed_bytes(&mqisdp);
    assert_eq!(
        h.conn.poll_transmit().as_deref(),
        Some(&[0x20, 0x02, 0x00, 0x01][..])
    );
    assert_eq!(
        h.events(),
        [Event::Closed(Closed::Refused(
            ReasonCode::UnsupportedProtocolVersion
        ))]
    );

    // 5.0 enhanced authentication is not offered.
    let mut h = Harness::new(Config::default(), V5);
    let mut c = connect(V5, 0);
    c.properties.authentication_method = Some("SCRAM-SHA-1".into());
    h.feed(&Packet::Connect(Box::new(c)));
    assert!(matches!(
        &h.sent()[..],
        [Packet::ConnAck(ConnAck {
            reason: ReasonCode::BadAuthenticationMethod,
            ..
        })]
    ));

    // A malformed 5.0 CONNECT is answered with CONNACK 0x81.
    let mut h = Harness::new(Config::default(), V5);
    let mut bytes = Packet::Connect(Box::new(connect(V5, 0)))
        .to_bytes(V5)
        .expect("encodes")
        .to_vec();
    bytes[9] |= 0x01; // reserved connect flag
    h.feed_bytes(&bytes);
    assert!(matches!(
        &h.sent()[..],
        [Packet::ConnAck(ConnAck {
            reason: ReasonCode::MalformedPacket,
            ..
        })]
    ));
    assert!(h.conn.is_closed());
}

#[test]
fn v5_empty_client_id_needs_an_assigned_one() {
    let mut h = Harness::new(Config::default(), V5);
    let mut c = connect(V5, 0);
    c.client_id.clear();
    h.feed(&Packet::Connect(Box::new(c)));
    h.events();
    assert_eq!(
        h.conn.accept(Accept::default()),
        Err(ActionError::AssignedClientIdRequired)
    );
    h.conn
        .accept(Accept {
            assigned_client_id: Some("gw-7".into()),
            ..Accept::default()
        })
        .expect("accept");
    let sent = h.sent();
    let [Packet::ConnAck(ack)] = &sent[..] else {
        panic!("{sent:?}")
    };
    assert_eq!(
        ack.properties.assigned_client_identifier.as_deref(),
        Some("gw-7")
    );
}

#[test]
fn first_packet_must_be_connect_and_only_once() {
    let mut h = Harness::new(Config::default(), V5);
    h.feed(&Packet::PingReq);
    assert_eq!(
        h.events(),
        [Event::Closed(Closed::Violation(
            Violation::FirstPacketNotConnect(qgate_mqtt::PacketType::PingReq)
        ))]
    );
    assert!(h.sent().is_empty());

    let mut h = Harness::connected(Config::default(), V5);
    h.feed(&Packet::Connect(Box::new(connect(V5, 0))));
    assert_eq!(h.sent(), [disconnect(ReasonCode::ProtocolError)]);
    assert_eq!(
        h.events(),
        [Event::Closed(Closed::Violation(Violation::SecondConnect))]
    );
}

#[test]
fn connect_deadline_covers_the_connect_and_the_shells_decision() {
    let mut h = Harness::new(Config::default(), V5);
    assert_eq!(
        h.conn.poll_timeout(),
        Some(h.start + Duration::from_secs(10))
    );
    h.advance(Duration::from_millis(9_999));
    assert!(!h.conn.is_closed());
    h.advance(Duration::from_millis(1));
    assert_eq!(h.events(), [Event::Closed(Closed::ConnectTimeout)]);
    assert!(h.sent().is_empty());
    assert_eq!(h.conn.poll_timeout(), None);

    // CONNECT in time, but the shell never answers.
    let mut h = Harness::new(Config::default(), V5);
    h.advance(Duration::from_secs(5));
    h.feed(&Packet::Connect(Box::new(connect(V5, 0))));
    assert!(matches!(h.events()[..], [Event::Connect(_)]));
    h.advance(Duration::from_secs(5));
    assert_eq!(h.events(), [Event::Closed(Closed::ConnectTimeout)]);
    assert_eq!(h.conn.accept(Accept::default()), Err(ActionError::Closed));
}

#[test]
fn keep_alive_is_one_and_a_half_periods_since_the_last_packet() {
    let mut h = Harness::connected_with(Config::default(), connect(V5, 10));
    assert_eq!(
        h.conn.poll_timeout(),
        Some(h.start + Duration::from_secs(15))
    );
    h.advance(Duration::from_secs(10));
    h.feed(&Packet::PingReq);
    assert_eq!(h.sent(), [Packet::PingResp]);
    assert_eq!(
        h.conn.poll_timeout(),
        Some(h.start + Duration::from_secs(25))
    );
    h.advance(Duration::from_millis(14_999));
    assert!(!h.conn.is_closed());
    h.advance(Duration::from_millis(1));
    assert_eq!(h.sent(), [disconnect(ReasonCode::KeepAliveTimeout)]);
    assert_eq!(h.events(), [Event::Closed(Closed::KeepAliveTimeout)]);

    // 3.1.1: closed without a DISCONNECT.
    let mut h = Harness::connected_with(Config::default(), connect(V311, 2));
    h.advance(Duration::from_secs(3));
    assert!(h.sent().is_empty());
    assert_eq!(h.events(), [Event::Closed(Closed::KeepAliveTimeout)]);
}

#[test]
fn keep_alive_is_capped_and_announced() {
    let config = Config {
        max_keep_alive: Some(60),
        ..Config::default()
    };
    let mut h = Harness::new(config.clone(), V5);
    h.feed(&Packet::Connect(Box::new(connect(V5, 0))));
    h.events();
    h.conn.accept(Accept::default()).expect("accept");
    let sent = h.sent();
    let [Packet::ConnAck(ack)] = &sent[..] else {
        panic!("{sent:?}")
    };
    assert_eq!(ack.properties.server_keep_alive, Some(60));
    assert_eq!(
        h.conn.poll_timeout(),
        Some(h.start + Duration::from_secs(90))
    );

    let h = Harness::connected_with(
        Config {
            max_keep_alive: None,
            ..config
        },
        connect(V5, 0),
    );
    assert_eq!(h.conn.poll_timeout(), None);
}

#[test]
fn qos1_is_acknowledged_only_when_the_shell_has_stored_it() {
    let mut h = Harness::connected(Config::default(), V5);
    h.feed(&publish(QoS::AtLeastOnce, 3, "d/1/temp", b"21.5"));
    let (messages, closed) = h.messages();
    assert_eq!(closed, None);
    let [m] = &messages[..] else {
        panic!("{messages:?}")
    };
    assert_eq!(
        (m.packet_id, m.qos, m.topic.as_str(), &m.payload[..]),
        (Some(3), QoS::AtLeastOnce, "d/1/temp", &b"21.5"[..])
    );
    assert!(h.sent().is_empty());
    h.conn.ack(3).expect("ack");
    assert_eq!(h.sent(), [Packet::PubAck(PubResponse::success(3))]);
    assert_eq!(h.conn.ack(3), Err(ActionError::UnknownPacketId(3)));
}

#[test]
fn qos2_is_delivered_once_and_pubrel_is_answered_with_pubcomp() {
    let mut h = Harness::connected(Config::default(), V5);
    let first = publish(QoS::ExactlyOnce, 7, "d/1/x", b"a");
    h.feed(&first);
    assert_eq!(h.messages().0.len(), 1);
    // Resent before our PUBREC: not delivered again, and not answered until the shell acks.
    let Packet::Publish(p) = &first else {
        unreachable!()
    };
    let dup = Packet::Publish(Publish {
        dup: true,
        ..p.clone()
    });
    h.feed(&dup);
    assert_eq!(h.messages().0.len(), 0);
    assert!(h.sent().is_empty());
    h.conn.ack(7).expect("ack");
    assert_eq!(h.sent(), [Packet::PubRec(PubResponse::success(7))]);
    // Resent after PUBREC (ours was lost): PUBREC again, still no delivery.
    h.feed(&dup);
    assert_eq!(h.messages().0.len(), 0);
    assert_eq!(h.sent(), [Packet::PubRec(PubResponse::success(7))]);
    h.feed(&Packet::PubRel(PubResponse::success(7)));
    assert_eq!(h.sent(), [Packet::PubComp(PubResponse::success(7))]);
    // A PUBREL resent after PUBCOMP: the id is gone.
    h.feed(&Packet::PubRel(PubResponse::success(7)));
    let [Packet::PubComp(comp)] = &h.sent()[..] else {
        panic!()
    };
    assert_eq!(comp.reason, ReasonCode::PacketIdentifierNotFound);
    // The id is free again: a new message with it is delivered.
    h.feed(&first);
    assert_eq!(h.messages().0.len(), 1);
}

#[test]
fn pubrel_before_pubrec_is_a_protocol_error() {
    let mut h = Harness::connected(Config::default(), V5);
    h.feed(&publish(QoS::ExactlyOnce, 9, "t", b""));
    h.feed(&Packet::PubRel(PubResponse::success(9)));
    assert_eq!(h.sent(), [disconnect(ReasonCode::ProtocolError)]);
    assert_eq!(
        h.messages().1,
        Some(Closed::Violation(Violation::PacketIdOutOfOrder(9)))
    );
}

#[test]
fn nack_refuses_in_5_0_and_closes_3_1_1() {
    let mut h = Harness::connected(Config::default(), V5);
    h.feed(&publish(QoS::AtLeastOnce, 1, "t", b"x"));
    h.feed(&publish(QoS::ExactlyOnce, 2, "t", b"y"));
    h.events();
    assert_eq!(
        h.conn.nack(1, ReasonCode::ServerBusy),
        Err(ActionError::ReasonNotAllowed(ReasonCode::ServerBusy))
    );
    h.conn.nack(1, ReasonCode::QuotaExceeded).expect("nack");
    h.conn.nack(2, ReasonCode::NotAuthorized).expect("nack");
    let sent = h.sent();
    let [Packet::PubAck(a), Packet::PubRec(b)] = &sent[..] else {
        panic!("{sent:?}")
    };
    assert_eq!(
        (a.packet_id, a.reason, b.packet_id, b.reason),
        (1, ReasonCode::QuotaExceeded, 2, ReasonCode::NotAuthorized)
    );

    let mut h = Harness::connected(Config::default(), V311);
    h.feed(&publish(QoS::AtLeastOnce, 1, "t", b"x"));
    h.events();
    h.conn.nack(1, ReasonCode::QuotaExceeded).expect("nack");
    assert!(h.sent().is_empty());
    assert_eq!(
        h.events(),
        [Event::Closed(Closed::ByServer(ReasonCode::QuotaExceeded))]
    );
}

#[test]
fn receive_maximum_exceeded() {
    for version in [V5, V311] {
        let mut h = Harness::connected(
            Config {
                receive_maximum: 2,
                ..Config::default()
            },
            version,
        );
        h.feed(&publish(QoS::AtLeastOnce, 1, "t", b""));
        h.feed(&publish(QoS::ExactlyOnce, 2, "t", b""));
        h.feed(&publish(QoS::AtMostOnce, 0, "t", b""));
        let (messages, closed) = h.messages();
        assert_eq!((messages.len(), closed), (3, None));
        h.conn.ack(1).expect("ack");
        h.conn.ack(2).expect("ack");
        h.sent();
        // The QoS 2 exchange still counts until PUBCOMP.
        h.feed(&publish(QoS::AtLeastOnce, 3, "t", b""));
        h.feed(&publish(QoS::AtLeastOnce, 4, "t", b""));
        let (messages, closed) = h.messages();
        assert_eq!(messages.len(), 1);
        assert_eq!(
            closed,
            Some(Closed::Violation(Violation::ReceiveMaximumExceeded))
        );
        let expected = match version {
            V5 => vec![disconnect(ReasonCode::ReceiveMaximumExceeded)],
            V311 => vec![],
        };
        assert_eq!(h.sent(), expected);
    }
}

#[test]
fn too_large_packet_is_refused_from_its_fixed_header() {
    let mut h = Harness::connected(
        Config {
            max_packet_size: 1024,
            ..Config::default()
        },
        V5,
    );
    // PUBLISH with a remaining length of 100 000: three header bytes, no body yet.
    h.feed_bytes(&[0x30, 0xA0, 0x8D, 0x06]);
    assert_eq!(h.sent(), [disconnect(ReasonCode::PacketTooLarge)]);
    assert_eq!(
        h.messages().1,
        Some(Closed::Violation(Violation::Decode(
            DecodeError::PacketTooLarge {
                size: 100_004,
                max: 1024
            }
        )))
    );
    // Exactly the maximum is fine.
    let mut h = Harness::connected(
        Config {
            max_packet_size: 1024,
            ..Config::default()
        },
        V311,
    );
    let payload: &'static [u8] = Box::leak(vec![7u8; 1024 - 3 - 5].into_boxed_slice());
    let p = publish(QoS::AtMostOnce, 0, "a/b", payload);
    assert_eq!(p.to_bytes(V311).expect("encodes").len(), 1024);
    h.feed(&p);
    assert_eq!(h.messages().0.len(), 1);
}

fn aliased(topic: &str, alias: u16) -> Packet {
    let Packet::Publish(mut p) = publish(QoS::AtMostOnce, 0, topic, b"v") else {
        unreachable!()
    };
    p.properties.topic_alias = Some(alias);
    Packet::Publish(p)
}

#[test]
fn topic_aliases_map_and_refuse_out_of_range() {
    let mut h = Harness::connected(Config::default(), V5);
    h.feed(&aliased("d/7/temp", 1));
    h.feed(&aliased("", 1));
    h.feed(&aliased("d/7/hum", 16));
    h.feed(&aliased("d/7/rain", 1));
    h.feed(&aliased("", 1));
    h.feed(&aliased("", 16));
    let topics: Vec<_> = h.messages().0.into_iter().map(|m| m.topic).collect();
    assert_eq!(
        topics,
        ["d/7/temp", "d/7/temp", "d/7/hum", "d/7/rain", "d/7/rain", "d/7/hum"]
    );

    for (packet, violation, reason) in [
        (
            aliased("x", 17),
            Violation::TopicAliasInvalid(17),
            ReasonCode::TopicAliasInvalid,
        ),
        (
            aliased("x", 0),
            Violation::TopicAliasInvalid(0),
            ReasonCode::TopicAliasInvalid,
        ),
        (
            aliased("", 2),
            Violation::TopicAliasUnknown(2),
            ReasonCode::ProtocolError,
        ),
        (
            publish(QoS::AtMostOnce, 0, "", b""),
            Violation::EmptyTopic,
            ReasonCode::ProtocolError,
        ),
    ] {
        let mut h = Harness::connected(Config::default(), V5);
        h.feed(&packet);
        assert_eq!(h.sent(), [disconnect(reason)]);
        assert_eq!(h.messages().1, Some(Closed::Violation(violation)));
    }

    // No aliases offered: any alias is out of range.
    let mut h = Harness::connected(
        Config {
            topic_alias_maximum: 0,
            ..Config::default()
        },
        V5,
    );
    h.feed(&aliased("x", 1));
    assert_eq!(h.sent(), [disconnect(ReasonCode::TopicAliasInvalid)]);
}

#[test]
fn publish_properties_reach_the_shell() {
    let mut h = Harness::connected(Config::default(), V5);
    let Packet::Publish(mut p) = publish(QoS::AtMostOnce, 0, "t", b"{}") else {
        unreachable!()
    };
    p.retain = true;
    p.properties = Properties {
        payload_format_utf8: Some(true),
        message_expiry_interval: Some(30),
        content_type: Some("application/json".into()),
        user_properties: vec![("unit".into(), "C".into())],
        ..Properties::default()
    };
    h.feed(&Packet::Publish(p));
    let (messages, _) = h.messages();
    let m = &messages[0];
    assert!(m.retain && m.payload_is_utf8);
    assert_eq!(
        (m.message_expiry, m.content_type.as_deref()),
        (Some(30), Some("application/json"))
    );
    assert_eq!(m.user_properties, [("unit".to_owned(), "C".to_owned())]);
}

fn subscribe(filters: &[&str]) -> Packet {
    let options = SubscriptionOptions {
        qos: QoS::AtLeastOnce,
        no_local: false,
        retain_as_published: false,
        retain_handling: RetainHandling::OnSubscribe,
    };
    let filters = filters
        .iter()
        .map(|f| Subscription {
            filter: (*f).into(),
            options,
        })
        .collect();
    Packet::Subscribe(Subscribe {
        packet_id: 4,
        properties: Properties::default(),
        filters,
    })
}

#[test]
fn subscribe_and_unsubscribe_are_answered_not_ignored() {
    let mut h = Harness::connected(Config::default(), V5);
    h.feed(&subscribe(&["cmd/+/set", "bad#"]));
    let sent = h.sent();
    let [Packet::SubAck(ack)] = &sent[..] else {
        panic!("{sent:?}")
    };
    assert_eq!(ack.packet_id, 4);
    assert_eq!(
        ack.reasons,
        [
            ReasonCode::ImplementationSpecificError,
            ReasonCode::TopicFilterInvalid
        ]
    );
    assert_eq!(
        ack.properties.reason_string.as_deref(),
        Some(qgate_mqtt::connection::SUBSCRIBE_REFUSAL)
    );
    h.feed(&Packet::Unsubscribe(Unsubscribe {
        packet_id: 5,
        properties: Properties::default(),
        filters: vec!["a".into(), "b".into()],
    }));
    let sent = h.sent();
    let [Packet::UnsubAck(ack)] = &sent[..] else {
        panic!("{sent:?}")
    };
    assert_eq!(
        (ack.packet_id, &ack.reasons[..]),
        (5, &[ReasonCode::NoSubscriptionExisted; 2][..])
    );
    assert!(!h.conn.is_closed());

    let mut h = Harness::connected(Config::default(), V311);
    h.feed(&subscribe(&["cmd/#"]));
    h.feed_bytes(&[0xA2, 0x05, 0x00, 0x06, 0x00, 0x01, b'a']);
    assert_eq!(
        h.conn.poll_transmit().as_deref(),
        Some(&[0x90, 0x03, 0x00, 0x04, 0x80, 0xB0, 0x02, 0x00, 0x06][..])
    );
}

#[test]
fn reason_string_is_dropped_for_a_client_with_a_small_maximum_packet_size() {
    let mut c = connect(V5, 0);
    c.properties.maximum_packet_size = Some(16);
    let mut h = Harness::connected_with(Config::default(), c);
    h.feed(&subscribe(&["a"]));
    let sent = h.sent();
    let [Packet::SubAck(ack)] = &sent[..] else {
        panic!("{sent:?}")
    };
    assert_eq!(ack.properties.reason_string, None);
}

#[test]
fn no_reason_string_for_a_client_that_asks_for_no_problem_information() {
    let mut c = connect(V5, 0);
    c.properties.request_problem_information = Some(false);
    let mut h = Harness::connected_with(Config::default(), c);
    h.feed(&subscribe(&["a"]));
    let sent = h.sent();
    let [Packet::SubAck(ack)] = &sent[..] else {
        panic!("{sent:?}")
    };
    assert_eq!(ack.properties.reason_string, None);
    assert_eq!(ack.reasons, [ReasonCode::ImplementationSpecificError]);
}

#[test]
fn garbage_after_connack_closes_with_the_right_reason() {
    for (bytes, reason) in [
        (&[0x00, 0x00][..], ReasonCode::MalformedPacket),
        (&[0x62, 0x02, 0x00, 0x00][..], ReasonCode::ProtocolError),
        (
            &[0x30, 0x03, 0x00, 0x01, 0x00][..],
            ReasonCode::MalformedPacket,
        ),
        (
            &[0x20, 0x03, 0x00, 0x00, 0x00][..],
            ReasonCode::ProtocolError,
        ),
        (&[0xF0, 0x00][..], ReasonCode::ProtocolError),
        (
            &[0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F][..],
            ReasonCode::MalformedPacket,
        ),
    ] {
        let mut h = Harness::connected(Config::default(), V5);
        h.feed_bytes(bytes);
        assert_eq!(h.sent(), [disconnect(reason)], "{bytes:02X?}");
        assert!(h.conn.is_closed());
        // Nothing after the close is read.
        h.feed(&Packet::PingReq);
        assert!(h.sent().is_empty());
    }
    // 3.1.1 closes silently.
    let mut h = Harness::connected(Config::default(), V311);
    h.feed_bytes(&[0x00, 0x00]);
    assert!(h.sent().is_empty());
    assert!(h.conn.is_closed());
}

#[test]
fn client_disconnect_ends_the_connection() {
    let mut h = Harness::connected(Config::default(), V5);
    h.feed(&disconnect(ReasonCode::DisconnectWithWillMessage));
    assert_eq!(
        h.events(),
        [Event::Closed(Closed::ByClient(
            ReasonCode::DisconnectWithWillMessage
        ))]
    );
    assert!(h.sent().is_empty());

    // Session expiry 0 on CONNECT may not become non-zero on DISCONNECT.
    let mut h = Harness::connected(Config::default(), V5);
    let mut d = Disconnect::new(ReasonCode::Success);
    d.properties.session_expiry_interval = Some(10);
    h.feed(&Packet::Disconnect(d));
    assert_eq!(h.sent(), [disconnect(ReasonCode::ProtocolError)]);
}

#[test]
fn server_close_sends_disconnect_in_5_0() {
    let mut h = Harness::connected(Config::default(), V5);
    h.conn.close(ReasonCode::ServerShuttingDown).expect("close");
    assert_eq!(h.sent(), [disconnect(ReasonCode::ServerShuttingDown)]);
    assert_eq!(
        h.events(),
        [Event::Closed(Closed::ByServer(
            ReasonCode::ServerShuttingDown
        ))]
    );
    assert_eq!(
        h.conn.close(ReasonCode::ServerShuttingDown),
        Err(ActionError::Closed)
    );
}

#[test]
fn packets_sent_after_connect_wait_for_accept() {
    let mut h = Harness::new(Config::default(), V5);
    let mut bytes = Packet::Connect(Box::new(connect(V5, 0)))
        .to_bytes(V5)
        .expect("encodes")
        .to_vec();
    bytes.extend_from_slice(
        &publish(QoS::AtLeastOnce, 1, "early", b"!")
            .to_bytes(V5)
            .expect("encodes"),
    );
    h.feed_bytes(&bytes);
    assert!(matches!(h.events()[..], [Event::Connect(_)]));
    h.conn.accept(Accept::default()).expect("accept");
    let (messages, _) = h.messages();
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].topic, "early");

    // More than a packet's worth while the shell decides closes the connection.
    let mut h = Harness::new(
        Config {
            max_packet_size: 64,
            ..Config::default()
        },
        V5,
    );
    h.feed(&Packet::Connect(Box::new(connect(V5, 0))));
    h.feed_bytes(&[0xC0, 0x00].repeat(33));
    let events = h.events();
    assert_eq!(
        events.last(),
        Some(&Event::Closed(Closed::Violation(
            Violation::InputBeforeConnAck
        )))
    );
}

/// What a client sends after CONNECT in the split test.
fn client_packet() -> impl Strategy<Value = Packet> {
    let payload = vec(any::<u8>(), 0..40).prop_map(Bytes::from);
    prop_oneof![
        4 => (0..3u8, 1..6u16, "[a-z]{1,5}", payload).prop_map(|(qos, id, topic, payload)| {
            let qos = QoS::from_bits(qos).expect("0..3");
            Packet::Publish(Publish {
                dup: false,
                qos,
                retain: false,
                topic,
                packet_id: (qos != QoS::AtMostOnce).then_some(id),
                properties: Properties::default(),
                payload,
            })
        }),
        1 => (1..6u16).prop_map(|id| Packet::PubRel(PubResponse::success(id))),
        1 => Just(Packet::PingReq),
        1 => Just(subscribe(&["a/+"])),
    ]
}

/// Feeds `stream` in the given chunks to a connection whose shell accepts at once and acks every
/// message once all input is in (acking between chunks would make the outcome depend on the
/// cuts: a resent QoS 1 id is a duplicate before its ack and a new message after), returning
/// the events and all bytes written.
fn run(stream: &[u8], cuts: &[usize]) -> (Vec<Event>, Vec<u8>) {
    let mut h = Harness::new(Config::default(), V5);
    let mut events = Vec::new();
    let mut out = Vec::new();
    let mut at = 0;
    let mut bounds: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
    bounds.sort_unstable();
    bounds.push(stream.len());
    let mut to_ack = Vec::new();
    let mut drain = |h: &mut Harness, events: &mut Vec<Event>, to_ack: &mut Vec<u16>| {
        while let Some(event) = h.conn.poll_event() {
            match &event {
                Event::Connect(_) => h.conn.accept(Accept::default()).expect("accept"),
                Event::Publish(m) => to_ack.extend(m.packet_id),
                Event::Closed(_) => {}
            }
            events.push(event);
        }
        while let Some(bytes) = h.conn.poll_transmit() {
            out.extend_from_slice(&bytes);
        }
    };
    for end in bounds {
        h.feed_bytes(&stream[at..end]);
        at = end;
        drain(&mut h, &mut events, &mut to_ack);
    }
    for id in to_ack {
        match h.conn.ack(id) {
            Ok(()) | Err(ActionError::Closed) => {}
            Err(e) => panic!("ack {id}: {e}"),
        }
    }
    drain(&mut h, &mut events, &mut Vec::new());
    (events, out)
}

proptest! {
    #[test]
    fn input_split_anywhere_gives_the_same_events_and_output(
        packets in vec(client_packet(), 1..12),
        cuts in vec(any::<usize>(), 0..10),
    ) {
        let mut stream = Packet::Connect(Box::new(connect(V5, 0))).to_bytes(V5).expect("encodes").to_vec();
        for p in &packets {
            stream.extend_from_slice(&p.to_bytes(V5).expect("encodes"));
        }
        let whole = run(&stream, &[]);
        prop_assert!(matches!(whole.0.first(), Some(Event::Connect(_))));
        let split = run(&stream, &cuts);
        prop_assert_eq!(&split, &whole);
        let byte_at_a_time: Vec<usize> = (0..stream.len()).collect();
        prop_assert_eq!(run(&stream, &byte_at_a_time), whole);
    }
}
