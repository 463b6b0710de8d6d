//! What a run measured, as CSV files and a summary for people.

use std::fmt::Write as _;
use std::path::Path;

use hdrhistogram::Histogram;

use crate::relay::RelayReport;

/// Percentiles written to queue_delay.csv and lateness.csv.
const PERCENTILES: &[f64] = &[
    0.0, 1.0, 5.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9, 100.0,
];

fn pct(h: &Histogram<u64>, p: f64) -> u64 {
    if h.is_empty() {
        0
    } else {
        h.value_at_quantile(p / 100.0)
    }
}

/// Goodput of a direction over the run, Mbit/s of IP bytes delivered.
pub fn delivered_mbps(r: &RelayReport) -> f64 {
    let s = r.elapsed.as_secs_f64();
    if s > 0.0 {
        r.stats.delivered_bytes as f64 * 8.0 / s / 1e6
    } else {
        0.0
    }
}

/// Relay CPU per packet handled, ns.
pub fn cpu_per_packet_ns(r: &RelayReport) -> f64 {
    r.cpu.as_nanos() as f64 / r.stats.sent.max(1) as f64
}

/// Write counters.csv, queue_delay.csv and lateness.csv into `dir`.
pub fn write_csv(dir: &Path, reports: &[RelayReport]) -> std::io::Result<()> {
    let mut counters = String::from(
        "path,way,elapsed_s,sent,sent_bytes,delivered,delivered_bytes,dropped_loss,\
         dropped_queue,dropped_down,marked,max_queue_packets,max_queue_bytes,delivered_mbps,\
         queue_delay_p50_us,queue_delay_p99_us,lateness_p50_us,lateness_p99_us,\
         lateness_max_us,cpu_ns_per_packet,realtime,write_errors,in_flight_at_start,\
         in_flight_at_end\n",
    );
    let mut delay = String::from("path,way,percentile,queue_delay_us\n");
    let mut late = String::from("path,way,percentile,lateness_us\n");
    for r in reports {
        let s = &r.stats;
        let _ = writeln!(
            counters,
            "{},{},{:.3},{},{},{},{},{},{},{},{},{},{},{:.3},{},{},{},{},{},{:.0},{},{},{},{}",
            r.path,
            r.way.as_str(),
            r.elapsed.as_secs_f64(),
            s.sent,
            s.sent_bytes,
            s.delivered,
            s.delivered_bytes,
            s.dropped_loss,
            s.dropped_queue,
            s.dropped_down,
            s.marked,
            s.max_queue_packets,
            s.max_queue_bytes,
            delivered_mbps(r),
            pct(&r.queue_delay_us, 50.0),
            pct(&r.queue_delay_us, 99.0),
            pct(&r.lateness_us, 50.0),
            pct(&r.lateness_us, 99.0),
            r.lateness_us.max(),
            cpu_per_packet_ns(r),
            r.realtime.is_ok(),
            r.write_errors,
            r.in_flight_at_start,
            r.in_flight_at_end,
        );
        for &p in PERCENTILES {
            let _ = writeln!(
                delay,
                "{},{},{p},{}",
                r.path,
                r.way.as_str(),
                pct(&r.queue_delay_us, p)
            );
            let _ = writeln!(
                late,
                "{},{},{p},{}",
                r.path,
                r.way.as_str(),
                pct(&r.lateness_us, p)
            );
        }
    }
    std::fs::write(dir.join("counters.csv"), counters)?;
    std::fs::write(dir.join("queue_delay.csv"), delay)?;
    std::fs::write(dir.join("lateness.csv"), late)
}

/// Fewer packets than this make a percentile or a per-packet cost meaningless: not judged.
const MIN_SAMPLES: u64 = 100;

/// The lateness p99 above which a summary warns that the run's timing is not to be trusted.
pub const LATENESS_WARN_US: u64 = 1000;

/// A summary for the terminal: one line per direction, then warnings.
pub fn summary(reports: &[RelayReport]) -> String {
    let mut out = String::from(
        "linkem: path way      sent  delivered  lost  q-drop  down  at-end  Mbit/s  qdelay p50/p99 ms  late p50/p99 µs  cpu ns/pkt\n",
    );
    for r in reports {
        let s = &r.stats;
        let _ = writeln!(
            out,
            "linkem: {:>4} {:<8} {:>6} {:>10} {:>5} {:>7} {:>5} {:>7} {:>7.2} {:>8.2}/{:<8.2} {:>7}/{:<7} {:>10}",
            r.path,
            r.way.as_str(),
            s.sent,
            s.delivered,
            s.dropped_loss,
            s.dropped_queue,
            s.dropped_down,
            r.in_flight_at_end,
            delivered_mbps(r),
            pct(&r.queue_delay_us, 50.0) as f64 / 1000.0,
            pct(&r.queue_delay_us, 99.0) as f64 / 1000.0,
            pct(&r.lateness_us, 50.0),
            pct(&r.lateness_us, 99.0),
            if s.sent >= MIN_SAMPLES {
                format!("{:.0}", cpu_per_packet_ns(r))
            } else {
                "–".into()
            },
        );
    }
    if let Some(Err(why)) = reports.first().map(|r| &r.realtime) {
        let _ = writeln!(out, "linkem: relays ran without real-time priority ({why})");
    }
    let worst = reports
        .iter()
        .filter(|r| r.lateness_us.len() >= MIN_SAMPLES)
        .map(|r| pct(&r.lateness_us, 99.0))
        .max()
        .unwrap_or(0);
    if worst > LATENESS_WARN_US {
        let _ = writeln!(
            out,
            "linkem: WARNING: relay lateness p99 {worst} µs > {LATENESS_WARN_US} µs: on this \
             machine, at this load, delays are accurate only to about that"
        );
    }
    for r in reports {
        if r.write_errors > 0 {
            let _ = writeln!(
                out,
                "linkem: path {} {}: {} packets could not be written to the far namespace",
                r.path,
                r.way.as_str(),
                r.write_errors
            );
        }
        if let Some(e) = &r.failure {
            let _ = writeln!(
                out,
                "linkem: path {} {} stopped early: {e}",
                r.path,
                r.way.as_str()
            );
        }
        if let Some(e) = &r.trace_error {
            let _ = writeln!(
                out,
                "linkem: trace of path {} {}: {e}",
                r.path,
                r.way.as_str()
            );
        }
    }
    out
}
