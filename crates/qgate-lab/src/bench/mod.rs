//! System benchmarks on real loopback sockets (and the simulator's own speed): every result is a
//! ratio against a baseline measured in the same run, because the machines are shared and noisy.

pub mod amqp;
pub mod gateway;
pub mod pipeline;
pub mod transport;
