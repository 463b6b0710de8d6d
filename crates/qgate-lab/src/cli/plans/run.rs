//! `qgate-lab run PLAN.toml`: any plan file, with overrides, a check-only mode and a repeat check.

use std::path::PathBuf;

use clap::Args;
use qgate::{usage, Failure};

use super::execute::{execute, out_dir, run_plan, write_results};

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The plan file (TOML).
    plan: PathBuf,
    /// Seeds per scheme and point [default: the plan's `seeds`; with --quick its quick.seeds, or 1].
    #[arg(long)]
    seeds: Option<u64>,
    /// Where to write results [default: results/<plan name>].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Smoke run: the plan's [plan.quick] settings (one seed unless it says otherwise).
    #[arg(long)]
    quick: bool,
    /// Simulations run at once [default: one per core].
    #[arg(long, short = 'j')]
    jobs: Option<usize>,
    /// Override a plan key, e.g. --set topology.links.p1.delay_ms=30 or
    /// --set 'workloads.gw.scheduler="adaptive"' (the value is TOML; a bare word is a string).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Check the plan and count its runs, without running them.
    #[arg(long)]
    check: bool,
    /// Also write samples.csv: every request's or download's value (large for big plans).
    #[arg(long)]
    samples: bool,
    /// Run every run twice and fail if any metric differs between the two: whether the plan's
    /// numbers depend on its seeds alone (twice the time; the results written are the first's).
    #[arg(long)]
    repeat_check: bool,
}

/// `KEY=VALUE` with a TOML value (a bare word that is not TOML is taken as a string).
fn parse_set(s: &str) -> Result<(String, toml::Value), Failure> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| usage(format!("--set '{s}': expected KEY=VALUE")))?;
    let value = toml::from_str::<toml::Table>(&format!("v = {v}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(v.to_string()));
    Ok((k.trim().to_string(), value))
}

pub(super) fn run_cmd(a: RunArgs) -> Result<(), Failure> {
    let loaded = crate::plan::Loaded::read(&a.plan).map_err(usage)?;
    let opts = crate::plan::Options {
        seeds: a.seeds,
        quick: a.quick,
        set: a
            .set
            .iter()
            .map(|s| parse_set(s))
            .collect::<Result<_, _>>()?,
        ..Default::default()
    };
    if a.check {
        let variants = loaded.variants(&opts).map_err(usage)?;
        println!(
            "{}: {} runs ({} scheme(s), seeds {})",
            a.plan.display(),
            variants.len(),
            loaded.scheme_names().join(", "),
            variants.iter().map(|v| v.seed).max().unwrap_or(0)
        );
        return Ok(());
    }
    if !a.repeat_check {
        return run_plan(&loaded, &opts, a.jobs, a.out, a.samples, |_| String::new());
    }
    let eff = loaded.overridden(&opts).map_err(usage)?;
    let out = out_dir(&eff, a.out)?;
    let ran = execute(&loaded, &opts, a.jobs)?;
    let again = execute(&loaded, &opts, a.jobs)?;
    write_results(&eff, &opts, &ran, out, a.samples, "")?;
    let diffs = crate::plan::run::differences(&ran.records, &again.records);
    if diffs.is_empty() {
        eprintln!(
            "repeat check: each of the {} runs gave the same numbers twice",
            ran.records.len()
        );
        return Ok(());
    }
    const SHOWN: usize = 10;
    Err(Failure::from(anyhow::anyhow!(
        "not repeatable: {} of {} runs differ on a second run with the same seed (the results written are the first run's):\n  {}{}",
        diffs.len(),
        ran.records.len(),
        diffs[..diffs.len().min(SHOWN)].join("\n  "),
        if diffs.len() > SHOWN { "\n  …" } else { "" }
    )))
}
