//! The systemd unit and the container file in `packaging/`, started as their managers would
//! start them: the unit passes `systemd-analyze verify`, and each file's own command line,
//! environment and configuration, run as an unprivileged user, serves, answers its health and
//! reload commands, stores what it acknowledged where its state lives, and exits 0 on SIGTERM.
//! (No container engine runs on the CI machine, so the image itself is not built here; its
//! final stage's ENV, USER, ENTRYPOINT, CMD and HEALTHCHECK are what the test runs.)

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

mod common;
use common::{first_line, Proc};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_qgate");
/// The uid and gid the daemons run as here (systemd's DynamicUser, the image's USER).
const UNPRIVILEGED: u32 = 65534;

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("qgate-pkg-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// A free TCP port on loopback (for the admin port the files name).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `packaging/etc/qgate/server.toml` for this test: its state paths under `state`, the device
/// port on an ephemeral loopback port, the admin port on `admin`.
fn server_config(state: &Path, admin: u16) -> String {
    let text = read("packaging/etc/qgate/server.toml");
    for needle in ["/var/lib/qgate", "0.0.0.0:4433", "127.0.0.1:9464"] {
        assert!(text.contains(needle), "server.toml no longer has {needle}");
    }
    text.replace("/var/lib/qgate", &state.display().to_string())
        .replace("0.0.0.0:4433", "127.0.0.1:0")
        .replace("127.0.0.1:9464", &format!("127.0.0.1:{admin}"))
}

/// Run `argv` (argv[0] the installed path of qgate) as the daemon: as an unprivileged user when
/// this test runs as root (the state directory is then given to that user).
fn daemon(argv: &[String], env: &[(String, String)], state: &Path) -> Command {
    assert!(argv[0].ends_with("/qgate"), "{argv:?}");
    let mut c = if is_root() {
        chown_tree(state);
        let mut c = Command::new("setpriv");
        c.args([
            format!("--reuid={UNPRIVILEGED}"),
            format!("--regid={UNPRIVILEGED}"),
            "--clear-groups".into(),
            "--".into(),
            BIN.into(),
        ]);
        c
    } else {
        Command::new(BIN)
    };
    c.args(&argv[1..])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .envs(env.iter().map(|(k, v)| (k, v)));
    c
}

fn chown_tree(p: &Path) {
    std::os::unix::fs::chown(p, Some(UNPRIVILEGED), Some(UNPRIVILEGED)).unwrap();
    if p.is_dir() {
        for e in std::fs::read_dir(p).unwrap() {
            chown_tree(&e.unwrap().path());
        }
    }
}

/// Start `c` (stderr shown); its first stdout line (the "listening" line) and the daemon.
fn start(mut c: Command) -> (Proc, String) {
    first_line(c.stderr(Stdio::inherit()))
}

/// The UDP port in "… listening on udp/127.0.0.1:PORT …".
fn device_port(line: &str) -> u16 {
    line.split("udp/127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no device port in {line:?}"))
}

/// POST a body as a device would, trusting the CA the daemon made in `home`.
fn post(home: &Path, port: u16, body: &str) {
    let o = Command::new(BIN)
        .env("QGATE_HOME", home)
        .args([
            "post",
            &format!("https://localhost:{port}/ingest/pkg"),
            "-d",
            body,
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// SIGTERM, then the exit status within `limit`.
fn terminate(d: &mut Proc, limit: Duration) -> std::process::ExitStatus {
    let st = Command::new("kill")
        .args(["-TERM", &d.0.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let t0 = Instant::now();
    loop {
        if let Some(st) = d.0.try_wait().unwrap() {
            return st;
        }
        assert!(
            t0.elapsed() < limit,
            "still running {limit:?} after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Values of `key=` lines of a unit file's `[Service]` section.
fn unit_values<'a>(unit: &'a str, key: &str) -> Vec<&'a str> {
    let prefix = format!("{key}=");
    unit.lines()
        .filter_map(|l| l.trim().strip_prefix(prefix.as_str()))
        .collect()
}

#[test]
fn systemd_unit_verifies_and_its_command_serves_reloads_and_stops() {
    let unit = read("packaging/systemd/qgate@.service");
    let dir = tmp("systemd");
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok()
    {
        // Verified as the instance qgate@server, with the binary where the unit expects it.
        let path = dir.join("qgate@server.service");
        std::fs::write(&path, unit.replace("/usr/local/bin/qgate", BIN)).unwrap();
        let o = Command::new("systemd-analyze")
            .arg("verify")
            .arg(&path)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "systemd-analyze verify: {err}");
        assert!(
            !err.contains("qgate@"),
            "systemd-analyze has remarks on the unit: {err}"
        );
    } else {
        // CI (.ci/run sets QGATE_INTEROP) runs on Debian, which has it.
        assert!(
            std::env::var_os("QGATE_INTEROP").is_none(),
            "systemd-analyze is missing: the unit cannot be verified"
        );
        eprintln!("systemd-analyze is not installed: the unit's syntax is not verified");
    }

    // Its own command, environment and state directory for the instance `server`, as systemd
    // expands them: %i = server, %S = the state root (StateDirectory=qgate under it).
    let state_root = dir.join("var-lib");
    let etc = dir.join("etc-qgate");
    std::fs::create_dir_all(&etc).unwrap();
    assert_eq!(unit_values(&unit, "StateDirectory"), ["qgate"]);
    assert_eq!(unit_values(&unit, "KillSignal"), ["SIGTERM"]);
    let state = state_root.join("qgate");
    std::fs::create_dir_all(&state).unwrap();
    let admin = free_port();
    std::fs::write(etc.join("server.toml"), server_config(&state, admin)).unwrap();
    let expand = |s: &str| {
        s.replace("%i", "server")
            .replace("%S", &state_root.display().to_string())
            .replace("/etc/qgate", &etc.display().to_string())
    };
    let argv = |key: &str| -> Vec<String> {
        let v = unit_values(&unit, key);
        assert_eq!(v.len(), 1, "{key}");
        expand(v[0]).split_whitespace().map(String::from).collect()
    };
    let env: Vec<(String, String)> = unit_values(&unit, "Environment")
        .iter()
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_string(), expand(v))
        })
        .collect();
    assert!(env.contains(&("QGATE_HOME".into(), state.display().to_string())));

    let (mut d, line) = start(daemon(&argv("ExecStart"), &env, &state));
    assert!(
        line.contains(&format!("admin http://127.0.0.1:{admin}/")),
        "{line}"
    );
    post(&state, device_port(&line), "from-systemd");
    let stored: Vec<_> = std::fs::read_dir(state.join("ingest/pkg"))
        .unwrap()
        .collect();
    assert_eq!(stored.len(), 1, "the body is in the state directory");

    // ExecReload reads the same file and finds the admin port in it.
    let o = daemon(&argv("ExecReload"), &env, &state).output().unwrap();
    assert!(
        o.status.success(),
        "reload: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("\"needs_restart\": []"), "{out}");

    let stop: Duration = unit_values(&unit, "TimeoutStopSec")[0]
        .trim_end_matches('s')
        .parse::<u64>()
        .map(Duration::from_secs)
        .unwrap();
    assert_eq!(terminate(&mut d, stop).code(), Some(0));
    std::fs::remove_dir_all(&dir).ok();
}

/// The final stage of the Containerfile: (ENV pairs, USER, ENTRYPOINT + CMD, HEALTHCHECK CMD).
struct Image {
    env: Vec<(String, String)>,
    user: String,
    argv: Vec<String>,
    health: Vec<String>,
}

fn json_array(s: &str) -> Vec<String> {
    serde_json::from_str(s.trim()).unwrap_or_else(|e| panic!("not an exec-form array: {s}: {e}"))
}

fn image(file: &str) -> Image {
    let last = file.rsplit_once("\nFROM ").expect("a multi-stage file").1;
    let mut img = Image {
        env: Vec::new(),
        user: String::new(),
        argv: Vec::new(),
        health: Vec::new(),
    };
    let (mut entry, mut cmd) = (Vec::new(), Vec::new());
    for l in last.lines() {
        if let Some(kv) = l.strip_prefix("ENV ") {
            let (k, v) = kv.split_once('=').expect("ENV K=V");
            img.env.push((k.to_string(), v.to_string()));
        } else if let Some(u) = l.strip_prefix("USER ") {
            img.user = u.trim().to_string();
        } else if let Some(a) = l.strip_prefix("ENTRYPOINT ") {
            entry = json_array(a);
        } else if let Some(a) = l.strip_prefix("CMD ") {
            cmd = json_array(a);
        } else if let Some(h) = l.strip_prefix("HEALTHCHECK ") {
            img.health = json_array(h.split_once(" CMD ").expect("HEALTHCHECK … CMD [..]").1);
        }
    }
    img.argv = entry.into_iter().chain(cmd).collect();
    img
}

#[test]
fn container_file_command_serves_answers_its_healthcheck_and_stops() {
    let file = read("packaging/container/Containerfile");
    let img = image(&file);
    assert_eq!(img.user, "qgate", "the image runs as its own user");
    assert!(file.contains("COPY packaging/etc/qgate/ /etc/qgate/"));
    assert!(file.contains("STOPSIGNAL SIGTERM"));
    assert!(
        std::fs::read_to_string(repo(".dockerignore"))
            .unwrap()
            .lines()
            .any(|l| l == "**/target"),
        "the build context leaves target/ out"
    );
    let dir = tmp("container");
    let (home, etc) = (dir.join("var-lib-qgate"), dir.join("etc-qgate"));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&etc).unwrap();
    let admin = free_port();
    std::fs::write(etc.join("server.toml"), server_config(&home, admin)).unwrap();
    let map = |s: &str| {
        s.replace("/var/lib/qgate", &home.display().to_string())
            .replace("/etc/qgate", &etc.display().to_string())
            .replace("127.0.0.1:9464", &format!("127.0.0.1:{admin}"))
    };
    // ctl and the health check find the admin port the shipped config opens.
    assert!(
        img.env
            .contains(&("QGATE_ADMIN".into(), "127.0.0.1:9464".into())),
        "{:?}",
        img.env
    );
    let env: Vec<(String, String)> = img.env.iter().map(|(k, v)| (k.clone(), map(v))).collect();
    assert!(env.contains(&("QGATE_HOME".into(), home.display().to_string())));
    let argv: Vec<String> = img.argv.iter().map(|a| map(a)).collect();
    let (mut d, line) = start(daemon(&argv, &env, &home));
    assert!(line.contains("listening"), "{line}");
    post(&home, device_port(&line), "from-container");

    // The image's HEALTHCHECK, run as the image would run it.
    let health: Vec<String> = img.health.iter().map(|a| map(a)).collect();
    let o = daemon(&health, &env, &home).output().unwrap();
    assert!(
        o.status.success(),
        "healthcheck: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout), "ok\n");
    // Logs are JSON lines for the container's log driver (QGATE_LOG_FORMAT=json).
    assert!(env.contains(&("QGATE_LOG_FORMAT".into(), "json".into())));

    assert_eq!(terminate(&mut d, Duration::from_secs(20)).code(), Some(0));
    std::fs::remove_dir_all(&dir).ok();
}
