//! A plan's results directory: `results.csv` (one row per run and metric), `series.csv` and,
//! when asked, `samples.csv` (what figures are drawn from), `summary.md` (mean ± std dev, n, distinct
//! outcomes, and each scheme against the first with a 95 % confidence interval and Welch's
//! p-value), SVG figures, and `provenance.toml`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::run::Record;
use super::spec::{Figure, FigureKind};
use super::{At, Loaded};
use crate::stats::{ci95_half, Summary, Welch};
use crate::svg;

/// Where results came from.
#[derive(Debug, Clone)]
pub struct Provenance {
    /// The command line.
    pub command: String,
    /// Threads used.
    pub jobs: usize,
    /// Wall-clock time of all runs, s.
    pub wall_s: f64,
    /// Seeds per run.
    pub seeds: u64,
    /// Whether `--quick` was given.
    pub quick: bool,
    /// Write `samples.csv` (every request's or download's value: large for big plans).
    pub samples: bool,
}

/// qgate's version and the commit it was built from.
pub fn version() -> String {
    qgate::VERSION.to_string()
}

/// SHA-256 of the plan text, hex.
pub fn plan_hash(text: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, text.as_bytes())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Four significant digits, no exponent for everyday magnitudes.
fn sig(v: f64) -> String {
    if !v.is_finite() {
        return "–".into();
    }
    if v == 0.0 {
        return "0".into();
    }
    let mag = v.abs().log10().floor() as i32;
    if !(-4..=8).contains(&mag) {
        return format!("{v:.3e}");
    }
    let decimals = (3 - mag).max(0) as usize;
    format!("{v:.decimals$}")
}

fn pval(p: f64) -> String {
    if p < 0.001 {
        "< 0.001".into()
    } else {
        format!("{p:.3}")
    }
}

/// The axis label of the sweep called `name`.
fn label_of(loaded: &Loaded, name: &str) -> String {
    loaded
        .plan
        .sweep
        .iter()
        .find(|s| s.name == name)
        .map(|s| s.label.clone())
        .unwrap_or_default()
}

/// The results of one plan, grouped.
struct Table<'a> {
    schemes: Vec<String>,
    points: Vec<Option<At>>,
    records: &'a [Record],
}

impl<'a> Table<'a> {
    fn new(loaded: &Loaded, records: &'a [Record]) -> Table<'a> {
        let mut points = Vec::new();
        for r in records {
            if !points.contains(&r.point) {
                points.push(r.point.clone());
            }
        }
        // The plan's schemes that ran (a filter such as `--only` leaves some out).
        let schemes = loaded
            .scheme_names()
            .into_iter()
            .filter(|s| records.iter().any(|r| &r.scheme == s))
            .collect();
        Table {
            schemes,
            points,
            records,
        }
    }

    /// One band per scheme at `point`, its points computed by `points` from that scheme's
    /// runs; `None` when no scheme has any point (nothing to draw).
    fn bands(
        &self,
        point: &Option<At>,
        points: impl Fn(&[&'a Record]) -> Vec<(f64, f64, f64, f64)>,
    ) -> Option<Vec<svg::Band>> {
        let bands: Vec<svg::Band> = self
            .schemes
            .iter()
            .map(|sc| svg::Band {
                name: sc.clone(),
                points: points(&self.runs(sc, point)),
            })
            .collect();
        (!bands.iter().all(|b| b.points.is_empty())).then_some(bands)
    }

    fn runs(&self, scheme: &str, point: &Option<At>) -> Vec<&'a Record> {
        self.records
            .iter()
            .filter(|r| r.scheme == scheme && &r.point == point)
            .collect()
    }

    fn values(&self, scheme: &str, point: &Option<At>, metric: &str) -> Vec<f64> {
        self.runs(scheme, point)
            .iter()
            .filter_map(|r| r.scalars.get(metric).copied())
            .filter(|v| v.is_finite())
            .collect()
    }
}

/// Whether metric `name` matches `pattern`, where each `*` stands for any run of characters
/// (`gw.path*_share` matches `gw.path1_share`).
fn glob(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// Metric names the summary shows: the plan's list (names, `*` standing for any characters),
/// else every scalar.
fn metrics(loaded: &Loaded, records: &[Record]) -> Vec<String> {
    let all: BTreeSet<&String> = records.iter().flat_map(|r| r.scalars.keys()).collect();
    let want = &loaded.plan.plan.metrics;
    if want.is_empty() {
        return all.into_iter().cloned().collect();
    }
    let mut out = Vec::new();
    for w in want {
        for m in &all {
            if glob(w, m) && !out.contains(*m) {
                out.push((*m).clone());
            }
        }
    }
    out
}

/// Write everything into `dir`, with `extra` (a scenario's own section) at the end of the
/// summary; the files written.
pub fn write(
    dir: &Path,
    loaded: &Loaded,
    records: &[Record],
    prov: &Provenance,
    extra: &str,
) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    remove_previous(dir)?;
    let mut files = Vec::new();
    let mut put = |name: &str, text: String| -> std::io::Result<()> {
        let p = dir.join(name);
        std::fs::write(&p, text)?;
        files.push(p);
        Ok(())
    };
    let x = |p: &Option<At>| {
        p.as_ref()
            .map(|p| format!("{},{}", p.sweep, p.x))
            .unwrap_or_else(|| ",".into())
    };
    let mut csv = String::from("scheme,sweep,x,seed,metric,value\n");
    let mut samples = String::from("scheme,sweep,x,seed,metric,t,value\n");
    let mut series = String::from("scheme,sweep,x,seed,metric,t,value\n");
    for r in records {
        for (m, v) in &r.scalars {
            let _ = writeln!(csv, "{},{},{},{m},{v}", r.scheme, x(&r.point), r.seed);
        }
        for (out, map) in [(&mut samples, &r.samples), (&mut series, &r.series)] {
            for (m, vs) in map {
                for (t, v) in vs {
                    let _ = writeln!(out, "{},{},{},{m},{t},{v}", r.scheme, x(&r.point), r.seed);
                }
            }
        }
    }
    put("results.csv", csv)?;
    if prov.samples {
        put("samples.csv", samples)?;
    }
    // Only plans with time series have rows for it: no empty file among those written.
    if series.lines().nth(1).is_some() {
        put("series.csv", series)?;
    }
    let warnings = warnings(loaded, records);
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    let mut text = summary(loaded, records, prov);
    if !warnings.is_empty() {
        text.push_str("## Warnings\n\n");
        for w in &warnings {
            let _ = writeln!(text, "- {w}");
        }
        text.push('\n');
    }
    let t = Table::new(loaded, records);
    let figures: Vec<(String, String)> = loaded
        .plan
        .figures
        .iter()
        .flat_map(|f| figure(f, &t, loaded))
        .collect();
    if !figures.is_empty() {
        text.push_str("## Figures\n\n");
        for (name, _) in &figures {
            let _ = writeln!(text, "![{name}]({name})\n");
        }
    }
    put("summary.md", text + extra)?;
    put(
        "provenance.toml",
        format!(
            "qgate = {:?}\nplan = {:?}\nplan_sha256 = {:?}\ncommand = {:?}\nseeds = {}\nquick = {}\nruns = {}\njobs = {}\nwall_s = {:.1}\n",
            version(),
            loaded.file.display().to_string(),
            plan_hash(&loaded.text),
            prov.command,
            prov.seeds,
            prov.quick,
            records.len(),
            prov.jobs,
            prov.wall_s
        ),
    )?;
    for (name, svg) in figures {
        put(&name, svg)?;
    }
    Ok(files)
}

/// A directory a previous run wrote (it holds that run's provenance.toml) has that run's
/// tables, summary and figures removed first, so a run's files are never mixed with another's
/// (a full run's samples.csv beside a quick run's results.csv). Files of other names and
/// subdirectories (other plans' results) are left alone.
fn remove_previous(dir: &Path) -> std::io::Result<()> {
    if !dir.join("provenance.toml").is_file() {
        return Ok(());
    }
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let ours = matches!(
            name,
            "results.csv" | "samples.csv" | "series.csv" | "summary.md" | "provenance.toml"
        ) || name.ends_with(".svg");
        if ours && p.is_file() {
            std::fs::remove_file(&p)?;
        }
    }
    Ok(())
}

/// Figures and summary metrics that name nothing any run measured (a misspelt metric, or a
/// figure kind that needs samples drawn from a scalar).
pub fn warnings(loaded: &Loaded, records: &[Record]) -> Vec<String> {
    let mut out = Vec::new();
    let has = |f: &dyn Fn(&Record) -> bool| records.iter().any(f);
    for f in &loaded.plan.figures {
        let m = f.metric.as_str();
        let found = match f.kind {
            FigureKind::Lines | FigureKind::Bars => has(&|r| r.scalars.contains_key(m)),
            FigureKind::Series => has(&|r| r.series.contains_key(m) || r.samples.contains_key(m)),
            FigureKind::Cdf => has(&|r| r.samples.contains_key(m)),
        };
        if !found {
            let known: BTreeSet<&String> = records
                .iter()
                .flat_map(|r| match f.kind {
                    FigureKind::Lines | FigureKind::Bars => r.scalars.keys().collect::<Vec<_>>(),
                    FigureKind::Series => r.series.keys().chain(r.samples.keys()).collect(),
                    FigureKind::Cdf => r.samples.keys().collect(),
                })
                .collect();
            out.push(format!(
                "figure '{}' of '{m}': no run measured it (a {} figure takes: {})",
                kind_name(f.kind),
                kind_name(f.kind),
                known.into_iter().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
    }
    let all: BTreeSet<&String> = records.iter().flat_map(|r| r.scalars.keys()).collect();
    for w in &loaded.plan.plan.metrics {
        if !all.iter().any(|m| glob(w, m)) {
            out.push(format!("'plan.metrics' entry '{w}' matches no metric"));
        }
    }
    out
}

/// `summary.md`: deterministic for the same plan, seeds and command (wall time is in
/// `provenance.toml`).
pub fn summary(loaded: &Loaded, records: &[Record], prov: &Provenance) -> String {
    let p = &loaded.plan.plan;
    let t = Table::new(loaded, records);
    let metrics = metrics(loaded, records);
    let mut s = String::new();
    let _ = writeln!(s, "# {}\n", p.name);
    if !p.description.is_empty() {
        let _ = writeln!(s, "{}\n", p.description.trim());
    }
    let _ = writeln!(s, "| | |\n|---|---|");
    let _ = writeln!(s, "| qgate | {} |", version());
    let _ = writeln!(
        s,
        "| plan | `{}` (sha256 {}) |",
        loaded.file.display(),
        &plan_hash(&loaded.text)[..16]
    );
    let _ = writeln!(s, "| command | `{}` |", prov.command);
    let _ = writeln!(
        s,
        "| runs | {} scheme(s) × {} point(s) × {} seed(s) = {}{} |\n",
        t.schemes.len(),
        t.points.len(),
        prov.seeds,
        records.len(),
        if prov.quick { " (quick)" } else { "" }
    );
    let _ = writeln!(
        s,
        "Each cell is mean ± sample standard deviation over the seeds (n). Seeds change the \
         random draws of a run (loss, device start jitter, flow start times, QUIC's own \
         randomness); \"distinct\" counts how many different outcomes the n runs gave, so \
         n = 5 with 1 distinct outcome is one measurement. Comparisons put each scheme against \
         `{}` at the same point: difference of means, its 95 % confidence interval and the \
         two-sided p-value of Welch's t-test (statrs' Student t). Runs with the same seed \
         share loss draws across schemes, which the unpaired test does not exploit \
         (conservative).\n",
        t.schemes[0]
    );
    for point in &t.points {
        if let Some(p) = point {
            let _ = writeln!(
                s,
                "## {}: {} = {}\n",
                p.sweep,
                label_of(loaded, &p.sweep),
                p.x
            );
        }
        let _ = write!(s, "| metric |");
        for sc in &t.schemes {
            let _ = write!(s, " {sc} |");
        }
        let _ = write!(s, "\n|---|");
        for _ in &t.schemes {
            let _ = write!(s, "---|");
        }
        s.push('\n');
        for m in &metrics {
            let _ = write!(s, "| {m} |");
            for sc in &t.schemes {
                let v = t.values(sc, point, m);
                let sm = Summary::of(&v);
                if sm.n == 0 {
                    let _ = write!(s, " – |");
                } else if sm.n == 1 {
                    // One run has no deviation to show.
                    let _ = write!(s, " {} (n = 1) |", sig(sm.mean));
                } else {
                    let _ = write!(s, " {} ± {} (n = {}) |", sig(sm.mean), sig(sm.std), sm.n);
                }
            }
            s.push('\n');
        }
        s.push('\n');
        let mut distinct = Vec::new();
        for sc in &t.schemes {
            let runs = t.runs(sc, point);
            let outcomes: BTreeSet<Vec<u64>> = runs
                .iter()
                .map(|r| r.scalars.values().map(|v| v.to_bits()).collect())
                .collect();
            distinct.push(format!("{sc} {}/{}", outcomes.len(), runs.len()));
            if runs.len() > 1 && outcomes.len() == 1 {
                distinct.push(format!(
                    "(**{sc}: every seed gave the same outcome — one measurement, not {}**)",
                    runs.len()
                ));
            }
        }
        let _ = writeln!(s, "Distinct outcomes: {}.\n", distinct.join(", "));
        let enough = t.schemes.iter().all(|sc| t.runs(sc, point).len() >= 2);
        if t.schemes.len() > 1 && !enough {
            let _ = writeln!(
                s,
                "(No comparisons: Welch's test needs at least 2 seeds per scheme.)\n"
            );
        }
        if t.schemes.len() > 1 && enough {
            let base = &t.schemes[0];
            let _ = writeln!(
                s,
                "| metric | scheme | mean of {base} | mean of scheme | difference | 95 % CI | p (Welch) |\n|---|---|---|---|---|---|---|"
            );
            for m in &metrics {
                let a = t.values(base, point, m);
                for sc in &t.schemes[1..] {
                    let b = t.values(sc, point, m);
                    if let Some(w) = Welch::test(&a, &b) {
                        // No spread on either side: nothing to test (the seeds changed nothing
                        // this metric shows).
                        let (ci, p) = if w.ci95.0 == w.ci95.1 {
                            ("–".to_string(), "– (no spread)".to_string())
                        } else {
                            (format!("[{}, {}]", sig(w.ci95.0), sig(w.ci95.1)), pval(w.p))
                        };
                        let _ = writeln!(
                            s,
                            "| {m} | {sc} | {} | {} | {} | {ci} | {p} |",
                            sig(Summary::of(&a).mean),
                            sig(Summary::of(&b).mean),
                            sig(w.diff),
                        );
                    }
                }
            }
            s.push('\n');
        }
    }
    s
}

fn file_name(f: &Figure, suffix: &str) -> String {
    drawn_as(f, f.kind, suffix)
}

/// Figures of one metric and kind for different sweeps get the sweep in their name.
fn sweep_suffix(f: &Figure) -> String {
    f.sweep
        .as_ref()
        .map(|s| format!("-{s}"))
        .unwrap_or_default()
}

/// The file name of a figure drawn as `kind` (lines without a sweep are drawn as bars).
fn drawn_as(f: &Figure, kind: FigureKind, suffix: &str) -> String {
    let base = f
        .file
        .clone()
        .unwrap_or_else(|| format!("{}-{}", kind_name(kind), f.metric.replace(['.', '@'], "-")));
    format!("{base}{suffix}.svg")
}

fn kind_name(k: FigureKind) -> &'static str {
    match k {
        FigureKind::Lines => "lines",
        FigureKind::Bars => "bars",
        FigureKind::Series => "series",
        FigureKind::Cdf => "cdf",
    }
}

fn scales(f: &Figure, ys: impl Iterator<Item = f64>, log_x: bool) -> svg::Scales {
    let (mut lo, mut hi) = (f64::MAX, 0.0f64);
    for y in ys.filter(|y| y.is_finite() && *y > 0.0) {
        lo = lo.min(y);
        hi = hi.max(y);
    }
    svg::Scales {
        log_x,
        log_y: f.log_y.unwrap_or_else(|| svg::wants_log(lo, hi)),
    }
}

/// The SVG files of one figure spec: (file name, SVG).
fn figure(f: &Figure, t: &Table, loaded: &Loaded) -> Vec<(String, String)> {
    let title = f.title.clone().unwrap_or_else(|| f.metric.clone());
    // Series and CDFs: one figure per point when there are several.
    let per_point = |p: &Option<At>| match p {
        Some(p) if t.points.len() > 1 => (
            format!("-{}-{}", p.sweep, p.x),
            format!("{title} ({} = {})", label_of(loaded, &p.sweep), p.x),
        ),
        _ => (String::new(), title.clone()),
    };
    let mut out = Vec::new();
    match f.kind {
        FigureKind::Lines if !loaded.plan.sweep.is_empty() => {
            for sw in &loaded.plan.sweep {
                if f.sweep.as_ref().is_some_and(|n| *n != sw.name) {
                    continue;
                }
                let points: Vec<&Option<At>> = t
                    .points
                    .iter()
                    .filter(|p| p.as_ref().is_some_and(|p| p.sweep == sw.name))
                    .collect();
                // A line needs two points (a one-point sweep is in the summary's tables).
                if points.len() < 2 {
                    continue;
                }
                let bands: Vec<svg::Band> = t
                    .schemes
                    .iter()
                    .map(|sc| svg::Band {
                        name: sc.clone(),
                        points: points
                            .iter()
                            .filter_map(|&p| {
                                let v = t.values(sc, p, &f.metric);
                                let m = Summary::of(&v);
                                let h = ci95_half(&v);
                                let x = p.as_ref()?.x;
                                (m.n > 0).then_some((x, m.mean, m.mean - h, m.mean + h))
                            })
                            .collect(),
                    })
                    .collect();
                let sc = scales(
                    f,
                    bands.iter().flat_map(|b| b.points.iter().map(|p| p.1)),
                    false,
                );
                let suffix = if loaded.plan.sweep.len() > 1 {
                    format!("-{}", sw.name)
                } else {
                    String::new()
                };
                out.push((
                    file_name(f, &suffix),
                    svg::band_chart(
                        &format!("{title} (mean, 95 % CI band)"),
                        &sw.label,
                        &f.metric,
                        &bands,
                        sc,
                    ),
                ));
            }
        }
        // Without a sweep, lines are drawn as bars.
        FigureKind::Lines | FigureKind::Bars => {
            let mut bars = Vec::new();
            for p in t.points.iter().filter(|p| in_sweep(f, p)) {
                for sc in &t.schemes {
                    let v = t.values(sc, p, &f.metric);
                    if v.is_empty() {
                        continue;
                    }
                    bars.push(svg::Bar {
                        label: match p {
                            Some(p) if t.points.len() > 1 => format!("{sc} @ {}", p.x),
                            _ => sc.clone(),
                        },
                        value: Summary::of(&v).mean,
                        err: ci95_half(&v),
                    });
                }
            }
            if !bars.is_empty() {
                out.push((
                    drawn_as(f, FigureKind::Bars, &sweep_suffix(f)),
                    svg::bar_chart(&format!("{title} (95 % CI)"), &f.metric, &bars),
                ));
            }
        }
        FigureKind::Series => {
            for p in t.points.iter().filter(|p| in_sweep(f, p)) {
                let (suffix, title) = per_point(p);
                let Some(bands) = t.bands(p, |runs| {
                    let mut by_t: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
                    for r in runs {
                        for (tt, v) in per_second(r, &f.metric) {
                            by_t.entry(tt.to_bits()).or_default().push(v);
                        }
                    }
                    let mut pts: Vec<(f64, f64, f64, f64)> = by_t
                        .into_iter()
                        .map(|(tt, v)| {
                            let m = Summary::of(&v).mean;
                            let lo = v.iter().copied().fold(f64::MAX, f64::min);
                            let hi = v.iter().copied().fold(f64::MIN, f64::max);
                            (f64::from_bits(tt), m, lo, hi)
                        })
                        .collect();
                    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                    pts
                }) else {
                    continue;
                };
                let sc = scales(
                    f,
                    bands.iter().flat_map(|b| b.points.iter().map(|p| p.1)),
                    false,
                );
                out.push((
                    file_name(f, &suffix),
                    svg::band_chart(
                        &format!("{title} (mean over seeds, min–max band)"),
                        "time (s)",
                        &f.metric,
                        &bands,
                        sc,
                    ),
                ));
            }
        }
        FigureKind::Cdf => {
            for p in t.points.iter().filter(|p| in_sweep(f, p)) {
                let (suffix, title) = per_point(p);
                let Some(bands) = t.bands(p, |runs| {
                    let mut v: Vec<f64> = runs
                        .iter()
                        .flat_map(|r| r.samples.get(&f.metric).into_iter().flatten())
                        .map(|s| s.1)
                        .filter(|v| v.is_finite())
                        .collect();
                    v.sort_by(f64::total_cmp);
                    let n = v.len() as f64;
                    // At most ~400 points per line: every k-th value, and the last.
                    let step = (v.len() / 400).max(1);
                    v.iter()
                        .enumerate()
                        .filter(|(i, _)| i % step == 0 || *i + 1 == v.len())
                        .map(|(i, x)| {
                            let y = (i + 1) as f64 / n;
                            (*x, y, y, y)
                        })
                        .collect()
                }) else {
                    continue;
                };
                let xs: Vec<f64> = bands
                    .iter()
                    .flat_map(|b| b.points.iter().map(|p| p.0))
                    .filter(|x| *x > 0.0)
                    .collect();
                let lo = xs.iter().copied().fold(f64::MAX, f64::min);
                let hi = xs.iter().copied().fold(0.0, f64::max);
                let scales = svg::Scales {
                    log_x: f.log_y.unwrap_or_else(|| svg::wants_log(lo, hi)),
                    log_y: false,
                };
                out.push((
                    file_name(f, &suffix),
                    svg::band_chart(
                        &format!("{title} (CDF, all seeds)"),
                        &f.metric,
                        "fraction ≤ x",
                        &bands,
                        scales,
                    ),
                ));
            }
        }
    }
    out
}

/// Whether the figure covers point `p` (all points unless it names a sweep).
fn in_sweep(f: &Figure, p: &Option<At>) -> bool {
    match (&f.sweep, p) {
        (Some(name), Some(p)) => p.sweep == *name,
        (Some(_), None) => false,
        (None, _) => true,
    }
}

/// A run's per-second values of `metric`: its series, or its samples averaged per second.
fn per_second(r: &Record, metric: &str) -> Vec<(f64, f64)> {
    if let Some(s) = r.series.get(metric) {
        return s.clone();
    }
    let mut bins: BTreeMap<u64, (f64, usize)> = BTreeMap::new();
    for (t, v) in r.samples.get(metric).into_iter().flatten() {
        let b = bins.entry(t.max(0.0).floor() as u64 + 1).or_default();
        b.0 += v;
        b.1 += 1;
    }
    bins.into_iter()
        .map(|(s, (sum, n))| (s as f64, sum / n as f64))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_globs_match_a_star_anywhere() {
        for (pattern, name, want) in [
            ("gw.path*_share", "gw.path1_share", true),
            ("gw.path*_share", "gw.path12_share", true),
            ("gw.path*_share", "gw.path1_priority_share", true),
            ("gw.path*_share", "gw.path1_util", false),
            ("gw.*", "gw.total_s", true),
            ("gw.path*", "gw.path1_util", true),
            ("gw.path*", "gw.total_s", false),
            ("gw.total_s", "gw.total_s", true),
            ("gw.total_s", "gw.total_s2", false),
            ("*_mean", "gw.response_ms_mean", true),
            ("a*b*c", "abc", true),
            ("a*b*c", "acb", false),
            ("ab*ba", "aba", false),
            ("*", "", true),
        ] {
            assert_eq!(glob(pattern, name), want, "{pattern} vs {name}");
        }
    }

    #[test]
    fn significant_digits() {
        assert_eq!(sig(1234.5678), "1235");
        assert_eq!(sig(12.345678), "12.35");
        assert_eq!(sig(0.012345), "0.01235");
        assert_eq!(sig(0.0), "0");
        assert_eq!(sig(f64::NAN), "–");
        assert_eq!(sig(1.5e12), "1.500e12");
        assert_eq!(pval(0.0001), "< 0.001");
    }

    #[test]
    fn samples_bin_per_second() {
        let mut r = Record::default();
        r.samples
            .insert("w.x".into(), vec![(0.2, 1.0), (0.7, 3.0), (1.5, 5.0)]);
        assert_eq!(per_second(&r, "w.x"), vec![(1.0, 2.0), (2.0, 5.0)]);
    }
}
