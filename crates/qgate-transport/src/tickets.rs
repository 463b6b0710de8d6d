//! A server's store of TLS 1.3 resumption tickets (stateful: the ticket is a key into this
//! store), with constant-time `put` and `take` however many clients it remembers.
//!
//! rustls's `ServerSessionMemoryCache` finds a taken key's place in its eviction queue by a linear
//! search, so with one ticket per device slot (decision G18) every resumption scanned up to
//! `max_devices` keys while holding the device listener's endpoint lock. Here each entry carries
//! the sequence number it was stored under and the queue is cleaned lazily: a key in the queue
//! whose entry is gone (taken) or was stored again later is skipped when it reaches the front,
//! and the queue is rebuilt once it holds more than twice the capacity, so memory stays bounded.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// The tickets of up to `capacity` clients, the oldest evicted first; each is taken when used.
#[derive(Debug)]
pub struct TicketStore {
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    capacity: usize,
    /// Key → (value, the sequence number it was stored under).
    entries: HashMap<Vec<u8>, (Vec<u8>, u64)>,
    /// Keys in storing order with their sequence numbers; stale ones are skipped.
    order: VecDeque<(u64, Vec<u8>)>,
    next: u64,
}

impl TicketStore {
    /// A store for `capacity` tickets (at least one).
    pub fn new(capacity: usize) -> Self {
        TicketStore {
            inner: Mutex::new(Inner {
                capacity: capacity.max(1),
                entries: HashMap::new(),
                order: VecDeque::new(),
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

    /// The eviction queue's length, stale keys included (at most 2 × capacity).
    pub fn queued(&self) -> usize {
        self.lock().order.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Inner {
    /// Whether the queue's entry `(seq, key)` still names a stored ticket.
    fn live(&self, seq: u64, key: &[u8]) -> bool {
        self.entries.get(key).is_some_and(|(_, s)| *s == seq)
    }

    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) {
        let seq = self.next;
        self.next += 1;
        self.entries.insert(key.clone(), (value, seq));
        self.order.push_back((seq, key));
        while self.entries.len() > self.capacity {
            let (seq, key) = self.order.pop_front().expect("a stored key is queued");
            if self.live(seq, &key) {
                self.entries.remove(&key);
            }
        }
        if self.order.len() > 2 * self.capacity {
            let order = std::mem::take(&mut self.order);
            self.order = order
                .into_iter()
                .filter(|(s, k)| self.live(*s, k))
                .collect();
        }
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
        self.lock().entries.remove(key).map(|(v, _)| v)
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
        assert!(s.take(&key(1)).is_some());
        // The store holds one ticket: the next fills the free place without evicting key 2.
        s.put(key(3), vec![3]);
        assert_eq!(s.len(), 2);
        assert!(s.get(&key(2)).is_some() && s.get(&key(3)).is_some());
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
    /// same tickets held, never more than the capacity, and a queue of at most 2 × capacity.
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
                assert!(s.queued() <= 2 * capacity);
            }
            for (k, v) in &model {
                assert_eq!(s.get(k).as_ref(), Some(v));
            }
        }
    }
}
