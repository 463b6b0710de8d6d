//! Third-party MQTT clients against the product, `qgate gateway --mqtt --mqtt-tls --mqtt-quic`
//! in front of `qgate server --sink DIR`, which must store every acknowledged message:
//! `mosquitto_pub` (Debian's `mosquitto-clients`) at QoS 0, 1 and 2 in MQTT 5.0 and 3.1.1 over
//! TCP, and at QoS 1 over TLS; paho-mqtt (Python) at QoS 1 in both versions over TCP and TLS;
//! and an aioquic client (`interop/mqtt/quic_pub.py`) over QUIC with ALPN `mqtt`. `.ci/run`
//! installs them all; with `QGATE_INTEROP` set a missing one fails the test instead of skipping
//! it.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{first_line, listening_addr, Proc};

fn qgate(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_qgate"));
    c.env("QGATE_HOME", home)
        .env_remove("QGATE_CONFIG")
        .env_remove("RUST_LOG");
    c
}

fn free_port(tcp: bool) -> u16 {
    if tcp {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    } else {
        std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }
}

/// Files the directory sink holds under `dir`, and their contents.
fn stored(dir: &Path) -> Vec<String> {
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
                out.push(std::fs::read_to_string(&p).unwrap_or_default());
            }
        }
    }
    out
}

/// A client that cannot run: fail under `QGATE_INTEROP` (CI), else say why and skip.
fn missing(why: &str) -> bool {
    if std::env::var_os("QGATE_INTEROP").is_some() {
        panic!("MQTT interop client missing: {why}");
    }
    eprintln!("skipped: {why}");
    false
}

/// Whether `python3` imports `module`.
fn python_has(module: &str) -> bool {
    Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `qgate server --sink` and `qgate gateway` with the MQTT door on loopback TCP, TLS and QUIC.
struct Door {
    home: PathBuf,
    sink: PathBuf,
    /// The CA that signed the gateway's certificate.
    ca: PathBuf,
    tcp: String,
    tls: String,
    quic: String,
    _server: Proc,
    _gw: Proc,
}

impl Door {
    fn start(name: &str) -> Door {
        let home = std::env::temp_dir().join(format!("qgate-mqtt-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&home);
        std::fs::create_dir_all(&home).unwrap();
        let sink = home.join("sink");
        let server = format!("127.0.0.1:{}", free_port(false));
        let mut s = qgate(&home);
        s.args(["server", "--listen", &server])
            .arg("--sink")
            .arg(&sink)
            .stderr(Stdio::null());
        let (_server, _) = first_line(&mut s);
        let tcp = format!("127.0.0.1:{}", free_port(true));
        let tls = format!("127.0.0.1:{}", free_port(true));
        let quic = format!("127.0.0.1:{}", free_port(false));
        let mut g = qgate(&home);
        g.args(["gateway", "--listen", "127.0.0.1:0", "--server", &server])
            .args(["--path", "127.0.0.1:0", "--mqtt", &tcp])
            .args(["--mqtt-tls", &tls, "--mqtt-quic", &quic])
            .stderr(Stdio::null());
        let (_gw, line) = first_line(&mut g);
        let _ = listening_addr(&line);
        assert!(
            line.contains(&format!("MQTT on tcp/{tcp}, tls/{tls}, quic/{quic}")),
            "{line}"
        );
        assert!(!line.contains("OPEN TO ANYONE"), "{line}");
        Door {
            ca: home.join("dev-pki/ca.pem"),
            home,
            sink,
            tcp,
            tls,
            quic,
            _server,
            _gw,
        }
    }

    /// Wait until the sink holds every body in `sent`.
    fn holds(&self, sent: &[String]) {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let got = stored(&self.sink);
            if sent.iter().all(|b| got.contains(b)) {
                eprintln!("the sink holds {} records", got.len());
                return;
            }
            assert!(Instant::now() < until, "stored {got:?}, sent {sent:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Door {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

fn port(addr: &str) -> &str {
    addr.rsplit(':').next().unwrap()
}

/// Run `cmd` until it succeeds, at most 20 s: the gateway may still be measuring its path, and
/// a client whose message was refused sends it again. Its last stdout.
fn until_done(what: &str, mut cmd: impl FnMut() -> Command) -> String {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let out = cmd().output().unwrap();
        if out.status.success() {
            return String::from_utf8_lossy(&out.stdout).into_owned();
        }
        assert!(
            Instant::now() < until,
            "{what}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Records each Python client publishes.
const RECORDS: usize = 10;

/// The bodies a Python client `id` publishes.
fn records(id: &str) -> Vec<String> {
    (0..RECORDS).map(|i| format!("{id} record {i}")).collect()
}

fn interop(script: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../interop/mqtt")
        .join(script)
}

#[test]
fn mosquitto_pub_publishes_through_the_gateway() {
    if Command::new("mosquitto_pub")
        .arg("--help")
        .output()
        .is_err()
    {
        missing("mosquitto_pub missing (apt-get install mosquitto-clients)");
        return;
    }
    let door = Door::start("mosquitto");
    let mut sent = Vec::new();
    // QoS 0, 1 and 2 over TCP, and QoS 1 over TLS trusting the gateway's CA. QoS 1 first: it
    // is retried until acknowledged, so the gateway has its path when the QoS 0 message, which
    // nobody retries, arrives.
    let runs = ["mqttv5", "mqttv311"].into_iter().flat_map(|version| {
        [("1", false), ("2", false), ("0", false), ("1", true)]
            .map(move |(qos, tls)| (version, qos, tls))
    });
    for (version, qos, tls) in runs {
        let via = if tls { "tls" } else { "tcp" };
        let body = format!("{version} qos {qos} over {via}");
        let id = format!("mosq-{version}-{qos}-{via}");
        until_done(&id, || {
            let mut c = Command::new("mosquitto_pub");
            c.args(["-h", "127.0.0.1", "-V", version, "-q", qos]).args([
                "-i",
                &id,
                "-t",
                &format!("sensors/{version}/q{qos}"),
                "-m",
                &body,
            ]);
            if tls {
                c.args(["-p", port(&door.tls), "--cafile"]).arg(&door.ca);
            } else {
                c.args(["-p", port(&door.tcp)]);
            }
            c
        });
        sent.push(body);
    }
    door.holds(&sent);
}

/// paho-mqtt publishes at QoS 1 in MQTT 5.0 and 3.1.1 over TCP and over TLS (trusting the
/// gateway's CA); every acknowledged message is in the server's sink.
#[test]
fn paho_publishes_over_tcp_and_tls_in_both_versions() {
    if !python_has("paho.mqtt.client") {
        missing("paho-mqtt is not installed (python3 -m pip install paho-mqtt==2.1.0)");
        return;
    }
    let door = Door::start("paho");
    let mut sent = Vec::new();
    for (transport, addr) in [("tcp", &door.tcp), ("tls", &door.tls)] {
        for version in ["5", "311"] {
            let id = format!("paho-{transport}-{version}");
            let out = until_done(&id, || {
                let mut c = Command::new("python3");
                c.arg(interop("paho_pub.py"))
                    .args(["127.0.0.1", port(addr), "--version", version])
                    .args(["--client-id", &id, "--topic", &format!("paho/{transport}")])
                    .args(["--records", &RECORDS.to_string()]);
                if transport == "tls" {
                    c.arg("--ca").arg(&door.ca);
                }
                c
            });
            assert!(
                out.contains(&format!("\"acked\": {RECORDS}")),
                "{id}: {out}"
            );
            sent.extend(records(&id));
        }
    }
    door.holds(&sent);
}

/// An aioquic client speaks MQTT over QUIC as EMQX expects (ALPN `mqtt`, one bidirectional
/// stream) in both versions: CONNACK, a PUBACK for every QoS 1 message, the stream's end after
/// DISCONNECT; every message is in the server's sink.
#[test]
fn an_aioquic_client_publishes_over_quic_in_both_versions() {
    if !python_has("aioquic") {
        missing("aioquic is not installed (python3 -m pip install aioquic==1.2.0)");
        return;
    }
    let door = Door::start("quic");
    let mut sent = Vec::new();
    for version in ["5", "311"] {
        let id = format!("aioquic-{version}");
        let out = until_done(&id, || {
            let mut c = Command::new("python3");
            c.arg(interop("quic_pub.py"))
                .args(["127.0.0.1", port(&door.quic), "--version", version])
                .arg("--ca")
                .arg(&door.ca)
                .args(["--client-id", &id, "--topic", "quic/sensors"])
                .args(["--records", &RECORDS.to_string()]);
            c
        });
        assert!(
            out.contains(&format!("\"acked\": {RECORDS}")),
            "{id}: {out}"
        );
        sent.extend(records(&id));
    }
    door.holds(&sent);
}

/// An MQTT door on an address other than loopback says, in the gateway's first line, that it is
/// open to anyone.
#[test]
fn a_door_beyond_loopback_says_it_is_open_to_anyone() {
    let home = std::env::temp_dir().join(format!("qgate-mqtt-open-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    let mqtt = format!("0.0.0.0:{}", free_port(true));
    let mut g = qgate(&home);
    g.args([
        "gateway",
        "--listen",
        "127.0.0.1:0",
        "--server",
        "127.0.0.1:9",
    ])
    .args(["--path", "127.0.0.1:0", "--mqtt", &mqtt])
    .stderr(Stdio::null());
    let (_gw, line) = first_line(&mut g);
    assert!(
        line.contains(&format!("MQTT on tcp/{mqtt} OPEN TO ANYONE")),
        "{line}"
    );
    let _ = std::fs::remove_dir_all(&home);
}
