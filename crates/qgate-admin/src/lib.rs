//! qgate's admin port (issue 17 item 3): plain HTTP/1.1 on its own address, off the data port,
//! for operators and their tools, never for devices.
//!
//! Routes, the same on every daemon:
//! - `GET /health`: `200 ok`, or `503` and the reason (no token needed: load balancers probe it).
//! - `GET /metrics`: the daemon's one registry, OpenMetrics text (`prometheus-client`).
//! - `GET /api`: the daemon's JSON routes; `GET|POST /api/…`: the daemon's [`Api`].
//!
//! With a [`Token`] configured every route but `/health` needs `Authorization: Bearer TOKEN`;
//! without one the port must be on a loopback address (decision O2). Every connection is bounded
//! ([`AdminLimits`]): a slot out of a fixed number, a deadline for its headers, for each request
//! and for its whole life, and a cap on header and body bytes.

mod api;
mod auth;
mod client;
mod serve;

pub use api::{Api, ApiError, Call, Reply, Route, DEFAULT_LIST_LIMIT};
pub use auth::Token;
pub use client::{AdminClient, ClientError};
pub use serve::{
    percent_decode, percent_encode, Admin, AdminBuilder, AdminError, AdminLimits, RunningAdmin,
};
