//! The server's own limits against hostile clients, over netsim in virtual time: connections
//! per client and in all (decision S10), a request stream that never finishes its headers
//! (HEADERS_DEADLINE).

use std::net::SocketAddr;
use std::time::Duration;

use qgate_netsim::{HostId, LinkParams, Network};
use qgate_transport::http3::{H3Client, ALPN_H3, HEADERS_DEADLINE};
use qgate_transport::{client_config, connect, endpoint, DevPki, Socket, TransportOptions};

const SERVER: &str = "10.0.0.9:443";

/// A server on 10.0.0.9 with `limits`, behind a router, and hosts 10.0.1.1 ... 10.0.1.`clients`.
fn world(
    clients: u8,
    limits: (usize, usize),
) -> (Network, Vec<HostId>, DevPki, qgate_server::RunningServer) {
    let net = Network::new(3);
    let link = || LinkParams::new(50_000_000, Duration::from_millis(5));
    let (s, r) = (net.add_host("server"), net.add_host("router"));
    net.set_forwarding(r, true);
    let is = net.add_interface(s, "10.0.0.9".parse().unwrap()).unwrap();
    let ir = net.add_interface(r, "10.0.0.254".parse().unwrap()).unwrap();
    net.connect_symmetric(is, ir, link()).unwrap();
    let hosts = (1..=clients)
        .map(|i| {
            let h = net.add_host(&format!("client{i}"));
            let ih = net
                .add_interface(h, format!("10.0.1.{i}").parse().unwrap())
                .unwrap();
            let ir = net
                .add_interface(r, format!("10.0.2.{i}").parse().unwrap())
                .unwrap();
            net.connect_symmetric(ih, ir, link()).unwrap();
            h
        })
        .collect();
    let pki = DevPki::generate(&[]).unwrap();
    let server = qgate_server::Server::builder()
        .socket(Socket::from(net.bind(s, SERVER.parse().unwrap()).unwrap()))
        .identity(&pki.server)
        .seed(1)
        .connection_limits(limits.0, limits.1)
        .start()
        .unwrap();
    (net, hosts, pki, server)
}

/// A QUIC connection from `host` (a fresh endpoint each time), or why not within 3 s.
async fn dial(net: &Network, host: HostId, pki: &DevPki) -> Result<quinn::Connection, String> {
    let ep = endpoint(
        Socket::from(net.bind(host, "0.0.0.0:0".parse().unwrap()).unwrap()),
        None,
        Some(7),
    )
    .unwrap();
    let cfg = client_config(&pki.trust(), &[ALPN_H3], &TransportOptions::default()).unwrap();
    let addr: SocketAddr = SERVER.parse().unwrap();
    match tokio::time::timeout(
        Duration::from_secs(3),
        connect(&ep, &cfg, addr, "localhost", false),
    )
    .await
    {
        Ok(Ok(c)) => Ok(c.connection().clone()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer".into()),
    }
}

#[tokio::test(start_paused = true)]
async fn connections_are_limited_per_client_and_in_all_and_a_closed_one_frees_its_place() {
    let (net, hosts, pki, server) = world(3, (3, 2));
    let a1 = dial(&net, hosts[0], &pki).await.unwrap();
    let _a2 = dial(&net, hosts[0], &pki).await.unwrap();
    // A third from the same client is refused before its handshake.
    let e = dial(&net, hosts[0], &pki).await.unwrap_err();
    assert!(e.contains("refused"), "{e}");
    // Another client still gets in, up to the limit in all.
    let _b = dial(&net, hosts[1], &pki).await.unwrap();
    assert!(dial(&net, hosts[2], &pki).await.is_err());
    assert_eq!(server.stats.snapshot().connections_refused, 2);
    // Once half the places were held, each new client first proved its address with a Retry
    // (spoofed Initials cannot hold places); honest ones got through all the same.
    assert!(
        server.stats.snapshot().retries >= 2,
        "{:?}",
        server.stats.snapshot()
    );
    // A closed connection gives its place back.
    a1.close(0u32.into(), b"bye");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let c = dial(&net, hosts[2], &pki).await.unwrap();
    // Every place is usable: an HTTP/3 exchange on the last one.
    let h3 = H3Client::new(c).await.unwrap();
    let r = h3
        .request(
            http::Request::get("https://localhost/health")
                .body(())
                .unwrap(),
            bytes::Bytes::new(),
            1 << 16,
        )
        .await
        .unwrap();
    assert_eq!(r.status, http::StatusCode::OK);
    let m = qgate_core::metrics::render(server.metrics.clone());
    assert!(
        m.contains("qgate_server_connections_refused_total 2"),
        "{m}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_whose_headers_never_end_is_dropped_at_the_deadline() {
    let (net, hosts, pki, _server) = world(1, (10, 10));
    let c = dial(&net, hosts[0], &pki).await.unwrap();
    // One byte of a HEADERS frame, then nothing.
    let (mut send, mut recv) = c.open_bi().await.unwrap();
    send.write_all(&[0x01]).await.unwrap();
    let started = tokio::time::Instant::now();
    let ended = tokio::time::timeout(HEADERS_DEADLINE * 2, recv.read_to_end(1024))
        .await
        .expect("the server ended the stream");
    let took = started.elapsed();
    assert!(
        took >= HEADERS_DEADLINE && took < HEADERS_DEADLINE + Duration::from_secs(1),
        "{took:?}: {ended:?}"
    );
    assert!(c.close_reason().is_none(), "only the stream ended");
}
