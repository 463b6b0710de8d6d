//! A request retried with the same `qgate-request-id` is stored once, even when the copies race.

use std::sync::Arc;

use bytes::Bytes;
use qgate_server::{DirSink, IngestService};
use qgate_transport::http3::Handler;

fn req(rid: Option<&str>) -> http::Request<()> {
    let mut b = http::Request::post("https://localhost/ingest/x");
    if let Some(r) = rid {
        b = b.header("qgate-request-id", r);
    }
    b.body(()).unwrap()
}

#[tokio::test]
async fn retried_requests_are_stored_once() {
    let dir = std::env::temp_dir().join(format!("qgate-dedup-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let svc = Arc::new(IngestService::new(Arc::new(DirSink::open(&dir).unwrap())));
    let peer = "10.0.0.1:1".parse().unwrap();
    let body = Bytes::from_static(b"reading");
    let first = svc.handle(req(Some("gw1-7")), body.clone(), peer).await;
    assert_eq!(first.status(), 201);
    let again = svc.handle(req(Some("gw1-7")), body.clone(), peer).await;
    assert_eq!(again.status(), 201);
    assert!(String::from_utf8_lossy(again.body()).contains("\"duplicate\":true"));
    let first_text = String::from_utf8_lossy(first.body()).to_string();
    let expected = first_text.replace('}', ",\"duplicate\":true}");
    assert_eq!(
        String::from_utf8_lossy(again.body()),
        expected,
        "the first copy's id and size"
    );
    // Ten copies at once: one stored.
    let copies = (0..10).map(|_| {
        let (svc, body) = (svc.clone(), body.clone());
        tokio::spawn(async move { svc.handle(req(Some("gw1-8")), body, peer).await.status() })
    });
    for c in copies {
        assert_eq!(c.await.unwrap(), 201);
    }
    // Without an id every request is stored.
    svc.handle(req(None), body.clone(), peer).await;
    svc.handle(req(None), body.clone(), peer).await;
    let s = svc.stats().snapshot();
    assert_eq!((s.ingested, s.duplicates), (4, 10));
    let files = std::fs::read_dir(dir.join("x")).unwrap().count();
    assert_eq!(files, 4);
    // The same id on another stream is another request.
    let other = http::Request::post("https://localhost/ingest/y")
        .header("qgate-request-id", "gw1-7")
        .body(())
        .unwrap();
    let r = svc.handle(other, body.clone(), peer).await;
    assert_eq!(r.status(), 201);
    assert!(!String::from_utf8_lossy(r.body()).contains("duplicate"));
    assert_eq!(svc.stats().snapshot().ingested, 5);
}
