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
pub(crate) enum Admission<'a> {
    /// First copy: store it, then [`Claim::finish`].
    Store(Claim<'a>),
    /// A copy of a stored request: answer with the first one's result.
    Duplicate(u64, usize),
    /// A copy of a request still being stored: [`Dedup::wait`], then ask again.
    Wait(Arc<Notify>),
}

/// The right to store the first copy of a request id. Dropped unfinished (its request's task
/// cancelled, or panicking in a sink), it forgets the id and wakes the copies waiting, so one of
/// them stores it: without this a retry of that id would wait for ever (decision S6). If the
/// sink had already stored the body (a blocking-pool write outlives its dropped await, a queue
/// may have taken the message), that copy is stored twice: at least once, never lost.
pub(crate) struct Claim<'a> {
    dedup: &'a Dedup,
    rid: Option<String>,
}

impl Claim<'_> {
    /// The first copy was stored (`Some`) or failed (`None`: the id is forgotten so a retry can
    /// store it); wake any copies waiting.
    pub(crate) fn finish(mut self, stored: Option<(u64, usize)>) {
        if let Some(rid) = self.rid.take() {
            self.dedup.settle(&rid, stored);
        }
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if let Some(rid) = self.rid.take() {
            self.dedup.settle(&rid, None);
        }
    }
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

    pub(crate) fn admit(&self, rid: &str) -> Admission<'_> {
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
                Admission::Store(Claim {
                    dedup: self,
                    rid: Some(rid.to_string()),
                })
            }
        }
    }

    /// Wait until the copy being stored under `rid` (whose [`Admission::Wait`] gave `pending`)
    /// is settled; ask [`Dedup::admit`] again after. Only looks: it never claims the id.
    pub(crate) async fn wait(&self, rid: &str, pending: Arc<Notify>) {
        // Registered before the look below: `notify_waiters` reaches a `Notified` from its
        // creation on, so a settle between the look and the await is not missed.
        let notified = pending.notified();
        let still = {
            let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            matches!(g.0.get(rid), Some(Slot::Pending(w)) if Arc::ptr_eq(w, &pending))
        };
        if still {
            notified.await;
        }
    }

    fn settle(&self, rid: &str, stored: Option<(u64, usize)>) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn store<'a>(d: &'a Dedup, rid: &str) -> Claim<'a> {
        match d.admit(rid) {
            Admission::Store(c) => c,
            _ => panic!("{rid} should be stored"),
        }
    }

    fn pending(d: &Dedup, rid: &str) -> Arc<Notify> {
        match d.admit(rid) {
            Admission::Wait(w) => w,
            _ => panic!("{rid} should be pending"),
        }
    }

    #[test]
    fn a_stored_copy_answers_later_ones() {
        let d = Dedup::new(8);
        store(&d, "a").finish(Some((7, 3)));
        assert!(matches!(d.admit("a"), Admission::Duplicate(7, 3)));
        // A failed first copy is forgotten: the next copy stores it.
        store(&d, "b").finish(None);
        store(&d, "b").finish(Some((8, 1)));
        assert!(matches!(d.admit("b"), Admission::Duplicate(8, 1)));
    }

    #[tokio::test]
    async fn a_claim_dropped_unfinished_lets_a_waiting_copy_store() {
        let d = Arc::new(Dedup::new(8));
        let first = store(&d, "a");
        let w = pending(&d, "a");
        let waiter = {
            let d = d.clone();
            tokio::spawn(async move { d.wait("a", w).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "the copy waits for the first");
        drop(first); // as a cancelled or panicking request's task drops it
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiting copy is woken")
            .unwrap();
        store(&d, "a").finish(Some((1, 1)));
    }

    #[tokio::test]
    async fn a_copy_settled_before_it_waits_does_not_wait() {
        let d = Dedup::new(8);
        let first = store(&d, "a");
        let w = pending(&d, "a");
        first.finish(None);
        // The first copy failed between the copy's admit and its wait: no wake-up will come.
        tokio::time::timeout(Duration::from_secs(5), d.wait("a", w))
            .await
            .expect("no wait for a settled id");
        // Asking again claims the id once: a second ask waits on that claim, not on itself.
        let c = store(&d, "a");
        assert!(matches!(d.admit("a"), Admission::Wait(_)));
        c.finish(Some((2, 2)));
        assert!(matches!(d.admit("a"), Admission::Duplicate(2, 2)));
    }

    #[test]
    fn pending_ids_outlive_the_cap() {
        let d = Dedup::new(2);
        let held = store(&d, "a");
        for rid in ["b", "c", "d"] {
            store(&d, rid).finish(Some((0, 0)));
        }
        assert!(matches!(d.admit("a"), Admission::Wait(_)));
        held.finish(Some((9, 9)));
        assert!(matches!(d.admit("a"), Admission::Duplicate(9, 9)));
    }
}
