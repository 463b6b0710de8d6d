//! `qgate`: IoT data over QUIC — the product: gateway, server, broker, device and clients. The
//! command line is this library's [`run`]; the binary only calls it (and picks the allocator),
//! so the parsers of untrusted input here (config files, URLs, durations) can be fuzzed
//! (`fuzz/`).

pub mod admin;
mod amqpcmd;
mod client;
pub mod config;
mod gatewaycmd;
mod historycmd;
mod pkicmd;
mod server;
mod uploadcmd;
pub mod url;

pub use amqpcmd::parse_send_line;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::Config;

/// qgate's version and the commit it was built from, as `--version` prints it.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("QGATE_COMMIT"),
    ")"
);

/// Exit status for a usage or configuration error (bad flag, URL, config file).
pub const EXIT_USAGE: u8 = 2;

/// A future that completes when the process is asked to stop: Ctrl-C (SIGINT) or SIGTERM,
/// which service managers (systemd, Docker, Kubernetes) send. The handlers are installed when
/// this is called, so call it before announcing that the service is up. The long-running
/// services shut down gracefully on either (the upload receiver syncs what it holds, U10).
pub fn stop_requested() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| eprintln!("qgate: cannot watch for SIGTERM ({e}); stop with Ctrl-C"))
        .ok();
    let int = tokio::signal::ctrl_c();
    async move {
        #[cfg(unix)]
        let term = async {
            match term {
                Some(mut t) => {
                    t.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let term = std::future::pending::<()>();
        tokio::select! {
            biased;
            r = int => {
                if let Err(e) = r {
                    eprintln!("qgate: cannot watch for Ctrl-C ({e})");
                    std::future::pending::<()>().await;
                }
            }
            () = term => {}
        }
    }
}
/// Exit status when a request got a non-success HTTP status.
pub const EXIT_HTTP_STATUS: u8 = 3;

/// The heading of the options every subcommand takes, listed after its own.
const GLOBAL: &str = "Global options";

#[derive(Parser, Debug)]
#[command(
    name = "qgate",
    version = VERSION,
    about = "qgate: IoT data over QUIC: edge gateway, HTTP/3 ingest server, AMQP 1.0 broker",
    long_about = "qgate carries IoT data over QUIC: an edge gateway that forwards devices' records \
                  over several backhaul paths by priority, an HTTP/3 ingest server, an AMQP 1.0 \
                  broker, and their clients. Experiments, benchmarks and the simulated demo are \
                  in the separate qgate-lab binary.\n\n\
                  Exit status: 0 success, 1 runtime error, 2 usage or configuration error, \
                  3 the server answered with a non-success HTTP status."
)]
struct Cli {
    /// More log output (-v info, -vv debug, -vvv trace). RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true, help_heading = GLOBAL)]
    verbose: u8,
    /// TOML configuration file (tables [server], [client], [transport], [history], [gateway],
    /// [broker], [admin]; e.g. docs/examples/gateway.toml); flags override it.
    #[arg(short, long, global = true, env = "QGATE_CONFIG", value_name = "FILE", help_heading = GLOBAL)]
    config: Option<PathBuf>,
    /// Log lines as text or JSON (one object per line).
    #[arg(
        long,
        global = true,
        help_heading = GLOBAL,
        env = "QGATE_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    log_format: LogFormat,
    /// Worker threads for the command's async runtime [default: one per core]
    #[arg(long, global = true, help_heading = GLOBAL, env = "QGATE_THREADS", value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    threads: Option<u16>,
    /// Write one qlog file per QUIC connection of the server, gateway, broker and clients into
    /// DIR, for qvis [default: $QLOGDIR, else [transport] qlog_dir]. Set SSLKEYLOGFILE=FILE to
    /// also log TLS secrets for Wireshark.
    #[arg(long, global = true, help_heading = GLOBAL, value_name = "DIR")]
    qlog_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the HTTP/3 ingest server on a real UDP address (POST /ingest[/NAME], POST /batch
    /// from gateways, GET /health; metrics and counters on --admin).
    Server(server::ServerArgs),
    /// Run the edge gateway: devices register for a Hash ID and send through it; it forwards
    /// over several backhaul paths (paper 000).
    Gateway(gatewaycmd::GatewayArgs),
    /// A device: register with a gateway and send records through it, reporting delays.
    Device(gatewaycmd::DeviceArgs),
    /// Send an HTTP/3 GET and print the response body.
    Get(client::ClientArgs),
    /// Send an HTTP/3 POST (body from --data, --file or standard input) and print the response.
    Post(client::PostArgs),
    /// Inspect or clear the congestion-window history (paper 002).
    History(historycmd::HistoryArgs),
    /// Run the AMQP 1.0 broker over QUIC and/or TCP(+TLS): durable queues, competing
    /// consumers, credit flow control (paper 003).
    Broker(amqpcmd::BrokerArgs),
    /// Send messages to an AMQP queue (count × size, or standard input lines) and report
    /// startup latency, total time and throughput.
    Send(amqpcmd::SendArgs),
    /// Receive messages from an AMQP queue and report the same.
    Recv(amqpcmd::RecvArgs),
    /// Upload a file over one or more interfaces at once, from both ends of the file toward the
    /// middle, resuming where an interrupted upload stopped (paper 001).
    Upload(uploadcmd::UploadArgs),
    /// Make a CA for a small fleet, and device and gateway certificates signed by it.
    Pki(pkicmd::PkiArgs),
    /// Talk to a running server, gateway or broker through its admin port (--admin): paths,
    /// sessions, queues, connections; purge, close, switch the scheduler, reload.
    Ctl(admin::ctl::CtlArgs),
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Lines for people (coloured on a terminal only).
    Text,
    /// One JSON object per line (timestamp, level, target, fields), for log collectors.
    Json,
}

/// Log to standard error at the level `-v` asks for (RUST_LOG overrides), as text or JSON.
pub fn init_logging(verbose: u8, format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let level = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new(format!(
            "{level},quinn=warn,quinn_proto=warn,h3=warn,rustls=warn"
        ))
        .add_directive(format!("qgate={level}").parse().expect("valid directive"))
    });
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => fmt.json().init(),
        LogFormat::Text => {
            use std::io::IsTerminal;
            // No colour codes in a file or a journal.
            fmt.with_ansi(std::io::stderr().is_terminal()).init()
        }
    }
}

/// An error and the exit status it deserves.
pub struct Failure {
    pub status: u8,
    pub error: anyhow::Error,
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure {
            status: 1,
            error: e.into(),
        }
    }
}

/// `n` and the noun for it: "1 path", "2 paths".
pub fn count(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `help` followed by the default, read from where the default lives (one source of truth).
/// A byte count on the command line, with or without a unit (`4096`, `64KiB`, `1MB`), as
/// every size flag takes it.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let n = qgate_core::units::parse_bytes(s)?;
    usize::try_from(n).map_err(|_| format!("size '{s}' is too large"))
}

pub fn dflt(help: &str, default: impl std::fmt::Display) -> String {
    format!("{help} [default: {default}]")
}

/// A usage/config error (exit 2).
pub fn usage(msg: impl std::fmt::Display) -> Failure {
    Failure {
        status: EXIT_USAGE,
        error: anyhow::anyhow!("{msg}"),
    }
}

/// The config file given with --config, for a daemon's reload.
static CONFIG_PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// `--qlog-dir` / `$QLOGDIR`, which wins over the file's `[transport] qlog_dir`.
static QLOG_DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// What the command line sets over any config file, at start and on every reload (so a reload
/// does not take the flag's value for a change of the file).
pub(crate) fn apply_overrides(cfg: &mut Config) {
    if let Some(d) = QLOG_DIR.get() {
        cfg.transport.qlog_dir = Some(d.clone());
    }
}

/// The config file given with --config, if any.
pub fn config_path() -> Option<PathBuf> {
    CONFIG_PATH.get().cloned()
}

/// Run the command line; the process's exit status.
pub fn run() -> ExitCode {
    let matches = <Cli as clap::CommandFactory>::command().get_matches();
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    init_logging(cli.verbose, cli.log_format);
    if let Some(p) = &cli.config {
        let _ = CONFIG_PATH.set(p.clone());
    }
    if let Some(n) = cli.threads {
        set_worker_threads(usize::from(n));
    }
    let mut config = match &cli.config {
        Some(path) => match Config::load(path) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("qgate: error: {e:#}");
                return ExitCode::from(EXIT_USAGE);
            }
        },
        None => Config::default(),
    };
    // An empty QLOGDIR (exported by a shell profile, say) means unset.
    let env_qlog = std::env::var_os("QLOGDIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from);
    if let Some(d) = cli.qlog_dir.or(env_qlog) {
        let _ = QLOG_DIR.set(d);
    }
    apply_overrides(&mut config);
    if let Some(d) = &config.transport.qlog_dir {
        let mut dir = std::fs::DirBuilder::new();
        dir.recursive(true);
        // A trace names peers and connection ids: only the owner reads a new directory.
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut dir, 0o700);
        let made = if d.exists() && !d.is_dir() {
            Err(std::io::Error::other("it exists and is not a directory"))
        } else {
            dir.create(d)
        };
        if let Err(e) = made {
            eprintln!(
                "qgate: error: cannot create the qlog directory {}: {e}",
                d.display()
            );
            return ExitCode::from(EXIT_USAGE);
        }
    }
    let result = match cli.command {
        Command::Server(a) => server::run(a, &config),
        Command::Gateway(a) => gatewaycmd::gateway(a, &config),
        Command::Device(a) => gatewaycmd::device(a, &config),
        Command::Get(a) => client::get(a, &config),
        Command::Post(a) => client::post(a, &config),
        Command::History(h) => historycmd::run(h, &config),
        Command::Broker(a) => amqpcmd::broker(a, &config),
        Command::Send(a) => amqpcmd::send(a, &config),
        Command::Recv(a) => amqpcmd::recv(a, &config),
        Command::Ctl(a) => admin::ctl::ctl(a, &config),
        Command::Pki(a) => pkicmd::run(a),
        Command::Upload(a) => uploadcmd::run(a, &config),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("qgate: error: {:#}", f.error);
            ExitCode::from(f.status)
        }
    }
}

/// Where the development PKI lives by default: `$QGATE_HOME/dev-pki`, else
/// `$XDG_DATA_HOME/qgate/dev-pki`, else `~/.local/share/qgate/dev-pki`.
/// `$QGATE_HOME/<name>` (beside the development PKI): where state files go unless told.
pub fn home_file(name: &str) -> PathBuf {
    default_dev_pki_dir()
        .parent()
        .map(|p| p.join(name))
        .unwrap_or_else(|| PathBuf::from(name))
}

pub fn default_dev_pki_dir() -> PathBuf {
    if let Some(h) = std::env::var_os("QGATE_HOME") {
        return PathBuf::from(h).join("dev-pki");
    }
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("qgate").join("dev-pki")
}

/// How long a daemon stopped by SIGTERM or Ctrl-C lets the work in flight finish.
pub const DRAIN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Worker threads set with --threads, if any.
static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

/// Set the worker threads of every runtime this process makes (`--threads`); the first call wins.
pub fn set_worker_threads(n: usize) {
    let _ = THREADS.set(n);
}

/// Worker threads of a command's runtime: --threads, else one per core of this machine.
pub fn worker_threads() -> usize {
    THREADS.get().copied().unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get)
    })
}

/// The multi-threaded runtime a command runs on ([`worker_threads`] workers).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(worker_threads())
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_thing_is_singular() {
        assert_eq!(super::count(1u64, "path", "paths"), "1 path");
        assert_eq!(super::count(0u64, "path", "paths"), "0 paths");
        assert_eq!(super::count(3u64, "device", "devices"), "3 devices");
    }
}
