//! Which backhaul path a device's request takes (paper 000 §3.3), and the paper's baselines.

use std::time::Duration;

use crate::path::{PathId, PathState, PathTable};

/// A device's class (paper 000 Fig. 2 step 4: 0 non-priority, 1 priority).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Priority {
    /// 0: best effort, load-balanced by hits.
    BestEffort,
    /// 1: priority, on the lowest-RTT path.
    Priority,
}

/// Picks a path for a request.
pub trait Scheduler: Send {
    /// `adaptive`, `round-robin` or `single`.
    fn name(&self) -> &'static str;

    /// The path for the next request of a device of class `priority` that is on `current`
    /// (`None` for a new device). `None` if no path is up.
    fn pick(
        &mut self,
        table: &PathTable,
        priority: Priority,
        current: Option<PathId>,
    ) -> Option<PathId>;
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
}

impl Default for Adaptive {
    fn default() -> Self {
        Adaptive { hysteresis: 0.25 }
    }
}

impl Scheduler for Adaptive {
    fn name(&self) -> &'static str {
        "adaptive"
    }

    fn pick(
        &mut self,
        table: &PathTable,
        priority: Priority,
        current: Option<PathId>,
    ) -> Option<PathId> {
        let cur = current.and_then(|c| table.get(c)).filter(|p| p.up);
        match priority {
            Priority::Priority => {
                let best = table.up().min_by_key(|p| (rtt_key(p), p.id))?;
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
                    .up()
                    .min_by_key(|p| (p.hits, rtt_key(p), p.id))
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

    fn pick(
        &mut self,
        table: &PathTable,
        _priority: Priority,
        _current: Option<PathId>,
    ) -> Option<PathId> {
        let n = table.paths().len();
        for k in 0..n {
            let i = (self.next + k) % n;
            if table.paths()[i].up {
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

    fn pick(
        &mut self,
        table: &PathTable,
        _priority: Priority,
        _current: Option<PathId>,
    ) -> Option<PathId> {
        table.get(self.path).filter(|p| p.up).map(|p| p.id)
    }
}

/// The scheduler a gateway runs unless told: paper 000's.
pub const DEFAULT_SCHEDULER: &str = "adaptive";

/// A scheduler by name: `adaptive`, `round-robin` or `single`.
pub fn by_name(name: &str) -> Result<Box<dyn Scheduler>, String> {
    match name {
        "adaptive" => Ok(Box::new(Adaptive::default())),
        "round-robin" | "roundrobin" | "rr" => Ok(Box::new(RoundRobin::default())),
        "single" => Ok(Box::new(Single { path: PathId(0) })),
        other => Err(format!(
            "unknown scheduler '{other}' (known: adaptive, round-robin, single)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::path::PathConfig;
    use std::time::Instant;

    /// A table with the given (RTT ms, hits, up) per path.
    fn table(rows: &[(Option<u64>, u32, bool)]) -> PathTable {
        let t0 = Instant::now();
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
            let got = Adaptive::default().pick(&t, *prio, current.map(PathId));
            assert_eq!(got, want.map(PathId), "{name}");
        }
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
            .map(|_| rr.pick(&t, Priority::Priority, None).unwrap().0)
            .collect();
        assert_eq!(seq, vec![0, 2, 0, 2, 0]);
        let none = table(&[(Some(10), 0, false)]);
        assert_eq!(rr.pick(&none, Priority::BestEffort, None), None);
    }

    #[test]
    fn single_uses_one_path_or_nothing() {
        let t = table(&[(Some(300), 0, true), (Some(10), 0, true)]);
        let mut s = Single { path: PathId(0) };
        assert_eq!(
            s.pick(&t, Priority::Priority, Some(PathId(1))),
            Some(PathId(0))
        );
        let down = table(&[(Some(300), 0, false), (Some(10), 0, true)]);
        assert_eq!(s.pick(&down, Priority::Priority, None), None);
        assert!(by_name("fastest")
            .err()
            .unwrap()
            .contains("adaptive, round-robin, single"));
        assert_eq!(by_name("rr").unwrap().name(), "round-robin");
    }
}
