//! The device ↔ gateway ↔ server protocol values (qgate_forward::protocol and Hash IDs) on
//! arbitrary header and body bytes: parsing never panics, and what parses round-trips.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qgate_forward::protocol::{self, Registered};
use qgate_forward::session::HashId;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = Registered::parse(data) {
        assert_eq!(Registered::parse(r.to_string().as_bytes()), Ok(r));
    }
    if let Ok(id) = protocol::parse_request_id(data) {
        assert_eq!(id.as_bytes(), data);
    }
    if let Ok(p) = protocol::parse_path(data) {
        assert_eq!(protocol::parse_path(p.to_string().as_bytes()), Ok(p));
    }
    if let Ok(p) = protocol::parse_priority(Some(data)) {
        assert_eq!(protocol::emit_priority(p).as_bytes(), data);
    }
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(h) = s.parse::<HashId>() {
            assert_eq!(h.to_string(), s.to_ascii_lowercase());
        }
    }
});
