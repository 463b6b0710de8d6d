//! A third-party MQTT client against the product: `mosquitto_pub` (Debian's
//! `mosquitto-clients`, which `.ci/run` installs) publishes at QoS 0, 1 and 2 in MQTT 5.0 and
//! 3.1.1 to `qgate gateway --mqtt`, and `qgate server --sink DIR` stores every message. With
//! `QGATE_INTEROP` set a missing `mosquitto_pub` fails the test instead of skipping it.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{first_line, listening_addr};

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

#[test]
fn mosquitto_pub_publishes_through_the_gateway() {
    if Command::new("mosquitto_pub")
        .arg("--help")
        .output()
        .is_err()
    {
        if std::env::var_os("QGATE_INTEROP").is_some() {
            panic!("mosquitto_pub missing: apt-get install mosquitto-clients");
        }
        eprintln!("skipped: mosquitto_pub missing (apt-get install mosquitto-clients)");
        return;
    }
    let home = std::env::temp_dir().join(format!("qgate-mqtt-{}", std::process::id()));
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
    let mqtt = format!("127.0.0.1:{}", free_port(true));
    let mut g = qgate(&home);
    g.args(["gateway", "--listen", "127.0.0.1:0", "--server", &server])
        .args(["--path", "127.0.0.1:0", "--mqtt", &mqtt])
        .stderr(Stdio::null());
    let (_gw, line) = first_line(&mut g);
    let _ = listening_addr(&line);
    assert!(line.contains(&format!("MQTT on tcp/{mqtt}")), "{line}");
    assert!(!line.contains("OPEN TO ANYONE"), "{line}");
    let port = mqtt.rsplit(':').next().unwrap();
    let mut sent = Vec::new();
    // The gateway may still be measuring its path: the first publishes are retried.
    for version in ["mqttv5", "mqttv311"] {
        for qos in ["0", "1", "2"] {
            let body = format!("{version} qos {qos}");
            let topic = format!("sensors/{version}/q{qos}");
            let until = Instant::now() + Duration::from_secs(20);
            loop {
                let out = Command::new("mosquitto_pub")
                    .args(["-h", "127.0.0.1", "-p", port, "-V", version, "-q", qos])
                    .args([
                        "-i",
                        &format!("mosq-{version}-{qos}"),
                        "-t",
                        &topic,
                        "-m",
                        &body,
                    ])
                    .output()
                    .unwrap();
                if out.status.success() {
                    break;
                }
                assert!(
                    Instant::now() < until,
                    "mosquitto_pub {version} -q {qos}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                std::thread::sleep(Duration::from_millis(300));
            }
            sent.push(body);
        }
    }
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let got = stored(&sink);
        if sent.iter().all(|b| got.contains(b)) {
            eprintln!("the sink holds {} records: {got:?}", got.len());
            break;
        }
        assert!(Instant::now() < until, "stored {got:?}, sent {sent:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let _ = std::fs::remove_dir_all(&home);
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
