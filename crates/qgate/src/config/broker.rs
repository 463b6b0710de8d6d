//! `[broker]` and `[[broker.bridges]]`: where the broker listens, its certificates and bridges,
//! and the broker crate's own configuration.

use std::net::SocketAddr;
use std::path::PathBuf;

use qgate_amqp::broker::BrokerConfig;
use serde::Deserialize;

/// `[broker]` in the config file: where it listens and its certificates, plus the broker
/// crate's own configuration (limits, timeouts, queues, store), not a copy of it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BrokerSection {
    /// UDP address for AMQP over QUIC ("" or absent with no flag: 0.0.0.0:5671).
    pub quic: Option<SocketAddr>,
    /// TCP address for AMQP over TLS.
    pub tls: Option<SocketAddr>,
    /// TCP address for plain AMQP.
    pub tcp: Option<SocketAddr>,
    /// Keep queues in memory only.
    pub memory: Option<bool>,
    /// SASL PLAIN credentials file.
    pub credentials: Option<PathBuf>,
    /// Admit SASL ANONYMOUS.
    pub anonymous: Option<bool>,
    /// Certificate chain and key (PEM); without them the development certificate.
    pub cert: Option<PathBuf>,
    /// Key for `cert`.
    pub key: Option<PathBuf>,
    /// CA whose certificates clients (QUIC and TLS) must present.
    pub client_ca: Option<PathBuf>,
    /// Admin HTTP port (metrics, JSON API), e.g. "127.0.0.1:9466" (`metrics` is its old name).
    #[serde(alias = "metrics")]
    pub admin: Option<String>,
    /// `[[broker.bridges]]`: local queues forwarded to upstream brokers.
    pub bridges: Vec<BridgeSection>,
    /// `store`, `max_messages`, `ttl = "10m"`, `idle_timeout = "off"`, `[[broker.queues]]`, …:
    /// [`BrokerConfig`]'s keys.
    #[serde(flatten)]
    pub config: BrokerConfig,
}

/// `[[broker.bridges]]`: forward `queue` to `upstream` (`amqp://`, `amqps://`, `amqp+quic://`
/// URL), checking a TLS or QUIC upstream's certificate against `ca`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeSection {
    /// The local queue.
    pub queue: String,
    /// The upstream broker and queue.
    pub upstream: String,
    /// CA certificate(s) (PEM) of an amqps or amqp+quic upstream [default: the development CA].
    pub ca: Option<PathBuf>,
}
