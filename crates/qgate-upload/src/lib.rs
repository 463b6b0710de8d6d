//! The device side of qgate's multi-homed two-ended upload (paper 001): one QUIC connection per
//! interface ("lane"), each bound to its own local address; the sans-IO
//! [`Planner`](qgate_chunks::Planner) says which chunk each lane sends next, lane 0
//! from the front of the file and lane 1 from the back, until they meet. Each chunk is one
//! HTTP/3 request to `qgate server` (protocol: `qgate_chunks`, decision U1), read from
//! the file when it is sent. A lane whose connection fails gives its unconfirmed chunks back
//! to the planner and reconnects; an upload that was interrupted resumes with what the server
//! already holds.
//!
//! `Upload::builder()` is the one way to run one: `qgate upload`, the lab and the tests.

mod builder;
mod lane;
mod progress;
mod source;

use std::net::SocketAddr;
use std::time::Duration;

use qgate_transport::Socket;

pub use builder::UploadBuilder;
pub use progress::{LaneCounters, LaneReport, Progress, Report};
pub use source::{sha256, Source};

/// Why an upload failed; the message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    /// The upload was not set up right.
    #[error("{0}")]
    Setup(String),
    /// The server refused it (a different file under the name, a chunk outside the file, over
    /// its limits, a checksum mismatch, …).
    #[error("the server answered {status}: {message}")]
    Refused {
        /// The status.
        status: http::StatusCode,
        /// The server's explanation.
        message: String,
    },
    /// Reading the file failed.
    #[error("reading the file: {0}")]
    Source(std::io::Error),
    /// No lane could reach the server.
    #[error("no interface reached the server: {0}")]
    Unreachable(String),
    /// Every chunk was accepted but the server did not confirm the file.
    #[error("every chunk was sent but the server did not confirm the file: {0}")]
    Unconfirmed(String),
}

/// One lane: the socket bound to one interface's address, and the server's address as seen
/// through that interface.
pub struct Lane {
    /// The socket (bound to the interface's address).
    pub socket: Socket,
    /// The server.
    pub server: SocketAddr,
    /// A socket on another interface: when this lane's path stalls, its connection migrates
    /// there (QUIC connection migration, RFC 9000 §9) and later tries its own path again.
    pub backup: Option<Socket>,
}

/// Entry point: [`Upload::builder`].
pub struct Upload;

/// A chunk request that takes longer than this is given back to the planner.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// A handshake that takes longer than this (or the request timeout, if shorter) fails.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The shortest stall that moves a lane to its backup interface.
pub const FAILOVER_FLOOR: Duration = Duration::from_secs(1);
/// How long a lane stays on its backup before it tries its own interface again (doubling
/// while that keeps failing, up to 30 s).
pub const RETRY_PRIMARY: Duration = Duration::from_secs(5);

/// Most chunk requests one lane keeps in flight; below that, one congestion window plus one
/// chunk, and the transport's send window (`send_window / chunk`, at least 2), bound them.
pub const MAX_IN_FLIGHT: usize = 64;
