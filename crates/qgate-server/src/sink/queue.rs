//! Ingest into an AMQP 1.0 queue: each body becomes a durable message on one sender link, and the
//! device's request is answered only once the broker has accepted it (at least once, decision
//! S5). Works with `qgate broker` and any AMQP 1.0 broker (Artemis, RabbitMQ 4).
//!
//! One task owns the connection and the link; requests reach it through a queue bounded in
//! messages and in bytes, and get their outcome back. Transfers are pipelined (up to `window`
//! unsettled), so throughput is not one broker round trip per message. While the link is down
//! (connecting, backing off) a request fails at once with [`SinkError::Unavailable`]; a request
//! gets an answer within `answer_timeout` whatever the broker does, below the gateway's own
//! request timeout so a broker outage is never taken for a dead backhaul path. A link that
//! settles nothing for `delivery_timeout` is torn down and opened again, failing what it held
//! (never acknowledged, so nothing acknowledged is lost). The broker's host is resolved again at
//! every connection attempt, and every address it has is tried.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fe2o3_amqp::link::SendError;
use fe2o3_amqp::types::messaging::{
    ApplicationProperties, Body, Data, Header, Message, MessageId, Outcome, Properties,
};
use fe2o3_amqp::types::primitives::{Binary, Value};
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use qgate_amqp_client::client::{bounded, quic_closed};
pub use qgate_amqp_client::url::Upstream;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::{Record, Sink, SinkError, Stored, UpstreamView};

/// How the queue sink behaves; every default lives here.
#[derive(Debug, Clone)]
pub struct QueueSinkConfig {
    /// Most messages sent and not yet settled by the broker.
    pub window: usize,
    /// Most requests waiting for the sender.
    pub backlog: usize,
    /// Most body bytes waiting for the sender or unsettled.
    pub backlog_bytes: usize,
    /// A request is answered within this long (503 if the broker has not accepted by then):
    /// below the gateway's request timeout (5 s).
    pub answer_timeout: Duration,
    /// The link is torn down and opened again when the broker settles nothing for this long
    /// with messages outstanding (checked every quarter of it), and a connection attempt
    /// gives up after it.
    pub delivery_timeout: Duration,
    /// Longest pause between reconnection attempts (they start at 100 ms and double).
    pub max_backoff: Duration,
    /// The sender link's name.
    pub link_name: String,
}

impl Default for QueueSinkConfig {
    fn default() -> Self {
        QueueSinkConfig {
            window: 256,
            backlog: 4096,
            backlog_bytes: 64 << 20,
            answer_timeout: Duration::from_secs(4),
            delivery_timeout: Duration::from_secs(10),
            max_backoff: Duration::from_secs(5),
            link_name: "qgate-server".into(),
        }
    }
}

/// What the sink has done (for the admin port's metrics and API, and the demo).
#[derive(Debug, Default)]
pub struct QueueSinkStats {
    /// Messages the broker accepted.
    pub accepted: AtomicU64,
    /// Requests answered with an error (refused, timed out, connection lost, unreachable).
    pub failed: AtomicU64,
    /// Connections opened to the broker (the first included).
    pub connects: AtomicU64,
}

/// Why one message was not accepted.
enum Failure {
    /// Try again later (503).
    Transient(String),
    /// Larger than the broker takes (413).
    TooLarge(String),
    /// The broker refused it for good (500).
    Refused(String),
}

struct Job {
    msg: Message<Body<Value>>,
    reply: oneshot::Sender<Result<(), Failure>>,
    /// Its share of the byte budget, held until it is settled.
    _bytes: OwnedSemaphorePermit,
}

/// The sink; see the module docs.
pub struct QueueSink {
    jobs: mpsc::Sender<Job>,
    bytes: Arc<Semaphore>,
    instance: u64,
    next: AtomicU64,
    cfg: QueueSinkConfig,
    stats: Arc<QueueSinkStats>,
    up: Arc<AtomicBool>,
}

impl std::fmt::Debug for QueueSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QueueSink")
    }
}

impl QueueSink {
    /// Start sending to `address` on `upstream` (on the current tokio runtime); `target` names
    /// the broker and queue in the server's logs (no password); response ids start at
    /// `first_id`.
    pub fn start(
        upstream: Upstream,
        address: &str,
        target: &str,
        cfg: QueueSinkConfig,
        first_id: u64,
    ) -> QueueSink {
        let (tx, rx) = mpsc::channel(cfg.backlog.max(1));
        let stats = Arc::new(QueueSinkStats::default());
        let up = Arc::new(AtomicBool::new(false));
        tokio::spawn(run(
            upstream,
            address.to_string(),
            target.to_string(),
            cfg.clone(),
            rx,
            stats.clone(),
            up.clone(),
        ));
        QueueSink {
            jobs: tx,
            bytes: Arc::new(Semaphore::new(cfg.backlog_bytes.max(1))),
            instance: qgate_amqp_client::client::run_id(),
            next: AtomicU64::new(first_id.max(1)),
            cfg,
            stats,
            up,
        }
    }

    /// The sink's counters.
    pub fn stats(&self) -> Arc<QueueSinkStats> {
        self.stats.clone()
    }

    /// The link to the broker is attached now.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Send `rec` and wait for the broker's accept; returns the response id.
    async fn deliver(&self, rec: &Record<'_>) -> Result<u64, SinkError> {
        let fail = |e: SinkError| {
            self.stats.failed.fetch_add(1, Ordering::Relaxed);
            e
        };
        let unavailable = |why: &str| fail(SinkError::Unavailable(format!("queue: {why}")));
        // Nothing is sent while the link is down: the device retries later (no duplicate).
        if !self.is_up() {
            return Err(unavailable("the broker is unreachable now"));
        }
        let size = u32::try_from(rec.body.len())
            .ok()
            .filter(|n| (*n as usize) <= self.cfg.backlog_bytes)
            .ok_or_else(|| fail(SinkError::TooLarge("queue: the body is too large".into())))?;
        let permit = self
            .bytes
            .clone()
            .try_acquire_many_owned(size.max(1))
            .map_err(|_| unavailable("too many bytes waiting for the broker"))?;
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let message_id = match rec.request_id {
            Some(r) => r.to_string(),
            // A direct request without an id: unique across restarts by the random instance.
            None => format!("{:016x}-{id}", self.instance),
        };
        let (reply, answer) = oneshot::channel();
        self.jobs
            .try_send(Job {
                msg: message(rec, message_id),
                reply,
                _bytes: permit,
            })
            .map_err(|_| unavailable("too many messages waiting for the broker"))?;
        match tokio::time::timeout(self.cfg.answer_timeout, answer).await {
            Ok(Ok(Ok(()))) => {
                self.stats.accepted.fetch_add(1, Ordering::Relaxed);
                Ok(id)
            }
            Ok(Ok(Err(Failure::Transient(why)))) => Err(unavailable(&why)),
            Ok(Ok(Err(Failure::TooLarge(why)))) => {
                Err(fail(SinkError::TooLarge(format!("queue: {why}"))))
            }
            Ok(Ok(Err(Failure::Refused(why)))) => {
                Err(fail(SinkError::Refused(format!("queue: {why}"))))
            }
            Ok(Err(_)) => Err(unavailable(
                "the broker connection ended before the message was accepted",
            )),
            // It may still be accepted later: at least once (its retry is a new request).
            Err(_) => Err(unavailable("the broker did not accept in time")),
        }
    }
}

impl Sink for QueueSink {
    fn store<'a>(&'a self, rec: &'a Record<'a>) -> Stored<'a> {
        Box::pin(self.deliver(rec))
    }

    fn upstream(&self) -> Option<UpstreamView> {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Some(UpstreamView {
            up: self.is_up(),
            accepted: r(&self.stats.accepted),
            failed: r(&self.stats.failed),
            connects: r(&self.stats.connects),
        })
    }
}

/// The message for `rec`: durable (so an external broker stores it), the request id as
/// message-id, device, stream, path and class (`priority` or `best-effort`) as application
/// properties.
fn message(rec: &Record<'_>, message_id: String) -> Message<Body<Value>> {
    let mut props = ApplicationProperties::builder()
        .insert("device", rec.device)
        .insert("stream", rec.stream);
    if let Some(p) = rec.path {
        // Below protocol::MAX_PATHS.
        props = props.insert("path", p as u32);
    }
    if let Some(c) = rec.class {
        props = props.insert("class", c.name());
    }
    Message::builder()
        .header(Header {
            durable: true,
            ..Default::default()
        })
        .properties(Properties {
            message_id: Some(MessageId::String(message_id)),
            ..Default::default()
        })
        .application_properties(props.build())
        .body(Body::Data(
            vec![Data(Binary::from(rec.body.to_vec()))].into(),
        ))
        .build()
}

/// Connect, send, reconnect: the sink's task. Ends when every [`QueueSink`] handle is gone.
async fn run(
    upstream: Upstream,
    address: String,
    target: String,
    cfg: QueueSinkConfig,
    mut jobs: mpsc::Receiver<Job>,
    stats: Arc<QueueSinkStats>,
    up: Arc<AtomicBool>,
) {
    let mut backoff = Duration::from_millis(100);
    let mut reported = false;
    loop {
        let (client, quic, mut sender) = match upstream
            .open_sender(&cfg.link_name, &address, cfg.delivery_timeout)
            .await
        {
            Ok((client, info, sender)) => (client, info.quic, sender),
            Err(why) => {
                if !reported {
                    tracing::warn!(%target, error = %why, "AMQP sink: broker unreachable; retrying");
                    reported = true;
                }
                // Requests that arrived meanwhile were queued while the link looked up.
                while let Ok(j) = jobs.try_recv() {
                    let _ = j.reply.send(Err(Failure::Transient(format!(
                        "the broker is unreachable: {why}"
                    ))));
                }
                if jobs.is_closed() {
                    return;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(cfg.max_backoff);
                continue;
            }
        };
        stats.connects.fetch_add(1, Ordering::Relaxed);
        up.store(true, Ordering::Relaxed);
        if reported {
            tracing::info!(%target, "AMQP sink: connected again");
        }
        reported = false;
        let (mut sent_any, mut settled_any) = (false, false);
        let mut inflight = FuturesUnordered::new();
        // When the broker last settled something (or the link came up).
        let mut progress = Instant::now();
        let mut check =
            tokio::time::interval((cfg.delivery_timeout / 4).max(Duration::from_millis(10)));
        let why = loop {
            tokio::select! {
                // Outcomes first: a settled message is answered before anything can end the link.
                biased;
                Some((reply, r)) = inflight.next(), if !inflight.is_empty() => {
                    progress = Instant::now();
                    match reply_to(reply, r) {
                        Ok(accepted) => settled_any |= accepted,
                        Err(e) => break e,
                    }
                }
                job = jobs.recv(), if inflight.len() < cfg.window.max(1) => {
                    let Some(Job { msg, reply, _bytes }) = job else {
                        // Every handle is gone: settle what is in flight (bounded), then stop.
                        let settle = async {
                            while let Some((reply, r)) = inflight.next().await {
                                let _ = reply_to(reply, r);
                            }
                        };
                        let _ = tokio::time::timeout(cfg.delivery_timeout, settle).await;
                        up.store(false, Ordering::Relaxed);
                        bounded(async { let _ = sender.close().await; }).await;
                        bounded(client.close()).await;
                        return;
                    };
                    // Its request has been answered already (timed out): do not send it.
                    if reply.is_closed() {
                        continue;
                    }
                    if inflight.is_empty() {
                        progress = Instant::now();
                    }
                    // Waits for credit: bounded, so a broker that grants none cannot hold it.
                    match tokio::time::timeout(cfg.delivery_timeout, sender.send_batchable(msg)).await {
                        Ok(Ok(fut)) => inflight.push({
                            sent_any = true;
                            async move {
                                let r = fut.await;
                                drop(_bytes);
                                (reply, r)
                            }
                        }),
                        // This message alone cannot be sent; the link is fine.
                        Ok(Err(e @ SendError::MessageSizeExceeded(_))) => {
                            let _ = reply.send(Err(Failure::TooLarge(e.to_string())));
                        }
                        Ok(Err(e @ SendError::MessageEncodeError)) => {
                            let _ = reply.send(Err(Failure::Refused(e.to_string())));
                        }
                        Ok(Err(e)) => {
                            let _ = reply.send(Err(Failure::Transient(format!("sending: {e}"))));
                            break format!("sending: {e}");
                        }
                        Err(_) => {
                            let _ = reply.send(Err(Failure::Transient("the broker granted no credit in time".into())));
                            break "no credit".into();
                        }
                    }
                }
                e = quic_closed(quic.as_ref()) => break format!("the QUIC connection closed: {e}"),
                _ = check.tick() => {
                    if !inflight.is_empty() && progress.elapsed() >= cfg.delivery_timeout {
                        break "the broker settled nothing in time".into();
                    }
                }
            }
        };
        up.store(false, Ordering::Relaxed);
        // Outcomes that arrived with the failure still count. Each delivery is polled directly:
        // `FuturesUnordered::next` may answer Pending while another is being woken.
        let ready: Vec<_> = std::pin::Pin::new(&mut inflight)
            .iter_pin_mut()
            .filter_map(|f| f.now_or_never())
            .collect();
        let unsettled = inflight.len() - ready.len();
        // Dropping the unsettled deliveries fails their requests (never acknowledged).
        drop(inflight);
        for (reply, r) in ready {
            settled_any |= reply_to(reply, r).unwrap_or(false);
        }
        tracing::warn!(%target, error = %why, unsettled, "AMQP sink: link lost; reconnecting");
        // A link that was sent messages and settled none does not earn a quick reconnect.
        backoff = if sent_any && !settled_any {
            (backoff * 2).min(cfg.max_backoff)
        } else {
            Duration::from_millis(100)
        };
        drop(sender);
        tokio::spawn(bounded(client.close()));
        tokio::time::sleep(backoff).await;
    }
}

/// Answer one request from its outcome: Ok(whether the broker accepted it), Err when the link
/// itself has ended.
fn reply_to(
    reply: oneshot::Sender<Result<(), Failure>>,
    r: Result<Outcome, SendError>,
) -> Result<bool, String> {
    let (answer, fatal) = match r {
        Ok(Outcome::Accepted(_)) => (Ok(()), None),
        Ok(Outcome::Rejected(rej)) => {
            let why = rej.error.as_ref().map_or_else(
                || "the broker rejected the message".to_string(),
                |e| {
                    format!(
                        "the broker rejected the message: {:?} {}",
                        e.condition,
                        e.description.clone().unwrap_or_default()
                    )
                },
            );
            // A full queue clears; anything else will be refused again.
            let transient = rej.error.as_ref().is_some_and(|e| {
                matches!(
                    e.condition,
                    fe2o3_amqp::types::definitions::ErrorCondition::AmqpError(
                        fe2o3_amqp::types::definitions::AmqpError::ResourceLimitExceeded
                    )
                )
            });
            let f = if transient {
                Failure::Transient(why)
            } else {
                Failure::Refused(why)
            };
            (Err(f), None)
        }
        Ok(other) => (
            Err(Failure::Transient(format!(
                "the broker did not accept: {other:?}"
            ))),
            None,
        ),
        Err(e @ (SendError::LinkStateError(_) | SendError::Detached(_))) => (
            Err(Failure::Transient(format!("the link ended: {e}"))),
            Some(e.to_string()),
        ),
        Err(e) => (Err(Failure::Transient(format!("sending: {e}"))), None),
    };
    let accepted = answer.is_ok();
    let _ = reply.send(answer);
    fatal.map_or(Ok(accepted), Err)
}
