//! Apache ActiveMQ Artemis 2.44 (`tools/artemis`, built with Maven) as a child process: test
//! and benchmark support, not part of qgate. It is the third-party AMQP peer our client is
//! tested against (`tests/artemis.rs`) and the broker `qgate-lab bench amqp --artemis` compares with.

use std::io::BufRead;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A running Artemis, killed when dropped.
pub struct Artemis {
    child: Child,
    /// Its AMQP acceptor (plain TCP).
    pub addr: SocketAddr,
}

impl Drop for Artemis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `tools/artemis` in this repository.
pub fn default_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/artemis")
}

/// Build `dir` with `mvn -q -B package` and start Artemis on a free loopback port, keeping
/// nothing; the error names the step that failed.
pub fn start(dir: &Path) -> Result<Artemis, String> {
    start_with(dir, None, None)
}

/// [`start`] on `port` (None: a free one), journalling durable messages in `data` (None: no
/// persistence), so a test can kill it and start it again where it was.
pub fn start_with(dir: &Path, port: Option<u16>, data: Option<&Path>) -> Result<Artemis, String> {
    launch(dir, port, data, None)
}

/// One node of a two-node cluster (`core` its cluster port, `peer` the other node's), keeping
/// nothing: messages go to whichever node has consumers.
pub fn start_node(dir: &Path, core: u16, peer: u16) -> Result<Artemis, String> {
    launch(dir, None, None, Some((core, peer)))
}

/// A free loopback TCP port.
pub fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("finding a free port: {e}"))
}

/// `mvn -q -B package` in `dir`, once per process: tests that start Artemis at the same time
/// must not run two Maven builds into one target directory (they race copying the jars).
fn build(dir: &Path) -> Result<(), String> {
    static BUILT: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if built.as_deref() == Some(dir) {
        return Ok(());
    }
    let out = Command::new("mvn")
        .args(["-q", "-B", "package"])
        .current_dir(dir)
        .output()
        .map_err(|e| format!("running mvn in {}: {e}", dir.display()))?;
    if !out.status.success() {
        return Err(format!(
            "mvn package failed in {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stdout)
        ));
    }
    *built = Some(dir.to_path_buf());
    Ok(())
}

fn launch(
    dir: &Path,
    port: Option<u16>,
    data: Option<&Path>,
    cluster: Option<(u16, u16)>,
) -> Result<Artemis, String> {
    build(dir)?;
    let port = match port {
        Some(p) => p,
        None => free_port()?,
    };
    let mut extra: Vec<String> = Vec::new();
    if let Some(d) = data {
        extra.push("--data".into());
        extra.push(d.display().to_string());
    }
    if let Some((core, peer)) = cluster {
        extra.extend(["--cluster".into(), core.to_string(), peer.to_string()]);
    }
    let mut child = Command::new("java")
        .args([
            "-cp",
            "target/classes:target/lib/*",
            "qgate.EmbeddedArtemis",
        ])
        .arg(port.to_string())
        .args(&extra)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting java: {e}"))?;
    let mut line = String::new();
    let read = std::io::BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line);
    if read.is_err() || !line.starts_with("READY") {
        let _ = child.kill();
        let _ = child.wait();
        return Err(format!("Artemis did not start: {line}"));
    }
    Ok(Artemis {
        child,
        addr: ([127, 0, 0, 1], port).into(),
    })
}
