//! Third-party AMQP 1.0 clients against our broker. python-qpid-proton is installed by
//! `.ci/run` (which sets QGATE_INTEROP=1 so a missing peer fails the suite); elsewhere these
//! tests say they were skipped.

use std::process::Command;

use qgate_amqp::broker::Broker;
use qgate_amqp::builder::RunningBroker;
use qgate_amqp::transport;
use qgate_transport::DevPki;

/// Whether `cmd ARGS` runs; without it the test is skipped, unless QGATE_INTEROP demands it.
fn available(cmd: &str, args: &[&str], what: &str) -> bool {
    let ok = Command::new(cmd)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("QGATE_INTEROP").is_none(),
            "QGATE_INTEROP is set but {what} is missing"
        );
        eprintln!("skipped: {what} is missing");
    }
    ok
}

fn have_python_proton() -> bool {
    available(
        "python3",
        &["-c", "import proton"],
        "python-qpid-proton (pip install python-qpid-proton)",
    )
}

/// A memory broker on loopback: plain TCP first, then TLS with `pki`'s certificate.
async fn tcp_broker(pki: &DevPki) -> RunningBroker {
    let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tls = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tcfg = transport::tls_server_config(&pki.server, None).unwrap();
    Broker::builder()
        .tcp(plain, None)
        .tcp(tls, Some(tcfg))
        .start()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_qpid_proton_sends_and_receives_over_tcp_and_tls_with_default_link_names() {
    if !have_python_proton() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("qgate-interop-{}", std::process::id()));
    let pki = DevPki::load_or_create(&dir).unwrap();
    let running = tcp_broker(&pki).await;
    let (plain_addr, tls_port) = (running.tcp_addrs()[0], running.tcp_addrs()[1].port());
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/interop/proton_client.py"
    );
    let ca = dir.join("ca.pem");
    for (url, queue) in [
        (format!("amqp://{plain_addr}"), "proton-plain"),
        (format!("amqps://localhost:{tls_port}"), "proton-tls"),
    ] {
        let out = tokio::process::Command::new("python3")
            .args([script, &url, queue, "200"])
            .arg(&ca)
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("OK 200"),
            "{url}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Proton names both links alike; the broker served both.
        let names: Vec<&str> = stdout
            .lines()
            .find(|l| l.starts_with("link names:"))
            .unwrap()
            .split_whitespace()
            .skip(2)
            .collect();
        assert_eq!(names.len(), 2);
        assert_eq!(
            names[0], names[1],
            "proton's default: one name for both links"
        );
    }
    let s = running.broker().queue_stats();
    assert!(s.iter().all(|q| q.stats.enqueued == 200), "{s:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn have_go() -> bool {
    available("go", &["version"], "a Go toolchain for the go-amqp client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_amqp_sends_and_receives_over_tcp_and_tls_and_with_default_options() {
    if !have_go() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("qgate-interop-go-{}", std::process::id()));
    let pki = DevPki::load_or_create(&dir).unwrap();
    let running = tcp_broker(&pki).await;
    let (plain_addr, tls_addr) = (running.tcp_addrs()[0], running.tcp_addrs()[1]);
    let client = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/goamqp");
    let ca = dir.join("ca.pem");
    // go-amqp with default options (`amqp.Dial(ctx, url, nil)`) skips the SASL layer; the
    // broker admits it while ANONYMOUS is admitted (decision M19).
    for (url, queue, mode) in [
        (format!("amqp://{plain_addr}"), "go-plain", "anonymous"),
        (format!("amqps://{tls_addr}"), "go-tls", "anonymous"),
        (format!("amqp://{plain_addr}"), "go-defaults", "defaults"),
    ] {
        let out = tokio::process::Command::new("go")
            .args(["run", ".", &url, queue, "200"])
            .arg(&ca)
            .arg(mode)
            .current_dir(client)
            .output()
            .await
            .unwrap();
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("OK 200"),
            "{url}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let s = running.broker().queue_stats();
    assert!(s.iter().all(|q| q.stats.enqueued == 200), "{s:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
