//! Process helpers shared by the CLI's integration tests.

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
