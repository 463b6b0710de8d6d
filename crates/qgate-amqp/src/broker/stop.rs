//! A clean stop (decision M32): consumers are handed no more messages, what they hold is given a
//! bounded time to be settled, and every settlement is made durable before the process exits.
//! After a crash a settled message may come back (at-least-once, M30); after a clean stop it
//! may not.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::state::Broker;
use crate::store::StoreError;

/// How often [`Broker::drain`] looks at what consumers still hold.
const DRAIN_POLL: Duration = Duration::from_millis(10);

impl Broker {
    /// Begin a clean stop: no consumer is handed another message from now on, and this returns
    /// once no consumer holds an unsettled one, or after `grace` (a consumer that never settles
    /// cannot hold the stop). Producers are still served; what they send stays queued.
    pub async fn drain(&self, grace: Duration) {
        self.inner.stopping.store(true, Ordering::Release);
        // Wake consumers waiting for a message, so they see the stop and wait only for their
        // outcomes.
        for q in self.queues().values() {
            q.arrived.notify_waiters();
        }
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            let held: usize = self.queues().values().map(|q| q.lock().unacked()).sum();
            if held == 0 || tokio::time::Instant::now() >= deadline {
                if held > 0 {
                    tracing::info!(target: "qgate_amqp::broker", messages = held, "stopping with unsettled deliveries: they will be delivered again");
                }
                return;
            }
            tokio::time::sleep(DRAIN_POLL).await;
        }
    }

    /// True once [`drain`](Self::drain) has begun.
    pub(super) fn stopping(&self) -> bool {
        self.inner.stopping.load(Ordering::Acquire)
    }

    /// Wait until every settlement and deletion made so far is durable in the store (nothing to
    /// do without one).
    pub async fn flush(&self) -> Result<(), StoreError> {
        match &self.inner.store {
            Some(s) => s.sync().await,
            None => Ok(()),
        }
    }
}
