//! Demonstrations: the real components on the simulated network with a live or summary view,
//! for a first look rather than a measurement.

pub mod gateway;
pub mod transport;
