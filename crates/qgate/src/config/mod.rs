//! The TOML configuration file: one table per command, every key also settable by a flag
//! (flags win).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use qgate_transport::TransportOptions;
use serde::Deserialize;

mod broker;
mod gateway;

pub use broker::{BridgeSection, BrokerSection};
pub use gateway::{GatewaySection, MqttSection, PathSection, SpoolSection};

/// The whole file. (`qgate-lab` reads its own tables, `[demo]` and `[linkem]`, from a file of
/// its own.)
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `[server]`
    pub server: ServerConfig,
    /// `[client]` (get, post)
    pub client: ClientConfig,
    /// `[transport]`: QUIC settings for server and clients.
    pub transport: TransportOptions,
    /// `[history]`: congestion-window history (paper 002) for get, post and server.
    pub history: HistorySection,
    /// `[gateway]` and `[[gateway.paths]]`.
    pub gateway: GatewaySection,
    /// `[broker]` and `[[broker.queues]]` (AMQP).
    pub broker: BrokerSection,
    /// `[admin]`: the admin ports' token (each daemon's section names its address).
    pub admin: AdminSection,
}

/// `[admin]`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdminSection {
    /// File holding the bearer token.
    pub token_file: Option<PathBuf>,
}

/// Whether and how new connections start from the congestion window of earlier ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum HistoryMode {
    /// Always the controller's default initial window.
    Off,
    /// Arithmetic mean of recorded windows.
    Mean,
    /// Exponentially weighted moving average of recorded windows.
    Ewma,
}

/// `[history]`: the keys people write (`mode`, `ewma_weight`, `max_age_s`), turned into
/// [`qgate_history::HistoryConfig`] by `historycmd::history_config`; every default is read from
/// there (and from `DEFAULT_SAFEGUARD_FACTOR`), not repeated here.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HistorySection {
    /// off, mean or ewma [default: off for get/post, on (EWMA) for services, decision H6].
    pub mode: Option<HistoryMode>,
    /// The database file [default: $QGATE_HOME/history.redb].
    pub store: Option<PathBuf>,
    /// Fall back to the default window (window resume) or make no jump (careful resume) when
    /// an RTT sample exceeds this × the recorded one; at least 1, or 0 to turn it off.
    pub safeguard: Option<f64>,
    /// EWMA weight of the newest sample.
    pub ewma_weight: Option<f64>,
    /// Never start above this many bytes.
    pub ceiling_bytes: Option<u64>,
    /// Forget a peer not seen for this many seconds.
    pub max_age_s: Option<u64>,
    /// At most this many peers.
    pub capacity: Option<usize>,
    /// Start a connection's RTT estimate from the peer's last smoothed RTT (false: paper
    /// 002's window-only history).
    pub seed_rtt: Option<bool>,
    /// How a new connection uses the history: "window" (paper 002: start at the average
    /// window) or "careful" (RFC 9959 careful resume, decision H9).
    pub resume: Option<qgate_history::Resume>,
}

/// `[server]`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Admin HTTP port (metrics, JSON API), e.g. "127.0.0.1:9464".
    pub admin: Option<String>,
    /// UDP address to listen on.
    pub listen: Option<SocketAddr>,
    /// PEM certificate chain.
    pub cert: Option<PathBuf>,
    /// PEM private key.
    pub key: Option<PathBuf>,
    /// Directory of the development PKI used when no cert/key is given.
    pub dev_pki: Option<PathBuf>,
    /// Where ingested bodies go: a directory, or an `amqp://`, `amqps://` or `amqp+quic://`
    /// URL of a queue; none = count only.
    pub sink: Option<String>,
    /// CA certificate (PEM) the queue sink checks an `amqps` or `amqp+quic` broker against.
    pub sink_ca: Option<PathBuf>,
    /// The durable de-duplication table.
    pub dedup_store: Option<PathBuf>,
    /// Largest request body, bytes.
    pub max_body: Option<usize>,
    /// Request-body bytes held at once over all connections.
    pub max_buffered: Option<usize>,
    /// Disk bytes kept free where bodies and uploads are stored.
    pub keep_free: Option<u64>,
    /// QUIC connections held at once.
    pub max_connections: Option<usize>,
    /// QUIC connections one client (IPv4 address, or IPv6 /64) may hold at once.
    pub max_connections_per_client: Option<usize>,
    /// Directory receiving `qgate upload` files; none = uploads off.
    pub uploads: Option<PathBuf>,
    /// Largest file an upload may announce, bytes.
    pub upload_max_bytes: Option<u64>,
    /// Days an unfinished upload may sit untouched before its files are deleted; 0 = never.
    pub upload_expire_days: Option<u32>,
}

/// `[client]`
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientConfig {
    /// CA certificate(s) to trust (PEM).
    pub ca: Option<PathBuf>,
    /// Give up connecting after this long, e.g. "10s".
    pub connect_timeout: Option<String>,
    /// Largest response body, bytes.
    pub max_response: Option<usize>,
}

impl Config {
    /// Read and check a config file; errors name the file and, for syntax, line and column.
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        Config::parse(&text, &path.display().to_string())
    }

    /// Parse and check a config file's `text`; errors name `origin` (the file).
    pub fn parse(text: &str, origin: &str) -> anyhow::Result<Config> {
        let cfg: Config = parse_toml(text, origin).map_err(|e| {
            let lab = ["`demo`", "`linkem`"]
                .iter()
                .any(|t| e.to_string().contains(&format!("unknown field {t}")));
            match lab {
                true => e.context(
                    "[demo] and [linkem] are the lab's tables: give them to qgate-lab --config (or QGATE_LAB_CONFIG)",
                ),
                false => e,
            }
        })?;
        cfg.transport
            .validate()
            .map_err(|e| anyhow::anyhow!("config file {origin}: [transport] {e}"))?;
        Ok(cfg)
    }
}

/// A TOML file's `text` as a `T`; errors name `origin` (the file), the line and column, and the
/// line of an unknown key.
pub fn parse_toml<T: serde::de::DeserializeOwned>(text: &str, origin: &str) -> anyhow::Result<T> {
    toml::from_str(text).map_err(|e| {
        // A key inside a table that flattens a crate's own config is reported at the
        // table's header: name the key's own line too.
        let key_line = e.message().split('`').nth(1).and_then(|key| {
            let from = e
                .span()
                .map_or(0, |s| text[..s.start].matches('\n').count());
            text.lines()
                .enumerate()
                .skip(from)
                .find(|(_, l)| {
                    l.trim_start()
                        .strip_prefix(key)
                        .is_some_and(|r| r.trim_start().starts_with('='))
                })
                .map(|(i, _)| i + 1)
        });
        let at = key_line
            .map(|l| format!(" (the key is on line {l})"))
            .unwrap_or_default();
        anyhow::anyhow!("config file {origin}: {}{at}", e.to_string().trim_end())
    })
}

pub use qgate_core::units::parse_duration;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absurd_rtt_is_an_error_not_a_panic() {
        let text = "[transport]\ninitial_rtt_ms = 1e300\n";
        let e = Config::parse(text, "x.toml").unwrap_err().to_string();
        assert!(e.contains("initial_rtt_ms"), "{e}");
    }

    #[test]
    fn broker_section_is_the_broker_crates_config_plus_listeners() {
        let text = r#"
[broker]
quic = "127.0.0.1:5671"
memory = true
max_messages = 50
ttl = "10m"
idle_timeout = "off"
high_water = 0.5

[[broker.queues]]
name = "telemetry"
max_bytes = 4096

[[broker.queues]]
name = "alarms"
max_messages = 7
ttl = "30s"
"#;
        let cfg = Config::parse(text, "b.toml").unwrap();
        let b = &cfg.broker;
        assert_eq!(b.quic, Some("127.0.0.1:5671".parse().unwrap()));
        let c = &b.config;
        assert_eq!(c.default_ttl, Some(std::time::Duration::from_secs(600)));
        assert_eq!(c.idle_timeout, std::time::Duration::ZERO);
        // A declared queue without its own limit takes the section's, not the crate default.
        let d = c.default_limits();
        assert_eq!(c.queues[0].limits(d).max_messages, 50);
        assert_eq!(c.queues[0].limits(d).max_bytes, 4096);
        assert_eq!(c.queues[1].limits(d).max_messages, 7);
        assert_eq!(c.queues[1].ttl, Some(std::time::Duration::from_secs(30)));
        // Keys the crate does not know are refused, with their line.
        let e = Config::parse("[broker]\nmemory = true\nmax_mesages = 5\n", "b.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_mesages") && e.contains("line 3"), "{e}");
        let e = Config::parse("[[broker.queues]]\nname = \"q\"\nlimit = 5\n", "b.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("limit"), "{e}");
        let e = Config::parse("[broker]\nidle_timeout = \"soon\"\n", "b.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("soon"), "{e}");
    }

    #[test]
    fn the_shipped_pipeline_toml_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/examples/pipeline.toml");
        let cfg = Config::load(&path).unwrap();
        let sink = cfg.server.sink.as_deref().unwrap();
        let url = qgate_amqp::url::parse(sink).unwrap();
        assert_eq!(url.address, "telemetry");
        let b = &cfg.broker.bridges;
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].queue, "telemetry");
        qgate_amqp::url::parse(&b[0].upstream).unwrap();
        for a in [&cfg.server.admin, &cfg.broker.admin] {
            let addr = crate::admin::parse_addr(a.as_deref().unwrap()).unwrap();
            assert!(
                addr.ip().is_loopback(),
                "no token in the example: loopback only"
            );
        }
    }

    #[test]
    fn gateway_mqtt_section_is_the_gateway_crates_config_plus_listen() {
        let text = "[gateway.mqtt]\nlisten = \"127.0.0.1:1884\"\ntls_listen = \"127.0.0.1:8884\"\nquic_listen = \"127.0.0.1:14568\"\npriority_topics = [\"alarms/#\"]\nmax_connections = 10\n";
        let cfg = Config::parse(text, "x.toml").unwrap();
        let m = cfg.gateway.mqtt.unwrap();
        assert_eq!(m.listen, Some("127.0.0.1:1884".parse().unwrap()));
        assert_eq!(m.tls_listen, Some("127.0.0.1:8884".parse().unwrap()));
        assert_eq!(m.quic_listen, Some("127.0.0.1:14568".parse().unwrap()));
        assert_eq!(m.config.priority_topics, ["alarms/#"]);
        assert_eq!(m.config.max_connections, 10);
        assert_eq!(
            m.config.receive_maximum,
            qgate_gateway::mqtt::MqttConfig::default().receive_maximum
        );
        assert!(Config::parse("[gateway.mqtt]\nlisten_on = 1\n", "x.toml").is_err());
        assert!(Config::parse("", "x.toml").unwrap().gateway.mqtt.is_none());
    }

    #[test]
    fn the_shipped_gateway_toml_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/examples/gateway.toml");
        let cfg = Config::load(&path).unwrap();
        let g = &cfg.gateway;
        assert_eq!(g.scheduler.as_deref(), Some("completion"));
        assert_eq!(g.paths.len(), 3);
        assert_eq!(g.paths[2].server, Some("10.0.3.2:4433".parse().unwrap()));
        let shape = g.paths[0].shape.as_ref().unwrap().params().unwrap();
        assert_eq!(shape.rate_bps, Some(19_000_000));
        qgate_transport::shaped::validate_shape(&shape).unwrap();
        assert!(g.paths[1].shape.is_none());
        assert_eq!(g.paths[1].congestion, None);
        assert_eq!(
            g.paths[2].congestion,
            Some(qgate_transport::Congestion::Auto)
        );
        assert_eq!(g.paths[2].connections, None);
        let text = std::fs::read_to_string(&path).unwrap();
        let documented = format!(
            "[default: {}]",
            qgate_gateway::paths::DEFAULT_CONNECTIONS_PER_PATH
        );
        assert!(
            text.contains(&documented),
            "the example's connections default"
        );
        assert_eq!(cfg.history.mode, Some(HistoryMode::Ewma));
        assert_eq!(cfg.transport.idle_timeout_ms, 30_000);
        // The example documents the gateway crate's defaults: it must not drift from them.
        assert_eq!(
            g.limits,
            qgate_gateway::gateway::GatewayConfig::default(),
            "docs/examples/gateway.toml disagrees with GatewayConfig::default()"
        );
        // A misspelt key is named, with its place in the file.
        let bad = std::env::temp_dir().join(format!("qgate-gw-{}.toml", std::process::id()));
        std::fs::write(&bad, "[gateway]\nschedular = \"single\"\n").unwrap();
        let e = Config::load(&bad).unwrap_err().to_string();
        assert!(e.contains("schedular") && e.contains("line 2"), "{e}");
        std::fs::write(&bad, "[gateway]\nrequest_timeout = \"5 parsecs\"\n").unwrap();
        let e = Config::load(&bad).unwrap_err().to_string();
        std::fs::remove_file(&bad).ok();
        assert!(e.contains("unknown unit") && e.contains("parsecs"), "{e}");
    }

    #[test]
    fn full_config_parses() {
        let cfg: Config = toml::from_str(
            r#"
            [server]
            listen = "127.0.0.1:4433"
            sink = "/tmp/x"
            [client]
            connect_timeout = "2s"
            [transport]
            congestion = "new-reno"
            "#,
        )
        .unwrap();
        assert_eq!(
            cfg.transport.congestion,
            qgate_transport::Congestion::NewReno
        );
        assert_eq!(cfg.server.listen, Some("127.0.0.1:4433".parse().unwrap()));
    }
}
