//! Senders and receivers: connect over any [`Scheme`](crate::transport::Scheme), send or
//! receive counted messages, and report startup latency, total time and throughput (the
//! quantities paper 003 compares).
//!
//! By concept: `connector` (byte streams to a broker), `connection` (an AMQP connection and
//! its close), `run` (counted sends and receives), `error`.

mod connection;
mod connector;
mod error;
mod run;

pub use connection::{bounded, quic_closed, Client};
pub use connector::{
    with_idle_timeout, Connector, EndpointMaker, StreamInfo, DEFAULT_IDLE_TIMEOUT,
};
pub use error::ClientError;
pub use run::{
    message, message_with_id, receive, run_id, send, send_into, RecvSpec, Report, SendSpec,
};
