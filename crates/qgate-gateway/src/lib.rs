//! The qgate edge gateway (paper 000 §3): the path manager (probes, path table), the
//! connection manager (Hash IDs, scheduler, hits), forwarding with retries, and a device
//! library. Work in progress (issue 4): the demo and `qgate lab proxy` are still to come.

pub mod device;
pub mod gateway;
pub mod paths;
