//! The planner in an in-memory harness: lanes with in-order pipes that deliver (confirm) their
//! oldest chunk, fail (losing what is in flight) and come back, in every order.

use std::collections::VecDeque;

use proptest::prelude::*;
use rand::{Rng, SeedableRng};

use super::*;

/// Lanes with at most `window` chunks in flight each, delivered in order.
struct Sim {
    p: Planner,
    window: usize,
    pipes: Vec<VecDeque<usize>>,
    confirmed: Vec<bool>,
    sent: usize,
    lost_in_flight: usize,
    stolen: usize,
    /// Requests cancelled because another lane's copy of their chunk arrived first.
    cancelled: usize,
    order: Vec<Vec<usize>>,
}

impl Sim {
    fn new(chunks: usize, lanes: usize, window: usize) -> Sim {
        let layout = Layout::new(chunks as u64 * MIN_CHUNK, MIN_CHUNK).unwrap();
        Sim {
            p: Planner::new(layout, lanes).unwrap(),
            window,
            pipes: vec![VecDeque::new(); lanes],
            confirmed: vec![false; chunks],
            sent: 0,
            lost_in_flight: 0,
            stolen: 0,
            cancelled: 0,
            order: vec![Vec::new(); lanes],
        }
    }

    /// Lane `l` fills its pipe; returns whether it took anything.
    fn fill(&mut self, l: usize) -> bool {
        let mut any = false;
        while self.pipes[l].len() < self.window {
            let Some(c) = self.p.next(l).unwrap() else {
                break;
            };
            assert!(
                !self.confirmed[c],
                "chunk {c} handed out after it was confirmed"
            );
            for (o, pipe) in self.pipes.iter().enumerate() {
                assert!(
                    !pipe.contains(&c),
                    "chunk {c} given to lane {l} while lane {o} has it"
                );
            }
            self.pipes[l].push_back(c);
            self.order[l].push(c);
            self.sent += 1;
            any = true;
        }
        any
    }

    /// Lane `l`'s oldest chunk arrives.
    fn deliver(&mut self, l: usize) -> bool {
        let Some(c) = self.pipes[l].pop_front() else {
            return false;
        };
        assert!(!self.confirmed[c], "chunk {c} delivered twice");
        assert!(self.p.sends(l, c), "lane {l} delivered {c}, no longer its");
        self.confirmed[c] = true;
        self.p.confirm(c).unwrap();
        // The other copy's request is cancelled (the planner no longer has anyone send it).
        for (o, pipe) in self.pipes.iter_mut().enumerate() {
            if let Some(i) = pipe.iter().position(|&x| x == c) {
                assert!(!self.p.sends(o, c));
                pipe.remove(i);
                self.cancelled += 1;
            }
        }
        true
    }

    /// Lane `l`'s chunks in its pipe that it holds (not the one it copies).
    fn owned(&self, l: usize) -> Vec<usize> {
        let copy = self.p.copy_of(l);
        self.pipes[l]
            .iter()
            .copied()
            .filter(|&c| Some(c) != copy)
            .collect()
    }

    /// Lane `l` copies another lane's chunk (the end game).
    fn copy(&mut self, l: usize) -> bool {
        if self.pipes[l].len() >= self.window {
            return false;
        }
        let Some(c) = self.p.copy(l).unwrap() else {
            return false;
        };
        assert!(!self.confirmed[c], "copied confirmed chunk {c}");
        assert!(self.pipes[l].is_empty(), "only an idle lane copies");
        let owner = self.p.owner(c).expect("a copied chunk has an owner");
        assert_ne!(owner, l);
        assert_eq!(
            self.owned(owner).last(),
            Some(&c),
            "the chunk its owner took last"
        );
        assert!(self.p.sends(l, c) && self.p.sends(owner, c));
        self.pipes[l].push_back(c);
        self.order[l].push(c);
        self.sent += 1;
        true
    }

    /// Lane `l` steals; the victim cancels its copy (its pipe drops it).
    fn steal(&mut self, l: usize) -> bool {
        if self.pipes[l].len() >= self.window {
            return false;
        }
        let Some(c) = self.p.steal(l).unwrap() else {
            return false;
        };
        assert!(!self.confirmed[c], "stole confirmed chunk {c}");
        assert!(
            !self.pipes[l].contains(&c) && self.p.copy_of(l) != Some(c),
            "lane {l} stole chunk {c} it already sends"
        );
        assert_eq!(
            self.pipes.iter().filter(|p| p.contains(&c)).count(),
            1,
            "a stolen chunk is sent by its victim alone (not one another lane copies)"
        );
        assert_eq!(self.p.owner(c), Some(l));
        let victim = (0..self.pipes.len())
            .find(|&v| v != l && self.pipes[v].contains(&c) && self.p.copy_of(v) != Some(c))
            .expect("a stolen chunk was in some lane's pipe");
        let (theirs, mine) = (self.owned(victim), self.owned(l));
        assert!(
            theirs.len() >= mine.len() + 2,
            "the victim keeps the chunk it is sending and held two more than the thief"
        );
        assert_eq!(theirs.last(), Some(&c), "the victim's last-taken chunk");
        let at = self.pipes[victim].iter().rposition(|&x| x == c).unwrap();
        self.pipes[victim].remove(at);
        self.pipes[l].push_back(c);
        self.order[l].push(c);
        self.sent += 1;
        self.stolen += 1;
        true
    }

    /// Lane `l`'s oldest request fails and gives its chunk back (a copy is dropped; a chunk
    /// another lane copies goes to that lane).
    fn release(&mut self, l: usize) {
        let Some(c) = self.pipes[l].pop_front() else {
            return;
        };
        self.lost_in_flight += 1;
        self.p.release(l, c).unwrap();
        assert!(
            !self.p.sends(l, c),
            "lane {l} still sends {c} after giving it back"
        );
        if let Some(o) = (0..self.pipes.len()).find(|&o| self.pipes[o].contains(&c)) {
            assert!(self.p.sends(o, c), "lane {o} still has {c} in flight");
        }
    }

    fn fail(&mut self, l: usize) {
        self.lost_in_flight += self.pipes[l].len();
        self.pipes[l].clear();
        self.p.fail(l).unwrap();
        assert_eq!(self.p.taken_by(l), 0);
    }

    /// Restore every lane and run round-robin to the end.
    fn finish(&mut self) {
        for l in 0..self.pipes.len() {
            self.p.restore(l).unwrap();
        }
        for _ in 0..100_000 {
            let mut progress = false;
            for l in 0..self.pipes.len() {
                progress |= self.fill(l);
                progress |= self.deliver(l);
            }
            if !progress {
                break;
            }
        }
        self.check_complete();
    }

    fn check_complete(&self) {
        assert!(
            self.p.is_complete(),
            "incomplete: {} of {}",
            self.p.done(),
            self.confirmed.len()
        );
        assert!(self.confirmed.iter().all(|&c| c));
        // A chunk is sent again only if it was lost in flight with a failed lane or stolen.
        assert_eq!(
            self.sent,
            self.confirmed.len() + self.lost_in_flight + self.stolen + self.cancelled
        );
        for l in 0..self.pipes.len() {
            assert_eq!(self.p.taken_by(l), 0);
            assert_eq!(self.p.copy_of(l), None);
        }
    }
}

#[test]
fn layouts_cover_the_file_exactly() {
    for chunk in [MIN_CHUNK, 1500, 4096] {
        for size in (0..=20_000u64).chain([chunk * 1000, chunk * 1000 + 1]) {
            let l = Layout::new(size, chunk).unwrap();
            let mut at = 0;
            for i in 0..l.chunks() {
                let (off, len) = l.range(i).unwrap();
                assert_eq!(off, at);
                assert!(len > 0 && len as u64 <= chunk);
                at += len as u64;
            }
            assert_eq!(at, size);
            assert_eq!(l.range(l.chunks()), None);
        }
    }
    assert_eq!(
        Layout::new(10, MIN_CHUNK - 1),
        Err(UploadError::Chunk(MIN_CHUNK - 1))
    );
    assert_eq!(
        Layout::new(10, MAX_CHUNK + 1),
        Err(UploadError::Chunk(MAX_CHUNK + 1))
    );
    assert!(Layout::new(MAX_CHUNKS * MIN_CHUNK, MIN_CHUNK).is_ok());
    assert!(matches!(
        Layout::new(MAX_CHUNKS * MIN_CHUNK + 1, MIN_CHUNK),
        Err(UploadError::TooManyChunks { .. })
    ));
    assert_eq!(
        Layout::new(MAX_CHUNKS * MAX_CHUNK, MAX_CHUNK)
            .unwrap()
            .range(usize::MAX),
        None
    );
}

/// Paper 001 Alg. 1: with two lanes and no failure, lane 0 sends 0, 1, …, m−1 and lane 1 sends
/// n−1, n−2, …, m, whatever the relative speeds and windows.
#[test]
fn two_lanes_send_from_both_ends_and_meet_once() {
    for n in 0..=120 {
        for window in [1, 2, 5] {
            for seed in 0..8u64 {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
                let speed: f64 = rng.random_range(0.05..0.95);
                let mut s = Sim::new(n, 2, window);
                while !s.p.is_complete() {
                    let l = usize::from(!rng.random_bool(speed));
                    s.fill(l);
                    s.deliver(l);
                }
                s.check_complete();
                let m = s.order[0].len();
                assert_eq!(s.order[0], (0..m).collect::<Vec<_>>(), "n {n} seed {seed}");
                assert_eq!(
                    s.order[1],
                    (m..n).rev().collect::<Vec<_>>(),
                    "n {n} seed {seed}"
                );
            }
        }
    }
}

/// With k lanes each lane's chunks form at most a few monotone runs, and nothing is sent twice.
#[test]
fn more_lanes_split_the_file_into_segments_worked_from_both_ends() {
    for lanes in 1..=MAX_LANES {
        for n in [0, 1, 2, 3, 7, 64, 333] {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(n as u64 * 31 + lanes as u64);
            let mut s = Sim::new(n, lanes, 3);
            while !s.p.is_complete() {
                let l = rng.random_range(0..lanes);
                s.fill(l);
                s.deliver(l);
            }
            s.check_complete();
        }
        // At equal speeds everyone gets work.
        let mut s = Sim::new(8 * lanes, lanes, 1);
        s.finish();
        assert!(s.order.iter().all(|o| !o.is_empty()), "{lanes} lanes");
    }
    // Four lanes at equal speed: two segments, each met in its middle.
    let mut s = Sim::new(100, 4, 1);
    for _ in 0..200 {
        for l in 0..4 {
            s.fill(l);
            s.deliver(l);
        }
    }
    s.check_complete();
    assert_eq!(s.order[0][..5], [0, 1, 2, 3, 4]);
    assert_eq!(s.order[1][..5], [99, 98, 97, 96, 95]);
    assert_eq!(s.order[2][..5], [50, 51, 52, 53, 54]);
    assert_eq!(s.order[3][..5], [49, 48, 47, 46, 45]);
}

/// A lane fails at every step of every small upload (and comes back at a later step, or never
/// while another lane is up): every chunk arrives, and only chunks lost in flight are resent.
#[test]
fn a_failure_at_every_step_loses_nothing_and_resends_only_what_was_in_flight() {
    for lanes in 1..=3 {
        for n in 0..=24 {
            for window in [1, 3] {
                // Steps of a failure-free run, to place the failure at each.
                let mut steps = 0;
                let mut s = Sim::new(n, lanes, window);
                while !s.p.is_complete() {
                    let l = steps % lanes;
                    s.fill(l);
                    s.deliver(l);
                    steps += 1;
                }
                for fail_at in 0..=steps {
                    for back_after in [Some(0), Some(3), None] {
                        let victim = fail_at % lanes;
                        let mut s = Sim::new(n, lanes, window);
                        let mut step = 0;
                        let mut down_since = None;
                        while !s.p.is_complete() && step < 10 * steps + 100 {
                            if step == fail_at {
                                s.fail(victim);
                                down_since = Some(step);
                            }
                            let back = match (down_since, back_after) {
                                (Some(d), Some(a)) => step >= d + a,
                                // With one lane, it must come back for the upload to finish.
                                (Some(_), None) => lanes == 1 && step > fail_at + 5,
                                (None, _) => false,
                            };
                            if back && down_since.is_some() {
                                s.p.restore(victim).unwrap();
                                down_since = None;
                            }
                            let l = step % lanes;
                            s.fill(l);
                            s.deliver(l);
                            step += 1;
                        }
                        s.finish();
                    }
                }
            }
        }
    }
}

/// At the meeting point the fast lane takes the slow lane's queued chunks: the slow lane is left
/// with the one it is sending, and the file ends sooner.
#[test]
fn a_fast_lane_steals_the_slow_lanes_queue_where_they_meet() {
    for n in 2..=60 {
        let run = |steal: bool| {
            let mut s = Sim::new(n, 2, 6);
            let mut steps = 0;
            while !s.p.is_complete() {
                // Lane 0 delivers every step, lane 1 every fourth.
                if !s.fill(0) && steal {
                    while s.steal(0) {}
                }
                s.deliver(0);
                s.fill(1);
                if steps % 4 == 3 {
                    s.deliver(1);
                }
                steps += 1;
            }
            s.check_complete();
            (steps, s.stolen)
        };
        let (plain, none) = run(false);
        let (stealing, stolen) = run(true);
        assert_eq!(none, 0);
        assert!(
            stealing <= plain,
            "{n} chunks: {stealing} steps with steals, {plain} without"
        );
        if n >= 20 {
            assert!(
                stolen > 0 && stealing < plain,
                "{n} chunks: {stolen} stolen, {stealing} vs {plain}"
            );
        }
    }
    // Two lanes stealing whenever they can never pass a chunk back and forth.
    let mut s = Sim::new(30, 2, 8);
    for _ in 0..200 {
        for l in 0..2 {
            s.fill(l);
            while s.steal(l) {}
        }
        assert!(s.stolen <= 30, "ping-pong: {} steals", s.stolen);
        s.deliver(0);
    }
    s.finish();
    // Nobody to steal from.
    let l = Layout::new(4 * MIN_CHUNK, MIN_CHUNK).unwrap();
    let mut p = Planner::new(l, 2).unwrap();
    assert_eq!(p.next(1).unwrap(), Some(3));
    assert_eq!(
        p.steal(0).unwrap(),
        None,
        "lane 1 holds only the chunk it sends"
    );
    p.fail(0).unwrap();
    assert_eq!(p.steal(0).unwrap(), None, "a down lane steals nothing");
}

/// The end game (decision U11): with nothing left to take or steal, the idle fast lane sends
/// the slow lane's last chunk too; the first copy to arrive counts and the other is cancelled.
#[test]
fn an_idle_lane_copies_the_chunk_another_lane_will_finish_last() {
    let mut sooner = 0;
    for n in 2..=40 {
        let run = |copy: bool| {
            let mut s = Sim::new(n, 2, 2);
            let mut steps = 0;
            while !s.p.is_complete() {
                // Lane 0 delivers every step, lane 1 every sixth.
                if !s.fill(0) {
                    while s.steal(0) {}
                    if copy && s.pipes[0].is_empty() {
                        s.copy(0);
                    }
                }
                s.deliver(0);
                s.fill(1);
                if steps % 6 == 5 {
                    s.deliver(1);
                }
                steps += 1;
            }
            s.check_complete();
            (steps, s.cancelled)
        };
        let (plain, none) = run(false);
        let (copying, cancelled) = run(true);
        assert_eq!(none, 0);
        assert!(copying <= plain, "{n} chunks: {copying} vs {plain} steps");
        assert!(cancelled <= 1, "{n} chunks: one copy at the end");
        sooner += usize::from(copying < plain);
    }
    // Not when the slow lane's last chunk was due anyway as the fast lane ran dry (n ≡ 6, 0
    // mod 7 here): 27 of the 39 sizes end sooner.
    assert!(sooner >= 25, "{sooner} of 39 sizes ended sooner");
    let l = Layout::new(4 * MIN_CHUNK, MIN_CHUNK).unwrap();
    let mut p = Planner::new(l, 3).unwrap();
    assert_eq!(p.copy(0).unwrap(), None, "nothing held by anyone");
    let (a, b) = (p.next(0).unwrap().unwrap(), p.next(1).unwrap().unwrap());
    assert_eq!(
        p.copy(0).unwrap(),
        None,
        "a lane holding a chunk copies none"
    );
    assert_eq!(
        p.copy(2).unwrap(),
        Some(a),
        "the lane holding the most, lowest first"
    );
    assert_eq!(p.copy(2).unwrap(), None, "one copy at a time");
    // The owner gives the chunk back: the copier now holds it, and it is not free.
    p.release(0, a).unwrap();
    assert_eq!((p.owner(a), p.copy_of(2)), (Some(2), None));
    assert_eq!(p.taken_by(2), 1);
    // A down lane takes and copies nothing; lane 0 comes back and takes the last free chunk.
    p.fail(0).unwrap();
    let c = p.next(0).unwrap();
    assert_eq!(c, None, "a down lane takes nothing");
    p.restore(0).unwrap();
    let rest = p.next(0).unwrap().unwrap();
    assert_eq!(p.copy(0).unwrap(), None, "it holds a chunk");
    p.confirm(rest).unwrap();
    assert_eq!(
        p.copy(0).unwrap(),
        Some(b),
        "lane 2's chunk was copied by none"
    );
    // The owner fails: the lane copying its chunk takes it over.
    p.fail(1).unwrap();
    assert_eq!((p.owner(b), p.copy_of(0)), (Some(0), None));
    // A confirmed chunk's copies end.
    p.restore(1).unwrap();
    assert_eq!(p.copy(1).unwrap(), Some(b));
    p.confirm(b).unwrap();
    assert!(!p.sends(0, b) && !p.sends(1, b) && p.copy_of(1).is_none());
    p.fail(1).unwrap();
    assert_eq!(p.copy(1).unwrap(), None, "a down lane copies nothing");
}

#[test]
fn resuming_skips_what_the_receiver_holds() {
    for n in 1..=40usize {
        for pattern in 0..6u64 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(pattern * 1000 + n as u64);
            let held = Held::from_fn(n, |_| false);
            assert_eq!(held.count(), 0);
            let has: Vec<bool> = (0..n).map(|_| rng.random_bool(0.5)).collect();
            let held = Held::from_fn(n, |i| has[i]);
            let mut s = Sim::new(n, 2, 2);
            for i in held.iter() {
                s.p.confirm(i).unwrap();
                s.confirmed[i] = true;
            }
            let before = held.count();
            s.sent = before; // held chunks count as sent once
            s.finish();
            for (l, order) in s.order.iter().enumerate() {
                for c in order {
                    assert!(!has[*c], "lane {l} resent chunk {c} the receiver held");
                }
            }
        }
    }
}

/// A receiver that crashed lost chunks it had confirmed: they are sent again, and only they.
#[test]
fn chunks_the_receiver_lost_are_sent_again() {
    for n in 1..=40usize {
        let mut s = Sim::new(n, 2, 3);
        for _ in 0..n {
            s.fill(0);
            s.deliver(0);
            s.fill(1);
            s.deliver(1);
        }
        let lost: Vec<usize> = (0..n).filter(|i| i % 3 == 0 && s.confirmed[*i]).collect();
        for &c in &lost {
            s.p.unconfirm(c).unwrap();
            s.confirmed[c] = false;
            s.lost_in_flight += 1; // counted as a resend
        }
        // Unconfirming a chunk that is not done changes nothing.
        if let Some(c) = (0..n).find(|&c| !s.confirmed[c] && !lost.contains(&c)) {
            s.p.unconfirm(c).unwrap();
        }
        let before: Vec<usize> = s.order.iter().map(Vec::len).collect();
        s.finish();
        let mut resent: Vec<usize> = s
            .order
            .iter()
            .zip(&before)
            .flat_map(|(o, &b)| o[b..].iter().copied())
            .filter(|c| lost.contains(c))
            .collect();
        resent.sort_unstable();
        assert_eq!(resent, lost, "{n} chunks");
    }
}

#[test]
fn bad_calls_are_refused() {
    let l = Layout::new(10 * MIN_CHUNK, MIN_CHUNK).unwrap();
    assert_eq!(Planner::new(l, 0).err(), Some(PlanError::Lanes(0)));
    assert_eq!(
        Planner::new(l, MAX_LANES + 1).err(),
        Some(PlanError::Lanes(MAX_LANES + 1))
    );
    let mut p = Planner::new(l, 2).unwrap();
    assert_eq!(p.next(2), Err(PlanError::NoLane(2)));
    assert_eq!(p.confirm(10), Err(PlanError::NoChunk(10)));
    assert_eq!(p.fail(5), Err(PlanError::NoLane(5)));
    // Releasing a chunk a lane does not hold changes nothing.
    let c = p.next(0).unwrap().unwrap();
    p.release(1, c).unwrap();
    assert_eq!(p.taken_by(0), 1);
    p.release(0, c).unwrap();
    assert_eq!(p.taken_by(0), 0);
    assert_eq!(p.next(1).unwrap(), Some(9));
    assert_eq!(
        p.next(0).unwrap(),
        Some(0),
        "a released chunk is taken again"
    );
    // A down lane takes nothing.
    p.fail(1).unwrap();
    assert_eq!(p.next(1).unwrap(), None);
}

#[test]
fn file_info_headers_round_trip_and_refuse_bad_values() {
    let info = FileInfo {
        layout: Layout::new(12_345, 4096).unwrap(),
        sha256: [0xa5; 32],
    };
    let h = info.headers();
    let get = |name: &str| {
        h.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_bytes())
    };
    assert_eq!(FileInfo::parse(get), Ok(info));
    let with = |name: &'static str, v: &'static str| {
        let mut h = info.headers().map(|(n, v)| (n, v.clone()));
        h.iter_mut().find(|(n, _)| *n == name).unwrap().1 = v.into();
        h
    };
    for (name, v, want) in [
        (SIZE_HEADER, "-1", UploadError::Number(SIZE_HEADER)),
        (
            SIZE_HEADER,
            "99999999999999999999999",
            UploadError::Number(SIZE_HEADER),
        ),
        (CHUNK_HEADER, "0", UploadError::Chunk(0)),
        (CHUNK_HEADER, "1e3", UploadError::Number(CHUNK_HEADER)),
        (SHA256_HEADER, "AB", UploadError::Sha256),
    ] {
        let h = with(name, v);
        let get = |n: &str| h.iter().find(|(k, _)| *k == n).map(|(_, v)| v.as_bytes());
        assert_eq!(FileInfo::parse(get), Err(want), "{name}: {v}");
    }
    assert_eq!(
        FileInfo::parse(|_| None),
        Err(UploadError::Missing(SIZE_HEADER))
    );
    let upper = "A5".repeat(32);
    assert_eq!(parse_sha256(upper.as_bytes()), Err(UploadError::Sha256));
}

#[test]
fn held_lists() {
    let h = Held::from_fn(20, |i| matches!(i, 0..=4 | 7 | 9..=12 | 19));
    assert_eq!(h.to_string(), "0-4,7,9-12,19");
    assert_eq!(Held::parse(h.to_string().as_bytes(), 20), Ok(h.clone()));
    assert_eq!(h.count(), 11);
    assert_eq!(Held::parse(b"", 0), Ok(Held::default()));
    for bad in [
        &b"0-4,3"[..],
        b"5-4",
        b"20",
        b"0-4,5",
        b"1,,2",
        b"a",
        b"-1",
        b"1-",
        b"0-9999999999",
    ] {
        assert_eq!(
            Held::parse(bad, 20),
            Err(UploadError::Held(20)),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Random sends, deliveries, failures and restores on random sizes and lane counts: the
    /// harness's invariants hold at every step and the upload completes.
    #[test]
    fn random_schedules_complete(
        n in 0usize..200,
        lanes in 1usize..=5,
        window in 1usize..6,
        ops in proptest::collection::vec((0u8..12, 0usize..5), 0..400),
    ) {
        let mut s = Sim::new(n, lanes, window);
        for (op, l) in ops {
            let l = l % lanes;
            match op {
                0 => s.fail(l),
                1 => s.p.restore(l).unwrap(),
                2..=4 => { s.fill(l); }
                5 => { s.steal(l); }
                6 => { s.copy(l); }
                7 => s.release(l),
                _ => { s.deliver(l); }
            }
        }
        s.finish();
    }

    #[test]
    fn any_held_list_parses_or_fails_cleanly(b in proptest::collection::vec(any::<u8>(), 0..60), n in 0usize..100) {
        if let Ok(h) = Held::parse(&b, n) {
            prop_assert!(h.iter().all(|i| i < n));
            prop_assert_eq!(Held::parse(h.to_string().as_bytes(), n), Ok(h.clone()));
        }
    }

    #[test]
    fn held_sets_round_trip(bits in proptest::collection::vec(any::<bool>(), 0..300)) {
        let h = Held::from_fn(bits.len(), |i| bits[i]);
        let back = Held::parse(h.to_string().as_bytes(), bits.len()).unwrap();
        let got: Vec<bool> = (0..bits.len()).map(|i| back.iter().any(|j| j == i)).collect();
        prop_assert_eq!(got, bits);
    }
}
