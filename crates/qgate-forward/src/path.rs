//! The gateway's path table (paper 000 §3.2, Table 1): per backhaul path its RTT, how many
//! devices use it (hits) and whether it is up. Sans-IO: the shell sends the probes this table
//! asks for, feeds back acknowledgements, QUIC's own RTT estimates and signs of life, and calls
//! `poll` with the current time.
//!
//! Probing: every `probe_interval` (paper: 30 s) per path. A silent path is found much sooner:
//! an unanswered probe is retried after `max(3 × srtt, min_probe_timeout)`, and `dead_after`
//! misses in a row mark the path down; forwarded traffic that gets no answer within the same
//! timeout triggers a probe at once. A down path keeps being probed at the timeout pace and
//! comes back up on the first answer.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A backhaul path, by its index in the gateway's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PathId(pub usize);

/// Path-manager settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PathConfig {
    /// Time between routine probes (paper 000: 30 s).
    pub probe_interval: Duration,
    /// Smallest wait for a probe answer.
    pub min_probe_timeout: Duration,
    /// Consecutive unanswered probes that mark a path down.
    pub dead_after: u32,
    /// Weight of a new RTT sample in the smoothed RTT (RFC 6298's 1/8).
    pub rtt_weight: f64,
}

impl Default for PathConfig {
    fn default() -> Self {
        PathConfig {
            probe_interval: Duration::from_secs(30),
            min_probe_timeout: Duration::from_millis(100),
            dead_after: 3,
            rtt_weight: 0.125,
        }
    }
}

/// A probe the shell must send now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// On which path.
    pub path: PathId,
    /// Sequence number to echo back.
    pub seq: u64,
}

/// What QUIC says about a path's connection, read by the shell after answers and probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionSample {
    /// QUIC's smoothed RTT.
    pub rtt: Duration,
    /// The congestion window, bytes.
    pub cwnd: u64,
    /// Packets sent on the connection so far.
    pub sent_packets: u64,
    /// Packets declared lost so far.
    pub lost_packets: u64,
    /// Congestion events so far (none: the window is still in slow start).
    pub congestion_events: u64,
    /// QUIC's minimum RTT of the connection.
    pub min_rtt: Duration,
}

/// A forwarded request's place in its path's queue, handed back with
/// [`PathTable::on_request_answered`] or [`PathTable::on_request_done`] (either, or both in
/// that order: the second finds nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    /// The path it went out on.
    pub path: PathId,
    seq: u64,
}

/// Packets over which the loss estimate averages (a per-packet EWMA).
const LOSS_WINDOW_PACKETS: f64 = 256.0;

/// The window a connection is assumed to have before QUIC has reported one (quinn's initial
/// window for a 1200-byte MTU: 10 packets, at least 14 720 bytes).
pub const ASSUMED_WINDOW: f64 = 14_720.0;

/// How much each earlier sample of a path's answer rate still counts when a new one arrives (about the last ten answers).
const SERVED_DECAY: f64 = 0.9;

/// The smallest request whose answer is a sample of the answer rate: one packet's payload.
const SERVED_MIN_BYTES: u64 = 1_200;

/// Samples needed before the answer rate bounds the drain rate.
const SERVED_MIN_SAMPLES: u32 = 4;

/// A path's answer rate is forgotten this long after its last sample, so a path judged slow
/// (after an outage, say) is tried again rather than avoided for good.
const SERVED_TTL: Duration = Duration::from_secs(2);

/// A request sent on a path and not yet answered.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Pending {
    sent: Instant,
    bytes: u64,
    /// Whether it fitted in the window with the bytes unsent before it: its answer then times
    /// the path, not the window's growth.
    in_window: bool,
    /// Whether it went at priority's urgency (a priority request, or a best-effort one sent
    /// again): a best-effort request's bytes wait behind every urgent byte (decision G24).
    urgent: bool,
}

/// One row of Table 1, and what the per-request scheduler needs beyond it.
#[derive(Debug, Clone, PartialEq)]
pub struct PathState {
    /// The path.
    pub id: PathId,
    /// Smoothed RTT, once measured.
    pub rtt: Option<Duration>,
    /// Devices currently assigned to this path.
    pub hits: u32,
    /// Whether the path carries traffic.
    pub up: bool,
    /// QUIC's latest smoothed RTT of the path's connection (not smoothed again here).
    pub quic_rtt: Option<Duration>,
    /// The connection's congestion window, bytes, once known.
    pub cwnd: Option<u64>,
    /// Whether the connection has had no congestion event yet (its window doubles each RTT
    /// while the sender fills it).
    pub slow_start: bool,
    /// Fraction of packets lost, averaged over about [`LOSS_WINDOW_PACKETS`] packets.
    pub loss: f64,
    /// Request bytes sent on the path and not yet answered.
    pub queued_bytes: u64,
    /// Those of them sent at priority's urgency.
    urgent_bytes: u64,
    /// Requests sent on the path and not yet answered, by ticket.
    pending: BTreeMap<u64, Pending>,
    /// QUIC's minimum RTT of the connection, once known.
    pub min_rtt: Option<Duration>,
    /// When the path last answered a request.
    last_answer: Option<Instant>,
    /// When the path last answered a best-effort request sent at urgency 0 (not sent again).
    last_best_effort_answer: Option<Instant>,
    /// When the answer rate last had a sample.
    served_at: Option<Instant>,
    /// Decayed sums over answers: (bytes answered, seconds the path spent on them), and how
    /// many samples.
    served: (f64, f64, u32),
    /// The connection's counters at the last sample: (sent, lost) packets.
    counters: Option<(u64, u64)>,
    outstanding: Option<(u64, Instant)>,
    next_probe: Instant,
    missed: u32,
    awaiting_since: Option<Instant>,
}

impl PathState {
    /// When the oldest request still unanswered on the path was sent: the first ticket's, as
    /// tickets are numbered in the order the shell sends (with non-decreasing `now`).
    pub fn oldest_pending(&self) -> Option<Instant> {
        self.pending.first_key_value().map(|(_, q)| q.sent)
    }

    /// A pending request's bytes leave the queue's counts.
    fn dequeue(&mut self, q: &Pending) {
        self.queued_bytes = self.queued_bytes.saturating_sub(q.bytes);
        if q.urgent {
            self.urgent_bytes = self.urgent_bytes.saturating_sub(q.bytes);
        }
    }

    /// Request bytes still unsent at `now` if the sender drains them at `rate` bytes/s in the
    /// order they came: a fluid queue over the pending requests. Bytes already sent and
    /// waiting for their answer take no sending capacity, so unlike `queued_bytes` this does
    /// not count them.
    pub fn backlog(&self, rate: f64, now: Instant) -> f64 {
        self.backlog_ahead_of(false, rate, now)
    }

    /// [`backlog`](Self::backlog) as a request sent at priority's urgency (`urgent`) or at
    /// best effort's finds it: urgent bytes go first (decision G24), so only urgent bytes are
    /// ahead of an urgent request; every byte is ahead of a best-effort one.
    ///
    /// Computed newest first as the largest `bytes sent since t − rate × (now − t)` over the
    /// send times `t` of the requests that count (the unrolled Lindley recursion), stopping
    /// once `rate × (now − t)` exceeds all their bytes: only recent requests are visited.
    pub fn backlog_ahead_of(&self, urgent: bool, rate: f64, now: Instant) -> f64 {
        let counts = |q: &&Pending| !urgent || q.urgent;
        let total = if urgent {
            self.urgent_bytes
        } else {
            self.queued_bytes
        } as f64;
        let (mut since, mut backlog) = (0.0f64, 0.0f64);
        for q in self.pending.values().rev().filter(counts) {
            let drained = rate * now.saturating_duration_since(q.sent).as_secs_f64();
            if drained >= total {
                break;
            }
            since += q.bytes as f64;
            backlog = backlog.max(since - drained);
        }
        backlog
    }

    /// The rate, bytes/s, at which the path answered requests, once measured and while fresh:
    /// the bottleneck's capacity as the gateway sees it (link, server or both; decision G14).
    pub fn served_rate(&self, now: Instant) -> Option<f64> {
        let (bytes, secs, n) = self.served;
        let fresh = self
            .served_at
            .is_some_and(|t| now.saturating_duration_since(t) <= SERVED_TTL);
        (fresh && n >= SERVED_MIN_SAMPLES && secs > 0.0 && bytes > 0.0).then(|| bytes / secs)
    }

    /// The rate, bytes/s, at which the path's sender drains its queue: a window per RTT (a
    /// sender with a queue is window-limited; quinn paces 1.25 windows per RTT, but a window's
    /// bytes in flight wait for their acknowledgements before the next window: decision G24),
    /// bounded by the answer rate once measured (a window grown past the bottleneck's capacity
    /// sends faster than the path delivers). `None` while the path has no RTT.
    pub fn drain_rate(&self, now: Instant) -> Option<f64> {
        let r = self.quic_rtt.or(self.rtt)?.as_secs_f64().max(1e-6);
        let w = self.cwnd.map_or(ASSUMED_WINDOW, |c| c as f64).max(1_200.0);
        let window_rate = w / r;
        Some(
            self.served_rate(now)
                .map_or(window_rate, |c| window_rate.min(c)),
        )
    }

    /// Requests sent on the path and not yet answered.
    pub fn pending_requests(&self) -> usize {
        self.pending.len()
    }

    fn timeout(&self, cfg: &PathConfig) -> Duration {
        self.rtt.map_or(cfg.min_probe_timeout * 3, |r| {
            (r * 3).max(cfg.min_probe_timeout)
        })
    }

    fn sample(&mut self, rtt: Duration, weight: f64) {
        self.rtt = Some(match self.rtt {
            None => rtt,
            Some(s) => s.mul_f64(1.0 - weight) + rtt.mul_f64(weight),
        });
    }
}

/// The path table.
#[derive(Debug, Clone)]
pub struct PathTable {
    cfg: PathConfig,
    paths: Vec<PathState>,
    next_seq: u64,
    next_ticket: u64,
}

impl PathTable {
    /// `n` paths, unmeasured and presumed up, each probed at once.
    pub fn new(n: usize, cfg: PathConfig, now: Instant) -> PathTable {
        let paths = (0..n)
            .map(|i| PathState {
                id: PathId(i),
                rtt: None,
                hits: 0,
                up: true,
                quic_rtt: None,
                cwnd: None,
                slow_start: true,
                loss: 0.0,
                queued_bytes: 0,
                pending: BTreeMap::new(),
                min_rtt: None,
                last_answer: None,
                last_best_effort_answer: None,
                urgent_bytes: 0,
                served_at: None,
                served: (0.0, 0.0, 0),
                counters: None,
                outstanding: None,
                next_probe: now,
                missed: 0,
                awaiting_since: None,
            })
            .collect();
        PathTable {
            cfg,
            paths,
            next_seq: 1,
            next_ticket: 0,
        }
    }

    /// Every path.
    pub fn paths(&self) -> &[PathState] {
        &self.paths
    }

    /// One path.
    pub fn get(&self, id: PathId) -> Option<&PathState> {
        self.paths.get(id.0)
    }

    /// Paths that are up.
    pub fn up(&self) -> impl Iterator<Item = &PathState> {
        self.paths.iter().filter(|p| p.up)
    }

    /// How long `p` has had a request unanswered without answering any, if longer than its
    /// probe timeout (`max(3 × srtt, min_probe_timeout)`): the time since its last answer or
    /// since its oldest unanswered request was sent, whichever is later. Past it, the path is
    /// slower than its RTT says, or silent; a path that keeps answering is not silent, however
    /// long its queue (a burst waiting for the window to grow is progress; decision G24).
    /// Priority requests judge a path by it: their bytes go first, so answers mean theirs move.
    pub fn silent(&self, p: &PathState, now: Instant) -> Option<Duration> {
        let waited = unanswered(p.oldest_pending(), p.last_answer, now)?;
        (waited > p.timeout(&self.cfg)).then_some(waited)
    }

    /// [`silent`](Self::silent) as best-effort requests see it: the longer of that and the time
    /// best-effort requests there at urgency 0 have gone unanswered (since the oldest was sent
    /// or one was last answered). Their bytes wait behind every urgent byte (decision G24), so
    /// a path busy answering priority requests can be stalled for them.
    pub fn stalled(&self, p: &PathState, now: Instant) -> Option<Duration> {
        let oldest = p.pending.values().find(|q| !q.urgent).map(|q| q.sent);
        let own = unanswered(oldest, p.last_best_effort_answer, now);
        let waited = own.max(unanswered(p.oldest_pending(), p.last_answer, now))?;
        (waited > p.timeout(&self.cfg)).then_some(waited)
    }

    /// Paths that are up and not in `avoid` (where a retried request already failed).
    pub fn usable<'a>(&'a self, avoid: &'a [PathId]) -> impl Iterator<Item = &'a PathState> {
        self.up().filter(move |p| !avoid.contains(&p.id))
    }

    /// A device was assigned to `id`.
    pub fn add_hit(&mut self, id: PathId) {
        if let Some(p) = self.paths.get_mut(id.0) {
            p.hits += 1;
        }
    }

    /// A device left `id` (or moved off it).
    pub fn remove_hit(&mut self, id: PathId) {
        if let Some(p) = self.paths.get_mut(id.0) {
            p.hits = p.hits.saturating_sub(1);
        }
    }

    /// Advance to `now`: time out unanswered probes, mark silent paths down, and return the
    /// probes to send now.
    pub fn poll(&mut self, now: Instant) -> Vec<Probe> {
        let cfg = self.cfg;
        let mut out = Vec::new();
        for p in &mut self.paths {
            let timeout = p.timeout(&cfg);
            if let Some((_, sent)) = p.outstanding {
                if now.saturating_duration_since(sent) >= timeout {
                    p.outstanding = None;
                    p.missed += 1;
                    if p.missed >= cfg.dead_after {
                        p.up = false;
                    }
                    p.next_probe = now; // retry at once, at the timeout pace
                }
            }
            // Traffic that got no answer within the timeout: check the path now.
            if p.awaiting_since
                .is_some_and(|t| now.saturating_duration_since(t) >= timeout)
                && p.outstanding.is_none()
            {
                p.next_probe = p.next_probe.min(now);
                p.awaiting_since = None;
            }
            if p.outstanding.is_none() && now >= p.next_probe {
                let seq = self.next_seq;
                self.next_seq += 1;
                p.outstanding = Some((seq, now));
                let pace = if p.up && p.missed == 0 {
                    cfg.probe_interval
                } else {
                    timeout
                };
                p.next_probe = now + pace;
                out.push(Probe { path: p.id, seq });
            }
        }
        out
    }

    /// When `poll` next has something to do.
    pub fn next_timeout(&self) -> Option<Instant> {
        self.paths
            .iter()
            .flat_map(|p| {
                let t = p.timeout(&self.cfg);
                [
                    // Once the probe out times out, `poll` sets the next one for then.
                    Some(p.next_probe).filter(|_| p.outstanding.is_none()),
                    p.outstanding.map(|(_, sent)| sent + t),
                    // While a probe is out, its own timeout comes first (`poll` checks the
                    // traffic only then): counting this too would ask for a poll that does
                    // nothing, again and again (found by the forwarder's harness).
                    p.awaiting_since
                        .filter(|_| p.outstanding.is_none())
                        .map(|a| a + t),
                ]
            })
            .flatten()
            .min()
    }

    /// The answer to probe `seq` arrived on `id`: an RTT sample; the path is up.
    pub fn on_probe_ack(&mut self, id: PathId, seq: u64, now: Instant) -> Option<Duration> {
        let w = self.cfg.rtt_weight;
        let p = self.paths.get_mut(id.0)?;
        let (want, sent) = p.outstanding?;
        if want != seq {
            return None; // a late answer to a probe already given up on
        }
        let rtt = now.saturating_duration_since(sent);
        p.outstanding = None;
        p.sample(rtt, w);
        p.missed = 0;
        p.up = true;
        p.awaiting_since = None;
        Some(rtt)
    }

    /// QUIC's own RTT estimate for the path's connection, between probes (§3.2 "refined").
    pub fn on_rtt_estimate(&mut self, id: PathId, rtt: Duration) {
        let w = self.cfg.rtt_weight;
        if let Some(p) = self.paths.get_mut(id.0) {
            p.sample(rtt, w);
        }
    }

    /// QUIC's counters for the path's connection: its RTT refines the table's (as
    /// [`on_rtt_estimate`](Self::on_rtt_estimate)) and is kept as it is; the window and the loss
    /// estimate feed the per-request scheduler. Counters that went backwards belong to a new
    /// connection and start a new baseline.
    pub fn on_connection_sample(&mut self, id: PathId, s: ConnectionSample) {
        self.on_rtt_estimate(id, s.rtt);
        let Some(p) = self.paths.get_mut(id.0) else {
            return;
        };
        p.quic_rtt = Some(s.rtt);
        p.min_rtt = Some(s.min_rtt);
        p.cwnd = Some(s.cwnd);
        p.slow_start = s.congestion_events == 0;
        if let Some((sent, lost)) = p.counters {
            if s.sent_packets >= sent && s.lost_packets >= lost && s.sent_packets > sent {
                let n = (s.sent_packets - sent) as f64;
                let x = ((s.lost_packets - lost) as f64 / n).min(1.0);
                // A per-packet EWMA: n packets weigh what n single updates would.
                let w = 1.0 - (1.0 - 1.0 / LOSS_WINDOW_PACKETS).powf(n);
                p.loss += (x - p.loss) * w;
            }
        }
        p.counters = Some((s.sent_packets, s.lost_packets));
    }

    /// A request of `bytes` went out on `id`, at priority's urgency if `urgent` (decision G24),
    /// and expects an answer; hand the ticket back with
    /// [`on_request_done`](Self::on_request_done) however it ends.
    pub fn on_request_sent(
        &mut self,
        id: PathId,
        urgent: bool,
        bytes: u64,
        now: Instant,
    ) -> Ticket {
        let seq = self.next_ticket;
        self.next_ticket += 1;
        if let Some(p) = self.paths.get_mut(id.0) {
            p.awaiting_since.get_or_insert(now);
            let unsent = p
                .drain_rate(now)
                .map_or(0.0, |d| p.backlog_ahead_of(urgent, d, now));
            let in_window = p.cwnd.is_some_and(|w| unsent + bytes as f64 <= w as f64);
            p.pending.insert(
                seq,
                Pending {
                    sent: now,
                    bytes,
                    in_window,
                    urgent,
                },
            );
            p.queued_bytes += bytes;
            if urgent {
                p.urgent_bytes += bytes;
            }
        }
        Ticket { path: id, seq }
    }

    /// The request of `ticket` ended (answered, failed or abandoned).
    pub fn on_request_done(&mut self, ticket: Ticket) {
        if let Some(p) = self.paths.get_mut(ticket.path.0) {
            if let Some(q) = p.pending.remove(&ticket.seq) {
                p.dequeue(&q);
            }
        }
    }

    /// The request of `ticket` was answered at `now`: it ends (as
    /// [`on_request_done`](Self::on_request_done)), and if it fitted in the window when sent,
    /// its bytes over the time since the path could start on it (the previous answer, or its
    /// earliest possible answer, sent + min RTT) are a sample of how fast the path serves.
    pub fn on_request_answered(&mut self, ticket: Ticket, now: Instant) {
        let Some(p) = self.paths.get_mut(ticket.path.0) else {
            return;
        };
        let Some(q) = p.pending.remove(&ticket.seq) else {
            return;
        };
        p.dequeue(&q);
        let Pending {
            sent,
            bytes,
            in_window,
            urgent,
        } = q;
        // A request under a packet (an empty GET, say) times the server, not the path.
        if let Some(r0) = p.min_rtt.filter(|_| in_window && bytes >= SERVED_MIN_BYTES) {
            // The path served these bytes from when it could start on them: the previous
            // answer, or the request's earliest answer over an idle path (sent + min RTT).
            let earliest = sent + r0;
            let from = p.last_answer.map_or(earliest, |prev| prev.max(earliest));
            if p.served_at
                .is_some_and(|t| now.saturating_duration_since(t) > SERVED_TTL)
            {
                p.served = (0.0, 0.0, 0);
            }
            if now > from {
                let gap = (now - from).as_secs_f64();
                p.served_at = Some(now);
                let (b, s, n) = p.served;
                p.served = (
                    b * SERVED_DECAY + bytes as f64,
                    s * SERVED_DECAY + gap,
                    n.saturating_add(1),
                );
            } else if p.served_at == Some(now) {
                // Answered with the previous sample: these bytes were served in its gap.
                p.served.0 += bytes as f64;
            }
        }
        p.last_answer = Some(p.last_answer.map_or(now, |prev| prev.max(now)));
        if !urgent {
            p.last_best_effort_answer = Some(now.max(p.last_best_effort_answer.unwrap_or(now)));
        }
    }

    /// The path's QUIC connection closed or timed out: the path is down now; probing continues
    /// at the timeout pace to find its recovery.
    pub fn on_connection_lost(&mut self, id: PathId, now: Instant) {
        let cfg = self.cfg;
        if let Some(p) = self.paths.get_mut(id.0) {
            p.up = false;
            p.missed = p.missed.max(cfg.dead_after);
            p.outstanding = None;
            // The next connection starts its own window and counters.
            p.cwnd = None;
            p.slow_start = true;
            p.counters = None;
            p.served = (0.0, 0.0, 0);
            p.served_at = None;
            p.last_answer = None;
            p.last_best_effort_answer = None;
            p.min_rtt = None;
            p.next_probe = p.next_probe.min(now + p.timeout(&cfg));
        }
    }

    /// Something came back on `id` (a response, an ACK): the path is alive.
    pub fn on_heard(&mut self, id: PathId) {
        if let Some(p) = self.paths.get_mut(id.0) {
            p.awaiting_since = None;
        }
    }
}

/// How long since a request sent at `oldest` (still unanswered) or the last answer, whichever
/// is later; `None` with nothing unanswered.
fn unanswered(oldest: Option<Instant>, last: Option<Instant>, now: Instant) -> Option<Duration> {
    let oldest = oldest?;
    let since = last.map_or(oldest, |a| a.max(oldest));
    Some(now.saturating_duration_since(since))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(x: u64) -> Duration {
        Duration::from_millis(x)
    }

    #[test]
    fn probes_measure_rtt_and_repeat_every_interval() {
        let t0 = Instant::now();
        let mut t = PathTable::new(2, PathConfig::default(), t0);
        let probes = t.poll(t0);
        assert_eq!(probes.len(), 2, "every path is probed at start");
        assert_eq!(
            t.on_probe_ack(PathId(0), probes[0].seq, t0 + ms(40)),
            Some(ms(40))
        );
        assert_eq!(t.get(PathId(0)).unwrap().rtt, Some(ms(40)));
        assert!(t.poll(t0 + ms(41)).is_empty());
        t.on_probe_ack(PathId(1), probes[1].seq, t0 + ms(80));
        // Next routine probe 30 s after the last one.
        assert!(t.poll(t0 + Duration::from_secs(29)).is_empty());
        assert_eq!(t.poll(t0 + Duration::from_secs(30)).len(), 2);
        // QUIC refines between probes (EWMA 1/8).
        t.on_rtt_estimate(PathId(0), ms(120));
        assert_eq!(t.get(PathId(0)).unwrap().rtt, Some(ms(50)));
    }

    /// The fluid backlog drains at the given rate in sending order; answers measure the rate
    /// the path serves bytes from when it could start on them (the previous answer, or the
    /// request's earliest answer, sent + min RTT), not while the window held a request back;
    /// the rate bounds the drain rate, and is forgotten after a quiet spell or with the
    /// connection.
    #[test]
    fn backlog_drains_and_answers_measure_the_served_rate() {
        let t0 = Instant::now();
        let mut t = PathTable::new(1, PathConfig::default(), t0);
        let id = PathId(0);
        t.on_connection_sample(
            id,
            ConnectionSample {
                rtt: ms(10),
                cwnd: 100_000,
                sent_packets: 10,
                lost_packets: 0,
                congestion_events: 0,
                min_rtt: ms(10),
            },
        );
        let a = t.on_request_sent(id, true, 10_000, t0);
        let b = t.on_request_sent(id, true, 10_000, t0 + ms(1));
        let p = t.get(id).unwrap();
        let near = |x: f64, want: f64| (x - want).abs() < 1e-3;
        // 5 MB/s drains 5 kB per ms.
        assert!(near(p.backlog(5e6, t0 + ms(1)), 15_000.0));
        assert!(near(p.backlog(5e6, t0 + ms(2)), 10_000.0));
        assert_eq!(p.backlog(5e6, t0 + ms(4)), 0.0);
        assert_eq!(p.served_rate(t0), None);

        // Each answer 2 ms after the path could start on it: a and the idle-path requests
        // from sent + 10 ms, b and the one behind from the previous answer.
        t.on_request_answered(a, t0 + ms(12));
        t.on_request_answered(b, t0 + ms(14));
        let later: Vec<_> = (0..2)
            .map(|_| t.on_request_sent(id, true, 10_000, t0 + ms(20)))
            .collect();
        assert_eq!(
            t.get(id).unwrap().served_rate(t0 + ms(20)),
            None,
            "2 samples"
        );
        t.on_request_answered(later[0], t0 + ms(32));
        assert_eq!(
            t.get(id).unwrap().served_rate(t0 + ms(32)),
            None,
            "3 samples"
        );
        t.on_request_answered(later[1], t0 + ms(34));
        let rate = |t: &PathTable, at| t.get(id).unwrap().served_rate(at);
        assert!(near(rate(&t, t0 + ms(34)).unwrap(), 5e6), "4 samples");
        assert_eq!(t.get(id).unwrap().queued_bytes, 0);
        // A request bigger than the window waits for it: no sample.
        let big = t.on_request_sent(id, true, 200_000, t0 + ms(40));
        t.on_request_answered(big, t0 + ms(400));
        assert!(near(rate(&t, t0 + ms(400)).unwrap(), 5e6));
        // The drain rate is a window per RTT (10 MB/s) bounded by it.
        let p = t.get(id).unwrap();
        assert!(near(p.drain_rate(t0 + ms(400)).unwrap(), 5e6));
        // Forgotten 2 s after the last sample: a window per RTT again.
        let quiet = t0 + ms(34) + SERVED_TTL + ms(1);
        assert_eq!(p.served_rate(quiet), None);
        assert!(near(p.drain_rate(quiet).unwrap(), 10e6));
        // The next sample starts afresh (one sample: not yet a rate)...
        let k = t.on_request_sent(id, true, 10_000, quiet);
        t.on_request_answered(k, quiet + ms(14));
        assert_eq!(t.get(id).unwrap().served.2, 1);
        assert_eq!(rate(&t, quiet + ms(14)), None);
        // ...and an answer at the same instant as a sample adds its bytes to that sample's gap.
        let two: Vec<_> = (0..2)
            .map(|_| t.on_request_sent(id, true, 10_000, quiet + ms(20)))
            .collect();
        t.on_request_answered(two[0], quiet + ms(32));
        t.on_request_answered(two[1], quiet + ms(32));
        let (bytes, secs, n) = t.get(id).unwrap().served;
        assert_eq!(n, 2);
        assert!(near(bytes, 10_000.0 * SERVED_DECAY + 20_000.0), "{bytes}");
        assert!(near(secs, 0.004 * SERVED_DECAY + 0.002), "{secs}");
        // A small request's answer times the server, not the path: no sample.
        let small = t.on_request_sent(id, true, 100, quiet + ms(40));
        t.on_request_answered(small, quiet + ms(60));
        assert_eq!(t.get(id).unwrap().served.2, 2);
        t.on_connection_lost(id, t0 + ms(500));
        assert_eq!(rate(&t, t0 + ms(500)), None);
    }

    #[test]
    fn a_silent_path_goes_down_within_a_few_rtts_and_recovers() {
        let t0 = Instant::now();
        let mut t = PathTable::new(1, PathConfig::default(), t0);
        let p = t.poll(t0);
        t.on_probe_ack(PathId(0), p[0].seq, t0 + ms(50));
        // The path dies at 1 s; traffic is sent and gets no answer.
        let dead = t0 + Duration::from_secs(1);
        t.on_request_sent(PathId(0), true, 1000, dead);
        let mut now = dead;
        let step = ms(10);
        while t.get(PathId(0)).unwrap().up {
            now += step;
            t.poll(now);
            assert!(
                now - dead < Duration::from_secs(2),
                "still up after {:?}",
                now - dead
            );
        }
        // 150 ms for the traffic timeout + 3 probe timeouts of 150 ms.
        assert!(now - dead <= ms(610), "down after {:?}", now - dead);
        // Down paths keep being probed; an answer brings the path back.
        let probes = t.poll(now + ms(150));
        assert_eq!(probes.len(), 1);
        t.on_probe_ack(PathId(0), probes[0].seq, now + ms(200));
        assert!(t.get(PathId(0)).unwrap().up);
    }

    #[test]
    fn a_lost_connection_downs_the_path_at_once_and_probing_finds_recovery() {
        let t0 = Instant::now();
        let mut t = PathTable::new(2, PathConfig::default(), t0);
        for p in t.poll(t0) {
            t.on_probe_ack(p.path, p.seq, t0 + ms(20));
        }
        t.on_connection_lost(PathId(1), t0 + ms(100));
        assert!(!t.get(PathId(1)).unwrap().up && t.get(PathId(0)).unwrap().up);
        // Probed again after one timeout (3 × 20 ms → the 100 ms floor), not after 30 s.
        let probes = t.poll(t0 + ms(200));
        assert_eq!(
            probes,
            vec![Probe {
                path: PathId(1),
                seq: probes[0].seq
            }]
        );
        t.on_probe_ack(PathId(1), probes[0].seq, t0 + ms(230));
        assert!(t.get(PathId(1)).unwrap().up);
    }

    #[test]
    fn late_answers_are_ignored_and_hits_never_underflow() {
        let t0 = Instant::now();
        let mut t = PathTable::new(1, PathConfig::default(), t0);
        let first = t.poll(t0)[0];
        let second = t.poll(t0 + ms(301)); // first timed out (3 × 100 ms unmeasured)
        assert_eq!(second.len(), 1);
        assert_eq!(t.on_probe_ack(PathId(0), first.seq, t0 + ms(310)), None);
        assert_eq!(
            t.on_probe_ack(PathId(0), second[0].seq, t0 + ms(320)),
            Some(ms(19))
        );
        t.remove_hit(PathId(0));
        assert_eq!(t.get(PathId(0)).unwrap().hits, 0);
        assert!(t.next_timeout().is_some());
    }
}
