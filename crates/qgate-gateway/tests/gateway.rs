//! devices → gateway → three backhaul paths → server, over netsim in virtual time.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use qgate_core::path::{PathConfig, PathId};
use qgate_core::scheduler;
use qgate_gateway::gateway::{Gateway, GatewayConfig, HASH_ID_HEADER, PRIORITY_HEADER};
use qgate_gateway::paths::{Backhaul, PathManager};
use qgate_netsim::{LinkId, LinkParams, Network};
use qgate_server::ServerStats;
use qgate_transport::http3::{H3Client, ALPN_H3};
use qgate_transport::{client_config, connect, endpoint, DevPki, Socket, TransportOptions};

struct World {
    net: Network,
    backhaul: Vec<LinkId>,
    gateway: Arc<Gateway>,
    server: Arc<ServerStats>,
    devices: Vec<Arc<H3Client>>,
}

/// `n` devices (even ones priority) on their own 1 Gbit/s / 1 ms links to the gateway; three
/// backhaul paths of 100/75/50 Mbit/s with 10/20/30 ms one-way delay.
async fn world(n: usize, sched: &str) -> World {
    let net = Network::new(7);
    let (g, s) = (net.add_host("gateway"), net.add_host("server"));
    let pki = DevPki::generate(&[]).unwrap();
    let opts = TransportOptions {
        keep_alive_ms: Some(1000),
        ..Default::default()
    };
    let mut backhaul = Vec::new();
    for (i, rate) in [100_000_000u64, 75_000_000, 50_000_000].iter().enumerate() {
        let k = i as u8 + 1;
        let gi = net
            .add_interface(g, format!("10.0.{k}.1").parse().unwrap())
            .unwrap();
        let si = net
            .add_interface(s, format!("10.0.{k}.2").parse().unwrap())
            .unwrap();
        let delay = Duration::from_millis(10 * k as u64);
        backhaul.push(
            net.connect_symmetric(gi, si, LinkParams::new(*rate, delay))
                .unwrap(),
        );
    }
    let server = qgate_server::CountingServer::start(
        Socket::from(net.bind(s, "0.0.0.0:443".parse().unwrap()).unwrap()),
        &pki.server,
        &opts,
        Some(1),
    )
    .unwrap()
    .stats;

    let paths = (1..=3u8)
        .map(|k| {
            let local: SocketAddr = format!("10.0.{k}.1:0").parse().unwrap();
            let remote: SocketAddr = format!("10.0.{k}.2:443").parse().unwrap();
            Backhaul::new(
                Socket::from(net.bind(g, local).unwrap()),
                remote,
                "localhost",
                Some(k as u64),
            )
            .unwrap()
        })
        .collect();
    let pm = PathManager::start(
        paths,
        client_config(&pki.trust(), &[ALPN_H3], &opts).unwrap(),
        PathConfig::default(),
    );
    let cfg = GatewayConfig {
        request_timeout: Duration::from_millis(500),
        ..Default::default()
    };
    let dev_ep = cfg
        .device_endpoint(
            Socket::from(net.bind(g, "0.0.0.0:443".parse().unwrap()).unwrap()),
            &pki.server,
            &opts,
            Some(3),
        )
        .unwrap();
    let gateway = Arc::new(Gateway::new(
        pm,
        scheduler::by_name(sched).unwrap(),
        cfg,
        [9; 32],
    ));
    tokio::spawn(gateway.clone().serve_devices(dev_ep));
    tokio::time::sleep(Duration::from_secs(1)).await; // paths measured

    let dcfg = client_config(&pki.trust(), &[ALPN_H3], &opts).unwrap();
    let mut devices = Vec::new();
    for i in 0..n {
        let h = net.add_host(&format!("dev{i}"));
        let di = net
            .add_interface(h, format!("10.8.{i}.2").parse().unwrap())
            .unwrap();
        let gi = net
            .add_interface(g, format!("10.8.{i}.1").parse().unwrap())
            .unwrap();
        net.connect_symmetric(
            di,
            gi,
            LinkParams::new(1_000_000_000, Duration::from_millis(1)),
        )
        .unwrap();
        let ep = endpoint(
            Socket::from(
                net.bind(h, format!("10.8.{i}.2:0").parse().unwrap())
                    .unwrap(),
            ),
            None,
            Some(100 + i as u64),
        )
        .unwrap();
        let gw_addr: SocketAddr = format!("10.8.{i}.1:443").parse().unwrap();
        let conn = connect(&ep, &dcfg, gw_addr, "localhost", false)
            .await
            .unwrap();
        devices.push(Arc::new(
            H3Client::new(conn.connection().clone()).await.unwrap(),
        ));
        std::mem::forget(ep); // keep the device endpoint alive for the test
    }
    World {
        net,
        backhaul,
        gateway,
        server,
        devices,
    }
}

async fn register(d: &H3Client, priority: u8) -> String {
    let r = d
        .request(
            http::Request::post("https://gw/register")
                .header(PRIORITY_HEADER, priority.to_string())
                .body(())
                .unwrap(),
            Bytes::new(),
            4096,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 201);
    let body = String::from_utf8_lossy(&r.body).to_string();
    body.split('"').nth(3).unwrap().to_string()
}

async fn send(d: &H3Client, hash: &str) -> (http::StatusCode, Option<usize>) {
    let r = d
        .request(
            http::Request::post("https://gw/ingest/data")
                .header(HASH_ID_HEADER, hash)
                .body(())
                .unwrap(),
            Bytes::from(vec![1u8; 1024]),
            4096,
        )
        .await
        .unwrap();
    (
        r.status,
        r.headers
            .get("qgate-path")
            .and_then(|v| v.to_str().ok()?.parse().ok()),
    )
}

#[tokio::test(start_paused = true)]
async fn every_scheduler_answers_every_request() {
    for sched in ["adaptive", "round-robin", "single"] {
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
                if sched == "adaptive" && i % 2 == 1 {
                    assert_eq!(path, Some(0), "priority devices ride the lowest-RTT path");
                }
            }
        }
        assert_eq!(w.server.snapshot().ingested, 50, "{sched}");
        match sched {
            "single" => assert_eq!(used, [50, 0, 0]),
            "round-robin" => assert!(used.iter().all(|u| *u >= 16), "{used:?}"),
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
    let m = w.devices[0]
        .request(
            http::Request::get("https://gw/metrics").body(()).unwrap(),
            Bytes::new(),
            1 << 16,
        )
        .await
        .unwrap();
    let m = String::from_utf8_lossy(&m.body).to_string();
    for line in [
        "qgate_gateway_sessions 2",
        "qgate_gateway_refused_total 3",
        "qgate_gateway_forwarded_total 1",
        "qgate_gateway_path_up{path=\"0\"} 1",
        "qgate_gateway_response_delay_seconds_count{class=\"best_effort\"} 1",
        "qgate_gateway_response_delay_seconds_count{class=\"priority\"} 0",
        "qgate_gateway_path_bytes_total{path=\"0\"} 1024",
    ] {
        assert!(m.contains(line), "missing '{line}' in:\n{m}");
    }
    assert!(
        m.contains("qgate_gateway_path_rtt_seconds{path=\"2\"} 0.06"),
        "{m}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_dying_path_loses_no_request() {
    let w = world(4, "adaptive").await;
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
            assert_eq!(status, 201, "round {round} device {i}");
            sent += 1;
            if round > 5 {
                assert_ne!(path, Some(0), "the dead path is not used");
            }
        }
    }
    let s = w.server.snapshot();
    assert_eq!(s.ingested, sent, "every request stored exactly once");
    assert!(!w.gateway.paths().table().get(PathId(0)).unwrap().up);
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
