//! Locking that outlives a panic: every shell holds one lock around a core, and a task that
//! panicked while holding it must not take the daemon down with it. The data behind a lock is
//! kept consistent by the core's own methods, which do not panic midway by design.

use std::sync::{Mutex, MutexGuard};

/// Lock `m`, taking it over from a holder that panicked.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
