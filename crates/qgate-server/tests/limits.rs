//! The server's own limits against hostile clients, over netsim in virtual time: connections
//! per client and in all (decision S10), a request stream that never finishes its headers
//! (HEADERS_DEADLINE), a client holding the request-body budget (T13).

use std::net::SocketAddr;
use std::time::Duration;

use qgate_netsim::{HostId, LinkParams, Network};
use qgate_transport::http3::{self, BodyBudget, H3Client, ServeLimits, ALPN_H3, HEADERS_DEADLINE};
use qgate_transport::{client_config, connect, endpoint, DevPki, Socket, TransportOptions};

const SERVER: &str = "10.0.0.9:443";

/// A server on 10.0.0.9 with `limits`, behind a router, and hosts 10.0.1.1 ... 10.0.1.`clients`.
fn world(
    clients: u8,
    limits: (usize, usize),
) -> (Network, Vec<HostId>, DevPki, qgate_server::RunningServer) {
    world_with(clients, limits, ServeLimits::default())
}

/// [`world`], its requests under `serve`.
fn world_with(
    clients: u8,
    limits: (usize, usize),
    serve: ServeLimits,
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
        .limits(serve)
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

/// Decision T13: a client that sends three bodies nearly whole, taking most of the server's
/// request-body budget, and then trickles a byte every 20 s (inside the 30 s stall timeout)
/// used to keep every other client's body out (503) for the five-minute body deadline. Now
/// another client's body is stored at once, and one of the hog's bodies is cut off with 503.
#[tokio::test(start_paused = true)]
async fn a_client_holding_the_body_budget_gives_way_to_another() {
    let (other, answers, budget, server, _) = hog_and_other(false).await;
    assert!(other.is_success(), "{other}");
    // Exactly one of the hog's requests made way, with 503; the other two still wait.
    let mut gave_way = 0;
    for a in answers {
        if a.is_finished() {
            assert_eq!(
                a.await.unwrap(),
                Some(http::StatusCode::SERVICE_UNAVAILABLE)
            );
            gave_way += 1;
        }
    }
    assert_eq!(gave_way, 1);
    assert_eq!(budget.gave_way(), 1);
    let m = qgate_core::metrics::render(server.metrics.clone());
    assert!(m.contains("qgate_server_bodies_gave_way_total 1"), "{m}");
}

/// A hog that grants no room for answers (a 48-byte stream window) cannot keep the bytes of a
/// body that gave way by never taking its 503: they come back before the answer is sent (the
/// hostile try of T13 held the budget this way for as long as its connection lived), and the
/// answer is reset at its deadline.
#[tokio::test(start_paused = true)]
async fn a_body_that_gave_way_gives_its_bytes_back_before_its_answer() {
    let (other, _answers, budget, _server, hog) = hog_and_other(true).await;
    assert!(other.is_success(), "{other}");
    assert_eq!(budget.gave_way(), 1);
    assert_eq!(hog.stats().frame_rx.reset_stream, 0);
    // The hog holds its two other bodies' 120 000 bytes (and a trickled byte or none); the
    // rest is free again.
    assert!(
        (79_990..=80_000).contains(&budget.available()),
        "{} free",
        budget.available()
    );
    // The 503 it never takes is reset at the answer deadline (its request's task ends).
    tokio::time::sleep(http3::ANSWER_DEADLINE).await;
    assert_eq!(hog.stats().frame_rx.reset_stream, 1);
}

/// A hog on 10.0.1.1 holding 180 000 bytes of a 200 000-byte budget in three trickled bodies,
/// its answers read or, with `zero_window`, never read and unsendable; then another client on 10.0.1.2
/// posts 60 000 bytes, which must be answered within 2 s. Returns that answer's status, the
/// hog's answers (1 s later), the budget, the server and the hog's connection.
async fn hog_and_other(
    zero_window: bool,
) -> (
    http::StatusCode,
    Vec<tokio::task::JoinHandle<Option<http::StatusCode>>>,
    BodyBudget,
    qgate_server::RunningServer,
    quinn::Connection,
) {
    let budget = BodyBudget::new(200_000);
    let (net, hosts, pki, server) = world_with(
        2,
        (10, 10),
        ServeLimits {
            max_body: 100_000,
            buffered: budget.clone(),
            ..ServeLimits::default()
        },
    );
    // The hog: 60 000 of 100 000 announced bytes on each of three requests.
    let hog = if zero_window {
        let ep = endpoint(
            Socket::from(net.bind(hosts[0], "0.0.0.0:0".parse().unwrap()).unwrap()),
            None,
            Some(7),
        )
        .unwrap();
        let mut cfg =
            client_config(&pki.trust(), &[ALPN_H3], &TransportOptions::default()).unwrap();
        let mut t = quinn::TransportConfig::default();
        // Room for the server's SETTINGS and an answer's HEADERS, not for the 503's text.
        t.stream_receive_window(48u32.into());
        cfg.transport_config(std::sync::Arc::new(t));
        connect(&ep, &cfg, SERVER.parse().unwrap(), "localhost", false)
            .await
            .unwrap()
            .connection()
            .clone()
    } else {
        dial(&net, hosts[0], &pki).await.unwrap()
    };
    let (mut driver, mut send) =
        h3::client::new(qgate_transport::quinn_streams::Connection::new(hog.clone()))
            .await
            .unwrap();
    tokio::spawn(async move { std::future::poll_fn(|cx| driver.poll_close(cx)).await });
    let (mut trickles, mut answers) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let req = http::Request::post("https://localhost/ingest/hog")
            .header(http::header::CONTENT_LENGTH, "100000")
            .body(())
            .unwrap();
        let mut stream = send.send_request(req).await.unwrap();
        stream
            .send_data(bytes::Bytes::from(vec![b'h'; 60_000]))
            .await
            .unwrap();
        let (tx, mut rx) = stream.split();
        trickles.push(tx);
        answers.push(tokio::spawn(async move {
            if zero_window {
                // Never read: the window stays shut.
                std::future::pending::<()>().await;
            }
            rx.recv_response().await.map(|r| r.status()).ok()
        }));
    }
    tokio::spawn(async move {
        // h3 closes a client's connection once every request sender is gone.
        let _send = send;
        loop {
            tokio::time::sleep(Duration::from_secs(20)).await;
            for t in &mut trickles {
                let _ = t.send_data(bytes::Bytes::from_static(b"h")).await;
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(budget.available() <= 20_000, "{} free", budget.available());
    let other = H3Client::new(dial(&net, hosts[1], &pki).await.unwrap())
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let r = other
        .request(
            http::Request::post("https://localhost/ingest/other")
                .body(())
                .unwrap(),
            bytes::Bytes::from(vec![b'o'; 60_000]),
            1 << 16,
        )
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    (r.status, answers, budget, server, hog)
}
