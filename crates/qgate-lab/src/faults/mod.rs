//! `qgate-lab faults`: the gateway and the broker under faults and hostile peers at once, on
//! the simulated network in virtual time, with the same components as a deployment (issue 18).
//!
//! Two scenarios, each run for several seeds:
//! - [`gateway`]: 50 devices → gateway → 3 backhaul paths → ingest server, while a path flaps,
//!   every path loses 15 % of its packets for a while, the server restarts, and hostile peers
//!   (a connection registering in a loop, garbage datagrams) hit the device port;
//! - [`broker`]: producers and consumers on the broker over QUIC whose connections are cut at
//!   random, and a broker restart (a new broker on the same store).
//!
//! Each reports what was accepted, delivered, lost (an acknowledged item never delivered: must
//! be 0), duplicated and still pending, and the recovery time after each fault.

pub mod broker;
pub mod gateway;
pub mod report;

/// How a fault affected the service.
#[derive(Debug, Clone, PartialEq)]
pub struct Recovery {
    /// The kind of fault, what the summary aggregates over seeds (e.g. "client link cut").
    pub kind: &'static str,
    /// What happened, e.g. "path 1 flaps", "producer 2 link down 7.5 s".
    pub fault: String,
    /// When it began, s from the start of the workload.
    pub start_s: f64,
    /// When it ended (the path back up, the server or broker restarted), s.
    pub end_s: f64,
    /// From `end_s` until service was back (see each scenario for its criterion), s; `None`
    /// if it never came back before the run ended.
    pub recovery_s: Option<f64>,
}

/// One run of one scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// "gateway" or "broker".
    pub scenario: &'static str,
    /// The seed.
    pub seed: u64,
    /// Items the service acknowledged to their source (device answered 201 / producer's message
    /// accepted).
    pub accepted: u64,
    /// Distinct acknowledged items that reached the end (stored by the server / received by a
    /// consumer).
    pub delivered: u64,
    /// Acknowledged items that never reached the end. Must be 0.
    pub lost: u64,
    /// Items that reached the end more than once (counted once per extra copy).
    pub duplicated: u64,
    /// Items offered but never acknowledged by the end of the run (not lost: their source still
    /// holds them).
    pub pending: u64,
    /// Per fault.
    pub recoveries: Vec<Recovery>,
    /// Other counters worth reporting (name, value), e.g. registrations refused.
    pub counters: Vec<(String, f64)>,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct FaultsConfig {
    /// Seeds 1..=seeds.
    pub seeds: u64,
    /// Smoke run: fewer devices and clients, the same faults.
    pub quick: bool,
}

impl FaultsConfig {
    /// The full run: 3 seeds.
    pub fn full() -> FaultsConfig {
        FaultsConfig {
            seeds: 3,
            quick: false,
        }
    }
}

/// Run both scenarios for every seed (two at a time), reporting each finished run.
pub fn run_all(cfg: &FaultsConfig, progress: impl Fn(&str) + Sync) -> Vec<Outcome> {
    let runs: Vec<(&'static str, u64)> = (1..=cfg.seeds)
        .flat_map(|s| [("gateway", s), ("broker", s)])
        .collect();
    let quick = cfg.quick;
    crate::pool::run_each(
        &runs,
        crate::pool::default_jobs(),
        |(scenario, seed)| match *scenario {
            "gateway" => crate::virtual_time(gateway::run(*seed, quick)),
            _ => crate::virtual_time(broker::run(*seed, quick)),
        },
        |(scenario, seed)| progress(&format!("{scenario} seed {seed}")),
    )
}

/// The first time at or after `from` when a window of `window` s holds at least `need`
/// successes, given success times `ok` (sorted, s); that time minus `from`.
pub fn recovered_after(ok: &[f64], from: f64, window: f64, need: usize) -> Option<f64> {
    let start = ok.partition_point(|t| *t < from);
    (start..ok.len()).find_map(|i| {
        let end = ok[i..].partition_point(|t| *t < ok[i] + window);
        (end >= need).then(|| ok[i] - from)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_is_the_first_full_window_after_the_fault() {
        // 10 per second until 5 s, nothing until 7 s, then 10 per second again.
        let mut ok: Vec<f64> = (0..50).map(|i| i as f64 * 0.1).collect();
        ok.extend((70..120).map(|i| i as f64 * 0.1));
        let r = recovered_after(&ok, 5.0, 1.0, 9).unwrap();
        assert!((r - 2.0).abs() < 1e-9, "{r}");
        assert_eq!(recovered_after(&ok, 12.0, 1.0, 9), None);
        // Service never stopped: recovered at once.
        assert_eq!(recovered_after(&ok, 1.0, 1.0, 9), Some(0.0));
    }
}
