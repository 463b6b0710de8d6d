//! What every client of the broker scenario saw, shared by their tasks, and the workload's
//! clock they note times on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// What every client saw, shared by their tasks.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) offered: u64,
    /// Message-id → when its producer first saw `accepted` (s from the workload's start).
    pub(super) accepted: HashMap<String, f64>,
    /// Every accepted outcome, s.
    pub(super) accept_times: Vec<f64>,
    /// Message-id → how many times a consumer received it.
    pub(super) deliveries: HashMap<String, u32>,
    /// Per client (producers first): when it succeeded (accepted outcome / message in), s.
    pub(super) ok: Vec<Vec<f64>>,
    /// Messages offered and never accepted at the end.
    pub(super) pending: u64,
    pub(super) producer_connects: u64,
    pub(super) consumer_connects: u64,
    pub(super) connect_failures: u64,
    pub(super) zero_rtt_rejected: u64,
    pub(super) zero_rtt: u64,
    pub(super) resent: u64,
    pub(super) not_accepted: u64,
    pub(super) stalls: u64,
    pub(super) connections_lost: u64,
    pub(super) redeliveries: u64,
}

pub(super) type Shared = Arc<Mutex<Tally>>;

pub(super) fn tally(t: &Shared) -> std::sync::MutexGuard<'_, Tally> {
    t.lock().unwrap_or_else(|e| e.into_inner())
}

/// Virtual seconds since the workload started.
#[derive(Clone, Copy)]
pub(super) struct Clock(pub(super) Instant);

impl Clock {
    pub(super) fn s(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
    pub(super) fn at(&self, s: f64) -> Instant {
        self.0 + Duration::from_secs_f64(s)
    }
}
