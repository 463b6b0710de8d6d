//! The repetitions behind every table and figure: a point's, found by what it ran; each side's
//! values; their summaries and how many distinct values they took.

use crate::papers::paper003::{Point, Rep, Side, Transport};
use crate::stats::Summary;

/// Wire throughput of a side, kbit/s (NaN where bytes are unknown).
pub(super) fn kbps(s: &Side) -> f64 {
    s.wire_bytes * 8.0 / 1000.0 / s.total_s.max(1e-12)
}

pub(super) fn sides(rep: &Rep) -> impl Iterator<Item = (&'static str, &Side)> {
    std::iter::once(("send", &rep.send)).chain(rep.recv.iter().map(|r| ("recv", r)))
}

pub(super) fn summary(reps: &[Rep], side: &str, f: impl Fn(&Side) -> f64) -> Summary {
    Summary::of(
        &reps
            .iter()
            .flat_map(sides)
            .filter(|(s, _)| *s == side)
            .map(|(_, x)| f(x))
            .filter(|v| v.is_finite())
            .collect::<Vec<_>>(),
    )
}

/// How many different values `f` took over the repetitions (seeds that agree exactly count
/// once), with n.
pub(super) fn outcomes(reps: &[Rep], side: &str, f: impl Fn(&Side) -> f64) -> String {
    let mut v: Vec<u64> = reps
        .iter()
        .flat_map(sides)
        .filter(|(s, _)| *s == side)
        .map(|(_, x)| f(x).to_bits())
        .collect();
    let n = v.len();
    v.sort_unstable();
    v.dedup();
    format!("n = {n}, {} distinct", v.len())
}

pub(super) fn find<'a>(
    points: &[Point],
    results: &'a [Vec<Rep>],
    f: impl Fn(&Point) -> bool,
) -> Option<(&'a [Rep], usize)> {
    points
        .iter()
        .position(f)
        .map(|i| (results[i].as_slice(), points[i].messages))
}

pub(super) fn failures(reps: &[Rep]) -> usize {
    reps.iter().flat_map(sides).map(|(_, x)| x.failed).sum()
}

/// The channels of a sweep, in plan order.
pub(super) fn sweep_channels(
    points: &[Point],
    sweep: &str,
) -> Vec<crate::papers::paper003::Channel> {
    let mut v: Vec<crate::papers::paper003::Channel> = Vec::new();
    for p in points.iter().filter(|p| p.sweep == sweep) {
        if !v.contains(&p.channel) {
            v.push(p.channel);
        }
    }
    v
}

pub(super) fn sweep_point<'a>(
    points: &[Point],
    results: &'a [Vec<Rep>],
    sweep: &str,
    c: &crate::papers::paper003::Channel,
    t: Transport,
) -> Option<&'a [Rep]> {
    find(points, results, |p| {
        p.sweep == sweep && p.channel == *c && p.transport == t
    })
    .map(|(r, _)| r)
}
