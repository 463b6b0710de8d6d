//! The kernel labs: the papers' cases with the kernel's TCP, MPTCP or the real gateway, through
//! `qgate-lab linkem` in real time (root).

use std::path::PathBuf;

use clap::Args;
use qgate::{usage, Failure};

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

pub(super) fn upload_kernel_cmd(a: UploadKernelArgs) -> Result<(), Failure> {
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

pub(super) fn amqp_kernel_cmd(a: AmqpKernelArgs) -> Result<(), Failure> {
    use crate::papers::paper003_kernel::{self as k, KernelAmqpConfig};
    let mut cfg = KernelAmqpConfig::new(crate::cli::product_exe()?);
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

pub(super) fn edge_aqm_cmd(a: EdgeAqmArgs) -> Result<(), Failure> {
    use crate::papers::paper004_edge::{self as k, EdgeConfig};
    let mut cfg = EdgeConfig::new(crate::cli::product_exe()?);
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

pub(super) fn aqm_kernel_cmd(a: AqmKernelArgs) -> Result<(), Failure> {
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
