//! The gateway on real UDP: devices on 127.0.0.1, backhaul paths bound to 127.0.0.2 and
//! 127.0.0.3, the server on 127.0.0.1.

mod common;

use std::time::Duration;

use qgate_gateway::gateway::GatewayConfig;
use qgate_transport::http3::{H3Client, ALPN_H3};
use qgate_transport::{client_config, connect, endpoint, Socket, TransportOptions};

/// One device on 127.0.0.1 registers and sends ten requests, each answered 201; the path the
/// gateway names for each.
async fn ten_requests(lb: &common::Loopback) -> Vec<Option<usize>> {
    let ccfg = client_config(&lb.trust, &[ALPN_H3], &TransportOptions::default()).unwrap();
    let dev = endpoint(
        Socket::bind_udp("127.0.0.1:0".parse().unwrap()).unwrap(),
        None,
        None,
    )
    .unwrap();
    let conn = connect(&dev, &ccfg, lb.addr, "localhost", false)
        .await
        .unwrap();
    let h3 = H3Client::new(conn.connection().clone()).await.unwrap();
    let hash = common::register(&h3, 1).await;
    let mut paths = Vec::new();
    for _ in 0..10 {
        let (status, path) = common::send(&h3, &hash).await;
        assert_eq!(status, 201);
        paths.push(path);
    }
    paths
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_over_two_loopback_paths() {
    let lb = common::loopback(
        GatewayConfig::default(),
        &["127.0.0.2:0", "127.0.0.3:0"],
        "round-robin",
    )
    .await;
    let paths: Vec<usize> = tokio::time::timeout(Duration::from_secs(30), ten_requests(&lb))
        .await
        .expect("loopback run timed out")
        .into_iter()
        .map(|p| p.expect("the gateway names the path"))
        .collect();
    assert!(paths.contains(&0) && paths.contains(&1), "{paths:?}");
    assert_eq!(lb.stats.snapshot().ingested, 10);
}

/// Shaped backhaul paths forward as before, and `/metrics` reports each shaper (decision L8).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shaped_paths_forward_and_report_their_shapers() {
    let mut shape = qgate_link::LinkParams::default();
    "rate=50mbit,queue=pid-delay"
        .parse::<qgate_link::LinkChange>()
        .unwrap()
        .apply(&mut shape)
        .unwrap();
    let lb = common::loopback_shaped(
        GatewayConfig::default(),
        &["127.0.0.2:0", "127.0.0.3:0"],
        "round-robin",
        Some(shape),
    )
    .await;
    tokio::time::timeout(Duration::from_secs(30), ten_requests(&lb))
        .await
        .expect("forwarded through the shapers within 30 s");
    let m = lb.gw.metrics();
    for path in ["0", "1"] {
        let sent: u64 = m
            .lines()
            .find_map(|l| {
                l.strip_prefix(&format!(
                    "qgate_gateway_shaper_sent_total{{path=\"{path}\"}} "
                ))?
                .parse()
                .ok()
            })
            .unwrap_or_else(|| panic!("no shaper line for path {path} in:\n{m}"));
        assert!(sent > 0, "path {path}: nothing went through its shaper");
    }
    assert!(m.contains("qgate_gateway_shaper_dropped_total{path=\"0\"} "));
    assert!(m.contains("qgate_gateway_shaper_queue_packets{path=\"1\"} "));
}
