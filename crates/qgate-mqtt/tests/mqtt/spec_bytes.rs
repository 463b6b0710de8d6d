//! Byte vectors from the specs' examples (MQTT 5.0 and 3.1.1), and the short forms 5.0 allows.

use bytes::Bytes;
use qgate_mqtt::packet::{PubResponse, RetainHandling, Subscription};
use qgate_mqtt::{DecodeError, Packet, PacketType, Properties, ProtocolVersion, QoS, ReasonCode};

const V5: ProtocolVersion = ProtocolVersion::V5;
const V311: ProtocolVersion = ProtocolVersion::V311;

fn parse(bytes: &[u8], version: ProtocolVersion) -> Result<Packet, DecodeError> {
    Packet::parse(Bytes::copy_from_slice(bytes), version)
}

fn emit(packet: &Packet, version: ProtocolVersion) -> Vec<u8> {
    packet.to_bytes(version).expect("encodes").to_vec()
}

/// A CONNECT whose variable header is the spec's example (3.1.1 §3.1.2.10 Figure 3.6; 5.0
/// §3.1.2.11 Figure 3-6): flags 0xCE = user name, password, will QoS 1, will, clean start;
/// keep-alive 10 s; in 5.0 a Session Expiry Interval of 10.
fn spec_connect(v5: bool) -> Vec<u8> {
    let mut body = vec![
        0x00,
        0x04,
        b'M',
        b'Q',
        b'T',
        b'T',
        if v5 { 5 } else { 4 },
        0xCE,
        0x00,
        0x0A,
    ];
    if v5 {
        body.extend([0x05, 0x11, 0x00, 0x00, 0x00, 0x0A]);
    }
    body.extend([0x00, 0x03, b'd', b'e', b'v']);
    if v5 {
        body.push(0x00); // will properties
    }
    body.extend([0x00, 0x03, b'a', b'/', b'w', 0x00, 0x02, b'h', b'i']);
    body.extend([0x00, 0x04, b'u', b's', b'e', b'r', 0x00, 0x02, 0xFF, 0x00]);
    let mut packet = vec![0x10, body.len() as u8];
    packet.extend(body);
    packet
}

#[test]
fn connect_spec_examples_parse_in_both_versions() {
    for v5 in [false, true] {
        let bytes = spec_connect(v5);
        let Ok(Packet::Connect(c)) = parse(&bytes, V5) else {
            panic!("CONNECT v5={v5} did not parse");
        };
        assert_eq!(c.protocol, if v5 { V5 } else { V311 });
        assert!(c.clean_start);
        assert_eq!(c.keep_alive, 10);
        assert_eq!(c.properties.session_expiry_interval, v5.then_some(10));
        assert_eq!(c.client_id, "dev");
        let will = c.will.as_ref().expect("will");
        assert_eq!(
            (will.qos, will.retain, will.topic.as_str()),
            (QoS::AtLeastOnce, false, "a/w")
        );
        assert_eq!(&will.payload[..], b"hi");
        assert_eq!(c.username.as_deref(), Some("user"));
        assert_eq!(c.password.as_deref(), Some(&[0xFF, 0x00][..]));
        assert_eq!(
            emit(&Packet::Connect(c), V311),
            bytes,
            "re-emits in its own version"
        );
    }
}

#[test]
fn connect_flag_rules() {
    let mut reserved = spec_connect(true);
    reserved[9] |= 0x01;
    assert_eq!(
        parse(&reserved, V5),
        Err(DecodeError::InvalidConnectFlags(0xCF))
    );
    // 3.1.1: a password without a user name.
    let mut password_only = spec_connect(false);
    password_only[9] &= !0x80;
    assert_eq!(
        parse(&password_only, V5),
        Err(DecodeError::InvalidConnectFlags(0x4E))
    );
    // Will QoS without the will flag.
    let mut will_qos = spec_connect(false);
    will_qos[9] &= !0x04;
    assert_eq!(
        parse(&will_qos, V5),
        Err(DecodeError::InvalidConnectFlags(0xCA))
    );
    let mut level = spec_connect(false);
    level[8] = 6;
    assert_eq!(
        parse(&level, V5),
        Err(DecodeError::UnsupportedProtocolVersion(6))
    );
    let mut name = spec_connect(false);
    name[5] = b'X';
    assert_eq!(parse(&name, V5), Err(DecodeError::InvalidProtocolName));
}

#[test]
fn publish_spec_example() {
    // 3.1.1 §3.3.2.3 Figure 3.11: topic "a/b", packet identifier 10.
    let v311 = [
        0x32, 0x09, 0x00, 0x03, b'a', b'/', b'b', 0x00, 0x0A, b'h', b'i',
    ];
    let Ok(Packet::Publish(p)) = parse(&v311, V311) else {
        panic!("PUBLISH")
    };
    assert_eq!(
        (p.qos, p.packet_id, p.topic.as_str(), &p.payload[..]),
        (QoS::AtLeastOnce, Some(10), "a/b", &b"hi"[..])
    );
    // 5.0 adds a property length; here a Topic Alias of 1.
    let v5 = [
        0x32, 0x0C, 0x00, 0x03, b'a', b'/', b'b', 0x00, 0x0A, 0x03, 0x23, 0x00, 0x01, b'h',
    ];
    assert_eq!(parse(&v5[..13], V5), Err(DecodeError::Truncated));
    let v5 = [
        0x32, 0x0B, 0x00, 0x03, b'a', b'/', b'b', 0x00, 0x0A, 0x03, 0x23, 0x00, 0x01,
    ];
    let Ok(Packet::Publish(p)) = parse(&v5, V5) else {
        panic!("PUBLISH v5")
    };
    assert_eq!(p.properties.topic_alias, Some(1));
    assert!(p.payload.is_empty());
}

#[test]
fn publish_rules() {
    // Wildcard in a topic name.
    assert_eq!(
        parse(&[0x30, 0x04, 0x00, 0x02, b'a', b'#'], V311),
        Err(DecodeError::TopicNameHasWildcard)
    );
    // Packet identifier 0 at QoS 1.
    assert_eq!(
        parse(&[0x32, 0x05, 0x00, 0x01, b'a', 0x00, 0x00], V311),
        Err(DecodeError::ZeroPacketId)
    );
    // QoS 3 in the fixed header.
    assert_eq!(
        parse(&[0x36, 0x03, 0x00, 0x01, b'a'], V311),
        Err(DecodeError::InvalidQos)
    );
    // U+0000 in the topic.
    assert_eq!(
        parse(&[0x30, 0x03, 0x00, 0x01, 0x00], V311),
        Err(DecodeError::InvalidUtf8)
    );
    // A remaining length past the end, or short of it.
    assert_eq!(
        parse(&[0x30, 0x05, 0x00, 0x01, b'a'], V311),
        Err(DecodeError::Truncated)
    );
    assert_eq!(
        parse(&[0xC0, 0x01, 0x00], V311),
        Err(DecodeError::TrailingBytes(1))
    );
}

#[test]
fn subscribe_suback_unsubscribe_spec_examples() {
    // 3.1.1 §3.8.3 Figure 3.22: id 10, "a/b" QoS 1, "c/d" QoS 2.
    let sub = [
        0x82, 0x0E, 0x00, 0x0A, 0x00, 0x03, b'a', b'/', b'b', 0x01, 0x00, 0x03, b'c', b'/', b'd',
        0x02,
    ];
    let Ok(Packet::Subscribe(s)) = parse(&sub, V311) else {
        panic!("SUBSCRIBE")
    };
    assert_eq!(s.packet_id, 10);
    let filters: Vec<_> = s
        .filters
        .iter()
        .map(|Subscription { filter, options }| (filter.as_str(), options.qos))
        .collect();
    assert_eq!(
        filters,
        [("a/b", QoS::AtLeastOnce), ("c/d", QoS::ExactlyOnce)]
    );
    assert_eq!(
        s.filters[0].options.retain_handling,
        RetainHandling::OnSubscribe
    );
    // 3.1.1 options with reserved bits; 5.0 retain handling 3; a SUBSCRIBE without filters.
    let mut reserved = sub;
    reserved[9] = 0x05;
    assert_eq!(
        parse(&reserved, V311),
        Err(DecodeError::InvalidSubscriptionOptions(0x05))
    );
    let v5 = [
        0x82, 0x09, 0x00, 0x0A, 0x00, 0x00, 0x03, b'a', b'/', b'b', 0x30,
    ];
    assert_eq!(parse(&v5, V5), Err(DecodeError::InvalidRetainHandling));
    assert_eq!(
        parse(&[0x82, 0x02, 0x00, 0x0A], V311),
        Err(DecodeError::NoTopicFilters)
    );
    assert!(matches!(
        parse(&[0x80, 0x02, 0x00, 0x0A], V311),
        Err(DecodeError::InvalidFlags { .. })
    ));

    // 3.1.1 §3.9.3 Figure 3.26: success QoS 0, success QoS 2, failure.
    let suback = [0x90, 0x05, 0x00, 0x0A, 0x00, 0x02, 0x80];
    let Ok(Packet::SubAck(a)) = parse(&suback, V311) else {
        panic!("SUBACK")
    };
    assert_eq!(
        a.reasons,
        [
            ReasonCode::Success,
            ReasonCode::GrantedQos2,
            ReasonCode::UnspecifiedError
        ]
    );
    assert_eq!(
        parse(&[0x90, 0x03, 0x00, 0x0A, 0x83], V311),
        Err(DecodeError::InvalidReasonCode(0x83))
    );

    // 3.1.1 §3.10.3 Figure 3.30: id 10, "a/b", "c/d".
    let unsub = [
        0xA2, 0x0C, 0x00, 0x0A, 0x00, 0x03, b'a', b'/', b'b', 0x00, 0x03, b'c', b'/', b'd',
    ];
    let Ok(Packet::Unsubscribe(u)) = parse(&unsub, V311) else {
        panic!("UNSUBSCRIBE")
    };
    assert_eq!(u.filters, ["a/b", "c/d"]);
}

#[test]
fn short_forms_of_5_0_acknowledgements_and_disconnect() {
    let ok = Packet::PubAck(PubResponse::success(1));
    assert_eq!(parse(&[0x40, 0x02, 0x00, 0x01], V5), Ok(ok.clone()));
    assert_eq!(emit(&ok, V5), [0x40, 0x02, 0x00, 0x01]);
    let no_subs = [0x40, 0x03, 0x00, 0x01, 0x10];
    let Ok(Packet::PubAck(a)) = parse(&no_subs, V5) else {
        panic!("PUBACK")
    };
    assert_eq!(a.reason, ReasonCode::NoMatchingSubscribers);
    assert_eq!(emit(&Packet::PubAck(a), V5), no_subs);
    // PUBREL/PUBCOMP may not carry a PUBACK reason.
    assert_eq!(
        parse(&[0x62, 0x03, 0x00, 0x01, 0x10], V5),
        Err(DecodeError::InvalidReasonCode(0x10))
    );
    assert_eq!(
        parse(&[0x40, 0x02, 0x00, 0x00], V5),
        Err(DecodeError::ZeroPacketId)
    );

    assert_eq!(parse(&[0xE0, 0x00], V5), parse(&[0xE0, 0x01, 0x00], V5));
    let Ok(Packet::Disconnect(d)) = parse(&[0xE0, 0x01, 0x04], V5) else {
        panic!("DISCONNECT")
    };
    assert_eq!(
        (d.reason, d.properties),
        (ReasonCode::DisconnectWithWillMessage, Properties::default())
    );
    assert_eq!(
        parse(&[0xE0, 0x01, 0x84], V5),
        Err(DecodeError::InvalidReasonCode(0x84))
    );
    assert_eq!(
        parse(&[0xE0, 0x01, 0x04], V311),
        Err(DecodeError::TrailingBytes(1))
    );
    // AUTH exists in 5.0 only.
    assert!(matches!(parse(&[0xF0, 0x00], V5), Ok(Packet::Auth(_))));
    assert_eq!(
        parse(&[0xF0, 0x00], V311),
        Err(DecodeError::ReservedPacketType(15))
    );
}

#[test]
fn connack_in_both_versions() {
    let refused = Packet::ConnAck(qgate_mqtt::packet::ConnAck {
        session_present: false,
        reason: ReasonCode::Banned,
        properties: Properties::default(),
    });
    assert_eq!(emit(&refused, V5), [0x20, 0x03, 0x00, 0x8A, 0x00]);
    // 3.1.1 has no "banned": the nearest return code is 5, not authorized.
    assert_eq!(emit(&refused, V311), [0x20, 0x02, 0x00, 0x05]);
    assert_eq!(
        parse(&[0x20, 0x02, 0x02, 0x00], V311),
        Err(DecodeError::InvalidFlags {
            packet_type: PacketType::ConnAck,
            flags: 2
        })
    );
    assert_eq!(
        parse(&[0x20, 0x02, 0x00, 0x06], V311),
        Err(DecodeError::InvalidReasonCode(6))
    );
}

#[test]
fn error_reason_codes() {
    assert_eq!(
        DecodeError::Truncated.reason_code(),
        ReasonCode::MalformedPacket
    );
    assert_eq!(
        DecodeError::DuplicateProperty(0x21).reason_code(),
        ReasonCode::ProtocolError
    );
    assert_eq!(
        DecodeError::PacketTooLarge { size: 9, max: 8 }.reason_code(),
        ReasonCode::PacketTooLarge
    );
    assert_eq!(DecodeError::Truncated.v311_return_code(), None);
}
