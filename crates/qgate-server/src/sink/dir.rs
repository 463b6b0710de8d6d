//! One file per record under `root/<stream>/<id>.bin`, fsynced and renamed into place before
//! the record is acknowledged, so an acknowledged record survives a crash.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{io_error as err, Record, Sink, SinkError, Stored};
use crate::room::Room;

/// Stores each record as a file (see the module).
#[derive(Debug)]
pub struct DirSink {
    /// The directory.
    root: PathBuf,
    /// Next id (continues after the largest id already on disk).
    next: AtomicU64,
    /// The room its filesystem keeps free (S11).
    room: Room,
}

impl DirSink {
    /// A sink storing under `root` (created if missing), keeping
    /// [`DEFAULT_KEEP_FREE`](crate::room::DEFAULT_KEEP_FREE) free on its filesystem. Ids continue
    /// after those on disk.
    pub fn open(root: &Path) -> Result<DirSink, SinkError> {
        DirSink::open_keeping(root, crate::room::DEFAULT_KEEP_FREE)
    }

    /// [`DirSink::open`] keeping `keep_free` bytes free: a body that would leave less is refused
    /// (507), not stored.
    pub fn open_keeping(root: &Path, keep_free: u64) -> Result<DirSink, SinkError> {
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
        Ok(DirSink {
            root: root.to_path_buf(),
            next: AtomicU64::new(max + 1),
            room: Room::new(root, keep_free),
        })
    }
}

impl Sink for DirSink {
    fn store<'a>(&'a self, rec: &'a Record<'a>) -> Stored<'a> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let dir = self.root.join(rec.stream);
        // Shared, not copied: the blocking pool's thread holds the request's bytes.
        let body = rec.body.clone();
        let room = self.room.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                room.check(body.len() as u64).map_err(SinkError::Full)?;
                write_durably(&dir, id, &body)
            })
            .await
            .map_err(|e| SinkError::Io {
                path: self.root.clone(),
                source: std::io::Error::other(e),
            })??;
            Ok(id)
        })
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

    fn rec<'a>(stream: &'a str, body: &'a bytes::Bytes) -> Record<'a> {
        Record {
            stream,
            body,
            request_id: None,
            device: "test",
            path: None,
            class: None,
        }
    }

    #[tokio::test]
    async fn a_body_that_would_leave_too_little_disk_is_refused_and_not_stored() {
        let root = std::env::temp_dir().join(format!("qgate-sink-full-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        // More kept free than any disk here has: every body is refused.
        let sink = DirSink::open_keeping(&root, 1 << 60).unwrap();
        let e = sink
            .store(&rec("a", &bytes::Bytes::from_static(b"one")))
            .await
            .unwrap_err();
        assert_eq!(e.status(), http::StatusCode::INSUFFICIENT_STORAGE);
        assert!(e.to_string().contains("nearly full"), "{e}");
        assert!(!root.join("a").exists(), "nothing stored");
        // With room, the same body is stored.
        let sink = DirSink::open_keeping(&root, 0).unwrap();
        assert!(sink
            .store(&rec("a", &bytes::Bytes::from_static(b"one")))
            .await
            .is_ok());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[tokio::test]
    async fn ids_continue_across_restarts() {
        let root = std::env::temp_dir().join(format!("qgate-sink-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let sink = DirSink::open(&root).unwrap();
        assert_eq!(
            sink.store(&rec("a", &bytes::Bytes::from_static(b"one")))
                .await
                .unwrap(),
            1
        );
        assert_eq!(
            sink.store(&rec("b", &bytes::Bytes::from_static(b"two")))
                .await
                .unwrap(),
            2
        );
        drop(sink);
        let sink = DirSink::open(&root).unwrap();
        assert_eq!(
            sink.store(&rec("a", &bytes::Bytes::from_static(b"three")))
                .await
                .unwrap(),
            3
        );
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
        let e = DirSink::open(&f).unwrap_err().to_string();
        assert!(e.contains(&f.display().to_string()), "{e}");
        let _ = std::fs::remove_file(&f);
    }
}
