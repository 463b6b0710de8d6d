//! Ingest into an AMQP 1.0 queue: each body becomes a durable message on one sender link, and the
//! device's request is answered only once the broker has accepted it (at least once, decision
//! S5). Works with `qgate broker` and any AMQP 1.0 broker (Artemis, RabbitMQ 4).
//!
//! One task owns the connection and the link; requests reach it through a bounded queue and get
//! their outcome back. Transfers are pipelined (up to `window` unsettled), so throughput is not
//! one broker round trip per message. When the broker is unreachable, requests fail at once
//! with [`SinkError::Unavailable`] (the device or gateway retries later) while the task
//! reconnects with backoff; a link that stops settling for `delivery_timeout` is torn down and
//! opened again, failing what it held (never acknowledged, so nothing acknowledged is lost).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fe2o3_amqp::types::messaging::{
    ApplicationProperties, Body, Data, Header, Message, MessageId, Outcome, Properties,
};
use fe2o3_amqp::types::primitives::{Binary, Value};
use futures_util::stream::{FuturesUnordered, StreamExt};
use qgate_amqp::client::Connector;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::sink::{Record, SinkError};

/// How the queue sink behaves; every default lives here.
#[derive(Debug, Clone)]
pub struct QueueSinkConfig {
    /// Most messages sent and not yet settled by the broker.
    pub window: usize,
    /// Most requests waiting for the sender (beyond them: [`SinkError::Unavailable`] at once).
    pub backlog: usize,
    /// A message the broker has not settled within this long fails, and the link is reopened.
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
            delivery_timeout: Duration::from_secs(10),
            max_backoff: Duration::from_secs(5),
            link_name: "qgate-server".into(),
        }
    }
}

/// What the sink has done (for `/stats`, `/metrics` and the demo).
#[derive(Debug, Default)]
pub struct QueueSinkStats {
    /// Messages the broker accepted.
    pub accepted: AtomicU64,
    /// Messages that failed (refused by the broker, timed out, connection lost, unreachable).
    pub failed: AtomicU64,
    /// Connections opened to the broker (the first included).
    pub connects: AtomicU64,
}

struct Job {
    msg: Message<Body<Value>>,
    reply: oneshot::Sender<Result<(), String>>,
}

/// The sink; see the module docs.
pub struct QueueSink {
    jobs: mpsc::Sender<Job>,
    target: String,
    instance: u64,
    next: AtomicU64,
    cfg: QueueSinkConfig,
    stats: Arc<QueueSinkStats>,
    up: Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for QueueSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QueueSink({})", self.target)
    }
}

impl QueueSink {
    /// Start sending to `address` through `connector` (on the current tokio runtime); `target`
    /// names the broker and queue in errors (no password); response ids start at `first_id`.
    pub fn start(
        connector: Connector,
        address: &str,
        target: &str,
        cfg: QueueSinkConfig,
        first_id: u64,
    ) -> QueueSink {
        let (tx, rx) = mpsc::channel(cfg.backlog.max(1));
        let stats = Arc::new(QueueSinkStats::default());
        let up = Arc::new(std::sync::atomic::AtomicBool::new(false));
        tokio::spawn(run(
            connector,
            address.to_string(),
            target.to_string(),
            cfg.clone(),
            rx,
            stats.clone(),
            up.clone(),
        ));
        QueueSink {
            jobs: tx,
            target: target.to_string(),
            instance: qgate_amqp::client::run_id(),
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
    pub(crate) async fn deliver(&self, rec: &Record<'_>) -> Result<u64, SinkError> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let message_id = match rec.request_id {
            Some(r) => r.to_string(),
            // A direct request without an id: unique across restarts by the random instance.
            None => format!("{:016x}-{id}", self.instance),
        };
        let (reply, answer) = oneshot::channel();
        let unavailable = |why: String| {
            self.stats.failed.fetch_add(1, Ordering::Relaxed);
            SinkError::Unavailable(format!("{}: {why}", self.target))
        };
        self.jobs
            .try_send(Job {
                msg: message(rec, message_id),
                reply,
            })
            .map_err(|e| {
                unavailable(match e {
                    mpsc::error::TrySendError::Full(_) => "too many messages waiting".into(),
                    mpsc::error::TrySendError::Closed(_) => "the sink has stopped".into(),
                })
            })?;
        // The task fails or times out every job itself; this bound only guards against a bug.
        match tokio::time::timeout(self.cfg.delivery_timeout * 3, answer).await {
            Ok(Ok(Ok(()))) => {
                self.stats.accepted.fetch_add(1, Ordering::Relaxed);
                Ok(id)
            }
            Ok(Ok(Err(why))) => Err(unavailable(why)),
            Ok(Err(_)) => Err(unavailable(
                "the broker connection ended before the message was accepted".into(),
            )),
            Err(_) => Err(unavailable("no answer from the sender".into())),
        }
    }
}

/// The message for `rec`: durable (so an external broker stores it), the request id as
/// message-id, device, stream and path as application properties.
fn message(rec: &Record<'_>, message_id: String) -> Message<Body<Value>> {
    let mut props = ApplicationProperties::builder()
        .insert("device", rec.device)
        .insert("stream", rec.stream);
    if let Some(p) = rec.path {
        // Below protocol::MAX_PATHS.
        props = props.insert("path", p as u32);
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
    connector: Connector,
    address: String,
    target: String,
    cfg: QueueSinkConfig,
    mut jobs: mpsc::Receiver<Job>,
    stats: Arc<QueueSinkStats>,
    up: Arc<std::sync::atomic::AtomicBool>,
) {
    let mut backoff = Duration::from_millis(100);
    let mut reported = false;
    loop {
        let opened = tokio::time::timeout(cfg.delivery_timeout, async {
            let (mut client, info) = connector.open().await.map_err(|e| e.to_string())?;
            match client.sender(&cfg.link_name, &address, false).await {
                Ok(s) => Ok((client, info, s)),
                Err(e) => {
                    client.close().await;
                    Err(e.to_string())
                }
            }
        })
        .await
        .unwrap_or_else(|_| Err("timed out connecting".into()));
        let (client, info, mut sender) = match opened {
            Ok(c) => c,
            Err(why) => {
                if !reported {
                    tracing::warn!(%target, error = %why, "AMQP sink: broker unreachable; retrying");
                    reported = true;
                }
                // Fail what arrives during the pause rather than let it wait for an outage.
                let pause = tokio::time::sleep(backoff);
                tokio::pin!(pause);
                loop {
                    tokio::select! {
                        _ = &mut pause => break,
                        job = jobs.recv() => match job {
                            Some(j) => { let _ = j.reply.send(Err(format!("broker unreachable: {why}"))); }
                            None => return,
                        },
                    }
                }
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
        backoff = Duration::from_millis(100);
        let quic = info.quic.clone();
        let mut inflight = FuturesUnordered::new();
        // When the broker last settled something (or the link came up).
        let mut progress = Instant::now();
        let mut check = tokio::time::interval(cfg.delivery_timeout / 4);
        let why = loop {
            tokio::select! {
                job = jobs.recv(), if inflight.len() < cfg.window.max(1) => {
                    let Some(Job { msg, reply }) = job else {
                        // Every handle is gone: settle what is in flight, then stop.
                        while let Some((reply, r)) = inflight.next().await {
                            let _ = reply_to(reply, r);
                        }
                        let _ = sender.close().await;
                        client.close().await;
                        up.store(false, Ordering::Relaxed);
                        return;
                    };
                    if inflight.is_empty() {
                        progress = Instant::now();
                    }
                    // Waits for credit: bounded, so a broker that grants none cannot hold it.
                    match tokio::time::timeout(cfg.delivery_timeout, sender.send_batchable(msg)).await {
                        Ok(Ok(fut)) => inflight.push(async move { (reply, fut.await) }),
                        Ok(Err(e)) => {
                            let _ = reply.send(Err(format!("sending: {e}")));
                            break format!("sending: {e}");
                        }
                        Err(_) => {
                            let _ = reply.send(Err("the broker granted no credit in time".into()));
                            break "no credit".into();
                        }
                    }
                }
                Some((reply, r)) = inflight.next(), if !inflight.is_empty() => {
                    progress = Instant::now();
                    if let Err(e) = reply_to(reply, r) {
                        break e;
                    }
                }
                e = closed(quic.as_ref()) => break format!("the QUIC connection closed: {e}"),
                _ = check.tick() => {
                    if !inflight.is_empty() && progress.elapsed() >= cfg.delivery_timeout {
                        break "the broker settled nothing in time".into();
                    }
                }
            }
        };
        up.store(false, Ordering::Relaxed);
        tracing::warn!(%target, error = %why, unsettled = inflight.len(), "AMQP sink: link lost; reconnecting");
        // Dropping the unsettled deliveries fails their requests (never acknowledged).
        drop(inflight);
        drop(sender);
        tokio::spawn(client.close());
    }
}

/// Answer one request from its outcome; Err when the link itself has ended.
fn reply_to(
    reply: oneshot::Sender<Result<(), String>>,
    r: Result<Outcome, fe2o3_amqp::link::SendError>,
) -> Result<(), String> {
    use fe2o3_amqp::link::SendError;
    let (answer, fatal) = match r {
        Ok(Outcome::Accepted(_)) => (Ok(()), None),
        Ok(Outcome::Rejected(rej)) => (
            Err(rej.error.map_or_else(
                || "the broker rejected the message".to_string(),
                |e| {
                    format!(
                        "the broker rejected the message: {:?} {}",
                        e.condition,
                        e.description.unwrap_or_default()
                    )
                },
            )),
            None,
        ),
        Ok(other) => (Err(format!("the broker did not accept: {other:?}")), None),
        Err(e @ (SendError::LinkStateError(_) | SendError::Detached(_))) => {
            (Err(format!("the link ended: {e}")), Some(e.to_string()))
        }
        Err(e) => (Err(format!("sending: {e}")), None),
    };
    let _ = reply.send(answer);
    fatal.map_or(Ok(()), Err)
}

/// Resolves when the QUIC connection closes; never for TCP (fe2o3 reports its end itself).
async fn closed(quic: Option<&quinn::Connection>) -> quinn::ConnectionError {
    match quic {
        Some(c) => c.closed().await,
        None => std::future::pending().await,
    }
}
