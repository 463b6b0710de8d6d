//! The gateway's connection management table (paper 000 §3.3, Table 2): one entry per device,
//! found by its Hash ID, holding the device's and the server's addresses, its priority and the
//! backhaul path it uses.
//!
//! Hash IDs are 128 random bits from a ChaCha20 generator (a CSPRNG: the shell seeds it from the
//! operating system in deployment, from the scenario seed in simulation) and are bound to the
//! QUIC connection that registered, not to its address, so a device that migrates to another
//! network keeps its session (decision G10); a request carrying another connection's Hash ID
//! is refused.
//!
//! Every entry is bounded (decision G10): devices in all, sessions per connection and per source
//! IP address, requests in flight per session; a session idle for longer than
//! [`SessionLimits::idle`] with nothing in flight expires, and a closed connection takes its
//! sessions with it. The in-flight count lives in the session, so a made-up Hash ID costs nothing.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::time::{Duration, Instant};

use qgate_core::quota::client_key;
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

use crate::path::PathId;
use crate::scheduler::Priority;

/// A device's Hash ID: 128 unguessable bits, written as 32 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct HashId(pub [u8; 16]);

impl fmt::Display for HashId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for HashId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HashId({self})")
    }
}

impl FromStr for HashId {
    type Err = SessionError;

    fn from_str(s: &str) -> Result<HashId, SessionError> {
        let bad = || SessionError::Malformed(s.chars().take(40).collect());
        // Hex digits only: `from_str_radix` alone would take "+4" as a byte (found by the
        // `protocol` fuzz target).
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let mut out = [0u8; 16];
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(HashId(out))
    }
}

/// Who owns a session: the shell's identifier of the QUIC connection that registered it.
pub type ConnId = u64;

/// Why a session operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// The table is at its device limit.
    #[error("the gateway serves its maximum of {0} devices")]
    Full(usize),
    /// The connection already holds its maximum of sessions.
    #[error("this connection already holds its maximum of {0} registrations")]
    ConnectionLimit(usize),
    /// The source address already holds its maximum of sessions.
    #[error("this address (or its IPv6 /64) already holds its maximum of {0} registrations")]
    AddressLimit(usize),
    /// The session has its maximum of requests in flight.
    #[error("too many requests in flight for this device (at most {0})")]
    InFlight(usize),
    /// No session has this Hash ID (never registered, expired, or its connection closed).
    #[error("unknown Hash ID")]
    Unknown,
    /// The Hash ID belongs to another connection.
    #[error("this Hash ID was not issued to this connection")]
    Forged,
    /// Not 32 hex digits.
    #[error("malformed Hash ID '{0}': expected 32 hex digits")]
    Malformed(String),
}

/// The table's bounds (decision G10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    /// Most sessions in all.
    pub max_devices: usize,
    /// Most sessions registered by one connection.
    pub per_connection: usize,
    /// Most sessions registered from one client: a source IPv4 address, or IPv6 /64 (S10).
    pub per_address: usize,
    /// Most requests in flight per session.
    pub max_inflight: usize,
    /// A session with nothing in flight and no request for this long expires.
    pub idle: Duration,
}

impl SessionLimits {
    /// The defaults: 10 000 devices, 4 sessions per connection, 256 per address, 8 requests
    /// in flight per device (decision G7), 10 minutes idle.
    pub const DEFAULT: SessionLimits = SessionLimits {
        max_devices: 10_000,
        per_connection: 4,
        per_address: 256,
        max_inflight: 8,
        idle: Duration::from_secs(600),
    };
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits::DEFAULT
    }
}

/// One row of Table 2.
#[derive(Debug, Clone, PartialEq)]
pub struct Session {
    /// The device's Hash ID.
    pub hash: HashId,
    /// The connection that registered it.
    pub conn: ConnId,
    /// The address it registered from (its connection may have migrated since).
    pub device: SocketAddr,
    /// The server it talks to.
    pub server: SocketAddr,
    /// Its class.
    pub priority: Priority,
    /// Its backhaul path, once assigned.
    pub path: Option<PathId>,
    /// Last request seen (or registration).
    pub last_seen: Instant,
    /// Requests in flight.
    pub inflight: usize,
}

/// The connection management table.
pub struct SessionTable {
    by_hash: HashMap<HashId, Session>,
    per_conn: HashMap<ConnId, usize>,
    per_ip: HashMap<IpAddr, usize>,
    limits: SessionLimits,
    rng: ChaCha20Rng,
}

impl fmt::Debug for SessionTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionTable")
            .field("sessions", &self.by_hash.len())
            .field("limits", &self.limits)
            .finish()
    }
}

/// Add one to `key`'s count.
fn count_up<K: std::hash::Hash + Eq>(m: &mut HashMap<K, usize>, key: K) {
    *m.entry(key).or_insert(0) += 1;
}

/// Take one from `key`'s count; a count that reaches zero is removed (the maps hold only keys
/// that own sessions).
fn count_down<K: std::hash::Hash + Eq>(m: &mut HashMap<K, usize>, key: K) {
    if let std::collections::hash_map::Entry::Occupied(mut e) = m.entry(key) {
        *e.get_mut() -= 1;
        if *e.get() == 0 {
            e.remove();
        }
    }
}

impl SessionTable {
    /// A table bounded by `limits` whose Hash IDs come from `seed`.
    pub fn new(limits: SessionLimits, seed: [u8; 32]) -> SessionTable {
        SessionTable {
            by_hash: HashMap::new(),
            per_conn: HashMap::new(),
            per_ip: HashMap::new(),
            limits,
            rng: ChaCha20Rng::from_seed(seed),
        }
    }

    /// The table's bounds.
    pub fn limits(&self) -> &SessionLimits {
        &self.limits
    }

    /// Register a device on connection `conn` from `device` (Fig. 2 steps 4–6); returns its
    /// new Hash ID.
    pub fn register(
        &mut self,
        conn: ConnId,
        device: SocketAddr,
        server: SocketAddr,
        priority: Priority,
        now: Instant,
    ) -> Result<HashId, SessionError> {
        let l = self.limits;
        if self.by_hash.len() >= l.max_devices {
            return Err(SessionError::Full(l.max_devices));
        }
        if self.per_conn.get(&conn).copied().unwrap_or(0) >= l.per_connection {
            return Err(SessionError::ConnectionLimit(l.per_connection));
        }
        if self
            .per_ip
            .get(&client_key(device.ip()))
            .copied()
            .unwrap_or(0)
            >= l.per_address
        {
            return Err(SessionError::AddressLimit(l.per_address));
        }
        let hash = loop {
            let mut b = [0u8; 16];
            self.rng.fill_bytes(&mut b);
            let h = HashId(b);
            if !self.by_hash.contains_key(&h) {
                break h;
            }
        };
        count_up(&mut self.per_conn, conn);
        count_up(&mut self.per_ip, client_key(device.ip()));
        self.by_hash.insert(
            hash,
            Session {
                hash,
                conn,
                device,
                server,
                priority,
                path: None,
                last_seen: now,
                inflight: 0,
            },
        );
        Ok(hash)
    }

    /// The session for a request carrying `hash` on connection `conn` (Fig. 2 step 10);
    /// refreshes it.
    pub fn lookup(
        &mut self,
        hash: &HashId,
        conn: ConnId,
        now: Instant,
    ) -> Result<&mut Session, SessionError> {
        let s = self.by_hash.get_mut(hash).ok_or(SessionError::Unknown)?;
        if s.conn != conn {
            return Err(SessionError::Forged);
        }
        s.last_seen = now;
        Ok(s)
    }

    /// A request carrying `hash` on `conn` starts: [`lookup`](Self::lookup), and one more in
    /// flight if the session has room. Every `Ok` must be followed by one [`end`](Self::end).
    pub fn begin(
        &mut self,
        hash: &HashId,
        conn: ConnId,
        now: Instant,
    ) -> Result<&mut Session, SessionError> {
        let max = self.limits.max_inflight;
        let s = self.lookup(hash, conn, now)?;
        if s.inflight >= max {
            return Err(SessionError::InFlight(max));
        }
        s.inflight += 1;
        Ok(s)
    }

    /// A request that [`begin`](Self::begin) admitted has finished (a session that ended
    /// meanwhile is ignored).
    pub fn end(&mut self, hash: &HashId, now: Instant) {
        if let Some(s) = self.by_hash.get_mut(hash) {
            s.inflight = s.inflight.saturating_sub(1);
            s.last_seen = now;
        }
    }

    fn take(&mut self, hash: &HashId) -> Option<Session> {
        let s = self.by_hash.remove(hash)?;
        count_down(&mut self.per_conn, s.conn);
        count_down(&mut self.per_ip, client_key(s.device.ip()));
        Some(s)
    }

    /// End a session; returns it so the caller can release its path's hit.
    pub fn remove(&mut self, hash: &HashId) -> Option<Session> {
        self.take(hash)
    }

    /// End every session of connection `conn` (it closed).
    pub fn remove_connection(&mut self, conn: ConnId) -> Vec<Session> {
        if !self.per_conn.contains_key(&conn) {
            return Vec::new();
        }
        let gone: Vec<HashId> = self
            .by_hash
            .values()
            .filter(|s| s.conn == conn)
            .map(|s| s.hash)
            .collect();
        gone.iter().filter_map(|h| self.take(h)).collect()
    }

    /// End sessions with nothing in flight that have been idle for longer than
    /// [`SessionLimits::idle`]; returns them.
    pub fn expire(&mut self, now: Instant) -> Vec<Session> {
        let idle = self.limits.idle;
        let gone: Vec<HashId> = self
            .by_hash
            .values()
            .filter(|s| s.inflight == 0 && now.saturating_duration_since(s.last_seen) > idle)
            .map(|s| s.hash)
            .collect();
        gone.iter().filter_map(|h| self.take(h)).collect()
    }

    /// Sessions on `path` (to move them when it goes down).
    pub fn on_path(&self, path: PathId) -> Vec<HashId> {
        self.by_hash
            .values()
            .filter(|s| s.path == Some(path))
            .map(|s| s.hash)
            .collect()
    }

    /// Every session, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &Session> {
        self.by_hash.values()
    }

    /// Devices registered.
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    /// Connections and source addresses that hold sessions (both bounded by the sessions).
    pub fn owners(&self) -> (usize, usize) {
        (self.per_conn.len(), self.per_ip.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn limits(max_devices: usize) -> SessionLimits {
        SessionLimits {
            max_devices,
            ..SessionLimits::DEFAULT
        }
    }

    const SERVER: &str = "10.0.0.2:443";

    #[test]
    fn register_lookup_and_binding_to_the_connection() {
        let now = Instant::now();
        let mut t = SessionTable::new(limits(10), [7; 32]);
        let (a, b) = (sa("10.1.0.1:5000"), sa("10.1.0.2:5000"));
        let ha = t
            .register(1, a, sa(SERVER), Priority::Priority, now)
            .unwrap();
        let hb = t
            .register(2, b, sa(SERVER), Priority::BestEffort, now)
            .unwrap();
        assert_ne!(ha, hb);
        assert_eq!(t.lookup(&ha, 1, now).unwrap().priority, Priority::Priority);
        assert_eq!(
            t.lookup(&ha, 2, now).unwrap_err(),
            SessionError::Forged,
            "connection 2 used connection 1's Hash ID"
        );
        assert_eq!(
            t.lookup(&HashId([0; 16]), 1, now).unwrap_err(),
            SessionError::Unknown
        );
        t.lookup(&hb, 2, now).unwrap().path = Some(PathId(2));
        assert_eq!(t.on_path(PathId(2)), vec![hb]);
        assert_eq!(t.remove_connection(2).len(), 1);
        assert_eq!(t.len(), 1);
        assert_eq!(t.owners(), (1, 1));
    }

    #[test]
    fn hash_ids_round_trip_and_reject_garbage() {
        let mut t = SessionTable::new(limits(10), [1; 32]);
        let h = t
            .register(
                0,
                sa("1.2.3.4:1"),
                sa("5.6.7.8:2"),
                Priority::BestEffort,
                Instant::now(),
            )
            .unwrap();
        let s = h.to_string();
        assert_eq!(s.len(), 32);
        assert_eq!(s.parse::<HashId>().unwrap(), h);
        for bad in [
            "",
            "abc",
            &"g".repeat(32),
            &"é".repeat(16),
            &format!("{s}00"),
            "00112231+45566778899aabbccddeeff",
        ] {
            let e = bad.parse::<HashId>().unwrap_err().to_string();
            assert!(e.starts_with("malformed Hash ID"), "{bad}: {e}");
        }
    }

    #[test]
    fn device_limit_and_idle_expiry() {
        let t0 = Instant::now();
        let mut t = SessionTable::new(
            SessionLimits {
                idle: Duration::from_secs(60),
                ..limits(2)
            },
            [3; 32],
        );
        let h1 = t
            .register(1, sa("1.1.1.1:1"), sa(SERVER), Priority::BestEffort, t0)
            .unwrap();
        let h2 = t
            .register(2, sa("1.1.1.2:1"), sa(SERVER), Priority::BestEffort, t0)
            .unwrap();
        assert_eq!(
            t.register(3, sa("1.1.1.3:1"), sa(SERVER), Priority::BestEffort, t0)
                .unwrap_err()
                .to_string(),
            "the gateway serves its maximum of 2 devices"
        );
        t.lookup(&h1, 1, t0 + Duration::from_secs(50)).unwrap();
        // h2 has a request in flight: it does not expire however long that takes.
        t.begin(&h2, 2, t0).unwrap();
        assert!(t.expire(t0 + Duration::from_secs(70)).is_empty());
        t.end(&h2, t0 + Duration::from_secs(5));
        let gone = t.expire(t0 + Duration::from_secs(70));
        assert_eq!(gone.len(), 1, "only the idle one expires");
        assert_eq!(gone[0].hash, h2);
        assert!(t.lookup(&h1, 1, t0).is_ok());
        // Its slot is free again.
        t.register(3, sa("1.1.1.3:1"), sa(SERVER), Priority::BestEffort, t0)
            .unwrap();
    }

    #[test]
    fn one_connection_or_address_cannot_take_every_slot() {
        let now = Instant::now();
        let mut t = SessionTable::new(
            SessionLimits {
                per_connection: 2,
                per_address: 3,
                ..limits(20)
            },
            [4; 32],
        );
        let reg = |t: &mut SessionTable, conn, addr: &str| {
            t.register(conn, sa(addr), sa(SERVER), Priority::BestEffort, now)
        };
        reg(&mut t, 1, "10.0.0.1:1").unwrap();
        reg(&mut t, 1, "10.0.0.1:1").unwrap();
        assert_eq!(
            reg(&mut t, 1, "10.0.0.1:1").unwrap_err(),
            SessionError::ConnectionLimit(2)
        );
        // Another connection from the same address: one more, then the address is full.
        reg(&mut t, 2, "10.0.0.1:2").unwrap();
        assert_eq!(
            reg(&mut t, 2, "10.0.0.1:2").unwrap_err(),
            SessionError::AddressLimit(3)
        );
        // Other devices are unaffected.
        reg(&mut t, 3, "10.0.0.9:1").unwrap();
        // A closed connection frees its slots, per connection and per address.
        assert_eq!(t.remove_connection(1).len(), 2);
        reg(&mut t, 2, "10.0.0.1:2").unwrap();
        assert_eq!(t.owners(), (2, 2));
    }

    #[test]
    fn in_flight_is_bounded_per_session_and_unknown_ids_cost_nothing() {
        let now = Instant::now();
        let mut t = SessionTable::new(
            SessionLimits {
                max_inflight: 2,
                ..limits(5)
            },
            [6; 32],
        );
        let h = t
            .register(1, sa("10.0.0.1:1"), sa(SERVER), Priority::Priority, now)
            .unwrap();
        t.begin(&h, 1, now).unwrap();
        t.begin(&h, 1, now).unwrap();
        assert_eq!(t.begin(&h, 1, now).unwrap_err(), SessionError::InFlight(2));
        t.end(&h, now);
        t.begin(&h, 1, now).unwrap();
        for i in 0..1000u32 {
            let mut b = [0u8; 16];
            b[..4].copy_from_slice(&i.to_le_bytes());
            assert_eq!(
                t.begin(&HashId(b), 1, now).unwrap_err(),
                SessionError::Unknown
            );
            t.end(&HashId(b), now);
        }
        assert_eq!(t.len(), 1);
        assert_eq!(t.owners(), (1, 1));
    }

    #[test]
    fn ids_are_distinct_and_seeded() {
        let big = SessionLimits {
            per_address: usize::MAX,
            per_connection: usize::MAX,
            ..limits(10_000)
        };
        let mut a = SessionTable::new(big, [5; 32]);
        let mut b = SessionTable::new(big, [5; 32]);
        let now = Instant::now();
        let mut seen = std::collections::HashSet::new();
        for i in 0..5000u32 {
            let addr = SocketAddr::from(([10, (i >> 16) as u8, (i >> 8) as u8, i as u8], 1));
            let h = a
                .register(i.into(), addr, addr, Priority::BestEffort, now)
                .unwrap();
            assert_eq!(
                h,
                b.register(i.into(), addr, addr, Priority::BestEffort, now)
                    .unwrap(),
                "same seed, same IDs"
            );
            assert!(seen.insert(h));
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Register { conn: u8, ip: u8 },
        Begin { pick: u8, conn: u8 },
        End { pick: u8 },
        Close { conn: u8 },
        Advance { secs: u8 },
        Expire,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0..6u8, 0..4u8).prop_map(|(conn, ip)| Op::Register { conn, ip }),
            4 => (any::<u8>(), 0..6u8).prop_map(|(pick, conn)| Op::Begin { pick, conn }),
            3 => any::<u8>().prop_map(|pick| Op::End { pick }),
            1 => (0..6u8).prop_map(|conn| Op::Close { conn }),
            2 => (0..40u8).prop_map(|secs| Op::Advance { secs }),
            1 => Just(Op::Expire),
        ]
    }

    proptest! {
        /// Any sequence of operations keeps every bound, keeps the owner counts equal to the
        /// sessions, and never expires a session with a request in flight.
        #[test]
        fn bounds_and_counts_hold_under_any_sequence(ops in proptest::collection::vec(op(), 1..200)) {
            let l = SessionLimits {
                max_devices: 8,
                per_connection: 3,
                per_address: 4,
                max_inflight: 2,
                idle: Duration::from_secs(30),
            };
            let mut t = SessionTable::new(l, [9; 32]);
            let t0 = Instant::now();
            let mut now = t0;
            // Hash IDs ever issued, and requests begun and not yet ended.
            let mut issued: Vec<(HashId, ConnId)> = Vec::new();
            let mut open: Vec<HashId> = Vec::new();
            for op in ops {
                match op {
                    Op::Register { conn, ip } => {
                        let addr = SocketAddr::from(([10, 0, 0, ip], 1000 + u16::from(conn)));
                        if let Ok(h) = t.register(conn.into(), addr, addr, Priority::BestEffort, now) {
                            issued.push((h, conn.into()));
                        }
                    }
                    Op::Begin { pick, conn } if !issued.is_empty() => {
                        let (h, owner) = issued[usize::from(pick) % issued.len()];
                        match t.begin(&h, conn.into(), now) {
                            Ok(_) => {
                                prop_assert_eq!(owner, ConnId::from(conn));
                                open.push(h);
                            }
                            Err(SessionError::Forged) => prop_assert_ne!(owner, ConnId::from(conn)),
                            Err(SessionError::InFlight(2)) | Err(SessionError::Unknown) => {}
                            Err(e) => prop_assert!(false, "unexpected {e}"),
                        }
                    }
                    Op::End { pick } if !open.is_empty() => {
                        let h = open.swap_remove(usize::from(pick) % open.len());
                        t.end(&h, now);
                    }
                    Op::Close { conn } => {
                        for s in t.remove_connection(conn.into()) {
                            prop_assert_eq!(s.conn, ConnId::from(conn));
                            open.retain(|h| *h != s.hash);
                        }
                    }
                    Op::Advance { secs } => now += Duration::from_secs(secs.into()),
                    Op::Expire => {
                        for s in t.expire(now) {
                            prop_assert_eq!(s.inflight, 0);
                            prop_assert!(!open.contains(&s.hash));
                            prop_assert!(now - s.last_seen > l.idle);
                        }
                    }
                    _ => {}
                }
                // The bounds and the owner counts.
                prop_assert!(t.len() <= l.max_devices);
                let mut per_conn: HashMap<ConnId, usize> = HashMap::new();
                let mut per_ip: HashMap<IpAddr, usize> = HashMap::new();
                for s in t.by_hash.values() {
                    prop_assert!(s.inflight <= l.max_inflight);
                    prop_assert_eq!(s.inflight, open.iter().filter(|h| **h == s.hash).count());
                    *per_conn.entry(s.conn).or_default() += 1;
                    *per_ip.entry(client_key(s.device.ip())).or_default() += 1;
                }
                prop_assert!(per_conn.values().all(|n| *n <= l.per_connection));
                prop_assert!(per_ip.values().all(|n| *n <= l.per_address));
                prop_assert_eq!(&per_conn, &t.per_conn);
                prop_assert_eq!(&per_ip, &t.per_ip);
            }
        }
    }
}
