//! A wire view of AMQP 1.0 encoded values (§1.6, the type system): walks a byte string and checks
//! that every length and count fits inside its container, without decoding or allocating.
//!
//! serde_amqp (under fe2o3-amqp) allocates a variable-width value's declared length before it
//! checks that the bytes are there, so a 20-byte frame declaring a 3 GB string makes it try to
//! allocate 3 GB (found by our fuzz target). The broker's shim runs every inbound frame through
//! [`check`] first; only frames that pass reach the decoder.

/// Why bytes are not well-formed AMQP values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed AMQP encoding at byte {at}: {what}")]
pub struct Malformed {
    /// Offset of the problem.
    pub at: usize,
    /// What is wrong.
    pub what: &'static str,
}

/// Deepest nesting accepted (described types, lists, maps, arrays).
const MAX_DEPTH: usize = 32;

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn fail<T>(&self, what: &'static str) -> Result<T, Malformed> {
        Err(Malformed { at: self.at, what })
    }

    fn take(&mut self, n: usize) -> Result<&[u8], Malformed> {
        if self.b.len() - self.at < n {
            return self.fail("length runs past the end");
        }
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn u8(&mut self) -> Result<usize, Malformed> {
        Ok(self.take(1)?[0] as usize)
    }

    fn u32(&mut self) -> Result<usize, Malformed> {
        let s = self.take(4)?;
        Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]]) as usize)
    }

    /// A compound or array header (size, then count, 1 or 4 bytes each): the count, where the
    /// value ends, and a cursor over its contents bounded by the size.
    fn sized(&mut self, wide: bool) -> Result<(usize, usize, Cursor<'_>), Malformed> {
        let size = if wide { self.u32()? } else { self.u8()? };
        let start = self.at;
        if self.b.len() - self.at < size {
            return self.fail("size runs past the end");
        }
        let count = if wide { self.u32()? } else { self.u8()? };
        let end = start + size;
        if self.at > end {
            return self.fail("size smaller than its count field");
        }
        let inner = Cursor {
            b: &self.b[..end],
            at: self.at,
        };
        Ok((count, end, inner))
    }

    /// One value: constructor, then its body.
    fn value(&mut self, depth: usize) -> Result<(), Malformed> {
        let ctor = self.constructor(depth)?;
        self.body(ctor, depth)
    }

    /// A constructor; a described one's descriptor is checked here. Returns the format code.
    fn constructor(&mut self, depth: usize) -> Result<u8, Malformed> {
        if depth > MAX_DEPTH {
            return self.fail("nested too deep");
        }
        let code = self.u8()? as u8;
        if code == 0x00 {
            self.value(depth + 1)?; // the descriptor
            return self.constructor(depth + 1);
        }
        Ok(code)
    }

    /// The body of a value whose format code is `code`.
    fn body(&mut self, code: u8, depth: usize) -> Result<(), Malformed> {
        let fixed = match code {
            0x40..=0x45 => Some(0),
            0x50..=0x56 => Some(1),
            0x60 | 0x61 => Some(2),
            0x70..=0x74 => Some(4),
            0x80..=0x84 => Some(8),
            0x94 | 0x98 => Some(16),
            _ => None,
        };
        if let Some(n) = fixed {
            return self.take(n).map(|_| ());
        }
        match code {
            0xa0 | 0xa1 | 0xa3 => {
                let n = self.u8()?;
                self.take(n).map(|_| ())
            }
            0xb0 | 0xb1 | 0xb3 => {
                let n = self.u32()?;
                self.take(n).map(|_| ())
            }
            0xc0 | 0xc1 | 0xd0 | 0xd1 => {
                let (count, end, mut inner) = self.sized(code >= 0xd0)?;
                for _ in 0..count {
                    inner.value(depth + 1)?;
                }
                if inner.at != end {
                    return inner.fail("compound size does not match its elements");
                }
                self.at = end;
                Ok(())
            }
            0xe0 | 0xf0 => {
                let (count, end, mut inner) = self.sized(code == 0xf0)?;
                let element = inner.constructor(depth + 1)?;
                // No more elements than bytes, even of zero-width types: a decoder would loop
                // over every one of them.
                if count > end - inner.at {
                    return inner.fail("array count larger than its bytes");
                }
                for _ in 0..count {
                    inner.body(element, depth + 1)?;
                }
                if inner.at != end {
                    return inner.fail("array size does not match its elements");
                }
                self.at = end;
                Ok(())
            }
            _ => self.fail("unknown format code"),
        }
    }
}

/// One frame (AMQP 1.0 §2.3.1): size, data offset 2, `kind` (0 AMQP, 1 SASL), `channel`, the
/// encoded `body`, then `payload` (a transfer's message bytes).
pub fn frame(kind: u8, channel: u16, body: &[u8], payload: &[u8]) -> Vec<u8> {
    let size = 8 + body.len() + payload.len();
    let mut f = Vec::with_capacity(size);
    f.extend_from_slice(&(size as u32).to_be_bytes());
    f.extend_from_slice(&[2, kind]);
    f.extend_from_slice(&channel.to_be_bytes());
    f.extend_from_slice(body);
    f.extend_from_slice(payload);
    f
}

/// An Open performative (AMQP 1.0 §2.7.1) from `container_id` offering `max_frame_size`, every
/// other field at its default.
pub fn open(
    container_id: &str,
    max_frame_size: u32,
) -> fe2o3_amqp::types::performatives::Performative {
    use fe2o3_amqp::types::performatives::{MaxFrameSize, Open, Performative};
    Performative::Open(Open {
        container_id: container_id.into(),
        hostname: None,
        max_frame_size: MaxFrameSize(max_frame_size),
        channel_max: Default::default(),
        idle_time_out: None,
        outgoing_locales: None,
        incoming_locales: None,
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    })
}

/// An AMQP frame on channel 0 carrying `perf`, then `payload`.
pub fn amqp_frame(
    perf: &fe2o3_amqp::types::performatives::Performative,
    payload: &[u8],
) -> Vec<u8> {
    frame(
        0,
        0,
        &serde_amqp::to_vec(perf).expect("performatives encode"),
        payload,
    )
}

/// Check a sequence of encoded values filling `bytes` exactly.
pub fn check(bytes: &[u8]) -> Result<(), Malformed> {
    let mut c = Cursor { b: bytes, at: 0 };
    while c.at < bytes.len() {
        c.value(0)?;
    }
    Ok(())
}

/// Check the first encoded value of `bytes` (a performative); returns its length.
pub fn check_first(bytes: &[u8]) -> Result<usize, Malformed> {
    let mut c = Cursor { b: bytes, at: 0 };
    c.value(0)?;
    Ok(c.at)
}

/// The encoded bytes of field `index` of a described list (a performative) already checked by
/// [`check_first`]; None if the list is shorter (the field takes its default).
pub fn list_field(perf: &[u8], index: usize) -> Option<&[u8]> {
    let mut c = Cursor { b: perf, at: 0 };
    if c.u8().ok()? != 0 {
        return None;
    }
    c.value(1).ok()?; // descriptor
    let count = match c.u8().ok()? as u8 {
        0x45 => return None,
        0xc0 => {
            c.u8().ok()?;
            c.u8().ok()?
        }
        0xd0 => {
            c.u32().ok()?;
            c.u32().ok()?
        }
        _ => return None,
    };
    if index >= count {
        return None;
    }
    for _ in 0..index {
        c.value(1).ok()?;
    }
    let start = c.at;
    c.value(1).ok()?;
    Some(&perf[start..c.at])
}

#[cfg(test)]
mod tests {
    use super::*;
    use fe2o3_amqp::types::messaging::message::__private::Serializable;

    #[test]
    fn real_encodings_pass_and_lies_are_caught() {
        let msg = crate::client::message(3, b"payload".to_vec());
        // The broker's stored form (`broker::encode`), spelled out: importing the broker here
        // would close a ring through the shim, which imports this module.
        let bytes = serde_amqp::to_vec(&Serializable(&msg)).unwrap();
        check(&bytes).unwrap();
        assert_eq!(check_first(&bytes).map(|n| n <= bytes.len()), Ok(true));
        // A 3 GB string in 7 bytes.
        assert!(check(&[0xb1, 0xb1, 0xb1, 0xb1, 0xb1, 0x41, 0x41]).is_err());
        // A list whose count is larger than its bytes.
        assert!(check(&[0xc0, 0x01, 0xff]).is_err());
        // Arrays: strings that do not fit, or 2^32-1 nulls declared in a few bytes.
        assert!(check(&[0xe0, 0x03, 0x05, 0xa1, 0x01, 0x41]).is_err());
        assert!(check(&[0xf0, 0, 0, 0, 5, 0xff, 0xff, 0xff, 0xff, 0x40]).is_err());
        assert!(check(&[0x00; 40]).is_err(), "descriptors nested forever");
        assert!(
            check(&[0xc0, 0x00, 0x41]).is_err(),
            "size 0 cannot hold the count"
        );
        assert!(check(&[0xd0, 0, 0, 0, 2, 0, 0, 0, 0]).is_err());
        assert!(check(&[0x99]).is_err(), "unknown code");
        check(&[0x40, 0x41, 0x52, 0x07, 0xa1, 0x02, b'h', b'i']).unwrap();
    }

    #[test]
    fn list_fields_of_a_real_transfer() {
        use fe2o3_amqp::types::performatives::{Performative, Transfer};
        for more in [false, true] {
            let t = Performative::Transfer(Transfer {
                handle: 3.into(),
                delivery_id: Some(9),
                delivery_tag: Some(vec![1u8, 2].into()),
                message_format: Some(0),
                settled: Some(false),
                more,
                rcv_settle_mode: None,
                state: None,
                resume: false,
                aborted: false,
                batchable: true,
            });
            let b = serde_amqp::to_vec(&t).unwrap();
            check(&b).unwrap();
            let f = list_field(&b, 5);
            assert_eq!(
                f.is_some_and(|v| v == [0x41] || v == [0x56, 0x01]),
                more,
                "{f:?}"
            );
            assert!(list_field(&b, 0).is_some());
        }
    }
}
