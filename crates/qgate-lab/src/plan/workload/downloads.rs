//! `kind = "downloads"`: paper 002's measurement. A client downloads `bytes` from a server run
//! after run, each on a new 1-RTT connection; with history on, the server starts each
//! connection from the window history of the client's earlier ones (one store for the whole
//! run, so it carries across the timeline's phases).
//!
//! Samples (runs after the first, t = the download's start): `latency_s` (connection start →
//! last byte), `loss_ratio` (packets the server declared lost ÷ sent), `initial_window_kb`.
//! Scalars: `first_latency_s` (the run without history), `completed`, `from_history` (fraction
//! of runs whose window came from history), `fell_back` (runs the safeguard reset, or whose
//! careful resume found the path changed or retreated), `validated` and `retreated` (runs whose
//! careful resume jump was validated, or retreated from).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use qgate_history::careful_resume::Outcome as CarefulOutcome;
use qgate_history::HistoryConfig;
use qgate_netsim::World;
use qgate_transport::window_history::{server_peer_key, HistoryStore, DEFAULT_SAFEGUARD_FACTOR};
use qgate_transport::{client_config, connect, endpoint, server_config, Socket, TransportOptions};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{secs, Clock, Measurements, Setup};
use crate::plan::spec::DownloadLoad;

/// The protocol: the client asks for a byte count (8 bytes, big endian).
const ALPN: &[u8] = b"qgate-history";

/// An in-memory history store averaging with `averaging` (none: no history), in simulated time.
fn virtual_store(d: &DownloadLoad) -> Option<Arc<HistoryStore>> {
    d.history.averaging().map(|averaging| {
        super::virtual_history(HistoryConfig {
            averaging,
            seed_rtt: d.seed_rtt,
            resume: d.resume,
            ..Default::default()
        })
    })
}

/// The server's view of one download.
struct Outcome {
    loss_ratio: f64,
    initial_window: u64,
    from_history: bool,
    fell_back: bool,
    careful: CarefulOutcome,
}

/// Serve downloads on `ep`: a request is the byte count (8 bytes, big endian; 0 = endless);
/// each finished download's outcome goes to `tx` with the client's address.
async fn serve(
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
                careful: hist
                    .as_ref()
                    .map_or(CarefulOutcome::None, |h| h.careful_outcome()),
            };
            let _ = tx.send((peer, outcome)).await;
        });
    }
}

pub(super) fn check(
    d: &DownloadLoad,
    host: &dyn Fn(&str, &str) -> Result<(), String>,
) -> Result<(), String> {
    host("workloads.client", &d.client)?;
    host("workloads.server", &d.server)?;
    if d.client == d.server {
        return Err(format!(
            "workload '{}': 'client' and 'server' are the same host",
            d.name
        ));
    }
    if d.bytes == 0 || d.runs == 0 {
        return Err(format!(
            "workload '{}': 'bytes' and 'runs' must be at least 1",
            d.name
        ));
    }
    if !(0.0..=86_400.0).contains(&d.interval_s) || d.runs > 1_000_000 {
        return Err(format!(
            "workload '{}': 'interval_s' must be in [0, 86400] and 'runs' at most 1000000",
            d.name
        ));
    }
    Ok(())
}

pub(crate) struct Prepared {
    spec: DownloadLoad,
    client: quinn::Endpoint,
    ccfg: quinn::ClientConfig,
    server_addr: SocketAddr,
    outcomes: mpsc::Receiver<(SocketAddr, Outcome)>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Prepared {
    fn drop(&mut self) {
        self.server.abort();
    }
}

pub(super) fn prepare(d: &DownloadLoad, world: &mut World, s: &Setup) -> Result<Prepared, String> {
    let net = world.net.clone();
    let srv = world.host(&d.server).ok_or("no server host")?;
    let cli = world.host(&d.client).ok_or("no client host")?;
    let srv_ip = world
        .address_of(srv)
        .ok_or_else(|| format!("server '{}' has no link", d.server))?;
    let cli_ip = world
        .address_of(cli)
        .ok_or_else(|| format!("client '{}' has no link", d.client))?;
    let opts = TransportOptions::default();
    let base = server_config(&s.pki.server, &[ALPN], &opts).map_err(|e| e.to_string())?;
    let store = virtual_store(d);
    let server_addr = SocketAddr::new(srv_ip, 5443 + s.index as u16);
    let ep = endpoint(
        Socket::from(net.bind(srv, server_addr).map_err(|e| e.to_string())?),
        Some(base.clone()),
        Some(s.seed),
    )
    .map_err(|e| e.to_string())?;
    let (tx, outcomes) = mpsc::channel(16);
    let safeguard = d.safeguard.then_some(DEFAULT_SAFEGUARD_FACTOR);
    let server = tokio::spawn(serve(ep, base, opts.clone(), store, safeguard, tx));
    let client = endpoint(
        Socket::from(
            net.bind(cli, SocketAddr::new(cli_ip, 0))
                .map_err(|e| e.to_string())?,
        ),
        None,
        Some(s.seed * 100 + 1),
    )
    .map_err(|e| e.to_string())?;
    Ok(Prepared {
        spec: d.clone(),
        client,
        ccfg: client_config(&s.pki.trust(), &[ALPN], &opts).map_err(|e| e.to_string())?,
        server_addr,
        outcomes,
        server,
    })
}

impl Prepared {
    pub(super) async fn run(mut self, clock: Clock) -> Measurements {
        let d = self.spec.clone();
        let begin = clock.start + secs(d.start_s);
        let local = self.client.local_addr().expect("bound");
        let (mut latency, mut loss, mut iw) = (Vec::new(), Vec::new(), Vec::new());
        let (mut completed, mut from_history, mut fell_back) = (0usize, 0usize, 0usize);
        let (mut validated, mut retreated) = (0usize, 0usize);
        let mut first = None;
        let mut ready = begin;
        for run in 0..d.runs {
            let at = (begin + secs(d.interval_s * run as f64)).max(ready);
            if at >= clock.deadline {
                break;
            }
            tokio::time::sleep_until(at).await;
            let t = clock.t();
            let t0 = Instant::now();
            let Ok(c) = connect(
                &self.client,
                &self.ccfg,
                self.server_addr,
                "localhost",
                false,
            )
            .await
            else {
                ready = Instant::now() + Duration::from_secs(1);
                continue;
            };
            let conn = c.connection().clone();
            let mut done = false;
            if let Ok((mut send, mut recv)) = conn.open_bi().await {
                let _ = send.write_all(&d.bytes.to_be_bytes()).await;
                let _ = send.finish();
                let mut got = 0u64;
                let until = tokio::time::sleep_until(clock.deadline);
                tokio::pin!(until);
                loop {
                    // Data before the deadline due at the same instant (decision U12).
                    tokio::select! {
                        biased;
                        c = recv.read_chunk(1 << 20, false) => match c {
                            Ok(Some(chunk)) => got += chunk.bytes.len() as u64,
                            _ => break,
                        },
                        _ = &mut until => break,
                    }
                }
                done = got == d.bytes;
            }
            let latency_s = t0.elapsed().as_secs_f64();
            conn.close(0u32.into(), b"done");
            drop(conn);
            drop(c);
            if !done {
                break;
            }
            // The server reports once the transfer is acknowledged.
            let outcome = loop {
                match self.outcomes.recv().await {
                    Some((addr, o)) if addr == local => break Some(o),
                    Some(_) => continue,
                    None => break None,
                }
            };
            // Let the closed connection drain so its window is recorded before the next run.
            ready = Instant::now() + Duration::from_secs(1);
            let Some(o) = outcome else { break };
            completed += 1;
            if run == 0 {
                first = Some(latency_s);
            } else {
                latency.push((t, latency_s));
                loss.push((t, o.loss_ratio));
                iw.push((t, o.initial_window as f64 / 1000.0));
            }
            from_history += usize::from(o.from_history);
            fell_back += usize::from(o.fell_back);
            validated += usize::from(o.careful == CarefulOutcome::Validated);
            retreated += usize::from(o.careful == CarefulOutcome::Retreated);
        }
        let mut m = Measurements::default();
        if let Some(f) = first {
            m.scalars.push(("first_latency_s".into(), f));
        }
        m.scalars.push(("completed".into(), completed as f64));
        m.scalars.push((
            "from_history".into(),
            from_history as f64 / completed.max(1) as f64,
        ));
        m.scalars.push(("fell_back".into(), fell_back as f64));
        m.scalars.push(("validated".into(), validated as f64));
        m.scalars.push(("retreated".into(), retreated as f64));
        m.samples.push(("latency_s".into(), latency));
        m.samples.push(("loss_ratio".into(), loss));
        m.samples.push(("initial_window_kb".into(), iw));
        m
    }
}
