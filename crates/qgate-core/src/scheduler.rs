//! Which backhaul path a device's request takes: ours (`completion`, per request, decision
//! G13), paper 000's (`adaptive`, §3.3) and the paper's baselines.

use std::time::{Duration, Instant};

use crate::path::{PathId, PathState, PathTable, ASSUMED_WINDOW, PACING_GAIN};

/// A device's class (paper 000 Fig. 2 step 4: 0 non-priority, 1 priority).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Priority {
    /// 0: best effort, load-balanced by hits.
    BestEffort,
    /// 1: priority, on the lowest-RTT path.
    Priority,
}

/// A request that needs a path.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// Its device's class.
    pub priority: Priority,
    /// Its body, bytes.
    pub bytes: u64,
    /// The path its device is on (`None` for a new device).
    pub current: Option<PathId>,
    /// Paths where this request already failed: not chosen while another is up.
    pub avoid: &'a [PathId],
    /// Now.
    pub now: Instant,
}

impl<'a> Ask<'a> {
    /// A first attempt of `bytes` from a device of class `priority` on `current`.
    pub fn new(priority: Priority, bytes: u64, current: Option<PathId>, now: Instant) -> Ask<'a> {
        Ask {
            priority,
            bytes,
            current,
            avoid: &[],
            now,
        }
    }
}

/// Picks a path for a request.
pub trait Scheduler: Send {
    /// One of [`SCHEDULERS`].
    fn name(&self) -> &'static str;

    /// The path for `ask` among the table's usable paths (up, not avoided); `None` if there is
    /// none.
    fn pick(&mut self, table: &PathTable, ask: &Ask<'_>) -> Option<PathId>;
}

/// `sched`'s path for `ask`, steering clear of `ask.avoid` only while another path is up.
pub fn pick_avoiding(
    sched: &mut dyn Scheduler,
    table: &PathTable,
    ask: &Ask<'_>,
) -> Option<PathId> {
    sched.pick(table, ask).or_else(|| {
        (!ask.avoid.is_empty())
            .then(|| sched.pick(table, &Ask { avoid: &[], ..*ask }))
            .flatten()
    })
}

/// An unmeasured path sorts after every measured one.
fn rtt_key(p: &PathState) -> Duration {
    p.rtt.unwrap_or(Duration::MAX)
}

/// Paper 000 §3.3: priority devices on the lowest-RTT path; best-effort devices on the path with
/// the fewest hits (tie → lower RTT). A device stays on its path while it is up, unless (priority
/// class) another path's RTT is below `(1 − hysteresis)` × its path's RTT (decision G1).
#[derive(Debug, Clone)]
pub struct Adaptive {
    /// Relative RTT improvement that moves a priority device (0.25 = 25 % lower).
    pub hysteresis: f64,
    /// What a path's hits count.
    pub hits: Hits,
}

/// What `adaptive` compares best-effort paths by (decision G15).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hits {
    /// The devices assigned to the path now (Table 1: "the number of clients who are using
    /// this network path"): the path table's `hits`.
    Devices,
    /// The data packets forwarded on the path so far (§3.4 step 11: the proxy increases the
    /// hits once a packet's path is determined): each request counts its body in the paper's
    /// 50-byte records, at least one; counted here, where the path is determined.
    Packets(Vec<u64>),
}

/// The paper's record: "each packet contains the payload of 50 bytes" (§4.1).
pub const PAPER_RECORD_BYTES: u64 = 50;

impl Default for Adaptive {
    fn default() -> Self {
        Adaptive {
            hysteresis: 0.25,
            hits: Hits::Devices,
        }
    }
}

impl Adaptive {
    /// `adaptive-packets`: hits count forwarded data packets (§3.4 step 11).
    pub fn packets() -> Adaptive {
        Adaptive {
            hits: Hits::Packets(Vec::new()),
            ..Adaptive::default()
        }
    }

    /// `p`'s hits as this variant counts them.
    fn hits_of(&self, p: &PathState) -> u64 {
        match &self.hits {
            Hits::Devices => u64::from(p.hits),
            Hits::Packets(sent) => sent.get(p.id.0).copied().unwrap_or(0),
        }
    }
}

impl Scheduler for Adaptive {
    fn name(&self) -> &'static str {
        match self.hits {
            Hits::Devices => "adaptive",
            Hits::Packets(_) => "adaptive-packets",
        }
    }

    fn pick(&mut self, table: &PathTable, ask: &Ask<'_>) -> Option<PathId> {
        let pick = self.assign(table, ask);
        if let (Some(p), Hits::Packets(sent)) = (pick, &mut self.hits) {
            if sent.len() <= p.0 {
                sent.resize(p.0 + 1, 0);
            }
            sent[p.0] += ask.bytes.div_ceil(PAPER_RECORD_BYTES).max(1);
        }
        pick
    }
}

impl Adaptive {
    /// The device's path for `ask` (§3.3, decision G1).
    fn assign(&self, table: &PathTable, ask: &Ask<'_>) -> Option<PathId> {
        let cur = ask
            .current
            .and_then(|c| table.get(c))
            .filter(|p| p.up && !ask.avoid.contains(&p.id));
        match ask.priority {
            Priority::Priority => {
                let best = table.usable(ask.avoid).min_by_key(|p| (rtt_key(p), p.id))?;
                match cur {
                    Some(c) => {
                        let (Some(cr), Some(br)) = (c.rtt, best.rtt) else {
                            return Some(c.id);
                        };
                        if br.as_secs_f64() < (1.0 - self.hysteresis) * cr.as_secs_f64() {
                            Some(best.id)
                        } else {
                            Some(c.id)
                        }
                    }
                    None => Some(best.id),
                }
            }
            Priority::BestEffort => match cur {
                Some(c) => Some(c.id),
                None => table
                    .usable(ask.avoid)
                    .min_by_key(|p| (self.hits_of(p), rtt_key(p), p.id))
                    .map(|p| p.id),
            },
        }
    }
}

/// The paper's MP-QUIC baseline: each new request on the next path that is up, in turn.
#[derive(Debug, Clone, Default)]
pub struct RoundRobin {
    next: usize,
}

impl Scheduler for RoundRobin {
    fn name(&self) -> &'static str {
        "round-robin"
    }

    fn pick(&mut self, table: &PathTable, ask: &Ask<'_>) -> Option<PathId> {
        let n = table.paths().len();
        for k in 0..n {
            let i = (self.next + k) % n;
            if table.paths()[i].up && !ask.avoid.contains(&PathId(i)) {
                self.next = (i + 1) % n;
                return Some(PathId(i));
            }
        }
        None
    }
}

/// The paper's SP-QUIC baseline: everything on one path; nothing when it is down.
#[derive(Debug, Clone)]
pub struct Single {
    /// The one path.
    pub path: PathId,
}

impl Scheduler for Single {
    fn name(&self) -> &'static str {
        "single"
    }

    fn pick(&mut self, table: &PathTable, ask: &Ask<'_>) -> Option<PathId> {
        table
            .get(self.path)
            .filter(|p| p.up && !ask.avoid.contains(&p.id))
            .map(|p| p.id)
    }
}

/// The payload a request's packets carry, for the loss term.
const PACKET_PAYLOAD: f64 = 1_200.0;

/// Ours (decisions G13, G14, G20, G22): every request goes where it is expected to complete first.
///
/// For each usable path, with `r` its RTT (QUIC's latest smoothed RTT), `w` its congestion
/// window, `b` this request's bytes, `ℓ` its packet loss rate, `D` the rate its sender drains
/// requests at (quinn's pacing rate `1.25 · w / r`, bounded by `C`, the rate the path answered
/// requests, once measured and fresh: `PathTable::on_request_answered`) and `B` the request bytes still unsent on it (a fluid
/// queue of the pending requests drained at `D`):
///
/// `E = max(r · (1 + F((B + b) / (1.25 · w))), r + (B + b) / C) + r · (1 − (1 − ℓ)^(⌈b / 1200⌉ + 1))`
///
/// — a round trip, plus the time the sender needs to send what is ahead and this request:
/// quinn paces 1.25 windows per round trip, so `x` of those take `F(x) = x` round trips once the
/// connection has had a congestion event, and `F(x) = log2(1 + x)` before, in slow start, where
/// the window doubles every round trip it is filled; at least the time the path's bottleneck
/// needs for those bytes at the rate it was seen to serve, while `C` is known (a window grown
/// past the capacity paces faster than the path delivers); plus a round trip for a retransmission weighted by the
/// chance that one of the request's packets (or its answer) is lost. Once the
/// oldest request unanswered on the path has waited longer than the path table's timeout
/// (`max(3 × srtt, 100 ms)`), the first term is at least that wait: a path that went silent or
/// slow is left within a few RTTs (the wait replaces the queue estimate, which it already
/// contains, rather than multiplying it). Priority requests take the lowest `E`. Best-effort requests
/// are placed by the exploring estimate ([`Completion::expected_exploring`], decision G20: in
/// slow start `B` pays the window's growth, and `b` only beyond its first paced window); on
/// the path a priority request would take now they pay the time beyond the round trip
/// `1 + best_effort_margin` times ([`Completion::on_priority_path`], decision G22), so small
/// requests share it while it is idle (a request whose own pacing there, counted twice, costs
/// more than the next path's longer round trip goes to that path), they spill off it first as
/// it loads, and priority traffic keeps the best path (paper 000's guarantee). Unmeasured
/// paths come last;
/// ties go to the lower path index.
#[derive(Debug, Clone)]
pub struct Completion {
    /// Extra cost, for best-effort requests, of the time beyond one round trip on the priority
    /// class's path (1.0: that time counts twice; [`Completion::on_priority_path`]).
    pub best_effort_margin: f64,
}

impl Default for Completion {
    fn default() -> Self {
        // Decision G22: the wait counts twice there (its own and the priority traffic's).
        Completion {
            best_effort_margin: 1.0,
        }
    }
}

impl Completion {
    /// Expected completion time of `bytes` on `p` (a path of `table`) at `now`, seconds;
    /// `None` if unmeasured. Priority requests are placed by it.
    pub fn expected(table: &PathTable, p: &PathState, bytes: u64, now: Instant) -> Option<f64> {
        Self::estimate(table, p, bytes, now, false)
    }

    /// [`expected`](Self::expected) for a best-effort request: in slow start the queue ahead
    /// pays the window's growth, and the request only for what exceeds its first paced window
    /// (decision G20). A window that
    /// light use kept small grows with the first requests a path carries and keeps its size
    /// (quinn does not shrink an idle window), so charging every request the slow start only
    /// the first ones pay would keep a lightly used path unused; best-effort traffic pays for
    /// that exploration, priority traffic never does.
    pub fn expected_exploring(
        table: &PathTable,
        p: &PathState,
        bytes: u64,
        now: Instant,
    ) -> Option<f64> {
        Self::estimate(table, p, bytes, now, true)
    }

    fn estimate(
        table: &PathTable,
        p: &PathState,
        bytes: u64,
        now: Instant,
        exploring: bool,
    ) -> Option<f64> {
        let r = p.quic_rtt.or(p.rtt)?.as_secs_f64();
        let waited = table.stalled(p, now).map_or(0.0, |d| d.as_secs_f64());
        let w = p
            .cwnd
            .map_or(ASSUMED_WINDOW, |c| c as f64)
            .max(PACKET_PAYLOAD);
        let backlog = p.drain_rate(now).map_or(0.0, |d| p.backlog(d, now));
        let ahead = backlog + bytes as f64;
        let flights = 1.0
            + if p.slow_start {
                // Exploring, the request pays only for what exceeds its first paced window.
                let grows = if exploring {
                    backlog + (bytes as f64 - PACING_GAIN * w).max(0.0)
                } else {
                    ahead
                };
                (grows / (PACING_GAIN * w)).ln_1p() / std::f64::consts::LN_2
            } else {
                ahead / (PACING_GAIN * w)
            };
        let served = p.served_rate(now).map_or(0.0, |c| ahead / c);
        let packets = (bytes as f64 / PACKET_PAYLOAD).ceil() + 1.0;
        let retransmit = 1.0 - (1.0 - p.loss.clamp(0.0, 1.0)).powf(packets);
        Some((r * flights).max(r + served).max(waited) + r * retransmit)
    }

    /// What a best-effort request expected to complete in `e` on `p`, the path priority
    /// requests would take now, is charged there (decision G22): the round trip as it is, and
    /// the time beyond it — queue, pacing, slow start, the retransmission term — `1 +
    /// best_effort_margin` times, since a request waiting there delays the priority requests
    /// behind it by about as much as it waits itself.
    pub fn on_priority_path(&self, p: &PathState, e: f64) -> f64 {
        let Some(r) = p.quic_rtt.or(p.rtt) else {
            return e;
        };
        let r = r.as_secs_f64();
        r + (e - r) * (1.0 + self.best_effort_margin)
    }

    /// The path with the lowest cost among `costs`, the lower index on a tie.
    fn best(costs: impl Iterator<Item = (f64, PathId)>) -> Option<PathId> {
        costs
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
            .map(|(_, id)| id)
    }
}

impl Scheduler for Completion {
    fn name(&self) -> &'static str {
        "completion"
    }

    fn pick(&mut self, table: &PathTable, ask: &Ask<'_>) -> Option<PathId> {
        // Each usable path's expected completion (unmeasured paths last).
        let cost = |p: &PathState, exploring: bool| {
            let e = Self::estimate(table, p, ask.bytes, ask.now, exploring);
            (e.unwrap_or(f64::INFINITY), p.id)
        };
        let first = Self::best(table.usable(ask.avoid).map(|p| cost(p, false)))?;
        match ask.priority {
            Priority::Priority => Some(first),
            Priority::BestEffort => Self::best(table.usable(ask.avoid).map(|p| {
                let (e, id) = cost(p, true);
                (
                    if id == first {
                        self.on_priority_path(p, e)
                    } else {
                        e
                    },
                    id,
                )
            })),
        }
    }
}

/// The scheduler a gateway runs unless told: ours (decision G14).
pub const DEFAULT_SCHEDULER: &str = "completion";

/// Every scheduler's name, the default first.
pub const SCHEDULERS: [&str; 5] = [
    "completion",
    "adaptive",
    "adaptive-packets",
    "round-robin",
    "single",
];

/// A scheduler by name: one of [`SCHEDULERS`].
pub fn by_name(name: &str) -> Result<Box<dyn Scheduler>, String> {
    match name {
        "completion" => Ok(Box::new(Completion::default())),
        "adaptive" => Ok(Box::new(Adaptive::default())),
        "adaptive-packets" => Ok(Box::new(Adaptive::packets())),
        "round-robin" | "roundrobin" | "rr" => Ok(Box::new(RoundRobin::default())),
        "single" => Ok(Box::new(Single { path: PathId(0) })),
        other => Err(format!(
            "unknown scheduler '{other}' (known: {})",
            SCHEDULERS.join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::path::{ConnectionSample, PathConfig};
    use std::time::Instant;

    /// A first attempt of 16 KiB, at a fixed instant.
    fn ask(priority: Priority, current: Option<PathId>) -> Ask<'static> {
        Ask::new(priority, 16_384, current, T0.with(|t| *t))
    }

    thread_local! {
        static T0: Instant = Instant::now();
    }

    /// A table with the given (RTT ms, hits, up) per path.
    fn table(rows: &[(Option<u64>, u32, bool)]) -> PathTable {
        let t0 = T0.with(|t| *t);
        let mut t = PathTable::new(rows.len(), PathConfig::default(), t0);
        let probes = t.poll(t0);
        for (i, (rtt, hits, up)) in rows.iter().enumerate() {
            if let Some(ms) = rtt {
                t.on_probe_ack(PathId(i), probes[i].seq, t0 + Duration::from_millis(*ms));
            }
            for _ in 0..*hits {
                t.add_hit(PathId(i));
            }
            if !up {
                t.on_connection_lost(PathId(i), t0);
            }
        }
        for (i, (_, _, up)) in rows.iter().enumerate() {
            assert_eq!(t.get(PathId(i)).unwrap().up, *up, "test setup for path {i}");
        }
        t
    }

    #[test]
    fn adaptive_table_driven() {
        let (hi, be) = (Priority::Priority, Priority::BestEffort);
        // Paper 000 Table 1: RTT 100/200/300 ms, hits 10/4/2.
        let paper = [
            (Some(100), 10, true),
            (Some(200), 4, true),
            (Some(300), 2, true),
        ];
        let ties = [
            (Some(100), 3, true),
            (Some(50), 3, true),
            (Some(70), 5, true),
        ];
        let first_down = [
            (Some(10), 0, false),
            (Some(200), 4, true),
            (Some(300), 9, true),
        ];
        let all_down = [(Some(10), 0, false), (Some(20), 0, false)];
        let unmeasured = [(None, 0, true), (Some(80), 0, true)];
        #[allow(clippy::type_complexity)]
        let cases: &[(
            &str,
            &[(Option<u64>, u32, bool)],
            Priority,
            Option<usize>,
            Option<usize>,
        )] = &[
            ("paper: priority → lowest RTT", &paper, hi, None, Some(0)),
            (
                "paper: best effort → fewest hits",
                &paper,
                be,
                None,
                Some(2),
            ),
            ("tie on hits → lower RTT", &ties, be, None, Some(1)),
            ("priority skips a down path", &first_down, hi, None, Some(1)),
            (
                "best effort skips a down path",
                &first_down,
                be,
                None,
                Some(1),
            ),
            (
                "device on a down path moves",
                &first_down,
                be,
                Some(0),
                Some(1),
            ),
            ("all down → none", &all_down, hi, None, None),
            (
                "all down → none (best effort)",
                &all_down,
                be,
                Some(1),
                None,
            ),
            ("unmeasured path sorts last", &unmeasured, hi, None, Some(1)),
            ("best effort stays while up", &paper, be, Some(0), Some(0)),
            (
                "priority device on the slowest path moves to the fastest",
                &paper,
                hi,
                Some(2),
                Some(0),
            ),
            (
                "priority stays within hysteresis",
                &[(Some(100), 0, true), (Some(90), 0, true)],
                hi,
                Some(0),
                Some(0),
            ),
            (
                "priority moves beyond hysteresis",
                &[(Some(100), 0, true), (Some(70), 0, true)],
                hi,
                Some(0),
                Some(1),
            ),
        ];
        for (name, rows, prio, current, want) in cases {
            let t = table(rows);
            let got = Adaptive::default().pick(&t, &ask(*prio, current.map(PathId)));
            assert_eq!(got, want.map(PathId), "{name}");
        }
    }

    #[test]
    fn adaptive_packets_counts_forwarded_records_not_devices() {
        let (hi, be) = (Priority::Priority, Priority::BestEffort);
        // Device hits say path 2 (fewest devices); packets have not been counted yet, so the
        // packet variant ties at 0 and takes the lowest RTT.
        let t = table(&[
            (Some(30), 5, true),
            (Some(10), 4, true),
            (Some(20), 1, true),
        ]);
        assert_eq!(
            Adaptive::default().pick(&t, &ask(be, None)),
            Some(PathId(2))
        );
        let mut s = Adaptive::packets();
        assert_eq!(s.name(), "adaptive-packets");
        // Every pick counts the request's 50-byte records on its path: 16 384 B = 328.
        assert_eq!(s.pick(&t, &ask(be, None)), Some(PathId(1)));
        assert_eq!(s.hits, Hits::Packets(vec![0, 328]));
        // A priority request on the lowest RTT counts too, so the next new best-effort device
        // goes to the path with the fewest packets, the 20 ms one.
        assert_eq!(s.pick(&t, &ask(hi, None)), Some(PathId(1)));
        assert_eq!(s.pick(&t, &ask(be, None)), Some(PathId(2)));
        assert_eq!(s.pick(&t, &ask(be, None)), Some(PathId(0)));
        assert_eq!(s.hits, Hits::Packets(vec![328, 656, 328]));
        // An assigned best-effort device keeps its path (G1) and still counts there; an empty
        // body is one packet.
        assert_eq!(s.pick(&t, &ask(be, Some(PathId(1)))), Some(PathId(1)));
        let empty = Ask::new(be, 0, Some(PathId(0)), T0.with(|t| *t));
        assert_eq!(s.pick(&t, &empty), Some(PathId(0)));
        assert_eq!(s.hits, Hits::Packets(vec![329, 984, 328]));
        // Nothing up: nothing picked, nothing counted.
        let down = table(&[(Some(10), 0, false)]);
        assert_eq!(s.pick(&down, &ask(be, None)), None);
        assert_eq!(s.hits, Hits::Packets(vec![329, 984, 328]));
    }

    #[test]
    fn round_robin_rotates_over_up_paths() {
        let t = table(&[
            (Some(10), 0, true),
            (Some(20), 0, false),
            (Some(30), 0, true),
        ]);
        let mut rr = RoundRobin::default();
        let seq: Vec<_> = (0..5)
            .map(|_| rr.pick(&t, &ask(Priority::Priority, None)).unwrap().0)
            .collect();
        assert_eq!(seq, vec![0, 2, 0, 2, 0]);
        let none = table(&[(Some(10), 0, false)]);
        assert_eq!(rr.pick(&none, &ask(Priority::BestEffort, None)), None);
    }

    #[test]
    fn single_uses_one_path_or_nothing() {
        let t = table(&[(Some(300), 0, true), (Some(10), 0, true)]);
        let mut s = Single { path: PathId(0) };
        assert_eq!(
            s.pick(&t, &ask(Priority::Priority, Some(PathId(1)))),
            Some(PathId(0))
        );
        let down = table(&[(Some(300), 0, false), (Some(10), 0, true)]);
        assert_eq!(s.pick(&down, &ask(Priority::Priority, None)), None);
        assert!(by_name("fastest")
            .err()
            .unwrap()
            .contains("completion, adaptive, adaptive-packets, round-robin, single"));
        assert_eq!(
            by_name("adaptive-packets").unwrap().name(),
            "adaptive-packets"
        );
        assert_eq!(by_name("rr").unwrap().name(), "round-robin");
    }

    /// A table whose paths have QUIC samples: (RTT ms, cwnd bytes, loss rate, up) each, past
    /// slow start.
    fn measured(rows: &[(u64, u64, f64, bool)]) -> PathTable {
        measured_in(rows, &vec![false; rows.len()])
    }

    /// [`measured`], with path i in slow start (no congestion event yet) if `slow_start[i]`.
    fn measured_in(rows: &[(u64, u64, f64, bool)], slow_start: &[bool]) -> PathTable {
        let mut t = table(&rows.iter().map(|r| (Some(r.0), 0, r.3)).collect::<Vec<_>>());
        for (i, (rtt, cwnd, loss, _)) in rows.iter().enumerate() {
            let s = |sent: u64| ConnectionSample {
                rtt: Duration::from_millis(*rtt),
                cwnd: *cwnd,
                sent_packets: sent,
                lost_packets: (sent as f64 * loss).round() as u64,
                congestion_events: u64::from(!slow_start[i]),
                min_rtt: Duration::from_millis(*rtt),
            };
            t.on_connection_sample(PathId(i), s(0));
            // Enough packets for the average to settle on the rate.
            t.on_connection_sample(PathId(i), s(1_000_000));
        }
        t
    }

    fn completion(t: &PathTable, priority: Priority) -> Option<usize> {
        Completion::default()
            .pick(t, &ask(priority, None))
            .map(|p| p.0)
    }

    #[test]
    fn completion_table_driven() {
        let (hi, be) = (Priority::Priority, Priority::BestEffort);
        let w = 64_000;
        #[allow(clippy::type_complexity)]
        let cases: &[(&str, &[(u64, u64, f64, bool)], Priority, Option<usize>)] = &[
            (
                "idle paths: priority on the lowest RTT",
                &[(30, w, 0.0, true), (10, w, 0.0, true)],
                hi,
                Some(1),
            ),
            (
                "idle paths: best effort too while the next is twice as slow",
                &[(10, w, 0.0, true), (20, w, 0.0, true)],
                be,
                Some(0),
            ),
            (
                // 16 KB on a 64 KB window: 10 × (1 + 2 × 0.2) = 14.1 ms against 11 × 1.2 = 13.3.
                "best effort leaves priority's path for one 10 % slower when its pacing, counted twice, costs more",
                &[(10, w, 0.0, true), (11, w, 0.0, true)],
                be,
                Some(1),
            ),
            (
                "equal paths: the lower index",
                &[(10, w, 0.0, true), (10, w, 0.0, true)],
                hi,
                Some(0),
            ),
            (
                "a small window costs round trips",
                &[(10, 4_000, 0.0, true), (25, w, 0.0, true)],
                hi,
                Some(1),
            ),
            (
                "loss costs a retransmission",
                &[(10, w, 0.6, true), (14, w, 0.0, true)],
                hi,
                Some(1),
            ),
            (
                "light loss does not outweigh the RTT",
                &[(10, w, 0.01, true), (14, w, 0.0, true)],
                hi,
                Some(0),
            ),
            (
                "a down path is skipped",
                &[(5, w, 0.0, false), (50, w, 0.0, true)],
                hi,
                Some(1),
            ),
            ("nothing up: none", &[(5, w, 0.0, false)], be, None),
        ];
        for (name, rows, prio, want) in cases {
            assert_eq!(completion(&measured(rows), *prio), *want, "{name}");
        }
        // A small best-effort request shares an idle priority path (decision G22): 2 KB costs
        // 10 × (1 + 2 × 0.025) = 10.5 ms there against 11 × 1.025 = 11.3 ms on the next one
        // (G14's 1.15 × 10.25 = 11.8 ms sent it there).
        let t = measured(&[(10, w, 0.0, true), (11, w, 0.0, true)]);
        let small = |mut c: Completion| {
            let at = T0.with(|t| *t);
            c.pick(&t, &Ask::new(be, 2_000, None, at))
        };
        assert_eq!(small(Completion::default()), Some(PathId(0)));
        // The rule it replaced would not have.
        let whole = |p: &PathState| {
            let at = T0.with(|t| *t);
            let e = Completion::expected_exploring(&t, p, 2_000, at).unwrap();
            if p.id == PathId(0) {
                1.15 * e
            } else {
                e
            }
        };
        assert!(whole(t.get(PathId(0)).unwrap()) > whole(t.get(PathId(1)).unwrap()));
        // Unmeasured paths come last.
        let t = table(&[(None, 0, true), (Some(80), 0, true)]);
        assert_eq!(completion(&t, hi), Some(1));
        let t = table(&[(None, 0, true), (None, 0, true)]);
        assert_eq!(completion(&t, be), Some(0));
    }

    #[test]
    fn completion_moves_off_a_loaded_or_silent_path() {
        let t0 = T0.with(|t| *t);
        let mut t = measured(&[(10, 32_000, 0.0, true), (20, 32_000, 0.0, true)]);
        assert_eq!(completion(&t, Priority::Priority), Some(0));
        // 45 KB unsent on path 0: 1 + (45 + 16.4) / (1.25 × 32) = 2.5 round trips of 10 ms
        // against 20 × 1.4 = 28 ms on path 1; with 60 KB, 2.9: moved.
        let mut tickets = Vec::new();
        for _ in 0..3 {
            tickets.push(t.on_request_sent(PathId(0), 15_000, t0));
        }
        assert_eq!(completion(&t, Priority::Priority), Some(0), "25 ms < 28 ms");
        tickets.push(t.on_request_sent(PathId(0), 15_000, t0));
        assert_eq!(completion(&t, Priority::Priority), Some(1), "29 ms > 28 ms");
        for k in tickets.drain(..) {
            t.on_request_done(k);
        }
        assert_eq!(t.get(PathId(0)).unwrap().queued_bytes, 0);
        assert_eq!(completion(&t, Priority::Priority), Some(0));
        // One small request unanswered past the path's timeout (max(3 × 10 ms, 100 ms)): the
        // path is at least that slow now.
        let k = t.on_request_sent(PathId(0), 100, t0);
        let later = |ms| {
            Ask::new(
                Priority::Priority,
                16_384,
                None,
                t0 + Duration::from_millis(ms),
            )
        };
        let mut c = Completion::default();
        assert_eq!(c.pick(&t, &later(99)), Some(PathId(0)));
        assert_eq!(c.pick(&t, &later(101)), Some(PathId(1)));
        t.on_request_done(k);
        t.on_request_done(k); // twice is harmless
        assert_eq!(c.pick(&t, &later(101)), Some(PathId(0)));
        assert_eq!(t.get(PathId(0)).unwrap().pending_requests(), 0);
    }

    /// Bytes already sent (drained at the pacing rate) do not hold a new request back; unsent
    /// ones do; and a path whose answers came slowly is charged for its
    /// backlog at that rate, however large its window (decision G14).
    #[test]
    fn completion_counts_unsent_bytes_at_the_rate_the_path_serves() {
        let t0 = T0.with(|t| *t);
        let ms = Duration::from_millis;
        let mut t = measured(&[(10, 64_000, 0.0, true), (10, 64_000, 0.0, true)]);
        // Four requests sent 50 ms ago: at 8 MB/s they left long since.
        for _ in 0..4 {
            t.on_request_sent(PathId(0), 16_384, t0 - ms(50));
        }
        assert_eq!(
            completion(&t, Priority::Priority),
            Some(0),
            "equal: the lower index"
        );
        t.on_request_sent(PathId(0), 16_384, t0);
        assert_eq!(
            completion(&t, Priority::Priority),
            Some(1),
            "16 KB unsent on path 0"
        );

        // Path 0 has a window of 10 MB (paced at 1.25 GB/s) but answered 16 KB every 16 ms
        // (from one min RTT after they were sent): 1 MB/s.
        let rows = [(10, 10_000_000, 0.0, true), (24, 64_000, 0.0, true)];
        let mut t = measured(&rows);
        let sent: Vec<_> = (0..6)
            .map(|_| t.on_request_sent(PathId(0), 16_384, t0 - ms(200)))
            .collect();
        for (k, ticket) in sent.into_iter().enumerate() {
            t.on_request_answered(ticket, t0 - ms(190) + ms(16 * (k as u64 + 1)));
        }
        let served = t.get(PathId(0)).unwrap().served_rate(t0).unwrap();
        assert!((served - 1_024_000.0).abs() < 1.0, "{served}");
        // 48 KB sent 40 ms ago: 8 KB still unsent at 1 MB/s, so a 16 KB request takes
        // 10 + 24 = 34 ms on path 0 against 24 × 1.2 = 29 ms on path 1 (drained at the pacing
        // rate it would be 10 + 16 = 26 ms; with nothing measured, 10 ms).
        let mut u = measured(&rows);
        for table in [&mut t, &mut u] {
            for _ in 0..3 {
                table.on_request_sent(PathId(0), 16_384, t0 - ms(40));
            }
        }
        let p0 = t.get(PathId(0)).unwrap();
        let backlog = p0.backlog(p0.drain_rate(t0).unwrap(), t0);
        assert!((backlog - 8_192.0).abs() < 1.0, "{backlog}");
        assert_eq!(
            completion(&t, Priority::Priority),
            Some(1),
            "34 ms on path 0 > 29 ms on path 1"
        );
        assert_eq!(
            completion(&u, Priority::Priority),
            Some(0),
            "paced, not measured"
        );
    }

    #[test]
    fn avoided_paths_are_used_only_when_nothing_else_is_up() {
        let t = measured(&[
            (10, 64_000, 0.0, true),
            (20, 64_000, 0.0, true),
            (5, 64_000, 0.0, false),
        ]);
        let t0 = T0.with(|t| *t);
        for name in SCHEDULERS {
            let mut s = by_name(name).unwrap();
            let avoid = [PathId(0)];
            let a = Ask {
                avoid: &avoid,
                ..Ask::new(Priority::Priority, 1000, Some(PathId(0)), t0)
            };
            let got = pick_avoiding(&mut *s, &t, &a);
            let want = if name == "single" {
                Some(PathId(0))
            } else {
                Some(PathId(1))
            };
            assert_eq!(got, want, "{name}");
            let both = [PathId(0), PathId(1)];
            let a = Ask { avoid: &both, ..a };
            let got = pick_avoiding(&mut *s, &t, &a);
            assert!(
                got.is_some_and(|p| p != PathId(2)),
                "{name}: {got:?} (path 2 is down)"
            );
        }
    }

    /// Random tables, paths in or past slow start: a priority request takes the up path with
    /// the lowest expected completion (the lower index on a tie); a best-effort request the up
    /// path with the lowest exploring estimate, priority's path charging the time beyond its
    /// round trip (1 + margin) times;
    /// nothing while no path is up.
    #[test]
    fn completion_places_priority_by_its_estimate_and_best_effort_by_the_exploring_one() {
        use rand::{Rng, SeedableRng};
        let t0 = T0.with(|t| *t);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for case in 0..2_000 {
            let n = rng.random_range(1..5);
            let rows: Vec<(u64, u64, f64, bool)> = (0..n)
                .map(|_| {
                    (
                        rng.random_range(1..300),
                        rng.random_range(1_200..200_000),
                        rng.random_range(0.0..0.3),
                        rng.random_bool(0.8),
                    )
                })
                .collect();
            let slow: Vec<bool> = (0..n).map(|_| rng.random_bool(0.5)).collect();
            let mut t = measured_in(&rows, &slow);
            for i in 0..n {
                // Sent oldest first, as a shell sends.
                let mut ago: Vec<u64> = (0..rng.random_range(0..4))
                    .map(|_| rng.random_range(0..400))
                    .collect();
                ago.sort_unstable_by(|a, b| b.cmp(a));
                for a in ago {
                    let at = t0 - Duration::from_millis(a);
                    t.on_request_sent(PathId(i), rng.random_range(100..40_000), at);
                }
            }
            let bytes = rng.random_range(1..100_000);
            let c = Completion::default();
            let at = |p: Priority| c.clone().pick(&t, &Ask::new(p, bytes, None, t0));
            let (hi, be) = (at(Priority::Priority), at(Priority::BestEffort));
            let e = |p: &PathState| Completion::expected(&t, p, bytes, t0).unwrap();
            let x = |p: &PathState| Completion::expected_exploring(&t, p, bytes, t0).unwrap();
            // Brute force: the up path with the lowest E, the first of equals.
            let mut want: Option<&PathState> = None;
            for p in t.paths().iter().filter(|p| p.up) {
                if want.is_none_or(|w| e(p) < e(w)) {
                    want = Some(p);
                }
            }
            assert_eq!(hi, want.map(|p| p.id), "case {case}: {rows:?}");
            assert_eq!(be.is_some(), hi.is_some(), "case {case}");
            if let (Some(h), Some(b)) = (hi, be) {
                // Best effort: the lowest exploring estimate, priority's path charging the time
                // beyond its round trip 1 + margin times.
                let cost = |p: &PathState| {
                    if p.id == h {
                        let r = p.quic_rtt.unwrap().as_secs_f64();
                        r + (1.0 + c.best_effort_margin) * (x(p) - r)
                    } else {
                        x(p)
                    }
                };
                let pb = t.get(b).unwrap();
                assert!(pb.up, "case {case}");
                for p in t.paths().iter().filter(|p| p.up) {
                    assert!(
                        cost(pb) < cost(p) || (cost(pb) == cost(p) && pb.id <= p.id),
                        "case {case}: best effort on {b:?} ({}) vs {:?} ({})",
                        cost(pb),
                        p.id,
                        cost(p)
                    );
                }
                // Exploring never costs more than the honest estimate, and past slow start
                // they agree.
                for p in t.paths().iter().filter(|p| p.up) {
                    assert!(x(p) <= e(p), "case {case}");
                    if !p.slow_start {
                        assert_eq!(x(p), e(p), "case {case}");
                    }
                }
            }
        }
    }

    /// A path still in slow start with a window smaller than a request (light use kept it
    /// small; decision G20): a priority request pays the extra round trip its growth costs and
    /// goes elsewhere, a best-effort one explores it, until requests queue there.
    #[test]
    fn best_effort_explores_a_path_whose_window_light_use_kept_small() {
        let t0 = T0.with(|t| *t);
        let rows = [(40, 64_000, 0.0, true), (30, 12_000, 0.0, true)];
        let mut t = measured_in(&rows, &[false, true]);
        // Priority: 30 × (1 + log2(1 + 16 384 / 15 000)) = 62 ms against 40 × 1.2 = 48 ms.
        assert_eq!(completion(&t, Priority::Priority), Some(0));
        // Best effort: 30 × (1 + log2(1 + 1 384 / 15 000)) = 34 ms (nothing queued; the
        // request exceeds its first paced window by 1 384 bytes) against 40 + 2 × 8 = 56 ms
        // on priority's path (decision G22).
        assert_eq!(completion(&t, Priority::BestEffort), Some(1));
        // A 60 KB request pays for the window's growth beyond its first 15 KB:
        // 30 × (1 + log2(1 + 45 000 / 15 000)) = 90 ms, against 40 + 2 × 30 = 100 ms on
        // path 0 (E = 40 × 1.75 = 70 ms there).
        let ms = |p: usize, bytes: u64| {
            let e = Completion::expected_exploring(&t, t.get(PathId(p)).unwrap(), bytes, t0);
            (e.unwrap() * 1e3).round()
        };
        assert_eq!((ms(1, 60_000), ms(0, 60_000)), (90.0, 70.0));
        let big = Ask::new(Priority::BestEffort, 60_000, None, t0);
        assert_eq!(Completion::default().pick(&t, &big), Some(PathId(1)));
        // Without the margin path 0's 70 ms would win.
        let mut plain = Completion {
            best_effort_margin: 0.0,
        };
        assert_eq!(plain.pick(&t, &big), Some(PathId(0)));
        // 30 KB queued there: 30 × (1 + log2(1 + (30 000 + 1 384) / 15 000)) = 79 ms: back on
        // path 0.
        t.on_request_sent(PathId(1), 30_000, t0);
        assert_eq!(completion(&t, Priority::BestEffort), Some(0));
        // Past slow start the window is what it is, for both classes.
        let t = measured(&rows);
        assert_eq!(completion(&t, Priority::BestEffort), Some(0));
    }
}
