//! The AMQP 1.0 broker: named queues, competing consumers, pre-settled and unsettled delivery,
//! credit-based back-pressure, redelivery, TTL, size limits, durable queues, SASL, metrics.
//!
//! Connection, session and link state machines are fe2o3-amqp's; everything a broker adds —
//! queues, routing, durability, redelivery — is here, on top of the sans-IO
//! [`Queue`](crate::queue::Queue).
//!
//! Files by what they are: `config` (settings), `state` (the handle, the shared state, start),
//! `registry` (the queues), `serve` and `links` (a connection and its links), `listen` (accept
//! loops), `stop` (a clean stop), `connections` (the admin port's view), `bridges`, `metrics`, `replay` (the 0-RTT
//! guard). Log events keep the target `qgate_amqp::broker` that log filters and collectors
//! name.

mod bridges;
mod config;
mod connections;
mod counters;
mod links;
mod listen;
mod message;
mod metrics;
mod queue_state;
mod registry;
mod replay;
mod serve;
mod state;
mod stop;

pub use config::{BrokerConfig, QueueDecl, MAX_FRAME_SIZE};
pub use connections::ConnectionView;
pub use listen::{serve_quic, serve_tcp, PerConnection};
pub use message::{decode, encode, AmqpMessage};
pub use metrics::BrokerMetrics;
pub use registry::{Declared, QueueReport};
pub use state::{Broker, BrokerError};
