//! `qgate lab history`: paper 002's experiment. A client downloads from a server through a
//! router, run after run, each run a new 1-RTT connection; the server's initial congestion
//! window comes from the history of earlier connections (or not, for the default scheme).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use qgate_core::history::{Averaging, HistoryConfig};
use qgate_netsim::{Direction, LinkParams, LossModel, Network};
use qgate_transport::history::{server_peer_key, Clock, HistoryStore, DEFAULT_SAFEGUARD_FACTOR};
use qgate_transport::{
    client_config, connect, endpoint, server_config, DevPki, Socket, TransportOptions,
};
use tokio::sync::mpsc;
use tokio::time::Instant;

pub(crate) const ALPN: &[u8] = b"qgate-history";

/// A network condition of paper 002 Table 1.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NetCondition {
    /// Name.
    pub name: &'static str,
    /// Round-trip propagation time.
    pub rtt_ms: u64,
    /// Random loss on the data (server → client) direction.
    pub loss: f64,
}

/// Good: 38 ms, 1 %.
pub const GOOD: NetCondition = NetCondition {
    name: "good",
    rtt_ms: 38,
    loss: 0.01,
};
/// Average: 50 ms, 2 %.
pub const AVERAGE: NetCondition = NetCondition {
    name: "average",
    rtt_ms: 50,
    loss: 0.02,
};
/// Bad: 188 ms, 8 %.
pub const BAD: NetCondition = NetCondition {
    name: "bad",
    rtt_ms: 188,
    loss: 0.08,
};

/// How the server picks a connection's initial window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// quinn's default initial window.
    Default,
    /// History, arithmetic mean.
    Mean,
    /// History, EWMA (weight 0.25).
    Ewma,
}

impl Scheme {
    /// Its name in results.
    pub fn name(self) -> &'static str {
        match self {
            Scheme::Default => "default",
            Scheme::Mean => "history-mean",
            Scheme::Ewma => "history-ewma",
        }
    }
}

/// One series: a fresh network and store, `runs` sequential downloads.
#[derive(Debug, Clone)]
pub struct Series {
    /// Which experiment it belongs to: "simple", "dumbbell" or "change".
    pub experiment: &'static str,
    /// The network condition (before any change).
    pub net: NetCondition,
    /// Bytes per download.
    pub bytes: u64,
    /// Initial-window scheme.
    pub scheme: Scheme,
    /// Competing bulk downloads on the same bottleneck.
    pub background: usize,
    /// Downloads.
    pub runs: usize,
    /// Switch the network to this condition before run `.1`.
    pub change: Option<(NetCondition, usize)>,
    /// Careful-resume safeguard on.
    pub safeguard: bool,
    /// Seed.
    pub seed: u64,
}

impl Series {
    /// A label for progress and tables.
    pub fn label(&self) -> String {
        let mut s = format!(
            "{} {} {} {}",
            self.experiment,
            self.net.name,
            human(self.bytes),
            self.scheme.name()
        );
        if self.background > 0 {
            s.push_str(&format!(" +{} bg", self.background));
        }
        if let Some((to, at)) = self.change {
            s.push_str(&format!(
                " → {} at run {}{}",
                to.name,
                at + 1,
                if self.safeguard { " (safeguard)" } else { "" }
            ));
        }
        s
    }
}

/// 1 MB / 10 MB style size names.
pub fn human(bytes: u64) -> String {
    if bytes.is_multiple_of(1_000_000) {
        format!("{}MB", bytes / 1_000_000)
    } else {
        format!("{}kB", bytes / 1000)
    }
}

/// One download.
#[derive(Debug, Clone)]
pub struct Run {
    /// Run index (0 = first, no history yet).
    pub run: usize,
    /// The network condition during this run.
    pub net: &'static str,
    /// Connection start → last byte received, seconds.
    pub latency_s: f64,
    /// Packets the server declared lost ÷ packets it sent on this connection.
    pub loss_ratio: f64,
    /// Initial congestion window the server started with, bytes.
    pub initial_window: u64,
    /// Whether it came from the history.
    pub from_history: bool,
    /// Whether the safeguard dropped it back to the default.
    pub fell_back: bool,
}

fn ip(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

fn bottleneck(n: &NetCondition) -> LinkParams {
    // The router–server hop carries all but 1 ms of each one-way delay.
    let one_way = Duration::from_millis(n.rtt_ms) / 2 - Duration::from_millis(1);
    LinkParams::new(100_000_000, one_way)
}

/// An in-memory history store averaging with `averaging` (none: no history) whose timestamps
/// follow the tokio clock, so entries age in simulated time.
pub(crate) fn virtual_store(averaging: Option<Averaging>) -> Option<Arc<HistoryStore>> {
    let start = Instant::now();
    let clock: Clock = Arc::new(move || 1_700_000_000_000 + start.elapsed().as_millis() as u64);
    averaging.map(|averaging| {
        HistoryStore::in_memory(
            HistoryConfig {
                averaging,
                ..Default::default()
            },
            clock,
        )
    })
}

/// The server's view of one download.
pub(crate) struct Outcome {
    pub(crate) loss_ratio: f64,
    pub(crate) initial_window: u64,
    pub(crate) from_history: bool,
    pub(crate) fell_back: bool,
}

/// Run one series in virtual time on this thread.
pub fn run_series(s: &Series) -> Vec<Run> {
    crate::virtual_time(simulate(s.clone()))
}

async fn simulate(s: Series) -> Vec<Run> {
    let net = Network::new(s.seed);
    let router = net.add_host("router");
    net.set_forwarding(router, true);
    let server = net.add_host("server");
    let r0 = net.add_interface(router, ip(10, 0, 0, 1)).expect("address");
    let s0 = net.add_interface(server, ip(10, 0, 0, 2)).expect("address");
    let data_dir = |n: &NetCondition| bottleneck(n).with_loss(LossModel::Bernoulli { p: n.loss });
    // a = router, b = server: the data (server → client) direction is BtoA.
    let link = net
        .connect(r0, s0, bottleneck(&s.net), data_dir(&s.net))
        .expect("link");

    let pki = DevPki::generate(&[]).expect("PKI");
    let opts = TransportOptions::default();
    let base = server_config(&pki.server, &[ALPN], &opts).expect("server config");
    let store = virtual_store(match s.scheme {
        Scheme::Default => None,
        Scheme::Mean => Some(Averaging::Mean),
        Scheme::Ewma => Some(HistoryConfig::default().averaging),
    });
    let safeguard = s.safeguard.then_some(DEFAULT_SAFEGUARD_FACTOR);
    let server_addr = SocketAddr::new(ip(10, 0, 0, 2), 443);
    let ep = endpoint(
        Socket::from(net.bind(server, server_addr).expect("port")),
        Some(base.clone()),
        Some(s.seed),
    )
    .expect("endpoint");
    let (tx, mut rx) = mpsc::channel::<(SocketAddr, Outcome)>(16);
    let server_task = tokio::spawn(serve(ep, base, opts.clone(), store, safeguard, tx));

    let ccfg = client_config(&pki.trust(), &[ALPN], &opts).expect("client config");
    let mut clients = Vec::new();
    for i in 0..=s.background {
        let h = net.add_host(&format!("client{i}"));
        let ci = net
            .add_interface(h, ip(10, 1, i as u8, 1))
            .expect("address");
        let ri = net
            .add_interface(router, ip(10, 1, i as u8, 2))
            .expect("address");
        net.connect_symmetric(
            ci,
            ri,
            LinkParams::new(100_000_000, Duration::from_millis(1)),
        )
        .expect("link");
        let sock = net
            .bind(h, SocketAddr::new(ip(10, 1, i as u8, 1), 0))
            .expect("port");
        clients.push(
            endpoint(Socket::from(sock), None, Some(s.seed * 100 + i as u64 + 1))
                .expect("endpoint"),
        );
    }
    // Background flows: endless downloads, started before the measured runs.
    let mut bg = Vec::new();
    for c in clients.iter().skip(1) {
        let (c, ccfg) = (c.clone(), ccfg.clone());
        bg.push(tokio::spawn(async move {
            let Ok(conn) = connect(&c, &ccfg, server_addr, "localhost", false).await else {
                return;
            };
            let Ok((mut send, mut recv)) = conn.connection().open_bi().await else {
                return;
            };
            let _ = send.write_all(&0u64.to_be_bytes()).await;
            let _ = send.finish();
            while let Ok(Some(_)) = recv.read_chunk(1 << 20, false).await {}
        }));
    }
    if s.background > 0 {
        tokio::time::sleep(Duration::from_secs(3)).await; // let them reach steady state
    }

    let mut runs = Vec::with_capacity(s.runs);
    let mut current = s.net;
    for run in 0..s.runs {
        if let Some((to, at)) = s.change {
            if run == at {
                net.set_params(link, Direction::AtoB, bottleneck(&to))
                    .expect("valid");
                net.set_params(link, Direction::BtoA, data_dir(&to))
                    .expect("valid");
                current = to;
            }
        }
        let t0 = Instant::now();
        let Ok(c) = connect(&clients[0], &ccfg, server_addr, "localhost", false).await else {
            continue;
        };
        let conn = c.connection().clone();
        let local = clients[0].local_addr().expect("bound");
        let mut done = false;
        if let Ok((mut send, mut recv)) = conn.open_bi().await {
            let _ = send.write_all(&s.bytes.to_be_bytes()).await;
            let _ = send.finish();
            let mut got = 0u64;
            while let Ok(Some(chunk)) = recv.read_chunk(1 << 20, false).await {
                got += chunk.bytes.len() as u64;
            }
            done = got == s.bytes;
        }
        let latency_s = t0.elapsed().as_secs_f64();
        conn.close(0u32.into(), b"done");
        drop(conn);
        drop(c);
        // The server reports its side once the transfer is acknowledged.
        let outcome = loop {
            match rx.recv().await {
                Some((addr, o)) if addr.port() == local.port() && addr.ip() == ip(10, 1, 0, 1) => {
                    break Some(o)
                }
                Some(_) => continue,
                None => break None,
            }
        };
        if let (true, Some(o)) = (done, outcome) {
            runs.push(Run {
                run,
                net: current.name,
                latency_s,
                loss_ratio: o.loss_ratio,
                initial_window: o.initial_window,
                from_history: o.from_history,
                fell_back: o.fell_back,
            });
        }
        // Let the closed connection drain so its window is recorded before the next run.
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }
    for b in bg {
        b.abort();
    }
    server_task.abort();
    runs
}

/// Serve downloads on `ep`: a request is the byte count (8 bytes, big endian; 0 = endless);
/// each finished download's outcome goes to `tx` with the client's address.
pub(crate) async fn serve(
    ep: quinn::Endpoint,
    base: quinn::ServerConfig,
    opts: TransportOptions,
    store: Option<Arc<HistoryStore>>,
    safeguard: Option<f64>,
    tx: mpsc::Sender<(SocketAddr, Outcome)>,
) {
    while let Some(incoming) = ep.accept().await {
        let peer = incoming.remote_address();
        let (connecting, hist) = match &store {
            Some(store) => {
                let (cfg, h) = store
                    .server_config(&base, &opts, &server_peer_key(peer), safeguard)
                    .expect("valid options");
                (incoming.accept_with(cfg), Some(h))
            }
            None => (incoming.accept(), None),
        };
        let tx = tx.clone();
        tokio::spawn(async move {
            let Ok(connecting) = connecting else { return };
            let Ok(conn) = connecting.await else { return };
            let initial_window = conn.congestion_state().initial_window();
            let Ok((mut send, mut recv)) = conn.accept_bi().await else {
                return;
            };
            let mut req = [0u8; 8];
            if recv.read_exact(&mut req).await.is_err() {
                return;
            }
            let want = u64::from_be_bytes(req);
            let chunk = Bytes::from(vec![0x17u8; 64 * 1024]);
            if want == 0 {
                // Background flow: send until the connection goes away.
                while send.write_chunk(chunk.clone()).await.is_ok() {}
                return;
            }
            let mut left = want;
            while left > 0 {
                let n = left.min(chunk.len() as u64) as usize;
                if send.write_chunk(chunk.slice(..n)).await.is_err() {
                    return;
                }
                left -= n as u64;
            }
            let _ = send.finish();
            let _ = send.stopped().await;
            let st = conn.stats().path;
            let outcome = Outcome {
                loss_ratio: st.lost_packets as f64 / st.sent_packets.max(1) as f64,
                initial_window,
                from_history: hist.as_ref().is_some_and(|h| h.decision.from_history),
                fell_back: hist.as_ref().is_some_and(|h| h.fell_back()),
            };
            let _ = tx.send((peer, outcome)).await;
        });
    }
}

/// The experiment's series. `quick`: 5 runs, 1 MB only, fewer variants.
pub fn plan(runs: usize, quick: bool) -> Vec<Series> {
    let mut v = Vec::new();
    let schemes = [Scheme::Default, Scheme::Mean, Scheme::Ewma];
    let sizes: &[u64] = if quick {
        &[1_000_000]
    } else {
        &[1_000_000, 10_000_000]
    };
    let nets: &[NetCondition] = if quick {
        &[GOOD, BAD]
    } else {
        &[GOOD, AVERAGE, BAD]
    };
    // Every scheme at one point shares a seed: the same random losses hit each (a paired
    // comparison), so differences come from the initial window, not from luck.
    let seed_of = |s: &Series| {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in format!(
            "{}|{}|{}|{}|{:?}",
            s.experiment,
            s.net.name,
            s.bytes,
            s.background,
            s.change.map(|c| c.1)
        )
        .bytes()
        {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        h % 1_000_000 + 1
    };
    let add = |v: &mut Vec<Series>, s: Series| {
        let seed = seed_of(&s);
        v.push(Series { seed, ..s });
    };
    for net in nets {
        for &bytes in sizes {
            for scheme in schemes {
                add(
                    &mut v,
                    Series {
                        experiment: "simple",
                        net: *net,
                        bytes,
                        scheme,
                        background: 0,
                        runs,
                        change: None,
                        safeguard: false,
                        seed: 0,
                    },
                );
            }
        }
    }
    let bgs: &[usize] = if quick { &[1] } else { &[1, 2, 3, 4] };
    for net in [GOOD, AVERAGE].iter().take(if quick { 1 } else { 2 }) {
        for &background in bgs {
            for scheme in schemes {
                add(
                    &mut v,
                    Series {
                        experiment: "dumbbell",
                        net: *net,
                        bytes: 1_000_000,
                        scheme,
                        background,
                        runs,
                        change: None,
                        safeguard: false,
                        seed: 0,
                    },
                );
            }
        }
    }
    // Good → bad: history built on the good network for the first half, then the network turns.
    let half = runs / 2;
    for (scheme, safeguard) in [
        (Scheme::Default, false),
        (Scheme::Ewma, false),
        (Scheme::Ewma, true),
    ] {
        add(
            &mut v,
            Series {
                experiment: "change",
                net: GOOD,
                bytes: 1_000_000,
                scheme,
                background: 0,
                runs,
                change: Some((BAD, half)),
                safeguard,
                seed: 0,
            },
        );
    }
    v
}

/// Run every series, two at a time; `progress(label)` after each.
pub fn run_all(series: &[Series], progress: impl Fn(&str) + Sync) -> Vec<Vec<Run>> {
    crate::pool::run_each(series, crate::pool::default_jobs(), run_series, |s| {
        progress(&s.label())
    })
}
