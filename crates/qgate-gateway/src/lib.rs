//! The qgate edge gateway (paper 000 §3). Work in progress: the path manager runs; device
//! registration, the connection manager and forwarding build on it (issue 4).

pub mod gateway;
pub mod paths;
