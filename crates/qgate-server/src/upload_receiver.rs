//! The receiving side of the two-ended upload (paper 001 Algorithm 2): each chunk is written at
//! its offset as it arrives (positional writes, no reordering buffer), on whichever connection
//! it comes. Protocol: `qgate_chunks` (decision U1); storage rules: decision U3.
//!
//! Under the upload directory, file `NAME` is complete and verified; `.NAME.part` holds the
//! chunks received so far and `.NAME.state` the file's description and the chunks known to be
//! on disk (written after an fsync of the part file). An announcement syncs, so the chunks it
//! reports as held survive a crash; the last chunk's `201` comes only after the whole file was
//! read back, matched its SHA-256, was fsynced and renamed into place.

use crate::room::Room;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::IpAddr;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use qgate_chunks::{hex, FileInfo, Held};
use tokio::time::Instant;

/// Limits on what uploads may hold (decision U3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UploadLimits {
    /// Largest file accepted, bytes.
    pub max_file_bytes: u64,
    /// Most chunks one file may have (the server keeps a byte per chunk in memory).
    pub max_chunks: usize,
    /// Largest chunk, bytes; a server lowers it to its largest request body
    /// ([`Uploads::cap_chunk`]), so no announced upload has chunks it would refuse.
    pub max_chunk_bytes: u64,
    /// Most uploads in progress in memory at once; more wait for an idle one to be flushed.
    pub max_active: usize,
    /// Most of those one client address may have started, so one client cannot take every
    /// slot (its own idle ones make room first).
    pub max_active_per_client: usize,
    /// An upload untouched this long may be flushed to disk and dropped from memory (it
    /// resumes from disk at its next announcement).
    pub idle: Duration,
    /// An unfinished upload whose files nobody wrote for this long is deleted by
    /// [`Uploads::expire`] (`qgate server` runs it at start and every
    /// [`EXPIRE_CHECK_EVERY`]); `None` keeps them until an operator removes them.
    pub expire_after: Option<Duration>,
    /// Bytes kept free on the upload directory's filesystem: a new upload or a chunk that
    /// would leave less is refused with 507 (decision S11).
    pub keep_free: u64,
}

/// How often `qgate server` deletes expired unfinished uploads.
pub const EXPIRE_CHECK_EVERY: Duration = Duration::from_secs(3600);

impl Default for UploadLimits {
    fn default() -> Self {
        UploadLimits {
            max_file_bytes: 4 << 30,
            max_chunks: 1 << 20,
            max_chunk_bytes: qgate_chunks::MAX_CHUNK,
            max_active: 64,
            max_active_per_client: 8,
            idle: Duration::from_secs(60),
            expire_after: Some(Duration::from_secs(7 * 86_400)),
            keep_free: crate::room::DEFAULT_KEEP_FREE,
        }
    }
}

/// Why an upload request was refused: each becomes an HTTP status and a sentence.
#[derive(Debug, thiserror::Error)]
pub enum UploadFailure {
    /// A malformed request (400).
    #[error("{0}")]
    Bad(String),
    /// Conflicts with what is stored (409); nothing stored changed.
    #[error("{0}")]
    Conflict(String),
    /// Over a limit (413).
    #[error("{0}")]
    TooLarge(String),
    /// Too many uploads at once (503).
    #[error("{0}")]
    Busy(String),
    /// The finished file does not match its announced checksum (422); it was discarded.
    #[error("{0}")]
    Checksum(String),
    /// The disk is nearly full (507): nothing of it was stored (S11).
    #[error("{0}")]
    Full(String),
    /// The disk failed (500).
    #[error("upload storage {path}: {source}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

impl UploadFailure {
    /// The HTTP status for it.
    pub fn status(&self) -> http::StatusCode {
        use http::StatusCode as S;
        match self {
            UploadFailure::Bad(_) => S::BAD_REQUEST,
            UploadFailure::Conflict(_) => S::CONFLICT,
            UploadFailure::TooLarge(_) => S::PAYLOAD_TOO_LARGE,
            UploadFailure::Busy(_) => S::SERVICE_UNAVAILABLE,
            UploadFailure::Checksum(_) => S::UNPROCESSABLE_ENTITY,
            UploadFailure::Full(_) => S::INSUFFICIENT_STORAGE,
            UploadFailure::Io { .. } => S::INTERNAL_SERVER_ERROR,
        }
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> UploadFailure + '_ {
    move |source| UploadFailure::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What an announcement found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Announced {
    /// The upload is (now) in progress; these chunks are on disk.
    InProgress(Held),
    /// The file is complete and verified.
    Complete,
}

/// What storing a chunk did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// Written at its offset.
    Written,
    /// The same bytes were already there.
    Duplicate,
    /// It was the last one: the file is verified, durable and in place.
    Complete,
    /// The file was already complete: answered as complete too, so the device learns it from
    /// whichever of two copies of the last chunk it reads first (decision U12).
    AlreadyComplete,
}

/// A chunk's state.
const NONE: u8 = 0;
const WRITTEN: u8 = 1;
const DURABLE: u8 = 2;

struct Entry {
    info: FileInfo,
    file: File,
    chunks: Vec<u8>,
    held: usize,
    /// Bytes written since the last sync.
    unsynced: u64,
    /// Verified and in place (the entry is about to leave the map).
    complete: bool,
    used: Instant,
    /// The client that started it (for the per-client limit): its address, or IPv6 /64.
    client: IpAddr,
}

/// Sync a part file and its held list after this many new bytes, so a crash loses at most
/// this much of an upload (besides announcements, which always sync).
pub const SYNC_EVERY: u64 = 8 << 20;

/// The upload directory and the uploads in progress.
pub struct Uploads {
    root: PathBuf,
    limits: UploadLimits,
    room: Room,
    active: Mutex<HashMap<String, Arc<Mutex<Entry>>>>,
}

/// Upload names are file names: `[A-Za-z0-9._-]{1,128}`, not starting with '.'.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

impl Uploads {
    /// Uploads stored under `root` (created if missing).
    pub fn new(root: &Path, limits: UploadLimits) -> Result<Uploads, UploadFailure> {
        if root.exists() && !root.is_dir() {
            return Err(io(root)(std::io::Error::new(
                std::io::ErrorKind::NotADirectory,
                "it exists and is not a directory",
            )));
        }
        std::fs::create_dir_all(root).map_err(io(root))?;
        Ok(Uploads {
            root: root.to_path_buf(),
            room: Room::new(root, limits.keep_free),
            limits,
            active: Mutex::new(HashMap::new()),
        })
    }

    /// Take no chunks larger than `max` bytes (the server's largest request body).
    pub fn cap_chunk(&mut self, max: u64) {
        self.limits.max_chunk_bytes = self.limits.max_chunk_bytes.min(max);
    }

    /// The directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn paths(&self, name: &str) -> (PathBuf, PathBuf, PathBuf) {
        (
            self.root.join(name),
            self.root.join(format!(".{name}.part")),
            self.root.join(format!(".{name}.state")),
        )
    }

    /// Announce `name` as `info`: start it, or say what is held, or that it is complete.
    pub fn announce(
        &self,
        client: IpAddr,
        name: &str,
        info: &FileInfo,
    ) -> Result<Announced, UploadFailure> {
        let Some(entry) = self.entry(client, name, info)? else {
            return Ok(Announced::Complete);
        };
        let mut e = entry.lock().expect("upload lock");
        if e.chunks.is_empty() {
            // An empty file has no chunk to complete it: it is complete when announced.
            let finished = self.finish(name, &mut e);
            drop(e);
            self.active.lock().expect("uploads lock").remove(name);
            return finished.map(|()| Announced::Complete);
        }
        self.sync(name, &mut e)?;
        let held = Held::from_fn(e.chunks.len(), |i| e.chunks[i] == DURABLE);
        Ok(Announced::InProgress(held))
    }

    /// Delete the files of every unfinished upload that is not in memory and whose part and
    /// state files were last written more than [`UploadLimits::expire_after`] before `now`
    /// (the wall clock: the files' times are). Returns the names deleted. A device that comes
    /// back later starts that upload afresh.
    pub fn expire(&self, now: std::time::SystemTime) -> Result<Vec<String>, UploadFailure> {
        let Some(age) = self.limits.expire_after else {
            return Ok(Vec::new());
        };
        // Under the map's lock: an upload cannot become active while its files go.
        let active = self.active.lock().expect("uploads lock");
        let mut names = Vec::new();
        for f in std::fs::read_dir(&self.root).map_err(io(&self.root))? {
            let f = f.map_err(io(&self.root))?;
            let file = f.file_name();
            // Unfinished uploads have a part file; a finished one keeps only its state (what
            // answers a repeated announcement).
            let Some(name) = file
                .to_str()
                .and_then(|n| n.strip_prefix('.').and_then(|n| n.strip_suffix(".part")))
            else {
                continue;
            };
            if valid_name(name) && !active.contains_key(name) && !names.iter().any(|n| n == name) {
                names.push(name.to_string());
            }
        }
        let mut gone = Vec::new();
        for name in names {
            let (_, part, state) = self.paths(&name);
            let written = [&part, &state]
                .iter()
                .filter_map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
                .max();
            let old = written.is_some_and(|t| now.duration_since(t).is_ok_and(|d| d > age));
            if old {
                for p in [&part, &state] {
                    match std::fs::remove_file(p) {
                        Ok(()) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        Err(e) => return Err(io(p)(e)),
                    }
                }
                gone.push(name);
            }
        }
        Ok(gone)
    }

    /// Sync every upload in progress (on a graceful shutdown).
    pub fn flush(&self) -> Result<(), UploadFailure> {
        let all: Vec<(String, Arc<Mutex<Entry>>)> = self
            .active
            .lock()
            .expect("uploads lock")
            .iter()
            .map(|(n, e)| (n.clone(), e.clone()))
            .collect();
        for (name, e) in all {
            self.sync(&name, &mut e.lock().expect("upload lock"))?;
        }
        Ok(())
    }

    /// Store chunk `index` of `name` (announced as `info`), sent by `client`.
    pub fn put(
        &self,
        client: IpAddr,
        name: &str,
        info: &FileInfo,
        index: usize,
        body: &[u8],
    ) -> Result<Stored, UploadFailure> {
        self.put_counting(client, name, info, index, body, |_| {})
    }

    /// [`put`](Self::put), calling `written` with the chunk's length when it is new, under the
    /// upload's lock: before any other chunk can complete the file, so a counter it feeds
    /// holds every chunk of a file by the time the file is answered complete.
    pub fn put_counting(
        &self,
        client: IpAddr,
        name: &str,
        info: &FileInfo,
        index: usize,
        body: &[u8],
        written: impl FnOnce(usize),
    ) -> Result<Stored, UploadFailure> {
        let layout = info.layout;
        let Some((offset, len)) = layout.range(index) else {
            return Err(UploadFailure::Bad(format!(
                "chunk {index} is outside the file: it has {} chunks",
                layout.chunks()
            )));
        };
        if body.len() != len {
            return Err(UploadFailure::Bad(format!(
                "chunk {index} must be {len} bytes, not {}",
                body.len()
            )));
        }
        let Some(entry) = self.entry(client, name, info)? else {
            return Ok(Stored::AlreadyComplete);
        };
        let mut e = entry.lock().expect("upload lock");
        let (_, part, _) = self.paths(name);
        if e.chunks[index] != NONE {
            let mut have = vec![0u8; len];
            e.file.read_exact_at(&mut have, offset).map_err(io(&part))?;
            return if have == body {
                Ok(Stored::Duplicate)
            } else {
                Err(UploadFailure::Conflict(format!(
                    "chunk {index} differs from the copy already stored; the first one is kept"
                )))
            };
        }
        self.room
            .check(body.len() as u64)
            .map_err(UploadFailure::Full)?;
        e.file.write_all_at(body, offset).map_err(io(&part))?;
        e.chunks[index] = WRITTEN;
        e.held += 1;
        written(body.len());
        e.unsynced += body.len() as u64;
        if e.held < e.chunks.len() {
            if e.unsynced >= SYNC_EVERY {
                self.sync(name, &mut e)?;
            }
            return Ok(Stored::Written);
        }
        let finished = self.finish(name, &mut e);
        drop(e);
        if matches!(finished, Ok(()) | Err(UploadFailure::Checksum(_))) {
            // Done with, either way: a new announcement starts afresh.
            self.active.lock().expect("uploads lock").remove(name);
        }
        finished.map(|()| Stored::Complete)
    }

    /// The entry for `name`, created or loaded from disk; `None` if the file is complete.
    fn entry(
        &self,
        client: IpAddr,
        name: &str,
        info: &FileInfo,
    ) -> Result<Option<Arc<Mutex<Entry>>>, UploadFailure> {
        // One client is an IPv4 address or an IPv6 /64 (decision S10).
        let client = qgate_core::quota::client_key(client);
        if !valid_name(name) {
            return Err(UploadFailure::Bad(
                "upload names are 1-128 characters of A-Z a-z 0-9 . _ - and do not start with '.'"
                    .into(),
            ));
        }
        let (done, part, state) = self.paths(name);
        let found = self.active.lock().expect("uploads lock").get(name).cloned();
        if let Some(e) = found {
            // Not under the map's lock: this one may be finishing (reading back a large file).
            let mut g = e.lock().expect("upload lock");
            if g.complete {
                // It finished while we waited for it.
                let same =
                    g.info.sha256 == info.sha256 && g.info.layout.size() == info.layout.size();
                return if same {
                    Ok(None)
                } else {
                    Err(different(name, &g.info, info, true))
                };
            }
            if g.info != *info {
                let same =
                    g.info.sha256 == info.sha256 && g.info.layout.size() == info.layout.size();
                if !(same && g.held == 0) {
                    return Err(different(name, &g.info, info, false));
                }
                // The same file in other chunks, nothing of it written yet (its chunks may
                // have been too large for this server): start over in the new size.
                drop(g);
                self.active.lock().expect("uploads lock").remove(name);
                let _ = std::fs::remove_file(&state);
                let _ = std::fs::remove_file(&part);
                return self.entry(client, name, info);
            }
            if part.exists() {
                g.used = Instant::now();
                drop(g);
                return Ok(Some(e));
            }
            // Its files were removed (by an operator): forget it and start afresh.
            drop(g);
            self.active.lock().expect("uploads lock").remove(name);
            let _ = std::fs::remove_file(&state);
        }
        let mut active = self.active.lock().expect("uploads lock");
        if active.contains_key(name) {
            // Created meanwhile: check it on the next call's fast path.
            drop(active);
            return self.entry(client, name, info);
        }
        if let Some(stored) = read_state(&state)? {
            let same_file = stored.info.sha256 == info.sha256
                && stored.info.layout.size() == info.layout.size();
            if stored.complete && same_file {
                // Complete: the chunk size it was sent with no longer matters.
                return Ok(None);
            }
            if stored.info != *info {
                if !(same_file && (stored.held.count() == 0 || !part.exists())) {
                    return Err(different(name, &stored.info, info, stored.complete));
                }
                // Nothing of it held: the new chunk size replaces the old.
                let _ = std::fs::remove_file(&state);
                let _ = std::fs::remove_file(&part);
            }
        } else if done.exists() {
            return Err(UploadFailure::Conflict(format!(
                "a file named '{name}' is already stored (not by an upload): pick another name"
            )));
        }
        let layout = info.layout;
        if layout.size() > self.limits.max_file_bytes {
            return Err(UploadFailure::TooLarge(format!(
                "the file is {} bytes; this server takes at most {}",
                layout.size(),
                self.limits.max_file_bytes
            )));
        }
        if layout.chunk_size() > self.limits.max_chunk_bytes {
            return Err(UploadFailure::TooLarge(format!(
                "chunks of {} bytes are larger than this server takes in one request ({}): \
                 upload with --chunk {} or less",
                layout.chunk_size(),
                self.limits.max_chunk_bytes,
                self.limits.max_chunk_bytes
            )));
        }
        if layout.chunks() > self.limits.max_chunks {
            return Err(UploadFailure::TooLarge(format!(
                "the file has {} chunks; this server takes at most {}: use larger chunks",
                layout.chunks(),
                self.limits.max_chunks
            )));
        }
        // Entries in use right now (locked) are not counted: the limit guards against a
        // client parking uploads, which sit idle.
        let mine = active
            .values()
            .filter(|e| e.try_lock().is_ok_and(|g| g.client == client))
            .count();
        if mine >= self.limits.max_active_per_client {
            self.evict_idle(&mut active, Some(client)).map_err(|_| {
                UploadFailure::Busy(format!(
                    "{client} has {mine} uploads in progress, the most one client (address, or \
                     IPv6 /64) may have; finish one or try again later"
                ))
            })?;
        } else if active.len() >= self.limits.max_active {
            self.evict_idle(&mut active, None)?;
        }
        let mut chunks = vec![NONE; layout.chunks()];
        let mut held = 0;
        // Held chunks count only while their part file exists.
        if let Some(stored) = read_state(&state)?.filter(|_| part.exists()) {
            for i in stored.held.iter() {
                chunks[i] = DURABLE;
                held += 1;
            }
        }
        if !part.exists() {
            // A new upload must fit whole (its part file is sparse until written).
            self.room
                .check(layout.size())
                .map_err(UploadFailure::Full)?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&part)
            .map_err(io(&part))?;
        if held == 0 {
            file.set_len(layout.size()).map_err(io(&part))?;
        }
        let e = Arc::new(Mutex::new(Entry {
            info: *info,
            file,
            chunks,
            held,
            unsynced: 0,
            complete: false,
            used: Instant::now(),
            client,
        }));
        if held == 0 {
            // The state file exists from the start, so a restart knows the part file's owner.
            self.sync(name, &mut e.lock().expect("upload lock"))?;
        }
        active.insert(name.to_string(), e.clone());
        Ok(Some(e))
    }

    /// Flush and drop the least recently used upload idle for [`UploadLimits::idle`], or
    /// refuse.
    fn evict_idle(
        &self,
        active: &mut HashMap<String, Arc<Mutex<Entry>>>,
        of: Option<IpAddr>,
    ) -> Result<(), UploadFailure> {
        let now = Instant::now();
        let victim = active
            .iter()
            .filter_map(|(n, e)| e.try_lock().ok().map(|g| (n.clone(), g.used, g.client)))
            .filter(|(_, used, c)| {
                now.duration_since(*used) >= self.limits.idle && of.is_none_or(|of| *c == of)
            })
            .map(|(n, used, _)| (n, used))
            .min_by_key(|(_, used)| *used);
        let Some((name, _)) = victim else {
            return Err(UploadFailure::Busy(format!(
                "{} uploads are in progress; try again later",
                active.len()
            )));
        };
        let e = active.remove(&name).expect("listed");
        let mut g = e.lock().expect("upload lock");
        self.sync(&name, &mut g)
    }

    /// fsync the part file and record every chunk written so far as durable.
    fn sync(&self, name: &str, e: &mut Entry) -> Result<(), UploadFailure> {
        let (_, part, state) = self.paths(name);
        e.file.sync_data().map_err(io(&part))?;
        e.unsynced = 0;
        for c in &mut e.chunks {
            if *c == WRITTEN {
                *c = DURABLE;
            }
        }
        let held = Held::from_fn(e.chunks.len(), |i| e.chunks[i] == DURABLE);
        write_state(&self.root, &state, &e.info, &held, false)
    }

    /// Verify the whole file against its checksum, make it durable and move it into place.
    fn finish(&self, name: &str, e: &mut Entry) -> Result<(), UploadFailure> {
        let (done, part, state) = self.paths(name);
        e.file.sync_all().map_err(io(&part))?;
        let got = sha256_of(&part)?;
        if got != e.info.sha256 {
            let _ = std::fs::remove_file(&part);
            let _ = std::fs::remove_file(&state);
            return Err(UploadFailure::Checksum(format!(
                "the received file's SHA-256 is {}, but the upload announced {}; it was discarded: upload it again",
                hex(&got),
                hex(&e.info.sha256)
            )));
        }
        std::fs::rename(&part, &done).map_err(io(&done))?;
        write_state(&self.root, &state, &e.info, &Held::default(), true)?;
        sync_dir(&self.root)?;
        e.complete = true;
        Ok(())
    }
}

/// A refusal of `announced` where `stored` (complete or not) holds the name: what differs,
/// and how to get past it.
fn different(name: &str, stored: &FileInfo, announced: &FileInfo, complete: bool) -> UploadFailure {
    if !complete
        && stored.sha256 == announced.sha256
        && stored.layout.size() == announced.layout.size()
    {
        return UploadFailure::Conflict(format!(
            "upload '{name}' of this file is in progress in chunks of {} bytes: resume it with that chunk size",
            stored.layout.chunk_size()
        ));
    }
    let how = if stored.layout.size() == announced.layout.size() {
        format!(
            "the same size, SHA-256 {} there, {} here",
            &hex(&stored.sha256)[..16],
            &hex(&announced.sha256)[..16]
        )
    } else {
        format!(
            "{} bytes there, {} here",
            stored.layout.size(),
            announced.layout.size()
        )
    };
    let (what, files) = if complete {
        (
            "is stored complete with other content",
            format!("{name} and .{name}.state"),
        )
    } else {
        (
            "is in progress for a different file",
            format!(".{name}.state and .{name}.part"),
        )
    };
    UploadFailure::Conflict(format!(
        "upload '{name}' {what} ({how}): upload under another name, or have the server's \
         operator remove {files} from its upload directory"
    ))
}

/// SHA-256 of a file, read in 64 KiB blocks: what the receiver holds is measured (decision U14),
/// and larger reads would not hash faster.
pub fn sha256_of(path: &Path) -> Result<[u8; 32], UploadFailure> {
    let mut f = File::open(path).map_err(io(path))?;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = f.read(&mut buf).map_err(io(path))?;
        if n == 0 {
            break;
        }
        ctx.update(&buf[..n]);
    }
    Ok(ctx.finish().as_ref().try_into().expect("32 bytes"))
}

struct StateFile {
    info: FileInfo,
    held: Held,
    complete: bool,
}

/// The state file: `key=value` lines (size, chunk, sha256, held, complete).
fn read_state(path: &Path) -> Result<Option<StateFile>, UploadFailure> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(path)(e)),
    };
    let bad = || UploadFailure::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, "unreadable upload state"),
    };
    let get = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix('='))
            .map(str::as_bytes)
    };
    let info =
        FileInfo::parse(|h| get(h.trim_start_matches("qgate-upload-"))).map_err(|_| bad())?;
    let held =
        Held::parse(get("held").ok_or_else(bad)?, info.layout.chunks()).map_err(|_| bad())?;
    Ok(Some(StateFile {
        info,
        held,
        complete: get("complete") == Some(b"1"),
    }))
}

fn write_state(
    root: &Path,
    path: &Path,
    info: &FileInfo,
    held: &Held,
    complete: bool,
) -> Result<(), UploadFailure> {
    let mut text = String::new();
    for (k, v) in info.headers() {
        text.push_str(&format!("{}={v}\n", k.trim_start_matches("qgate-upload-")));
    }
    text.push_str(&format!("held={held}\ncomplete={}\n", u8::from(complete)));
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(text.as_bytes()).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))?;
    sync_dir(root)
}

fn sync_dir(dir: &Path) -> Result<(), UploadFailure> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The client address of the tests' requests.
    const ME: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    use qgate_chunks::Layout;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("qgate-upload-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn file(size: usize, seed: u8) -> Vec<u8> {
        (0..size)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    fn info(data: &[u8], chunk: u64) -> FileInfo {
        let sha = ring::digest::digest(&ring::digest::SHA256, data);
        FileInfo {
            layout: Layout::new(data.len() as u64, chunk).unwrap(),
            sha256: sha.as_ref().try_into().unwrap(),
        }
    }

    fn chunk(data: &[u8], info: &FileInfo, i: usize) -> Vec<u8> {
        let (off, len) = info.layout.range(i).unwrap();
        data[off as usize..off as usize + len].to_vec()
    }

    #[test]
    fn the_written_callback_counts_each_new_chunk_once_before_the_file_completes() {
        let root = dir("counting");
        let up = Uploads::new(&root, UploadLimits::default()).unwrap();
        let data = file(3000, 3);
        let inf = info(&data, 1024);
        let mut counted = Vec::new();
        let mut put = |i: usize| {
            up.put_counting(ME, "c", &inf, i, &chunk(&data, &inf, i), |n| {
                counted.push(n)
            })
            .unwrap()
        };
        assert_eq!(put(0), Stored::Written);
        assert_eq!(put(0), Stored::Duplicate);
        assert_eq!(put(2), Stored::Written);
        // The completing chunk is counted too, and a copy after it is not.
        assert_eq!(put(1), Stored::Complete);
        assert_eq!(put(1), Stored::AlreadyComplete);
        assert_eq!(counted, vec![1024, 952, 1024]);
    }

    #[tokio::test]
    async fn chunks_from_both_ends_make_the_file_and_duplicates_are_checked() {
        let root = dir("ends");
        let up = Uploads::new(&root, UploadLimits::default()).unwrap();
        let data = file(10_000, 7);
        let inf = info(&data, 1024);
        assert_eq!(
            up.announce(ME, "f.bin", &inf).unwrap(),
            Announced::InProgress(Held::default())
        );
        let n = inf.layout.chunks();
        let (mut lo, mut hi) = (0, n - 1);
        let mut last = None;
        while lo <= hi {
            last = Some(
                up.put(ME, "f.bin", &inf, lo, &chunk(&data, &inf, lo))
                    .unwrap(),
            );
            lo += 1;
            if lo <= hi {
                last = Some(
                    up.put(ME, "f.bin", &inf, hi, &chunk(&data, &inf, hi))
                        .unwrap(),
                );
                hi -= 1;
            }
            if lo == 3 {
                // A resend of the same bytes is fine; different bytes are refused and change
                // nothing.
                assert_eq!(
                    up.put(ME, "f.bin", &inf, 0, &chunk(&data, &inf, 0))
                        .unwrap(),
                    Stored::Duplicate
                );
                let mut other = chunk(&data, &inf, 1);
                other[0] ^= 1;
                let e = up.put(ME, "f.bin", &inf, 1, &other).unwrap_err();
                assert_eq!(e.status(), http::StatusCode::CONFLICT, "{e}");
                // What is written is reported as held, durably.
                let Announced::InProgress(h) = up.announce(ME, "f.bin", &inf).unwrap() else {
                    panic!("complete too early")
                };
                assert_eq!(
                    h.iter().collect::<Vec<_>>(),
                    vec![0, 1, 2, n - 3, n - 2, n - 1]
                );
            }
        }
        assert_eq!(last, Some(Stored::Complete));
        assert_eq!(std::fs::read(root.join("f.bin")).unwrap(), data);
        assert!(!root.join(".f.bin.part").exists());
        // A copy of a chunk arriving after the file completed is told so (U12).
        assert_eq!(
            up.put(ME, "f.bin", &inf, 0, &chunk(&data, &inf, 0))
                .unwrap(),
            Stored::AlreadyComplete
        );
        assert_eq!(up.announce(ME, "f.bin", &inf).unwrap(), Announced::Complete);
        // The same name for different bytes is refused.
        let other = file(10_000, 8);
        let e = up.announce(ME, "f.bin", &info(&other, 1024)).unwrap_err();
        assert_eq!(e.status(), http::StatusCode::CONFLICT);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[tokio::test]
    async fn bad_chunks_and_limits_are_refused_without_losing_what_was_accepted() {
        let root = dir("bad");
        let limits = UploadLimits {
            max_file_bytes: 1 << 20,
            max_chunks: 100,
            max_active: 2,
            idle: Duration::from_secs(3600),
            ..Default::default()
        };
        let up = Uploads::new(&root, limits).unwrap();
        let data = file(5000, 1);
        let inf = info(&data, 1024);
        up.put(ME, "a", &inf, 0, &chunk(&data, &inf, 0)).unwrap();
        for (i, body, want) in [
            (5, vec![0u8; 10], http::StatusCode::BAD_REQUEST), // outside the file
            (1, vec![0u8; 10], http::StatusCode::BAD_REQUEST), // wrong length
            (4, vec![0u8; 1024], http::StatusCode::BAD_REQUEST), // the last one is short
        ] {
            let e = up.put(ME, "a", &inf, i, &body).unwrap_err();
            assert_eq!(e.status(), want, "{e}");
        }
        // Another file under the same name.
        let e = up
            .announce(ME, "a", &info(&file(6000, 2), 1024))
            .unwrap_err();
        assert_eq!(e.status(), http::StatusCode::CONFLICT);
        let why = e.to_string();
        assert!(
            why.contains("in progress for a different file")
                && why.contains("5000 bytes there, 6000 here")
                && why.contains(".a.state and .a.part"),
            "{why}"
        );
        let e = up.announce(ME, "a", &info(&data, 2048)).unwrap_err();
        assert_eq!(e.status(), http::StatusCode::CONFLICT);
        // Too big, too many chunks, too many at once.
        let big = FileInfo {
            layout: Layout::new(2 << 20, 1 << 16).unwrap(),
            sha256: [0; 32],
        };
        assert_eq!(
            up.announce(ME, "big", &big).unwrap_err().status(),
            http::StatusCode::PAYLOAD_TOO_LARGE
        );
        let many = FileInfo {
            layout: Layout::new(200 * 1024, 1024).unwrap(),
            sha256: [0; 32],
        };
        assert_eq!(
            up.announce(ME, "many", &many).unwrap_err().status(),
            http::StatusCode::PAYLOAD_TOO_LARGE
        );
        up.announce(ME, "b", &inf).unwrap();
        assert_eq!(
            up.announce(ME, "c", &inf).unwrap_err().status(),
            http::StatusCode::SERVICE_UNAVAILABLE
        );
        for bad in ["", ".hidden", "a/b", "../x", &"x".repeat(129)] {
            assert_eq!(
                up.announce(ME, bad, &inf).unwrap_err().status(),
                http::StatusCode::BAD_REQUEST
            );
        }
        // Chunk 0 of "a" is still there.
        let Announced::InProgress(h) = up.announce(ME, "a", &inf).unwrap() else {
            panic!()
        };
        assert_eq!(h.iter().collect::<Vec<_>>(), vec![0]);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[tokio::test]
    async fn a_restart_resumes_from_what_was_announced_held() {
        let root = dir("restart");
        let data = file(8192, 3);
        let inf = info(&data, 1024);
        {
            let up = Uploads::new(&root, UploadLimits::default()).unwrap();
            for i in [0, 1, 7] {
                up.put(ME, "r", &inf, i, &chunk(&data, &inf, i)).unwrap();
            }
            up.announce(ME, "r", &inf).unwrap();
        }
        let up = Uploads::new(&root, UploadLimits::default()).unwrap();
        let Announced::InProgress(h) = up.announce(ME, "r", &inf).unwrap() else {
            panic!()
        };
        assert_eq!(h.to_string(), "0-1,7");
        // A chunk that differs from one held before the restart is refused.
        let e = up.put(ME, "r", &inf, 7, &[0u8; 1024]).unwrap_err();
        assert_eq!(e.status(), http::StatusCode::CONFLICT);
        let mut last = Stored::Written;
        for i in 2..7 {
            last = up.put(ME, "r", &inf, i, &chunk(&data, &inf, i)).unwrap();
        }
        assert_eq!(last, Stored::Complete);
        assert_eq!(std::fs::read(root.join("r")).unwrap(), data);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[tokio::test]
    async fn chunks_larger_than_a_request_are_refused_and_a_new_size_can_start_over() {
        let root = dir("chunksize");
        let mut up = Uploads::new(&root, UploadLimits::default()).unwrap();
        up.cap_chunk(2048);
        let data = file(10_000, 3);
        let big = info(&data, 4096);
        let e = up.announce(ME, "f", &big).unwrap_err();
        assert_eq!(e.status(), http::StatusCode::PAYLOAD_TOO_LARGE);
        assert!(e.to_string().contains("--chunk 2048 or less"), "{e}");
        assert!(!root.join(".f.part").exists() && !root.join(".f.state").exists());
        // Announced in one size with nothing written (in memory, then after a restart): the
        // same file in another size starts over instead of being refused.
        let up = Uploads::new(&root, UploadLimits::default()).unwrap();
        up.announce(ME, "f", &big).unwrap();
        let small = info(&data, 1024);
        up.announce(ME, "f", &small).unwrap();
        drop(up);
        let up = Uploads::new(&root, UploadLimits::default()).unwrap();
        let Announced::InProgress(h) = up.announce(ME, "f", &big).unwrap() else {
            panic!()
        };
        assert_eq!(h.count(), 0);
        // Once a chunk is held, the size is fixed.
        up.put(ME, "f", &big, 0, &chunk(&data, &big, 0)).unwrap();
        up.announce(ME, "f", &big).unwrap();
        let e = up.announce(ME, "f", &small).unwrap_err();
        assert_eq!(e.status(), http::StatusCode::CONFLICT);
        drop(up);
        let up = Uploads::new(&root, UploadLimits::default()).unwrap();
        let e = up.announce(ME, "f", &small).unwrap_err();
        assert_eq!(e.status(), http::StatusCode::CONFLICT);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn uploads_that_would_leave_too_little_disk_are_refused_and_keep_what_they_hold() {
        let root = dir("full");
        let data = file(4096, 3);
        let inf = info(&data, 1024);
        let up = Uploads::new(&root, UploadLimits::default()).unwrap();
        up.put(ME, "held", &inf, 0, &chunk(&data, &inf, 0)).unwrap();
        up.flush().unwrap();
        drop(up);
        // The disk fills (as far as the server is told): a new upload makes no file, a chunk
        // of one in progress is not written, and what it held stays held.
        let full = UploadLimits {
            keep_free: 1 << 60,
            ..Default::default()
        };
        let up = Uploads::new(&root, full).unwrap();
        let e = up.announce(ME, "new", &inf).unwrap_err();
        assert_eq!(e.status(), http::StatusCode::INSUFFICIENT_STORAGE, "{e}");
        assert!(!root.join(".new.part").exists() && !root.join(".new.state").exists());
        let e = up
            .put(ME, "held", &inf, 1, &chunk(&data, &inf, 1))
            .unwrap_err();
        assert_eq!(e.status(), http::StatusCode::INSUFFICIENT_STORAGE, "{e}");
        drop(up);
        let up = Uploads::new(&root, UploadLimits::default()).unwrap();
        let Announced::InProgress(h) = up.announce(ME, "held", &inf).unwrap() else {
            panic!()
        };
        assert_eq!(h.to_string(), "0");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[tokio::test(start_paused = true)]
    async fn one_client_cannot_take_every_slot() {
        let root = dir("perclient");
        let limits = UploadLimits {
            max_active_per_client: 2,
            idle: Duration::from_secs(10),
            ..Default::default()
        };
        let up = Uploads::new(&root, limits).unwrap();
        let data = file(4096, 8);
        let inf = info(&data, 1024);
        let other = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 9));
        up.announce(ME, "a", &inf).unwrap();
        up.put(ME, "b", &inf, 0, &chunk(&data, &inf, 0)).unwrap();
        // A third from the same address: busy, and it names the limit.
        let e = up.announce(ME, "c", &inf).unwrap_err();
        assert_eq!(e.status(), http::StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            e.to_string()
                .contains("the most one client (address, or IPv6 /64) may have"),
            "{e}"
        );
        // The addresses of one IPv6 /64 are one client (S10): a host holds them all.
        let v6 = |a: &str| a.parse::<IpAddr>().unwrap();
        up.announce(v6("2001:db8::1"), "e", &inf).unwrap();
        up.announce(v6("2001:db8::ffff:2"), "f", &inf).unwrap();
        let e = up.announce(v6("2001:db8::3"), "g", &inf).unwrap_err();
        assert_eq!(e.status(), http::StatusCode::SERVICE_UNAVAILABLE, "{e}");
        // Another address is not held back, and the first keeps its two.
        up.announce(other, "d", &inf).unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        up.put(ME, "a", &inf, 1, &chunk(&data, &inf, 1)).unwrap();
        // Once one of its own is idle, it makes room for the next: the least recently used
        // ("b"), flushed, so it resumes with what it held.
        tokio::time::advance(Duration::from_secs(11)).await;
        up.announce(ME, "c", &inf).unwrap();
        let Announced::InProgress(h) = up.announce(other, "b", &inf).unwrap() else {
            panic!()
        };
        assert_eq!(h.to_string(), "0");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[tokio::test]
    async fn unfinished_uploads_untouched_past_the_limit_expire_and_others_stay() {
        let root = dir("expire");
        let data = file(5000, 6);
        let inf = info(&data, 1024);
        let up = Uploads::new(&root, UploadLimits::default()).unwrap();
        for name in ["old", "busy"] {
            up.announce(ME, name, &inf).unwrap();
            up.put(ME, name, &inf, 0, &chunk(&data, &inf, 0)).unwrap();
        }
        // A finished upload is not touched.
        let small = file(100, 7);
        let si = info(&small, 1024);
        up.put(ME, "done", &si, 0, &small).unwrap();
        let now = std::time::SystemTime::now();
        let day = Duration::from_secs(86_400);
        // In memory (a device is sending it): kept however old.
        let g = up.expire(now + 30 * day).unwrap();
        assert!(g.is_empty(), "{g:?}");
        // After a restart nothing is in memory: within the week both stay, past it they go.
        drop(up);
        let up = Uploads::new(&root, UploadLimits::default()).unwrap();
        assert!(up.expire(now + 6 * day).unwrap().is_empty());
        up.announce(ME, "busy", &inf).unwrap();
        let mut gone = up.expire(now + 8 * day).unwrap();
        gone.sort();
        assert_eq!(gone, ["old"]);
        assert!(!root.join(".old.part").exists() && !root.join(".old.state").exists());
        assert!(root.join(".busy.part").exists() && root.join("done").exists());
        assert!(root.join(".done.state").exists());
        // The device that comes back starts afresh.
        assert_eq!(
            up.announce(ME, "old", &inf).unwrap(),
            Announced::InProgress(Held::default())
        );
        // Off: nothing expires.
        let keep = Uploads::new(
            &root,
            UploadLimits {
                expire_after: None,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(keep.expire(now + 300 * day).unwrap().is_empty());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[tokio::test]
    async fn a_file_that_does_not_match_its_checksum_is_discarded() {
        let root = dir("sum");
        let up = Uploads::new(&root, UploadLimits::default()).unwrap();
        let data = file(3000, 4);
        let mut inf = info(&data, 1024);
        inf.sha256[0] ^= 1;
        up.put(ME, "s", &inf, 0, &chunk(&data, &inf, 0)).unwrap();
        up.put(ME, "s", &inf, 1, &chunk(&data, &inf, 1)).unwrap();
        let e = up
            .put(ME, "s", &inf, 2, &chunk(&data, &inf, 2))
            .unwrap_err();
        assert_eq!(e.status(), http::StatusCode::UNPROCESSABLE_ENTITY, "{e}");
        assert!(!root.join("s").exists() && !root.join(".s.part").exists());
        // It can be sent again.
        assert_eq!(
            up.announce(ME, "s", &inf).unwrap(),
            Announced::InProgress(Held::default())
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[tokio::test]
    async fn an_empty_file_completes_when_announced_and_progress_is_synced_as_it_grows() {
        let root = dir("empty");
        let up = Uploads::new(&root, UploadLimits::default()).unwrap();
        assert_eq!(
            up.announce(ME, "e", &info(&[], 1024)).unwrap(),
            Announced::Complete
        );
        assert_eq!(std::fs::read(root.join("e")).unwrap(), b"");
        assert_eq!(
            up.announce(ME, "e", &info(&[], 1024)).unwrap(),
            Announced::Complete
        );
        // Chunks written past SYNC_EVERY are durable without an announcement: a restart
        // (a new Uploads on the same directory) reports them held.
        let data = file(12 << 20, 9);
        let inf = info(&data, 1 << 20);
        for i in 0..10 {
            up.put(ME, "big", &inf, i, &chunk(&data, &inf, i)).unwrap();
        }
        drop(up);
        let up = Uploads::new(&root, UploadLimits::default()).unwrap();
        let Announced::InProgress(h) = up.announce(ME, "big", &inf).unwrap() else {
            panic!()
        };
        assert_eq!(h.to_string(), "0-7", "synced after 8 MiB");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_uploads_make_room_and_resume_from_disk() {
        let root = dir("idle");
        let limits = UploadLimits {
            max_active: 1,
            idle: Duration::from_secs(10),
            ..Default::default()
        };
        let up = Uploads::new(&root, limits).unwrap();
        let data = file(4096, 5);
        let inf = info(&data, 1024);
        up.put(ME, "x", &inf, 3, &chunk(&data, &inf, 3)).unwrap();
        assert_eq!(
            up.announce(ME, "y", &inf).unwrap_err().status(),
            http::StatusCode::SERVICE_UNAVAILABLE
        );
        tokio::time::advance(Duration::from_secs(11)).await;
        up.announce(ME, "y", &inf).unwrap();
        tokio::time::advance(Duration::from_secs(11)).await;
        let Announced::InProgress(h) = up.announce(ME, "x", &inf).unwrap() else {
            panic!()
        };
        assert_eq!(h.to_string(), "3", "x was flushed when y took its place");
        let _ = std::fs::remove_dir_all(&root);
    }
}
