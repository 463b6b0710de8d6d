//! `[gateway]` and `[[gateway.paths]]`: where the gateway listens, its paths, and the gateway
//! crate's own configuration.

use std::net::SocketAddr;
use std::path::PathBuf;

use qgate_gateway::gateway::GatewayConfig;
use serde::Deserialize;

/// `[gateway]` in the config file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewaySection {
    /// Admin HTTP port (metrics, JSON API), e.g. "127.0.0.1:9465".
    pub admin: Option<String>,
    /// Device-facing UDP address.
    pub listen: Option<SocketAddr>,
    /// The server, for paths that do not name their own.
    pub server: Option<SocketAddr>,
    /// CA to trust for the server.
    pub ca: Option<PathBuf>,
    /// The path scheduler (`qgate gateway --help` lists them).
    pub scheduler: Option<String>,
    /// Routine probe period, e.g. "30s".
    pub probe_interval: Option<String>,
    /// The backhaul paths.
    pub paths: Vec<PathSection>,
    /// Limits and timeouts: the gateway crate's own configuration (`server_name`,
    /// `max_devices`, `request_timeout = "5s"`, …), not a copy of it.
    #[serde(flatten)]
    pub limits: GatewayConfig,
}

/// `[[gateway.paths]]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathSection {
    /// Local address the path's connection is bound to (port 0 = any).
    pub local: SocketAddr,
    /// The server's address on this path [default: gateway.server].
    #[serde(default)]
    pub server: Option<SocketAddr>,
    /// Shape this path's egress to a rate through a queue discipline, so the standing queue
    /// forms here under an AQM instead of in a bloated modem:
    /// `shape = "rate=19mbit,queue=pid-delay"` or `{ rate_mbps = 19, queue = "fq-codel" }`.
    #[serde(default)]
    pub shape: Option<qgate_link::ChangeSpec>,
    /// This path's congestion controller, cubic, new-reno, bbr or auto (CUBIC until random
    /// loss dominates, then BBR; decision G16) [default: [transport] congestion].
    #[serde(default)]
    pub congestion: Option<qgate_transport::Congestion>,
    /// QUIC connections on this path (1 to `MAX_CONNECTIONS_PER_PATH`); each request takes the
    /// one with the fewest out (decision G21) [default: `DEFAULT_CONNECTIONS_PER_PATH`].
    #[serde(default)]
    pub connections: Option<usize>,
}
