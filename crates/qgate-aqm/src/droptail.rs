//! Drop-tail: a FIFO that refuses arrivals once a packet or byte limit is reached.

use std::time::Instant;

use crate::fifo::CountedFifo;
use crate::{Backlog, DropReason, Dropped, Packet, QueueDiscipline, QueueStats, Verdict};

/// A FIFO bounded by packets and, optionally, bytes; an arrival that would exceed either limit
/// is dropped (tail drop).
#[derive(Debug)]
pub struct DropTail<T> {
    q: CountedFifo<T>,
    limit_packets: usize,
    limit_bytes: Option<usize>,
}

impl<T> DropTail<T> {
    /// A queue of at most `limit_packets` packets.
    pub fn with_packet_limit(limit_packets: usize) -> Self {
        DropTail {
            q: CountedFifo::default(),
            limit_packets,
            limit_bytes: None,
        }
    }

    /// A queue of at most `limit_bytes` bytes (and at most `limit_bytes` packets, so that even
    /// zero-length packets are bounded).
    pub fn with_byte_limit(limit_bytes: usize) -> Self {
        let mut q = Self::with_packet_limit(limit_bytes.max(1));
        q.limit_bytes = Some(limit_bytes);
        q
    }

    /// Also cap the number of packets (for a byte-limited queue).
    pub fn with_packet_cap(mut self, limit_packets: usize) -> Self {
        self.limit_packets = limit_packets;
        self
    }

    fn fits(&self, size: usize) -> bool {
        self.q.fifo.len() < self.limit_packets
            && self
                .limit_bytes
                .is_none_or(|l| self.q.fifo.bytes + size <= l)
    }
}

impl<T: Send> QueueDiscipline<T> for DropTail<T> {
    fn name(&self) -> &'static str {
        "droptail"
    }

    fn enqueue(
        &mut self,
        now: Instant,
        packet: Packet<T>,
        dropped: &mut Vec<Dropped<T>>,
    ) -> Verdict {
        self.q.offered();
        if !self.fits(packet.size) {
            return self.q.reject(packet, DropReason::Overflow, dropped);
        }
        self.q.admit(now, packet);
        Verdict::Enqueued
    }

    fn dequeue(&mut self, _now: Instant, _dropped: &mut Vec<Dropped<T>>) -> Option<Packet<T>> {
        self.q.depart()
    }

    fn backlog(&self) -> Backlog {
        self.q.fifo.backlog()
    }

    fn stats(&self) -> QueueStats {
        self.q.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    fn pkt(size: usize, id: u32) -> Packet<u32> {
        Packet::new(size, 0, id)
    }

    #[test]
    fn packet_limit_drops_the_arrival() {
        let now = Instant::now();
        let mut q = DropTail::with_packet_limit(2);
        let mut dropped = Vec::new();
        assert_eq!(q.enqueue(now, pkt(100, 1), &mut dropped), Verdict::Enqueued);
        assert_eq!(q.enqueue(now, pkt(100, 2), &mut dropped), Verdict::Enqueued);
        assert_eq!(
            q.enqueue(now, pkt(100, 3), &mut dropped),
            Verdict::Dropped(DropReason::Overflow)
        );
        assert_eq!(dropped.len(), 1);
        assert_eq!(dropped[0].packet.payload, 3);
        assert_eq!(
            q.backlog(),
            Backlog {
                packets: 2,
                bytes: 200
            }
        );
    }

    #[test]
    fn byte_limit_counts_bytes() {
        let now = Instant::now();
        let mut q = DropTail::with_byte_limit(1500);
        let mut dropped = Vec::new();
        assert_eq!(
            q.enqueue(now, pkt(1000, 1), &mut dropped),
            Verdict::Enqueued
        );
        assert_eq!(
            q.enqueue(now, pkt(600, 2), &mut dropped),
            Verdict::Dropped(DropReason::Overflow)
        );
        // A smaller packet still fits.
        assert_eq!(q.enqueue(now, pkt(500, 3), &mut dropped), Verdict::Enqueued);
        assert_eq!(q.backlog().bytes, 1500);
    }

    #[test]
    fn sojourn_is_measured_from_enqueue() {
        let t0 = Instant::now();
        let mut q = DropTail::with_packet_limit(10);
        let mut dropped = Vec::new();
        q.enqueue(t0, pkt(1, 1), &mut dropped);
        let p = q
            .dequeue(t0 + Duration::from_millis(7), &mut dropped)
            .unwrap();
        assert_eq!(
            p.sojourn(t0 + Duration::from_millis(7)),
            Duration::from_millis(7)
        );
    }

    proptest! {
        /// Never above either limit; FIFO order; every offered packet is either dequeued, still
        /// queued, or dropped exactly once.
        #[test]
        fn invariants(ops in proptest::collection::vec((any::<bool>(), 1usize..2000), 1..400),
                      limit_packets in 1usize..50, limit_bytes in 1usize..20_000, by_bytes: bool) {
            let now = Instant::now();
            let mut q = if by_bytes { DropTail::with_byte_limit(limit_bytes) }
                        else { DropTail::with_packet_limit(limit_packets) };
            let mut dropped = Vec::new();
            let mut next_id = 0u32;
            let mut out = Vec::new();
            for (is_enqueue, size) in ops {
                if is_enqueue {
                    q.enqueue(now, pkt(size, next_id), &mut dropped);
                    next_id += 1;
                } else if let Some(p) = q.dequeue(now, &mut dropped) {
                    out.push(p.payload);
                }
                let b = q.backlog();
                if by_bytes { prop_assert!(b.bytes <= limit_bytes); }
                else { prop_assert!(b.packets <= limit_packets); }
            }
            prop_assert!(out.windows(2).all(|w| w[0] < w[1]), "FIFO order");
            let s = q.stats();
            prop_assert_eq!(s.offered, next_id as u64);
            prop_assert_eq!(s.offered, s.enqueued + s.dropped_overflow + s.dropped_aqm);
            prop_assert_eq!(s.enqueued, s.dequeued + q.backlog().packets as u64);
            prop_assert_eq!(dropped.len() as u64, s.dropped_overflow);
            let mut all: Vec<u32> = out.clone();
            all.extend(dropped.iter().map(|d| d.packet.payload));
            while let Some(p) = q.dequeue(now, &mut dropped) { all.push(p.payload); }
            all.sort_unstable();
            prop_assert_eq!(all, (0..next_id).collect::<Vec<_>>());
        }
    }
}
