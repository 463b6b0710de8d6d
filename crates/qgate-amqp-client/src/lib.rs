//! qgate's AMQP 1.0 client, apart from the broker so a component that only sends or receives
//! (the ingest server's queue sink, `qgate send` and `qgate recv`, the broker's bridges) links
//! no broker (decision W3):
//! - [`transport`]: QUIC / TCP / TCP+TLS streams, listeners and connectors;
//! - [`client`]: senders and receivers over any of them;
//! - [`url`]: `amqp://`, `amqps://` and `amqp+quic://` URLs.

pub mod client;
pub mod transport;
pub mod url;
