//! Workloads of the real components on a plan's network. Each is set up (hosts, servers,
//! connections) before the clock starts, then runs until it is done or the run's deadline, and
//! returns its measurements: scalars, timed samples and per-second series.

pub(crate) mod amqp;
mod bulk;
mod conventional;
mod downloads;
pub(crate) mod gateway;
mod upload;

use std::sync::Arc;

use qgate_netsim::topology::Topology;
use qgate_netsim::World;
use qgate_transport::DevPki;
use tokio::time::Instant;

use super::spec::Workload;

/// What a run measured of one workload (names without the workload prefix).
#[derive(Debug, Default)]
pub struct Measurements {
    /// One number per run.
    pub scalars: Vec<(String, f64)>,
    /// Many values per run, each with when it was taken (s from the start).
    pub samples: Vec<(String, Vec<(f64, f64)>)>,
    /// One value per second (t = the end of the second).
    pub series: Vec<(String, Vec<(f64, f64)>)>,
}

/// What setting up a workload needs.
pub struct Setup {
    /// The run's seed.
    pub seed: u64,
    /// The workload's position in the plan (ports, seeds).
    pub index: usize,
    /// Certificates for every server.
    pub pki: Arc<DevPki>,
}

/// When a run's workloads start and must stop.
#[derive(Debug, Clone)]
pub struct Clock {
    /// t = 0.
    pub start: Instant,
    /// No new work after this.
    pub deadline: Instant,
    /// Set once every workload with an end (devices' files, downloads) has ended: endless
    /// background workloads (bulk flows) stop then, or at the deadline if the run has only
    /// background work.
    pub finished: Arc<std::sync::atomic::AtomicBool>,
}

impl Clock {
    /// Seconds since the start.
    pub fn t(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// Whether the work this run is about has ended.
    pub fn finished(&self) -> bool {
        self.finished.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A workload ready to run.
pub enum Prepared {
    /// See [`gateway`].
    Gateway(Box<gateway::Prepared>),
    /// See [`bulk`].
    Bulk(Box<bulk::Prepared>),
    /// See [`downloads`].
    Downloads(Box<downloads::Prepared>),
    /// See [`amqp`].
    Amqp(Box<amqp::Prepared>),
    /// See [`upload`].
    Upload(Box<upload::Prepared>),
    /// See [`conventional`].
    Conventional(Box<conventional::Prepared>),
}

/// Check a workload's host and link names against the topology, and its values against the
/// run's length.
pub fn check(
    w: &Workload,
    duration_s: f64,
    topology: &Topology,
    host: &dyn Fn(&str, &str) -> Result<(), String>,
    link: &dyn Fn(&str, &str) -> Result<(), String>,
) -> Result<(), String> {
    if w.start_s() >= duration_s {
        return Err(format!(
            "workload '{}': 'start_s' ({}) must be before the run ends ('plan.duration_s' = {duration_s})",
            w.name(),
            w.start_s()
        ));
    }
    match w {
        Workload::Gateway(g) => gateway::check(g, topology, host, link),
        Workload::Bulk(b) => bulk::check(b, duration_s, host, link),
        Workload::Downloads(d) => downloads::check(d, host),
        Workload::Amqp(a) => amqp::check(a, topology, host),
        Workload::Upload(u) => upload::check(u, topology, host, link),
    }
}

/// Build what `w` needs on `world`.
pub async fn prepare(w: &Workload, world: &mut World, s: &Setup) -> Result<Prepared, String> {
    let fail = |e: String| format!("workload '{}': {e}", w.name());
    Ok(match w {
        Workload::Gateway(g) => Prepared::Gateway(Box::new(
            gateway::prepare(g, world, s, Arc::new(qgate_server::CountSink::new()))
                .await
                .map_err(fail)?,
        )),
        Workload::Bulk(b) => Prepared::Bulk(Box::new(bulk::prepare(b, world, s).map_err(fail)?)),
        Workload::Downloads(d) => {
            Prepared::Downloads(Box::new(downloads::prepare(d, world, s).map_err(fail)?))
        }
        Workload::Amqp(a) => Prepared::Amqp(Box::new(amqp::prepare(a, world, s).map_err(fail)?)),
        Workload::Upload(u) if u.conventional => Prepared::Conventional(Box::new(
            conventional::prepare(u, world, s).await.map_err(fail)?,
        )),
        Workload::Upload(u) => {
            Prepared::Upload(Box::new(upload::prepare(u, world, s).await.map_err(fail)?))
        }
    })
}

impl Prepared {
    /// Whether it runs until the others end (bulk flows) rather than to an end of its own.
    pub fn is_background(&self) -> bool {
        matches!(self, Prepared::Bulk(_))
    }

    /// Run until done or the deadline.
    pub async fn run(self, clock: Clock) -> Measurements {
        match self {
            Prepared::Gateway(p) => p.run(clock).await,
            Prepared::Bulk(p) => p.run(clock).await,
            Prepared::Downloads(p) => p.run(clock).await,
            Prepared::Amqp(p) => p.run(clock).await,
            Prepared::Upload(p) => p.run(clock).await,
            Prepared::Conventional(p) => p.run(clock).await,
        }
    }
}

/// A seeded RNG for one workload of one run: different seeds give different draws, and
/// different workloads of a run draw independently.
fn rng(seed: u64, index: usize) -> rand_chacha::ChaCha8Rng {
    rand::SeedableRng::seed_from_u64(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ index as u64)
}

/// An in-memory history store whose timestamps follow the tokio clock, so entries age in
/// simulated time.
fn virtual_history(
    config: qgate_history::HistoryConfig,
) -> Arc<qgate_transport::window_history::HistoryStore> {
    let start = Instant::now();
    let clock: qgate_transport::window_history::Clock =
        Arc::new(move || 1_700_000_000_000 + start.elapsed().as_millis() as u64);
    qgate_transport::window_history::HistoryStore::in_memory(config, clock)
}

/// Seconds as a duration (plan values are checked finite and non-negative).
fn secs(s: f64) -> std::time::Duration {
    std::time::Duration::from_secs_f64(s.max(0.0))
}
