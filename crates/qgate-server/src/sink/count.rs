//! Records counted and dropped: for benchmarks, and a server run to see what arrives.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Record, Sink, Stored};

/// Keeps nothing; every record gets the next id.
#[derive(Debug)]
pub struct CountSink {
    next: AtomicU64,
}

impl CountSink {
    /// Ids from 1.
    pub fn new() -> CountSink {
        CountSink {
            next: AtomicU64::new(1),
        }
    }
}

impl Default for CountSink {
    fn default() -> Self {
        CountSink::new()
    }
}

impl Sink for CountSink {
    fn store<'a>(&'a self, _rec: &'a Record<'a>) -> Stored<'a> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        Box::pin(std::future::ready(Ok(id)))
    }
}
