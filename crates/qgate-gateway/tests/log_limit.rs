//! Warnings a peer can provoke are rate-limited (issue 18 item 5, decision G11): one WARN line
//! per refused request wrote 89 MB in three minutes before.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{assert_metrics, metrics, send, world};

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn refusals_do_not_flood_the_log() {
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .finish();
    // The process-wide subscriber: this binary holds this one test, so no other thread can
    // settle the log call sites' interest before it is installed (a thread-local subscriber
    // missed events when tests ran in parallel).
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let w = world(1, "adaptive").await;
    for _ in 0..300 {
        assert_eq!(send(&w.devices[0], "nope").await.0, 400);
    }
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let lines = text
        .lines()
        .filter(|l| l.contains("request refused"))
        .count();
    assert!(lines <= 10, "{lines} lines:\n{text}");
    assert!(lines > 0, "the first refusals are logged");
    let m = metrics(&w).await;
    assert_metrics(
        &m,
        &[
            "qgate_gateway_refused_total 300",
            &format!("qgate_gateway_log_lines_suppressed_total {}", 300 - lines),
        ],
    );
    // A minute later the next line says how many were left out.
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(send(&w.devices[0], "nope").await.0, 400);
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.contains(&format!("suppressed={}", 300 - lines)),
        "{text}"
    );
}
