//! The MQTT front door (qgate_mqtt) on arbitrary bytes: a `Connection` fed them in chunks, raw
//! or after a valid CONNECT (5.0 or 3.1.1), by a shell that accepts, acks and nacks; and every
//! complete packet in them parsed on its own. Nothing panics, everything the connection writes
//! is a valid packet, and whatever parses re-emits to bytes that parse to the same value.
//!
//! The first byte steers: bits 0–1 pick the prefix (1: a 5.0 CONNECT, 2: a 3.1.1 CONNECT,
//! otherwise none), bits 2–7 the chunk size less one.
#![no_main]

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use qgate_mqtt::packet::Connect;
use qgate_mqtt::{
    Accept, ActionError, Config, Connection, Event, FixedHeader, Packet, Properties,
    ProtocolVersion, QoS, ReasonCode,
};

fn connect(protocol: ProtocolVersion) -> Bytes {
    let connect = Connect {
        protocol,
        clean_start: true,
        keep_alive: 5,
        properties: Properties::default(),
        client_id: "fuzz".into(),
        will: None,
        username: None,
        password: None,
    };
    Packet::Connect(Box::new(connect))
        .to_bytes(protocol)
        .expect("encodes")
}

/// emit → parse of an accepted packet gives it back.
fn check_round_trip(packet: &Packet, version: ProtocolVersion) {
    let version = match packet {
        Packet::Connect(c) => c.protocol,
        _ => version,
    };
    let bytes = packet.to_bytes(version).expect("a parsed packet encodes");
    assert_eq!(Packet::parse(bytes, version).as_ref(), Ok(packet));
}

/// Parses complete packets off the front of `buf` as the connection's own output: they must all
/// be valid.
fn drain_output(buf: &mut BytesMut, version: ProtocolVersion) {
    while let Some(header) = FixedHeader::parse(buf).expect("valid fixed header") {
        if buf.len() < header.packet_len() {
            return;
        }
        let packet = Packet::parse(buf.split_to(header.packet_len()).freeze(), version)
            .expect("the connection writes valid packets");
        check_round_trip(&packet, version);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&steer, rest)) = data.split_first() else {
        return;
    };
    let mut input = match steer & 0b11 {
        1 => connect(ProtocolVersion::V5).to_vec(),
        2 => connect(ProtocolVersion::V311).to_vec(),
        _ => Vec::new(),
    };
    input.extend_from_slice(rest);
    let chunk = usize::from(steer >> 2) + 1;

    // Every complete packet on its own, in both versions.
    let mut at = 0;
    while let Ok(Some(header)) = FixedHeader::parse(&input[at..]) {
        let end = at + header.packet_len();
        if end > input.len() {
            break;
        }
        for version in [ProtocolVersion::V5, ProtocolVersion::V311] {
            if let Ok(packet) = Packet::parse(Bytes::copy_from_slice(&input[at..end]), version) {
                check_round_trip(&packet, version);
            }
        }
        at = end;
    }

    let config = Config {
        max_packet_size: 4096,
        receive_maximum: 4,
        topic_alias_maximum: 4,
        ..Config::default()
    };
    let start = Instant::now();
    let mut now = start;
    let mut conn = Connection::new(config, now);
    let mut output = BytesMut::new();
    let mut publishes = 0u32;
    for piece in input.chunks(chunk) {
        now += Duration::from_millis(10);
        conn.handle_bytes(now, piece);
        conn.handle_timeout(now);
        while let Some(event) = conn.poll_event() {
            match event {
                Event::Connect(req) => {
                    let assigned = req.client_id.is_empty().then(|| "assigned".to_owned());
                    let accept = Accept {
                        assigned_client_id: assigned,
                        ..Accept::default()
                    };
                    // The connection may have closed after queuing the event (too much input
                    // while awaiting accept).
                    match conn.accept(accept) {
                        Ok(()) | Err(ActionError::Closed) => {}
                        Err(e) => panic!("accept: {e}"),
                    }
                }
                Event::Publish(m) => {
                    publishes += 1;
                    if let (Some(id), true) = (m.packet_id, m.qos != QoS::AtMostOnce) {
                        // Ack most, refuse some, leave every fifth in flight.
                        let _ = match publishes % 5 {
                            0 => Ok(()),
                            3 => conn.nack(id, ReasonCode::QuotaExceeded),
                            _ => conn.ack(id),
                        };
                    }
                }
                Event::Closed(_) => assert!(conn.is_closed()),
            }
        }
        while let Some(bytes) = conn.poll_transmit() {
            output.extend_from_slice(&bytes);
        }
        let version = conn.protocol().unwrap_or(ProtocolVersion::V311);
        drain_output(&mut output, version);
        if let Some(due) = conn.poll_timeout() {
            assert!(due > start);
        }
    }
});
