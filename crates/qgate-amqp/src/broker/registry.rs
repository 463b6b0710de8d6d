//! The broker's table of queues: declaring, finding, purging and expiring them, and their
//! reports.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::config::QueueDecl;
use super::queue_state::QueueState;
use super::state::Broker;
use crate::queue::{Limits, Queue, QueueStats};

impl Broker {
    pub(super) fn queues(&self) -> MutexGuard<'_, BTreeMap<String, Arc<QueueState>>> {
        self.inner.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn find(&self, name: &str) -> Option<Arc<QueueState>> {
        self.queues().get(name).cloned()
    }

    pub(super) fn declare(
        &self,
        name: &str,
        limits: Limits,
        ttl: Option<Duration>,
    ) -> Arc<QueueState> {
        Self::declare_in(&mut self.queues(), name, limits, ttl)
    }

    /// Queue `name` in `queues` (whose lock the caller holds, so a check and its declaration
    /// are one step), created if missing.
    pub(super) fn declare_in(
        queues: &mut BTreeMap<String, Arc<QueueState>>,
        name: &str,
        limits: Limits,
        ttl: Option<Duration>,
    ) -> Arc<QueueState> {
        queues
            .entry(name.to_string())
            .or_insert_with(|| {
                Arc::new(QueueState {
                    name: name.to_string(),
                    q: Mutex::new(Queue::new(limits)),
                    ttl,
                    arrived: Notify::new(),
                    drained: Notify::new(),
                })
            })
            .clone()
    }

    /// Declare `decl` unless a queue has its name already (a config reload adds queues; it
    /// does not change live ones).
    pub fn declare_queue(&self, decl: &QueueDecl) -> Declared {
        // One lock for the check and the declaration: an auto-create between them must not
        // turn this queue's declared limits into the defaults.
        let mut queues = self.queues();
        if queues.contains_key(&decl.name) {
            return Declared::Exists;
        }
        if queues.len() >= self.inner.cfg.max_queues {
            return Declared::Full;
        }
        let limits = self.inner.cfg.default_limits();
        Self::declare_in(&mut queues, &decl.name, decl.limits(limits), decl.ttl);
        drop(queues);
        tracing::info!(target: "qgate_amqp::broker", queue = decl.name, "queue declared");
        Declared::Created
    }

    /// Remove every ready message of queue `name` (delivered, unsettled ones stay with their
    /// consumers); the store forgets them too, committed before this returns, in a task of its
    /// own so that a caller that gives up waiting cannot leave purged messages stored (to come
    /// back at a restart). None if there is no such queue.
    pub async fn purge(&self, name: &str) -> Option<usize> {
        let q = self.find(name)?;
        let mut purged = Vec::new();
        q.lock().purge(&mut purged);
        q.drained.notify_waiters();
        let n = purged.len();
        if let Some(s) = self.inner.store.clone() {
            let queue = q.name.clone();
            let forget = tokio::spawn(async move {
                for seq in purged {
                    s.delete(&queue, seq).await;
                }
                if let Err(e) = s.sync().await {
                    tracing::error!(target: "qgate_amqp::broker", error = %e, "purged messages may come back at a restart");
                }
            });
            let _ = forget.await;
        }
        tracing::info!(target: "qgate_amqp::broker", queue = name, messages = n, "queue purged");
        Some(n)
    }

    /// Drop expired messages everywhere (the store forgets them too).
    pub(super) async fn sweep(&self) {
        let queues: Vec<_> = self.queues().values().cloned().collect();
        let now = Instant::now();
        for q in queues {
            let mut expired = Vec::new();
            q.lock().expire(now, &mut expired);
            if !expired.is_empty() {
                q.drained.notify_waiters();
            }
            if let Some(s) = &self.inner.store {
                for seq in expired {
                    s.delete(&q.name, seq).await;
                }
            }
        }
    }

    /// Depth and counters of every queue.
    pub fn queue_stats(&self) -> Vec<QueueReport> {
        self.queues()
            .values()
            .map(|q| {
                let g = q.lock();
                QueueReport {
                    name: q.name.clone(),
                    depth: g.depth(),
                    ready: g.ready(),
                    unacked: g.unacked(),
                    bytes: g.bytes(),
                    stats: g.stats(),
                }
            })
            .collect()
    }
}

/// What [`Broker::declare_queue`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Declared {
    /// The queue was created.
    Created,
    /// A queue of that name exists (declared before or auto-created): it keeps its limits.
    Exists,
    /// The broker holds `max_queues` already.
    Full,
}

/// One queue's state for reports.
#[derive(Debug, Clone)]
pub struct QueueReport {
    /// Address.
    pub name: String,
    /// Ready + unsettled.
    pub depth: usize,
    /// Waiting for a consumer.
    pub ready: usize,
    /// Delivered, not settled.
    pub unacked: usize,
    /// Bytes held.
    pub bytes: usize,
    /// Counters.
    pub stats: QueueStats,
}
