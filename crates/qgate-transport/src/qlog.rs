//! One qlog file per QUIC connection (quinn-proto's `qlog` feature), for qvis and other qlog
//! viewers. The directory comes from `[transport] qlog_dir`, `--qlog-dir` or `$QLOGDIR` (the
//! variable quiche, ngtcp2 and neqo read); each file is JSON-SEQ, named
//! `<client|server>-<peer>-<pid>-<n>.sqlog`. Times in it are the connection's own clock, so a
//! simulated connection's qlog is in virtual time. A debugging aid: nothing bounds the files.
//! (Decision O6.)

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

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

/// A failure to create a file was logged as a warning (later ones are debug lines: with an
/// unwritable directory every connection would warn).
static WARNED: AtomicBool = AtomicBool::new(false);

/// Longest peer part of a file name, characters (names stay under 255 bytes).
const MAX_PEER_PART: usize = 120;

/// `peer` as a file-name part: letters, digits, `.` and `-` kept, anything else `_`.
fn file_part(peer: &str) -> String {
    peer.chars()
        .take(MAX_PEER_PART)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Writes each JSON-SEQ record to the file whole, as soon as it ends (the streamer ends every
/// record with a lone `\n` write): a long-lived connection's trace is readable while it runs,
/// and a crash loses at most the record being written.
struct RecordWriter {
    file: File,
    record: Vec<u8>,
}

impl Write for RecordWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.record.extend_from_slice(buf);
        if buf.ends_with(b"\n") {
            self.flush()?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let r = self.file.write_all(&self.record);
        self.record.clear();
        r
    }
}

/// Create the next free file for `vantage` and `peer` in `dir` (never an existing one: a
/// restarted process reuses pids and counters).
fn create(dir: &Path, vantage: Vantage, peer: &str) -> io::Result<(PathBuf, File)> {
    let peer = file_part(peer);
    let mut open = OpenOptions::new();
    open.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!(
            "{}-{peer}-{}-{n}.sqlog",
            vantage.as_str(),
            std::process::id()
        ));
        match open.open(&path) {
            Ok(f) => return Ok((path, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
        }
    }
}

/// A new qlog stream into a new file in `dir` for one connection with `peer`; `None` (logged)
/// when the file cannot be created, so a full disk costs the trace, not the connection.
pub(crate) fn stream(dir: &Path, vantage: Vantage, peer: &str) -> Option<QlogStream> {
    let file = match create(dir, vantage, peer) {
        Ok((_, f)) => f,
        Err(e) => {
            if WARNED.swap(true, Ordering::Relaxed) {
                tracing::debug!(error = %e, "cannot create qlog file");
            } else {
                tracing::warn!(error = %e, "cannot create qlog file (further failures at debug level)");
            }
            return None;
        }
    };
    let mut c = QlogConfig::default();
    c.writer(Box::new(RecordWriter {
        file,
        record: Vec::with_capacity(512),
    }))
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
        assert_eq!(file_part(&"x".repeat(1000)).len(), MAX_PEER_PART);
    }

    #[test]
    fn an_existing_file_is_never_reused_and_records_are_written_whole() {
        let dir = std::env::temp_dir().join(format!("qgate-qlog-unit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (first, _) = create(&dir, Vantage::Server, "p").unwrap();
        // What a restarted process with the same pid would try next.
        let n = NEXT.load(Ordering::Relaxed);
        let taken = dir.join(format!("server-p-{}-{n}.sqlog", std::process::id()));
        std::fs::write(&taken, b"earlier run").unwrap();
        let (second, file) = create(&dir, Vantage::Server, "p").unwrap();
        assert!(second != first && second != taken, "{second:?}");
        assert_eq!(std::fs::read(&taken).unwrap(), b"earlier run");
        let mut w = RecordWriter {
            file,
            record: Vec::new(),
        };
        w.write_all(b"\x1e{\"a\":").unwrap();
        assert_eq!(
            std::fs::read(&second).unwrap(),
            b"",
            "half a record stays buffered"
        );
        w.write_all(b"1}").unwrap();
        w.write_all(b"\n").unwrap();
        assert_eq!(std::fs::read(&second).unwrap(), b"\x1e{\"a\":1}\n");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&second).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "only the owner reads a trace");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_directory_costs_the_trace_only() {
        assert!(stream(Path::new("/nonexistent/qgate-qlog"), Vantage::Client, "x").is_none());
    }
}
