//! The labs on the simulated network in virtual time: the papers' experiments (shipped plans
//! through the plan runner, paper 003's cases in code), the fault lab, and paper 004's margins.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use qgate::{usage, Failure};
use qgate_aqm::PidDelayParams;

use super::execute::{execute, out_dir, scenario, write_results};
use crate::papers::paper004_report as aqm_report;
use crate::papers::paper004_results::AqmConfig;

#[derive(Args, Debug)]
pub struct AmqpArgs {
    /// Smoke run: each plan's `[plan.quick]` (a few messages, one or two seeds, two points per
    /// sweep).
    #[arg(long)]
    quick: bool,
    /// Seeds (repetitions) of every plan [default: each plan's own `seeds`].
    #[arg(long)]
    seeds: Option<u64>,
    /// Threads for the simulated runs [default: one per core].
    #[arg(long)]
    jobs: Option<usize>,
    /// Skip the real-time loopback baseline (QUIC and TCP+TLS on 127.0.0.1).
    #[arg(long)]
    no_loopback: bool,
    /// Where to write results [default: results/amqp].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct FaultsArgs {
    /// Smoke run: one seed, 10 devices and fewer clients (the same faults).
    #[arg(long)]
    quick: bool,
    /// Seeds per scenario [default: 3; 1 with --quick].
    #[arg(long)]
    seeds: Option<u64>,
    /// Where to write results [default: results/faults].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ProxyArgs {
    /// Smoke run: the plan's [plan.quick] (a few points, one seed, no dynamic scenario).
    #[arg(long)]
    quick: bool,
    /// Seeds per point [default: the plan's, 5].
    #[arg(long)]
    seeds: Option<u64>,
    /// Where to write results [default: results/proxy; every device sending both classes in
    /// its both-classes/].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Only this scenario: `device` (one class per device) or `both` (every device sends both,
    /// as the paper's clients) [default: each in turn].
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(crate::papers::paper000::SCENARIOS.map(|s| s.0)))]
    classes: Option<String>,
    /// Simulations run at once [default: one per core].
    #[arg(long, short = 'j')]
    jobs: Option<usize>,
}

#[derive(Args, Debug)]
pub struct UploadArgs {
    /// Smoke run: the plans' [plan.quick] (2 MB, two window points, two seeds).
    #[arg(long)]
    quick: bool,
    /// Seeds per point [default: the plans', 5].
    #[arg(long)]
    seeds: Option<u64>,
    /// Where to write results [default: results/upload; the fault case in its fault/].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Simulations run at once [default: one per core].
    #[arg(long, short = 'j')]
    jobs: Option<usize>,
}

#[derive(Args, Debug)]
pub struct HistoryArgs {
    /// Smoke run: the plans' [plan.quick] (5 downloads per series, 1 MB, fewer variants).
    #[arg(long)]
    quick: bool,
    /// Downloads per series [default: 50; 5 with --quick].
    #[arg(long)]
    runs: Option<usize>,
    /// Seeds per series [default: the plans', 3; 1 with --quick].
    #[arg(long)]
    seeds: Option<u64>,
    /// Where to write results [default: results/history; dumbbell/ and change/ below it].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Simulations run at once [default: one per core].
    #[arg(long, short = 'j')]
    jobs: Option<usize>,
}

#[derive(Args, Debug)]
pub struct AqmArgs {
    /// Smoke run: one seed, 20 s, paper point only, no τ0 sweep.
    #[arg(long)]
    quick: bool,
    /// Number of seeds (1, 2, …) [default: 5].
    #[arg(long)]
    seeds: Option<u64>,
    /// Simulated seconds per run [default: 100].
    #[arg(long)]
    duration: Option<u64>,
    /// Only these disciplines (comma-separated names, e.g. pie,pid-delay).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Run only the paper's operating point (skip 50 Mbit/s / 20 ms / 30 flows and 5 Mbit/s /
    /// 100 ms / 5 flows).
    #[arg(long)]
    no_second_point: bool,
    /// Where to write results [default: results/aqm].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Simulations run at once [default: one per core].
    #[arg(long, short = 'j')]
    jobs: Option<usize>,
}

#[derive(Args, Debug)]
pub struct MarginArgs {
    /// Bottleneck rate, Mbit/s.
    #[arg(long, default_value_t = 10.0)]
    mbps: f64,
    /// Round-trip propagation delay, ms (τ0 is added).
    #[arg(long, default_value_t = 102.0)]
    rtt_ms: f64,
    /// Long-lived flows.
    #[arg(long, default_value_t = 10)]
    flows: usize,
    /// Packet size, bytes.
    #[arg(long, default_value_t = 1440)]
    packet_bytes: usize,
}

pub(super) fn amqp_cmd(a: AmqpArgs) -> Result<(), Failure> {
    use crate::papers::{paper003, paper003_report};
    let root = a.out.unwrap_or_else(|| PathBuf::from("results/amqp"));
    let command = std::iter::once("qgate-lab amqp".to_string())
        .chain(std::env::args().skip(2))
        .collect::<Vec<_>>()
        .join(" ");
    let opts = crate::plan::Options {
        seeds: a.seeds,
        quick: a.quick,
        ..Default::default()
    };
    let wall = std::time::Instant::now();
    // Every plan is checked before anything runs.
    let mut plans = Vec::new();
    for shipped in &paper003::PLANS {
        let loaded = shipped.load().map_err(usage)?;
        let eff = loaded.overridden(&opts).map_err(usage)?;
        let out = out_dir(&eff, Some(root.join(shipped.sub)))?;
        let seeds = loaded.variants(&opts).map_err(usage)?;
        let seeds = seeds.iter().map(|v| v.seed).max().unwrap_or(1) as usize;
        plans.push((shipped, loaded, eff, out, seeds));
    }
    // The real-time baseline first, with nothing else running.
    let mut loopback = Vec::new();
    if !a.no_loopback {
        for (shipped, _, eff, _, seeds) in &plans {
            if !paper003::LOOPBACK_CASES.contains(&shipped.case) {
                continue;
            }
            let w = paper003::workload(eff).map_err(usage)?;
            for t in paper003::LOOPBACK_TRANSPORTS {
                eprintln!(
                    "amqp: loopback {} {} ({seeds} repetitions)",
                    shipped.case.name(),
                    t.name()
                );
                loopback.push(paper003::loopback(shipped.case, w, t, *seeds));
            }
        }
    }
    let mut points = Vec::new();
    for (shipped, loaded, eff, out, _) in plans {
        let ran = execute(&loaded, &opts, a.jobs)?;
        points.extend(
            paper003::netsim_points(shipped.case, &ran.variants, &ran.records)
                .map_err(|e| anyhow::anyhow!("{}: {e}", loaded.file.display()))?,
        );
        write_results(&eff, &opts, &ran, out, false, "")?;
    }
    points.extend(loopback);
    let (points, results): (Vec<_>, Vec<_>) = points.into_iter().unzip();
    paper003_report::write_all(&root, &points, &results, &command)
        .map_err(|e| anyhow::anyhow!("writing results to {}: {e}", root.display()))?;
    eprintln!(
        "qgate-lab amqp: done in {:.1} s; paper report in {}",
        wall.elapsed().as_secs_f64(),
        root.join("summary.md").display()
    );
    Ok(())
}

pub(super) fn faults_cmd(a: FaultsArgs) -> Result<(), Failure> {
    use crate::faults::{self, report, FaultsConfig};
    let cfg = FaultsConfig {
        seeds: a.seeds.unwrap_or(if a.quick {
            1
        } else {
            FaultsConfig::full().seeds
        }),
        quick: a.quick,
    };
    if cfg.seeds == 0 {
        return Err(usage("--seeds must be at least 1"));
    }
    scenario(
        "faults",
        "runs",
        2 * cfg.seeds as usize,
        a.out,
        |tick| faults::run_all(&cfg, tick),
        |out, results, command| report::write_all(out, results, command),
    )?;
    Ok(())
}

pub(super) fn proxy_cmd(a: ProxyArgs) -> Result<(), Failure> {
    use crate::papers::paper000;
    let loaded = paper000::plan().map_err(usage)?;
    let root = out_dir(&loaded, a.out)?;
    // Every scenario's plan is checked before the first runs.
    let mut scenarios = Vec::new();
    for (classes, sub) in paper000::SCENARIOS {
        if a.classes.as_ref().is_some_and(|c| c != classes) {
            continue;
        }
        let opts = crate::plan::Options {
            seeds: a.seeds,
            quick: a.quick,
            set: vec![(
                "workloads.gw.classes".into(),
                toml::Value::String(classes.into()),
            )],
            ..Default::default()
        };
        let eff = loaded.overridden(&opts).map_err(usage)?;
        let out = sub.map_or(Ok(root.clone()), |s| out_dir(&eff, Some(root.join(s))))?;
        scenarios.push((opts, eff, out));
    }
    for (opts, eff, out) in scenarios {
        let ran = execute(&loaded, &opts, a.jobs)?;
        let extra = paper000::against_paper(&eff, &ran.records);
        write_results(&eff, &opts, &ran, out, false, &extra)?;
    }
    Ok(())
}

pub(super) fn upload_cmd(a: UploadArgs) -> Result<(), Failure> {
    let root = a.out.unwrap_or_else(|| PathBuf::from("results/upload"));
    let opts = crate::plan::Options {
        seeds: a.seeds,
        quick: a.quick,
        ..Default::default()
    };
    let plans = crate::papers::paper001::plans().map_err(usage)?;
    let mut done = Vec::new();
    for (loaded, sub) in &plans {
        let eff = loaded.overridden(&opts).map_err(usage)?;
        let out = out_dir(&eff, Some(root.join(sub)))?;
        done.push((execute(loaded, &opts, a.jobs)?, out, eff));
    }
    let extra = crate::papers::paper001::against_paper(
        &done[0].0.records,
        &done[1].0.records,
        &done[2].0.records,
    );
    let required = crate::papers::paper001::requirement_section(&done[2].0.records);
    for (i, (ran, out, eff)) in done.into_iter().enumerate() {
        let e = match i {
            0 => extra.as_str(),
            2 => required.as_str(),
            _ => "",
        };
        write_results(&eff, &opts, &ran, out, false, e)?;
    }
    Ok(())
}

pub(super) fn history_cmd(a: HistoryArgs) -> Result<(), Failure> {
    let runs = a.runs.unwrap_or(if a.quick { 5 } else { 50 });
    if runs < 2 {
        return Err(usage(
            "--runs must be at least 2 (the first run of a series has no history)",
        ));
    }
    let root = a.out.unwrap_or_else(|| PathBuf::from("results/history"));
    let opts = crate::plan::Options {
        seeds: a.seeds,
        quick: a.quick,
        set: vec![(
            "workloads.dl.runs".into(),
            toml::Value::Integer(runs as i64),
        )],
        ..Default::default()
    };
    let plans = crate::papers::paper002::plans().map_err(usage)?;
    let mut done = Vec::new();
    for (loaded, sub) in &plans {
        let eff = loaded.overridden(&opts).map_err(usage)?;
        let out = out_dir(&eff, Some(root.join(sub)))?;
        done.push((execute(loaded, &opts, a.jobs)?, out, eff));
    }
    let extra = crate::papers::paper002::against_paper(
        &done[0].0.records,
        &done[1].0.records,
        &done[2].0.records,
        &done[3].0.records,
    );
    for (i, (ran, out, eff)) in done.into_iter().enumerate() {
        let e = if i == 0 { extra.as_str() } else { "" };
        write_results(&eff, &opts, &ran, out, false, e)?;
    }
    Ok(())
}

pub(super) fn aqm_cmd(a: AqmArgs) -> Result<(), Failure> {
    use crate::papers::paper004;
    let loaded = paper004::plan().map_err(usage)?;
    let mut opts = crate::plan::Options {
        seeds: a.seeds,
        quick: a.quick,
        schemes: a.only.clone(),
        ..Default::default()
    };
    if let Some(d) = a.duration {
        if d < 2 {
            return Err(usage("--duration must be at least 2 seconds"));
        }
        opts.set
            .push(("plan.duration_s".into(), toml::Value::Integer(d as i64)));
        // The warm-up stays at most a quarter of the run.
        let warm = (d as f64 / 4.0).min(10.0);
        opts.set
            .push(("workloads.flows.warmup_s".into(), toml::Value::Float(warm)));
    }
    if a.no_second_point {
        opts.points = Some(vec![0]);
    }
    let eff = loaded.overridden(&opts).map_err(usage)?;
    let out = out_dir(&eff, a.out)?;
    let ran = execute(&loaded, &opts, a.jobs)?;
    // The companion plans run with the same seeds and overrides.
    let beside = |plan: crate::plan::Loaded| -> Result<Vec<_>, Failure> {
        let o = crate::plan::Options {
            seeds: a.seeds,
            set: opts.set.clone(),
            ..Default::default()
        };
        let r = execute(&plan, &o, a.jobs)?;
        Ok(r.variants.into_iter().zip(r.records).collect())
    };
    // PID-Delay's τ0 sweep (not with --quick, nor when PID-Delay is left out).
    let mut tau0 = Vec::new();
    if !a.quick && (a.only.is_empty() || a.only.iter().any(|o| o == "pid-delay")) {
        tau0 = beside(paper004::tau0_plan().map_err(usage)?)?;
    }
    // What 95 % utilisation costs at the third point (decision P12): not with --quick, nor
    // when the stable variant or that point is left out.
    let mut frontier = Vec::new();
    if !a.quick
        && !a.no_second_point
        && (a.only.is_empty() || a.only.iter().any(|o| o == paper004::STABLE))
    {
        frontier = beside(paper004::frontier_plan().map_err(usage)?)?;
    }
    let extra = paper004::sections(&ran.variants, &ran.records, &tau0, &frontier)
        .map_err(|e| Failure::from(anyhow::anyhow!("{e}")))?;
    write_results(&eff, &opts, &ran, out, false, &extra)
}

/// Paper 004's gain and phase margins for a custom operating point (its fluid model; nothing runs).
pub(super) fn margins_cmd(m: MarginArgs) -> Result<(), Failure> {
    let pps = m.mbps * 1e6 / (m.packet_bytes as f64 * 8.0);
    let positive = m.mbps > 0.0 && m.rtt_ms > 0.0 && m.flows > 0 && m.packet_bytes > 0;
    if !(positive && m.mbps.is_finite() && m.rtt_ms.is_finite()) {
        return Err(usage(
            "--mbps, --rtt-ms, --flows and --packet-bytes must be positive and finite",
        ));
    }
    if pps < 1.0 {
        return Err(usage(format!(
            "--mbps {} carries {pps:.3} packets of {} B a second: under one, the fluid model has no meaning",
            m.mbps, m.packet_bytes
        )));
    }
    let paper = crate::papers::paper004::plan().map_err(usage)?;
    let base = crate::papers::paper004::config(&paper.plan.clone(), vec![1])
        .map_err(|e| Failure::from(anyhow::anyhow!("{e}")))?;
    let cfg = AqmConfig {
        key: "custom".into(),
        label: "custom".into(),
        flows: m.flows,
        bottleneck_rate_bps: (m.mbps * 1e6) as u64,
        bottleneck_delay: qgate_netsim::delay_from_ms(m.rtt_ms / 2.0)
            .map_err(|e| usage(format!("--rtt-ms: {e}")))?,
        access_delay: Duration::ZERO,
        packet_bytes: m.packet_bytes,
        ..base
    };
    println!(
        "## pid-delay (paper 004, Table II)\n\n{}\n\n## pid-delay-stable (decision P11)\n\n{}",
        aqm_report::margins_md(&cfg, &PidDelayParams::default()),
        aqm_report::margins_md(&cfg, &PidDelayParams::stable())
    );
    Ok(())
}
