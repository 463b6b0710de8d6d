//! The qgate edge gateway (paper 000 §3): the path manager (probes, path table), the
//! connection manager (Hash IDs, scheduler, hits), forwarding with retries, and a device
//! library. [`Gateway::builder`](gateway::Gateway::builder) assembles one.

pub mod answer;
pub mod batcher;
pub mod builder;
pub mod device;
pub mod gateway;
pub mod mqtt;
pub mod outbound;
pub mod paths;
pub mod reachability;
