//! Durable queues: every message a durable queue accepts is committed to redb before the broker
//! settles it with the producer, so it survives `kill -9`. Writes go through one writer task that
//! commits whatever has piled up in one transaction (group commit): a producer waits one fsync,
//! shared with everyone who wrote meanwhile.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::{mpsc, oneshot};

/// (queue name, sequence number) → encoded message (AMQP 1.0 message sections).
const MESSAGES: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("messages");

/// Most operations one transaction commits.
const BATCH: usize = 4096;

/// Longest time a deletion committed without a sync waits for a durable commit (decision M30).
const DURABLE_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// The store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Opening the database file.
    #[error("message store {path}: {msg}")]
    Open {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        msg: String,
    },
    /// A read or a commit.
    #[error("message store: {0}")]
    Io(String),
    /// The writer task is gone (the broker is shutting down).
    #[error("message store is closed")]
    Closed,
}

fn io(e: impl std::fmt::Display) -> StoreError {
    StoreError::Io(e.to_string())
}

enum Op {
    Put {
        queue: String,
        seq: u64,
        bytes: Vec<u8>,
        done: oneshot::Sender<Result<(), StoreError>>,
    },
    Delete {
        queue: String,
        seq: u64,
    },
    /// Answered once everything sent before it is committed.
    Sync {
        done: oneshot::Sender<Result<(), StoreError>>,
    },
}

/// A handle to the store; clone freely.
#[derive(Clone, Debug)]
pub struct Store {
    tx: mpsc::Sender<Op>,
}

/// A message read back at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovered {
    /// Its queue.
    pub queue: String,
    /// Its sequence number there.
    pub seq: u64,
    /// The encoded message.
    pub bytes: Vec<u8>,
}

impl Store {
    /// Open (or create) the store at `path`, return every message it holds (in queue and
    /// sequence order) and start the writer task on the current tokio runtime (an error outside
    /// one).
    pub fn open(path: &Path) -> Result<(Store, Vec<Recovered>), StoreError> {
        let open_err = |msg: String| StoreError::Open {
            path: path.to_path_buf(),
            msg,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| open_err(e.to_string()))?;
        }
        let db = Database::create(path).map_err(|e| open_err(e.to_string()))?;
        let mut recovered = Vec::new();
        {
            let rtx = db.begin_read().map_err(io)?;
            match rtx.open_table(MESSAGES) {
                Ok(t) => {
                    for row in t.iter().map_err(io)? {
                        let (k, v) = row.map_err(io)?;
                        let (queue, seq) = k.value();
                        recovered.push(Recovered {
                            queue: queue.to_string(),
                            seq,
                            bytes: v.value().to_vec(),
                        });
                    }
                }
                Err(redb::TableError::TableDoesNotExist(_)) => {}
                Err(e) => return Err(io(e)),
            }
        }
        let rt = tokio::runtime::Handle::try_current()
            .map_err(|_| open_err("the store needs a tokio runtime".into()))?;
        let (tx, rx) = mpsc::channel(BATCH);
        rt.spawn(writer(Arc::new(db), rx));
        Ok((Store { tx }, recovered))
    }

    /// Make `bytes` durable as message `seq` of `queue`; returns once committed.
    pub async fn put(&self, queue: &str, seq: u64, bytes: Vec<u8>) -> Result<(), StoreError> {
        let (done, wait) = oneshot::channel();
        self.tx
            .send(Op::Put {
                queue: queue.to_string(),
                seq,
                bytes,
                done,
            })
            .await
            .map_err(|_| StoreError::Closed)?;
        wait.await.map_err(|_| StoreError::Closed)?
    }

    /// Wait until every operation sent before this call is committed (a purge returns only
    /// then, so purged messages cannot come back at a restart).
    pub async fn sync(&self) -> Result<(), StoreError> {
        let (done, wait) = oneshot::channel();
        self.tx
            .send(Op::Sync { done })
            .await
            .map_err(|_| StoreError::Closed)?;
        wait.await.map_err(|_| StoreError::Closed)?
    }

    /// Forget message `seq` of `queue` (settled or expired). Not awaited, and synced with the
    /// next put or within [`DURABLE_EVERY`]: if the broker dies before that the message is
    /// delivered again (at-least-once, decision M30).
    pub async fn delete(&self, queue: &str, seq: u64) {
        let _ = self
            .tx
            .send(Op::Delete {
                queue: queue.to_string(),
                seq,
            })
            .await;
    }
}

/// The writer: wait for one operation, take whatever else is waiting (up to [`BATCH`]), commit
/// them in one transaction, then answer every producer in the batch. The commit (and its fsync)
/// runs on a blocking thread: off the runtime's workers, and on a paused (virtual) clock time
/// stands still while it runs, as it does for any other blocking task, so a durable broker runs
/// deterministically on the simulator. A batch of deletions alone is committed without a sync,
/// made durable by the next put or sync, or by an empty durable commit within
/// [`DURABLE_EVERY`] (M30). The database closes (and its file lock goes) when the last handle
/// is dropped and the batch in hand is committed and synced; if the runtime stops first,
/// redb's own close syncs what was committed.
async fn writer(db: Arc<Database>, mut rx: mpsc::Receiver<Op>) {
    let mut batch = Vec::with_capacity(BATCH);
    // A commit failed since the last sync was answered: the next sync reports it, since the
    // operations before it are not all on disk.
    let mut failed_since_sync = false;
    // When the oldest commit of deletions only, not synced, was made (decision M30).
    let mut unsynced: Option<tokio::time::Instant> = None;
    loop {
        let first = tokio::select! {
            // The due sync before more operations: under a steady stream of them it would
            // otherwise wait for a quiet moment (and an unbiased select! draws unseeded).
            biased;
            _ = tokio::time::sleep_until(unsynced.map_or_else(tokio::time::Instant::now, |t| t + DURABLE_EVERY)), if unsynced.is_some() => {
                let d = db.clone();
                let r = tokio::task::spawn_blocking(move || commit(&d, &[], true)).await;
                if let Ok(Err(e)) | Err(e) = r.map_err(io) {
                    tracing::error!(error = %e, "message store sync failed");
                    failed_since_sync = true;
                }
                unsynced = None;
                continue;
            }
            op = rx.recv() => op,
        };
        let Some(first) = first else {
            if unsynced.is_some() {
                let _ = tokio::task::spawn_blocking(move || commit(&db, &[], true)).await;
            }
            return;
        };
        batch.push(first);
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        // Deletions alone need no sync: one lost in a crash is a redelivery. A put or a sync
        // makes them durable with it.
        let durable = batch.iter().any(|op| !matches!(op, Op::Delete { .. }));
        let d = db.clone();
        let ops = std::mem::take(&mut batch);
        let (ops, result) = match tokio::task::spawn_blocking(move || {
            let r = commit(&d, &ops, durable);
            (ops, r)
        })
        .await
        {
            Ok(done) => done,
            // The commit panicked: its producers see the store as closed.
            Err(e) => {
                tracing::error!(error = %e, "message store commit failed");
                failed_since_sync = true;
                continue;
            }
        };
        batch = ops;
        failed_since_sync |= result.is_err();
        if result.is_ok() {
            if durable {
                unsynced = None;
            } else {
                unsynced.get_or_insert_with(tokio::time::Instant::now);
            }
        }
        let mut answered_sync = false;
        for op in batch.drain(..) {
            match op {
                Op::Put { done, .. } => {
                    let _ = done.send(result.as_ref().map(|_| ()).map_err(io));
                }
                Op::Sync { done } => {
                    let r = match &result {
                        Err(e) => Err(io(e)),
                        Ok(()) if failed_since_sync => Err(StoreError::Io(
                            "an earlier commit failed: not everything before this sync is stored"
                                .into(),
                        )),
                        Ok(()) => Ok(()),
                    };
                    let _ = done.send(r);
                    answered_sync = true;
                }
                Op::Delete { .. } => {}
            }
        }
        if answered_sync {
            failed_since_sync = false;
        }
        if let Err(e) = result {
            tracing::error!(error = %e, "message store commit failed");
        }
    }
}

/// Apply `batch` in one transaction, synced when `durable` (which also makes every earlier
/// unsynced commit durable).
fn commit(db: &Database, batch: &[Op], durable: bool) -> Result<(), StoreError> {
    let mut wtx = db.begin_write().map_err(io)?;
    if !durable {
        wtx.set_durability(redb::Durability::None).map_err(io)?;
    }
    {
        let mut t = wtx.open_table(MESSAGES).map_err(io)?;
        for op in batch {
            match op {
                Op::Put {
                    queue, seq, bytes, ..
                } => {
                    t.insert((queue.as_str(), *seq), bytes.as_slice())
                        .map_err(io)?;
                }
                Op::Delete { queue, seq } => {
                    t.remove((queue.as_str(), *seq)).map_err(io)?;
                }
                Op::Sync { .. } => {}
            }
        }
    }
    wtx.commit().map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deletions committed without a sync (M30) are on disk after the store closes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn deletions_alone_are_synced_by_the_close() {
        let dir = std::env::temp_dir().join(format!("qgate-store-del-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("broker.redb");
        {
            let (s, _) = Store::open(&path).unwrap();
            for i in 0..3u64 {
                s.put("q", i, b"m".to_vec()).await.unwrap();
            }
            for i in 0..2u64 {
                s.delete("q", i).await;
            }
        }
        let rec = loop {
            match Store::open(&path) {
                Ok((_, rec)) => break rec,
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
            }
        };
        assert_eq!(rec.iter().map(|r| r.seq).collect::<Vec<_>>(), [2]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn puts_survive_reopen_and_deletes_are_applied() {
        let dir = std::env::temp_dir().join(format!("qgate-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("broker.redb");
        {
            let (s, rec) = Store::open(&path).unwrap();
            assert!(rec.is_empty());
            let mut waits = Vec::new();
            for i in 0..100u64 {
                let s = s.clone();
                waits.push(tokio::spawn(async move {
                    s.put("q", i, vec![i as u8; 10]).await
                }));
            }
            for w in waits {
                w.await.unwrap().unwrap();
            }
            s.put("other", 5, b"x".to_vec()).await.unwrap();
            for i in 0..50u64 {
                s.delete("q", i).await;
            }
            // A put after the deletes is committed after them (one writer, in order).
            s.put("q", 100, b"last".to_vec()).await.unwrap();
        }
        // The writer thread ends when its channel closes; wait for the file lock to go.
        let rec = loop {
            match Store::open(&path) {
                Ok((_, rec)) => break rec,
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
            }
        };
        let q: Vec<_> = rec
            .iter()
            .filter(|r| r.queue == "q")
            .map(|r| r.seq)
            .collect();
        assert_eq!(q, (50..=100).collect::<Vec<_>>());
        assert_eq!(rec.iter().filter(|r| r.queue == "other").count(), 1);
        assert_eq!(rec.last().unwrap().bytes.len(), 4);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
