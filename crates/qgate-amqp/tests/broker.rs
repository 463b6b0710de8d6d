//! The broker end to end on loopback: every scheme, queue semantics, credit and back-pressure,
//! redelivery, TTL, limits, and bad input.

use std::net::SocketAddr;
use std::time::Duration;

use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::types::messaging::Body;
use fe2o3_amqp::types::primitives::Value;
use qgate_amqp::auth::Credentials;
use qgate_amqp::broker::{Broker, BrokerConfig, QueueDecl};
use qgate_amqp::builder::RunningBroker;
use qgate_amqp::client::{self, Connector, RecvSpec, SendSpec};
use qgate_amqp::transport::{self, Scheme, TlsVersion, ALPN_AMQP};
use qgate_transport::{endpoint, server_config, DevPki, Socket, TransportOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;
use common::{connector_to, quic_broker_with};
#[path = "common/raw.rs"]
mod raw;

struct Running {
    broker: Broker,
    quic: SocketAddr,
    tls: SocketAddr,
    tcp: SocketAddr,
    pki: DevPki,
    _running: RunningBroker,
}

async fn start(cfg: BrokerConfig) -> Running {
    let pki = DevPki::generate(&[]).unwrap();
    let opts = transport::broker_options(&TransportOptions::default());
    let scfg = server_config(&pki.server, &[ALPN_AMQP], &opts).unwrap();
    let ep = endpoint(
        Socket::bind_udp("127.0.0.1:0".parse().unwrap()).unwrap(),
        Some(scfg),
        None,
    )
    .unwrap();
    let tls = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tcfg = transport::tls_server_config(&pki.server, None).unwrap();
    let running = Broker::builder()
        .config(cfg)
        .quic(ep)
        .tcp(tls, Some(tcfg))
        .tcp(tcp, None)
        .start()
        .unwrap();
    Running {
        broker: running.broker().clone(),
        quic: running.quic_addrs()[0],
        tls: running.tcp_addrs()[0],
        tcp: running.tcp_addrs()[1],
        pki,
        _running: running,
    }
}

impl Running {
    fn connector(&self, scheme: Scheme, sasl: Option<(&str, &str)>) -> Connector {
        let addr = match scheme {
            Scheme::Quic | Scheme::QuicMux => self.quic,
            Scheme::TcpTls(_) => self.tls,
            Scheme::Tcp => self.tcp,
        };
        connector_to(scheme, addr, &self.pki, sasl)
    }
}

fn send_spec(address: &str, settled: bool) -> SendSpec {
    SendSpec {
        address: address.into(),
        settled,
        window: 100,
        rate: None,
        link_name: "sender".into(),
    }
}

fn recv_spec(address: &str, count: u64) -> RecvSpec {
    RecvSpec {
        address: address.into(),
        settled: false,
        count: Some(count),
        idle: Duration::from_secs(5),
        credit: 100,
        link_name: "receiver".into(),
    }
}

fn bodies(n: usize, tag: u8) -> impl Iterator<Item = Vec<u8>> {
    (0..n).map(move |i| {
        let mut b = vec![tag; 100];
        b[..8].copy_from_slice(&(i as u64).to_be_bytes());
        b
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scheme_carries_settled_and_unsettled_messages_in_order() {
    let r = start(BrokerConfig::default()).await;
    for scheme in [
        Scheme::Quic,
        Scheme::QuicMux,
        Scheme::TcpTls(TlsVersion::V13),
        Scheme::TcpTls(TlsVersion::V12),
        Scheme::Tcp,
    ] {
        let c = r.connector(scheme, None);
        let q = format!("q-{scheme}");
        let a = client::send(&c, &send_spec(&q, false), bodies(200, 1))
            .await
            .unwrap();
        assert_eq!((a.messages, a.rejected), (200, 0), "{scheme}");
        let b = client::send(&c, &send_spec(&q, true), bodies(200, 2))
            .await
            .unwrap();
        assert_eq!(b.rejected, 0, "{scheme}");
        let mut got = Vec::new();
        let rep = client::receive(&c, &recv_spec(&q, 400), |b| got.push(b.to_vec()))
            .await
            .unwrap();
        assert_eq!(rep.messages, 400, "{scheme}");
        let expect: Vec<Vec<u8>> = bodies(200, 1).chain(bodies(200, 2)).collect();
        assert_eq!(got, expect, "{scheme}: FIFO, nothing lost or duplicated");
        assert!(rep.startup > Duration::ZERO && rep.total >= rep.startup);
    }
    // The receivers' last dispositions reach the broker after they return.
    let mut m = String::new();
    for _ in 0..200 {
        m = r.broker.metrics();
        if r.broker.queue_stats().iter().all(|q| q.depth == 0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        m.contains("qgate_amqp_acked_total{queue=\"q-quic\"} 400"),
        "{m}"
    );
    assert!(
        m.contains("qgate_amqp_queue_depth{queue=\"q-tcp\"} 0"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_mux_carries_many_amqp_connections_on_one_quic_connection() {
    use qgate_amqp::oneshot::{receive_one, send_one};
    let r = start(BrokerConfig::default()).await;
    let c = r.connector(Scheme::QuicMux, None);
    let t = Duration::from_secs(10);
    for i in 0..5u8 {
        let msg = client::message_with_id(
            fe2o3_amqp::types::messaging::MessageId::String(format!("m{i}")),
            vec![i; 50],
        );
        let rep = send_one(&c, "mux", &msg, false, t).await.unwrap();
        assert_eq!(rep.messages, 1);
    }
    assert_eq!(
        c.quic_handshakes(),
        Some(1),
        "one handshake for five AMQP connections"
    );
    // Connections ran one after another on streams of the same QUIC connection; their
    // concurrent use shares it too.
    let both = futures_util::future::join(receive_one(&c, "mux", t), receive_one(&c, "mux", t));
    let (a, b) = both.await;
    assert_eq!((a.unwrap().messages, b.unwrap().messages), (1, 1));
    assert_eq!(c.quic_handshakes(), Some(1));
    // Once the shared connection is gone, the next AMQP connection opens another, in 0-RTT.
    c.close_shared().await;
    let rep = receive_one(&c, "mux", t).await.unwrap();
    assert_eq!(rep.messages, 1);
    assert_eq!(c.quic_handshakes(), Some(2));
    assert!(
        rep.zero_rtt,
        "the ticket from the first connection resumes the second"
    );
    let rest = client::receive(&c, &recv_spec("mux", 2), |_| {})
        .await
        .unwrap();
    assert_eq!(rest.messages, 2);
    assert_eq!(c.quic_handshakes(), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_on_a_declared_radio_dials_each_connection_from_a_socket_of_its_own() {
    // Decision T10: per-connection QUIC on a declared radio leaves from a new UDP socket each
    // time, with no connection IDs of its own, and still resumes in 0-RTT.
    use qgate_amqp::oneshot::send_one;
    let r = start(BrokerConfig::default()).await;
    let opts = TransportOptions {
        link_kbps: Some(250.0),
        ..Default::default()
    };
    let c = Connector::new(
        Scheme::Quic,
        r.quic,
        "localhost",
        &r.pki.trust(),
        None,
        None,
        &opts,
    )
    .unwrap();
    let t = Duration::from_secs(10);
    let mut zero_rtt = Vec::new();
    for i in 0..3u8 {
        let msg = client::message_with_id(
            fe2o3_amqp::types::messaging::MessageId::String(format!("r{i}")),
            vec![i; 50],
        );
        let rep = send_one(&c, "radio", &msg, false, t).await.unwrap();
        assert_eq!(rep.messages, 1);
        zero_rtt.push(rep.zero_rtt);
    }
    assert_eq!(zero_rtt, [false, true, true]);
    assert_eq!(c.quic_handshakes(), Some(3));
    let (io, info) = c.stream().await.unwrap();
    let conn = info.quic.expect("a QUIC connection");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(conn.stats().frame_tx.new_connection_id, 0);
    // The same connector without a declared radio issues the broker spare IDs.
    let plain = r.connector(Scheme::Quic, None);
    let (io2, info2) = plain.stream().await.unwrap();
    let conn2 = info2.quic.expect("a QUIC connection");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(conn2.stats().frame_tx.new_connection_id > 0);
    drop((io, io2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_beyond_the_per_address_limit_close_their_quic_connection() {
    let r = start(BrokerConfig {
        max_connections_per_address: 2,
        ..Default::default()
    })
    .await;
    let open = |n: u64| {
        let b = r.broker.clone();
        async move {
            for _ in 0..250 {
                if b.connections_open() == n {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            false
        }
    };
    let c = r.connector(Scheme::QuicMux, None);
    let header = b"AMQP\x03\x01\x00\x00";
    let (mut s1, info) = c.stream().await.unwrap();
    let conn = info.quic.unwrap();
    s1.write_all(header).await.unwrap();
    let (mut s2, _) = c.stream().await.unwrap();
    s2.write_all(header).await.unwrap();
    assert!(open(2).await, "two AMQP connections on one QUIC connection");
    // AMQP uses bidirectional streams only; the broker grants no unidirectional one.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), conn.open_uni())
            .await
            .is_err()
    );
    let (mut s3, _) = c.stream().await.unwrap();
    s3.write_all(header).await.unwrap();
    let e = tokio::time::timeout(Duration::from_secs(5), conn.closed())
        .await
        .expect("the third stream closes the connection");
    assert!(
        matches!(&e, quinn::ConnectionError::ApplicationClosed(a) if &a.reason[..] == b"per-address connection limit"),
        "{e}"
    );
    assert!(
        open(0).await,
        "a closed QUIC connection frees its AMQP connections"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_and_a_receiver_may_share_a_link_name() {
    // python-qpid-proton's default naming; fe2o3-amqp's session alone answers
    // DuplicatedLinkName and hangs (and its client refuses to send it), so the peer is written
    // frame by frame here.
    use fe2o3_amqp::types::definitions::Role;
    use fe2o3_amqp::types::messaging::{Source, Target};
    use fe2o3_amqp::types::performatives::{Attach, Begin, Performative};
    let r = start(BrokerConfig::default()).await;
    let attach = |role: Role, handle: u32| {
        let sender = role == Role::Sender;
        Performative::Attach(Attach {
            name: "same".into(),
            handle: handle.into(),
            role,
            snd_settle_mode: Default::default(),
            rcv_settle_mode: Default::default(),
            source: Some(Box::new(Source::builder().address("shared").build())),
            target: Some(Box::new(Target::builder().address("shared").build().into())),
            unsettled: None,
            incomplete_unsettled: false,
            initial_delivery_count: sender.then_some(0),
            max_message_size: None,
            offered_capabilities: None,
            desired_capabilities: None,
            properties: None,
        })
    };
    let mut out = b"AMQP\x03\x01\x00\x00".to_vec();
    out.extend(fe2o3_sasl_anonymous_init());
    out.extend_from_slice(b"AMQP\x00\x01\x00\x00");
    out.extend(frame(&qgate_amqp::wire::open("raw", u32::MAX)));
    out.extend(frame(&Performative::Begin(Begin {
        remote_channel: None,
        next_outgoing_id: 0,
        incoming_window: 100,
        outgoing_window: 100,
        handle_max: 10.into(),
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    })));
    out.extend(frame(&attach(Role::Sender, 0)));
    out.extend(frame(&attach(Role::Receiver, 1)));
    let mut t = tokio::net::TcpStream::connect(r.tcp).await.unwrap();
    t.write_all(&out).await.unwrap();
    let mut buf = Vec::new();
    let mut attaches = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while attaches.len() < 2 && tokio::time::Instant::now() < deadline {
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout(Duration::from_millis(200), t.read(&mut chunk)).await {
            Ok(Ok(0)) => break,
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
            _ => continue,
        }
        attaches = raw::frames(&buf)
            .into_iter()
            .filter_map(|(_, p)| match p? {
                Performative::Attach(a) => Some((a.name, a.role)),
                Performative::Detach(d) if d.error.is_some() => panic!("detached: {d:?}"),
                Performative::Close(c) if c.error.is_some() => panic!("closed: {c:?}"),
                _ => None,
            })
            .collect();
    }
    attaches.sort_by_key(|(_, role)| *role == Role::Receiver);
    assert_eq!(
        attaches,
        vec![
            ("same".to_string(), Role::Sender),
            ("same".to_string(), Role::Receiver)
        ],
        "both links attached under the peer's own name"
    );
}

fn frame(perf: &fe2o3_amqp::types::performatives::Performative) -> Vec<u8> {
    qgate_amqp::wire::amqp_frame(perf, &[])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn competing_consumers_share_the_queue_without_duplicates() {
    let r = start(BrokerConfig::default()).await;
    let c = r.connector(Scheme::Quic, None);
    client::send(&c, &send_spec("work", false), bodies(600, 7))
        .await
        .unwrap();
    let (mut c1, _) = c.open().await.unwrap();
    let (mut c2, _) = c.open().await.unwrap();
    let mut r1 = c1.receiver("w1", "work", false, 5).await.unwrap();
    let mut r2 = c2.receiver("w2", "work", false, 5).await.unwrap();
    let mut seen = std::collections::BTreeSet::new();
    let (mut n1, mut n2) = (0, 0);
    while seen.len() < 600 {
        tokio::select! {
            d = r1.recv::<Body<Value>>() => { let d = d.unwrap(); r1.accept(&d).await.unwrap(); n1 += 1; assert!(seen.insert(id(&d))); }
            d = r2.recv::<Body<Value>>() => { let d = d.unwrap(); r2.accept(&d).await.unwrap(); n2 += 1; assert!(seen.insert(id(&d))); }
            _ = tokio::time::sleep(Duration::from_secs(5)) => panic!("stalled at {}", seen.len()),
        }
    }
    assert!(n1 > 0 && n2 > 0, "both consumers got work: {n1} / {n2}");
    c1.close().await;
    c2.close().await;
}

fn id(d: &fe2o3_amqp::link::delivery::Delivery<Body<Value>>) -> String {
    match d
        .message()
        .properties
        .as_ref()
        .and_then(|p| p.message_id.clone())
    {
        Some(fe2o3_amqp::types::messaging::MessageId::String(s)) => s,
        other => panic!("message id {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsettled_messages_of_a_dropped_consumer_are_redelivered() {
    let r = start(BrokerConfig::default()).await;
    let c = r.connector(Scheme::Quic, None);
    client::send(&c, &send_spec("jobs", false), bodies(20, 3))
        .await
        .unwrap();
    {
        let (mut cl, _) = c.open().await.unwrap();
        let mut rx = cl.receiver("greedy", "jobs", false, 20).await.unwrap();
        rx.set_credit_mode(CreditMode::Manual);
        for _ in 0..20 {
            // Received, never accepted.
            tokio::time::timeout(Duration::from_secs(5), rx.recv::<Body<Value>>())
                .await
                .unwrap()
                .unwrap();
        }
        cl.close().await;
    }
    let mut got = Vec::new();
    let rep = client::receive(&c, &recv_spec("jobs", 20), |b| got.push(b.to_vec()))
        .await
        .unwrap();
    assert_eq!(rep.messages, 20);
    assert_eq!(got, bodies(20, 3).collect::<Vec<_>>(), "all back, in order");
    let s = &r.broker.queue_stats()[0];
    assert_eq!(s.stats.released, 20);
    assert_eq!(s.depth, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_rejects_with_resource_limit_exceeded() {
    let r = start(BrokerConfig {
        queues: vec![QueueDecl {
            name: "small".into(),
            max_messages: Some(5),
            max_bytes: Some(1 << 20),
            ttl: None,
        }],
        high_water: 1.0,
        ..Default::default()
    })
    .await;
    let c = r.connector(Scheme::Tcp, None);
    let mut spec = send_spec("small", false);
    spec.window = 1;
    let rep = client::send(&c, &spec, bodies(8, 1)).await.unwrap();
    assert_eq!((rep.messages, rep.rejected), (5, 3));
    let e = rep.first_error.unwrap();
    assert!(
        e.contains("ResourceLimitExceeded") && e.contains("small"),
        "{e}"
    );
    let got = client::receive(&c, &recv_spec("small", 5), |_| {})
        .await
        .unwrap();
    assert_eq!(got.messages, 5);
}

/// A message over the announced max-message-size fails at once, by name, on every scheme,
/// instead of streaming megabytes into a connection the broker then closes (the client used
/// to hang); one at the limit's edge still goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_announced_size_is_refused_by_the_sender() {
    let r = start(BrokerConfig::default()).await;
    for scheme in [Scheme::Quic, Scheme::Tcp] {
        let c = r.connector(scheme, None);
        let big = vec![7u8; qgate_amqp::shim::MAX_PARTIAL + 1];
        let e = tokio::time::timeout(
            Duration::from_secs(20),
            client::send(&c, &send_spec("big", false), std::iter::once(big)),
        )
        .await
        .expect("no hang")
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("exceed") || e.contains("size"),
            "{scheme:?}: {e}"
        );
        let fits = vec![7u8; qgate_amqp::shim::MAX_PARTIAL - 1024];
        let rep = client::send(&c, &send_spec("big", false), std::iter::once(fits))
            .await
            .unwrap();
        assert_eq!(rep.messages, 1, "{scheme:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_consumer_back_pressures_the_producer_and_memory_stays_bounded() {
    let r = start(BrokerConfig {
        queues: vec![QueueDecl {
            name: "bp".into(),
            max_messages: Some(100),
            max_bytes: Some(1 << 20),
            ttl: None,
        }],
        producer_credit: 10,
        high_water: 0.5,
        ..Default::default()
    })
    .await;
    let c = r.connector(Scheme::Quic, None);
    let mut spec = send_spec("bp", false);
    spec.window = 20;
    let producer = {
        let c = c.clone();
        tokio::spawn(async move { client::send(&c, &spec, bodies(1000, 9)).await })
    };
    // Wait (not a fixed sleep: a loaded machine connects late) for the high-water mark, then
    // watch it hold with the producer still held back.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while r.broker.queue_stats()[0].depth < 50 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the queue never filled"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!producer.is_finished(), "the producer is held back");
    let depth = r.broker.queue_stats()[0].depth;
    assert!(
        (50..=100).contains(&depth),
        "depth {depth} stays near the high-water mark"
    );
    // A consumer drains it; the producer finishes and nothing was refused or lost.
    let mut got = 0u64;
    let mut max_depth = 0;
    let rx = {
        let c = c.clone();
        tokio::spawn(async move { client::receive(&c, &recv_spec("bp", 1000), |_| {}).await })
    };
    while !rx.is_finished() {
        max_depth = max_depth.max(r.broker.queue_stats()[0].depth);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    got += rx.await.unwrap().unwrap().messages;
    let sent = producer.await.unwrap().unwrap();
    assert_eq!((sent.messages, sent.rejected, got), (1000, 0, 1000));
    assert!(max_depth <= 100, "depth peaked at {max_depth}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_messages_are_not_delivered() {
    let r = start(BrokerConfig {
        default_ttl: Some(Duration::from_millis(100)),
        ..Default::default()
    })
    .await;
    let c = r.connector(Scheme::Tcp, None);
    client::send(&c, &send_spec("ttl", false), bodies(3, 1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let mut spec = recv_spec("ttl", 1);
    spec.idle = Duration::from_millis(300);
    let rep = client::receive(&c, &spec, |_| {}).await.unwrap();
    assert_eq!(rep.messages, 0);
    assert_eq!(r.broker.queue_stats()[0].stats.expired, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_address_and_wrong_credentials_are_refused_by_name() {
    let users = [("alice".to_string(), "pw".to_string())]
        .into_iter()
        .collect();
    let r = start(BrokerConfig {
        auto_create: false,
        queues: vec![QueueDecl {
            name: "known".into(),
            max_messages: None,
            max_bytes: None,
            ttl: None,
        }],
        credentials: Credentials::plain(users, false),
        ..Default::default()
    })
    .await;
    let bad = r.connector(Scheme::Quic, Some(("alice", "nope")));
    let e = client::send(&bad, &send_spec("known", false), bodies(1, 1))
        .await
        .unwrap_err();
    assert!(matches!(e, qgate_amqp::client::ClientError::Open(_)), "{e}");
    let anon = r.connector(Scheme::Quic, None);
    assert!(
        client::send(&anon, &send_spec("known", false), bodies(1, 1))
            .await
            .is_err()
    );
    let good = r.connector(Scheme::Quic, Some(("alice", "pw")));
    let e = client::send(&good, &send_spec("nowhere", false), bodies(1, 1))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("nowhere"), "{e}");
    let ok = client::send(&good, &send_spec("known", false), bodies(2, 1))
        .await
        .unwrap();
    assert_eq!(ok.messages, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_bad_frames_close_that_connection_only() {
    let r = start(BrokerConfig::default()).await;
    let c = r.connector(Scheme::Tcp, None);
    let (mut keep, _) = c.open().await.unwrap();
    let mut s = keep.sender("s", "steady", false).await.unwrap();
    s.send(client::message(0, b"before".to_vec()))
        .await
        .unwrap();
    // Garbage instead of a protocol header: the broker answers with its header and closes.
    let mut t = tokio::net::TcpStream::connect(r.tcp).await.unwrap();
    t.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), t.read_to_end(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(buf, b"AMQP\x03\x01\x00\x00");
    // A valid start, then an oversized frame: framing-error close after the broker's open.
    let mut t = tokio::net::TcpStream::connect(r.tcp).await.unwrap();
    t.write_all(b"AMQP\x03\x01\x00\x00").await.unwrap();
    let init = fe2o3_sasl_anonymous_init();
    t.write_all(&init).await.unwrap();
    t.write_all(b"AMQP\x00\x01\x00\x00").await.unwrap();
    t.write_all(&[0x7f, 0, 0, 0, 2, 0, 0, 0]).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), t.read_to_end(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let tail = String::from_utf8_lossy(&buf);
    assert!(tail.contains("amqp:connection:framing-error"), "{tail}");
    // Everyone else is still served, and nothing accepted is lost.
    s.send(client::message(1, b"after".to_vec())).await.unwrap();
    let rep = client::receive(&c, &recv_spec("steady", 2), |_| {})
        .await
        .unwrap();
    assert_eq!(rep.messages, 2);
    keep.close().await;
}

/// SASL-init for ANONYMOUS, encoded by hand (AMQP 1.0 §5.3.3.2).
fn fe2o3_sasl_anonymous_init() -> Vec<u8> {
    use fe2o3_amqp::types::primitives::Symbol;
    use fe2o3_amqp::types::sasl::SaslInit;
    let init = SaslInit {
        mechanism: Symbol::from("ANONYMOUS"),
        initial_response: None,
        hostname: None,
    };
    qgate_amqp::wire::frame(1, 0, &serde_amqp::to_vec(&init).unwrap(), &[])
}

/// A CA and a client certificate it signed, made for the test.
fn client_pki(name: &str) -> (qgate_transport::TrustRoots, qgate_transport::Identity) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    let ca_key = KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let leaf = CertificateParams::new(vec![name.to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    (
        qgate_transport::TrustRoots {
            roots: vec![CertificateDer::from(ca_cert.der().to_vec())],
        },
        qgate_transport::Identity {
            chain: vec![CertificateDer::from(leaf.der().to_vec())],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_can_require_tls_client_certificates() {
    let pki = DevPki::generate(&[]).unwrap();
    let (client_ca, device) = client_pki("device-1");
    let (_, stranger) = client_pki("stranger");
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tcfg = transport::tls_server_config(&pki.server, Some(&client_ca)).unwrap();
    let running = Broker::builder().tcp(l, Some(tcfg)).start().unwrap();
    let addr = running.tcp_addrs()[0];
    let base = || connector_to(Scheme::TcpTls(TlsVersion::V13), addr, &pki, None);
    let spec = send_spec("certs", false);
    // No certificate, or one from another CA: refused during the handshake.
    assert!(client::send(&base(), &spec, bodies(1, 1)).await.is_err());
    let other = base()
        .with_client_identity(&pki.trust(), &stranger)
        .unwrap();
    assert!(client::send(&other, &spec, bodies(1, 1)).await.is_err());
    let ok = base().with_client_identity(&pki.trust(), &device).unwrap();
    let r = client::send(&ok, &spec, bodies(3, 1)).await.unwrap();
    assert_eq!(r.messages, 3);
    // Over TLS 1.2 as well.
    let v12 = connector_to(Scheme::TcpTls(TlsVersion::V12), addr, &pki, None)
        .with_client_identity(&pki.trust(), &device)
        .unwrap();
    assert_eq!(
        client::send(&v12, &spec, bodies(2, 1))
            .await
            .unwrap()
            .messages,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_larger_than_a_frame_pass_the_shim_whole() {
    // 200 kB bodies span several 64 KiB frames: the shim checks each delivery whole (M11).
    let r = start(BrokerConfig::default()).await;
    for scheme in [Scheme::Quic, Scheme::Tcp] {
        let c = r.connector(scheme, None);
        let q = format!("big-{scheme}");
        let big: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i; 200_000]).collect();
        let sent = client::send(&c, &send_spec(&q, false), big.clone())
            .await
            .unwrap();
        assert_eq!((sent.messages, sent.rejected), (3, 0), "{scheme}");
        let mut got = Vec::new();
        let rep = client::receive(&c, &recv_spec(&q, 3), |b| got.push(b.to_vec()))
            .await
            .unwrap();
        assert_eq!(rep.messages, 3, "{scheme}");
        assert_eq!(got, big, "{scheme}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quic_broker_can_require_client_certificates() {
    let pki = DevPki::generate(&[]).unwrap();
    let (client_ca, device) = client_pki("device-1");
    let (_, stranger) = client_pki("stranger");
    let scfg = qgate_transport::server_config_with_client_auth(
        &pki.server,
        &[ALPN_AMQP],
        &TransportOptions::default(),
        Some(&client_ca),
    )
    .unwrap();
    let (_broker, addr) = quic_broker_with(BrokerConfig::default(), scfg);
    let base = || connector_to(Scheme::Quic, addr, &pki, None);
    let spec = send_spec("quic-certs", false);
    let within = |f| tokio::time::timeout(Duration::from_secs(10), f);
    let anonymous = base();
    assert!(within(client::send(&anonymous, &spec, bodies(1, 1)))
        .await
        .unwrap()
        .is_err());
    let other = base()
        .with_client_identity(&pki.trust(), &stranger)
        .unwrap();
    assert!(within(client::send(&other, &spec, bodies(1, 1)))
        .await
        .unwrap()
        .is_err());
    let ok = base().with_client_identity(&pki.trust(), &device).unwrap();
    let r = within(client::send(&ok, &spec, bodies(3, 1)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.messages, 3);
    // The same client comes back (with a ticket) and is let in again.
    let again = within(client::send(&ok, &spec, bodies(2, 1)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.messages, 2);
    // Plain TCP cannot carry a certificate: a clear error, not a silent downgrade.
    let tcp = connector_to(Scheme::Tcp, addr, &pki, None);
    let e = tcp
        .with_client_identity(&pki.trust(), &device)
        .err()
        .unwrap();
    assert!(e.to_string().contains("needs TLS"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_without_the_sasl_layer_is_served_while_anonymous_is_admitted() {
    // go-amqp's defaults send the plain AMQP header (issue #18 item 9, decision M19).
    let msg = qgate_amqp::broker::encode(&client::message(1, b"plain".to_vec()));
    let r = start(BrokerConfig::default()).await;
    let mut t = tokio::net::TcpStream::connect(r.tcp).await.unwrap();
    let d = raw::send_after(&mut t, raw::plain_opening(), "plain", &msg).await;
    assert!(
        matches!(&d, Some(fe2o3_amqp::types::performatives::Performative::Disposition(x))
            if matches!(x.state, Some(fe2o3_amqp::types::messaging::DeliveryState::Accepted(_)))),
        "{d:?}"
    );
    assert_eq!(r.broker.queue_stats()[0].stats.enqueued, 1);
    // Turned off, or with anonymous peers not admitted: the broker answers with the SASL
    // header it requires and closes (AMQP 1.0 §2.2).
    let plain_off = BrokerConfig {
        plain_amqp: false,
        ..Default::default()
    };
    let users = Credentials::plain([("u".to_string(), "p".to_string())].into(), false);
    let no_anonymous = BrokerConfig {
        credentials: users,
        ..Default::default()
    };
    for cfg in [plain_off, no_anonymous] {
        let r = start(cfg).await;
        let mut t = tokio::net::TcpStream::connect(r.tcp).await.unwrap();
        t.write_all(&raw::plain_opening()).await.unwrap();
        let mut buf = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), t.read_to_end(&mut buf))
            .await
            .unwrap()
            .ok();
        assert_eq!(buf, b"AMQP\x03\x01\x00\x00");
    }
}

/// The admin port's actions: a purge drops the ready messages (the delivered one stays with its
/// consumer) and frees their room; a closed connection hears `connection:forced` and its
/// unsettled message comes back; both are listed and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_can_purge_a_queue_and_close_a_connection() {
    for (scheme, kind) in [(Scheme::Tcp, "tcp"), (Scheme::Quic, "quic")] {
        operator_actions(scheme, kind).await;
        closing_a_held_producer_ends_its_send(scheme).await;
    }
}

/// A producer held by back-pressure (a full queue grants no credit) whose connection the
/// operator closes gets an error at once instead of waiting for credit forever.
async fn closing_a_held_producer_ends_its_send(scheme: Scheme) {
    let r = start(BrokerConfig {
        queues: vec![QueueDecl {
            name: "small".into(),
            max_messages: Some(10),
            max_bytes: None,
            ttl: None,
        }],
        ..Default::default()
    })
    .await;
    let c = r.connector(scheme, None);
    let send =
        tokio::spawn(
            async move { client::send(&c, &send_spec("small", false), bodies(50, 5)).await },
        );
    // Held: the depth stops below the limit and the sender waits.
    let mut last = usize::MAX;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let d = r.broker.queue_stats()[0].depth;
        if d == last && d > 0 {
            break;
        }
        last = d;
    }
    assert!(!send.is_finished(), "the producer is held");
    let (conns, _) = r.broker.connection_views(10);
    assert!(r.broker.close_connection(conns[0].id));
    let out = tokio::time::timeout(Duration::from_secs(5), send)
        .await
        .expect("the send ends once its connection is closed")
        .unwrap();
    let e = out.expect_err("the link ended").to_string();
    assert!(e.contains("closed"), "{e}");
}

async fn operator_actions(scheme: Scheme, kind: &str) {
    let r = start(BrokerConfig::default()).await;
    let c = r.connector(scheme, None);
    client::send(&c, &send_spec("jobs", false), bodies(10, 4))
        .await
        .unwrap();
    let (mut cl, _) = c.open().await.unwrap();
    let mut rx = cl.receiver("holder", "jobs", false, 1).await.unwrap();
    rx.set_credit_mode(CreditMode::Manual);
    tokio::time::timeout(Duration::from_secs(5), rx.recv::<Body<Value>>())
        .await
        .unwrap()
        .unwrap();
    // The consumer holds what its credit let through (at least the one it read).
    let held = r.broker.queue_stats()[0].unacked;
    assert!(held >= 1);
    assert_eq!(r.broker.purge("jobs").await, Some(10 - held));
    assert_eq!(r.broker.purge("nope").await, None);
    let q = &r.broker.queue_stats()[0];
    assert_eq!(
        (q.depth, q.ready, q.unacked, q.stats.purged),
        (held, 0, held, (10 - held) as u64)
    );
    // The holder's connection is listed; closing it sends its message back.
    let (conns, total) = r.broker.connection_views(100);
    assert_eq!(total, 1);
    assert_eq!(conns[0].kind, kind);
    assert!(!r.broker.close_connection(conns[0].id + 1000));
    assert!(r.broker.close_connection(conns[0].id));
    let err = tokio::time::timeout(Duration::from_secs(5), rx.recv::<Body<Value>>())
        .await
        .expect("the receiver hears the close")
        .expect_err("no more messages");
    let why = format!("{err:?}");
    assert!(
        why.contains("ConnectionForced") && why.contains("closed by the operator"),
        "{why}"
    );
    // The connection's state is freed and its unsettled messages come back.
    let mut freed = false;
    for _ in 0..100 {
        let q = &r.broker.queue_stats()[0];
        if r.broker.connection_views(100).1 == 0 && (q.ready, q.unacked) == (held, 0) {
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        freed,
        "the closed connection is freed and its messages are back"
    );
    let got = client::receive(&c, &recv_spec("jobs", held as u64), |_| {})
        .await
        .unwrap();
    assert_eq!(got.messages, held as u64);
    let m = r.broker.metrics();
    assert!(
        m.contains("qgate_amqp_queue_depth{queue=\"jobs\"} 0\n"),
        "{m}"
    );
}

/// Declarations racing each other (a reload, auto-creates) never pass `max_queues`, and a name
/// declared twice at once is created once.
#[tokio::test]
async fn racing_declarations_respect_the_queue_cap() {
    let r = start(BrokerConfig {
        max_queues: 3,
        ..Default::default()
    })
    .await;
    let decl = |name: String| QueueDecl {
        name,
        max_messages: Some(7),
        max_bytes: None,
        ttl: None,
    };
    // All sixteen start together, so checks and declarations interleave.
    let start = std::sync::Barrier::new(16);
    let outcomes: Vec<qgate_amqp::broker::Declared> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..16)
            .map(|i| {
                let (b, d, start) = (&r.broker, decl(format!("q{}", i % 8)), &start);
                s.spawn(move || {
                    start.wait();
                    b.declare_queue(&d)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    use qgate_amqp::broker::Declared;
    let count = |want: Declared| outcomes.iter().filter(|o| **o == want).count();
    assert_eq!(count(Declared::Created), 3, "{outcomes:?}");
    assert_eq!(r.broker.queue_stats().len(), 3);
    // Every loser of a race for a created name saw it exist; the rest found the broker full.
    assert_eq!(count(Declared::Exists) + count(Declared::Full), 13);
}

/// Issue 49 item 6c (decision M32): a consumer settles messages while the broker is stopped as
/// `qgate broker` stops on SIGTERM (`RunningBroker::close`, then its runtime dropped); restarted
/// on the same store, the broker delivers none of the settled messages again, and loses none.
#[test]
fn a_clean_stop_keeps_every_settlement() {
    const TOTAL: usize = 2000;
    let dir = std::env::temp_dir().join(format!("qgate-clean-stop-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = BrokerConfig {
        store: Some(dir.join("broker.redb")),
        ..BrokerConfig::default()
    };
    let pki = DevPki::generate(&[]).unwrap();
    let clients = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    // The broker in a runtime of its own, as the CLI runs it.
    let start = |cfg: BrokerConfig| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let opts = transport::broker_options(&TransportOptions::default());
        let scfg = server_config(&pki.server, &[ALPN_AMQP], &opts).unwrap();
        // The previous broker's store closes as its runtime goes: wait for its file lock.
        let t0 = std::time::Instant::now();
        let running = loop {
            let _g = rt.enter();
            let ep = endpoint(
                Socket::bind_udp("127.0.0.1:0".parse().unwrap()).unwrap(),
                Some(scfg.clone()),
                None,
            )
            .unwrap();
            match Broker::builder().config(cfg.clone()).quic(ep).start() {
                Ok(r) => break r,
                Err(e) if t0.elapsed() < Duration::from_secs(10) => {
                    eprintln!("restart: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("{e}"),
            }
        };
        let _g = clients.enter();
        let c = connector_to(Scheme::Quic, running.quic_addrs()[0], &pki, None);
        (rt, running, c)
    };
    let (rt, running, c) = start(cfg.clone());
    clients
        .block_on(client::send(
            &c,
            &send_spec("jobs", false),
            bodies(TOTAL, 9),
        ))
        .unwrap();
    // A consumer accepting every message as it comes, until its connection ends.
    let (tx, half) = std::sync::mpsc::channel();
    let consumer = clients.spawn(async move {
        let (mut cl, _) = c.open().await.unwrap();
        let mut rx = cl.receiver("worker", "jobs", false, 100).await.unwrap();
        let mut settled = std::collections::BTreeSet::new();
        loop {
            let d = match tokio::time::timeout(Duration::from_secs(5), rx.recv::<Body<Value>>())
                .await
            {
                Ok(Ok(d)) => d,
                _ => break,
            };
            if rx.accept(&d).await.is_err() {
                break;
            }
            assert!(settled.insert(id(&d)), "delivered twice before the stop");
            if settled.len() == TOTAL / 4 {
                let _ = tx.send(());
            }
        }
        settled
    });
    half.recv_timeout(Duration::from_secs(30))
        .expect("a quarter settled");
    rt.block_on(running.close(Duration::from_secs(2)));
    drop(rt);
    let settled = clients.block_on(consumer).unwrap();
    assert!(settled.len() < TOTAL, "the stop came before the end");

    let (rt, running, c) = start(cfg);
    let mut again = Vec::new();
    let rest = (TOTAL - settled.len()) as u64;
    let rep = clients
        .block_on(async {
            let (mut cl, _) = c.open().await.unwrap();
            let mut rx = cl.receiver("after", "jobs", false, 100).await.unwrap();
            let mut n = 0;
            while let Ok(Ok(d)) =
                tokio::time::timeout(Duration::from_secs(2), rx.recv::<Body<Value>>()).await
            {
                rx.accept(&d).await.unwrap();
                again.push(id(&d));
                n += 1;
            }
            cl.close().await;
            Ok::<_, ()>(n)
        })
        .unwrap();
    let repeated: Vec<_> = again.iter().filter(|i| settled.contains(*i)).collect();
    assert!(
        repeated.is_empty(),
        "{} of {} settled messages delivered again after a clean stop: {:?}",
        repeated.len(),
        settled.len(),
        &repeated[..repeated.len().min(5)]
    );
    assert_eq!(rep, rest, "every message not settled is still there");
    rt.block_on(running.close(Duration::from_secs(1)));
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 49 item 6b (decision M33): the broker holds at most `max_connections`, whatever the
/// addresses they come from; one more is closed on accept and counted, and once one closes a
/// new one is admitted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_broker_limit_are_refused_until_one_closes() {
    let r = start(BrokerConfig {
        max_connections: 3,
        max_connections_per_address: 2,
        ..Default::default()
    })
    .await;
    let open = |n: u64| {
        let b = r.broker.clone();
        async move {
            for _ in 0..250 {
                if b.connections_open() == n {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            false
        }
    };
    // Plain TCP from three loopback addresses, each within its per-address share.
    let connect = |from: &'static str| {
        let to = r.tcp;
        async move {
            let s = tokio::net::TcpSocket::new_v4().unwrap();
            s.bind(format!("{from}:0").parse().unwrap()).unwrap();
            let mut s = s.connect(to).await.unwrap();
            s.write_all(b"AMQP\x03\x01\x00\x00").await.unwrap();
            s
        }
    };
    let mut held = Vec::new();
    for (i, from) in ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
        .into_iter()
        .enumerate()
    {
        held.push(connect(from).await);
        assert!(open(i as u64 + 1).await, "connection {} admitted", i + 1);
    }
    // A fourth, from an address that holds none: closed on accept.
    let mut fourth = connect("127.0.0.4").await;
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), fourth.read(&mut buf))
        .await
        .expect("the fourth is closed at once");
    assert!(matches!(n, Ok(0) | Err(_)), "the fourth was served: {n:?}");
    assert_eq!(r.broker.connections_open(), 3);
    let m = r.broker.metrics();
    assert!(
        m.contains("qgate_amqp_connections_refused_full_total 1"),
        "{m}"
    );
    assert!(m.contains("qgate_amqp_max_connections 3"), "{m}");
    // One closes: the next is admitted.
    drop(held.remove(0));
    assert!(open(2).await, "a closed connection frees its place");
    let _fifth = connect("127.0.0.4").await;
    assert!(open(3).await, "admitted again once one closed");
}
