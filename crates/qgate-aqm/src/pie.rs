//! PIE (RFC 8033): a drop probability updated every T_UPDATE from the queueing delay and its
//! trend, auto-tuned to the probability's magnitude, applied at enqueue with burst allowance
//! and de-randomisation.
//!
//! Queue delay: the sojourn time of the most recently dequeued packet, 0 once the queue
//! empties (the timestamp method, RFC 8033 §5.3; Linux's default). Updates are timer-free: each
//! enqueue or dequeue first runs the updates that came due.

use std::time::{Duration, Instant};

use crate::fifo::CountedFifo;
use crate::rng::SplitMix64;
use crate::{Backlog, DropReason, Dropped, Packet, QueueDiscipline, QueueStats, Verdict};

/// PIE parameters (RFC 8033 §4 defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PieParams {
    /// QDELAY_REF (15 ms).
    pub target: Duration,
    /// T_UPDATE (15 ms).
    pub t_update: Duration,
    /// α, Hz (0.125).
    pub alpha: f64,
    /// β, Hz (1.25).
    pub beta: f64,
    /// MAX_BURST (150 ms).
    pub max_burst: Duration,
    /// Packet limit.
    pub limit: usize,
    /// MEAN_PKTSIZE: no early drop while at most two of these are queued (1500 B).
    pub mean_pkt_size: usize,
    /// Mark ECN-capable packets instead of dropping them while p ≤ 10 %.
    pub ecn: bool,
}

impl Default for PieParams {
    fn default() -> Self {
        PieParams {
            target: Duration::from_millis(15),
            t_update: Duration::from_millis(15),
            alpha: 0.125,
            beta: 1.25,
            max_burst: Duration::from_millis(150),
            limit: 1000,
            mean_pkt_size: 1500,
            ecn: false,
        }
    }
}

/// RFC 8033 §4.2 auto-tuning: the factor a probability step is scaled by when the
/// probability is `p`, so that the step stays proportionate to p's magnitude (1/2048 below
/// 10⁻⁶, rising 4× per decade to 1/2 from 1 %, and 1 from 10 %). PID-Delay's stable variant scales the same way.
pub(crate) fn auto_tune_scale(p: f64) -> f64 {
    const DIVISORS: [(f64, f64); 6] = [
        (1e-6, 2048.0),
        (1e-5, 512.0),
        (1e-4, 128.0),
        (1e-3, 32.0),
        (1e-2, 8.0),
        (1e-1, 2.0),
    ];
    DIVISORS
        .iter()
        .find(|(limit, _)| p < *limit)
        .map_or(1.0, |(_, d)| 1.0 / d)
}

/// PIE.
#[derive(Debug)]
pub struct Pie<T> {
    p: PieParams,
    q: CountedFifo<T>,
    prob: f64,
    qdelay: Duration,
    qdelay_old: Duration,
    burst_allowance: Duration,
    accu_prob: f64,
    next_update: Option<Instant>,
    rng: SplitMix64,
}

impl<T> Pie<T> {
    /// PIE with `params`, random choices from `seed`.
    pub fn new(params: PieParams, seed: u64) -> Self {
        Pie {
            p: params,
            q: CountedFifo::default(),
            prob: 0.0,
            qdelay: Duration::ZERO,
            qdelay_old: Duration::ZERO,
            burst_allowance: params.max_burst,
            accu_prob: 0.0,
            next_update: None,
            rng: SplitMix64::new(seed),
        }
    }

    /// The current drop probability.
    pub fn drop_probability(&self) -> f64 {
        self.prob
    }

    /// Run every update due by `now` (RFC 8033 §4.2, §4.4).
    fn catch_up(&mut self, now: Instant) {
        let next = *self.next_update.get_or_insert(now + self.p.t_update);
        let mut next = next;
        while now >= next {
            self.update();
            next += self.p.t_update;
        }
        self.next_update = Some(next);
    }

    fn update(&mut self) {
        let (q, q_old) = (self.qdelay.as_secs_f64(), self.qdelay_old.as_secs_f64());
        let target = self.p.target.as_secs_f64();
        let mut delta = self.p.alpha * (q - target) + self.p.beta * (q - q_old);
        delta *= auto_tune_scale(self.prob);
        // Above 10 %, never raise p by more than 2 % per update.
        if self.prob >= 0.1 && delta > 0.02 {
            delta = 0.02;
        }
        self.prob += delta;
        // Decay when the queue has been empty for two updates.
        if q == 0.0 && q_old == 0.0 {
            self.prob *= 0.98;
        }
        self.prob = self.prob.clamp(0.0, 1.0);
        self.burst_allowance = self.burst_allowance.saturating_sub(self.p.t_update);
        if self.prob == 0.0 && q < target / 2.0 && q_old < target / 2.0 {
            self.burst_allowance = self.p.max_burst;
        }
        self.qdelay_old = self.qdelay;
    }

    /// RFC 8033 §5.1 drop_early with de-randomisation.
    fn drop_early(&mut self, size: usize) -> bool {
        if (self.qdelay_old < self.p.target / 2 && self.prob < 0.2)
            || self.q.fifo.bytes + size <= 2 * self.p.mean_pkt_size
        {
            return false;
        }
        if self.prob == 0.0 {
            self.accu_prob = 0.0;
        }
        self.accu_prob += self.prob;
        if self.accu_prob < 0.85 {
            return false;
        }
        if self.accu_prob >= 8.5 {
            self.accu_prob = 0.0;
            return true;
        }
        if self.rng.next_f64() < self.prob {
            self.accu_prob = 0.0;
            return true;
        }
        false
    }
}

impl<T: Send> QueueDiscipline<T> for Pie<T> {
    fn name(&self) -> &'static str {
        "pie"
    }

    fn enqueue(
        &mut self,
        now: Instant,
        packet: Packet<T>,
        dropped: &mut Vec<Dropped<T>>,
    ) -> Verdict {
        self.catch_up(now);
        self.q.offered();
        if self.q.fifo.len() >= self.p.limit {
            return self.q.reject(packet, DropReason::Overflow, dropped);
        }
        let mut verdict = Verdict::Enqueued;
        let mut packet = packet;
        if self.burst_allowance.is_zero() && self.drop_early(packet.size) {
            // ECN only while p ≤ 10 % (RFC 8033 §5.1).
            match self
                .q
                .signal(packet, self.p.ecn && self.prob <= 0.1, dropped)
            {
                Ok(p) => {
                    packet = p;
                    verdict = Verdict::Marked;
                }
                Err(v) => return v,
            }
        }
        self.q.admit(now, packet);
        verdict
    }

    fn dequeue(&mut self, now: Instant, _dropped: &mut Vec<Dropped<T>>) -> Option<Packet<T>> {
        self.catch_up(now);
        let p = self.q.depart()?;
        self.qdelay = if self.q.fifo.packets.is_empty() {
            Duration::ZERO
        } else {
            p.sojourn(now)
        };
        Some(p)
    }

    fn backlog(&self) -> Backlog {
        self.q.fifo.backlog()
    }

    fn stats(&self) -> QueueStats {
        self.q.stats
    }

    fn signal_probability(&self) -> Option<f64> {
        Some(self.prob)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ns-3's golden: a 1000-byte packet every 10 ms (400 of them), one dequeued every
    /// `dequeue_ms`, limit 300. Returns (stats, largest per-update rise of p once p ≥ 0.1).
    fn run(params: PieParams, dequeue_ms: u64) -> (QueueStats, f64) {
        let mut q = Pie::new(
            PieParams {
                limit: 300,
                ..params
            },
            7,
        );
        let t0 = Instant::now();
        let mut d = Vec::new();
        let mut max_rise = 0.0f64;
        let mut next_deq = Duration::from_millis(dequeue_ms);
        for i in 0..400u64 {
            let t_enq = Duration::from_millis(10 * i);
            while next_deq <= t_enq {
                let before = q.drop_probability();
                q.dequeue(t0 + next_deq, &mut d);
                if before >= 0.1 {
                    max_rise = max_rise.max(q.drop_probability() - before);
                }
                next_deq += Duration::from_millis(dequeue_ms);
            }
            let before = q.drop_probability();
            q.enqueue(t0 + t_enq, Packet::new(1000, 0, i), &mut d);
            if before >= 0.1 {
                max_rise = max_rise.max(q.drop_probability() - before);
            }
        }
        (q.stats(), max_rise)
    }

    #[test]
    fn golden_unforced_drops_and_no_forced_ones() {
        let (s, _) = run(PieParams::default(), 12);
        assert!(s.dropped_aqm > 0, "{s:?}");
        assert_eq!(s.dropped_overflow, 0, "{s:?}");
    }

    #[test]
    fn golden_higher_target_fewer_drops() {
        let (low, _) = run(
            PieParams {
                target: Duration::from_millis(20),
                ..Default::default()
            },
            12,
        );
        let (high, _) = run(
            PieParams {
                target: Duration::from_millis(80),
                ..Default::default()
            },
            12,
        );
        assert!(
            high.dropped_aqm < low.dropped_aqm,
            "{} vs {}",
            high.dropped_aqm,
            low.dropped_aqm
        );
    }

    #[test]
    fn golden_slower_dequeue_more_drops() {
        let (d12, _) = run(PieParams::default(), 12);
        let (d15, _) = run(PieParams::default(), 15);
        assert!(d15.dropped_aqm > d12.dropped_aqm);
    }

    #[test]
    fn golden_increase_capped_above_ten_percent() {
        let (_, max_rise) = run(PieParams::default(), 20);
        assert!(max_rise > 0.0, "p must have gone above 0.1");
        assert!(max_rise <= 0.02 + 1e-12, "rise {max_rise}");
    }

    #[test]
    fn probability_decays_when_the_queue_stays_empty() {
        let mut q: Pie<u32> = Pie::new(PieParams::default(), 1);
        q.prob = 0.5;
        q.catch_up(Instant::now());
        let t0 = Instant::now();
        q.catch_up(t0 + Duration::from_millis(150));
        // 10 updates at zero delay: α·(0 − 15 ms) each, capped nothing, then × 0.98 each.
        assert!(q.drop_probability() < 0.5 * 0.98f64.powi(9));
    }
}
