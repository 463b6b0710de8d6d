//! The gateway's spool in virtual time (issue 50): with every backhaul path down, records are
//! answered as stored and nothing reaches the server; when the paths return the spool drains,
//! every record arrives once, and live records of a device with spooled ones queue behind them.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use qgate_spool::{Spool, SpoolConfig};

fn spool(name: &str) -> (Spool, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("qgate-gw-spool-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = SpoolConfig {
        keep_free: 0,
        ..SpoolConfig::new(&dir)
    };
    (Spool::open(cfg).unwrap(), dir)
}

#[tokio::test(start_paused = true)]
async fn records_are_spooled_while_every_path_is_down_and_drain_when_one_returns() {
    let (s, dir) = spool("outage");
    let w = world_spooled(4, "adaptive", s.clone()).await;
    let hashes = {
        let mut h = Vec::new();
        for (i, d) in w.devices.iter().enumerate() {
            h.push(register(d, (i % 2) as u8).await);
        }
        h
    };
    assert_eq!(send(&w.devices[0], &hashes[0]).await.0, 201);
    let before = w.server.ingested.load(Ordering::Relaxed);
    for l in &w.backhaul {
        w.net.update_both(*l, |l| l.up = false).unwrap();
    }
    // Every record gets an answer, as stored, while no path is up.
    for round in 0..10 {
        for (d, h) in w.devices.iter().zip(&hashes) {
            let (status, path) = send(d, h).await;
            assert_eq!((status.as_u16(), path), (202, None), "round {round}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(w.server.ingested.load(Ordering::Relaxed), before);
    let v = s.view();
    assert_eq!(v.priority.held.records + v.best_effort.held.records, 40);
    assert_eq!(v.priority.held.records, 20);
    // Back: the spool drains, and every record reaches the server once.
    for l in &w.backhaul {
        w.net.update_both(*l, |l| l.up = true).unwrap();
    }
    // A device whose records wait in the spool queues its new ones behind them.
    assert!(s.holds("10.8.0.2", qgate_forward::scheduler::Priority::BestEffort));
    assert_eq!(send(&w.devices[0], &hashes[0]).await.0, 202);
    let mut waited = 0;
    while s.view().priority.held.records + s.view().best_effort.held.records > 0 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        waited += 1;
        assert!(
            waited < 600,
            "not drained after 2 virtual minutes: {:?}",
            s.view()
        );
    }
    let snap = s.stats().snapshot();
    assert_eq!((snap.spooled, snap.drained, snap.rejected), (41, 41, 0));
    assert_eq!(w.server.ingested.load(Ordering::Relaxed), before + 41);
    assert_eq!(w.server.duplicates.load(Ordering::Relaxed), 0);
    // Live again.
    assert_eq!(send(&w.devices[1], &hashes[1]).await.0, 201);
    drop(w);
    std::fs::remove_dir_all(&dir).unwrap();
}
