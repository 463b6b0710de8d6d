//! Where ingested bodies go: counted only, stored as files, or sent to an AMQP queue — durably,
//! before acknowledgement.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::queue_sink::QueueSink;
use crate::room::Room;

/// Storing a body failed.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// A file or directory could not be written (answered 500).
    #[error("sink {path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The queue did not take the message now (answered 503: try again later).
    #[error("{0}")]
    Unavailable(String),
    /// Larger than the queue takes (answered 413).
    #[error("{0}")]
    TooLarge(String),
    /// The queue refused the message for good (answered 500).
    #[error("{0}")]
    Refused(String),
    /// The disk is nearly full (answered 507): nothing was stored (decision S11).
    #[error("{0}")]
    Full(String),
}

impl SinkError {
    /// The HTTP status a device gets for this failure.
    pub fn status(&self) -> http::StatusCode {
        match self {
            SinkError::Io { .. } | SinkError::Refused(_) => http::StatusCode::INTERNAL_SERVER_ERROR,
            SinkError::Unavailable(_) => http::StatusCode::SERVICE_UNAVAILABLE,
            SinkError::TooLarge(_) => http::StatusCode::PAYLOAD_TOO_LARGE,
            SinkError::Full(_) => http::StatusCode::INSUFFICIENT_STORAGE,
        }
    }
}

/// One ingested body and what is known about it.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    /// The stream (from `/ingest/<stream>`).
    pub stream: &'a str,
    /// The body.
    pub body: &'a [u8],
    /// The forwarder's request id (`qgate-request-id`), if any.
    pub request_id: Option<&'a str>,
    /// The device: the forwarder's `qgate-device`, else the peer's address.
    pub device: &'a str,
    /// The gateway's backhaul path, if it said (`qgate-path`).
    pub path: Option<usize>,
}

/// The destination of ingested bodies.
#[derive(Debug)]
pub enum Sink {
    /// Count bodies; keep nothing.
    Count {
        /// Next id.
        next: AtomicU64,
    },
    /// One file per body under `root/<stream>/<id>.bin`, fsynced and renamed into place before
    /// the request is acknowledged, so an acknowledged body survives a crash.
    Dir {
        /// The directory.
        root: PathBuf,
        /// Next id (continues after the largest id already on disk).
        next: AtomicU64,
        /// The room its filesystem keeps free (S11).
        room: Room,
    },
    /// A message on an AMQP 1.0 queue, accepted by the broker before the request is
    /// acknowledged.
    Queue(QueueSink),
}

fn err(path: &Path) -> impl FnOnce(std::io::Error) -> SinkError + '_ {
    move |source| SinkError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl Sink {
    /// A sink that only counts.
    pub fn count_only() -> Sink {
        Sink::Count {
            next: AtomicU64::new(1),
        }
    }

    /// A sink storing under `root` (created if missing), keeping
    /// [`DEFAULT_KEEP_FREE`](crate::room::DEFAULT_KEEP_FREE) free on its filesystem. Ids continue
    /// after those on disk.
    pub fn directory(root: &Path) -> Result<Sink, SinkError> {
        Sink::directory_keeping(root, crate::room::DEFAULT_KEEP_FREE)
    }

    /// [`Sink::directory`] keeping `keep_free` bytes free: a body that would leave less is
    /// refused (507), not stored.
    pub fn directory_keeping(root: &Path, keep_free: u64) -> Result<Sink, SinkError> {
        std::fs::create_dir_all(root).map_err(err(root))?;
        let mut max = 0u64;
        for stream in std::fs::read_dir(root).map_err(err(root))? {
            let stream = stream.map_err(err(root))?.path();
            if !stream.is_dir() {
                continue;
            }
            for f in std::fs::read_dir(&stream).map_err(err(&stream))? {
                let name = f.map_err(err(&stream))?.file_name();
                let id = name
                    .to_str()
                    .and_then(|n| n.strip_suffix(".bin"))
                    .and_then(|n| n.parse::<u64>().ok());
                max = max.max(id.unwrap_or(0));
            }
        }
        Ok(Sink::Dir {
            root: root.to_path_buf(),
            next: AtomicU64::new(max + 1),
            room: Room::new(root, keep_free),
        })
    }

    /// Store one record; returns its id once it is durable.
    pub async fn store(&self, rec: &Record<'_>) -> Result<u64, SinkError> {
        match self {
            Sink::Count { next } => Ok(next.fetch_add(1, Ordering::Relaxed)),
            Sink::Queue(q) => q.deliver(rec).await,
            Sink::Dir { root, next, room } => {
                let id = next.fetch_add(1, Ordering::Relaxed);
                let dir = root.join(rec.stream);
                let body = rec.body.to_vec();
                let room = room.clone();
                tokio::task::spawn_blocking(move || {
                    room.check(body.len() as u64).map_err(SinkError::Full)?;
                    write_durably(&dir, id, &body)
                })
                .await
                .map_err(|e| SinkError::Io {
                    path: root.clone(),
                    source: std::io::Error::other(e),
                })??;
                Ok(id)
            }
        }
    }
}

/// Write `dir/<id>.bin` via a temporary file: write, fsync, rename, fsync the directory. A crash
/// at any point leaves either no file or the whole file, never a torn one under the final name.
fn write_durably(dir: &Path, id: u64, body: &[u8]) -> Result<(), SinkError> {
    use std::io::Write;
    std::fs::create_dir_all(dir).map_err(err(dir))?;
    let tmp = dir.join(format!(".{id:012}.tmp"));
    let dst = dir.join(format!("{id:012}.bin"));
    let mut f = std::fs::File::create(&tmp).map_err(err(&tmp))?;
    f.write_all(body).map_err(err(&tmp))?;
    f.sync_all().map_err(err(&tmp))?;
    drop(f);
    std::fs::rename(&tmp, &dst).map_err(err(&dst))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(err(dir))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec<'a>(stream: &'a str, body: &'a [u8]) -> Record<'a> {
        Record {
            stream,
            body,
            request_id: None,
            device: "test",
            path: None,
        }
    }

    #[tokio::test]
    async fn a_body_that_would_leave_too_little_disk_is_refused_and_not_stored() {
        let root = std::env::temp_dir().join(format!("qgate-sink-full-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        // More kept free than any disk here has: every body is refused.
        let sink = Sink::directory_keeping(&root, 1 << 60).unwrap();
        let e = sink.store(&rec("a", b"one")).await.unwrap_err();
        assert_eq!(e.status(), http::StatusCode::INSUFFICIENT_STORAGE);
        assert!(e.to_string().contains("nearly full"), "{e}");
        assert!(!root.join("a").exists(), "nothing stored");
        // With room, the same body is stored.
        let sink = Sink::directory_keeping(&root, 0).unwrap();
        assert!(sink.store(&rec("a", b"one")).await.is_ok());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[tokio::test]
    async fn ids_continue_across_restarts() {
        let root = std::env::temp_dir().join(format!("qgate-sink-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let sink = Sink::directory(&root).unwrap();
        assert_eq!(sink.store(&rec("a", b"one")).await.unwrap(), 1);
        assert_eq!(sink.store(&rec("b", b"two")).await.unwrap(), 2);
        drop(sink);
        let sink = Sink::directory(&root).unwrap();
        assert_eq!(sink.store(&rec("a", b"three")).await.unwrap(), 3);
        assert_eq!(
            std::fs::read(root.join("a/000000000001.bin")).unwrap(),
            b"one"
        );
        assert_eq!(
            std::fs::read(root.join("a/000000000003.bin")).unwrap(),
            b"three"
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn unusable_root_is_named() {
        let f = std::env::temp_dir().join(format!("qgate-sink-file-{}", std::process::id()));
        std::fs::write(&f, b"x").unwrap();
        let e = Sink::directory(&f).unwrap_err().to_string();
        assert!(e.contains(&f.display().to_string()), "{e}");
        let _ = std::fs::remove_file(&f);
    }
}
