//! The broker's metrics, read at scrape time (decision O1).

use std::sync::atomic::{AtomicU64, Ordering};

use qgate_core::metrics;

use super::registry::QueueReport;
use super::state::Broker;
use crate::bridge::BridgeStats;

impl Broker {
    /// The broker's metrics as a registry collector (decision O1).
    pub fn collector(&self) -> BrokerMetrics {
        BrokerMetrics(self.clone())
    }

    /// The broker's metrics text (OpenMetrics), as the admin port serves it.
    pub fn metrics(&self) -> String {
        metrics::render(self.collector())
    }
}

/// Reads the broker's queues, connections and bridges at scrape time.
#[derive(Clone)]
pub struct BrokerMetrics(Broker);

impl std::fmt::Debug for BrokerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BrokerMetrics")
    }
}

impl metrics::Collector for BrokerMetrics {
    fn encode(&self, mut e: metrics::DescriptorEncoder) -> std::fmt::Result {
        let b = &self.0;
        let qs = b.queue_stats();
        let by_queue = |f: &dyn Fn(&QueueReport) -> u64| {
            qs.iter()
                .map(move |q| ([("queue", q.name.as_str())], f(q)))
                .collect::<Vec<_>>()
        };
        for (name, help, f) in [
            (
                "qgate_amqp_queue_depth",
                "messages held (ready + unsettled)",
                &(|q: &QueueReport| q.depth as u64) as &dyn Fn(&QueueReport) -> u64,
            ),
            (
                "qgate_amqp_queue_ready",
                "messages waiting for a consumer",
                &|q| q.ready as u64,
            ),
            (
                "qgate_amqp_queue_unacked",
                "messages delivered, not yet settled",
                &|q| q.unacked as u64,
            ),
            ("qgate_amqp_queue_bytes", "message bytes held", &|q| {
                q.bytes as u64
            }),
        ] {
            metrics::gauges(&mut e, name, help, by_queue(f))?;
        }
        for (name, help, f) in [
            (
                "qgate_amqp_enqueued",
                "messages accepted into the queue",
                &(|q: &QueueReport| q.stats.enqueued) as &dyn Fn(&QueueReport) -> u64,
            ),
            ("qgate_amqp_acked", "messages settled by consumers", &|q| {
                q.stats.acked
            }),
            (
                "qgate_amqp_redelivered",
                "messages put back for redelivery",
                &|q| q.stats.released,
            ),
            ("qgate_amqp_expired", "messages dropped by TTL", &|q| {
                q.stats.expired
            }),
            (
                "qgate_amqp_refused",
                "messages refused by the queue's limits",
                &|q| q.stats.refused,
            ),
        ] {
            metrics::counters(&mut e, name, help, by_queue(f))?;
        }
        let cfg = &b.inner.cfg;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        b.inner.counters.snapshot().encode(&mut e)?;
        metrics::gauge(
            &mut e,
            "qgate_amqp_max_connections",
            "configured limit of connections held at once",
            cfg.max_connections as u64,
        )?;
        metrics::gauge(
            &mut e,
            "qgate_amqp_max_connections_per_address",
            "configured limit of connections per source address",
            cfg.max_connections_per_address as u64,
        )?;
        metrics::gauge(
            &mut e,
            "qgate_amqp_handshake_timeout_seconds",
            "configured handshake deadline",
            cfg.handshake_timeout.as_secs_f64(),
        )?;
        metrics::gauge(
            &mut e,
            "qgate_amqp_idle_timeout_seconds",
            "configured idle timeout (0: none)",
            cfg.idle_timeout.as_secs_f64(),
        )?;
        let bridges = b.bridges();
        let by_bridge = |f: &dyn Fn(&BridgeStats) -> u64| {
            bridges
                .iter()
                .map(|(q, up, st)| ([("queue", q.as_str()), ("upstream", up.as_str())], f(st)))
                .collect::<Vec<_>>()
        };
        for (name, help, f) in [
            (
                "qgate_amqp_bridge_forwarded",
                "messages the upstream accepted (then forgotten here)",
                &(|s: &BridgeStats| r(&s.forwarded)) as &dyn Fn(&BridgeStats) -> u64,
            ),
            (
                "qgate_amqp_bridge_rejected",
                "messages the upstream refused for good (dropped)",
                &|s| r(&s.rejected),
            ),
            (
                "qgate_amqp_bridge_connects",
                "connections opened to the upstream",
                &|s| r(&s.connects),
            ),
        ] {
            metrics::counters(&mut e, name, help, by_bridge(f))?;
        }
        metrics::gauges(
            &mut e,
            "qgate_amqp_bridge_up",
            "1 while the upstream link is attached",
            by_bridge(&|s| u64::from(s.up.load(Ordering::Relaxed))),
        )
    }
}
