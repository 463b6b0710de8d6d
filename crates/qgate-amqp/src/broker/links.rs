//! Links: a producer's messages into a queue (durable, back-pressured, replay-guarded) and a
//! consumer's out of it (windowed, redelivered when unsettled).

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use fe2o3_amqp::link::delivery::DeliveryInfo;
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::link::{Receiver, Sender};
use fe2o3_amqp::types::definitions::{self, AmqpError};
use fe2o3_amqp::types::messaging::{Body, Outcome};
use fe2o3_amqp::types::primitives::Value;
use futures_util::stream::{FuturesOrdered, FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use tokio::time::Instant;

use super::message::{encode, redelivered, sendable, AmqpMessage};
use super::queue_state::QueueState;
use super::replay::{replay_key, ReplayGuard};
use super::state::Broker;
use crate::queue::ConsumerId;

/// A delivery on its way into a queue.
struct Staged {
    info: DeliveryInfo,
    seq: u64,
    msg: AmqpMessage,
    size: usize,
    expires: Option<Instant>,
    stored: Result<(), String>,
    /// The 0-RTT replay key to forget if the message does not make it in.
    replay_key: Option<u64>,
}

fn amqp_error(condition: AmqpError, description: impl Into<String>) -> definitions::Error {
    definitions::Error {
        condition: condition.into(),
        description: Some(description.into()),
        info: None,
    }
}

impl Broker {
    fn replays(&self) -> MutexGuard<'_, ReplayGuard> {
        self.inner.replays.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The queue at `address`, created if allowed; a refusal is counted.
    fn resolve(&self, address: Option<&str>) -> Result<Arc<QueueState>, definitions::Error> {
        let r = self.lookup(address);
        if r.is_err() {
            self.inner
                .counters
                .links_refused
                .fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    fn lookup(&self, address: Option<&str>) -> Result<Arc<QueueState>, definitions::Error> {
        let Some(name) = address.filter(|a| !a.is_empty()) else {
            return Err(amqp_error(
                AmqpError::InvalidField,
                "the link has no address (source for receivers, target for senders)",
            ));
        };
        // One lock from the check to the creation, so racing creators cannot pass the cap.
        let mut queues = self.queues();
        if let Some(q) = queues.get(name) {
            return Ok(q.clone());
        }
        if !self.inner.cfg.auto_create {
            return Err(amqp_error(
                AmqpError::NotFound,
                format!("no queue '{name}'"),
            ));
        }
        if queues.len() >= self.inner.cfg.max_queues {
            return Err(amqp_error(
                AmqpError::ResourceLimitExceeded,
                format!("queue limit ({}) reached", self.inner.cfg.max_queues),
            ));
        }
        Ok(Self::declare_in(
            &mut queues,
            name,
            self.inner.cfg.default_limits(),
            self.inner.cfg.default_ttl,
        ))
    }

    /// A link on which a peer sends to a queue.
    pub(super) async fn producer(&self, mut r: Receiver, early: bool) {
        let address = r
            .target()
            .as_ref()
            .and_then(|t| t.address.clone())
            .map(|a| a.to_string());
        let q = match self.resolve(address.as_deref()) {
            Ok(q) => q,
            Err(e) => {
                let _ = r.close_with_error(e).await;
                return;
            }
        };
        r.set_credit_mode(CreditMode::Auto(self.inner.cfg.producer_credit));
        if r.set_credit(self.inner.cfg.producer_credit).await.is_err() {
            return;
        }
        let limits = q.lock().limits();
        let high = (
            (limits.max_messages as f64 * self.inner.cfg.high_water) as usize,
            (limits.max_bytes as f64 * self.inner.cfg.high_water) as usize,
        );
        // Deliveries whose durable write is under way, in arrival order: the store commits in
        // order, so they complete in order, and several share one fsync (group commit).
        let mut pending = FuturesOrdered::new();
        let window = self.inner.cfg.producer_credit.max(1) as usize;
        let mut open = true;
        while open || !pending.is_empty() {
            tokio::select! {
                biased;
                Some(done) = pending.next(), if !pending.is_empty() => {
                    // Everything the same commit made durable is settled in one disposition (M30).
                    let mut ready = vec![done];
                    while let Some(Some(d)) = pending.next().now_or_never() {
                        ready.push(d);
                    }
                    if !self.admit(&q, &mut r, ready, high, open).await {
                        open = false;
                    }
                }
                d = r.recv::<Body<Value>>(), if open && pending.len() < window => {
                    let d = match d {
                        Ok(d) => d,
                        Err(e) => {
                            tracing::debug!(target: "qgate_amqp::broker", queue = %q.name, error = ?e, "producer link ended");
                            open = false;
                            continue;
                        }
                    };
                    match self.stage(&q, d, early) {
                        Ok(fut) => pending.push_back(fut),
                        Err((info, Some(e))) => {
                            if r.reject(info, e).await.is_err() {
                                open = false;
                            }
                        }
                        Err((info, None)) => {
                            // A replayed 0-RTT transfer: it is already queued once.
                            if r.accept(info).await.is_err() {
                                open = false;
                            }
                        }
                    }
                }
            }
        }
        let _ = r.close().await;
    }

    /// Reserve a place for a delivery and start its durable write; the returned future
    /// resolves when it is committed (at once for memory-only brokers). Err(None): a replay of
    /// a 0-RTT transfer already taken (settle it, queue nothing).
    #[allow(clippy::type_complexity)]
    fn stage(
        &self,
        q: &Arc<QueueState>,
        d: fe2o3_amqp::link::delivery::Delivery<Body<Value>>,
        early: bool,
    ) -> Result<
        futures_util::future::BoxFuture<'static, Staged>,
        (DeliveryInfo, Option<definitions::Error>),
    > {
        let info = DeliveryInfo::from(&d);
        let msg = d.into_message();
        let bytes = encode(&msg);
        let size = bytes.len();
        let replay_key = if early {
            let Some(id) = msg.properties.as_ref().and_then(|p| p.message_id.as_ref()) else {
                return Err((
                    info,
                    Some(amqp_error(
                        AmqpError::PreconditionFailed,
                        "a transfer over QUIC needs a message-id (0-RTT replay protection)",
                    )),
                ));
            };
            let key = replay_key(&q.name, id, &bytes);
            if !self.replays().first_time(key, Instant::now()) {
                self.inner
                    .counters
                    .replays_dropped
                    .fetch_add(1, Ordering::Relaxed);
                return Err((info, None));
            }
            Some(key)
        } else {
            None
        };
        let header_ttl = msg
            .header
            .as_ref()
            .and_then(|h| h.ttl)
            .map(|ms| Duration::from_millis(ms as u64));
        let ttl = match (header_ttl, q.ttl) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let expires = ttl.map(|t| Instant::now() + t);
        let reserved = q.lock().reserve(size);
        let seq = reserved.map_err(|refused| {
            if let Some(k) = replay_key {
                self.replays().forget(k);
            }
            (
                info.clone(),
                Some(amqp_error(
                    AmqpError::ResourceLimitExceeded,
                    format!("{}: {refused}", q.name),
                )),
            )
        })?;
        let store = self.inner.store.clone();
        let name = q.name.clone();
        Ok(Box::pin(async move {
            let stored = match store {
                Some(s) => s.put(&name, seq, bytes).await.map_err(|e| e.to_string()),
                None => Ok(()),
            };
            Staged {
                info,
                seq,
                msg,
                size,
                expires,
                stored,
                replay_key,
            }
        }))
    }

    /// Deliveries whose writes are done: put them in the queue and settle them with the producer
    /// (one disposition for all that were accepted), after waiting out back-pressure. False
    /// when the link is gone.
    async fn admit(
        &self,
        q: &QueueState,
        r: &mut Receiver,
        staged: Vec<Staged>,
        (high_msgs, high_bytes): (usize, usize),
        open: bool,
    ) -> bool {
        let mut accepted = Vec::with_capacity(staged.len());
        let mut alive = open;
        for s in staged {
            let refused = match s.stored {
                Err(e) => {
                    tracing::error!(target: "qgate_amqp::broker", queue = %q.name, error = %e, "could not store a message");
                    Some(amqp_error(
                        AmqpError::InternalError,
                        format!("message store: {e}"),
                    ))
                }
                Ok(()) => {
                    let inserted =
                        q.lock()
                            .insert(s.seq, Arc::new(sendable(s.msg)), s.size, s.expires);
                    if inserted {
                        None
                    } else {
                        if let Some(store) = &self.inner.store {
                            store.delete(&q.name, s.seq).await;
                            // Synced before the producer hears "refused": a crash must not
                            // bring the message back beside its retry (M30 leaves deletions
                            // of settled messages unsynced, not these).
                            if let Err(e) = store.sync().await {
                                tracing::error!(target: "qgate_amqp::broker", queue = %q.name, error = %e, "message store sync failed");
                            }
                        }
                        Some(amqp_error(
                            AmqpError::ResourceLimitExceeded,
                            format!("{}: queue is full", q.name),
                        ))
                    }
                }
            };
            match refused {
                None => {
                    accepted.push(s.info);
                    q.arrived.notify_one();
                    // Back-pressure, one delivery at a time as before ranges: the next is not
                    // queued, and none of these is settled (settling refills the producer's
                    // credit), while the queue is above its high-water mark.
                    if alive {
                        q.wait_below(high_msgs, high_bytes).await;
                    }
                }
                Some(e) => {
                    if let Some(k) = s.replay_key {
                        self.replays().forget(k);
                    }
                    alive = alive && r.reject(s.info, e).await.is_ok();
                }
            }
        }
        if accepted.is_empty() || !alive {
            // Whatever was stored is queued; a producer that is gone resends (at-least-once).
            return alive;
        }
        if accepted.len() == 1 {
            r.accept(accepted.pop().expect("one")).await.is_ok()
        } else {
            r.accept_all(accepted).await.is_ok()
        }
    }

    /// A link on which a peer receives from a queue: competing with the queue's other consumers,
    /// up to `consumer_window` deliveries outstanding; whatever is outstanding when the link or
    /// its connection goes goes back to the queue.
    pub(super) async fn consumer(&self, mut s: Sender) {
        let address = s
            .source()
            .as_ref()
            .and_then(|t| t.address.clone())
            .map(|a| a.to_string());
        let q = match self.resolve(address.as_deref()) {
            Ok(q) => q,
            Err(e) => {
                let _ = s.close_with_error(e).await;
                return;
            }
        };
        let id: ConsumerId = self.inner.next_consumer.fetch_add(1, Ordering::Relaxed);
        let window = self.inner.cfg.consumer_window.max(1);
        let mut inflight = FuturesUnordered::new();
        'link: loop {
            while let Some(Some((seq, outcome))) = inflight.next().now_or_never() {
                if !self.settle(&q, id, seq, outcome).await {
                    break 'link;
                }
            }
            if inflight.len() >= window {
                if let Some((seq, outcome)) = inflight.next().await {
                    if !self.settle(&q, id, seq, outcome).await {
                        break 'link;
                    }
                }
                continue;
            }
            let arrived = q.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            // A clean stop hands out nothing more (decision M32): only outcomes of what is out
            // are awaited, until the link ends. Checked after `enable`, so a stop begun since
            // wakes this link.
            if self.stopping() {
                tokio::select! {
                    biased;
                    Some((seq, outcome)) = inflight.next(), if !inflight.is_empty() => {
                        if !self.settle(&q, id, seq, outcome).await {
                            break 'link;
                        }
                    }
                    _ = s.on_detach() => break 'link,
                }
                continue;
            }
            let mut expired = Vec::new();
            let (taken, more) = {
                let mut g = q.lock();
                let t = g.take(id, false, Instant::now(), &mut expired);
                (t, g.ready() > 0)
            };
            self.forget(&q, expired).await;
            match taken {
                Some(t) => {
                    if more {
                        q.arrived.notify_one();
                    }
                    let item = if t.redeliveries > 0 {
                        Arc::new(redelivered(&t.msg, t.redeliveries))
                    } else {
                        t.msg
                    };
                    match s.send_batchable_ref(&item).await {
                        Ok(fut) => {
                            let seq = t.seq;
                            inflight.push(async move { (seq, fut.await.ok()) });
                        }
                        Err(e) => {
                            tracing::debug!(target: "qgate_amqp::broker", queue = %q.name, error = ?e, "consumer link ended");
                            q.lock().release(id, t.seq, false);
                            q.arrived.notify_one();
                            break 'link;
                        }
                    }
                }
                None => {
                    tokio::select! {
                        // Outcomes first, then the link's end, then news (decision U12: no
                        // unseeded draw among branches ready at once).
                        biased;
                        Some((seq, outcome)) = inflight.next(), if !inflight.is_empty() => {
                            if !self.settle(&q, id, seq, outcome).await {
                                break 'link;
                            }
                        }
                        _ = s.on_detach() => break 'link,
                        _ = &mut arrived => {}
                    }
                }
            }
        }
        // Outcomes that arrived before the detach still count (the peer settled them). Each
        // delivery is polled directly: `FuturesUnordered::next` may answer Pending while another
        // thread is mid-way through waking one of them, which lost outcomes under load (the
        // messages came back as released and were delivered twice).
        let settled: Vec<(u64, Option<Outcome>)> = std::pin::Pin::new(&mut inflight)
            .iter_pin_mut()
            .filter_map(|f| f.now_or_never())
            .collect();
        drop(inflight);
        for (seq, outcome) in settled {
            self.settle(&q, id, seq, outcome).await;
        }
        let back = q.lock().consumer_gone(id);
        if back > 0 {
            tracing::debug!(target: "qgate_amqp::broker", queue = %q.name, messages = back, "redelivering a gone consumer's messages");
            q.arrived.notify_one();
        }
        let _ = s.close().await;
    }

    /// Apply a consumer's outcome for `seq`; false when the delivery failed (the link or its
    /// session is gone).
    async fn settle(
        &self,
        q: &QueueState,
        id: ConsumerId,
        seq: u64,
        outcome: Option<Outcome>,
    ) -> bool {
        let alive = outcome.is_some();
        let gone = match outcome {
            // Accepted, or rejected (a message the consumer cannot process is not retried).
            Some(Outcome::Accepted(_)) | Some(Outcome::Rejected(_)) => q.lock().ack(id, seq),
            Some(Outcome::Released(_)) => {
                q.lock().release(id, seq, false);
                q.arrived.notify_one();
                false
            }
            // Modified, or the link failed before an outcome arrived.
            _ => {
                q.lock().release(id, seq, true);
                q.arrived.notify_one();
                false
            }
        };
        if gone {
            q.drained.notify_waiters();
            if let Some(store) = &self.inner.store {
                store.delete(&q.name, seq).await;
            }
        }
        alive
    }

    async fn forget(&self, q: &QueueState, expired: Vec<u64>) {
        if expired.is_empty() {
            return;
        }
        q.drained.notify_waiters();
        if let Some(store) = &self.inner.store {
            for seq in expired {
                store.delete(&q.name, seq).await;
            }
        }
    }
}
