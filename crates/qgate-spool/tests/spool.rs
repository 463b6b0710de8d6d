//! The spool against its promises: what was answered as stored comes back after a restart, a
//! torn tail is cut and never refuses a start, limits hold exactly, and what is done with
//! leaves the disk.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use qgate_forward::scheduler::Priority;
use qgate_spool::{Done, Held, Limits, NewRecord, OnFull, Spool, SpoolConfig, SpoolError};

const T0: u64 = 1_800_000_000_000;

fn rec(owner: &str, class: Priority, n: u32) -> NewRecord {
    NewRecord {
        class,
        owner: owner.into(),
        device: format!("{owner}:5000"),
        target: "/ingest/t".into(),
        request_id: format!("{owner}-{n}"),
        body: Bytes::from(format!("record {n:05}")),
    }
}

fn cfg(dir: &Path) -> SpoolConfig {
    SpoolConfig {
        keep_free: 0,
        ..SpoolConfig::new(dir)
    }
}

fn segments(dir: &Path, class: &str) -> usize {
    std::fs::read_dir(dir.join(class))
        .unwrap()
        .filter(|d| {
            d.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".seg")
        })
        .count()
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("qgate-spool-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[tokio::test]
async fn what_was_stored_comes_back_after_a_restart_in_order_and_by_class() {
    let dir = tempdir("restart");
    {
        let s = Spool::open(cfg(&dir)).unwrap();
        for n in 0..50 {
            let class = if n % 5 == 0 {
                Priority::Priority
            } else {
                Priority::BestEffort
            };
            s.append(rec("10.0.0.1", class, n), T0 + u64::from(n))
                .await
                .unwrap();
        }
        assert_eq!(s.stats().snapshot().spooled, 50);
    }
    let s = Spool::open(cfg(&dir)).unwrap();
    let v = s.view();
    assert_eq!(v.priority.held.records, 10);
    assert_eq!(v.best_effort.held.records, 40);
    let p = s.take(Priority::Priority, 100, u64::MAX, T0 + 100).await;
    let ids: Vec<_> = p.iter().map(|e| e.request_id.clone()).collect();
    let want: Vec<_> = (0..50)
        .filter(|n| n % 5 == 0)
        .map(|n| format!("10.0.0.1-{n}"))
        .collect();
    assert_eq!(ids, want);
    let b = s.take(Priority::BestEffort, 100, u64::MAX, T0 + 100).await;
    assert_eq!(b.len(), 40);
    assert!(b.windows(2).all(|w| w[0].seq < w[1].seq));
    assert_eq!(b[0].body, Bytes::from("record 00001"));
    s.finish(&p, Done::Delivered);
    s.finish(&b, Done::Delivered);
    assert_eq!(s.view().priority.held, Held::default());
    assert_eq!(s.stats().snapshot().drained, 50);
    // Reopened: nothing left, and the drained segments' files are gone once no longer written.
    drop(s);
    let s = Spool::open(cfg(&dir)).unwrap();
    assert_eq!(s.view().best_effort.held.records, 0);
    assert_eq!(
        segments(&dir, "priority") + segments(&dir, "best-effort"),
        0
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_torn_tail_is_cut_at_the_last_good_record_and_counted() {
    let dir = tempdir("torn");
    {
        let s = Spool::open(cfg(&dir)).unwrap();
        for n in 0..10 {
            s.append(rec("a", Priority::BestEffort, n), T0)
                .await
                .unwrap();
        }
    }
    // A crash mid-write: half a frame at the end; and a bit flipped in the one before.
    let seg = std::fs::read_dir(dir.join("best-effort"))
        .unwrap()
        .map(|d| d.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "seg"))
        .unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    let frame = bytes.len() / 10;
    let n = bytes.len();
    bytes[n - frame / 2] ^= 1;
    bytes.extend_from_within(..frame / 2);
    std::fs::write(&seg, &bytes).unwrap();
    let s = Spool::open(cfg(&dir)).unwrap();
    assert_eq!(s.stats().snapshot().torn, 1);
    let got = s.take(Priority::BestEffort, 100, u64::MAX, T0).await;
    assert_eq!(
        got.len(),
        9,
        "the corrupted last record and what follows it are cut"
    );
    assert_eq!(std::fs::metadata(&seg).unwrap().len() as usize, frame * 9);
    // New records go on after the cut.
    s.append(rec("a", Priority::BestEffort, 99), T0)
        .await
        .unwrap();
    s.back(got);
    assert_eq!(
        s.take(Priority::BestEffort, 100, u64::MAX, T0).await.len(),
        10
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn limits_hold_exactly_and_a_device_cannot_take_more_than_its_share() {
    let dir = tempdir("limits");
    let mut c = cfg(&dir);
    c.limits = Limits {
        max_records: 20,
        device_records: 8,
        ..Limits::default()
    };
    let s = Spool::open(c).unwrap();
    let mut ok = 0;
    for n in 0..30 {
        match s.append(rec("flood", Priority::BestEffort, n), T0).await {
            Ok(_) => ok += 1,
            Err(e) => assert_eq!(e, SpoolError::Share),
        }
    }
    assert_eq!(ok, 8, "one device's share");
    for d in 0..3 {
        for n in 0..8 {
            let r = s
                .append(rec(&format!("d{d}"), Priority::Priority, n), T0)
                .await;
            // 8 from flood + 12 more fill the 20.
            let before = 8 + d * 8 + n;
            assert_eq!(r.is_ok(), before < 20, "device {d} record {n}: {r:?}");
            if let Err(e) = r {
                assert_eq!(e, SpoolError::Full);
            }
        }
    }
    assert_eq!(
        s.view().priority.held.records + s.view().best_effort.held.records,
        20
    );
    let snap = s.stats().snapshot();
    assert_eq!((snap.refused_share, snap.refused_full), (22, 12));
    // Bytes too: one byte over refuses.
    let dir2 = tempdir("limits-bytes");
    let one = {
        let s = Spool::open(cfg(&dir2)).unwrap();
        s.append(rec("x", Priority::Priority, 0), T0).await.unwrap();
        s.view().priority.held.bytes
    };
    std::fs::remove_dir_all(&dir2).unwrap();
    let mut c = cfg(&dir2);
    c.limits.max_bytes = one * 3;
    let s2 = Spool::open(c).unwrap();
    // Owners named as long as "x": every record the same size.
    for o in ["p", "q", "r"] {
        s2.append(rec(o, Priority::Priority, 0), T0).await.unwrap();
    }
    assert_eq!(
        s2.append(rec("s", Priority::Priority, 0), T0).await,
        Err(SpoolError::Full)
    );
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&dir2).unwrap();
}

#[tokio::test]
async fn drop_oldest_makes_room_from_best_effort_only() {
    let dir = tempdir("drop");
    let mut c = cfg(&dir);
    c.limits.max_records = 5;
    c.limits.on_full = [OnFull::DropOldest, OnFull::DropOldest];
    let s = Spool::open(c).unwrap();
    for n in 0..3 {
        s.append(rec("a", Priority::BestEffort, n), T0)
            .await
            .unwrap();
    }
    for n in 0..4 {
        s.append(rec("b", Priority::Priority, n), T0).await.unwrap();
    }
    // 7 appended into 5: the two oldest best-effort records were dropped.
    assert_eq!(s.stats().snapshot().dropped, 2);
    let b = s.take(Priority::BestEffort, 10, u64::MAX, T0).await;
    assert_eq!(
        b.iter().map(|e| e.request_id.as_str()).collect::<Vec<_>>(),
        ["a-2"]
    );
    s.back(b);
    // Priority cannot be dropped: with no best effort left to drop, full refuses.
    s.append(rec("b", Priority::Priority, 4), T0).await.unwrap();
    assert_eq!(
        s.append(rec("b", Priority::Priority, 5), T0).await,
        Err(SpoolError::Full)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_record_past_the_age_limit_is_never_delivered() {
    let dir = tempdir("age");
    let mut c = cfg(&dir);
    c.limits.max_age = Duration::from_secs(60);
    let s = Spool::open(c).unwrap();
    s.append(rec("a", Priority::Priority, 0), T0).await.unwrap();
    s.append(rec("a", Priority::Priority, 1), T0 + 30_000)
        .await
        .unwrap();
    // At 60 s the first is exactly at the limit: still delivered.
    let got = s.take(Priority::Priority, 10, u64::MAX, T0 + 60_000).await;
    assert_eq!(got.len(), 2);
    s.back(got);
    s.expire(T0 + 60_001).await;
    assert_eq!(s.stats().snapshot().expired, 1);
    assert_eq!(s.view().priority.held.records, 1);
    let got = s.take(Priority::Priority, 10, u64::MAX, T0 + 90_001).await;
    assert!(got.is_empty());
    assert_eq!(s.stats().snapshot().expired, 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_purge_removes_one_devices_records_and_survives_a_restart() {
    let dir = tempdir("purge");
    {
        let s = Spool::open(cfg(&dir)).unwrap();
        for n in 0..4 {
            s.append(rec("a", Priority::BestEffort, n), T0)
                .await
                .unwrap();
            s.append(rec("b", Priority::BestEffort, n), T0)
                .await
                .unwrap();
        }
        assert_eq!(s.purge(Some("a"), None).await.unwrap(), 4);
        assert_eq!(s.view().best_effort.held.records, 4);
        s.append(rec("a", Priority::BestEffort, 9), T0)
            .await
            .unwrap();
    }
    let s = Spool::open(cfg(&dir)).unwrap();
    assert_eq!(s.view().best_effort.held.records, 5);
    let got = s.take(Priority::BestEffort, 10, u64::MAX, T0).await;
    let ids: Vec<_> = got.iter().map(|e| e.request_id.as_str()).collect();
    assert_eq!(ids, ["b-0", "b-1", "b-2", "b-3", "a-9"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_checkpoint_keeps_a_restart_from_sending_what_was_delivered() {
    let dir = tempdir("cursor");
    let mut c = cfg(&dir);
    // Small segments: some are given back whole, the cursor covers the rest.
    c.segment_bytes = 500;
    {
        let s = Spool::open(c.clone()).unwrap();
        for n in 0..40 {
            s.append(rec("a", Priority::Priority, n), T0).await.unwrap();
        }
        let segs = segments(&dir, "priority");
        assert!(segs > 3, "{segs}");
        let got = s.take(Priority::Priority, 25, u64::MAX, T0).await;
        let (done, back) = got.split_at(22);
        s.finish(done, Done::Delivered);
        s.back(back.to_vec());
        s.checkpoint().await.unwrap();
        assert!(
            segments(&dir, "priority") < segs,
            "drained segments are given back"
        );
    }
    let s = Spool::open(c).unwrap();
    let got = s.take(Priority::Priority, 100, u64::MAX, T0).await;
    assert_eq!(got.first().map(|e| e.request_id.as_str()), Some("a-22"));
    assert_eq!(got.len(), 18);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_share_syncs_and_none_is_lost() {
    let dir = tempdir("group");
    let mut c = cfg(&dir);
    c.segment_bytes = 64 << 10;
    let s = Spool::open(c).unwrap();
    let tasks: Vec<_> = (0..2000u32)
        .map(|n| {
            let s = s.clone();
            tokio::spawn(async move {
                s.append(rec(&format!("d{}", n % 50), Priority::BestEffort, n), T0)
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut seqs = Vec::new();
    for t in tasks {
        seqs.push(t.await.unwrap());
    }
    seqs.sort();
    seqs.dedup();
    assert_eq!(seqs.len(), 2000);
    drop(s);
    let s = Spool::open(cfg(&dir)).unwrap();
    let got = s.take(Priority::BestEffort, 5000, u64::MAX, T0).await;
    assert_eq!(got.len(), 2000);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_disk_without_room_turns_the_spool_off_and_it_says_so() {
    let dir = tempdir("full");
    let mut c = cfg(&dir);
    c.keep_free = u64::MAX;
    let s = Spool::open(c).unwrap();
    let e = s
        .append(rec("a", Priority::Priority, 0), T0)
        .await
        .unwrap_err();
    assert!(
        matches!(e, SpoolError::Unavailable(ref why) if why.contains("kept free")),
        "{e}"
    );
    assert!(s.unavailable(T0).is_some());
    assert!(s.unavailable(T0 + 10_001).is_none(), "off for 10 s only");
    assert_eq!(
        s.view().priority.held.records,
        0,
        "a refused record is not counted"
    );
    // Off for a while, then it tries again.
    assert!(matches!(
        s.append(rec("a", Priority::Priority, 1), T0 + 1000).await,
        Err(SpoolError::Unavailable(_))
    ));
    assert_eq!(s.stats().snapshot().refused_unavailable, 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_cursor_that_cannot_be_right_is_ignored_and_nothing_is_lost() {
    let dir = tempdir("bad-cursor");
    {
        let s = Spool::open(cfg(&dir)).unwrap();
        for n in 0..10 {
            s.append(rec("a", Priority::BestEffort, n), T0)
                .await
                .unwrap();
        }
    }
    for garbage in [&b"garbage\n"[..], &[0xff; 8][..], &[1, 2, 3][..]] {
        std::fs::write(dir.join("best-effort/cursor"), garbage).unwrap();
        let s = Spool::open(cfg(&dir)).unwrap();
        assert_eq!(s.view().best_effort.held.records, 10, "{garbage:?}");
        // New records still get numbers and go in.
        s.append(rec("b", Priority::BestEffort, 0), T0)
            .await
            .unwrap();
        let got = s.take(Priority::BestEffort, 100, u64::MAX, T0).await;
        assert_eq!(got.len(), 11);
        s.back(got);
        s.purge(Some("b"), None).await.unwrap();
    }
    // Garbage in the purge list and a directory where a segment should be: started anyway.
    std::fs::write(dir.join("purges"), [0xc3, 0x28, b'\n', b'x']).unwrap();
    std::fs::create_dir_all(dir.join("priority").join("00000000000000000099.seg")).unwrap();
    let s = Spool::open(cfg(&dir)).unwrap();
    // A lost purge list sends the purged records after all; nothing else changes.
    let got = s.take(Priority::BestEffort, 100, u64::MAX, T0).await;
    assert_eq!(got.iter().filter(|e| e.owner == "a").count(), 10);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn one_spool_directory_serves_one_gateway() {
    let dir = tempdir("lock");
    let a = Spool::open(cfg(&dir)).unwrap();
    let e = Spool::open(cfg(&dir)).unwrap_err();
    assert!(e.to_string().contains("in use by another gateway"), "{e}");
    drop(a);
    Spool::open(cfg(&dir)).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_record_no_share_could_hold_is_too_large_not_a_full_share() {
    let dir = tempdir("too-large");
    let mut c = cfg(&dir);
    c.limits.device_bytes = 200;
    let s = Spool::open(c).unwrap();
    let mut r = rec("a", Priority::Priority, 0);
    r.body = Bytes::from(vec![0u8; 300]);
    assert_eq!(s.append(r, T0).await, Err(SpoolError::TooLarge));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A tmpfs of `size` mounted on `dir` while it lives (root only).
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(dir.to_owned()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[tokio::test]
async fn a_disk_that_fills_mid_write_keeps_every_stored_record_and_no_other() {
    let dir = tempdir("enospc");
    let Some(_fs) = Tmpfs::mount(&dir, "256k") else {
        // Mounting needs root; CI has it, so there the test must run.
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must be able to mount a tmpfs for this test"
        );
        eprintln!("skipped: cannot mount a tmpfs here (not root)");
        return;
    };
    let s = Spool::open(cfg(&dir)).unwrap();
    let mut stored = std::collections::BTreeSet::new();
    let mut refused = 0;
    // Rounds of concurrent appends (so a group's write is cut mid-way) until the disk is full.
    for round in 0..40u32 {
        let mut tasks = tokio::task::JoinSet::new();
        for k in 0..16u32 {
            let s = s.clone();
            let n = round * 16 + k;
            tasks.spawn(async move {
                let mut r = rec("10.0.0.9", Priority::BestEffort, n);
                r.body = Bytes::from(vec![b'x'; 900 + n as usize % 200]);
                (r.request_id.clone(), s.append(r, T0).await)
            });
        }
        while let Some(t) = tasks.join_next().await {
            match t.unwrap() {
                (id, Ok(_)) => {
                    stored.insert(id);
                }
                (_, Err(e)) => {
                    assert!(matches!(e, SpoolError::Unavailable(_)), "{e}");
                    refused += 1;
                }
            }
        }
        if refused > 0 {
            break;
        }
    }
    assert!(refused > 0, "a 256 KiB disk took 640 KiB of records");
    assert!(stored.len() > 100, "only {} stored", stored.len());
    assert!(
        s.unavailable(T0).is_some(),
        "a failed write turns the spool off"
    );
    assert_eq!(s.view().best_effort.held.records, stored.len() as u64);
    drop(s);
    // Reopened on the same full disk: exactly what was answered as stored, nothing torn.
    let s = Spool::open(cfg(&dir)).unwrap();
    let got = s.take(Priority::BestEffort, 10_000, u64::MAX, T0).await;
    let ids: std::collections::BTreeSet<_> = got.iter().map(|e| e.request_id.clone()).collect();
    assert_eq!(ids, stored);
    assert_eq!(got.len(), stored.len(), "no record twice");
    assert_eq!(
        s.stats().snapshot().torn,
        0,
        "the cut write left no torn tail"
    );
}
