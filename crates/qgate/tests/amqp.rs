//! `qgate broker`, `qgate send`, `qgate recv` as processes: durability across `kill -9`, the CLI
//! round trip, and configuration errors.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fe2o3_amqp::types::messaging::{Body, MessageId, Outcome};
use fe2o3_amqp::types::primitives::Value;
use qgate_amqp::client::{self, Connector};
use qgate_amqp::transport::Scheme;
use qgate_transport::{DevPki, TransportOptions};

fn qgate(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_qgate"));
    c.env("QGATE_HOME", home)
        .env_remove("QGATE_CONFIG")
        .env_remove("RUST_LOG");
    c
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("qgate-amqp-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A broker process, killed (SIGKILL) when dropped.
struct BrokerProc {
    child: Child,
    quic: SocketAddr,
    tcp: SocketAddr,
}

impl Drop for BrokerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Spawn `cmd` with stdout piped and return it with the first line it printed.
fn spawn_first_line(cmd: &mut Command) -> (Child, String) {
    let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line)
}

/// The text of `line` after `tag`, up to the first of `end`.
fn after(line: &str, tag: &str, end: &[char]) -> String {
    line.split(tag)
        .nth(1)
        .and_then(|r| r.split(end).next())
        .unwrap_or_else(|| panic!("no {tag} in {line}"))
        .trim()
        .to_string()
}

fn start_broker(home: &Path, quic: &str, tcp: &str, extra: &[&str]) -> BrokerProc {
    let mut child = qgate(home)
        .args(["broker", "--quic", quic, "--tcp", tcp])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    // "qgate broker listening: quic udp/A, tcp tcp/B; store …"
    let addr = |tag: &str| -> SocketAddr {
        let i = line.find(tag).unwrap_or_else(|| panic!("{tag} in {line}")) + tag.len();
        line[i..]
            .split([',', ';'])
            .next()
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let (quic, tcp) = (addr("quic udp/"), addr("tcp tcp/"));
    BrokerProc { child, quic, tcp }
}

#[test]
fn accepted_messages_survive_kill_9_and_restart() {
    let home = tmp("durable");
    let store = home.join("broker.redb");
    let store_arg = store.to_str().unwrap();
    let broker = start_broker(&home, "127.0.0.1:0", "127.0.0.1:0", &["--store", store_arg]);
    let pki = DevPki::load_or_create(&home.join("dev-pki")).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let accepted = Arc::new(Mutex::new(BTreeSet::new()));
    let broker = Arc::new(Mutex::new(Some(broker)));
    let tcp = broker.lock().unwrap().as_ref().unwrap().tcp;
    rt.block_on(async {
        let c = Connector::new(
            Scheme::Tcp,
            tcp,
            "localhost",
            &pki.trust(),
            None,
            None,
            &TransportOptions::default(),
        )
        .unwrap();
        let (mut cl, _) = c.open().await.unwrap();
        let mut s = cl.sender("durable", "orders", false).await.unwrap();
        let mut inflight = futures_util::stream::FuturesUnordered::new();
        use futures_util::StreamExt;
        // Send until the broker dies under us: it is killed once 3000 messages are accepted.
        // Every wait is bounded: once the broker is gone, a send or an outcome may never come.
        let wait = Duration::from_secs(3);
        'send: for i in 0u64..1_000_000 {
            let fut = match tokio::time::timeout(
                wait,
                s.send_batchable(client::message(i, vec![7; 100])),
            )
            .await
            {
                Ok(Ok(f)) => f,
                _ => break 'send,
            };
            inflight.push(async move { (i, fut.await) });
            while inflight.len() >= 200 {
                match tokio::time::timeout(wait, inflight.next()).await {
                    Ok(Some((id, Ok(Outcome::Accepted(_))))) => {
                        let n = {
                            let mut a = accepted.lock().unwrap();
                            a.insert(id);
                            a.len()
                        };
                        if n == 3000 {
                            // SIGKILL: no shutdown path runs. Stop sending; count what resolves.
                            drop(broker.lock().unwrap().take());
                            break 'send;
                        }
                    }
                    _ => break 'send,
                }
            }
        }
        // Whatever else resolves as accepted counts too.
        while let Ok(Some(r)) = tokio::time::timeout(Duration::from_secs(2), inflight.next()).await
        {
            if let (id, Ok(Outcome::Accepted(_))) = r {
                accepted.lock().unwrap().insert(id);
            }
        }
    });
    let accepted = accepted.lock().unwrap().clone();
    assert!(accepted.len() >= 3000, "{}", accepted.len());
    // Restart on the same store and drain the queue.
    let broker = start_broker(&home, "127.0.0.1:0", "127.0.0.1:0", &["--store", store_arg]);
    let received = rt.block_on(async {
        let c = Connector::new(
            Scheme::Quic,
            broker.quic,
            "localhost",
            &pki.trust(),
            None,
            None,
            &TransportOptions::default(),
        )
        .unwrap();
        let (mut cl, _) = c.open().await.unwrap();
        let mut r = cl.receiver("drain", "orders", false, 500).await.unwrap();
        let mut got = BTreeSet::new();
        while let Ok(Ok(d)) =
            tokio::time::timeout(Duration::from_secs(3), r.recv::<Body<Value>>()).await
        {
            if let Some(MessageId::Ulong(id)) = d
                .message()
                .properties
                .as_ref()
                .and_then(|p| p.message_id.clone())
            {
                got.insert(id);
            }
            r.accept(&d).await.unwrap();
        }
        got
    });
    let lost: Vec<_> = accepted.difference(&received).take(10).collect();
    assert!(
        lost.is_empty(),
        "{} accepted messages lost, e.g. {lost:?}",
        accepted.len() - accepted.intersection(&received).count()
    );
    drop(broker);
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn send_and_recv_round_trip_as_processes() {
    let home = tmp("cli");
    let b = start_broker(&home, "127.0.0.1:0", "127.0.0.1:0", &["--memory"]);
    let quic = b.quic.to_string();
    let o = qgate(&home)
        .args(["send", &quic, "greetings", "--count", "50", "--size", "10"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("sent 50 messages (500 bytes) over quic"),
        "{err}"
    );
    assert!(err.contains("startup") && err.contains("msg/s"), "{err}");
    // quic-mux: every AMQP connection a stream of one QUIC connection.
    let o = qgate(&home)
        .args([
            "send",
            &quic,
            "greetings",
            "--count",
            "5",
            "--size",
            "10",
            "--one-per-connection",
            "--transport",
            "quic-mux",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("5 connections over 1 QUIC handshake(s)"),
        "{err}"
    );
    // `qgate-lab amqp-kernel` reads the same summary line.
    let (total, startup) =
        qgate::parse_send_line(&err).unwrap_or_else(|| panic!("no summary line: {err}"));
    assert!(total > 0.0 && startup > 0.0, "{err}");
    // A body larger than one frame is refused by name, not as a framing error.
    let o = qgate(&home)
        .args([
            "send",
            &quic,
            "greetings",
            "--count",
            "1",
            "--size",
            "70000",
            "--one-per-connection",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("does not fit one 65536-byte frame"), "{err}");
    let mut child = qgate(&home)
        .args([
            "send",
            &b.tcp.to_string(),
            "lines",
            "--stdin",
            "--transport",
            "tcp",
            "--settle",
        ])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"temperature=21.5\nhumidity=40\n")
        .unwrap();
    assert!(child.wait_with_output().unwrap().status.success());
    let o = qgate(&home)
        .args(["recv", &quic, "lines", "--count", "2", "--print"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "temperature=21.5\nhumidity=40\n"
    );
    let o = qgate(&home)
        .args(["recv", &quic, "greetings", "--count", "60", "--idle", "2s"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("received 55 of 60"), "{err}");
    // Host names and URLs: the URL names the transport and the queue.
    let url = format!("amqp+quic://localhost:{}/by-url", b.quic.port());
    let o = qgate(&home)
        .args(["send", &url, "--count", "3", "--size", "10"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("sent 3 messages (30 bytes) over quic"),
        "{err}"
    );
    let tcp = format!("localhost:{}", b.tcp.port());
    let o = qgate(&home)
        .args(["recv", &tcp, "by-url", "--transport", "tcp", "--count", "3"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("received 3 messages (30 bytes) over tcp"),
        "{err}"
    );
    for (args, why) in [
        (
            vec!["send", "amqp+quic://localhost:1/a", "b"],
            "the URL names queue 'a' and QUEUE is 'b'",
        ),
        (
            vec!["send", "amqp://localhost:1/a", "--transport", "quic"],
            "the URL's scheme means --transport tcp, not quic",
        ),
        (vec!["send", "amqp+quic://localhost:1"], "missing queue"),
        (vec!["send", "nowhere", "q"], "'nowhere' is not a broker"),
        (vec!["send", "localhost:1"], "give the QUEUE"),
    ] {
        let o = qgate(&home).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(why), "{args:?}: {err}");
    }
    let o = qgate(&home)
        .args(["send", "no-such-host.invalid:5671", "q"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains("cannot resolve the broker's host 'no-such-host.invalid'"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn broker_configuration_errors_are_named() {
    let home = tmp("cfg");
    let creds = home.join("users.toml");
    std::fs::write(&creds, "[users]\nalice = \"\"\n").unwrap();
    let o = qgate(&home)
        .args([
            "broker",
            "--memory",
            "--tcp",
            "127.0.0.1:0",
            "--credentials",
        ])
        .arg(&creds)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("users.toml") && err.contains("alice"), "{err}");
    let cfg = home.join("qgate.toml");
    std::fs::write(&cfg, "[broker]\nhigh_water = 3.0\n").unwrap();
    let o = qgate(&home)
        .args(["--config"])
        .arg(&cfg)
        .args(["broker", "--memory", "--tcp", "127.0.0.1:0"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("high_water"), "{err}");
    let o = qgate(&home)
        .args(["send", "127.0.0.1:9", "q", "--transport", "carrier-pigeon"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("carrier-pigeon"), "{err}");
    let _ = std::fs::remove_dir_all(&home);
}

#[test]
fn send_says_what_was_accepted_when_the_broker_dies() {
    // Issue #18 item 11: the broker is killed mid-run; `qgate send` must notice within its
    // QUIC idle timeout (default a few seconds, not 30) and say how many messages the broker
    // had accepted (decision M20).
    let home = tmp("dies");
    let b = start_broker(&home, "127.0.0.1:0", "127.0.0.1:0", &["--memory"]);
    let quic = b.quic.to_string();
    let child = qgate(&home)
        .args([
            "send", &quic, "doomed", "--count", "1000000", "--rate", "200", "--size", "10",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    drop(b); // SIGKILL
    let killed = std::time::Instant::now();
    let o = child.wait_with_output().unwrap();
    let took = killed.elapsed();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        took < Duration::from_secs(10),
        "noticed after {took:?}: {err}"
    );
    let sent: u64 = err
        .split("sent ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in: {err}"));
    // About 300 at 200/s; a loaded machine may have started the sender late, and any count
    // is right as long as it is the broker's.
    assert!(sent > 0, "{err}");
    assert!(
        err.contains(&format!("the broker had accepted {sent} messages")),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&home);
}

/// `qgate server --sink amqp+quic://…` and `qgate broker` as processes: a posted body is on
/// the queue (`qgate recv` prints it) before the post returns; with the broker gone a post gets
/// 503 (exit 3) and nothing is acknowledged; a bad sink URL is a usage error.
#[test]
fn server_ingests_into_the_broker_as_processes() {
    let home = tmp("sink");
    let broker = start_broker(&home, "127.0.0.1:0", "127.0.0.1:0", &["--memory"]);
    let url = format!("amqp+quic://localhost:{}/telemetry", broker.quic.port());
    let start_server = || {
        let mut server = qgate(&home)
            .args(["server", "--listen", "127.0.0.1:0", "--sink", &url])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(server.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        // "qgate server listening on udp/127.0.0.1:PORT (HTTP/3)"
        let port = line
            .split(':')
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .to_string();
        let server = BrokerProc {
            child: server,
            quic: broker.quic,
            tcp: broker.tcp,
        };
        (server, port)
    };
    let (server, port) = start_server();
    let post_to = |port: &str, body: &str, rid: Option<&str>| {
        let mut c = qgate(&home);
        c.args([
            "post",
            &format!("https://localhost:{port}/ingest/meters"),
            "--data",
            body,
        ]);
        if let Some(r) = rid {
            c.args(["-H", &format!("qgate-request-id: {r}")]);
        }
        c.output().unwrap()
    };
    // A request id is stored once, also across a server restart (the durable table).
    let o = post_to(&port, "reading-4", Some("r-4"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = post_to(&port, "reading-4", Some("r-4"));
    assert!(String::from_utf8_lossy(&o.stdout).contains("\"duplicate\":true"));
    drop(server);
    let (server, port) = start_server();
    let o = post_to(&port, "reading-4", Some("r-4"));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("\"duplicate\":true"),
        "after a restart: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    let post = |body: &str| post_to(&port, body, None);
    for i in 0..4 {
        let o = post(&format!("reading-{i}"));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let o = qgate(&home)
        .args([
            "recv",
            &broker.quic.to_string(),
            "telemetry",
            "--count",
            "5",
            "--print",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got = String::from_utf8_lossy(&o.stdout);
    for i in 0..5 {
        assert!(got.contains(&format!("reading-{i}")), "{got}");
    }
    drop(broker);
    let o = post("while the broker is down");
    assert_eq!(
        o.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(said.contains("503"), "{said}");
    drop(server);
    let o = qgate(&home)
        .args(["server", "--sink", "amqp://localhost"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("missing queue"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `qgate broker --bridge out=amqp://…/in` as processes: what a producer sends to the edge's
/// queue arrives on the upstream's; a malformed bridge is a usage error naming the problem.
#[test]
fn a_bridge_forwards_between_broker_processes() {
    let home = tmp("bridge");
    let upstream = start_broker(&home, "127.0.0.1:0", "127.0.0.1:0", &["--memory"]);
    let bridge = format!("out=amqp://127.0.0.1:{}/in", upstream.tcp.port());
    let edge = start_broker(
        &home,
        "127.0.0.1:0",
        "127.0.0.1:0",
        &["--memory", "--bridge", &bridge],
    );
    let o = qgate(&home)
        .args([
            "send",
            &edge.quic.to_string(),
            "out",
            "--count",
            "200",
            "--size",
            "50",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = qgate(&home)
        .args([
            "recv",
            &upstream.quic.to_string(),
            "in",
            "--count",
            "200",
            "--idle",
            "10s",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(said.contains("received 200 messages"), "{said}");
    for (arg, why) in [
        ("out", "--bridge takes QUEUE=URL"),
        ("out=amqp://h", "missing queue"),
        ("out=amqp://u:secret/x@h/q", "percent-encode"),
    ] {
        let o = qgate(&home)
            .args([
                "broker",
                "--memory",
                "--tcp",
                "127.0.0.1:0",
                "--bridge",
                arg,
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{arg}: {err}");
        assert!(err.contains(why) && !err.contains("secret"), "{arg}: {err}");
    }
}

/// `qgate broker --admin` with a token, driven by `qgate ctl`: queues with depth, a purge, the
/// connections, and a config reload that declares a new queue and names what needs a restart.
#[test]
fn the_broker_admin_port_answers_qgate_ctl() {
    let home = tmp("admin");
    let token = "broker-admin-token-0123456789";
    let cfg = home.join("broker.toml");
    let store = home.join("broker.redb");
    let head = format!(
        "[broker]\nstore = {:?}\nadmin = \"127.0.0.1:0\"\n",
        store.to_str().unwrap()
    );
    std::fs::write(&cfg, format!("{head}[[broker.queues]]\nname = \"a\"\n")).unwrap();
    // The broker process, its admin address and its QUIC address.
    let start = || {
        let (child, line) = spawn_first_line(
            qgate(&home)
                .env("QGATE_ADMIN_TOKEN", token)
                .args(["--config", cfg.to_str().unwrap()])
                .args(["broker", "--quic", "127.0.0.1:0", "--tcp", "127.0.0.1:0"])
                .stderr(Stdio::null()),
        );
        assert!(line.contains("(token)"), "{line}");
        let (admin, quic) = (
            after(&line, "admin http://", &['/']),
            after(&line, "quic udp/", &[',', ';']),
        );
        let proc = BrokerProc {
            child,
            quic: quic.parse().unwrap(),
            tcp: "127.0.0.1:1".parse().unwrap(),
        };
        (proc, admin, quic)
    };
    let (b, admin, quic) = start();
    let o = qgate(&home)
        .args(["send", &quic, "a", "--count", "7", "--size", "10"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ctl = |args: &[&str], with_token: bool| {
        let mut c = qgate(&home);
        c.env_remove("QGATE_ADMIN_TOKEN");
        if with_token {
            c.env("QGATE_ADMIN_TOKEN", token);
        }
        c.args(["ctl", "--admin", &admin])
            .args(args)
            .output()
            .unwrap()
    };
    let o = ctl(&["queues"], false);
    assert_eq!(o.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&o.stderr).contains("401"));
    let o = ctl(&["health"], false);
    assert!(o.status.success(), "health needs no token");
    let o = ctl(&["queues"], true);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let row = out.lines().find(|l| l.starts_with("a ")).expect(&out);
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cols[..3], ["a", "7", "7"], "{out}");
    let o = ctl(&["--json", "purge", "a"], true);
    assert!(String::from_utf8_lossy(&o.stdout).contains("\"purged\": 7"));
    // Purged for good: three more sent, the broker killed (SIGKILL) and started again on its
    // store — the three are there, the seven are not.
    let o = qgate(&home)
        .args(["send", &quic, "a", "--count", "3", "--size", "10"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    drop(b);
    let (b, admin, _) = start();
    let ctl = |args: &[&str], with_token: bool| {
        let mut c = qgate(&home);
        c.env_remove("QGATE_ADMIN_TOKEN");
        if with_token {
            c.env("QGATE_ADMIN_TOKEN", token);
        }
        c.args(["ctl", "--admin", &admin])
            .args(args)
            .output()
            .unwrap()
    };
    let o = ctl(&["--json", "queues"], true);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(out.contains("\"depth\": 3,"), "{out}");
    let o = ctl(&["purge", "zzz"], true);
    assert!(String::from_utf8_lossy(&o.stderr).contains("404 Not Found: no queue 'zzz'"));
    // Any queue name, escaped on the way (a peer may name one "/topic/x y").
    let quic = b.quic.to_string();
    let o = qgate(&home)
        .args(["send", &quic, "/topic/x y", "--count", "2", "--size", "10"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = ctl(&["--json", "purge", "/topic/x y"], true);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("\"purged\": 2"),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let o = ctl(&["--json", "connections"], true);
    assert!(String::from_utf8_lossy(&o.stdout).contains("\"total\": 0"));
    // Reload: a new queue is declared live; a changed listener needs a restart.
    std::fs::write(
        &cfg,
        format!("{head}tcp = \"127.0.0.1:9\"\n[[broker.queues]]\nname = \"a\"\n[[broker.queues]]\nname = \"b\"\n[admin]\ntoken_file = \"/nonexistent\"\n"),
    )
    .unwrap();
    let o = ctl(&["--json", "reload"], true);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(out.contains("queue b declared"), "{out}");
    assert!(out.contains("listeners"), "{out}");
    assert!(
        out.contains("[admin]"),
        "a new token needs a restart: {out}"
    );
    let o = ctl(&["queues"], true);
    assert!(String::from_utf8_lossy(&o.stdout)
        .lines()
        .any(|l| l.starts_with("b ")));
    std::fs::write(&cfg, "[broker]\nnot_a_key = 1\n").unwrap();
    let o = ctl(&["reload"], true);
    assert_eq!(o.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not_a_key"));
    let m = String::from_utf8_lossy(&ctl(&["metrics"], true).stdout).to_string();
    assert!(m.contains("qgate_amqp_queue_depth{queue=\"a\"} 3\n"), "{m}");
    drop(b);
}

/// `--log-format json`: one JSON object per line, for log collectors (a bad peer's warning).
#[test]
fn logs_can_be_json_lines() {
    use std::io::{Read, Write};
    let home = tmp("jsonlog");
    let (mut child, line) = spawn_first_line(
        qgate(&home)
            .args(["--log-format", "json", "broker", "--memory"])
            .args(["--quic", "127.0.0.1:0", "--tcp", "127.0.0.1:0"])
            .stderr(Stdio::piped()),
    );
    let tcp = after(&line, "tcp tcp/", &[',', ';']);
    let mut s = std::net::TcpStream::connect(&tcp).unwrap();
    s.write_all(b"garbage!").unwrap();
    let _ = s.read(&mut [0u8; 64]);
    std::thread::sleep(Duration::from_millis(300));
    let _ = child.kill();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let _ = child.wait();
    let warned = err
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect(l))
        .any(|v| v["level"] == "WARN" && v["target"] == "qgate_amqp::shim");
    assert!(warned, "{err}");
}
