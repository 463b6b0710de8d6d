//! `qgate-lab linkem`: run a program across emulated links (the `[linkem]` table, flags win).

use std::path::PathBuf;

use clap::Args;
use qgate_linkem::config::{DEFAULT_SEED, DEFAULT_SETTLE};
use qgate_linkem::{LinkemConfig, PathConfig, TimedChange};

use qgate::{dflt, usage, Failure};

use super::config::LabConfig;

#[derive(Args, Debug)]
#[command(
    after_help = "Path N joins 10.77.N.1 (inside, where COMMAND runs) and 10.77.N.2 (outside). \
                  COMMAND and the --outside command find the addresses in their environment: \
                  QGATE_LINKEM_PEER (the far end of path 1), QGATE_LINKEM_PEER_2, …, \
                  QGATE_LINKEM_ADDR, QGATE_LINKEM_ADDR_2, … (their own), QGATE_LINKEM_PATHS; \
                  and by name: qgate.test and linkem-peer (path 1's far end; qgate's \
                  development certificate is valid for qgate.test), linkem-peer-N. A packet \
                  from 10.77.N.1 always leaves on path N (policy routing). IPv4 only.\n\n\
                  Example: qgate-lab linkem --link rate=10mbit,delay=25ms,queue=pid-delay \
                  --outside 'qgate server --listen 0.0.0.0:4433' -- \
                  qgate post https://qgate.test:4433/ingest --data hi\n\n\
                  Needs root and /dev/net/tun. Exit status: COMMAND's (128 + signal if a \
                  signal ended it); 2 for a usage error."
)]
pub struct LinkemArgs {
    /// One path, both directions: 'rate=20mbit,delay=5ms,jitter=1ms,loss=1%,queue=pid-delay'
    /// (keys rate, delay, jitter, loss, burst, queue and the queue's own keys, up, down;
    /// rate is required). Repeat for more paths. Per-direction overrides: the [linkem] table.
    #[arg(long = "link", value_name = "SPEC")]
    links: Vec<String>,
    /// A change while COMMAND runs, timed from its start: 'at 20s path 1 delay=80ms',
    /// 'at 40s path 2 down', 'at 5s path 1 uplink rate=1mbit'. Repeatable.
    #[arg(long = "at", value_name = "CHANGE")]
    at: Vec<String>,
    /// Shell command run first in the outside namespace (a server); stopped at the end.
    #[arg(long, value_name = "SHELL-COMMAND")]
    outside: Option<String>,
    #[arg(long, value_name = "DURATION", help = dflt(
        "How long the outside command gets to start before COMMAND",
        format!("{}ms", DEFAULT_SETTLE.as_millis())
    ))]
    settle: Option<String>,
    #[arg(long, help = dflt("Seed of the loss and jitter draws", DEFAULT_SEED))]
    seed: Option<u64>,
    /// Leave this much of the start out of the statistics (e.g. 10s: slow start is over).
    #[arg(long, value_name = "DURATION")]
    warmup: Option<String>,
    /// Write counters.csv, queue_delay.csv and lateness.csv here.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Also write a per-packet trace of each path direction into --out.
    #[arg(long)]
    trace: bool,
    /// Do not ask for real-time priority for the relay threads.
    #[arg(long)]
    no_realtime: bool,
    /// Busy-wait for the last DURATION before each scheduled delivery instead of sleeping
    /// (e.g. 200us; at most 1ms): tighter timing on a machine whose timer wake-ups are late, for
    /// a busy core while packets are on the wire [default: off].
    #[arg(long, value_name = "DURATION")]
    spin: Option<String>,
    /// Print no summary at the end.
    #[arg(short, long)]
    quiet: bool,
    /// The program to run inside, after '--'.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// The `[linkem]` table with the flags applied over it.
fn merged(a: &LinkemArgs, config: &LabConfig) -> Result<LinkemConfig, Failure> {
    let mut c = config.linkem.clone();
    if !a.links.is_empty() {
        c.paths = a.links.iter().map(|l| PathConfig::symmetric(l)).collect();
    }
    for t in &a.at {
        c.timeline.push(t.parse::<TimedChange>().map_err(usage)?);
    }
    c.outside = a.outside.clone().or(c.outside);
    c.settle = a.settle.clone().or(c.settle);
    c.seed = a.seed.or(c.seed);
    c.warmup = a.warmup.clone().or(c.warmup);
    c.out = a.out.clone().or(c.out);
    c.trace |= a.trace;
    c.no_realtime |= a.no_realtime;
    c.spin = a.spin.clone().or(c.spin);
    if c.trace && c.out.is_none() {
        return Err(usage("--trace needs --out DIR (where the trace files go)"));
    }
    c.validate().map_err(usage)?;
    Ok(c)
}

pub fn run(a: LinkemArgs, config: &LabConfig) -> Result<(), Failure> {
    let c = merged(&a, config)?;
    if a.command.is_empty() {
        return Err(usage(
            "no COMMAND: give the program to run after '--' (e.g. qgate-lab linkem --link \
             rate=10mbit,delay=25ms -- sh -c 'ping $QGATE_LINKEM_PEER')",
        ));
    }
    let outcome = qgate_linkem::run(&c, &a.command).map_err(|e| match e {
        qgate_linkem::Error::Config(m) => usage(m),
        e => Failure::from(anyhow::anyhow!(e)),
    })?;
    if !a.quiet {
        eprint!("{}", qgate_linkem::report::summary(&outcome.reports));
        if let (Some(dir), None) = (&c.out, &outcome.csv_error) {
            eprintln!(
                "linkem: counters, queue delay and lateness in {}",
                dir.display()
            );
        }
    }
    if let Some(e) = &outcome.csv_error {
        eprintln!("linkem: error: {e}");
        if outcome.exit_code == 0 {
            return Err(Failure::from(anyhow::anyhow!("{e}")));
        }
    }
    if let Some(sig) = outcome.interrupted_by {
        eprintln!("linkem: stopped by signal {sig}; namespaces removed");
    }
    if outcome.exit_code != 0 {
        return Err(Failure {
            status: outcome.exit_code.clamp(1, 255) as u8,
            error: anyhow::anyhow!("COMMAND exited with status {}", outcome.exit_code),
        });
    }
    Ok(())
}
