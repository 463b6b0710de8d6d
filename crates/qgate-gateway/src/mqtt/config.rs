//! `MqttConfig`: the MQTT door's limits, and the `[gateway.mqtt]` keys that set them.

use std::time::Duration;

use qgate_forward::session::SessionLimits;

/// The MQTT door's limits (durations as `"10s"`). The defaults live here and in
/// [`qgate_mqtt::Config::DEFAULT`]; the CLI composes this type.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MqttConfig {
    /// Most MQTT connections at once; more are closed as they arrive.
    pub max_connections: usize,
    /// Most MQTT connections from one source IP address.
    pub max_connections_per_address: usize,
    /// Client sessions remembered (open or closed with a session to keep): a redelivered
    /// QoS 1/2 PUBLISH gets the request id of its first copy only while its session is here.
    pub max_sessions: usize,
    /// Largest MQTT packet, fixed header included (also bounds a connection's input buffer).
    pub max_packet_size: u32,
    /// QoS 1 and 2 PUBLISHes a client may have unacknowledged, announced as Receive Maximum;
    /// also the records one connection has in the pipeline at once (QoS 0 included). At most
    /// `max_inflight_per_device`, so a client within it is never refused for being in flight.
    pub receive_maximum: u16,
    /// From TCP accept to an accepted CONNECT.
    #[serde(with = "qgate_core::units::duration")]
    pub connect_timeout: Duration,
    /// Longest keep-alive held, in seconds; a client asking for more or none gets this one.
    pub max_keep_alive: u16,
    /// Topic aliases a 5.0 client may set.
    pub topic_alias_maximum: u16,
    /// Topic filters (`+` and `#` wildcards) whose messages are priority records, unless the
    /// PUBLISH says otherwise with the user property `qgate-priority` (`1` or `0`).
    pub priority_topics: Vec<String>,
}

impl Default for MqttConfig {
    fn default() -> Self {
        let c = qgate_mqtt::Config::DEFAULT;
        MqttConfig {
            max_connections: 1024,
            max_connections_per_address: 64,
            max_sessions: 4096,
            max_packet_size: c.max_packet_size,
            receive_maximum: c
                .receive_maximum
                .min(SessionLimits::DEFAULT.max_inflight as u16),
            connect_timeout: c.connect_timeout,
            max_keep_alive: c.max_keep_alive.unwrap_or(3600),
            topic_alias_maximum: c.topic_alias_maximum,
            priority_topics: Vec::new(),
        }
    }
}

impl MqttConfig {
    /// The codec's limits, the receive maximum kept within `max_inflight` (the session's).
    pub fn codec(&self, max_inflight: usize) -> qgate_mqtt::Config {
        qgate_mqtt::Config {
            max_packet_size: self.max_packet_size,
            receive_maximum: self
                .receive_maximum
                .min(u16::try_from(max_inflight).unwrap_or(u16::MAX))
                .max(1),
            topic_alias_maximum: self.topic_alias_maximum,
            connect_timeout: self.connect_timeout,
            max_keep_alive: Some(self.max_keep_alive.max(1)),
        }
    }

    /// Whether every `priority_topics` entry is a topic filter; the first that is not.
    pub fn check(&self) -> Result<(), String> {
        match self
            .priority_topics
            .iter()
            .find(|f| !qgate_mqtt::topic::is_valid_filter(f))
        {
            Some(f) => Err(format!(
                "priority_topics: {f:?} is not an MQTT topic filter"
            )),
            None => Ok(()),
        }
    }
}
