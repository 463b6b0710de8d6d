//! `kind = "upload"` with `conventional = true`: paper 001's baseline, the MPTCP model of its
//! §2 on QUIC. One multipath QUIC connection (noq, draft-ietf-quic-multipath) with a path on
//! each of the device's links carries the file as one stream; noq's scheduler stripes it over
//! the paths and the server reassembles it in one buffer, the stream's receive window (Fig. 4's
//! receive buffer). The device's send window is Fig. 5's send buffer. Decision U9.
//!
//! The server reads the stream in order and compares it with the file byte for byte, then
//! answers `ok` on the same stream; the upload completes when the device reads that answer
//! (as `qgate upload` completes when the server confirms the file).
//!
//! Scalars: `completed` (also 0 when a path never opened: that is not this baseline),
//! `completion_s`, `goodput_mbps` (as the two-ended workload's), `path<i>_sent_share` (the
//! fraction of the connection's UDP bytes path i sent: data, headers, acknowledgements and
//! retransmissions, unlike two-ended's `lane<i>_share` of confirmed file bytes), `paths`
//! (paths opened), `lost_packets`, `peak_in_flight_kb` (as the two-ended workload's, summed
//! over the paths), `recv_peak_kb` (as the two-ended workload's: noq's drivers and the reading
//! task).
//! Series: `path<i>_sent_mbps`, each path's sent UDP bits per second.

use std::io::{self, IoSliceMut};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::num::NonZeroUsize;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use noq::congestion::{Controller, ControllerFactory};
use noq::{FourTuple, PathError, PathId, PathStatus, VarInt};
use qgate_netsim::{SimSocket, World};
use qgate_transport::{FlightGauge, TransportOptions};
use quinn::AsyncUdpSocket as _;
use rand::RngCore;
// noq's controller trait takes std instants from its runtime (virtual here); no clock is read.
use std::time::Instant;

use super::{rng, Clock, Measurements, Setup};
use crate::plan::spec::UploadLoad;

/// ALPN of the baseline's connections (not `qgate upload`'s protocol).
const ALPN: &[u8] = b"qgate-upload-conventional";

/// How long the device keeps asking for a second path while the server issues connection
/// IDs for it (noq refuses with `RemoteCidsExhausted` for ~100–200 ms after the handshake).
const OPEN_PATH_FOR: Duration = Duration::from_secs(5);

/// A simulated socket as noq's socket: the same datagrams, noq's types. `default_src` is the
/// source address of datagrams noq sends without one (its first path), so the first path
/// leaves through the first listed link whatever the routing table says.
#[derive(Debug)]
struct NoqSocket {
    sim: Arc<SimSocket>,
    default_src: Option<IpAddr>,
    /// quinn's metadata for a receive batch, reused.
    meta: Vec<quinn::udp::RecvMeta>,
}

#[derive(Debug)]
struct NoqSender {
    sim: Arc<SimSocket>,
    default_src: Option<IpAddr>,
}

fn to_quinn_ecn(e: Option<noq::udp::EcnCodepoint>) -> Option<quinn::udp::EcnCodepoint> {
    e.and_then(|e| quinn::udp::EcnCodepoint::from_bits(e as u8))
}

fn to_noq_ecn(e: Option<quinn::udp::EcnCodepoint>) -> Option<noq::udp::EcnCodepoint> {
    e.and_then(|e| noq::udp::EcnCodepoint::from_bits(e as u8))
}

impl noq::UdpSender for NoqSender {
    fn poll_send(
        self: Pin<&mut Self>,
        transmit: &noq::udp::Transmit<'_>,
        _cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        // The simulated socket never blocks: a full link queue drops, as a bottleneck would.
        // A datagram with no route (a link down) is lost like one dropped on the wire: noq's
        // driver ends the connection on a send error, a real socket's sender only logs it.
        if let Err(e) = self.sim.try_send(&quinn::udp::Transmit {
            destination: transmit.destination,
            ecn: to_quinn_ecn(transmit.ecn),
            contents: transmit.contents,
            segment_size: transmit.segment_size,
            src_ip: transmit.src_ip.or(self.default_src),
        }) {
            tracing::debug!(error = %e, "conventional upload: datagram not sent");
        }
        Poll::Ready(Ok(()))
    }

    fn max_transmit_segments(&self) -> NonZeroUsize {
        NonZeroUsize::new(self.sim.max_transmit_segments()).unwrap_or(NonZeroUsize::MIN)
    }
}

impl noq::AsyncUdpSocket for NoqSocket {
    fn create_sender(&self) -> Pin<Box<dyn noq::UdpSender>> {
        Box::pin(NoqSender {
            sim: self.sim.clone(),
            default_src: self.default_src,
        })
    }

    fn poll_recv(
        &mut self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [noq::udp::RecvMeta],
    ) -> Poll<io::Result<usize>> {
        self.meta
            .resize(meta.len(), quinn::udp::RecvMeta::default());
        let n = match self.sim.poll_recv(cx, bufs, &mut self.meta[..meta.len()]) {
            Poll::Ready(Ok(n)) => n,
            other => return other,
        };
        for (m, q) in meta.iter_mut().zip(&self.meta[..n]) {
            *m = noq::udp::RecvMeta::default();
            m.addr = q.addr;
            m.len = q.len;
            m.stride = q.stride;
            m.ecn = to_noq_ecn(q.ecn);
            m.dst_ip = q.dst_ip;
        }
        Poll::Ready(Ok(n))
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.sim.local())
    }

    fn may_fragment(&self) -> bool {
        false
    }
}

/// noq's CUBIC, counting its bytes in flight into a [`FlightGauge`] as qgate's controllers do
/// (one controller per path; the gauge sums them).
struct CountedCubic {
    gauge: FlightGauge,
}

impl ControllerFactory for CountedCubic {
    fn build(self: Arc<Self>, now: Instant, mtu: u16) -> Box<dyn Controller> {
        Box::new(CountedPath {
            inner: Arc::new(noq::congestion::CubicConfig::default()).build(now, mtu),
            gauge: self.gauge.clone(),
            mine: 0,
            original: true,
        })
    }
}

/// Delegates every call to noq's controller; keeps the gauge.
struct CountedPath {
    inner: Box<dyn Controller>,
    gauge: FlightGauge,
    mine: u64,
    /// Copies made by `clone_box` do not count.
    original: bool,
}

impl CountedPath {
    fn set(&mut self, new: u64) {
        if self.original {
            self.gauge.set(&mut self.mine, new);
        }
    }
}

impl std::fmt::Debug for CountedPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountedPath")
            .field("mine", &self.mine)
            .finish()
    }
}

impl Controller for CountedPath {
    fn on_sent(&mut self, now: Instant, bytes: u64, largest_pn: u64) {
        self.set(self.mine + bytes);
        self.inner.on_sent(now, bytes, largest_pn)
    }
    fn on_packet_sent(&mut self, now: Instant, bytes: u16, pn: u64) {
        self.inner.on_packet_sent(now, bytes, pn)
    }
    fn on_cwnd_limited(&mut self) {
        self.inner.on_cwnd_limited()
    }
    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        pn: u64,
        app_limited: bool,
        rtt: &noq_proto::RttEstimator,
    ) {
        self.inner.on_ack(now, sent, bytes, pn, app_limited, rtt)
    }
    fn on_end_acks(
        &mut self,
        now: Instant,
        in_flight: u64,
        app_limited: bool,
        largest: Option<u64>,
    ) {
        self.set(in_flight);
        self.inner.on_end_acks(now, in_flight, app_limited, largest)
    }
    fn on_congestion_event(
        &mut self,
        now: Instant,
        sent: Instant,
        persistent: bool,
        ecn: bool,
        lost_bytes: u64,
        largest_lost_pn: u64,
    ) {
        self.set(self.mine.saturating_sub(lost_bytes));
        self.inner
            .on_congestion_event(now, sent, persistent, ecn, lost_bytes, largest_lost_pn)
    }
    fn on_packet_lost(&mut self, lost_bytes: u16, pn: u64, now: Instant) {
        self.inner.on_packet_lost(lost_bytes, pn, now)
    }
    fn on_spurious_congestion_event(&mut self) {
        self.inner.on_spurious_congestion_event()
    }
    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.inner.on_mtu_update(new_mtu)
    }
    fn on_ack_frequency_update(&mut self, threshold: u64, max_ack_delay: Duration) {
        self.inner.on_ack_frequency_update(threshold, max_ack_delay)
    }
    fn window(&self) -> u64 {
        self.inner.window()
    }
    fn metrics(&self) -> noq::congestion::ControllerMetrics {
        self.inner.metrics()
    }
    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(CountedPath {
            inner: self.inner.clone_box(),
            gauge: self.gauge.clone(),
            mine: self.mine,
            original: false,
        })
    }
    fn initial_window(&self) -> u64 {
        self.inner.initial_window()
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

impl Drop for CountedPath {
    fn drop(&mut self) {
        self.set(0);
    }
}

/// noq's transport settings from qgate's (the values the two-ended lanes run with), with
/// `paths` multipath paths.
fn noq_transport(o: &TransportOptions, paths: u32) -> Result<noq::TransportConfig, String> {
    let var = |v: u64, what: &str| VarInt::from_u64(v).map_err(|_| format!("{what} too large"));
    let mut t = noq::TransportConfig::default();
    t.initial_rtt(Duration::from_secs_f64(
        o.effective_initial_rtt_ms() / 1000.0,
    ))
    .max_idle_timeout(Some(
        noq::IdleTimeout::try_from(Duration::from_millis(o.idle_timeout_ms))
            .map_err(|e| e.to_string())?,
    ))
    .stream_receive_window(var(o.stream_receive_window, "stream_receive_window")?)
    .receive_window(var(o.receive_window, "receive_window")?)
    .send_window(o.send_window)
    .max_concurrent_bidi_streams(var(u64::from(o.max_concurrent_bidi_streams), "streams")?)
    .congestion_controller_factory(Arc::new(CountedCubic {
        gauge: o.flight.clone().unwrap_or_default(),
    }))
    .max_concurrent_multipath_paths(paths);
    if !o.mtu_discovery {
        t.mtu_discovery_config(None);
    }
    Ok(t)
}

fn endpoint_config(seed: u64) -> noq::EndpointConfig {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    let mut c = noq::EndpointConfig::default();
    c.rng_seed(Some(key));
    c
}

pub(crate) struct Prepared {
    spec: UploadLoad,
    server: noq::Endpoint,
    server_task: tokio::task::JoinHandle<()>,
    served: tokio::sync::watch::Receiver<Option<bool>>,
    device: noq::Endpoint,
    client: noq::ClientConfig,
    server_addr: SocketAddr,
    path_ips: Vec<IpAddr>,
    data: Bytes,
    flight: FlightGauge,
    /// The receiver's allocations (decision U14).
    server_account: Option<qgate_tally::Account>,
}

impl Drop for Prepared {
    fn drop(&mut self) {
        self.server_task.abort();
    }
}

pub(super) async fn prepare(
    u: &UploadLoad,
    world: &mut World,
    s: &Setup,
) -> Result<Prepared, String> {
    let super::upload::Ends {
        net,
        dev,
        srv,
        server_addr,
        path_ips,
    } = super::upload::ends(u, world, s)?;
    let (server_opts, device_opts, server_account) = super::upload::windows(u);
    let paths = u32::try_from(u.paths.len()).map_err(|e| e.to_string())?;
    let runtime: Arc<dyn noq::Runtime> = Arc::new(noq::TokioRuntime);
    // The server's drivers charge what they allocate to the receiver's account (U14).
    let server_runtime: Arc<dyn noq::Runtime> = match &server_account {
        Some(a) => Arc::new(CountedRuntime(a.clone())),
        None => runtime.clone(),
    };

    let provider = qgate_transport::tls::provider();
    let mut tls = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(s.pki.server.chain.clone(), s.pki.server.key.clone_key())
        .map_err(|e| e.to_string())?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = noq::crypto::rustls::QuicServerConfig::try_from(tls).map_err(|e| e.to_string())?;
    let mut server_config = noq::ServerConfig::with_crypto(Arc::new(crypto));
    server_config.transport_config(Arc::new(noq_transport(&server_opts, paths)?));
    let server = noq::Endpoint::new_with_abstract_socket(
        endpoint_config(s.seed * 100 + 7),
        Some(server_config),
        Box::new(NoqSocket {
            sim: net.bind(srv, server_addr).map_err(|e| e.to_string())?,
            default_src: None,
            meta: Vec::new(),
        }),
        server_runtime,
    )
    .map_err(|e| e.to_string())?;

    let any = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
    let device = noq::Endpoint::new_with_abstract_socket(
        endpoint_config(s.seed * 100 + 8),
        None,
        Box::new(NoqSocket {
            sim: net.bind(dev, any).map_err(|e| e.to_string())?,
            default_src: path_ips.first().copied(),
            meta: Vec::new(),
        }),
        runtime,
    )
    .map_err(|e| e.to_string())?;
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_root_certificates(s.pki.trust().store().map_err(|e| e.to_string())?)
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let crypto = noq::crypto::rustls::QuicClientConfig::try_from(tls).map_err(|e| e.to_string())?;
    let mut client = noq::ClientConfig::new(Arc::new(crypto));
    client.transport_config(Arc::new(noq_transport(&device_opts, paths)?));

    // The file's bytes differ from seed to seed.
    let mut bytes = vec![0u8; u.bytes as usize];
    rng(s.seed, s.index).fill_bytes(&mut bytes);
    let data = Bytes::from(bytes);

    let (tx, served) = tokio::sync::watch::channel(None);
    // The receiving application charges the receiver's account too (U14).
    let charged = server_account
        .as_ref()
        .map(|a| a.parent().unwrap_or(a).enter());
    let server_task = tokio::spawn(qgate_tally::inherit(serve(
        server.clone(),
        data.clone(),
        tx,
    )));
    drop(charged);
    Ok(Prepared {
        spec: u.clone(),
        server,
        server_task,
        served,
        device,
        client,
        server_addr,
        path_ips,
        data,
        flight: device_opts.flight.clone().unwrap_or_default(),
        server_account,
    })
}

/// noq's tokio runtime, with what the endpoint's driver and its connections' drivers allocate
/// charged to an account (decision U14), as `qgate_transport`'s server endpoint does for quinn.
#[derive(Debug)]
struct CountedRuntime(qgate_tally::Account);

impl noq::Runtime for CountedRuntime {
    fn new_timer(&self, i: Instant) -> Pin<Box<dyn noq::AsyncTimer>> {
        noq::TokioRuntime.new_timer(i)
    }

    fn spawn(&self, future: Pin<Box<dyn std::future::Future<Output = ()> + Send>>) {
        noq::TokioRuntime.spawn(Box::pin(self.0.counted(future)))
    }

    fn wrap_udp_socket(
        &self,
        t: std::net::UdpSocket,
    ) -> std::io::Result<Box<dyn noq::AsyncUdpSocket>> {
        noq::TokioRuntime.wrap_udp_socket(t)
    }

    // noq's clock through tokio's (virtual here), as `TokioRuntime` reads it.
    fn now(&self) -> std::time::Instant {
        noq::TokioRuntime.now()
    }
}

/// The receiving side: one connection, one stream, read in order and compared with the file;
/// `ok` when all of it matched. Reports whether it did.
async fn serve(ep: noq::Endpoint, data: Bytes, done: tokio::sync::watch::Sender<Option<bool>>) {
    let result = async {
        let conn = ep.accept().await?.await.ok()?;
        let (mut send, mut recv) = conn.accept_bi().await.ok()?;
        let mut at = 0usize;
        let mut same = true;
        while let Some(chunk) = recv.read_chunk(usize::MAX).await.ok()? {
            let end = at + chunk.len();
            same &= data.get(at..end) == Some(&chunk[..]);
            at = end;
        }
        let ok = same && at == data.len();
        let _ = send.write_all(if ok { b"ok" } else { b"no" }).await;
        let _ = send.finish();
        // Keep the connection until the device has the answer and closes.
        conn.closed().await;
        Some(ok)
    }
    .await;
    let _ = done.send(Some(result == Some(true)));
}

impl Prepared {
    pub(super) async fn run(self, clock: Clock) -> Measurements {
        let u = self.spec.clone();
        tokio::time::sleep_until(clock.start + super::secs(u.start_s)).await;
        let n = self.path_ips.len();
        let t0 = tokio::time::Instant::now();
        let mut m = Measurements::default();
        let conn =
            match self
                .device
                .connect_with(self.client.clone(), self.server_addr, "localhost")
            {
                Ok(c) => tokio::time::timeout_at(clock.deadline, c).await,
                Err(e) => {
                    tracing::warn!(error = %e, "conventional upload: connect failed");
                    m.scalars.push(("completed".into(), 0.0));
                    return m;
                }
            };
        let conn = match conn {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "conventional upload: handshake failed");
                m.scalars.push(("completed".into(), 0.0));
                return m;
            }
            Err(_) => {
                tracing::warn!("conventional upload: no handshake before the deadline");
                m.scalars.push(("completed".into(), 0.0));
                return m;
            }
        };
        // The other links' paths, opened while the upload starts on the first.
        let opener = {
            let conn = conn.clone();
            let (server, ips) = (self.server_addr, self.path_ips.clone());
            tokio::spawn(async move {
                let mut ids = vec![PathId::ZERO];
                for ip in ips.into_iter().skip(1) {
                    let until = tokio::time::Instant::now() + OPEN_PATH_FOR;
                    loop {
                        match conn
                            .open_path(FourTuple::new(server, Some(ip)), PathStatus::Available)
                            .await
                        {
                            Ok(p) => {
                                ids.push(p.id());
                                break;
                            }
                            Err(PathError::RemoteCidsExhausted)
                                if tokio::time::Instant::now() < until =>
                            {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, %ip, "conventional upload: no path");
                                break;
                            }
                        }
                    }
                }
                ids
            })
        };
        // Each path's sent bits per second while the upload runs.
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let sampler = {
            let conn = conn.clone();
            let clock = clock.clone();
            tokio::spawn(async move {
                let mut series = vec![Vec::new(); n];
                let mut last = vec![0u64; n];
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                tick.tick().await;
                loop {
                    // The end before a tick due at the same instant (decision U12).
                    let ended = tokio::select! {
                        biased;
                        _ = &mut stopped => true,
                        _ = tick.tick() => false,
                    };
                    let t = clock.t();
                    for (i, s) in series.iter_mut().enumerate() {
                        // Paths get ids in the order they open, one per link.
                        let sent = path_sent(&conn, PathId::from(i as u32));
                        s.push((t, sent.saturating_sub(last[i]) as f64 * 8e-6));
                        last[i] = sent;
                    }
                    if ended {
                        return series;
                    }
                }
            })
        };
        let upload = async {
            let (mut send, mut recv) = conn.open_bi().await.ok()?;
            send.write_chunk(self.data.clone()).await.ok()?;
            send.finish().ok()?;
            let answer = recv.read_to_end(16).await.ok()?;
            Some(answer == b"ok")
        };
        let answered = tokio::time::timeout_at(clock.deadline, upload).await;
        let elapsed = t0.elapsed().as_secs_f64();
        // A path still being opened when the upload ended carried none of it.
        if !opener.is_finished() {
            opener.abort();
        }
        let ids = opener.await.unwrap_or_else(|_| vec![PathId::ZERO]);
        let sent: Vec<u64> = ids.iter().map(|id| path_sent(&conn, *id)).collect();
        let lost = conn.stats().lost_packets;
        conn.close(VarInt::from_u32(0), b"done");
        let _ = stop.send(());
        let series = sampler.await.unwrap_or_default();
        // The server's own verdict (it compared every byte).
        let mut served = self.served.clone();
        let verified =
            tokio::time::timeout(Duration::from_secs(5), served.wait_for(Option::is_some))
                .await
                .ok()
                .and_then(|r| r.ok().and_then(|v| *v))
                == Some(true);
        // An upload that did not get a path on every link is not this baseline.
        if ids.len() < n {
            tracing::warn!(
                paths = ids.len(),
                links = n,
                "conventional upload: a path never opened"
            );
        }
        let identical = matches!(answered, Ok(Some(true))) && verified && ids.len() == n;
        m.scalars
            .push(("completed".into(), f64::from(u8::from(identical))));
        if identical {
            m.scalars.push(("completion_s".into(), elapsed));
            m.scalars.push((
                "goodput_mbps".into(),
                u.bytes as f64 * 8e-6 / elapsed.max(1e-9),
            ));
        }
        let total = sent.iter().sum::<u64>().max(1) as f64;
        for (i, s) in sent.iter().enumerate() {
            m.scalars
                .push((format!("path{}_sent_share", i + 1), *s as f64 / total));
        }
        m.scalars.push(("paths".into(), ids.len() as f64));
        m.scalars.push(("lost_packets".into(), lost as f64));
        m.scalars.push((
            "peak_in_flight_kb".into(),
            self.flight.peak() as f64 / 1000.0,
        ));
        super::upload::receiver_peak(self.server_account.as_ref(), &mut m);
        for (i, s) in series.into_iter().enumerate() {
            m.series.push((format!("path{}_sent_mbps", i + 1), s));
        }
        self.server.close(VarInt::from_u32(0), b"");
        m
    }
}

/// Bytes (UDP payload: data, headers, acknowledgements, retransmissions) path `id` has sent,
/// 0 if it is closed.
fn path_sent(conn: &noq::Connection, id: PathId) -> u64 {
    conn.path(id).map_or(0, |p| p.stats().udp_tx.bytes)
}
