//! A returning device in 0-RTT (issue 15 item 5, decision G18), over netsim in virtual time: its
//! first record rides in the first flight with its class instead of a Hash ID, under its own
//! request id; a copy of that flight on another connection is stored once; an early request
//! with no id is told to wait (425).

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use qgate_gateway::device::Device;
use qgate_gateway::gateway::PRIORITY_HEADER;
use qgate_transport::http3::H3Client;
use qgate_transport::{connect, Connected};

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
    let dev = Device::first_use(h3, true, 0x5eed);
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
    assert_eq!(dev.hash_id(), Some(hash.as_str()));
    assert_eq!(w.gateway.stats.snapshot().early, 1);
    assert_eq!(w.server.snapshot().ingested, 2);

    // The same first flight again, on another connection (an attacker's replay, or the device
    // sending again after a lost answer): answered, and not stored twice.
    let (c2, h3) = reconnect(&w).await;
    assert!(c2.is_0rtt());
    let copy = Device::first_use(h3, true, 0x5eed);
    copy.send_as("/ingest/data", record.clone(), Some(&id))
        .await
        .unwrap();
    let s = w.server.snapshot();
    assert_eq!((s.ingested, s.duplicates), (2, 1), "{s:?}");
    assert_eq!(w.gateway.stats.snapshot().early, 2);

    // An early request that names no id could not be told from its copies: 425 Too Early.
    let (c3, h3) = reconnect(&w).await;
    assert!(c3.is_0rtt());
    let r = h3
        .request(
            http::Request::post("https://gw/ingest/data")
                .header(PRIORITY_HEADER, "1")
                .body(())
                .unwrap(),
            record.clone(),
            4096,
        )
        .await
        .unwrap();
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
    let r = h3
        .request(
            http::Request::post("https://gw/ingest/data")
                .header(PRIORITY_HEADER, "1")
                .body(())
                .unwrap(),
            record,
            4096,
        )
        .await
        .unwrap();
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
    Device::first_use(h3, true, 0xfeed)
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
    assert!(m.contains("qgate_gateway_early_requests_total 4"), "{m}");
    assert!(m.contains("qgate_gateway_too_early_total 1"), "{m}");
    drop((c, c2));
}
