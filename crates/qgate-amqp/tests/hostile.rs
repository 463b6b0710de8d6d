//! Hostile and faulty peers (issue #18): raw TCP peers that stop half-way, send frames where no
//! session is, say nothing, or never read; the broker must free every connection within its
//! deadlines (decision M16).

use std::net::SocketAddr;
use std::time::Duration;

use fe2o3_amqp::types::performatives::Performative;
use qgate_amqp::broker::{Broker, BrokerConfig};
use qgate_amqp::builder::RunningBroker;
use qgate_amqp::wire;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[path = "common/raw.rs"]
mod raw;
use raw::*;

struct Running {
    broker: Broker,
    tcp: SocketAddr,
    tls: SocketAddr,
    _running: RunningBroker,
}

async fn start(cfg: BrokerConfig) -> Running {
    let pki = qgate_transport::DevPki::generate(&[]).unwrap();
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tls = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tcfg = qgate_amqp::transport::tls_server_config(&pki.server, None).unwrap();
    let running = Broker::builder()
        .config(cfg)
        .tcp(tcp, None)
        .tcp(tls, Some(tcfg))
        .start()
        .unwrap();
    Running {
        broker: running.broker().clone(),
        tcp: running.tcp_addrs()[0],
        tls: running.tcp_addrs()[1],
        _running: running,
    }
}

/// Wait until the broker holds `n` connections; false if it does not within `within`.
async fn held(b: &Broker, n: u64, within: Duration) -> bool {
    let until = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < until {
        if b.connections_open() == n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    b.connections_open() == n
}

/// Everything the broker sends until it closes the socket (or `within` passes).
async fn read_all(t: &mut TcpStream, within: Duration) -> Vec<u8> {
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(within, t.read_to_end(&mut buf)).await;
    buf
}

fn short(cfg: BrokerConfig) -> BrokerConfig {
    BrokerConfig {
        handshake_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(2),
        ..cfg
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_on_a_channel_without_a_session_frees_the_connection() {
    // Issue #18 item 7: begin on channel 5, then attach and transfer on channel 0, where no
    // session is. The shim used to hold the transfer for credit that never came and stop
    // there, so a closed socket never freed the connection.
    let r = start(short(BrokerConfig::default())).await;
    let mut bytes = opening(None);
    bytes.extend(frame(5, &begin(), &[]));
    bytes.extend(frame(0, &sender_attach("q"), &[]));
    bytes.extend(frame(0, &transfer(), &payload()));
    // One peer stays to read the answer: a close naming the channel.
    let mut t = TcpStream::connect(r.tcp).await.unwrap();
    t.write_all(&bytes).await.unwrap();
    let got = read_all(&mut t, Duration::from_secs(5)).await;
    let why = close_condition(&got).expect("a close");
    assert!(
        why.contains("NotFound") && why.contains("channel 0"),
        "{why}"
    );
    // Many close their socket at once.
    let mut peers = Vec::new();
    for _ in 0..100 {
        let mut t = TcpStream::connect(r.tcp).await.unwrap();
        t.write_all(&bytes).await.unwrap();
        peers.push(t);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(peers);
    assert!(
        held(&r.broker, 0, Duration::from_secs(3)).await,
        "{} connections still held",
        r.broker.connections_open()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_never_stops_sending_empty_frames_meets_the_handshake_deadline() {
    // Empty frames (AMQP 1.0 §2.3.2: 8 bytes, a heartbeat) are valid before open and lift only
    // the idle deadline. A peer that keeps the socket full of them must still be closed when
    // the handshake deadline passes: with the peer's bytes read first, it never was.
    let r = start(short(BrokerConfig::default())).await;
    let o = opening(None);
    let cut = o.len() - frame(0, &wire::open("hostile", 65_536), &[]).len();
    let t = TcpStream::connect(r.tcp).await.unwrap();
    let (mut rd, mut wr) = t.into_split();
    wr.write_all(&o[..cut]).await.unwrap();
    let empties = [0u8, 0, 0, 8, 2, 0, 0, 0].repeat(8_192);
    let flood = tokio::spawn(async move {
        let until = tokio::time::Instant::now() + Duration::from_secs(6);
        while tokio::time::Instant::now() < until {
            if wr.write_all(&empties).await.is_err() {
                return true;
            }
        }
        false
    });
    // The broker's header, then EOF once the deadline closes the connection.
    let mut got = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(4), rd.read_to_end(&mut got)).await;
    assert!(
        closed.is_ok(),
        "still open 4 s into a 1 s handshake deadline"
    );
    assert!(
        held(&r.broker, 0, Duration::from_secs(1)).await,
        "{} connections still held",
        r.broker.connections_open()
    );
    assert!(flood.await.unwrap(), "the flood's writes kept succeeding");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_peers_are_closed_by_the_handshake_deadline() {
    // Issue #18 item 8: peers that send nothing, only the SASL header, or stop before open,
    // on plain TCP and on TLS (whose handshake counts too). A 2 s deadline: all 60 must be
    // seen held before the first of them meets it, however slowly a loaded machine connects.
    let r = start(BrokerConfig {
        handshake_timeout: Duration::from_secs(2),
        ..short(BrokerConfig::default())
    })
    .await;
    let mut peers = Vec::new();
    for i in 0..60 {
        let addr = if i % 4 == 3 { r.tls } else { r.tcp };
        let mut t = TcpStream::connect(addr).await.unwrap();
        match i % 4 {
            1 => t.write_all(b"AMQP\x03\x01\x00\x00").await.unwrap(),
            2 => {
                let o = opening(None);
                // Everything up to (not including) the open frame.
                let cut = o.len() - frame(0, &wire::open("hostile", 65_536), &[]).len();
                t.write_all(&o[..cut]).await.unwrap()
            }
            _ => {}
        }
        peers.push(t);
    }
    assert!(held(&r.broker, 60, Duration::from_millis(1500)).await);
    assert!(
        held(&r.broker, 0, Duration::from_secs(4)).await,
        "{} connections still held after the 2 s handshake deadline",
        r.broker.connections_open()
    );
    // Each got EOF (after the broker's header or close, where one was due).
    for t in &mut peers {
        let mut buf = Vec::new();
        tokio::time::timeout(Duration::from_secs(1), t.read_to_end(&mut buf))
            .await
            .expect("EOF")
            .ok();
    }
    let m = r.broker.metrics();
    assert!(
        m.contains("qgate_amqp_connections_timed_out_total 60"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_time_out_is_announced_honoured_and_enforced() {
    // AMQP 1.0 §2.4.5: the broker announces half its idle timeout, sends empty frames as often
    // as the peer's open asks, and closes a peer that sends nothing for its idle timeout.
    let r = start(short(BrokerConfig::default())).await;
    let mut t = TcpStream::connect(r.tcp).await.unwrap();
    t.write_all(&opening(Some(200))).await.unwrap();
    let started = tokio::time::Instant::now();
    let got = read_all(&mut t, Duration::from_secs(5)).await;
    let took = started.elapsed();
    let fs = frames(&got);
    let announced = fs.iter().find_map(|(_, p)| match p {
        Some(Performative::Open(o)) => Some(o.idle_time_out),
        _ => None,
    });
    assert_eq!(announced, Some(Some(1000)), "half of the 2 s idle timeout");
    let empty = fs.iter().filter(|(_, p)| p.is_none()).count();
    assert!(empty >= 5, "{empty} empty frames in {took:?}");
    let why = close_condition(&got).expect("a close");
    assert!(
        why.contains("ResourceLimitExceeded") && why.contains("idle"),
        "{why}"
    );
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(4),
        "{took:?}"
    );
    assert!(held(&r.broker, 0, Duration::from_secs(2)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_holds_at_most_its_limit_of_connections() {
    // The default (long) handshake deadline: the held connections must not expire mid-test.
    let r = start(BrokerConfig {
        max_connections_per_address: 3,
        ..BrokerConfig::default()
    })
    .await;
    let mut peers = Vec::new();
    for _ in 0..3 {
        peers.push(TcpStream::connect(r.tcp).await.unwrap());
    }
    assert!(held(&r.broker, 3, Duration::from_millis(500)).await);
    // The fourth is closed at once, without a byte.
    let mut t = TcpStream::connect(r.tcp).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_millis(500), t.read_to_end(&mut buf))
        .await
        .expect("closed at once")
        .ok();
    assert!(buf.is_empty());
    assert_eq!(r.broker.connections_open(), 3);
    let m = r.broker.metrics();
    assert!(m.contains("qgate_amqp_connections_refused_total 1"), "{m}");
    assert!(
        m.contains("qgate_amqp_max_connections_per_address 3"),
        "{m}"
    );
    // A place frees when one goes.
    drop(peers.pop());
    assert!(held(&r.broker, 2, Duration::from_secs(1)).await);
    peers.push(TcpStream::connect(r.tcp).await.unwrap());
    assert!(held(&r.broker, 3, Duration::from_millis(500)).await);
}

/// Not a test: the load of decision M33's measurement. Holds `QGATE_IDLE_N` (default 2000) idle
/// AMQP connections (SASL ANONYMOUS, open, two sessions) to the broker at `QGATE_BROKER_TCP`,
/// from 127.0.0.1–127.0.0.20 in turn, for `QGATE_IDLE_HOLD` seconds (default 20), so that the
/// broker's RSS can be read meanwhile (see docs/experiments/M33.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement's load; needs a broker at QGATE_BROKER_TCP"]
async fn hold_idle_connections() {
    let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_string());
    let to: SocketAddr = env("QGATE_BROKER_TCP", "127.0.0.1:5672").parse().unwrap();
    let n: usize = env("QGATE_IDLE_N", "2000").parse().unwrap();
    let hold: u64 = env("QGATE_IDLE_HOLD", "20").parse().unwrap();
    let mut opening = opening(None);
    opening.extend(frame(0, &begin(), &[]));
    opening.extend(frame(1, &begin(), &[]));
    let mut held = Vec::with_capacity(n);
    for i in 0..n {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind(format!("127.0.0.{}:0", 1 + i % 20).parse().unwrap())
            .unwrap();
        let mut t = s.connect(to).await.unwrap();
        t.write_all(&opening).await.unwrap();
        held.push(t);
    }
    // Every connection's answer (SASL outcome, open, two begins) read, so each is opened.
    let mut opened = 0;
    for t in &mut held {
        let mut buf = [0u8; 4096];
        if tokio::time::timeout(Duration::from_secs(5), t.read(&mut buf))
            .await
            .is_ok_and(|r| r.is_ok_and(|n| n > 0))
        {
            opened += 1;
        }
    }
    println!("holding {n} connections ({opened} answered) for {hold} s");
    tokio::time::sleep(Duration::from_secs(hold)).await;
}
