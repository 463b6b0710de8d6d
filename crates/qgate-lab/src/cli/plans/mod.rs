//! `qgate-lab PLAN-OR-PAPER …`: the papers' experiments and any plan file. The subcommands are
//! grouped by how they run: `run` (any plan file), the labs on the simulated network, and the
//! kernel labs (real time, root); `execute` runs a plan's variants and writes its results.

mod execute;
mod kernel;
mod run;
mod simulated;

use clap::Subcommand;
use qgate::Failure;

use self::kernel::{
    amqp_kernel_cmd, aqm_kernel_cmd, edge_aqm_cmd, upload_kernel_cmd, AmqpKernelArgs,
    AqmKernelArgs, EdgeAqmArgs, UploadKernelArgs,
};
use self::run::{run_cmd, RunArgs};
use self::simulated::{
    amqp_cmd, aqm_cmd, faults_cmd, history_cmd, margins_cmd, proxy_cmd, upload_cmd, AmqpArgs,
    AqmArgs, FaultsArgs, HistoryArgs, MarginArgs, ProxyArgs, UploadArgs,
};

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
    /// Run a scenario described in a plan file (docs/book/src/lab/plans.md; examples in
    /// lab/plans/): results.csv, summary.md with confidence intervals and p-values, SVG figures.
    Run(RunArgs),
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
        Lab::Margins(m) => margins_cmd(m),
    }
}
