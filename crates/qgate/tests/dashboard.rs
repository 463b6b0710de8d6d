//! The admin port's dashboard in a real browser (headless Chromium driven over WebDriver by
//! chromedriver): the gateway's page loads, shows its paths and spool, updates by itself when the paths
//! go down, and fits a phone's width. `.ci/run` installs Chromium; with QGATE_INTEROP set a
//! missing browser fails the suite, otherwise the test is skipped.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use http::Method;
use qgate_admin::AdminClient;
use serde_json::{json, Value};

mod common;
use common::{first_line, Proc};

fn qgate(home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_qgate"));
    c.env("QGATE_HOME", home)
        .env_remove("QGATE_CONFIG")
        .env_remove("QGATE_ADMIN_TOKEN")
        .env_remove("RUST_LOG");
    c
}

/// Start a daemon (stderr discarded) and return it with its first stdout line.
fn daemon(cmd: &mut Command) -> (Proc, String) {
    first_line(cmd.stderr(Stdio::null()))
}

fn after(line: &str, tag: &str, end: &[char]) -> String {
    line.split(tag)
        .nth(1)
        .and_then(|r| r.split(end).next())
        .unwrap_or_else(|| panic!("no {tag} in {line}"))
        .to_string()
}

fn find(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|n| {
        std::env::split_paths(&path)
            .map(|d| d.join(n))
            .find(|p| p.is_file())
    })
}

/// A WebDriver session on chromedriver at `port`.
struct Browser {
    client: AdminClient,
    session: String,
    rt: tokio::runtime::Runtime,
}

impl Browser {
    fn call(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        let (status, bytes) = self
            .rt
            .block_on(self.client.request(method, path, body.as_ref()))
            .unwrap();
        let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        assert!(status.is_success(), "{path}: {status} {v}");
        v["value"].clone()
    }

    fn open(port: u16) -> Browser {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = AdminClient::new(&format!("127.0.0.1:{port}"), None).unwrap();
        let mut b = Browser {
            client,
            session: String::new(),
            rt,
        };
        let caps = json!({"capabilities": {"alwaysMatch": {"goog:chromeOptions": {
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
        }}}});
        let v = b.call(Method::POST, "/session", Some(caps));
        b.session = v["sessionId"].as_str().unwrap().to_string();
        b
    }

    fn go(&self, url: &str) {
        self.call(
            Method::POST,
            &format!("/session/{}/url", self.session),
            Some(json!({ "url": url })),
        );
    }

    fn eval(&self, script: &str) -> Value {
        self.call(
            Method::POST,
            &format!("/session/{}/execute/sync", self.session),
            Some(json!({ "script": script, "args": [] })),
        )
    }

    /// Evaluate `script` until it returns `want` (within `limit`).
    fn wait_for(&self, script: &str, want: &str, limit: Duration) -> Value {
        let t = Instant::now();
        loop {
            let v = self.eval(script);
            if v.as_str() == Some(want) {
                return v;
            }
            assert!(t.elapsed() < limit, "{script} never gave {want}: last {v}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.rt.block_on(self.client.request(
                Method::DELETE,
                &format!("/session/{}", self.session),
                None,
            ));
        }
    }
}

const STATES: &str =
    "return [...document.querySelectorAll('#paths tbody td.state')].map(e => e.textContent).join(',')";

#[test]
fn the_gateway_dashboard_shows_its_paths_and_follows_them_down() {
    let (Some(chrome), Some(driver)) = (
        find(&["chromium", "chromium-browser", "google-chrome"]),
        find(&["chromedriver"]),
    ) else {
        assert!(
            std::env::var_os("QGATE_INTEROP").is_none(),
            "QGATE_INTEROP is set but Chromium or chromedriver is missing (.ci/run installs them)"
        );
        eprintln!("skipped: no chromium and chromedriver on PATH");
        return;
    };
    let home = std::env::temp_dir().join(format!("qgate-dashboard-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home).unwrap();
    let (server, line) = daemon(qgate(&home).args(["server", "--listen", "127.0.0.1:0"]));
    let sport = after(&line, "udp/127.0.0.1:", &[' ']);
    let (_gateway, line) = daemon(qgate(&home).args([
        "gateway",
        "--listen",
        "127.0.0.1:0",
        "--server",
        &format!("127.0.0.1:{sport}"),
        "--path",
        "127.0.0.2:0",
        "--path",
        "127.0.0.3:0",
        "--probe-interval",
        "200ms",
        "--admin",
        "127.0.0.1:0",
        "--spool",
        home.join("spool").to_str().unwrap(),
    ]));
    let admin = after(&line, "admin http://", &['/']);
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let _driver = Proc(
        Command::new(&driver)
            .arg(format!("--port={port}"))
            .env("CHROME_BIN", &chrome)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "chromedriver did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let b = Browser::open(port);
    b.go(&format!("http://{admin}/"));
    b.wait_for(STATES, "up,up", Duration::from_secs(20));
    assert_eq!(
        b.eval("return document.title").as_str(),
        Some("qgate gateway")
    );
    // The spool's panel: its classes, empty while the server answers.
    b.wait_for(
        "const t = document.querySelector('#gw-spool table'); return t ? t.rows.length + ':' + t.rows[1].cells[1].textContent : ''",
        "3:0",
        Duration::from_secs(10),
    );
    let ticks = "return document.getElementById('ticks').textContent";
    let before: u64 = b.eval(ticks).as_str().unwrap().parse().unwrap();
    // The server goes away: both paths fail their probes, and the open page shows it.
    drop(server);
    b.wait_for(STATES, "down,down", Duration::from_secs(30));
    let after: u64 = b.eval(ticks).as_str().unwrap().parse().unwrap();
    assert!(
        after > before,
        "the page refreshed itself ({before} → {after})"
    );
    assert_eq!(
        b.eval("return document.getElementById('error').textContent")
            .as_str(),
        Some("")
    );
    // A phone's width: nothing wider than the screen but the tables' own scrolling boxes.
    b.call(
        Method::POST,
        &format!("/session/{}/window/rect", b.session),
        Some(json!({"width": 390, "height": 844})),
    );
    b.wait_for(
        "return String(document.documentElement.scrollWidth <= window.innerWidth)",
        "true",
        Duration::from_secs(5),
    );
}
