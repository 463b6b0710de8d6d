//! The gateway's connection management table (paper 000 §3.3, Table 2): one entry per device,
//! found by its Hash ID, holding the device's and the server's addresses, its priority and the
//! backhaul path it uses.
//!
//! Hash IDs are 128 random bits from a ChaCha20 generator (a CSPRNG: the shell seeds it from the
//! operating system in deployment, from the scenario seed in simulation) and are bound to the
//! device address that registered: a request carrying another device's Hash ID is refused.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::{Duration, Instant};

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
        if s.len() != 32 || !s.is_ascii() {
            return Err(bad());
        }
        let mut out = [0u8; 16];
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(HashId(out))
    }
}

/// Why a session operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// The table is at its device limit.
    #[error("the gateway serves its maximum of {0} devices")]
    Full(usize),
    /// No session has this Hash ID (never registered, or expired).
    #[error("unknown Hash ID")]
    Unknown,
    /// The Hash ID belongs to another device.
    #[error("this Hash ID was not issued to this device")]
    Forged,
    /// Not 32 hex digits.
    #[error("malformed Hash ID '{0}': expected 32 hex digits")]
    Malformed(String),
}

/// One row of Table 2.
#[derive(Debug, Clone, PartialEq)]
pub struct Session {
    /// The device's Hash ID.
    pub hash: HashId,
    /// The device's address and port (the registering connection's).
    pub device: SocketAddr,
    /// The server it talks to.
    pub server: SocketAddr,
    /// Its class.
    pub priority: Priority,
    /// Its backhaul path, once assigned.
    pub path: Option<PathId>,
    /// Last request seen.
    pub last_seen: Instant,
}

/// The connection management table.
pub struct SessionTable {
    by_hash: HashMap<HashId, Session>,
    max: usize,
    rng: ChaCha20Rng,
}

impl fmt::Debug for SessionTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionTable")
            .field("sessions", &self.by_hash.len())
            .field("max", &self.max)
            .finish()
    }
}

impl SessionTable {
    /// A table of at most `max` devices whose Hash IDs come from `seed`.
    pub fn new(max: usize, seed: [u8; 32]) -> SessionTable {
        SessionTable {
            by_hash: HashMap::new(),
            max,
            rng: ChaCha20Rng::from_seed(seed),
        }
    }

    /// Register a device (Fig. 2 steps 4–6); returns its new Hash ID.
    pub fn register(
        &mut self,
        device: SocketAddr,
        server: SocketAddr,
        priority: Priority,
        now: Instant,
    ) -> Result<HashId, SessionError> {
        if self.by_hash.len() >= self.max {
            return Err(SessionError::Full(self.max));
        }
        let hash = loop {
            let mut b = [0u8; 16];
            self.rng.fill_bytes(&mut b);
            let h = HashId(b);
            if !self.by_hash.contains_key(&h) {
                break h;
            }
        };
        self.by_hash.insert(
            hash,
            Session {
                hash,
                device,
                server,
                priority,
                path: None,
                last_seen: now,
            },
        );
        Ok(hash)
    }

    /// The session for a request carrying `hash` from `device` (Fig. 2 step 10); refreshes it.
    pub fn lookup(
        &mut self,
        hash: &HashId,
        device: SocketAddr,
        now: Instant,
    ) -> Result<&mut Session, SessionError> {
        let s = self.by_hash.get_mut(hash).ok_or(SessionError::Unknown)?;
        if s.device != device {
            return Err(SessionError::Forged);
        }
        s.last_seen = now;
        Ok(s)
    }

    /// End a session (the device closed); returns it so the caller can release its path's hit.
    pub fn remove(&mut self, hash: &HashId) -> Option<Session> {
        self.by_hash.remove(hash)
    }

    /// End every session of a device address (its connection closed).
    pub fn remove_device(&mut self, device: SocketAddr) -> Vec<Session> {
        let gone: Vec<HashId> = self
            .by_hash
            .values()
            .filter(|s| s.device == device)
            .map(|s| s.hash)
            .collect();
        gone.iter().filter_map(|h| self.by_hash.remove(h)).collect()
    }

    /// End sessions idle for longer than `idle`; returns them.
    pub fn expire(&mut self, now: Instant, idle: Duration) -> Vec<Session> {
        let gone: Vec<HashId> = self
            .by_hash
            .values()
            .filter(|s| now.saturating_duration_since(s.last_seen) > idle)
            .map(|s| s.hash)
            .collect();
        gone.iter().filter_map(|h| self.by_hash.remove(h)).collect()
    }

    /// Sessions on `path` (to move them when it goes down).
    pub fn on_path(&self, path: PathId) -> Vec<HashId> {
        self.by_hash
            .values()
            .filter(|s| s.path == Some(path))
            .map(|s| s.hash)
            .collect()
    }

    /// Devices registered.
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn register_lookup_and_binding() {
        let now = Instant::now();
        let mut t = SessionTable::new(10, [7; 32]);
        let (a, b) = (sa("10.1.0.1:5000"), sa("10.1.0.2:5000"));
        let server = sa("10.0.0.2:443");
        let ha = t.register(a, server, Priority::Priority, now).unwrap();
        let hb = t.register(b, server, Priority::BestEffort, now).unwrap();
        assert_ne!(ha, hb);
        assert_eq!(t.lookup(&ha, a, now).unwrap().priority, Priority::Priority);
        assert_eq!(
            t.lookup(&ha, b, now).unwrap_err(),
            SessionError::Forged,
            "b used a's Hash ID"
        );
        assert_eq!(
            t.lookup(&HashId([0; 16]), a, now).unwrap_err(),
            SessionError::Unknown
        );
        t.lookup(&hb, b, now).unwrap().path = Some(PathId(2));
        assert_eq!(t.on_path(PathId(2)), vec![hb]);
        assert_eq!(t.remove_device(b).len(), 1);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn hash_ids_round_trip_and_reject_garbage() {
        let mut t = SessionTable::new(10, [1; 32]);
        let h = t
            .register(
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
        ] {
            let e = bad.parse::<HashId>().unwrap_err().to_string();
            assert!(e.starts_with("malformed Hash ID"), "{bad}: {e}");
        }
    }

    #[test]
    fn limits_and_expiry() {
        let t0 = Instant::now();
        let mut t = SessionTable::new(2, [3; 32]);
        let h1 = t
            .register(sa("1.1.1.1:1"), sa("9.9.9.9:9"), Priority::BestEffort, t0)
            .unwrap();
        t.register(sa("1.1.1.2:1"), sa("9.9.9.9:9"), Priority::BestEffort, t0)
            .unwrap();
        assert_eq!(
            t.register(sa("1.1.1.3:1"), sa("9.9.9.9:9"), Priority::BestEffort, t0)
                .unwrap_err()
                .to_string(),
            "the gateway serves its maximum of 2 devices"
        );
        t.lookup(&h1, sa("1.1.1.1:1"), t0 + Duration::from_secs(50))
            .unwrap();
        let gone = t.expire(t0 + Duration::from_secs(70), Duration::from_secs(60));
        assert_eq!(gone.len(), 1, "only the idle one expires");
        assert!(t.lookup(&h1, sa("1.1.1.1:1"), t0).is_ok());
    }

    #[test]
    fn ids_are_distinct_and_seeded() {
        let mut a = SessionTable::new(10_000, [5; 32]);
        let mut b = SessionTable::new(10_000, [5; 32]);
        let now = Instant::now();
        let mut seen = std::collections::HashSet::new();
        for i in 0..5000u32 {
            let addr = SocketAddr::from(([10, (i >> 16) as u8, (i >> 8) as u8, i as u8], 1));
            let h = a.register(addr, addr, Priority::BestEffort, now).unwrap();
            assert_eq!(
                h,
                b.register(addr, addr, Priority::BestEffort, now).unwrap(),
                "same seed, same IDs"
            );
            assert!(seen.insert(h));
        }
    }
}
