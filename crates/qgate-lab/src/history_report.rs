//! Result files of `qgate lab history`: results.csv, summary.md and SVG figures.

use std::fmt::Write as _;
use std::path::Path;

use crate::history::{human, Run, Scheme, Series};
use crate::stats::Summary;
use crate::svg::{bar_chart, line_chart, Bar, Series as Line};

/// results.csv: one row per download.
pub fn results_csv(series: &[Series], runs: &[Vec<Run>]) -> String {
    let mut s = String::from("experiment,network,bytes,scheme,background,safeguard,seed,run,network_now,latency_s,loss_ratio,initial_window,from_history,fell_back\n");
    for (sr, rs) in series.iter().zip(runs) {
        for r in rs {
            let _ = writeln!(
                s,
                "{},{},{},{},{},{},{},{},{},{:.4},{:.5},{},{},{}",
                sr.experiment,
                sr.net.name,
                sr.bytes,
                sr.scheme.name(),
                sr.background,
                sr.safeguard,
                sr.seed,
                r.run,
                r.net,
                r.latency_s,
                r.loss_ratio,
                r.initial_window,
                r.from_history,
                r.fell_back
            );
        }
    }
    s
}

/// Welch's t statistic of mean(a) − mean(b).
fn welch_t(a: &Summary, b: &Summary) -> f64 {
    let se = (a.std.powi(2) / a.n as f64 + b.std.powi(2) / b.n as f64).sqrt();
    if se == 0.0 {
        0.0
    } else {
        (a.mean - b.mean) / se
    }
}

fn lat(rs: &[Run]) -> Summary {
    Summary::of(&rs.iter().map(|r| r.latency_s).collect::<Vec<_>>())
}

fn loss(rs: &[Run]) -> Summary {
    Summary::of(&rs.iter().map(|r| r.loss_ratio).collect::<Vec<_>>())
}

fn find<'a>(
    series: &[Series],
    runs: &'a [Vec<Run>],
    f: impl Fn(&Series) -> bool,
) -> Option<&'a [Run]> {
    series.iter().position(f).map(|i| runs[i].as_slice())
}

/// The latency change of `h` against `d` (negative = faster) with Welch's t.
fn reduction(d: &Summary, h: &Summary) -> String {
    let r = (h.mean / d.mean - 1.0) * 100.0;
    format!("{r:+.1} % (t = {:.1})", welch_t(h, d))
}

/// summary.md.
pub fn summary_md(series: &[Series], runs: &[Vec<Run>], command: &str) -> String {
    let mut s = String::from(
        "# qgate lab history — initial congestion window from history (paper 002)\n\n",
    );
    let _ = writeln!(
        s,
        "Reproduce: `{command}` (deterministic for the same options).\n"
    );
    let nruns = series.first().map_or(0, |x| x.runs);
    let _ = writeln!(s, "Setup: client —(100 Mbit/s, 1 ms)— router —(100 Mbit/s, RTT/2 − 1 ms, random loss on the data direction, drop-tail 1000)— server; the server sends (1 MB or 10 MB) on a new 1-RTT QUIC connection per run (quinn, CUBIC, default initial window 12 000 B), {nruns} runs per series, one after another, so each history run starts from the windows recorded by the runs before it (the first run of a series has none). Latency = client's connect() → last byte received. Loss ratio = packets the server declared lost ÷ packets it sent. All schemes at a point share the random-loss seed (paired). History: max(default, average window recorded at connection close), ceiling 1 MiB; EWMA weight 0.25. `t` is Welch's t of the difference (|t| > 2 ≈ significant at 5 %).\n");

    let _ = writeln!(s, "## Simple topology (paper Figs. 9, 10, 12–14)\n");
    let _ = writeln!(s, "| network | size | default latency s | history-mean s | history-ewma s | mean vs default | ewma vs default | loss ratio default / mean / ewma |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
    let mut nets: Vec<&'static str> = Vec::new();
    let mut sizes: Vec<u64> = Vec::new();
    for x in series.iter().filter(|x| x.experiment == "simple") {
        if !nets.contains(&x.net.name) {
            nets.push(x.net.name);
        }
        if !sizes.contains(&x.bytes) {
            sizes.push(x.bytes);
        }
    }
    let mut simple_rows = Vec::new();
    for &net in &nets {
        for &bytes in &sizes {
            let get = |sc: Scheme| {
                find(series, runs, |x| {
                    x.experiment == "simple"
                        && x.net.name == net
                        && x.bytes == bytes
                        && x.scheme == sc
                })
            };
            let (Some(d), Some(m), Some(e)) =
                (get(Scheme::Default), get(Scheme::Mean), get(Scheme::Ewma))
            else {
                continue;
            };
            let (ld, lm, le) = (lat(d), lat(m), lat(e));
            let _ = writeln!(
                s,
                "| {net} | {} | {:.3} ± {:.3} (n = {}) | {:.3} ± {:.3} | {:.3} ± {:.3} | {} | {} | {:.4} / {:.4} / {:.4} |",
                human(bytes), ld.mean, ld.std, ld.n, lm.mean, lm.std, le.mean, le.std,
                reduction(&ld, &lm), reduction(&ld, &le), loss(d).mean, loss(m).mean, loss(e).mean
            );
            simple_rows.push((net, bytes, ld, lm, le));
        }
    }

    let _ = writeln!(
        s,
        "\n## Dumbbell: 1 MB beside competing bulk flows (paper Fig. 15)\n"
    );
    let _ = writeln!(s, "| network | background flows | default s | history-mean s | history-ewma s | mean vs default | ewma vs default |");
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    let mut dumbbell = Vec::new();
    for x in series
        .iter()
        .filter(|x| x.experiment == "dumbbell" && x.scheme == Scheme::Default)
    {
        let get = |sc: Scheme| {
            find(series, runs, |y| {
                y.experiment == "dumbbell"
                    && y.net.name == x.net.name
                    && y.background == x.background
                    && y.scheme == sc
            })
        };
        let (Some(d), Some(m), Some(e)) =
            (get(Scheme::Default), get(Scheme::Mean), get(Scheme::Ewma))
        else {
            continue;
        };
        let (ld, lm, le) = (lat(d), lat(m), lat(e));
        let _ = writeln!(
            s,
            "| {} | {} | {:.3} ± {:.3} | {:.3} ± {:.3} | {:.3} ± {:.3} | {} | {} |",
            x.net.name,
            x.background,
            ld.mean,
            ld.std,
            lm.mean,
            lm.std,
            le.mean,
            le.std,
            reduction(&ld, &lm),
            reduction(&ld, &le)
        );
        dumbbell.push((x.net.name, x.background, ld, lm, le));
    }

    let _ = writeln!(
        s,
        "\n## Good → bad: a history from a good network reused on a bad one (beyond the paper)\n"
    );
    let _ = writeln!(s, "| variant | runs after the change | latency s | loss ratio | initial window B (mean) | safeguard fell back |");
    let _ = writeln!(s, "|---|---|---|---|---|---|");
    let mut change = Vec::new();
    for x in series.iter().filter(|x| x.experiment == "change") {
        let rs = find(series, runs, |y| {
            y.experiment == "change" && y.scheme == x.scheme && y.safeguard == x.safeguard
        })
        .unwrap_or(&[]);
        let at = x.change.map_or(0, |c| c.1);
        let after: Vec<Run> = rs.iter().filter(|r| r.run >= at).cloned().collect();
        let name = match (x.scheme, x.safeguard) {
            (Scheme::Default, _) => "default".to_string(),
            (sc, false) => format!("{} (no safeguard)", sc.name()),
            (sc, true) => format!("{} + safeguard", sc.name()),
        };
        let (l, ls) = (lat(&after), loss(&after));
        let iw = Summary::of(
            &after
                .iter()
                .map(|r| r.initial_window as f64)
                .collect::<Vec<_>>(),
        );
        let fb = after.iter().filter(|r| r.fell_back).count();
        let _ = writeln!(
            s,
            "| {name} | {} | {:.3} ± {:.3} | {:.4} ± {:.4} | {:.0} | {fb} of {} |",
            after.len(),
            l.mean,
            l.std,
            ls.mean,
            ls.std,
            iw.mean,
            after.len()
        );
        change.push((name, l, ls));
    }

    let _ = writeln!(s, "\n## Against paper 002\n");
    let _ = writeln!(s, "| claim | paper | ours (EWMA / mean) | verdict |");
    let _ = writeln!(s, "|---|---|---|---|");
    for (net, bytes, paper) in [
        ("good", 1_000_000u64, -31.0),
        ("average", 1_000_000, -38.0),
        ("good", 10_000_000, -13.0),
        ("average", 10_000_000, -9.0),
    ] {
        if let Some((_, _, d, m, e)) = simple_rows.iter().find(|r| r.0 == net && r.1 == bytes) {
            let re = (e.mean / d.mean - 1.0) * 100.0;
            let rm = (m.mean / d.mean - 1.0) * 100.0;
            let sig = welch_t(e, d).abs() > 2.0 || welch_t(m, d).abs() > 2.0;
            let verdict = if re < 0.0 && rm < 0.0 {
                if sig {
                    "agrees in direction (significant)"
                } else {
                    "agrees in direction, **not significant** at this n"
                }
            } else {
                "**differs**"
            };
            let _ = writeln!(s, "| {} {net}: latency change | {paper:+.0} % | {re:+.1} % / {rm:+.1} % | {verdict} |", human(bytes));
        }
    }
    for (net, bytes) in [("bad", 1_000_000u64), ("bad", 10_000_000)] {
        if let Some((_, _, d, m, e)) = simple_rows.iter().find(|r| r.0 == net && r.1 == bytes) {
            let re = (e.mean / d.mean - 1.0) * 100.0;
            let rm = (m.mean / d.mean - 1.0) * 100.0;
            let same = welch_t(e, d).abs() < 2.0 && welch_t(m, d).abs() < 2.0;
            let _ = writeln!(s, "| {} bad: ≈ unchanged (history below default) | ≈ 0 % | {re:+.1} % / {rm:+.1} % | {} |", human(bytes), if same { "agrees (no significant change)" } else { "**differs**" });
        }
    }
    for (net, paper) in [("good", -22.0), ("average", -31.0)] {
        let rows: Vec<_> = dumbbell.iter().filter(|r| r.0 == net).collect();
        if !rows.is_empty() {
            let re: Vec<String> = rows
                .iter()
                .map(|r| format!("{} bg {:+.0} %", r.1, (r.4.mean / r.2.mean - 1.0) * 100.0))
                .collect();
            let all_down = rows.iter().all(|r| r.4.mean < r.2.mean);
            let _ = writeln!(
                s,
                "| dumbbell 1MB {net} | {paper:+.0} % | EWMA: {} | {} |",
                re.join(", "),
                if all_down {
                    "agrees in direction"
                } else {
                    "**differs** at some points"
                }
            );
        }
    }
    let _ = writeln!(s);
    s.push_str("## Why we differ where we do\n\n");
    // The windows the history actually offered, per network (EWMA, 1 MB, runs that used it).
    let offered: Vec<String> = nets
        .iter()
        .filter_map(|net| {
            let rs = find(series, runs, |x| {
                x.experiment == "simple"
                    && x.net.name == *net
                    && x.bytes == 1_000_000
                    && x.scheme == Scheme::Ewma
            })?;
            let used: Vec<f64> = rs
                .iter()
                .filter(|r| r.from_history)
                .map(|r| r.initial_window as f64)
                .collect();
            Some(if used.is_empty() {
                format!(
                    "{net}: never above the default ({} of {} runs used the default)",
                    rs.len(),
                    rs.len()
                )
            } else {
                let m = Summary::of(&used);
                format!(
                    "{net}: {:.0} B ({:.1}× the default) in {} of {} runs",
                    m.mean,
                    m.mean / 12_000.0,
                    used.len(),
                    rs.len()
                )
            })
        })
        .collect();
    let _ = writeln!(
        s,
        "- **What the history offers.** Random loss keeps CUBIC's window near the Mathis limit (≈ 1.22/√p packets), so the windows recorded at close — and hence the initial windows offered — are modest: {}. A larger first window saves the first round trips of slow start: that is much of a 1 MB transfer at 38 ms, and little of a 10 MB one, which spends most of its time in loss-limited congestion avoidance where the initial window no longer matters (compare the 1 MB and 10 MB rows). The smaller the offered window relative to the default, the smaller the gain, and the more of it is hidden by the run-to-run spread at n = {nruns}. The paper does not describe its loss model or QUIC stack precisely enough to tell why its recorded windows (and gains) were larger where ours are not.",
        offered.join("; ")
    );
    s.push_str("- **Loss dominates latency.** A transfer's latency varies by a factor of several from run to run with where the random losses fall (a tail loss costs a probe timeout); the std columns show it. Paired seeds (every scheme sees the same losses in its first run) remove part of that variance; the `t` values say which differences stand out.\n");
    s.push_str("- **Bad network.** The recorded windows stay below the default, so both history schemes start every connection at the default and, with paired seeds, reproduce the default's runs exactly — the paper's \"≈ unchanged\".\n");
    if let (Some(d), Some(h), Some(g)) = (
        change.iter().find(|c| c.0 == "default"),
        change.iter().find(|c| c.0.contains("no safeguard")),
        change.iter().find(|c| c.0.contains("+ safeguard")),
    ) {
        let storm = h.2.mean > d.2.mean * 1.2 && welch_t(&h.2, &d.2) > 2.0;
        let _ = writeln!(
            s,
            "- **Good → bad.** Reusing the good network's history on the bad one gave a loss ratio of {:.4} against the default's {:.4} (t = {:.1}) and a latency change of {:+.1} %: {}. With the safeguard (fall back when the first RTT sample exceeds 2 × the recorded minimum RTT) the loss ratio was {:.4} and the latency change {:+.1} % against the default.",
            h.2.mean, d.2.mean, welch_t(&h.2, &d.2), (h.1.mean / d.1.mean - 1.0) * 100.0,
            if storm { "a loss storm — the safeguard is needed" } else { "no loss storm at these window sizes, because a window learnt under 1 % loss is only a few times the default" },
            g.2.mean, (g.1.mean / d.1.mean - 1.0) * 100.0
        );
    }
    s
}

/// The figures.
pub fn figures(series: &[Series], runs: &[Vec<Run>]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for bytes in [1_000_000u64, 10_000_000] {
        for net in ["good", "average", "bad"] {
            let bars: Vec<Bar> = series
                .iter()
                .zip(runs)
                .filter(|(x, _)| x.experiment == "simple" && x.bytes == bytes && x.net.name == net)
                .map(|(x, rs)| {
                    let l = lat(rs);
                    Bar {
                        label: x.scheme.name().into(),
                        value: l.mean,
                        err: l.std,
                    }
                })
                .collect();
            if !bars.is_empty() {
                out.push((
                    format!("latency_{}_{net}.svg", human(bytes)),
                    bar_chart(
                        &format!(
                            "{} download latency, {net} network (mean ± std)",
                            human(bytes)
                        ),
                        "latency (s)",
                        &bars,
                    ),
                ));
            }
        }
    }
    let loss_bars: Vec<Bar> = series
        .iter()
        .zip(runs)
        .filter(|(x, _)| x.experiment == "simple" && x.bytes == 1_000_000)
        .map(|(x, rs)| {
            let l = loss(rs);
            Bar {
                label: format!(
                    "{}/{}",
                    x.net.name,
                    x.scheme.name().trim_start_matches("history-")
                ),
                value: l.mean * 100.0,
                err: l.std * 100.0,
            }
        })
        .collect();
    out.push((
        "loss_ratio_1MB.svg".into(),
        bar_chart(
            "1MB: packets lost ÷ sent by the server (mean ± std)",
            "loss ratio (%)",
            &loss_bars,
        ),
    ));
    for net in ["good", "average"] {
        let lines: Vec<Line> = [Scheme::Default, Scheme::Mean, Scheme::Ewma]
            .iter()
            .map(|sc| Line {
                name: sc.name().into(),
                points: series
                    .iter()
                    .zip(runs)
                    .filter(|(x, _)| {
                        x.experiment == "dumbbell" && x.net.name == net && x.scheme == *sc
                    })
                    .map(|(x, rs)| (x.background as f64, lat(rs).mean))
                    .collect(),
            })
            .filter(|l| !l.points.is_empty())
            .collect();
        if !lines.is_empty() {
            out.push((
                format!("dumbbell_{net}.svg"),
                line_chart(
                    &format!("Dumbbell, {net} network: 1MB latency vs background flows"),
                    "background bulk flows",
                    "latency (s)",
                    &lines,
                ),
            ));
        }
    }
    let change: Vec<Line> = series
        .iter()
        .zip(runs)
        .filter(|(x, _)| x.experiment == "change")
        .map(|(x, rs)| Line {
            name: format!(
                "{}{}",
                x.scheme.name(),
                if x.safeguard { " + safeguard" } else { "" }
            ),
            points: rs
                .iter()
                .map(|r| (r.run as f64 + 1.0, r.latency_s))
                .collect(),
        })
        .collect();
    if !change.is_empty() {
        out.push((
            "good_to_bad_latency.svg".into(),
            line_chart(
                "Good → bad network at mid-series: 1MB latency per run",
                "run",
                "latency (s)",
                &change,
            ),
        ));
    }
    out
}

/// Write every file.
pub fn write_all(
    dir: &Path,
    series: &[Series],
    runs: &[Vec<Run>],
    command: &str,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("results.csv"), results_csv(series, runs))?;
    std::fs::write(dir.join("summary.md"), summary_md(series, runs, command))?;
    for (name, svg) in figures(series, runs) {
        std::fs::write(dir.join(name), svg)?;
    }
    Ok(())
}
