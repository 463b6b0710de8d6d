//! PID-Delay (paper 004): queue delay τ = backlog bytes / average dequeue rate (eq. 1), error
//! o = τ − τ0 (eq. 2), incremental PID ΔU (eq. 5) shaped by Algorithm 1, and U used as the
//! drop probability at enqueue.
//!
//! Every choice the paper leaves open is recorded in docs/decisions.md (P1–P10) and cited at
//! the line that implements it.

use std::time::{Duration, Instant};

use crate::fifo::CountedFifo;
use crate::rng::SplitMix64;
use crate::{Backlog, DropReason, Dropped, Packet, QueueDiscipline, QueueStats, Verdict};

/// PID-Delay parameters: paper 004 Table II gains, plus the decisions in docs/decisions.md.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PidDelayParams {
    /// K_p (Table II: 1.3125), per second of error.
    pub kp: f64,
    /// K_i (Table II: 1.25), per second of error per update.
    pub ki: f64,
    /// K_d (Table II: 0.125).
    pub kd: f64,
    /// Z1 gain when |o| > M1 (1.5).
    pub z1: f64,
    /// Z2 gain when M2 < |o| ≤ M1 (1.2).
    pub z2: f64,
    /// Z3 damping at a local extremum with |o| ≤ M2 (0.8).
    pub z3: f64,
    /// M1 (20 ms).
    pub m1: Duration,
    /// M2 (10 ms).
    pub m2: Duration,
    /// τ0, the target queue delay (decision P2: 5 ms).
    pub target: Duration,
    /// Sampling period of the controller (decision P1: 15 ms, PIE's T_UPDATE).
    pub period: Duration,
    /// Bytes that must leave before a dequeue-rate sample is taken (decision P7: 16 KB).
    pub dq_threshold: usize,
    /// No early drop while the backlog is at most two of these (decision P8: 1500 B).
    pub mean_pkt_size: usize,
    /// Packet limit.
    pub limit: usize,
    /// Mark ECN-capable packets instead of dropping while U ≤ 0.1 (decision P9).
    pub ecn: bool,
}

impl Default for PidDelayParams {
    fn default() -> Self {
        PidDelayParams {
            kp: 1.3125,
            ki: 1.25,
            kd: 0.125,
            z1: 1.5,
            z2: 1.2,
            z3: 0.8,
            m1: Duration::from_millis(20),
            m2: Duration::from_millis(10),
            target: Duration::from_millis(5),
            period: Duration::from_millis(15),
            dq_threshold: 16 * 1024,
            mean_pkt_size: 1500,
            limit: 1000,
            ecn: false,
        }
    }
}

/// Which branch of Algorithm 1 shaped an update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Branch {
    /// |o| > M1: ×Z1, no integral (line 2).
    LargeError,
    /// M2 < |o| ≤ M1 and the error grows: ×Z2 (line 6).
    Growing,
    /// M2 < |o| ≤ M1, shrinking after growing: ×Z2, no integral (line 9).
    Shrinking,
    /// |o| ≤ M2 at a local extremum: ×Z3, no integral (line 14).
    Extremum,
    /// Anything else: plain incremental PID (step 5).
    Plain,
}

/// The controller of eq. 5 and Algorithm 1 alone: errors in, U out. Errors are in seconds
/// (decision P3: the gains are PIE-like, per second).
#[derive(Debug, Clone)]
pub struct PidController {
    p: PidDelayParams,
    /// U, the control output, kept in [0, 1] (decision P4/P5).
    pub u: f64,
    o1: f64,
    o2: f64,
}

impl PidController {
    /// A controller at rest: U = 0 and past errors −τ0, as if the queue had been empty
    /// (decision P6), so the first update has no derivative kick.
    pub fn new(p: PidDelayParams) -> Self {
        let o0 = -p.target.as_secs_f64();
        PidController {
            p,
            u: 0.0,
            o1: o0,
            o2: o0,
        }
    }

    /// Feed the error o(t_i) in seconds; returns ΔU applied and the branch taken.
    pub fn update(&mut self, o: f64) -> (f64, Branch) {
        let p = &self.p;
        let (m1, m2) = (p.m1.as_secs_f64(), p.m2.as_secs_f64());
        let d_o = o - self.o1; // ΔO(t_i)
        let d_o_prev = self.o1 - self.o2; // ΔO(t_{i-1})
                                          // Eq. 5 terms.
        let prop = p.kp * (o - self.o1);
        let integ = p.ki * o;
        let deriv = p.kd * (o - 2.0 * self.o1 + self.o2);
        // Algorithm 1.
        let (scale, with_integral, branch) = if o.abs() > m1 {
            (p.z1, false, Branch::LargeError)
        } else if o.abs() > m2 {
            if o * d_o > 0.0 {
                (p.z2, true, Branch::Growing)
            } else if o * d_o < 0.0 && o * d_o_prev > 0.0 {
                (p.z2, false, Branch::Shrinking)
            } else {
                (1.0, true, Branch::Plain)
            }
        } else if o * d_o < 0.0 && o * d_o_prev < 0.0 {
            (p.z3, false, Branch::Extremum)
        } else {
            (1.0, true, Branch::Plain)
        };
        let delta = scale * (prop + deriv + if with_integral { integ } else { 0.0 });
        // Decision P5: U is clamped to [0, 1] after each step, which stops integration at the
        // limits (anti-windup by clamping).
        self.u = (self.u + delta).clamp(0.0, 1.0);
        self.o2 = self.o1;
        self.o1 = o;
        (delta, branch)
    }
}

/// Average dequeue rate by PIE's measurement cycles (RFC 8033 §5.3; decision P7): a cycle
/// starts when at least `dq_threshold` bytes are queued and ends when that many have left;
/// rate samples are averaged with weight 1/8.
#[derive(Debug, Clone, Default)]
struct DequeueRate {
    cycle: Option<(Instant, usize)>,
    /// Bytes per second; 0 until the first sample.
    avg: f64,
}

impl DequeueRate {
    fn on_dequeue(&mut self, now: Instant, size: usize, backlog_after: usize, threshold: usize) {
        if self.cycle.is_none() && backlog_after + size >= threshold {
            self.cycle = Some((now, 0));
        }
        let Some((start, count)) = self.cycle.as_mut() else {
            return;
        };
        *count += size;
        if *count >= threshold {
            let dt = now.saturating_duration_since(*start).as_secs_f64();
            if dt > 0.0 {
                let rate = *count as f64 / dt;
                self.avg = if self.avg == 0.0 {
                    rate
                } else {
                    self.avg * 0.875 + rate * 0.125
                };
            }
            self.cycle = (backlog_after >= threshold).then_some((now, 0));
        }
    }
}

/// PID-Delay.
#[derive(Debug)]
pub struct PidDelay<T> {
    p: PidDelayParams,
    q: CountedFifo<T>,
    ctl: PidController,
    rate: DequeueRate,
    next_update: Option<Instant>,
    tau: Duration,
    rng: SplitMix64,
}

impl<T> PidDelay<T> {
    /// PID-Delay with `params`, random choices from `seed`.
    pub fn new(params: PidDelayParams, seed: u64) -> Self {
        PidDelay {
            p: params,
            q: CountedFifo::default(),
            ctl: PidController::new(params),
            rate: DequeueRate::default(),
            next_update: None,
            tau: Duration::ZERO,
            rng: SplitMix64::new(seed),
        }
    }

    /// U, the drop probability.
    pub fn drop_probability(&self) -> f64 {
        self.ctl.u
    }

    /// τ at the last update (eq. 1).
    pub fn queue_delay(&self) -> Duration {
        self.tau
    }

    /// The dequeue-rate estimate, bytes per second (0 before the first sample).
    pub fn dequeue_rate(&self) -> f64 {
        self.rate.avg
    }

    /// Decision P1: run the controller every `period`, timer-free (each enqueue/dequeue runs
    /// the updates that came due, like a timer-free PIE).
    fn catch_up(&mut self, now: Instant) {
        let mut next = *self.next_update.get_or_insert(now + self.p.period);
        while now >= next {
            // Eq. 1 with the current backlog (decision P7). With no rate estimate yet and a
            // non-empty queue there is no delay measurement: skip, as Linux PIE does.
            if self.rate.avg > 0.0 || self.q.fifo.bytes == 0 {
                let tau = if self.q.fifo.bytes == 0 {
                    0.0
                } else {
                    self.q.fifo.bytes as f64 / self.rate.avg
                };
                self.tau = Duration::from_secs_f64(tau.min(3600.0));
                // Eq. 2.
                self.ctl.update(tau - self.p.target.as_secs_f64());
            }
            next += self.p.period;
        }
        self.next_update = Some(next);
    }
}

impl<T: Send> QueueDiscipline<T> for PidDelay<T> {
    fn name(&self) -> &'static str {
        "pid-delay"
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
        // Decision P8: drop at enqueue with probability U, never with ≤ 2 packets' worth queued.
        let mut verdict = Verdict::Enqueued;
        let mut packet = packet;
        let u = self.ctl.u;
        let room = self.q.fifo.bytes + packet.size <= 2 * self.p.mean_pkt_size;
        if !room && u > 0.0 && self.rng.next_f64() < u {
            // Decision P9: mark instead while U ≤ 0.1.
            match self.q.signal(packet, self.p.ecn && u <= 0.1, dropped) {
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
        self.rate
            .on_dequeue(now, p.size, self.q.fifo.bytes, self.p.dq_threshold);
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

    const MS: f64 = 0.001;

    fn ctl_at(o1: f64, o2: f64) -> PidController {
        let mut c = PidController::new(PidDelayParams::default());
        c.o1 = o1;
        c.o2 = o2;
        c.u = 0.5;
        c
    }

    /// Each branch of Algorithm 1 with its exact ΔU (Table II gains, errors in seconds).
    #[test]
    fn algorithm_1_branches() {
        let (kp, ki, kd) = (1.3125, 1.25, 0.125);
        let pid = |o: f64, o1: f64, o2: f64| (kp * (o - o1), ki * o, kd * (o - 2.0 * o1 + o2));
        // (o, o1, o2, branch, scale, integral?)
        let cases = [
            (
                30.0 * MS,
                25.0 * MS,
                20.0 * MS,
                Branch::LargeError,
                1.5,
                false,
            ),
            (15.0 * MS, 12.0 * MS, 11.0 * MS, Branch::Growing, 1.2, true),
            (
                15.0 * MS,
                17.0 * MS,
                14.0 * MS,
                Branch::Shrinking,
                1.2,
                false,
            ),
            (15.0 * MS, 17.0 * MS, 18.0 * MS, Branch::Plain, 1.0, true),
            (4.0 * MS, 6.0 * MS, 7.0 * MS, Branch::Extremum, 0.8, false),
            (4.0 * MS, 3.0 * MS, 2.0 * MS, Branch::Plain, 1.0, true),
            (-5.0 * MS, -5.0 * MS, -5.0 * MS, Branch::Plain, 1.0, true),
        ];
        for (o, o1, o2, branch, scale, integral) in cases {
            let mut c = ctl_at(o1, o2);
            let (delta, b) = c.update(o);
            let (p, i, d) = pid(o, o1, o2);
            let want = scale * (p + d + if integral { i } else { 0.0 });
            assert_eq!(b, branch, "o={o} o1={o1} o2={o2}");
            assert!(
                (delta - want).abs() < 1e-12,
                "{branch:?}: {delta} vs {want}"
            );
            assert!((c.u - (0.5 + want).clamp(0.0, 1.0)).abs() < 1e-12);
        }
    }

    #[test]
    fn output_is_clamped_and_unwinds_at_once() {
        let mut c = PidController::new(PidDelayParams::default());
        for _ in 0..200 {
            c.update(0.009); // a small standing error: plain PID, the integral acts
        }
        assert_eq!(c.u, 1.0);
        // Clamping stops the integral at 1: the first negative steps bring U down at once.
        for _ in 0..3 {
            c.update(-0.005);
        }
        assert!(c.u < 1.0);
        for _ in 0..500 {
            c.update(-0.005);
        }
        assert_eq!(c.u, 0.0);
    }

    #[test]
    fn dequeue_rate_estimate_matches_the_link() {
        // 1500-byte packets leaving every 1.2 ms = 1.25 MB/s (10 Mbit/s).
        let mut r = DequeueRate::default();
        let t0 = Instant::now();
        for i in 0..200u64 {
            r.on_dequeue(
                t0 + Duration::from_micros(1200 * (i + 1)),
                1500,
                100_000,
                16 * 1024,
            );
        }
        assert!((r.avg - 1_250_000.0).abs() / 1_250_000.0 < 0.1, "{}", r.avg);
    }

    /// Above τ0 + M1 Algorithm 1 drops the integral term, so in incremental form U moves only
    /// with changes of the error: the controller is proportional there.
    #[test]
    fn large_standing_error_has_no_integral_action() {
        let mut c = PidController::new(PidDelayParams::default());
        c.update(0.1);
        let u = c.u;
        c.update(0.1); // Δo = 0 → only the derivative of the last step acts
        let u2 = c.u;
        for _ in 0..100 {
            c.update(0.1);
        }
        assert!(u > 0.0);
        assert_eq!(c.u, u2, "no drift while the large error stands still");
    }

    /// Arrivals at 1.5 × a 10 Mbit/s service rate. Drop-tail at this limit would settle at
    /// 1000 packets = 1.2 s; PID-Delay holds the delay far lower, by dropping early. Because the
    /// large-error branch is proportional-only, the standing delay sits above τ0 + M1, where
    /// Z1·Kp·Δτ has built the drop probability the overload needs.
    #[test]
    fn holds_delay_near_target_under_overload() {
        let mut q = PidDelay::new(PidDelayParams::default(), 3);
        let t0 = Instant::now();
        let mut d = Vec::new();
        let service = Duration::from_micros(1200);
        let mut t_arr = Duration::ZERO;
        let mut t_srv = Duration::ZERO;
        let mut sojourns = Vec::new();
        let end = Duration::from_secs(20);
        while t_arr < end {
            while t_srv <= t_arr {
                if let Some(p) = q.dequeue(t0 + t_srv, &mut d) {
                    if t_srv > Duration::from_secs(10) {
                        sojourns.push(p.sojourn(t0 + t_srv).as_secs_f64());
                    }
                }
                t_srv += service;
            }
            q.enqueue(t0 + t_arr, Packet::new(1500, 0, ()), &mut d);
            t_arr += service * 2 / 3;
        }
        let mean = sojourns.iter().sum::<f64>() / sojourns.len() as f64;
        assert!(mean > 0.025 && mean < 0.3, "mean sojourn {mean} s");
        assert!(q.stats().dropped_aqm > 0);
        assert_eq!(q.stats().dropped_overflow, 0);
    }
}
