//! The forwarder on simulated paths: an in-memory harness (quinn-proto's `Pair` in spirit)
//! drives it on a virtual clock through thousands of randomized worlds (paths with delays,
//! rates, loss and deaths; devices registering, sending, going away) and checks the invariants
//! after every event.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::scheduler::{by_name, SCHEDULERS};

fn ms(x: u64) -> Duration {
    Duration::from_millis(x)
}

/// A simulated backhaul path.
#[derive(Debug, Clone)]
struct SimPath {
    /// One-way delay.
    delay: Duration,
    /// Bytes per second the path (and server) serve, one request after another.
    rate: f64,
    /// Chance an attempt gets no answer.
    loss: f64,
    /// When the path is dead, as offsets from the start.
    down: Vec<(Duration, Duration)>,
    /// When the path finishes what it has been given.
    busy_until: Instant,
    /// QUIC's counters: packets sent and lost.
    sent: u64,
    lost: u64,
}

impl SimPath {
    fn dead(&self, t0: Instant, now: Instant) -> bool {
        let at = now - t0;
        self.down.iter().any(|&(a, b)| a <= at && at < b)
    }
}

#[derive(Debug)]
enum Event {
    /// A device's request on session `k`.
    Arrive(usize, u64),
    Finish(Attempt, Outcome),
    Resume(Wait),
    Abandon(RequestId),
    Register(ConnId, Priority),
    Close(ConnId),
    Expire,
    ProbeAck(PathId, u64),
}

/// How a request ended, as the harness saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum End {
    Answered(PathId),
    Failed,
    Refused,
    Abandoned,
}

/// A request begun and not over: its session, attempts sent, and when its budget ends.
#[derive(Debug)]
struct Live {
    session: usize,
    sends: usize,
    deadline: Instant,
}

struct World {
    seed: u64,
    f: Forwarder,
    rng: ChaCha8Rng,
    t0: Instant,
    now: Instant,
    end_of_load: Instant,
    paths: Vec<SimPath>,
    events: Vec<Option<Event>>,
    queue: BinaryHeap<Reverse<(Instant, usize)>>,
    sessions: Vec<(HashId, ConnId)>,
    /// Requests begun and not over.
    live: HashMap<RequestId, Live>,
    ends: HashMap<RequestId, End>,
    /// Requests whose device did nothing to them (no abandon, its connection kept).
    undisturbed: Vec<RequestId>,
    closed: Vec<ConnId>,
    /// Whether path 0 never fails and answers within any attempt's limit.
    perfect: bool,
}

impl World {
    fn at(&mut self, t: Instant, e: Event) {
        self.events.push(Some(e));
        self.queue.push(Reverse((t, self.events.len() - 1)));
    }

    fn new(seed: u64) -> World {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let t0 = Instant::now();
        let n = rng.random_range(1..=4usize);
        let perfect = rng.random_bool(0.5);
        let horizon = 20_000u64;
        let paths: Vec<SimPath> = (0..n)
            .map(|i| {
                if i == 0 && perfect {
                    return SimPath {
                        delay: ms(rng.random_range(1..=20)),
                        rate: 1e9,
                        loss: 0.0,
                        down: Vec::new(),
                        busy_until: t0,
                        sent: 0,
                        lost: 0,
                    };
                }
                let down = (0..rng.random_range(0..=2))
                    .map(|_| {
                        let a = rng.random_range(0..horizon);
                        (ms(a), ms(a + rng.random_range(100..5_000)))
                    })
                    .collect();
                SimPath {
                    delay: ms(rng.random_range(1..=150)),
                    rate: 10f64.powf(rng.random_range(4.0..8.0)),
                    loss: if rng.random_bool(0.5) {
                        0.0
                    } else {
                        rng.random_range(0.0..0.3)
                    },
                    down,
                    busy_until: t0,
                    sent: 0,
                    lost: 0,
                }
            })
            .collect();
        let attempts = rng.random_range(1..=4usize);
        let cfg = ForwarderConfig {
            sessions: SessionLimits {
                max_devices: rng.random_range(1..=20),
                per_connection: rng.random_range(1..=4),
                per_address: rng.random_range(1..=20),
                max_inflight: rng.random_range(1..=8),
                idle: ms(rng.random_range(500..30_000)),
            },
            paths: PathConfig::default(),
            attempts: if perfect { attempts.max(n) } else { attempts },
            attempt_timeout: ms(rng.random_range(400..2_000)),
        };
        let name = SCHEDULERS[rng.random_range(0..SCHEDULERS.len())];
        let mut seed_bytes = [0u8; 32];
        rng.fill(&mut seed_bytes);
        let f = Forwarder::new(n, cfg, by_name(name).unwrap(), seed_bytes, t0);
        let mut w = World {
            seed,
            f,
            rng,
            t0,
            now: t0,
            end_of_load: t0 + ms(horizon),
            paths,
            events: Vec::new(),
            queue: BinaryHeap::new(),
            sessions: Vec::new(),
            live: HashMap::new(),
            ends: HashMap::new(),
            undisturbed: Vec::new(),
            closed: Vec::new(),
            perfect,
        };
        let conns = w.rng.random_range(1..=6u64);
        for c in 0..conns {
            for _ in 0..w.rng.random_range(1..=3) {
                let t = t0 + ms(w.rng.random_range(0..horizon / 2));
                let p = if w.rng.random_bool(0.5) {
                    Priority::Priority
                } else {
                    Priority::BestEffort
                };
                w.at(t, Event::Register(c, p));
            }
            if w.rng.random_bool(0.2) {
                let t = t0 + ms(w.rng.random_range(0..horizon));
                w.at(t, Event::Close(c));
            }
        }
        for s in 1..=horizon / 1000 {
            w.at(t0 + ms(s * 1000), Event::Expire);
        }
        w
    }

    /// The world's next event, or a poll of the path table if that comes first.
    fn step(&mut self) -> bool {
        let polling = !self.live.is_empty() || self.now < self.end_of_load;
        let next_event = self.queue.peek().map(|Reverse((t, _))| *t);
        let next_poll = self.f.poll_timeout().filter(|_| polling);
        match (next_event, next_poll) {
            (None, None) => return false,
            (Some(e), Some(p)) if p < e => self.poll(p),
            (None, Some(p)) => self.poll(p),
            _ => {
                let Reverse((t, i)) = self.queue.pop().expect("peeked");
                self.now = self.now.max(t);
                let e = self.events[i].take().expect("each event once");
                self.handle(e);
            }
        }
        if let Err(e) = self.f.audit() {
            panic!("seed {}, at {:?}: {e}", self.seed, self.now - self.t0);
        }
        true
    }

    fn poll(&mut self, t: Instant) {
        self.now = self.now.max(t);
        for probe in self.f.poll(self.now) {
            let p = &self.paths[probe.path.0];
            if !p.dead(self.t0, self.now) {
                let back = self.now + p.delay * 2;
                self.at(back, Event::ProbeAck(probe.path, probe.seq));
            }
        }
    }

    fn handle(&mut self, e: Event) {
        let now = self.now;
        match e {
            Event::Register(conn, priority) => {
                if self.closed.contains(&conn) {
                    return;
                }
                let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), conn as u16);
                if let Ok(h) = self.f.register(conn, addr, priority, now) {
                    let k = self.sessions.len();
                    self.sessions.push((h, conn));
                    // Its requests: a burst or a trickle until the load ends.
                    let mut t = now;
                    while t < self.end_of_load {
                        t += ms(self.rng.random_range(1..1_500));
                        let bytes = self.rng.random_range(0..100_000);
                        self.at(t, Event::Arrive(k, bytes));
                    }
                }
            }
            Event::Arrive(k, bytes) => {
                let (hash, conn) = self.sessions[k];
                let Ok((id, _, step)) = self.f.begin(&hash, conn, bytes, now) else {
                    return;
                };
                let cfg = self.f.config();
                let deadline = now + cfg.attempt_timeout * cfg.attempts as u32;
                let live = Live {
                    session: k,
                    sends: 0,
                    deadline,
                };
                assert!(
                    !self.ends.contains_key(&id) && self.live.insert(id, live).is_none(),
                    "request id {id} given twice"
                );
                if self.rng.random_bool(0.05) {
                    let t = now + ms(self.rng.random_range(0..3_000));
                    self.at(t, Event::Abandon(id));
                } else if !self.closed.contains(&conn) {
                    self.undisturbed.push(id);
                }
                self.follow(id, step);
            }
            Event::Finish(attempt, outcome) => {
                let id = attempt.request;
                match self.f.finish(attempt, outcome, now) {
                    Some(step) => self.follow(id, step),
                    None => assert_eq!(
                        self.ends.get(&id),
                        Some(&End::Abandoned),
                        "{id}: an attempt of a request not abandoned was ignored"
                    ),
                }
            }
            Event::Resume(wait) => {
                let id = wait.request;
                let step = self.f.resume(wait, now);
                if self.live.contains_key(&id) {
                    self.follow(id, step);
                } else {
                    assert_eq!(step, Step::Failed, "{id}: abandoned, then resumed");
                }
            }
            Event::Abandon(id) => {
                self.f.abandon(id, now);
                if self.live.remove(&id).is_some() {
                    self.ends.insert(id, End::Abandoned);
                }
            }
            Event::Close(conn) => {
                self.closed.push(conn);
                self.f.end_connection(conn);
                let hit: Vec<RequestId> = self
                    .live
                    .iter()
                    .filter(|(_, l)| self.sessions[l.session].1 == conn)
                    .map(|(id, _)| *id)
                    .collect();
                self.undisturbed.retain(|id| !hit.contains(id));
            }
            Event::Expire => {
                self.f.expire(now);
                // The shell's other callers: a new scheduler, a backhaul connection seen gone.
                if self.rng.random_bool(0.1) {
                    let name = SCHEDULERS[self.rng.random_range(0..SCHEDULERS.len())];
                    self.f.set_scheduler(by_name(name).unwrap());
                }
                for i in 0..self.paths.len() {
                    if self.paths[i].dead(self.t0, now) && self.rng.random_bool(0.3) {
                        self.f.on_connection_lost(PathId(i), now);
                    }
                }
            }
            Event::ProbeAck(path, seq) => {
                self.f.on_probe_ack(path, seq, now);
            }
        }
    }

    /// Carry out `step` for request `id`.
    fn follow(&mut self, id: RequestId, step: Step) {
        let now = self.now;
        let attempts = self.f.config().attempts;
        let live = self.live.get_mut(&id).expect("a step for a live request");
        let end = match step {
            Step::Send(a) => {
                assert_eq!(a.request, id, "an attempt under another request's id");
                live.sends += 1;
                assert!(
                    live.sends <= attempts,
                    "{id}: attempt {} of {attempts}",
                    live.sends
                );
                assert!(now < live.deadline, "{id}: an attempt after its budget");
                self.send(a);
                return;
            }
            Step::Wait(wait) => {
                assert!(wait.until > now, "a wait that does not wait");
                assert_eq!(wait.request, id, "a wait under another request's id");
                self.at(wait.until, Event::Resume(wait));
                return;
            }
            Step::Answered(p) => End::Answered(p),
            Step::Failed => {
                assert!(
                    live.sends == attempts || now >= live.deadline,
                    "{id}: failed after {} of {attempts} attempts, budget left",
                    live.sends
                );
                End::Failed
            }
            Step::Refused(_) => {
                let conn = self.sessions[live.session].1;
                assert!(
                    self.closed.contains(&conn),
                    "{id}: refused, connection open"
                );
                End::Refused
            }
        };
        assert!(
            self.live.remove(&id).is_some(),
            "{id} ended twice: {end:?} after {:?}",
            self.ends.get(&id)
        );
        self.ends.insert(id, end);
    }

    /// The simulated path carries attempt `a`.
    fn send(&mut self, a: Attempt) {
        let now = self.now;
        let timeout = self.f.config().attempt_timeout;
        let (t0, bytes) = (self.t0, self.f.requests[&a.request].bytes);
        let p = &mut self.paths[a.path.0];
        let packets = bytes / 1_200 + 1;
        p.sent += packets;
        if p.dead(t0, now) {
            if self.rng.random_bool(0.5) {
                self.at(now, Event::Finish(a, Outcome::ConnectionLost));
            } else {
                self.at(now + timeout, Event::Finish(a, Outcome::Unanswered));
            }
            return;
        }
        if self.rng.random_bool(p.loss) {
            p.lost += 1;
            self.at(now + timeout, Event::Finish(a, Outcome::Unanswered));
            return;
        }
        let start = (now + p.delay).max(p.busy_until);
        p.busy_until = start + Duration::from_secs_f64(bytes as f64 / p.rate);
        let answer = p.busy_until + p.delay;
        if answer > now + timeout {
            self.at(now + timeout, Event::Finish(a, Outcome::Unanswered));
            return;
        }
        // QUIC's estimate wanders around the path's RTT.
        let jitter = p.delay.mul_f64(self.rng.random_range(0.0..1.0));
        let sample = ConnectionSample {
            rtt: p.delay * 2 + jitter,
            cwnd: 14_720 + p.sent * 100,
            sent_packets: p.sent,
            lost_packets: p.lost,
            congestion_events: p.lost,
            min_rtt: p.delay * 2,
        };
        let success = self.rng.random_bool(0.95);
        let outcome = Outcome::Answered {
            success,
            sample: Some(sample),
        };
        self.at(answer, Event::Finish(a, outcome));
    }
}

/// Runs world `seed` to the end; returns it for the caller's checks.
fn run(seed: u64) -> World {
    let mut w = World::new(seed);
    let mut steps = 0;
    while w.step() {
        steps += 1;
        assert!(steps < 200_000, "seed {seed}: no end in sight");
    }
    w
}

#[test]
fn randomized_worlds_keep_every_invariant() {
    // Answered on path 0, answered on another, failed, refused, abandoned.
    let mut ends = [0usize; 5];
    for seed in 0..2_000 {
        let w = run(seed);
        assert!(
            w.live.is_empty(),
            "seed {seed}: {} requests never ended",
            w.live.len()
        );
        assert_eq!(w.f.requests_in_flight(), 0, "seed {seed}");
        for p in w.f.paths().paths() {
            assert_eq!(
                p.pending_requests(),
                0,
                "seed {seed}: path {} holds requests",
                p.id.0
            );
            assert_eq!(p.queued_bytes, 0, "seed {seed}");
        }
        for s in w.f.sessions().iter() {
            assert_eq!(s.inflight, 0, "seed {seed}: session {} in flight", s.hash);
        }
        // With a path that never fails and at least as many attempts as paths, a request its
        // device left alone is answered.
        if w.perfect {
            for id in &w.undisturbed {
                let end = &w.ends[id];
                assert!(
                    matches!(end, End::Answered(_)),
                    "seed {seed}: {id} {end:?} with a perfect path"
                );
            }
        }
        for e in w.ends.values() {
            let k = match e {
                End::Answered(p) if p.0 > 0 => 1,
                End::Answered(_) => 0,
                End::Failed => 2,
                End::Refused => 3,
                End::Abandoned => 4,
            };
            ends[k] += 1;
        }
    }
    // The worlds exercise what they claim to: many requests, most answered, some on other
    // paths than the first, and every other way a request can end.
    let begun: usize = ends.iter().sum();
    assert!(begun > 50_000, "{ends:?}");
    assert!(ends[0] + ends[1] > begun / 2, "{ends:?}");
    assert!(ends[1..].iter().all(|&n| n > 100), "{ends:?}");
}

/// A tiny world: two paths, one device, both probed at t0.
fn pair(scheduler: &str, attempts: usize) -> (Forwarder, Instant, HashId) {
    let t0 = Instant::now();
    let cfg = ForwarderConfig {
        sessions: SessionLimits::DEFAULT,
        paths: PathConfig::default(),
        attempts,
        attempt_timeout: ms(1_000),
    };
    let mut f = Forwarder::new(2, cfg, by_name(scheduler).unwrap(), [7; 32], t0);
    let probes = f.poll(t0);
    for (i, p) in probes.iter().enumerate() {
        f.on_probe_ack(p.path, p.seq, t0 + ms(10 * (i as u64 + 1)));
    }
    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 9);
    let h = f.register(1, addr, Priority::Priority, t0).unwrap();
    (f, t0, h)
}

fn sent(step: Step) -> Attempt {
    match step {
        Step::Send(a) => a,
        other => panic!("expected an attempt, got {other:?}"),
    }
}

#[test]
fn a_retry_keeps_the_request_id_and_avoids_the_failed_path() {
    let (mut f, t0, h) = pair("adaptive", 3);
    let (id, class, step) = f.begin(&h, 1, 16_384, t0 + ms(30)).unwrap();
    assert_eq!(class, Priority::Priority);
    let a = sent(step);
    assert_eq!((a.request, a.path), (id, PathId(0)));
    let b = sent(f.finish(a, Outcome::Unanswered, t0 + ms(1_030)).unwrap());
    assert_eq!((b.request, b.path), (id, PathId(1)));
    assert_eq!(f.paths().get(PathId(1)).unwrap().hits, 1);
    assert_eq!(f.paths().get(PathId(0)).unwrap().hits, 0);
    let done = f.finish(
        b,
        Outcome::Answered {
            success: true,
            sample: None,
        },
        t0 + ms(1_060),
    );
    assert_eq!(done, Some(Step::Answered(PathId(1))));
    assert_eq!(f.requests_in_flight(), 0);
    f.audit().unwrap();
    // The next request has the next id.
    let (next, _, _) = f.begin(&h, 1, 10, t0 + ms(1_100)).unwrap();
    assert_eq!((next.instance, next.seq), (id.instance, id.seq + 1));
}

#[test]
fn the_budget_ends_a_request_and_frees_its_place() {
    let (mut f, t0, h) = pair("single", 2);
    let (id, _, step) = f.begin(&h, 1, 100, t0 + ms(30)).unwrap();
    let a = sent(step);
    let b = sent(f.finish(a, Outcome::Unanswered, t0 + ms(1_030)).unwrap());
    // `single` has one path; avoiding it leaves none, so the retry goes there again.
    assert_eq!((b.request, b.path), (id, PathId(0)));
    assert_eq!(
        f.finish(b, Outcome::Unanswered, t0 + ms(2_030)),
        Some(Step::Failed)
    );
    assert_eq!(f.sessions().iter().next().unwrap().inflight, 0);
    f.audit().unwrap();
}

#[test]
fn with_every_path_down_a_request_waits_then_goes_out() {
    let (mut f, t0, h) = pair("completion", 3);
    f.on_connection_lost(PathId(0), t0);
    f.on_connection_lost(PathId(1), t0);
    let (id, _, step) = f.begin(&h, 1, 100, t0 + ms(30)).unwrap();
    let Step::Wait(wait) = step else {
        panic!("{step:?}")
    };
    assert_eq!(
        (wait.request, wait.until),
        (id, t0 + ms(30) + WAIT_FOR_PATH)
    );
    // Probing finds path 1 again.
    let at = f.poll_timeout().unwrap();
    let probes = f.poll(at);
    let p1 = probes.iter().find(|p| p.path == PathId(1)).unwrap();
    f.on_probe_ack(PathId(1), p1.seq, at + ms(20));
    let a = sent(f.resume(wait, at + ms(20)));
    assert_eq!(a.path, PathId(1));
    f.audit().unwrap();
    // Abandoned with the attempt under way: everything is handed back, and the attempt's late
    // end is ignored.
    f.abandon(id, at + ms(30));
    assert_eq!(f.paths().get(PathId(1)).unwrap().pending_requests(), 0);
    assert_eq!(f.finish(a, Outcome::Unanswered, at + ms(40)), None);
    f.audit().unwrap();
}

#[test]
fn a_closed_connection_refuses_its_requests_at_their_next_step() {
    let (mut f, t0, h) = pair("adaptive", 3);
    let (_, _, step) = f.begin(&h, 1, 100, t0 + ms(30)).unwrap();
    let a = sent(step);
    assert_eq!(f.end_connection(1), 1);
    assert_eq!(f.paths().get(a.path).unwrap().hits, 0);
    f.audit().unwrap();
    assert_eq!(
        f.finish(a, Outcome::ConnectionLost, t0 + ms(40)),
        Some(Step::Refused(SessionError::Unknown))
    );
    assert_eq!(f.requests_in_flight(), 0);
    // The failed path was taken down.
    assert!(!f.paths().paths().iter().all(|p| p.up));
    f.audit().unwrap();
}

#[test]
fn a_session_admits_no_more_than_its_limit_in_flight() {
    let (mut f, t0, h) = pair("completion", 1);
    let limit = SessionLimits::DEFAULT.max_inflight;
    let attempts: Vec<Attempt> = (0..limit)
        .map(|_| sent(f.begin(&h, 1, 10, t0 + ms(30)).unwrap().2))
        .collect();
    assert_eq!(
        f.begin(&h, 1, 10, t0 + ms(30)).unwrap_err(),
        SessionError::InFlight(limit)
    );
    assert_eq!(
        f.begin(&h, 2, 10, t0 + ms(30)).unwrap_err(),
        SessionError::Forged
    );
    for a in attempts {
        let out = Outcome::Answered {
            success: false,
            sample: None,
        };
        assert!(f.finish(a, out, t0 + ms(60)).unwrap().is_final());
    }
    f.audit().unwrap();
    assert!(f.begin(&h, 1, 10, t0 + ms(70)).is_ok());
}

#[test]
fn first_use_registers_once_per_connection_and_class() {
    let (mut f, t0, _) = pair("completion", 1);
    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 10);
    let (a, new) = f.session_for(5, addr, Priority::BestEffort, t0).unwrap();
    assert!(new);
    assert_eq!(
        f.session_for(5, addr, Priority::BestEffort, t0).unwrap(),
        (a, false)
    );
    let (b, _) = f.session_for(5, addr, Priority::Priority, t0).unwrap();
    assert_ne!(a, b);
    // Another connection gets its own.
    let (c, _) = f.session_for(6, addr, Priority::BestEffort, t0).unwrap();
    assert_ne!(a, c);
    assert_eq!(f.sessions().len(), 4);
    // An expired session is registered anew; a closed connection forgets its own.
    let idle = SessionLimits::DEFAULT.idle + ms(1);
    assert_eq!(f.expire(t0 + idle), 4);
    let (a2, new) = f
        .session_for(5, addr, Priority::BestEffort, t0 + idle)
        .unwrap();
    assert!(new && a != a2);
    assert_eq!(f.end_connection(5), 1);
    assert!(!f.first_use.contains_key(&5));
    // The per-connection bound holds for sessions made on first use too.
    for _ in 0..2 {
        f.session_for(7, addr, Priority::Priority, t0 + idle)
            .unwrap();
    }
    assert_eq!(f.sessions().iter().filter(|s| s.conn == 7).count(), 1);
    f.audit().unwrap();
}

#[test]
fn a_spooled_record_is_placed_and_retried_without_a_session() {
    let (mut f, t0, _) = pair("adaptive", 3);
    let (id, step) = f.begin_spooled(Priority::BestEffort, 100, t0 + ms(30));
    let a = sent(step);
    assert!(!a.urgent, "a best-effort record's first attempt");
    // Its connection-less entry is untouched by a device's connection closing.
    assert_eq!(f.end_connection(1), 1);
    let b = sent(f.finish(a, Outcome::Unanswered, t0 + ms(1_030)).unwrap());
    assert_eq!(b.request, id);
    assert!(b.urgent, "a retry goes at priority's urgency (G24)");
    assert_eq!(
        f.finish(
            b,
            Outcome::Answered {
                success: true,
                sample: None
            },
            t0 + ms(1_060)
        )
        .map(|s| s.is_final()),
        Some(true)
    );
    assert_eq!(f.requests_in_flight(), 0);
    f.audit().unwrap();
    // With no path up it waits, like any request; abandoned, nothing is left.
    f.on_connection_lost(PathId(0), t0 + ms(2_000));
    f.on_connection_lost(PathId(1), t0 + ms(2_000));
    let (id, step) = f.begin_spooled(Priority::Priority, 100, t0 + ms(2_010));
    assert!(matches!(step, Step::Wait(_)), "{step:?}");
    f.abandon(id, t0 + ms(2_020));
    assert_eq!(f.requests_in_flight(), 0);
    f.audit().unwrap();
}
