//! What an upload reports: live counters while it runs, and its report at the end.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use qgate_chunks::MAX_LANES;

/// Live counters of an upload, readable while it runs (progress bars, the lab's series).
#[derive(Debug, Default)]
pub struct Progress {
    lanes: [LaneCounters; MAX_LANES],
    pub(crate) held_at_start: AtomicU64,
}

/// One lane's counters.
#[derive(Debug, Default)]
pub struct LaneCounters {
    /// Chunks the server confirmed from this lane.
    pub chunks: AtomicU64,
    /// Their bytes.
    pub bytes: AtomicU64,
    /// Whether the lane's connection is up.
    pub up: AtomicBool,
    /// Connections made (1 + reconnections).
    pub connects: AtomicU64,
    /// Requests that failed and were given back to the planner.
    pub failed: AtomicU64,
    /// Connection attempts that failed.
    pub connect_failures: AtomicU64,
    /// Migrations to the backup interface.
    pub migrations: AtomicU64,
    /// Whether the lane's connection is on its backup interface now.
    pub on_backup: AtomicBool,
    /// Requests cancelled because another lane took their chunk over, or because another
    /// lane's copy of it arrived first.
    pub taken_away: AtomicU64,
    /// End-game copies of another lane's last chunk this lane sent (decision U11).
    pub copies: AtomicU64,
}

impl Progress {
    /// Lane `i`'s counters.
    pub fn lane(&self, i: usize) -> &LaneCounters {
        &self.lanes[i]
    }

    /// Bytes the server held before this run (a resumed upload).
    pub fn held_at_start(&self) -> u64 {
        self.held_at_start.load(Ordering::Relaxed)
    }

    /// Bytes confirmed by all lanes in this run.
    pub fn bytes(&self) -> u64 {
        self.lanes
            .iter()
            .map(|l| l.bytes.load(Ordering::Relaxed))
            .sum()
    }
}

/// What a finished upload did.
#[derive(Debug, Clone)]
pub struct Report {
    /// Connections up → the server confirmed the file.
    pub elapsed: Duration,
    /// Bytes the server already held when it started (resumed), not sent again.
    pub resumed_bytes: u64,
    /// Per lane: chunks and bytes confirmed, requests failed, connections made.
    pub lanes: Vec<LaneReport>,
}

/// One lane's part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneReport {
    /// Chunks confirmed.
    pub chunks: u64,
    /// Bytes confirmed.
    pub bytes: u64,
    /// Requests that failed (their chunks went back to the planner).
    pub failed: u64,
    /// Connections made.
    pub connects: u64,
    /// Migrations to the backup interface.
    pub migrations: u64,
}
