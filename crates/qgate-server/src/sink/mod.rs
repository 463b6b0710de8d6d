//! Where ingested records go: a provider. Each sink is one module implementing [`Sink`]: counted
//! only ([`CountSink`]), stored as files ([`DirSink`]), or sent to an AMQP queue ([`QueueSink`]),
//! durably, before the record is acknowledged. A new sink is one more module (decision W2).

mod count;
mod dir;
mod queue;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

use bytes::Bytes;
use qgate_forward::scheduler::Priority;

pub use count::CountSink;
pub use dir::DirSink;
pub use queue::{QueueSink, QueueSinkConfig, QueueSinkStats, Upstream};

/// Storing a body failed.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// A file or directory could not be written (answered 500).
    #[error("sink {path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The queue did not take the message now (answered 503: try again later).
    #[error("{0}")]
    Unavailable(String),
    /// Larger than the queue takes (answered 413).
    #[error("{0}")]
    TooLarge(String),
    /// The queue refused the message for good (answered 500).
    #[error("{0}")]
    Refused(String),
    /// The disk is nearly full (answered 507): nothing was stored (decision S11).
    #[error("{0}")]
    Full(String),
}

impl SinkError {
    /// The HTTP status a device gets for this failure.
    pub fn status(&self) -> http::StatusCode {
        match self {
            SinkError::Io { .. } | SinkError::Refused(_) => http::StatusCode::INTERNAL_SERVER_ERROR,
            SinkError::Unavailable(_) => http::StatusCode::SERVICE_UNAVAILABLE,
            SinkError::TooLarge(_) => http::StatusCode::PAYLOAD_TOO_LARGE,
            SinkError::Full(_) => http::StatusCode::INSUFFICIENT_STORAGE,
        }
    }
}

/// One ingested body and what is known about it.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    /// The stream (from `/ingest/<stream>`).
    pub stream: &'a str,
    /// The body, shared with the request that carried it (a sink keeps it without a copy).
    pub body: &'a Bytes,
    /// The forwarder's request id (`qgate-request-id`), if any.
    pub request_id: Option<&'a str>,
    /// The device: the forwarder's `qgate-device`, else the peer's address.
    pub device: &'a str,
    /// The gateway's backhaul path, if it said (`qgate-path`).
    pub path: Option<usize>,
    /// The class the gateway admitted it in, if it said (`qgate-priority`).
    pub class: Option<Priority>,
}

/// What [`Sink::store`] returns: the record's id once it is durable.
pub type Stored<'a> = Pin<Box<dyn Future<Output = Result<u64, SinkError>> + Send + 'a>>;

/// The state of a sink that delivers to an upstream (the queue sink's broker), for the metrics,
/// `/health` and the admin port.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct UpstreamView {
    /// Whether the link to the upstream is attached.
    pub up: bool,
    /// Records the upstream accepted.
    pub accepted: u64,
    /// Records that could not be delivered (answered 503).
    pub failed: u64,
    /// Connections opened to the upstream.
    pub connects: u64,
}

/// The destination of ingested records.
pub trait Sink: Send + Sync + std::fmt::Debug + 'static {
    /// Store one record; its id once it is durable (an acknowledged record is never lost).
    fn store<'a>(&'a self, rec: &'a Record<'a>) -> Stored<'a>;

    /// Its upstream's state, for a sink that has one; `GET /health` answers 503 while it is
    /// down.
    fn upstream(&self) -> Option<UpstreamView> {
        None
    }
}

/// An I/O error on `path` as a [`SinkError`].
pub(crate) fn io_error(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> SinkError + '_ {
    move |source| SinkError::Io {
        path: path.to_path_buf(),
        source,
    }
}
