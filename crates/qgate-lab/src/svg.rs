//! Minimal SVG charts for result figures: line charts and bar charts with error bars. Plain text
//! out, no dependencies; every chart has a title, labelled axes with ticks, and a legend.

use std::fmt::Write;

const W: f64 = 760.0;
const H: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 55.0;
const COLORS: &[&str] = &[
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// One line of a line chart.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend name.
    pub name: String,
    /// (x, y) points in order of x.
    pub points: Vec<(f64, f64)>,
}

/// One bar of a bar chart.
#[derive(Debug, Clone)]
pub struct Bar {
    /// Label under the bar.
    pub label: String,
    /// Height.
    pub value: f64,
    /// Half-height of the error bar (a standard deviation); 0 for none.
    pub err: f64,
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Round tick steps: 1, 2, 5 × 10^k, about `n` of them over [lo, hi].
fn ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    let span = (hi - lo).max(1e-12);
    let raw = span / n as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| span / s <= n as f64)
        .unwrap_or(10.0 * mag);
    let mut t = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while t <= hi + step * 1e-9 {
        out.push(if t.abs() < step * 1e-9 { 0.0 } else { t });
        t += step;
    }
    out
}

fn fmt_tick(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 1000.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}").trim_end_matches('0').to_string()
    }
}

fn frame(out: &mut String, title: &str, x_label: &str, y_label: &str) {
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">
<rect width="{W}" height="{H}" fill="white"/>
<text x="{}" y="22" text-anchor="middle" font-size="14">{}</text>
<text x="{}" y="{}" text-anchor="middle">{}</text>
<text transform="translate(18,{}) rotate(-90)" text-anchor="middle">{}</text>
"#,
        W / 2.0,
        esc(title),
        (LEFT + W - RIGHT) / 2.0,
        H - 12.0,
        esc(x_label),
        (TOP + H - BOTTOM) / 2.0,
        esc(y_label)
    );
}

/// A horizontal grid line at `y` with its tick label on the left.
fn y_gridline(out: &mut String, y: f64, label: &str) {
    let _ = writeln!(
        out,
        r##"<line x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#e5e5e5"/><text x="{}" y="{:.1}" text-anchor="end">{label}</text>"##,
        W - RIGHT,
        LEFT - 6.0,
        y + 4.0,
    );
}

fn y_axis(out: &mut String, y_lo: f64, y_hi: f64) -> impl Fn(f64) -> f64 {
    let (top, bottom) = (TOP, H - BOTTOM);
    let sy = move |y: f64| bottom - (y - y_lo) / (y_hi - y_lo).max(1e-12) * (bottom - top);
    for t in ticks(y_lo, y_hi, 6) {
        y_gridline(out, sy(t), &fmt_tick(t));
    }
    let _ = writeln!(
        out,
        r##"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{bottom}" stroke="#333"/><line x1="{LEFT}" y1="{bottom}" x2="{}" y2="{bottom}" stroke="#333"/>"##,
        W - RIGHT
    );
    sy
}

fn legend(out: &mut String, names: &[&str]) {
    for (i, name) in names.iter().enumerate() {
        let y = TOP + 10.0 + i as f64 * 20.0;
        let x = W - RIGHT + 15.0;
        let _ = writeln!(
            out,
            r#"<rect x="{x}" y="{}" width="14" height="4" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            y - 2.0,
            COLORS[i % COLORS.len()],
            x + 20.0,
            y + 4.0,
            esc(name)
        );
    }
}

/// A line chart of `series` (y axis from 0 unless values are negative).
pub fn line_chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let pts = series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .filter(|(x, y)| x.is_finite() && y.is_finite());
    let (mut x_lo, mut x_hi, mut y_lo, mut y_hi) = (f64::MAX, f64::MIN, 0.0f64, f64::MIN);
    for (x, y) in pts {
        x_lo = x_lo.min(x);
        x_hi = x_hi.max(x);
        y_lo = y_lo.min(y);
        y_hi = y_hi.max(y);
    }
    if x_lo > x_hi {
        (x_lo, x_hi, y_hi) = (0.0, 1.0, 1.0);
    }
    if y_hi <= y_lo {
        y_hi = y_lo + 1.0;
    }
    y_hi *= 1.05;
    let mut out = String::new();
    frame(&mut out, title, x_label, y_label);
    let sy = y_axis(&mut out, y_lo, y_hi);
    let sx = |x: f64| LEFT + (x - x_lo) / (x_hi - x_lo).max(1e-12) * (W - RIGHT - LEFT);
    for t in ticks(x_lo, x_hi, 8) {
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            sx(t),
            H - BOTTOM + 16.0,
            fmt_tick(t)
        );
    }
    for (i, s) in series.iter().enumerate() {
        let d: Vec<String> = s
            .points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(*y)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{}" stroke-width="1.6" points="{}"/>"#,
            COLORS[i % COLORS.len()],
            d.join(" ")
        );
    }
    legend(
        &mut out,
        &series.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
    );
    out.push_str("</svg>\n");
    out
}

/// A bar chart with error bars (± `err`).
pub fn bar_chart(title: &str, y_label: &str, bars: &[Bar]) -> String {
    let y_hi = bars
        .iter()
        .map(|b| b.value + b.err)
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.1;
    let mut out = String::new();
    frame(&mut out, title, "", y_label);
    let sy = y_axis(&mut out, 0.0, y_hi);
    let n = bars.len().max(1) as f64;
    let slot = (W - RIGHT - LEFT) / n;
    for (i, b) in bars.iter().enumerate() {
        let x = LEFT + slot * i as f64 + slot * 0.2;
        let w = slot * 0.6;
        let color = COLORS[i % COLORS.len()];
        let _ = writeln!(
            out,
            r#"<rect x="{x:.1}" y="{:.1}" width="{w:.1}" height="{:.1}" fill="{color}"/><text transform="translate({:.1},{}) rotate({})" text-anchor="{}">{}</text><text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10">{}</text>"#,
            sy(b.value),
            (sy(0.0) - sy(b.value)).max(0.0),
            x + w / 2.0,
            H - BOTTOM + 16.0,
            // Many bars: slant the labels so they do not run into each other.
            if bars.len() > 6 { -25 } else { 0 },
            if bars.len() > 6 { "end" } else { "middle" },
            esc(&b.label),
            x + w / 2.0,
            sy(b.value + b.err) - 5.0,
            fmt_tick((b.value * 100.0).round() / 100.0)
        );
        if b.err > 0.0 {
            let cx = x + w / 2.0;
            let _ = writeln!(
                out,
                r##"<line x1="{cx:.1}" y1="{:.1}" x2="{cx:.1}" y2="{:.1}" stroke="#222"/><line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#222"/><line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#222"/>"##,
                sy((b.value - b.err).max(0.0)),
                sy(b.value + b.err),
                cx - 6.0,
                sy(b.value + b.err),
                cx + 6.0,
                sy(b.value + b.err),
                cx - 6.0,
                sy((b.value - b.err).max(0.0)),
                cx + 6.0,
                sy((b.value - b.err).max(0.0)),
            );
        }
    }
    out.push_str("</svg>\n");
    out
}

/// One line with a band around it (a confidence interval, or min–max over seeds).
#[derive(Debug, Clone)]
pub struct Band {
    /// Legend name.
    pub name: String,
    /// (x, y, band low, band high) in order of x.
    pub points: Vec<(f64, f64, f64, f64)>,
}

/// Axis scales of a [`band_chart`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Scales {
    /// Logarithmic x.
    pub log_x: bool,
    /// Logarithmic y.
    pub log_y: bool,
}

/// Dash patterns, so a line drawn on top of another still shows the one under it.
const DASHES: &[&str] = &["", "7 4", "2 3", "10 3 2 3", "4 4", "1 5"];

/// Whether values spanning `lo..hi` (positive) are better read on a log axis: over two decades.
pub fn wants_log(lo: f64, hi: f64) -> bool {
    lo > 0.0 && hi / lo > 100.0
}

/// Ticks of a log axis over [lo, hi] (exponents): whole decades.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let (a, b) = (lo.floor() as i32, hi.ceil() as i32);
    (a..=b)
        .map(f64::from)
        .filter(|t| *t >= lo - 1e-9 && *t <= hi + 1e-9)
        .collect()
}

/// A line chart with bands: each series a line (its own colour, dash pattern and markers) over
/// a translucent band; optional log axes (non-positive values are left out on a log axis).
pub fn band_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Band],
    scales: Scales,
) -> String {
    let fx = |x: f64| if scales.log_x { x.log10() } else { x };
    let fy = |y: f64| if scales.log_y { y.log10() } else { y };
    let ok = |v: f64, log: bool| v.is_finite() && (!log || v > 0.0);
    let (mut x_lo, mut x_hi, mut y_lo, mut y_hi) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for s in series {
        for &(x, y, lo, hi) in &s.points {
            if !ok(x, scales.log_x) {
                continue;
            }
            x_lo = x_lo.min(fx(x));
            x_hi = x_hi.max(fx(x));
            for v in [y, lo, hi] {
                if ok(v, scales.log_y) {
                    y_lo = y_lo.min(fy(v));
                    y_hi = y_hi.max(fy(v));
                }
            }
        }
    }
    if x_lo > x_hi {
        (x_lo, x_hi) = (0.0, 1.0);
    }
    if y_lo > y_hi {
        (y_lo, y_hi) = (0.0, 1.0);
    }
    if !scales.log_y {
        y_lo = y_lo.min(0.0);
    }
    if y_hi <= y_lo {
        y_hi = y_lo + 1.0;
    }
    if x_hi <= x_lo {
        (x_lo, x_hi) = (x_lo - 0.5, x_hi + 0.5);
    }
    let pad = (y_hi - y_lo) * 0.05;
    let (y_lo, y_hi) = if scales.log_y {
        (y_lo - pad, y_hi + pad)
    } else {
        (y_lo, y_hi + pad)
    };
    let mut out = String::new();
    frame(&mut out, title, x_label, y_label);
    let (top, bottom) = (TOP, H - BOTTOM);
    let sy = move |y: f64| bottom - (y - y_lo) / (y_hi - y_lo).max(1e-12) * (bottom - top);
    let sx = |x: f64| LEFT + (x - x_lo) / (x_hi - x_lo).max(1e-12) * (W - RIGHT - LEFT);
    let label = |v: f64, log: bool| {
        if log {
            fmt_tick(10f64.powf(v))
        } else {
            fmt_tick(v)
        }
    };
    let yt = if scales.log_y {
        log_ticks(y_lo, y_hi)
    } else {
        ticks(y_lo, y_hi, 6)
    };
    for t in yt {
        y_gridline(&mut out, sy(t), &label(t, scales.log_y));
    }
    let xt = if scales.log_x {
        log_ticks(x_lo, x_hi)
    } else {
        ticks(x_lo, x_hi, 8)
    };
    for t in xt {
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
            sx(t),
            H - BOTTOM + 16.0,
            label(t, scales.log_x)
        );
    }
    let _ = writeln!(
        out,
        r##"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{bottom}" stroke="#333"/><line x1="{LEFT}" y1="{bottom}" x2="{}" y2="{bottom}" stroke="#333"/>"##,
        W - RIGHT
    );
    let clamp = |y: f64| sy(y.clamp(y_lo, y_hi));
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<(f64, f64, f64, f64)> = s
            .points
            .iter()
            .filter(|p| ok(p.0, scales.log_x) && ok(p.1, scales.log_y))
            .map(|&(x, y, lo, hi)| {
                let lo = if ok(lo, scales.log_y) { fy(lo) } else { fy(y) };
                let hi = if ok(hi, scales.log_y) { fy(hi) } else { fy(y) };
                (fx(x), fy(y), lo, hi)
            })
            .collect();
        if pts.iter().any(|p| p.3 > p.2) {
            let upper = pts
                .iter()
                .map(|p| format!("{:.1},{:.1}", sx(p.0), clamp(p.3)));
            let lower = pts
                .iter()
                .rev()
                .map(|p| format!("{:.1},{:.1}", sx(p.0), clamp(p.2)));
            let _ = writeln!(
                out,
                r#"<polygon fill="{color}" fill-opacity="0.15" stroke="none" points="{}"/>"#,
                upper.chain(lower).collect::<Vec<_>>().join(" ")
            );
        }
        let d: Vec<String> = pts
            .iter()
            .map(|p| format!("{:.1},{:.1}", sx(p.0), clamp(p.1)))
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.8" stroke-dasharray="{}" points="{}"/>"#,
            DASHES[i % DASHES.len()],
            d.join(" ")
        );
        if pts.len() <= 40 {
            for p in &pts {
                let _ = writeln!(
                    out,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="{}" fill="{color}"/>"#,
                    sx(p.0),
                    clamp(p.1),
                    2.0 + (i % 3) as f64
                );
            }
        }
    }
    for (i, s) in series.iter().enumerate() {
        let y = TOP + 10.0 + i as f64 * 20.0;
        let x = W - RIGHT + 15.0;
        let _ = writeln!(
            out,
            r#"<line x1="{x}" y1="{y}" x2="{}" y2="{y}" stroke="{}" stroke-width="2" stroke-dasharray="{}"/><text x="{}" y="{}">{}</text>"#,
            x + 18.0,
            COLORS[i % COLORS.len()],
            DASHES[i % DASHES.len()],
            x + 24.0,
            y + 4.0,
            esc(&s.name)
        );
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round() {
        assert_eq!(ticks(0.0, 10.0, 5), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        // At most n intervals on a 1-2-5 step: 0.9 over at most 4 → steps of 0.5.
        assert_eq!(ticks(0.0, 0.9, 4), vec![0.0, 0.5]);
        assert_eq!(ticks(0.0, 0.9, 10).len(), 10);
    }

    #[test]
    fn band_charts_draw_bands_dashes_and_log_ticks() {
        let b = band_chart(
            "t",
            "x",
            "y",
            &[
                Band {
                    name: "a".into(),
                    points: vec![(1.0, 1.0, 0.5, 2.0), (10.0, 1000.0, 900.0, 1100.0)],
                },
                Band {
                    name: "b".into(),
                    points: vec![(1.0, 1.0, 1.0, 1.0), (10.0, 1000.0, 1000.0, 1000.0)],
                },
            ],
            Scales {
                log_x: false,
                log_y: true,
            },
        );
        assert_eq!(
            b.matches("<polygon").count(),
            1,
            "only the series with a band"
        );
        assert!(b.contains(r#"stroke-dasharray="7 4""#));
        assert!(b.contains(">1000<") && b.contains(">100<") && b.contains(">10<"));
        assert!(wants_log(0.5, 1000.0) && !wants_log(1.0, 50.0) && !wants_log(0.0, 10.0));
    }

    #[test]
    fn charts_are_well_formed() {
        let l = line_chart(
            "t <1>",
            "x",
            "y",
            &[Series {
                name: "a&b".into(),
                points: vec![(0.0, 1.0), (1.0, 2.0)],
            }],
        );
        assert!(l.starts_with("<svg") && l.ends_with("</svg>\n"));
        assert!(l.contains("t &lt;1&gt;") && l.contains("a&amp;b") && l.contains("<polyline"));
        let b = bar_chart(
            "bars",
            "ms",
            &[Bar {
                label: "x".into(),
                value: 3.0,
                err: 1.0,
            }],
        );
        assert_eq!(b.matches("<rect").count(), 2); // background + bar
    }
}
