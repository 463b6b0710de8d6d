//! AMQP 1.0 over QUIC (one bidirectional stream per AMQP connection) and over TCP+TLS, with one
//! code path generic over the byte stream (paper 003).
//!
//! - [`queue`]: the sans-IO queue core (ordering, competing consumers, redelivery, TTL, limits);
//! - [`store`]: durable queues in redb with group commit;
//! - [`linkname`]: the frame-level shim that lets a peer give its sender and receiver the same
//!   link name (AMQP 1.0 §2.6.1), which fe2o3-amqp's session refuses;
//! - [`auth`]: SASL PLAIN (credentials file) and ANONYMOUS;
//! - [`transport`]: QUIC / TCP / TCP+TLS streams, listeners and connectors;
//! - [`broker`]: the broker; [`client`]: senders and receivers.

pub mod auth;
pub mod broker;
pub mod client;
pub mod linkname;
pub mod oneshot;
pub mod queue;
pub mod store;
pub mod transport;
pub mod wire;
