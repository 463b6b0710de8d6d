//! Running a plan's variants: each builds its world, sets its workloads up, starts the clock,
//! applies the timeline and collects what the workloads measured. Runs are independent and
//! deterministic (the same variant gives the same record), so they spread over any number of
//! threads.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use qgate_netsim::topology::{Directions, LinkChange};
use qgate_netsim::World;
use qgate_transport::DevPki;
use tokio::time::Instant;

use super::spec::Plan;
use super::workload::{self, Clock, Setup};
use super::Variant;

/// What one run measured, metric names prefixed with their workload's.
#[derive(Debug, Clone, Default)]
pub struct Record {
    /// Scheme.
    pub scheme: String,
    /// Sweep point.
    pub point: Option<super::At>,
    /// Seed.
    pub seed: u64,
    /// One value per metric: the workloads' scalars, and for each sampled metric its `_mean`,
    /// `_p50`, `_p99` (and `_mean@phase` per timeline phase).
    pub scalars: BTreeMap<String, f64>,
    /// Sampled metrics: (t, value).
    pub samples: BTreeMap<String, Vec<(f64, f64)>>,
    /// Per-second series.
    pub series: BTreeMap<String, Vec<(f64, f64)>>,
}

/// After the deadline, workloads get this long to wind down (answers in flight).
const GRACE: Duration = Duration::from_secs(30);

/// Run one variant in virtual time on this thread.
pub fn run_variant(v: &Variant) -> Result<Record, String> {
    let at = format!("scheme {}", v.label());
    let mut rec =
        crate::virtual_time(simulate(&v.plan, v.seed)).map_err(|e| format!("{at}: {e}"))?;
    rec.scheme = v.scheme.clone();
    rec.point = v.point.clone();
    rec.seed = v.seed;
    Ok(rec)
}

async fn simulate(plan: &Plan, seed: u64) -> Result<Record, String> {
    let mut world = World::build(&plan.topology, seed).map_err(|e| e.to_string())?;
    let pki = Arc::new(DevPki::generate(&[]).map_err(|e| e.to_string())?);
    let mut prepared = Vec::new();
    for (index, w) in plan.workloads.iter().enumerate() {
        let setup = Setup {
            seed,
            index,
            pki: pki.clone(),
        };
        prepared.push((
            w.name().to_string(),
            workload::prepare(w, &mut world, &setup).await?,
        ));
    }
    let start = Instant::now();
    let clock = Clock {
        start,
        deadline: start + Duration::from_secs_f64(plan.plan.duration_s),
        finished: Arc::default(),
    };
    let world = Arc::new(world);
    let changes = plan.timeline.clone();
    let timeline = {
        let world = world.clone();
        tokio::spawn(async move {
            let mut changes = changes;
            changes.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
            for c in changes {
                tokio::time::sleep_until(start + Duration::from_secs_f64(c.at_s)).await;
                if let Some(link) = &c.link {
                    let dir = |o: &Option<LinkChange>| match o {
                        Some(o) => c.set.then(o),
                        None => c.set.clone(),
                    };
                    world.change(link, Directions::AToB, &dir(&c.a_to_b))?;
                    world.change(link, Directions::BToA, &dir(&c.b_to_a))?;
                }
            }
            Ok::<(), qgate_netsim::topology::TopologyError>(())
        })
    };
    let names: Vec<String> = prepared.iter().map(|p| p.0.clone()).collect();
    let background: Vec<bool> = prepared.iter().map(|p| p.1.is_background()).collect();
    let mut fg = Vec::new();
    let mut bg = Vec::new();
    for (_, p) in prepared {
        if p.is_background() {
            bg.push(p.run(clock.clone()));
        } else {
            fg.push(p.run(clock.clone()));
        }
    }
    let any_fg = !fg.is_empty();
    let finished = clock.finished.clone();
    let fg = async move {
        let r = futures_util::future::join_all(fg).await;
        // The run's own work is done: background flows stop (decision X4).
        if any_fg {
            finished.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        r
    };
    let both = async { tokio::join!(fg, futures_util::future::join_all(bg)) };
    let (fg, bg) = tokio::time::timeout_at(clock.deadline + GRACE, both)
        .await
        .map_err(|_| format!("workloads still running {GRACE:?} after the deadline"))?;
    let (mut fg, mut bg) = (fg.into_iter(), bg.into_iter());
    let results: Vec<_> = background
        .iter()
        .map(|&b| {
            if b {
                bg.next().expect("one per background workload")
            } else {
                fg.next().expect("one per workload")
            }
        })
        .collect();
    if timeline.is_finished() {
        timeline
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("timeline: {e}"))?;
    } else {
        timeline.abort();
    }

    Ok(collect(names.into_iter().zip(results), &phases(plan)))
}

/// One record of what named workloads measured: metric names prefixed with the workload's,
/// each sampled metric also aggregated (overall and per phase).
pub(crate) fn collect(
    measured: impl IntoIterator<Item = (String, workload::Measurements)>,
    phases: &[(f64, String)],
) -> Record {
    let mut rec = Record::default();
    for (name, m) in measured {
        for (k, v) in m.scalars {
            rec.scalars.insert(format!("{name}.{k}"), v);
        }
        for (k, v) in m.series {
            rec.series.insert(format!("{name}.{k}"), v);
        }
        for (k, v) in m.samples {
            let key = format!("{name}.{k}");
            aggregate(&mut rec.scalars, &key, &v, phases);
            rec.samples.insert(key, v);
        }
    }
    rec
}

/// The timeline's phases: (start s, name), in time order.
pub fn phases(plan: &Plan) -> Vec<(f64, String)> {
    let mut p: Vec<(f64, String)> = plan
        .timeline
        .iter()
        .filter_map(|c| Some((c.at_s, c.phase.clone()?)))
        .collect();
    p.sort_by(|a, b| a.0.total_cmp(&b.0));
    p
}

/// Quantile `q` of sorted values (nearest rank).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// `key_mean`, `key_p50`, `key_p99` of the samples, and `key_mean@phase` per phase.
fn aggregate(
    out: &mut BTreeMap<String, f64>,
    key: &str,
    samples: &[(f64, f64)],
    phases: &[(f64, String)],
) {
    let mut v: Vec<f64> = samples.iter().map(|s| s.1).collect();
    if v.is_empty() {
        return;
    }
    out.insert(
        format!("{key}_mean"),
        v.iter().sum::<f64>() / v.len() as f64,
    );
    v.sort_by(f64::total_cmp);
    out.insert(format!("{key}_p50"), quantile(&v, 0.5));
    out.insert(format!("{key}_p99"), quantile(&v, 0.99));
    // A phase may come back later in the run: its mean covers all of its intervals.
    let mut by_phase: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for (i, (from, name)) in phases.iter().enumerate() {
        let to = phases.get(i + 1).map_or(f64::INFINITY, |p| p.0);
        by_phase.entry(name).or_default().extend(
            samples
                .iter()
                .filter(|s| s.0 >= *from && s.0 < to)
                .map(|s| s.1),
        );
    }
    for (name, v) in by_phase {
        if !v.is_empty() {
            out.insert(
                format!("{key}_mean@{name}"),
                v.iter().sum::<f64>() / v.len() as f64,
            );
        }
    }
}

/// Run every variant on up to `jobs` threads; `progress(done, total, variant)` after each.
/// Records come back in variant order; the first failure is returned.
pub fn run_all(
    variants: &[Variant],
    jobs: usize,
    progress: impl Fn(usize, usize, &Variant) + Sync,
) -> Result<Vec<Record>, String> {
    let done = std::sync::atomic::AtomicUsize::new(0);
    crate::pool::run_each(variants, jobs, run_variant, |v| {
        let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        progress(n, variants.len(), v)
    })
    .into_iter()
    .collect()
}

/// Where two executions of the same variants disagree: one line per run whose scalars differ
/// (bit for bit; NaN equals NaN), naming the run and its first differing metric. A plan whose
/// runs depend only on their seed gives none (`qgate-lab run --repeat-check`).
pub fn differences(first: &[Record], second: &[Record]) -> Vec<String> {
    let same = |a: f64, b: f64| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
    let mut out = Vec::new();
    for (a, b) in first.iter().zip(second) {
        let name = |r: &Record| {
            let at = r
                .point
                .as_ref()
                .map_or(String::new(), |p| format!(" at {} = {}", p.sweep, p.x));
            format!("{}{at} seed {}", r.scheme, r.seed)
        };
        let keys = a.scalars.keys().chain(b.scalars.keys());
        let first_diff = keys
            .filter(|k| match (a.scalars.get(*k), b.scalars.get(*k)) {
                (Some(x), Some(y)) => !same(*x, *y),
                _ => true,
            })
            .min();
        if let Some(k) = first_diff {
            let show = |r: &Record| r.scalars.get(k).map_or("absent".into(), |v| v.to_string());
            out.push(format!("{}: {k} {} then {}", name(a), show(a), show(b)));
        }
    }
    if first.len() != second.len() {
        out.push(format!("{} runs then {}", first.len(), second.len()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_name_the_run_and_its_first_differing_metric() {
        let rec = |seed: u64, vals: &[(&str, f64)]| Record {
            scheme: "s".into(),
            point: None,
            seed,
            scalars: vals.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            ..Default::default()
        };
        let a = vec![
            rec(1, &[("x", 1.0), ("y", f64::NAN)]),
            rec(2, &[("x", 1.0), ("y", 2.0)]),
        ];
        assert!(differences(&a, &a.clone()).is_empty(), "NaN equals NaN");
        let b = vec![
            rec(1, &[("x", 1.0), ("y", f64::NAN)]),
            rec(2, &[("x", 1.0), ("y", 2.000_000_000_000_001)]),
        ];
        assert_eq!(
            differences(&a, &b),
            ["s seed 2: y 2 then 2.000000000000001"]
        );
        let c = vec![rec(1, &[("x", 1.0)])];
        assert_eq!(differences(&a[..1], &c), ["s seed 1: y NaN then absent"]);
    }

    #[test]
    fn aggregates_split_by_phase() {
        let mut out = BTreeMap::new();
        let samples = [(0.5, 1.0), (1.5, 3.0), (2.5, 5.0), (3.5, 7.0)];
        let phases = vec![
            (0.0, "a".to_string()),
            (2.0, "b".to_string()),
            (3.0, "a".to_string()),
        ];
        aggregate(&mut out, "w.x", &samples, &phases);
        assert_eq!(out["w.x_mean"], 4.0);
        assert_eq!(out["w.x_p50"], 3.0);
        assert_eq!(out["w.x_p99"], 7.0);
        assert_eq!(
            out["w.x_mean@a"],
            (1.0 + 3.0 + 7.0) / 3.0,
            "both of a's intervals"
        );
        assert_eq!(out["w.x_mean@b"], 5.0);
    }
}
