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
}

/// A forwarded request's place in its path's queue, handed back with
/// [`PathTable::on_request_done`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    /// The path it went out on.
    pub path: PathId,
    seq: u64,
}

/// Packets over which the loss estimate averages (a per-packet EWMA).
const LOSS_WINDOW_PACKETS: f64 = 256.0;

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
    /// Requests sent on the path and not yet answered: ticket → (sent at, bytes).
    pending: BTreeMap<u64, (Instant, u64)>,
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
        self.pending.first_key_value().map(|(_, (t, _))| *t)
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

    /// How long `p`'s oldest unanswered request has waited, if longer than the path's probe
    /// timeout (`max(3 × srtt, min_probe_timeout)`): past it, the path is slower than its RTT
    /// says, or silent.
    pub fn stalled(&self, p: &PathState, now: Instant) -> Option<Duration> {
        let waited = now.saturating_duration_since(p.oldest_pending()?);
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
                    Some(p.next_probe),
                    p.outstanding.map(|(_, sent)| sent + t),
                    p.awaiting_since.map(|a| a + t),
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

    /// A request of `bytes` went out on `id` and expects an answer; hand the ticket back with
    /// [`on_request_done`](Self::on_request_done) however it ends.
    pub fn on_request_sent(&mut self, id: PathId, bytes: u64, now: Instant) -> Ticket {
        let seq = self.next_ticket;
        self.next_ticket += 1;
        if let Some(p) = self.paths.get_mut(id.0) {
            p.awaiting_since.get_or_insert(now);
            p.pending.insert(seq, (now, bytes));
            p.queued_bytes += bytes;
        }
        Ticket { path: id, seq }
    }

    /// The request of `ticket` ended (answered, failed or abandoned).
    pub fn on_request_done(&mut self, ticket: Ticket) {
        if let Some(p) = self.paths.get_mut(ticket.path.0) {
            if let Some((_, bytes)) = p.pending.remove(&ticket.seq) {
                p.queued_bytes = p.queued_bytes.saturating_sub(bytes);
            }
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

    #[test]
    fn a_silent_path_goes_down_within_a_few_rtts_and_recovers() {
        let t0 = Instant::now();
        let mut t = PathTable::new(1, PathConfig::default(), t0);
        let p = t.poll(t0);
        t.on_probe_ack(PathId(0), p[0].seq, t0 + ms(50));
        // The path dies at 1 s; traffic is sent and gets no answer.
        let dead = t0 + Duration::from_secs(1);
        t.on_request_sent(PathId(0), 1000, dead);
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
