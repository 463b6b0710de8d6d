//! Devices known by their certificates, as real processes (issue 49): `qgate pki` makes a fleet
//! CA and a device certificate; a gateway with `--device-ca` takes the device that presents
//! it, names it in its connection list, and refuses a device without one.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{first_line, listening_addr};

fn qgate(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_qgate"));
    c.env("QGATE_HOME", home)
        .env_remove("QGATE_CONFIG")
        .env_remove("RUST_LOG");
    c
}

fn run(home: &Path, args: &[&str]) -> Output {
    qgate(home).args(args).output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("qgate-identity-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A server and a gateway in front of it with the extra `args` (its credentials, its admin
/// port), both killed when dropped; the gateway's listening line.
fn server_and_gateway(
    home: &Path,
    args: &[&std::ffi::OsStr],
) -> (common::Proc, common::Proc, String) {
    let (server, line) = first_line(
        qgate(home)
            .args(["server", "--listen", "127.0.0.1:0"])
            .stderr(Stdio::null()),
    );
    let addr = listening_addr(&line);
    let (gateway, line) = first_line(
        qgate(home)
            .args(["gateway", "--listen", "127.0.0.1:0"])
            .args(["--server", &addr.to_string(), "--path", "127.0.0.1:0"])
            .args(args)
            .stderr(Stdio::null()),
    );
    (server, gateway, line)
}

#[test]
fn pki_makes_a_fleet_and_the_gateway_takes_only_its_devices() {
    let home = tmp("fleet");
    let fleet = home.join("fleet");
    let f = fleet.to_str().unwrap();
    let o = run(&home, &["pki", "ca", f]);
    assert!(o.status.success(), "{}", text(&o));
    let o = run(&home, &["pki", "issue", "sensor-1", "--ca", f]);
    assert!(o.status.success(), "{}", text(&o));
    use std::os::unix::fs::PermissionsExt;
    for key in ["ca.key", "sensor-1.key"] {
        let mode = std::fs::metadata(fleet.join(key))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{key} is readable by others: {mode:o}");
    }
    // Nothing is overwritten, and a name the device header cannot carry is refused.
    let o = run(&home, &["pki", "issue", "sensor-1", "--ca", f]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("nothing is overwritten"), "{}", text(&o));
    let o = run(&home, &["pki", "issue", "two words", "--ca", f]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));

    let ca = fleet.join("ca.pem");
    let (_server, _gateway, line) = server_and_gateway(
        &home,
        &[
            "--admin".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--device-ca".as_ref(),
            ca.as_os_str(),
        ],
    );
    assert!(line.contains("devices by certificate"), "{line}");
    let gw = listening_addr(&line);
    let admin = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap()
        .to_owned();
    let url = format!("https://localhost:{}", gw.port());

    let device = |extra: &[&str]| {
        let mut c = qgate(&home);
        c.args(["device", &url, "--count", "5", "--retry-for", "2s"])
            .args(extra);
        c.output().unwrap()
    };
    let cert = fleet.join("sensor-1.pem");
    let key = fleet.join("sensor-1.key");
    let o = device(&[
        "--cert",
        cert.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("sent 5 records"), "{}", text(&o));
    let o = device(&[]);
    assert!(
        !o.status.success(),
        "a device without a certificate sent: {}",
        text(&o)
    );
    let o = run(&home, &["ctl", "--admin", &admin, "--json", "stats"]);
    assert!(text(&o).contains("\"forwarded\": 5"), "{}", text(&o));
}

#[test]
fn a_token_from_qgate_pki_lets_a_device_without_a_certificate_in() {
    let home = tmp("token");
    let keys = home.join("keys");
    let k = keys.to_str().unwrap();
    let o = run(&home, &["pki", "token-key", k]);
    assert!(o.status.success(), "{}", text(&o));
    let o = run(&home, &["pki", "token-key", k]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "a key is never replaced: {}",
        text(&o)
    );
    let o = run(
        &home,
        &["pki", "token", "tracker-1", "--key", k, "--days", "1"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let token = String::from_utf8_lossy(&o.stdout).trim().to_owned();
    assert_eq!(token.split('.').count(), 3, "{token}");
    let token_file = home.join("tracker-1.token");
    std::fs::write(&token_file, &token).unwrap();
    let forged = home.join("forged.token");
    std::fs::write(&forged, token.replace('.', ".x")).unwrap();

    let public = keys.join("token.pub");
    let (_server, _gateway, line) =
        server_and_gateway(&home, &["--device-token-key".as_ref(), public.as_os_str()]);
    assert!(line.contains("devices by token"), "{line}");
    let url = format!("https://localhost:{}", listening_addr(&line).port());
    let device = |file: &Path| {
        qgate(&home)
            .args([
                "device",
                &url,
                "--count",
                "3",
                "--retry-for",
                "2s",
                "--token",
            ])
            .arg(file)
            .output()
            .unwrap()
    };
    let o = device(&token_file);
    assert!(o.status.success(), "{}", text(&o));
    let o = device(&forged);
    assert!(
        !o.status.success(),
        "a forged token was taken: {}",
        text(&o)
    );
    assert!(text(&o).contains("401"), "{}", text(&o));
}
