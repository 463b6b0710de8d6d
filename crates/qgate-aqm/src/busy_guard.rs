//! The busy-time guard (decision P12): a slow outer loop that raises a delay-targeting
//! discipline's target while the link it feeds idles although the flows fill the queue to the
//! target, and lowers it again once the link stays busy.
//!
//! A delay target alone cannot say how much queue the flows need to keep the link busy: every
//! loss or mark takes a share of one flow's window, and with few flows on a long path that share
//! is more than a few milliseconds of queue (5 CUBIC flows at 5 Mbit/s and 200 ms give up about
//! 5 packets, 12 ms, per loss). The guard measures what the target costs instead of modelling it:
//! the fraction of each [`WINDOW`] the transmitter found the queue empty. It raises the target
//! only while the measured queue delay has reached the target within [`FULL_MEMORY`]: idle time
//! on a link whose senders never fill the queue that far is a lack of traffic, which a larger
//! target cannot help, so a lightly loaded link keeps the operator's target, and the allowance
//! stops growing where the flows stop reaching it.
//!
//! Sans-IO: every call takes `now`; the caller reports admissions, delay measurements and the
//! moments the transmitter asked for a packet and found none.

use std::time::{Duration, Instant};

/// How long the guard measures idle time before it moves the allowance.
pub const WINDOW: Duration = Duration::from_secs(1);
/// Idle time may raise the allowance for this long after the queue delay last reached the
/// target. (1 s kept 90.6 % of the 5 Mbit/s lab point busy, 3 s 91.8 %: docs/decisions.md P12.)
pub const FULL_MEMORY: Duration = Duration::from_secs(3);
/// Seconds of allowance per unit of idle fraction away from the set-point, per window: 8 % too
/// much idle adds 8 ms a second; an always-busy link (set-point 0.96) sheds 4 ms a second.
pub const GAIN_S: f64 = 0.1;
/// The most one window raises the allowance, so that the idle of a load that has just ended
/// (the queue was full a moment ago) adds at most this much per window of [`FULL_MEMORY`].
pub const MAX_STEP: Duration = Duration::from_millis(10);

/// The guard's state.
#[derive(Debug, Clone)]
pub struct BusyGuard {
    /// The busy fraction to keep, in (0, 1).
    busy: f64,
    /// The most the target may be raised.
    max: Duration,
    window_start: Option<Instant>,
    /// Idle time closed in the current window.
    idle: Duration,
    /// When the transmitter last found the queue empty, while it still is.
    idle_since: Option<Instant>,
    /// When the measured queue delay last reached the target.
    last_full: Option<Instant>,
    allowance: Duration,
}

impl BusyGuard {
    /// A guard that keeps the link busy at least `busy` of the time (in (0, 1)) by raising the
    /// target by up to `max`.
    pub fn new(busy: f64, max: Duration) -> Self {
        BusyGuard {
            busy: busy.clamp(f64::MIN_POSITIVE, 1.0 - f64::EPSILON),
            max,
            window_start: None,
            idle: Duration::ZERO,
            idle_since: None,
            last_full: None,
            allowance: Duration::ZERO,
        }
    }

    /// What the guard adds to the target now.
    pub fn allowance(&self) -> Duration {
        self.allowance
    }

    /// The discipline measured queue delay `tau` against its current `target`.
    pub fn on_queue_delay(&mut self, now: Instant, tau: Duration, target: Duration) {
        self.roll(now);
        if tau >= target {
            self.last_full = Some(now);
        }
    }

    /// The transmitter asked for a packet and the queue had none: the link idles from `now`.
    pub fn on_empty(&mut self, now: Instant) {
        self.roll(now);
        self.idle_since.get_or_insert(now);
    }

    /// A packet was admitted: the idle period, if any, ends.
    pub fn on_arrival(&mut self, now: Instant) {
        self.roll(now);
        if let Some(t) = self.idle_since.take() {
            self.idle += now.saturating_duration_since(t);
        }
    }

    /// Close every window that ended by `now` and move the allowance once per window.
    pub fn roll(&mut self, now: Instant) {
        let mut start = *self.window_start.get_or_insert(now);
        while now >= start + WINDOW {
            let end = start + WINDOW;
            let mut idle = self.idle;
            if let Some(t) = self.idle_since {
                idle += end.saturating_duration_since(t.max(start));
                self.idle_since = Some(end);
            }
            let idle_fraction = (idle.as_secs_f64() / WINDOW.as_secs_f64()).min(1.0);
            let error = idle_fraction - (1.0 - self.busy);
            let filled = self
                .last_full
                .is_some_and(|t| end.saturating_duration_since(t) <= FULL_MEMORY);
            // Too much idle raises the allowance only while the flows fill the queue to the
            // target; otherwise it is a lack of traffic, and the allowance falls as on a busy
            // link. Too little idle always lowers it.
            let step = if error < 0.0 || filled {
                (GAIN_S * error).min(MAX_STEP.as_secs_f64())
            } else {
                -GAIN_S * (1.0 - self.busy)
            };
            let a = self.allowance.as_secs_f64() + step;
            self.allowance = Duration::from_secs_f64(a.clamp(0.0, self.max.as_secs_f64()));
            self.idle = Duration::ZERO;
            start = end;
        }
        self.window_start = Some(start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Windows `from..from + n` in which the link idles the last `idle_ms` of each; when
    /// `full`, the queue delay reaches the target at the start of each.
    fn windows(g: &mut BusyGuard, t0: Instant, from: u32, n: u32, idle_ms: u32, full: bool) {
        for s in from..from + n {
            let at = t0 + WINDOW * s;
            let tau = if full { 5 * MS } else { Duration::ZERO };
            g.on_queue_delay(at, tau, 5 * MS);
            g.on_arrival(at);
            g.on_empty(at + WINDOW - MS * idle_ms);
            g.on_arrival(at + WINDOW);
        }
    }

    fn assert_ms(g: &BusyGuard, ms: f64) {
        let a = g.allowance().as_secs_f64() * 1e3;
        assert!((a - ms).abs() < 1e-6, "allowance {a} ms, want {ms}");
    }

    #[test]
    fn idle_while_the_queue_fills_raises_and_busy_lowers() {
        let t0 = Instant::now();
        let mut g = BusyGuard::new(0.96, 100 * MS);
        g.roll(t0);
        // 12 % idle against a 4 % budget: +8 ms per window.
        windows(&mut g, t0, 0, 3, 120, true);
        assert_ms(&g, 24.0);
        // Busy the whole time: −4 ms per window, down to zero and no further.
        windows(&mut g, t0, 3, 3, 0, true);
        assert_ms(&g, 12.0);
        windows(&mut g, t0, 6, 10, 0, false);
        assert_ms(&g, 0.0);
    }

    /// Idle raises the allowance only for FULL_MEMORY after the queue was last full; after
    /// that it is a lack of traffic, and the allowance falls as on a busy link.
    #[test]
    fn idle_without_a_full_queue_is_a_lack_of_traffic() {
        let t0 = Instant::now();
        let mut g = BusyGuard::new(0.96, 100 * MS);
        g.roll(t0);
        windows(&mut g, t0, 0, 20, 900, false);
        assert_ms(&g, 0.0);
        // Full at the start of windows 20–22 (the last at 22 s), 12 % idle: +8 ms each.
        windows(&mut g, t0, 20, 3, 120, true);
        assert_ms(&g, 24.0);
        // Then idle from 23 s on with nothing queued: the windows ending at 24 and 25 s are
        // within FULL_MEMORY of 22 s (+10 ms each, the step cap); from 26 s, −4 ms each.
        g.on_empty(t0 + WINDOW * 23);
        g.roll(t0 + WINDOW * 25);
        assert_ms(&g, 44.0);
        g.roll(t0 + WINDOW * 30);
        assert_ms(&g, 24.0);
        g.roll(t0 + WINDOW * 40);
        assert_ms(&g, 0.0);
    }

    /// The idle after a load ends raises the allowance by at most MAX_STEP per window of
    /// FULL_MEMORY, and the cap holds.
    #[test]
    fn steps_and_allowance_are_capped() {
        let t0 = Instant::now();
        let mut g = BusyGuard::new(0.96, 100 * MS);
        g.roll(t0);
        g.on_queue_delay(t0, 5 * MS, 5 * MS);
        g.on_empty(t0);
        g.roll(t0 + FULL_MEMORY);
        let windows_in_memory = FULL_MEMORY.as_secs_f64() / WINDOW.as_secs_f64();
        assert_ms(&g, windows_in_memory * MAX_STEP.as_secs_f64() * 1e3);
        let mut g = BusyGuard::new(0.96, 30 * MS);
        g.roll(t0);
        windows(&mut g, t0, 0, 50, 1000, true);
        assert_ms(&g, 30.0);
    }

    /// An idle period that spans a window boundary counts in each window for its own part.
    #[test]
    fn idle_spanning_windows_is_split() {
        let t0 = Instant::now();
        let mut g = BusyGuard::new(0.95, 100 * MS);
        g.roll(t0);
        g.on_queue_delay(t0, 5 * MS, 5 * MS);
        g.on_empty(t0 + 930 * MS);
        g.roll(t0 + WINDOW);
        assert_ms(&g, 2.0); // 7 % idle in window 0: +2 ms
        g.on_arrival(t0 + 1030 * MS);
        g.roll(t0 + WINDOW * 2);
        assert_ms(&g, 0.0); // 3 % in window 1: −2 ms
    }
}
