//! The gateway's forwarding core (paper 000 §3.3–3.4), sans-IO: the session table, the path
//! table, the scheduler, the requests in flight with their retry budgets and ids, behind one
//! interface the shell calls under one lock (decision G17).
//!
//! A forwarded request goes through [`Forwarder::begin`] (its session admits it, a path is
//! picked, the path's queue counts it) and then one [`Forwarder::finish`] per attempt, each of
//! which says what to do next: the answer is final, retry on another path with the same request
//! id, wait for a path to come up ([`Forwarder::resume`] at the given instant), or give up. A
//! request the shell stops caring about (its device went away) is handed back with
//! [`Forwarder::abandon`]. Every call takes `now`, which must not go backwards; the path side
//! (probes, QUIC's estimates, connection events) is fed through [`Forwarder::poll`],
//! [`Forwarder::poll_timeout`] and the `on_*` methods, as quinn-proto's `Connection` is.
//!
//! Invariants, checked by [`Forwarder::audit`] after every step of the randomized harness in
//! the tests: a path's hits are the sessions assigned to it; a session's in-flight count is its
//! requests here; a path's pending requests are the attempts under way on it; a request is
//! answered, failed, refused or abandoned exactly once.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::path::{ConnectionSample, PathConfig, PathId, PathTable, Probe, Ticket};
use crate::scheduler::{pick_avoiding, Ask, Priority, Scheduler};
use crate::session::{ConnId, HashId, Session, SessionError, SessionLimits, SessionTable};

/// How long a request waits before asking again while no path is up (probing brings paths
/// back at the probe timeout's pace, at least 100 ms by default).
pub const WAIT_FOR_PATH: Duration = Duration::from_millis(50);

/// The forwarder's bounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ForwarderConfig {
    /// The session table's bounds.
    pub sessions: SessionLimits,
    /// Probing.
    pub paths: PathConfig,
    /// Attempts per request (paths tried, a path that comes back counted again).
    pub attempts: usize,
    /// One attempt's limit; a request's whole budget is `attempts` of them.
    pub attempt_timeout: Duration,
}

/// A forwarded request's id, as the server sees it in `qgate-request-id`: the gateway instance
/// and a sequence number. Every attempt of a request carries the same id, so the server stores
/// a request retried on another path once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId {
    /// The gateway instance (from its seed).
    pub instance: u64,
    /// The request's number within the instance.
    pub seq: u64,
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}-{}", self.instance, self.seq)
    }
}

/// One attempt of a request on a path, to be reported with [`Forwarder::finish`]. Not `Clone`:
/// an attempt ends once.
#[derive(Debug, PartialEq, Eq)]
pub struct Attempt {
    /// The request.
    pub request: RequestId,
    /// The path it goes out on.
    pub path: PathId,
    /// Whether it goes at priority's urgency: a priority request, or a best-effort one whose
    /// earlier attempt failed, which priority traffic may then delay but not starve (decision
    /// G24).
    pub urgent: bool,
    ticket: Ticket,
}

/// A request waiting for a path, to be resumed with [`Forwarder::resume`]. Not `Clone`: a
/// wait ends once.
#[derive(Debug, PartialEq, Eq)]
pub struct Wait {
    /// The request.
    pub request: RequestId,
    /// When to resume it.
    pub until: Instant,
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Outcome {
    /// The server answered: `success` if with a 2xx (only those time the path, decision
    /// G14). `sample` is the path's QUIC counters read after the answer.
    Answered {
        /// Whether the status was 2xx.
        success: bool,
        /// The connection's state now, if the shell read it.
        sample: Option<ConnectionSample>,
    },
    /// No answer (the attempt's limit passed, or its stream failed): the stream was cancelled,
    /// the connection kept (decision G5).
    Unanswered,
    /// The path's connection is gone (or could not be had): the path is down until probing
    /// brings it back.
    ConnectionLost,
}

/// What the shell does next with a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Send it on `attempt.path` with its request id, and report with
    /// [`Forwarder::finish`].
    Send(Attempt),
    /// No path is up: call [`Forwarder::resume`] at `Wait::until`.
    Wait(Wait),
    /// The server's answer (on this path) is the request's: it is over.
    Answered(PathId),
    /// Every attempt failed or its budget ran out: it is over.
    Failed,
    /// Its session ended meanwhile (connection closed, or expired): it is over.
    Refused(SessionError),
}

impl Step {
    /// Whether the request is over (no call for it may follow).
    pub fn is_final(&self) -> bool {
        !matches!(self, Step::Send(_) | Step::Wait(_))
    }
}

/// A request between `begin` and its final step.
#[derive(Debug)]
struct InFlight {
    /// Its session; `None` for a record drained from the gateway's spool, whose device may be
    /// long gone.
    hash: Option<HashId>,
    class: Priority,
    conn: ConnId,
    bytes: u64,
    /// Paths where an attempt failed: avoided while another is up.
    tried: Vec<PathId>,
    attempts: usize,
    deadline: Instant,
    /// The attempt under way, if any.
    current: Option<Ticket>,
}

/// The forwarding core.
pub struct Forwarder {
    sessions: SessionTable,
    paths: PathTable,
    scheduler: Box<dyn Scheduler>,
    requests: HashMap<RequestId, InFlight>,
    /// Sessions registered on first use ([`Forwarder::session_for`]), per connection and class
    /// (best effort, priority); an entry may outlive its session, never its connection.
    first_use: HashMap<ConnId, [Option<HashId>; 2]>,
    instance: u64,
    next_seq: u64,
    cfg: ForwarderConfig,
}

impl fmt::Debug for Forwarder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Forwarder")
            .field("sessions", &self.sessions.len())
            .field("paths", &self.paths.paths().len())
            .field("scheduler", &self.scheduler.name())
            .field("requests", &self.requests.len())
            .finish()
    }
}

impl Forwarder {
    /// `n` backhaul paths (probed at once), `scheduler`, Hash IDs and the instance id from
    /// `seed`.
    pub fn new(
        n: usize,
        cfg: ForwarderConfig,
        scheduler: Box<dyn Scheduler>,
        seed: [u8; 32],
        now: Instant,
    ) -> Forwarder {
        Forwarder {
            sessions: SessionTable::new(cfg.sessions, seed),
            paths: PathTable::new(n, cfg.paths, now),
            scheduler,
            requests: HashMap::new(),
            first_use: HashMap::new(),
            instance: u64::from_le_bytes(seed[..8].try_into().expect("8 bytes")),
            next_seq: 1,
            cfg,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ForwarderConfig {
        &self.cfg
    }

    /// The session table.
    pub fn sessions(&self) -> &SessionTable {
        &self.sessions
    }

    /// The path table.
    pub fn paths(&self) -> &PathTable {
        &self.paths
    }

    /// The scheduler's name.
    pub fn scheduler_name(&self) -> &'static str {
        self.scheduler.name()
    }

    /// Choose paths with `scheduler` from now on (sessions keep their paths until it moves
    /// them).
    pub fn set_scheduler(&mut self, scheduler: Box<dyn Scheduler>) {
        self.scheduler = scheduler;
    }

    /// Requests between `begin` and their final step.
    pub fn requests_in_flight(&self) -> usize {
        self.requests.len()
    }

    /// Register a device on connection `conn` from `device` (Fig. 2 steps 4–6).
    pub fn register(
        &mut self,
        conn: ConnId,
        device: SocketAddr,
        priority: Priority,
        now: Instant,
    ) -> Result<HashId, SessionError> {
        self.sessions.register(conn, device, device, priority, now)
    }

    /// The session of class `priority` that `conn` registered on first use, registered now if
    /// it has none (decision G18): a returning device's first records carry their class instead
    /// of a Hash ID, so they can ride in 0-RTT with no registration round trip before them.
    /// Returns the session and whether it is new.
    pub fn session_for(
        &mut self,
        conn: ConnId,
        device: SocketAddr,
        priority: Priority,
        now: Instant,
    ) -> Result<(HashId, bool), SessionError> {
        let k = usize::from(priority == Priority::Priority);
        if let Some(h) = self.first_use.get(&conn).and_then(|s| s[k]) {
            if self.sessions.lookup(&h, conn, now).is_ok() {
                return Ok((h, false));
            }
        }
        let h = self.register(conn, device, priority, now)?;
        self.first_use.entry(conn).or_default()[k] = Some(h);
        Ok((h, true))
    }

    /// A request of `bytes` carrying `hash` arrived on `conn`: its session admits it (one
    /// lookup: bound to `conn`, room in flight) and its first step is planned. Returns its id
    /// and class with the step.
    pub fn begin(
        &mut self,
        hash: &HashId,
        conn: ConnId,
        bytes: u64,
        now: Instant,
    ) -> Result<(RequestId, Priority, Step), SessionError> {
        let s = self.sessions.begin(hash, conn, now)?;
        let priority = s.priority;
        let id = RequestId {
            instance: self.instance,
            seq: self.next_seq,
        };
        self.next_seq += 1;
        let budget = self.cfg.attempt_timeout * self.cfg.attempts.max(1) as u32;
        let mut r = InFlight {
            hash: Some(*hash),
            class: priority,
            conn,
            bytes,
            tried: Vec::new(),
            attempts: 0,
            deadline: now + budget,
            current: None,
        };
        let pick = assign(&mut *self.scheduler, &mut self.paths, s, &r, now);
        let step = attempt(&mut self.paths, id, &mut r, pick, priority, now);
        self.requests.insert(id, r);
        Ok((id, priority, step))
    }

    /// A record of `class` and `bytes` drained from the gateway's spool: no session holds it
    /// (its device may be long gone), but the scheduler places it as a new device's record of
    /// its class, and its attempts and retries are planned like any request's (issue 50).
    pub fn begin_spooled(
        &mut self,
        class: Priority,
        bytes: u64,
        now: Instant,
    ) -> (RequestId, Step) {
        let id = RequestId {
            instance: self.instance,
            seq: self.next_seq,
        };
        self.next_seq += 1;
        let budget = self.cfg.attempt_timeout * self.cfg.attempts.max(1) as u32;
        let mut r = InFlight {
            hash: None,
            class,
            conn: ConnId::MAX,
            bytes,
            tried: Vec::new(),
            attempts: 0,
            deadline: now + budget,
            current: None,
        };
        let pick = pick_avoiding(
            &mut *self.scheduler,
            &self.paths,
            &Ask::new(class, bytes, None, now),
        );
        let step = attempt(&mut self.paths, id, &mut r, pick, class, now);
        self.requests.insert(id, r);
        (id, step)
    }

    /// Plan the next attempt after a [`Step::Wait`]. A request abandoned meanwhile is
    /// [`Step::Failed`].
    pub fn resume(&mut self, wait: Wait, now: Instant) -> Step {
        self.next(wait.request, now)
    }

    /// `attempt` ended with `outcome`: update the path and plan what follows. `None` if the
    /// request was abandoned meanwhile (nothing to do).
    pub fn finish(&mut self, attempt: Attempt, outcome: Outcome, now: Instant) -> Option<Step> {
        let r = self.requests.get_mut(&attempt.request)?;
        debug_assert_eq!(r.current, Some(attempt.ticket), "one attempt at a time");
        r.current = None;
        let path = attempt.path;
        match outcome {
            Outcome::Answered { success, sample } => {
                // A success times the path (decision G14); a refusal may not have read the
                // body, so its ticket only ends.
                if success {
                    self.paths.on_request_answered(attempt.ticket, now);
                }
                self.paths.on_request_done(attempt.ticket);
                self.paths.on_heard(path);
                // Every answer refreshes the path's RTT, window and loss from QUIC (§3.2).
                if let Some(s) = sample {
                    self.paths.on_connection_sample(path, s);
                }
                self.end(attempt.request, now);
                Some(Step::Answered(path))
            }
            Outcome::Unanswered => {
                self.paths.on_request_done(attempt.ticket);
                r.tried.push(path);
                Some(self.next(attempt.request, now))
            }
            Outcome::ConnectionLost => {
                self.paths.on_request_done(attempt.ticket);
                self.paths.on_connection_lost(path, now);
                r.tried.push(path);
                Some(self.next(attempt.request, now))
            }
        }
    }

    /// The shell gave up on `id` (its device went away, or its task was dropped): its attempt,
    /// if any, and its place in flight are handed back. Nothing if it is already over.
    pub fn abandon(&mut self, id: RequestId, now: Instant) {
        if let Some(r) = self.requests.get(&id) {
            if let Some(t) = r.current {
                self.paths.on_request_done(t);
            }
            self.end(id, now);
        }
    }

    /// The request `id` is over: its session has one fewer in flight.
    fn end(&mut self, id: RequestId, now: Instant) {
        if let Some(h) = self.requests.remove(&id).and_then(|r| r.hash) {
            self.sessions.end(&h, now);
        }
    }

    /// The step after an attempt that failed (or a wait): another attempt while the budget
    /// lasts and the session lives.
    fn next(&mut self, id: RequestId, now: Instant) -> Step {
        let Some(mut r) = self.requests.remove(&id) else {
            return Step::Failed;
        };
        if r.attempts >= self.cfg.attempts.max(1) || now >= r.deadline {
            if let Some(h) = r.hash {
                self.sessions.end(&h, now);
            }
            return Step::Failed;
        }
        let class = r.class;
        let pick = match r.hash {
            Some(h) => match self.sessions.lookup(&h, r.conn, now) {
                Ok(s) => assign(&mut *self.scheduler, &mut self.paths, s, &r, now),
                Err(e) => {
                    self.sessions.end(&h, now);
                    return Step::Refused(e);
                }
            },
            None => {
                let ask = Ask {
                    avoid: &r.tried,
                    ..Ask::new(class, r.bytes, None, now)
                };
                pick_avoiding(&mut *self.scheduler, &self.paths, &ask)
            }
        };
        let step = attempt(&mut self.paths, id, &mut r, pick, class, now);
        self.requests.insert(id, r);
        step
    }

    /// Connection `conn` closed: its sessions end (their requests are refused at their next
    /// step). Returns how many ended.
    pub fn end_connection(&mut self, conn: ConnId) -> usize {
        self.first_use.remove(&conn);
        let gone = self.sessions.remove_connection(conn);
        self.release(&gone);
        gone.len()
    }

    /// End sessions idle for longer than the limit (decision G10); returns how many.
    pub fn expire(&mut self, now: Instant) -> usize {
        let gone = self.sessions.expire(now);
        self.release(&gone);
        gone.len()
    }

    /// The path hits of sessions that ended.
    fn release(&mut self, gone: &[Session]) {
        for p in gone.iter().filter_map(|s| s.path) {
            self.paths.remove_hit(p);
        }
    }

    /// Advance the path table to `now`; the probes to send.
    pub fn poll(&mut self, now: Instant) -> Vec<Probe> {
        self.paths.poll(now)
    }

    /// When [`poll`](Self::poll) next has something to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.paths.next_timeout()
    }

    /// The answer to probe `seq` arrived on `path`.
    pub fn on_probe_ack(&mut self, path: PathId, seq: u64, now: Instant) -> Option<Duration> {
        let rtt = self.paths.on_probe_ack(path, seq, now);
        self.paths.on_heard(path);
        rtt
    }

    /// QUIC's counters for `path`'s connection.
    pub fn on_connection_sample(&mut self, path: PathId, s: ConnectionSample) {
        self.paths.on_connection_sample(path, s);
    }

    /// `path`'s connection closed: it is down until probing brings it back.
    pub fn on_connection_lost(&mut self, path: PathId, now: Instant) {
        self.paths.on_connection_lost(path, now);
    }

    /// Check the invariants (for tests and debugging): `Err` names the first broken one.
    pub fn audit(&self) -> Result<(), String> {
        for p in self.paths.paths() {
            let assigned = self
                .sessions
                .iter()
                .filter(|s| s.path == Some(p.id))
                .count();
            if assigned != p.hits as usize {
                return Err(format!(
                    "path {}: {} hits but {assigned} sessions",
                    p.id.0, p.hits
                ));
            }
            let attempts = self
                .requests
                .values()
                .filter(|r| r.current.is_some_and(|t| t.path == p.id))
                .count();
            if attempts != p.pending_requests() {
                return Err(format!(
                    "path {}: {} pending but {attempts} attempts under way",
                    p.id.0,
                    p.pending_requests()
                ));
            }
        }
        for s in self.sessions.iter() {
            let n = self
                .requests
                .values()
                .filter(|r| r.hash == Some(s.hash))
                .count();
            if n != s.inflight {
                return Err(format!(
                    "session {}: {} in flight but {n} requests",
                    s.hash, s.inflight
                ));
            }
        }
        Ok(())
    }
}

/// The path for `r`'s next attempt, chosen for session `s` (moved if the scheduler says so,
/// its hits following it).
fn assign(
    scheduler: &mut dyn Scheduler,
    paths: &mut PathTable,
    s: &mut Session,
    r: &InFlight,
    now: Instant,
) -> Option<PathId> {
    let ask = Ask {
        priority: s.priority,
        bytes: r.bytes,
        current: s.path,
        avoid: &r.tried,
        now,
    };
    let pick = pick_avoiding(scheduler, paths, &ask);
    if pick != s.path {
        if let Some(o) = s.path {
            paths.remove_hit(o);
        }
        if let Some(p) = pick {
            paths.add_hit(p);
        }
        s.path = pick;
    }
    pick
}

/// An attempt of `r` on `pick`, or a wait for a path.
fn attempt(
    paths: &mut PathTable,
    id: RequestId,
    r: &mut InFlight,
    pick: Option<PathId>,
    class: Priority,
    now: Instant,
) -> Step {
    match pick {
        None => Step::Wait(Wait {
            request: id,
            until: (now + WAIT_FOR_PATH).min(r.deadline),
        }),
        Some(path) => {
            let urgent = class == Priority::Priority || r.attempts > 0;
            r.attempts += 1;
            let ticket = paths.on_request_sent(path, urgent, r.bytes, now);
            r.current = Some(ticket);
            Step::Send(Attempt {
                request: id,
                path,
                urgent,
                ticket,
            })
        }
    }
}

#[cfg(test)]
mod tests;
