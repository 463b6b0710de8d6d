//! What a [`crate::Connection`] tells its shell.

use bytes::Bytes;

use crate::packet::{ProtocolVersion, QoS, Will};
use crate::reason::ReasonCode;
use crate::violation::Violation;

/// Something the shell acts on, from [`crate::Connection::poll_event`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A client asks to connect: authenticate it, then call `accept` or `refuse`. No other
    /// event comes before one of them.
    Connect(Box<ConnectRequest>),
    /// An application message. QoS 1 and 2 ones wait for the shell's `ack` (or `nack`).
    Publish(Message),
    /// The connection is over; flush `poll_transmit`, then close the transport.
    Closed(Closed),
}

/// A CONNECT, with 5.0's defaults filled in where the client left a property out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    pub protocol: ProtocolVersion,
    /// May be empty: the shell names the client (and tells a 5.0 one, via `accept`).
    pub client_id: String,
    pub clean_start: bool,
    /// As the client asked, in seconds (see `Config::max_keep_alive` for what is enforced).
    pub keep_alive: u16,
    pub username: Option<String>,
    pub password: Option<Bytes>,
    /// Seconds; 0 when absent (and always in 3.1.1).
    pub session_expiry: u32,
    /// The client's Receive Maximum; 65 535 when absent.
    pub receive_maximum: u16,
    /// The largest packet the client accepts; `None` when unlimited.
    pub maximum_packet_size: Option<u32>,
    /// Parsed for the record; this crate never publishes it.
    pub will: Option<Will>,
    pub user_properties: Vec<(String, String)>,
}

/// A PUBLISH, its topic resolved through the connection's topic aliases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Present for QoS 1 and 2: the identifier `ack` takes.
    pub packet_id: Option<u16>,
    pub qos: QoS,
    /// The client's DUP flag: it may have sent this message before, perhaps on an earlier
    /// connection (a shell that stores by message id uses the id it gave the first copy).
    pub dup: bool,
    pub topic: String,
    pub payload: Bytes,
    pub retain: bool,
    /// The client said the payload is UTF-8 (Payload Format Indicator 1); not checked here.
    pub payload_is_utf8: bool,
    /// Seconds the message stays valid, from the client.
    pub message_expiry: Option<u32>,
    pub content_type: Option<String>,
    pub user_properties: Vec<(String, String)>,
}

/// Why a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Closed {
    /// The client sent DISCONNECT with this reason (Success is a normal disconnection;
    /// Disconnect with Will Message asks for the will).
    ByClient(ReasonCode),
    /// The client broke the protocol or a limit; a 5.0 client was told
    /// [`Violation::reason_code`] in DISCONNECT (or CONNACK, before one was accepted).
    Violation(Violation),
    /// Nothing from the client for one and a half keep-alive periods.
    KeepAliveTimeout,
    /// No CONNECT, or no `accept`, within `Config::connect_timeout`.
    ConnectTimeout,
    /// CONNECT refused with this reason, by the shell's `refuse` or by the connection itself
    /// (3.1.1 empty client identifier without Clean Session; any 5.0 authentication method;
    /// an unsupported protocol level).
    Refused(ReasonCode),
    /// The shell closed the connection with `close`.
    ByServer(ReasonCode),
}
