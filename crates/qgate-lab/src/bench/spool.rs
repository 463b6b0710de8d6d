//! `qgate-lab bench spool`: how fast the gateway's spool takes records (issue 50: ≥ 50,000
//! records/s of 100 B), beside the direct forwarding rate measured in the same run, and whether
//! its memory depends on what it holds (RSS empty, full, and reopened full).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use qgate_forward::scheduler::Priority;
use qgate_spool::{NewRecord, Spool, SpoolConfig};
use qgate_transport::http3::{H3Client, ALPN_H3};
use qgate_transport::{client_config, connect, endpoint, DevPki, Socket, TransportOptions};

use super::gateway::{drive, rss_bytes, Load, SendFn};
use crate::stats::Summary;

/// What to measure.
#[derive(Debug, Clone)]
pub struct SpoolBenchConfig {
    /// Concurrent writers (devices answered at once).
    pub writers: usize,
    /// Bytes per record body.
    pub body: usize,
    /// Seconds per measurement.
    pub secs: f64,
    /// Alternating (spool, direct) pairs.
    pub repeats: usize,
    /// MiB spooled for the memory measurement (0 skips it).
    pub fill_mib: u64,
}

impl Default for SpoolBenchConfig {
    fn default() -> Self {
        SpoolBenchConfig {
            writers: 1000,
            body: 100,
            secs: 5.0,
            repeats: 3,
            fill_mib: 1024,
        }
    }
}

/// The results.
#[derive(Debug, Clone)]
pub struct SpoolBench {
    /// Records spooled per second (each answered once synced), per repeat.
    pub spool: Vec<Load>,
    /// Records posted straight to a local ingest server per second, per repeat.
    pub direct: Vec<Load>,
    /// Resident memory: an empty spool open, the same holding `fill_mib`, and reopened full.
    pub rss: Option<(u64, u64, u64)>,
}

impl SpoolBench {
    /// Spooled records/s.
    pub fn spool_rps(&self) -> Summary {
        Summary::of(&self.spool.iter().map(|l| l.rps).collect::<Vec<_>>())
    }

    /// Direct records/s.
    pub fn direct_rps(&self) -> Summary {
        Summary::of(&self.direct.iter().map(|l| l.rps).collect::<Vec<_>>())
    }

    /// Spooled over direct, per pair.
    pub fn ratio(&self) -> Summary {
        Summary::of(
            &self
                .spool
                .iter()
                .zip(&self.direct)
                .map(|(s, d)| s.rps / d.rps.max(1e-9))
                .collect::<Vec<_>>(),
        )
    }
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("qgate-bench-spool-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn config(dir: &std::path::Path) -> SpoolConfig {
    let mut c = SpoolConfig::new(dir);
    // The limits are not what is measured.
    c.limits.max_bytes = u64::MAX / 4;
    c.limits.max_records = u64::MAX / 4;
    c.limits.device_bytes = u64::MAX / 4;
    c.limits.device_records = u64::MAX / 4;
    c.keep_free = 0;
    c
}

/// Run the benchmark.
pub fn run(cfg: SpoolBenchConfig, progress: impl Fn(&str)) -> SpoolBench {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let pki = DevPki::generate(&[]).expect("PKI");
        let opts = TransportOptions::default();
        let server = qgate_server::Server::builder()
            .socket(Socket::bind_udp("127.0.0.1:0".parse().expect("addr")).expect("bind"))
            .identity(&pki.server)
            .transport(opts.clone())
            .start()
            .expect("server");
        let ccfg = client_config(&pki.trust(), &[ALPN_H3], &opts).expect("config");
        let ep = endpoint(
            Socket::bind_udp("127.0.0.1:0".parse().expect("addr")).expect("bind"),
            None,
            None,
        )
        .expect("endpoint");
        // Direct: as many clients as the gateway bench's devices (100), each one request at a time.
        let mut direct = Vec::new();
        for _ in 0..100 {
            let c = connect(&ep, &ccfg, server.addr(), "localhost", false)
                .await
                .expect("connect");
            direct.push(Arc::new(
                H3Client::new(c.connection().clone()).await.expect("h3"),
            ));
        }
        let direct_senders = || super::gateway::direct_senders(&direct);
        let dir = tempdir("rate");
        let spool = Spool::open(config(&dir)).expect("spool");
        let n = Arc::new(AtomicU64::new(0));
        let spool_senders = || -> Vec<SendFn> {
            (0..cfg.writers)
                .map(|i| {
                    let (spool, n) = (spool.clone(), n.clone());
                    Arc::new(move |b: Bytes| {
                        let (spool, n) = (spool.clone(), n.clone());
                        Box::pin(async move {
                            let k = n.fetch_add(1, Ordering::Relaxed);
                            let r = NewRecord {
                                class: if i % 2 == 0 {
                                    Priority::Priority
                                } else {
                                    Priority::BestEffort
                                },
                                owner: format!("10.0.{}.{}", i / 250, i % 250),
                                device: format!("10.0.{}.{}:4000", i / 250, i % 250),
                                target: "/ingest/bench".into(),
                                request_id: format!("{k:032x}"),
                                body: b,
                            };
                            spool.append(r, 1_800_000_000_000).await.is_ok()
                        }) as futures_util::future::BoxFuture<'static, bool>
                    }) as SendFn
                })
                .collect()
        };
        let mut out = SpoolBench {
            spool: Vec::new(),
            direct: Vec::new(),
            rss: None,
        };
        for i in 0..cfg.repeats {
            out.spool
                .push(drive(spool_senders(), cfg.body, cfg.secs, 0.0).await);
            out.direct
                .push(drive(direct_senders(), cfg.body, cfg.secs, 0.0).await);
            progress(&format!("pair {}/{} done", i + 1, cfg.repeats));
        }
        drop(spool);
        let _ = std::fs::remove_dir_all(&dir);
        if cfg.fill_mib > 0 {
            let dir = tempdir("fill");
            let me = std::process::id();
            let spool = Spool::open(config(&dir)).expect("spool");
            let empty = rss_bytes(me).unwrap_or(0);
            // Large records fill it fast; memory per record held is what is looked for.
            let chunk = Bytes::from(vec![b'x'; 64 << 10]);
            let want = cfg.fill_mib << 20;
            let mut k = 0u64;
            while spool.view().best_effort.held.bytes + spool.view().priority.held.bytes < want {
                let batch: Vec<_> = (0..64)
                    .map(|j| {
                        let (spool, body) = (spool.clone(), chunk.clone());
                        k += 1;
                        tokio::spawn(async move {
                            let r = NewRecord {
                                class: if j % 2 == 0 {
                                    Priority::Priority
                                } else {
                                    Priority::BestEffort
                                },
                                owner: format!("10.1.0.{}", j % 50),
                                device: "10.1.0.1:4000".into(),
                                target: "/ingest/fill".into(),
                                request_id: format!("{k:032x}"),
                                body,
                            };
                            spool.append(r, 1_800_000_000_000).await
                        })
                    })
                    .collect();
                for t in batch {
                    let _ = t.await;
                }
            }
            let full = rss_bytes(me).unwrap_or(0);
            drop(spool);
            let spool = Spool::open(config(&dir)).expect("reopen");
            let reopened = rss_bytes(me).unwrap_or(0);
            progress(&format!(
                "filled {} MiB in {} records",
                spool.view().best_effort.held.bytes / 1048576
                    + spool.view().priority.held.bytes / 1048576,
                spool.view().best_effort.held.records + spool.view().priority.held.records
            ));
            drop(spool);
            let _ = std::fs::remove_dir_all(&dir);
            out.rss = Some((empty, full, reopened));
        }
        out
    })
}
