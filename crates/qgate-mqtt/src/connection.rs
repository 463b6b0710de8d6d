//! The server side of one MQTT connection, without I/O: bytes and time go in, events and bytes
//! come out.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::config::Config;
use crate::error::{DecodeError, EncodeError};
use crate::event::{Closed, ConnectRequest, Event, Message};
use crate::packet::{
    ConnAck, Connect, Disconnect, FixedHeader, Packet, PacketType, ProtocolVersion, PubResponse,
    Publish, QoS, SubAck, Subscribe, UnsubAck, Unsubscribe,
};
use crate::properties::Properties;
use crate::reason::ReasonCode;
use crate::topic;
use crate::violation::Violation;

/// What SUBACK's reason string tells a 5.0 client: the gateway carries data from devices and
/// offers no way back to them.
pub const SUBSCRIBE_REFUSAL: &str =
    "subscriptions are not offered: this server accepts PUBLISH only (no commands to devices)";

/// What the shell does with a CONNECT it accepts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Accept {
    /// Whether the server holds a session for this client from before (5.0: only without
    /// Clean Start).
    pub session_present: bool,
    /// The identifier the shell gave a client that connected with an empty one; required for
    /// 5.0 in that case (spec §3.2.2.3.7), not sent in 3.1.1.
    pub assigned_client_id: Option<String>,
    /// Sent to 5.0 clients in CONNACK.
    pub user_properties: Vec<(String, String)>,
}

/// A shell's call the connection cannot carry out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActionError {
    /// `accept` or `refuse` without a CONNECT waiting for it.
    #[error("no CONNECT awaits accept or refuse")]
    NotAwaitingAccept,
    /// A 5.0 client with an empty client identifier accepted without `assigned_client_id`.
    #[error("an empty client identifier needs an assigned one")]
    AssignedClientIdRequired,
    /// `ack` or `nack` of an identifier with no PUBLISH waiting for it.
    #[error("no PUBLISH {0} awaits an acknowledgement")]
    UnknownPacketId(u16),
    /// A reason the packet may not carry (a success in `refuse`/`nack`, or outside the spec's
    /// table for CONNACK, PUBACK/PUBREC or DISCONNECT).
    #[error("reason {0} not allowed here")]
    ReasonNotAllowed(ReasonCode),
    /// The connection has closed.
    #[error("connection closed")]
    Closed,
    /// The shell's strings do not fit the packet.
    #[error("{0}")]
    Encode(#[from] EncodeError),
}

#[derive(Debug)]
enum State {
    /// Waiting for CONNECT, until `deadline`.
    AwaitingConnect {
        deadline: Instant,
    },
    /// The Connect event is out; the shell has until `deadline` to `accept` or `refuse`.
    Authenticating {
        deadline: Instant,
        pending: Box<Pending>,
    },
    Connected,
    Closed,
}

/// What `accept` needs from the CONNECT.
#[derive(Debug)]
struct Pending {
    client_id_empty: bool,
    /// The keep-alive to enforce, in seconds (0: none).
    keep_alive: u16,
    /// The Server Keep Alive to announce, when it differs from the client's.
    server_keep_alive: Option<u16>,
    session_expiry_zero: bool,
}

/// Where a QoS 1/2 PUBLISH's exchange stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InFlight {
    /// Delivered as an event; the shell has not acknowledged it.
    AwaitingAck(QoS),
    /// QoS 2: PUBREC sent, PUBREL not yet received.
    Received,
}

/// One MQTT connection, server side, sans-IO (as `quinn_proto::Connection`): the shell owns the
/// transport (TCP, TLS, a QUIC stream) and the clock and feeds both in; nothing here blocks,
/// reads a clock or touches a socket.
///
/// Polling order, after creating it with [`Connection::new`] and after every call that feeds it
/// ([`handle_bytes`](Self::handle_bytes), [`handle_timeout`](Self::handle_timeout), or an
/// action: [`accept`](Self::accept), [`refuse`](Self::refuse), [`ack`](Self::ack),
/// [`nack`](Self::nack), [`close`](Self::close)):
///
/// 1. [`poll_event`](Self::poll_event) until `None`, acting on each event (an action may be
///    taken later too, e.g. `ack` once a record is stored);
/// 2. [`poll_transmit`](Self::poll_transmit) until `None`, writing every buffer to the transport
///    in order;
/// 3. if [`is_closed`](Self::is_closed), close the transport once the writes are flushed and
///    drop the connection;
/// 4. otherwise arm a timer for [`poll_timeout`](Self::poll_timeout) and call `handle_timeout`
///    when it fires.
///
/// Events and output queue up between polls in proportion to the input handed in, so a shell
/// reading in bounded chunks and draining after each keeps them bounded. The input buffer holds
/// at most one partial packet, at most `max_packet_size` bytes.
#[derive(Debug)]
pub struct Connection {
    config: Config,
    state: State,
    protocol: Option<ProtocolVersion>,
    input: BytesMut,
    /// When the last input arrived: packets parsed from the buffer later (after `accept`)
    /// count as received then.
    last_input: Instant,
    /// When the last complete packet arrived: keep-alive counts from here.
    last_packet: Instant,
    /// 1.5 × the enforced keep-alive; `None` when off.
    keep_alive_timeout: Option<Duration>,
    session_expiry_zero: bool,
    client_max_packet_size: Option<u32>,
    /// The client's Request Problem Information: when `false`, no reason string outside
    /// CONNACK and DISCONNECT (spec §3.1.2.11.7).
    problem_information: bool,
    in_flight: HashMap<u16, InFlight>,
    /// Topic alias `n` is at index `n - 1`.
    topic_aliases: Vec<Option<String>>,
    events: VecDeque<Event>,
    output: BytesMut,
}

impl Connection {
    /// A connection whose transport was established at `now`. Out-of-range config values are
    /// clamped (see [`Config`]).
    pub fn new(config: Config, now: Instant) -> Self {
        let config = config.clamped();
        let deadline = now + config.connect_timeout;
        Connection {
            state: State::AwaitingConnect { deadline },
            protocol: None,
            input: BytesMut::new(),
            last_input: now,
            last_packet: now,
            keep_alive_timeout: None,
            session_expiry_zero: true,
            client_max_packet_size: None,
            problem_information: true,
            in_flight: HashMap::new(),
            topic_aliases: Vec::new(),
            events: VecDeque::new(),
            output: BytesMut::new(),
            config,
        }
    }

    /// The protocol version, once CONNECT has been read.
    pub fn protocol(&self) -> Option<ProtocolVersion> {
        self.protocol
    }

    /// Whether the connection is over: the shell flushes the output and closes the transport.
    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    /// Feeds bytes read from the transport at `now`. Every complete packet is handled at once;
    /// a partial one is kept until the rest arrives, and refused from its fixed header alone when
    /// it exceeds `max_packet_size`. While a CONNECT awaits `accept`, input is held unread, at
    /// most `max_packet_size` bytes of it (more closes the connection): a shell that decides
    /// slowly should stop reading meanwhile.
    pub fn handle_bytes(&mut self, now: Instant, data: &[u8]) {
        if self.is_closed() {
            return;
        }
        self.last_input = now;
        self.input.extend_from_slice(data);
        self.process_input();
        if matches!(self.state, State::Authenticating { .. })
            && self.input.len() > self.config.max_packet_size as usize
        {
            self.fail(Violation::InputBeforeConnAck);
        }
    }

    /// The next event for the shell.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Bytes to write to the transport, everything queued since the last call in one buffer.
    pub fn poll_transmit(&mut self) -> Option<Bytes> {
        if self.output.is_empty() {
            return None;
        }
        Some(self.output.split().freeze())
    }

    /// When [`handle_timeout`](Self::handle_timeout) is next due: the connect deadline before
    /// `accept`, then 1.5 × keep-alive after the last packet; `None` when closed or keep-alive
    /// is off.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.state {
            State::AwaitingConnect { deadline } | State::Authenticating { deadline, .. } => {
                Some(*deadline)
            }
            State::Connected => self.keep_alive_timeout.map(|t| self.last_packet + t),
            State::Closed => None,
        }
    }

    /// Closes the connection if a deadline has passed by `now` (5.0: with DISCONNECT 0x8D
    /// Keep Alive timeout once connected). Harmless to call early.
    pub fn handle_timeout(&mut self, now: Instant) {
        let Some(due) = self.poll_timeout() else {
            return;
        };
        if now < due {
            return;
        }
        if matches!(self.state, State::Connected) {
            self.send_disconnect(ReasonCode::KeepAliveTimeout);
            self.close_with(Closed::KeepAliveTimeout);
        } else {
            self.close_with(Closed::ConnectTimeout);
        }
    }

    /// Accepts the CONNECT the last `Event::Connect` carried: sends CONNACK (5.0: with the
    /// server's limits from [`Config`], and no wildcard, shared or identified subscriptions) and
    /// handles any packets the client sent after CONNECT.
    pub fn accept(&mut self, accept: Accept) -> Result<(), ActionError> {
        let State::Authenticating { pending, .. } = &self.state else {
            return Err(self.not_awaiting());
        };
        let protocol = self.protocol.unwrap_or(ProtocolVersion::V5);
        if protocol == ProtocolVersion::V5
            && pending.client_id_empty
            && accept.assigned_client_id.is_none()
        {
            return Err(ActionError::AssignedClientIdRequired);
        }
        let mut properties = Properties {
            maximum_packet_size: Some(self.config.max_packet_size),
            wildcard_subscription_available: Some(false),
            subscription_identifier_available: Some(false),
            shared_subscription_available: Some(false),
            server_keep_alive: pending.server_keep_alive,
            user_properties: accept.user_properties,
            ..Properties::default()
        };
        if pending.client_id_empty {
            properties.assigned_client_identifier = accept.assigned_client_id;
        }
        if self.config.receive_maximum < u16::MAX {
            properties.receive_maximum = Some(self.config.receive_maximum);
        }
        if self.config.topic_alias_maximum > 0 {
            properties.topic_alias_maximum = Some(self.config.topic_alias_maximum);
        }
        let connack = Packet::ConnAck(ConnAck {
            session_present: accept.session_present,
            reason: ReasonCode::Success,
            properties,
        });
        let (keep_alive, session_expiry_zero) = (pending.keep_alive, pending.session_expiry_zero);
        self.try_send(connack)?;
        self.session_expiry_zero = session_expiry_zero;
        self.keep_alive_timeout =
            (keep_alive > 0).then(|| Duration::from_millis(u64::from(keep_alive) * 1500));
        self.topic_aliases = vec![None; usize::from(self.config.topic_alias_maximum)];
        self.state = State::Connected;
        self.process_input();
        Ok(())
    }

    /// Refuses the CONNECT the last `Event::Connect` carried with a failure `reason` (3.1.1:
    /// the nearest return code) and closes.
    pub fn refuse(&mut self, reason: ReasonCode) -> Result<(), ActionError> {
        if !matches!(self.state, State::Authenticating { .. }) {
            return Err(self.not_awaiting());
        }
        if !reason.is_error() || !reason.allowed_in(PacketType::ConnAck) {
            return Err(ActionError::ReasonNotAllowed(reason));
        }
        self.refuse_connect(reason, self.protocol.unwrap_or(ProtocolVersion::V5));
        Ok(())
    }

    /// Acknowledges the QoS 1/2 PUBLISH `packet_id` once the shell has stored it: PUBACK for
    /// QoS 1, PUBREC for QoS 2 (whose PUBREL the connection answers with PUBCOMP by itself).
    pub fn ack(&mut self, packet_id: u16) -> Result<(), ActionError> {
        let qos = self.awaiting_ack(packet_id)?;
        let response = PubResponse::success(packet_id);
        if qos == QoS::AtLeastOnce {
            self.in_flight.remove(&packet_id);
            self.send(Packet::PubAck(response));
        } else {
            self.in_flight.insert(packet_id, InFlight::Received);
            self.send(Packet::PubRec(response));
        }
        Ok(())
    }

    /// Rejects the QoS 1/2 PUBLISH `packet_id`: 5.0 answers PUBACK or PUBREC with `reason`
    /// (a failure allowed there, e.g. 0x97 Quota exceeded) and the exchange ends. 3.1.1 has no
    /// way to say no, and an acknowledgement would claim the message was taken: the connection
    /// closes instead, so the client sends it again elsewhere or later.
    pub fn nack(&mut self, packet_id: u16, reason: ReasonCode) -> Result<(), ActionError> {
        if !reason.is_error() || !reason.allowed_in(PacketType::PubAck) {
            return Err(ActionError::ReasonNotAllowed(reason));
        }
        let qos = self.awaiting_ack(packet_id)?;
        if self.protocol != Some(ProtocolVersion::V5) {
            self.close_with(Closed::ByServer(reason));
            return Ok(());
        }
        self.in_flight.remove(&packet_id);
        let response = PubResponse {
            packet_id,
            reason,
            properties: Properties::default(),
        };
        self.send(if qos == QoS::AtLeastOnce {
            Packet::PubAck(response)
        } else {
            Packet::PubRec(response)
        });
        Ok(())
    }

    /// Closes the connection from the server's side (shutdown, session taken over…): 5.0
    /// clients get DISCONNECT with `reason`. Before CONNACK it closes without a word.
    pub fn close(&mut self, reason: ReasonCode) -> Result<(), ActionError> {
        if self.is_closed() {
            return Err(ActionError::Closed);
        }
        if !reason.allowed_in(PacketType::Disconnect) {
            return Err(ActionError::ReasonNotAllowed(reason));
        }
        if matches!(self.state, State::Connected) {
            self.send_disconnect(reason);
        }
        self.close_with(Closed::ByServer(reason));
        Ok(())
    }

    fn not_awaiting(&self) -> ActionError {
        if self.is_closed() {
            ActionError::Closed
        } else {
            ActionError::NotAwaitingAccept
        }
    }

    fn awaiting_ack(&self, packet_id: u16) -> Result<QoS, ActionError> {
        if self.is_closed() {
            return Err(ActionError::Closed);
        }
        match self.in_flight.get(&packet_id) {
            Some(&InFlight::AwaitingAck(qos)) => Ok(qos),
            _ => Err(ActionError::UnknownPacketId(packet_id)),
        }
    }

    /// Handles every complete packet in the input, while the state reads packets.
    fn process_input(&mut self) {
        loop {
            let connected = match self.state {
                State::AwaitingConnect { .. } => false,
                State::Connected => true,
                State::Authenticating { .. } | State::Closed => return,
            };
            let header = match FixedHeader::parse(&self.input) {
                Ok(Some(header)) => header,
                Ok(None) => return,
                Err(error) => return self.fail(Violation::Decode(error)),
            };
            let size = header.packet_len();
            if size > self.config.max_packet_size as usize {
                let max = self.config.max_packet_size;
                return self.fail(Violation::Decode(DecodeError::PacketTooLarge {
                    size: size as u64,
                    max,
                }));
            }
            if self.input.len() < size {
                return;
            }
            let packet = self.input.split_to(size).freeze();
            self.last_packet = self.last_input;
            if connected {
                self.handle_packet(packet);
            } else {
                self.handle_first_packet(header, packet);
            }
        }
    }

    fn handle_first_packet(&mut self, header: FixedHeader, packet: Bytes) {
        if header.packet_type != PacketType::Connect {
            return self.fail(Violation::FirstPacketNotConnect(header.packet_type));
        }
        let level = connect_level(&packet[header.header_len..]);
        match Packet::parse(packet, ProtocolVersion::V5) {
            Ok(Packet::Connect(connect)) => self.handle_connect(*connect),
            Ok(other) => self.fail(Violation::FirstPacketNotConnect(other.packet_type())),
            Err(error) => {
                // A 5.0 client hears why in CONNACK (spec §4.13.1); a 3.1.1 one only about its
                // protocol level; any other closes silently.
                if level == Some(5) {
                    self.protocol = Some(ProtocolVersion::V5);
                    self.refuse_connect(error.reason_code(), ProtocolVersion::V5);
                } else if let Some(code) = error.v311_return_code() {
                    self.refuse_connect(code.to_reason(), ProtocolVersion::V311);
                }
                self.close_with(Closed::Violation(Violation::Decode(error)));
            }
        }
    }

    fn handle_connect(&mut self, connect: Connect) {
        let protocol = connect.protocol;
        self.protocol = Some(protocol);
        if protocol == ProtocolVersion::V311 && connect.client_id.is_empty() && !connect.clean_start
        {
            return self.refuse_connect(ReasonCode::ClientIdentifierNotValid, protocol);
        }
        if connect.properties.authentication_method.is_some() {
            return self.refuse_connect(ReasonCode::BadAuthenticationMethod, protocol);
        }
        let (keep_alive, server_keep_alive) = match self.config.max_keep_alive {
            Some(max) if connect.keep_alive == 0 || connect.keep_alive > max => (max, Some(max)),
            _ => (connect.keep_alive, None),
        };
        let props = connect.properties;
        self.client_max_packet_size = props.maximum_packet_size;
        self.problem_information = props.request_problem_information != Some(false);
        let session_expiry = props.session_expiry_interval.unwrap_or(0);
        let pending = Box::new(Pending {
            client_id_empty: connect.client_id.is_empty(),
            keep_alive,
            server_keep_alive: server_keep_alive.filter(|_| protocol == ProtocolVersion::V5),
            session_expiry_zero: session_expiry == 0,
        });
        let State::AwaitingConnect { deadline } = self.state else {
            return;
        };
        self.state = State::Authenticating { deadline, pending };
        self.events
            .push_back(Event::Connect(Box::new(ConnectRequest {
                protocol,
                client_id: connect.client_id,
                clean_start: connect.clean_start,
                keep_alive: connect.keep_alive,
                username: connect.username,
                password: connect.password,
                session_expiry,
                receive_maximum: props.receive_maximum.unwrap_or(u16::MAX),
                maximum_packet_size: props.maximum_packet_size,
                will: connect.will,
                user_properties: props.user_properties,
            })));
    }

    /// Sends a refusing CONNACK and closes.
    fn refuse_connect(&mut self, reason: ReasonCode, protocol: ProtocolVersion) {
        let connack = ConnAck {
            session_present: false,
            reason,
            properties: Properties::default(),
        };
        self.send_as(Packet::ConnAck(connack), protocol);
        self.close_with(Closed::Refused(reason));
    }

    fn handle_packet(&mut self, packet: Bytes) {
        let protocol = self.protocol.unwrap_or(ProtocolVersion::V5);
        let packet = match Packet::parse(packet, protocol) {
            Ok(packet) => packet,
            Err(error) => return self.fail(Violation::Decode(error)),
        };
        match packet {
            Packet::Publish(publish) => self.handle_publish(publish),
            Packet::PubRel(rel) => self.handle_pubrel(rel.packet_id),
            Packet::Subscribe(subscribe) => self.handle_subscribe(subscribe),
            Packet::Unsubscribe(unsubscribe) => self.handle_unsubscribe(unsubscribe),
            Packet::PingReq => self.send(Packet::PingResp),
            Packet::Disconnect(disconnect) => {
                let expiry = disconnect.properties.session_expiry_interval.unwrap_or(0);
                if self.session_expiry_zero && expiry != 0 {
                    return self.fail(Violation::SessionExpiryAfterZero);
                }
                self.close_with(Closed::ByClient(disconnect.reason));
            }
            Packet::Connect(_) => self.fail(Violation::SecondConnect),
            other => self.fail(Violation::UnexpectedPacket(other.packet_type())),
        }
    }

    fn handle_publish(&mut self, publish: Publish) {
        let Publish {
            dup,
            qos,
            retain,
            topic,
            packet_id,
            properties,
            payload,
            ..
        } = publish;
        if !properties.subscription_identifiers.is_empty() {
            return self.fail(Violation::SubscriptionIdentifierInPublish);
        }
        let topic = match self.resolve_topic(topic, properties.topic_alias) {
            Ok(topic) => topic,
            Err(violation) => return self.fail(violation),
        };
        if let Some(id) = packet_id {
            let full = self.in_flight.len() >= usize::from(self.config.receive_maximum);
            match self.in_flight.entry(id) {
                // The client sent it again before our acknowledgement: the pending `ack` answers
                // both, and the shell sees the message once.
                Entry::Occupied(e) if *e.get() == InFlight::AwaitingAck(qos) => return,
                // QoS 2 already taken (PUBREC sent): say so again, deliver nothing.
                Entry::Occupied(e) if *e.get() == InFlight::Received && qos == QoS::ExactlyOnce => {
                    return self.send(Packet::PubRec(PubResponse::success(id)));
                }
                Entry::Occupied(_) => return self.fail(Violation::PacketIdOutOfOrder(id)),
                Entry::Vacant(e) => {
                    if full {
                        return self.fail(Violation::ReceiveMaximumExceeded);
                    }
                    e.insert(InFlight::AwaitingAck(qos));
                }
            }
        }
        self.events.push_back(Event::Publish(Message {
            packet_id,
            qos,
            dup,
            topic,
            payload,
            retain,
            payload_is_utf8: properties.payload_format_utf8 == Some(true),
            message_expiry: properties.message_expiry_interval,
            content_type: properties.content_type,
            user_properties: properties.user_properties,
        }));
    }

    /// The topic a PUBLISH goes to: its name, or (5.0) the name its alias stands for; a named
    /// PUBLISH with an alias (re)binds the alias.
    fn resolve_topic(&mut self, topic: String, alias: Option<u16>) -> Result<String, Violation> {
        let Some(alias) = alias else {
            return if topic.is_empty() {
                Err(Violation::EmptyTopic)
            } else {
                Ok(topic)
            };
        };
        let slot = usize::from(alias)
            .checked_sub(1)
            .and_then(|i| self.topic_aliases.get_mut(i))
            .ok_or(Violation::TopicAliasInvalid(alias))?;
        if topic.is_empty() {
            return slot.clone().ok_or(Violation::TopicAliasUnknown(alias));
        }
        *slot = Some(topic.clone());
        Ok(topic)
    }

    fn handle_pubrel(&mut self, packet_id: u16) {
        let reason = match self.in_flight.get(&packet_id) {
            Some(InFlight::Received) => {
                self.in_flight.remove(&packet_id);
                ReasonCode::Success
            }
            Some(InFlight::AwaitingAck(_)) => {
                return self.fail(Violation::PacketIdOutOfOrder(packet_id));
            }
            // Already completed (a PUBREL resent after our PUBCOMP was lost) or never seen.
            None => ReasonCode::PacketIdentifierNotFound,
        };
        let response = PubResponse {
            packet_id,
            reason,
            properties: Properties::default(),
        };
        self.send(Packet::PubComp(response));
    }

    /// Answers SUBSCRIBE with a failure for every filter: 0x83 Implementation specific error
    /// ("valid, but the Server does not accept it", spec §3.9.3) with [`SUBSCRIBE_REFUSAL`] as
    /// reason string (unless the client asked for no problem information), 0x8F for a malformed
    /// filter; 3.1.1 has only 0x80.
    fn handle_subscribe(&mut self, subscribe: Subscribe) {
        let reasons = subscribe
            .filters
            .iter()
            .map(|sub| match topic::is_valid_filter(&sub.filter) {
                true => ReasonCode::ImplementationSpecificError,
                false => ReasonCode::TopicFilterInvalid,
            })
            .collect();
        let properties = Properties {
            reason_string: self
                .problem_information
                .then(|| SUBSCRIBE_REFUSAL.to_owned()),
            ..Properties::default()
        };
        self.send(Packet::SubAck(SubAck {
            packet_id: subscribe.packet_id,
            properties,
            reasons,
        }));
    }

    /// Answers UNSUBSCRIBE: there was never a subscription (5.0: 0x11 for every filter).
    fn handle_unsubscribe(&mut self, unsubscribe: Unsubscribe) {
        let reasons = vec![ReasonCode::NoSubscriptionExisted; unsubscribe.filters.len()];
        let ack = UnsubAck {
            packet_id: unsubscribe.packet_id,
            properties: Properties::default(),
            reasons,
        };
        self.send(Packet::UnsubAck(ack));
    }

    /// Closes for a client's fault: 5.0 clients past CONNACK get DISCONNECT with its reason.
    fn fail(&mut self, violation: Violation) {
        if matches!(self.state, State::Connected) {
            self.send_disconnect(violation.reason_code());
        }
        self.close_with(Closed::Violation(violation));
    }

    fn send_disconnect(&mut self, reason: ReasonCode) {
        if self.protocol == Some(ProtocolVersion::V5) {
            let reason = if reason.allowed_in(PacketType::Disconnect) {
                reason
            } else {
                ReasonCode::ProtocolError
            };
            self.send(Packet::Disconnect(Disconnect::new(reason)));
        }
    }

    fn close_with(&mut self, closed: Closed) {
        if self.is_closed() {
            return;
        }
        self.state = State::Closed;
        self.input = BytesMut::new();
        self.in_flight.clear();
        self.topic_aliases.clear();
        self.events.push_back(Event::Closed(closed));
    }

    /// Queues a packet built from parsed identifiers and this crate's own strings, which always
    /// encodes; only `accept` carries the shell's strings, through [`Self::try_send`].
    fn send(&mut self, packet: Packet) {
        let result = self.try_send(packet);
        debug_assert!(result.is_ok(), "{result:?}");
    }

    fn try_send(&mut self, packet: Packet) -> Result<(), EncodeError> {
        let protocol = self.protocol.unwrap_or(ProtocolVersion::V5);
        self.try_send_as(packet, protocol)
    }

    fn send_as(&mut self, packet: Packet, protocol: ProtocolVersion) {
        let result = self.try_send_as(packet, protocol);
        debug_assert!(result.is_ok(), "{result:?}");
    }

    /// Encodes into the output; a packet over the client's Maximum Packet Size loses its reason
    /// string and user properties, as spec §3.1.2.11.4 prescribes (what remains is sent).
    fn try_send_as(
        &mut self,
        mut packet: Packet,
        protocol: ProtocolVersion,
    ) -> Result<(), EncodeError> {
        let mut encoded = BytesMut::new();
        packet.emit(protocol, &mut encoded)?;
        if let Some(max) = self.client_max_packet_size {
            if encoded.len() > max as usize {
                if let Some(properties) = diagnostic_properties(&mut packet) {
                    properties.reason_string = None;
                    properties.user_properties.clear();
                    encoded.clear();
                    packet.emit(protocol, &mut encoded)?;
                }
            }
        }
        self.output.extend_from_slice(&encoded);
        Ok(())
    }
}

/// The properties of a packet this server sends that may carry a reason string or user
/// properties.
fn diagnostic_properties(packet: &mut Packet) -> Option<&mut Properties> {
    match packet {
        Packet::ConnAck(p) => Some(&mut p.properties),
        Packet::SubAck(p) => Some(&mut p.properties),
        Packet::UnsubAck(p) => Some(&mut p.properties),
        Packet::Disconnect(p) => Some(&mut p.properties),
        Packet::PubAck(p) | Packet::PubRec(p) | Packet::PubComp(p) => Some(&mut p.properties),
        _ => None,
    }
}

/// The protocol level of a CONNECT body that names "MQTT", read without parsing the rest: how a
/// malformed CONNECT tells whether its client speaks 5.0.
fn connect_level(body: &[u8]) -> Option<u8> {
    match body {
        [0x00, 0x04, b'M', b'Q', b'T', b'T', level, ..] => Some(*level),
        _ => None,
    }
}
