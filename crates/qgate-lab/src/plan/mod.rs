//! `qgate-lab run PLAN.toml`: scenarios as data. A plan file describes a network, timed changes,
//! workloads of the real components, variants to compare, a sweep, and figures; the runner
//! builds each (point, scheme, seed) run on the simulated network in virtual time, on every core
//! it is given, and writes `results.csv`, `summary.md` (with confidence intervals and p-values)
//! and SVG figures.

mod check;
mod error;
mod loaded;
pub mod overrides;
pub mod report;
pub mod run;
pub mod spec;
#[cfg(test)]
mod testing;
mod variants;
pub(crate) mod workload;

pub use check::{MAX_DURATION_S, MAX_RUNS, MAX_SEEDS};
pub use error::PlanError;
pub use loaded::Loaded;
pub use spec::Plan;
pub use variants::{At, Options, Variant};
