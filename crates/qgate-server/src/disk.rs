//! Where the upload receiver's disk work runs: a provider. Unset, tokio's blocking pool; a
//! simulation in virtual time supplies one that runs the work on the request's own task, since
//! a pool thread finishes at no fixed point among the events of the same instant and runs with
//! one seed drifted apart (decision U12).

use std::future::Future;
use std::pin::Pin;

/// Runs a piece of blocking disk work.
pub trait DiskRunner: Send + Sync {
    /// Run `job`; the future resolves when it has run (an error if it panicked).
    fn run(
        &self,
        job: Box<dyn FnOnce() + Send>,
    ) -> Pin<Box<dyn Future<Output = Result<(), tokio::task::JoinError>> + Send>>;
}
