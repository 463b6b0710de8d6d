//! CoDel (RFC 8289): drop at dequeue when the head packet's sojourn time has stayed above
//! `target` for at least `interval`, at a rate that grows with √count.
//!
//! Arithmetic: Linux's. 1/√count is kept in Q0.16 and refined by one Newton step per count
//! increment (`include/net/codel_impl.h`), so the second drop of a cycle comes 50 ms after the
//! first, not 70.7 ms. Times are exact nanoseconds. [`CodelState`] is the control law alone,
//! driven over any FIFO, so FQ-CoDel runs one per flow.

use std::time::{Duration, Instant};

use crate::fifo::{CountedFifo, Fifo};
use crate::{Backlog, DropReason, Dropped, Ecn, Packet, QueueDiscipline, QueueStats, Verdict};

/// CoDel's parameters (RFC 8289 §4.2–4.3 defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CodelParams {
    /// Acceptable standing sojourn time (5 ms).
    pub target: Duration,
    /// Window over which sojourn must stay above target before dropping (100 ms).
    pub interval: Duration,
    /// Below this backlog (bytes remaining after the dequeue) never drop: one MTU (1514).
    pub mtu: usize,
    /// Mark ECN-capable packets instead of dropping them.
    pub ecn: bool,
}

impl Default for CodelParams {
    fn default() -> Self {
        CodelParams {
            target: Duration::from_millis(5),
            interval: Duration::from_millis(100),
            mtu: 1514,
            ecn: false,
        }
    }
}

/// Q0.16 fixed point, as Linux keeps `rec_inv_sqrt`.
const REC_INV_SQRT_BITS: u32 = 16;
const REC_INV_SQRT_SHIFT: u32 = 32 - REC_INV_SQRT_BITS;

/// The CoDel control law's state for one queue.
#[derive(Debug, Clone)]
pub struct CodelState {
    /// Drops in the current dropping cycle.
    pub count: u32,
    lastcount: u32,
    dropping: bool,
    rec_inv_sqrt: u16,
    /// When the sojourn time will have been above target for an interval; `None` = below.
    pub first_above_time: Option<Instant>,
    /// When the next drop is due while dropping.
    pub drop_next: Option<Instant>,
    /// Sojourn time of the last packet examined.
    pub ldelay: Duration,
}

impl Default for CodelState {
    fn default() -> Self {
        CodelState {
            count: 0,
            lastcount: 0,
            dropping: false,
            rec_inv_sqrt: 0,
            first_above_time: None,
            drop_next: None,
            ldelay: Duration::ZERO,
        }
    }
}

/// A FIFO CoDel can drive: pop the head, and say how many bytes remain.
pub trait CodelQueue<T> {
    /// Remove and return the head packet.
    fn pop(&mut self) -> Option<Packet<T>>;
    /// Bytes still queued (after any pop).
    fn backlog_bytes(&self) -> usize;
}

impl CodelState {
    /// Whether the control law is in its dropping state.
    pub fn dropping(&self) -> bool {
        self.dropping
    }

    /// One Newton step towards 1/√count in Q0.16: x ← x(3 − count·x²)/2.
    fn newton_step(&mut self) {
        let invsqrt = (self.rec_inv_sqrt as u32) << REC_INV_SQRT_SHIFT;
        let invsqrt2 = ((invsqrt as u64 * invsqrt as u64) >> 32) as u32;
        let mut val = (3u64 << 32).wrapping_sub(self.count as u64 * invsqrt2 as u64);
        val >>= 2; // avoid overflow in the multiply below
        val = (val * invsqrt as u64) >> (32 - 2 + 1);
        self.rec_inv_sqrt = (val >> REC_INV_SQRT_SHIFT) as u16;
    }

    /// `t + interval / √count` with the Q0.16 reciprocal (RFC 8289 §5.5 control_law).
    fn control_law(&self, t: Instant, interval: Duration) -> Instant {
        let scale = (self.rec_inv_sqrt as u64) << REC_INV_SQRT_SHIFT;
        t + Duration::from_nanos(
            ((interval.as_nanos() as u64 as u128 * scale as u128) >> 32) as u64,
        )
    }

    /// RFC 8289 §5.4 `ok_to_drop` (Linux `codel_should_drop`) for a packet just taken from the
    /// head, with `backlog` bytes left behind it.
    fn should_drop<T>(
        &mut self,
        p: Option<&Packet<T>>,
        backlog: usize,
        now: Instant,
        params: &CodelParams,
    ) -> bool {
        let Some(p) = p else {
            self.first_above_time = None;
            return false;
        };
        self.ldelay = p.sojourn(now);
        if self.ldelay < params.target || backlog <= params.mtu {
            // Went below: stay below for at least an interval before dropping again.
            self.first_above_time = None;
            return false;
        }
        match self.first_above_time {
            None => {
                self.first_above_time = Some(now + params.interval);
                false
            }
            Some(t) => now >= t,
        }
    }

    /// Dequeue through the control law. Dropped packets go to `dropped` (reason Aqm);
    /// packets marked instead are returned with `ecn = Ce` and counted in `marks`.
    pub fn dequeue<T, Q: CodelQueue<T>>(
        &mut self,
        queue: &mut Q,
        now: Instant,
        params: &CodelParams,
        dropped: &mut Vec<Dropped<T>>,
        marks: &mut u64,
    ) -> Option<Packet<T>> {
        let mut p = queue.pop();
        if p.is_none() {
            self.dropping = false;
            self.first_above_time = None;
            return None;
        }
        let drop = self.should_drop(p.as_ref(), queue.backlog_bytes(), now, params);
        if self.dropping {
            if !drop {
                // Sojourn below target: leave the dropping state.
                self.dropping = false;
            } else if now >= self.drop_next.expect("set while dropping") {
                // Time for the next drop(s): a large backlog may need several now.
                while self.dropping && now >= self.drop_next.expect("set while dropping") {
                    self.count = self.count.wrapping_add(1);
                    self.newton_step();
                    let head = p.as_mut().expect("a packet is in hand");
                    if params.ecn && head.ecn.is_capable() {
                        head.ecn = Ecn::Ce;
                        *marks += 1;
                        self.drop_next =
                            Some(self.control_law(self.drop_next.unwrap(), params.interval));
                        return p;
                    }
                    dropped.push(Dropped {
                        packet: p.take().expect("a packet is in hand"),
                        reason: DropReason::Aqm,
                    });
                    p = queue.pop();
                    if !self.should_drop(p.as_ref(), queue.backlog_bytes(), now, params) {
                        self.dropping = false;
                    } else {
                        // The base is the previous drop_next, not now (RFC 8289 §5.6).
                        self.drop_next =
                            Some(self.control_law(self.drop_next.unwrap(), params.interval));
                    }
                }
            }
        } else if drop {
            let head = p.as_mut().expect("a packet is in hand");
            if params.ecn && head.ecn.is_capable() {
                head.ecn = Ecn::Ce;
                *marks += 1;
            } else {
                dropped.push(Dropped {
                    packet: p.take().expect("a packet is in hand"),
                    reason: DropReason::Aqm,
                });
                p = queue.pop();
                self.should_drop(p.as_ref(), queue.backlog_bytes(), now, params);
            }
            self.dropping = true;
            // If we were dropping recently, start near the drop rate that controlled the queue
            // last time (RFC 8289 §5.5).
            let delta = self.count.wrapping_sub(self.lastcount);
            let recent = self
                .drop_next
                .is_some_and(|dn| now.saturating_duration_since(dn) < params.interval * 16);
            if delta > 1 && recent {
                self.count = delta;
                self.newton_step();
            } else {
                self.count = 1;
                self.rec_inv_sqrt = u16::MAX;
            }
            self.lastcount = self.count;
            self.drop_next = Some(self.control_law(now, params.interval));
        }
        p
    }
}

impl<T> CodelQueue<T> for Fifo<T> {
    fn pop(&mut self) -> Option<Packet<T>> {
        Fifo::pop(self)
    }
    fn backlog_bytes(&self) -> usize {
        self.bytes
    }
}

/// CoDel over a single FIFO with a packet limit (tail drop at the limit).
#[derive(Debug)]
pub struct Codel<T> {
    params: CodelParams,
    limit: usize,
    q: CountedFifo<T>,
    state: CodelState,
}

impl<T> Codel<T> {
    /// CoDel with `params` and a limit of `limit` packets.
    pub fn new(params: CodelParams, limit: usize) -> Self {
        Codel {
            params,
            limit,
            q: CountedFifo::default(),
            state: CodelState::default(),
        }
    }

    /// The control law's state.
    pub fn state(&self) -> &CodelState {
        &self.state
    }
}

impl<T: Send> QueueDiscipline<T> for Codel<T> {
    fn name(&self) -> &'static str {
        "codel"
    }

    fn enqueue(
        &mut self,
        now: Instant,
        packet: Packet<T>,
        dropped: &mut Vec<Dropped<T>>,
    ) -> Verdict {
        self.q.offered();
        if self.q.fifo.len() >= self.limit {
            return self.q.reject(packet, DropReason::Overflow, dropped);
        }
        self.q.admit(now, packet);
        Verdict::Enqueued
    }

    fn dequeue(&mut self, now: Instant, dropped: &mut Vec<Dropped<T>>) -> Option<Packet<T>> {
        let before = dropped.len();
        let q = &mut self.q;
        let p = self
            .state
            .dequeue(&mut q.fifo, now, &self.params, dropped, &mut q.stats.marked);
        let n = (dropped.len() - before) as u64;
        q.stats.dropped_aqm += n;
        q.stats.dropped_after_enqueue += n;
        if let Some(p) = &p {
            q.count_departure(p);
        }
        p
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

    fn ms(x: f64) -> Duration {
        Duration::from_secs_f64(x / 1000.0)
    }

    /// Linux control-law offsets after a cycle's first drop, for count 1, 2, 3, 4, 5, 6, 10, 16
    /// (../shared/references/aqm.md).
    #[test]
    fn control_law_matches_the_linux_vector() {
        let expected = [
            (1, 100.0),
            (2, 50.0),
            (3, 56.25),
            (4, 48.78),
            (5, 44.15),
            (6, 40.41),
            (10, 31.50),
            (16, 24.96),
        ];
        let t0 = Instant::now();
        let mut s = CodelState {
            count: 1,
            rec_inv_sqrt: u16::MAX,
            ..Default::default()
        };
        for count in 1..=16u32 {
            if count > 1 {
                s.count = count;
                s.newton_step();
            }
            if let Some(&(_, want)) = expected.iter().find(|(c, _)| *c == count) {
                let got = (s.control_law(t0, ms(100.0)) - t0).as_secs_f64() * 1000.0;
                assert!(
                    (got - want).abs() < 0.01,
                    "count {count}: {got} ms, want {want}"
                );
            }
        }
    }

    fn filled(n: usize, t0: Instant) -> Codel<u32> {
        let mut q = Codel::new(CodelParams::default(), 500);
        let mut d = Vec::new();
        for i in 0..n {
            q.enqueue(t0, Packet::new(1000, 0, i as u32), &mut d);
        }
        q
    }

    /// The aqm.md golden scenario: 20 × 1000 B at t = 0, dequeues at 10, 210, 210, 420 ms.
    #[test]
    fn golden_dequeue_sequence() {
        let t0 = Instant::now();
        let mut q = filled(20, t0);
        let mut d = Vec::new();
        let p = q.dequeue(t0 + ms(10.0), &mut d).unwrap();
        assert_eq!((p.payload, d.len()), (0, 0));
        assert_eq!(q.state().first_above_time, Some(t0 + ms(110.0)));

        let p = q.dequeue(t0 + ms(210.0), &mut d).unwrap();
        assert_eq!((p.payload, d.len()), (2, 1), "one drop, then delivery");
        assert!(q.state().dropping());
        let dn = q.state().drop_next.unwrap() - t0;
        assert!((dn.as_secs_f64() * 1000.0 - 310.0).abs() < 0.01, "{dn:?}");

        let p = q.dequeue(t0 + ms(210.0), &mut d).unwrap();
        assert_eq!((p.payload, d.len()), (3, 1), "no drop before drop_next");

        let p = q.dequeue(t0 + ms(420.0), &mut d).unwrap();
        assert_eq!(d.len(), 4, "three more drops: 310 → 360 → 416.25 → 465 ms");
        assert_eq!(p.payload, 7);
        let dn = (q.state().drop_next.unwrap() - t0).as_secs_f64() * 1000.0;
        assert!((dn - 465.03).abs() < 0.05, "{dn}");
        let s = q.stats();
        assert_eq!((s.dropped_aqm, s.dequeued), (4, 4));
    }

    #[test]
    fn overflow_is_tail_drop() {
        let t0 = Instant::now();
        let mut q = Codel::new(CodelParams::default(), 500);
        let mut d = Vec::new();
        for i in 0..503 {
            q.enqueue(t0, Packet::new(100, 0, i), &mut d);
        }
        assert_eq!(q.stats().dropped_overflow, 3);
        assert_eq!(
            d.iter().map(|x| x.payload_id()).collect::<Vec<_>>(),
            vec![500, 501, 502]
        );
    }

    #[test]
    fn never_drops_below_one_mtu_of_backlog() {
        let t0 = Instant::now();
        let mut q = filled(2, t0);
        let mut d = Vec::new();
        // 1000 B remain after the first dequeue: ≤ MTU, so no state even at huge sojourn.
        q.dequeue(t0 + ms(5000.0), &mut d);
        assert!(q.state().first_above_time.is_none());
        q.dequeue(t0 + ms(9000.0), &mut d);
        assert!(d.is_empty());
    }

    #[test]
    fn ecn_capable_packets_are_marked_not_dropped() {
        let t0 = Instant::now();
        let mut q = Codel::new(
            CodelParams {
                ecn: true,
                ..Default::default()
            },
            100,
        );
        let mut d = Vec::new();
        for i in 0..20u32 {
            let mut p = Packet::new(1000, 0, i);
            p.ecn = Ecn::Ect0;
            q.enqueue(t0, p, &mut d);
        }
        q.dequeue(t0 + ms(10.0), &mut d);
        let p = q.dequeue(t0 + ms(210.0), &mut d).unwrap();
        assert_eq!(p.ecn, Ecn::Ce);
        assert_eq!(p.payload, 1);
        assert!(d.is_empty());
        assert_eq!(q.stats().marked, 1);
    }

    trait Id {
        fn payload_id(&self) -> u32;
    }
    impl Id for Dropped<u32> {
        fn payload_id(&self) -> u32 {
            self.packet.payload
        }
    }
}
