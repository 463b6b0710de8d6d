//! Where blocking disk work runs: a provider. Unset, tokio's blocking pool; a simulation in
//! virtual time supplies one that runs the work on the asking task, since a pool thread
//! finishes at no fixed point among the events of the same instant and runs with one seed
//! drifted apart (decision U12). The server's upload receiver and the gateway's spool use it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// Runs a piece of blocking disk work.
pub trait DiskRunner: Send + Sync + std::fmt::Debug {
    /// Run `job`; the future resolves when it has run (an error if it panicked).
    fn run(
        &self,
        job: Box<dyn FnOnce() + Send>,
    ) -> Pin<Box<dyn Future<Output = Result<(), tokio::task::JoinError>> + Send>>;
}

/// `f` on `runner`, or on tokio's blocking pool without one; its result.
pub async fn run<T: Send + 'static>(
    runner: Option<&Arc<dyn DiskRunner>>,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    let Some(runner) = runner else {
        return tokio::task::spawn_blocking(f).await;
    };
    let out = Arc::new(std::sync::Mutex::new(None));
    let slot = out.clone();
    runner
        .run(Box::new(move || {
            *crate::sync::lock(&slot) = Some(f());
        }))
        .await?;
    let done = crate::sync::lock(&out).take();
    Ok(done.expect("a disk runner resolves only after its job ran"))
}
