//! Disk work on the request's own task, at a fixed point of virtual time (decision U12).

use std::future::Future;
use std::pin::Pin;

use qgate_core::disk::DiskRunner;

/// Runs the upload receiver's disk work where it is asked for, so one seed gives one result.
#[derive(Debug, Clone, Copy, Default)]
pub struct InlineDisk;

impl DiskRunner for InlineDisk {
    fn run(
        &self,
        job: Box<dyn FnOnce() + Send>,
    ) -> Pin<Box<dyn Future<Output = Result<(), tokio::task::JoinError>> + Send>> {
        job();
        Box::pin(std::future::ready(Ok(())))
    }
}
