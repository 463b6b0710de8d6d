//! `qgate-lab upload`: paper 001's experiments, run from the shipped plans
//! `lab/plans/paper001-upload.toml` (goodput against the windows and the chunk size) and
//! `lab/plans/paper001-fault.toml` (the Wi-Fi path dies mid-transfer), with a closing section
//! that holds the results against the paper. Every number in it is from the same run
//! (decision X4).

use std::fmt::Write as _;
use std::path::Path;

use super::sweep_points as points;
use crate::plan::run::Record;
use crate::plan::{Loaded, PlanError};
use crate::stats::Summary;

/// The shipped plans (also in `lab/plans/`).
pub const PLAN: &str = include_str!("../../../../lab/plans/paper001-upload.toml");
/// Where it lives in the repository.
pub const PLAN_PATH: &str = "lab/plans/paper001-upload.toml";
/// The fault plan.
pub const FAULT_PLAN: &str = include_str!("../../../../lab/plans/paper001-fault.toml");
/// Where it lives in the repository.
pub const FAULT_PLAN_PATH: &str = "lab/plans/paper001-fault.toml";

/// The buffer-requirement plan (Figs. 6–7).
pub const REQUIREMENT_PLAN: &str = include_str!("../../../../lab/plans/paper001-requirement.toml");
/// Where it lives in the repository.
pub const REQUIREMENT_PLAN_PATH: &str = "lab/plans/paper001-requirement.toml";

/// The three plans and their results subdirectories ("" = the results root), in the order
/// [`against_paper`] takes their records.
pub fn plans() -> Result<Vec<(Loaded, &'static str)>, PlanError> {
    Ok(vec![
        (Loaded::parse(PLAN, Path::new(PLAN_PATH))?, ""),
        (
            Loaded::parse(FAULT_PLAN, Path::new(FAULT_PLAN_PATH))?,
            "fault",
        ),
        (
            Loaded::parse(REQUIREMENT_PLAN, Path::new(REQUIREMENT_PLAN_PATH))?,
            "requirement",
        ),
    ])
}

/// The share of its large-window goodput a scheme must keep (paper §4.4: "the same
/// throughput as … a sufficiently large buffer"; 95 % as EXPERIMENTS.md asks).
const KEEP: f64 = 0.95;

/// A scheme's buffer requirement on one sweep.
struct Requirement {
    /// The smallest window from which on the scheme's mean goodput stays at [`KEEP`] of its
    /// mean at the largest window, every run of those points completed.
    x: f64,
    /// It is the smallest window swept: the requirement is at most this.
    at_most: bool,
    /// It is the largest window swept: the requirement is more than the one below it.
    more_than: Option<f64>,
    /// The largest window and the goodput there.
    reference: (f64, Summary),
}

impl Requirement {
    fn kb(&self) -> String {
        match (self.at_most, self.more_than) {
            (true, _) => format!("≤ {:.0}", self.x / 1000.0),
            (_, Some(below)) => format!("> {:.0}", below / 1000.0),
            _ => format!("{:.0}", self.x / 1000.0),
        }
    }
}

fn requirement(records: &[Record], sweep: &str, scheme: &str) -> Option<Requirement> {
    let pts = points(records, sweep);
    let at = |i: usize| summary(records, Some((sweep, i)), scheme, "up.goodput_mbps");
    // Goodput exists only for completed runs: a point where one failed cannot qualify.
    let all_completed = |i: usize| {
        let c = values(records, Some((sweep, i)), scheme, "up.completed");
        !c.is_empty() && c.iter().all(|v| *v == 1.0)
    };
    let &(last, last_x) = pts.last()?;
    let reference = at(last);
    if reference.n == 0 || !all_completed(last) {
        return None;
    }
    let mut need = None;
    for (k, &(i, x)) in pts.iter().enumerate().rev() {
        let g = at(i);
        if g.n == 0 || !all_completed(i) || g.mean < KEEP * reference.mean {
            break;
        }
        need = Some((k, x));
    }
    need.map(|(k, x)| Requirement {
        x,
        at_most: k == 0,
        more_than: (k + 1 == pts.len() && k > 0).then(|| pts[k - 1].1),
        reference: (last_x, reference),
    })
}

/// The buffer-requirement table (paper Figs. 6–7) from the requirement plan's records.
pub fn requirement_section(records: &[Record]) -> String {
    let mut s = String::new();
    let mut sweeps: Vec<(String, u32)> = Vec::new();
    for r in records {
        if let Some(p) = &r.point {
            let delay = p
                .sweep
                .rsplit('-')
                .next()
                .and_then(|d| d.strip_suffix("ms"))
                .and_then(|d| d.parse().ok());
            if let Some(d) = delay {
                if !sweeps.iter().any(|(n, _)| *n == p.sweep) {
                    sweeps.push((p.sweep.clone(), d));
                }
            }
        }
    }
    if sweeps.is_empty() {
        return s;
    }
    sweeps.sort_by_key(|(n, d)| (!n.starts_with("receive"), *d));
    let _ = writeln!(
        s,
        "### Buffer requirement against the cellular delay (results/upload/requirement)\n\n\
         The smallest window (KB, per connection) from which on a scheme's mean goodput stays \
         at ≥ {:.0} % of its own at the largest window swept (the paper's definition), every \
         run completed, on the swept grid (×1.25 steps from 40 KB to 3.15 MB and 8 MB in the \
         full plan): \"≤ 40\" means already at the smallest window, \"> 3150\" only at the \
         largest, and a ratio with \"≥\" is a lower bound. Two-ended runs two connections, so \
         its total is twice its per-connection window (the paper's tcp_rmem/tcp_wmem were \
         per socket too).\n",
        KEEP * 100.0
    );
    let _ = writeln!(
        s,
        "| buffer | cellular one-way delay (ms) | two-ended | conventional | conventional ÷ two-ended (per connection) | ÷ two-ended total | two-ended / conventional at the largest window (Mbit/s) |
|---|---|---|---|---|---|---|"
    );
    let mut ratios: Vec<(bool, f64, f64)> = Vec::new();
    for (sweep, delay) in &sweeps {
        let receive = sweep.starts_with("receive");
        let (two, conv) = (
            requirement(records, sweep, "two-ended"),
            requirement(records, sweep, "conventional"),
        );
        let kb = |r: &Option<Requirement>| r.as_ref().map_or("–".into(), Requirement::kb);
        let (ratio, total) = match (&two, &conv) {
            (Some(t), Some(c)) => {
                // A bound on either side makes the ratio a bound ("≥" when two-ended's is an
                // upper bound or conventional's a lower one).
                let (r, lower) = match (t.at_most || c.more_than.is_some(), c.at_most) {
                    (true, false) => (c.more_than.unwrap_or(c.x) / t.x, "≥ "),
                    (false, false) => (c.x / t.x, ""),
                    _ => (c.x / t.x, "~ "),
                };
                ratios.push((receive, r, r / 2.0));
                (format!("{lower}{r:.2}"), format!("{lower}{:.2}", r / 2.0))
            }
            _ => ("–".into(), "–".into()),
        };
        let refs = match (&two, &conv) {
            (Some(a), Some(b)) => format!(
                "{:.2} ± {:.2} / {:.2} ± {:.2} (n = {})",
                a.reference.1.mean,
                a.reference.1.std,
                b.reference.1.mean,
                b.reference.1.std,
                a.reference.1.n
            ),
            _ => "–".into(),
        };
        let _ = writeln!(
            s,
            "| {} | {delay} | {} | {} | {ratio} | {total} | {refs} |",
            if receive { "receive" } else { "send" },
            kb(&two),
            kb(&conv)
        );
    }
    for (receive, paper) in [(true, "2.0–2.7×"), (false, "1.9–2.4×")] {
        let r: Vec<_> = ratios.iter().filter(|r| r.0 == receive).collect();
        if r.is_empty() {
            continue;
        }
        let lo = r.iter().map(|r| r.1).fold(f64::INFINITY, f64::min);
        let hi = r.iter().map(|r| r.1).fold(f64::NEG_INFINITY, f64::max);
        let met = r.iter().filter(|r| r.1 >= 2.5).count();
        let _ = writeln!(
            s,
            "\n{}: conventional needs {lo:.2}–{hi:.2}× the two-ended window per connection \
             (bounds as marked in the table) \
             (paper, Linux MPTCP: {paper}; our goal ≥ 2.5×, met at {met} of {} delays), \
             {:.2}–{:.2}× its total.",
            if receive { "Receive" } else { "Send" },
            r.len(),
            r.iter().map(|r| r.2).fold(f64::INFINITY, f64::min),
            r.iter().map(|r| r.2).fold(f64::NEG_INFINITY, f64::max),
        );
    }
    // Why the send side differs from the paper, from this run's numbers.
    let conv = |receive: bool| -> Vec<f64> {
        sweeps
            .iter()
            .filter(|(n, _)| n.starts_with("receive") == receive)
            .filter_map(|(n, _)| requirement(records, n, "conventional").map(|r| r.x / 1000.0))
            .collect()
    };
    let (rx, tx) = (conv(true), conv(false));
    if !rx.is_empty() && !tx.is_empty() {
        let range = |v: &[f64]| {
            (
                v.iter().copied().fold(f64::INFINITY, f64::min),
                v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            )
        };
        let ((rlo, rhi), (tlo, thi)) = (range(&rx), range(&tx));
        if thi < rlo {
            let _ = writeln!(
                s,
                "\nConventional's send requirement is {tlo:.0}–{thi:.0} KB against its receive \
                 requirement of {rlo:.0}–{rhi:.0} KB in this run: a QUIC sender frees the bytes \
                 of every acknowledged packet whatever their place in the stream, where an \
                 MPTCP sender holds them until the cumulative data-level acknowledgement, so \
                 the send-side buffer blocking the paper measured is much smaller on QUIC \
                 (decision U9)."
            );
        }
    }
    s.push('\n');
    s
}

fn values(records: &[Record], at: Option<(&str, usize)>, scheme: &str, metric: &str) -> Vec<f64> {
    records
        .iter()
        .filter(|r| r.scheme == scheme)
        .filter(|r| match (at, &r.point) {
            (Some((sweep, i)), Some(p)) => p.sweep == sweep && p.index == i,
            (None, None) => true,
            _ => false,
        })
        .filter_map(|r| r.scalars.get(metric).copied())
        .collect()
}

fn summary(records: &[Record], at: Option<(&str, usize)>, scheme: &str, metric: &str) -> Summary {
    Summary::of(&values(records, at, scheme, metric))
}

/// Item 5 on the receiving side: what the receiver held at its peak, counted by the allocator
/// (decision U14), against the receive window; empty where it was not counted.
fn held_section(records: &[Record]) -> String {
    let mut s = String::new();
    let windows = points(records, "receive-window");
    let cell = |i: usize, sc: &str, metric: &str| {
        summary(records, Some(("receive-window", i)), sc, metric)
    };
    if windows
        .iter()
        .all(|&(i, _)| cell(i, "two-ended", "up.recv_peak_kb").n == 0)
    {
        return s;
    }
    let _ = writeln!(
        s,
        "Held at the receiver, peak over the upload (KB, mean ± std dev; decision U14). \
         `up.recv_peak_kb`: every byte allocated by its QUIC endpoint's and connections' \
         drivers and by its server (two-ended) or reading task (conventional) and not yet \
         freed: datagrams the QUIC stack has taken in, waiting in stream reassembly or in the \
         application, and connection and request state; not datagrams still queued at its \
         socket, nor scratch buffers made with the endpoint. `up.recv_quic_peak_kb`: the \
         drivers' part alone, the QUIC stack; the rest is what the server's tasks (or the \
         reading task) allocated, the connection's state made when they accepted it included. Two-ended's server holds each chunk, one request's body, until the \
         whole chunk has come and is written; `up.recv_body_peak_kb` is the most those bodies \
         held (sampled every 10 ms).\n\n\
         | receive window (KB) | two-ended | its QUIC stack | its request bodies (sampled) | conventional | its QUIC stack | Wi-Fi alone | cellular alone | conventional ÷ two-ended | QUIC stacks: conventional ÷ two-ended |\n|---|---|---|---|---|---|---|---|---|---|"
    );
    let f = |v: &Summary| {
        if v.n == 0 {
            "–".to_string()
        } else {
            format!("{:.0} ± {:.0}", v.mean, v.std)
        }
    };
    let ratio = |a: &Summary, b: &Summary| {
        if a.n > 0 && b.n > 0 {
            format!("{:.2}", a.mean / b.mean)
        } else {
            "–".into()
        }
    };
    for &(i, x) in &windows {
        let held = |sc: &str| cell(i, sc, "up.recv_peak_kb");
        let stack = |sc: &str| cell(i, sc, "up.recv_quic_peak_kb");
        let (two, conv) = (held("two-ended"), held("conventional"));
        let (two_q, conv_q) = (stack("two-ended"), stack("conventional"));
        let _ = writeln!(
            s,
            "| {x} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            f(&two),
            f(&two_q),
            f(&cell(i, "two-ended", "up.recv_body_peak_kb")),
            f(&conv),
            f(&conv_q),
            f(&held("wifi-only")),
            f(&held("cellular-only")),
            ratio(&conv, &two),
            ratio(&conv_q, &two_q),
        );
    }
    if let (Some(&(lo, xl)), Some(&(hi, xh))) = (windows.first(), windows.last()) {
        let m = |i: usize, sc: &str, metric: &str| cell(i, sc, metric).mean;
        let _ = writeln!(
            s,
            "\nFrom a {xl} KB to a {xh} KB window, conventional's peak grows from {:.0} to \
             {:.0} KB (the one stream's reassembly fills the window while the cellular bytes \
             are awaited); two-ended's QUIC stack goes from {:.0} to {:.0} KB and the whole \
             receiver from {:.0} to {:.0} KB, its server's request bodies peaking at {:.0} and \
             {:.0} KB (sampled, not necessarily at the same moment).\n",
            m(lo, "conventional", "up.recv_peak_kb"),
            m(hi, "conventional", "up.recv_peak_kb"),
            m(lo, "two-ended", "up.recv_quic_peak_kb"),
            m(hi, "two-ended", "up.recv_quic_peak_kb"),
            m(lo, "two-ended", "up.recv_peak_kb"),
            m(hi, "two-ended", "up.recv_peak_kb"),
            m(lo, "two-ended", "up.recv_body_peak_kb"),
            m(hi, "two-ended", "up.recv_body_peak_kb"),
        );
    }
    s
}

/// The section appended to the main plan's `summary.md`.
pub fn against_paper(records: &[Record], fault: &[Record], required: &[Record]) -> String {
    let mut s = String::from("## Against paper 001\n\n");
    let _ = writeln!(
        s,
        "The paper's claim: the two-ended scheme reaches the aggregate goodput of both paths \
         (≈ 25 Mbit/s in its testbed) with small buffers, and needs 2.0–2.7× less receive and \
         1.9–2.4× less send buffer than conventional MPTCP. Our goal: two-ended ≥ 95 % of \
         (Wi-Fi alone + cellular alone) in the same run. Goodput is file bits ÷ time from the \
         first connection to the server's confirmation that the file is complete, verified and \
         durable (mean ± std dev over n seeds).\n"
    );
    let _ = writeln!(
        s,
        "| sweep | x | two-ended (Mbit/s) | literal (Mbit/s) | conventional (Mbit/s) | Wi-Fi + cellular alone | two-ended ÷ sum | literal ÷ sum | conventional ÷ sum |\n|---|---|---|---|---|---|---|---|---|"
    );
    let (mut met, mut total) = (0, 0);
    let mut ratios = Vec::new();
    for sweep in ["receive-window", "send-window", "chunk"] {
        for (i, x) in points(records, sweep) {
            let at = Some((sweep, i));
            let g = |sc: &str| summary(records, at, sc, "up.goodput_mbps");
            let (two, lit, conv, wifi, cell) = (
                g("two-ended"),
                g("two-ended-literal"),
                g("conventional"),
                g("wifi-only"),
                g("cellular-only"),
            );
            let sum = wifi.mean + cell.mean;
            if sum.is_nan() || sum <= 0.0 || two.n == 0 {
                continue;
            }
            let r = two.mean / sum;
            ratios.push(r);
            total += 1;
            if r >= 0.95 {
                met += 1;
            }
            let _ = writeln!(
                s,
                "| {sweep} | {x} | {:.2} ± {:.2} (n = {}) | {:.2} ± {:.2} | {:.2} ± {:.2} | {:.2} + {:.2} | {:.3} | {:.3} | {:.3} |",
                two.mean,
                two.std,
                two.n,
                lit.mean,
                lit.std,
                conv.mean,
                conv.std,
                wifi.mean,
                cell.mean,
                r,
                lit.mean / sum,
                conv.mean / sum
            );
        }
    }
    if total > 0 {
        let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let _ = writeln!(
            s,
            "\nTwo-ended reached ≥ 95 % of the sum at {met} of {total} points (ratio {lo:.3}–{hi:.3}). \
             The literal scheme is paper Alg. 1/2 without the take-over where the lanes meet \
             (decision U6) and without the end-game copy of the other lane's last chunk (U11)."
        );
        // The mechanism, measured: how long the first lane to finish sat idle at the end.
        let at = points(records, "chunk")
            .into_iter()
            .find(|&(_, x)| x == 64.0)
            .map(|(i, _)| ("chunk", i));
        if let Some(at) = at {
            let t = |sc: &str| summary(records, Some(at), sc, "up.tail_s");
            let (two, lit) = (t("two-ended"), t("two-ended-literal"));
            if two.n > 0 && lit.n > 0 {
                let _ = writeln!(
                    s,
                    "At 64 KB chunks the first lane to finish sat idle for {:.3} ± {:.3} s \
                     (literal: {:.3} ± {:.3} s, n = {}) while the other lane's last chunks \
                     drained (`up.tail_s`).",
                    two.mean, two.std, lit.mean, lit.std, lit.n
                );
            }
        }
        // The end game where it matters most: the largest chunks, whose last one takes the
        // slow lane longest.
        let largest = points(records, "chunk")
            .into_iter()
            .max_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((i, x)) = largest {
            let at = Some(("chunk", i));
            let m = |sc: &str, metric: &str| summary(records, at, sc, metric);
            let (two, lit) = (
                m("two-ended", "up.goodput_mbps"),
                m("two-ended-literal", "up.goodput_mbps"),
            );
            let copies = m("two-ended", "up.copies");
            if two.n > 0 && lit.n > 0 && copies.n > 0 {
                let _ = writeln!(
                    s,
                    "At {x:.0} KB chunks two-ended reached {:.2} ± {:.2} Mbit/s (literal: \
                     {:.2} ± {:.2}, n = {}), sending {:.1} end-game copies per upload \
                     (`up.copies`; a copy is at most one chunk of extra bytes).",
                    two.mean, two.std, lit.mean, lit.std, lit.n, copies.mean
                );
            }
        }
        s.push('\n');
    }
    let _ = writeln!(
        s,
        "`conventional` is paper §2's MPTCP model on QUIC: one multipath connection (noq, \
         draft-ietf-quic-multipath) with a path per link, the file as one stream reassembled \
         in the server's receive window (decision U9). Windows are per connection; \
         two-ended has two.\n"
    );
    // Item 5: what the sender held unacknowledged, measured by its congestion controllers.
    let flight = points(records, "receive-window");
    if !flight.is_empty() {
        let _ = writeln!(
            s,
            "Sent and not yet acknowledged at the device, peak over the upload (KB of QUIC \
             packets, all connections or paths; `up.peak_in_flight_kb`, mean ± std dev):\n\n\
             | receive window (KB) | two-ended | literal | conventional | Wi-Fi alone | cellular alone |\n|---|---|---|---|---|---|"
        );
        for (i, x) in flight {
            let f = |sc: &str| {
                let v = summary(
                    records,
                    Some(("receive-window", i)),
                    sc,
                    "up.peak_in_flight_kb",
                );
                if v.n == 0 {
                    "–".to_string()
                } else {
                    format!("{:.0} ± {:.0}", v.mean, v.std)
                }
            };
            let _ = writeln!(
                s,
                "| {x} | {} | {} | {} | {} | {} |",
                f("two-ended"),
                f("two-ended-literal"),
                f("conventional"),
                f("wifi-only"),
                f("cellular-only")
            );
        }
        s.push('\n');
    }
    s.push_str(&held_section(records));
    s.push_str(&requirement_section(required));
    if !fault.is_empty() {
        let f = |sc: &str, m: &str| summary(fault, None, sc, m);
        let _ = writeln!(
            s,
            "### The Wi-Fi path dies 1.5 s into the upload (results/upload/fault)\n\n\
             | scheme | completed byte-identical | completion (s) | lane 1's longest stall (s) | migrations |\n|---|---|---|---|---|"
        );
        for sc in ["wifi-dies", "wifi-returns", "no-backup"] {
            let (c, t, st, mg) = (
                f(sc, "up.completed"),
                f(sc, "up.completion_s"),
                f(sc, "up.lane1_max_stall_s"),
                f(sc, "up.migrations"),
            );
            if c.n == 0 {
                continue;
            }
            let _ = writeln!(
                s,
                "| {sc} | {:.0} of {} | {:.2} ± {:.2} | {:.2} ± {:.2} | {:.1} |",
                c.mean * c.n as f64,
                c.n,
                t.mean,
                t.std,
                st.mean,
                st.std,
                mg.mean
            );
        }
        let _ = writeln!(
            s,
            "\nLane 1's longest stall includes the wait that triggers the move: no chunk \
             confirmed for max(1 s, 8 × RTT) (decision U7), after which its connection \
             continues over the cellular interface by QUIC connection migration. Without a \
             backup (`no-backup`) its requests wait for their timeout (30 s), while the other \
             lane takes over its queued chunks where they meet (decision U6) and copies the \
             one it was sending (U11), so the file completes without it."
        );
    }
    s
}
