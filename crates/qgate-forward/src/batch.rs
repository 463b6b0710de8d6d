//! Several devices' ingest records in one gateway → server request, and the server's answer to
//! each (decision G23). Every forwarded record used to cost the gateway a whole HTTP/3
//! exchange on the backhaul; records ready for the same backhaul connection at once now share
//! one.
//!
//! A wire view in smoltcp's style: [`parse_entries`] / [`emit_entry`] for the request body and
//! [`parse_results`] / [`emit_result`] for the answer's. An entry carries what the headers of a
//! single forwarded request carry — its target (`/ingest/<name>`), request id, device, path and
//! class — as the same bytes; `crate::forwarded::Forwarded` reads and writes both, so the server
//! checks them with the same parsers.
//!
//! ```text
//! request body := "QGB2" entry*
//! entry        := u16 target length, target, u8 request id length, request id (0: none),
//!                 u8 device length, device (0: none), u16 path (0xffff: none),
//!                 u8 class (the class header's byte, `0` or `1`; 0x00: none),
//!                 u32 body length, body
//! answer body  := "QGA1" result*         (one per entry, in order)
//! result       := u16 status, u16 Retry-After seconds (0: none), u32 body length, body
//! ```
//! Integers are big-endian. A "QGB1" body (a gateway from before the class was carried) has the
//! same entries without the class byte, and is still taken.

use std::fmt;

/// The server's route for batches.
pub const BATCH_PATH: &str = "/batch";
/// Most entries in one batch; a longer one is refused whole.
pub const MAX_ENTRIES: usize = 256;
/// Longest target accepted.
pub const MAX_TARGET: usize = 1024;

const REQUEST_MAGIC: &[u8; 4] = b"QGB2";
/// Without the class byte.
const REQUEST_MAGIC_V1: &[u8; 4] = b"QGB1";
const ANSWER_MAGIC: &[u8; 4] = b"QGA1";
const NO_PATH: u16 = 0xffff;

/// One record of a batch, borrowed from the body it was parsed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    /// The path and query the device asked for, e.g. `/ingest/sensor`.
    pub target: &'a [u8],
    /// The request id header's value, if any.
    pub request_id: Option<&'a [u8]>,
    /// The device header's value, if any.
    pub device: Option<&'a [u8]>,
    /// The backhaul path that carried it, if known.
    pub path: Option<u16>,
    /// The class header's byte, if any.
    pub class: Option<u8>,
    /// The record.
    pub body: &'a [u8],
}

/// The server's answer to one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome<'a> {
    /// Its HTTP status.
    pub status: u16,
    /// Its `Retry-After` in seconds, if any.
    pub retry_after: Option<u16>,
    /// Its body.
    pub body: &'a [u8],
}

/// Why a batch or an answer does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// It does not start with the format's magic.
    #[error("not a qgate batch (it must start with {0:?})")]
    Magic(&'static str),
    /// It ends inside an entry or a result.
    #[error("truncated in entry {0}")]
    Truncated(usize),
    /// More entries than [`MAX_ENTRIES`].
    #[error("more than {MAX_ENTRIES} entries")]
    TooMany,
    /// A target that is empty or longer than [`MAX_TARGET`].
    #[error("entry {0}: the target must be 1 to {MAX_TARGET} bytes")]
    Target(usize),
    /// A zero or impossible status.
    #[error("result {0}: status {1} is not an HTTP status")]
    Status(usize, u16),
    /// An answer with a different number of results than entries sent.
    #[error("{got} results for {sent} entries")]
    Count {
        /// Results in the answer.
        got: usize,
        /// Entries sent.
        sent: usize,
    },
}

/// Start a request body.
pub fn start_entries(out: &mut Vec<u8>) {
    out.extend_from_slice(REQUEST_MAGIC);
}

/// Append `e` to a request body begun with [`start_entries`]. Fields longer than the format
/// holds are the caller's error (the gateway's headers are checked before: at most 64 bytes).
pub fn emit_entry(out: &mut Vec<u8>, e: &Entry<'_>) {
    let short = |n: usize| u8::try_from(n).expect("a field of at most 255 bytes");
    out.extend_from_slice(&u16::try_from(e.target.len()).expect("target").to_be_bytes());
    out.extend_from_slice(e.target);
    let rid = e.request_id.unwrap_or_default();
    out.push(short(rid.len()));
    out.extend_from_slice(rid);
    let dev = e.device.unwrap_or_default();
    out.push(short(dev.len()));
    out.extend_from_slice(dev);
    out.extend_from_slice(&e.path.unwrap_or(NO_PATH).to_be_bytes());
    out.push(e.class.unwrap_or(0));
    out.extend_from_slice(&u32::try_from(e.body.len()).expect("body").to_be_bytes());
    out.extend_from_slice(e.body);
}

/// The entries of a request body, all of them or an error (nothing of a bad batch is used).
pub fn parse_entries(body: &[u8]) -> Result<Vec<Entry<'_>>, BatchError> {
    let v1 = body.starts_with(REQUEST_MAGIC_V1);
    let magic = if v1 { REQUEST_MAGIC_V1 } else { REQUEST_MAGIC };
    let mut r = Reader::new(body, magic, "QGB2")?;
    let mut out = Vec::new();
    while !r.done() {
        let i = out.len();
        if i == MAX_ENTRIES {
            return Err(BatchError::TooMany);
        }
        let t = BatchError::Truncated(i);
        let n = r.u16().ok_or(t.clone())? as usize;
        if n == 0 || n > MAX_TARGET {
            return Err(BatchError::Target(i));
        }
        let target = r.take(n).ok_or(t.clone())?;
        let n = r.u8().ok_or(t.clone())? as usize;
        let request_id = r.take(n).ok_or(t.clone())?;
        let n = r.u8().ok_or(t.clone())? as usize;
        let device = r.take(n).ok_or(t.clone())?;
        let path = r.u16().ok_or(t.clone())?;
        let class = if v1 { 0 } else { r.u8().ok_or(t.clone())? };
        let n = r.u32().ok_or(t.clone())? as usize;
        let body = r.take(n).ok_or(t)?;
        out.push(Entry {
            target,
            request_id: (!request_id.is_empty()).then_some(request_id),
            device: (!device.is_empty()).then_some(device),
            path: (path != NO_PATH).then_some(path),
            class: (class != 0).then_some(class),
            body,
        });
    }
    Ok(out)
}

/// Start an answer body.
pub fn start_results(out: &mut Vec<u8>) {
    out.extend_from_slice(ANSWER_MAGIC);
}

/// Append `o` to an answer body begun with [`start_results`].
pub fn emit_result(out: &mut Vec<u8>, o: &Outcome<'_>) {
    out.extend_from_slice(&o.status.to_be_bytes());
    out.extend_from_slice(&o.retry_after.unwrap_or(0).to_be_bytes());
    out.extend_from_slice(&u32::try_from(o.body.len()).expect("body").to_be_bytes());
    out.extend_from_slice(o.body);
}

/// The results of an answer to a batch of `sent` entries: exactly one per entry.
pub fn parse_results(body: &[u8], sent: usize) -> Result<Vec<Outcome<'_>>, BatchError> {
    let mut r = Reader::new(body, ANSWER_MAGIC, "QGA1")?;
    let mut out = Vec::with_capacity(sent.min(MAX_ENTRIES));
    while !r.done() {
        let i = out.len();
        if i == sent {
            return Err(BatchError::Count { got: i + 1, sent });
        }
        let t = BatchError::Truncated(i);
        let status = r.u16().ok_or(t.clone())?;
        if !(100..=999).contains(&status) {
            return Err(BatchError::Status(i, status));
        }
        let retry = r.u16().ok_or(t.clone())?;
        let n = r.u32().ok_or(t.clone())? as usize;
        let body = r.take(n).ok_or(t)?;
        out.push(Outcome {
            status,
            retry_after: (retry != 0).then_some(retry),
            body,
        });
    }
    if out.len() != sent {
        return Err(BatchError::Count {
            got: out.len(),
            sent,
        });
    }
    Ok(out)
}

/// Reads the fields of a body front to back; `None` when a field runs past its end.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(body: &'a [u8], magic: &[u8; 4], name: &'static str) -> Result<Self, BatchError> {
        match body.strip_prefix(magic) {
            Some(rest) => Ok(Reader { rest }),
            None => Err(BatchError::Magic(name)),
        }
    }

    fn done(&self) -> bool {
        self.rest.is_empty()
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.rest.len() {
            return None;
        }
        let (a, b) = self.rest.split_at(n);
        self.rest = b;
        Some(a)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

impl fmt::Display for Entry<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({} bytes)",
            String::from_utf8_lossy(self.target),
            self.body.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries() -> Vec<Entry<'static>> {
        vec![
            Entry {
                target: b"/ingest/a",
                request_id: Some(b"gw-1"),
                device: Some(b"10.0.0.1:5000"),
                path: Some(2),
                class: Some(b'1'),
                body: b"hello",
            },
            Entry {
                target: b"/ingest",
                request_id: None,
                device: None,
                path: None,
                class: None,
                body: b"",
            },
            Entry {
                target: b"/ingest/b",
                request_id: Some(b"d-0123"),
                device: Some(b"x"),
                path: Some(0),
                class: Some(b'0'),
                body: &[7; 300],
            },
        ]
    }

    fn request(es: &[Entry<'_>]) -> Vec<u8> {
        let mut out = Vec::new();
        start_entries(&mut out);
        for e in es {
            emit_entry(&mut out, e);
        }
        out
    }

    #[test]
    fn entries_round_trip_and_every_truncation_is_refused() {
        let es = entries();
        let body = request(&es);
        assert_eq!(parse_entries(&body).unwrap(), es);
        assert_eq!(parse_entries(b"QGB2").unwrap(), vec![]);
        // Cut anywhere but at an entry's end, a batch is refused whole.
        let mut ends = vec![4];
        let mut at = 4;
        for e in &es {
            at += 2 + e.target.len() + 1 + e.request_id.map_or(0, <[u8]>::len);
            at += 1 + e.device.map_or(0, <[u8]>::len) + 2 + 1 + 4 + e.body.len();
            ends.push(at);
        }
        assert_eq!(at, body.len());
        for cut in 0..body.len() {
            let r = parse_entries(&body[..cut]);
            if ends.contains(&cut) {
                assert_eq!(
                    r.unwrap().len(),
                    ends.iter().position(|&e| e == cut).unwrap()
                );
            } else if cut < 4 {
                assert_eq!(r, Err(BatchError::Magic("QGB2")));
            } else {
                assert!(matches!(r, Err(BatchError::Truncated(_))), "{cut}: {r:?}");
            }
        }
    }

    #[test]
    fn a_batch_without_classes_is_still_taken() {
        // The first format: the same entries, no class byte.
        let mut b = b"QGB1".to_vec();
        b.extend_from_slice(&[0, 2, b'/', b'i', 1, b'r', 0, 0, 3, 0, 0, 0, 2, b'h', b'i']);
        let e = Entry {
            target: b"/i",
            request_id: Some(b"r"),
            device: None,
            path: Some(3),
            class: None,
            body: b"hi",
        };
        assert_eq!(parse_entries(&b).unwrap(), vec![e]);
        assert!(matches!(
            parse_entries(&b[..b.len() - 1]),
            Err(BatchError::Truncated(0))
        ));
    }

    #[test]
    fn bad_batches_are_refused_whole() {
        assert_eq!(parse_entries(b"QGA1"), Err(BatchError::Magic("QGB2")));
        // An empty target, and one longer than the limit.
        let mut b = b"QGB2".to_vec();
        b.extend_from_slice(&[0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 0, 0]);
        assert_eq!(parse_entries(&b), Err(BatchError::Target(0)));
        let long = vec![b'/'; MAX_TARGET + 1];
        let mut b = b"QGB2".to_vec();
        b.extend_from_slice(&u16::try_from(long.len()).unwrap().to_be_bytes());
        b.extend_from_slice(&long);
        assert_eq!(parse_entries(&b), Err(BatchError::Target(0)));
        // A body length past the end.
        let mut b = request(&entries()[..1]);
        let n = b.len();
        b[n - 9..n - 5].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(parse_entries(&b), Err(BatchError::Truncated(0)));
        // One entry more than allowed.
        let e = entries()[1];
        let many = request(&vec![e; MAX_ENTRIES]);
        assert_eq!(parse_entries(&many).unwrap().len(), MAX_ENTRIES);
        let more = request(&vec![e; MAX_ENTRIES + 1]);
        assert_eq!(parse_entries(&more), Err(BatchError::TooMany));
    }

    #[test]
    fn results_round_trip_and_must_match_the_entries_sent() {
        let os = [
            Outcome {
                status: 201,
                retry_after: None,
                body: b"{\"id\":1,\"bytes\":5}",
            },
            Outcome {
                status: 503,
                retry_after: Some(1),
                body: b"the queue is down\n",
            },
        ];
        let mut body = Vec::new();
        start_results(&mut body);
        for o in &os {
            emit_result(&mut body, o);
        }
        assert_eq!(parse_results(&body, 2).unwrap(), os);
        assert_eq!(
            parse_results(&body, 3),
            Err(BatchError::Count { got: 2, sent: 3 })
        );
        assert_eq!(
            parse_results(&body, 1),
            Err(BatchError::Count { got: 2, sent: 1 })
        );
        for cut in 5..body.len() {
            if cut != 4 + 8 + os[0].body.len() {
                assert!(parse_results(&body[..cut], 2).is_err(), "{cut}");
            }
        }
        let mut zero = b"QGA1".to_vec();
        zero.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(parse_results(&zero, 1), Err(BatchError::Status(0, 0)));
        assert_eq!(parse_results(b"QGB1", 0), Err(BatchError::Magic("QGA1")));
    }
}
