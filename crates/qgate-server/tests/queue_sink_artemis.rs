//! The queue sink into Apache ActiveMQ Artemis 2.44 (tools/artemis, journalling to disk), killed
//! with SIGKILL mid-run and started again where it was: every body the server acknowledged is
//! on Artemis's queue afterwards, with its request id as message-id. `.ci/run` sets
//! QGATE_INTEROP=1, so an Artemis that does not build or start fails the suite there.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use fe2o3_amqp::types::messaging::{Body, MessageId};
use fe2o3_amqp::types::primitives::{SimpleValue, Value};
use qgate_amqp::artemis::{self, Artemis};
use qgate_amqp::client::Connector;
use qgate_amqp::transport::Scheme;
use qgate_server::{IngestService, QueueSink, QueueSinkConfig, Sink, Upstream};
use qgate_transport::http3::Handler;

async fn start(port: Option<u16>, data: &std::path::Path) -> Option<Artemis> {
    let data = data.to_path_buf();
    match tokio::task::spawn_blocking(move || {
        artemis::start_with(&artemis::default_dir(), port, Some(&data))
    })
    .await
    {
        Ok(Ok(a)) => Some(a),
        other => {
            assert!(
                std::env::var_os("QGATE_INTEROP").is_none(),
                "QGATE_INTEROP is set but Artemis does not start: {:?}",
                other.map(|r| r.err())
            );
            None
        }
    }
}

const POSTERS: usize = 4;
const EACH: usize = 150;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_acknowledged_is_lost_when_artemis_is_killed_mid_run() {
    let data = std::env::temp_dir().join(format!("qgate-artemis-sink-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let Some(first) = start(None, &data).await else {
        eprintln!("skipped: Maven or Artemis unavailable");
        return;
    };
    let addr = first.addr;
    let opts = qgate_amqp::client::with_idle_timeout(&Default::default(), Duration::from_secs(2));
    let connector = || {
        Connector::new(
            Scheme::Tcp,
            addr,
            "localhost",
            &Default::default(),
            None,
            None,
            &opts,
        )
        .unwrap()
    };
    let cfg = QueueSinkConfig {
        delivery_timeout: Duration::from_secs(3),
        max_backoff: Duration::from_millis(300),
        ..Default::default()
    };
    let sink = QueueSink::start(
        Upstream::Connector(connector()),
        "qgate.ingest",
        "artemis",
        cfg,
        1,
    );
    while !sink.is_up() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let svc = Arc::new(IngestService::new(Sink::Queue(sink)));
    let acked = Arc::new(Mutex::new(HashSet::new()));
    let refused = Arc::new(std::sync::atomic::AtomicU64::new(0));
    // Posters retry a refused request with the same id until it is acknowledged (a gateway's
    // retries within its budget keep the id; a device's later retry is a new request).
    let posters: Vec<_> = (0..POSTERS)
        .map(|p| {
            let (svc, acked, refused) = (svc.clone(), acked.clone(), refused.clone());
            tokio::spawn(async move {
                for i in 0..EACH {
                    let rid = format!("p{p}-{i}");
                    loop {
                        let req = http::Request::post("https://localhost/ingest/meters")
                            .header("qgate-request-id", rid.as_str())
                            .header("qgate-device", format!("dev-{p}"))
                            .body(())
                            .unwrap();
                        let r = svc
                            .handle(req, Bytes::from(rid.clone()), "10.0.0.1:1".parse().unwrap())
                            .await;
                        if r.status() == 201 {
                            acked.lock().unwrap().insert(rid.clone());
                            break;
                        }
                        assert_eq!(r.status(), 503, "{:?}", r.body());
                        refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            })
        })
        .collect();
    // Kill it once a third is in, start it again on the same port and journal.
    while acked.lock().unwrap().len() < POSTERS * EACH / 3 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let at_kill = acked.lock().unwrap().len();
    tokio::task::spawn_blocking(move || drop(first))
        .await
        .unwrap();
    let second = start(Some(addr.port()), &data)
        .await
        .expect("Artemis restarts");
    for p in posters {
        tokio::time::timeout(Duration::from_secs(120), p)
            .await
            .expect("every poster finishes once Artemis is back")
            .unwrap();
    }
    let refused = refused.load(std::sync::atomic::Ordering::Relaxed);
    assert!(at_kill < POSTERS * EACH, "the kill came mid-run");
    assert!(refused > 0, "requests were refused while Artemis was down");

    // Every acknowledged id is on the queue (a message in flight at the kill may be there twice:
    // at least once).
    let (mut client, _) = connector().open().await.unwrap();
    let mut rx = client
        .receiver("check", "qgate.ingest", false, 200)
        .await
        .unwrap();
    let mut seen: HashMap<String, usize> = HashMap::new();
    while let Ok(Ok(d)) =
        tokio::time::timeout(Duration::from_secs(2), rx.recv::<Body<Value>>()).await
    {
        let id = match d
            .message()
            .properties
            .as_ref()
            .and_then(|p| p.message_id.clone())
        {
            Some(MessageId::String(s)) => s,
            other => panic!("message-id {other:?}"),
        };
        let props = d.message().application_properties.as_ref().unwrap();
        assert_eq!(
            props.0.get("stream"),
            Some(&SimpleValue::String("meters".into()))
        );
        if let Body::Data(b) = d.body() {
            assert_eq!(
                b.iter().flat_map(|x| x.0.to_vec()).collect::<Vec<_>>(),
                id.as_bytes()
            );
        }
        rx.accept(&d).await.unwrap();
        *seen.entry(id).or_default() += 1;
    }
    let _ = rx.close().await;
    client.close().await;
    let acked = acked.lock().unwrap().clone();
    assert_eq!(acked.len(), POSTERS * EACH);
    let lost: Vec<_> = acked.iter().filter(|r| !seen.contains_key(*r)).collect();
    let twice = seen.values().filter(|n| **n > 1).count();
    eprintln!(
        "killed after {at_kill} acknowledged; {refused} refusals while down; {} distinct on the queue, {twice} twice, {} lost",
        seen.len(),
        lost.len()
    );
    assert!(lost.is_empty(), "acknowledged but lost: {lost:?}");
    drop(second);
    let _ = std::fs::remove_dir_all(&data);
}
