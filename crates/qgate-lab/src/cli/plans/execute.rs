//! Running a plan's variants (or a scenario's items) on a progress bar, and writing the results
//! directory: what `run` and the papers' commands share.

use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};
use qgate::{usage, Failure};

fn progress(total: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template("{prefix} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}")
            .expect("valid template"),
    );
    pb.set_prefix(what.to_string());
    pb
}

/// A plan's runs and what they measured.
pub(super) struct Executed {
    pub(super) variants: Vec<crate::plan::Variant>,
    pub(super) records: Vec<crate::plan::run::Record>,
    jobs: usize,
    wall_s: f64,
}

/// Run every variant of a plan on `jobs` threads (default: one per core) with a progress bar.
pub(super) fn execute(
    loaded: &crate::plan::Loaded,
    opts: &crate::plan::Options,
    jobs: Option<usize>,
) -> Result<Executed, Failure> {
    let variants = loaded.variants(opts).map_err(usage)?;
    let jobs = jobs.unwrap_or_else(crate::pool::default_jobs);
    if jobs == 0 {
        return Err(usage("--jobs must be at least 1"));
    }
    let jobs = jobs.min(variants.len().max(1));
    let pb = progress(variants.len() as u64, &loaded.plan.plan.name);
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let started = std::time::Instant::now();
    let records = crate::plan::run::run_all(&variants, jobs, |done, total, v| {
        let what = v.label();
        if tty {
            pb.set_message(what);
            pb.inc(1);
        } else {
            eprintln!("[{done}/{total}] {what}");
        }
    })
    .map_err(|e| Failure::from(anyhow::anyhow!("{}: {e}", loaded.file.display())))?;
    pb.finish_and_clear();
    Ok(Executed {
        variants,
        records,
        jobs,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

/// Where a plan's results go (default `results/<plan name>`), made and tried before anything
/// runs: a long run must not end in an error writing its results.
pub(super) fn out_dir(
    loaded: &crate::plan::Loaded,
    out: Option<PathBuf>,
) -> Result<PathBuf, Failure> {
    let out = out.unwrap_or_else(|| PathBuf::from("results").join(&loaded.plan.plan.name));
    if out.exists() && !out.is_dir() {
        return Err(usage(format!(
            "--out {}: exists and is not a directory",
            out.display()
        )));
    }
    let probe = out.join(".qgate-write-test");
    std::fs::create_dir_all(&out)
        .and_then(|()| std::fs::write(&probe, b""))
        .and_then(|()| std::fs::remove_file(&probe))
        .map_err(|e| usage(format!("--out {}: cannot write there: {e}", out.display())))?;
    Ok(out)
}

/// Write a plan's results directory; `extra` is a scenario's own section at the end of the
/// summary.
pub(super) fn write_results(
    loaded: &crate::plan::Loaded,
    opts: &crate::plan::Options,
    ran: &Executed,
    out: PathBuf,
    samples: bool,
    extra: &str,
) -> Result<(), Failure> {
    let prov = crate::plan::report::Provenance {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        jobs: ran.jobs,
        wall_s: ran.wall_s,
        seeds: ran.variants.iter().map(|v| v.seed).max().unwrap_or(0),
        quick: opts.quick,
        samples,
    };
    let files = crate::plan::report::write(&out, loaded, &ran.records, &prov, extra)
        .map_err(|e| Failure::from(anyhow::anyhow!("writing {}: {e}", out.display())))?;
    println!(
        "{} runs in {:.1} s on {} thread(s); wrote {} files to {}",
        ran.records.len(),
        ran.wall_s,
        ran.jobs,
        files.len(),
        out.display()
    );
    Ok(())
}

/// [`execute`] and [`write_results`].
pub(super) fn run_plan(
    loaded: &crate::plan::Loaded,
    opts: &crate::plan::Options,
    jobs: Option<usize>,
    out: Option<PathBuf>,
    samples: bool,
    extra: impl Fn(&[crate::plan::run::Record]) -> String,
) -> Result<(), Failure> {
    // The summary and figures follow the plan as overridden (--set, --quick).
    let eff = loaded.overridden(opts).map_err(usage)?;
    let out = out_dir(&eff, out)?;
    let ran = execute(loaded, opts, jobs)?;
    write_results(&eff, opts, &ran, out, samples, &extra(&ran.records))
}

/// Run scenario `name` (`total` items of `unit`) with a progress bar (one line per item when
/// stderr is not a terminal), write its results into `out` [default: results/NAME], print
/// summary.md and the wall time.
pub(super) fn scenario<R>(
    name: &str,
    unit: &str,
    total: usize,
    out: Option<PathBuf>,
    run: impl FnOnce(&(dyn Fn(&str) + Sync)) -> R,
    write: impl FnOnce(&std::path::Path, &R, &str) -> std::io::Result<()>,
) -> Result<(), Failure> {
    let out = out.unwrap_or_else(|| PathBuf::from(format!("results/{name}")));
    // The command as typed, with its flags: `qgate-lab NAME` and what followed it.
    let command = std::iter::once(format!("qgate-lab {name}"))
        .chain(std::env::args().skip(2))
        .collect::<Vec<_>>()
        .join(" ");
    let wall = std::time::Instant::now();
    let pb = progress(total as u64, unit);
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let results = run(&|label: &str| {
        pb.set_message(label.to_string());
        pb.inc(1);
        if !tty {
            eprintln!("{name}: [{}/{total}] {label}", pb.position());
        }
    });
    pb.finish_with_message("done");
    write(&out, &results, &command)
        .map_err(|e| anyhow::anyhow!("writing results to {}: {e}", out.display()))?;
    println!(
        "{}",
        std::fs::read_to_string(out.join("summary.md")).unwrap_or_default()
    );
    eprintln!(
        "qgate-lab {name}: done in {:.1} s; results in {}",
        wall.elapsed().as_secs_f64(),
        out.display()
    );
    Ok(())
}
