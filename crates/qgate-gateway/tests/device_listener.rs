//! The gateway's device listener on real loopback UDP: a flood of QUIC Initials, and sessions
//! bound to their connection rather than the address (issue 18 items 3 and 6, decisions G10 and
//! G12). Before, the flood filled every connection slot with half-open handshakes (the device
//! was refused), and a session belonged to an address: another connection from the same
//! address and port could use it, and closing one connection ended the other's sessions.

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Loopback;
use qgate_gateway::gateway::GatewayConfig;
use qgate_transport::http3::{H3Client, ALPN_H3};
use qgate_transport::{client_config, connect, endpoint, Socket, TransportOptions, TrustRoots};

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

async fn register(h3: &H3Client) -> String {
    common::register(h3, 1).await
}

async fn send(h3: &H3Client, hash: &str) -> u16 {
    common::send(h3, hash).await.0.as_u16()
}

/// Server on 127.0.0.1, one backhaul path from 127.0.0.2, the gateway's devices on 127.0.0.1.
async fn loopback(cfg: GatewayConfig) -> Loopback {
    common::loopback(cfg, &["127.0.0.2:0"], "single").await
}

/// `n` distinct client Initial datagrams for `to`, made by a quinn-proto client (real ones:
/// the gateway must decrypt them to tell them from a device's).
fn initials(to: SocketAddr, trust: &TrustRoots, n: usize) -> Vec<Vec<u8>> {
    let ccfg = client_config(trust, &[ALPN_H3], &TransportOptions::default()).unwrap();
    let mut ep = quinn_proto::Endpoint::new(Arc::default(), None, true, None);
    let now = Instant::now();
    (0..n)
        .map(|_| {
            let (_, mut conn) = ep.connect(now, ccfg.clone(), to, "localhost").unwrap();
            let mut buf = Vec::new();
            let tx = conn.poll_transmit(now, 1, &mut buf).expect("an Initial");
            buf.truncate(tx.size);
            buf
        })
        .collect()
}

/// Send `total` of `packets` (round robin) to `to` at 10 000 per second from 64 ports, on a
/// thread of its own, until sent or `stop`; the count sent and the time it took.
fn flood(
    to: SocketAddr,
    packets: Vec<Vec<u8>>,
    total: usize,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(usize, Duration)> {
    std::thread::spawn(move || {
        let socks: Vec<UdpSocket> = (0..64)
            .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
            .collect();
        let start = Instant::now();
        let mut sent = 0usize;
        while sent < total && !stop.load(Ordering::Relaxed) {
            // 100 every 10 ms.
            for _ in 0..100.min(total - sent) {
                let _ = socks[sent % socks.len()].send_to(&packets[sent % packets.len()], to);
                sent += 1;
            }
            let due = start + Duration::from_millis(sent as u64 / 10);
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
        }
        (sent, start.elapsed())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_registers_within_a_second_during_an_initial_flood() {
    let cfg = GatewayConfig {
        max_devices: 100,
        ..Default::default()
    };
    let max_handshakes = cfg.max_handshakes;
    let lb = loopback(cfg).await;
    // 10 000 Initials/s from 64 source ports, for as long as the device needs.
    let packets = initials(lb.addr, &lb.trust, 4000);
    let stop = Arc::new(AtomicBool::new(false));
    let flooding = flood(lb.addr, packets, 200_000, stop.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Three devices, one after another, each connecting and registering from scratch.
    let trust = lb.trust.clone();
    let devices = async move {
        let ccfg = client_config(&trust, &[ALPN_H3], &TransportOptions::default()).unwrap();
        let mut took = Vec::new();
        let mut keep = Vec::new();
        for _ in 0..3 {
            let t = Instant::now();
            let ep = endpoint(Socket::bind_udp(sa("127.0.0.1:0")).unwrap(), None, None).unwrap();
            let conn = connect(&ep, &ccfg, lb.addr, "localhost", false)
                .await
                .unwrap();
            let h3 = H3Client::new(conn.connection().clone()).await.unwrap();
            let hash = register(&h3).await;
            took.push(t.elapsed());
            assert_eq!(send(&h3, &hash).await, 201);
            keep.push((ep, h3));
        }
        (took, keep)
    };
    let (took, _keep) = tokio::time::timeout(Duration::from_secs(30), devices)
        .await
        .expect("the devices got through within 30 s");
    stop.store(true, Ordering::Relaxed);
    let (sent, flood_time) = flooding.join().unwrap();
    let rate = sent as f64 / flood_time.as_secs_f64();
    let m = lb.gw.metrics();
    let value = |name: &str| -> f64 {
        m.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in:\n{m}"))
    };
    eprintln!(
        "flood {rate:.0} Initials/s ({sent}); devices registered in {took:?}; retries {}, handshakes {}",
        value("qgate_gateway_retries_sent_total"),
        value("qgate_gateway_handshakes ")
    );
    assert!(rate > 8000.0, "the flood ran at only {rate:.0}/s");
    // Within 1 s (the bound). One lost Initial costs the client a 1 s retransmission
    // timeout, which a 2-core machine busy with other tests can cause by itself (the kernel
    // drops datagrams while the flood outruns a starved driver); the median of three is what
    // must hold, and none may take more than two such timeouts.
    let mut sorted = took.clone();
    sorted.sort();
    assert!(
        sorted[1] < Duration::from_secs(1),
        "registering took {took:?}"
    );
    assert!(
        sorted[2] < Duration::from_secs(3),
        "registering took {took:?}"
    );
    assert!(value("qgate_gateway_retries_sent_total") > 1000.0);
    assert!(value("qgate_gateway_handshakes ") <= max_handshakes as f64);
    assert_eq!(lb.stats.snapshot().ingested, 3);
}

/// From one socket on 127.0.0.1, `rate` new connections a second to `to`: each answers the
/// gateway's Retry with its token, as a real client would, and then says nothing more (only
/// Retry packets are read). Until `stop`; the Initials sent and the Retries answered.
fn retry_flood(
    to: SocketAddr,
    trust: TrustRoots,
    rate: f64,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(usize, usize)> {
    std::thread::spawn(move || {
        let ccfg = client_config(&trust, &[ALPN_H3], &TransportOptions::default()).unwrap();
        let mut ep = quinn_proto::Endpoint::new(Arc::default(), None, true, None);
        let mut conns = std::collections::HashMap::new();
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_nonblocking(true).unwrap();
        let start = Instant::now();
        let (mut sent, mut answered) = (0usize, 0usize);
        let mut buf = Vec::new();
        let mut rbuf = vec![0u8; 65_536];
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            let due = (start.elapsed().as_secs_f64() * rate) as usize;
            while sent < due {
                let (h, mut conn) = ep.connect(now, ccfg.clone(), to, "localhost").unwrap();
                buf.clear();
                if let Some(tx) = conn.poll_transmit(now, 1, &mut buf) {
                    let _ = sock.send_to(&buf[..tx.size], to);
                }
                conns.insert(h, conn);
                sent += 1;
            }
            while let Ok((len, from)) = sock.recv_from(&mut rbuf) {
                // A QUIC v1 Retry: long header, packet type 3.
                if len == 0 || rbuf[0] & 0xf0 != 0xf0 {
                    continue;
                }
                let mut resp = Vec::new();
                let data = bytes::BytesMut::from(&rbuf[..len]);
                if let Some(quinn_proto::DatagramEvent::ConnectionEvent(h, ev)) =
                    ep.handle(now, from, None, None, data, &mut resp)
                {
                    // The Initial again, with the token; then never a word more.
                    if let Some(mut conn) = conns.remove(&h) {
                        conn.handle_event(ev);
                        buf.clear();
                        if let Some(tx) = conn.poll_transmit(now, 1, &mut buf) {
                            let _ = sock.send_to(&buf[..tx.size], to);
                            answered += 1;
                        }
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        (sent, answered)
    })
}

/// Issue 49 item 6a (decision G26): a client on 127.0.0.1 opening 1 000 connections a second,
/// each answering its Retry and then silent, holds its share of the handshake budget (32), not
/// the whole budget (256), so devices on other addresses still register within a second.
/// Before, the flood kept every handshake slot taken (each for the 10 s handshake timeout) and
/// the devices' Initials were ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_passing_flood_from_one_address_leaves_room_for_others() {
    let cfg = GatewayConfig::default();
    let share = cfg.max_handshakes_per_address;
    let lb = loopback(cfg).await;
    let stop = Arc::new(AtomicBool::new(false));
    let flooding = retry_flood(lb.addr, lb.trust.clone(), 1000.0, stop.clone());
    // Long enough to fill the whole budget at that rate without the share.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let trust = lb.trust.clone();
    let addr = lb.addr;
    let devices = async move {
        let ccfg = client_config(&trust, &[ALPN_H3], &TransportOptions::default()).unwrap();
        let mut took = Vec::new();
        let mut keep = Vec::new();
        for i in 0..3 {
            let t = Instant::now();
            let from = sa(&format!("127.0.0.{}:0", 2 + i));
            let ep = endpoint(Socket::bind_udp(from).unwrap(), None, None).unwrap();
            let conn = connect(&ep, &ccfg, addr, "localhost", false).await.unwrap();
            let h3 = H3Client::new(conn.connection().clone()).await.unwrap();
            let _hash = register(&h3).await;
            took.push(t.elapsed());
            keep.push((ep, h3));
        }
        (took, keep)
    };
    let (took, _keep) = tokio::time::timeout(Duration::from_secs(30), devices)
        .await
        .expect("the devices got through within 30 s");
    let m = lb.gw.metrics();
    stop.store(true, Ordering::Relaxed);
    let (sent, answered) = flooding.join().unwrap();
    let value = |name: &str| -> f64 {
        m.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in:\n{m}"))
    };
    eprintln!(
        "flood: {sent} Initials, {answered} Retries answered; devices registered in {took:?}; \
         handshakes {}, ignored by the share {}",
        value("qgate_gateway_handshakes "),
        value("qgate_gateway_handshakes_ignored_share_total"),
    );
    assert!(sent > 1500, "the flood sent only {sent} Initials");
    assert!(answered > 0, "the flood answered no Retry");
    assert!(value("qgate_gateway_handshakes_ignored_share_total") > 0.0);
    assert!(value("qgate_gateway_handshakes ") <= (share + 3) as f64);
    // The median of three within 1 s; a lost Initial costs a 1 s retransmission timeout, which
    // a loaded 2-core machine can cause by itself (see the Initial-flood test above).
    let mut sorted = took.clone();
    sorted.sort();
    assert!(
        sorted[1] < Duration::from_secs(1),
        "registering took {took:?}"
    );
    assert!(
        sorted[2] < Duration::from_secs(3),
        "registering took {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_that_migrates_keeps_its_session() {
    let lb = loopback(GatewayConfig::default()).await;
    let ccfg = client_config(&lb.trust, &[ALPN_H3], &TransportOptions::default()).unwrap();
    let run = async {
        let ep = endpoint(Socket::bind_udp(sa("127.0.0.1:0")).unwrap(), None, None).unwrap();
        let conn = connect(&ep, &ccfg, lb.addr, "localhost", false)
            .await
            .unwrap();
        let h3 = H3Client::new(conn.connection().clone()).await.unwrap();
        let hash = register(&h3).await;
        assert_eq!(send(&h3, &hash).await, 201);
        let before = ep.local_addr().unwrap();
        // The device moves to another address (a new port: its NAT binding or network changed).
        ep.rebind(UdpSocket::bind("127.0.0.1:0").unwrap()).unwrap();
        assert_ne!(ep.local_addr().unwrap(), before);
        for _ in 0..5 {
            assert_eq!(
                send(&h3, &hash).await,
                201,
                "the session survived migration"
            );
        }
        // Registering again counts against the same connection, not the new address.
        let _second = register(&h3).await;
    };
    tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("migration run timed out");
    assert_eq!(lb.stats.snapshot().ingested, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_belong_to_their_connection_not_their_address() {
    let lb = loopback(GatewayConfig::default()).await;
    let ccfg = client_config(&lb.trust, &[ALPN_H3], &TransportOptions::default()).unwrap();
    let run = async {
        // Two connections from one socket: the same address and port.
        let ep = endpoint(Socket::bind_udp(sa("127.0.0.1:0")).unwrap(), None, None).unwrap();
        let mut h3 = Vec::new();
        for _ in 0..2 {
            let c = connect(&ep, &ccfg, lb.addr, "localhost", false)
                .await
                .unwrap();
            h3.push(H3Client::new(c.connection().clone()).await.unwrap());
        }
        let a = register(&h3[0]).await;
        let b = register(&h3[1]).await;
        assert_eq!(send(&h3[1], &a).await, 403, "another connection's Hash ID");
        assert_eq!(send(&h3[1], &b).await, 201);
        // The first connection closes: only its session ends.
        h3[0].close();
        while !lb.gw.metrics().contains("qgate_gateway_sessions 1\n") {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(send(&h3[1], &b).await, 201);
    };
    tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("run timed out");
    assert_eq!(lb.stats.snapshot().ingested, 2);
}

/// Resident memory of this process, bytes (Linux).
fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// Memory stays flat under made-up Hash IDs and under a flood of Initials (issue 18 items 2
/// and 3: 500 000 random Hash IDs raised a gateway's RSS from 27 to 56 MB; 11 300 Initials
/// took it to 350 MB). A measurement, not part of the suite:
/// `cargo test --release -p qgate-gateway --test device_listener -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn memory_stays_flat_under_made_up_hash_ids_and_initial_floods() {
    let lb = loopback(GatewayConfig::default()).await;
    let ccfg = client_config(&lb.trust, &[ALPN_H3], &TransportOptions::default()).unwrap();
    let ep = endpoint(Socket::bind_udp(sa("127.0.0.1:0")).unwrap(), None, None).unwrap();
    let conn = connect(&ep, &ccfg, lb.addr, "localhost", false)
        .await
        .unwrap();
    let h3 = Arc::new(H3Client::new(conn.connection().clone()).await.unwrap());
    let fake = |i: u64| {
        format!(
            "{:032x}",
            u128::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c)
        )
    };
    // Warm up (allocator pools, QPACK tables), then measure.
    for i in 0..5_000 {
        assert_eq!(send(&h3, &fake(i)).await, 401);
    }
    let before = rss();
    let total = 500_000u64;
    let tasks: Vec<_> = (0..8u64)
        .map(|w| {
            let h3 = h3.clone();
            tokio::spawn(async move {
                let mut i = w;
                while i < total {
                    assert_eq!(send(&h3, &fake(1_000_000 + i)).await, 401);
                    i += 8;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let after = rss();
    eprintln!(
        "{total} requests with made-up Hash IDs: RSS {:.1} → {:.1} MiB",
        before as f64 / 1048576.0,
        after as f64 / 1048576.0
    );
    assert!(after < before + 8 * 1048576, "memory grew");

    // 20 000 distinct Initials from 64 ports in 2 s.
    let packets = initials(lb.addr, &lb.trust, 20_000);
    let before = rss();
    flood(lb.addr, packets, 20_000, Arc::default())
        .join()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss();
    let m = lb.gw.metrics();
    eprintln!(
        "20 000 Initials: RSS {:.1} → {:.1} MiB; {}",
        before as f64 / 1048576.0,
        after as f64 / 1048576.0,
        m.lines()
            .filter(|l| l.starts_with("qgate_gateway_retries_sent_total")
                || l.starts_with("qgate_gateway_handshakes "))
            .collect::<Vec<_>>()
            .join(", ")
    );
    assert!(after < before + 32 * 1048576, "memory grew");
}
