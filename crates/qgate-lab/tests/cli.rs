//! The `qgate-lab` binary as a user runs it: help, bad input, the demo, every lab's quick run
//! and the benchmarks.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn qgate(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_qgate-lab"));
    c.env("QGATE_HOME", home)
        .env_remove("QGATE_LAB_CONFIG")
        .env_remove("RUST_LOG");
    c
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("qgate-lab-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Run `qgate-lab ARGS…` with `home` as QGATE_HOME and wait for it.
fn run(home: &Path, args: &[&str]) -> Output {
    qgate(home).args(args).output().unwrap()
}

/// A failed run: the expected exit status, the message on stderr, and never a panic.
fn assert_fails(o: Output, status: i32, needle: &str) {
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(status), "stderr: {err}");
    assert!(err.contains(needle), "expected '{needle}' in: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
}

#[test]
fn help_everywhere() {
    let home = tmp("help");
    for args in [
        vec!["--help"],
        vec!["demo", "--help"],
        vec!["bench", "--help"],
        vec!["bench", "sim", "--help"],
        vec!["bench", "loopback", "--help"],
        vec!["linkem", "--help"],
        vec!["run", "--help"],
        vec!["aqm-kernel", "--help"],
        vec!["amqp-kernel", "--help"],
        vec!["upload-kernel", "--help"],
    ] {
        let o = qgate(&home).args(&args).output().unwrap();
        assert!(o.status.success(), "{args:?}");
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains("Usage"), "{args:?}");
        // A subcommand's own options come first, the global ones under their own heading.
        if args.len() > 1 {
            let at = |s: &str| out.find(s).unwrap_or_else(|| panic!("{args:?}: no {s}"));
            assert!(at("Options:") < at("Global options:"), "{args:?}");
            assert!(at("Global options:") < at("--verbose"), "{args:?}");
            assert!(out[..at("Global options:")]
                .lines()
                .all(|l| !l.trim_start().starts_with("-c, --config")));
        }
    }
}

#[test]
fn malformed_config_is_named_with_its_line() {
    let home = tmp("config");
    let cfg = home.join("bad.toml");
    std::fs::write(&cfg, "[demo]\nclients = 3\nclinets = 5\n").unwrap();
    let o = qgate(&home)
        .arg("--config")
        .arg(&cfg)
        .args(["demo"])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(err.contains("bad.toml") && err.contains("line 3"), "{err}");
    assert_fails(o, 2, "unknown field `clinets`");

    std::fs::write(&cfg, "[transport]\nkeep_alive_ms = 0\n").unwrap();
    let o = qgate(&home)
        .arg("--config")
        .arg(&cfg)
        .args(["demo"])
        .output()
        .unwrap();
    assert_fails(o, 2, "keep_alive_ms");

    let o = run(&home, &["--config", "/nonexistent/q.toml", "demo"]);
    assert_fails(o, 2, "cannot read config file /nonexistent/q.toml");

    std::fs::write(&cfg, "[demo]\nclients = 0\n").unwrap();
    let o = qgate(&home)
        .arg("--config")
        .arg(&cfg)
        .args(["demo"])
        .output()
        .unwrap();
    assert_fails(o, 2, "demo.clients = 0 must be 1..=1000");
}

#[test]
fn demo_runs_in_virtual_time_and_reports() {
    let home = tmp("demo");
    let o = run(
        &home,
        &[
            "demo",
            "--direct",
            "--clients",
            "3",
            "--requests",
            "20",
            "--seed",
            "4",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("requests answered    60 of 60 (0 failed)"),
        "{out}"
    );
    assert!(out.contains("response delay"), "{out}");
    assert!(out.contains("virtual time"), "{out}");
    // Same seed, same numbers (the wall-clock line aside).
    let again = run(
        &home,
        &[
            "demo",
            "--direct",
            "--clients",
            "3",
            "--requests",
            "20",
            "--seed",
            "4",
        ],
    );
    let strip = |s: &str| {
        s.lines()
            .filter(|l| !l.contains("wall clock"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(strip(&out), strip(&String::from_utf8_lossy(&again.stdout)));
}

/// Run `qgate-lab LAB --quick` into a fresh directory and check it wrote `files`; returns the
/// home and output directories.
fn run_lab_quick(lab: &str, files: &[&str]) -> (PathBuf, PathBuf) {
    let home = tmp(&format!("lab-{lab}"));
    let out = home.join(lab);
    let o = qgate(&home)
        .args([lab, "--quick", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    for f in files {
        assert!(out.join(f).exists(), "{lab}: {f} missing");
    }
    (home, out)
}

#[test]
fn lab_aqm_quick_writes_every_result_file() {
    let (home, out) = run_lab_quick(
        "aqm",
        &[
            "results.csv",
            "series.csv",
            "summary.md",
            "provenance.toml",
            "bars-flows-qdelay_ms.svg",
            "bars-flows-goodput_mbps.svg",
            "series-flows-qdelay_ms.svg",
            "cdf-flows-flow_goodput_mbps.svg",
        ],
    );
    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(
        summary.contains("Against paper 004, number by number"),
        "{summary}"
    );
    assert!(
        summary.contains("## point: bottleneck rate (Mbit/s) = 10") && !summary.contains("= 50\n"),
        "--quick runs the paper's point only:\n{summary}"
    );
    // Drop-tail's standing queue dwarfs every AQM's (the bufferbloat every AQM exists to fix).
    let delay = |name: &str| -> f64 {
        let row = csv
            .lines()
            .find(|l| l.starts_with(&format!("{name},")) && l.contains(",flows.qdelay_ms,"))
            .unwrap();
        row.rsplit(',').next().unwrap().parse().unwrap()
    };
    for aqm in ["red", "pie", "codel", "fq-codel", "pid-delay"] {
        assert!(
            delay("droptail") > 2.0 * delay(aqm),
            "droptail {} ms vs {aqm} {} ms",
            delay("droptail"),
            delay(aqm)
        );
    }
    let o = run(&home, &["aqm", "--quick", "--only", "blue"]);
    assert_fails(o, 2, "no scheme 'blue'");
}

#[test]
fn lab_margins_prints_the_table() {
    let home = tmp("margins");
    let o = run(
        &home,
        &["margins", "--mbps", "50", "--rtt-ms", "42", "--flows", "30"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("phase margin") && out.contains("Table II (×1)"),
        "{out}"
    );
    // The stable variant's row, with its auto-scaling factor, and its phase margin ≥ 45°.
    let row = out
        .lines()
        .find(|l| l.contains("PIE's auto-scaling"))
        .unwrap_or_else(|| panic!("{out}"));
    let pm: f64 = row.split('|').nth(3).unwrap().trim().parse().unwrap();
    assert!(pm >= 45.0, "{row}");
}

#[test]
fn demo_takes_a_queue_discipline_flag() {
    let home = tmp("demo-queue");
    let o = run(
        &home,
        &[
            "demo",
            "--direct",
            "--clients",
            "2",
            "--requests",
            "10",
            "--backbone-queue",
            "codel:target_ms=3",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("queue codel:target_ms=3"));
    let o = run(&home, &["demo", "--backbone-queue", "pie:target=3"]);
    assert_fails(o, 2, "unknown field `target`");
}

#[test]
fn lab_history_quick_writes_every_result_file() {
    let (home, out) = run_lab_quick(
        "history",
        &[
            "results.csv",
            "summary.md",
            "provenance.toml",
            "lines-dl-latency_s_mean-1MB.svg",
            "cdf-dl-latency_s-1MB-38.svg",
            "dumbbell/summary.md",
            "change/summary.md",
            "change/series-dl-latency_s.svg",
            "congested/summary.md",
        ],
    );
    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    for scheme in ["default", "history-mean", "history-ewma", "careful"] {
        assert!(
            csv.contains(&format!("{scheme},1MB,38,1,dl.latency_s_mean,")),
            "{scheme}:\n{csv}"
        );
    }
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(
        summary.contains("## Against paper 002")
            && summary.contains("Good → bad")
            && summary.contains("At a congested bottleneck"),
        "{summary}"
    );
    let o = run(&home, &["history", "--runs", "1"]);
    assert_fails(o, 2, "--runs must be at least 2");
}

#[test]
fn lab_faults_quick_loses_nothing() {
    let (_home, out) = run_lab_quick("faults", &["results.csv", "summary.md"]);
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.contains("**Lost over every run: 0**"), "{summary}");
    // The command that reproduces it, flags and all.
    assert!(
        summary.contains("Reproduce: `qgate-lab faults --quick --out "),
        "{summary}"
    );
    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    for fault in [
        "server restart",
        "path 1 flaps",
        "hostile peers",
        "broker restart",
    ] {
        assert!(csv.contains(fault), "no {fault} in:\n{csv}");
    }
    assert!(!csv.contains(",never"), "every fault recovered:\n{csv}");
}

#[test]
fn lab_proxy_quick_writes_every_result_file() {
    let (_home, out) = run_lab_quick(
        "proxy",
        &[
            "results.csv",
            "series.csv",
            "summary.md",
            "provenance.toml",
            "lines-gw-response_ms_mean-delay-equal.svg",
            "lines-gw-total_s-delay-hetero.svg",
            "lines-gw-response_ms_mean-loss.svg",
        ],
    );
    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    assert!(
        csv.starts_with("scheme,sweep,x,seed,metric,value\n"),
        "{csv}"
    );
    for sweep in ["delay-equal", "delay-hetero", "loss", "all-priority"] {
        assert!(csv.contains(&format!(",{sweep},")), "{sweep} missing");
    }
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.contains("## Against paper 000"), "{summary}");
    assert!(summary.contains("Distinct outcomes"), "{summary}");
    // One seed: a mean without a deviation it cannot have; the figures linked.
    assert!(summary.contains(" (n = 1) |"), "{summary}");
    assert!(!summary.contains("± 0 (n = 1)"), "{summary}");
    assert!(
        summary.contains("![lines-gw-total_s-delay-hetero.svg](lines-gw-total_s-delay-hetero.svg)"),
        "{summary}"
    );
    let prov = std::fs::read_to_string(out.join("provenance.toml")).unwrap();
    assert!(
        prov.contains("plan = \"lab/plans/paper000-proxy.toml\"") && prov.contains("plan_sha256"),
        "{prov}"
    );
}

/// A two-seed plan small enough for a test: two schemes of downloads over one link.
const TINY_PLAN: &str = r#"
[plan]
name = "tiny"
duration_s = 8
seeds = 2

[topology]
hosts = [{ name = "c" }, { name = "s" }]
[[topology.links]]
name = "l"
a = "c"
b = "s"
rate_mbps = 20
delay_ms = 10
loss = { kind = "bernoulli", p = 0.01 }

[[workloads]]
kind = "downloads"
name = "dl"
client = "c"
server = "s"
bytes = 200000
runs = 3
interval_s = 1

[[schemes]]
name = "default"
[[schemes]]
name = "ewma"
set = { "workloads.dl.history" = "ewma" }

[[figures]]
kind = "bars"
metric = "dl.latency_s_mean"
"#;

#[test]
fn lab_run_plan_is_deterministic_and_its_errors_name_the_line() {
    let home = tmp("lab-run");
    let plan = home.join("tiny.toml");
    std::fs::write(&plan, TINY_PLAN).unwrap();
    let run_to = |dir: &str| {
        let out = home.join(dir);
        let o = qgate(&home)
            .args(["run", "-j", "2", "--out"])
            .arg(&out)
            .arg(&plan)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        out
    };
    let (a, b) = (run_to("a"), run_to("b"));
    let csv = std::fs::read_to_string(a.join("results.csv")).unwrap();
    assert_eq!(
        csv,
        std::fs::read_to_string(b.join("results.csv")).unwrap(),
        "the same plan and seeds give the same numbers"
    );
    assert!(csv.contains("ewma,,,2,dl.latency_s_mean,"), "{csv}");
    let summary = std::fs::read_to_string(a.join("summary.md")).unwrap();
    assert!(
        summary.contains("Distinct outcomes: default 2/2, ewma 2/2."),
        "two seeds, two different outcomes:\n{summary}"
    );
    assert!(summary.contains("| dl.from_history | ewma |"), "{summary}");
    assert!(a.join("bars-dl-latency_s_mean.svg").exists());
    // No time series in this plan, so no series.csv of a header alone.
    assert!(!a.join("series.csv").exists());
    // A rerun into the same directory replaces the previous run's files, leaving no stale ones
    // (a figure of another name here), and other files alone.
    std::fs::write(a.join("bars-old-metric.svg"), "<svg/>").unwrap();
    std::fs::write(a.join("notes.txt"), "mine").unwrap();
    std::fs::write(a.join("series.csv"), "scheme\n").unwrap();
    run_to("a");
    assert!(!a.join("bars-old-metric.svg").exists() && !a.join("series.csv").exists());
    assert!(a.join("bars-dl-latency_s_mean.svg").exists() && a.join("notes.txt").exists());
    // An --out that cannot be written is refused before anything runs.
    std::fs::write(home.join("afile"), "").unwrap();
    let o = qgate(&home)
        .args(["run", "--out"])
        .arg(home.join("afile/sub"))
        .arg(&plan)
        .output()
        .unwrap();
    assert_fails(o, 2, "cannot write there");

    std::fs::write(&plan, TINY_PLAN.replace("delay_ms = 10", "dealy_ms = 10")).unwrap();
    let o = run(&home, &["run", plan.to_str().unwrap()]);
    assert_fails(o, 2, "tiny.toml:14: unknown field `dealy_ms`");
    std::fs::write(&plan, TINY_PLAN.replace("\"ewma\" }", "\"fastest\" }")).unwrap();
    let o = run(&home, &["run", plan.to_str().unwrap()]);
    assert_fails(o, 2, "scheme 'ewma': unknown variant `fastest`");
    let o = run(&home, &["run", "--set", "plan.seeds=0", "nope.toml"]);
    assert_fails(o, 2, "nope.toml: cannot read");
}

#[test]
fn shipped_plans_check() {
    let home = tmp("plans");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../lab/plans");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let o = run(&home, &["run", "--check", p.to_str().unwrap()]);
        assert!(o.status.success(), "{}: {}", p.display(), stderr(&o));
        let o = run(&home, &["run", "--check", "--quick", p.to_str().unwrap()]);
        assert!(
            o.status.success(),
            "{} --quick: {}",
            p.display(),
            stderr(&o)
        );
        n += 1;
    }
    assert!(n >= 4, "{n} plans");
}

#[test]
fn gateway_demo_in_virtual_time() {
    let home = tmp("gwdemo");
    let o = run(
        &home,
        &["demo", "--virtual", "--duration", "6", "--devices", "6"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("6 devices → gateway") && out.contains("summary"),
        "{out}"
    );
    assert!(out.contains("failed       0"), "{out}");
    // The whole pipeline: every answered request reached the consumer once.
    let line = out.lines().find(|l| l.starts_with("pipeline")).expect(&out);
    assert!(line.ends_with(": adds up"), "{line}");
    let n: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    // sent, answered, stored, accepted, received, distinct, missing, extra
    assert_eq!(n.len(), 8, "{line}");
    assert!(n[0] > 300, "6 devices × 6 s × 10/s: {line}");
    assert_eq!(
        (n[1], n[2], n[3], n[4], n[5], n[6]),
        (n[0], n[0], n[0], n[0], n[0], 0),
        "{line}"
    );
    let o = run(&home, &["demo", "--scheduler", "fastest"]);
    assert_fails(o, 2, "unknown scheduler 'fastest'");
}

#[test]
fn lab_amqp_quick_writes_results_and_rejects_zero_repetitions() {
    let (home, out) = run_lab_quick(
        "amqp",
        &[
            "results.csv",
            "summary.md",
            "fig6-7_multi_total.svg",
            "fig14_bandwidth.svg",
            "loopback_total.svg",
            "sweep/summary.md",
            "multi/results.csv",
        ],
    );
    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    for t in [
        "quic",
        "quic-pmtud-off",
        "quic-constrained",
        "quic-mux",
        "tcp-tls13",
        "tcp-tls12",
    ] {
        assert!(csv.contains(&format!(",{t},netsim,")), "{t} on netsim");
    }
    assert!(csv.contains(",quic-mux,loopback,"), "quic-mux on loopback");
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(
        summary.contains("## Against the paper's claims"),
        "{summary}"
    );
    // quic-mux is compared with both TCP baselines at every sweep point the quick run has.
    let line = summary
        .lines()
        .find(|l| l.contains("**quic-mux against TCP+TLS 1.2 and 1.3"))
        .unwrap_or_else(|| panic!("{summary}"));
    assert!(line.contains(" comparisons"), "{line}");
    let o = run(&home, &["amqp", "--seeds", "0"]);
    assert_fails(o, 2, "seeds must be in 1..=");
}

#[test]
fn bench_gateway_reports_throughput_cpu_latency_and_memory() {
    let home = tmp("bench-gateway");
    let o = run(
        &home,
        &[
            "bench",
            "gateway",
            "--devices",
            "8",
            "--seconds",
            "0.3",
            "--repeats",
            "1",
            "--paced-rate",
            "200",
            "--memory-devices",
            "200",
        ],
    );
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{out}\n{}", stderr(&o));
    for needle in [
        "via gateway",
        "direct",
        "gateway CPU",
        "offered load 200",
        "idle registered devices",
    ] {
        assert!(out.contains(needle), "'{needle}' missing from:\n{out}");
    }
    // The memory line ends "…, X KiB per device"; a few dozen KiB is expected.
    let kib: f64 = out
        .lines()
        .find(|l| l.contains("KiB per device"))
        .and_then(|l| l.split(", ").last())
        .and_then(|t| t.split(' ').next())
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("no per-device memory in:\n{out}"));
    assert!(kib > 0.0 && kib < 500.0, "{kib} KiB per device:\n{out}");
}

#[test]
fn bench_pipeline_checks_every_record_arrives_once() {
    let home = tmp("bench-pipeline");
    let o = run(
        &home,
        &[
            "bench",
            "pipeline",
            "--devices",
            "8",
            "--seconds",
            "0.5",
            "--repeats",
            "1",
        ],
    );
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{out}\n{}", stderr(&o));
    for needle in [
        "into the broker",
        "count-only server",
        "ratio",
        "device→consumer p50",
    ] {
        assert!(out.contains(needle), "'{needle}' missing from:\n{out}");
    }
    assert!(out.contains("exactly once      yes"), "{out}");
    let answered: u64 = out
        .split(", ")
        .find(|w| w.ends_with(" answered"))
        .and_then(|w| w.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no answered count in:\n{out}"));
    assert!(answered > 50, "{out}");
    let o = run(&home, &["bench", "pipeline", "--body", "8"]);
    assert_fails(o, 2, "--body 16 B to 1 MiB");
}

/// The values of `up.METRIC` in a lab's results.csv at one scheme, sweep and point, one per seed.
fn point_values(csv: &str, scheme: &str, sweep: &str, x: &str, metric: &str) -> Vec<f64> {
    csv.lines()
        .filter(|l| {
            l.starts_with(&format!("{scheme},{sweep},{x},"))
                && l.contains(&format!(",up.{metric},"))
        })
        .map(|l| l.rsplit(',').next().unwrap().parse().unwrap())
        .collect()
}

#[test]
fn lab_upload_quick_completes_every_upload_and_compares_with_the_paper() {
    let (_home, out) = run_lab_quick(
        "upload",
        &[
            "results.csv",
            "summary.md",
            "provenance.toml",
            "fault/results.csv",
            "fault/summary.md",
            "requirement/results.csv",
            "requirement/summary.md",
        ],
    );
    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    for scheme in [
        "two-ended",
        "two-ended-literal",
        "conventional",
        "wifi-only",
        "cellular-only",
    ] {
        assert!(
            csv.contains(&format!("{scheme},receive-window,")),
            "{scheme} missing"
        );
    }
    // Every upload arrived byte-identical, on the healthy and on the failing network.
    for f in [
        "results.csv",
        "fault/results.csv",
        "requirement/results.csv",
    ] {
        let csv = std::fs::read_to_string(out.join(f)).unwrap();
        let completed: Vec<&str> = csv
            .lines()
            .filter(|l| l.contains(",up.completed,"))
            .collect();
        assert!(!completed.is_empty(), "{f}");
        assert!(
            completed.iter().all(|l| l.ends_with(",1")),
            "{f}:\n{}",
            completed.join("\n")
        );
    }
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.contains("## Against paper 001"), "{summary}");
    assert!(summary.contains("| wifi-dies | 2 of 2 |"), "{summary}");
    // What the receiver held, counted by the binary's allocator (decision U14): conventional's
    // one stream reassembles in its window, so a 2 000 KB window holds more than a 100 KB one;
    // two-ended's server holds chunks as request bodies.
    let held = |scheme: &str, x: &str, metric: &str| -> f64 {
        let v = point_values(&csv, scheme, "receive-window", x, metric);
        assert_eq!(v.len(), 2, "{scheme} {metric} at {x}:\n{csv}");
        v.iter().sum::<f64>() / 2.0
    };
    let (conv_small, conv_large) = (
        held("conventional", "100", "recv_peak_kb"),
        held("conventional", "2000", "recv_peak_kb"),
    );
    assert!(
        conv_small > 100.0 && conv_large > 2.0 * conv_small,
        "{conv_small} {conv_large}"
    );
    assert!(held("two-ended", "2000", "recv_body_peak_kb") > 0.0);
    // The QUIC stack's part is a part: its drivers' blocks count in the whole too.
    let (part, whole) = (
        held("two-ended", "2000", "recv_quic_peak_kb"),
        held("two-ended", "2000", "recv_peak_kb"),
    );
    assert!(part > 0.0 && part < whole, "{part} {whole}");
    assert!(summary.contains("Held at the receiver"), "{summary}");
    // Buffer blocking, measured: at a 100 KB window the conventional multipath connection
    // (one reorder buffer) loses goodput that two-ended (one connection per link) keeps.
    let req = std::fs::read_to_string(out.join("requirement/results.csv")).unwrap();
    // A metric's mean over the seeds at one point of the 60 ms receive sweep.
    let mean = |scheme: &str, x: &str, metric: &str| -> f64 {
        let v = point_values(&req, scheme, "receive-60ms", x, metric);
        assert!(!v.is_empty(), "{scheme} {metric} at {x}:\n{req}");
        v.iter().sum::<f64>() / v.len() as f64
    };
    let goodput = |scheme: &str, x: &str| mean(scheme, x, "goodput_mbps");
    let (two_small, two_large) = (
        goodput("two-ended", "100000"),
        goodput("two-ended", "8000000"),
    );
    let (conv_small, conv_large) = (
        goodput("conventional", "100000"),
        goodput("conventional", "8000000"),
    );
    assert!(two_small >= 0.95 * two_large, "{two_small} vs {two_large}");
    // What the device held unacknowledged is measured, and a 100 KB receive window bounds
    // the conventional connection's bytes in flight (flow control), not its 2 MB one.
    let flight = |scheme: &str, x: &str| mean(scheme, x, "peak_in_flight_kb");
    let (small, large) = (
        flight("conventional", "100000"),
        flight("conventional", "8000000"),
    );
    assert!(
        small > 10.0 && small <= 130.0 && large > small,
        "{small} {large}"
    );
    assert!(
        conv_small < 0.9 * conv_large,
        "{conv_small} vs {conv_large}"
    );
    let required = std::fs::read_to_string(out.join("requirement/summary.md")).unwrap();
    assert!(
        required.contains("| receive | 60 | ≤ 100 | > 100 | ≥ 1.00 |"),
        "{required}"
    );
    // The backup path carried lane 1 after Wi-Fi died.
    let fault = std::fs::read_to_string(out.join("fault/results.csv")).unwrap();
    assert!(
        fault.lines().any(|l| l.starts_with("wifi-dies,")
            && l.contains(",up.migrations,")
            && !l.ends_with(",0")),
        "{fault}"
    );
}

#[test]
fn lab_upload_kernel_summary_reads_back_its_results() {
    let home = tmp("ukernel");
    let out = home.join("uk");
    std::fs::create_dir_all(&out).unwrap();
    let mut csv = String::from(
        "scheme,sweep,buffer_kb,rep,goodput_mbps,lateness_p99_us,backup_subflows,backup_bytes\n",
    );
    csv.push_str("tcp-wifi,single,4000,1,19.0,100,0,0\ntcp-cellular,single,4000,1,4.5,100,0,0\n");
    // Path 1 dies: 10 MB in 16 s (5 Mbit/s) over the backup, 20 s without a backup's help.
    csv.push_str(
        "two-ended,fault,4000,1,5.0,100,2,3000000\nconventional,fault,4000,1,4.0,100,0,0\n",
    );
    for (scheme, sweep, values) in [
        (
            "conventional",
            "receive",
            [7.0, 8.0, 12.0, 15.0, 20.0, 21.5],
        ),
        ("conventional", "send", [9.0, 16.0, 21.0, 21.0, 21.5, 21.5]),
        ("two-ended", "receive", [20.0, 20.5, 20.0, 19.0, 19.0, 19.0]),
        ("two-ended", "send", [20.0, 20.5, 20.0, 19.0, 19.0, 19.0]),
    ] {
        for (kb, v) in [100, 200, 400, 800, 1200, 2000].iter().zip(values) {
            let backup = if scheme == "two-ended" { "2,0" } else { "0,0" };
            csv.push_str(&format!("{scheme},{sweep},{kb},1,{v},100,{backup}\n"));
        }
    }
    std::fs::write(out.join("results.csv"), &csv).unwrap();
    // `--summarize`, with `--cellular-delay` when given.
    let summarize = |delay: Option<&str>| {
        let mut args = vec!["upload-kernel", "--summarize", "--only"];
        args.extend(["conventional,two-ended", "--out", out.to_str().unwrap()]);
        args.extend(delay.map(|d| ["--cellular-delay", d]).into_iter().flatten());
        run(&home, &args)
    };
    let o = summarize(None);
    assert!(o.status.success(), "{}", stderr(&o));
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    // 80 % of 23.5 = 18.8 Mbit/s: conventional first at 1200 KB, two-ended at 100 KB.
    assert!(
        summary.contains("to 80 % of the sum, conventional ÷ two-ended: **12.00×**"),
        "{summary}"
    );
    assert!(summary.contains("(sum 23.50)"), "{summary}");
    assert!(
        summary.contains("two-ended: 2–2 backup subflows open per run; at most 0 bytes"),
        "{summary}"
    );
    assert!(
        summary.contains("| two-ended | 16.00 ± 0.00 | 5.00 ± 0.00 | 3000000 | 1 | 1 |"),
        "{summary}"
    );
    assert!(
        summary.contains("| conventional | 20.00 ± 0.00 | 4.00 ± 0.00 | 0 | 1 | 1 |"),
        "{summary}"
    );
    assert!(summary.contains("5 Mbit/s / 60 ms one way"), "{summary}");
    // The cellular delay given again is the one the summary states and reproduces (U15).
    let o = summarize(Some("200"));
    assert!(o.status.success(), "{}", stderr(&o));
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.contains("5 Mbit/s / 200 ms one way"), "{summary}");
    assert!(summary.contains(" --cellular-delay 200`"), "{summary}");
    let o = summarize(Some("0"));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("1 to 1000 ms"), "{}", stderr(&o));
    // A file that records its delay needs no flag, and refuses another.
    let recorded: String = csv
        .lines()
        .enumerate()
        .map(|(i, l)| {
            let tail = if i == 0 {
                ",sender_peak_bytes,sender_unacked_peak_bytes,receiver_peak_bytes,cellular_delay_ms"
            } else {
                ",0,0,0,100"
            };
            format!("{l}{tail}\n")
        })
        .collect();
    std::fs::write(out.join("results.csv"), recorded).unwrap();
    let o = summarize(None);
    assert!(o.status.success(), "{}", stderr(&o));
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.contains("5 Mbit/s / 100 ms one way"), "{summary}");
    assert!(summary.contains(" --cellular-delay 100`"), "{summary}");
    let o = summarize(Some("200"));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("measured with --cellular-delay 100, not 200"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_config_file_given_to_a_lab_is_said_to_be_unread() {
    // A plan file is a lab's configuration; -c used to be validated and then ignored quietly.
    let home = tmp("labcfg");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let plan = root.join("lab/plans/paper001-upload.toml");
    let cfg = home.join("lab.toml");
    std::fs::write(&cfg, "[demo]\nclients = 3\n").unwrap();
    let check = [
        "run".to_string(),
        "--check".into(),
        plan.display().to_string(),
    ];
    let o = qgate(&home)
        .args(&check)
        .args(["-c".to_string(), cfg.display().to_string()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("is not read"), "{}", stderr(&o));
    // Inherited from the environment it is a default for every command, not a mistake here.
    let o = qgate(&home)
        .env("QGATE_LAB_CONFIG", &cfg)
        .args(&check)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("is not read"), "{}", stderr(&o));
}

#[test]
fn lab_run_repeat_check_runs_each_run_twice() {
    let home = tmp("repeat");
    let plan = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../lab/plans/paper003-single.toml");
    let out = home.join("out");
    let o = run(
        &home,
        &[
            "run",
            &plan.display().to_string(),
            "--quick",
            "--repeat-check",
            "--out",
            &out.display().to_string(),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(err.contains("gave the same numbers twice"), "{err}");
    // Eight runs of four variants: each progress line twice.
    assert_eq!(err.matches("tcp-tls12 seed 1").count(), 2, "{err}");
    assert!(out.join("results.csv").exists());
}
