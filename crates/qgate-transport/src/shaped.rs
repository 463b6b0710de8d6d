//! Egress shaping: a socket layer that sends every datagram through a [`LinkModel`] (a rate and
//! any queue discipline) before the socket under it, so a standing queue builds here, where an
//! AQM such as PID-Delay controls it, instead of in a bloated modem further on (the SQM idea,
//! paper 004 at the gateway's edge). Receiving passes straight through.
//!
//! Stackable like smoltcp's layers: it wraps any [`AsyncUdpSocket`], a real UDP socket or a
//! simulated interface, and runs on tokio's clock, so it behaves the same in virtual time.

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use qgate_aqm::{Ecn, Packet, QueueStats};
use qgate_link::{LinkModel, LinkParams, LinkStats, IPV4_UDP_OVERHEAD, IPV6_UDP_OVERHEAD};
use quinn::udp::{EcnCodepoint, RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tokio::sync::Notify;
use tokio::time::Instant;

/// A datagram waiting in the shaper.
struct Datagram {
    destination: SocketAddr,
    src_ip: Option<IpAddr>,
    data: Box<[u8]>,
}

struct State {
    model: LinkModel<Datagram>,
    rng: ChaCha8Rng,
}

/// What the shaper's owner can read while it runs: its counters.
#[derive(Clone)]
pub struct ShapeHandle {
    state: Arc<Mutex<State>>,
}

impl fmt::Debug for ShapeHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShapeHandle").finish_non_exhaustive()
    }
}

impl ShapeHandle {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The shaper's link counters (sent, delivered, queue drops, largest queue).
    pub fn stats(&self) -> LinkStats {
        self.lock().model.stats()
    }

    /// The queue discipline's own counters.
    pub fn queue_stats(&self) -> QueueStats {
        self.lock().model.queue_stats()
    }

    /// Packets queued now.
    pub fn backlog_packets(&self) -> usize {
        self.lock().model.backlog().packets
    }
}

/// The shaping socket layer.
pub struct ShapedSocket {
    inner: Arc<dyn AsyncUdpSocket>,
    handle: ShapeHandle,
    notify: Arc<Notify>,
    drain: tokio::task::AbortHandle,
}

impl fmt::Debug for ShapedSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShapedSocket")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl Drop for ShapedSocket {
    fn drop(&mut self) {
        self.drain.abort();
    }
}

fn to_ecn(e: Option<EcnCodepoint>) -> Ecn {
    match e {
        Some(EcnCodepoint::Ect0) => Ecn::Ect0,
        Some(EcnCodepoint::Ect1) => Ecn::Ect1,
        Some(EcnCodepoint::Ce) => Ecn::Ce,
        None => Ecn::NotEct,
    }
}

fn from_ecn(e: Ecn) -> Option<EcnCodepoint> {
    match e {
        Ecn::NotEct => None,
        Ecn::Ect0 => Some(EcnCodepoint::Ect0),
        Ecn::Ect1 => Some(EcnCodepoint::Ect1),
        Ecn::Ce => Some(EcnCodepoint::Ce),
    }
}

/// Check shaping parameters: a rate, and nothing a shaper cannot do (it adds no delay or loss).
pub fn validate_shape(params: &LinkParams) -> Result<(), String> {
    params.validate()?;
    if params.rate_bps.is_none() {
        return Err("shaping needs a rate (e.g. rate = \"20mbit\")".into());
    }
    if !params.up {
        return Err("a shaped path cannot be 'down' (it would drop everything)".into());
    }
    if !params.delay.is_zero() || !params.jitter.is_zero() || params.loss.mean_loss() > 0.0 {
        return Err("shaping takes a rate and a queue only, not delay, jitter or loss".into());
    }
    Ok(())
}

impl ShapedSocket {
    /// Shape what `inner` sends with `params` (a rate and a queue discipline); `seed` seeds the
    /// queue's random choices. Must be called inside a tokio runtime (it spawns the task that
    /// releases datagrams at the rate).
    pub fn new(
        inner: Arc<dyn AsyncUdpSocket>,
        params: LinkParams,
        seed: u64,
    ) -> Result<(Arc<ShapedSocket>, ShapeHandle), String> {
        validate_shape(&params)?;
        let handle = ShapeHandle {
            state: Arc::new(Mutex::new(State {
                model: LinkModel::new(params, seed)?,
                rng: ChaCha8Rng::seed_from_u64(seed),
            })),
        };
        let notify = Arc::new(Notify::new());
        let drain = tokio::spawn(drain(inner.clone(), handle.clone(), notify.clone()));
        Ok((
            Arc::new(ShapedSocket {
                inner,
                handle: handle.clone(),
                notify,
                drain: drain.abort_handle(),
            }),
            handle,
        ))
    }
}

/// Release datagrams when the model says they have left, into the socket underneath.
async fn drain(inner: Arc<dyn AsyncUdpSocket>, handle: ShapeHandle, notify: Arc<Notify>) {
    let mut poller = inner.clone().create_io_poller();
    let mut ready = Vec::new();
    loop {
        let next = {
            let mut st = handle.lock();
            let now = Instant::now().into_std();
            let State { model, rng } = &mut *st;
            model.handle_timeout(now, rng);
            while let Some((_, p)) = model.poll_deliver(now) {
                ready.push(p);
            }
            model.poll_timeout()
        };
        for p in ready.drain(..) {
            let t = Transmit {
                destination: p.payload.destination,
                ecn: from_ecn(p.ecn),
                contents: &p.payload.data,
                segment_size: None,
                src_ip: p.payload.src_ip,
            };
            loop {
                match inner.try_send(&t) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        if std::future::poll_fn(|cx| poller.as_mut().poll_writable(cx))
                            .await
                            .is_err()
                        {
                            break;
                        }
                    }
                    // Lost like any datagram the socket refuses; QUIC recovers.
                    _ => break,
                }
            }
        }
        match next {
            Some(at) => {
                tokio::select! {
                    biased;
                    _ = tokio::time::sleep_until(Instant::from_std(at)) => {}
                    _ = notify.notified() => {}
                }
            }
            None => notify.notified().await,
        }
    }
}

/// The shaper never makes a sender wait: like a bottleneck, its queue drops instead.
#[derive(Debug)]
struct AlwaysWritable;

impl UdpPoller for AlwaysWritable {
    fn poll_writable(self: Pin<&mut Self>, _cx: &mut Context) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl AsyncUdpSocket for ShapedSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(AlwaysWritable)
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        let overhead = if transmit.destination.is_ipv4() {
            IPV4_UDP_OVERHEAD
        } else {
            IPV6_UDP_OVERHEAD
        };
        // One flow per destination (a QUIC connection's), hashed with fixed keys: deterministic.
        let flow = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            transmit.destination.hash(&mut h);
            h.finish()
        };
        let segment = transmit
            .segment_size
            .unwrap_or(transmit.contents.len())
            .max(1);
        {
            let mut st = self.handle.lock();
            let now = Instant::now().into_std();
            let State { model, rng } = &mut *st;
            model.handle_timeout(now, rng);
            for chunk in transmit.contents.chunks(segment) {
                let mut p = Packet::new(
                    chunk.len() + overhead,
                    flow,
                    Datagram {
                        destination: transmit.destination,
                        src_ip: transmit.src_ip,
                        data: chunk.into(),
                    },
                );
                p.ecn = to_ecn(transmit.ecn);
                model.send(now, p);
            }
        }
        self.notify.notify_one();
        Ok(())
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}
