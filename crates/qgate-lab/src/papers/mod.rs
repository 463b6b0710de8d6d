//! The papers' experiments. Papers 000, 001, 002 and 004 run shipped plans (`lab/plans/`) through the
//! plan runner and add only their comparison with the paper; paper 003 (AMQP over QUIC against
//! TCP+TLS) still builds its cases in code. `paper004_kernel` runs paper 004's point with kernel
//! TCP flows through the real-time emulator (`qgate-lab linkem`), `paper003_kernel` paper 003's
//! cases with the kernel's TCP under TLS, `paper001_kernel` the upload with Linux MPTCP, and
//! `paper004_edge` the real gateway shaping its backhaul through each discipline.

pub mod paper000;
pub mod paper001;
pub mod paper001_kernel;
pub mod paper002;
pub mod paper003;
pub mod paper003_kernel;
pub mod paper003_report;
pub mod paper004;
pub mod paper004_edge;
pub mod paper004_kernel;
pub mod paper004_report;
pub mod paper004_results;

/// The rows of a results.csv a kernel lab wrote (header skipped, blank lines ignored): each
/// split at commas, which must give `fields` fields, and read by `row` (`None`: malformed).
pub(crate) fn parse_rows<T>(
    text: &str,
    fields: usize,
    row: impl Fn(&[&str]) -> Option<T>,
) -> Result<Vec<T>, String> {
    text.lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f.len() == fields)
                .then(|| row(&f))
                .flatten()
                .ok_or_else(|| format!("results.csv: bad row '{l}'"))
        })
        .collect()
}

/// The points of `sweep` present in `records`: (index, x), in sweep order.
pub(crate) fn sweep_points(records: &[crate::plan::run::Record], sweep: &str) -> Vec<(usize, f64)> {
    let mut v: Vec<(usize, f64)> = records
        .iter()
        .filter_map(|r| r.point.as_ref())
        .filter(|p| p.sweep == sweep)
        .map(|p| (p.index, p.x))
        .collect();
    v.sort_by_key(|p| p.0);
    v.dedup_by(|a, b| a.0 == b.0);
    v
}
