//! The SVG figures: the paper's bar charts per case and its sweeps' line charts.

use super::reps::{find, summary, sweep_channels, sweep_point};
use crate::papers::paper003::{Case, Point, Rep, Side, Testbed, Transport};
use crate::stats::Summary;
use crate::svg::{bar_chart, line_chart, Bar, Series as Line};

/// SVG figures.
pub fn figures(points: &[Point], results: &[Vec<Rep>]) -> Vec<(String, String)> {
    const ALL: [Transport; 7] = crate::papers::paper003::TRANSPORTS;
    let mut out = Vec::new();
    let at = |case: Case, testbed: Testbed, t: Transport| {
        find(points, results, |p| {
            p.case == case && p.testbed == testbed && p.transport == t && p.sweep == "default"
        })
        .map(|(r, _)| r)
    };
    let bar = |label: String, x: Summary| Bar {
        label,
        value: x.mean,
        err: x.std,
    };
    let bars_of =
        |case: Case, testbed: Testbed, sides: &[&str], scale: f64, f: fn(&Side) -> f64| {
            let mut bars = Vec::new();
            for side in sides {
                for t in ALL {
                    if let Some(reps) = at(case, testbed, t) {
                        let x = summary(reps, side, f);
                        if x.n > 0 {
                            bars.push(bar(
                                format!("{} {side}", t.name()),
                                Summary {
                                    mean: x.mean * scale,
                                    std: x.std * scale,
                                    n: x.n,
                                },
                            ));
                        }
                    }
                }
            }
            bars
        };
    let mut push = |name: &str, title: &str, y: &str, bars: Vec<Bar>| {
        if !bars.is_empty() {
            out.push((name.to_string(), bar_chart(title, y, &bars)));
        }
    };
    push(
        "fig6-7_multi_total.svg",
        "100 connections × one message: total communication time (netsim)",
        "seconds",
        bars_of(Case::Multi, Testbed::Netsim, &["send", "recv"], 1.0, |x| {
            x.total_s
        }),
    );
    push(
        "fig8_single_total.svg",
        "1000 messages on one connection: total communication time (netsim)",
        "seconds",
        bars_of(Case::Single, Testbed::Netsim, &["send"], 1.0, |x| x.total_s),
    );
    push(
        "fig9_startup.svg",
        "Single connection: startup latency (netsim)",
        "milliseconds",
        bars_of(Case::Single, Testbed::Netsim, &["send"], 1.0, |x| {
            x.startup_ms
        }),
    );
    push(
        "fig10-11_energy.svg",
        "10 one-message connections: sender energy (netsim)",
        "joules",
        bars_of(Case::Energy, Testbed::Netsim, &["send"], 1.0, |x| {
            x.energy_j
        }),
    );
    push(
        "fig16_bytes.svg",
        "10 one-message connections: bytes on the wire (netsim)",
        "kB",
        bars_of(Case::Energy, Testbed::Netsim, &["send"], 1e-3, |x| {
            x.wire_bytes
        }),
    );
    push(
        "loopback_total.svg",
        "100 connections × one message on loopback (kernel TCP, real time)",
        "milliseconds",
        bars_of(
            Case::Multi,
            Testbed::Loopback,
            &["send", "recv"],
            1e3,
            |x| x.total_s,
        ),
    );
    for (sweep, file, x_label, x_of) in [
        (
            "delay",
            "fig12_delay.svg",
            "added one-way delay (ms)",
            (|c: &crate::papers::paper003::Channel, base_ms: f64| {
                c.delay.as_secs_f64() * 1e3 - base_ms
            }) as fn(&crate::papers::paper003::Channel, f64) -> f64,
        ),
        ("loss", "fig13_loss.svg", "loss (%)", |c, _| c.loss * 100.0),
        (
            "bandwidth",
            "fig14_bandwidth.svg",
            "channel rate (kbit/s)",
            |c, _| c.rate_bps as f64 / 1000.0,
        ),
    ] {
        let chs = sweep_channels(points, sweep);
        // The delay sweep adds to the channel's own delay: its smallest point.
        let base_ms = chs
            .iter()
            .map(|c| c.delay.as_secs_f64() * 1e3)
            .fold(f64::INFINITY, f64::min);
        let x_of = |c: &crate::papers::paper003::Channel| x_of(c, base_ms);
        let lines: Vec<Line> = ALL
            .iter()
            .map(|&t| Line {
                name: t.name().into(),
                points: chs
                    .iter()
                    .filter_map(|c| {
                        sweep_point(points, results, sweep, c, t)
                            .map(|r| (x_of(c), summary(r, "send", |x| x.total_s).mean))
                    })
                    .collect(),
            })
            .filter(|l| !l.points.is_empty())
            .collect();
        if !lines.is_empty() {
            out.push((
                file.into(),
                line_chart(
                    &format!("10 one-message connections: total time vs {sweep} (netsim)"),
                    x_label,
                    "seconds",
                    &lines,
                ),
            ));
        }
    }
    let chs = sweep_channels(points, "bandwidth");
    let lines: Vec<Line> = ALL
        .iter()
        .map(|&t| Line {
            name: t.name().into(),
            points: chs
                .iter()
                .filter_map(|c| {
                    sweep_point(points, results, "bandwidth", c, t).map(|r| {
                        (
                            c.rate_bps as f64 / 1000.0,
                            summary(r, "send", |x| x.wire_bytes).mean / 1000.0,
                        )
                    })
                })
                .collect(),
        })
        .filter(|l| !l.points.is_empty())
        .collect();
    if !lines.is_empty() {
        out.push((
            "fig15_bytes_vs_bandwidth.svg".into(),
            line_chart(
                "10 one-message connections: bytes on the wire vs channel rate (netsim)",
                "channel rate (kbit/s)",
                "kB",
                &lines,
            ),
        ));
    }
    out
}
