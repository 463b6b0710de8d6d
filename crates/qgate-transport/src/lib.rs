//! QUIC transport for qgate: endpoints on quinn 0.11 with rustls (ring) and TLS 1.3,
//! development certificates, one options struct for every transport knob, 0-RTT, and HTTP/3
//! helpers on h3. The same code runs on a real UDP socket or a `qgate-netsim` interface.

mod delegate;
mod endpoint;
mod flight;
pub mod frame_guard;
mod h3_adapter;
pub mod holdings;
pub mod http3;
pub mod loss_switch;
mod options;
pub mod peer_id;
pub mod pki;
pub mod qlog;
pub mod quinn_streams;
pub mod shaped;
pub mod shared_driver;
pub mod tasks;
pub mod tickets;
pub mod tls;
pub mod token;
pub mod window_history;

pub use endpoint::{
    client_config, client_config_for, client_config_with_identity, connect, constrained_endpoint,
    endpoint, one_connection_endpoint, server_config, server_config_for, server_config_resuming,
    server_config_with_client_auth, server_endpoint, ClientAuth, Connected, Socket, TransportError,
};
pub use flight::FlightGauge;
pub use options::{Congestion, OptionError, TransportOptions};
pub use tls::{DevPki, Identity, TlsError, TrustRoots};
