//! FQ-CoDel (RFC 8290): flows hashed into buckets, deficit round robin with new/old lists
//! (sparse flows first), CoDel per flow, and fattest-flow head drops on overflow.

use std::collections::VecDeque;
use std::time::Instant;

use crate::codel::{CodelParams, CodelState};
use crate::fifo::Fifo;
use crate::{Backlog, DropReason, Dropped, Packet, QueueDiscipline, QueueStats, Verdict};

/// FQ-CoDel parameters (RFC 8290 §5 / Linux defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FqCodelParams {
    /// Number of flow buckets (1024).
    pub flows: usize,
    /// DRR quantum in bytes (1514).
    pub quantum: i64,
    /// Packet limit across all flows (10240).
    pub limit: usize,
    /// Per-flow CoDel parameters (target 5 ms, interval 100 ms, ECN on).
    pub codel: CodelParams,
    /// Most packets one overflow event drops from the fattest flow (64, Linux `drop_batch`).
    pub drop_batch: usize,
    /// Perturbs the flow hash (Linux picks it at random; here it comes from the seed).
    pub perturbation: u64,
}

impl Default for FqCodelParams {
    fn default() -> Self {
        FqCodelParams {
            flows: 1024,
            quantum: 1514,
            limit: 10240,
            codel: CodelParams {
                ecn: true,
                ..CodelParams::default()
            },
            drop_batch: 64,
            perturbation: 0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum List {
    None,
    New,
    Old,
}

#[derive(Debug)]
struct Flow<T> {
    fifo: Fifo<T>,
    codel: CodelState,
    deficit: i64,
    list: List,
}

/// FQ-CoDel.
#[derive(Debug)]
pub struct FqCodel<T> {
    params: FqCodelParams,
    flows: Vec<Flow<T>>,
    new_flows: VecDeque<usize>,
    old_flows: VecDeque<usize>,
    packets: usize,
    bytes: usize,
    stats: QueueStats,
}

impl<T> FqCodel<T> {
    /// FQ-CoDel with `params`.
    pub fn new(params: FqCodelParams) -> Self {
        let flows = (0..params.flows.max(1))
            .map(|_| Flow {
                fifo: Fifo::default(),
                codel: CodelState::default(),
                deficit: 0,
                list: List::None,
            })
            .collect();
        FqCodel {
            params,
            flows,
            new_flows: VecDeque::new(),
            old_flows: VecDeque::new(),
            packets: 0,
            bytes: 0,
            stats: QueueStats::default(),
        }
    }

    fn bucket(&self, flow: u64) -> usize {
        // splitmix64 finaliser over flow ⊕ perturbation, then reduce.
        let mut z = flow ^ self.params.perturbation;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z % self.flows.len() as u64) as usize
    }

    /// The deficit of the bucket `flow` hashes to (for tests and traces).
    pub fn deficit_of(&self, flow: u64) -> i64 {
        self.flows[self.bucket(flow)].deficit
    }

    /// Whether `flow`'s bucket is on the new list (`Some(true)`), the old list
    /// (`Some(false)`), or inactive (`None`).
    pub fn is_new(&self, flow: u64) -> Option<bool> {
        match self.flows[self.bucket(flow)].list {
            List::New => Some(true),
            List::Old => Some(false),
            List::None => None,
        }
    }

    /// RFC 8290 §4.1.1: drop from the head of the fattest flow until half its bytes or
    /// `drop_batch` packets are gone. Returns the bucket dropped from.
    fn drop_from_fattest(&mut self, dropped: &mut Vec<Dropped<T>>) -> usize {
        let (idx, fattest) = self
            .flows
            .iter()
            .enumerate()
            .max_by_key(|(i, f)| (f.fifo.bytes, std::cmp::Reverse(*i)))
            .map(|(i, f)| (i, f.fifo.bytes))
            .expect("at least one bucket");
        let threshold = fattest / 2;
        let mut freed = 0;
        let mut n = 0;
        while n < self.params.drop_batch && freed < threshold.max(1) {
            let Some(p) = self.flows[idx].fifo.packets.pop_front() else {
                break;
            };
            self.flows[idx].fifo.bytes -= p.size;
            freed += p.size;
            n += 1;
            self.packets -= 1;
            self.bytes -= p.size;
            self.stats.count_drop(DropReason::Overflow);
            self.stats.dropped_after_enqueue += 1;
            dropped.push(Dropped {
                packet: p,
                reason: DropReason::Overflow,
            });
        }
        idx
    }
}

impl<T: Send> QueueDiscipline<T> for FqCodel<T> {
    fn name(&self) -> &'static str {
        "fq-codel"
    }

    fn enqueue(
        &mut self,
        now: Instant,
        mut packet: Packet<T>,
        dropped: &mut Vec<Dropped<T>>,
    ) -> Verdict {
        self.stats.offered += 1;
        let idx = self.bucket(packet.flow);
        packet.enqueued_at = Some(now);
        self.packets += 1;
        self.bytes += packet.size;
        let flow = &mut self.flows[idx];
        flow.fifo.push(packet);
        if flow.list == List::None {
            // A flow still on old_flows (even empty) is not re-added as new (RFC 8290 §4.1).
            flow.list = List::New;
            flow.deficit = self.params.quantum;
            self.new_flows.push_back(idx);
        }
        self.stats.enqueued += 1;
        if self.packets > self.params.limit {
            // The arrival is queued; the overflow is paid by the fattest flow.
            let from = self.drop_from_fattest(dropped);
            self.stats.observe_backlog(self.backlog());
            // Drops come from the head, so the arrival (at the tail) went only if its own flow
            // was emptied.
            if from == idx && self.flows[idx].fifo.packets.is_empty() {
                return Verdict::Dropped(DropReason::Overflow);
            }
            return Verdict::Enqueued;
        }
        self.stats.observe_backlog(self.backlog());
        Verdict::Enqueued
    }

    fn dequeue(&mut self, now: Instant, dropped: &mut Vec<Dropped<T>>) -> Option<Packet<T>> {
        loop {
            let (from_new, idx) = match (self.new_flows.front(), self.old_flows.front()) {
                (Some(&i), _) => (true, i),
                (None, Some(&i)) => (false, i),
                (None, None) => return None,
            };
            let flow = &mut self.flows[idx];
            if flow.deficit <= 0 {
                flow.deficit += self.params.quantum;
                flow.list = List::Old;
                if from_new {
                    self.new_flows.pop_front();
                } else {
                    self.old_flows.pop_front();
                }
                self.old_flows.push_back(idx);
                continue;
            }
            let before = dropped.len();
            let bytes_before = flow.fifo.bytes;
            let p = flow.codel.dequeue(
                &mut flow.fifo,
                now,
                &self.params.codel,
                dropped,
                &mut self.stats.marked,
            );
            let removed = bytes_before - flow.fifo.bytes;
            let n_dropped = dropped.len() - before;
            self.stats.dropped_aqm += n_dropped as u64;
            self.stats.dropped_after_enqueue += n_dropped as u64;
            self.packets -= n_dropped + usize::from(p.is_some());
            self.bytes -= removed;
            match p {
                None => {
                    if from_new {
                        self.new_flows.pop_front();
                        if !self.old_flows.is_empty() {
                            // Force a pass through old_flows so new flows cannot starve them.
                            flow.list = List::Old;
                            self.old_flows.push_back(idx);
                        } else {
                            flow.list = List::None;
                        }
                    } else {
                        self.old_flows.pop_front();
                        flow.list = List::None;
                    }
                }
                Some(p) => {
                    flow.deficit -= p.size as i64;
                    self.stats.dequeued += 1;
                    self.stats.dequeued_bytes += p.size as u64;
                    return Some(p);
                }
            }
        }
    }

    fn backlog(&self) -> Backlog {
        Backlog {
            packets: self.packets,
            bytes: self.bytes,
        }
    }

    fn stats(&self) -> QueueStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn two_flows(params: FqCodelParams) -> (FqCodel<u32>, u64, u64) {
        let q = FqCodel::new(params);
        // Pick two flow ids that land in different buckets.
        let a = 1u64;
        let b = (2..).find(|f| q.bucket(*f) != q.bucket(a)).unwrap();
        (q, a, b)
    }

    /// aqm.md: limit 4, three packets of A and one of B, then one more of B → two dropped
    /// from A (the fattest), B's packets kept.
    #[test]
    fn overflow_drops_from_the_fattest_flow() {
        let (mut q, a, b) = two_flows(FqCodelParams {
            limit: 4,
            ..Default::default()
        });
        let t0 = Instant::now();
        let mut d = Vec::new();
        for i in 0..3 {
            q.enqueue(t0, Packet::new(1000, a, i), &mut d);
        }
        q.enqueue(t0, Packet::new(1000, b, 10), &mut d);
        assert!(d.is_empty());
        assert_eq!(
            q.enqueue(t0, Packet::new(1000, b, 11), &mut d),
            Verdict::Enqueued
        );
        assert_eq!(
            d.iter().map(|x| x.packet.payload).collect::<Vec<_>>(),
            vec![0, 1]
        );
        assert_eq!(q.backlog().packets, 3);
        let s = q.stats();
        assert_eq!((s.dropped_overflow, s.enqueued, s.offered), (2, 5, 5));
    }

    /// DRR with quantum 90 and 120-byte packets: deficits and list moves step by step
    /// (−30, 60, −60, 30, −90, 90, 30 over the sequence below).
    #[test]
    fn deficit_round_robin_step_by_step() {
        let (mut q, a, b) = two_flows(FqCodelParams {
            quantum: 90,
            ..Default::default()
        });
        let t0 = Instant::now();
        let mut d = Vec::new();
        for i in 0..4 {
            q.enqueue(t0, Packet::new(120, a, i), &mut d);
        }
        assert_eq!((q.deficit_of(a), q.is_new(a)), (90, Some(true)));
        // A is served once: 90 − 120 = −30, still on the new list.
        assert_eq!(q.dequeue(t0, &mut d).unwrap().payload, 0);
        assert_eq!((q.deficit_of(a), q.is_new(a)), (-30, Some(true)));
        for i in 0..3 {
            q.enqueue(t0, Packet::new(120, b, 10 + i), &mut d);
        }
        assert_eq!((q.deficit_of(b), q.is_new(b)), (90, Some(true)));
        // A's deficit is spent: it gets a quantum (−30 + 90 = 60) and moves to old; B is served.
        assert_eq!(q.dequeue(t0, &mut d).unwrap().payload, 10);
        assert_eq!((q.deficit_of(a), q.is_new(a)), (60, Some(false)));
        assert_eq!((q.deficit_of(b), q.is_new(b)), (-30, Some(true)));
        // B moves to old with 60; A (head of old) is served: 60 − 120 = −60.
        assert_eq!(q.dequeue(t0, &mut d).unwrap().payload, 1);
        assert_eq!((q.deficit_of(a), q.is_new(a)), (-60, Some(false)));
        assert_eq!((q.deficit_of(b), q.is_new(b)), (60, Some(false)));
        // A gets a quantum (30) and goes behind B; B is served: 60 − 120 = −60.
        assert_eq!(q.dequeue(t0, &mut d).unwrap().payload, 11);
        assert_eq!(q.deficit_of(a), 30);
        assert_eq!(q.deficit_of(b), -60);
        // A is served: 30 − 120 = −90.
        assert_eq!(q.dequeue(t0, &mut d).unwrap().payload, 2);
        assert_eq!(q.deficit_of(a), -90);
        // A gets a quantum (0) and goes behind B; B (30) is served: 30 − 120 = −90.
        assert_eq!(q.dequeue(t0, &mut d).unwrap().payload, 12);
        assert_eq!(q.deficit_of(b), -90);
        assert_eq!(q.deficit_of(a), 0);
        // B → 0, A → 90, B → 90 (each a turn to the tail of old_flows); A is served: −30.
        assert_eq!(q.dequeue(t0, &mut d).unwrap().payload, 3);
        assert_eq!((q.deficit_of(a), q.deficit_of(b)), (-30, 90));
        assert!(q.dequeue(t0, &mut d).is_none());
        assert!(d.is_empty());
    }

    /// A sparse flow (one small packet now and then) beside a standing bulk queue goes out
    /// almost at once, because it enters on the new list.
    #[test]
    fn sparse_flow_sees_near_zero_delay() {
        let (mut q, bulk, sparse) = two_flows(FqCodelParams::default());
        let t0 = Instant::now();
        let mut d = Vec::new();
        let mut t = t0;
        let tick = Duration::from_micros(1200); // 1500 B at 10 Mbit/s
        let mut sparse_delays = Vec::new();
        let mut bulk_delays = Vec::new();
        let mut id = 0u32;
        for step in 0..5000 {
            // Bulk arrives at twice the link rate; the sparse flow every 100 steps.
            q.enqueue(t, Packet::new(1500, bulk, id), &mut d);
            q.enqueue(t, Packet::new(1500, bulk, id + 1), &mut d);
            id += 2;
            if step % 100 == 0 {
                q.enqueue(t, Packet::new(100, sparse, u32::MAX), &mut d);
            }
            if let Some(p) = q.dequeue(t, &mut d) {
                let delay = p.sojourn(t);
                if p.payload == u32::MAX {
                    sparse_delays.push(delay);
                } else {
                    bulk_delays.push(delay);
                }
            }
            t += tick;
        }
        let max_sparse = sparse_delays.iter().max().unwrap();
        assert!(*max_sparse <= tick * 2, "sparse flow waited {max_sparse:?}");
        let late_bulk = bulk_delays[bulk_delays.len() / 2..].iter().max().unwrap();
        assert!(
            *late_bulk > Duration::from_millis(5),
            "bulk queue is standing: {late_bulk:?}"
        );
        assert!(q.stats().dropped_aqm > 0, "CoDel acts on the bulk flow");
    }
}
