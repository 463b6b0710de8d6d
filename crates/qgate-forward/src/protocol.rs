//! The device ↔ gateway ↔ server protocol on top of HTTP/3: the header names and the values
//! they carry, each with a parse of untrusted bytes and an emit (smoltcp `Repr` style), so the
//! gateway, the device library and the server read and write them in one place.

use std::fmt;

use crate::scheduler::Priority;
use crate::session::HashId;

/// A device's Hash ID on every data request (paper 000 Fig. 2 step 10).
pub const HASH_ID_HEADER: &str = "qgate-hash-id";
/// The class asked for at registration: `0` best effort, `1` priority. On a forwarded record,
/// the class the gateway admitted it in.
pub const PRIORITY_HEADER: &str = "qgate-priority";
/// The gateway's id for a forwarded request; the server stores each id once (decision G5).
/// A device may send its own ([`parse_device_request_id`]): the gateway then forwards that one,
/// so a request the device sends again (or an attacker replays in 0-RTT) is stored once
/// (decision G18).
pub const REQUEST_ID_HEADER: &str = "qgate-request-id";
/// The backhaul path the gateway used: on its answer to the device, and on the forwarded
/// request (the server passes it on with the body).
pub const PATH_HEADER: &str = "qgate-path";
/// The device a forwarded request came from, as the gateway saw it (its address); the server
/// passes it on with the body.
pub const DEVICE_HEADER: &str = "qgate-device";
/// On a gateway's answer: `1` when the record was kept in the gateway's spool, to be sent on
/// when a backhaul path can take it (issue 50). The gateway then owns the record.
pub const SPOOLED_HEADER: &str = "qgate-spooled";
/// Longest request id accepted.
pub const MAX_REQUEST_ID: usize = 64;
/// Paths are numbered below this.
pub const MAX_PATHS: usize = 1024;

/// Why a protocol value was refused; the text says what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The priority header is not `0` or `1`.
    #[error("{PRIORITY_HEADER} must be 0 or 1")]
    Priority,
    /// The registration answer is not `{"hash_id":"<32 hex digits>"}`.
    #[error("the registration answer is not {{\"hash_id\":\"<32 hex digits>\"}}: '{0}'")]
    Registration(String),
    /// A request id that is empty, too long or not visible ASCII.
    #[error("{REQUEST_ID_HEADER} must be 1 to {MAX_REQUEST_ID} visible ASCII characters")]
    RequestId,
    /// A device's request id that is not 32 hex digits.
    #[error("a device's {REQUEST_ID_HEADER} must be 32 hex digits (128 random bits per record)")]
    DeviceRequestId,
    /// A device header that is not 1-64 visible ASCII characters.
    #[error("{DEVICE_HEADER} must be 1 to {MAX_REQUEST_ID} visible ASCII characters")]
    Device,
    /// A path header that is not a small decimal number.
    #[error("{PATH_HEADER} must be a path number below {MAX_PATHS}")]
    Path,
    /// A target that is not UTF-8.
    #[error("the target must be UTF-8")]
    Target,
    /// An ingest target whose stream name is not allowed.
    #[error("stream name must be 1-64 characters of A-Z a-z 0-9 . _ - and not start with '.'")]
    Stream,
}

/// The priority header's value (absent means best effort).
pub fn parse_priority(v: Option<&[u8]>) -> Result<Priority, ProtocolError> {
    match v {
        Some(b"1") => Ok(Priority::Priority),
        Some(b"0") | None => Ok(Priority::BestEffort),
        Some(_) => Err(ProtocolError::Priority),
    }
}

/// The priority header's value for `p`.
pub fn emit_priority(p: Priority) -> &'static str {
    match p {
        Priority::Priority => "1",
        Priority::BestEffort => "0",
    }
}

/// The gateway's answer to a registration: the Hash ID it issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registered {
    /// The device's Hash ID.
    pub hash: HashId,
}

impl fmt::Display for Registered {
    /// The body: `{"hash_id":"<32 hex digits>"}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{\"hash_id\":\"{}\"}}", self.hash)
    }
}

impl Registered {
    /// Parse an answer body; whitespace around the tokens is allowed, nothing else.
    pub fn parse(body: &[u8]) -> Result<Registered, ProtocolError> {
        let bad = || {
            ProtocolError::Registration(String::from_utf8_lossy(&body[..body.len().min(80)]).into())
        };
        let text = std::str::from_utf8(body).map_err(|_| bad())?;
        let compact: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        let hex = compact
            .strip_prefix("{\"hash_id\":\"")
            .and_then(|r| r.strip_suffix("\"}"))
            .ok_or_else(bad)?;
        let hash = hex.parse().map_err(|_| bad())?;
        Ok(Registered { hash })
    }
}

/// A request id header's value.
pub fn parse_request_id(v: &[u8]) -> Result<&str, ProtocolError> {
    if v.is_empty() || v.len() > MAX_REQUEST_ID || !v.iter().all(|b| b.is_ascii_graphic()) {
        return Err(ProtocolError::RequestId);
    }
    std::str::from_utf8(v).map_err(|_| ProtocolError::RequestId)
}

/// A device's request id: 32 hex digits, lowercased. Devices draw each record's id at random
/// (128 bits), so ids neither collide (the server would take a record for a copy) nor can be
/// guessed from one seen.
pub fn parse_device_request_id(v: &[u8]) -> Result<String, ProtocolError> {
    if v.len() != 32 || !v.iter().all(u8::is_ascii_hexdigit) {
        return Err(ProtocolError::DeviceRequestId);
    }
    Ok(String::from_utf8_lossy(v).to_ascii_lowercase())
}

/// A device's request id from 128 random bits.
pub fn emit_device_request_id(bits: u128) -> String {
    format!("{bits:032x}")
}

/// The id the gateway forwards a request under when its device named it: the device's, marked
/// so that it can never equal one of the gateway's own (`<instance>-<n>`).
pub fn forwarded_device_request_id(device: &str) -> String {
    format!("d-{device}")
}

/// A device header's value: 1 to [`MAX_REQUEST_ID`] visible ASCII characters.
pub fn parse_device(v: &[u8]) -> Result<&str, ProtocolError> {
    parse_request_id(v).map_err(|_| ProtocolError::Device)
}

/// The route of records: `/ingest` and everything under it.
pub const INGEST_PATH: &str = "/ingest";

/// Whether a request is an ingest record: a `POST` to [`INGEST_PATH`] or below. The one test
/// of it, for the gateway (0-RTT, batches) and the server alike.
pub fn is_record(method: &str, path: &str) -> bool {
    method == "POST" && path.starts_with(INGEST_PATH)
}

/// An ingest path's stream (`/ingest` → `default`, `/ingest/<name>` → `<name>`), `None` for a
/// path that is not under [`INGEST_PATH`]. Names are `[A-Za-z0-9._-]{1,64}`, not starting with
/// `.`, so a sink can use them as file names.
pub fn ingest_stream(path: &str) -> Option<Result<&str, ProtocolError>> {
    let rest = path.strip_prefix(INGEST_PATH)?;
    let name = match rest {
        "" | "/" => "default",
        r => match r.strip_prefix('/') {
            Some(n) => n,
            None => return Some(Err(ProtocolError::Stream)),
        },
    };
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    Some(if ok {
        Ok(name)
    } else {
        Err(ProtocolError::Stream)
    })
}

/// A path header's value.
pub fn parse_path(v: &[u8]) -> Result<usize, ProtocolError> {
    if v.is_empty() || v.len() > 4 || !v.iter().all(u8::is_ascii_digit) {
        return Err(ProtocolError::Path);
    }
    let n: usize = std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(ProtocolError::Path)?;
    if n < MAX_PATHS {
        Ok(n)
    } else {
        Err(ProtocolError::Path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn device_request_ids() {
        let id = emit_device_request_id(0xdead_beef << 64 | 7);
        assert_eq!(id.len(), 32);
        assert_eq!(parse_device_request_id(id.as_bytes()).unwrap(), id);
        assert_eq!(
            parse_device_request_id(id.to_uppercase().as_bytes()).unwrap(),
            id
        );
        for bad in [
            "",
            "abc",
            &id[1..],
            &format!("{id}0"),
            &id.replace('d', "g"),
        ] {
            assert_eq!(
                parse_device_request_id(bad.as_bytes()),
                Err(ProtocolError::DeviceRequestId),
                "{bad}"
            );
        }
        let fwd = forwarded_device_request_id(&id);
        assert!(parse_request_id(fwd.as_bytes()).is_ok() && !fwd.contains(char::is_whitespace));
    }

    #[test]
    fn priorities() {
        assert_eq!(parse_priority(None), Ok(Priority::BestEffort));
        for p in [Priority::Priority, Priority::BestEffort] {
            assert_eq!(parse_priority(Some(emit_priority(p).as_bytes())), Ok(p));
        }
        for bad in [&b"2"[..], b"", b"01", b"yes"] {
            assert_eq!(parse_priority(Some(bad)), Err(ProtocolError::Priority));
        }
    }

    #[test]
    fn registration_answers() {
        let r = Registered {
            hash: HashId([0xab; 16]),
        };
        let body = r.to_string();
        assert_eq!(body, format!("{{\"hash_id\":\"{}\"}}", "ab".repeat(16)));
        assert_eq!(Registered::parse(body.as_bytes()), Ok(r));
        let spaced = format!("{{ \"hash_id\" : \"{}\" }}\n", "ab".repeat(16));
        assert_eq!(Registered::parse(spaced.as_bytes()), Ok(r));
        for bad in [
            "".to_string(),
            "{}".into(),
            format!("{{\"hash_id\":\"{}\"}}", "ab".repeat(15)),
            format!("{{\"hash\":\"{}\"}}", "ab".repeat(16)),
            format!("{{\"hash_id\":\"{}\",\"x\":1}}", "ab".repeat(16)),
        ] {
            assert!(Registered::parse(bad.as_bytes()).is_err(), "{bad}");
        }
        assert!(Registered::parse(&[0xff, 0xfe]).is_err());
    }

    #[test]
    fn request_ids_and_paths() {
        assert_eq!(parse_request_id(b"0123abcd-17"), Ok("0123abcd-17"));
        for bad in [&b""[..], b"a b", &[b'x'; 65], b"\xc3\xa9"] {
            assert_eq!(parse_request_id(bad), Err(ProtocolError::RequestId));
        }
        assert_eq!(parse_path(b"0"), Ok(0));
        assert_eq!(parse_path(b"1023"), Ok(1023));
        for bad in [&b""[..], b"1024", b"-1", b"99999", b"1.0"] {
            assert_eq!(parse_path(bad), Err(ProtocolError::Path));
        }
    }

    #[test]
    fn ingest_streams() {
        assert_eq!(ingest_stream("/ingest"), Some(Ok("default")));
        assert_eq!(ingest_stream("/ingest/"), Some(Ok("default")));
        assert_eq!(ingest_stream("/ingest/a.b_c-9"), Some(Ok("a.b_c-9")));
        assert_eq!(ingest_stream("/health"), None);
        for bad in ["/ingestx", "/ingest/.hidden", "/ingest/a/b", "/ingest/a b"] {
            assert_eq!(
                ingest_stream(bad),
                Some(Err(ProtocolError::Stream)),
                "{bad}"
            );
        }
        let long = format!("/ingest/{}", "a".repeat(65));
        assert_eq!(ingest_stream(&long), Some(Err(ProtocolError::Stream)));
        assert!(is_record("POST", "/ingest/a") && is_record("POST", "/ingest"));
        assert!(!is_record("GET", "/ingest/a") && !is_record("POST", "/batch"));
    }

    proptest! {
        #[test]
        fn any_bytes_parse_or_fail_cleanly_and_values_round_trip(b in proptest::collection::vec(any::<u8>(), 0..100)) {
            if let Ok(r) = Registered::parse(&b) {
                prop_assert_eq!(Registered::parse(r.to_string().as_bytes()), Ok(r));
            }
            if let Ok(id) = parse_request_id(&b) {
                prop_assert_eq!(id.as_bytes(), &b[..]);
            }
            prop_assert_eq!(parse_device(&b).ok(), parse_request_id(&b).ok());
            if let Ok(p) = parse_path(&b) {
                prop_assert_eq!(parse_path(p.to_string().as_bytes()), Ok(p));
            }
            let _ = parse_priority(Some(&b));
        }
    }
}
