//! The `qgate-lab` command line: the papers' experiments and any plan file, the system
//! benchmarks, the simulated demo and the real-time link emulator. It stands on the product
//! (`qgate`'s library for errors, logging and runtimes; the `qgate` binary for the daemons the
//! kernel labs and benchmarks start), which knows nothing of it (decision W1).

mod bench;
pub mod config;
mod demo;
mod linkem;
mod plans;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use qgate::{Failure, LogFormat};

use self::config::LabConfig;

/// The heading of the options every subcommand takes, listed after its own.
const GLOBAL: &str = "Global options";

#[derive(Parser, Debug)]
#[command(
    name = "qgate-lab",
    version = qgate::VERSION,
    about = "qgate's lab: the papers' experiments, plan files, benchmarks, the simulated demo",
    long_about = "qgate-lab runs qgate's own code on a simulated network in virtual time (the \
                  papers' experiments, any plan file, the demo), benchmarks the system, and \
                  emulates links in real time for stacks the simulator cannot run. The product \
                  (gateway, server, broker, clients) is the qgate binary; the kernel labs and \
                  some benchmarks start it, from beside this binary.\n\n\
                  Exit status: 0 success, 1 runtime error, 2 usage or configuration error."
)]
struct Cli {
    /// More log output (-v info, -vv debug, -vvv trace). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true, help_heading = GLOBAL)]
    verbose: u8,
    /// TOML file with the tables [demo] (the direct demo), [transport] and [linkem],
    /// [[linkem.path]], [[linkem.timeline]]; flags override it. Plans take no such file: they
    /// are their own configuration.
    #[arg(short, long, global = true, env = "QGATE_LAB_CONFIG", value_name = "FILE", help_heading = GLOBAL)]
    config: Option<PathBuf>,
    /// Log lines as text or JSON (one object per line).
    #[arg(long, global = true, help_heading = GLOBAL, env = "QGATE_LOG_FORMAT", value_enum,
          default_value = "text")]
    log_format: LogFormat,
    /// Worker threads for the command's async runtime [default: one per core]
    #[arg(long, global = true, help_heading = GLOBAL, env = "QGATE_THREADS", value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    threads: Option<u16>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The whole pipeline on a simulated network: devices, the gateway with three paths, the
    /// server, the broker and a consumer, with a live view (--direct: clients straight to a
    /// server).
    Demo(demo::DemoArgs),
    /// Measure the system: the gateway, the pipeline, the broker, the simulator, the transport.
    #[command(subcommand)]
    Bench(bench::Bench),
    /// Run a program across emulated links in real time (rate, delay, loss, any queue
    /// discipline), in network namespaces it creates and removes (Linux, root).
    Linkem(linkem::LinkemArgs),
    #[command(flatten)]
    Plans(plans::Lab),
}

/// Run the command line; the process's exit status.
pub fn run() -> ExitCode {
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    // Given on this command line, not inherited from QGATE_LAB_CONFIG.
    let config_flag =
        matches.value_source("config") == Some(clap::parser::ValueSource::CommandLine);
    qgate::init_logging(cli.verbose, cli.log_format);
    if let Some(n) = cli.threads {
        qgate::set_worker_threads(usize::from(n));
    }
    // Read only by the commands that take it: a file meant for another is no reason to refuse
    // a plan or a benchmark.
    let config = || match &cli.config {
        Some(path) => LabConfig::load(path).map_err(|e| Failure {
            status: qgate::EXIT_USAGE,
            error: e,
        }),
        None => Ok(LabConfig::default()),
    };
    let result = match cli.command {
        Command::Demo(a) => config().and_then(|c| demo::demo(a, &c)),
        Command::Bench(b) => bench::bench(b),
        Command::Linkem(a) => config().and_then(|c| linkem::run(a, &c)),
        Command::Plans(l) => {
            if let Some(p) = cli.config.as_ref().filter(|_| config_flag) {
                // A plan file is a lab's configuration; saying so beats ignoring it silently.
                eprintln!(
                    "qgate-lab: note: experiments take their settings from plan files (change a key with --set KEY=VALUE); {} is not read",
                    p.display()
                );
            }
            plans::run(l)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("qgate-lab: error: {:#}", f.error);
            ExitCode::from(f.status)
        }
    }
}

/// The product binary, `qgate`, which the kernel labs and benchmarks start: beside this one
/// (both are built into the same target directory), else `$QGATE_BIN`.
pub fn product_exe() -> Result<PathBuf, Failure> {
    if let Some(p) = std::env::var_os("QGATE_BIN").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let me = std::env::current_exe()
        .map_err(|e| anyhow::anyhow!("finding the qgate-lab binary: {e}"))?;
    let beside = me.with_file_name(format!("qgate{}", std::env::consts::EXE_SUFFIX));
    if beside.is_file() {
        Ok(beside)
    } else {
        Err(anyhow::anyhow!(
            "this needs the qgate binary beside {} (build it: cargo build --release -p qgate), or its path in QGATE_BIN",
            me.display()
        )
        .into())
    }
}
