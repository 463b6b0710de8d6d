//! The gateway's sans-IO forwarding core and the protocol devices, gateways and servers speak:
//! sessions (Hash IDs), the path table and its probes, the schedulers, the forwarder that ties
//! them together, and the wire values (headers, forwarded facts, batches). Used by
//! qgate-gateway (which runs it), qgate-server (which reads what the gateway sends), the CLI
//! and the lab. Plain data and algorithms: the caller passes `now` and owns sockets and clocks.

pub mod batch;
pub mod forwarded;
pub mod forwarder;
pub mod path;
pub mod probe;
pub mod protocol;
pub mod scheduler;
pub mod session;
