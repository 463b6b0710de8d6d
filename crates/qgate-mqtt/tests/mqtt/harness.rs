//! A test shell around a `Connection`: feeds packets, collects events, and parses what the
//! connection writes back.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use qgate_mqtt::packet::{Connect, Publish};
use qgate_mqtt::{
    Accept, Closed, Config, Connection, Event, FixedHeader, Message, Packet, Properties,
    ProtocolVersion, QoS,
};

pub struct Harness {
    pub conn: Connection,
    pub start: Instant,
    pub now: Instant,
    pub version: ProtocolVersion,
    /// Everything the connection wrote, not yet read by `sent`.
    output: BytesMut,
}

impl Harness {
    pub fn new(config: Config, version: ProtocolVersion) -> Self {
        let start = Instant::now();
        Harness {
            conn: Connection::new(config, start),
            start,
            now: start,
            version,
            output: BytesMut::new(),
        }
    }

    /// A harness whose client has connected and been accepted; the CONNACK is read.
    pub fn connected(config: Config, version: ProtocolVersion) -> Self {
        Self::connected_with(config, connect(version, 0))
    }

    pub fn connected_with(config: Config, connect: Connect) -> Self {
        let mut h = Harness::new(config, connect.protocol);
        h.feed(&Packet::Connect(Box::new(connect)));
        assert!(matches!(h.events()[..], [Event::Connect(_)]));
        h.conn.accept(Accept::default()).expect("accept");
        assert!(matches!(h.sent()[..], [Packet::ConnAck(_)]));
        h
    }

    pub fn advance(&mut self, by: Duration) {
        self.now += by;
        self.conn.handle_timeout(self.now);
    }

    pub fn feed(&mut self, packet: &Packet) {
        let bytes = packet.to_bytes(self.version).expect("encodes");
        self.feed_bytes(&bytes);
    }

    pub fn feed_bytes(&mut self, bytes: &[u8]) {
        self.conn.handle_bytes(self.now, bytes);
    }

    pub fn events(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.conn.poll_event()).collect()
    }

    /// The packets written since the last call.
    pub fn sent(&mut self) -> Vec<Packet> {
        while let Some(bytes) = self.conn.poll_transmit() {
            self.output.extend_from_slice(&bytes);
        }
        parse_stream(&mut self.output, self.version)
    }

    /// The publishes among the events, and how the connection closed if it did.
    pub fn messages(&mut self) -> (Vec<Message>, Option<Closed>) {
        let mut messages = Vec::new();
        let mut closed = None;
        for event in self.events() {
            match event {
                Event::Publish(m) => messages.push(m),
                Event::Closed(c) => closed = Some(c),
                Event::Connect(c) => panic!("unexpected {c:?}"),
            }
        }
        (messages, closed)
    }
}

/// Cuts complete packets off the front of `buf`.
pub fn parse_stream(buf: &mut BytesMut, version: ProtocolVersion) -> Vec<Packet> {
    let mut packets = Vec::new();
    while let Ok(Some(header)) = FixedHeader::parse(buf) {
        if buf.len() < header.packet_len() {
            break;
        }
        let bytes: Bytes = buf.split_to(header.packet_len()).freeze();
        packets.push(Packet::parse(bytes, version).expect("the connection writes valid packets"));
    }
    packets
}

pub fn connect(version: ProtocolVersion, keep_alive: u16) -> Connect {
    Connect {
        protocol: version,
        clean_start: true,
        keep_alive,
        properties: Properties::default(),
        client_id: "sensor-1".into(),
        will: None,
        username: Some("user".into()),
        password: Some(Bytes::from_static(b"secret")),
    }
}

pub fn publish(qos: QoS, packet_id: u16, topic: &str, payload: &'static [u8]) -> Packet {
    Packet::Publish(Publish {
        dup: false,
        qos,
        retain: false,
        topic: topic.into(),
        packet_id: (qos != QoS::AtMostOnce).then_some(packet_id),
        properties: Properties::default(),
        payload: Bytes::from_static(payload),
    })
}
