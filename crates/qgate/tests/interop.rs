//! HTTP/3 interop with other QUIC stacks (issue 13 item 4): devices on aioquic (PyPI) and on
//! quic-go (Go module proxy) register with `qgate gateway` and post records through it to
//! `qgate server` — across a lossy link emulated by `qgate-lab linkem` when running as root (as CI
//! does), on loopback otherwise — and `qgate get`/`post` talk to their HTTP/3 servers.
//!
//! The peers are this project's code in `interop/` (`aioquic/h3peer.py`, `quicgo/main.go`);
//! `.ci/run` installs aioquic, and the Go peer is built here. With `QGATE_INTEROP` set a missing
//! peer fails the test instead of skipping it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

mod common;
use common::{first_line, listening_addr, root};

/// Records each device posts.
const RECORDS: usize = 30;

fn interop_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../interop")
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("qgate-interop-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A peer that cannot run: fail under `QGATE_INTEROP` (CI), else say why and skip.
fn missing(why: &str) -> Option<PathBuf> {
    if std::env::var_os("QGATE_INTEROP").is_some() {
        panic!("interop peer missing: {why}");
    }
    eprintln!("skipped: {why}");
    None
}

/// `python3 h3peer.py`, if aioquic imports.
fn aioquic_peer() -> Option<PathBuf> {
    let ok = Command::new("python3")
        .args(["-c", "import aioquic"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        return missing("aioquic is not installed (python3 -m pip install aioquic==1.2.0)");
    }
    Some(interop_dir().join("aioquic/h3peer.py"))
}

/// The quic-go peer, built once per test run.
fn quicgo_peer() -> Option<PathBuf> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("quicgo-peer");
        let o = Command::new("go")
            .args(["build", "-buildvcs=false", "-o"])
            .arg(&out)
            .arg(".")
            .current_dir(interop_dir().join("quicgo"))
            .output()
            .map_err(|e| format!("go: {e}"))?;
        if !o.status.success() {
            return Err(format!(
                "go build interop/quicgo failed: {}",
                String::from_utf8_lossy(&o.stderr)
            ));
        }
        Ok(out)
    });
    match built {
        Ok(p) => Some(p.clone()),
        Err(e) => missing(e),
    }
}

fn show(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The value after `"key":` in a one-line JSON report (numbers only).
fn number(line: &str, key: &str) -> u64 {
    let at = line
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("no {key} in {line}"));
    line[at + key.len() + 3..]
        .trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{key} is not a number in {line}"))
}

/// Every stored body of ingest stream `stream` under the server's sink directory.
fn stored(sink: &Path, stream: &str) -> Vec<Vec<u8>> {
    let Ok(dir) = std::fs::read_dir(sink.join(stream)) else {
        return Vec::new();
    };
    dir.flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "bin"))
        .map(|e| std::fs::read(e.path()).unwrap())
        .collect()
}

/// The bodies a peer's device sends: "TAG record I " padded with dots to 200 bytes.
fn expected(tag: &str) -> BTreeSet<Vec<u8>> {
    (0..RECORDS)
        .map(|i| {
            let mut b = format!("{tag} record {i} ").into_bytes();
            b.resize(200, b'.');
            b
        })
        .collect()
}

#[test]
fn aioquic_and_quic_go_devices_post_through_the_gateway() {
    let (Some(aioquic), Some(quicgo)) = (aioquic_peer(), quicgo_peer()) else {
        return;
    };
    let home = tmp("devices");
    let sink = home.join("sink");
    let q = env!("CARGO_BIN_EXE_qgate");
    let ca = home.join("dev-pki/ca.pem");
    let devices = |peer: &str, port: u16| {
        format!(
            "python3 '{}' device {peer} {port} --ca '{ca}' --records {RECORDS} --body-bytes 200 \
             --tag aioquic && '{}' device {peer} {port} -ca '{ca}' -records {RECORDS} \
             -body-bytes 200 -tag quicgo",
            aioquic.display(),
            quicgo.display(),
            ca = ca.display(),
        )
    };
    let o = if root() {
        // The daemons in linkem's outside namespace (its own loopback and ports).
        let (server_log, gateway_log) = (home.join("server.log"), home.join("gateway.log"));
        let daemons = format!(
            "'{q}' server --listen 127.0.0.1:14400 --sink '{}' > '{}' 2>&1 & \
             exec '{q}' gateway --listen 0.0.0.0:4433 --path 127.0.0.1:0=127.0.0.1:14400 > '{}' 2>&1",
            sink.display(),
            server_log.display(),
            gateway_log.display()
        );
        // The devices start once both daemons say they listen (the CA they load exists by
        // then), at most 30 s, rather than after a fixed pause.
        let ready = format!(
            "i=0; until grep -q listening '{}' 2>/dev/null && grep -q listening '{}' 2>/dev/null; \
             do i=$((i+1)); [ $i -gt 600 ] && echo 'the daemons did not start' >&2 && \
             cat '{}' '{}' >&2 && exit 1; sleep 0.05; done; ",
            server_log.display(),
            gateway_log.display(),
            server_log.display(),
            gateway_log.display()
        );
        // 5 % loss each way on the devices' access link, 20 Mbit/s, 10 ms.
        Command::new(common::lab_binary())
            .args([
                "linkem",
                "--link",
                "rate=20mbit,delay=10ms,loss=0.05",
                "--outside",
                &daemons,
                "--",
                "sh",
                "-c",
                &format!("{ready}{}", devices("$QGATE_LINKEM_PEER", 4433)),
            ])
            .env("QGATE_HOME", &home)
            .env_remove("QGATE_CONFIG")
            .output()
            .unwrap()
    } else {
        eprintln!("not root: over loopback, without the emulated lossy link");
        let daemon = |args: &[&str]| {
            let mut c = Command::new(q);
            c.args(args)
                .env("QGATE_HOME", &home)
                .env_remove("QGATE_CONFIG");
            first_line(&mut c)
        };
        let sink_dir = sink.to_str().unwrap();
        let (_server, line) = daemon(&["server", "--listen", "127.0.0.1:0", "--sink", sink_dir]);
        let path = format!("127.0.0.1:0={}", listening_addr(&line));
        let (_gateway, line) = daemon(&["gateway", "--listen", "127.0.0.1:0", "--path", &path]);
        Command::new("sh")
            .args(["-c", &devices("127.0.0.1", listening_addr(&line).port())])
            .output()
            .unwrap()
    };
    let text = show(&o);
    eprintln!("{text}");
    assert!(o.status.success(), "{text}");
    let reports: Vec<&str> = text.lines().filter(|l| l.contains("\"stack\"")).collect();
    assert_eq!(reports.len(), 2, "{text}");
    for (report, stream, tag) in [
        (reports[0], "aioquic", "aioquic"),
        (reports[1], "quicgo", "quicgo"),
    ] {
        assert_eq!(number(report, "created"), RECORDS as u64, "{report}");
        assert_eq!(number(report, "hash_id_hex_digits"), 32, "{report}");
        assert_eq!(number(report, "without_hash_id"), 401, "{report}");
        // Each record stored once, byte for byte (the devices retry only on 502/503 answers).
        let got = stored(&sink, stream);
        assert_eq!(got.len(), RECORDS, "{stream}: {} stored\n{text}", got.len());
        assert_eq!(got.into_iter().collect::<BTreeSet<_>>(), expected(tag));
    }
}

/// Devices with certificates (issue 49, decision G30): a gateway with `--device-ca` takes the
/// aioquic and quic-go devices that present a certificate its CA signed (Ed25519, from `qgate
/// pki`), and refuses the same devices without one: nothing of theirs is stored. On loopback.
#[test]
fn aioquic_and_quic_go_devices_authenticate_with_certificates() {
    let (Some(aioquic), Some(quicgo)) = (aioquic_peer(), quicgo_peer()) else {
        return;
    };
    let home = tmp("certs");
    let sink = home.join("sink");
    let fleet = home.join("fleet");
    let q = env!("CARGO_BIN_EXE_qgate");
    let qgate = |args: &[&str]| {
        let o = Command::new(q)
            .args(args)
            .env("QGATE_HOME", &home)
            .env_remove("QGATE_CONFIG")
            .output()
            .unwrap();
        assert!(o.status.success(), "{args:?}: {}", show(&o));
    };
    let f = fleet.to_str().unwrap();
    qgate(&["pki", "ca", f]);
    qgate(&["pki", "issue", "py-device", "--ca", f]);
    qgate(&["pki", "issue", "go-device", "--ca", f]);
    let daemon = |args: &[&str]| {
        let mut c = Command::new(q);
        c.args(args)
            .env("QGATE_HOME", &home)
            .env_remove("QGATE_CONFIG")
            .stderr(Stdio::null());
        first_line(&mut c)
    };
    let (_server, line) = daemon(&[
        "server",
        "--listen",
        "127.0.0.1:0",
        "--sink",
        sink.to_str().unwrap(),
    ]);
    let path = format!("127.0.0.1:0={}", listening_addr(&line));
    let device_ca = fleet.join("ca.pem");
    let (_gateway, line) = daemon(&[
        "gateway",
        "--listen",
        "127.0.0.1:0",
        "--path",
        &path,
        "--device-ca",
        device_ca.to_str().unwrap(),
    ]);
    assert!(line.contains("devices by certificate"), "{line}");
    let port = listening_addr(&line).port().to_string();
    let ca = home.join("dev-pki/ca.pem");
    let ca = ca.to_str().unwrap();
    let file = |name: &str| fleet.join(name).to_str().unwrap().to_owned();
    let run = |c: &mut Command| {
        let o = c.output().unwrap();
        (o.status.success(), show(&o))
    };
    let py = |stream: &str, creds: bool| {
        let mut c = Command::new("python3");
        c.arg(&aioquic)
            .args(["device", "127.0.0.1", &port, "--ca", ca, "--records", "10"])
            .args(["--stream", stream, "--attempts", "2", "--timeout", "5"]);
        if creds {
            c.args([
                "--cert",
                &file("py-device.pem"),
                "--key",
                &file("py-device.key"),
            ]);
        }
        run(&mut c)
    };
    let go = |stream: &str, creds: bool| {
        let mut c = Command::new(&quicgo);
        c.args(["device", "127.0.0.1", &port, "-ca", ca, "-records", "10"])
            .args(["-stream", stream, "-attempts", "2", "-timeout", "5s"]);
        if creds {
            c.args([
                "-cert",
                &file("go-device.pem"),
                "-key",
                &file("go-device.key"),
            ]);
        }
        run(&mut c)
    };
    let (ok, text) = py("pycert", true);
    assert!(ok, "aioquic with its certificate: {text}");
    let (ok, text) = go("gocert", true);
    assert!(ok, "quic-go with its certificate: {text}");
    assert_eq!(stored(&sink, "pycert").len(), 10);
    assert_eq!(stored(&sink, "gocert").len(), 10);
    let (ok, text) = py("pyanon", false);
    assert!(!ok, "aioquic without a certificate was taken: {text}");
    let (ok, text) = go("goanon", false);
    assert!(!ok, "quic-go without a certificate was taken: {text}");
    assert!(stored(&sink, "pyanon").is_empty() && stored(&sink, "goanon").is_empty());
}

/// Our HTTP/3 client against each peer's server: a GET and two POSTs (one small, one of 300 KB
/// so the body spans many DATA frames and, against the peers' 64 KiB stream windows, many
/// flow-control updates); the peer's SHA-256 of what it received must equal the file's.
#[test]
fn qgate_get_and_post_talk_to_aioquic_and_quic_go_servers() {
    let (Some(aioquic), Some(quicgo)) = (aioquic_peer(), quicgo_peer()) else {
        return;
    };
    let home = tmp("servers");
    let big = home.join("big.bin");
    let bytes: Vec<u8> = (0..300_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&big, &bytes).unwrap();
    let sum = |f: &Path| {
        let o = Command::new("sha256sum").arg(f).output().unwrap();
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    let q = env!("CARGO_BIN_EXE_qgate");
    for (name, mut peer) in [
        ("aioquic", {
            let mut c = Command::new("python3");
            c.arg(&aioquic);
            c
        }),
        ("quic-go", Command::new(&quicgo)),
    ] {
        let port = std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
            .to_string();
        let pki = home.join(name);
        let flag = if name == "aioquic" { "--pki" } else { "-pki" };
        peer.args(["server", &port, flag])
            .arg(&pki)
            .stderr(Stdio::inherit());
        let (_server, line) = first_line(&mut peer);
        assert_eq!(line.trim(), "listening", "{name}");
        let url = format!("https://localhost:{port}/ingest");
        let ca = pki.join("ca.pem");
        let run = |args: &[&str]| {
            let o = Command::new(q)
                .args(args)
                .arg("--ca")
                .arg(&ca)
                .env("QGATE_HOME", &home)
                .env_remove("QGATE_CONFIG")
                .output()
                .unwrap();
            assert!(o.status.success(), "{name}: {}", show(&o));
            String::from_utf8_lossy(&o.stdout).to_string()
        };
        assert_eq!(run(&["get", &url]), format!("hello from {name}\n"));
        let small = run(&["post", &url, "--data", "hello"]);
        assert_eq!(number(&small.replace(' ', ""), "bytes"), 5, "{small}");
        let large = run(&["post", &url, "--file", big.to_str().unwrap()]);
        assert_eq!(number(&large.replace(' ', ""), "bytes"), 300_000, "{large}");
        assert!(large.contains(&sum(&big)), "{name}: {large}");
    }
}
