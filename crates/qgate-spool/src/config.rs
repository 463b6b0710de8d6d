//! The spool's settings and their defaults, declared once: the gateway's config file, its
//! flags and the docs read them here.

use std::path::PathBuf;
use std::time::Duration;

/// What a full spool does with a new record of a class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnFull {
    /// Refuse it: the device gets `503` and keeps its own copy. Nothing answered as stored is
    /// ever lost.
    Refuse,
    /// Drop the oldest best-effort records to make room (counted as dropped). Records that
    /// were answered as stored are then lost: chosen by the operator, never the default.
    DropOldest,
}

impl std::str::FromStr for OnFull {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "refuse" => Ok(OnFull::Refuse),
            "drop-oldest" => Ok(OnFull::DropOldest),
            _ => Err(format!("{s:?}: expected refuse or drop-oldest")),
        }
    }
}

/// Bytes the spool holds at most by default (Greengrass stream manager's default `maxSize`).
pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;
/// Records held at most by default.
pub const DEFAULT_MAX_RECORDS: u64 = 1_000_000;
/// How long a record may wait by default before it is dropped as expired.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(24 * 3600);
/// One device's share by default: an eighth of the spool, so one device cannot fill it.
pub const DEFAULT_DEVICE_SHARE: u64 = 8;
/// Bytes kept free on the spool's filesystem by default: a full spool never fills the disk.
pub const DEFAULT_KEEP_FREE: u64 = 256 << 20;
/// Bytes per segment file: the unit a drained spool gives back to the disk.
pub const DEFAULT_SEGMENT_BYTES: u64 = 16 << 20;
/// The largest record the spool takes (its frame content).
pub const MAX_RECORD: usize = 16 << 20;

/// The spool's limits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Bytes held at most (frames on disk).
    pub max_bytes: u64,
    /// Records held at most.
    pub max_records: u64,
    /// A record older than this is dropped as expired, never delivered.
    pub max_age: Duration,
    /// One device's bytes at most.
    pub device_bytes: u64,
    /// One device's records at most.
    pub device_records: u64,
    /// What a full spool does, by class (best effort, priority).
    pub on_full: [OnFull; 2],
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: DEFAULT_MAX_BYTES,
            max_records: DEFAULT_MAX_RECORDS,
            max_age: DEFAULT_MAX_AGE,
            device_bytes: DEFAULT_MAX_BYTES / DEFAULT_DEVICE_SHARE,
            device_records: DEFAULT_MAX_RECORDS / DEFAULT_DEVICE_SHARE,
            on_full: [OnFull::Refuse; 2],
        }
    }
}

/// The spool's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SpoolConfig {
    /// Its directory (made if missing; one gateway's alone).
    pub dir: PathBuf,
    /// Its limits.
    pub limits: Limits,
    /// Bytes kept free on its filesystem.
    pub keep_free: u64,
    /// Bytes per segment file.
    pub segment_bytes: u64,
}

impl SpoolConfig {
    /// The defaults, in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> SpoolConfig {
        SpoolConfig {
            dir: dir.into(),
            limits: Limits::default(),
            keep_free: DEFAULT_KEEP_FREE,
            segment_bytes: DEFAULT_SEGMENT_BYTES,
        }
    }
}
