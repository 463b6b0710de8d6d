//! A bridge (store and forward) from a local queue to an upstream broker that is killed mid-run
//! and started again: every message the local broker accepted reaches the upstream queue (at
//! least once), the local queue ends empty, and while the upstream is down the messages wait
//! in the local queue.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use fe2o3_amqp::types::messaging::{Body, MessageId};
use fe2o3_amqp::types::primitives::Value;
use qgate_amqp::bridge::BridgeConfig;
use qgate_amqp::broker::{Broker, BrokerConfig};
use qgate_amqp::builder::RunningBroker;
use qgate_amqp::client::{self, Connector, SendSpec};
use qgate_amqp::transport::Scheme;
use qgate_amqp::url;

/// A durable broker on plain TCP in its own runtime, so the test can kill it the way a crash
/// would (every task and socket at once) and start it again on the same port and store.
struct UpstreamBroker {
    rt: Option<tokio::runtime::Runtime>,
    running: Option<RunningBroker>,
    addr: SocketAddr,
}

impl UpstreamBroker {
    fn start(store: &Path, addr: SocketAddr) -> UpstreamBroker {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let running = {
            let _g = rt.enter();
            let s = tokio::net::TcpSocket::new_v4().unwrap();
            s.set_reuseaddr(true).unwrap();
            s.bind(addr).unwrap();
            Broker::builder()
                .config(BrokerConfig {
                    store: Some(store.to_path_buf()),
                    ..Default::default()
                })
                .tcp(s.listen(64).unwrap(), None)
                .start()
                .unwrap()
        };
        UpstreamBroker {
            addr: running.tcp_addrs()[0],
            running: Some(running),
            rt: Some(rt),
        }
    }

    async fn kill(&mut self) {
        drop(self.running.take());
        if let Some(rt) = self.rt.take() {
            tokio::task::spawn_blocking(move || rt.shutdown_timeout(Duration::from_secs(5)))
                .await
                .unwrap();
        }
    }
}

impl Drop for UpstreamBroker {
    fn drop(&mut self) {
        drop(self.running.take());
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

fn tcp(addr: SocketAddr) -> Connector {
    let opts = client::with_idle_timeout(&Default::default(), Duration::from_secs(2));
    Connector::new(
        Scheme::Tcp,
        addr,
        "localhost",
        &Default::default(),
        None,
        None,
        &opts,
    )
    .unwrap()
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("qgate-bridge-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Every message on `queue` (until 2 s pass without one): message-id → copies.
async fn drain(c: &Connector, queue: &str) -> HashMap<String, usize> {
    let (mut client, _) = c.open().await.unwrap();
    let mut rx = client.receiver("check", queue, false, 200).await.unwrap();
    let mut seen = HashMap::new();
    while let Ok(Ok(d)) =
        tokio::time::timeout(Duration::from_secs(2), rx.recv::<Body<Value>>()).await
    {
        let id = match d
            .message()
            .properties
            .as_ref()
            .and_then(|p| p.message_id.clone())
        {
            Some(MessageId::String(s)) => s,
            other => format!("{other:?}"),
        };
        rx.accept(&d).await.unwrap();
        *seen.entry(id).or_insert(0) += 1;
    }
    let _ = rx.close().await;
    client.close().await;
    seen
}

fn depth(b: &Broker, queue: &str) -> usize {
    b.queue_stats()
        .iter()
        .find(|q| q.name == queue)
        .map_or(0, |q| q.depth)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_and_forward_survives_the_upstream_being_killed() {
    const N: usize = 1000;
    let dir = tmp("kill");
    let mut upstream = UpstreamBroker::start(&dir.join("up.redb"), "127.0.0.1:0".parse().unwrap());
    let up_addr = upstream.addr;

    // The edge broker: durable, TCP, one bridge from "out" to the upstream's "in".
    let mut bridge = BridgeConfig::new(
        "out",
        url::Upstream::Connector(tcp(up_addr)),
        "in",
        "upstream",
    );
    bridge.settle_timeout = Duration::from_secs(2);
    bridge.max_backoff = Duration::from_millis(300);
    let edge = Broker::builder()
        .config(BrokerConfig {
            store: Some(dir.join("edge.redb")),
            ..Default::default()
        })
        .tcp(
            tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
            None,
        )
        .bridge(bridge)
        .start()
        .unwrap();
    let broker = edge.broker().clone();
    let stats = broker.bridges()[0].2.clone();
    let edge_addr = edge.tcp_addrs()[0];

    // A producer sends N to the edge, paced so the kill lands mid-run.
    let producer = tokio::spawn(async move {
        let spec = SendSpec {
            address: "out".into(),
            settled: false,
            window: 50,
            rate: Some(1000.0),
            link_name: "producer".into(),
        };
        client::send(&tcp(edge_addr), &spec, (0..N).map(|i| vec![i as u8; 64]))
            .await
            .unwrap()
    });
    while stats.forwarded.load(Ordering::Relaxed) < (N / 4) as u64 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    upstream.kill().await;
    let at_kill = stats.forwarded.load(Ordering::Relaxed);
    // While it is down, messages wait at the edge.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while stats.up.load(Ordering::Relaxed) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the bridge never saw the upstream go"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        depth(&broker, "out") > 0,
        "messages wait in the local queue"
    );
    let upstream = UpstreamBroker::start(&dir.join("up.redb"), up_addr);
    let sent = producer.await.unwrap();
    assert_eq!((sent.messages, sent.rejected), (N as u64, 0));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while depth(&broker, "out") > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the edge still holds {} after 30 s",
            depth(&broker, "out")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let seen = drain(&tcp(upstream.addr), "in").await;
    let twice = seen.values().filter(|n| **n > 1).count();
    eprintln!(
        "killed after {at_kill} forwarded; upstream holds {} distinct, {twice} twice; {} connects",
        seen.len(),
        stats.connects.load(Ordering::Relaxed)
    );
    assert_eq!(
        seen.len(),
        N,
        "every message the edge accepted reached the upstream"
    );
    assert!(
        stats.connects.load(Ordering::Relaxed) >= 2,
        "it reconnected"
    );
    assert!(broker
        .metrics()
        .contains("qgate_amqp_bridge_forwarded_total{queue=\"out\",upstream=\"upstream\"}"));
    drop(edge);
    let _ = std::fs::remove_dir_all(&dir);
}

/// An upstream whose queue is full turns messages away for now: the bridge puts them back in
/// the local queue and tries again later — none is dropped — and they all arrive once a
/// consumer makes room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_upstream_queue_defers_and_drops_nothing() {
    const N: usize = 300;
    let upstream = Broker::builder()
        .config(BrokerConfig {
            // No holding back below the limit: past 40 the upstream rejects
            // (resource-limit-exceeded), as Artemis and RabbitMQ do with a full queue.
            max_messages: 40,
            high_water: 1.0,
            ..Default::default()
        })
        .tcp(
            tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
            None,
        )
        .start()
        .unwrap();
    let up_addr = upstream.tcp_addrs()[0];
    let mut bridge = BridgeConfig::new(
        "out",
        url::Upstream::Connector(tcp(up_addr)),
        "in",
        "upstream",
    );
    bridge.settle_timeout = Duration::from_secs(2);
    bridge.max_backoff = Duration::from_millis(300);
    let edge = Broker::builder()
        .tcp(
            tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
            None,
        )
        .bridge(bridge)
        .start()
        .unwrap();
    let stats = edge.broker().bridges()[0].2.clone();
    let spec = SendSpec {
        address: "out".into(),
        settled: false,
        window: 50,
        rate: None,
        link_name: "producer".into(),
    };
    let sent = client::send(
        &tcp(edge.tcp_addrs()[0]),
        &spec,
        (0..N).map(|i| vec![i as u8; 32]),
    )
    .await
    .unwrap();
    assert_eq!(sent.messages, N as u64);
    // The upstream fills up and turns messages away.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while stats.deferred.load(Ordering::Relaxed) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the upstream never turned one away"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A consumer makes room; everything arrives, nothing was dropped.
    let mut seen: HashMap<String, usize> = HashMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while seen.len() < N && tokio::time::Instant::now() < deadline {
        for (k, v) in drain(&tcp(up_addr), "in").await {
            *seen.entry(k).or_insert(0) += v;
        }
    }
    eprintln!(
        "{} distinct arrived; {} deferrals; {} rejected; {} connects",
        seen.len(),
        stats.deferred.load(Ordering::Relaxed),
        stats.rejected.load(Ordering::Relaxed),
        stats.connects.load(Ordering::Relaxed)
    );
    assert_eq!(stats.rejected.load(Ordering::Relaxed), 0, "nothing dropped");
    assert_eq!(seen.len(), N, "every message arrived");
    assert_eq!(depth(edge.broker(), "out"), 0);
}
