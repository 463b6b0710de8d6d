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
        vec!["gateway", "--help"],
        vec!["device", "--help"],
        vec!["broker", "--help"],
        vec!["send", "--help"],
        vec!["recv", "--help"],
        vec!["ctl", "--help"],
        vec!["history", "--help"],
        vec!["upload", "--help"],
    ] {
        let o = qgate(&home).args(&args).output().unwrap();
        assert!(o.status.success(), "{args:?}");
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains("Usage"), "{args:?}");
        // The product's help names no lab command.
        for lab in ["demo", "bench", "linkem", "lab "] {
            assert!(
                !out.lines().any(|l| l.trim_start().starts_with(lab)),
                "{args:?}: {lab} listed in\n{out}"
            );
        }
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
fn version_names_the_commit() {
    let o = run(&tmp("version"), &["--version"]);
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.starts_with("qgate ") && out.contains(" (commit "),
        "{out}"
    );
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
fn malformed_config_is_named_with_its_line() {
    let home = tmp("config");
    let cfg = home.join("bad.toml");
    std::fs::write(&cfg, "[server]\nlisten = \"127.0.0.1:4433\"\nlistne = 5\n").unwrap();
    let o = qgate(&home)
        .arg("--config")
        .arg(&cfg)
        .args(["history", "list"])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(err.contains("bad.toml") && err.contains("line 3"), "{err}");
    assert_fails(o, 2, "unknown field `listne`");

    std::fs::write(&cfg, "[transport]\nkeep_alive_ms = 0\n").unwrap();
    let o = qgate(&home)
        .arg("--config")
        .arg(&cfg)
        .args(["history", "list"])
        .output()
        .unwrap();
    assert_fails(o, 2, "keep_alive_ms");

    let o = run(
        &home,
        &["--config", "/nonexistent/q.toml", "history", "list"],
    );
    assert_fails(o, 2, "cannot read config file /nonexistent/q.toml");

    // The lab's tables are the lab's: the product names them as unknown.
    std::fs::write(&cfg, "[demo]\nclients = 3\n").unwrap();
    let o = qgate(&home)
        .arg("--config")
        .arg(&cfg)
        .args(["history", "list"])
        .output()
        .unwrap();
    assert_fails(o, 2, "unknown field `demo`");
    let o = qgate(&home)
        .arg("--config")
        .arg(&cfg)
        .args(["history", "list"])
        .output()
        .unwrap();
    assert_fails(o, 2, "give them to qgate-lab --config");
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
    let o = run(
        &home,
        &[
            "gateway",
            "--server",
            "127.0.0.1:1",
            "--path",
            "127.0.0.2:0",
            "--max-body",
            "2048",
            "--max-buffered",
            "1024",
        ],
    );
    assert_fails(o, 2, "max_body (2048) is larger than max_buffered (1024)");

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
        ("--max-buffered", "[default: 268435456]"),
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

/// A gateway whose server is not there says so in its log, and says when it comes (issue 53
/// item 1: it used to say nothing until a device got a 502).
#[test]
fn a_gateway_says_when_its_server_is_unreachable_and_when_it_is_back() {
    let home = tmp("gateway-unreachable");
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = qgate(&home)
        .args([
            "gateway",
            "--listen",
            "127.0.0.1:0",
            "--probe-interval",
            "1s",
        ])
        .args([
            "--server",
            &format!("127.0.0.1:{port}"),
            "--path",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Whatever happens, the gateway is gone within a minute, so a read below cannot hang.
    let pid = child.id().to_string();
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(60));
        let _ = Command::new("kill").arg(&pid).status();
    });
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    // The lines before the first that holds `needle`.
    let mut until = |needle: &str| {
        let mut seen = Vec::new();
        for l in lines.by_ref().map_while(Result::ok) {
            if l.contains(needle) {
                return seen;
            }
            seen.push(l);
        }
        panic!("no '{needle}' in the gateway's log: {seen:?}")
    };
    let before = until("backhaul path down");
    assert!(
        before.iter().all(|l| !l.contains("backhaul path")),
        "{before:?}"
    );
    let mut server = qgate(&home);
    server.args(["server", "--listen", &format!("127.0.0.1:{port}")]);
    server.args(["--admin", "127.0.0.1:0"]);
    let (_server, _, _) = spawn_daemon(server);
    let between = until("backhaul path back up");
    let _ = child.kill();
    let _ = child.wait();
    // Reminders while down are at most one a minute: none in these few seconds.
    assert!(
        between.iter().filter(|l| l.contains("still down")).count() <= 1,
        "{between:?}"
    );
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
