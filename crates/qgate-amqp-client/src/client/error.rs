//! What can go wrong on the client side.

use crate::transport::TransportError;

/// A client-side failure; the message names the step.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Setting up the byte stream.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// Configuration.
    #[error("{0}")]
    Config(String),
    /// AMQP open (including SASL).
    #[error("AMQP open: {0}")]
    Open(String),
    /// AMQP begin.
    #[error("AMQP begin: {0}")]
    Begin(String),
    /// Link attach (e.g. unknown address).
    #[error("attaching to '{address}': {msg}")]
    Attach {
        /// The address.
        address: String,
        /// Cause.
        msg: String,
    },
    /// Sending or receiving after attach.
    #[error("{0}")]
    Link(String),
}
