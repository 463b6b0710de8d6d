//! Third-party AMQP 1.0 clients against our broker. python-qpid-proton is installed by
//! `.ci/run` (which sets QGATE_INTEROP=1 so a missing peer fails the suite); elsewhere these
//! tests say they were skipped.

use std::process::Command;

use qgate_amqp::broker::{serve_tcp, Broker, BrokerConfig};
use qgate_amqp::transport;
use qgate_transport::DevPki;

fn have_python_proton() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import proton"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("QGATE_INTEROP").is_none(),
            "QGATE_INTEROP is set but python3 cannot import proton (pip install python-qpid-proton)"
        );
        eprintln!("skipped: python-qpid-proton is not installed");
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_qpid_proton_sends_and_receives_over_tcp_and_tls_with_default_link_names() {
    if !have_python_proton() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("qgate-interop-{}", std::process::id()));
    let pki = DevPki::load_or_create(&dir).unwrap();
    let broker = Broker::start(BrokerConfig::default()).unwrap();
    let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let plain_addr = plain.local_addr().unwrap();
    tokio::spawn(serve_tcp(broker.clone(), plain, None));
    let tls = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tls_port = tls.local_addr().unwrap().port();
    let tcfg = transport::tls_server_config(&pki.server, None).unwrap();
    tokio::spawn(serve_tcp(broker.clone(), tls, Some(tcfg)));
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
    let s = broker.queue_stats();
    assert!(s.iter().all(|q| q.stats.enqueued == 200), "{s:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn have_go() -> bool {
    let ok = Command::new("go")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("QGATE_INTEROP").is_none(),
            "QGATE_INTEROP is set but there is no Go toolchain for the go-amqp client"
        );
        eprintln!("skipped: no Go toolchain");
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_amqp_sends_and_receives_over_tcp_and_tls() {
    if !have_go() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("qgate-interop-go-{}", std::process::id()));
    let pki = DevPki::load_or_create(&dir).unwrap();
    let broker = Broker::start(BrokerConfig::default()).unwrap();
    let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let plain_addr = plain.local_addr().unwrap();
    tokio::spawn(serve_tcp(broker.clone(), plain, None));
    let tls = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tls_addr = tls.local_addr().unwrap();
    let tcfg = transport::tls_server_config(&pki.server, None).unwrap();
    tokio::spawn(serve_tcp(broker.clone(), tls, Some(tcfg)));
    let client = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/interop/goamqp");
    let ca = dir.join("ca.pem");
    for (url, queue) in [
        (format!("amqp://{plain_addr}"), "go-plain"),
        (format!("amqps://{tls_addr}"), "go-tls"),
    ] {
        let out = tokio::process::Command::new("go")
            .args(["run", ".", &url, queue, "200"])
            .arg(&ca)
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
    let s = broker.queue_stats();
    assert!(s.iter().all(|q| q.stats.enqueued == 200), "{s:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// An embedded Artemis 2.44 (tools/artemis, built with Maven), killed when dropped.
struct Artemis {
    child: std::process::Child,
    addr: std::net::SocketAddr,
}

impl Drop for Artemis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_artemis() -> Option<Artemis> {
    use std::io::BufRead;
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tools/artemis");
    let mvn = Command::new("mvn")
        .args(["-q", "-B", "package"])
        .current_dir(dir)
        .output();
    match mvn {
        Ok(o) if o.status.success() => {}
        other => {
            assert!(
                std::env::var_os("QGATE_INTEROP").is_none(),
                "QGATE_INTEROP is set but tools/artemis does not build: {other:?}"
            );
            eprintln!("skipped: Maven or Artemis unavailable");
            return None;
        }
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new("java")
        .args([
            "-cp",
            "target/classes:target/lib/*",
            "qgate.EmbeddedArtemis",
        ])
        .arg(port.to_string())
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("READY"), "Artemis said: {line}");
    Some(Artemis {
        child,
        addr: ([127, 0, 0, 1], port).into(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_sender_and_receiver_against_apache_artemis() {
    use qgate_amqp::client::{self, Connector, RecvSpec, SendSpec};
    use qgate_amqp::transport::Scheme;
    let Some(artemis) = tokio::task::spawn_blocking(start_artemis).await.unwrap() else {
        return;
    };
    let c = Connector::new(
        Scheme::Tcp,
        artemis.addr,
        "localhost",
        &Default::default(),
        None,
        None,
        &Default::default(),
    )
    .unwrap();
    for settled in [false, true] {
        let q = format!("qgate-interop-{settled}");
        let spec = SendSpec {
            address: q.clone(),
            settled,
            window: 100,
            rate: None,
            link_name: "qgate-sender".into(),
        };
        let bodies = (0..500u32).map(|i| i.to_be_bytes().to_vec());
        let sent = client::send(&c, &spec, bodies.clone()).await.unwrap();
        assert_eq!((sent.messages, sent.rejected), (500, 0));
        let mut got = Vec::new();
        let spec = RecvSpec {
            address: q,
            settled,
            count: Some(500),
            idle: std::time::Duration::from_secs(10),
            credit: 100,
            link_name: "qgate-receiver".into(),
        };
        let r = client::receive(&c, &spec, |b| got.push(b.to_vec()))
            .await
            .unwrap();
        assert_eq!(r.messages, 500);
        assert_eq!(
            got,
            bodies.collect::<Vec<_>>(),
            "in order, settled = {settled}"
        );
    }
}
