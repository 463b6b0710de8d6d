//! The server's limits for one MQTT connection. Every one bounds a piece of state the
//! connection holds for its client; the 5.0 ones are announced in CONNACK so a well-behaved
//! client never trips them.

use std::time::Duration;

/// Limits of a [`crate::Connection`]. [`Config::DEFAULT`] holds the defaults, in one place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Largest packet accepted, fixed header included. Checked against the fixed header, before
    /// the body is buffered, so it also bounds the connection's input buffer. Announced in 5.0
    /// CONNACK as Maximum Packet Size; a larger packet closes the connection (5.0: DISCONNECT
    /// 0x95 Packet too large). Clamped to 64 ..= 268 435 460 (the largest MQTT can frame).
    pub max_packet_size: u32,
    /// QoS 1 and 2 PUBLISHes a client may have unacknowledged at once: what the shell may have
    /// in storage for this connection. Announced in 5.0 CONNACK as Receive Maximum; one more
    /// closes the connection (5.0: DISCONNECT 0x93). 3.1.1 clients are not told and are closed
    /// the same way. At least 1.
    pub receive_maximum: u16,
    /// Topic aliases (1 ..= this) a 5.0 client may set, each holding one topic name. Announced
    /// as Topic Alias Maximum; 0 offers none. An alias outside the range closes the connection
    /// with DISCONNECT 0x94 Topic Alias invalid.
    pub topic_alias_maximum: u16,
    /// Time from the connection's creation to the shell's `accept`: the client's CONNECT and the
    /// shell's decision on it both fit in it, or the connection closes.
    pub connect_timeout: Duration,
    /// Longest keep-alive, in seconds, the server holds a silent connection for. A client asking
    /// for more, or for none (0), gets this one: announced as Server Keep Alive in 5.0, applied
    /// without a word to 3.1.1 clients (which 3.1.1 §3.1.2.10 allows). `None` lets a client
    /// keep an idle connection open for ever.
    pub max_keep_alive: Option<u16>,
}

impl Config {
    /// The defaults: 256 KiB packets, 32 unacknowledged publishes, 16 topic aliases, 10 s to
    /// connect, keep-alive at most an hour.
    pub const DEFAULT: Config = Config {
        max_packet_size: 256 * 1024,
        receive_maximum: 32,
        topic_alias_maximum: 16,
        connect_timeout: Duration::from_secs(10),
        max_keep_alive: Some(3600),
    };

    /// The smallest Maximum Packet Size the connection uses: room for a CONNECT with short
    /// fields.
    pub const MIN_PACKET_SIZE: u32 = 64;

    /// The largest packet MQTT can frame: a 5-byte fixed header and the largest remaining length.
    pub const MAX_PACKET_SIZE: u32 = 268_435_460;

    /// This config with every value brought into its valid range.
    pub(crate) fn clamped(mut self) -> Config {
        self.max_packet_size = self
            .max_packet_size
            .clamp(Self::MIN_PACKET_SIZE, Self::MAX_PACKET_SIZE);
        self.receive_maximum = self.receive_maximum.max(1);
        self
    }
}

impl Default for Config {
    fn default() -> Self {
        Config::DEFAULT
    }
}
