//! One qlog file per QUIC connection (quinn-proto's `qlog` feature), for qvis and other qlog
//! viewers. The directory comes from `[transport] qlog_dir`, `--qlog-dir` or `$QLOGDIR` (the
//! variable quiche, ngtcp2 and neqo read); each file is JSON-SEQ, named
//! `<client|server>-<peer>-<pid>-<n>.sqlog`. Times in it are the connection's own clock, so a
//! simulated connection's qlog is in virtual time. A debugging aid: nothing bounds the files.
//! (Decision O6.)

use std::fs::OpenOptions;
use std::io::BufWriter;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use quinn::{QlogConfig, QlogStream};

/// Which end of the connection writes the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vantage {
    /// The side that opened the connection.
    Client,
    /// The side that accepted it.
    Server,
}

impl Vantage {
    fn as_str(self) -> &'static str {
        match self {
            Vantage::Client => "client",
            Vantage::Server => "server",
        }
    }
}

/// Files written by this process so far: the `<n>` of the next name.
static NEXT: AtomicU64 = AtomicU64::new(0);

/// `peer` as a file-name part: letters, digits, `.` and `-` kept, anything else `_`.
fn file_part(peer: &str) -> String {
    peer.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// A new qlog stream into a new file in `dir` for one connection with `peer`; `None` (logged)
/// when the file cannot be created, so a full disk costs the trace, not the connection.
pub(crate) fn stream(dir: &Path, vantage: Vantage, peer: &str) -> Option<QlogStream> {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = format!(
        "{}-{}-{}-{n}.sqlog",
        vantage.as_str(),
        file_part(peer),
        std::process::id()
    );
    let path = dir.join(name);
    let file = match OpenOptions::new().write(true).create_new(true).open(&path) {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot create qlog file");
            return None;
        }
    };
    let mut c = QlogConfig::default();
    c.writer(Box::new(BufWriter::new(file)))
        .title(Some(format!("qgate {} {peer}", vantage.as_str())))
        // The clock quinn gives the connection: tokio's, which a simulation pauses.
        .start_time(tokio::time::Instant::now().into_std());
    c.into_stream()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_become_safe_file_names() {
        assert_eq!(file_part("[::1]:4433"), "___1__4433");
        assert_eq!(
            file_part("gw.example@10.0.0.1:443"),
            "gw.example_10.0.0.1_443"
        );
        assert_eq!(file_part("../../etc"), ".._.._etc");
    }

    #[test]
    fn a_missing_directory_costs_the_trace_only() {
        assert!(stream(Path::new("/nonexistent/qgate-qlog"), Vantage::Client, "x").is_none());
    }
}
