//! Bytes in flight as the congestion controllers see them: sent, not yet acknowledged and
//! not declared lost (QUIC packet bytes, headers included). A [`FlightGauge`] is shared by
//! every connection built with it (every path, with multipath), and keeps its peak: what a
//! sender must hold for retransmission, measured rather than bounded by its send window
//! (paper 001 item 5). It wraps whichever controller the options choose, so nothing reaches
//! into quinn.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use quinn::congestion::{Controller, ControllerFactory};
// The controller trait's own type: quinn passes the times in (virtual under a paused clock);
// nothing here reads a clock.
use std::time::Instant;

use crate::delegate::{Layer, Wrapped};

/// A shared count of bytes in flight, and its peak. Clones share the count.
#[derive(Clone, Default)]
pub struct FlightGauge(Arc<Counts>);

#[derive(Default)]
struct Counts {
    now: AtomicU64,
    peak: AtomicU64,
}

impl FlightGauge {
    /// A gauge at zero.
    pub fn new() -> FlightGauge {
        FlightGauge::default()
    }

    /// Bytes in flight now, over every connection using the gauge.
    pub fn now(&self) -> u64 {
        self.0.now.load(Ordering::Relaxed)
    }

    /// The most that were ever in flight at once.
    pub fn peak(&self) -> u64 {
        self.0.peak.load(Ordering::Relaxed)
    }

    /// Move one sender's share from `*mine` to `new` (a controller per connection or path
    /// keeps its own share, so the gauge is their sum).
    pub fn set(&self, mine: &mut u64, new: u64) {
        let c = &self.0;
        let now = if new >= *mine {
            c.now.fetch_add(new - *mine, Ordering::Relaxed) + (new - *mine)
        } else {
            c.now.fetch_sub(*mine - new, Ordering::Relaxed) - (*mine - new)
        };
        *mine = new;
        c.peak.fetch_max(now, Ordering::Relaxed);
    }
}

impl PartialEq for FlightGauge {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl fmt::Debug for FlightGauge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlightGauge")
            .field("now", &self.now())
            .field("peak", &self.peak())
            .finish()
    }
}

/// Builds the configured controller, wrapped to keep `gauge` up to date.
pub(crate) struct CountedFactory {
    pub(crate) inner: Arc<dyn ControllerFactory + Send + Sync>,
    pub(crate) gauge: FlightGauge,
}

impl ControllerFactory for CountedFactory {
    fn build(self: Arc<Self>, now: Instant, current_mtu: u16) -> Box<dyn Controller> {
        Box::new(Wrapped(Counted {
            inner: self.inner.clone().build(now, current_mtu),
            gauge: self.gauge.clone(),
            mine: 0,
            original: true,
        }))
    }
}

struct Counted {
    inner: Box<dyn Controller>,
    gauge: FlightGauge,
    /// This connection's bytes in flight, as last known.
    mine: u64,
    /// Copies made by `clone_box` (quinn's `congestion_state()`) do not count.
    original: bool,
}

impl Counted {
    fn set(&mut self, new: u64) {
        if self.original {
            self.gauge.set(&mut self.mine, new);
        }
    }
}

impl Layer for Counted {
    fn inner(&self) -> &dyn Controller {
        self.inner.as_ref()
    }

    fn inner_mut(&mut self) -> &mut dyn Controller {
        self.inner.as_mut()
    }

    fn copy(&self) -> Counted {
        Counted {
            inner: self.inner.clone_box(),
            gauge: self.gauge.clone(),
            mine: self.mine,
            original: false,
        }
    }

    fn on_sent(&mut self, now: Instant, bytes: u64, last_packet_number: u64) {
        self.set(self.mine + bytes);
        self.inner.on_sent(now, bytes, last_packet_number)
    }

    fn on_end_acks(
        &mut self,
        now: Instant,
        in_flight: u64,
        app_limited: bool,
        largest: Option<u64>,
    ) {
        // The connection's own count after a batch of acknowledgements: exact again.
        self.set(in_flight);
        self.inner.on_end_acks(now, in_flight, app_limited, largest)
    }

    fn on_congestion_event(&mut self, now: Instant, sent: Instant, persistent: bool, lost: u64) {
        self.set(self.mine.saturating_sub(lost));
        self.inner.on_congestion_event(now, sent, persistent, lost)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        // A closed connection holds nothing.
        self.set(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gauge_sums_senders_and_keeps_its_peak() {
        let g = FlightGauge::new();
        let (mut a, mut b) = (0, 0);
        g.set(&mut a, 1000);
        g.set(&mut b, 500);
        assert_eq!((g.now(), g.peak()), (1500, 1500));
        g.set(&mut a, 200);
        assert_eq!((g.now(), g.peak()), (700, 1500));
        g.set(&mut b, 0);
        g.set(&mut a, 0);
        assert_eq!((g.now(), g.peak()), (0, 1500));
        assert_eq!(g.clone(), g);
        assert_ne!(FlightGauge::new(), g);
    }
}
