//! qgate experiments: scenarios that run the real qgate code on the simulated network in
//! virtual time, and system benchmarks. Split by what things are:
//! - [`plan`]: the plan runner (a scenario as TOML), its workloads and its reports;
//! - [`papers`]: the papers' experiments, from shipped plans where the runner covers them;
//! - [`faults`]: the fault-injection lab (gateway and broker under hostile conditions);
//! - [`bench`]: benchmarks on real sockets; [`demo`]: demonstrations;
//! - [`stats`], [`svg`], [`pool`]: statistics, figures and the worker pool the others share;
//! - [`cli`]: the `qgate-lab` command line.
//!
//! The user-space TCP lives beside the simulator (`qgate_netsim::tcp`), the Artemis launcher
//! with the AMQP crate's test support (`qgate_amqp::artemis`).

pub mod bench;
pub mod cli;
pub mod demo;
pub mod faults;
pub mod papers;
pub mod plan;
pub mod pool;
pub mod providers;
pub mod stats;
pub mod svg;

/// Run `f` on a single-threaded tokio runtime whose clock is paused: time advances only when
/// every task waits, straight to the next timer, so simulated minutes take wall-clock
/// milliseconds and runs are deterministic.
pub fn virtual_time<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a tokio runtime")
        .block_on(f)
}
