//! A rate limit for repeated log lines (decision G11): a hostile peer that makes the gateway
//! refuse a request a million times must not write a million lines. Each kind of line may be
//! written `burst` times per `window`; the rest are counted, and the next line written says how
//! many were left out. Counters in `/metrics` stay exact: only the text is limited.

use std::time::{Duration, Instant};

/// One kind of log line's budget.
#[derive(Debug, Clone)]
pub struct LogGate {
    burst: u32,
    window: Duration,
    window_start: Option<Instant>,
    written: u32,
    /// Left out since the last line written.
    pending: u64,
    /// Left out in all.
    suppressed: u64,
}

impl LogGate {
    /// At most `burst` lines per `window`.
    pub const fn new(burst: u32, window: Duration) -> LogGate {
        LogGate {
            burst,
            window,
            window_start: None,
            written: 0,
            pending: 0,
            suppressed: 0,
        }
    }

    /// Whether a line may be written at `now`: `Some(n)` with the `n` lines left out since the
    /// last one written, or `None` (counted as left out).
    pub fn admit(&mut self, now: Instant) -> Option<u64> {
        let fresh = self
            .window_start
            .is_none_or(|s| now.saturating_duration_since(s) >= self.window);
        if fresh {
            self.window_start = Some(now);
            self.written = 0;
        }
        if self.written < self.burst {
            self.written += 1;
            Some(std::mem::take(&mut self.pending))
        } else {
            self.pending += 1;
            self.suppressed += 1;
            None
        }
    }

    /// Lines left out since the gate was made.
    pub fn suppressed(&self) -> u64 {
        self.suppressed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_per_window_then_the_count_of_what_was_left_out() {
        let t0 = Instant::now();
        let mut g = LogGate::new(3, Duration::from_secs(10));
        let out: Vec<Option<u64>> = (0..10).map(|_| g.admit(t0)).collect();
        assert_eq!(out[..3], [Some(0), Some(0), Some(0)]);
        assert!(out[3..].iter().all(Option::is_none));
        assert_eq!(g.suppressed(), 7);
        // Still the same window.
        assert_eq!(g.admit(t0 + Duration::from_secs(9)), None);
        // The next window's first line reports the 8 left out.
        assert_eq!(g.admit(t0 + Duration::from_secs(10)), Some(8));
        assert_eq!(g.admit(t0 + Duration::from_secs(10)), Some(0));
        assert_eq!(g.suppressed(), 8);
    }

    #[test]
    fn a_million_refusals_write_a_bounded_number_of_lines() {
        let t0 = Instant::now();
        let mut g = LogGate::new(10, Duration::from_secs(60));
        // One refusal every 0.36 ms for six minutes.
        let written = (0..1_000_000u64)
            .filter(|i| g.admit(t0 + Duration::from_micros(i * 360)).is_some())
            .count();
        assert_eq!(written, 10 * 6);
        assert_eq!(g.suppressed() + written as u64, 1_000_000);
    }
}
