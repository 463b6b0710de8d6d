//! What the gateway counts: its counters (declared once) and its response-delay histograms.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use qgate_core::metrics;

/// Upper bounds of the response-delay histogram buckets, seconds.
const DELAY_BUCKETS: [f64; 12] = [
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
];

/// Response delays of one class: the exposed histogram, and its count and sum for the admin
/// API (the library reads those back only in its tests).
#[derive(Debug)]
pub struct DelayHistogram {
    pub(crate) hist: metrics::Histogram,
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Default for DelayHistogram {
    fn default() -> Self {
        DelayHistogram {
            hist: metrics::Histogram::new(DELAY_BUCKETS),
            count: AtomicU64::new(0),
            sum_us: AtomicU64::new(0),
        }
    }
}

impl DelayHistogram {
    pub(crate) fn record(&self, d: Duration) {
        self.hist.observe(d.as_secs_f64());
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// Responses recorded.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Their delays added up, seconds.
    pub fn sum_s(&self) -> f64 {
        self.sum_us.load(Ordering::Relaxed) as f64 / 1e6
    }
}

qgate_core::counters! {
    /// What the gateway has done.
    pub struct GatewayStats => StatsSnapshot {
        /// Devices registered.
        registered: counter "qgate_gateway_registered", "devices registered";
        /// Requests refused because their connection showed no usable device identity.
        unauthenticated: counter "qgate_gateway_unauthenticated",
            "requests refused for want of a usable device identity";
        /// Requests answered by the server.
        forwarded: counter "qgate_gateway_forwarded", "requests answered by the server";
        /// Forwarding attempts that failed and were retried on another path.
        retried: counter "qgate_gateway_retried", "forwarding attempts retried on another path";
        /// Requests refused: unknown, forged or malformed Hash ID, or too many in flight.
        refused: counter "qgate_gateway_refused",
            "requests refused for their Hash ID or in-flight limit";
        /// Registrations refused: the gateway, the connection or the address is full.
        registrations_refused: counter "qgate_gateway_registrations_refused",
            "registrations refused: gateway, connection or address full";
        /// Sessions ended for being idle.
        sessions_expired: counter "qgate_gateway_sessions_expired", "sessions ended for being idle";
        /// Forwarding attempts that timed out (their stream cancelled, the connection kept).
        timeouts: counter "qgate_gateway_timeouts",
            "forwarding attempts timed out (stream cancelled, connection kept)";
        /// Requests that failed on every path.
        failed: counter "qgate_gateway_failed", "requests that failed on every path";
        /// Requests handled before their connection's handshake finished (they came in 0-RTT).
        early: counter "qgate_gateway_early_requests",
            "requests handled before their connection's handshake finished (0-RTT)";
        /// Of those, refused (425): no device request id, or not a record.
        too_early: counter "qgate_gateway_too_early",
            "of those, refused with 425: no device request id, or not a record";
    }
    extra {
        /// Response delay (device request in → response out) of priority devices.
        pub delay_priority: DelayHistogram,
        /// Response delay of best-effort devices.
        pub delay_best_effort: DelayHistogram,
    }
}
