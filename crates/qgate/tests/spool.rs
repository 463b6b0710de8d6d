//! The gateway keeps what it acknowledges (issue 50), as real processes: devices post while the
//! server is down and while the spool drains, the gateway is killed with SIGKILL six times in
//! between, and every record answered as stored or created reaches the server's sink (counted
//! by the record's own number).

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{first_line, listening_addr, Proc};
use qgate_transport::http3::{H3Client, ALPN_H3};
use qgate_transport::{client_config, connect, endpoint, DevPki, Socket, TransportOptions};

fn qgate(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_qgate"));
    c.env("QGATE_HOME", home)
        .env_remove("QGATE_CONFIG")
        .env_remove("RUST_LOG");
    c
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A gateway on `listen` with its spool in `home/spool`, its one path to `server`, and its
/// admin port; the first line it printed.
fn gateway(home: &Path, listen: &str, server: SocketAddr) -> (Proc, String) {
    let mut c = qgate(home);
    c.args(["gateway", "--listen", listen, "--probe-interval", "1s"])
        .args(["--admin", "127.0.0.1:0"])
        .args(["--request-timeout", "1s"])
        .args(["--server", &server.to_string(), "--path", "127.0.0.1:0"])
        .arg("--spool")
        .arg(home.join("spool"))
        .stderr(Stdio::null());
    first_line(&mut c)
}

fn kill9(p: Proc) {
    let pid = p.0.id().to_string();
    Command::new("kill").args(["-9", &pid]).status().unwrap();
    drop(p);
}

/// Every record number the sink holds, each as often as stored.
fn stored(dir: &Path) -> Vec<u64> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "bin") {
                if let Ok(s) = std::fs::read_to_string(&p) {
                    if let Ok(n) = s.trim().parse() {
                        out.push(n);
                    }
                }
            }
        }
    }
    out
}

/// A device posting numbered records as fast as answers come, reconnecting whenever the
/// gateway went away; the numbers answered 201 or 202 go to `acked`.
async fn device(
    gw: SocketAddr,
    pki: PathBuf,
    priority: u8,
    first: u64,
    stop: Arc<Mutex<bool>>,
    acked: Arc<Mutex<BTreeSet<u64>>>,
) {
    let pki = DevPki::load_or_create(&pki).unwrap();
    let cfg = client_config(&pki.trust(), &[ALPN_H3], &TransportOptions::default()).unwrap();
    let mut n = first;
    let mut client: Option<H3Client> = None;
    while !*stop.lock().unwrap() {
        if client.as_ref().is_none_or(|c| c.is_closed()) {
            client = None;
            let ep = endpoint(
                Socket::bind_udp("127.0.0.1:0".parse().unwrap()).unwrap(),
                None,
                None,
            )
            .unwrap();
            let c = tokio::time::timeout(
                Duration::from_secs(2),
                connect(&ep, &cfg, gw, "localhost", false),
            )
            .await;
            if let Ok(Ok(c)) = c {
                if let Ok(h) = H3Client::new(c.connection().clone()).await {
                    client = Some(h);
                }
            }
            if client.is_none() {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        }
        let c = client.as_ref().unwrap();
        let req = http::Request::post("https://gw/ingest/kill")
            .header("qgate-priority", priority.to_string())
            .body(())
            .unwrap();
        let r = tokio::time::timeout(
            Duration::from_secs(5),
            c.request(req, Bytes::from(format!("{n}\n")), 4096),
        )
        .await;
        match r {
            Ok(Ok(r)) if r.status == 201 || r.status == 202 => {
                acked.lock().unwrap().insert(n);
                n += 1;
            }
            // Not taken: the same record again (the device keeps it).
            Ok(Ok(_)) => tokio::time::sleep(Duration::from_millis(50)).await,
            _ => client = None,
        }
    }
}

#[test]
fn killed_six_times_during_an_outage_and_the_drain_the_gateway_loses_no_acknowledged_record() {
    let home = std::env::temp_dir().join(format!("qgate-spool-kill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home).unwrap();
    let server_addr: SocketAddr = format!("127.0.0.1:{}", free_udp_port()).parse().unwrap();
    let (mut gw, line) = gateway(&home, "127.0.0.1:0", server_addr);
    assert!(line.contains("spool"), "{line}");
    let listen = listening_addr(&line);
    let listen_s = listen.to_string();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let stop = Arc::new(Mutex::new(false));
    let acked = Arc::new(Mutex::new(BTreeSet::new()));
    let pki = home.join("dev-pki");
    let devices: Vec<_> = (0..4u64)
        .map(|i| {
            rt.spawn(device(
                listen,
                pki.clone(),
                (i % 2) as u8,
                i * 1_000_000,
                stop.clone(),
                acked.clone(),
            ))
        })
        .collect();
    let count = |a: &Arc<Mutex<BTreeSet<u64>>>| a.lock().unwrap().len();
    let wait_for_more = |had: usize| {
        let until = Instant::now() + Duration::from_secs(30);
        while count(&acked) < had + 20 {
            assert!(Instant::now() < until, "devices stalled at {had} records");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // The outage: no server. Killed twice while records are spooled.
    for _ in 0..2 {
        wait_for_more(count(&acked));
        kill9(gw);
        gw = gateway(&home, &listen_s, server_addr).0;
    }
    wait_for_more(count(&acked));
    // The admin port shows what is held; restarts found it all.
    let line = {
        kill9(gw);
        let (g, line) = gateway(&home, &listen_s, server_addr);
        gw = g;
        line
    };
    let admin = line
        .split("admin http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no admin address in {line}"))
        .to_string();
    let ctl = qgate(&home)
        .args(["ctl", "--admin", &admin, "--json", "spool"])
        .output()
        .unwrap();
    let view: serde_json::Value = serde_json::from_slice(&ctl.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&ctl.stderr)));
    let held = |v: &serde_json::Value| {
        v["priority"]["held"]["records"].as_u64().unwrap()
            + v["best_effort"]["held"]["records"].as_u64().unwrap()
    };
    assert!(held(&view) > 0, "{view}");
    // A purge of a device that holds nothing purges nothing.
    let ctl = qgate(&home)
        .args(["ctl", "--admin", &admin, "--json", "spool", "--purge"])
        .args(["--device", "192.0.2.1"])
        .output()
        .unwrap();
    let purged: serde_json::Value = serde_json::from_slice(&ctl.stdout).unwrap();
    assert_eq!(purged["purged"], 0, "{purged}");
    // The server comes up; the spool drains while devices go on; killed three more times.
    let sink = home.join("sink");
    let mut s = qgate(&home);
    s.args(["server", "--listen", &server_addr.to_string()])
        .arg("--sink")
        .arg(&sink)
        .stderr(Stdio::null());
    let (_server, _) = first_line(&mut s);
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(1500));
        wait_for_more(count(&acked));
        kill9(gw);
        gw = gateway(&home, &listen_s, server_addr).0;
    }
    wait_for_more(count(&acked));
    *stop.lock().unwrap() = true;
    for d in devices {
        rt.block_on(d).unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    // Everything acknowledged arrives once the spool has drained.
    let until = Instant::now() + Duration::from_secs(60);
    let missing = loop {
        let got: BTreeSet<u64> = stored(&sink).into_iter().collect();
        let missing: Vec<u64> = acked.difference(&got).copied().collect();
        if missing.is_empty() || Instant::now() > until {
            break missing;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let all = stored(&sink);
    eprintln!(
        "acknowledged {}, stored {} ({} copies of records stored twice)",
        acked.len(),
        all.len(),
        all.len() - all.iter().collect::<BTreeSet<_>>().len()
    );
    assert!(
        missing.is_empty(),
        "{} acknowledged records lost, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    drop(gw);
    let _ = std::fs::remove_dir_all(&home);
}
