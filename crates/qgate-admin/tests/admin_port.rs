//! The admin port as its peers see it: the routes, the token, and hostile clients (slow
//! headers, idle connections, oversized and garbage bodies).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::{Method, StatusCode};
use qgate_admin::{
    Admin, AdminClient, AdminLimits, Api, ApiError, Call, Reply, Route, RunningAdmin, Token,
};
use qgate_core::metrics::{self, Collector, DescriptorEncoder};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A counter the API can bump, exposed as a metric too.
#[derive(Debug, Clone, Default)]
struct Clicks(Arc<AtomicU64>);

impl Collector for Clicks {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        metrics::counter(
            &mut e,
            "test_clicks",
            "clicks",
            self.0.load(Ordering::Relaxed),
        )
    }
}

impl Api for Clicks {
    fn routes(&self) -> Vec<Route> {
        vec![Route {
            method: "POST",
            path: "click",
            about: "count one",
        }]
    }

    fn call<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            match (call.method, call.path.as_slice()) {
                (&Method::POST, ["click"]) => {
                    let by = call.body.get("by").and_then(Value::as_u64).unwrap_or(1);
                    Ok(json!({ "clicks": self.0.fetch_add(by, Ordering::Relaxed) + by }))
                }
                (&Method::GET, ["fail"]) => Err(ApiError::conflict("not now")),
                _ => Err(call.no_route()),
            }
        })
    }

    fn health(&self) -> Result<(), String> {
        if self.0.load(Ordering::Relaxed) >= 100 {
            Err("too many clicks".into())
        } else {
            Ok(())
        }
    }
}

const TOKEN: &str = "0123456789abcdef-test";

async fn start(token: Option<&str>, limits: AdminLimits) -> (RunningAdmin, Clicks) {
    let c = Clicks::default();
    let admin = Admin::builder()
        .metrics(c.clone())
        .api(c.clone())
        .token(token.map(|t| Token::new(t).unwrap()))
        .limits(limits)
        .bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    (admin, c)
}

fn client(a: &RunningAdmin, token: Option<&str>) -> AdminClient {
    AdminClient::new(&a.addr().to_string(), token.map(|t| Token::new(t).unwrap())).unwrap()
}

#[tokio::test]
async fn routes_answer_and_the_token_guards_all_but_health() {
    let (a, _c) = start(Some(TOKEN), AdminLimits::default()).await;
    let anon = client(&a, None);
    let wrong = client(&a, Some("0123456789abcdef-nope"));
    let ok = client(&a, Some(TOKEN));
    let (s, b) = anon.request(Method::GET, "/health", None).await.unwrap();
    assert_eq!((s, &b[..]), (StatusCode::OK, &b"ok\n"[..]));
    for c in [&anon, &wrong] {
        for (m, p) in [
            (Method::GET, "/metrics"),
            (Method::GET, "/api"),
            (Method::POST, "/api/click"),
        ] {
            let (s, _) = c.request(m, p, None).await.unwrap();
            assert_eq!(s, StatusCode::UNAUTHORIZED, "{p}");
        }
    }
    let (s, b) = ok
        .request(Method::POST, "/api/click", Some(&json!({"by": 3})))
        .await
        .unwrap();
    assert_eq!(s, StatusCode::OK);
    assert_eq!(serde_json::from_slice::<Value>(&b).unwrap()["clicks"], 3);
    let (s, b) = ok.request(Method::GET, "/metrics", None).await.unwrap();
    let text = String::from_utf8(b.to_vec()).unwrap();
    assert_eq!(s, StatusCode::OK);
    assert!(text.contains("test_clicks_total 3\n"), "{text}");
    let (s, b) = ok.request(Method::GET, "/api", None).await.unwrap();
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        serde_json::from_slice::<Value>(&b).unwrap()[0]["path"],
        "click"
    );
    let (s, b) = ok.request(Method::GET, "/api/fail", None).await.unwrap();
    assert_eq!(s, StatusCode::CONFLICT);
    assert!(String::from_utf8_lossy(&b).contains("not now"));
    let (s, b) = ok
        .request(Method::GET, "/api/nothing/here", None)
        .await
        .unwrap();
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(String::from_utf8_lossy(&b).contains("GET /api lists them"));
    let (s, b) = ok
        .request(Method::DELETE, "/api/click", None)
        .await
        .unwrap();
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
    assert!(String::from_utf8_lossy(&b).contains("GET, POST"));
    let (s, b) = ok.request(Method::GET, "/", None).await.unwrap();
    assert_eq!(s, StatusCode::OK);
    assert!(String::from_utf8_lossy(&b).contains("/api/click"));
    // Health follows the daemon.
    ok.request(Method::POST, "/api/click", Some(&json!({"by": 100})))
        .await
        .unwrap();
    let (s, b) = anon.request(Method::GET, "/health", None).await.unwrap();
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(&b[..], b"too many clicks\n");
}

#[tokio::test]
async fn without_a_token_only_loopback_may_listen() {
    let err = Admin::builder()
        .bind("0.0.0.0:0".parse().unwrap())
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("token"), "{err}");
    assert!(Admin::builder()
        .token(Some(Token::new(TOKEN).unwrap()))
        .bind("0.0.0.0:0".parse().unwrap())
        .await
        .is_ok());
}

#[tokio::test]
async fn bad_bodies_get_clear_errors() {
    let limits = AdminLimits {
        max_body: 1024,
        ..Default::default()
    };
    let (a, c) = start(None, limits).await;
    let cl = client(&a, None);
    let big = json!({ "by": 1, "pad": "x".repeat(2000) });
    let (s, _) = cl
        .request(Method::POST, "/api/click", Some(&big))
        .await
        .unwrap();
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    // Garbage, and a body that lies about its length being chunked past the limit.
    let mut raw = TcpStream::connect(a.addr()).await.unwrap();
    raw.write_all(b"POST /api/click HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 5\r\n\r\n{nope")
        .await
        .unwrap();
    let got = read_some(&mut raw).await;
    assert!(got.starts_with("HTTP/1.1 400"), "{got}");
    assert!(got.contains("not JSON"), "{got}");
    let mut raw = TcpStream::connect(a.addr()).await.unwrap();
    raw.write_all(b"POST /api/click HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    for _ in 0..3 {
        raw.write_all(b"200\r\n").await.unwrap();
        raw.write_all(&[b' '; 0x200]).await.unwrap();
        raw.write_all(b"\r\n").await.unwrap();
    }
    let got = read_some(&mut raw).await;
    assert!(got.starts_with("HTTP/1.1 413"), "{got}");
    let mut raw = TcpStream::connect(a.addr()).await.unwrap();
    raw.write_all(b"\x16\x03\x01garbage that is not HTTP\r\n\r\n")
        .await
        .unwrap();
    let got = read_some(&mut raw).await;
    assert!(got.is_empty() || got.starts_with("HTTP/1.1 400"), "{got}");
    assert_eq!(c.0.load(Ordering::Relaxed), 0, "nothing was acted on");
}

/// A web page in the operator's browser cannot drive a token-less admin port: a POST without
/// the JSON content type (what a page may send without asking), a foreign Origin, or a Host
/// that is not loopback (DNS rebinding) is refused, and nothing is acted on.
#[tokio::test]
async fn browsers_on_other_origins_are_refused() {
    let (a, c) = start(None, AdminLimits::default()).await;
    let port = a.addr().port();
    for (req, status) in [
        (format!("POST /api/click HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\n{{}}"), "415"),
        (format!("POST /api/click HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\norigin: http://evil.example\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{{}}"), "403"),
        (format!("GET /api HTTP/1.1\r\nhost: evil.example:{port}\r\n\r\n"), "403"),
        (format!("POST /api/click HTTP/1.1\r\nhost: rebound.example:{port}\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{{}}"), "403"),
    ] {
        let mut raw = TcpStream::connect(a.addr()).await.unwrap();
        raw.write_all(req.as_bytes()).await.unwrap();
        let got = read_some(&mut raw).await;
        assert!(got.starts_with(&format!("HTTP/1.1 {status}")), "{req}\n→ {got}");
    }
    assert_eq!(c.0.load(Ordering::Relaxed), 0, "nothing was acted on");
    // The port's own origin is fine.
    let mut raw = TcpStream::connect(a.addr()).await.unwrap();
    raw.write_all(format!("POST /api/click HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\norigin: http://127.0.0.1:{port}\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n").as_bytes()).await.unwrap();
    let got = read_some(&mut raw).await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert_eq!(c.0.load(Ordering::Relaxed), 1);
}

/// Read what arrives until the peer closes or pauses for 2 s.
async fn read_some(s: &mut TcpStream) -> String {
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = Vec::new();
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
        if got.windows(4).any(|w| w == b"\r\n\r\n") && got.ends_with(b"\n") {
            break;
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// The slots are taken before any token is checked, so one client (an address, or an IPv6
/// /64) holds at most its share of them: the operator from another address still gets in
/// (decision S10).
#[tokio::test]
async fn one_client_cannot_take_every_slot() {
    let limits = AdminLimits {
        max_connections: 8,
        max_connections_per_client: 2,
        ..Default::default()
    };
    let (a, _c) = start(None, limits).await;
    let from = |ip: &str| {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind(format!("{ip}:0").parse().unwrap()).unwrap();
        s.connect(a.addr())
    };
    let _held = [
        from("127.0.0.2").await.unwrap(),
        from("127.0.0.2").await.unwrap(),
    ];
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut third = from("127.0.0.2").await.unwrap();
    assert_eq!(read_some(&mut third).await, "", "closed without an answer");
    assert_eq!(a.refused(), 1);
    let (status, _) = client(&a, None)
        .request(Method::GET, "/metrics", None)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
}

/// Slow or silent peers lose their connection at a deadline; the slots they held come back,
/// and a flood of idle connections leaves room for the operator once they are cut.
#[tokio::test]
async fn idle_and_slow_peers_are_cut_and_their_slots_freed() {
    let limits = AdminLimits {
        max_connections: 4,
        header_timeout: Duration::from_millis(300),
        connection_lifetime: Duration::from_millis(1500),
        ..Default::default()
    };
    let (a, _c) = start(None, limits).await;
    // Four silent connections take every slot; a fifth is closed on accept.
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(TcpStream::connect(a.addr()).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut extra = TcpStream::connect(a.addr()).await.unwrap();
    assert_eq!(read_some(&mut extra).await, "", "closed without an answer");
    assert!(a.refused() >= 1);
    // A slowloris sending one header byte at a time is cut at the header deadline.
    for s in &mut idle {
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nho").await;
    }
    let t0 = tokio::time::Instant::now();
    for s in &mut idle {
        let mut b = [0u8; 256];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut b))
            .await
            .expect("closed within the deadline")
            .unwrap_or(0);
        // hyper may answer 408 before closing.
        assert!(n == 0 || b.starts_with(b"HTTP/1.1 408"), "{:?}", &b[..n]);
    }
    assert!(t0.elapsed() < Duration::from_secs(3));
    // The slots are back: the operator gets an answer.
    let cl = client(&a, None);
    let mut answered = None;
    for _ in 0..50 {
        if let Ok((StatusCode::OK, body)) = cl.request(Method::GET, "/metrics", None).await {
            answered = Some(String::from_utf8_lossy(&body).into_owned());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let text = answered.expect("the operator gets through");
    // The refusals are counted where Prometheus sees them.
    let refused = text
        .lines()
        .find_map(|l| l.strip_prefix("qgate_admin_connections_refused_total "))
        .and_then(|v| v.parse::<u64>().ok())
        .expect(&text);
    assert!(refused >= 1, "{text}");
    // A keep-alive connection that keeps asking is still closed at the end of its life.
    let mut ka = TcpStream::connect(a.addr()).await.unwrap();
    let t0 = tokio::time::Instant::now();
    loop {
        if ka
            .write_all(b"GET /health HTTP/1.1\r\nhost: localhost\r\n\r\n")
            .await
            .is_err()
        {
            break;
        }
        let mut b = [0u8; 512];
        match tokio::time::timeout(Duration::from_secs(3), ka.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(_)) => {}
            Err(_) => panic!("no answer and no close"),
        }
        assert!(t0.elapsed() < Duration::from_secs(4), "never closed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(t0.elapsed() >= Duration::from_millis(1400));
}
