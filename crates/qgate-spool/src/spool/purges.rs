//! Purges: an operator drops what a device (or every device) holds in a class. A purge is a
//! line in the `purges` file: records below its sequence number are skipped when read.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::Ordering;

use qgate_core::sync::lock;
use qgate_forward::scheduler::Priority;

impl Spool {
    /// Purge what `owner` (or every device) holds in `class` (or both): skipped when read,
    /// uncounted now. Returns the records purged.
    pub async fn purge(
        &self,
        owner: Option<&str>,
        class: Option<Priority>,
    ) -> std::io::Result<u64> {
        let (purges, n) = {
            let mut s = lock(&self.inner.state);
            let below = s.next_seq;
            let owners: Vec<String> = match owner {
                Some(o) => vec![o.to_owned()],
                None => s.ledger.owners().map(|(o, _)| o.to_owned()).collect(),
            };
            let mut n = 0;
            for c in CLASSES
                .into_iter()
                .filter(|c| class.is_none_or(|k| k == *c))
            {
                for o in &owners {
                    let gone = s.ledger.forget(o, c);
                    if gone.records > 0 {
                        n += gone.records;
                        s.purges.push(Purge {
                            class: c,
                            owner: o.clone(),
                            below,
                        });
                    }
                }
            }
            self.inner.stats.purged.fetch_add(n, Ordering::Relaxed);
            self.refresh(&s);
            (s.purges.clone(), n)
        };
        let path = self.inner.cfg.dir.join("purges");
        qgate_core::disk::run(self.inner.disk.as_ref(), move || {
            write_purges(&path, &purges)
        })
        .await
        .map_err(std::io::Error::other)??;
        Ok(n)
    }
}

/// The purges in `path`; lines that are not one are ignored (their records are sent).
pub(super) fn read_purges(path: &Path) -> Vec<Purge> {
    let text = match std::fs::read(path) {
        Ok(t) => String::from_utf8_lossy(&t).into_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            tracing::warn!(target: "qgate_spool", error = %e, "spool purge list unreadable: ignored");
            return Vec::new();
        }
    };
    text.lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ' ');
            let class = match it.next()? {
                "priority" => Priority::Priority,
                "best-effort" => Priority::BestEffort,
                _ => return None,
            };
            let below = it.next()?.parse().ok()?;
            let owner = it.next()?.to_owned();
            Some(Purge {
                class,
                owner,
                below,
            })
        })
        .collect()
}

pub(super) fn write_purges(path: &Path, purges: &[Purge]) -> std::io::Result<()> {
    let mut text = String::new();
    for p in purges {
        text.push_str(&format!("{} {} {}\n", class_dir(p.class), p.below, p.owner));
    }
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

use super::{class_dir, Purge, Spool, CLASSES};
