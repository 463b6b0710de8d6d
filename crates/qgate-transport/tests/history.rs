//! Congestion-window history (paper 002) on real QUIC connections over netsim, and its store.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use qgate_history::careful_resume::Outcome;
use qgate_history::{Averaging, HistoryConfig, Observed, Resume};
use qgate_netsim::{LinkId, LinkParams, Network};
use qgate_transport::window_history::{client_peer_key, HistoryStore};
use qgate_transport::{
    client_config, connect, endpoint, server_config, DevPki, Socket, TransportOptions,
};

const SERVER: &str = "10.0.0.2:4433";

fn sa(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("qgate-hist-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Paper 002's scheme: the window at close, averaged; a new connection starts there.
fn config() -> HistoryConfig {
    HistoryConfig {
        averaging: Averaging::Mean,
        resume: Resume::Window,
        ..Default::default()
    }
}

/// A connection whose minimum and final smoothed RTTs were both `us`.
fn rtt(us: u64) -> Observed {
    Observed {
        min_us: us,
        srtt_us: us,
        capacity: 0,
    }
}

/// Virtual-time clock for the store.
fn virtual_clock() -> qgate_transport::window_history::Clock {
    let start = tokio::time::Instant::now();
    Arc::new(move || 1_700_000_000_000 + start.elapsed().as_millis() as u64)
}

struct Setup {
    net: Network,
    link: LinkId,
    client: quinn::Endpoint,
    base: quinn::ClientConfig,
}

fn setup(one_way_ms: u64) -> Setup {
    let net = Network::new(1);
    let (c, s) = (net.add_host("client"), net.add_host("server"));
    let ic = net.add_interface(c, "10.0.0.1".parse().unwrap()).unwrap();
    let is = net.add_interface(s, "10.0.0.2".parse().unwrap()).unwrap();
    let link = net
        .connect_symmetric(
            ic,
            is,
            LinkParams::new(100_000_000, Duration::from_millis(one_way_ms)),
        )
        .unwrap();
    let pki = DevPki::generate(&[]).unwrap();
    let opts = TransportOptions::default();
    let server = endpoint(
        Socket::from(net.bind(s, sa(SERVER)).unwrap()),
        Some(server_config(&pki.server, &[b"t"], &opts).unwrap()),
        Some(1),
    )
    .unwrap();
    tokio::spawn(async move {
        while let Some(inc) = server.accept().await {
            tokio::spawn(async move {
                let Ok(conn) = inc.await else { return };
                while let Ok(mut rx) = conn.accept_uni().await {
                    tokio::spawn(async move {
                        while let Ok(Some(_)) = rx.read_chunk(1 << 20, false).await {}
                    });
                }
            });
        }
    });
    let client = endpoint(
        Socket::from(net.bind(c, sa("10.0.0.1:0")).unwrap()),
        None,
        Some(2),
    )
    .unwrap();
    let base = client_config(&pki.trust(), &[b"t"], &opts).unwrap();
    Setup {
        net,
        link,
        client,
        base,
    }
}

/// Upload `bytes` on a connection configured by `cfg`; return the connection's initial window
/// and its window at the end; close it and wait until quinn has dropped it.
async fn upload(s: &Setup, cfg: &quinn::ClientConfig, bytes: usize) -> (u64, u64) {
    let c = connect(&s.client, cfg, sa(SERVER), "localhost", false)
        .await
        .unwrap();
    let conn = c.connection().clone();
    let initial = conn.congestion_state().initial_window();
    let mut st = conn.open_uni().await.unwrap();
    st.write_all(&Bytes::from(vec![7u8; bytes])).await.unwrap();
    st.finish().unwrap();
    st.stopped().await.ok();
    let end = conn.stats().path.cwnd;
    conn.close(0u32.into(), b"done");
    drop(conn);
    drop(c);
    tokio::time::sleep(Duration::from_secs(2)).await; // draining, then the state is freed
    (initial, end)
}

#[tokio::test(start_paused = true)]
async fn second_connection_starts_from_the_recorded_window() {
    let s = setup(20);
    let store = HistoryStore::in_memory(config(), virtual_clock());
    let opts = TransportOptions::default();
    let peer = client_peer_key("localhost", sa(SERVER));

    let (cfg, h1) = store.client_config(&s.base, &opts, &peer, None).unwrap();
    assert!(!h1.decision.from_history, "no history yet");
    let (initial1, end1) = upload(&s, &cfg, 4 << 20).await;
    assert_eq!(initial1, h1.decision.window);
    let e = store
        .get(&peer)
        .expect("the closed connection was recorded");
    assert_eq!(e.count, 1);
    assert_eq!(
        e.avg_cwnd as u64, end1,
        "the window at close is what was recorded"
    );
    assert!(
        end1 > initial1 * 4,
        "slow start grew the window: {initial1} → {end1}"
    );
    assert!(
        e.min_rtt_us >= 40_000 && e.min_rtt_us < 45_000,
        "{}",
        e.min_rtt_us
    );

    let (cfg, h2) = store.client_config(&s.base, &opts, &peer, None).unwrap();
    assert!(h2.decision.from_history);
    assert_eq!(h2.decision.window, end1.min(1 << 20));
    let (initial2, _) = upload(&s, &cfg, 100_000).await;
    assert_eq!(
        initial2, h2.decision.window,
        "the new connection starts with the history"
    );
    assert_eq!(store.get(&peer).unwrap().count, 2);
}

#[tokio::test(start_paused = true)]
async fn history_below_the_default_uses_the_default() {
    let s = setup(20);
    let store = HistoryStore::in_memory(config(), virtual_clock());
    let peer = client_peer_key("localhost", sa(SERVER));
    store.record(&peer, 3_000, rtt(40_000)); // a bad network's small window
    let (cfg, h) = store
        .client_config(&s.base, &TransportOptions::default(), &peer, None)
        .unwrap();
    assert!(!h.decision.from_history);
    let (initial, _) = upload(&s, &cfg, 10_000).await;
    assert_eq!(initial, h.decision.window);
    assert!(
        initial > 3_000,
        "the default ({initial}) and not the history"
    );
}

#[tokio::test(start_paused = true)]
async fn safeguard_falls_back_when_the_rtt_jumps() {
    let s = setup(20);
    let store = HistoryStore::in_memory(config(), virtual_clock());
    let opts = TransportOptions::default();
    let peer = client_peer_key("localhost", sa(SERVER));
    let (cfg, _) = store
        .client_config(&s.base, &opts, &peer, Some(2.0))
        .unwrap();
    upload(&s, &cfg, 4 << 20).await;

    // Same RTT: the history stands.
    let (cfg, h) = store
        .client_config(&s.base, &opts, &peer, Some(2.0))
        .unwrap();
    upload(&s, &cfg, 200_000).await;
    assert!(h.decision.from_history && !h.fell_back());

    // The path's delay quadruples: the first RTT sample (≈ 160 ms vs 40 ms) trips the safeguard.
    s.net
        .update_both(s.link, |l| l.delay = Duration::from_millis(80))
        .unwrap();
    let (cfg, h) = store
        .client_config(&s.base, &opts, &peer, Some(2.0))
        .unwrap();
    assert!(h.decision.from_history);
    upload(&s, &cfg, 200_000).await;
    assert!(h.fell_back(), "RTT jumped: back to the default window");

    // Without the safeguard the same history is used as it is.
    let (cfg, h) = store.client_config(&s.base, &opts, &peer, None).unwrap();
    upload(&s, &cfg, 200_000).await;
    assert!(h.decision.from_history && !h.fell_back());
}

/// Careful resume (decision H9) on real connections: the first records a capacity; the next
/// starts at the default window, confirms the RTT, jumps and validates, and finishes sooner
/// than a connection without history; a slower path (RTT × 4) gets no jump; a bottleneck that
/// cannot take the jump makes it retreat.
#[tokio::test(start_paused = true)]
async fn careful_resume_jumps_validates_and_retreats() {
    let s = setup(20);
    let careful = HistoryConfig {
        resume: Resume::Careful,
        ..config()
    };
    let store = HistoryStore::in_memory(careful, virtual_clock());
    let opts = TransportOptions::default();
    let peer = client_peer_key("localhost", sa(SERVER));
    let timed = |cfg: quinn::ClientConfig, bytes: usize| {
        let s = &s;
        async move {
            let t = tokio::time::Instant::now();
            upload(s, &cfg, bytes).await;
            t.elapsed() - Duration::from_secs(2) // upload() waits 2 s after the close
        }
    };
    let (cfg, h) = store
        .client_config(&s.base, &opts, &peer, Some(2.0))
        .unwrap();
    assert_eq!(h.decision.careful, None, "no history yet");
    let cold = timed(cfg, 1 << 20).await;
    let (cfg, _) = store
        .client_config(&s.base, &opts, &peer, Some(2.0))
        .unwrap();
    timed(cfg, 4 << 20).await;
    let e = store.get(&peer).unwrap();
    // 100 Mbit/s × 40 ms = 500 kB; slow start and a 4 MB transfer get a good part of it.
    assert!(
        e.capacity > 100_000.0 && e.capacity < 520_000.0,
        "capacity {}",
        e.capacity
    );
    assert!(
        (40_000..45_000).contains(&e.recent_rtt_us),
        "{}",
        e.recent_rtt_us
    );

    let (cfg, h) = store
        .client_config(&s.base, &opts, &peer, Some(2.0))
        .unwrap();
    let saved = h
        .decision
        .careful
        .expect("careful resume towards the capacity");
    assert_eq!(
        h.decision.window,
        cfg_default_window(&opts),
        "starts at the default window"
    );
    let warm = timed(cfg, 1 << 20).await;
    assert_eq!(h.careful_outcome(), Outcome::Validated);
    eprintln!(
        "1 MB: cold {cold:?}, careful {warm:?}, jump {} B",
        saved.capacity / 2
    );
    assert!(!h.fell_back());
    assert!(
        warm.as_secs_f64() < 0.8 * cold.as_secs_f64(),
        "1 MB with careful resume {warm:?} against {cold:?} without history (jump to {} B)",
        saved.capacity / 2
    );

    // RTT × 4: reconnaissance finds another path and keeps the default window.
    s.net
        .update_both(s.link, |l| l.delay = Duration::from_millis(80))
        .unwrap();
    let (cfg, h) = store
        .client_config(&s.base, &opts, &peer, Some(2.0))
        .unwrap();
    assert!(h.decision.careful.is_some());
    timed(cfg, 1 << 20).await;
    assert_eq!(h.careful_outcome(), Outcome::PathChanged);
    assert!(h.fell_back());

    // Back to 40 ms but at 5 Mbit/s behind a 20-packet queue: the jump is lost and retreats.
    s.net
        .update_both(s.link, |l| {
            l.delay = Duration::from_millis(20);
            l.rate_bps = Some(5_000_000);
            l.queue = qgate_aqm::DisciplineSpec::Droptail {
                packets: Some(20),
                bytes: None,
            };
        })
        .unwrap();
    // The recent RTT is now the 160 ms path's: record a 40 ms connection at the old capacity.
    store.record(
        &peer,
        200_000,
        Observed {
            capacity: e.capacity as u64,
            ..rtt(40_000)
        },
    );
    let (cfg, h) = store
        .client_config(&s.base, &opts, &peer, Some(2.0))
        .unwrap();
    assert!(h.decision.careful.is_some());
    timed(cfg, 200_000).await;
    assert_eq!(h.careful_outcome(), Outcome::Retreated);
}

/// The controller's own initial window under `opts`.
fn cfg_default_window(opts: &TransportOptions) -> u64 {
    opts.controller_factory()
        .build(std::time::Instant::now(), 1200)
        .initial_window()
}

/// RFC 9002 §6.2.2 (decision H8): a connection to a known peer starts its RTT estimate from the
/// last connection's smoothed RTT, so a lost first Initial is resent after about three RTTs
/// rather than quinn's 1 s (3 × 333 ms); paper 002's literal scheme (`seed_rtt = false`) waits
/// the full second.
#[tokio::test(start_paused = true)]
async fn a_lost_first_packet_is_resent_after_the_recorded_rtt() {
    for seed_rtt in [true, false] {
        let s = setup(20);
        let store = HistoryStore::in_memory(
            HistoryConfig {
                seed_rtt,
                ..config()
            },
            virtual_clock(),
        );
        let opts = TransportOptions::default();
        let peer = client_peer_key("localhost", sa(SERVER));
        let (cfg, _) = store.client_config(&s.base, &opts, &peer, None).unwrap();
        upload(&s, &cfg, 100_000).await;
        let srtt = store.get(&peer).unwrap().srtt_us;
        assert!((40_000..60_000).contains(&srtt), "recorded srtt {srtt} µs");

        let (cfg, h) = store.client_config(&s.base, &opts, &peer, None).unwrap();
        assert_eq!(h.decision.initial_rtt_us, if seed_rtt { srtt } else { 0 });
        // The link drops everything for the first 10 ms: the client's first Initial is lost.
        s.net.update_both(s.link, |l| l.up = false).unwrap();
        let (net, link) = (s.net.clone(), s.link);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            net.update_both(link, |l| l.up = true).unwrap();
        });
        let t0 = tokio::time::Instant::now();
        let c = connect(&s.client, &cfg, sa(SERVER), "localhost", false)
            .await
            .unwrap();
        let took = t0.elapsed();
        c.connection().close(0u32.into(), b"");
        if seed_rtt {
            // PTO = 3 × srtt ≈ 150 ms, then one round trip.
            assert!(took < Duration::from_millis(400), "seeded: {took:?}");
        } else {
            assert!(took > Duration::from_millis(900), "literal: {took:?}");
        }
    }
}

#[test]
fn store_persists_across_reopen_and_survives_a_corrupt_file() {
    let dir = tmp("persist");
    let path = dir.join("history.redb");
    let clock = qgate_transport::window_history::system_clock();
    {
        let (store, warning) = HistoryStore::open(&path, config(), clock.clone()).unwrap();
        assert!(warning.is_none());
        store.record("a@1.2.3.4:443", 100_000, rtt(30_000));
        store.record("a@1.2.3.4:443", 300_000, rtt(20_000));
        store.record("b@5.6.7.8:443", 50_000, rtt(0));
    }
    let (store, _) = HistoryStore::open(&path, config(), clock.clone()).unwrap();
    let a = store.get("a@1.2.3.4:443").unwrap();
    assert_eq!(
        (a.avg_cwnd, a.count, a.min_rtt_us, a.srtt_us),
        (200_000.0, 2, 20_000, 20_000)
    );
    assert_eq!(store.entries().len(), 2);
    assert_eq!(store.clear().unwrap(), 2);
    drop(store);
    let (store, _) = HistoryStore::open(&path, config(), clock.clone()).unwrap();
    assert!(store.entries().is_empty(), "clear persisted");
    drop(store);

    // A corrupt file: a clear warning, the file kept aside, a fresh store.
    std::fs::write(
        &path,
        b"this is not a redb database, just garbage bytes.....",
    )
    .unwrap();
    let (store, warning) = HistoryStore::open(&path, config(), clock).unwrap();
    let w = warning.expect("a warning");
    assert!(
        w.contains("was unreadable") && w.contains(".corrupt-"),
        "{w}"
    );
    assert!(store.entries().is_empty());
    let aside: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1);
    store.record("c", 1, rtt(0));
    assert!(store.get("c").is_some());
}

/// Paper 002's second recording point: when a 0-RTT resumption completes its handshake.
#[tokio::test(start_paused = true)]
async fn zero_rtt_handshake_completion_is_recorded() {
    let s = setup(20);
    let store = HistoryStore::in_memory(config(), virtual_clock());
    let opts = TransportOptions::default();
    let peer = client_peer_key("localhost", sa(SERVER));
    let (cfg, _) = store.client_config(&s.base, &opts, &peer, None).unwrap();
    upload(&s, &cfg, 1 << 20).await; // also caches a session ticket
    assert_eq!(store.get(&peer).unwrap().count, 1);

    let (cfg, _) = store.client_config(&s.base, &opts, &peer, None).unwrap();
    let c = connect(&s.client, &cfg, sa(SERVER), "localhost", true)
        .await
        .unwrap();
    let qgate_transport::Connected::ZeroRtt { conn, accepted } = c else {
        panic!("a ticket was cached, so this must be 0-RTT");
    };
    assert!(
        accepted.await,
        "handshake completed with early data accepted"
    );
    let e = qgate_transport::window_history::record_now(&store, &peer, &conn);
    assert_eq!(e.count, 2, "recorded at 0-RTT handshake completion");
    conn.close(0u32.into(), b"");
}

/// A store file cut short (a torn write at the file level): opening it never panics; either the
/// last committed state is there or the file is set aside with a warning and a fresh store
/// starts.
#[test]
fn truncated_store_opens_cleanly() {
    let dir = tmp("torn");
    let path = dir.join("history.redb");
    let clock = qgate_transport::window_history::system_clock();
    {
        let (store, _) = HistoryStore::open(&path, config(), clock.clone()).unwrap();
        for i in 0..200 {
            store.record(&format!("peer{i}"), 50_000 + i, rtt(10_000));
        }
    }
    let len = std::fs::metadata(&path).unwrap().len();
    for cut in [len / 2, len / 3, 4096.min(len - 1)] {
        let bytes = std::fs::read(&path).unwrap_or_default();
        let torn = dir.join(format!("torn-{cut}.redb"));
        std::fs::write(&torn, &bytes[..cut as usize]).unwrap();
        let (store, warning) = HistoryStore::open(&torn, config(), clock.clone()).unwrap();
        let n = store.entries().len();
        assert!(
            n == 200 || (n == 0 && warning.is_some()),
            "cut at {cut}: {n} entries, warning {warning:?}"
        );
        store.record("after", 1, rtt(0));
        assert!(store.get("after").is_some());
    }
}

/// A store another holder has open is reported as in use, and never moved aside.
#[test]
fn a_store_in_use_is_an_error_not_corruption() {
    let dir = tmp("inuse");
    let path = dir.join("history.redb");
    let clock = qgate_transport::window_history::system_clock();
    let (first, _) = HistoryStore::open(&path, config(), clock.clone()).unwrap();
    first.record("keep", 100_000, rtt(1_000));
    let e = HistoryStore::open(&path, config(), clock)
        .unwrap_err()
        .to_string();
    assert!(e.contains("is in use by another process"), "{e}");
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        vec!["history.redb".to_string()],
        "nothing moved aside"
    );
    assert!(first.get("keep").is_some());
}
