//! Ingest records of one urgency that are ready for the same backhaul connection at once go to
//! the server in one request (decision G23). A forwarded record used to cost the gateway a
//! whole HTTP/3 exchange on the backhaul, as much CPU as the device's own exchange with it;
//! records now share one exchange when several are waiting.
//!
//! Each lane has a [`Batcher`] per urgency (priority records and best-effort ones sent again go
//! at priority's, decision G24, and never wait in a batch behind best effort's bytes), a task
//! fed by a bounded channel: it takes the first record that comes, lets the tasks that are ready run (as the AMQP shim does, decision M31: no timer, so
//! nothing waits for a batch to fill), takes whatever they queued meanwhile, and sends the lot
//! as one `POST /batch` (`qgate_forward::batch`), or a record alone as the request it was. The
//! exchange runs in a task of its own, so the next batch is gathered while this one is out. A
//! `404` or `405` (a server that does not know batches) sends each record again on its own; any
//! other error status (a busy server's `503` with its Retry-After) is each record's; a failed
//! exchange, or a success that is not a batch's answer, fails every record in it, and the
//! forwarding core retries each as before.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use qgate_forward::batch;
use qgate_transport::http3::{H3Client, H3Error, H3Response};
use tokio::sync::{mpsc, oneshot};

use crate::answer::Answer;
use crate::outbound::{self, Facts};

/// Most records in one batch (the server takes up to `qgate_forward::batch::MAX_ENTRIES`).
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

/// One record to forward.
#[derive(Debug, Clone)]
pub struct Record {
    /// Whether it goes at priority's urgency (a priority record, or a best-effort one sent
    /// again; decision G24): each urgency has its own batcher on a lane, so a priority record
    /// never waits in a batch behind best effort's bytes.
    pub urgent: bool,
    /// What the gateway says about it (target, request id, device, path, class).
    pub facts: Facts,
    /// The body.
    pub body: Bytes,
}

struct Pending {
    record: Record,
    reply: oneshot::Sender<Result<Answer, H3Error>>,
}

qgate_core::counters! {
    /// Counts of what the batchers sent.
    pub struct BatchStats => BatchSnapshot {
        /// Batches of more than one record sent.
        batches: counter "qgate_gateway_batches",
            "backhaul requests that carried several records (decision G23)";
        /// Records sent in those batches.
        batched: counter "qgate_gateway_batched_records", "records forwarded in those batches";
        /// Batches answered 404 or 405 (their records went again alone) or with an error status
        /// (each record's answer).
        refused: counter "qgate_gateway_batches_refused",
            "batches the server answered 404 or 405 (their records sent again alone) or with an error status (the answer is each record's)";
    }
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
        let lane = Arc::new(Lane {
            client,
            authority,
            timeout,
            stats,
        });
        tokio::spawn(run(rx, lane));
        Batcher { tx }
    }

    /// Forward `record` (alone or with others) and wait for the server's answer to it.
    pub async fn send(&self, record: Record) -> Result<Answer, H3Error> {
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

struct Lane {
    client: Arc<H3Client>,
    authority: String,
    timeout: Duration,
    stats: Arc<BatchStats>,
}

async fn run(mut rx: mpsc::Receiver<Pending>, lane: Arc<Lane>) {
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

/// What the answer to a `POST /batch` of `sent` records comes to.
#[derive(Debug)]
enum BatchAnswer {
    /// One answer per record, in order.
    Each(Vec<Answer>),
    /// A server that does not know batches (404, 405): each record goes again alone.
    Unknown,
    /// An error status for the whole batch (a busy server's 503): each record's answer.
    Whole(Answer),
    /// No answer to this batch: each record failed, as after a lost exchange.
    Broken(H3Error),
}

/// Classify the answer to a batch of `sent` records (pure: the branches are tested without a
/// network).
fn classify(answer: Result<H3Response, H3Error>, sent: usize) -> BatchAnswer {
    let a = match answer {
        Ok(a) => a,
        Err(e) => return BatchAnswer::Broken(e),
    };
    match a.status {
        StatusCode::OK => match batch::parse_results(&a.body, sent) {
            Ok(results) => BatchAnswer::Each(
                results
                    .iter()
                    .map(|o| Answer::of_result(&a.body, o))
                    .collect(),
            ),
            Err(e) => BatchAnswer::Broken(H3Error::Stream(format!("batch answer: {e}"))),
        },
        StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED => BatchAnswer::Unknown,
        // Another success is no answer to a batch: the records were not known stored.
        s if s.is_success() => BatchAnswer::Broken(H3Error::Stream(format!(
            "batch answered {s}, not 200 with a result per record"
        ))),
        _ => BatchAnswer::Whole(Answer::of_response(a)),
    }
}

/// Send `batch` and hand each record its answer.
async fn exchange(lane: Arc<Lane>, batch: Vec<Pending>) {
    use std::sync::atomic::Ordering::Relaxed;
    if batch.len() == 1 {
        let p = batch.into_iter().next().expect("one record");
        let _ = p.reply.send(send_alone(&lane, p.record).await);
        return;
    }
    let mut body = Vec::with_capacity(
        4 + batch
            .iter()
            .map(|p| p.record.body.len() + p.record.facts.target.len() + 96)
            .sum::<usize>(),
    );
    // One urgency per batcher: the batch goes at its records'.
    let urgency = outbound::urgency(batch[0].record.urgent);
    batch::start_entries(&mut body);
    for p in &batch {
        p.record.facts.emit_entry(&p.record.body, &mut body);
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
    match classify(answer, batch.len()) {
        BatchAnswer::Each(answers) => {
            for (p, a) in batch.into_iter().zip(answers) {
                let _ = p.reply.send(Ok(a));
            }
        }
        BatchAnswer::Unknown => {
            lane.stats.refused.fetch_add(1, Relaxed);
            // The module's name before it was renamed: log filters name it.
            tracing::debug!(
                target: "qgate_gateway::batch",
                records = batch.len(),
                "batch refused; sending its records alone"
            );
            for p in batch {
                let lane = lane.clone();
                tokio::spawn(async move {
                    let _ = p.reply.send(send_alone(&lane, p.record).await);
                });
            }
        }
        // Each record's answer, with its Retry-After: sending them all again at once would
        // pile onto a busy server.
        BatchAnswer::Whole(a) => {
            lane.stats.refused.fetch_add(1, Relaxed);
            for p in batch {
                let _ = p.reply.send(Ok(a.clone()));
            }
        }
        BatchAnswer::Broken(e) => {
            for p in batch {
                let _ = p.reply.send(Err(e.clone()));
            }
        }
    }
}

/// Send one record as the request it was.
async fn send_alone(lane: &Lane, record: Record) -> Result<Answer, H3Error> {
    let req = outbound::request(&http::Method::POST, &lane.authority, &record.facts);
    let urgency = outbound::urgency(record.urgent);
    lane.client
        .request_within_at(urgency, req, record.body, MAX_ANSWER, lane.timeout)
        .await
        .map(Answer::of_response)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(status: u16, body: Vec<u8>) -> Result<H3Response, H3Error> {
        Ok(H3Response {
            status: StatusCode::from_u16(status).unwrap(),
            headers: http::HeaderMap::new(),
            body: Bytes::from(body),
        })
    }

    fn results(n: usize) -> Vec<u8> {
        let mut out = Vec::new();
        batch::start_results(&mut out);
        for i in 0..n {
            let body = format!("{{\"id\":{i}}}");
            batch::emit_result(
                &mut out,
                &batch::Outcome {
                    status: 201,
                    retry_after: None,
                    body: body.as_bytes(),
                },
            );
        }
        out
    }

    #[test]
    fn every_answer_to_a_batch_is_classified() {
        match classify(response(200, results(2)), 2) {
            BatchAnswer::Each(a) => {
                assert_eq!(a.len(), 2);
                assert_eq!(a[1].status, StatusCode::CREATED);
                assert_eq!(&a[1].body[..], b"{\"id\":1}");
            }
            other => panic!("{other:?}"),
        }
        // As many results as records, or none of them is taken for stored.
        assert!(matches!(
            classify(response(200, results(1)), 2),
            BatchAnswer::Broken(_)
        ));
        assert!(matches!(
            classify(response(200, b"garbage".to_vec()), 1),
            BatchAnswer::Broken(_)
        ));
        for unknown in [404, 405] {
            assert!(matches!(
                classify(response(unknown, Vec::new()), 3),
                BatchAnswer::Unknown
            ));
        }
        // A success other than 200 is no batch answer: not one record counts as stored.
        for odd in [201, 204] {
            assert!(matches!(
                classify(response(odd, Vec::new()), 3),
                BatchAnswer::Broken(_)
            ));
        }
        let mut busy = http::HeaderMap::new();
        busy.insert(http::header::RETRY_AFTER, http::HeaderValue::from(2));
        match classify(
            Ok(H3Response {
                status: StatusCode::SERVICE_UNAVAILABLE,
                headers: busy,
                body: Bytes::from_static(b"busy\n"),
            }),
            3,
        ) {
            BatchAnswer::Whole(a) => assert_eq!(a.retry_after, Some(2)),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            classify(Err(H3Error::TimedOut(Duration::from_secs(1))), 3),
            BatchAnswer::Broken(_)
        ));
    }
}
