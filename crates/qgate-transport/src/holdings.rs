//! Who holds a server's budget of request-body bytes, and whose body gives way when a body
//! from another client finds it spent (decision T13). Sans-IO, with `now` passed in: the body
//! budget in [`http3`](crate::http3) keeps one under its lock.
//!
//! The budget (T7) bounds memory, but one client could keep all of it: bodies sent almost
//! whole and then trickled a byte at a time stay under the stall timeout, and every other
//! client got 503 until the five-minute body deadline. Here a client that needs room takes it
//! back from the client holding the most, as long as that client would still hold more than
//! the one asking: shares tend to max-min fairness, a lone client (a gateway carrying every
//! device's records) may still use the whole budget, and a client never evicts its own bodies.
//! Of the heaviest client's bodies, the one that has gone longest without a byte gives way.
//! Bytes of bodies told to give way count as free until they are back, so a burst of asks
//! cuts no more than it needs; and clients are indexed by what they hold and each client's
//! bodies by staleness, so each cut costs a few B-tree steps however many clients and bodies
//! there are.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::Hash;
use std::time::Instant;

/// One body in the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BodyId(u64);

#[derive(Debug)]
struct Body<K> {
    client: K,
    held: u64,
    /// When its last bytes were taken (or it opened).
    progress: Instant,
    state: State,
}

impl<K> Body<K> {
    /// Its place among its client's arriving bodies: the stalest first, then the largest.
    fn rank(&self, id: BodyId) -> Rank {
        (self.progress, Reverse(self.held), id)
    }
}

type Rank = (Instant, Reverse<u64>, BodyId);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Still arriving: only these may be told to give way.
    Arriving,
    /// Whole, with its handler: it keeps its bytes until it closes.
    Arrived,
    /// Told to give way: its bytes no longer count for its client, and count as free.
    GaveWay,
}

/// The ledger of one budget: per body and per client, the bytes held.
#[derive(Debug)]
pub struct Holdings<K> {
    bodies: HashMap<BodyId, Body<K>>,
    clients: HashMap<K, Holder>,
    /// The clients with an arriving body that holds bytes, by what they hold: those that can
    /// give way, the heaviest last.
    givers: BTreeSet<(u64, K)>,
    /// Bytes of bodies told to give way and not yet closed: on their way back.
    leaving: u64,
    next: u64,
}

/// One client with a body open.
#[derive(Debug, Default)]
struct Holder {
    /// Bytes its bodies hold, those told to give way not counted.
    held: u64,
    bodies: HashSet<BodyId>,
    /// Its arriving bodies that hold bytes, in the order they would give way.
    arriving: BTreeSet<Rank>,
}

impl<K> Default for Holdings<K> {
    fn default() -> Self {
        Holdings {
            bodies: HashMap::new(),
            clients: HashMap::new(),
            givers: BTreeSet::new(),
            leaving: 0,
            next: 0,
        }
    }
}

impl<K: Eq + Hash + Ord + Clone> Holdings<K> {
    /// A body from `client` starts, holding nothing yet.
    pub fn open(&mut self, client: K, now: Instant) -> BodyId {
        let id = BodyId(self.next);
        self.next += 1;
        self.clients
            .entry(client.clone())
            .or_default()
            .bodies
            .insert(id);
        self.bodies.insert(
            id,
            Body {
                client,
                held: 0,
                progress: now,
                state: State::Arriving,
            },
        );
        id
    }

    /// Body `id` took `bytes` more of the budget at `now`.
    pub fn took(&mut self, id: BodyId, bytes: u64, now: Instant) {
        let Some(b) = self.bodies.get_mut(&id) else {
            return;
        };
        let k = b.client.clone();
        let Some(c) = self.clients.get_mut(&k) else {
            return;
        };
        self.givers.remove(&(c.held, k.clone()));
        match b.state {
            State::Arriving => {
                c.arriving.remove(&b.rank(id));
                b.held += bytes;
                b.progress = now;
                c.held += bytes;
                if b.held > 0 {
                    c.arriving.insert(b.rank(id));
                }
            }
            State::Arrived => {
                b.held += bytes;
                c.held += bytes;
            }
            // Its last grant raced the word to give way: those bytes are on their way back too.
            State::GaveWay => {
                b.held += bytes;
                self.leaving += bytes;
            }
        }
        if !c.arriving.is_empty() {
            self.givers.insert((c.held, k));
        }
    }

    /// Body `id` has arrived whole: it no longer gives way. False if it was told to give way
    /// before: its bytes are on their way back, so it must not be handled.
    pub fn arrived(&mut self, id: BodyId) -> bool {
        let Some(b) = self.bodies.get_mut(&id) else {
            return false;
        };
        match b.state {
            State::Arriving => {
                b.state = State::Arrived;
                let k = b.client.clone();
                if let Some(c) = self.clients.get_mut(&k) {
                    self.givers.remove(&(c.held, k.clone()));
                    c.arriving.remove(&b.rank(id));
                    if !c.arriving.is_empty() {
                        self.givers.insert((c.held, k));
                    }
                }
                true
            }
            State::Arrived => true,
            State::GaveWay => false,
        }
    }

    /// Body `id` gave its bytes back.
    pub fn close(&mut self, id: BodyId) {
        let Some(b) = self.bodies.remove(&id) else {
            return;
        };
        if b.state == State::GaveWay {
            self.leaving -= b.held;
        }
        let Some(c) = self.clients.get_mut(&b.client) else {
            return;
        };
        self.givers.remove(&(c.held, b.client.clone()));
        if b.state != State::GaveWay {
            c.held -= b.held;
        }
        c.arriving.remove(&b.rank(id));
        c.bodies.remove(&id);
        if c.bodies.is_empty() {
            self.clients.remove(&b.client);
        } else if !c.arriving.is_empty() {
            self.givers.insert((c.held, b.client));
        }
    }

    /// Bytes `client` holds (bodies told to give way not counted).
    pub fn held_by(&self, client: &K) -> u64 {
        self.clients.get(client).map_or(0, |c| c.held)
    }

    /// Bytes of bodies told to give way that have not closed yet.
    pub fn leaving(&self) -> u64 {
        self.leaving
    }

    /// Body `id`, arriving, needs `need` more bytes and the budget has `available` free: the
    /// bodies of other clients that must give way so that it fits, counting the bytes of
    /// bodies already told as free. Each comes from the client holding the most at that
    /// moment, while it holds more than the asking client would with `need` more, and is its
    /// body longest without a byte; each is taken out of its client's count at once. Empty
    /// when it fits already, when not enough can give way to make it fit, or when the asking
    /// body was itself told to give way.
    pub fn give_way(&mut self, id: BodyId, need: u64, available: u64) -> Vec<BodyId> {
        let asking = match self.bodies.get(&id) {
            Some(b) if b.state == State::Arriving => b.client.clone(),
            _ => return Vec::new(),
        };
        let mine = self.held_by(&asking) + need;
        let mut freed = available + self.leaving;
        let mut out = Vec::new();
        while freed < need {
            // The heaviest other client that holds more than the asker would (ties: the
            // higher key).
            let Some((held, k)) = self
                .givers
                .iter()
                .rev()
                .take_while(|(h, _)| *h > mine)
                .find(|(_, k)| *k != asking)
                .cloned()
            else {
                break;
            };
            self.givers.remove(&(held, k.clone()));
            let c = self.clients.get_mut(&k).expect("a giver is a client");
            let (.., victim) = c.arriving.pop_first().expect("a giver has a body arriving");
            let b = self.bodies.get_mut(&victim).expect("listed");
            b.state = State::GaveWay;
            c.held -= b.held;
            self.leaving += b.held;
            freed += b.held;
            out.push(victim);
            if !c.arriving.is_empty() {
                self.givers.insert((c.held, k));
            }
        }
        if freed < need {
            // Not enough can give way: cutting some would cost their senders and free too
            // little for this body anyway.
            for v in out.drain(..).rev() {
                self.take_back(v);
            }
        }
        out
    }

    /// Undo body `id`'s giving way.
    fn take_back(&mut self, id: BodyId) {
        let b = self.bodies.get_mut(&id).expect("listed");
        let c = self.clients.get_mut(&b.client).expect("listed");
        self.givers.remove(&(c.held, b.client.clone()));
        b.state = State::Arriving;
        c.held += b.held;
        self.leaving -= b.held;
        c.arriving.insert(b.rank(id));
        self.givers.insert((c.held, b.client.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(ms: u64) -> Instant {
        thread_local!(static T0: Instant = Instant::now());
        T0.with(|t| *t) + Duration::from_millis(ms)
    }

    #[test]
    fn a_lone_client_never_gives_way_to_itself() {
        let mut h = Holdings::default();
        let a = h.open("gw", at(0));
        h.took(a, 900, at(0));
        let b = h.open("gw", at(1));
        assert!(h.give_way(b, 500, 100).is_empty());
        assert_eq!(h.held_by(&"gw"), 900);
    }

    #[test]
    fn the_heaviest_clients_stalest_body_gives_way_until_the_body_fits() {
        let mut h = Holdings::default();
        // The attacker's three bodies: fresh, stalest, middle.
        let fresh = h.open("attacker", at(0));
        h.took(fresh, 300, at(30));
        let stale = h.open("attacker", at(0));
        h.took(stale, 300, at(10));
        let middle = h.open("attacker", at(0));
        h.took(middle, 300, at(20));
        let other = h.open("other", at(0));
        h.took(other, 50, at(5));
        let honest = h.open("honest", at(40));
        // 100 free, 500 needed: two bodies must go, the stalest first.
        assert_eq!(h.give_way(honest, 500, 100), vec![stale, middle]);
        assert_eq!(h.held_by(&"attacker"), 300);
        // Nothing is free now: the attacker's 300 and other's 50 are less than honest's 500.
        assert!(h.give_way(honest, 500, 0).is_empty());
        h.close(stale);
        h.close(middle);
        assert_eq!(h.held_by(&"attacker"), 300, "no second release");
    }

    #[test]
    fn a_burst_of_asks_cuts_no_more_than_it_needs() {
        let mut h = Holdings::default();
        for _ in 0..5 {
            let b = h.open("hog", at(0));
            h.took(b, 4000, at(0));
        }
        let cut: usize = (0..5)
            .map(|_| {
                let small = h.open("other", at(1));
                h.give_way(small, 300, 0).len()
            })
            .sum();
        // The first ask's victim frees 4000, enough for all five until it is back.
        assert_eq!(cut, 1);
        assert_eq!(h.leaving(), 4000);
    }

    #[test]
    fn room_comes_from_whichever_client_holds_the_most_at_each_cut() {
        let mut h = Holdings::default();
        for (client, sizes) in [("a", [500, 400]), ("b", [450, 300])] {
            for (i, n) in sizes.into_iter().enumerate() {
                let b = h.open(client, at(0));
                h.took(b, n, at(i as u64));
            }
        }
        let asker = h.open("c", at(5));
        // c would hold 700. a 900, b 750: a's stalest (500) goes; 500 is not enough, and
        // now b (750) holds the most: its stalest (450) goes.
        let cut = h.give_way(asker, 700, 0);
        assert_eq!(cut.len(), 2);
        assert_eq!((h.held_by(&"a"), h.held_by(&"b")), (400, 300));
    }

    #[test]
    fn a_body_told_after_its_last_byte_is_not_handled() {
        let mut h = Holdings::default();
        let a = h.open("a", at(0));
        h.took(a, 500, at(0));
        let b = h.open("b", at(0));
        assert_eq!(h.give_way(b, 100, 0), vec![a]);
        // Its read ended before it heard: its bytes are on their way back all the same.
        assert!(!h.arrived(a));
        assert_eq!((h.held_by(&"a"), h.leaving()), (0, 500));
    }

    #[test]
    fn a_body_told_to_give_way_cuts_no_other() {
        let mut h = Holdings::default();
        let a = h.open("a", at(0));
        h.took(a, 500, at(0));
        let x = h.open("x", at(0));
        assert_eq!(h.give_way(x, 400, 0), vec![a]);
        let b = h.open("b", at(1));
        h.took(b, 1100, at(1));
        // a, told, still asks for 1000 more: b holds more than a would, yet keeps its body.
        assert!(h.give_way(a, 1000, 0).is_empty());
        assert_eq!(h.held_by(&"b"), 1100);
    }

    #[test]
    fn nothing_gives_way_when_not_enough_can() {
        let mut h = Holdings::default();
        let whole = h.open("a", at(0));
        h.took(whole, 900, at(0));
        assert!(h.arrived(whole));
        let small = h.open("a", at(0));
        h.took(small, 10, at(0));
        let b = h.open("b", at(1));
        // a holds 910, but only its 10 arriving bytes could go: 500 cannot be made.
        assert!(h.give_way(b, 500, 0).is_empty());
        assert_eq!((h.held_by(&"a"), h.leaving()), (910, 0));
        // With 495 free, the 10 suffice.
        assert_eq!(h.give_way(b, 500, 495), vec![small]);
    }

    #[test]
    fn a_client_gives_way_only_while_it_would_still_hold_more() {
        let mut h = Holdings::default();
        let a = h.open("a", at(0));
        h.took(a, 500, at(0));
        let b = h.open("b", at(0));
        h.took(b, 200, at(0));
        // b would hold 200 + 300 = 500: not less than a's 500.
        assert!(h.give_way(b, 300, 0).is_empty());
        // With 299 it would hold 499 < 500: a gives way.
        assert_eq!(h.give_way(b, 299, 0), vec![a]);
    }

    #[test]
    fn a_whole_body_keeps_its_bytes_until_it_closes() {
        let mut h = Holdings::default();
        let a = h.open("a", at(0));
        h.took(a, 500, at(0));
        assert!(h.arrived(a));
        let b = h.open("b", at(0));
        assert!(h.give_way(b, 100, 0).is_empty());
        assert_eq!(h.held_by(&"a"), 500);
        h.close(a);
        assert_eq!(h.held_by(&"a"), 0);
        h.close(b);
        assert!(h.clients.is_empty() && h.bodies.is_empty() && h.givers.is_empty());
    }

    #[test]
    fn bytes_taken_after_giving_way_do_not_count() {
        let mut h = Holdings::default();
        let a = h.open("a", at(0));
        h.took(a, 500, at(0));
        let b = h.open("b", at(0));
        assert_eq!(h.give_way(b, 100, 0), vec![a]);
        // The evicted body's last grant raced its eviction.
        h.took(a, 100, at(1));
        assert_eq!(h.held_by(&"a"), 0);
        h.close(a);
        assert_eq!(h.held_by(&"a"), 0);
    }

    /// Random opens, grants, arrivals, closes and requests for room from four clients: each
    /// client's count is the sum of its bodies that did not give way, and the bytes leaving
    /// the sum of those that did and are open; nothing gives way when the bytes free and
    /// leaving suffice; a body never gives way to its own client or after it arrived; each
    /// victim's client held more than the asking client would, when chosen; and when nothing
    /// more gives way, no other client with a body to give holds more than the asker would.
    #[test]
    fn randomized_counts_and_choices_hold() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _case in 0..300 {
            let mut h = Holdings::default();
            let mut open: Vec<(BodyId, u8)> = Vec::new();
            let mut states: HashMap<BodyId, (u8, u64, bool, bool)> = HashMap::new();
            for step in 0..60u64 {
                let now = at(step);
                match rnd(5) {
                    0 => {
                        let c = rnd(4) as u8;
                        let id = h.open(c, now);
                        open.push((id, c));
                        states.insert(id, (c, 0, true, false));
                    }
                    1 if !open.is_empty() => {
                        let (id, _) = open[rnd(open.len() as u64) as usize];
                        let n = rnd(1000);
                        h.took(id, n, now);
                        let s = states.get_mut(&id).unwrap();
                        s.1 += n;
                    }
                    2 if !open.is_empty() => {
                        let (id, _) = open[rnd(open.len() as u64) as usize];
                        let s = states.get_mut(&id).unwrap();
                        assert_eq!(h.arrived(id), !s.3, "a body that gave way is not handled");
                        s.2 = false;
                    }
                    3 if !open.is_empty() => {
                        let (id, _) = open.swap_remove(rnd(open.len() as u64) as usize);
                        h.close(id);
                        states.remove(&id);
                    }
                    _ if !open.is_empty() => {
                        let (id, c) = open[rnd(open.len() as u64) as usize];
                        let (need, avail) = (rnd(3000), rnd(1000));
                        let mut now_held: HashMap<u8, u64> =
                            (0..4).map(|k| (k, h.held_by(&k))).collect();
                        let mine = now_held[&c] + need;
                        // Only an arriving body, not told to give way, may ask for room.
                        let asker_told = states[&id].3 || !states[&id].2;
                        let victims = h.give_way(id, need, avail);
                        let mut freed =
                            avail + states.values().filter(|s| s.3).map(|s| s.1).sum::<u64>();
                        if freed >= need {
                            assert!(victims.is_empty(), "it fitted already");
                        }
                        if asker_told {
                            assert!(victims.is_empty(), "only an arriving body cuts others");
                        }
                        for v in &victims {
                            let eligible =
                                |k: u8| states.values().any(|s| s.0 == k && s.2 && !s.3 && s.1 > 0);
                            let heaviest = (0..4)
                                .filter(|k| *k != c && eligible(*k))
                                .map(|k| now_held[&k])
                                .max();
                            let s = states.get_mut(v).unwrap();
                            assert_ne!(s.0, c, "a client's own body gave way");
                            assert!(s.2 && !s.3, "only arriving bodies give way");
                            assert_eq!(Some(now_held[&s.0]), heaviest, "the heaviest gives way");
                            assert!(now_held[&s.0] > mine, "only while it holds more");
                            *now_held.get_mut(&s.0).unwrap() -= s.1;
                            s.3 = true;
                            freed += s.1;
                        }
                        // All or nothing: bodies are cut only when the cuts make it fit.
                        assert!(victims.is_empty() || freed >= need, "{freed} < {need}");
                    }
                    _ => {}
                }
                let leaving: u64 = states.values().filter(|s| s.3).map(|s| s.1).sum();
                assert_eq!(h.leaving(), leaving);
                // The index of clients that can give way is in step with their bodies.
                let givers: BTreeSet<(u64, u8)> = (0..4u8)
                    .filter(|k| states.values().any(|s| s.0 == *k && s.2 && !s.3 && s.1 > 0))
                    .map(|k| (h.held_by(&k), k))
                    .collect();
                assert_eq!(h.givers, givers);
                for k in 0..4u8 {
                    let sum: u64 = states
                        .values()
                        .filter(|s| s.0 == k && !s.3)
                        .map(|s| s.1)
                        .sum();
                    assert_eq!(h.held_by(&k), sum, "client {k}");
                }
            }
        }
    }
}
