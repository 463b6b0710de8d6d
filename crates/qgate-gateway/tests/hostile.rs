//! The gateway against hostile and faulty device peers and backhaul faults (issue 18), over
//! netsim in virtual time. Each test failed on the gateway before decisions G10–G12.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::{
    assert_metrics, metrics, register, send, send_to, try_register, world, world_with,
    world_with_lanes, Far, Slow,
};
use qgate_forward::path::PathId;
use qgate_gateway::gateway::GatewayConfig;

#[tokio::test(start_paused = true)]
async fn one_connection_cannot_take_every_device_slot() {
    let cfg = GatewayConfig {
        max_devices: 20,
        ..Default::default()
    };
    let per_conn = cfg.max_sessions_per_connection;
    let w = world_with(3, "adaptive", cfg, Far::Counting).await;
    // One connection asks for every slot.
    let mut created = 0;
    for _ in 0..20 {
        let (status, _) = try_register(&w.devices[0], 0).await;
        match status.as_u16() {
            201 => created += 1,
            429 => {}
            s => panic!("unexpected status {s}"),
        }
    }
    assert_eq!(created, per_conn, "one connection holds at most its share");
    // Real devices still register and send.
    for d in &w.devices[1..] {
        let h = register(d, 1).await;
        assert_eq!(send(d, &h).await.0, 201);
    }
    let m = metrics(&w).await;
    assert_metrics(
        &m,
        &[
            &format!("qgate_gateway_sessions {}", per_conn + 2),
            &format!(
                "qgate_gateway_registrations_refused_total {}",
                20 - per_conn
            ),
            "qgate_gateway_session_connections 3",
            &format!("qgate_gateway_limit_max_sessions_per_connection {per_conn}"),
        ],
    );
}

#[tokio::test(start_paused = true)]
async fn idle_sessions_expire_and_release_their_path() {
    let cfg = GatewayConfig {
        request_timeout: Duration::from_millis(500),
        session_idle_timeout: Duration::from_secs(2),
        ..Default::default()
    };
    let w = world_with(2, "adaptive", cfg, Far::Counting).await;
    let idle = register(&w.devices[0], 1).await;
    let busy = register(&w.devices[1], 1).await;
    assert_eq!(send(&w.devices[0], &idle).await.0, 201);
    // Device 1 keeps sending every 500 ms; device 0 says nothing for 5 s.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(send(&w.devices[1], &busy).await.0, 201);
    }
    assert_eq!(
        send(&w.devices[0], &idle).await.0,
        401,
        "an expired session is unknown"
    );
    let m = metrics(&w).await;
    assert_metrics(
        &m,
        &[
            "qgate_gateway_sessions 1",
            "qgate_gateway_sessions_expired_total 1",
        ],
    );
    let hits: u32 = w
        .gateway
        .paths()
        .table()
        .paths()
        .iter()
        .map(|p| p.hits)
        .sum();
    assert_eq!(hits, 1, "the expired session's path hit was released");
    // The device registers again and carries on.
    let again = register(&w.devices[0], 1).await;
    assert_eq!(send(&w.devices[0], &again).await.0, 201);
}

#[tokio::test(start_paused = true)]
async fn made_up_hash_ids_leave_no_state() {
    let w = world(2, "adaptive").await;
    let h = register(&w.devices[0], 0).await;
    for i in 0..2000u32 {
        let fake = format!("{:032x}", u128::from(i) * 0x9e37_79b9_7f4a_7c15);
        assert_eq!(send(&w.devices[1], &fake).await.0, 401);
    }
    assert_eq!(send(&w.devices[0], &h).await.0, 201);
    let m = metrics(&w).await;
    assert_metrics(
        &m,
        &[
            "qgate_gateway_sessions 1",
            "qgate_gateway_session_connections 1",
            "qgate_gateway_session_addresses 1",
            "qgate_gateway_refused_total 2000",
        ],
    );
    assert_eq!(w.server.snapshot().ingested, 1);
}

/// Decision G21: one of a path's two backhaul connections closes under a request. The
/// request is retried, the path stays up on the other connection, and the other devices'
/// requests go on there; the closed one is replaced with the path's probes.
#[tokio::test(start_paused = true)]
async fn a_backhaul_connection_closing_among_several_keeps_its_path() {
    let slow = Arc::new(Slow::default());
    let cfg = GatewayConfig {
        request_timeout: Duration::from_millis(500),
        ..Default::default()
    };
    let w = world_with_lanes(2, "single", cfg, Far::Slow(slow.clone()), 2).await;
    let (a, b) = (
        register(&w.devices[0], 0).await,
        register(&w.devices[1], 0).await,
    );
    let paths = w.gateway.paths();
    let p0 = PathId(0);
    assert_eq!(paths.live_connections(p0), 2);
    // Device 0's request is held at the server on the first connection (none out: lane 0).
    let d0 = w.devices[0].clone();
    let stuck = tokio::spawn(async move { send_to(&d0, &a, "/ingest/slow").await.0 });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let first = paths.live(p0).next().unwrap();
    first.close(0u32.into(), b"test");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        paths.table().get(p0).unwrap().up,
        "the path is up on its other connection"
    );
    for _ in 0..10 {
        assert_eq!(
            send(&w.devices[1], &b).await,
            (http::StatusCode::CREATED, Some(0)),
            "requests go on path 0's other connection"
        );
    }
    assert_eq!(paths.live_connections(p0), 1);
    stuck.abort();
    let st = &w.gateway.stats;
    assert_eq!(st.failed.load(Ordering::Relaxed), 0);
    assert!(
        st.retried.load(Ordering::Relaxed) >= 1,
        "the held request was retried"
    );
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_request_cancels_only_its_stream() {
    let slow = Arc::new(Slow::default());
    let cfg = GatewayConfig {
        request_timeout: Duration::from_millis(500),
        ..Default::default()
    };
    let w = world_with(2, "single", cfg, Far::Slow(slow.clone())).await;
    let (a, b) = (
        register(&w.devices[0], 0).await,
        register(&w.devices[1], 0).await,
    );
    assert_eq!(
        send(&w.devices[1], &b).await,
        (http::StatusCode::CREATED, Some(0))
    );
    // Held, not only its id: an id is an address a successor could be allocated at.
    let conn0 = w.gateway.paths().connection(PathId(0)).unwrap();
    // Device 0's request hangs at the server on every path; device 1 keeps sending on path 0.
    let d0 = w.devices[0].clone();
    let stuck = tokio::spawn(async move { send_to(&d0, &a, "/ingest/slow").await.0 });
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            send(&w.devices[1], &b).await,
            (http::StatusCode::CREATED, Some(0)),
            "the other device's requests are unaffected"
        );
    }
    assert_eq!(stuck.await.unwrap(), 502, "every attempt timed out");
    let st = &w.gateway.stats;
    assert_eq!(st.timeouts.load(Ordering::Relaxed), 3);
    assert_eq!(st.failed.load(Ordering::Relaxed), 1);
    assert_eq!(
        w.gateway.paths().connection(PathId(0)).unwrap().stable_id(),
        conn0.stable_id(),
        "path 0's backhaul connection stayed up"
    );
    assert!(w.gateway.paths().table().get(PathId(0)).unwrap().up);
    assert_eq!(slow.answered.load(Ordering::Relaxed), 31);
}

/// Issue 49 item 6d: a request stream the device gave up on (STOP_SENDING before the answer)
/// gives its credit back as soon as the gateway's answer fails: the gateway resets its sending
/// half, as quinn's streams do when dropped (decision T14). Before, each such stream kept one of
/// the device's 8 request streams for the connection's life, and its 9th request waited for
/// ever.
#[tokio::test(start_paused = true)]
async fn streams_a_device_gave_up_on_return_their_credit() {
    let slow = Arc::new(Slow::default());
    let cfg = GatewayConfig {
        request_timeout: Duration::from_millis(500),
        ..Default::default()
    };
    let streams = cfg.max_inflight_per_device;
    let w = world_with(1, "single", cfg, Far::Slow(slow.clone())).await;
    let d = &w.devices[0];
    let hash = register(d, 0).await;
    for _ in 0..2 * streams {
        // Given up after 100 ms: stopped and reset by the device, answered later by the gateway.
        let r = d
            .request_within(
                http::Request::post("https://gw/ingest/slow")
                    .header(qgate_gateway::gateway::HASH_ID_HEADER, hash.as_str())
                    .body(())
                    .unwrap(),
                bytes::Bytes::from_static(b"x"),
                4096,
                Duration::from_millis(100),
            )
            .await;
        assert!(r.is_err(), "the device gave up");
        // The gateway's answer (a 502 after its 500 ms request timeout) meets the stop.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let t0 = tokio::time::Instant::now();
    let (status, _) = tokio::time::timeout(Duration::from_secs(5), try_register(d, 0))
        .await
        .expect("a stream was free for the next request");
    assert!(status == 201 || status == 429, "status {status}");
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "waited {:?} for a stream",
        t0.elapsed()
    );
}
