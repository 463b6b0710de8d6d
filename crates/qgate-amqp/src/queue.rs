//! One queue, sans-IO: messages in arrival order, handed to competing consumers, held until
//! settled, put back (in order) when a consumer releases them or goes away, dropped when their
//! TTL passes, refused above the queue's limits. The async broker drives it; tests drive it
//! directly.

use std::collections::{BTreeMap, HashMap};
// tokio's clock: TTLs run in virtual time on the simulator (M18).
use tokio::time::Instant;

/// Identifies one consumer link within the broker.
pub type ConsumerId = u64;

/// A queue's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most messages held (ready + delivered, not yet settled).
    pub max_messages: usize,
    /// Most message bytes held.
    pub max_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_messages: 1_000_000,
            max_bytes: 64 << 20,
        }
    }
}

/// Why a message was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The queue holds `max_messages` already.
    #[error("queue is full ({0} messages)")]
    Messages(usize),
    /// Adding the message would pass `max_bytes`.
    #[error("queue is full ({0} bytes)")]
    Bytes(usize),
}

#[derive(Debug, Clone)]
struct Entry<M> {
    msg: M,
    size: usize,
    expires: Option<Instant>,
    /// Times delivered and not settled (AMQP header delivery-count on redelivery).
    deliveries: u32,
}

/// A message handed to a consumer.
#[derive(Debug, Clone, PartialEq)]
pub struct Taken<M> {
    /// Its sequence number in the queue.
    pub seq: u64,
    /// The message.
    pub msg: M,
    /// Earlier deliveries that were not settled (0 on the first delivery).
    pub redeliveries: u32,
}

/// Counters since the queue was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Messages accepted into the queue.
    pub enqueued: u64,
    /// Messages settled by consumers (removed for good).
    pub acked: u64,
    /// Messages put back for redelivery.
    pub released: u64,
    /// Messages dropped because their TTL passed.
    pub expired: u64,
    /// Messages refused by the limits.
    pub refused: u64,
    /// Ready messages removed by a purge.
    pub purged: u64,
}

/// One queue.
#[derive(Debug)]
pub struct Queue<M> {
    limits: Limits,
    /// Ready messages by sequence number (so released ones go back in their place).
    ready: BTreeMap<u64, Entry<M>>,
    /// Delivered, not yet settled: sequence number → (consumer, entry).
    unacked: HashMap<u64, (ConsumerId, Entry<M>)>,
    next_seq: u64,
    bytes: usize,
    stats: QueueStats,
}

impl<M: Clone> Queue<M> {
    /// An empty queue.
    pub fn new(limits: Limits) -> Self {
        Queue {
            limits,
            ready: BTreeMap::new(),
            unacked: HashMap::new(),
            next_seq: 0,
            bytes: 0,
            stats: QueueStats::default(),
        }
    }

    /// Messages held (ready + delivered unsettled).
    pub fn depth(&self) -> usize {
        self.ready.len() + self.unacked.len()
    }

    /// Messages waiting for a consumer.
    pub fn ready(&self) -> usize {
        self.ready.len()
    }

    /// Messages delivered and not yet settled.
    pub fn unacked(&self) -> usize {
        self.unacked.len()
    }

    /// Message bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The limits.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Counters.
    pub fn stats(&self) -> QueueStats {
        self.stats
    }

    /// The sequence number the next message will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    fn admit(&mut self, size: usize) -> Result<(), Refused> {
        if self.depth() >= self.limits.max_messages {
            self.stats.refused += 1;
            return Err(Refused::Messages(self.limits.max_messages));
        }
        if self.bytes + size > self.limits.max_bytes {
            self.stats.refused += 1;
            return Err(Refused::Bytes(self.limits.max_bytes));
        }
        Ok(())
    }

    /// Check that a message of `size` bytes would be admitted, and reserve its sequence number.
    /// The broker makes it durable under that number before [`Queue::insert`].
    pub fn reserve(&mut self, size: usize) -> Result<u64, Refused> {
        self.admit(size)?;
        let seq = self.next_seq;
        self.next_seq += 1;
        Ok(seq)
    }

    /// Add `msg` (`size` bytes) under a reserved (or recovered) sequence number; `expires` is
    /// when its TTL passes. Returns false when the limits no longer admit it (another producer
    /// filled the queue between reserve and insert).
    pub fn insert(&mut self, seq: u64, msg: M, size: usize, expires: Option<Instant>) -> bool {
        if self.admit(size).is_err() {
            return false;
        }
        self.next_seq = self.next_seq.max(seq + 1);
        self.bytes += size;
        self.stats.enqueued += 1;
        self.ready.insert(
            seq,
            Entry {
                msg,
                size,
                expires,
                deliveries: 0,
            },
        );
        true
    }

    /// Reserve and insert in one step.
    pub fn enqueue(
        &mut self,
        msg: M,
        size: usize,
        expires: Option<Instant>,
    ) -> Result<u64, Refused> {
        let seq = self.reserve(size)?;
        let ok = self.insert(seq, msg, size, expires);
        debug_assert!(ok, "reserve just admitted it");
        Ok(seq)
    }

    /// Hand the oldest live message to `consumer`. Unless `settled` (at-most-once), the queue
    /// keeps it until [`Queue::ack`] or [`Queue::release`]. Messages whose TTL passed are dropped
    /// on the way and returned in `expired` (sequence numbers) so the store can forget them.
    pub fn take(
        &mut self,
        consumer: ConsumerId,
        settled: bool,
        now: Instant,
        expired: &mut Vec<u64>,
    ) -> Option<Taken<M>> {
        while let Some((seq, entry)) = self.ready.pop_first() {
            if entry.expires.is_some_and(|t| t <= now) {
                self.bytes -= entry.size;
                self.stats.expired += 1;
                expired.push(seq);
                continue;
            }
            let taken = Taken {
                seq,
                msg: entry.msg.clone(),
                redeliveries: entry.deliveries,
            };
            if settled {
                self.bytes -= entry.size;
                self.stats.acked += 1;
            } else {
                self.unacked.insert(seq, (consumer, entry));
            }
            return Some(taken);
        }
        None
    }

    /// `consumer` settled `seq` (accepted or rejected): it leaves the queue. False if it was not
    /// outstanding with that consumer.
    pub fn ack(&mut self, consumer: ConsumerId, seq: u64) -> bool {
        match self.unacked.get(&seq) {
            Some((c, _)) if *c == consumer => {
                let (_, e) = self.unacked.remove(&seq).expect("present");
                self.bytes -= e.size;
                self.stats.acked += 1;
                true
            }
            _ => false,
        }
    }

    /// `consumer` gave `seq` back (released, modified, or the transfer failed): it goes back in
    /// its place for another delivery; `delivered` counts the attempt toward its redeliveries.
    pub fn release(&mut self, consumer: ConsumerId, seq: u64, delivered: bool) -> bool {
        match self.unacked.get(&seq) {
            Some((c, _)) if *c == consumer => {
                let (_, mut e) = self.unacked.remove(&seq).expect("present");
                if delivered {
                    e.deliveries += 1;
                }
                self.stats.released += 1;
                self.ready.insert(seq, e);
                true
            }
            _ => false,
        }
    }

    /// `consumer`'s link or connection is gone: everything it held goes back for redelivery.
    /// Returns how many.
    pub fn consumer_gone(&mut self, consumer: ConsumerId) -> usize {
        let mine: Vec<u64> = self
            .unacked
            .iter()
            .filter(|(_, (c, _))| *c == consumer)
            .map(|(s, _)| *s)
            .collect();
        for s in &mine {
            self.release(consumer, *s, true);
        }
        mine.len()
    }

    /// Drop every ready message (an operator's purge); their sequence numbers go to `purged`.
    /// Messages delivered and not yet settled stay: their consumers still hold them.
    pub fn purge(&mut self, purged: &mut Vec<u64>) {
        for (s, e) in std::mem::take(&mut self.ready) {
            self.bytes -= e.size;
            self.stats.purged += 1;
            purged.push(s);
        }
    }

    /// Drop every ready message whose TTL has passed; their sequence numbers go to `expired`.
    pub fn expire(&mut self, now: Instant, expired: &mut Vec<u64>) {
        let dead: Vec<u64> = self
            .ready
            .iter()
            .filter(|(_, e)| e.expires.is_some_and(|t| t <= now))
            .map(|(s, _)| *s)
            .collect();
        for s in dead {
            let e = self.ready.remove(&s).expect("present");
            self.bytes -= e.size;
            self.stats.expired += 1;
            expired.push(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn purge_drops_ready_messages_and_keeps_delivered_ones() {
        let mut q = q();
        for m in ["a", "b", "c"] {
            q.enqueue(m, 10, None).unwrap();
        }
        let t = q.take(7, false, Instant::now(), &mut Vec::new()).unwrap();
        let mut gone = Vec::new();
        q.purge(&mut gone);
        assert_eq!(gone.len(), 2);
        assert!(!gone.contains(&t.seq));
        assert_eq!(
            (q.depth(), q.ready(), q.unacked(), q.bytes()),
            (1, 0, 1, 10)
        );
        assert_eq!(q.stats().purged, 2);
        assert!(q.ack(7, t.seq));
        assert_eq!((q.depth(), q.bytes()), (0, 0));
        // Room is back for new messages.
        q.enqueue("d", 10, None).unwrap();
        assert_eq!(q.ready(), 1);
    }

    fn q() -> Queue<&'static str> {
        Queue::new(Limits {
            max_messages: 3,
            max_bytes: 100,
        })
    }

    #[test]
    fn fifo_and_settled_delivery_leaves_the_queue() {
        let mut q = q();
        let now = Instant::now();
        let mut ex = Vec::new();
        q.enqueue("a", 1, None).unwrap();
        q.enqueue("b", 1, None).unwrap();
        let t = q.take(1, true, now, &mut ex).unwrap();
        assert_eq!((t.seq, t.msg, t.redeliveries), (0, "a", 0));
        assert_eq!(q.depth(), 1);
        assert_eq!(q.take(1, true, now, &mut ex).unwrap().msg, "b");
        assert!(q.take(1, true, now, &mut ex).is_none());
        assert_eq!(q.bytes(), 0);
        assert_eq!(q.stats().acked, 2);
    }

    #[test]
    fn limits_refuse_by_count_and_bytes() {
        let mut q = q();
        q.enqueue("a", 10, None).unwrap();
        assert_eq!(q.enqueue("big", 91, None), Err(Refused::Bytes(100)));
        q.enqueue("b", 10, None).unwrap();
        q.enqueue("c", 10, None).unwrap();
        assert_eq!(q.enqueue("d", 1, None), Err(Refused::Messages(3)));
        assert_eq!(q.stats().refused, 2);
        // Unsettled deliveries still count until settled.
        let mut ex = Vec::new();
        let t = q.take(7, false, Instant::now(), &mut ex).unwrap();
        assert!(q.enqueue("d", 1, None).is_err());
        assert!(q.ack(7, t.seq));
        q.enqueue("d", 1, None).unwrap();
    }

    #[test]
    fn competing_consumers_get_distinct_messages_and_acks_are_per_consumer() {
        let mut q = q();
        let now = Instant::now();
        let mut ex = Vec::new();
        q.enqueue("a", 1, None).unwrap();
        q.enqueue("b", 1, None).unwrap();
        let a = q.take(1, false, now, &mut ex).unwrap();
        let b = q.take(2, false, now, &mut ex).unwrap();
        assert_ne!(a.seq, b.seq);
        assert!(
            !q.ack(2, a.seq),
            "consumer 2 cannot settle consumer 1's delivery"
        );
        assert!(q.ack(1, a.seq));
        assert!(!q.ack(1, a.seq), "twice");
        assert_eq!(q.unacked(), 1);
    }

    #[test]
    fn released_and_orphaned_messages_come_back_in_order() {
        let mut q = Queue::new(Limits::default());
        let now = Instant::now();
        let mut ex = Vec::new();
        for m in ["a", "b", "c", "d"] {
            q.enqueue(m, 1, None).unwrap();
        }
        let a = q.take(1, false, now, &mut ex).unwrap();
        let b = q.take(1, false, now, &mut ex).unwrap();
        let c = q.take(2, false, now, &mut ex).unwrap();
        assert!(q.release(1, b.seq, true));
        // Consumer 1 goes away holding "a": back before "b".
        assert_eq!(q.consumer_gone(1), 1);
        assert_eq!(q.consumer_gone(1), 0);
        let order: Vec<_> = std::iter::from_fn(|| q.take(3, true, now, &mut ex))
            .map(|t| (t.msg, t.redeliveries))
            .collect();
        assert_eq!(order, vec![("a", 1), ("b", 1), ("d", 0)]);
        assert_eq!(q.unacked(), 1);
        assert!(q.ack(2, c.seq));
        assert_eq!(a.seq, 0);
        assert_eq!(q.depth(), 0);
        assert_eq!(q.bytes(), 0);
    }

    #[test]
    fn ttl_drops_expired_messages_on_take_and_on_sweep() {
        let mut q = Queue::new(Limits::default());
        let t0 = Instant::now();
        let mut ex = Vec::new();
        q.enqueue("old", 5, Some(t0 + Duration::from_secs(1)))
            .unwrap();
        q.enqueue("new", 5, Some(t0 + Duration::from_secs(10)))
            .unwrap();
        q.enqueue("forever", 5, None).unwrap();
        let t = q
            .take(1, true, t0 + Duration::from_secs(2), &mut ex)
            .unwrap();
        assert_eq!(t.msg, "new");
        assert_eq!(ex, vec![0]);
        ex.clear();
        q.enqueue("x", 5, Some(t0)).unwrap();
        q.expire(t0 + Duration::from_secs(2), &mut ex);
        assert_eq!(ex, vec![3]);
        assert_eq!(q.depth(), 1);
        assert_eq!(q.bytes(), 5);
        assert_eq!(q.stats().expired, 2);
    }

    #[test]
    fn recovered_messages_keep_their_sequence_numbers() {
        let mut q = Queue::new(Limits::default());
        assert!(q.insert(41, "x", 1, None));
        assert!(q.insert(7, "y", 1, None));
        assert_eq!(q.next_seq(), 42);
        let mut ex = Vec::new();
        assert_eq!(q.take(1, true, Instant::now(), &mut ex).unwrap().seq, 7);
        assert_eq!(q.reserve(1).unwrap(), 42);
    }

    proptest::proptest! {
        /// Any interleaving of operations: every message is acked, expired, refused or still
        /// held exactly once; byte and depth accounting stay exact; limits hold.
        #[test]
        fn accounting_is_exact(ops in proptest::collection::vec((0u8..6, 0u64..4, 1usize..20), 1..200)) {
            let mut q: Queue<u64> = Queue::new(Limits { max_messages: 8, max_bytes: 60 });
            let now = Instant::now();
            let mut held: HashMap<u64, usize> = HashMap::new();
            let mut out: HashMap<u64, (ConsumerId, usize)> = HashMap::new();
            let mut ex = Vec::new();
            let mut gone = 0u64;
            for (op, c, size) in ops {
                match op {
                    0 | 1 => {
                        if let Ok(s) = q.enqueue(s_of(&q), size, None) { held.insert(s, size); }
                    }
                    2 => if let Some(t) = q.take(c, false, now, &mut ex) {
                        let size = held.remove(&t.seq).expect("held");
                        out.insert(t.seq, (c, size));
                    },
                    3 => if let Some(t) = q.take(c, true, now, &mut ex) {
                        held.remove(&t.seq).expect("held");
                        gone += 1;
                    },
                    4 => if let Some((&s, &(oc, _))) = out.iter().next() {
                        proptest::prop_assert!(q.ack(oc, s));
                        out.remove(&s);
                        gone += 1;
                    },
                    _ => {
                        let n = q.consumer_gone(c);
                        let back: Vec<_> = out.iter().filter(|(_, (oc, _))| *oc == c).map(|(s, v)| (*s, v.1)).collect();
                        proptest::prop_assert_eq!(n, back.len());
                        for (s, size) in back { out.remove(&s); held.insert(s, size); }
                    }
                }
                proptest::prop_assert!(q.depth() <= 8);
                proptest::prop_assert!(q.bytes() <= 60);
                proptest::prop_assert_eq!(q.ready(), held.len());
                proptest::prop_assert_eq!(q.unacked(), out.len());
                proptest::prop_assert_eq!(q.bytes(), held.values().sum::<usize>() + out.values().map(|v| v.1).sum::<usize>());
            }
            proptest::prop_assert_eq!(q.stats().acked, gone);
            proptest::prop_assert!(ex.is_empty());
        }
    }

    fn s_of(q: &Queue<u64>) -> u64 {
        q.next_seq()
    }
}
