//! De-duplication that survives a restart: every request id stored is committed to redb before
//! its request is acknowledged, so a copy the gateway retries after the server restarted gets
//! the first one's answer instead of a second message (decision S6). Commits are grouped: one
//! writer task commits whatever has piled up in one transaction. They are not synced one by one:
//! a durable commit follows within [`DURABLE_EVERY`] of any change, and when the last handle
//! goes, so a crash (not a restart) forgets at most that span of ids, whose retries would each
//! be stored once more: a duplicate at worst, never a loss (decision S9).
//!
//! Layout (S9): one table in arrival order, `order → (request id, response id, bytes)`, so a
//! record appends at the end and forgetting the oldest past `cap` takes from the front: no
//! random inserts. Lookups go through an in-memory index, a keyed 64-bit hash of each request
//! id → its order (about 32 bytes an id), rebuilt from the table at open; only a hit reads the
//! table, and the stored id must match, so a hash collision costs a duplicate, never a wrong
//! answer.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use qgate_core::sync::lock;
use redb::{
    Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition, TableHandle,
};
use tokio::sync::{mpsc, oneshot};

/// Arrival order → (request id, response id, bytes).
const LOG: TableDefinition<u64, (&str, u64, u64)> = TableDefinition::new("log");
/// `max_id`: the largest response id ever recorded (it outlives the records past the cap).
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// Tables of the first layout (S6): dropped at open; `meta`'s `max_id` carries over.
const OLD_TABLES: [&str; 2] = ["seen", "order"];

/// Most records one transaction commits.
const BATCH: usize = 4096;

/// Longest time a recorded id may wait for a durable commit (decision S9).
const DURABLE_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

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

/// Keyed hash of a request id → its order in [`LOG`].
struct Index {
    hasher: std::collections::hash_map::RandomState,
    orders: HashMap<u64, u64>,
}

impl Index {
    fn key(&self, rid: &str) -> u64 {
        self.hasher.hash_one(rid)
    }
}

/// A handle to the durable de-duplication table.
pub struct DedupStore {
    db: Arc<Database>,
    tx: mpsc::Sender<Op>,
    index: Arc<Mutex<Index>>,
    path: PathBuf,
}

impl std::fmt::Debug for DedupStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DedupStore({})", self.path.display())
    }
}

/// Where the writer appends next and how many records the table holds.
#[derive(Clone, Copy)]
struct Tail {
    next: u64,
    count: u64,
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
        let e = |e: &dyn std::fmt::Display| fail(e.to_string());
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|x| e(&x))?;
        }
        let db = Database::create(path).map_err(|x| e(&x))?;
        let mut index = Index {
            hasher: Default::default(),
            orders: HashMap::new(),
        };
        let wtx = db.begin_write().map_err(|x| e(&x))?;
        let old: Vec<_> = wtx
            .list_tables()
            .map_err(|x| e(&x))?
            .filter(|t| OLD_TABLES.contains(&t.name()))
            .collect();
        if !old.is_empty() {
            migrate(&wtx).map_err(|x| e(&x))?;
            tracing::info!(path = %path.display(), "de-duplication store converted to the appending layout");
        }
        for t in old {
            wtx.delete_table(t).map_err(|x| e(&x))?;
        }
        let (max_id, tail) = {
            let meta = wtx.open_table(META).map_err(|x| e(&x))?;
            let max_id = meta
                .get("max_id")
                .map_err(|x| e(&x))?
                .map_or(0, |v| v.value());
            let log = wtx.open_table(LOG).map_err(|x| e(&x))?;
            let mut next = 0;
            for row in log.iter().map_err(|x| e(&x))? {
                let (k, v) = row.map_err(|x| e(&x))?;
                let (rid, _, _) = v.value();
                index.orders.insert(index.key(rid), k.value());
                next = k.value() + 1;
            }
            let count = log.len().map_err(|x| e(&x))?;
            (max_id, Tail { next, count })
        };
        wtx.commit().map_err(|x| e(&x))?;
        let rt = tokio::runtime::Handle::try_current()
            .map_err(|_| fail("the store needs a tokio runtime".into()))?;
        let db = Arc::new(db);
        let index = Arc::new(Mutex::new(index));
        let (tx, rx) = mpsc::channel(BATCH);
        rt.spawn(writer(
            db.clone(),
            rx,
            cap.max(1),
            index.clone(),
            tail,
            max_id,
        ));
        Ok((
            DedupStore {
                db,
                tx,
                index,
                path: path.to_path_buf(),
            },
            max_id,
        ))
    }

    /// The answer recorded for `rid`: (response id, bytes).
    pub fn lookup(&self, rid: &str) -> Result<Option<(u64, usize)>, DedupStoreError> {
        let order = {
            let i = lock(&self.index);
            i.orders.get(&i.key(rid)).copied()
        };
        // Most requests are new: no read of the table at all.
        let Some(order) = order else {
            return Ok(None);
        };
        let fail = |e: &dyn std::fmt::Display| DedupStoreError {
            path: self.path.clone(),
            msg: e.to_string(),
        };
        let rtx = self.db.begin_read().map_err(|e| fail(&e))?;
        let t = rtx.open_table(LOG).map_err(|e| fail(&e))?;
        Ok(t.get(order).map_err(|e| fail(&e))?.and_then(|v| {
            let (stored, id, bytes) = v.value();
            (stored == rid).then_some((id, bytes as usize))
        }))
    }

    /// Record `rid` → (`id`, `bytes`); returns once committed (made durable within
    /// [`DURABLE_EVERY`]).
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

/// Copy the first layout's ids into [`LOG`], oldest first (their answers kept), and drop its
/// counters from [`META`]; the caller deletes its tables.
fn migrate(wtx: &redb::WriteTransaction) -> Result<(), redb::Error> {
    let seen = wtx.open_table(TableDefinition::<&str, (u64, u64, u64)>::new(OLD_TABLES[0]))?;
    let order = wtx.open_table(TableDefinition::<u64, &str>::new(OLD_TABLES[1]))?;
    let mut log = wtx.open_table(LOG)?;
    for row in order.iter()? {
        let (o, rid) = row?;
        if let Some(v) = seen.get(rid.value())? {
            let (id, bytes, _) = v.value();
            log.insert(o.value(), (rid.value(), id, bytes))?;
        }
    }
    let mut meta = wtx.open_table(META)?;
    meta.remove("next_order")?;
    meta.remove("count")?;
    Ok(())
}

/// What one commit changed in the index: (key, order) added, (key, order) forgotten.
type Changes = (Vec<(u64, u64)>, Vec<(u64, u64)>);

/// Wait for one record, take whatever else is waiting, commit them in one transaction (not
/// synced) on a blocking thread, update the index, answer everyone in the batch; make
/// everything durable within [`DURABLE_EVERY`] of the first unsynced commit, and before ending.
async fn writer(
    db: Arc<Database>,
    mut rx: mpsc::Receiver<Op>,
    cap: u64,
    index: Arc<Mutex<Index>>,
    mut tail: Tail,
    mut max_id: u64,
) {
    let mut batch = Vec::with_capacity(BATCH);
    // When the oldest commit not yet synced was made.
    let mut unsynced: Option<tokio::time::Instant> = None;
    loop {
        let first = tokio::select! {
            // The due sync before more records: under a steady stream of them it would
            // otherwise wait for a quiet moment (and an unbiased select! draws unseeded).
            biased;
            _ = tokio::time::sleep_until(unsynced.map_or_else(tokio::time::Instant::now, |t| t + DURABLE_EVERY)), if unsynced.is_some() => {
                durable(&db).await;
                unsynced = None;
                continue;
            }
            op = rx.recv() => op,
        };
        let Some(first) = first else {
            if unsynced.is_some() {
                durable(&db).await;
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
        // Keys computed here, under the index lock; the blocking thread gets a copy of the hasher.
        let (keys, hasher): (Vec<(u64, bool)>, _) = {
            let i = lock(&index);
            let keys = batch
                .iter()
                .map(|op| {
                    let k = i.key(&op.rid);
                    (k, i.orders.contains_key(&k))
                })
                .collect();
            (keys, i.hasher.clone())
        };
        let d = db.clone();
        let ops = std::mem::take(&mut batch);
        let (ops, result) = match tokio::task::spawn_blocking(move || {
            let r = commit(&d, &ops, &keys, cap, tail, max_id, &hasher);
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
        let answer = match result {
            Ok((t, m, (added, forgotten))) => {
                tail = t;
                max_id = m;
                let mut i = lock(&index);
                // Added first: a row added and forgotten in one commit (a cap below the batch)
                // must not stay in the index.
                i.orders.extend(added);
                for (k, o) in forgotten {
                    if i.orders.get(&k) == Some(&o) {
                        i.orders.remove(&k);
                    }
                }
                unsynced.get_or_insert_with(tokio::time::Instant::now);
                Ok(())
            }
            Err(e) => {
                tracing::error!(error = %e, "de-duplication commit failed");
                Err(e)
            }
        };
        for op in ops {
            let _ = op.done.send(answer.clone());
        }
    }
}

/// An empty durable commit: everything committed before it is on disk.
async fn durable(db: &Arc<Database>) {
    let d = db.clone();
    let r = tokio::task::spawn_blocking(move || -> Result<(), String> {
        let wtx = d.begin_write().map_err(|e| e.to_string())?;
        wtx.commit().map_err(|e| e.to_string())
    })
    .await;
    if let Ok(Err(e)) | Err(e) = r.map_err(|e| e.to_string()) {
        tracing::error!(error = %e, "de-duplication sync failed");
    }
}

/// Append `batch` (ids already in the index, or earlier in the batch, keep their first answer),
/// forget the oldest past `cap`, in one unsynced transaction. Returns the new tail, the new
/// largest response id and the index changes.
fn commit(
    db: &Database,
    batch: &[Op],
    keys: &[(u64, bool)],
    cap: u64,
    mut tail: Tail,
    mut max_id: u64,
    hasher: &std::collections::hash_map::RandomState,
) -> Result<(Tail, u64, Changes), String> {
    let s = |e: &dyn std::fmt::Display| e.to_string();
    let mut wtx = db.begin_write().map_err(|e| s(&e))?;
    // Synced by the writer's next durable commit (decision S9).
    wtx.set_durability(redb::Durability::None)
        .map_err(|e| s(&e))?;
    let mut added: Vec<(u64, u64)> = Vec::with_capacity(batch.len());
    let mut forgotten = Vec::new();
    {
        let mut log = wtx.open_table(LOG).map_err(|e| s(&e))?;
        let mut in_batch = std::collections::HashSet::with_capacity(batch.len());
        for (op, &(key, known)) in batch.iter().zip(keys) {
            // Same key: the same id unless the hashes collide (then the first stays).
            if known || !in_batch.insert(key) {
                continue;
            }
            log.insert(tail.next, (op.rid.as_str(), op.id, op.bytes))
                .map_err(|e| s(&e))?;
            added.push((key, tail.next));
            tail.next += 1;
            tail.count += 1;
            max_id = max_id.max(op.id);
        }
        while tail.count > cap {
            let Some((order, row)) = log.pop_first().map_err(|e| s(&e))? else {
                break;
            };
            let (rid, _, _) = row.value();
            forgotten.push((hasher.hash_one(rid), order.value()));
            tail.count -= 1;
        }
        let mut meta = wtx.open_table(META).map_err(|e| s(&e))?;
        meta.insert("max_id", max_id).map_err(|e| s(&e))?;
    }
    wtx.commit().map_err(|e| s(&e))?;
    Ok((tail, max_id, (added, forgotten)))
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
        // The writer lets go of the file once its handle is gone (after its last sync).
        let (s, max) = loop {
            match DedupStore::open(&p, 3) {
                Ok(opened) => break opened,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            }
        };
        assert_eq!(max, 13);
        assert_eq!(s.lookup("a").unwrap(), None, "the oldest past the cap");
        assert_eq!(s.lookup("b").unwrap(), Some((11, 1)));
        assert_eq!(s.lookup("d").unwrap(), Some((13, 3)));
        assert_eq!(s.lookup("zz").unwrap(), None);
        drop(s);
        let _ = std::fs::remove_file(&p);
    }

    /// A file of the first layout (S6) opens: its ids and max_id carry over, its tables go.
    #[tokio::test]
    async fn the_first_layout_is_replaced_keeping_the_largest_id() {
        let p = path("old");
        {
            let db = Database::create(&p).unwrap();
            let w = db.begin_write().unwrap();
            {
                let mut seen = w
                    .open_table(TableDefinition::<&str, (u64, u64, u64)>::new("seen"))
                    .unwrap();
                seen.insert("x", (41, 1, 0)).unwrap();
                let mut order = w
                    .open_table(TableDefinition::<u64, &str>::new("order"))
                    .unwrap();
                order.insert(0, "x").unwrap();
                let mut meta = w.open_table(META).unwrap();
                meta.insert("max_id", 41).unwrap();
            }
            w.commit().unwrap();
        }
        let (s, max) = DedupStore::open(&p, 10).unwrap();
        assert_eq!(max, 41);
        assert_eq!(s.lookup("x").unwrap(), Some((41, 1)), "ids carried over");
        let names: Vec<String> =
            s.db.begin_read()
                .unwrap()
                .list_tables()
                .unwrap()
                .map(|t| t.name().to_string())
                .collect();
        assert!(
            !names.iter().any(|n| OLD_TABLES.contains(&n.as_str())),
            "{names:?}"
        );
        s.record("y", 42, 1).await.unwrap();
        assert_eq!(s.lookup("y").unwrap(), Some((42, 1)));
        drop(s);
        let _ = std::fs::remove_file(&p);
    }

    /// The same id twice in one batch keeps the first answer; an id forgotten past the cap is
    /// recorded afresh (the index does not keep a stale entry for it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn same_id_in_one_batch_and_again_after_eviction() {
        let p = path("again");
        let (s, _) = DedupStore::open(&p, 2).unwrap();
        let s = Arc::new(s);
        let (a, b) = tokio::join!(s.record("r", 1, 1), s.record("r", 2, 2));
        a.unwrap();
        b.unwrap();
        let first = s.lookup("r").unwrap().unwrap();
        assert!(first == (1, 1) || first == (2, 2), "{first:?}");
        for x in ["x", "y"] {
            s.record(x, 9, 9).await.unwrap();
        }
        assert_eq!(s.lookup("r").unwrap(), None, "forgotten past the cap");
        s.record("r", 3, 3).await.unwrap();
        assert_eq!(s.lookup("r").unwrap(), Some((3, 3)), "recorded afresh");
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
