//! 0-RTT: a returning client's SASL, open, begin, attach and first transfer ride in the first
//! flight and the broker takes them; replays of that flight are harmless.

use std::time::Duration;

use fe2o3_amqp::types::messaging::{Body, Data, Message, MessageId};
use fe2o3_amqp::types::primitives::Binary;
use qgate_amqp::broker::BrokerConfig;
use qgate_amqp::builder::RunningBroker;
use qgate_amqp::client::{self, Connector};
use qgate_amqp::oneshot::{receive_one, send_in_turn, send_one};
use qgate_amqp::transport::{Scheme, ALPN_AMQP};
use qgate_transport::{server_config, DevPki, TransportOptions};

mod common;
use common::{connector_to, quic_broker_with};

fn metric(m: &str, name: &str) -> u64 {
    m.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} in {m}"))
}

/// A memory broker on a loopback QUIC listener and a connector to it (one ticket cache, so
/// the connector's later connections may resume with 0-RTT).
async fn quic_broker() -> (RunningBroker, Connector) {
    let pki = DevPki::generate(&[]).unwrap();
    let scfg = server_config(&pki.server, &[ALPN_AMQP], &TransportOptions::default()).unwrap();
    let (running, addr) = quic_broker_with(BrokerConfig::default(), scfg);
    let c = connector_to(Scheme::Quic, addr, &pki, None);
    (running, c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_client_pipelines_everything_in_0rtt_and_replays_are_dropped() {
    let (broker, c) = quic_broker().await;
    let t = Duration::from_secs(5);
    // First contact: a full handshake, and a session ticket for next time.
    let first = send_one(&c, "sensors", &client::message(1, b"a".to_vec()), false, t)
        .await
        .unwrap();
    assert!(!first.zero_rtt);
    assert_eq!(first.messages, 1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Returning: everything in the first flight.
    let msg = client::message(2, b"b".to_vec());
    let second = send_one(&c, "sensors", &msg, false, t).await.unwrap();
    assert!(second.zero_rtt, "the client resumed with 0-RTT");
    assert_eq!(
        (second.messages, second.rejected),
        (1, 0),
        "{:?}",
        second.first_error
    );
    // An attacker replaying that flight gets the same answer, and nothing is queued twice.
    let replay = send_one(&c, "sensors", &msg, false, t).await.unwrap();
    assert!(replay.zero_rtt);
    assert_eq!(replay.messages, 1);
    // Without a message-id there is nothing to de-duplicate on: refused in 0-RTT.
    let anonymous: Message<Body<fe2o3_amqp::types::primitives::Value>> = Message::builder()
        .body(Body::Data(vec![Data(Binary::from(b"c".to_vec()))].into()))
        .build();
    let r = send_one(&c, "sensors", &anonymous, false, t).await.unwrap();
    assert_eq!(r.rejected, 1);
    assert!(r.first_error.unwrap().contains("message-id"));
    let m = broker.broker().metrics();
    assert_eq!(metric(&m, "qgate_amqp_replays_dropped_total"), 1, "{m}");
    let q = &broker.broker().queue_stats()[0];
    assert_eq!((q.name.as_str(), q.depth), ("sensors", 2));
    // The fe2o3-based client over a resumed connection works too (its stream starts in 0-RTT;
    // its message-ids are unique per run).
    let spec = client::SendSpec {
        address: "sensors".into(),
        settled: false,
        window: 10,
        rate: None,
        link_name: "s".into(),
    };
    let bulk = client::send(&c, &spec, (0..50).map(|_| vec![1u8; 10]))
        .await
        .unwrap();
    assert!(bulk.zero_rtt);
    assert_eq!((bulk.messages, bulk.rejected), (50, 0));
    let again = client::send(&c, &spec, (0..50).map(|_| vec![1u8; 10]))
        .await
        .unwrap();
    assert_eq!(again.messages, 50);
    assert_eq!(
        broker.broker().queue_stats()[0].depth,
        102,
        "identical bodies in a new run are not replays"
    );
    let _ = MessageId::Ulong(0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_clients_send_in_turn_and_receive_one_per_connection() {
    let (broker, c) = quic_broker().await;
    let t = Duration::from_secs(5);
    let run = client::run_id();
    let msgs: Vec<_> = (0..5u8)
        .map(|i| client::message_with_id(MessageId::String(format!("{run}-{i}")), vec![i; 10]))
        .collect();
    let sent = send_in_turn(&c, "turns", &msgs, false, t).await.unwrap();
    assert_eq!((sent.messages, sent.rejected, sent.bytes), (5, 0, 50));
    assert!(sent.rtt.is_some() && sent.startup <= sent.total);
    let mut zero = 0;
    for _ in 0..5 {
        let r = receive_one(&c, "turns", t).await.unwrap();
        assert_eq!(r.messages, 1);
        zero += usize::from(r.zero_rtt);
    }
    assert!(
        zero >= 4,
        "the returning receiver resumes in 0-RTT ({zero} of 5)"
    );
    // Every message was accepted and settled: nothing left, nothing waiting for redelivery.
    let q = broker
        .broker()
        .queue_stats()
        .into_iter()
        .find(|q| q.name == "turns")
        .unwrap();
    assert_eq!((q.depth, q.stats.acked), (0, 5));
    // An empty queue: the receiver waits, bounded, and says so.
    let e = receive_one(&c, "turns", Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no answer"), "{e}");
}
