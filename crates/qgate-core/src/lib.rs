//! Infrastructure shared by qgate's crates: counters declared once ([`counters!`]) and the
//! metrics helpers they render with, log gating, per-client quotas and the client key, units
//! (durations, sizes), summaries, a lock that outlives a panicked holder, and where blocking disk
//! work runs. The sans-IO cores
//! live in crates of their own, by who uses them: `qgate-forward` (forwarding and its
//! protocol), `qgate-history` (window history), `qgate-chunks` (the upload's planner and
//! protocol).

pub mod counters;
pub mod disk;
pub mod loggate;
pub mod metrics;
pub mod quota;
pub mod summary;
pub mod sync;
pub mod units;
