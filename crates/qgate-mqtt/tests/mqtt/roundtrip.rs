//! emit → parse is the identity for every packet kind in both versions; parse never panics, and
//! whatever it accepts re-emits to bytes that parse to the same value.

use bytes::Bytes;
use proptest::collection::vec;
use proptest::prelude::*;
use qgate_mqtt::{FixedHeader, Packet, ProtocolVersion};

use crate::strategies::packet;

fn round_trip(packet: &Packet, version: ProtocolVersion) -> Result<(), TestCaseError> {
    let bytes = packet
        .to_bytes(version)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let header = FixedHeader::parse(&bytes).ok().flatten();
    prop_assert_eq!(header.map(|h| h.packet_len()), Some(bytes.len()));
    let parsed = Packet::parse(bytes, version);
    prop_assert_eq!(parsed.as_ref(), Ok(packet));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn v5_packets_round_trip(p in packet(ProtocolVersion::V5)) {
        round_trip(&p, ProtocolVersion::V5)?;
    }

    #[test]
    fn v311_packets_round_trip(p in packet(ProtocolVersion::V311)) {
        round_trip(&p, ProtocolVersion::V311)?;
    }

    /// Arbitrary bytes, and valid packets with one byte changed: parse returns, and an accepted
    /// packet survives emit → parse unchanged.
    #[test]
    fn parse_never_panics_and_accepted_input_round_trips(
        raw in vec(any::<u8>(), 0..64),
        valid in packet(ProtocolVersion::V5),
        flip in any::<(usize, u8)>(),
        v5 in any::<bool>(),
    ) {
        let version = if v5 { ProtocolVersion::V5 } else { ProtocolVersion::V311 };
        let mut mutated = valid.to_bytes(ProtocolVersion::V5).map(|b| b.to_vec()).unwrap_or_default();
        if !mutated.is_empty() {
            let at = flip.0 % mutated.len();
            mutated[at] ^= flip.1;
        }
        for input in [raw, mutated] {
            let _ = FixedHeader::parse(&input);
            if let Ok(parsed) = Packet::parse(Bytes::from(input), version) {
                // A CONNECT carries its own version.
                let version = match &parsed {
                    Packet::Connect(c) => c.protocol,
                    _ => version,
                };
                round_trip(&parsed, version)?;
            }
        }
    }
}
