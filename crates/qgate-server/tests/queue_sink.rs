//! The queue sink against our broker on loopback: a body is acknowledged only once the broker
//! accepted it, with the request id as message-id and device, stream and path as application
//! properties; a dead broker means 503 (never 201), and the sink reconnects when it returns; a
//! copy retried after the server restarted is answered from the durable table, not sent again.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fe2o3_amqp::types::messaging::{Body, MessageId};
use fe2o3_amqp::types::primitives::{SimpleValue, Value};
use qgate_amqp::broker::{Broker, BrokerConfig};
use qgate_amqp::builder::RunningBroker;
use qgate_amqp::client::Connector;
use qgate_amqp::transport::{self, Scheme, ALPN_AMQP};
use qgate_server::{DedupStore, IngestService, QueueSink, QueueSinkConfig, Upstream};
use qgate_transport::http3::Handler;
use qgate_transport::{endpoint, server_config, DevPki, Socket, TransportOptions};

/// A broker in its own runtime, so the test can kill it (every task and socket at once) the way
/// a crash would.
struct Killable {
    rt: Option<tokio::runtime::Runtime>,
    running: Option<RunningBroker>,
    tcp: SocketAddr,
    quic: SocketAddr,
}

impl Killable {
    /// A broker on `tcp` (plain AMQP) and `quic` (port 0: any), keeping queues in memory.
    fn start(pki: &DevPki, tcp: SocketAddr, quic: SocketAddr) -> Killable {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let running = {
            let _g = rt.enter();
            let s = tokio::net::TcpSocket::new_v4().unwrap();
            s.set_reuseaddr(true).unwrap();
            s.bind(tcp).unwrap();
            let listener = s.listen(64).unwrap();
            let opts = transport::broker_options(&TransportOptions::default());
            let scfg = server_config(&pki.server, &[ALPN_AMQP], &opts).unwrap();
            let ep = endpoint(Socket::bind_udp(quic).unwrap(), Some(scfg), None).unwrap();
            Broker::builder()
                .config(BrokerConfig::default())
                .tcp(listener, None)
                .quic(ep)
                .start()
                .unwrap()
        };
        Killable {
            tcp: running.tcp_addrs()[0],
            quic: running.quic_addrs()[0],
            rt: Some(rt),
            running: Some(running),
        }
    }

    /// Stop every task and close every socket, and wait until they are closed (so the
    /// addresses can be bound again).
    async fn kill(&mut self) {
        drop(self.running.take());
        if let Some(rt) = self.rt.take() {
            tokio::task::spawn_blocking(move || rt.shutdown_timeout(Duration::from_secs(5)))
                .await
                .unwrap();
        }
    }
}

impl Drop for Killable {
    fn drop(&mut self) {
        drop(self.running.take());
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// Wait until the sink's link is attached.
async fn up(sink: &QueueSink) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !sink.is_up() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sink never connected"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Open the durable table, waiting for a previous owner's writer to let go of the file.
async fn reopen(path: &std::path::Path) -> DedupStore {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match DedupStore::open(path, 1 << 16) {
            Ok((s, _)) => return s,
            Err(e) => {
                assert!(tokio::time::Instant::now() < deadline, "{e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

fn connector(scheme: Scheme, addr: SocketAddr, pki: &DevPki) -> Connector {
    let opts =
        qgate_amqp::client::with_idle_timeout(&TransportOptions::default(), Duration::from_secs(2));
    Connector::new(scheme, addr, "localhost", &pki.trust(), None, None, &opts).unwrap()
}

fn post(
    stream: &str,
    rid: Option<&str>,
    device: Option<&str>,
    path: Option<&str>,
) -> http::Request<()> {
    let mut b = http::Request::post(format!("https://localhost/ingest/{stream}"));
    for (k, v) in [
        ("qgate-request-id", rid),
        ("qgate-device", device),
        ("qgate-path", path),
    ] {
        if let Some(v) = v {
            b = b.header(k, v);
        }
    }
    b.body(()).unwrap()
}

/// What the consumer saw: message-id → (body, application properties).
type Seen = HashMap<String, (Vec<u8>, HashMap<String, SimpleValue>)>;

/// Take every message waiting on `queue` (until 2 s pass without one: the broker runs on its
/// own one-worker runtime, which a loaded machine can stall for a while).
async fn drain(c: &Connector, queue: &str) -> Seen {
    let (mut client, _) = c.open().await.unwrap();
    let mut rx = client
        .receiver("test-consumer", queue, false, 100)
        .await
        .unwrap();
    let mut seen = Seen::new();
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
            other => panic!("message-id {other:?}"),
        };
        let body = match d.body() {
            Body::Data(b) => b.iter().flat_map(|x| x.0.to_vec()).collect(),
            other => panic!("body {other:?}"),
        };
        let props = d
            .message()
            .application_properties
            .as_ref()
            .map(|p| p.0.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        rx.accept(&d).await.unwrap();
        assert!(
            seen.insert(id.clone(), (body, props)).is_none(),
            "{id} twice"
        );
    }
    let _ = rx.close().await;
    client.close().await;
    seen
}

async fn service(sink: QueueSink, dedup: &std::path::Path) -> Arc<IngestService> {
    up(&sink).await;
    let store = reopen(dedup).await;
    Arc::new(IngestService::new(Arc::new(sink)).with_dedup_store(store))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_only_once_the_broker_accepted() {
    let pki = DevPki::generate(&[]).unwrap();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut broker = Killable::start(&pki, any, any);
    let (tcp, quic) = (broker.tcp, broker.quic);
    let dedup = std::env::temp_dir().join(format!("qgate-qsink-{}.redb", std::process::id()));
    let _ = std::fs::remove_file(&dedup);
    let cfg = QueueSinkConfig {
        delivery_timeout: Duration::from_secs(2),
        max_backoff: Duration::from_millis(500),
        ..Default::default()
    };
    let sink = QueueSink::start(
        Upstream::Connector(connector(Scheme::Tcp, tcp, &pki)),
        "ingest",
        "test",
        cfg.clone(),
        1,
    );
    let svc = service(sink, &dedup).await;
    let peer: SocketAddr = "10.0.0.9:7000".parse().unwrap();

    // Forwarded by a gateway: its id, device and path travel with the body; a retried copy is
    // answered, not sent again.
    // As a gateway forwards a priority record.
    let priority = || {
        let mut r = post("temps", Some("gw-1"), Some("10.1.1.1:5000"), Some("1"));
        r.headers_mut()
            .insert("qgate-priority", http::HeaderValue::from_static("1"));
        r
    };
    let r = svc
        .handle(priority(), Bytes::from_static(b"21.5"), peer)
        .await;
    assert_eq!(r.status(), 201, "{:?}", r.body());
    let r = svc
        .handle(
            post("temps", Some("gw-1"), Some("10.1.1.1:5000"), Some("1")),
            Bytes::from_static(b"21.5"),
            peer,
        )
        .await;
    assert_eq!(r.status(), 201);
    assert!(String::from_utf8_lossy(r.body()).contains("\"duplicate\":true"));
    // Straight from a device: no id, its own address, no path.
    let r = svc
        .handle(
            post("hum", None, None, None),
            Bytes::from_static(b"40"),
            peer,
        )
        .await;
    assert_eq!(r.status(), 201);
    // Many at once are pipelined, each acknowledged once accepted.
    let many = (0..200).map(|i| {
        let svc = svc.clone();
        tokio::spawn(async move {
            svc.handle(
                post("bulk", Some(&format!("gw-b{i}")), Some("d"), Some("0")),
                Bytes::from(vec![i as u8; 100]),
                peer,
            )
            .await
            .status()
        })
    });
    for t in many {
        assert_eq!(t.await.unwrap(), 201);
    }

    let seen = drain(&connector(Scheme::Tcp, tcp, &pki), "ingest").await;
    let missing: Vec<_> = (0..200)
        .map(|i| format!("gw-b{i}"))
        .chain(["gw-1".to_string()])
        .filter(|k| !seen.contains_key(k))
        .collect();
    assert_eq!(
        seen.len(),
        202,
        "every acknowledged body once; missing {missing:?}"
    );
    let (body, props) = &seen["gw-1"];
    assert_eq!(body, b"21.5");
    assert_eq!(props["device"], SimpleValue::String("10.1.1.1:5000".into()));
    assert_eq!(props["stream"], SimpleValue::String("temps".into()));
    assert_eq!(props["path"], SimpleValue::Uint(1));
    assert_eq!(props["class"], SimpleValue::String("priority".into()));
    let (_, (body, props)) = seen
        .iter()
        .find(|(_, (_, p))| p["stream"] == SimpleValue::String("hum".into()))
        .unwrap();
    assert_eq!(body, b"40");
    assert_eq!(props["device"], SimpleValue::String(peer.to_string()));
    assert!(!props.contains_key("path") && !props.contains_key("class"));

    // Too large for the broker (4 MiB): refused on its own, the link stays up.
    let r = svc
        .handle(
            post("big", Some("gw-big"), None, None),
            Bytes::from(vec![0u8; 5 << 20]),
            peer,
        )
        .await;
    assert_eq!(r.status(), 413, "{:?}", r.body());
    let r = svc
        .handle(
            post("temps", Some("gw-after-big"), None, None),
            Bytes::from_static(b"1"),
            peer,
        )
        .await;
    assert_eq!(r.status(), 201, "{:?}", r.body());
    let _ = drain(&connector(Scheme::Tcp, tcp, &pki), "ingest").await;

    // The broker dies: requests fail with 503 (nothing acknowledged that was not accepted).
    broker.kill().await;
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        svc.handle(
            post("temps", Some("gw-2"), None, None),
            Bytes::from_static(b"x"),
            peer,
        ),
    )
    .await
    .expect("answered within the delivery timeout");
    assert_eq!(r.status(), 503, "{:?}", r.body());
    assert!(r.headers().contains_key("retry-after"));
    // It comes back on the same address: the sink reconnects by itself, and the retried
    // request is stored.
    let broker = Killable::start(&pki, tcp, quic);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let r = svc
            .handle(
                post("temps", Some("gw-2"), None, None),
                Bytes::from_static(b"x"),
                peer,
            )
            .await;
        if r.status() == 201 {
            break;
        }
        assert_eq!(r.status(), 503);
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sink never reconnected"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The server restarts (same durable table, now over QUIC): a copy of an id stored before is
    // answered as a duplicate and not sent; a new one is.
    drop(svc);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let sink = QueueSink::start(
        Upstream::Connector(connector(Scheme::Quic, broker.quic, &pki)),
        "ingest",
        "test",
        cfg,
        1000,
    );
    let svc = service(sink, &dedup).await;
    let r = svc
        .handle(
            post("temps", Some("gw-2"), None, None),
            Bytes::from_static(b"x"),
            peer,
        )
        .await;
    assert_eq!(r.status(), 201);
    assert!(
        String::from_utf8_lossy(r.body()).contains("\"duplicate\":true"),
        "{:?}",
        r.body()
    );
    let r = svc
        .handle(
            post("temps", Some("gw-3"), None, None),
            Bytes::from_static(b"y"),
            peer,
        )
        .await;
    assert_eq!(r.status(), 201, "{:?}", r.body());
    assert!(
        String::from_utf8_lossy(r.body()).contains("\"id\":1000"),
        "{:?}",
        r.body()
    );
    let seen = drain(&connector(Scheme::Quic, broker.quic, &pki), "ingest").await;
    let ids: Vec<_> = {
        let mut v: Vec<_> = seen.keys().cloned().collect();
        v.sort();
        v
    };
    assert_eq!(ids, ["gw-2", "gw-3"]);
    drop(svc);
    let _ = std::fs::remove_file(&dedup);
}

/// A "broker" that accepts TCP connections and never says a word: the sink never comes up,
/// and every request is answered 503 at once instead of waiting on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_broker_gets_503_at_once_not_a_hang() {
    let pki = DevPki::generate(&[]).unwrap();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut socks = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            socks.push(s);
        }
    });
    let cfg = QueueSinkConfig {
        delivery_timeout: Duration::from_millis(500),
        ..Default::default()
    };
    let sink = QueueSink::start(
        Upstream::Connector(connector(Scheme::Tcp, addr, &pki)),
        "ingest",
        "silent",
        cfg,
        1,
    );
    let stats = sink.stats();
    let svc = Arc::new(IngestService::new(Arc::new(sink)));
    let peer: SocketAddr = "10.0.0.9:7000".parse().unwrap();
    let t = tokio::time::Instant::now();
    for i in 0..50 {
        let r = svc
            .handle(
                post("x", Some(&format!("r{i}")), None, None),
                Bytes::from_static(b"v"),
                peer,
            )
            .await;
        assert_eq!(r.status(), 503);
        assert!(
            !String::from_utf8_lossy(r.body()).contains("127.0.0.1"),
            "no broker address for devices"
        );
    }
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    let health = http::Request::get("https://localhost/health")
        .body(())
        .unwrap();
    let r = svc.handle(health, Bytes::new(), peer).await;
    assert_eq!(r.status(), 503, "health says the sink is down");
    // It keeps trying (the connect attempts time out) without coming up.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(stats.connects.load(std::sync::atomic::Ordering::Relaxed), 0);
    held.abort();
}
