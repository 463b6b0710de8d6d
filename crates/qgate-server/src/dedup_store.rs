//! De-duplication that survives a restart: every request id stored is committed to redb before
//! its request is acknowledged, so a copy the gateway retries after the server restarted gets
//! the first one's answer instead of a second message (decision S6). Commits are grouped: one
//! writer task commits whatever has piled up in one transaction, and every request in it waits
//! one shared fsync. Bounded: past `cap` ids the oldest are forgotten, in the same transaction.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::{mpsc, oneshot};

/// Request id → (response id, bytes, order).
const SEEN: TableDefinition<&str, (u64, u64, u64)> = TableDefinition::new("seen");
/// Order → request id: the oldest is forgotten first.
const ORDER: TableDefinition<u64, &str> = TableDefinition::new("order");
/// `next_order`, `count`, `max_id`.
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// Most records one transaction commits.
const BATCH: usize = 4096;

/// The store failed; the message names the file.
#[derive(Debug, thiserror::Error)]
#[error("de-duplication store {path}: {msg}")]
pub struct DedupStoreError {
    /// The database file.
    pub path: PathBuf,
    /// What went wrong.
    pub msg: String,
}

struct Op {
    rid: String,
    id: u64,
    bytes: u64,
    done: oneshot::Sender<Result<(), String>>,
}

/// A handle to the durable de-duplication table.
pub struct DedupStore {
    db: Arc<Database>,
    tx: mpsc::Sender<Op>,
    path: PathBuf,
}

impl std::fmt::Debug for DedupStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DedupStore({})", self.path.display())
    }
}

impl DedupStore {
    /// Open (or create) the table at `path`, remembering at most `cap` ids, and start its writer
    /// on the current tokio runtime. Also returns the largest response id recorded (0 if none),
    /// so a sink's ids can continue after it.
    pub fn open(path: &Path, cap: u64) -> Result<(DedupStore, u64), DedupStoreError> {
        let fail = |msg: String| DedupStoreError {
            path: path.to_path_buf(),
            msg,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| fail(e.to_string()))?;
        }
        let db = Database::create(path).map_err(|e| fail(e.to_string()))?;
        let max_id = {
            let rtx = db.begin_read().map_err(|e| fail(e.to_string()))?;
            match rtx.open_table(META) {
                Ok(t) => t
                    .get("max_id")
                    .map_err(|e| fail(e.to_string()))?
                    .map_or(0, |v| v.value()),
                Err(redb::TableError::TableDoesNotExist(_)) => 0,
                Err(e) => return Err(fail(e.to_string())),
            }
        };
        let rt = tokio::runtime::Handle::try_current()
            .map_err(|_| fail("the store needs a tokio runtime".into()))?;
        let db = Arc::new(db);
        let (tx, rx) = mpsc::channel(BATCH);
        rt.spawn(writer(db.clone(), rx, cap.max(1)));
        Ok((
            DedupStore {
                db,
                tx,
                path: path.to_path_buf(),
            },
            max_id,
        ))
    }

    /// The answer recorded for `rid`: (response id, bytes).
    pub fn lookup(&self, rid: &str) -> Result<Option<(u64, usize)>, DedupStoreError> {
        let fail = |e: &dyn std::fmt::Display| DedupStoreError {
            path: self.path.clone(),
            msg: e.to_string(),
        };
        let rtx = self.db.begin_read().map_err(|e| fail(&e))?;
        let t = match rtx.open_table(SEEN) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(fail(&e)),
        };
        Ok(t.get(rid).map_err(|e| fail(&e))?.map(|v| {
            let (id, bytes, _) = v.value();
            (id, bytes as usize)
        }))
    }

    /// Make `rid` → (`id`, `bytes`) durable; returns once committed.
    pub async fn record(&self, rid: &str, id: u64, bytes: usize) -> Result<(), DedupStoreError> {
        let fail = |msg: String| DedupStoreError {
            path: self.path.clone(),
            msg,
        };
        let (done, wait) = oneshot::channel();
        self.tx
            .send(Op {
                rid: rid.to_string(),
                id,
                bytes: bytes as u64,
                done,
            })
            .await
            .map_err(|_| fail("closed".into()))?;
        wait.await.map_err(|_| fail("closed".into()))?.map_err(fail)
    }
}

/// Wait for one record, take whatever else is waiting, commit them in one transaction on a
/// blocking thread, answer everyone in the batch.
async fn writer(db: Arc<Database>, mut rx: mpsc::Receiver<Op>, cap: u64) {
    let mut batch = Vec::with_capacity(BATCH);
    while let Some(first) = rx.recv().await {
        batch.push(first);
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        let d = db.clone();
        let ops = std::mem::take(&mut batch);
        let (ops, result) = match tokio::task::spawn_blocking(move || {
            let r = commit(&d, &ops, cap);
            (ops, r)
        })
        .await
        {
            Ok(done) => done,
            Err(e) => {
                // The commit panicked: its requests see the store as closed.
                tracing::error!(error = %e, "de-duplication commit failed");
                continue;
            }
        };
        if let Err(e) = &result {
            tracing::error!(error = %e, "de-duplication commit failed");
        }
        for op in ops {
            let _ = op.done.send(result.clone());
        }
    }
}

fn commit(db: &Database, batch: &[Op], cap: u64) -> Result<(), String> {
    let s = |e: &dyn std::fmt::Display| e.to_string();
    let wtx = db.begin_write().map_err(|e| s(&e))?;
    {
        let mut seen = wtx.open_table(SEEN).map_err(|e| s(&e))?;
        let mut order = wtx.open_table(ORDER).map_err(|e| s(&e))?;
        let mut meta = wtx.open_table(META).map_err(|e| s(&e))?;
        let get = |m: &redb::Table<&str, u64>, k: &str| -> Result<u64, String> {
            Ok(m.get(k).map_err(|e| s(&e))?.map_or(0, |v| v.value()))
        };
        let mut next = get(&meta, "next_order")?;
        let mut count = get(&meta, "count")?;
        let mut max_id = get(&meta, "max_id")?;
        for op in batch {
            if seen.get(op.rid.as_str()).map_err(|e| s(&e))?.is_some() {
                continue;
            }
            seen.insert(op.rid.as_str(), (op.id, op.bytes, next))
                .map_err(|e| s(&e))?;
            order.insert(next, op.rid.as_str()).map_err(|e| s(&e))?;
            next += 1;
            count += 1;
            max_id = max_id.max(op.id);
        }
        while count > cap {
            let Some((_, rid)) = order.pop_first().map_err(|e| s(&e))? else {
                break;
            };
            seen.remove(rid.value()).map_err(|e| s(&e))?;
            count -= 1;
        }
        meta.insert("next_order", next).map_err(|e| s(&e))?;
        meta.insert("count", count).map_err(|e| s(&e))?;
        meta.insert("max_id", max_id).map_err(|e| s(&e))?;
    }
    wtx.commit().map_err(|e| s(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(name: &str) -> PathBuf {
        let p =
            std::env::temp_dir().join(format!("qgate-dedup-{name}-{}.redb", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    #[tokio::test]
    async fn survives_reopening_and_forgets_the_oldest_past_the_cap() {
        let p = path("cap");
        {
            let (s, max) = DedupStore::open(&p, 3).unwrap();
            assert_eq!(max, 0);
            for (i, rid) in ["a", "b", "c", "d"].iter().enumerate() {
                s.record(rid, 10 + i as u64, i).await.unwrap();
            }
            // A second record of the same id keeps the first answer.
            s.record("d", 99, 99).await.unwrap();
            assert_eq!(s.lookup("d").unwrap(), Some((13, 3)));
        }
        // The writer lets go of the file once its handle is gone.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let (s, max) = DedupStore::open(&p, 3).unwrap();
        assert_eq!(max, 13);
        assert_eq!(s.lookup("a").unwrap(), None, "the oldest past the cap");
        assert_eq!(s.lookup("b").unwrap(), Some((11, 1)));
        assert_eq!(s.lookup("d").unwrap(), Some((13, 3)));
        assert_eq!(s.lookup("zz").unwrap(), None);
        drop(s);
        let _ = std::fs::remove_file(&p);
    }

    #[tokio::test]
    async fn concurrent_records_share_commits_and_all_land() {
        let p = path("many");
        let (s, _) = DedupStore::open(&p, 1 << 20).unwrap();
        let s = Arc::new(s);
        let mut tasks = Vec::new();
        for i in 0..500u64 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                s.record(&format!("r{i}"), i + 1, 1).await.unwrap()
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        for i in 0..500u64 {
            assert_eq!(s.lookup(&format!("r{i}")).unwrap(), Some((i + 1, 1)));
        }
        let _ = std::fs::remove_file(&p);
    }
}
