//! Store-and-forward bridges (shovels): a local queue's messages forwarded to a queue on an
//! upstream AMQP 1.0 broker (the cloud's Artemis or RabbitMQ cluster), at least once
//! (decision M28).
//!
//! A bridge takes a message off the local queue only while the upstream link is attached, sends
//! it upstream (durable), and settles it locally only once the upstream accepted it; until then
//! it stays in the local queue (and its durable store). When the upstream goes away, the local
//! link is closed and the broker puts every unsettled message back, so nothing waits on a dead
//! connection and nothing is lost: a message in flight at that moment may arrive upstream twice,
//! with the same message-id. At most `window` messages are unsettled at once.
//!
//! The local side is an in-process AMQP connection (a byte pipe the broker serves itself, dialed
//! by the connector `Broker::bridge` hands in): the bridge uses the broker exactly as any
//! consumer does, and needs nothing else of it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fe2o3_amqp::link::delivery::DeliveryInfo;
use fe2o3_amqp::types::messaging::{Body, Header, Outcome};
use fe2o3_amqp::types::primitives::Value;
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use tokio::time::Instant;

use crate::client::{bounded, quic_closed, Client, Connector};
use crate::url::Upstream;

/// One bridge; every default lives here.
#[derive(Clone)]
pub struct BridgeConfig {
    /// The local queue to drain.
    pub queue: String,
    /// Where its messages go: the upstream broker.
    pub upstream: Upstream,
    /// The upstream address (queue) they are sent to.
    pub address: String,
    /// The upstream as shown in logs and metrics (no password).
    pub upstream_name: String,
    /// Most messages sent upstream and not yet settled there.
    pub window: u32,
    /// A message the upstream has not settled within this long tears the link down (and the
    /// local messages are put back).
    pub settle_timeout: Duration,
    /// Longest pause between attempts to reach the upstream (from 100 ms, doubling).
    pub max_backoff: Duration,
}

impl BridgeConfig {
    /// A bridge from `queue` to `address` through `upstream`, with the default window (256),
    /// settle timeout (10 s) and backoff (at most 5 s).
    pub fn new(queue: &str, upstream: Upstream, address: &str, upstream_name: &str) -> Self {
        BridgeConfig {
            queue: queue.to_string(),
            upstream,
            address: address.to_string(),
            upstream_name: upstream_name.to_string(),
            window: 256,
            settle_timeout: Duration::from_secs(10),
            max_backoff: Duration::from_secs(5),
        }
    }
}

/// What a bridge has done.
#[derive(Debug, Default)]
pub struct BridgeStats {
    /// Messages the upstream accepted (and the local queue then forgot).
    pub forwarded: AtomicU64,
    /// Messages the upstream refused for good (malformed, too large): dropped here.
    pub rejected: AtomicU64,
    /// Times the upstream turned a message away for now (full queue, released): it went back
    /// to the local queue.
    pub deferred: AtomicU64,
    /// Upstream connections opened.
    pub connects: AtomicU64,
    /// The upstream link is attached.
    pub up: AtomicBool,
}

/// How long the bridge stops pulling after the upstream turned a message away for now (full
/// queue, released): the message is back in the local queue and would come straight back.
const REFUSED_PAUSE: Duration = Duration::from_secs(1);

/// A message the upstream rejected (for a reason other than a full queue) this many times is
/// dropped and counted: a rejection we cannot classify must neither lose data at once nor slow
/// the bridge for ever.
const MAX_REJECTIONS: u32 = 10;

/// Run the bridge, consuming through `local`, until the broker stops it (its task is aborted).
pub(crate) async fn run(local: Connector, cfg: BridgeConfig, stats: Arc<BridgeStats>) {
    let name = format!("qgate-bridge-{}", cfg.queue);
    let mut backoff = Duration::from_millis(100);
    let mut reported = false;
    loop {
        let (up, info, mut sender) = match cfg
            .upstream
            .open_sender(&name, &cfg.address, cfg.settle_timeout)
            .await
        {
            Ok(x) => x,
            Err(why) => {
                if !reported {
                    tracing::warn!(queue = %cfg.queue, upstream = %cfg.upstream_name, error = %why, "bridge: upstream unreachable; messages wait in the local queue");
                    reported = true;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(cfg.max_backoff);
                continue;
            }
        };
        let (here, mut rx) = match open_local(&local, &name, &cfg.queue, cfg.window).await {
            Ok(x) => x,
            Err(e) => {
                tracing::error!(queue = %cfg.queue, error = %e, "bridge: cannot consume the local queue");
                bounded(up.close()).await;
                tokio::time::sleep(cfg.max_backoff).await;
                continue;
            }
        };
        stats.connects.fetch_add(1, Ordering::Relaxed);
        stats.up.store(true, Ordering::Relaxed);
        if reported {
            tracing::info!(queue = %cfg.queue, upstream = %cfg.upstream_name, "bridge: upstream reachable again");
        }
        reported = false;
        let forwarded_before = stats.forwarded.load(Ordering::Relaxed);
        let mut sent_any = false;
        let quic = info.quic.clone();
        let mut inflight = FuturesUnordered::new();
        let mut progress = Instant::now();
        // Pulling stops until then after a message was turned away for now.
        let mut paused_until: Option<Instant> = None;
        let mut check =
            tokio::time::interval((cfg.settle_timeout / 4).max(Duration::from_millis(10)));
        let why: String = loop {
            let pulling = inflight.len() < cfg.window as usize && paused_until.is_none();
            tokio::select! {
                // Outcomes first: an accepted message is settled before anything ends the link.
                biased;
                Some((local_id, tries, outcome)) = inflight.next(), if !inflight.is_empty() => {
                    progress = Instant::now();
                    match settle(&mut rx, &cfg, &stats, local_id, tries, outcome).await {
                        Settled::Done => {}
                        Settled::Later => paused_until = Some(Instant::now() + REFUSED_PAUSE),
                        Settled::LinkEnded(e) => break e,
                    }
                }
                _ = tokio::time::sleep_until(paused_until.unwrap_or_else(Instant::now)), if paused_until.is_some() => {
                    paused_until = None;
                }
                d = rx.recv::<Body<Value>>(), if pulling => {
                    let d = match d {
                        Ok(d) => d,
                        Err(e) => break format!("the local link ended: {e}"),
                    };
                    if inflight.is_empty() {
                        progress = Instant::now();
                    }
                    let local_id = DeliveryInfo::from(&d);
                    let mut msg = d.into_message();
                    // Times the local broker has handed it out before (it counts redeliveries).
                    let tries = msg.header.as_ref().map_or(0, |h| h.delivery_count);
                    sent_any = true;
                    // Upstream keeps it on disk: it has left our store once accepted there.
                    msg.header.get_or_insert_with(Header::default).durable = true;
                    match tokio::time::timeout(cfg.settle_timeout, sender.send_batchable(msg)).await {
                        Ok(Ok(fut)) => inflight.push(async move { (local_id, tries, fut.await) }),
                        // This message alone cannot go upstream: it would fail for ever.
                        Ok(Err(e @ (fe2o3_amqp::link::SendError::MessageSizeExceeded(_)
                            | fe2o3_amqp::link::SendError::MessageEncodeError))) => {
                            tracing::warn!(queue = %cfg.queue, upstream = %cfg.upstream_name, error = %e, "bridge: the upstream cannot take a message; dropping it");
                            stats.rejected.fetch_add(1, Ordering::Relaxed);
                            let _ = rx.reject(local_id, None).await;
                        }
                        Ok(Err(e)) => {
                            let _ = rx.release(local_id).await;
                            break format!("sending upstream: {e}");
                        }
                        Err(_) => {
                            let _ = rx.release(local_id).await;
                            break "the upstream granted no credit in time".into();
                        }
                    }
                }
                e = quic_closed(quic.as_ref()) => break format!("the upstream QUIC connection closed: {e}"),
                _ = check.tick() => {
                    if !inflight.is_empty() && progress.elapsed() >= cfg.settle_timeout {
                        break "the upstream settled nothing in time".into();
                    }
                }
            }
        };
        stats.up.store(false, Ordering::Relaxed);
        // Outcomes that arrived with the failure still count. Each delivery is polled directly:
        // `FuturesUnordered::next` may answer Pending while another is being woken.
        let ready: Vec<_> = std::pin::Pin::new(&mut inflight)
            .iter_pin_mut()
            .filter_map(|f| f.now_or_never())
            .collect();
        drop(inflight);
        for (local_id, tries, outcome) in ready {
            let _ = settle(&mut rx, &cfg, &stats, local_id, tries, outcome).await;
        }
        // A session that sent but forwarded nothing (a stalled or refusing upstream) does not
        // earn a quick reconnect: each one would send the same unsettled window again.
        if sent_any && stats.forwarded.load(Ordering::Relaxed) == forwarded_before {
            backoff = (backoff * 2).min(cfg.max_backoff);
        } else {
            backoff = Duration::from_millis(100);
        }
        tracing::warn!(queue = %cfg.queue, upstream = %cfg.upstream_name, error = %why, "bridge: link lost; the unsettled messages go back to the local queue");
        // Closing the local link puts everything it held unsettled back in the queue.
        drop(sender);
        bounded(async {
            let _ = rx.close().await;
        })
        .await;
        bounded(here.close()).await;
        tokio::spawn(bounded(up.close()));
        tokio::time::sleep(backoff).await;
    }
}

/// What became of one local message.
enum Settled {
    /// Accepted upstream (and forgotten here), or refused for good (dropped here).
    Done,
    /// Turned away for now: back in the local queue; pause before pulling more.
    Later,
    /// The upstream link has ended.
    LinkEnded(String),
}

/// A full queue: the upstream takes it again once a consumer makes room, however long that is.
fn full(e: Option<&fe2o3_amqp::types::definitions::Error>) -> bool {
    use fe2o3_amqp::types::definitions::{AmqpError, ErrorCondition};
    e.is_some_and(|e| {
        matches!(
            e.condition,
            ErrorCondition::AmqpError(AmqpError::ResourceLimitExceeded)
        )
    })
}

/// A rejection the upstream would give again whatever we wait: the message itself is bad.
fn refused_for_good(e: Option<&fe2o3_amqp::types::definitions::Error>) -> bool {
    use fe2o3_amqp::types::definitions::{AmqpError, ErrorCondition, LinkError};
    e.is_some_and(|e| {
        matches!(
            e.condition,
            ErrorCondition::AmqpError(AmqpError::DecodeError | AmqpError::InvalidField)
                | ErrorCondition::LinkError(LinkError::MessageSizeExceeded)
        )
    })
}

/// Settle one local message by its upstream outcome.
async fn settle(
    rx: &mut fe2o3_amqp::Receiver,
    cfg: &BridgeConfig,
    stats: &BridgeStats,
    local_id: DeliveryInfo,
    tries: u32,
    outcome: Result<Outcome, fe2o3_amqp::link::SendError>,
) -> Settled {
    use fe2o3_amqp::link::SendError;
    match outcome {
        Ok(Outcome::Accepted(_)) => {
            if let Err(e) = rx.accept(local_id).await {
                return Settled::LinkEnded(format!("settling locally: {e}"));
            }
            stats.forwarded.fetch_add(1, Ordering::Relaxed);
            Settled::Done
        }
        Ok(Outcome::Rejected(r)) if refused_for_good(r.error.as_ref()) => {
            tracing::warn!(queue = %cfg.queue, upstream = %cfg.upstream_name, error = ?r.error, "bridge: the upstream refuses a message for good; dropping it");
            stats.rejected.fetch_add(1, Ordering::Relaxed);
            let _ = rx.reject(local_id, r.error).await;
            Settled::Done
        }
        Ok(Outcome::Rejected(r)) if !full(r.error.as_ref()) && tries + 1 >= MAX_REJECTIONS => {
            tracing::warn!(queue = %cfg.queue, upstream = %cfg.upstream_name, error = ?r.error, tries = tries + 1, "bridge: the upstream keeps rejecting a message; dropping it");
            stats.rejected.fetch_add(1, Ordering::Relaxed);
            let _ = rx.reject(local_id, r.error).await;
            Settled::Done
        }
        Ok(Outcome::Rejected(r)) if !full(r.error.as_ref()) => {
            tracing::warn!(queue = %cfg.queue, upstream = %cfg.upstream_name, error = ?r.error, tries = tries + 1, "bridge: the upstream rejected a message; it goes back to the queue");
            stats.deferred.fetch_add(1, Ordering::Relaxed);
            let _ = rx.release(local_id).await;
            Settled::Later
        }
        // A full queue, released, modified: it goes back here, tried later.
        Ok(other) => {
            tracing::debug!(queue = %cfg.queue, outcome = ?other, "bridge: the upstream turned a message away for now");
            stats.deferred.fetch_add(1, Ordering::Relaxed);
            let _ = rx.release(local_id).await;
            Settled::Later
        }
        Err(e @ (SendError::LinkStateError(_) | SendError::Detached(_))) => {
            let _ = rx.release(local_id).await;
            Settled::LinkEnded(format!("the upstream link ended: {e}"))
        }
        Err(e) => {
            let _ = rx.release(local_id).await;
            tracing::warn!(queue = %cfg.queue, error = %e, "bridge: send failed; the message goes back to the queue");
            Settled::Later
        }
    }
}

/// The local consumer: a connection to the broker itself and a receiver on `queue` with
/// `credit` (refilled as messages are settled).
async fn open_local(
    local: &Connector,
    name: &str,
    queue: &str,
    credit: u32,
) -> Result<(Client, fe2o3_amqp::Receiver), String> {
    let (mut c, _) = local.open().await.map_err(|e| e.to_string())?;
    match c.receiver(name, queue, false, credit).await {
        Ok(r) => Ok((c, r)),
        Err(e) => {
            bounded(c.close()).await;
            Err(e.to_string())
        }
    }
}
