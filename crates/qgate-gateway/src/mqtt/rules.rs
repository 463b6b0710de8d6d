//! The MQTT door's decisions, without I/O: which stream a topic is, which class a message is,
//! which client ids are taken, the request id a message goes under, and what a refusal is
//! called in MQTT.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use http::StatusCode;
use qgate_forward::protocol::{self as wire, PRIORITY_HEADER};
use qgate_forward::scheduler::Priority;
use qgate_forward::session::{ConnId, SessionError};
use qgate_mqtt::{Message, ReasonCode};

use crate::gateway::Refusal;

/// Longest client identifier taken (visible ASCII): it must fit the logs and, later, the
/// device identity (issue 49).
pub const MAX_CLIENT_ID: usize = 64;

/// The stream a topic's messages go to: `/` becomes `.`, and the result must be a stream name
/// (`[A-Za-z0-9._-]{1,64}`, not starting with `.`); `None`: refused with 0x90 Topic Name
/// invalid. `sensors/room1/temp` → `sensors.room1.temp`.
pub fn stream_of(topic: &str) -> Option<String> {
    let s = topic.replace('/', ".");
    let target = format!("{}/{s}", wire::INGEST_PATH);
    matches!(wire::ingest_stream(&target), Some(Ok(_))).then_some(s)
}

/// A message's class: the user property `qgate-priority` (`1` priority, `0` best effort; any
/// other value is ignored), else priority when its topic matches one of `priority_topics`, else
/// best effort.
pub fn class_of(m: &Message, priority_topics: &[String]) -> Priority {
    let said = m
        .user_properties
        .iter()
        .rev()
        .find(|(k, _)| k == PRIORITY_HEADER)
        .and_then(|(_, v)| wire::parse_priority(Some(v.as_bytes())).ok());
    said.unwrap_or_else(|| {
        if priority_topics.iter().any(|f| matches_filter(f, &m.topic)) {
            Priority::Priority
        } else {
            Priority::BestEffort
        }
    })
}

/// Whether `topic` matches the topic filter `filter` (spec §4.7: `+` one level, `#` the rest,
/// its parent level included; wildcards at the first level do not match topics starting `$`).
pub fn matches_filter(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && filter.starts_with(['+', '#']) {
        return false;
    }
    let mut t = topic.split('/');
    for f in filter.split('/') {
        match (f, t.next()) {
            ("#", _) => return true,
            ("+", Some(_)) => {}
            (f, Some(level)) if f == level => {}
            _ => return false,
        }
    }
    t.next().is_none()
}

/// Whether a client identifier is taken as given: 1 to [`MAX_CLIENT_ID`] visible ASCII
/// characters (an empty one gets a name from the gateway).
pub fn valid_client_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_CLIENT_ID && id.bytes().all(|b| b.is_ascii_graphic())
}

/// What an MQTT 5.0 client hears for a record the pipeline did not take: in PUBACK or PUBREC
/// (3.1.1 has no word for it: its connection closes and it sends the message again).
pub fn reason_for(r: &Refusal) -> ReasonCode {
    if let Some(SessionError::InFlight(_)) = r.session {
        return ReasonCode::QuotaExceeded;
    }
    reason_for_status(r.status)
}

/// The PUBACK reason for an HTTP status from the server or the gateway.
pub fn reason_for_status(s: StatusCode) -> ReasonCode {
    match s {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => ReasonCode::NotAuthorized,
        StatusCode::PAYLOAD_TOO_LARGE
        | StatusCode::TOO_MANY_REQUESTS
        | StatusCode::SERVICE_UNAVAILABLE
        | StatusCode::INSUFFICIENT_STORAGE => ReasonCode::QuotaExceeded,
        StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY => {
            ReasonCode::PayloadFormatInvalid
        }
        _ => ReasonCode::UnspecifiedError,
    }
}

/// A client session's memory of the request ids it gave QoS 1/2 messages, by packet id, so a
/// copy sent again with DUP (on this connection or a later one) goes under its first copy's id
/// and the server stores it once. Holds the last [`Memory::CAP`] packet ids: a client resends
/// only messages it has not seen acknowledged, at most its receive maximum.
#[derive(Debug, Default)]
pub struct Memory {
    recent: VecDeque<(u16, u64)>,
}

impl Memory {
    /// Packet ids remembered.
    pub const CAP: usize = 256;

    /// The number a message with `packet_id` goes under: its earlier copy's if `dup` and one
    /// is remembered, else `fresh()`.
    pub fn number(&mut self, packet_id: u16, dup: bool, fresh: impl FnOnce() -> u64) -> u64 {
        if dup {
            if let Some(&(_, n)) = self.recent.iter().find(|(p, _)| *p == packet_id) {
                return n;
            }
        }
        let n = fresh();
        self.recent.retain(|(p, _)| *p != packet_id);
        if self.recent.len() >= Self::CAP {
            self.recent.pop_front();
        }
        self.recent.push_back((packet_id, n));
        n
    }
}

/// The request id of message number `n` at a door whose ids start with `salt`: `m-` and 32 hex
/// digits, never one of the gateway's own (`<instance>-<n>`) or a device's (`d-…`).
pub fn request_id(salt: u64, n: u64) -> String {
    format!("m-{salt:016x}{n:016x}")
}

/// One client id's entry: the connection holding it, if any, and its session's memory.
#[derive(Debug)]
struct Client {
    live: Option<(ConnId, Arc<tokio::sync::Notify>)>,
    memory: Arc<Mutex<Memory>>,
    /// Kept after its connection closes (3.1.1 without Clean Session, 5.0 with a session
    /// expiry).
    keep: bool,
    used: u64,
}

/// What [`Registry::connect`] gives a connection.
#[derive(Debug)]
pub struct Claimed {
    /// The session was there from before (and Clean Start was not asked).
    pub session_present: bool,
    pub memory: Arc<Mutex<Memory>>,
    /// Notified when a newer connection takes the client id over.
    pub taken_over: Arc<tokio::sync::Notify>,
    /// Whether an open connection had it (and is now told to close).
    pub took_over: bool,
}

/// Client ids → the connection holding each and its session, at most `max` of them (sessions
/// without a connection give way first, least recently used).
#[derive(Debug)]
pub struct Registry {
    max: usize,
    clients: HashMap<String, Client>,
    tick: u64,
}

impl Registry {
    pub fn new(max: usize) -> Registry {
        Registry {
            max: max.max(1),
            clients: HashMap::new(),
            tick: 0,
        }
    }

    /// Sessions held.
    pub fn len(&self) -> usize {
        self.clients.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }

    /// Connection `conn` claims `client_id` (MQTT's takeover rule: a connection already holding
    /// it is notified to close). `clean`: start a new session; `keep`: keep it after the
    /// connection closes. `None`: every entry belongs to an open connection.
    pub fn connect(
        &mut self,
        client_id: &str,
        conn: ConnId,
        clean: bool,
        keep: bool,
    ) -> Option<Claimed> {
        self.tick += 1;
        if !self.clients.contains_key(client_id) && self.clients.len() >= self.max {
            let idle = self
                .clients
                .iter()
                .filter(|(_, c)| c.live.is_none())
                .min_by_key(|(_, c)| c.used)
                .map(|(k, _)| k.clone())?;
            self.clients.remove(&idle);
        }
        let notify = Arc::new(tokio::sync::Notify::new());
        let tick = self.tick;
        let mut session_present = false;
        let mut took_over = false;
        let c = self
            .clients
            .entry(client_id.to_owned())
            .and_modify(|c| {
                if let Some((_, old)) = c.live.take() {
                    old.notify_one();
                    took_over = true;
                }
                if clean {
                    c.memory = Arc::default();
                } else {
                    session_present = true;
                }
            })
            .or_insert_with(|| Client {
                live: None,
                memory: Arc::default(),
                keep,
                used: tick,
            });
        c.live = Some((conn, notify.clone()));
        c.keep = keep;
        c.used = tick;
        Some(Claimed {
            session_present,
            memory: c.memory.clone(),
            taken_over: notify,
            took_over,
        })
    }

    /// Connection `conn`, holding `client_id`, closed: its session stays if it is to be kept.
    pub fn disconnect(&mut self, client_id: &str, conn: ConnId) {
        let Some(c) = self.clients.get_mut(client_id) else {
            return;
        };
        if c.live.as_ref().is_some_and(|(id, _)| *id == conn) {
            c.live = None;
            if !c.keep {
                self.clients.remove(client_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use qgate_mqtt::QoS;

    fn msg(topic: &str, props: &[(&str, &str)]) -> Message {
        Message {
            packet_id: Some(1),
            qos: QoS::AtLeastOnce,
            dup: false,
            topic: topic.into(),
            payload: Bytes::new(),
            retain: false,
            payload_is_utf8: false,
            message_expiry: None,
            content_type: None,
            user_properties: props
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn topics_map_to_streams_or_are_refused() {
        assert_eq!(
            stream_of("sensors/room1/temp").unwrap(),
            "sensors.room1.temp"
        );
        assert_eq!(stream_of("a_b-c").unwrap(), "a_b-c");
        for bad in [
            "/leading",
            "with space",
            "ünï",
            "$SYS/x",
            &"a".repeat(65),
            ".",
        ] {
            assert_eq!(stream_of(bad), None, "{bad}");
        }
    }

    #[test]
    fn class_from_property_then_topic_filters() {
        let prio = vec!["alarms/#".to_string(), "+/urgent".to_string()];
        assert_eq!(class_of(&msg("alarms", &[]), &prio), Priority::Priority);
        assert_eq!(
            class_of(&msg("alarms/fire", &[]), &prio),
            Priority::Priority
        );
        assert_eq!(class_of(&msg("x/urgent", &[]), &prio), Priority::Priority);
        assert_eq!(
            class_of(&msg("x/y/urgent", &[]), &prio),
            Priority::BestEffort
        );
        assert_eq!(class_of(&msg("temp", &[]), &prio), Priority::BestEffort);
        let one = [("qgate-priority", "1")];
        assert_eq!(class_of(&msg("temp", &one), &prio), Priority::Priority);
        let zero = [("qgate-priority", "0")];
        assert_eq!(
            class_of(&msg("alarms/x", &zero), &prio),
            Priority::BestEffort
        );
        let junk = [("qgate-priority", "yes")];
        assert_eq!(class_of(&msg("temp", &junk), &prio), Priority::BestEffort);
        assert!(matches_filter("#", "a/b") && !matches_filter("#", "$SYS/a"));
        assert!(matches_filter("a/+/c", "a/b/c") && !matches_filter("a/+", "a/b/c"));
    }

    #[test]
    fn client_ids() {
        assert!(valid_client_id("sensor-1") && valid_client_id(&"x".repeat(64)));
        assert!(
            !valid_client_id("") && !valid_client_id("a b") && !valid_client_id(&"x".repeat(65))
        );
    }

    #[test]
    fn a_dup_copy_keeps_its_number_a_reused_packet_id_does_not() {
        let mut m = Memory::default();
        let mut next = 0u64;
        let mut fresh = || {
            next += 1;
            next
        };
        let a = m.number(7, false, &mut fresh);
        assert_eq!(m.number(7, true, &mut fresh), a);
        let b = m.number(7, false, &mut fresh);
        assert_ne!(a, b);
        assert_eq!(m.number(9, true, &mut fresh), 3, "unknown DUP: fresh");
        for p in 0..(Memory::CAP as u16 + 10) {
            m.number(1000 + p, false, &mut fresh);
        }
        assert!(m.recent.len() <= Memory::CAP);
        assert!(request_id(1, 2).len() <= wire::MAX_REQUEST_ID);
    }

    #[test]
    fn takeover_and_bounded_sessions() {
        let mut r = Registry::new(2);
        let a = r.connect("a", 1, true, false).unwrap();
        assert!(!a.session_present && !a.took_over);
        let a2 = r.connect("a", 2, false, true).unwrap();
        assert!(a2.took_over && a2.session_present);
        assert!(Arc::ptr_eq(&a.memory, &a2.memory));
        // The old connection's close does not free the new one's claim.
        r.disconnect("a", 1);
        r.connect("b", 3, true, false).unwrap();
        assert!(
            r.connect("c", 4, true, false).is_none(),
            "both held by open connections"
        );
        r.disconnect("a", 2);
        // "a" is kept (no connection): it gives way to "c".
        assert!(r.connect("c", 4, true, false).is_some());
        assert_eq!(r.len(), 2);
        r.disconnect("b", 3);
        assert_eq!(r.len(), 1, "a session not to keep ends with its connection");
    }
}
