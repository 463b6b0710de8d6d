//! The path probe (paper 000 Fig. 2 steps 2–3: Path Request → ACK Response) on the wire: one
//! QUIC DATAGRAM frame each way, so a lost probe is not retransmitted and its RTT is the path's.
//!
//! Format (9 bytes): type (0x01 request, 0x02 response), then the sequence number, big-endian u64.

/// A probe message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeMsg {
    /// Path Request from the gateway.
    Request(u64),
    /// ACK Response from the server, echoing the request's sequence number.
    Response(u64),
}

/// Why bytes are not a probe.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// Not 9 bytes.
    #[error("probe datagram has {0} bytes, expected 9")]
    Length(usize),
    /// Unknown type byte.
    #[error("probe datagram has unknown type 0x{0:02x}")]
    Type(u8),
}

impl ProbeMsg {
    /// Encode.
    pub fn encode(self) -> [u8; 9] {
        let (t, seq) = match self {
            ProbeMsg::Request(s) => (0x01, s),
            ProbeMsg::Response(s) => (0x02, s),
        };
        let mut b = [0u8; 9];
        b[0] = t;
        b[1..].copy_from_slice(&seq.to_be_bytes());
        b
    }

    /// Decode, rejecting anything else.
    pub fn decode(b: &[u8]) -> Result<ProbeMsg, ProbeError> {
        if b.len() != 9 {
            return Err(ProbeError::Length(b.len()));
        }
        let seq = u64::from_be_bytes(b[1..].try_into().expect("8 bytes"));
        match b[0] {
            0x01 => Ok(ProbeMsg::Request(seq)),
            0x02 => Ok(ProbeMsg::Response(seq)),
            t => Err(ProbeError::Type(t)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn round_trip_and_errors() {
        for m in [
            ProbeMsg::Request(0),
            ProbeMsg::Response(u64::MAX),
            ProbeMsg::Request(42),
        ] {
            assert_eq!(ProbeMsg::decode(&m.encode()), Ok(m));
        }
        assert_eq!(ProbeMsg::decode(&[1, 2, 3]), Err(ProbeError::Length(3)));
        assert_eq!(ProbeMsg::decode(&[9; 9]), Err(ProbeError::Type(9)));
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..32)) {
            let _ = ProbeMsg::decode(&bytes);
        }
    }
}
