//! System benchmarks: how fast the simulator runs, and what qgate-transport costs over plain
//! quinn on real loopback UDP. Each reports mean ± std over repeats; comparisons are ratios
//! measured in the same run, alternating the two sides so machine noise hits both alike.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use qgate_netsim::{LinkParams, Network};
use qgate_transport::{
    client_config, connect, endpoint, server_config, DevPki, Socket, TransportOptions,
};

use crate::stats::Summary;

const ALPN: &[u8] = b"qgate-bench";

/// Simulator-speed benchmark settings.
#[derive(Debug, Clone)]
pub struct SimSpeedConfig {
    /// Virtual seconds of bulk transfer per repeat.
    pub virtual_secs: f64,
    /// Link rate, bit/s.
    pub rate_bps: u64,
    /// One-way delay.
    pub delay: Duration,
    /// Repeats.
    pub repeats: usize,
}

impl Default for SimSpeedConfig {
    fn default() -> Self {
        SimSpeedConfig {
            virtual_secs: 60.0,
            rate_bps: 10_000_000,
            delay: Duration::from_millis(25),
            repeats: 5,
        }
    }
}

/// Simulator-speed results.
#[derive(Debug, Clone)]
pub struct SimSpeedReport {
    /// The settings.
    pub config: SimSpeedConfig,
    /// Virtual seconds simulated per wall-clock second.
    pub speedup: Summary,
    /// Wall-clock seconds per repeat.
    pub wall_secs: Summary,
    /// Goodput of the simulated flow, Mbit/s.
    pub goodput_mbps: Summary,
}

/// One bulk QUIC flow through a netsim link for `virtual_secs`; returns (wall s, goodput Mbit/s).
fn sim_once(cfg: &SimSpeedConfig, seed: u64) -> (f64, f64) {
    let wall = std::time::Instant::now();
    let bytes = crate::virtual_time(async {
        let net = Network::new(seed);
        let (c, s) = (net.add_host("client"), net.add_host("server"));
        let ic = net.add_interface(c, "10.0.0.1".parse().unwrap()).unwrap();
        let is = net.add_interface(s, "10.0.0.2".parse().unwrap()).unwrap();
        net.connect_symmetric(ic, is, LinkParams::new(cfg.rate_bps, cfg.delay))
            .unwrap();
        let server_addr: SocketAddr = "10.0.0.2:443".parse().unwrap();
        let (server, client, ccfg) = endpoints(
            Socket::from(net.bind(s, server_addr).unwrap()),
            Socket::from(net.bind(c, "10.0.0.1:0".parse().unwrap()).unwrap()),
            Some(seed),
        );
        let received = Arc::new(std::sync::atomic::AtomicU64::new(0));
        tokio::spawn(sink(server, received.clone()));
        let conn = connect(&client, &ccfg, server_addr, "localhost", false)
            .await
            .unwrap();
        let conn = conn.connection().clone();
        let writer = tokio::spawn(async move {
            let mut st = conn.open_uni().await.unwrap();
            let chunk = Bytes::from(vec![0u8; 64 * 1024]);
            loop {
                if st.write_chunk(chunk.clone()).await.is_err() {
                    break;
                }
            }
        });
        tokio::time::sleep(Duration::from_secs_f64(cfg.virtual_secs)).await;
        writer.abort();
        received.load(std::sync::atomic::Ordering::Relaxed)
    });
    let wall = wall.elapsed().as_secs_f64();
    (wall, bytes as f64 * 8.0 / cfg.virtual_secs / 1e6)
}

/// Run the simulator-speed benchmark; `progress(i)` is called after repeat i.
pub fn sim_speed(cfg: SimSpeedConfig, mut progress: impl FnMut(usize)) -> SimSpeedReport {
    let (mut speed, mut walls, mut goodput) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..cfg.repeats {
        let (wall, mbps) = sim_once(&cfg, 1 + i as u64);
        speed.push(cfg.virtual_secs / wall);
        walls.push(wall);
        goodput.push(mbps);
        progress(i + 1);
    }
    SimSpeedReport {
        speedup: Summary::of(&speed),
        wall_secs: Summary::of(&walls),
        goodput_mbps: Summary::of(&goodput),
        config: cfg,
    }
}

/// Loopback-throughput benchmark settings.
#[derive(Debug, Clone)]
pub struct LoopbackConfig {
    /// Bytes per transfer.
    pub bytes: u64,
    /// Transfers per side.
    pub repeats: usize,
}

impl Default for LoopbackConfig {
    fn default() -> Self {
        LoopbackConfig {
            bytes: 256 * 1024 * 1024,
            repeats: 5,
        }
    }
}

/// Loopback-throughput results.
#[derive(Debug, Clone)]
pub struct LoopbackReport {
    /// The settings.
    pub config: LoopbackConfig,
    /// qgate-transport endpoints, Gbit/s.
    pub qgate_gbps: Summary,
    /// Plain quinn endpoints with quinn's defaults, Gbit/s.
    pub quinn_gbps: Summary,
}

impl LoopbackReport {
    /// qgate mean / quinn mean.
    pub fn ratio(&self) -> f64 {
        self.qgate_gbps.mean / self.quinn_gbps.mean
    }
}

/// Server and client endpoints through qgate-transport with a fresh development PKI.
fn endpoints(
    server: Socket,
    client: Socket,
    seed: Option<u64>,
) -> (quinn::Endpoint, quinn::Endpoint, quinn::ClientConfig) {
    let pki = DevPki::generate(&[]).expect("dev PKI");
    let opts = TransportOptions::default();
    let scfg = server_config(&pki.server, &[ALPN], &opts).expect("server config");
    let server = endpoint(server, Some(scfg), seed).expect("server endpoint");
    let client = endpoint(client, None, seed.map(|s| s + 1)).expect("client endpoint");
    let ccfg = client_config(&pki.trust(), &[ALPN], &opts).expect("client config");
    (server, client, ccfg)
}

/// Plain quinn endpoints: quinn's own config constructors and defaults, nothing of ours.
fn plain_quinn_endpoints() -> (quinn::Endpoint, quinn::Endpoint, quinn::ClientConfig) {
    let pki = DevPki::generate(&[]).expect("dev PKI");
    let scfg =
        quinn::ServerConfig::with_single_cert(pki.server.chain.clone(), pki.server.key.clone_key())
            .expect("server config");
    let server = quinn::Endpoint::server(scfg, "127.0.0.1:0".parse().unwrap()).expect("bind");
    let client = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).expect("bind");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca.clone()).expect("CA");
    let ccfg = quinn::ClientConfig::with_root_certificates(Arc::new(roots)).expect("client config");
    (server, client, ccfg)
}

/// Accept connections and count every byte of every uni stream into `received`.
async fn sink(server: quinn::Endpoint, received: Arc<std::sync::atomic::AtomicU64>) {
    while let Some(incoming) = server.accept().await {
        let received = received.clone();
        tokio::spawn(async move {
            let Ok(conn) = incoming.await else { return };
            while let Ok(mut rx) = conn.accept_uni().await {
                let received = received.clone();
                tokio::spawn(async move {
                    while let Ok(Some(c)) = rx.read_chunk(1 << 20, false).await {
                        received
                            .fetch_add(c.bytes.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    }
                });
            }
        });
    }
}

/// Send `bytes` on one stream from client to server; Gbit/s from stream open to the last byte
/// acknowledged (`stopped` resolves once the peer has read everything).
async fn transfer(
    server: quinn::Endpoint,
    client: quinn::Endpoint,
    ccfg: quinn::ClientConfig,
    bytes: u64,
) -> f64 {
    let addr = server.local_addr().unwrap();
    let received = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sink_task = tokio::spawn(sink(server.clone(), received.clone()));
    let conn = client
        .connect_with(ccfg, addr, "localhost")
        .unwrap()
        .await
        .unwrap();
    let t = std::time::Instant::now();
    let mut st = conn.open_uni().await.unwrap();
    let chunk = Bytes::from(vec![0u8; 1 << 20]);
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        st.write_chunk(chunk.slice(..n)).await.unwrap();
        left -= n as u64;
    }
    st.finish().unwrap();
    while received.load(std::sync::atomic::Ordering::Relaxed) < bytes {
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let secs = t.elapsed().as_secs_f64();
    conn.close(0u32.into(), b"");
    server.close(0u32.into(), b"");
    sink_task.abort();
    bytes as f64 * 8.0 / secs / 1e9
}

/// Run the loopback benchmark, alternating qgate and plain quinn; `progress(i)` after each pair.
pub fn loopback(cfg: LoopbackConfig, mut progress: impl FnMut(usize)) -> LoopbackReport {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for i in 0..cfg.repeats {
        ours.push(rt.block_on(async {
            let (s, c, cc) = endpoints(
                Socket::bind_udp("127.0.0.1:0".parse().unwrap()).unwrap(),
                Socket::bind_udp("127.0.0.1:0".parse().unwrap()).unwrap(),
                None,
            );
            transfer(s, c, cc, cfg.bytes).await
        }));
        theirs.push(rt.block_on(async {
            let (s, c, cc) = plain_quinn_endpoints();
            transfer(s, c, cc, cfg.bytes).await
        }));
        progress(i + 1);
    }
    LoopbackReport {
        qgate_gbps: Summary::of(&ours),
        quinn_gbps: Summary::of(&theirs),
        config: cfg,
    }
}
