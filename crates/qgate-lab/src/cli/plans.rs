//! `qgate-lab PLAN-OR-PAPER …`: the papers' experiments and any plan file.

use std::path::PathBuf;
use std::time::Duration;

use crate::papers::paper004_report as aqm_report;
use crate::papers::paper004_results::AqmConfig;
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use qgate::{usage, Failure};
use qgate_aqm::PidDelayParams;

#[derive(Subcommand, Debug)]
pub enum Lab {
    /// Paper 003: AMQP 1.0 over QUIC vs over TCP+TLS (results/amqp/).
    Amqp(AmqpArgs),
    /// Paper 003's cases with the kernel's TCP: `qgate broker` and `qgate send` through `qgate-lab
    /// linkem` in real time, QUIC against TLS 1.2 and 1.3 on kernel TCP (results/amqp-kernel/).
    /// Needs root; about 6 minutes with the defaults.
    AmqpKernel(AmqpKernelArgs),
    /// Paper 004: six queue disciplines and our stable PID-Delay under QUIC bulk flows, at three
    /// operating points (results/aqm/).
    Aqm(AqmArgs),
    /// Paper 004's point with kernel TCP flows (CUBIC, BBR) through `qgate-lab linkem` in real
    /// time, all six disciplines (results/aqm-kernel/). Needs root; about a minute per
    /// (cc, discipline, repetition) with the defaults.
    AqmKernel(AqmKernelArgs),
    /// Paper 004 in the product: the real `qgate gateway` shaping its backhaul through each
    /// discipline (or not) in front of a bloated 10 Mbit/s modem, through `qgate-lab linkem` in real
    /// time; priority response delay and bulk goodput (results/edge-aqm/). Needs root; about
    /// 25 s per (scheme, repetition) with the defaults.
    EdgeAqm(EdgeAqmArgs),
    /// The gateway and the broker under faults and hostile peers at once: path flaps, loss
    /// bursts, server and broker restarts, cut connections, registration floods, garbage
    /// datagrams; accepted, delivered, lost (must be 0), duplicated, recovery times
    /// (results/faults/).
    Faults(FaultsArgs),
    /// Gain and phase margins on the linearised model (paper 004 §III) of PID-Delay's Table II
    /// gains and of the stable variant's designed gains.
    Margins(MarginArgs),
    /// Paper 002: initial congestion window from history (runs the shipped plans
    /// lab/plans/paper002-*.toml into results/history/).
    History(HistoryArgs),
    /// Paper 001: multi-homed two-ended upload over Wi-Fi and cellular, against each alone,
    /// and the Wi-Fi path dying mid-transfer (runs the shipped plans
    /// lab/plans/paper001-*.toml into results/upload/).
    Upload(UploadArgs),
    /// Paper 001 as the paper ran it: Linux MPTCP (conventional, and the two-ended scheme on
    /// MPTCP sockets with backup subflows) through `qgate-lab linkem`, buffer sweeps (root).
    UploadKernel(UploadKernelArgs),
    /// Paper 000: the gateway's schedulers over three backhaul paths (runs the shipped plan
    /// lab/plans/paper000-proxy.toml into results/proxy/).
    Proxy(ProxyArgs),
    /// Run a scenario described in a plan file (README "Plan files"; examples in lab/plans/):
    /// results.csv, summary.md with confidence intervals and p-values, SVG figures.
    Run(RunArgs),
}

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The plan file (TOML).
    plan: PathBuf,
    /// Seeds per scheme and point [default: the plan's `seeds`; with --quick its quick.seeds, or 1].
    #[arg(long)]
    seeds: Option<u64>,
    /// Where to write results [default: results/<plan name>].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Smoke run: the plan's [plan.quick] settings (one seed unless it says otherwise).
    #[arg(long)]
    quick: bool,
    /// Simulations run at once [default: one per core].
    #[arg(long, short = 'j')]
    jobs: Option<usize>,
    /// Override a plan key, e.g. --set topology.links.p1.delay_ms=30 or
    /// --set 'workloads.gw.scheduler="adaptive"' (the value is TOML; a bare word is a string).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Check the plan and count its runs, without running them.
    #[arg(long)]
    check: bool,
    /// Also write samples.csv: every request's or download's value (large for big plans).
    #[arg(long)]
    samples: bool,
    /// Run every run twice and fail if any metric differs between the two: whether the plan's
    /// numbers depend on its seeds alone (twice the time; the results written are the first's).
    #[arg(long)]
    repeat_check: bool,
}

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
pub struct AmqpKernelArgs {
    /// Smoke run: the first channel only, one repetition (unless --reps says otherwise).
    #[arg(long)]
    quick: bool,
    #[arg(long, help = qgate::dflt("Repetitions of each case", crate::papers::paper003_kernel::DEFAULT_REPS))]
    reps: Option<u64>,
    /// Only these transports (comma-separated: quic, tcp-tls12, tcp-tls).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Where to write results [default: results/amqp-kernel].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct EdgeAqmArgs {
    /// Smoke run: unshaped and PID-Delay only, one repetition, shorter, fewer bulk devices.
    #[arg(long)]
    quick: bool,
    #[arg(long, help = qgate::dflt("Repetitions of each scheme", crate::papers::paper004_edge::EdgeConfig::new(PathBuf::new()).reps))]
    reps: Option<u64>,
    #[arg(long, value_delimiter = ',', help = format!("Only these schemes, comma-separated ({})", crate::papers::paper004_edge::SCHEMES.join(", ")))]
    only: Vec<String>,
    #[arg(long, help = qgate::dflt("Best-effort bulk devices", crate::papers::paper004_edge::EdgeConfig::new(PathBuf::new()).bulk))]
    bulk: Option<usize>,
    /// Where to write results [default: results/edge-aqm].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Only rewrite summary.md from the results.csv already in the output directory (a run
    /// with the default settings, or the same flags as this).
    #[arg(long)]
    summarize: bool,
}

#[derive(Args, Debug)]
pub struct UploadKernelArgs {
    /// Smoke run: 4 MB, buffers 200 and 2000 KB, path 1 dying at 1 s, one repetition.
    #[arg(long)]
    quick: bool,
    #[arg(long, help = qgate::dflt("Repetitions of each run", crate::papers::paper001_kernel::KernelUploadConfig::default().reps))]
    reps: Option<u64>,
    /// Only these schemes (comma-separated: conventional, two-ended).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Where to write results [default: results/upload-kernel].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Only rewrite summary.md from the results.csv already in the output directory.
    #[arg(long)]
    summarize: bool,
    #[arg(long, value_name = "MS", help = qgate::dflt("The cellular-like path's one-way delay, 1-1000 ms (the paper's Figs. 6-7 sweep 20-200; --summarize reads it from results.csv, or from this flag for files from before it was recorded)", crate::papers::paper001_kernel::KernelUploadConfig::default().cellular_delay_ms))]
    cellular_delay: Option<u64>,
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
pub struct AqmKernelArgs {
    /// Smoke run: CUBIC only, 8 s runs with 2 s warm-up, one repetition, 4 flows.
    #[arg(long)]
    quick: bool,
    /// Congestion controls, comma-separated [default: cubic,bbr].
    #[arg(long, value_delimiter = ',')]
    cc: Vec<String>,
    /// Only these disciplines (comma-separated).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    #[arg(long, help = qgate::dflt("Repetitions of each run", crate::papers::paper004_kernel::KernelAqmConfig::default().reps))]
    reps: Option<u64>,
    #[arg(long, help = qgate::dflt("Seconds of traffic per run, warm-up included", crate::papers::paper004_kernel::KernelAqmConfig::default().seconds))]
    seconds: Option<u64>,
    #[arg(long, help = qgate::dflt("Seconds left out of the statistics at the start", crate::papers::paper004_kernel::KernelAqmConfig::default().warmup))]
    warmup: Option<u64>,
    #[arg(long, help = qgate::dflt("Bulk TCP flows", crate::papers::paper004_kernel::KernelAqmConfig::default().flows))]
    flows: Option<usize>,
    /// Where to write results [default: results/aqm-kernel].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
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

fn progress(total: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template("{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}")
            .expect("valid template"),
    );
    pb.set_prefix(what.to_string());
    pb
}

pub fn run(which: Lab) -> Result<(), Failure> {
    match which {
        Lab::Aqm(a) => aqm_cmd(a),
        Lab::AqmKernel(a) => aqm_kernel_cmd(a),
        Lab::AmqpKernel(a) => amqp_kernel_cmd(a),
        Lab::EdgeAqm(a) => edge_aqm_cmd(a),
        Lab::Amqp(a) => amqp_cmd(a),
        Lab::History(h) => history_cmd(h),
        Lab::Proxy(p) => proxy_cmd(p),
        Lab::Upload(u) => upload_cmd(u),
        Lab::UploadKernel(u) => upload_kernel_cmd(u),
        Lab::Run(r) => run_cmd(r),
        Lab::Faults(f) => faults_cmd(f),
        Lab::Margins(m) => {
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
    }
}

/// `KEY=VALUE` with a TOML value (a bare word that is not TOML is taken as a string).
fn parse_set(s: &str) -> Result<(String, toml::Value), Failure> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| usage(format!("--set '{s}': expected KEY=VALUE")))?;
    let value = toml::from_str::<toml::Table>(&format!("v = {v}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(v.to_string()));
    Ok((k.trim().to_string(), value))
}

fn run_cmd(a: RunArgs) -> Result<(), Failure> {
    let loaded = crate::plan::Loaded::read(&a.plan).map_err(usage)?;
    let opts = crate::plan::Options {
        seeds: a.seeds,
        quick: a.quick,
        set: a
            .set
            .iter()
            .map(|s| parse_set(s))
            .collect::<Result<_, _>>()?,
        ..Default::default()
    };
    if a.check {
        let variants = loaded.variants(&opts).map_err(usage)?;
        println!(
            "{}: {} runs ({} scheme(s), seeds {})",
            a.plan.display(),
            variants.len(),
            loaded.scheme_names().join(", "),
            variants.iter().map(|v| v.seed).max().unwrap_or(0)
        );
        return Ok(());
    }
    if !a.repeat_check {
        return run_plan(&loaded, &opts, a.jobs, a.out, a.samples, |_| String::new());
    }
    let eff = loaded.overridden(&opts).map_err(usage)?;
    let out = out_dir(&eff, a.out)?;
    let ran = execute(&loaded, &opts, a.jobs)?;
    let again = execute(&loaded, &opts, a.jobs)?;
    write_results(&eff, &opts, &ran, out, a.samples, "")?;
    let diffs = crate::plan::run::differences(&ran.records, &again.records);
    if diffs.is_empty() {
        eprintln!(
            "repeat check: each of the {} runs gave the same numbers twice",
            ran.records.len()
        );
        return Ok(());
    }
    const SHOWN: usize = 10;
    Err(Failure::from(anyhow::anyhow!(
        "not repeatable: {} of {} runs differ on a second run with the same seed (the results written are the first run's):\n  {}{}",
        diffs.len(),
        ran.records.len(),
        diffs[..diffs.len().min(SHOWN)].join("\n  "),
        if diffs.len() > SHOWN { "\n  …" } else { "" }
    )))
}

/// A plan's runs and what they measured.
struct Executed {
    variants: Vec<crate::plan::Variant>,
    records: Vec<crate::plan::run::Record>,
    jobs: usize,
    wall_s: f64,
}

/// Run every variant of a plan on `jobs` threads (default: one per core) with a progress bar.
fn execute(
    loaded: &crate::plan::Loaded,
    opts: &crate::plan::Options,
    jobs: Option<usize>,
) -> Result<Executed, Failure> {
    let variants = loaded.variants(opts).map_err(usage)?;
    let jobs = jobs.unwrap_or_else(crate::pool::default_jobs);
    if jobs == 0 {
        return Err(usage("--jobs must be at least 1"));
    }
    let jobs = jobs.min(variants.len().max(1));
    let pb = progress(variants.len() as u64, &loaded.plan.plan.name);
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let started = std::time::Instant::now();
    let records = crate::plan::run::run_all(&variants, jobs, |done, total, v| {
        let what = v.label();
        if tty {
            pb.set_message(what);
            pb.inc(1);
        } else {
            eprintln!("[{done}/{total}] {what}");
        }
    })
    .map_err(|e| Failure::from(anyhow::anyhow!("{}: {e}", loaded.file.display())))?;
    pb.finish_and_clear();
    Ok(Executed {
        variants,
        records,
        jobs,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

/// Where a plan's results go (default `results/<plan name>`), made and tried before anything
/// runs: a long run must not end in an error writing its results.
fn out_dir(loaded: &crate::plan::Loaded, out: Option<PathBuf>) -> Result<PathBuf, Failure> {
    let out = out.unwrap_or_else(|| PathBuf::from("results").join(&loaded.plan.plan.name));
    if out.exists() && !out.is_dir() {
        return Err(usage(format!(
            "--out {}: exists and is not a directory",
            out.display()
        )));
    }
    let probe = out.join(".qgate-write-test");
    std::fs::create_dir_all(&out)
        .and_then(|()| std::fs::write(&probe, b""))
        .and_then(|()| std::fs::remove_file(&probe))
        .map_err(|e| usage(format!("--out {}: cannot write there: {e}", out.display())))?;
    Ok(out)
}

/// Write a plan's results directory; `extra` is a scenario's own section at the end of the
/// summary.
fn write_results(
    loaded: &crate::plan::Loaded,
    opts: &crate::plan::Options,
    ran: &Executed,
    out: PathBuf,
    samples: bool,
    extra: &str,
) -> Result<(), Failure> {
    let prov = crate::plan::report::Provenance {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        jobs: ran.jobs,
        wall_s: ran.wall_s,
        seeds: ran.variants.iter().map(|v| v.seed).max().unwrap_or(0),
        quick: opts.quick,
        samples,
    };
    let files = crate::plan::report::write(&out, loaded, &ran.records, &prov, extra)
        .map_err(|e| Failure::from(anyhow::anyhow!("writing {}: {e}", out.display())))?;
    println!(
        "{} runs in {:.1} s on {} thread(s); wrote {} files to {}",
        ran.records.len(),
        ran.wall_s,
        ran.jobs,
        files.len(),
        out.display()
    );
    Ok(())
}

/// [`execute`] and [`write_results`].
fn run_plan(
    loaded: &crate::plan::Loaded,
    opts: &crate::plan::Options,
    jobs: Option<usize>,
    out: Option<PathBuf>,
    samples: bool,
    extra: impl Fn(&[crate::plan::run::Record]) -> String,
) -> Result<(), Failure> {
    // The summary and figures follow the plan as overridden (--set, --quick).
    let eff = loaded.overridden(opts).map_err(usage)?;
    let out = out_dir(&eff, out)?;
    let ran = execute(loaded, opts, jobs)?;
    write_results(&eff, opts, &ran, out, samples, &extra(&ran.records))
}

fn amqp_cmd(a: AmqpArgs) -> Result<(), Failure> {
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

fn faults_cmd(a: FaultsArgs) -> Result<(), Failure> {
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

fn proxy_cmd(a: ProxyArgs) -> Result<(), Failure> {
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

fn upload_cmd(a: UploadArgs) -> Result<(), Failure> {
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

fn history_cmd(a: HistoryArgs) -> Result<(), Failure> {
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

/// Run scenario `name` (`total` items of `unit`) with a progress bar (one line per item when
/// stderr is not a terminal), write its results into `out` [default: results/NAME], print
/// summary.md and the wall time.
fn scenario<R>(
    name: &str,
    unit: &str,
    total: usize,
    out: Option<PathBuf>,
    run: impl FnOnce(&(dyn Fn(&str) + Sync)) -> R,
    write: impl FnOnce(&std::path::Path, &R, &str) -> std::io::Result<()>,
) -> Result<(), Failure> {
    let out = out.unwrap_or_else(|| PathBuf::from(format!("results/{name}")));
    // The command as typed, with its flags: `qgate-lab NAME` and what followed it.
    let command = std::iter::once(format!("qgate-lab {name}"))
        .chain(std::env::args().skip(2))
        .collect::<Vec<_>>()
        .join(" ");
    let wall = std::time::Instant::now();
    let pb = progress(total as u64, unit);
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let results = run(&|label: &str| {
        pb.set_message(label.to_string());
        pb.inc(1);
        if !tty {
            eprintln!("{name}: [{}/{total}] {label}", pb.position());
        }
    });
    pb.finish_with_message("done");
    write(&out, &results, &command)
        .map_err(|e| anyhow::anyhow!("writing results to {}: {e}", out.display()))?;
    println!(
        "{}",
        std::fs::read_to_string(out.join("summary.md")).unwrap_or_default()
    );
    eprintln!(
        "qgate-lab {name}: done in {:.1} s; results in {}",
        wall.elapsed().as_secs_f64(),
        out.display()
    );
    Ok(())
}

/// A kernel lab's `--only` list, each name checked against the `known` ones (`what` they are).
fn only(names: &[String], known: &[&str], what: &str) -> Result<Vec<String>, Failure> {
    match names.iter().find(|n| !known.contains(&n.as_str())) {
        Some(n) => Err(usage(format!(
            "--only: unknown {what} '{n}' (known: {})",
            known.join(", ")
        ))),
        None => {
            // Each once, in the order given: a repeated name would pool two runs' worth in one row.
            let mut v: Vec<String> = Vec::new();
            for n in names {
                if !v.contains(n) {
                    v.push(n.clone());
                }
            }
            Ok(v)
        }
    }
}

/// ` --only A,B` for a results' "Reproduce" line, when the run was filtered.
fn only_flag(names: &[String]) -> String {
    if names.is_empty() {
        String::new()
    } else {
        format!(" --only {}", names.join(","))
    }
}

fn upload_kernel_cmd(a: UploadKernelArgs) -> Result<(), Failure> {
    use crate::papers::paper001_kernel::{self as k, KernelUploadConfig};
    let mut cfg = KernelUploadConfig::default();
    if a.quick {
        cfg.bytes = 4_000_000;
        cfg.buffers_kb = vec![200, 2000];
        cfg.reps = 1;
        // A 4 MB upload takes about 2.5 s: path 1 dies mid-way.
        cfg.fault_at_s = 1.0;
    }
    if !a.only.is_empty() {
        cfg.schemes = only(&a.only, k::SCHEMES, "scheme")?;
    }
    cfg.reps = a.reps.unwrap_or(cfg.reps);
    if cfg.reps == 0 {
        return Err(usage("--reps must be positive"));
    }
    cfg.cellular_delay_ms = a.cellular_delay.unwrap_or(cfg.cellular_delay_ms);
    if !(1..=1000).contains(&cfg.cellular_delay_ms) {
        return Err(usage("--cellular-delay must be 1 to 1000 ms"));
    }
    if !std::fs::read_to_string("/proc/sys/net/mptcp/enabled").is_ok_and(|s| s.trim() == "1") {
        return Err(usage(
            "Linux MPTCP is off or missing (net.mptcp.enabled must be 1)",
        ));
    }
    let out = a
        .out
        .unwrap_or_else(|| PathBuf::from("results/upload-kernel"));
    if a.summarize {
        let csv = std::fs::read_to_string(out.join("results.csv"))
            .map_err(|e| usage(format!("{}: {e}", out.join("results.csv").display())))?;
        let runs = k::parse_csv(&csv).map_err(usage)?;
        cfg.reps = runs.iter().map(|r| r.rep).max().unwrap_or(0);
        // The delay the file records; an older file's is the flag's, or the default.
        let delay = match (k::recorded_delay(&runs).map_err(usage)?, a.cellular_delay) {
            (Some(d), Some(given)) if d != given => {
                return Err(usage(format!(
                    "results.csv was measured with --cellular-delay {d}, not {given}"
                )))
            }
            (Some(d), _) => {
                cfg.cellular_delay_ms = d;
                (d != KernelUploadConfig::default().cellular_delay_ms).then_some(d)
            }
            (None, given) => given,
        };
        let quick = if a.quick { " --quick" } else { "" };
        let command = format!(
            "sudo qgate-lab upload-kernel{quick} --reps {}{}{}",
            cfg.reps,
            only_flag(&a.only),
            delay_flag(delay)
        );
        std::fs::write(out.join("summary.md"), k::summary(&cfg, &runs, &command))?;
        return Ok(());
    }
    qgate_linkem::preflight().map_err(|e| usage(e.to_string()))?;
    let runs_per_rep = 2 + cfg.schemes.len() * (2 * cfg.buffers_kb.len() + 1);
    eprintln!(
        "lab upload-kernel: {} runs of a {} MB upload",
        runs_per_rep * cfg.reps as usize,
        cfg.bytes as f64 / 1e6
    );
    let runs = k::run(&cfg, &out.join("work"), |r, i, n| {
        eprintln!(
            "  [{i}/{n}] {} {} {} KB rep {}: {:.2} Mbit/s (lateness p99 {} µs)",
            r.scheme, r.sweep, r.buffer_kb, r.rep, r.goodput_mbps, r.lateness_p99_us
        )
    })
    .map_err(|e| anyhow::anyhow!(e))?;
    std::fs::remove_dir_all(out.join("work")).ok();
    let mut command = String::from("sudo qgate-lab upload-kernel");
    if a.quick {
        command.push_str(" --quick");
    }
    if let Some(r) = a.reps {
        command.push_str(&format!(" --reps {r}"));
    }
    command.push_str(&only_flag(&a.only));
    command.push_str(&delay_flag(a.cellular_delay));
    std::fs::write(out.join("results.csv"), k::csv(&runs))?;
    std::fs::write(out.join("summary.md"), k::summary(&cfg, &runs, &command))?;
    eprintln!("lab upload-kernel: results in {}", out.display());
    Ok(())
}

/// ` --cellular-delay MS` when given, for the command a summary says reproduces it.
fn delay_flag(ms: Option<u64>) -> String {
    ms.map(|ms| format!(" --cellular-delay {ms}"))
        .unwrap_or_default()
}

fn amqp_kernel_cmd(a: AmqpKernelArgs) -> Result<(), Failure> {
    use crate::papers::paper003_kernel::{self as k, KernelAmqpConfig};
    let mut cfg = KernelAmqpConfig::new(super::product_exe()?);
    if a.quick {
        cfg.channels.truncate(1);
        cfg.reps = 1;
    }
    if !a.only.is_empty() {
        cfg.transports = only(&a.only, k::TRANSPORTS, "transport")?;
    }
    cfg.reps = a.reps.unwrap_or(cfg.reps);
    if cfg.reps == 0 {
        return Err(usage("--reps must be positive"));
    }
    qgate_linkem::preflight().map_err(|e| usage(e.to_string()))?;
    let out = a
        .out
        .unwrap_or_else(|| PathBuf::from("results/amqp-kernel"));
    let total = cfg.channels.len() * cfg.transports.len() * cfg.reps as usize;
    eprintln!(
        "lab amqp-kernel: {total} runs of {} one-message connections",
        cfg.messages
    );
    let runs = k::run(&cfg, &out.join("work"), |r, i, n| {
        eprintln!(
            "  [{i}/{n}] {} over {} rep {}: total {:.3} s, startup {:.2} ms, {} bytes, {} lost (lateness p99 {} µs)",
            r.transport, r.channel, r.rep, r.total_s, r.startup_ms, r.wire_bytes, r.lost_packets, r.lateness_p99_us
        )
    })
    .map_err(|e| anyhow::anyhow!(e))?;
    std::fs::remove_dir_all(out.join("work")).ok();
    let mut command = String::from("sudo qgate-lab amqp-kernel");
    if a.quick {
        command.push_str(" --quick");
    }
    if let Some(r) = a.reps {
        command.push_str(&format!(" --reps {r}"));
    }
    command.push_str(&only_flag(&a.only));
    std::fs::write(out.join("results.csv"), k::csv(&runs))?;
    // The simulated lab's numbers for the same channels, when they are here (`qgate-lab amqp`).
    let netsim = std::fs::read_to_string("results/amqp/results.csv").ok();
    std::fs::write(
        out.join("summary.md"),
        k::summary(&cfg, &runs, netsim.as_deref(), &command),
    )?;
    eprintln!("lab amqp-kernel: results in {}", out.display());
    Ok(())
}

fn edge_aqm_cmd(a: EdgeAqmArgs) -> Result<(), Failure> {
    use crate::papers::paper004_edge::{self as k, EdgeConfig};
    let mut cfg = EdgeConfig::new(super::product_exe()?);
    if a.quick {
        cfg.schemes = vec!["unshaped".into(), "pid-delay".into()];
        cfg.reps = 1;
        cfg.warmup = 2;
        cfg.seconds = 5;
        cfg.bulk = 4;
    }
    if !a.only.is_empty() {
        cfg.schemes = only(&a.only, k::SCHEMES, "scheme")?;
    }
    cfg.reps = a.reps.unwrap_or(cfg.reps);
    cfg.bulk = a.bulk.unwrap_or(cfg.bulk);
    if cfg.reps == 0 || cfg.bulk == 0 {
        return Err(usage("--reps and --bulk must be positive"));
    }
    let out = a.out.unwrap_or_else(|| PathBuf::from("results/edge-aqm"));
    let mut command = String::from("sudo qgate-lab edge-aqm");
    if a.quick {
        command.push_str(" --quick");
    }
    for (flag, v) in [(" --reps", a.reps), (" --bulk", a.bulk.map(|b| b as u64))] {
        if let Some(v) = v {
            command.push_str(&format!("{flag} {v}"));
        }
    }
    command.push_str(&only_flag(&a.only));
    if a.summarize {
        let file = out.join("results.csv");
        let text = std::fs::read_to_string(&file)
            .map_err(|e| usage(format!("{}: {e}", file.display())))?;
        let runs = k::parse_csv(&text).map_err(usage)?;
        std::fs::write(out.join("summary.md"), k::summary(&cfg, &runs, &command))?;
        eprintln!("lab edge-aqm: summary rewritten in {}", out.display());
        return Ok(());
    }
    qgate_linkem::preflight().map_err(|e| usage(e.to_string()))?;
    let total = cfg.schemes.len() * cfg.reps as usize;
    eprintln!(
        "lab edge-aqm: {total} runs of {} s, about {} min",
        cfg.warmup + cfg.seconds + 3,
        (total as u64 * (cfg.warmup + cfg.seconds + 5)).div_ceil(60)
    );
    let runs = k::run(&cfg, &out.join("work"), |r, i, n| {
        eprintln!(
            "  [{i}/{n}] {} rep {}: priority {:.1} ms (p99 {:.1}), bulk {:.2} Mbit/s, modem queue {:.1} ms, lateness p99 {} µs",
            r.scheme, r.rep, r.priority_mean_ms, r.priority_p99_ms, r.bulk_goodput_mbps, r.modem_queue_ms, r.lateness_p99_us
        )
    })
    .map_err(|e| anyhow::anyhow!(e))?;
    std::fs::remove_dir_all(out.join("work")).ok();
    std::fs::write(out.join("results.csv"), k::csv(&runs))?;
    std::fs::write(out.join("summary.md"), k::summary(&cfg, &runs, &command))?;
    eprintln!("lab edge-aqm: results in {}", out.display());
    Ok(())
}

fn aqm_kernel_cmd(a: AqmKernelArgs) -> Result<(), Failure> {
    use crate::papers::paper004_kernel::{self as k, KernelAqmConfig};
    let mut cfg = KernelAqmConfig::default();
    if a.quick {
        cfg.ccs = vec!["cubic".into()];
        cfg.seconds = 8;
        cfg.warmup = 2;
        cfg.reps = 1;
        cfg.flows = 4;
    }
    if !a.cc.is_empty() {
        cfg.ccs = a.cc.clone();
    }
    if !a.only.is_empty() {
        cfg.disciplines = only(&a.only, k::DISCIPLINES, "discipline")?;
    }
    cfg.reps = a.reps.unwrap_or(cfg.reps);
    cfg.seconds = a.seconds.unwrap_or(cfg.seconds);
    cfg.warmup = a.warmup.unwrap_or(cfg.warmup);
    cfg.flows = a.flows.unwrap_or(cfg.flows);
    if cfg.reps == 0 || cfg.flows == 0 || cfg.warmup >= cfg.seconds {
        return Err(usage(
            "--reps and --flows must be positive and --warmup shorter than --seconds",
        ));
    }
    let available = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .unwrap_or_default();
    for cc in &cfg.ccs {
        if !available.split_whitespace().any(|c| c == cc) {
            return Err(usage(format!(
                "congestion control '{cc}' is not available in this kernel (available: {})",
                available.trim()
            )));
        }
    }
    qgate_linkem::preflight().map_err(|e| usage(e.to_string()))?;
    let out = a.out.unwrap_or_else(|| PathBuf::from("results/aqm-kernel"));
    let total = cfg.ccs.len() * cfg.disciplines.len() * cfg.reps as usize;
    eprintln!(
        "lab aqm-kernel: {total} runs of {} s ({} flows), about {} min",
        cfg.seconds,
        cfg.flows,
        (total as u64 * (cfg.seconds + 2)).div_ceil(60)
    );
    let runs = k::run(&cfg, &out.join("work"), |r, i, n| {
        eprintln!(
            "  [{i}/{n}] {} {} rep {}: utilisation {:.3}, queue delay {:.2} ms (p99 {:.1}), lateness p99 {} µs",
            r.cc, r.discipline, r.rep, r.utilisation, r.queue_delay_mean_ms, r.queue_delay_p99_ms, r.lateness_p99_us
        )
    })
    .map_err(|e| anyhow::anyhow!(e))?;
    std::fs::remove_dir_all(out.join("work")).ok();
    let mut command = String::from("sudo qgate-lab aqm-kernel");
    if a.quick {
        command.push_str(" --quick");
    }
    if !a.cc.is_empty() {
        command.push_str(&format!(" --cc {}", a.cc.join(",")));
    }
    for (flag, v) in [
        (" --reps", a.reps),
        (" --seconds", a.seconds),
        (" --warmup", a.warmup),
        (" --flows", a.flows.map(|f| f as u64)),
    ] {
        if let Some(v) = v {
            command.push_str(&format!("{flag} {v}"));
        }
    }
    command.push_str(&only_flag(&a.only));
    std::fs::write(out.join("results.csv"), k::csv(&runs))?;
    std::fs::write(out.join("summary.md"), k::summary(&cfg, &runs, &command))?;
    eprintln!("lab aqm-kernel: results in {}", out.display());
    Ok(())
}

fn aqm_cmd(a: AqmArgs) -> Result<(), Failure> {
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
