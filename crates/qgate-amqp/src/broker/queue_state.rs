//! One queue as the broker holds it: the sans-IO queue behind a lock, its TTL, and what wakes
//! its consumers and producers.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use super::message::Item;
use crate::queue::Queue;

pub(super) struct QueueState {
    pub(super) name: String,
    pub(super) q: Mutex<Queue<Item>>,
    pub(super) ttl: Option<Duration>,
    /// Wakes a consumer when a message arrives (chained: a consumer that takes one and sees
    /// more wakes the next).
    pub(super) arrived: Notify,
    /// Wakes producers waiting for the queue to drain below the high-water mark.
    pub(super) drained: Notify,
}

impl QueueState {
    /// Return once the queue is at or below `high_msgs` messages and `high_bytes`.
    pub(super) async fn wait_below(&self, high_msgs: usize, high_bytes: usize) {
        loop {
            let drained = self.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            let (depth, bytes) = {
                let g = self.lock();
                (g.depth(), g.bytes())
            };
            if depth <= high_msgs && bytes <= high_bytes {
                return;
            }
            drained.await;
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Queue<Item>> {
        self.q.lock().unwrap_or_else(|e| e.into_inner())
    }
}
