//! The broker's settings: the `[broker]` table of a config file and its queue declarations.

use std::path::PathBuf;
use std::time::Duration;

use crate::auth::Credentials;
use crate::queue::Limits;
use crate::shim;

/// One queue declared in the configuration (`[[broker.queues]]`).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueDecl {
    /// Its address.
    pub name: String,
    /// Most messages held [default: the broker's `max_messages`].
    #[serde(default)]
    pub max_messages: Option<usize>,
    /// Most message bytes held [default: the broker's `max_bytes`].
    #[serde(default)]
    pub max_bytes: Option<usize>,
    /// Longest a message waits (the message's own header TTL applies if shorter) [default:
    /// forever].
    #[serde(default, with = "qgate_core::units::optional_duration")]
    pub ttl: Option<Duration>,
}

impl QueueDecl {
    /// Its limits, the broker's `default` where it sets none.
    pub fn limits(&self, default: Limits) -> Limits {
        Limits {
            max_messages: self.max_messages.unwrap_or(default.max_messages),
            max_bytes: self.max_bytes.unwrap_or(default.max_bytes),
        }
    }
}

/// The largest `max_frame_size` a broker may announce (1 MiB).
pub const MAX_FRAME_SIZE: u32 = 1 << 20;

/// Broker settings, and the `[broker]` keys of a config file that set them (durations as
/// `"30s"`, timeouts also `"off"`). The defaults live here and in [`Limits::default`]; the CLI
/// composes this type and its help reads them from here.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BrokerConfig {
    /// Container id in the broker's open frame.
    pub container_id: String,
    /// Largest frame accepted and announced (AMQP 1.0 §2.7.1 max-frame-size).
    pub max_frame_size: u32,
    /// Queues created at start.
    pub queues: Vec<QueueDecl>,
    /// Create a queue when a link names an unknown address (with the default limits and
    /// TTL); if false, such links are refused with `amqp:not-found`.
    pub auto_create: bool,
    /// Most messages per queue, unless its declaration says otherwise.
    pub max_messages: usize,
    /// Most message bytes per queue, unless its declaration says otherwise.
    pub max_bytes: usize,
    /// TTL of auto-created queues (none: forever).
    #[serde(rename = "ttl", with = "qgate_core::units::optional_duration")]
    pub default_ttl: Option<Duration>,
    /// Most queues (auto-creation stops there).
    pub max_queues: usize,
    /// Durable store file; `None` keeps queues in memory only.
    pub store: Option<PathBuf>,
    /// Credit a producer link is given (refilled as the broker settles its messages).
    pub producer_credit: u32,
    /// Most unsettled deliveries per consumer link.
    pub consumer_window: usize,
    /// Producers stop getting credit while a queue holds this fraction of `max_messages` or
    /// bytes, and resume below it: a slow consumer slows producers instead of filling memory.
    pub high_water: f64,
    /// SASL (from a credentials file: not a config key of its own).
    #[serde(skip)]
    pub credentials: Credentials,
    /// Protocol header → SASL → open must be done within this, a frame held for credit waits
    /// at most this, and so does the broker's close for the peer's (decision M16).
    #[serde(with = "qgate_core::units::duration")]
    pub handshake_timeout: Duration,
    /// A connection that receives nothing for this long is closed (`amqp:resource-limit-
    /// exceeded`), and one whose peer takes no bytes for this long; half of it is announced as
    /// the broker's idle-time-out (AMQP 1.0 §2.4.5). Zero: never (decision M16).
    #[serde(with = "qgate_core::units::timeout")]
    pub idle_timeout: Duration,
    /// Most connections held at once, from every address (an in-process bridge's own counts
    /// but is never refused); more are closed on accept (decision M33).
    pub max_connections: usize,
    /// Most connections from one IP address at once; more are closed on accept (M16).
    pub max_connections_per_address: usize,
    /// Most sessions per connection (a begin beyond is a framing error).
    pub max_sessions: usize,
    /// While ANONYMOUS is admitted, also accept a connection that skips the SASL layer and
    /// starts with the plain AMQP header, as go-amqp does by default (decision M19).
    pub plain_amqp: bool,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        let limits = Limits::default();
        BrokerConfig {
            container_id: "qgate-broker".into(),
            max_frame_size: 65_536,
            queues: Vec::new(),
            auto_create: true,
            max_messages: limits.max_messages,
            max_bytes: limits.max_bytes,
            default_ttl: None,
            max_queues: 10_000,
            store: None,
            producer_credit: 500,
            consumer_window: 1000,
            high_water: 0.8,
            credentials: Credentials::anonymous(),
            handshake_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_connections: 4096,
            max_connections_per_address: 256,
            max_sessions: shim::DEFAULT_MAX_SESSIONS,
            plain_amqp: true,
        }
    }
}

impl BrokerConfig {
    /// The limits of a queue that declares none.
    pub fn default_limits(&self) -> Limits {
        Limits {
            max_messages: self.max_messages,
            max_bytes: self.max_bytes,
        }
    }

    /// Refuse settings the broker cannot run with; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("max_messages", self.max_messages),
            ("max_bytes", self.max_bytes),
            ("max_queues", self.max_queues),
            ("producer_credit", self.producer_credit as usize),
            ("consumer_window", self.consumer_window),
            ("max_connections", self.max_connections),
            (
                "max_connections_per_address",
                self.max_connections_per_address,
            ),
            ("max_sessions", self.max_sessions),
            ("max_frame_size", self.max_frame_size as usize),
        ];
        if let Some((key, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{key} must be at least 1"));
        }
        // AMQP 1.0 §2.7.1: max-frame-size is at least 512. Messages larger than a frame span
        // several, so a bigger frame buys nothing but a bigger buffer a peer can fill.
        if !(shim::MIN_MAX_FRAME_SIZE..=MAX_FRAME_SIZE).contains(&self.max_frame_size) {
            return Err(format!(
                "max_frame_size must be in [{}, {MAX_FRAME_SIZE}] (AMQP 1.0 §2.7.1)",
                shim::MIN_MAX_FRAME_SIZE
            ));
        }
        if !(self.high_water > 0.0 && self.high_water <= 1.0) {
            return Err(format!(
                "high_water must be in (0, 1], not {}",
                self.high_water
            ));
        }
        let mut names = std::collections::BTreeSet::new();
        for q in &self.queues {
            if q.name.is_empty() {
                return Err("a declared queue has an empty name".into());
            }
            if !names.insert(&q.name) {
                return Err(format!("queue '{}' is declared twice", q.name));
            }
            if q.max_messages == Some(0) || q.max_bytes == Some(0) {
                return Err(format!(
                    "queue '{}': max_messages and max_bytes must be at least 1",
                    q.name
                ));
            }
        }
        Ok(())
    }
}
