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
    /// CA whose certificates devices must present (decision G30); none = devices are not
    /// authenticated.
    pub device_ca: Option<PathBuf>,
    /// Ed25519 public key (PEM) device tokens are checked with (decision G33).
    pub device_token_key: Option<PathBuf>,
    /// The path scheduler (`qgate gateway --help` lists them).
    pub scheduler: Option<String>,
    /// Routine probe period, e.g. "30s".
    pub probe_interval: Option<String>,
    /// The backhaul paths.
    pub paths: Vec<PathSection>,
    /// `[gateway.spool]`: keep records no path can take on this disk (issue 50); none = off.
    pub spool: Option<SpoolSection>,
    /// `[gateway.mqtt]`: the MQTT front door over TCP, TLS and QUIC (issue 51); none = off.
    pub mqtt: Option<MqttSection>,
    /// Limits and timeouts: the gateway crate's own configuration (`server_name`,
    /// `max_devices`, `request_timeout = "5s"`, …), not a copy of it.
    #[serde(flatten)]
    pub limits: GatewayConfig,
}

/// `[gateway.spool]`: where and how much the gateway keeps while no path can take its records.
/// Defaults in `qgate_spool::config`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpoolSection {
    /// Its directory (one gateway's alone).
    pub dir: PathBuf,
    /// Bytes held at most.
    #[serde(default)]
    pub max_bytes: Option<u64>,
    /// Records held at most.
    #[serde(default)]
    pub max_records: Option<u64>,
    /// A record older than this is dropped, e.g. "24h".
    #[serde(default)]
    pub max_age: Option<String>,
    /// One device's bytes at most [default: max_bytes / 8].
    #[serde(default)]
    pub device_max_bytes: Option<u64>,
    /// One device's records at most [default: max_records / 8].
    #[serde(default)]
    pub device_max_records: Option<u64>,
    /// A full spool and a new priority record: "refuse" (the device keeps it) or "drop-oldest"
    /// (the oldest best-effort records go).
    #[serde(default)]
    pub on_full_priority: Option<qgate_spool::OnFull>,
    /// The same for a best-effort record.
    #[serde(default)]
    pub on_full_best_effort: Option<qgate_spool::OnFull>,
    /// Bytes kept free on the spool's filesystem.
    #[serde(default)]
    pub keep_free: Option<u64>,
}

impl SpoolSection {
    /// The spool's settings: these values over the crate's defaults.
    pub fn config(&self) -> Result<qgate_spool::SpoolConfig, String> {
        let mut c = qgate_spool::SpoolConfig::new(&self.dir);
        let l = &mut c.limits;
        if let Some(v) = self.max_bytes {
            l.max_bytes = v;
            l.device_bytes = v / qgate_spool::config::DEFAULT_DEVICE_SHARE;
        }
        if let Some(v) = self.max_records {
            l.max_records = v;
            l.device_records = v / qgate_spool::config::DEFAULT_DEVICE_SHARE;
        }
        if let Some(v) = &self.max_age {
            l.max_age = crate::config::parse_duration(v).map_err(|e| format!("max_age: {e}"))?;
        }
        if let Some(v) = self.device_max_bytes {
            l.device_bytes = v;
        }
        if let Some(v) = self.device_max_records {
            l.device_records = v;
        }
        if let Some(v) = self.on_full_best_effort {
            l.on_full[0] = v;
        }
        if let Some(v) = self.on_full_priority {
            l.on_full[1] = v;
        }
        if let Some(v) = self.keep_free {
            c.keep_free = v;
        }
        let l = &mut c.limits;
        if l.max_bytes == 0 || l.max_records == 0 {
            return Err("max_bytes and max_records must be at least 1".into());
        }
        // A share rounded down to nothing would refuse every record.
        l.device_bytes = l.device_bytes.max(1);
        l.device_records = l.device_records.max(1);
        if l.device_bytes > l.max_bytes || l.device_records > l.max_records {
            return Err(format!(
                "device_max_bytes ({}) and device_max_records ({}) must be at most max_bytes ({}) and max_records ({})",
                l.device_bytes, l.device_records, l.max_bytes, l.max_records
            ));
        }
        Ok(c)
    }
}

/// `[gateway.mqtt]`: where the MQTT door listens (`listen = "127.0.0.1:1883"`, `tls_listen`,
/// `quic_listen`, or `qgate gateway --mqtt ADDR`, `--mqtt-tls`, `--mqtt-quic`; the section
/// alone opens TCP on 127.0.0.1:1883) and the gateway crate's own MQTT limits
/// (`qgate_gateway::mqtt::MqttConfig`: `priority_topics = ["alarms/#"]`, `max_connections`, …).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MqttSection {
    /// The TCP address MQTT clients connect to [default: 127.0.0.1:1883 unless `tls_listen` or
    /// `quic_listen` is set]. Any address (of the three) other than loopback lets anyone in:
    /// there is no authentication yet (issue 49).
    pub listen: Option<SocketAddr>,
    /// The TCP address MQTT-over-TLS clients connect to (e.g. 127.0.0.1:8883), with the
    /// certificate the device port presents; none = no TLS listener.
    pub tls_listen: Option<SocketAddr>,
    /// The UDP address MQTT-over-QUIC clients connect to (ALPN `mqtt`, single-stream mode, e.g.
    /// 127.0.0.1:14567); none = no QUIC listener.
    pub quic_listen: Option<SocketAddr>,
    /// Limits and the class rule, the same on every transport.
    #[serde(flatten)]
    pub config: qgate_gateway::mqtt::MqttConfig,
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
