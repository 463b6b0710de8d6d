//! RED (Floyd & Jacobson 1993) with gentle mode and "wait", ns-3 `RedQueueDisc` defaults.

use std::time::Instant;

use crate::fifo::CountedFifo;
use crate::rng::SplitMix64;
use crate::{Backlog, DropReason, Dropped, Packet, QueueDiscipline, QueueStats, Verdict};

/// RED parameters (ns-3 defaults except the limit, which the caller sets).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RedParams {
    /// Queue weight w_q of the average (0.002).
    pub w_q: f64,
    /// Minimum threshold, packets (5).
    pub min_th: f64,
    /// Maximum threshold, packets (15).
    pub max_th: f64,
    /// Drop probability at max_th (1/50).
    pub max_p: f64,
    /// Gentle mode: probability rises from max_p to 1 between max_th and 2·max_th.
    pub gentle: bool,
    /// "Wait": space drops out evenly (pa = pb / (2 − count·pb)).
    pub wait: bool,
    /// Mean packet size for the idle-time decay, bytes (500).
    pub mean_pkt_size: usize,
    /// Link rate for the idle-time decay, bit/s.
    pub link_rate_bps: u64,
    /// Packet limit (tail drop beyond it).
    pub limit: usize,
    /// Mark ECN-capable packets instead of early-dropping them.
    pub ecn: bool,
}

impl Default for RedParams {
    fn default() -> Self {
        RedParams {
            w_q: 0.002,
            min_th: 5.0,
            max_th: 15.0,
            max_p: 1.0 / 50.0,
            gentle: true,
            wait: true,
            mean_pkt_size: 500,
            link_rate_bps: 10_000_000,
            limit: 1000,
            ecn: false,
        }
    }
}

/// RED.
#[derive(Debug)]
pub struct Red<T> {
    p: RedParams,
    q: CountedFifo<T>,
    avg: f64,
    /// Packets since the last drop while avg was between the thresholds; −1 below min_th.
    count: i64,
    idle_since: Option<Instant>,
    rng: SplitMix64,
}

impl<T> Red<T> {
    /// RED with `params`, random choices from `seed`.
    pub fn new(params: RedParams, seed: u64) -> Self {
        Red {
            p: params,
            q: CountedFifo::default(),
            avg: 0.0,
            count: -1,
            idle_since: None,
            rng: SplitMix64::new(seed),
        }
    }

    /// The average queue length, packets.
    pub fn avg(&self) -> f64 {
        self.avg
    }

    fn update_avg(&mut self, now: Instant) {
        let q = self.q.fifo.len() as f64;
        match self.idle_since.take() {
            // After idle, decay as if m small packets had left: avg ← (1 − w)^m · avg.
            Some(since) if self.q.fifo.packets.is_empty() => {
                let idle = now.saturating_duration_since(since).as_secs_f64();
                let m = idle * self.p.link_rate_bps as f64 / 8.0 / self.p.mean_pkt_size as f64;
                self.avg *= (1.0 - self.p.w_q).powf(m);
            }
            _ => self.avg = (1.0 - self.p.w_q) * self.avg + self.p.w_q * q,
        }
    }

    /// The early-drop probability pb for the current average.
    fn pb(&self) -> f64 {
        let (min, max, max_p) = (self.p.min_th, self.p.max_th, self.p.max_p);
        if self.avg < max {
            max_p * (self.avg - min) / (max - min)
        } else {
            max_p + (1.0 - max_p) * (self.avg - max) / max
        }
    }
}

impl<T: Send> QueueDiscipline<T> for Red<T> {
    fn name(&self) -> &'static str {
        "red"
    }

    fn enqueue(
        &mut self,
        now: Instant,
        packet: Packet<T>,
        dropped: &mut Vec<Dropped<T>>,
    ) -> Verdict {
        self.q.offered();
        self.update_avg(now);
        let mut early = None;
        if self.avg < self.p.min_th {
            self.count = -1;
        } else if (!self.p.gentle && self.avg >= self.p.max_th) || self.avg >= 2.0 * self.p.max_th {
            early = Some(true); // forced
        } else {
            self.count += 1;
            let pb = self.pb().clamp(0.0, 1.0);
            let cpb = self.count as f64 * pb;
            let pa = if self.p.wait {
                if cpb < 1.0 {
                    0.0
                } else if cpb < 2.0 {
                    pb / (2.0 - cpb)
                } else {
                    1.0
                }
            } else if cpb < 1.0 {
                pb / (1.0 - cpb)
            } else {
                1.0
            };
            // No early drop with at most one packet queued.
            if self.q.fifo.len() > 1 && self.rng.next_f64() < pa {
                early = Some(false);
            }
        }
        let mut verdict = Verdict::Enqueued;
        let packet = match early {
            None => packet,
            Some(forced) => {
                self.count = 0;
                // Only early drops may become marks (RFC 3168 §7); forced drops drop.
                match self.q.signal(packet, !forced && self.p.ecn, dropped) {
                    Ok(p) => {
                        verdict = Verdict::Marked;
                        p
                    }
                    Err(v) => return v,
                }
            }
        };
        if self.q.fifo.len() >= self.p.limit {
            return self.q.reject(packet, DropReason::Overflow, dropped);
        }
        self.q.admit(now, packet);
        verdict
    }

    fn dequeue(&mut self, now: Instant, _dropped: &mut Vec<Dropped<T>>) -> Option<Packet<T>> {
        let p = self.q.depart()?;
        if self.q.fifo.packets.is_empty() {
            self.idle_since = Some(now);
        }
        Some(p)
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
    use crate::Ecn;
    use std::time::Duration;

    /// ns-3's golden: 300 back-to-back enqueues of 1000 B, no dequeues, limit 300.
    fn drops(params: RedParams) -> u64 {
        let mut q = Red::new(
            RedParams {
                limit: 300,
                ..params
            },
            1,
        );
        let t0 = Instant::now();
        let mut d = Vec::new();
        for i in 0..300u32 {
            q.enqueue(t0, Packet::new(1000, 0, i), &mut d);
        }
        let s = q.stats();
        assert_eq!(s.dropped_overflow, 0);
        s.dropped_aqm
    }

    #[test]
    fn golden_back_to_back_enqueues() {
        let base = RedParams {
            min_th: 70.0,
            max_th: 150.0,
            ..Default::default()
        };
        assert_eq!(
            drops(base),
            0,
            "w_q 0.002: the average never gets far enough"
        );
        let fast = RedParams { w_q: 0.02, ..base };
        let d_fast = drops(fast);
        assert!(d_fast > 0, "w_q 0.02 → drops");
        assert!(
            drops(RedParams {
                max_th: 100.0,
                ..fast
            }) > d_fast,
            "lower max_th → more drops"
        );
        assert!(
            drops(RedParams { max_p: 0.2, ..fast }) > d_fast,
            "max_p 1/5 → more drops"
        );
        assert!(
            drops(RedParams {
                gentle: false,
                ..fast
            }) > d_fast,
            "gentle off → more drops"
        );
        assert!(
            drops(RedParams {
                wait: false,
                ..fast
            }) > d_fast,
            "wait off → more drops"
        );
    }

    #[test]
    fn average_follows_the_ewma_and_decays_when_idle() {
        let mut q = Red::new(RedParams::default(), 1);
        let t0 = Instant::now();
        let mut d = Vec::new();
        q.enqueue(t0, Packet::new(500, 0, 0u32), &mut d);
        q.enqueue(t0, Packet::new(500, 0, 1), &mut d);
        // avg = 0.002 · 1 after the second arrival (the queue held one packet).
        assert!((q.avg() - 0.002).abs() < 1e-12);
        q.dequeue(t0, &mut d);
        q.dequeue(t0, &mut d);
        // Idle 1 ms at 10 Mbit/s = 2.5 mean packets: avg · 0.998^2.5.
        q.enqueue(
            t0 + Duration::from_millis(1),
            Packet::new(500, 0, 2),
            &mut d,
        );
        assert!((q.avg() - 0.002 * 0.998f64.powf(2.5)).abs() < 1e-12);
    }

    #[test]
    fn ecn_marks_instead_of_early_drop() {
        let mut q = Red::new(
            RedParams {
                w_q: 0.5,
                ecn: true,
                limit: 100,
                ..Default::default()
            },
            2,
        );
        let t0 = Instant::now();
        let mut d = Vec::new();
        for i in 0..25u32 {
            let mut p = Packet::new(500, 0, i);
            p.ecn = Ecn::Ect0;
            q.enqueue(t0, p, &mut d);
        }
        let s = q.stats();
        assert!(s.marked > 0, "{s:?}");
        // Forced drops (avg ≥ 2·max_th) still drop.
        assert_eq!(s.dropped_aqm as usize, d.len());
    }
}
