//! Process helpers shared by the CLI's integration tests.
// Each test file uses a subset of these.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// A child process, killed and reaped when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start `cmd` (its stderr as the caller set it) and return it with its first stdout line: a
/// daemon's "listening" line.
pub fn first_line(cmd: &mut Command) -> (Proc, String) {
    let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (Proc(child), line)
}

/// Whether `qgate-lab linkem` can run here: root and a TUN device (CI runs as root).
pub fn root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
        && std::path::Path::new("/dev/net/tun").exists()
}

/// The address in a daemon's "… listening on udp/ADDR …" line.
pub fn listening_addr(line: &str) -> std::net::SocketAddr {
    line.split("udp/")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no udp/ADDR in {line:?}"))
}

/// The lab's binary, for its link emulator: built beside the product's by
/// `cargo test --workspace`.
pub fn lab_binary() -> std::path::PathBuf {
    let lab = std::path::Path::new(env!("CARGO_BIN_EXE_qgate")).with_file_name("qgate-lab");
    assert!(
        lab.exists(),
        "{} is missing: build it (cargo build -p qgate-lab) or run the workspace's tests",
        lab.display()
    );
    lab
}
