//! The `qgate` binary as a user runs it: help, bad input, and a real server on loopback.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

fn qgate(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_qgate"));
    c.env("QGATE_HOME", home)
        .env_remove("QGATE_CONFIG")
        .env_remove("RUST_LOG");
    c
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("qgate-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Run `qgate ARGS…` with `home` as QGATE_HOME and wait for it.
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
        vec!["server", "--help"],
        vec!["get", "--help"],
        vec!["post", "--help"],
        vec!["demo", "--help"],
        vec!["bench", "--help"],
        vec!["bench", "sim", "--help"],
        vec!["bench", "loopback", "--help"],
        vec!["linkem", "--help"],
        vec!["lab", "aqm-kernel", "--help"],
        vec!["lab", "amqp-kernel", "--help"],
        vec!["upload", "--help"],
        vec!["lab", "upload-kernel", "--help"],
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
                .all(|l| !l.contains("--config")));
        }
    }
}

#[test]
fn malformed_url_is_a_usage_error() {
    let home = tmp("url");
    let o = run(&home, &["get", "localhost:4433/x"]);
    assert_fails(o, 2, "invalid URL 'localhost:4433/x'");
    let o = run(&home, &["get", "http://localhost/"]);
    assert_fails(o, 2, "scheme 'http' is not supported");
}

#[test]
fn missing_ca_says_what_to_do() {
    let home = tmp("noca");
    let o = run(&home, &["get", "https://localhost:4433/"]);
    assert_fails(o, 2, "no CA to trust: pass --ca FILE");
}

#[test]
fn unreachable_server_times_out_clearly() {
    let home = tmp("unreach");
    let pki = home.join("pki");
    qgate_transport::DevPki::load_or_create(&pki).unwrap();
    // A bound UDP socket that never answers.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let url = format!("https://localhost:{}/", silent.local_addr().unwrap().port());
    let o = qgate(&home)
        .args(["get", &url, "--ca"])
        .arg(pki.join("ca.pem"))
        .args(["--connect-timeout", "500ms"])
        .output()
        .unwrap();
    assert_fails(o, 1, "within 500ms: is a qgate server listening there?");
}

#[test]
fn bad_certificate_files_are_named() {
    let home = tmp("certs");
    let o = run(
        &home,
        &[
            "server",
            "--listen",
            "127.0.0.1:0",
            "--cert",
            "/nonexistent/c.pem",
            "--key",
            "/nonexistent/k.pem",
        ],
    );
    assert_fails(o, 2, "/nonexistent/c.pem: No such file");
    let junk = home.join("junk.pem");
    std::fs::write(&junk, "not pem at all").unwrap();
    let o = qgate(&home)
        .args(["server", "--listen", "127.0.0.1:0", "--cert"])
        .arg(&junk)
        .arg("--key")
        .arg(&junk)
        .output()
        .unwrap();
    assert_fails(o, 2, "junk.pem: contains no CERTIFICATE block");
    let o = qgate(&home)
        .args(["get", "https://localhost/", "--ca"])
        .arg(&junk)
        .output()
        .unwrap();
    assert_fails(o, 2, "junk.pem: contains no CERTIFICATE block");
}

#[test]
fn malformed_config_is_named_with_its_line() {
    let home = tmp("config");
    let cfg = home.join("bad.toml");
    std::fs::write(&cfg, "[server]\nlisten = \"127.0.0.1:4433\"\nlistne = 5\n").unwrap();
    let o = qgate(&home)
        .arg("--config")
        .arg(&cfg)
        .args(["demo"])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(err.contains("bad.toml") && err.contains("line 3"), "{err}");
    assert_fails(o, 2, "unknown field `listne`");

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

/// Run `qgate lab LAB --quick` into a fresh directory and check it wrote `files`; returns the
/// home and output directories.
fn run_lab_quick(lab: &str, files: &[&str]) -> (PathBuf, PathBuf) {
    let home = tmp(&format!("lab-{lab}"));
    let out = home.join(lab);
    let o = qgate(&home)
        .args(["lab", lab, "--quick", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    for f in files {
        assert!(out.join(f).exists(), "{lab}: {f} missing");
    }
    (home, out)
}

/// A `qgate server` on 127.0.0.1 with a free port, killed when dropped; its admin address.
struct Server(Child, String);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start `qgate server --listen 127.0.0.1:0 ARGS…` and return it with the port it printed.
fn start_server(home: &Path, args: &[&std::ffi::OsStr]) -> (Server, String) {
    start_server_with(home, args, &[])
}

/// [`start_server`] with extra environment variables.
fn start_server_with(
    home: &Path,
    args: &[&std::ffi::OsStr],
    envs: &[(&str, &Path)],
) -> (Server, String) {
    let mut cmd = qgate(home);
    cmd.envs(envs.iter().copied())
        .args([
            "server",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
        ])
        .args(args);
    let (server, port, _) = spawn_daemon(cmd);
    (server, port)
}

/// Spawn a daemon that first prints "… on udp/127.0.0.1:PORT …, admin http://ADDR/ …" (as
/// `qgate server` and `qgate gateway` do); killed when dropped. It, its port and that line.
fn spawn_daemon(mut cmd: Command) -> (Server, String, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let admin = line
        .split("admin http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no admin address in {line}"))
        .to_string();
    let port = line
        .split(':')
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .to_string();
    (Server(child, admin), port, line)
}

/// The files Wireshark and qvis read: a qlog per connection on both ends, and both ends' TLS
/// secrets for the same handshake.
#[test]
fn qlog_and_key_log_for_wireshark() {
    let home = tmp("qlog");
    let (sq, cq) = (home.join("server-qlog"), home.join("client-qlog"));
    let (skeys, ckeys) = (home.join("server-keys"), home.join("client-keys"));
    let (mut server, port) = start_server_with(
        &home,
        &["--qlog-dir".as_ref(), sq.as_os_str()],
        &[("SSLKEYLOGFILE", &skeys)],
    );
    let o = qgate(&home)
        .env("QLOGDIR", &cq)
        .env("SSLKEYLOGFILE", &ckeys)
        .args([
            "post",
            &format!("https://localhost:{port}/ingest"),
            "-d",
            "x",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("SSLKEYLOGFILE is set"),
        "{}",
        stderr(&o)
    );
    // A graceful stop frees every connection's state, which completes its qlog file.
    assert_eq!(terminate(&mut server).code(), Some(0));
    let one = |dir: &Path, prefix: &str| {
        let files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(files.len(), 1, "{files:?}");
        let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with(prefix) && name.ends_with(".sqlog"),
            "{name}"
        );
        std::fs::read_to_string(&files[0]).unwrap()
    };
    let client = one(&cq, "client-localhost_127.0.0.1_");
    // JSON-SEQ (RFC 7464): each record starts with the record separator.
    assert!(client.starts_with("\u{1e}{") && client.contains("\"qlog_format\":\"JSON-SEQ\""));
    assert!(client.contains("transport:packet_sent"), "{client}");
    // Secrets: the server logged the same handshakes' (by client random) as the client.
    let randoms = |f: &Path| {
        let text = std::fs::read_to_string(f).unwrap();
        let mut r: Vec<String> = text
            .lines()
            .filter(|l| l.starts_with("CLIENT_TRAFFIC_SECRET_0 "))
            .map(|l| l.split(' ').nth(1).unwrap().to_string())
            .collect();
        r.sort();
        r
    };
    let c = randoms(&ckeys);
    assert_eq!(c.len(), 1, "one handshake");
    assert_eq!(randoms(&skeys), c);
    let server_log = one(&sq, "server-127.0.0.1_");
    assert!(
        server_log.contains("transport:packet_received"),
        "{server_log}"
    );
    // Every record whole: RS, one JSON value, newline.
    for log in [&client, &server_log] {
        assert!(log.ends_with('\n'));
        for rec in log.split('\u{1e}').skip(1) {
            serde_json::from_str::<serde_json::Value>(rec.trim_end())
                .unwrap_or_else(|e| panic!("{e}: {rec}"));
        }
    }
}

#[test]
fn server_post_get_over_loopback() {
    let home = tmp("e2e");
    let sink = home.join("sink");
    let (server, port) = start_server(
        &home,
        &[
            "--max-body".as_ref(),
            "1000".as_ref(),
            "--sink".as_ref(),
            sink.as_os_str(),
        ],
    );
    let base = format!("https://localhost:{port}");
    let ca = home.join("dev-pki/ca.pem");
    assert!(ca.exists(), "the server created the development CA");

    // The default CA location is found without --ca.
    let o = run(
        &home,
        &[
            "post",
            &format!("{base}/ingest/sensors"),
            "--data",
            "t=21.5",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let body = String::from_utf8_lossy(&o.stdout);
    assert!(body.contains("\"bytes\":6"), "{body}");
    let stored: Vec<_> = std::fs::read_dir(sink.join("sensors")).unwrap().collect();
    assert_eq!(stored.len(), 1);
    assert_eq!(
        std::fs::read(stored[0].as_ref().unwrap().path()).unwrap(),
        b"t=21.5"
    );

    let o = run(&home, &["ctl", "--admin", &server.1, "--json", "stats"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("\"ingested\": 1"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    // Counters are on the admin port only.
    let o = run(&home, &["get", &format!("{base}/stats")]);
    assert_fails(o, 3, "404 Not Found");

    // Too large → 413 and exit status 3; the server keeps serving.
    let big = home.join("big.bin");
    std::fs::write(&big, vec![0u8; 5000]).unwrap();
    let o = qgate(&home)
        .args(["post", &format!("{base}/ingest"), "--file"])
        .arg(&big)
        .output()
        .unwrap();
    assert_fails(o, 3, "413 Payload Too Large");
    let o = run(&home, &["get", &format!("{base}/nope")]);
    assert_fails(o, 3, "404 Not Found");
    let o = run(&home, &["ctl", "--admin", &server.1, "metrics"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("qgate_server_ingested_total 1"));
    let o = run(&home, &["ctl", "--admin", &server.1, "health"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), "ok\n");
    let o = run(&home, &["ctl", "--admin", &server.1, "queues"]);
    assert_fails(o, 3, "404 Not Found: no route GET /api/queues");
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
    let o = run(&home, &["lab", "aqm", "--quick", "--only", "blue"]);
    assert_fails(o, 2, "no scheme 'blue'");
}

#[test]
fn lab_margins_prints_the_table() {
    let home = tmp("margins");
    let o = run(
        &home,
        &[
            "lab", "margins", "--mbps", "50", "--rtt-ms", "42", "--flows", "30",
        ],
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
fn history_is_recorded_listed_and_cleared() {
    let home = tmp("history");
    let sink = home.join("sink");
    let server_store = home.join("server-history.redb");
    let (server, port) = start_server(
        &home,
        &[
            "--history".as_ref(),
            "ewma".as_ref(),
            "--history-store".as_ref(),
            server_store.as_os_str(),
            "--sink".as_ref(),
            sink.as_os_str(),
        ],
    );
    let url = format!("https://localhost:{port}/ingest/h");
    let store = home.join("client-history.redb");
    for _ in 0..2 {
        let o = qgate(&home)
            .args([
                "post",
                &url,
                "--data",
                "x",
                "--history",
                "mean",
                "--history-store",
            ])
            .arg(&store)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let o = qgate(&home)
        .args(["history", "list", "--store"])
        .arg(&store)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let peer = format!("localhost@127.0.0.1:{port}");
    assert!(out.contains(&peer) && out.contains("samples=2"), "{out}");
    let o = qgate(&home)
        .args(["history", "show", &peer, "--store"])
        .arg(&store)
        .output()
        .unwrap();
    assert!(o.status.success());
    let o = qgate(&home)
        .args(["history", "show", "nobody", "--store"])
        .arg(&store)
        .output()
        .unwrap();
    assert_fails(o, 2, "no history for 'nobody'");
    let o = qgate(&home)
        .args(["history", "clear", "--store"])
        .arg(&store)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("forgot 1 peers"));

    // The server recorded its side, keyed by the client's address.
    drop(server);
    let o = qgate(&home)
        .args(["history", "list", "--store"])
        .arg(&server_store)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.starts_with("127.0.0.1\t"), "{out}");

    // A corrupt store: a warning naming it, and the command still works.
    std::fs::write(&store, b"garbage garbage garbage garbage garbage garbage").unwrap();
    let o = qgate(&home)
        .args(["history", "list", "--store"])
        .arg(&store)
        .output()
        .unwrap();
    assert!(o.status.success());
    assert!(
        stderr(&o).contains("was unreadable") && stderr(&o).contains(".corrupt-"),
        "{}",
        stderr(&o)
    );

    // A safeguard below 1 would take every connection for a path change: refused, by name.
    let cfg = home.join("bad-safeguard.toml");
    std::fs::write(&cfg, "[history]\nresume = \"careful\"\nsafeguard = 0.5\n").unwrap();
    let o = run(
        &home,
        &[
            "-c",
            cfg.to_str().unwrap(),
            "history",
            "list",
            "--store",
            store.to_str().unwrap(),
        ],
    );
    assert_fails(
        o,
        2,
        "[history] safeguard = 0.5: must be 0 (off) or a factor of at least 1",
    );
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
    let o = run(&home, &["lab", "history", "--runs", "1"]);
    assert_fails(o, 2, "--runs must be at least 2");
}

#[test]
fn device_through_gateway_to_server_as_processes() {
    let home = tmp("gateway");
    let (server, sport) = start_server(&home, &[]);
    let mut cmd = qgate(&home);
    cmd.args([
        "gateway",
        "--admin",
        "127.0.0.1:0",
        "--listen",
        "127.0.0.1:0",
        "--server",
        &format!("127.0.0.1:{sport}"),
        "--path",
        "127.0.0.2:0",
        "--path",
        "127.0.0.3:0",
        "--scheduler",
        "round-robin",
    ]);
    let (gateway, gport, line) = spawn_daemon(cmd);
    let gadmin = gateway.1.clone();
    assert!(line.contains("2 paths, scheduler round-robin"), "{line}");
    // The gateway says it listens before its backhaul connections exist; a path still
    // connecting when the device starts would take no request. Wait until both are measured
    // (a path is presumed up before its first probe).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let o = run(&home, &["ctl", "--admin", &gadmin, "--json", "paths"]);
        let paths = String::from_utf8_lossy(&o.stdout).into_owned();
        if paths.matches("\"up\": true").count() == 2
            && paths.matches("\"rtt_ms\": null").count() == 0
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "paths never up: {paths}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let o = run(
        &home,
        &[
            "device",
            &format!("https://localhost:{gport}"),
            "--count",
            "20",
            "--size",
            "100",
            "--priority",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("sent 20 records of 100 B (2000 B)"), "{out}");
    assert!(
        out.contains("paths used: 0: 10, 1: 10"),
        "round-robin alternates: {out}"
    );
    let o = run(&home, &["ctl", "--admin", &server.1, "--json", "stats"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("\"ingested\": 20"));
    let o = run(&home, &["ctl", "--admin", &server.1, "sink"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // A gateway's command sent to the server: the error says what to ask instead.
    let o = run(&home, &["ctl", "--admin", &server.1, "paths"]);
    assert_fails(o, 3, "`qgate ctl routes` lists what this daemon answers");
    // The gateway's admin port: paths, counters, the scheduler switched live.
    let ctl = |args: &[&str]| {
        let o = run(&home, &[&["ctl", "--admin", &gadmin], args].concat());
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let paths = ctl(&["paths"]);
    assert!(paths.starts_with("id  up    rtt_ms"), "{paths}");
    assert_eq!(paths.lines().count(), 3, "{paths}");
    assert!(paths.lines().skip(1).all(|l| l.contains("true")), "{paths}");
    let stats = ctl(&["--json", "stats"]);
    assert!(stats.contains("\"forwarded\": 20"), "{stats}");
    assert!(stats.contains("\"batches_refused\": 0"), "{stats}");
    assert!(ctl(&["scheduler"]).contains("\"name\": \"round-robin\""));
    assert!(ctl(&["scheduler", "single"]).contains("\"before\": \"round-robin\""));
    assert!(ctl(&["scheduler"]).contains("\"name\": \"single\""));
    let o = run(&home, &["ctl", "--admin", &gadmin, "scheduler", "fastest"]);
    assert_fails(o, 3, "400 Bad Request: unknown scheduler");
    assert!(ctl(&["metrics"]).contains("qgate_gateway_forwarded_total 20\n"));
    let o = run(&home, &["ctl", "--admin", &gadmin, "close", "999"]);
    assert_fails(o, 3, "404 Not Found: no device connection 999");
    // Devices keep a window history by default (paper 002, decision H6).
    let o = qgate(&home)
        .args(["history", "list", "--store"])
        .arg(home.join("device-history.redb"))
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&o.stdout);
    assert!(
        listed.contains(&format!("localhost@127.0.0.1:{gport}")),
        "{listed}"
    );
    // A file, cut into records.
    let file = home.join("readings.csv");
    std::fs::write(&file, "t,21.5\n".repeat(100)).unwrap(); // 700 bytes
    let o = qgate(&home)
        .args([
            "device",
            &format!("https://localhost:{gport}"),
            "--size",
            "300",
            "--file",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("sent 3 records of 300 B (700 B)"));

    // Bad input: no paths, a malformed path, an unknown scheduler.
    let o = run(&home, &["gateway", "--listen", "127.0.0.1:0"]);
    assert_fails(o, 2, "no backhaul paths");
    let o = run(&home, &["gateway", "--path", "nowhere"]);
    assert_fails(o, 2, "'nowhere' is not an address");
    let o = run(
        &home,
        &[
            "gateway",
            "--server",
            "127.0.0.1:1",
            "--path",
            "127.0.0.2:0",
            "--scheduler",
            "fastest",
        ],
    );
    assert_fails(o, 2, "unknown scheduler 'fastest'");

    // Every limit is a flag whose help shows the default the code uses (issue 18).
    let o = run(&home, &["gateway", "--help"]);
    let help = String::from_utf8_lossy(&o.stdout).replace('\n', " ");
    for (flag, default) in [
        ("--max-inflight-per-device", "[default: 8]"),
        ("--max-sessions-per-connection", "[default: 4]"),
        ("--max-sessions-per-address", "[default: 256]"),
        ("--session-idle-timeout", "[default: 600s]"),
        ("--max-handshakes", "[default: 256]"),
        ("--retry-above", "[default: 16]"),
        ("--handshake-timeout", "[default: 10s]"),
    ] {
        let at = help
            .find(flag)
            .unwrap_or_else(|| panic!("no {flag} in:\n{help}"));
        let next = help[at + 2..]
            .find(" --")
            .map_or(help.len(), |i| at + 2 + i);
        assert!(
            help[at..next].contains(default),
            "{flag}: {}",
            &help[at..next]
        );
    }
}

#[test]
fn lab_faults_quick_loses_nothing() {
    let (_home, out) = run_lab_quick("faults", &["results.csv", "summary.md"]);
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.contains("**Lost over every run: 0**"), "{summary}");
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
            .args(["lab", "run", "-j", "2", "--out"])
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
    // A rerun into the same directory replaces the previous run's files, leaving no stale ones
    // (a figure of another name here), and other files alone.
    std::fs::write(a.join("bars-old-metric.svg"), "<svg/>").unwrap();
    std::fs::write(a.join("notes.txt"), "mine").unwrap();
    run_to("a");
    assert!(!a.join("bars-old-metric.svg").exists());
    assert!(a.join("bars-dl-latency_s_mean.svg").exists() && a.join("notes.txt").exists());
    // An --out that cannot be written is refused before anything runs.
    std::fs::write(home.join("afile"), "").unwrap();
    let o = qgate(&home)
        .args(["lab", "run", "--out"])
        .arg(home.join("afile/sub"))
        .arg(&plan)
        .output()
        .unwrap();
    assert_fails(o, 2, "cannot write there");

    std::fs::write(&plan, TINY_PLAN.replace("delay_ms = 10", "dealy_ms = 10")).unwrap();
    let o = run(&home, &["lab", "run", plan.to_str().unwrap()]);
    assert_fails(o, 2, "tiny.toml:14: unknown field `dealy_ms`");
    std::fs::write(&plan, TINY_PLAN.replace("\"ewma\" }", "\"fastest\" }")).unwrap();
    let o = run(&home, &["lab", "run", plan.to_str().unwrap()]);
    assert_fails(o, 2, "scheme 'ewma': unknown variant `fastest`");
    let o = run(&home, &["lab", "run", "--set", "plan.seeds=0", "nope.toml"]);
    assert_fails(o, 2, "nope.toml: cannot read");
}

#[test]
fn shipped_plans_check() {
    let home = tmp("plans");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../lab/plans");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let o = run(&home, &["lab", "run", "--check", p.to_str().unwrap()]);
        assert!(o.status.success(), "{}: {}", p.display(), stderr(&o));
        let o = run(
            &home,
            &["lab", "run", "--check", "--quick", p.to_str().unwrap()],
        );
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
    let o = run(&home, &["lab", "amqp", "--seeds", "0"]);
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

#[test]
fn a_gateway_path_shape_it_cannot_do_is_refused_before_anything_binds() {
    let home = tmp("shape");
    for (shape, says) in [
        ("\"delay=5ms\"", "shaping needs a rate"),
        ("\"rate=10mbit,loss=1%\"", "rate and a queue only"),
        ("\"rate=10mbps\"", "ambiguous"),
        ("{ rate_mbps = 10, colour = 1 }", "colour"),
    ] {
        let cfg = home.join("gw.toml");
        std::fs::write(
            &cfg,
            format!(
                "[gateway]\nserver = \"127.0.0.1:9\"\n[[gateway.paths]]\nlocal = \"127.0.0.1:0\"\nshape = {shape}\n"
            ),
        )
        .unwrap();
        let o = run(&home, &["-c", cfg.to_str().unwrap(), "gateway"]);
        assert_fails(o, 2, says);
    }
    // So is a path with no connection or too many (decision G21).
    for n in [0, 17] {
        let cfg = home.join("gw.toml");
        std::fs::write(
            &cfg,
            format!(
                "[gateway]\nserver = \"127.0.0.1:9\"\n[[gateway.paths]]\nlocal = \"127.0.0.1:0\"\nconnections = {n}\n"
            ),
        )
        .unwrap();
        let o = run(&home, &["-c", cfg.to_str().unwrap(), "gateway"]);
        assert_fails(o, 2, "connections must be 1 to 16");
    }
}

#[test]
fn upload_over_two_interfaces_to_a_server() {
    let home = tmp("upload");
    let recv = home.join("recv");
    let (mut server, port) = start_server(&home, &["--uploads".as_ref(), recv.as_os_str()]);
    let file = home.join("data.bin");
    let bytes: Vec<u8> = (0..700_001u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&file, &bytes).unwrap();
    let url = format!("https://localhost:{port}");
    let f = file.to_str().unwrap();
    let o = run(
        &home,
        &[
            "upload",
            f,
            &url,
            "--via",
            "127.0.0.1",
            "--via",
            "127.0.0.2",
            "--chunk",
            "16KiB",
            "-q",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("uploaded data.bin: 700001 bytes"), "{out}");
    assert!(out.contains("interface 2 (127.0.0.2)"), "{out}");
    assert_eq!(std::fs::read(recv.join("data.bin")).unwrap(), bytes);
    // Again under the same name: already complete, nothing sent.
    let o = run(&home, &["upload", f, &url, "-q"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("700001 bytes were already there"));
    // A different file under that name is refused (exit 3) and the stored one is kept.
    std::fs::write(&file, b"something else").unwrap();
    let o = run(
        &home,
        &["upload", f, &format!("{url}/upload/data.bin"), "-q"],
    );
    assert_fails(o, 3, "409 Conflict");
    assert_eq!(std::fs::read(recv.join("data.bin")).unwrap(), bytes);
    // Bad input: clear usage errors.
    assert_fails(
        run(&home, &["upload", "/nonexistent", &url]),
        2,
        "cannot open /nonexistent",
    );
    assert_fails(
        run(&home, &["upload", f, &format!("{url}/ingest/x")]),
        2,
        "the path must be /upload/NAME",
    );
    assert_fails(
        run(&home, &["upload", f, &url, "--chunk", "10"]),
        2,
        "chunk size must be",
    );
    assert_fails(
        run(&home, &["upload", f, &url, "--chunk", "1mb"]),
        2,
        "unknown unit 'mb'",
    );
    assert_fails(
        run(&home, &["upload", f, &url, "--via", "10.255.255.1"]),
        2,
        "--via 10.255.255.1",
    );
    // A server without --uploads says how to turn them on.
    let (_plain, plain) = start_server(&home, &[]);
    let o = run(
        &home,
        &["upload", f, &format!("https://localhost:{plain}"), "-q"],
    );
    assert_fails(o, 3, "start it with --uploads DIR");
    // SIGTERM, what service managers send, stops the server gracefully (exit 0, not death
    // by the signal).
    let status = terminate(&mut server);
    assert_eq!(status.code(), Some(0), "{status:?}");
}

/// Send SIGTERM to `server` and wait (at most 20 s) for it to exit.
fn terminate(server: &mut Server) -> std::process::ExitStatus {
    // SAFETY: kill(2) on our own child's pid. (The suite runs on Linux: linkem, MPTCP.)
    assert_eq!(unsafe { libc_kill(server.0.id() as i32, 15) }, 0);
    let start = std::time::Instant::now();
    loop {
        if let Some(st) = server.0.try_wait().unwrap() {
            return st;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(20),
            "no exit"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
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
        let mut args = vec!["lab", "upload-kernel", "--summarize", "--only"];
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
    let cfg = root.join("docs/examples/gateway.toml");
    let check = [
        "lab".to_string(),
        "run".into(),
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
        .env("QGATE_CONFIG", &cfg)
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
            "lab",
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
