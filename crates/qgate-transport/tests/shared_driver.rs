//! The shared-driver server endpoint (one driver task for all connections) carrying HTTP/3 for quinn
//! clients: on real loopback UDP, and on the simulated network in virtual time.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use qgate_netsim::{LinkParams, LossModel, Network};
use qgate_transport::http3::{self, H3Client, Handler, ServeLimits, ALPN_H3};
use qgate_transport::{
    client_config, connect, endpoint, server_config, shared_driver, DevPki, Socket,
    TransportOptions,
};

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

/// Answers every request with its own body.
struct Echo;

impl Handler for Echo {
    async fn handle(&self, _req: Request<()>, body: Bytes, _peer: SocketAddr) -> Response<Bytes> {
        Response::new(body)
    }
}

fn serve(ep: shared_driver::Endpoint) {
    tokio::spawn(async move {
        while let Some(c) = ep.accept().await {
            let peer = c.remote_address();
            tokio::spawn(http3::serve_quic(
                c,
                peer,
                Arc::new(Echo),
                ServeLimits {
                    max_body: 4 << 20,
                    ..Default::default()
                },
            ));
        }
    });
}

/// An echoing shared-driver server on loopback (up to 16 connections) with `opts`, its
/// address, and a client endpoint beside it.
fn loopback(
    pki: &DevPki,
    opts: &TransportOptions,
) -> (shared_driver::Endpoint, SocketAddr, quinn::Endpoint) {
    let scfg = server_config(&pki.server, &[ALPN_H3], opts).unwrap();
    let ep = shared_driver::Endpoint::server(
        Socket::bind_udp(sa("127.0.0.1:0")).unwrap(),
        scfg,
        opts,
        None,
        shared_driver::Limits::with_connections(16),
    )
    .unwrap();
    let addr = ep.local_addr();
    serve(ep.clone());
    let cep = endpoint(Socket::bind_udp(sa("127.0.0.1:0")).unwrap(), None, None).unwrap();
    (ep, addr, cep)
}

fn post(i: usize) -> Request<()> {
    Request::post(format!("https://localhost/echo/{i}"))
        .body(())
        .unwrap()
}

/// Small flow-control windows, so that both sides' writes block and resume.
fn tight() -> TransportOptions {
    TransportOptions {
        stream_receive_window: 16 * 1024,
        receive_window: 64 * 1024,
        ..Default::default()
    }
}

async fn h3_client(
    ep: &quinn::Endpoint,
    cfg: &quinn::ClientConfig,
    server: SocketAddr,
) -> H3Client {
    let c = connect(ep, cfg, server, "localhost", false).await.unwrap();
    H3Client::new(c.connection().clone()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echoes_bodies_through_blocked_windows_on_loopback() {
    let pki = DevPki::generate(&[]).unwrap();
    let (ep, addr, cep) = loopback(&pki, &tight());
    let ccfg = client_config(&pki.trust(), &[ALPN_H3], &tight()).unwrap();
    let run = async {
        let client = Arc::new(h3_client(&cep, &ccfg, addr).await);
        let sizes = [
            0usize,
            1,
            1024,
            300 * 1024,
            50 * 1024,
            50 * 1024,
            50 * 1024,
            7,
        ];
        let tasks: Vec<_> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let client = client.clone();
                tokio::spawn(async move {
                    let body: Bytes = (0..n).map(|k| (k * 7 + i) as u8).collect();
                    let r = client
                        .request(post(i), body.clone(), 1 << 20)
                        .await
                        .unwrap();
                    assert_eq!(r.status, 200);
                    assert!(
                        r.body == body,
                        "request {i}: {} of {n} bytes back",
                        r.body.len()
                    );
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(ep.open_connections(), 1);
        client.close();
    };
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the echoes finish");
    // The server notices the close and frees the connection.
    let freed = async {
        while ep.open_connections() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), freed)
        .await
        .expect("the connection is freed after the client closes");
}

/// A shared-driver server and `clients` client hosts on the simulated network, each client on its
/// own 10 Mbit/s, 10 ms link with `loss`; the clients' HTTP/3 connections are open.
struct Sim {
    ep: shared_driver::Endpoint,
    clients: Vec<H3Client>,
    _keep: Vec<quinn::Endpoint>,
}

async fn sim(clients: usize, loss: f64, server_opts: &TransportOptions, max: usize) -> Sim {
    let net = Network::new(7);
    let s = net.add_host("server");
    let pki = DevPki::generate(&[]).unwrap();
    let scfg = server_config(&pki.server, &[ALPN_H3], server_opts).unwrap();
    let ep = shared_driver::Endpoint::server(
        Socket::from(net.bind(s, sa("0.0.0.0:443")).unwrap()),
        scfg,
        &Default::default(),
        Some(1),
        shared_driver::Limits::with_connections(max),
    )
    .unwrap();
    serve(ep.clone());
    let ccfg = client_config(&pki.trust(), &[ALPN_H3], &TransportOptions::default()).unwrap();
    let (mut out, mut keep) = (Vec::new(), Vec::new());
    for k in 0..clients {
        let h = net.add_host(&format!("device{k}"));
        let ci = net
            .add_interface(h, format!("10.0.{k}.2").parse().unwrap())
            .unwrap();
        let si = net
            .add_interface(s, format!("10.0.{k}.1").parse().unwrap())
            .unwrap();
        let link = LinkParams::new(10_000_000, Duration::from_millis(10))
            .with_loss(LossModel::Bernoulli { p: loss });
        net.connect_symmetric(ci, si, link).unwrap();
        let cep = endpoint(
            Socket::from(
                net.bind(h, format!("10.0.{k}.2:0").parse().unwrap())
                    .unwrap(),
            ),
            None,
            Some(10 + k as u64),
        )
        .unwrap();
        if k < max {
            out.push(h3_client(&cep, &ccfg, format!("10.0.{k}.1:443").parse().unwrap()).await);
        } else {
            let refused = connect(
                &cep,
                &ccfg,
                format!("10.0.{k}.1:443").parse().unwrap(),
                "localhost",
                false,
            )
            .await;
            assert!(
                refused.is_err(),
                "connection {k} is beyond the limit of {max}"
            );
        }
        keep.push(cep);
    }
    Sim {
        ep,
        clients: out,
        _keep: keep,
    }
}

#[tokio::test(start_paused = true)]
async fn many_connections_share_one_driver_over_lossy_links_in_virtual_time() {
    let s = sim(8, 0.05, &tight(), 8).await;
    assert_eq!(s.ep.open_connections(), 8);
    let runs = s.clients.iter().enumerate().map(|(k, c)| async move {
        for i in 0..5 {
            let body = Bytes::from(vec![(k * 10 + i) as u8; 10_000 * (i + 1)]);
            let r = c.request(post(i), body.clone(), 1 << 20).await.unwrap();
            assert!(r.body == body, "client {k} request {i}");
        }
        c.close();
    });
    tokio::time::timeout(
        Duration::from_secs(120),
        futures_util::future::join_all(runs),
    )
    .await
    .expect("every request is answered");
    tokio::time::timeout(Duration::from_secs(30), async {
        while s.ep.open_connections() > 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("closed connections are freed");
}

#[tokio::test(start_paused = true)]
async fn refuses_connections_beyond_its_limit() {
    let s = sim(3, 0.0, &TransportOptions::default(), 2).await;
    assert_eq!(s.ep.open_connections(), 2);
    // The admitted ones still work.
    for c in &s.clients {
        let r = c
            .request(post(0), Bytes::from_static(b"hi"), 1024)
            .await
            .unwrap();
        assert_eq!(&r.body[..], b"hi");
    }
}

#[tokio::test(start_paused = true)]
async fn idle_connections_time_out_and_are_freed() {
    let opts = TransportOptions {
        idle_timeout_ms: 2_000,
        ..Default::default()
    };
    let s = sim(2, 0.0, &opts, 4).await;
    assert_eq!(s.ep.open_connections(), 2);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(s.ep.open_connections(), 0, "idle connections end after 2 s");
    let e = s.clients[0]
        .request(post(0), Bytes::new(), 1024)
        .await
        .expect_err("the connection is gone");
    assert!(!e.to_string().is_empty());
}

/// A client host and a server host joined by one 10 Mbit/s link (the client on its A side), a
/// shared-driver server for `alpn` on it (up to 4 connections, seed 1) and a client endpoint
/// (seed 2) with its configuration.
struct OneLink {
    net: Network,
    link: qgate_netsim::LinkId,
    ep: shared_driver::Endpoint,
    cep: quinn::Endpoint,
    ccfg: quinn::ClientConfig,
}

fn one_link(net_seed: u64, delay: Duration, alpn: &[u8]) -> OneLink {
    let net = Network::new(net_seed);
    let (s, c) = (net.add_host("server"), net.add_host("client"));
    let si = net.add_interface(s, "10.0.0.1".parse().unwrap()).unwrap();
    let ci = net.add_interface(c, "10.0.0.2".parse().unwrap()).unwrap();
    let link = net
        .connect_symmetric(ci, si, LinkParams::new(10_000_000, delay))
        .unwrap();
    let pki = DevPki::generate(&[]).unwrap();
    let opts = TransportOptions::default();
    let scfg = server_config(&pki.server, &[alpn], &opts).unwrap();
    let ep = shared_driver::Endpoint::server(
        Socket::from(net.bind(s, sa(SERVER)).unwrap()),
        scfg,
        &opts,
        Some(1),
        shared_driver::Limits::with_connections(4),
    )
    .unwrap();
    let cep = endpoint(
        Socket::from(net.bind(c, sa("10.0.0.2:0")).unwrap()),
        None,
        Some(2),
    )
    .unwrap();
    let ccfg = client_config(&pki.trust(), &[alpn], &opts).unwrap();
    OneLink {
        net,
        link,
        ep,
        cep,
        ccfg,
    }
}

#[tokio::test(start_paused = true)]
async fn a_server_close_reaches_the_client_with_its_code() {
    let OneLink {
        net: _net,
        ep,
        cep,
        ccfg,
        ..
    } = one_link(3, Duration::from_millis(5), b"test");
    let client = connect(&cep, &ccfg, sa(SERVER), "localhost", false)
        .await
        .unwrap();
    let server = ep.accept().await.expect("accepted");
    assert_eq!(server.remote_address().ip(), sa("10.0.0.2:0").ip());
    server.close(7, b"bye");
    let reason = client.connection().closed().await;
    match reason {
        quinn::ConnectionError::ApplicationClosed(c) => {
            assert_eq!(c.error_code, 7u32.into());
            assert_eq!(&c.reason[..], b"bye");
        }
        other => panic!("expected an application close, got {other}"),
    }
    drop(server);
    tokio::time::timeout(Duration::from_secs(10), async {
        while ep.open_connections() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the closed connection drains and is freed");
}

const SERVER: &str = "10.0.0.1:443";

/// With `qlog_dir`, every connection the shared driver accepts writes a qlog file of its own,
/// complete once the connection's state is freed; a client's does too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_connection_writes_its_own_qlog() {
    let dir = std::env::temp_dir().join(format!("qgate-qlog-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let opts = TransportOptions {
        qlog_dir: Some(dir.clone()),
        ..Default::default()
    };
    let pki = DevPki::generate(&[]).unwrap();
    let (ep, addr, cep) = loopback(&pki, &opts);
    let base = client_config(&pki.trust(), &[ALPN_H3], &opts).unwrap();
    for i in 0..2 {
        let ccfg = qgate_transport::client_config_for(&base, &opts, "localhost").unwrap();
        let client = h3_client(&cep, &ccfg, addr).await;
        let r = client
            .request(post(i), Bytes::from_static(b"hi"), 1024)
            .await
            .unwrap();
        assert_eq!(r.body, Bytes::from_static(b"hi"));
        client.close();
    }
    let freed = async {
        while ep.open_connections() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), freed)
        .await
        .expect("freed");
    cep.wait_idle().await;
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), 4, "{names:?}");
    assert!(names[..2]
        .iter()
        .all(|n| n.starts_with("client-localhost-")));
    assert!(names[2..]
        .iter()
        .all(|n| n.starts_with("server-127.0.0.1_")));
    for n in &names[2..] {
        let text = std::fs::read_to_string(dir.join(n)).unwrap();
        assert!(text.contains("transport:packet_received"), "{n}: {text}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A draining endpoint: after `stop_accepting`, an open connection is still served and a new
/// one is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_accepting_keeps_open_connections_and_refuses_new_ones() {
    let pki = DevPki::generate(&[]).unwrap();
    let opts = TransportOptions::default();
    let (ep, addr, cep) = loopback(&pki, &opts);
    let mut copts = opts.clone();
    copts.idle_timeout_ms = 2_000;
    let ccfg = client_config(&pki.trust(), &[ALPN_H3], &copts).unwrap();
    let open = h3_client(&cep, &ccfg, addr).await;
    // Answered: the server has taken the connection (a handshake it has not finished when it
    // stops accepting is refused like a new one).
    let r = open
        .request(post(0), Bytes::from_static(b"first"), 1024)
        .await
        .unwrap();
    assert_eq!(r.body, Bytes::from_static(b"first"));
    ep.stop_accepting();
    let r = open
        .request(post(1), Bytes::from_static(b"still"), 1024)
        .await
        .unwrap();
    assert_eq!(r.body, Bytes::from_static(b"still"));
    let refused = tokio::time::timeout(
        Duration::from_secs(10),
        connect(&cep, &ccfg, addr, "localhost", false),
    )
    .await
    .expect("an answer, not silence");
    assert!(refused.is_err(), "a new connection is refused");
    assert_eq!(ep.open_connections(), 1);
    open.close();
}

/// A client that says GOAWAY (RFC 9114 §5.2) after its last answer: the server's request loop
/// ends and the connection is freed without the client closing it (a loop that kept waiting
/// would hold it until the 30 s idle timeout).
/// (The next test sends GOAWAY before its answer is read.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_goaway_ends_the_connection() {
    let pki = DevPki::generate(&[]).unwrap();
    let opts = TransportOptions::default();
    let (ep, addr, cep) = loopback(&pki, &opts);
    let ccfg = client_config(&pki.trust(), &[ALPN_H3], &opts).unwrap();
    let run = async {
        let conn = connect(&cep, &ccfg, addr, "localhost", false)
            .await
            .unwrap()
            .connection()
            .clone();
        let (mut driver, mut send) = h3::client::builder()
            .build::<_, _, Bytes>(h3_quinn::Connection::new(conn.clone()))
            .await
            .unwrap();
        let mut stream = send.send_request(post(0)).await.unwrap();
        stream.send_data(Bytes::from_static(b"last")).await.unwrap();
        stream.finish().await.unwrap();
        let resp = stream.recv_response().await.unwrap();
        assert_eq!(resp.status(), 200);
        let mut body = Vec::new();
        while let Some(mut chunk) = stream.recv_data().await.unwrap() {
            use bytes::Buf;
            body.extend_from_slice(&chunk.copy_to_bytes(chunk.remaining()));
        }
        assert_eq!(body, b"last");
        assert_eq!(ep.open_connections(), 1);
        driver.shutdown(0).await.unwrap();
        // The server closes the connection: the client never does.
        conn.closed().await;
        while ep.open_connections() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(send);
    };
    tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("the server ends a connection whose client said GOAWAY");
}

/// A client says GOAWAY while its last answer is still on the way, larger than its stream
/// window: the server's request loop ends and the answer's handle is the last one, yet the close
/// waits until the peer has acknowledged the whole answer (decision G19), so the client reads
/// every byte; then the server closes without the client doing so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_goaway_before_the_answer_is_read_loses_none_of_it() {
    let pki = DevPki::generate(&[]).unwrap();
    let (ep, addr, cep) = loopback(&pki, &tight());
    let ccfg = client_config(&pki.trust(), &[ALPN_H3], &tight()).unwrap();
    let run = async {
        let conn = connect(&cep, &ccfg, addr, "localhost", false)
            .await
            .unwrap()
            .connection()
            .clone();
        let (mut driver, mut send) = h3::client::builder()
            .build::<_, _, Bytes>(h3_quinn::Connection::new(conn.clone()))
            .await
            .unwrap();
        let sent: Bytes = (0..200 * 1024).map(|k| (k % 251) as u8).collect();
        let mut stream = send.send_request(post(0)).await.unwrap();
        stream.send_data(sent.clone()).await.unwrap();
        stream.finish().await.unwrap();
        let resp = stream.recv_response().await.unwrap();
        assert_eq!(resp.status(), 200);
        // Most of the answer is held back by the client's 16 KiB stream window.
        driver.shutdown(0).await.unwrap();
        // The client's driver runs on, as `H3Client`'s does: the end of the server's control
        // stream would be a connection error (H3_CLOSED_CRITICAL_STREAM) that loses the answer.
        let ended =
            tokio::spawn(async move { std::future::poll_fn(|cx| driver.poll_close(cx)).await });
        let mut body = Vec::new();
        while let Some(mut chunk) = stream.recv_data().await.unwrap() {
            use bytes::Buf;
            // A slow reader: the server's handles are gone long before the answer is acked.
            tokio::time::sleep(Duration::from_millis(2)).await;
            body.extend_from_slice(&chunk.copy_to_bytes(chunk.remaining()));
        }
        assert_eq!(body.len(), sent.len());
        assert!(body == sent, "the answer arrived intact");
        conn.closed().await;
        let e = ended.await.unwrap();
        assert!(e.is_h3_no_error(), "the server closed gracefully: {e}");
        while ep.open_connections() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(send);
    };
    tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .expect("the whole answer, then the server's close");
}

/// The graceful close's wait is bounded (decision G19): a client says GOAWAY with its request
/// and then hears nothing more (the server-to-client direction goes down while the answer is
/// on its way), so the answer is never acknowledged. The server still holds the connection at
/// 5 s, waiting, and has closed and freed it by 15 s: within its 10 s linger, not at the 30 s
/// idle timeout.
#[tokio::test(start_paused = true)]
async fn a_graceful_close_waits_for_unacknowledged_answers_within_its_linger() {
    let OneLink {
        net,
        link,
        ep,
        cep,
        ccfg,
    } = one_link(5, Duration::from_millis(10), ALPN_H3);
    assert_eq!(TransportOptions::default().idle_timeout_ms, 30_000);
    assert_eq!(
        shared_driver::Limits::DEFAULT.linger,
        Duration::from_secs(10)
    );
    serve(ep.clone());
    let conn = connect(&cep, &ccfg, sa(SERVER), "localhost", false)
        .await
        .unwrap()
        .connection()
        .clone();
    let (mut driver, mut send) = h3::client::builder()
        .build::<_, _, Bytes>(h3_quinn::Connection::new(conn.clone()))
        .await
        .unwrap();
    // Settle the handshake's last packets, then send the request and the GOAWAY together.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t0 = tokio::time::Instant::now();
    let mut stream = send.send_request(post(0)).await.unwrap();
    stream.send_data(Bytes::from_static(b"lost")).await.unwrap();
    stream.finish().await.unwrap();
    driver.shutdown(0).await.unwrap();
    // They reach the server after ~10 ms, and its answer is on the wire until ~20 ms.
    tokio::time::sleep_until(t0 + Duration::from_millis(16)).await;
    let down = |p: &mut LinkParams| p.up = false;
    net.update(link, qgate_netsim::Direction::BtoA, down)
        .unwrap();
    tokio::time::sleep_until(t0 + Duration::from_secs(5)).await;
    assert_eq!(ep.open_connections(), 1, "the close waits for the answer");
    tokio::time::sleep_until(t0 + Duration::from_secs(15)).await;
    assert_eq!(ep.open_connections(), 0, "the wait ends at the linger");
    drop((stream, send, conn));
}

/// A stream reset after it was finished is not waited for (decision G19; quinn-proto reports
/// no `Finished` for it): with nothing acknowledged from then on, the last handle's close goes
/// out at once and the connection is freed long before the 10 s linger.
#[tokio::test(start_paused = true)]
async fn a_stream_reset_after_its_finish_is_not_waited_for() {
    use h3::quic::{Connection as _, SendStream as _};
    let OneLink {
        net,
        link,
        ep,
        cep,
        ccfg,
    } = one_link(6, Duration::from_millis(10), b"test");
    let client = connect(&cep, &ccfg, sa(SERVER), "localhost", false)
        .await
        .unwrap();
    let (mut tx, _rx) = client.connection().open_bi().await.unwrap();
    tx.write_all(b"hi").await.unwrap();
    tx.finish().unwrap();
    let mut conn = ep.accept().await.expect("accepted");
    let mut stream = std::future::poll_fn(|cx| conn.poll_accept_bidi(cx))
        .await
        .unwrap();
    // From now on the client hears nothing, so nothing is acknowledged.
    let down = |p: &mut LinkParams| p.up = false;
    net.update(link, qgate_netsim::Direction::BtoA, down)
        .unwrap();
    let frame = h3::proto::frame::Frame::Data(Bytes::from_static(b"answer"));
    stream.send_data(frame).unwrap();
    std::future::poll_fn(|cx| stream.poll_finish(cx))
        .await
        .unwrap();
    stream.reset(7);
    drop((stream, conn));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(ep.open_connections(), 0, "closed at once, not after 10 s");
    drop(client);
}

/// Holds `/slow` requests for 10 s; echoes the rest at once.
struct Held;

impl Handler for Held {
    async fn handle(&self, req: Request<()>, body: Bytes, _peer: SocketAddr) -> Response<Bytes> {
        if req.uri().path() == "/slow" {
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
        Response::new(body)
    }
}

/// Issue 49 item 6d (decision T14): with 8 request streams per connection, 7 of them held and
/// the 8th answered, the 9th opens at once. quinn-proto announces new stream credit only once
/// an eighth of the limit has ended (2 of 8), so the 9th waited for a held request to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_stream_returns_its_credit_while_the_others_are_held() {
    let pki = DevPki::generate(&[]).unwrap();
    let opts = TransportOptions {
        max_concurrent_bidi_streams: 8,
        ..Default::default()
    };
    let scfg = server_config(&pki.server, &[ALPN_H3], &opts).unwrap();
    let ep = shared_driver::Endpoint::server(
        Socket::bind_udp(sa("127.0.0.1:0")).unwrap(),
        scfg,
        &opts,
        None,
        shared_driver::Limits::with_connections(4),
    )
    .unwrap();
    let addr = ep.local_addr();
    tokio::spawn(async move {
        while let Some(c) = ep.accept().await {
            let peer = c.remote_address();
            tokio::spawn(http3::serve_quic(
                c,
                peer,
                Arc::new(Held),
                ServeLimits::default(),
            ));
        }
    });
    let cep = endpoint(Socket::bind_udp(sa("127.0.0.1:0")).unwrap(), None, None).unwrap();
    let ccfg = client_config(&pki.trust(), &[ALPN_H3], &TransportOptions::default()).unwrap();
    let client = Arc::new(h3_client(&cep, &ccfg, addr).await);
    let req = |path: &str| {
        Request::post(format!("https://localhost{path}"))
            .body(())
            .unwrap()
    };
    let mut held = tokio::task::JoinSet::new();
    for _ in 0..7 {
        let c = client.clone();
        let r = req("/slow");
        held.spawn(async move { c.request(r, Bytes::from_static(b"x"), 64).await });
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The 8th stream, then the 9th, which needs the 8th's credit back.
    for n in [8, 9] {
        let t0 = std::time::Instant::now();
        let r = tokio::time::timeout(
            Duration::from_secs(5),
            client.request(req("/fast"), Bytes::from_static(b"y"), 64),
        )
        .await
        .unwrap_or_else(|_| panic!("stream {n} waited 5 s for credit"))
        .unwrap();
        assert_eq!(&r.body[..], b"y");
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "stream {n} waited {:?} with 7 others held",
            t0.elapsed()
        );
    }
    assert!(held.try_join_next().is_none(), "the 7 are still held");
}
