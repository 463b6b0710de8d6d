//! qgate experiments: scenarios that run the real qgate code on the simulated network in
//! virtual time, and system benchmarks.

pub mod amqp;
pub mod amqp_report;
pub mod amqpbench;
pub mod aqm;
pub mod aqm_report;
pub mod artemis;
pub mod bench;
pub mod demo;
pub mod faults;
pub mod gwbench;
pub mod gwdemo;
pub mod paper000;
pub mod paper002;
pub mod paper004;
pub mod plan;
pub mod pool;
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
