//! A server's store of TLS 1.3 resumption tickets (stateful: the ticket is a key into this
//! store), with `take` and `put` in O(log n) at worst however many clients it remembers.
//!
//! rustls's `ServerSessionMemoryCache` finds a taken key's place in its eviction queue by a linear
//! search, so with one ticket per device slot (decision G18) every resumption scanned up to
//! `max_devices` keys while holding the device listener's endpoint lock. Here each ticket is
//! stored under a sequence number, and the eviction order is a B-tree keyed by it: a taken
//! ticket leaves it at once, and the oldest is its first entry.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// The tickets of up to `capacity` clients, the oldest evicted first; each is taken when used.
pub struct TicketStore {
    inner: Mutex<Inner>,
}

struct Inner {
    capacity: usize,
    /// Key → (value, the sequence number it was stored under).
    entries: HashMap<Vec<u8>, (Vec<u8>, u64)>,
    /// Sequence number → key, in storing order: exactly the stored tickets.
    order: BTreeMap<u64, Vec<u8>>,
    next: u64,
}

impl TicketStore {
    /// A store for `capacity` tickets (at least one).
    pub fn new(capacity: usize) -> Self {
        TicketStore {
            inner: Mutex::new(Inner {
                capacity: capacity.max(1),
                entries: HashMap::new(),
                order: BTreeMap::new(),
                next: 0,
            }),
        }
    }

    /// Tickets held now.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// Whether it holds no ticket.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Counts only: the values are resumption secrets, never printed (rustls's store prints
/// nothing either, and `rustls::ServerConfig`'s `Debug` includes its store).
impl std::fmt::Debug for TicketStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = self.lock();
        f.debug_struct("TicketStore")
            .field("capacity", &i.capacity)
            .field("len", &i.entries.len())
            .finish_non_exhaustive()
    }
}

impl Inner {
    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        let seq = self.next;
        self.next += 1;
        if let Some((_, old)) = self.entries.insert(key.clone(), (value, seq)) {
            self.order.remove(&old);
        }
        self.order.insert(seq, key);
        while self.entries.len() > self.capacity {
            let (_, oldest) = self.order.pop_first().expect("a stored key is ordered");
            self.entries.remove(&oldest);
        }
    }

    fn take(&mut self, key: &[u8]) -> Option<Vec<u8>> {
        let (value, seq) = self.entries.remove(key)?;
        self.order.remove(&seq);
        Some(value)
    }
}

impl rustls::server::StoresServerSessions for TicketStore {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        self.lock().put(key, value);
        true
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.lock().entries.get(key).map(|(v, _)| v.clone())
    }

    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.lock().take(key)
    }

    fn can_cache(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rustls::server::StoresServerSessions;

    fn key(i: u32) -> Vec<u8> {
        i.to_be_bytes().to_vec()
    }

    #[test]
    fn a_ticket_is_taken_once() {
        let s = TicketStore::new(4);
        s.put(key(1), b"one".to_vec());
        assert_eq!(s.get(&key(1)).as_deref(), Some(&b"one"[..]));
        assert_eq!(s.take(&key(1)).as_deref(), Some(&b"one"[..]));
        assert_eq!(s.take(&key(1)), None);
        assert_eq!(s.get(&key(1)), None);
        assert!(s.is_empty());
    }

    #[test]
    fn the_oldest_is_evicted_first() {
        let s = TicketStore::new(3);
        for i in 0..5 {
            s.put(key(i), vec![i as u8]);
        }
        assert_eq!(s.len(), 3);
        assert_eq!(s.get(&key(0)), None);
        assert_eq!(s.get(&key(1)), None);
        for i in 2..5 {
            assert_eq!(s.get(&key(i)), Some(vec![i as u8]));
        }
    }

    #[test]
    fn a_taken_key_does_not_cost_a_live_one_its_place() {
        let s = TicketStore::new(2);
        s.put(key(1), vec![1]);
        s.put(key(2), vec![2]);
        assert!(s.take(&key(2)).is_some());
        // The store holds one ticket: the next fills the free place without evicting key 1.
        s.put(key(3), vec![3]);
        assert_eq!(s.len(), 2);
        assert!(s.get(&key(1)).is_some() && s.get(&key(3)).is_some());
    }

    #[test]
    fn debug_prints_no_secret() {
        let s = TicketStore::new(2);
        s.put(b"ticket-id".to_vec(), b"resumption-secret".to_vec());
        let d = format!("{s:?}");
        assert!(d.contains("len: 1"), "{d}");
        assert!(
            !d.contains("secret") && !d.contains("ticket-id") && !d.contains("114"),
            "{d}"
        );
    }

    #[test]
    fn a_key_stored_again_is_as_young_as_its_last_put() {
        let s = TicketStore::new(2);
        s.put(key(1), vec![1]);
        s.put(key(2), vec![2]);
        s.put(key(1), vec![11]);
        // Key 1's first queue entry is stale: key 2 is now the oldest.
        s.put(key(3), vec![3]);
        assert_eq!(s.get(&key(1)), Some(vec![11]));
        assert_eq!(s.get(&key(2)), None);
        assert_eq!(s.get(&key(3)), Some(vec![3]));
    }

    /// Against a model (a list in storing order), over random puts, re-puts and takes: the
    /// same tickets held, never more than the capacity, and the order index naming exactly them.
    #[test]
    fn matches_a_fifo_model() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for capacity in [1usize, 2, 3, 7, 64] {
            let s = TicketStore::new(capacity);
            let mut model: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
            for step in 0..20_000u32 {
                let k = key(rng.random_range(0..(capacity as u32 * 3)));
                if rng.random_bool(0.5) {
                    let v = step.to_le_bytes().to_vec();
                    model.retain(|(mk, _)| *mk != k);
                    model.push((k.clone(), v.clone()));
                    if model.len() > capacity {
                        model.remove(0);
                    }
                    s.put(k, v);
                } else {
                    let want = model
                        .iter()
                        .position(|(mk, _)| *mk == k)
                        .map(|i| model.remove(i).1);
                    assert_eq!(s.take(&k), want, "capacity {capacity}, step {step}");
                }
                assert_eq!(s.len(), model.len());
                let i = s.lock();
                assert_eq!(i.order.len(), i.entries.len());
                assert!(i.order.iter().all(|(q, k)| i.entries[k].1 == *q));
            }
            for (k, v) in &model {
                assert_eq!(s.get(k).as_ref(), Some(v));
            }
        }
    }
}
