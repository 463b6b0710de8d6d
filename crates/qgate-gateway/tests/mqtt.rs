//! The MQTT door on loopback TCP, TLS and QUIC in front of a real gateway and the counting
//! server: raw MQTT clients built from `qgate_mqtt` packets publish at QoS 0, 1 and 2; what the
//! server stores, what the clients are told, redelivery, bad topics, takeover, garbage, the
//! transports' own hostile peers, and acknowledgement by the spool when no server is reachable.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use qgate_gateway::mqtt::MqttConfig;
use qgate_mqtt::packet::{ConnAck, Connect, PubResponse, Publish};
use qgate_mqtt::{FixedHeader, Packet, Properties, ProtocolVersion, QoS, ReasonCode};
use qgate_transport::{Socket, TransportOptions, TrustRoots};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

const V5: ProtocolVersion = ProtocolVersion::V5;
const V311: ProtocolVersion = ProtocolVersion::V311;

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// How a client reaches the door.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Via {
    Tcp,
    Tls,
    Quic,
}

/// A door's address on one transport, and the roots its certificate is checked against.
#[derive(Clone)]
struct At {
    via: Via,
    addr: SocketAddr,
    trust: TrustRoots,
}

fn at(lb: &common::Loopback, via: Via) -> At {
    let addr = match via {
        Via::Tcp => lb.mqtt,
        Via::Tls => lb.mqtt_tls,
        Via::Quic => lb.mqtt_quic,
    };
    At {
        via,
        addr: addr.unwrap(),
        trust: lb.trust.clone(),
    }
}

/// A QUIC connection to `addr` with ALPN `mqtt`, and its endpoint (kept alive with it).
async fn quic(addr: SocketAddr, trust: &TrustRoots) -> (quinn::Endpoint, quinn::Connection) {
    let ep = qgate_transport::endpoint(
        Socket::bind_udp("127.0.0.1:0".parse().unwrap()).unwrap(),
        None,
        None,
    )
    .unwrap();
    let cfg =
        qgate_transport::client_config(trust, &[b"mqtt"], &TransportOptions::default()).unwrap();
    let c = qgate_transport::connect(&ep, &cfg, addr, "localhost", false)
        .await
        .unwrap();
    let conn = c.connection().clone();
    (ep, conn)
}

/// A raw MQTT client.
struct Client {
    s: Box<dyn Io>,
    v: ProtocolVersion,
    buf: BytesMut,
    /// Its QUIC connection and endpoint, over QUIC.
    quic: Option<(quinn::Endpoint, quinn::Connection)>,
}

impl Client {
    async fn open(at: &At, v: ProtocolVersion) -> Client {
        let mut quic_conn = None;
        let s: Box<dyn Io> = match at.via {
            Via::Tcp => Box::new(TcpStream::connect(at.addr).await.unwrap()),
            Via::Tls => {
                let cfg =
                    rustls::ClientConfig::builder_with_provider(qgate_transport::tls::provider())
                        .with_safe_default_protocol_versions()
                        .unwrap()
                        .with_root_certificates(at.trust.store().unwrap())
                        .with_no_client_auth();
                let tcp = TcpStream::connect(at.addr).await.unwrap();
                let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
                let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
                    .connect(name, tcp)
                    .await
                    .unwrap();
                Box::new(tls)
            }
            Via::Quic => {
                let (ep, conn) = quic(at.addr, &at.trust).await;
                let (send, recv) = conn.open_bi().await.unwrap();
                quic_conn = Some((ep, conn));
                Box::new(tokio::io::join(recv, send))
            }
        };
        Client {
            s,
            v,
            buf: BytesMut::new(),
            quic: quic_conn,
        }
    }

    /// Connects as `id`; the CONNACK.
    async fn connect(at: &At, v: ProtocolVersion, id: &str, clean: bool) -> (Client, ConnAck) {
        let mut c = Client::open(at, v).await;
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
        self.write(&p.to_bytes(self.v).unwrap()).await;
    }

    async fn write(&mut self, b: &[u8]) {
        self.s.write_all(b).await.unwrap();
        self.s.flush().await.unwrap();
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
async fn qos_0_1_and_2_reach_the_server_in_both_versions_over_tcp_tls_and_quic() {
    let lb = door().await;
    let mut total = 0;
    for (via, v, id) in [Via::Tcp, Via::Tls, Via::Quic]
        .into_iter()
        .flat_map(|via| [(via, V5, "five"), (via, V311, "three")])
    {
        let id = format!("{id}-{via:?}");
        let (mut c, ack) = Client::connect(&at(&lb, via), v, &id, true).await;
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
        "qgate_gateway_mqtt_publish_qos0_total 6",
        "qgate_gateway_mqtt_publish_qos1_total 6",
        "qgate_gateway_mqtt_publish_qos2_total 6",
        "qgate_gateway_mqtt_connects_total 6",
        "qgate_gateway_mqtt_connections_total 6",
        "qgate_gateway_mqtt_connections_tls_total 2",
        "qgate_gateway_mqtt_connections_quic_total 2",
        "qgate_gateway_mqtt_handshakes_failed_total 0",
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
    let addr = at(&lb, Via::Tcp);
    for v in [V5, V311] {
        let before = lb.stats.snapshot();
        let (mut c, _) = Client::connect(&addr, v, "redeliverer", false).await;
        c.publish(QoS::ExactlyOnce, 7, "meters", b"42 kWh", false)
            .await;
        assert!(matches!(c.recv().await, Some(Packet::PubRec(r)) if r.packet_id == 7));
        // The connection drops before PUBREL; the client has no PUBCOMP, so it sends the
        // PUBLISH again, with DUP, once it is back.
        drop(c);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (mut c, ack) = Client::connect(&addr, v, "redeliverer", false).await;
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
        let (_c, ack) = Client::connect(&addr, v, "redeliverer", true).await;
        assert!(!ack.session_present);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_that_is_no_stream_is_refused() {
    let lb = door().await;
    let addr = at(&lb, Via::Tcp);
    let (mut c, _) = Client::connect(&addr, V5, "bad-topics", true).await;
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
    let (mut c, _) = Client::connect(&addr, V311, "bad-topics-311", true).await;
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
    let addr = at(&lb, Via::Tcp);
    // Across transports: the client ids are the door's, not a listener's.
    let (mut first, _) = Client::connect(&at(&lb, Via::Tls), V5, "twin", true).await;
    let (mut second, _) = Client::connect(&at(&lb, Via::Quic), V5, "twin", true).await;
    match first.recv().await {
        Some(Packet::Disconnect(d)) => assert_eq!(d.reason, ReasonCode::SessionTakenOver),
        other => panic!("expected DISCONNECT 0x8E, got {other:?}"),
    }
    assert_eq!(first.recv().await, None);
    second.publish(QoS::AtLeastOnce, 1, "t", b"x", false).await;
    assert_eq!(second.puback().await.reason, ReasonCode::Success);
    // 3.1.1: closed without a word.
    let (mut a, _) = Client::connect(&addr, V311, "twin311", true).await;
    let (_b, _) = Client::connect(&addr, V311, "twin311", true).await;
    assert_eq!(a.recv().await, None);
    assert!(lb
        .gw
        .metrics()
        .contains("qgate_gateway_mqtt_takeovers_total 2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_bad_client_ids_close_the_connection() {
    let lb = door().await;
    let addr = at(&lb, Via::Tcp);
    let mut c = Client::open(&addr, V5).await;
    c.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(c.recv().await, None);
    let mut c = Client::open(&addr, V5).await;
    c.write(&[0xff; 64]).await;
    assert_eq!(c.recv().await, None);
    // A PUBLISH before CONNECT.
    let mut c = Client::open(&addr, V5).await;
    c.publish(QoS::AtMostOnce, 0, "t", b"x", false).await;
    assert_eq!(c.recv().await, None);
    // Garbage after CONNECT: DISCONNECT, then the end.
    let (mut c, _) = Client::connect(&addr, V5, "garbler", true).await;
    c.write(&[0x00, 0x00]).await;
    assert!(matches!(c.recv().await, Some(Packet::Disconnect(_))));
    assert_eq!(c.recv().await, None);
    // A client id with a space is refused in CONNACK.
    let (mut c, ack) = Client::connect(&addr, V5, "has space", true).await;
    assert_eq!(ack.reason, ReasonCode::ClientIdentifierNotValid);
    assert_eq!(c.recv().await, None);
    // An empty one is named by the gateway.
    let (_c, ack) = Client::connect(&addr, V5, "", true).await;
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
    let (mut c, _) = Client::connect(&at(&lb, Via::Tcp), V5, "classy", true).await;
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

/// Garbage on a TLS session or a QUIC stream closes the connection as on TCP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_over_tls_and_quic_closes_the_connection() {
    let lb = door().await;
    for via in [Via::Tls, Via::Quic] {
        let mut c = Client::open(&at(&lb, via), V5).await;
        c.write(&[0xff; 64]).await;
        assert_eq!(c.recv().await, None, "{via:?}");
        let (mut c, _) = Client::connect(&at(&lb, via), V5, "garbler", true).await;
        c.write(&[0x00, 0x00]).await;
        assert!(matches!(c.recv().await, Some(Packet::Disconnect(_))));
        assert_eq!(c.recv().await, None, "{via:?}");
    }
    let m = lb.gw.metrics();
    assert!(m.contains("qgate_gateway_mqtt_violations_total 4"), "{m}");
}

/// A door whose connect timeout is 300 ms, on every transport.
async fn impatient_door() -> common::Loopback {
    let cfg = MqttConfig {
        connect_timeout: Duration::from_millis(300),
        ..MqttConfig::default()
    };
    common::loopback_mqtt(&["127.0.0.2:0"], cfg).await
}

/// A TLS handshake never finished holds its connection only until the connect timeout (it
/// spends the CONNECT's time), then the door closes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_handshake_never_finished_is_closed_at_the_connect_timeout() {
    let lb = impatient_door().await;
    let t0 = Instant::now();
    let mut s = TcpStream::connect(lb.mqtt_tls.unwrap()).await.unwrap();
    // The start of a ClientHello's record header, and nothing more.
    s.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
    let mut b = [0u8; 64];
    let r = tokio::time::timeout(Duration::from_secs(10), s.read(&mut b)).await;
    assert!(matches!(r, Ok(Ok(0) | Err(_))), "closed, not {r:?}");
    assert!(
        t0.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t0.elapsed()
    );
    let m = lb.gw.metrics();
    assert!(
        m.contains("qgate_gateway_mqtt_handshakes_failed_total 1"),
        "{m}"
    );
    assert!(m.contains("qgate_gateway_mqtt_connects_total 0"), "{m}");
}

/// The application error code a QUIC connection was closed with by the door.
async fn closed_with(conn: &quinn::Connection) -> u64 {
    match tokio::time::timeout(Duration::from_secs(10), conn.closed()).await {
        Ok(quinn::ConnectionError::ApplicationClosed(c)) => c.error_code.into_inner(),
        other => panic!("expected an application close, got {other:?}"),
    }
}

/// A QUIC connection that opens no stream is closed at the connect timeout, with its own
/// error code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quic_connection_without_a_stream_is_closed_at_the_connect_timeout() {
    let lb = impatient_door().await;
    let t0 = Instant::now();
    let (_ep, conn) = quic(lb.mqtt_quic.unwrap(), &lb.trust).await;
    assert_eq!(
        closed_with(&conn).await,
        u64::from(qgate_gateway::mqtt::quic::NO_STREAM)
    );
    assert!(
        t0.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t0.elapsed()
    );
    let m = lb.gw.metrics();
    assert!(
        m.contains("qgate_gateway_mqtt_handshakes_failed_total 1"),
        "{m}"
    );
}

/// Single-stream mode only: a second stream closes the connection; the first one's client is
/// gone from the door (its id may connect again at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_quic_stream_closes_the_connection() {
    let lb = door().await;
    let quic_at = at(&lb, Via::Quic);
    let (mut c, ack) = Client::connect(&quic_at, V5, "streamy", true).await;
    assert_eq!(ack.reason, ReasonCode::Success);
    let conn = c.quic.as_ref().unwrap().1.clone();
    let (mut send, _recv) = conn.open_bi().await.unwrap();
    send.write_all(b"\x10").await.unwrap();
    assert_eq!(
        closed_with(&conn).await,
        u64::from(qgate_gateway::mqtt::quic::SECOND_STREAM)
    );
    assert_eq!(c.recv().await, None);
    let m = lb.gw.metrics();
    assert!(m.contains("qgate_gateway_mqtt_violations_total 1"), "{m}");
    let (_c, ack) = Client::connect(&quic_at, V5, "streamy", true).await;
    assert_eq!(ack.reason, ReasonCode::Success);
    assert!(lb
        .gw
        .metrics()
        .contains("qgate_gateway_mqtt_takeovers_total 0"));
}

/// One address's connection limit counts every transport: with room for two, a third
/// connection is closed at once, whichever listener it reaches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_limits_count_every_transport() {
    let cfg = MqttConfig {
        max_connections_per_address: 2,
        ..MqttConfig::default()
    };
    let lb = common::loopback_mqtt(&["127.0.0.2:0"], cfg).await;
    let (_a, _) = Client::connect(&at(&lb, Via::Tcp), V5, "one", true).await;
    let (_b, _) = Client::connect(&at(&lb, Via::Tls), V5, "two", true).await;
    let (_ep, conn) = {
        let ep = qgate_transport::endpoint(
            Socket::bind_udp("127.0.0.1:0".parse().unwrap()).unwrap(),
            None,
            None,
        )
        .unwrap();
        let cfg =
            qgate_transport::client_config(&lb.trust, &[b"mqtt"], &TransportOptions::default())
                .unwrap();
        let r =
            qgate_transport::connect(&ep, &cfg, lb.mqtt_quic.unwrap(), "localhost", false).await;
        (ep, r)
    };
    assert!(conn.is_err(), "the QUIC handshake is refused");
    let mut tcp = TcpStream::connect(lb.mqtt.unwrap()).await.unwrap();
    let mut b = [0u8; 8];
    let r = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut b)).await;
    assert!(matches!(r, Ok(Ok(0) | Err(_))), "closed, not {r:?}");
    let m = lb.gw.metrics();
    assert!(
        m.contains("qgate_gateway_mqtt_connections_refused_total 2"),
        "{m}"
    );
}

/// Past half its connections the door has a QUIC client prove its address first (a Retry,
/// which the client answers on its own), then serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_half_its_connections_the_quic_door_asks_for_a_retry() {
    let cfg = MqttConfig {
        max_connections: 4,
        ..MqttConfig::default()
    };
    let lb = common::loopback_mqtt(&["127.0.0.2:0"], cfg).await;
    let (_a, _) = Client::connect(&at(&lb, Via::Quic), V5, "calm", true).await;
    assert!(lb
        .gw
        .metrics()
        .contains("qgate_gateway_mqtt_quic_retries_total 0"));
    let (_b, _) = Client::connect(&at(&lb, Via::Tcp), V5, "busy", true).await;
    let (mut c, ack) = Client::connect(&at(&lb, Via::Quic), V5, "proven", true).await;
    assert_eq!(ack.reason, ReasonCode::Success);
    c.publish(QoS::AtLeastOnce, 1, "t", b"x", false).await;
    assert_eq!(c.puback().await.reason, ReasonCode::Success);
    let m = lb.gw.metrics();
    assert!(m.contains("qgate_gateway_mqtt_quic_retries_total 1"), "{m}");
}

/// A quiet MQTT-over-QUIC client lives as long as MQTT's keep-alive says, not QUIC's idle
/// timeout: with the gateway's transport idle timeout at 300 ms, a client quiet for 1.5 s (its
/// keep-alive is 30 s) still gets PINGRESP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_quic_client_lives_by_the_mqtt_keep_alive() {
    let pki = qgate_transport::DevPki::generate(&[]).unwrap();
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let sa = |s: &str| -> SocketAddr { s.parse().unwrap() };
    let running = qgate_gateway::gateway::Gateway::builder()
        .with_transport(TransportOptions {
            idle_timeout_ms: 300,
            ..TransportOptions::default()
        })
        .with_identity(pki.server.clone())
        .with_server_trust(pki.trust())
        .with_device_socket(Socket::bind_udp(sa("127.0.0.1:0")).unwrap())
        .with_path(
            Socket::bind_udp(sa("127.0.0.2:0")).unwrap(),
            silent.local_addr().unwrap(),
        )
        .with_mqtt_quic(sa("127.0.0.1:0"))
        .start()
        .unwrap();
    let quic_at = At {
        via: Via::Quic,
        addr: running.mqtt_quic_addr().unwrap(),
        trust: pki.trust(),
    };
    let (mut c, ack) = Client::connect(&quic_at, V5, "quiet", true).await;
    assert_eq!(ack.reason, ReasonCode::Success);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    c.send(&Packet::PingReq).await;
    assert_eq!(c.recv().await, Some(Packet::PingResp));
}

/// With no server reachable and a spool, a QoS 1 or 2 message is acknowledged once the spool
/// holds it: when PUBACK or PUBREC arrives the spool's view counts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_backhaul_down_the_spool_holds_a_message_before_it_is_acknowledged() {
    let dir = std::env::temp_dir().join(format!("qgate-gw-mqtt-spool-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let spool = qgate_spool::Spool::open(qgate_spool::SpoolConfig {
        keep_free: 0,
        ..qgate_spool::SpoolConfig::new(&dir)
    })
    .unwrap();
    let pki = qgate_transport::DevPki::generate(&[]).unwrap();
    // A "server" that never answers: the path never comes up.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let sa = |s: &str| -> SocketAddr { s.parse().unwrap() };
    let running = qgate_gateway::gateway::Gateway::builder()
        .with_identity(pki.server.clone())
        .with_server_trust(pki.trust())
        .with_device_socket(Socket::bind_udp(sa("127.0.0.1:0")).unwrap())
        .with_path(
            Socket::bind_udp(sa("127.0.0.2:0")).unwrap(),
            silent.local_addr().unwrap(),
        )
        .with_spool(spool.clone())
        .with_mqtt_quic(sa("127.0.0.1:0"))
        .start()
        .unwrap();
    let held = || {
        let v = spool.view();
        v.priority.held.records + v.best_effort.held.records
    };
    let quic_at = At {
        via: Via::Quic,
        addr: running.mqtt_quic_addr().unwrap(),
        trust: pki.trust(),
    };
    assert_eq!(running.mqtt_addr(), None, "only the listeners asked for");
    let mut n = 0;
    for v in [V5, V311] {
        let (mut c, ack) = Client::connect(&quic_at, v, "spooler", true).await;
        assert_eq!(ack.reason, ReasonCode::Success);
        c.publish(QoS::AtLeastOnce, 1, "meters", b"1 kWh", false)
            .await;
        assert_eq!(c.puback().await.reason, ReasonCode::Success);
        n += 1;
        assert_eq!(held(), n, "{v:?}: acknowledged, so held");
        assert_eq!(
            c.exactly_once(2, "meters", b"2 kWh", false).await,
            ReasonCode::Success
        );
        n += 1;
        assert_eq!(held(), n, "{v:?}");
    }
    assert!(running
        .gateway
        .metrics()
        .contains("qgate_gateway_mqtt_stored_total 4"));
    drop(running);
    let _ = std::fs::remove_dir_all(&dir);
}
