//! A returning device in 0-RTT (issue 15 item 5, decision G18), over netsim in virtual time: its
//! first record rides in the first flight with its class instead of a Hash ID, under its own
//! request id; a copy of that flight on another connection is stored once; an early request
//! with no id is told to wait (425).

mod common;

use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use qgate_gateway::device::Device;
use qgate_gateway::gateway::PRIORITY_HEADER;
use qgate_netsim::SimSocket;
use qgate_transport::http3::H3Client;
use qgate_transport::{connect, endpoint, Connected, Socket};
use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};

/// A new connection from device 0 to the gateway, resuming (0-RTT) if it holds a ticket.
async fn reconnect(w: &common::World) -> (Connected, Arc<H3Client>) {
    let gw: SocketAddr = "10.8.0.1:443".parse().unwrap();
    let c = connect(&w.device_eps[0], &w.device_cfg, gw, "localhost", true)
        .await
        .unwrap();
    let h3 = Arc::new(H3Client::new(c.connection().clone()).await.unwrap());
    (c, h3)
}

#[tokio::test(start_paused = true)]
async fn a_returning_device_rides_in_0rtt_and_a_copy_of_its_flight_is_stored_once() {
    let w = common::world(1, "completion").await;
    // The world's device connected once with a full handshake: it holds a ticket by now.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let record = Bytes::from(vec![7u8; 1024]);

    let (c, h3) = reconnect(&w).await;
    assert!(c.is_0rtt(), "the device resumes with 0-RTT");
    let dev = Device::first_use(h3, true, [5; 32]);
    let id = dev.next_request_id().unwrap();
    let sent = dev
        .send_as("/ingest/data", record.clone(), Some(&id))
        .await
        .unwrap();
    assert!(sent.path.is_some());
    let hash = dev
        .hash_id()
        .expect("the answer names the session")
        .to_string();
    let g = w.gateway.stats.snapshot();
    assert_eq!((g.early, g.registered, g.forwarded), (1, 1, 1), "{g:?}");
    assert_eq!(w.server.snapshot().ingested, 1);
    // The connection is established now: the next record goes as any other, under the Hash
    // ID the first answer gave.
    dev.send("/ingest/data", record.clone()).await.unwrap();
    assert_eq!(dev.hash_id(), Some(hash));
    assert_eq!(w.gateway.stats.snapshot().early, 1);
    assert_eq!(w.server.snapshot().ingested, 2);

    // The same first flight again, on another connection (an attacker's replay, or the device
    // sending again after a lost answer): answered, and not stored twice.
    let (c2, h3) = reconnect(&w).await;
    assert!(c2.is_0rtt());
    let copy = Device::first_use(h3, true, [5; 32]);
    copy.send_as("/ingest/data", record.clone(), Some(&id))
        .await
        .unwrap();
    let s = w.server.snapshot();
    assert_eq!((s.ingested, s.duplicates), (2, 1), "{s:?}");
    assert_eq!(w.gateway.stats.snapshot().early, 2);

    // An early request that names no id could not be told from its copies: 425 Too Early.
    let (c3, h3) = reconnect(&w).await;
    assert!(c3.is_0rtt());
    // A record with its class and no request id.
    let anonymous = || async {
        h3.request(
            http::Request::post("https://gw/ingest/data")
                .header(PRIORITY_HEADER, "1")
                .body(())
                .unwrap(),
            record.clone(),
            4096,
        )
        .await
        .unwrap()
    };
    let r = anonymous().await;
    assert_eq!(
        r.status.as_u16(),
        425,
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(w.gateway.stats.snapshot().too_early, 1);
    // Sent again once the handshake is done, it goes through.
    if let Connected::ZeroRtt { accepted, .. } = c3 {
        assert!(accepted.await, "the gateway accepted the early data");
    }
    let r = anonymous().await;
    assert_eq!(r.status.as_u16(), 201);
    assert_eq!(w.server.snapshot().ingested, 3);

    // What it saves, in virtual time over the 2 ms access round trip: a handshake, a
    // registration and a record, against a record in the first flight.
    let t = tokio::time::Instant::now();
    let gw: SocketAddr = "10.8.0.1:443".parse().unwrap();
    let full = connect(&w.device_eps[0], &w.device_cfg, gw, "localhost", false)
        .await
        .unwrap();
    let h3 = H3Client::new(full.connection().clone()).await.unwrap();
    let d = Device::register(h3, true).await.unwrap();
    d.send("/ingest/data", Bytes::from(vec![1u8; 1024]))
        .await
        .unwrap();
    let one_rtt = t.elapsed();
    let t = tokio::time::Instant::now();
    let (c4, h3) = reconnect(&w).await;
    assert!(c4.is_0rtt());
    Device::first_use(h3, true, [6; 32])
        .send("/ingest/data", Bytes::from(vec![1u8; 1024]))
        .await
        .unwrap();
    let zero_rtt = t.elapsed();
    assert!(
        zero_rtt + Duration::from_millis(4) <= one_rtt,
        "0-RTT {zero_rtt:?} vs handshake + registration {one_rtt:?}"
    );
    eprintln!("first record: 0-RTT {zero_rtt:?}, handshake + registration {one_rtt:?}");
    let m = common::metrics(&w).await;
    // One session for each returning connection's records, however many records.
    assert_eq!(w.gateway.stats.snapshot().registered, 5);
    assert!(m.contains("qgate_gateway_early_requests_total 4"), "{m}");
    assert!(m.contains("qgate_gateway_too_early_total 1"), "{m}");
    drop((c, c2));
}

/// A device's socket that keeps a copy of every datagram it sends, with the time sent: what an
/// attacker on the path sees.
#[derive(Debug)]
struct Tap {
    inner: Arc<SimSocket>,
    sent: Mutex<Vec<(tokio::time::Instant, Vec<u8>, SocketAddr)>>,
}

impl AsyncUdpSocket for Tap {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, t: &Transmit) -> io::Result<()> {
        let seg = t.segment_size.unwrap_or(t.contents.len()).max(1);
        let now = tokio::time::Instant::now();
        let mut sent = self.sent.lock().unwrap();
        for d in t.contents.chunks(seg) {
            sent.push((now, d.to_vec(), t.destination));
        }
        drop(sent);
        self.inner.try_send(t)
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// An attacker captures a returning device's first flight (its ClientHello with the ticket,
/// and the record in 0-RTT) and sends it again from another port once the device has gone: the
/// ticket was taken when the device used it, so the copy gets a full handshake it cannot finish
/// and its early data is dropped; nothing reaches the server twice (decision G18).
#[tokio::test(start_paused = true)]
async fn a_replayed_first_flight_is_not_forwarded() {
    let w = common::world(1, "completion").await;
    let gw: SocketAddr = "10.8.0.1:443".parse().unwrap();
    let host = w.device_hosts[0];
    let tap = Arc::new(Tap {
        inner: w.net.bind(host, "10.8.0.2:0".parse().unwrap()).unwrap(),
        sent: Mutex::new(Vec::new()),
    });
    let ep = endpoint(Socket::Abstract(tap.clone()), None, Some(500)).unwrap();
    let record = Bytes::from(vec![3u8; 1024]);
    // First contact (a full handshake) leaves a ticket with the device.
    let first = connect(&ep, &w.device_cfg, gw, "localhost", true)
        .await
        .unwrap();
    let h3 = Arc::new(H3Client::new(first.connection().clone()).await.unwrap());
    Device::first_use(h3.clone(), false, [1; 32])
        .send("/ingest/data", record.clone())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    first.connection().close(0u32.into(), b"bye");
    drop(h3);
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Returning: the record rides in the first flight.
    tap.sent.lock().unwrap().clear();
    let back = connect(&ep, &w.device_cfg, gw, "localhost", true)
        .await
        .unwrap();
    assert!(back.is_0rtt());
    let h3 = Arc::new(H3Client::new(back.connection().clone()).await.unwrap());
    Device::first_use(h3.clone(), false, [2; 32])
        .send("/ingest/data", record)
        .await
        .unwrap();
    let stored = w.server.snapshot().ingested;
    let early = w.gateway.stats.snapshot().early;
    assert_eq!((stored, early), (2, 1));
    back.connection().close(0u32.into(), b"bye");
    drop(h3);
    tokio::time::sleep(Duration::from_secs(2)).await; // the gateway forgets the connection

    // The copy: every datagram of the first flight (sent at the instant the device began).
    let flight: Vec<(Vec<u8>, SocketAddr)> = {
        let sent = tap.sent.lock().unwrap();
        let t0 = sent[0].0;
        sent.iter()
            .filter(|(t, _, _)| *t == t0)
            .map(|(_, d, to)| (d.clone(), *to))
            .collect()
    };
    assert!(
        flight.len() >= 2,
        "ClientHello and 0-RTT: {} datagrams",
        flight.len()
    );
    let attacker = w.net.bind(host, "10.8.0.2:0".parse().unwrap()).unwrap();
    for (d, to) in &flight {
        attacker.send_to(d, *to).unwrap();
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    // It reached the gateway and started a handshake ...
    let m = common::metrics(&w).await;
    assert!(m.contains("qgate_gateway_handshakes 1"), "{m}");
    // ... but nothing of it was taken early or stored.
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(w.gateway.stats.snapshot().early, early);
    assert_eq!(w.server.snapshot().ingested, stored);
    // The handshake deadline closed it, and its state is freed once it has drained.
    let m = common::metrics(&w).await;
    assert!(
        m.contains("qgate_gateway_handshake_timeouts_total 1"),
        "{m}"
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    let m = common::metrics(&w).await;
    assert!(m.contains("qgate_gateway_handshakes 0"), "{m}");
}
