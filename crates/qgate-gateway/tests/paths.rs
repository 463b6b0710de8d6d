//! The path manager over three simulated backhaul paths: RTTs measured, a dead path detected
//! within a few RTTs (not after the 30 s probe interval), and its recovery found.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use qgate_forward::forwarder::{Forwarder, Step};
use qgate_forward::path::{PathConfig, PathId};
use qgate_forward::scheduler::{Priority, Scheduler, Single};
use qgate_gateway::paths::{Backhaul, PathManager};
use qgate_netsim::{LinkParams, Network};
use qgate_transport::http3::ALPN_H3;
use qgate_transport::{client_config, DevPki, Socket, TransportOptions};

/// A forwarding core for `n` paths with the gateway's defaults and `scheduler`.
fn core(n: usize, scheduler: Box<dyn Scheduler>) -> Forwarder {
    let cfg =
        qgate_gateway::gateway::GatewayConfig::default().forwarder_config(PathConfig::default());
    let now = tokio::time::Instant::now().into_std();
    Forwarder::new(n, cfg, scheduler, [1; 32], now)
}

/// A gateway and a server joined by one 100 Mbit/s link per one-way delay (path i, from 1, on
/// 10.0.i.0/24), the server answering on each with `opts`.
struct Backhauls {
    net: Network,
    gateway: qgate_netsim::HostId,
    links: Vec<qgate_netsim::LinkId>,
    pki: DevPki,
    _server: qgate_server::RunningServer,
}

fn backhauls(seed: u64, one_way_ms: &[u64], opts: &TransportOptions) -> Backhauls {
    let net = Network::new(seed);
    let (g, s) = (net.add_host("gateway"), net.add_host("server"));
    let pki = DevPki::generate(&[]).unwrap();
    let mut links = Vec::new();
    for (i, ms) in (1u8..).zip(one_way_ms) {
        let gi = net
            .add_interface(g, format!("10.0.{i}.1").parse().unwrap())
            .unwrap();
        let si = net
            .add_interface(s, format!("10.0.{i}.2").parse().unwrap())
            .unwrap();
        let one_way = Duration::from_millis(*ms);
        links.push(
            net.connect_symmetric(gi, si, LinkParams::new(100_000_000, one_way))
                .unwrap(),
        );
    }
    let server = qgate_server::Server::builder()
        .socket(Socket::from(
            net.bind(s, "0.0.0.0:443".parse().unwrap()).unwrap(),
        ))
        .identity(&pki.server)
        .transport(opts.clone())
        .seed(1)
        .start()
        .unwrap();
    Backhauls {
        net,
        gateway: g,
        links,
        pki,
        _server: server,
    }
}

impl Backhauls {
    /// Path `i`'s backhaul, its endpoint seeded with `seed`.
    fn path(&self, i: u8, seed: u64) -> Backhaul {
        let local: SocketAddr = format!("10.0.{i}.1:0").parse().unwrap();
        Backhaul::new(
            Socket::from(self.net.bind(self.gateway, local).unwrap()),
            format!("10.0.{i}.2:443").parse().unwrap(),
            "localhost",
            Some(seed),
        )
        .unwrap()
    }
}

/// An in-memory history store on the tokio clock.
fn virtual_store() -> Arc<qgate_transport::window_history::HistoryStore> {
    let start = tokio::time::Instant::now();
    qgate_transport::window_history::HistoryStore::in_memory(
        qgate_history::HistoryConfig::default(),
        Arc::new(move || 1_700_000_000_000 + start.elapsed().as_millis() as u64),
    )
}

#[tokio::test(start_paused = true)]
async fn measures_detects_death_and_recovery() {
    let opts = TransportOptions {
        keep_alive_ms: Some(1000),
        ..Default::default()
    };
    let w = backhauls(1, &[10, 20, 30], &opts);
    let (net, links, pki) = (&w.net, &w.links, &w.pki);
    let paths = (1..=3u8).map(|i| w.path(i, i as u64)).collect();
    let cfg = client_config(&pki.trust(), &[ALPN_H3], &opts).unwrap();
    // Requests go to path 2 (index 1), to show its death.
    let pm = PathManager::start(paths, cfg, core(3, Box::new(Single { path: PathId(1) })));

    tokio::time::sleep(Duration::from_secs(2)).await;
    let t = pm.table();
    for (i, p) in t.paths().iter().enumerate() {
        let rtt = p.rtt.expect("measured").as_secs_f64() * 1000.0;
        let want = 20.0 * (i + 1) as f64;
        assert!(
            p.up && (rtt - want).abs() < 3.0,
            "path {i}: up {} rtt {rtt} ms",
            p.up
        );
    }

    // Path 2 (index 1) goes dark; traffic on it is not answered.
    net.update_both(links[1], |l| l.up = false).unwrap();
    let step = pm.with_core(|f| {
        let now = tokio::time::Instant::now().into_std();
        let device = SocketAddr::from(([10, 9, 9, 9], 9));
        let h = f.register(1, device, Priority::Priority, now).unwrap();
        f.begin(&h, 1, 1000, now).unwrap().2
    });
    assert!(
        matches!(&step, Step::Send(a) if a.path == PathId(1)),
        "{step:?}"
    );
    let died = tokio::time::Instant::now();
    while pm.table().get(PathId(1)).unwrap().up {
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            died.elapsed() < Duration::from_secs(3),
            "not detected after {:?}",
            died.elapsed()
        );
    }
    let detected = died.elapsed();
    assert!(
        detected < Duration::from_millis(700),
        "detected after {detected:?}"
    );
    assert!(pm.table().get(PathId(0)).unwrap().up && pm.table().get(PathId(2)).unwrap().up);

    // It comes back: probing finds it.
    net.update_both(links[1], |l| l.up = true).unwrap();
    let back = tokio::time::Instant::now();
    while !pm.table().get(PathId(1)).unwrap().up {
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            back.elapsed() < Duration::from_secs(10),
            "recovery not found"
        );
    }
    assert!(pm.connection(PathId(1)).is_some());
}

#[tokio::test(start_paused = true)]
async fn backhaul_connections_record_and_reuse_their_window_history() {
    use qgate_gateway::paths::BackhaulHistory;

    let opts = TransportOptions {
        keep_alive_ms: Some(1000),
        idle_timeout_ms: 5000,
        ..Default::default()
    };
    let w = backhauls(2, &[10], &opts);
    let (net, link, pki) = (&w.net, w.links[0], &w.pki);
    let store = virtual_store();
    let path = w.path(1, 3);
    let cfg = client_config(&pki.trust(), &[ALPN_H3], &opts).unwrap();
    let history = BackhaulHistory {
        store: store.clone(),
        safeguard: Some(2.0),
    };
    let pm = PathManager::start_with_history(
        vec![path],
        cfg,
        opts.clone(),
        core(1, Box::new(Single { path: PathId(0) })),
        Some(history),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(pm.connection(PathId(0)).is_some());
    let key = "localhost@10.0.1.2:443 via 10.0.1.1";
    assert!(
        store.get(key).is_none(),
        "nothing recorded while the connection lives"
    );

    // The path dies; the connection idles out and its window is recorded under the path's key.
    net.update_both(link, |l| l.up = false).unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let e = store
        .get(key)
        .expect("recorded when the backhaul connection ended");
    assert_eq!(e.count, 1);
    // It comes back: the new connection is configured from the history (recorded again at its end).
    net.update_both(link, |l| l.up = true).unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(pm.connection(PathId(0)).is_some(), "reconnected");
}

/// Two paths, path 1 with BBR of its own, path 2 on the transport's CUBIC, with or without
/// window history: whether each path's live connection runs BBR.
async fn bbr_per_path(history: bool) -> [bool; 2] {
    use qgate_transport::Congestion;
    let opts = TransportOptions::default();
    let w = backhauls(1, &[5, 5], &opts);
    let pki = &w.pki;
    let mut paths = Vec::new();
    for (i, congestion) in [(1u8, Some(Congestion::Bbr)), (2, None)] {
        let mut p = w.path(i, i as u64);
        p.congestion = congestion;
        paths.push(p);
    }
    let cfg = client_config(&pki.trust(), &[ALPN_H3], &opts).unwrap();
    let history = history.then(|| qgate_gateway::paths::BackhaulHistory {
        store: virtual_store(),
        safeguard: Some(2.0),
    });
    let pm = PathManager::start_with_history(
        paths,
        cfg,
        opts,
        core(2, qgate_forward::scheduler::by_name("completion").unwrap()),
        history,
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    // BBR reports a pacing rate, CUBIC a slow-start threshold (through any wrapper).
    [0, 1].map(|k| {
        let m = pm
            .connection(PathId(k))
            .expect("connected")
            .congestion_state()
            .metrics();
        assert_ne!(m.pacing_rate.is_some(), m.ssthresh.is_some());
        m.pacing_rate.is_some()
    })
}

#[tokio::test(start_paused = true)]
async fn a_path_runs_its_own_congestion_controller() {
    assert_eq!(bbr_per_path(false).await, [true, false]);
}

#[tokio::test(start_paused = true)]
async fn a_path_runs_its_own_congestion_controller_with_history() {
    assert_eq!(bbr_per_path(true).await, [true, false]);
}

/// Decision G21: a path with three connections keeps three, leases each request to the one
/// with the fewest out, stays up while any lives, and reconnects a lost one with its probes.
#[tokio::test(start_paused = true)]
async fn a_path_with_several_connections_spreads_requests_and_outlives_one_of_them() {
    let opts = TransportOptions {
        keep_alive_ms: Some(1000),
        ..Default::default()
    };
    let w = backhauls(3, &[10], &opts);
    let mut path = w.path(1, 1);
    path.connections = 3;
    let cfg = client_config(&w.pki.trust(), &[ALPN_H3], &opts).unwrap();
    let pm = PathManager::start(
        vec![path],
        cfg,
        core(1, Box::new(Single { path: PathId(0) })),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let p = PathId(0);
    assert_eq!((pm.lanes(p), pm.live_connections(p)), (3, 3));

    // Three requests out take three different connections; a fourth shares the least busy.
    let mut leases: Vec<_> = (0..3).map(|_| pm.lease(p).expect("a connection")).collect();
    let mut lanes: Vec<usize> = leases.iter().map(|l| l.lane()).collect();
    lanes.sort();
    assert_eq!(lanes, [0, 1, 2]);
    let ids: std::collections::HashSet<usize> =
        leases.iter().map(|l| l.connection().stable_id()).collect();
    assert_eq!(ids.len(), 3, "three distinct QUIC connections");
    let freed = leases.remove(1).lane();
    assert_eq!(pm.lease(p).unwrap().lane(), freed, "the one with none out");
    drop(leases);

    // The sample is the path as one pipe: three windows, one RTT, the packets of all three.
    let stats: Vec<_> = pm.live(p).map(|c| c.stats().path).collect();
    let s = pm.sample(p).unwrap();
    assert_eq!(s.cwnd, stats.iter().map(|x| x.cwnd).sum::<u64>());
    assert_eq!(
        s.sent_packets,
        stats.iter().map(|x| x.sent_packets).sum::<u64>()
    );
    assert!((s.rtt.as_secs_f64() - 0.020).abs() < 0.003, "{:?}", s.rtt);

    // One connection closes: the path stays up on the other two, and the next probe (30 s)
    // brings the third back.
    let lost = pm.lease(p).unwrap();
    let (lost_lane, lost_id) = (lost.lane(), lost.connection().stable_id());
    // A stable id is the connection's address: holding the lost one keeps a new connection
    // from being allocated where it was and taking its id (CI saw that once).
    let lost_conn = lost.connection().clone();
    lost_conn.close(0u32.into(), b"test");
    drop(lost);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(pm.live_connections(p), 2);
    assert!(
        pm.table().get(p).unwrap().up,
        "up while two connections live"
    );
    for _ in 0..4 {
        let l = pm.lease(p).unwrap();
        assert_ne!(l.lane(), lost_lane, "no request on the closed connection");
    }
    let before = pm.sample(p).unwrap();
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert_eq!(pm.live_connections(p), 3, "reconnected with the probes");
    let ids: std::collections::HashSet<usize> = pm.live(p).map(|c| c.stable_id()).collect();
    assert_eq!(ids.len(), 3);
    assert!(
        !ids.contains(&lost_id),
        "a new connection in the lost one's lane"
    );
    assert!(pm.live(p).all(|c| c.close_reason().is_none()));
    drop(lost_conn);
    // A new connection's packets add to the path's counters, and the lost one's stay in
    // them: they never go back.
    let after = pm.sample(p).unwrap();
    let now: u64 = pm.live(p).map(|c| c.stats().path.sent_packets).sum();
    assert!(after.sent_packets > before.sent_packets && after.sent_packets > now);

    // Every connection closes: the path is down at once, its window forgotten.
    for c in pm.live(p).collect::<Vec<_>>() {
        c.close(0u32.into(), b"test");
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = pm.table();
    let path = t.get(p).unwrap();
    assert!(
        !path.up && path.cwnd.is_none(),
        "down with its last connection"
    );
}
