//! Result files of `qgate-lab amqp`: results.csv, summary.md and SVG figures.

mod beyond;
mod claims;
mod figures;
mod reps;
mod summary;

use std::fmt::Write as _;
use std::path::Path;

use self::reps::{kbps, sides};
use crate::papers::paper003::{Point, Rep};

pub use self::figures::figures;
pub use self::summary::summary_md;

/// results.csv: one row per repetition and side.
pub fn results_csv(points: &[Point], results: &[Vec<Rep>]) -> String {
    let mut s = String::from("case,sweep,rate_bps,delay_ms,loss,transport,testbed,messages_per_rep,rep,seed,side,messages,failed,zero_rtt,total_s,startup_ms,rtt_ms,wire_bytes,throughput_kbps,energy_j\n");
    for (p, reps) in points.iter().zip(results) {
        for r in reps {
            for (side, x) in sides(r) {
                let _ = writeln!(
                    s,
                    "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.6},{:.4},{:.4},{},{:.3},{:.6}",
                    p.case.name(),
                    p.sweep,
                    p.channel.rate_bps,
                    p.channel.delay.as_millis(),
                    p.channel.loss,
                    p.transport.name(),
                    p.testbed.name(),
                    p.messages,
                    r.rep,
                    r.seed,
                    side,
                    x.messages,
                    x.failed,
                    x.zero_rtt,
                    x.total_s,
                    x.startup_ms,
                    x.rtt_ms,
                    x.wire_bytes,
                    kbps(x),
                    x.energy_j
                );
            }
        }
    }
    s
}

/// Write results.csv, summary.md and the figures into `dir`.
pub fn write_all(
    dir: &Path,
    points: &[Point],
    results: &[Vec<Rep>],
    command: &str,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("results.csv"), results_csv(points, results))?;
    std::fs::write(dir.join("summary.md"), summary_md(points, results, command))?;
    for (name, svg) in figures(points, results) {
        std::fs::write(dir.join(name), svg)?;
    }
    Ok(())
}
