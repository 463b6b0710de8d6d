//! The MQTT door on loopback TCP in front of a real gateway and the counting server: raw MQTT
//! clients built from `qgate_mqtt` packets publish at QoS 0, 1 and 2; what the server stores,
//! what the clients are told, redelivery, bad topics, takeover and garbage.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use qgate_gateway::mqtt::MqttConfig;
use qgate_mqtt::packet::{ConnAck, Connect, PubResponse, Publish};
use qgate_mqtt::{FixedHeader, Packet, Properties, ProtocolVersion, QoS, ReasonCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const V5: ProtocolVersion = ProtocolVersion::V5;
const V311: ProtocolVersion = ProtocolVersion::V311;

/// A raw MQTT client.
struct Client {
    s: TcpStream,
    v: ProtocolVersion,
    buf: BytesMut,
}

impl Client {
    async fn open(addr: SocketAddr, v: ProtocolVersion) -> Client {
        Client {
            s: TcpStream::connect(addr).await.unwrap(),
            v,
            buf: BytesMut::new(),
        }
    }

    /// Connects as `id`; the CONNACK.
    async fn connect(
        addr: SocketAddr,
        v: ProtocolVersion,
        id: &str,
        clean: bool,
    ) -> (Client, ConnAck) {
        let mut c = Client::open(addr, v).await;
        let properties = Properties {
            session_expiry_interval: (!clean && v == V5).then_some(300),
            ..Properties::default()
        };
        c.send(&Packet::Connect(Box::new(Connect {
            protocol: v,
            clean_start: clean,
            keep_alive: 30,
            properties,
            client_id: id.into(),
            will: None,
            username: None,
            password: None,
        })))
        .await;
        match c.recv().await {
            Some(Packet::ConnAck(a)) => (c, a),
            other => panic!("expected CONNACK, got {other:?}"),
        }
    }

    async fn send(&mut self, p: &Packet) {
        self.s
            .write_all(&p.to_bytes(self.v).unwrap())
            .await
            .unwrap();
    }

    /// The next packet; `None` when the gateway closed the connection.
    async fn recv(&mut self) -> Option<Packet> {
        let read = async {
            loop {
                if let Ok(Some(h)) = FixedHeader::parse(&self.buf) {
                    if self.buf.len() >= h.packet_len() {
                        let b: Bytes = self.buf.split_to(h.packet_len()).freeze();
                        return Some(Packet::parse(b, self.v).expect("valid packet"));
                    }
                }
                let mut chunk = [0u8; 4096];
                match self.s.read(&mut chunk).await {
                    Ok(0) | Err(_) => return None,
                    Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(20), read)
            .await
            .expect("an answer within 20 s")
    }

    async fn publish(&mut self, qos: QoS, id: u16, topic: &str, body: &[u8], dup: bool) {
        self.publish_with(qos, id, topic, body, dup, Properties::default())
            .await;
    }

    async fn publish_with(
        &mut self,
        qos: QoS,
        id: u16,
        topic: &str,
        body: &[u8],
        dup: bool,
        properties: Properties,
    ) {
        let p = Packet::Publish(Publish {
            dup,
            qos,
            retain: false,
            topic: topic.into(),
            packet_id: (qos != QoS::AtMostOnce).then_some(id),
            properties,
            payload: Bytes::copy_from_slice(body),
        });
        self.send(&p).await;
    }

    /// QoS 2 to the end: PUBLISH, PUBREC (its reason), PUBREL, PUBCOMP.
    async fn exactly_once(&mut self, id: u16, topic: &str, body: &[u8], dup: bool) -> ReasonCode {
        self.publish(QoS::ExactlyOnce, id, topic, body, dup).await;
        let rec = match self.recv().await {
            Some(Packet::PubRec(r)) => r,
            other => panic!("expected PUBREC, got {other:?}"),
        };
        assert_eq!(rec.packet_id, id);
        if rec.reason.is_error() {
            return rec.reason;
        }
        self.send(&Packet::PubRel(PubResponse::success(id))).await;
        match self.recv().await {
            Some(Packet::PubComp(c)) => assert_eq!(c.packet_id, id),
            other => panic!("expected PUBCOMP, got {other:?}"),
        }
        rec.reason
    }

    async fn puback(&mut self) -> PubResponse {
        match self.recv().await {
            Some(Packet::PubAck(a)) => a,
            other => panic!("expected PUBACK, got {other:?}"),
        }
    }
}

async fn door() -> common::Loopback {
    common::loopback_mqtt(&["127.0.0.2:0"], MqttConfig::default()).await
}

/// Waits until the server has stored `n` records.
async fn stored(lb: &common::Loopback, n: u64) {
    let until = tokio::time::Instant::now() + Duration::from_secs(20);
    while lb.stats.snapshot().ingested < n {
        assert!(
            tokio::time::Instant::now() < until,
            "the server stored {} of {n}",
            lb.stats.snapshot().ingested
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qos_0_1_and_2_reach_the_server_in_both_versions() {
    let lb = door().await;
    let addr = lb.mqtt.unwrap();
    let mut total = 0;
    for (v, id) in [(V5, "five"), (V311, "three")] {
        let (mut c, ack) = Client::connect(addr, v, id, true).await;
        assert_eq!(ack.reason, ReasonCode::Success);
        assert!(!ack.session_present);
        c.publish(QoS::AtMostOnce, 0, "sensors/room1/temp", b"21.5", false)
            .await;
        c.publish(QoS::AtLeastOnce, 1, "sensors/room1/temp", b"21.6", false)
            .await;
        let a = c.puback().await;
        assert_eq!((a.packet_id, a.reason), (1, ReasonCode::Success));
        assert_eq!(
            c.exactly_once(2, "alarms/door", b"open", false).await,
            ReasonCode::Success
        );
        total += 3;
        stored(&lb, total).await;
    }
    let m = lb.gw.metrics();
    for line in [
        "qgate_gateway_mqtt_publish_qos0_total 2",
        "qgate_gateway_mqtt_publish_qos1_total 2",
        "qgate_gateway_mqtt_publish_qos2_total 2",
        "qgate_gateway_mqtt_connects_total 2",
    ] {
        assert!(m.contains(line), "missing {line} in:\n{m}");
    }
    assert_eq!(lb.stats.snapshot().duplicates, 0);
}

/// A QoS 2 message sent again with DUP on a new connection (its PUBREC lost with the old one)
/// goes under the same request id: the server stores it once. A packet id reused without DUP
/// is a new message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_message_is_stored_once() {
    let lb = door().await;
    let addr = lb.mqtt.unwrap();
    for v in [V5, V311] {
        let before = lb.stats.snapshot();
        let (mut c, _) = Client::connect(addr, v, "redeliverer", false).await;
        c.publish(QoS::ExactlyOnce, 7, "meters", b"42 kWh", false)
            .await;
        assert!(matches!(c.recv().await, Some(Packet::PubRec(r)) if r.packet_id == 7));
        // The connection drops before PUBREL; the client has no PUBCOMP, so it sends the
        // PUBLISH again, with DUP, once it is back.
        drop(c);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (mut c, ack) = Client::connect(addr, v, "redeliverer", false).await;
        assert!(ack.session_present, "the session is kept ({v:?})");
        assert_eq!(
            c.exactly_once(7, "meters", b"42 kWh", true).await,
            ReasonCode::Success
        );
        // QoS 1 the same way.
        c.publish(QoS::AtLeastOnce, 8, "meters", b"43 kWh", false)
            .await;
        assert_eq!(c.puback().await.reason, ReasonCode::Success);
        c.publish(QoS::AtLeastOnce, 8, "meters", b"43 kWh", true)
            .await;
        assert_eq!(c.puback().await.reason, ReasonCode::Success);
        // Packet id 8 again, without DUP: a new message.
        c.publish(QoS::AtLeastOnce, 8, "meters", b"44 kWh", false)
            .await;
        assert_eq!(c.puback().await.reason, ReasonCode::Success);
        let after = lb.stats.snapshot();
        assert_eq!(after.ingested - before.ingested, 3, "{v:?}");
        assert_eq!(after.duplicates - before.duplicates, 2, "{v:?}");
        // A clean start forgets the session.
        drop(c);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (_c, ack) = Client::connect(addr, v, "redeliverer", true).await;
        assert!(!ack.session_present);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_that_is_no_stream_is_refused() {
    let lb = door().await;
    let addr = lb.mqtt.unwrap();
    let (mut c, _) = Client::connect(addr, V5, "bad-topics", true).await;
    c.publish(QoS::AtLeastOnce, 1, "has space", b"x", false)
        .await;
    let a = c.puback().await;
    assert_eq!((a.packet_id, a.reason), (1, ReasonCode::TopicNameInvalid));
    assert_eq!(
        c.exactly_once(2, "/leading/slash", b"x", false).await,
        ReasonCode::TopicNameInvalid
    );
    // The connection carries on.
    c.publish(QoS::AtLeastOnce, 3, "fine", b"x", false).await;
    assert_eq!(c.puback().await.reason, ReasonCode::Success);
    // 3.1.1 has no way to say no: the connection closes.
    let (mut c, _) = Client::connect(addr, V311, "bad-topics-311", true).await;
    c.publish(QoS::AtLeastOnce, 1, "has space", b"x", false)
        .await;
    assert_eq!(c.recv().await, None);
    assert!(lb
        .gw
        .metrics()
        .contains("qgate_gateway_mqtt_refused_topic_total 3"));
    assert_eq!(lb.stats.snapshot().ingested, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_connection_with_the_same_client_id_takes_over() {
    let lb = door().await;
    let addr = lb.mqtt.unwrap();
    let (mut first, _) = Client::connect(addr, V5, "twin", true).await;
    let (mut second, _) = Client::connect(addr, V5, "twin", true).await;
    match first.recv().await {
        Some(Packet::Disconnect(d)) => assert_eq!(d.reason, ReasonCode::SessionTakenOver),
        other => panic!("expected DISCONNECT 0x8E, got {other:?}"),
    }
    assert_eq!(first.recv().await, None);
    second.publish(QoS::AtLeastOnce, 1, "t", b"x", false).await;
    assert_eq!(second.puback().await.reason, ReasonCode::Success);
    // 3.1.1: closed without a word.
    let (mut a, _) = Client::connect(addr, V311, "twin311", true).await;
    let (_b, _) = Client::connect(addr, V311, "twin311", true).await;
    assert_eq!(a.recv().await, None);
    assert!(lb
        .gw
        .metrics()
        .contains("qgate_gateway_mqtt_takeovers_total 2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_bad_client_ids_close_the_connection() {
    let lb = door().await;
    let addr = lb.mqtt.unwrap();
    let mut c = Client::open(addr, V5).await;
    c.s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(c.recv().await, None);
    let mut c = Client::open(addr, V5).await;
    c.s.write_all(&[0xff; 64]).await.unwrap();
    assert_eq!(c.recv().await, None);
    // A PUBLISH before CONNECT.
    let mut c = Client::open(addr, V5).await;
    c.publish(QoS::AtMostOnce, 0, "t", b"x", false).await;
    assert_eq!(c.recv().await, None);
    // Garbage after CONNECT: DISCONNECT, then the end.
    let (mut c, _) = Client::connect(addr, V5, "garbler", true).await;
    c.s.write_all(&[0x00, 0x00]).await.unwrap();
    assert!(matches!(c.recv().await, Some(Packet::Disconnect(_))));
    assert_eq!(c.recv().await, None);
    // A client id with a space is refused in CONNACK.
    let (mut c, ack) = Client::connect(addr, V5, "has space", true).await;
    assert_eq!(ack.reason, ReasonCode::ClientIdentifierNotValid);
    assert_eq!(c.recv().await, None);
    // An empty one is named by the gateway.
    let (_c, ack) = Client::connect(addr, V5, "", true).await;
    assert_eq!(ack.reason, ReasonCode::Success);
    assert!(ack.properties.assigned_client_identifier.is_some());
    assert_eq!(lb.stats.snapshot().ingested, 0);
    let m = lb.gw.metrics();
    assert!(m.contains("qgate_gateway_mqtt_violations_total 4"), "{m}");
}

/// Priority by property or topic pattern: the server's sink sees the class (its per-class
/// counter is not exposed, so the gateway's response-delay histograms tell).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn class_from_property_or_priority_topics() {
    let cfg = MqttConfig {
        priority_topics: vec!["alarms/#".into()],
        ..MqttConfig::default()
    };
    let lb = common::loopback_mqtt(&["127.0.0.2:0"], cfg).await;
    let (mut c, _) = Client::connect(lb.mqtt.unwrap(), V5, "classy", true).await;
    c.publish(QoS::AtLeastOnce, 1, "alarms/fire", b"!", false)
        .await;
    c.puback().await;
    let props = Properties {
        user_properties: vec![("qgate-priority".into(), "1".into())],
        ..Properties::default()
    };
    c.publish_with(QoS::AtLeastOnce, 2, "temp", b"1", false, props)
        .await;
    c.puback().await;
    c.publish(QoS::AtLeastOnce, 3, "temp", b"2", false).await;
    c.puback().await;
    assert_eq!(lb.gw.stats.delay_priority.count(), 2);
    assert_eq!(lb.gw.stats.delay_best_effort.count(), 1);
}
