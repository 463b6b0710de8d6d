//! `qgate-lab aqm`: paper 004's experiment, run from the shipped plans
//! `lab/plans/paper004-aqm.toml` (six disciplines at two operating points) and
//! `paper004-tau0.toml` (PID-Delay's τ0), with the paper's own table, its numbers against ours,
//! the τ0 sweep and the stability margins appended to the plan's summary.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use qgate_aqm::{DisciplineSpec, PidDelayParams};

use crate::papers::paper004_report::{self, Aggregate};
use crate::papers::paper004_results::{AqmConfig, RunResult};
use crate::plan::run::Record;
use crate::plan::spec::{Plan, Workload};
use crate::plan::{Loaded, PlanError, Variant};
use crate::stats::Summary;

/// The scheme name of PID-Delay's stable variant in the plan (decision P11).
pub const STABLE: &str = "pid-delay-stable";

/// The shipped disciplines plan.
pub const PLAN: &str = include_str!("../../../../lab/plans/paper004-aqm.toml");
/// Its path in the repository.
pub const PLAN_PATH: &str = "lab/plans/paper004-aqm.toml";
/// The shipped τ0 plan.
pub const TAU0_PLAN: &str = include_str!("../../../../lab/plans/paper004-tau0.toml");
/// Its path in the repository.
pub const TAU0_PLAN_PATH: &str = "lab/plans/paper004-tau0.toml";

/// The shipped plan of what 95 % utilisation costs at the third point (decision P12).
pub const FRONTIER_PLAN: &str = include_str!("../../../../lab/plans/paper004-frontier.toml");
/// Its path in the repository.
pub const FRONTIER_PLAN_PATH: &str = "lab/plans/paper004-frontier.toml";

/// The disciplines plan, parsed.
pub fn plan() -> Result<Loaded, PlanError> {
    Loaded::parse(PLAN, Path::new(PLAN_PATH))
}

/// The τ0 plan, parsed.
pub fn tau0_plan() -> Result<Loaded, PlanError> {
    Loaded::parse(TAU0_PLAN, Path::new(TAU0_PLAN_PATH))
}

/// The frontier plan, parsed.
pub fn frontier_plan() -> Result<Loaded, PlanError> {
    Loaded::parse(FRONTIER_PLAN, Path::new(FRONTIER_PLAN_PATH))
}

/// The operating point a variant of these plans runs, in the report's terms (read from the
/// plan as run, so the report cannot disagree with it).
pub fn config(p: &Plan, seeds: Vec<u64>) -> Result<AqmConfig, String> {
    let flows = p
        .workloads
        .iter()
        .find_map(|w| match w {
            Workload::Bulk(b) if b.name == "flows" => Some(b),
            _ => None,
        })
        .ok_or("no bulk workload 'flows'")?;
    let link = p
        .topology
        .links
        .iter()
        .find(|l| l.name == "bottleneck")
        .ok_or("no link 'bottleneck'")?;
    let data = link
        .params(qgate_netsim::Direction::AtoB)
        .map_err(|e| format!("bottleneck: {e}"))?;
    let mut access = qgate_netsim::LinkParams::default();
    flows
        .access
        .apply(&mut access)
        .map_err(|e| format!("access: {e}"))?;
    let limit = match &data.queue {
        DisciplineSpec::Droptail {
            packets: Some(n), ..
        } => *n,
        _ => qgate_aqm::DEFAULT_PACKET_LIMIT,
    };
    let rate = data.rate_bps.ok_or("the bottleneck needs a rate")?;
    Ok(AqmConfig {
        key: format!("{}mbit", rate / 1_000_000),
        label: format!(
            "{} Mbit/s, {} ms, {} flows",
            rate / 1_000_000,
            data.delay.as_millis(),
            flows.sources
        ),
        flows: flows.sources,
        access_rate_bps: access.rate_bps.unwrap_or(0),
        access_delay: access.delay,
        bottleneck_rate_bps: rate,
        bottleneck_delay: data.delay,
        loss: data.loss.mean_loss(),
        limit,
        packet_bytes: flows.packet_bytes,
        duration: Duration::from_secs_f64(p.plan.duration_s),
        warmup: Duration::from_secs_f64(flows.warmup_s),
        seeds,
        disciplines: Vec::new(),
    })
}

/// One run in the report's terms.
pub fn run_result(v: &Variant, r: &Record) -> RunResult {
    let get = |k: &str| r.scalars.get(&format!("flows.{k}")).copied();
    let samples = |k: &str| -> Vec<f64> {
        r.samples
            .get(&format!("flows.{k}"))
            .map(|s| s.iter().map(|x| x.1).collect())
            .unwrap_or_default()
    };
    let spec = v
        .plan
        .topology
        .links
        .iter()
        .find(|l| l.name == "bottleneck")
        .and_then(|l| l.params(qgate_netsim::Direction::AtoB).ok())
        .map(|p| p.queue.to_string())
        .unwrap_or_default();
    let nan = f64::NAN;
    RunResult {
        discipline: r.scheme.clone(),
        spec,
        seed: r.seed,
        total_goodput_mbps: get("goodput_mbps").unwrap_or(nan),
        flow_goodput_mbps: samples("flow_goodput_mbps"),
        utilisation: get("utilisation").unwrap_or(nan),
        qdelay_ms: Summary {
            mean: get("qdelay_ms").unwrap_or(nan),
            std: get("qdelay_std_ms").unwrap_or(nan),
            n: get("delivered_packets").unwrap_or(0.0) as usize,
        },
        qdelay_p99_ms: get("qdelay_p99_ms").unwrap_or(nan),
        flow_rtt_ms: samples("flow_rtt_ms"),
        queue_drops: get("queue_drops").unwrap_or(0.0) as u64,
        aqm_drops: get("aqm_drops").unwrap_or(0.0) as u64,
        random_losses: get("random_losses").unwrap_or(0.0) as u64,
        received_packets: get("delivered_packets").unwrap_or(0.0) as u64,
        signal_probability: (
            get("drop_probability").unwrap_or(nan),
            get("drop_probability_std").unwrap_or(nan),
        ),
        target_ms: get("target_ms").unwrap_or(nan),
    }
}

/// The appended sections: per operating point, the paper's table and comparison; the τ0
/// table from `tau0` runs (at the first point); the stability margins; what 95 % utilisation
/// costs at the third point, from `frontier` runs.
pub fn sections(
    variants: &[Variant],
    records: &[Record],
    tau0: &[(Variant, Record)],
    frontier: &[(Variant, Record)],
) -> Result<String, String> {
    let mut points: Vec<usize> = Vec::new();
    for v in variants {
        let i = v.point.as_ref().map_or(0, |p| p.index);
        if !points.contains(&i) {
            points.push(i);
        }
    }
    let sweep: Vec<(f64, Aggregate)> = {
        let mut xs: Vec<f64> = Vec::new();
        for (v, _) in tau0 {
            let x = v.point.as_ref().map_or(0.0, |p| p.x);
            if !xs.contains(&x) {
                xs.push(x);
            }
        }
        xs.iter()
            .filter_map(|&x| {
                let runs: Vec<RunResult> = tau0
                    .iter()
                    .filter(|(v, _)| v.point.as_ref().map_or(0.0, |p| p.x) == x)
                    .map(|(v, r)| run_result(v, r))
                    .collect();
                paper004_report::aggregate(&runs).pop().map(|a| (x, a))
            })
            .collect()
    };
    let mut out = String::new();
    for (k, &i) in points.iter().enumerate() {
        let at: Vec<(&Variant, &Record)> = variants
            .iter()
            .zip(records)
            .filter(|(v, _)| v.point.as_ref().map_or(0, |p| p.index) == i)
            .collect();
        let Some((first, _)) = at.first() else {
            continue;
        };
        let mut seeds: Vec<u64> = at.iter().map(|(v, _)| v.seed).collect();
        seeds.sort_unstable();
        seeds.dedup();
        let cfg = config(&first.plan, seeds)?;
        let runs: Vec<RunResult> = at.iter().map(|(v, r)| run_result(v, r)).collect();
        // The paper's comparison covers the paper's six; the stable variant has its own section.
        let paper: Vec<RunResult> = runs
            .iter()
            .filter(|r| r.discipline != STABLE)
            .cloned()
            .collect();
        let margins = paper004_report::margins_md(&cfg, &PidDelayParams::default());
        let sw: &[(f64, Aggregate)] = if k == 0 { &sweep } else { &[] };
        out.push_str(&paper004_report::paper_sections(&cfg, &paper, sw, &margins));
        if paper.len() < runs.len() {
            let mut stable = paper004_report::margins_md(&cfg, &PidDelayParams::stable());
            // The busy-time guard moves the target, and the loop's RTT with it (decision P12).
            let targets: Vec<f64> = runs
                .iter()
                .filter(|r| r.discipline == STABLE && r.target_ms.is_finite())
                .map(|r| r.target_ms)
                .collect();
            if !targets.is_empty() {
                let mean = Summary::of(&targets).mean;
                let at = PidDelayParams {
                    target: std::time::Duration::from_secs_f64(mean / 1e3),
                    ..PidDelayParams::stable()
                };
                let _ = write!(
                    stable,
                    "\n\nAt the target the busy-time guard held on average in this run ({mean:.2} ms, decision P12):\n\n{}",
                    paper004_report::margins_md(&cfg, &at)
                );
            }
            out.push_str(&paper004_report::stable_section(
                &cfg, &runs, STABLE, &stable,
            ));
        }
    }
    if let Some((v, _)) = frontier.first() {
        let mut seeds: Vec<u64> = frontier.iter().map(|(v, _)| v.seed).collect();
        seeds.sort_unstable();
        seeds.dedup();
        let cfg = config(&v.plan, seeds)?;
        let runs: Vec<RunResult> = frontier.iter().map(|(v, r)| run_result(v, r)).collect();
        out.push_str(&paper004_report::frontier_section(&cfg, &runs, STABLE));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_shipped_plans_parse_and_describe_the_paper_point() {
        let p = super::plan().unwrap();
        assert_eq!(p.scheme_names().len(), 7);
        let cfg = super::config(&p.plan, vec![1]).unwrap();
        assert_eq!(
            (
                cfg.flows,
                cfg.bottleneck_rate_bps,
                cfg.limit,
                cfg.packet_bytes
            ),
            (10, 10_000_000, 1000, 1440)
        );
        assert_eq!(cfg.loss, 0.01);
        assert_eq!(cfg.access_rate_bps, 50_000_000);
        super::tau0_plan().unwrap();
        super::frontier_plan().unwrap();
    }
}
