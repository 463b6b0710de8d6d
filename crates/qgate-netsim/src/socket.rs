//! A UDP socket on a simulated host: quinn's `AsyncUdpSocket`, plus plain `send_to`/`recv_from`.

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use qgate_aqm::Ecn;
use quinn::udp::{EcnCodepoint, RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};
use tokio::time::Instant;

use crate::state::NetInner;

/// Datagrams quinn may hand over in one call (a GSO batch), split here into single datagrams.
const MAX_SEGMENTS: usize = 10;

/// A UDP socket bound on a simulated host. Dropping it frees the port.
pub struct SimSocket {
    net: Arc<NetInner>,
    id: usize,
    local: SocketAddr,
}

impl fmt::Debug for SimSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimSocket")
            .field("local", &self.local)
            .finish()
    }
}

fn to_ecn(e: Option<EcnCodepoint>) -> Option<Ecn> {
    e.map(|e| match e {
        EcnCodepoint::Ect0 => Ecn::Ect0,
        EcnCodepoint::Ect1 => Ecn::Ect1,
        EcnCodepoint::Ce => Ecn::Ce,
    })
}

fn from_ecn(e: Option<Ecn>) -> Option<EcnCodepoint> {
    match e? {
        Ecn::NotEct => None,
        Ecn::Ect0 => Some(EcnCodepoint::Ect0),
        Ecn::Ect1 => Some(EcnCodepoint::Ect1),
        Ecn::Ce => Some(EcnCodepoint::Ce),
    }
}

/// A datagram as [`SimSocket::recv_from`] returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The payload.
    pub data: Vec<u8>,
    /// The sender.
    pub from: SocketAddr,
    /// The local address it arrived at (the interface, for wildcard-bound sockets).
    pub to: IpAddr,
}

impl SimSocket {
    pub(crate) fn new(net: Arc<NetInner>, id: usize, local: SocketAddr) -> Self {
        SimSocket { net, id, local }
    }

    /// The bound address (IP may be unspecified for a wildcard bind).
    pub fn local(&self) -> SocketAddr {
        self.local
    }

    /// Send one datagram to `dst` from the bound address (or, if wildcard-bound, from the
    /// interface the route to `dst` leaves through).
    pub fn send_to(&self, data: &[u8], dst: SocketAddr) -> io::Result<()> {
        let shared = &self.net.shared;
        let mut st = shared.lock();
        let r = st.send(self.id, None, dst, None, data, Instant::now(), false);
        shared.after_change(st);
        r
    }

    /// Send `packet`, a whole IP packet built by a user-space stack, carried to `dst` as this
    /// socket's datagram but costed on the links at its own size (no UDP/IP header added): how
    /// a TCP stack runs over the simulator.
    pub fn send_ip_packet(&self, packet: &[u8], dst: SocketAddr) -> io::Result<()> {
        let shared = &self.net.shared;
        let mut st = shared.lock();
        let r = st.send(self.id, None, dst, None, packet, Instant::now(), true);
        shared.after_change(st);
        r
    }

    /// Receive one datagram.
    pub async fn recv_from(&self) -> Received {
        std::future::poll_fn(|cx| {
            let mut st = self.net.shared.lock();
            let slot = st.sockets[self.id].as_mut().expect("socket is bound");
            match slot.rx.pop_front() {
                Some((d, to, _)) => Poll::Ready(Received {
                    data: d.data.into_vec(),
                    from: d.src,
                    to,
                }),
                None => {
                    slot.waker = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        })
        .await
    }

    /// Datagrams dropped because this socket's receive buffer was full.
    pub fn dropped(&self) -> u64 {
        let st = self.net.shared.lock();
        st.sockets[self.id].as_ref().map_or(0, |s| s.dropped_rx)
    }
}

impl SimSocket {
    /// Hand `transmit`'s datagrams to the network now.
    fn send_now(&self, transmit: &Transmit) -> io::Result<()> {
        let shared = &self.net.shared;
        let mut st = shared.lock();
        let now = Instant::now();
        let seg = transmit
            .segment_size
            .unwrap_or(transmit.contents.len())
            .max(1);
        let mut result = Ok(());
        for chunk in transmit.contents.chunks(seg) {
            let r = st.send(
                self.id,
                transmit.src_ip,
                transmit.destination,
                to_ecn(transmit.ecn),
                chunk,
                now,
                false,
            );
            if r.is_err() {
                result = r;
            }
        }
        shared.after_change(st);
        result
    }
}

impl Drop for SimSocket {
    fn drop(&mut self) {
        self.net.shared.lock().unbind(self.id);
    }
}

#[derive(Debug)]
struct AlwaysWritable;

impl UdpPoller for AlwaysWritable {
    /// The simulated socket never blocks a sender: a full link queue drops, as a real
    /// bottleneck would.
    fn poll_writable(self: Pin<&mut Self>, _cx: &mut Context) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl AsyncUdpSocket for SimSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(AlwaysWritable)
    }

    fn try_send(&self, transmit: &Transmit) -> io::Result<()> {
        // The network's own work (the datagram's copy on the wire, due events) is not the
        // sending host's memory (decision U14).
        qgate_tally::outside(|| self.send_now(transmit))
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let mut st = self.net.shared.lock();
        let slot = st.sockets[self.id]
            .as_mut()
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))?;
        let mut n = 0;
        while n < bufs.len().min(meta.len()) {
            let Some((d, to, ecn)) = slot.rx.pop_front() else {
                break;
            };
            let len = d.data.len().min(bufs[n].len());
            bufs[n][..len].copy_from_slice(&d.data[..len]);
            meta[n] = RecvMeta {
                addr: d.src,
                len,
                stride: len,
                ecn: from_ecn(ecn),
                dst_ip: Some(to),
            };
            n += 1;
        }
        if n == 0 {
            slot.waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        Poll::Ready(Ok(n))
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }

    fn max_transmit_segments(&self) -> usize {
        MAX_SEGMENTS
    }

    fn may_fragment(&self) -> bool {
        false
    }
}
