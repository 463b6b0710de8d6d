//! What a gateway says about a record it forwards: its target, request id, device, backhaul
//! path and class. One representation (smoltcp's `Repr`) with a parse and an emit for each of
//! the two ways a record travels to the server: the headers of a single request, and an entry of
//! a batch ([`crate::batch::Entry`]). The gateway emits it, the server parses it; each field is
//! checked by the same parser ([`crate::protocol`]) whichever way it came.

use crate::batch::Entry;
use crate::protocol::{
    self as wire, ProtocolError, DEVICE_HEADER, PATH_HEADER, PRIORITY_HEADER, REQUEST_ID_HEADER,
};
use crate::scheduler::Priority;

/// A forwarded record's facts, over any string storage: `&str` when parsed from a request,
/// `Arc<str>` where the gateway keeps it for several attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forwarded<S> {
    /// The path (and query) the device asked for, e.g. `/ingest/sensor`.
    pub target: S,
    /// The id the server de-duplicates it by.
    pub request_id: Option<S>,
    /// The device it came from, as the gateway knows it.
    pub device: Option<S>,
    /// The backhaul path that carried it.
    pub path: Option<usize>,
    /// Its class, as the gateway admitted it.
    pub class: Option<Priority>,
}

impl<'a> Forwarded<&'a str> {
    /// From a request's target and headers (`header` gives a header's value). A value present
    /// but malformed is an error, never ignored: a request id dropped would store a retried
    /// copy twice (decision S7).
    pub fn parse_headers(
        target: &'a str,
        header: impl Fn(&str) -> Option<&'a [u8]>,
    ) -> Result<Self, ProtocolError> {
        Ok(Forwarded {
            target,
            request_id: header(REQUEST_ID_HEADER)
                .map(wire::parse_request_id)
                .transpose()?,
            device: header(DEVICE_HEADER).map(wire::parse_device).transpose()?,
            path: header(PATH_HEADER).map(wire::parse_path).transpose()?,
            class: header(PRIORITY_HEADER)
                .map(|v| wire::parse_priority(Some(v)))
                .transpose()?,
        })
    }

    /// From a batch entry, with the checks its headers would get.
    pub fn parse_entry(e: &Entry<'a>) -> Result<Self, ProtocolError> {
        let path = match e.path.map(usize::from) {
            Some(p) if p >= wire::MAX_PATHS => return Err(ProtocolError::Path),
            p => p,
        };
        Ok(Forwarded {
            target: std::str::from_utf8(e.target).map_err(|_| ProtocolError::Target)?,
            request_id: e.request_id.map(wire::parse_request_id).transpose()?,
            device: e.device.map(wire::parse_device).transpose()?,
            path,
            class: e
                .class
                .map(|c| wire::parse_priority(Some(&[c])))
                .transpose()?,
        })
    }
}

impl<S: AsRef<str>> Forwarded<S> {
    /// Its headers on a single request, each handed to `put` as name and value.
    pub fn emit_headers(&self, mut put: impl FnMut(&'static str, &str)) {
        if let Some(r) = &self.request_id {
            put(REQUEST_ID_HEADER, r.as_ref());
        }
        if let Some(d) = &self.device {
            put(DEVICE_HEADER, d.as_ref());
        }
        if let Some(p) = self.path {
            put(PATH_HEADER, &p.to_string());
        }
        if let Some(c) = self.class {
            put(PRIORITY_HEADER, wire::emit_priority(c));
        }
    }

    /// Append it with `body` as an entry to a batch begun with [`crate::batch::start_entries`].
    /// The gateway's fields are checked before (at most 64 bytes, a path below 1 024).
    pub fn emit_entry(&self, body: &[u8], out: &mut Vec<u8>) {
        let class = self.class.map(|c| wire::emit_priority(c).as_bytes()[0]);
        crate::batch::emit_entry(
            out,
            &Entry {
                target: self.target.as_ref().as_bytes(),
                request_id: self.request_id.as_ref().map(|r| r.as_ref().as_bytes()),
                device: self.device.as_ref().map(|d| d.as_ref().as_bytes()),
                path: self
                    .path
                    .map(|p| u16::try_from(p).expect("a path below 1024")),
                class,
                body,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn headers(f: &Forwarded<&str>) -> HashMap<&'static str, String> {
        let mut h = HashMap::new();
        f.emit_headers(|k, v| {
            assert!(h.insert(k, v.to_string()).is_none(), "{k} twice");
        });
        h
    }

    fn through_headers<'a>(
        target: &'a str,
        h: &'a HashMap<&'static str, String>,
    ) -> Result<Forwarded<&'a str>, ProtocolError> {
        Forwarded::parse_headers(target, |n| h.get(n).map(|v| v.as_bytes()))
    }

    fn through_entry(f: &Forwarded<&str>) -> Vec<u8> {
        let mut out = Vec::new();
        batch::start_entries(&mut out);
        f.emit_entry(b"body", &mut out);
        out
    }

    #[test]
    fn a_record_round_trips_both_ways() {
        let full = Forwarded {
            target: "/ingest/temp",
            request_id: Some("gw1-17"),
            device: Some("10.0.0.9:4000"),
            path: Some(3),
            class: Some(Priority::Priority),
        };
        let bare = Forwarded {
            target: "/ingest",
            request_id: None,
            device: None,
            path: None,
            class: None,
        };
        for f in [full, bare] {
            let h = headers(&f);
            assert_eq!(through_headers(f.target, &h), Ok(f.clone()));
            let body = through_entry(&f);
            let es = batch::parse_entries(&body).unwrap();
            assert_eq!(es.len(), 1);
            assert_eq!(es[0].body, b"body");
            assert_eq!(Forwarded::parse_entry(&es[0]), Ok(f.clone()));
        }
        assert_eq!(
            headers(&Forwarded {
                target: "/x",
                request_id: Some("r"),
                device: Some("d"),
                path: Some(0),
                class: Some(Priority::BestEffort),
            })
            .len(),
            4
        );
    }

    #[test]
    fn malformed_fields_are_refused_the_same_either_way() {
        let cases: [(&str, &[u8], ProtocolError); 4] = [
            (REQUEST_ID_HEADER, b"a b", ProtocolError::RequestId),
            (DEVICE_HEADER, b"", ProtocolError::Device),
            (PATH_HEADER, b"1024", ProtocolError::Path),
            (PRIORITY_HEADER, b"2", ProtocolError::Priority),
        ];
        for (name, value, err) in cases {
            let got = Forwarded::parse_headers("/ingest/a", |n| (n == name).then_some(value));
            assert_eq!(got, Err(err.clone()), "{name}");
            let mut e = Entry {
                target: b"/ingest/a",
                request_id: None,
                device: None,
                path: None,
                class: None,
                body: b"",
            };
            match name {
                REQUEST_ID_HEADER => e.request_id = Some(value),
                DEVICE_HEADER => e.device = Some(value),
                PATH_HEADER => e.path = Some(1024),
                _ => e.class = Some(value[0]),
            }
            assert_eq!(Forwarded::parse_entry(&e), Err(err), "{name}");
        }
        let e = Entry {
            target: b"/ingest/\xff",
            request_id: None,
            device: None,
            path: None,
            class: None,
            body: b"",
        };
        assert_eq!(Forwarded::parse_entry(&e), Err(ProtocolError::Target));
    }

    proptest! {
        #[test]
        fn any_entry_parses_or_fails_cleanly_and_what_parses_emits_the_same(
            target in proptest::collection::vec(any::<u8>(), 1..40),
            rid in proptest::option::of(proptest::collection::vec(any::<u8>(), 1..70)),
            dev in proptest::option::of(proptest::collection::vec(any::<u8>(), 1..70)),
            path in proptest::option::of(0u16..2000),
            class in proptest::option::of(any::<u8>()),
        ) {
            let e = Entry {
                target: &target,
                request_id: rid.as_deref(),
                device: dev.as_deref(),
                path,
                class,
                body: b"body",
            };
            if let Ok(f) = Forwarded::parse_entry(&e) {
                let body = through_entry(&f);
                let again = batch::parse_entries(&body).unwrap();
                prop_assert_eq!(&again[0], &e);
                let h = headers(&f);
                prop_assert_eq!(through_headers(f.target, &h), Ok(f.clone()));
            }
        }
    }
}
