//! A deterministic simulated IP network whose interfaces are quinn sockets.
//!
//! Hosts have one or more interfaces (addresses); point-to-point links join interfaces; each
//! link direction has a rate, a propagation delay with optional jitter (never reordering), a loss
//! model (Bernoulli or Gilbert–Elliott) and a bounded queue behind a
//! [`qgate_aqm::QueueDiscipline`]. Hosts may forward (routers). Every socket is a
//! [`quinn::AsyncUdpSocket`], so the real qgate code runs on it unchanged.
//!
//! Under a paused tokio clock the network runs in virtual time: a minute of traffic takes a
//! fraction of a second. With a running clock it runs in real time. All randomness comes from
//! the seed given to [`Network::new`]: the same program and seed give the same packets.
//!
//! ```no_run
//! # async fn demo() -> Result<(), qgate_netsim::NetError> {
//! use qgate_netsim::{LinkParams, Network};
//! use std::time::Duration;
//! let net = Network::new(1);
//! let (a, b) = (net.add_host("client"), net.add_host("server"));
//! let ia = net.add_interface(a, "10.0.0.1".parse().unwrap())?;
//! let ib = net.add_interface(b, "10.0.0.2".parse().unwrap())?;
//! net.connect_symmetric(ia, ib, LinkParams::new(10_000_000, Duration::from_millis(25)))?;
//! let server = net.bind(b, "10.0.0.2:4433".parse().unwrap())?;
//! # Ok(()) }
//! ```

mod error;
mod ids;
mod network;
mod socket;
mod state;
#[cfg(feature = "tcp")]
pub mod tcp;
pub mod topology;
mod trace;

pub use error::NetError;
pub use ids::{Direction, HostId, InterfaceId, LinkId};
pub use network::{Network, SojournLog, DEFAULT_SOCKET_RX_LIMIT};
pub use qgate_link::{
    delay_from_ms, LinkParams, LinkStats, LossModel, TraceEvent, IPV4_UDP_OVERHEAD,
    IPV6_UDP_OVERHEAD, MAX_DELAY_MS,
};
pub use socket::{Received, SimSocket};
pub use state::HostDrops;
pub use topology::{Topology, World};
pub use trace::{Trace, TraceRecord};
