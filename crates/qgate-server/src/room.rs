//! The disk room the server keeps free (decision S11): an ingest body or an upload that would
//! leave less than that free on its filesystem, or too few inodes, is refused with 507 and
//! nothing of it is stored, so hostile or runaway clients cannot fill the machine's disk.

use std::path::{Path, PathBuf};

/// Bytes kept free on the filesystem of the sink and the upload directory when none is
/// configured (`--keep-free`).
pub const DEFAULT_KEEP_FREE: u64 = 1 << 30;

/// Inodes kept free: this many, or 1 % of the filesystem's, whichever is more (a flood of
/// tiny bodies or empty uploads runs out of inodes before bytes).
const KEEP_INODES: u64 = 1024;

/// The room one directory's filesystem must keep.
#[derive(Debug, Clone)]
pub struct Room {
    dir: PathBuf,
    keep_bytes: u64,
}

impl Room {
    /// Keep `keep_bytes` free on the filesystem holding `dir`.
    pub fn new(dir: &Path, keep_bytes: u64) -> Room {
        Room {
            dir: dir.to_path_buf(),
            keep_bytes,
        }
    }

    /// Whether `need` more bytes (and a file) fit with the room kept; if not, why, as the
    /// client is told. A filesystem that cannot be asked is taken as having room (the write
    /// itself then fails or not).
    pub fn check(&self, need: u64) -> Result<(), String> {
        let Ok(s) = rustix::fs::statvfs(&self.dir) else {
            return Ok(());
        };
        let free = s.f_bavail.saturating_mul(s.f_frsize);
        if free < self.keep_bytes.saturating_add(need) {
            return Err(format!(
                "the server's disk is nearly full ({} free, {} kept free): try again later",
                human(free),
                human(self.keep_bytes)
            ));
        }
        // Filesystems that do not count inodes report 0 of them.
        let keep_inodes = KEEP_INODES.max(s.f_files / 100);
        if s.f_files > 0 && s.f_favail < keep_inodes {
            return Err(format!(
                "the server's disk is out of files ({} left, {keep_inodes} kept): try again later",
                s.f_favail
            ));
        }
        Ok(())
    }
}

fn human(b: u64) -> String {
    qgate_core::units::format_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_judged_against_what_is_kept_and_what_is_asked() {
        let dir = std::env::temp_dir();
        let s = rustix::fs::statvfs(&dir).unwrap();
        let free = s.f_bavail * s.f_frsize;
        assert!(Room::new(&dir, 0).check(0).is_ok());
        let e = Room::new(&dir, free + (1 << 30)).check(0).unwrap_err();
        assert!(e.contains("nearly full"), "{e}");
        // What the write needs counts with what is kept.
        assert!(Room::new(&dir, free / 2).check(free).is_err());
        // A directory that cannot be asked does not refuse.
        assert!(Room::new(Path::new("/nonexistent/qgate"), u64::MAX)
            .check(0)
            .is_ok());
    }
}
