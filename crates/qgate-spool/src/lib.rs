//! The gateway's durable spool (issue 50): where a record goes when no backhaul path can take
//! it now, answered as stored once it is synced to the gateway's disk, and drained to the
//! server when a path returns.
//!
//! - [`frame`]: one record on disk, with its length and checksum (parse/emit).
//! - [`segment`]: a class's log as a run of segment files, scanned and cut at start.
//! - [`ledger`]: what is held and whether one more record may come in (sans-IO policy, decision
//!   K3).
//! - [`spool`]: the store itself: group-committed appends, reads oldest first, done-tracking.
//! - [`config`]: limits and their defaults, declared once.

pub mod config;
mod crc;
pub mod frame;
pub mod ledger;
pub mod segment;
pub mod spool;
pub mod stats;

pub use config::{Limits, OnFull, SpoolConfig};
pub use frame::Entry;
pub use ledger::Held;
pub use spool::{Done, NewRecord, Spool, SpoolError, SpoolView};
pub use stats::{SpoolSnapshot, SpoolStats};
