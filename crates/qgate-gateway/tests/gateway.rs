//! devices → gateway → three backhaul paths → server, over netsim in virtual time.

mod common;

use std::time::Duration;

use common::{assert_metrics, metrics, register, send, world};
use qgate_forward::path::PathId;

#[tokio::test(start_paused = true)]
async fn every_scheduler_answers_every_request() {
    for sched in qgate_forward::scheduler::SCHEDULERS {
        let w = world(10, sched).await;
        let mut hashes = Vec::new();
        for (i, d) in w.devices.iter().enumerate() {
            hashes.push(register(d, (i % 2) as u8).await);
        }
        let mut used = [0usize; 3];
        for round in 0..5 {
            for (i, d) in w.devices.iter().enumerate() {
                let (status, path) = send(d, &hashes[i]).await;
                assert_eq!(status, 201, "{sched} round {round} device {i}");
                used[path.unwrap()] += 1;
                if matches!(sched, "adaptive" | "adaptive-packets" | "completion") && i % 2 == 1 {
                    assert_eq!(path, Some(0), "priority devices ride the lowest-RTT path");
                }
            }
        }
        assert_eq!(w.server.snapshot().ingested, 50, "{sched}");
        // Every answered request gave its place in its path's queue back.
        let table = w.gateway.paths().table();
        for p in table.paths() {
            assert_eq!(
                (p.queued_bytes, p.pending_requests()),
                (0, 0),
                "{sched}: {p:?}"
            );
        }
        match sched {
            "single" => assert_eq!(used, [50, 0, 0]),
            "round-robin" => assert!(used.iter().all(|u| *u >= 16), "{used:?}"),
            // One request at a time: nothing queued anywhere, so every request takes the
            // lowest RTT (20 ms round trip; the next path's 40 ms costs more).
            "completion" => assert_eq!(used, [50, 0, 0], "{sched}"),
            _ => {
                // Best-effort devices spread over the paths by hits (tie → lower RTT).
                assert!(used[1] > 0 && used[2] > 0, "{used:?}");
                let hits: Vec<u32> = w
                    .gateway
                    .paths()
                    .table()
                    .paths()
                    .iter()
                    .map(|p| p.hits)
                    .collect();
                assert_eq!(
                    hits.iter().sum::<u32>(),
                    10,
                    "every device counted once: {hits:?}"
                );
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_forged_hash_id_is_refused() {
    let w = world(2, "adaptive").await;
    let a = register(&w.devices[0], 1).await;
    assert_eq!(
        send(&w.devices[1], &a).await.0,
        403,
        "device 1 used device 0's Hash ID"
    );
    assert_eq!(
        send(&w.devices[1], "00112233445566778899aabbccddeeff")
            .await
            .0,
        401
    );
    assert_eq!(send(&w.devices[1], "nope").await.0, 400);
    assert_eq!(w.server.snapshot().ingested, 0);
    let b = register(&w.devices[1], 0).await;
    assert_eq!(send(&w.devices[1], &b).await.0, 201);
    // The gateway's metrics show all of it.
    let m = metrics(&w).await;
    assert_metrics(
        &m,
        &[
            "qgate_gateway_sessions 2",
            "qgate_gateway_refused_total 3",
            "qgate_gateway_forwarded_total 1",
            "qgate_gateway_path_up{path=\"0\"} 1",
            "qgate_gateway_path_connections{path=\"0\"} 1",
            "qgate_gateway_response_delay_seconds_count{class=\"best_effort\"} 1",
            "qgate_gateway_response_delay_seconds_count{class=\"priority\"} 0",
            "qgate_gateway_path_bytes_total{path=\"0\"} 1024",
            "qgate_gateway_bodies_gave_way_total 0",
        ],
    );
    assert!(
        m.contains("qgate_gateway_path_rtt_seconds{path=\"2\"} 0.06"),
        "{m}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_dying_path_loses_no_request() {
    for sched in ["adaptive", "completion"] {
        a_dying_path_loses_no_request_with(sched).await;
    }
}

async fn a_dying_path_loses_no_request_with(sched: &str) {
    let w = world(4, sched).await;
    let mut hashes = Vec::new();
    for d in &w.devices {
        hashes.push(register(d, 1).await); // all priority: all on path 0
    }
    let mut sent = 0;
    for round in 0..20 {
        if round == 5 {
            w.net.update_both(w.backhaul[0], |l| l.up = false).unwrap();
        }
        for (i, d) in w.devices.iter().enumerate() {
            let (status, path) = send(d, &hashes[i]).await;
            assert_eq!(status, 201, "{sched}: round {round} device {i}");
            sent += 1;
            if round > 5 {
                assert_ne!(path, Some(0), "{sched}: the dead path is not used");
            }
        }
    }
    let s = w.server.snapshot();
    assert_eq!(s.ingested, sent, "every request stored exactly once");
    let table = w.gateway.paths().table();
    assert!(!table.get(PathId(0)).unwrap().up);
    // The attempts that timed out on the dead path gave their tickets back too.
    for p in table.paths() {
        assert_eq!(
            (p.queued_bytes, p.pending_requests()),
            (0, 0),
            "{sched}: {p:?}"
        );
    }
    assert!(
        w.gateway
            .stats
            .retried
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );
}

#[tokio::test(start_paused = true)]
async fn adaptive_moves_priority_devices_off_a_degrading_path() {
    let w = world(4, "adaptive").await;
    let mut hashes = Vec::new();
    for (i, d) in w.devices.iter().enumerate() {
        hashes.push(register(d, (i % 2) as u8).await);
    }
    for (i, d) in w.devices.iter().enumerate() {
        let (status, path) = send(d, &hashes[i]).await;
        assert_eq!(status, 201);
        if i % 2 == 1 {
            assert_eq!(path, Some(0));
        }
    }
    // Path 1's delay rises from 10 to 80 ms one way (the dynamic scenario of EXPERIMENTS.md).
    w.net
        .update_both(w.backhaul[0], |l| l.delay = Duration::from_millis(80))
        .unwrap();
    let mut moved_at = None;
    for round in 0..60 {
        for (i, d) in w.devices.iter().enumerate() {
            let (status, path) = send(d, &hashes[i]).await;
            assert_eq!(status, 201, "no request lost while moving");
            if i % 2 == 1 && path != Some(0) && moved_at.is_none() {
                moved_at = Some(round);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let round = moved_at.expect("priority devices moved off the slowed path");
    assert!(round < 30, "moved only after {round} rounds");
    // Best-effort devices stay where they are while their path is up.
    assert_eq!(w.server.snapshot().ingested, 4 + 60 * 4);
}

/// Twenty devices each send three records at once; what the backhaul carried.
async fn burst(cfg: qgate_gateway::gateway::GatewayConfig, priority: u8) -> (u64, u64, String) {
    let w = common::world_with(20, "single", cfg, common::Far::Counting).await;
    let mut hashes = Vec::new();
    for d in &w.devices {
        hashes.push(register(d, priority).await);
    }
    for round in 0..3 {
        let sends = w
            .devices
            .iter()
            .zip(&hashes)
            .map(|(d, h)| send(d, h))
            .collect::<Vec<_>>();
        for (i, (status, path)) in futures_util::future::join_all(sends)
            .await
            .into_iter()
            .enumerate()
        {
            assert_eq!(
                (status.as_u16(), path),
                (201, Some(0)),
                "round {round} device {i}"
            );
        }
    }
    assert_eq!(w.server.snapshot().ingested, 60);
    let b = &w.gateway.batch_stats;
    let r = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(r(&b.refused), 0);
    (r(&b.batches), r(&b.batched), metrics(&w).await)
}

#[tokio::test(start_paused = true)]
async fn best_effort_records_sent_at_once_share_backhaul_requests() {
    // Decision G23: records ready for the same lane at once go in one `POST /batch`; every
    // one is still answered and stored once.
    let (batches, batched, m) = burst(Default::default(), 0).await;
    assert!(
        batches >= 1 && batched >= 2 * batches,
        "{batches} batches of {batched}"
    );
    assert!(batched > 30, "{batched} of 60 records batched");
    assert_metrics(
        &m,
        &[&format!("qgate_gateway_batched_records_total {batched}")],
    );
    // Off: one request per record.
    let off = qgate_gateway::gateway::GatewayConfig {
        batch_max_record: 0,
        ..Default::default()
    };
    assert_eq!(burst(off, 0).await.0, 0);
    // Priority records are batched with priority records only (a batcher per class): here
    // every device is priority, so they batch as best effort did.
    let (batches, batched, _) = burst(Default::default(), 1).await;
    assert!(
        batches >= 1 && batched > 30,
        "{batches} batches of {batched}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_device_cannot_send_the_server_a_batch() {
    // A batch names devices and request ids: forwarded, a device could claim ids the
    // gateway's own records need, and they would be answered as duplicates, never stored.
    let w = world(1, "single").await;
    let hash = register(&w.devices[0], 0).await;
    let (status, _) = common::send_to(&w.devices[0], &hash, "/batch").await;
    assert_eq!(status, 404);
    assert_eq!(w.server.snapshot().requests, 0);
}

#[tokio::test(start_paused = true)]
async fn a_best_effort_request_starved_by_priority_goes_again_at_its_urgency() {
    // Decision G24: priority requests' bytes go first on a backhaul connection, so a
    // best-effort request behind a steady stream of them waits; once an attempt has timed out
    // (500 ms here) it goes again at priority's urgency and shares the connection.
    let w = world(3, "single").await;
    // A short queue keeps the connection's window near the path's 2 Mbit/s: the bytes wait in
    // the sender, where urgency orders them, not in the link's queue.
    w.net
        .update_both(w.backhaul[0], |l| {
            l.rate_bps = Some(2_000_000);
            l.queue = qgate_aqm::DisciplineSpec::Droptail {
                packets: Some(8),
                bytes: None,
            };
        })
        .unwrap();
    let prio = register(&w.devices[0], 1).await;
    let best = register(&w.devices[1], 0).await;
    // Three priority requests of 16 KiB always under way, started 100 ms apart: each takes
    // about 200 ms at 2 Mbit/s beside the others, so the connection never runs out of
    // priority bytes.
    let until = tokio::time::Instant::now() + Duration::from_secs(4);
    let loops: Vec<_> = (0..3u64)
        .map(|i| {
            let (d, hash) = (w.devices[0].clone(), prio.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(100 * i)).await;
                let mut answered = 0;
                while tokio::time::Instant::now() < until {
                    let r = d
                        .request(
                            http::Request::post("https://gw/ingest/data")
                                .header(qgate_gateway::gateway::HASH_ID_HEADER, hash.as_str())
                                .body(())
                                .unwrap(),
                            bytes::Bytes::from(vec![1u8; 16 * 1024]),
                            4096,
                        )
                        .await
                        .unwrap();
                    assert_eq!(r.status, 201);
                    answered += 1;
                }
                answered
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(650)).await;
    let sent = tokio::time::Instant::now();
    let (status, _) = send(&w.devices[1], &best).await;
    assert_eq!(
        status, 201,
        "a best-effort request starved on every attempt"
    );
    // Its first attempt timed out (500 ms); the second was answered.
    let took = sent.elapsed();
    assert!(
        took > Duration::from_millis(500) && took < Duration::from_millis(1_000),
        "{took:?}"
    );
    for l in loops {
        assert!(l.await.unwrap() > 5);
    }
}
