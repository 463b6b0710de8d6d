//! The server answers path probes on the same QUIC connection as HTTP/3, over netsim.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use qgate_forward::probe::ProbeMsg;
use qgate_netsim::{LinkParams, Network};
use qgate_transport::http3::{H3Client, ALPN_H3};
use qgate_transport::{client_config, connect, endpoint, DevPki, Socket, TransportOptions};
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn probes_are_answered_at_once_beside_http3() {
    let net = Network::new(1);
    let (g, s) = (net.add_host("gateway"), net.add_host("server"));
    let ig = net.add_interface(g, "10.0.0.1".parse().unwrap()).unwrap();
    let is = net.add_interface(s, "10.0.0.2".parse().unwrap()).unwrap();
    net.connect_symmetric(
        ig,
        is,
        LinkParams::new(50_000_000, Duration::from_millis(30)),
    )
    .unwrap();
    let pki = DevPki::generate(&[]).unwrap();
    let opts = TransportOptions::default();
    let server_addr: SocketAddr = "10.0.0.2:443".parse().unwrap();
    let stats = qgate_server::Server::builder()
        .socket(Socket::from(net.bind(s, server_addr).unwrap()))
        .identity(&pki.server)
        .transport(opts.clone())
        .seed(1)
        .start()
        .unwrap()
        .metrics;

    let cep = endpoint(
        Socket::from(net.bind(g, "10.0.0.1:0".parse().unwrap()).unwrap()),
        None,
        Some(2),
    )
    .unwrap();
    let ccfg = client_config(&pki.trust(), &[ALPN_H3], &opts).unwrap();
    let conn = connect(&cep, &ccfg, server_addr, "localhost", false)
        .await
        .unwrap()
        .connection()
        .clone();

    for seq in [1u64, 2, 3] {
        let t = Instant::now();
        conn.send_datagram(Bytes::copy_from_slice(&ProbeMsg::Request(seq).encode()))
            .unwrap();
        let d = conn.read_datagram().await.unwrap();
        assert_eq!(ProbeMsg::decode(&d), Ok(ProbeMsg::Response(seq)));
        let rtt = t.elapsed();
        assert!(
            rtt >= Duration::from_millis(60) && rtt <= Duration::from_millis(62),
            "{rtt:?}"
        );
    }
    // Garbage is ignored and counted; the connection and HTTP/3 keep working.
    conn.send_datagram(Bytes::from_static(b"not a probe"))
        .unwrap();
    let h3 = H3Client::new(conn.clone()).await.unwrap();
    let r = h3
        .request(
            http::Request::get("https://localhost/health")
                .body(())
                .unwrap(),
            Bytes::new(),
            1 << 16,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let s = stats.snapshot();
    assert_eq!((s.probes, s.bad_probes), (3, 1));
    // Counters are not served on the data port (a device must not read them).
    for path in ["/stats", "/metrics"] {
        let r = h3
            .request(
                http::Request::get(format!("https://localhost{path}"))
                    .body(())
                    .unwrap(),
                Bytes::new(),
                1 << 16,
            )
            .await
            .unwrap();
        assert_eq!(r.status, 404, "{path}");
    }
    assert_eq!(stats.snapshot().probes, 3);
}
