//! Places for a listener's clients: at most so many in all and so many per client, each
//! given back when its holder drops it.
//!
//! A client is its IPv4 address, or its IPv6 /64 (decision S10): one host commonly holds a
//! whole /64, so a per-address limit keyed on the full IPv6 address would give it 2^64 quotas.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Who a limit per client counts: an IPv4 address (an IPv4-mapped IPv6 address counts as its
/// IPv4 one), or the /64 an IPv6 address is in.
pub fn client_key(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V4(_) => addr,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
    }
}

/// Why a place was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Every place is taken.
    Full { limit: usize },
    /// This client holds its share.
    PerClient { limit: usize },
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Full { limit } => write!(f, "all {limit} places are taken"),
            Refused::PerClient { limit } => {
                write!(f, "this client (address, or IPv6 /64) holds its {limit}")
            }
        }
    }
}

#[derive(Debug)]
struct Held {
    total: usize,
    per_client: HashMap<IpAddr, usize>,
}

/// The places of one listener.
#[derive(Debug, Clone)]
pub struct Quota {
    max_total: usize,
    max_per_client: usize,
    held: Arc<Mutex<Held>>,
}

/// One place, given back when dropped.
#[derive(Debug)]
pub struct Place {
    key: IpAddr,
    held: Arc<Mutex<Held>>,
}

impl Quota {
    /// At most `max_total` places, `max_per_client` of them per client.
    pub fn new(max_total: usize, max_per_client: usize) -> Quota {
        Quota {
            max_total,
            max_per_client,
            held: Arc::new(Mutex::new(Held {
                total: 0,
                per_client: HashMap::new(),
            })),
        }
    }

    /// A place for a client at `addr`, or why not.
    pub fn take(&self, addr: IpAddr) -> Result<Place, Refused> {
        let key = client_key(addr);
        let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if h.total >= self.max_total {
            return Err(Refused::Full {
                limit: self.max_total,
            });
        }
        let n = h.per_client.get(&key).copied().unwrap_or(0);
        if n >= self.max_per_client {
            return Err(Refused::PerClient {
                limit: self.max_per_client,
            });
        }
        h.per_client.insert(key, n + 1);
        h.total += 1;
        Ok(Place {
            key,
            held: self.held.clone(),
        })
    }

    /// Places held now.
    pub fn held(&self) -> usize {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).total
    }

    /// Places the client at `addr` (its address, or IPv6 /64) holds now.
    pub fn held_by(&self, addr: IpAddr) -> usize {
        let h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        h.per_client.get(&client_key(addr)).copied().unwrap_or(0)
    }

    /// Clients holding a place now (each has an entry while it does).
    pub fn clients(&self) -> usize {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .per_client
            .len()
    }

    /// The limit in all.
    pub fn max_total(&self) -> usize {
        self.max_total
    }

    /// The limit per client.
    pub fn max_per_client(&self) -> usize {
        self.max_per_client
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        h.total -= 1;
        if let Some(n) = h.per_client.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                h.per_client.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_client_is_an_ipv4_address_or_an_ipv6_64() {
        assert_eq!(client_key(ip("10.1.2.3")), ip("10.1.2.3"));
        assert_eq!(client_key(ip("::ffff:10.1.2.3")), ip("10.1.2.3"));
        assert_eq!(client_key(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(
            client_key(ip("2001:db8:1:2:ffff:ffff:ffff:ffff")),
            client_key(ip("2001:db8:1:2::"))
        );
        assert_ne!(client_key(ip("2001:db8:1:3::1")), ip("2001:db8:1:2::"));
    }

    #[test]
    fn places_are_limited_in_all_and_per_client_and_come_back_when_dropped() {
        let q = Quota::new(5, 2);
        let a = [
            q.take(ip("10.0.0.1")).unwrap(),
            q.take(ip("10.0.0.1")).unwrap(),
        ];
        assert_eq!(
            q.take(ip("10.0.0.1")).unwrap_err(),
            Refused::PerClient { limit: 2 }
        );
        // Another address of the same IPv6 /64 is the same client.
        let b = [
            q.take(ip("2001:db8::1")).unwrap(),
            q.take(ip("2001:db8::ffff")).unwrap(),
        ];
        assert!(q.take(ip("2001:db8::2")).is_err());
        let c = q.take(ip("10.0.0.2")).unwrap();
        assert_eq!(
            q.take(ip("10.0.0.3")).unwrap_err(),
            Refused::Full { limit: 5 }
        );
        assert_eq!((q.held(), q.clients()), (5, 3));
        assert_eq!(q.held_by(ip("2001:db8::7")), 2);
        drop(a);
        assert_eq!((q.held(), q.clients()), (3, 2));
        let _d = q.take(ip("10.0.0.1")).unwrap();
        drop((b, c));
        assert_eq!((q.held(), q.clients()), (1, 1));
    }
}
