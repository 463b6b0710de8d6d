//! AMQP 1.0 over QUIC (one bidirectional stream per AMQP connection) and over TCP+TLS, with one
//! code path generic over the byte stream (paper 003).
//!
//! - [`queue`]: the sans-IO queue core (ordering, competing consumers, redelivery, TTL, limits);
//! - [`store`]: durable queues in redb with group commit;
//! - [`shim`]: the frame-level shim in front of the broker: framing and encoding checks of
//!   untrusted bytes, the link-name rename (AMQP 1.0 §2.6.1) fe2o3-amqp's session needs, and the
//!   hold that lets 0-RTT transfers wait for credit;
//! - [`wire`]: our view of AMQP encodings, checking every length before anything decodes;
//! - [`oneshot`]: pipelined clients whose whole opening rides in 0-RTT;
//! - [`auth`]: SASL PLAIN (credentials file) and ANONYMOUS;
//! - [`bridge`]: store-and-forward of a local queue to an upstream broker;
//! - [`broker`]: the broker.
//!
//! The client ([`client`], [`transport`], [`url`]) is its own crate, `qgate-amqp-client`, so a
//! component that only sends or receives links no broker; it is re-exported here.

pub mod artemis;
pub mod auth;
pub mod bridge;
pub mod broker;
pub mod builder;
pub mod oneshot;
pub mod queue;
pub mod shim;
pub mod store;
pub mod wire;

pub use qgate_amqp_client::{client, transport, url};
