//! Whether a backhaul path's server answers, as the log tells it (issue 53 item 1): a gateway
//! that cannot reach its server used to say nothing until a device got a 502. Sans-IO: the
//! path manager reports connects, failures and losses with `now`; this says which line to
//! write. One line when a path comes up, one when it goes down or its first connection fails,
//! and while it stays down a reminder at most every [`REMIND`], so a dead server neither goes
//! unnoticed nor floods the log with one line per probe.

use std::time::{Duration, Instant};

/// Least time between two "still unreachable" lines of one path.
pub const REMIND: Duration = Duration::from_secs(60);

/// What a path's connection attempts have shown so far.
#[derive(Debug, Default)]
pub struct Reachability {
    up: Option<bool>,
    /// Failed attempts since the path was last up (or since the start).
    failures: u64,
    /// When the last "down" line was written.
    said: Option<Instant>,
}

/// The line to write, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Say {
    /// The path is up: for the first time, or `again` after being down (a recovery, which
    /// the log says at the level it said the fault).
    Up {
        /// It was down before.
        again: bool,
        /// Attempts that failed before this one.
        after_failures: u64,
    },
    /// The path is down: its first attempts failed, or its last connection was lost.
    Down,
    /// Still down after this many failed attempts.
    StillDown {
        /// Failed attempts since it was last up.
        failures: u64,
    },
}

impl Reachability {
    /// A connection of the path was established.
    pub fn on_up(&mut self) -> Option<Say> {
        let was = self.up.replace(true);
        let after_failures = std::mem::take(&mut self.failures);
        self.said = None;
        (was != Some(true)).then_some(Say::Up {
            again: was == Some(false),
            after_failures,
        })
    }

    /// An attempt to connect the path failed (no other connection of it is live).
    pub fn on_failure(&mut self, now: Instant) -> Option<Say> {
        self.failures += 1;
        match self.up.replace(false) {
            Some(false) => match self.said {
                Some(t) if now.saturating_duration_since(t) < REMIND => None,
                _ => {
                    self.said = Some(now);
                    Some(Say::StillDown {
                        failures: self.failures,
                    })
                }
            },
            // Up until now, or never tried: say it at once.
            _ => {
                self.said = Some(now);
                Some(Say::Down)
            }
        }
    }

    /// The path's last live connection closed.
    pub fn on_lost(&mut self, now: Instant) -> Option<Say> {
        match self.up.replace(false) {
            Some(true) => {
                self.said = Some(now);
                Some(Say::Down)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn says_each_change_once_and_reminds_while_down() {
        let t0 = Instant::now();
        let s = |secs: u64| t0 + Duration::from_secs(secs);
        let mut r = Reachability::default();
        // A server that is not there at start: said at once, then once a minute.
        assert_eq!(r.on_failure(s(0)), Some(Say::Down));
        assert_eq!(r.on_failure(s(5)), None);
        assert_eq!(r.on_failure(s(59)), None);
        assert_eq!(r.on_failure(s(60)), Some(Say::StillDown { failures: 4 }));
        assert_eq!(r.on_failure(s(61)), None);
        assert_eq!(
            r.on_up(),
            Some(Say::Up {
                again: true,
                after_failures: 5
            })
        );
        assert_eq!(r.on_up(), None, "a second lane coming up is no news");
        // Lost, then failing again: one line for the loss, the next after a minute.
        assert_eq!(r.on_lost(s(100)), Some(Say::Down));
        assert_eq!(r.on_lost(s(101)), None);
        assert_eq!(r.on_failure(s(102)), None);
        assert_eq!(r.on_failure(s(160)), Some(Say::StillDown { failures: 2 }));
        assert_eq!(
            r.on_up(),
            Some(Say::Up {
                again: true,
                after_failures: 2
            })
        );
        // A path up from its first attempt.
        let mut r = Reachability::default();
        assert_eq!(
            r.on_up(),
            Some(Say::Up {
                again: false,
                after_failures: 0
            })
        );
        assert_eq!(r.on_lost(s(0)), Some(Say::Down));
    }
}
