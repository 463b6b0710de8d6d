//! The model of a network link, sans-IO: one code path for the simulator (virtual time), the
//! real-time emulator (`qgate-lab linkem`) and the gateway's egress shaping.
//!
//! A [`LinkModel`] is one direction of a point-to-point link: a [`qgate_aqm::QueueDiscipline`]
//! in front of a transmitter that serialises packets at a rate, then a wire with a propagation
//! delay, jitter that never reorders, and Bernoulli or Gilbert–Elliott loss ([`LossModel`]). It
//! takes `now` and returns decisions; it owns no clock, socket or thread. [`LinkParams`] are its
//! parameters; [`LinkChange`] is the same in the units people write (TOML, or the compact
//! `rate=20mbit,delay=5ms,loss=1%,queue=pid-delay`).

mod change;
mod loss;
mod model;
mod params;

pub use change::{parse_ms, parse_rate_mbps, ChangeSpec, LinkChange, QueueSpec};
pub use loss::{LossModel, LossState};
pub use model::{LinkEvent, LinkModel, SojournLog, TraceEvent};
pub use params::{
    delay_from_ms, LinkParams, LinkStats, IPV4_UDP_OVERHEAD, IPV6_UDP_OVERHEAD, MAX_DELAY_MS,
};
