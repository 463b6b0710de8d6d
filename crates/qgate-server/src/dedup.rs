//! At-most-once ingest for retried requests: a request carrying `qgate-request-id` is stored the
//! first time; a copy that arrives later (the gateway retried it on another path) gets the first
//! one's answer instead of a second copy on disk. Bounded: the oldest ids are forgotten first.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

enum Slot {
    /// The first copy is being stored; later copies wait for it.
    Pending(Arc<Notify>),
    /// Stored under this id with this many bytes.
    Done(u64, usize),
}

/// What a request id's arrival should do.
pub(crate) enum Admission {
    /// First copy: store it, then call [`Dedup::finish`].
    Store,
    /// A copy of a stored request: answer with the first one's result.
    Duplicate(u64, usize),
    /// A copy of a request still being stored: wait, then ask again.
    Wait(Arc<Notify>),
}

/// Remembers the last `cap` request ids.
pub(crate) struct Dedup {
    inner: Mutex<(HashMap<String, Slot>, VecDeque<String>)>,
    cap: usize,
}

impl Dedup {
    pub(crate) fn new(cap: usize) -> Dedup {
        Dedup {
            inner: Mutex::new((HashMap::new(), VecDeque::new())),
            cap: cap.max(1),
        }
    }

    pub(crate) fn admit(&self, rid: &str) -> Admission {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (map, order) = &mut *g;
        match map.get(rid) {
            Some(Slot::Done(id, n)) => Admission::Duplicate(*id, *n),
            Some(Slot::Pending(w)) => Admission::Wait(w.clone()),
            None => {
                map.insert(rid.to_string(), Slot::Pending(Arc::new(Notify::new())));
                order.push_back(rid.to_string());
                while order.len() > self.cap {
                    if let Some(old) = order.pop_front() {
                        // Never forget a pending one: its waiters need the answer.
                        if matches!(map.get(&old), Some(Slot::Pending(_))) {
                            order.push_back(old);
                            break;
                        }
                        map.remove(&old);
                    }
                }
                Admission::Store
            }
        }
    }

    /// The first copy was stored (`Some`) or failed (`None`: the id is forgotten so a retry can
    /// store it); wake any copies waiting.
    pub(crate) fn finish(&self, rid: &str, stored: Option<(u64, usize)>) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (map, order) = &mut *g;
        let waiters = match stored {
            Some((id, n)) => map.insert(rid.to_string(), Slot::Done(id, n)),
            None => {
                order.retain(|r| r != rid);
                map.remove(rid)
            }
        };
        if let Some(Slot::Pending(w)) = waiters {
            w.notify_waiters();
        }
    }
}
