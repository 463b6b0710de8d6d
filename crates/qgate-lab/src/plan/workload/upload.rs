//! `kind = "upload"`: paper 001's measurement with the product's code. The device uploads a
//! file to the real ingest server (`Server::builder().uploads(…)`, writing to a temporary
//! directory) with `qgate_upload::Upload`, one QUIC connection per listed link; the file on
//! the server's disk is compared with the original byte for byte.
//!
//! Scalars: `completion_s` (start → the server confirmed the file), `goodput_mbps` (file bits
//! ÷ completion time), `completed` (1 when confirmed and byte-identical), `lane<i>_share`
//! (fraction of the file's bytes that lane i carried), `failed_requests`, `connects`,
//! `migrations` (moves to a backup interface), `copies` (end-game copies of another lane's
//! last chunk, decision U11), `max_stall_s` (the longest time no lane had a
//! chunk confirmed, sampled every 10 ms), `lane<i>_max_stall_s` (the same per lane, not counting
//! a lane that waits at the end of the file), `tail_s` (with several lanes: from the moment the
//! first lane had its last chunk confirmed to the server's confirmation of the file, where
//! `completion_s` ends: the time it sat idle while the others finished), `peak_in_flight_kb`
//! (the most QUIC packet bytes the device's connections had sent and not yet seen
//! acknowledged or lost at once, counted by their congestion controllers: what the sender
//! held for retransmission), `recv_peak_kb` (the most the receiver held at once, counted by
//! the allocator: decision U14), `recv_quic_peak_kb` (the same for its QUIC stack alone), `recv_body_peak_kb` (the most bytes the server's request
//! bodies held, each chunk being one request's body until it is written: its body budget,
//! sampled every 10 ms).
//! Series: `lane<i>_mbps`, each lane's confirmed goodput per second.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use qgate_chunks::{FileInfo, Layout};
use qgate_netsim::topology::Topology;
use qgate_netsim::World;
use qgate_server::{RunningServer, Server, UploadLimits, Uploads};
use qgate_tally::Account;
use qgate_transport::{Socket, TransportOptions};
use qgate_upload::{sha256, Lane, Upload};
use rand::RngCore;
use tokio::time::Instant;

use super::{rng, Clock, Measurements, Setup};
use crate::plan::spec::UploadLoad;

pub(super) fn check(
    u: &UploadLoad,
    topology: &Topology,
    host: &dyn Fn(&str, &str) -> Result<(), String>,
    link: &dyn Fn(&str, &str) -> Result<(), String>,
) -> Result<(), String> {
    let fail = |e: String| Err(format!("workload '{}': {e}", u.name));
    host("workloads.device", &u.device)?;
    host("workloads.server", &u.server)?;
    if u.device == u.server {
        return fail("'device' and 'server' are the same host".into());
    }
    if u.paths.is_empty() || u.paths.len() > qgate_chunks::MAX_LANES {
        return fail(format!(
            "'paths' must name 1 to {} of the device's links",
            qgate_chunks::MAX_LANES
        ));
    }
    for (i, p) in u.paths.iter().enumerate() {
        link("workloads.paths", p)?;
        let l = topology
            .links
            .iter()
            .find(|l| &l.name == p)
            .expect("checked");
        if l.a != u.device && l.b != u.device {
            return fail(format!(
                "path '{p}' does not end at the device '{}'",
                u.device
            ));
        }
        if u.paths[..i].contains(p) {
            return fail(format!("path '{p}' is listed twice"));
        }
    }
    if u.bytes == 0 || u.bytes > 1 << 30 {
        return fail("'bytes' must be 1 to 2^30 (the file is held in memory)".into());
    }
    Layout::new(u.bytes, u.chunk_bytes).map_err(|e| format!("workload '{}': {e}", u.name))?;
    for (key, v) in [
        ("receive_window", u.receive_window),
        ("send_window", u.send_window),
    ] {
        if v.is_some_and(|v| !(1200..=1 << 30).contains(&v)) {
            return fail(format!("'{key}' must be 1200 bytes to 1 GiB"));
        }
    }
    Ok(())
}

/// Where an upload runs: the network, the device and server hosts, the server's address
/// (port 4433 + the workload's index) and the device's address on each of its paths.
pub(super) struct Ends {
    pub(super) net: qgate_netsim::Network,
    pub(super) dev: qgate_netsim::HostId,
    pub(super) srv: qgate_netsim::HostId,
    pub(super) server_addr: SocketAddr,
    pub(super) path_ips: Vec<std::net::IpAddr>,
}

pub(super) fn ends(u: &UploadLoad, world: &World, s: &Setup) -> Result<Ends, String> {
    let dev = world.host(&u.device).ok_or("no device host")?;
    let srv = world.host(&u.server).ok_or("no server host")?;
    let srv_ip = world
        .address_toward(srv, dev)
        .ok_or_else(|| format!("no route from '{}' to '{}'", u.device, u.server))?;
    let mut path_ips = Vec::new();
    for p in &u.paths {
        let l = world.link(p).map_err(|e| e.to_string())?;
        path_ips.push(if l.a.0 == dev { l.a.1 } else { l.b.1 });
    }
    Ok(Ends {
        net: world.net.clone(),
        dev,
        srv,
        server_addr: SocketAddr::new(srv_ip, 4433 + s.index as u16),
        path_ips,
    })
}

/// The server's and the device's transport options: the defaults with the plan's receive
/// window (per connection, and for each stream: the conventional baseline's one stream gets
/// all of it) and send window.
/// The receiver's and the device's transport options, and the receiver's allocation account.
pub(super) fn windows(u: &UploadLoad) -> (TransportOptions, TransportOptions, Option<Account>) {
    let mut server = TransportOptions::default();
    if let Some(w) = u.receive_window {
        server.receive_window = w;
        server.stream_receive_window = w;
    }
    let mut device = TransportOptions::default();
    if let Some(w) = u.send_window {
        device.send_window = w;
    }
    // What the device's connections hold unacknowledged, measured (`peak_in_flight_kb`).
    device.flight = Some(qgate_transport::FlightGauge::new());
    // What the receiver holds, measured (`recv_peak_kb`; its QUIC stack's part,
    // `recv_quic_peak_kb`; decision U14): none where the process's allocator does not count
    // (a test binary).
    let account = Account::claim().as_ref().and_then(Account::claim_within);
    server.tasks = crate::providers::Charged::tasks(account.as_ref());
    (server, device, account)
}

/// `recv_peak_kb`: the most bytes the receiver held at once in what it allocated while it ran
/// (its QUIC endpoint's and connections' drivers, its server or application tasks): datagrams
/// taken in and waiting in stream reassembly or in the application, and connection and request
/// state; `recv_quic_peak_kb`: the same for its QUIC stack alone (the drivers: `account`, whose
/// parent counts the whole; decision U14). Left out where nothing was counted, or a block was
/// missed.
pub(super) fn receiver_peak(account: Option<&qgate_tally::Account>, m: &mut Measurements) {
    let Some(quic) = account else { return };
    let whole = quic.parent().unwrap_or(quic);
    if !(quic.complete() && whole.complete()) {
        tracing::warn!("the receiver's allocations were not all counted");
        return;
    }
    m.scalars
        .push(("recv_peak_kb".into(), whole.peak() as f64 / 1000.0));
    m.scalars
        .push(("recv_quic_peak_kb".into(), quic.peak() as f64 / 1000.0));
}

pub(crate) struct Prepared {
    spec: UploadLoad,
    server: RunningServer,
    dir: PathBuf,
    lanes: Vec<Lane>,
    data: Bytes,
    info: FileInfo,
    pki: Arc<qgate_transport::DevPki>,
    device_opts: TransportOptions,
    /// The receiver's allocations (decision U14).
    server_account: Option<qgate_tally::Account>,
    seed: u64,
}

impl Drop for Prepared {
    fn drop(&mut self) {
        self.server.task.abort();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(super) async fn prepare(
    u: &UploadLoad,
    world: &mut World,
    s: &Setup,
) -> Result<Prepared, String> {
    let Ends {
        net,
        dev,
        srv,
        server_addr,
        path_ips: ips,
    } = ends(u, world, s)?;
    let (server_opts, device_opts, server_account) = windows(u);
    // One directory per run (several runs share the process).
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "qgate-lab-upload-{}-{}",
        std::process::id(),
        RUNS.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let uploads = Uploads::new(&dir, UploadLimits::default()).map_err(|e| e.to_string())?;
    let server = Server::builder()
        .socket(Socket::from(
            net.bind(srv, server_addr).map_err(|e| e.to_string())?,
        ))
        .identity(&s.pki.server)
        .transport(server_opts)
        .uploads(uploads)
        // Disk work at a fixed point of virtual time, so one seed gives one result (U12).
        .disk_runner(Arc::new(crate::providers::InlineDisk))
        .seed(s.seed * 100 + 7)
        .start()
        .map_err(|e| e.to_string())?;
    let bind = |ip| {
        net.bind(dev, SocketAddr::new(ip, 0))
            .map(Socket::from)
            .map_err(|e| e.to_string())
    };
    let mut lanes = Vec::new();
    for (i, ip) in ips.iter().enumerate() {
        // Each lane's backup is the next lane's link (paper 001 §3.1).
        let backup = (u.backup && ips.len() > 1)
            .then(|| bind(ips[(i + 1) % ips.len()]))
            .transpose()?;
        lanes.push(Lane {
            socket: bind(*ip)?,
            server: server_addr,
            backup,
        });
    }
    // The file's bytes differ from seed to seed, so its checksum does too.
    let mut bytes = vec![0u8; u.bytes as usize];
    rng(s.seed, s.index).fill_bytes(&mut bytes);
    let data = Bytes::from(bytes);
    let info = FileInfo {
        layout: Layout::new(u.bytes, u.chunk_bytes).map_err(|e| e.to_string())?,
        sha256: sha256(&data, u.bytes, |_| {}).map_err(|e| e.to_string())?,
    };
    Ok(Prepared {
        spec: u.clone(),
        server,
        dir,
        lanes,
        data,
        info,
        pki: s.pki.clone(),
        device_opts,
        server_account,
        seed: s.seed,
    })
}

impl Prepared {
    pub(super) async fn run(mut self, clock: Clock) -> Measurements {
        let u = self.spec.clone();
        tokio::time::sleep_until(clock.start + super::secs(u.start_s)).await;
        let n = self.lanes.len();
        let mut up = Upload::builder()
            .trust(self.pki.trust())
            .name("upload.bin")
            .transport(self.device_opts.clone())
            .seed(self.seed)
            .steal(u.steal)
            .file(self.info, Arc::new(self.data.clone()));
        for lane in self.lanes.drain(..) {
            up = up.lane(lane);
        }
        let progress = up.progress();
        let flight = self.device_opts.flight.clone().unwrap_or_default();
        let t0 = tokio::time::Instant::now();
        // Each lane's goodput per second, until the upload ends.
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        // Each lane's goodput per second, and the longest time without any confirmed chunk
        // (checked every 10 ms), until the upload ends.
        let file_bytes = u.bytes;
        let sampler = {
            let progress = progress.clone();
            let clock = clock.clone();
            let metrics = self.server.metrics.clone();
            tokio::spawn(async move {
                let mut series = vec![Vec::new(); n];
                let mut last = vec![0u64; n];
                let mut tick = tokio::time::interval(Duration::from_millis(10));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let (mut total, mut since, mut max_stall) = (0u64, Instant::now(), 0f64);
                // Per lane: bytes, since when unchanged, longest unchanged stretch.
                let mut lane_stall = vec![(0u64, Instant::now(), 0f64); n];
                // Per lane: when its confirmed bytes last grew.
                let mut last_growth = vec![None::<Instant>; n];
                // The most bytes the server's request bodies held at a tick.
                let mut bodies = 0usize;
                let mut ticks = 0u64;
                loop {
                    // The end before a tick due at the same instant (decision U12).
                    let ended = tokio::select! {
                        biased;
                        _ = &mut stopped => true,
                        _ = tick.tick() => false,
                    };
                    ticks += 1;
                    bodies = bodies.max(metrics.bodies_held());
                    let now_total = progress.bytes();
                    if now_total != total || ended {
                        total = now_total;
                        since = Instant::now();
                    }
                    max_stall = max_stall.max(since.elapsed().as_secs_f64());
                    let all_done = progress.bytes() + progress.held_at_start() >= file_bytes;
                    for (i, st) in lane_stall.iter_mut().enumerate() {
                        let b = progress.lane(i).bytes.load(Ordering::Relaxed);
                        if b != st.0 {
                            last_growth[i] = Some(Instant::now());
                        }
                        // A lane waiting at the end of the file is not stalled.
                        if b != st.0 || all_done {
                            *st = (b, Instant::now(), st.2);
                        }
                        st.2 = st.2.max(st.1.elapsed().as_secs_f64());
                    }
                    if ticks.is_multiple_of(100) || ended {
                        let t = clock.t();
                        for (i, s) in series.iter_mut().enumerate() {
                            let b = progress.lane(i).bytes.load(Ordering::Relaxed);
                            s.push((t, (b - last[i]) as f64 * 8e-6));
                            last[i] = b;
                        }
                    }
                    if ended {
                        let lanes = lane_stall.iter().map(|s| s.2).collect::<Vec<_>>();
                        // When the first lane had its last chunk confirmed: the tail starts.
                        let first_done = last_growth.iter().flatten().min().copied();
                        return (series, max_stall, lanes, first_done, bodies);
                    }
                }
            })
        };
        let result = tokio::time::timeout_at(clock.deadline, up.run()).await;
        // Start → the server's confirmation (the report's), not → the last lane's stop (U12).
        let elapsed = match &result {
            Ok(Ok(report)) => report.elapsed.as_secs_f64(),
            _ => t0.elapsed().as_secs_f64(),
        };
        let _ = stop.send(());
        let (series, max_stall, lane_stalls, first_done, bodies) = sampler
            .await
            .unwrap_or_else(|_| (vec![Vec::new(); n], 0.0, vec![0.0; n], None, 0));
        // The tail ends where `completion_s` does: at the server's confirmation (U12).
        let end = t0 + Duration::from_secs_f64(elapsed);
        let tail = first_done.map(|f| end.saturating_duration_since(f).as_secs_f64());
        let mut m = Measurements::default();
        let confirmed = matches!(result, Ok(Ok(_)));
        if let Ok(Err(e)) = &result {
            tracing::warn!(error = %e, "upload failed");
        }
        let identical = confirmed
            && std::fs::read(self.dir.join("upload.bin")).is_ok_and(|f| f == self.data[..]);
        m.scalars
            .push(("completed".into(), f64::from(u8::from(identical))));
        if identical {
            m.scalars.push(("completion_s".into(), elapsed));
            m.scalars.push((
                "goodput_mbps".into(),
                u.bytes as f64 * 8e-6 / elapsed.max(1e-9),
            ));
        }
        let (mut failed, mut connects, mut migrations, mut copies) = (0, 0, 0, 0);
        for i in 0..n {
            let l = progress.lane(i);
            m.scalars.push((
                format!("lane{}_share", i + 1),
                l.bytes.load(Ordering::Relaxed) as f64 / u.bytes as f64,
            ));
            failed += l.failed.load(Ordering::Relaxed);
            connects += l.connects.load(Ordering::Relaxed);
            migrations += l.migrations.load(Ordering::Relaxed);
            copies += l.copies.load(Ordering::Relaxed);
        }
        m.scalars.push(("migrations".into(), migrations as f64));
        m.scalars.push(("copies".into(), copies as f64));
        m.scalars.push(("max_stall_s".into(), max_stall));
        if let (Some(t), true) = (tail, n > 1 && identical) {
            m.scalars.push(("tail_s".into(), t));
        }
        for (i, st) in lane_stalls.iter().enumerate() {
            m.scalars.push((format!("lane{}_max_stall_s", i + 1), *st));
        }
        m.scalars.push(("failed_requests".into(), failed as f64));
        m.scalars
            .push(("peak_in_flight_kb".into(), flight.peak() as f64 / 1000.0));
        receiver_peak(self.server_account.as_ref(), &mut m);
        m.scalars
            .push(("recv_body_peak_kb".into(), bodies as f64 / 1000.0));
        m.scalars.push(("connects".into(), connects as f64));
        for (i, s) in series.into_iter().enumerate() {
            m.series.push((format!("lane{}_mbps", i + 1), s));
        }
        m
    }
}
