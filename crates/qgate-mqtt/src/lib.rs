//! The server side of MQTT 3.1.1 and 5.0 without I/O: qgate's MQTT front door, whatever carries
//! it (TCP, TLS, or one QUIC stream under ALPN "mqtt" as EMQX serves it).
//!
//! Two layers:
//!
//! - [`packet`]: every control packet as a value, parsed from and emitted to bytes, checked as
//!   the specs require (UTF-8 strings, reserved bits, which properties each packet may carry and
//!   how often, packet identifiers, topic names). [`FixedHeader::parse`] reads a packet's length
//!   from its first bytes, so an oversized one is refused before its body is buffered. Errors
//!   ([`DecodeError`]) name the MQTT 5.0 reason code they close the connection with.
//! - [`Connection`]: one client's session state machine, quinn-proto style. The shell (a later
//!   step, in the gateway) owns the socket and the clock: it feeds received bytes and the time
//!   (`now`; nothing here reads a clock, so virtual time works), polls [`Event`]s (a CONNECT to
//!   authenticate, PUBLISHes to store, the end of the connection), calls back with decisions
//!   (`accept`/`refuse`, `ack`/`nack` once a record is stored, `close`) and writes what
//!   `poll_transmit` returns. Every piece of per-client state is bounded by [`Config`].
//!
//! The server takes PUBLISH only: it never sends one, refuses every subscription, and answers
//! each QoS 1/2 message only once the shell has stored it.

pub mod config;
pub mod connection;
pub mod error;
pub mod event;
pub mod packet;
pub mod properties;
mod reader;
pub mod reason;
pub mod topic;
pub mod varint;
pub mod violation;
mod writer;

pub use config::Config;
pub use connection::{Accept, ActionError, Connection};
pub use error::{DecodeError, EncodeError};
pub use event::{Closed, ConnectRequest, Event, Message};
pub use packet::{FixedHeader, Packet, PacketType, ProtocolVersion, QoS};
pub use properties::Properties;
pub use reason::{ConnectReturnCode, ReasonCode};
pub use violation::Violation;
