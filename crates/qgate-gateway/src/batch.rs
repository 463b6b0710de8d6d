//! Ingest records of one urgency that are ready for the same backhaul connection at once go to
//! the server in one request (decision G23). A forwarded record used to cost the gateway a
//! whole HTTP/3 exchange on the backhaul, as much CPU as the device's own exchange with it;
//! records now share one exchange when several are waiting.
//!
//! Each lane has a [`Batcher`] per urgency (priority records and best-effort ones sent again go
//! at priority's, decision G24, and never wait in a batch behind best effort's bytes), a task
//! fed by a bounded channel: it takes the first record that comes, lets the tasks that are ready run (as the AMQP shim does, decision M31: no timer, so
//! nothing waits for a batch to fill), takes whatever they queued meanwhile, and sends the lot
//! as one `POST /batch` (`qgate_core::batch`), or a record alone as the request it was. The
//! exchange runs in a task of its own, so the next batch is gathered while this one is out. A
//! `404` or `405` (a server that does not know batches) sends each record again on its own; any
//! other answer but `200` (a busy server's `503` with its Retry-After) is each record's; a failed
//! exchange fails every record in it, and the forwarding core retries each as before.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use qgate_core::batch::{self, Entry};
use qgate_core::protocol::{DEVICE_HEADER, PATH_HEADER, REQUEST_ID_HEADER};
use qgate_transport::http3::{H3Client, H3Error, H3Response};
use tokio::sync::{mpsc, oneshot};

/// Most records in one batch (the server takes up to `qgate_core::batch::MAX_ENTRIES`).
pub const MAX_RECORDS: usize = 64;
/// A batch stops growing once its bodies reach this many bytes.
pub const MAX_BYTES: usize = 64 * 1024;
/// `[gateway] batch_max_record`'s default: records larger than this go alone. A batch pays
/// most for small records, whose exchange costs more than their bytes, and least for large
/// ones, which delay the others' answers by their bytes (decision G23).
pub const DEFAULT_MAX_RECORD: usize = 4096;
/// Turns of the scheduler the batcher gives the forwarding tasks to queue more records.
const GATHER_ROUNDS: usize = 4;
/// Records queued for a lane before forwarding tasks wait to queue theirs.
const QUEUE: usize = 1024;
/// Largest answer read.
const MAX_ANSWER: usize = 1 << 20;

/// One record to forward, as the headers of a single request would carry it.
#[derive(Debug, Clone)]
pub struct Record {
    /// Whether it goes at priority's urgency (a priority record, or a best-effort one sent
    /// again; decision G24): each urgency has its own batcher on a lane, so a priority record
    /// never waits in a batch behind best effort's bytes.
    pub priority: bool,
    /// The path the device asked for (`/ingest/<name>`).
    pub target: String,
    /// The request id it goes under.
    pub request_id: String,
    /// The device, as the gateway saw it.
    pub device: String,
    /// The backhaul path.
    pub path: usize,
    /// The body.
    pub body: Bytes,
}

impl Record {
    /// Whether a request may go in a batch: a `POST /ingest…`.
    pub fn batchable(method: &http::Method, target: &str) -> bool {
        method == http::Method::POST && target.starts_with("/ingest")
    }

    /// The single request this record would be.
    fn request(&self, authority: &str) -> Request<()> {
        Request::builder()
            .method(http::Method::POST)
            .uri(format!("https://{authority}{}", self.target))
            .header(REQUEST_ID_HEADER, self.request_id.as_str())
            .header(DEVICE_HEADER, self.device.as_str())
            .header(PATH_HEADER, self.path)
            .body(())
            .expect("valid request")
    }
}

struct Pending {
    record: Record,
    reply: oneshot::Sender<Result<H3Response, H3Error>>,
}

/// Counts of what the batchers sent.
#[derive(Debug, Default)]
pub struct BatchStats {
    /// Batches of more than one record sent.
    pub batches: std::sync::atomic::AtomicU64,
    /// Records sent in those batches.
    pub batched: std::sync::atomic::AtomicU64,
    /// Batches answered other than `200`, whose records went again alone.
    pub refused: std::sync::atomic::AtomicU64,
}

/// One lane's batcher; its task ends when the last handle is dropped (the lane's client was
/// replaced) and the records already queued have gone.
#[derive(Clone)]
pub struct Batcher {
    tx: mpsc::Sender<Pending>,
}

impl Batcher {
    /// A batcher sending on `client` to the server named `authority`, each exchange within
    /// `timeout`.
    pub fn new(
        client: Arc<H3Client>,
        authority: String,
        timeout: Duration,
        stats: Arc<BatchStats>,
    ) -> Batcher {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(run(
            rx,
            Lane {
                client,
                authority,
                timeout,
                stats,
            },
        ));
        Batcher { tx }
    }

    /// Forward `record` (alone or with others) and wait for the server's answer to it.
    pub async fn send(&self, record: Record) -> Result<H3Response, H3Error> {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Pending { record, reply })
            .await
            .map_err(|_| H3Error::Connection("the lane's batcher has stopped".into()))?;
        answer
            .await
            .unwrap_or_else(|_| Err(H3Error::Connection("the lane's batcher has stopped".into())))
    }
}

#[derive(Clone)]
struct Lane {
    client: Arc<H3Client>,
    authority: String,
    timeout: Duration,
    stats: Arc<BatchStats>,
}

async fn run(mut rx: mpsc::Receiver<Pending>, lane: Lane) {
    while let Some(first) = rx.recv().await {
        let mut bytes = first.record.body.len();
        let mut batch = vec![first];
        for _ in 0..GATHER_ROUNDS {
            if batch.len() >= MAX_RECORDS || bytes >= MAX_BYTES {
                break;
            }
            tokio::task::yield_now().await;
            let before = batch.len();
            while batch.len() < MAX_RECORDS && bytes < MAX_BYTES {
                match rx.try_recv() {
                    Ok(p) => {
                        bytes += p.record.body.len();
                        batch.push(p);
                    }
                    Err(_) => break,
                }
            }
            if batch.len() == before {
                break;
            }
        }
        tokio::spawn(exchange(lane.clone(), batch));
    }
}

/// Send `batch` and hand each record its answer.
async fn exchange(lane: Lane, batch: Vec<Pending>) {
    use std::sync::atomic::Ordering::Relaxed;
    if batch.len() == 1 {
        return alone(&lane, batch.into_iter().next().expect("one record")).await;
    }
    let mut body = Vec::with_capacity(
        4 + batch
            .iter()
            .map(|p| p.record.body.len() + p.record.target.len() + 96)
            .sum::<usize>(),
    );
    // One urgency per batcher: the batch goes at its records'.
    let urgency = crate::gateway::urgency(batch[0].record.priority);
    batch::start_entries(&mut body);
    for p in &batch {
        let r = &p.record;
        batch::emit_entry(
            &mut body,
            &Entry {
                target: r.target.as_bytes(),
                request_id: Some(r.request_id.as_bytes()),
                device: Some(r.device.as_bytes()),
                path: u16::try_from(r.path).ok(),
                body: &r.body,
            },
        );
    }
    lane.stats.batches.fetch_add(1, Relaxed);
    lane.stats.batched.fetch_add(batch.len() as u64, Relaxed);
    let req = Request::builder()
        .method(http::Method::POST)
        .uri(format!("https://{}{}", lane.authority, batch::BATCH_PATH))
        .body(())
        .expect("valid request");
    let answer = lane
        .client
        .request_within_at(urgency, req, Bytes::from(body), MAX_ANSWER, lane.timeout)
        .await;
    match answer {
        Ok(a) if a.status == StatusCode::OK => {
            match batch::parse_results(&a.body, batch.len()) {
                Ok(results) => {
                    for (p, o) in batch.into_iter().zip(results) {
                        let _ = p.reply.send(Ok(answer_of(&o)));
                    }
                }
                Err(e) => {
                    // Not an answer to this batch: each record is retried as after a lost one.
                    let e = H3Error::Stream(format!("batch answer: {e}"));
                    for p in batch {
                        let _ = p.reply.send(Err(e.clone()));
                    }
                }
            }
        }
        // A server that does not know batches: each record as the request it was.
        Ok(a)
            if matches!(
                a.status,
                StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED
            ) =>
        {
            lane.stats.refused.fetch_add(1, Relaxed);
            tracing::debug!(status = %a.status, records = batch.len(), "batch refused; sending its records alone");
            for p in batch {
                let lane = lane.clone();
                tokio::spawn(async move { alone(&lane, p).await });
            }
        }
        // Anything else (a server that is busy, a bad batch) is each record's answer, with its
        // Retry-After: sending them all again at once would pile onto a busy server.
        Ok(a) => {
            lane.stats.refused.fetch_add(1, Relaxed);
            for p in batch {
                let _ = p.reply.send(Ok(a.clone()));
            }
        }
        Err(e) => {
            for p in batch {
                let _ = p.reply.send(Err(e.clone()));
            }
        }
    }
}

/// Send one record as the request it was.
async fn alone(lane: &Lane, p: Pending) {
    let req = p.record.request(&lane.authority);
    let urgency = crate::gateway::urgency(p.record.priority);
    let answer = lane
        .client
        .request_within_at(urgency, req, p.record.body, MAX_ANSWER, lane.timeout)
        .await;
    let _ = p.reply.send(answer);
}

/// One record's result as the answer a single request would have had.
fn answer_of(o: &batch::Outcome<'_>) -> H3Response {
    let mut headers = http::HeaderMap::new();
    if let Some(s) = o.retry_after {
        headers.insert(http::header::RETRY_AFTER, http::HeaderValue::from(s));
    }
    H3Response {
        status: StatusCode::from_u16(o.status).unwrap_or(StatusCode::BAD_GATEWAY),
        headers,
        body: Bytes::copy_from_slice(o.body),
    }
}
