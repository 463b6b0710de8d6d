//! The 0-RTT replay guard (decision M9): transfers that may have been replayed are recognised
//! by queue, message-id and bytes.

use std::time::Duration;
// tokio's clock: the replay window runs in virtual time on the simulator (decision M18).
use tokio::time::Instant;

/// Transfers from 0-RTT connections seen recently: a replayed flight repeats queue, message-id
/// and bytes exactly, so a repeat within [`REPLAY_WINDOW`] is settled without queueing it
/// again. Bounded: beyond [`REPLAY_KEYS`] the oldest keys go first.
#[derive(Debug, Default)]
pub(super) struct ReplayGuard {
    seen: std::collections::HashMap<u64, Instant>,
    order: std::collections::VecDeque<(u64, Instant)>,
}

/// How long a 0-RTT transfer is remembered (longer than a session ticket is accepted).
const REPLAY_WINDOW: Duration = Duration::from_secs(24 * 3600);
/// Most remembered transfers (~50 bytes each).
const REPLAY_KEYS: usize = 1 << 18;

impl ReplayGuard {
    /// Record `key`; false if it was seen within the window.
    pub(super) fn first_time(&mut self, key: u64, now: Instant) -> bool {
        while let Some(&(k, t)) = self.order.front() {
            if self.order.len() < REPLAY_KEYS && now.duration_since(t) < REPLAY_WINDOW {
                break;
            }
            self.order.pop_front();
            if self.seen.get(&k) == Some(&t) {
                self.seen.remove(&k);
            }
        }
        if self.seen.contains_key(&key) {
            return false;
        }
        self.seen.insert(key, now);
        self.order.push_back((key, now));
        true
    }

    pub(super) fn forget(&mut self, key: u64) {
        self.seen.remove(&key);
    }
}

pub(super) fn replay_key(
    queue: &str,
    id: &fe2o3_amqp::types::messaging::MessageId,
    bytes: &[u8],
) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    queue.hash(&mut h);
    format!("{id:?}").hash(&mut h);
    bytes.hash(&mut h);
    h.finish()
}
