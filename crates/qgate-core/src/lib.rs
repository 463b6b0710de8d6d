//! Sans-IO cores of qgate: plain data structures and algorithms that take `now` as an argument
//! and return decisions; the async shells in other crates own sockets, clocks and files.

pub mod batch;
pub mod careful_resume;
pub mod counters;
pub mod forwarded;
pub mod forwarder;
pub mod frame_guard;
pub mod history;
pub mod holdings;
pub mod loggate;
pub mod metrics;
pub mod path;
pub mod probe;
pub mod protocol;
pub mod quota;
pub mod scheduler;
pub mod session;
pub mod summary;
pub mod sync;
pub mod units;
pub mod upload;
