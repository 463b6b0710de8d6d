//! The gateway's metrics, read from its tables and counters at scrape time (decision O1).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use qgate_core::loggate::LogGate;
use qgate_core::metrics;
use qgate_core::sync::lock;

use qgate_forward::path::PathId;

use super::Gateway;

impl Gateway {
    /// The gateway's metrics text (OpenMetrics), as the admin port serves it.
    pub fn metrics(self: &Arc<Self>) -> String {
        metrics::render(self.collector())
    }

    /// The gateway's metrics as a registry collector (decision O1).
    pub fn collector(self: &Arc<Self>) -> GatewayMetrics {
        GatewayMetrics(self.clone())
    }
}

/// Reads the path table, per-path traffic, sessions, counters and delay histograms at scrape
/// time.
#[derive(Clone)]
pub struct GatewayMetrics(Arc<Gateway>);

impl std::fmt::Debug for GatewayMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GatewayMetrics")
    }
}

impl metrics::Collector for GatewayMetrics {
    fn encode(&self, mut e: metrics::DescriptorEncoder) -> std::fmt::Result {
        let gw = &self.0;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let table = gw.paths.table();
        // Path ids are their places in the table and in the per-path counters.
        let ids: Vec<String> = (0..gw.per_path.len().max(table.paths().len()))
            .map(|i| i.to_string())
            .collect();
        let per_path = |i: usize| [("path", ids.get(i).map_or("?", String::as_str))];
        metrics::gauges(
            &mut e,
            "qgate_gateway_path_rtt_seconds",
            "smoothed RTT of each backhaul path",
            table
                .paths()
                .iter()
                .enumerate()
                .filter_map(|(i, p)| p.rtt.map(|rtt| (per_path(i), rtt.as_secs_f64()))),
        )?;
        metrics::gauges(
            &mut e,
            "qgate_gateway_path_hits",
            "devices assigned to each path",
            table
                .paths()
                .iter()
                .enumerate()
                .map(|(i, p)| (per_path(i), p.hits as u64)),
        )?;
        metrics::gauges(
            &mut e,
            "qgate_gateway_path_up",
            "whether each path is up",
            table
                .paths()
                .iter()
                .enumerate()
                .map(|(i, p)| (per_path(i), u64::from(p.up))),
        )?;
        metrics::gauges(
            &mut e,
            "qgate_gateway_path_connections",
            "live QUIC connections of each path (decision G21)",
            (0..table.paths().len()).map(|i| {
                let live = gw.paths.live_connections(PathId(i)) as u64;
                (per_path(i), live)
            }),
        )?;
        metrics::counters(
            &mut e,
            "qgate_gateway_path_requests",
            "requests forwarded on each path",
            gw.per_path
                .iter()
                .enumerate()
                .map(|(i, n)| (per_path(i), r(n))),
        )?;
        metrics::counters(
            &mut e,
            "qgate_gateway_path_bytes",
            "request body bytes forwarded on each path",
            gw.per_path_bytes
                .iter()
                .enumerate()
                .map(|(i, n)| (per_path(i), r(n))),
        )?;
        let shaped: Vec<(usize, qgate_link::LinkStats, u64)> = gw
            .shapers
            .iter()
            .enumerate()
            .filter_map(|(i, h)| {
                h.as_ref()
                    .map(|h| (i, h.stats(), h.backlog_packets() as u64))
            })
            .collect();
        let by_shaper = |f: fn(&qgate_link::LinkStats, u64) -> u64| {
            shaped.iter().map(move |(i, s, b)| (per_path(*i), f(s, *b)))
        };
        metrics::counters(
            &mut e,
            "qgate_gateway_shaper_dropped",
            "packets the path's egress shaper dropped (queue limit or AQM)",
            by_shaper(|s, _| s.dropped_queue),
        )?;
        metrics::counters(
            &mut e,
            "qgate_gateway_shaper_marked",
            "packets the path's egress shaper marked CE",
            by_shaper(|s, _| s.marked),
        )?;
        metrics::counters(
            &mut e,
            "qgate_gateway_shaper_sent",
            "packets offered to the path's egress shaper",
            by_shaper(|s, _| s.sent),
        )?;
        metrics::gauges(
            &mut e,
            "qgate_gateway_shaper_queue_packets",
            "packets queued in the path's egress shaper",
            by_shaper(|_, b| b),
        )?;
        let (sessions, (conns, addrs)) = gw.paths.with_core(|f| {
            let t = f.sessions();
            (t.len(), t.owners())
        });
        metrics::gauge(
            &mut e,
            "qgate_gateway_sessions",
            "registered devices",
            sessions as u64,
        )?;
        metrics::gauge(
            &mut e,
            "qgate_gateway_session_connections",
            "device connections holding sessions",
            conns as u64,
        )?;
        metrics::gauge(
            &mut e,
            "qgate_gateway_session_addresses",
            "source addresses holding sessions",
            addrs as u64,
        )?;
        let limits = gw.cfg.session_limits();
        for (name, v) in [
            ("qgate_gateway_limit_max_devices", limits.max_devices),
            (
                "qgate_gateway_limit_max_sessions_per_connection",
                limits.per_connection,
            ),
            (
                "qgate_gateway_limit_max_sessions_per_address",
                limits.per_address,
            ),
            (
                "qgate_gateway_limit_max_inflight_per_device",
                limits.max_inflight,
            ),
            ("qgate_gateway_limit_max_handshakes", gw.cfg.max_handshakes),
            (
                "qgate_gateway_limit_max_handshakes_per_address",
                gw.cfg.max_handshakes_per_address,
            ),
            ("qgate_gateway_limit_retry_above", gw.cfg.retry_above),
        ] {
            metrics::gauge(&mut e, name, "configured limit", v as u64)?;
        }
        if let Some(ep) = gw.endpoint.get() {
            metrics::gauge(
                &mut e,
                "qgate_gateway_handshakes",
                "device handshakes in progress",
                ep.handshaking.load(Ordering::Relaxed) as u64,
            )?;
            metrics::gauge(
                &mut e,
                "qgate_gateway_device_connections",
                "established device connections",
                ep.established.load(Ordering::Relaxed) as u64,
            )?;
            for (name, help, v) in [
                (
                    "qgate_gateway_retries_sent",
                    "QUIC Retry packets sent to unproved device addresses",
                    &ep.retries,
                ),
                (
                    "qgate_gateway_connections_refused",
                    "device connections refused: every slot taken",
                    &ep.refused_full,
                ),
                (
                    "qgate_gateway_handshakes_ignored",
                    "device Initials ignored: handshake budget spent",
                    &ep.ignored_busy,
                ),
                (
                    "qgate_gateway_handshakes_ignored_share",
                    "device Initials ignored: their address held its share of the handshake budget (decision G26)",
                    &ep.ignored_share,
                ),
                (
                    "qgate_gateway_handshake_timeouts",
                    "device handshakes closed at their deadline",
                    &ep.handshake_timeouts,
                ),
            ] {
                metrics::counter(&mut e, name, help, r(v))?;
            }
        }
        metrics::counter(
            &mut e,
            "qgate_gateway_bodies_gave_way",
            "device request bodies cut off (503) to make room for another address's, theirs holding the most of the body budget (decision T13)",
            gw.bodies.gave_way(),
        )?;
        let suppressed: u64 = lock(&gw.logs).0.iter().map(LogGate::suppressed).sum();
        metrics::counter(
            &mut e,
            "qgate_gateway_log_lines_suppressed",
            "warnings left out by the log rate limit",
            suppressed,
        )?;
        let st = &gw.stats;
        st.snapshot().encode(&mut e)?;
        gw.batch_stats.snapshot().encode(&mut e)?;
        if let Some(s) = &gw.spool {
            s.stats().snapshot().encode(&mut e)?;
        }
        if let Some(m) = gw.mqtt_stats_if_any() {
            m.snapshot().encode(&mut e)?;
        }
        metrics::histograms(
            &mut e,
            "qgate_gateway_response_delay_seconds",
            "device request in to response out",
            [
                ([("class", "priority")], &st.delay_priority.hist),
                ([("class", "best_effort")], &st.delay_best_effort.hist),
            ],
        )
    }
}
