//! `qgate-lab aqm`'s data: the operating point of a run and what it measured, in the terms of
//! paper 004's report. The runs themselves are the shipped plans `lab/plans/paper004-aqm.toml`
//! and `paper004-tau0.toml` (see [`crate::papers::paper004`]).

use std::time::Duration;

use qgate_aqm::DisciplineSpec;

use crate::stats::Summary;

/// The experiment's settings.
#[derive(Debug, Clone)]
pub struct AqmConfig {
    /// A short key for the operating point (CSV column `point`).
    pub key: String,
    /// A name for the operating point (used in titles).
    pub label: String,
    /// Bulk flows, one per source.
    pub flows: usize,
    /// Access link rate, bit/s.
    pub access_rate_bps: u64,
    /// Access link one-way delay.
    pub access_delay: Duration,
    /// Bottleneck rate, bit/s.
    pub bottleneck_rate_bps: u64,
    /// Bottleneck one-way delay.
    pub bottleneck_delay: Duration,
    /// Random loss on the bottleneck's data direction.
    pub loss: f64,
    /// Packet limit of every queue.
    pub limit: usize,
    /// IP packet size (QUIC datagrams are this minus 28 bytes of IP + UDP).
    pub packet_bytes: usize,
    /// Simulated time per run.
    pub duration: Duration,
    /// Statistics skip this initial period (slow start).
    pub warmup: Duration,
    /// One run per seed and discipline.
    pub seeds: Vec<u64>,
    /// The disciplines on the bottleneck.
    pub disciplines: Vec<DisciplineSpec>,
}

/// What one run measured (statistics after the warm-up).
#[derive(Debug, Clone)]
pub struct RunResult {
    /// Discipline name.
    pub discipline: String,
    /// The spec as run.
    pub spec: String,
    /// Seed.
    pub seed: u64,
    /// Sum of all flows' goodput, Mbit/s.
    pub total_goodput_mbps: f64,
    /// Each flow's goodput, Mbit/s.
    pub flow_goodput_mbps: Vec<f64>,
    /// Bytes the bottleneck delivered after the warm-up ÷ its capacity over that time.
    pub utilisation: f64,
    /// Queueing delay at the bottleneck, ms.
    pub qdelay_ms: Summary,
    /// 99th percentile queueing delay, ms.
    pub qdelay_p99_ms: f64,
    /// Each sender's mean smoothed RTT, ms.
    pub flow_rtt_ms: Vec<f64>,
    /// Packets the bottleneck queue dropped (overflow + AQM).
    pub queue_drops: u64,
    /// Of which the AQM chose.
    pub aqm_drops: u64,
    /// Packets lost to random loss on the bottleneck.
    pub random_losses: u64,
    /// Packets the bottleneck delivered to the sink.
    pub received_packets: u64,
    /// The discipline's signal probability (PIE's p, PID-Delay's U) sampled every 10 ms after
    /// the warm-up: mean and standard deviation; NaN for disciplines without one.
    pub signal_probability: (f64, f64),
    /// The delay the discipline steered toward, once a second after the warm-up, averaged
    /// (the stable variant's τ0 plus its busy-time guard's allowance), ms; NaN for the others.
    pub target_ms: f64,
}
