//! The gateway on real UDP: devices on 127.0.0.1, backhaul paths bound to 127.0.0.2 and
//! 127.0.0.3, the server on 127.0.0.1.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use qgate_core::path::PathConfig;
use qgate_core::scheduler;
use qgate_gateway::gateway::{Gateway, GatewayConfig, HASH_ID_HEADER, PRIORITY_HEADER};
use qgate_gateway::paths::{Backhaul, PathManager};
use qgate_transport::http3::{H3Client, ALPN_H3};
use qgate_transport::{client_config, connect, endpoint, DevPki, Socket, TransportOptions};

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_over_two_loopback_paths() {
    let pki = DevPki::generate(&[]).unwrap();
    let opts = TransportOptions::default();

    let server = qgate_server::CountingServer::start(
        Socket::bind_udp(sa("127.0.0.1:0")).unwrap(),
        &pki.server,
        &opts,
        None,
    )
    .unwrap();
    let server_addr = server.addr();
    let stats = server.stats.clone();

    let paths = ["127.0.0.2:0", "127.0.0.3:0"]
        .iter()
        .map(|l| {
            Backhaul::new(
                Socket::bind_udp(sa(l)).unwrap(),
                server_addr,
                "localhost",
                None,
            )
            .unwrap()
        })
        .collect();
    let ccfg = client_config(&pki.trust(), &[ALPN_H3], &opts).unwrap();
    let pm = PathManager::start(paths, ccfg.clone(), PathConfig::default());
    let gw = Arc::new(Gateway::new(
        pm,
        scheduler::by_name("round-robin").unwrap(),
        GatewayConfig::default(),
        [4; 32],
    ));
    let listener = GatewayConfig::default()
        .device_endpoint(
            Socket::bind_udp(sa("127.0.0.1:0")).unwrap(),
            &pki.server,
            &opts,
            None,
        )
        .unwrap();
    let gw_addr = listener.local_addr();
    tokio::spawn(gw.clone().serve_devices(listener));

    let run = async {
        // Wait until both paths are connected and measured.
        while gw.paths().table().paths().iter().any(|p| p.rtt.is_none()) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let dev = endpoint(Socket::bind_udp(sa("127.0.0.1:0")).unwrap(), None, None).unwrap();
        let conn = connect(&dev, &ccfg, gw_addr, "localhost", false)
            .await
            .unwrap();
        let h3 = H3Client::new(conn.connection().clone()).await.unwrap();
        let r = h3
            .request(
                http::Request::post("https://gw/register")
                    .header(PRIORITY_HEADER, "1")
                    .body(())
                    .unwrap(),
                Bytes::new(),
                4096,
            )
            .await
            .unwrap();
        let hash = String::from_utf8_lossy(&r.body)
            .split('"')
            .nth(3)
            .unwrap()
            .to_string();
        let mut paths = Vec::new();
        for _ in 0..10 {
            let r = h3
                .request(
                    http::Request::post("https://gw/ingest/loop")
                        .header(HASH_ID_HEADER, hash.as_str())
                        .body(())
                        .unwrap(),
                    Bytes::from_static(b"reading"),
                    4096,
                )
                .await
                .unwrap();
            assert_eq!(r.status, 201);
            paths.push(
                r.headers
                    .get("qgate-path")
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_string(),
            );
        }
        paths
    };
    let paths = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("loopback run timed out");
    assert!(
        paths.contains(&"0".to_string()) && paths.contains(&"1".to_string()),
        "{paths:?}"
    );
    assert_eq!(stats.snapshot().ingested, 10);
}
