//! The broker reads tokio's clock, so message TTLs and the 0-RTT replay window pass in virtual
//! time like everything else on the simulator (issue #18 item 10, decision M18). Each test runs
//! on a paused clock: hours pass in milliseconds of wall time.

use std::time::Duration;

use fe2o3_amqp::types::messaging::DeliveryState;
use fe2o3_amqp::types::performatives::Performative;
use qgate_amqp::broker::{encode, Broker, BrokerConfig, QueueDecl};
use qgate_amqp::client;

#[path = "common/raw.rs"]
mod raw;

fn accepted(d: Option<Performative>) -> bool {
    matches!(d, Some(Performative::Disposition(d)) if matches!(d.state, Some(DeliveryState::Accepted(_))))
}

/// Send one message on a fresh in-memory connection; `quic` serves it as a QUIC stream
/// (guarded against 0-RTT replays).
async fn send(broker: &Broker, quic: bool, queue: &str, body: &[u8]) -> bool {
    let (mut ours, theirs) = tokio::io::duplex(64 * 1024);
    let b = broker.clone();
    tokio::spawn(async move {
        if quic {
            b.serve_quic_stream(theirs, false).await
        } else {
            b.serve(theirs).await
        }
    });
    let msg = client::message_with_id(
        fe2o3_amqp::types::messaging::MessageId::String("m-1".into()),
        body.to_vec(),
    );
    let d = raw::send_one(&mut ours, queue, &encode(&msg)).await;
    accepted(d)
}

fn depth(b: &Broker, queue: &str) -> (usize, u64, u64) {
    b.queue_stats()
        .into_iter()
        .find(|q| q.name == queue)
        .map_or((0, 0, 0), |q| (q.depth, q.stats.enqueued, q.stats.expired))
}

#[tokio::test(start_paused = true)]
async fn message_ttl_passes_in_virtual_time() {
    let broker = Broker::start(BrokerConfig {
        queues: vec![QueueDecl {
            name: "short-lived".into(),
            max_messages: None,
            max_bytes: None,
            ttl: Some(Duration::from_secs(10)),
        }],
        ..Default::default()
    })
    .unwrap();
    assert!(send(&broker, false, "short-lived", b"x").await);
    assert_eq!(depth(&broker, "short-lived"), (1, 1, 0));
    // Ten virtual seconds later (the sweep runs each second) the message has expired,
    // although almost no wall time has passed.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(depth(&broker, "short-lived"), (0, 1, 1));
}

#[tokio::test(start_paused = true)]
async fn the_replay_window_passes_in_virtual_time() {
    let broker = Broker::start(BrokerConfig::default()).unwrap();
    assert!(send(&broker, true, "q", b"same").await);
    // A repeat within the window is a replay: accepted, not queued again (M9).
    assert!(send(&broker, true, "q", b"same").await);
    assert_eq!(depth(&broker, "q").1, 1);
    // After the 24 h window, the same message-id and bytes are a new message.
    tokio::time::sleep(Duration::from_secs(25 * 3600)).await;
    assert!(send(&broker, true, "q", b"same").await);
    assert_eq!(depth(&broker, "q").1, 2);
}
