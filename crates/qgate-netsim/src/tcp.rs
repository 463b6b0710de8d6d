//! A user-space TCP (smoltcp, CUBIC) on the simulated network, so TCP+TLS runs on the same
//! links, in the same virtual time, as QUIC. Each host's stack sends whole IP packets as
//! datagrams of a carrier socket ([`SimSocket::send_ip_packet`] costs them at their own size:
//! no UDP header is added), and the peer's stack takes them in.
//!
//! This is not Linux's TCP: minimum RTO 1 s (RFC 6298; Linux 200 ms), no SACK, delayed ACKs of
//! 10 ms; Nagle is off, as on our kernel sockets.

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use crate::{HostId, Network, SimSocket};
use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{Device, DeviceCapabilities, Medium, RxToken, TxToken};
use smoltcp::socket::tcp;
use smoltcp::wire::{HardwareAddress, IpCidr, Ipv4Address};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// The carrier port on every host.
const CARRIER_PORT: u16 = 9;
/// Socket buffers, each direction (64 KiB, a common default receive window).
const BUFFER: usize = 65_535;
const MTU: usize = 1500;

/// The stack's virtual NIC: packets in from the carrier, packets out to it.
#[derive(Default)]
struct Nic {
    rx: VecDeque<Vec<u8>>,
    tx: VecDeque<Vec<u8>>,
}

struct Rx(Vec<u8>);
struct Tx<'a>(&'a mut VecDeque<Vec<u8>>);

impl RxToken for Rx {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl TxToken for Tx<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut p = vec![0; len];
        let r = f(&mut p);
        self.0.push_back(p);
        r
    }
}

impl Device for Nic {
    type RxToken<'a> = Rx;
    type TxToken<'a> = Tx<'a>;

    fn receive(
        &mut self,
        _: smoltcp::time::Instant,
    ) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let p = self.rx.pop_front()?;
        Some((Rx(p), Tx(&mut self.tx)))
    }

    fn transmit(&mut self, _: smoltcp::time::Instant) -> Option<Self::TxToken<'_>> {
        Some(Tx(&mut self.tx))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut c = DeviceCapabilities::default();
        c.medium = Medium::Ip;
        c.max_transmission_unit = MTU;
        c
    }
}

struct Listener {
    port: u16,
    listening: SocketHandle,
    /// Handshakes under way.
    pending: Vec<SocketHandle>,
    /// Established, not yet accepted.
    ready: VecDeque<SocketHandle>,
    waker: Option<Waker>,
}

struct State {
    iface: Interface,
    sockets: SocketSet<'static>,
    nic: Nic,
    listeners: Vec<Listener>,
    /// Streams dropped by their owners: removed once closed.
    dropped: Vec<SocketHandle>,
    next_port: u16,
}

struct Shared {
    state: Mutex<State>,
    /// A stream changed something the stack must act on (data to send, window to open).
    kick: Notify,
    epoch: Instant,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("no panics under the stack lock")
    }

    fn now(&self) -> smoltcp::time::Instant {
        smoltcp::time::Instant::from_micros(self.epoch.elapsed().as_micros() as i64)
    }
}

fn new_socket() -> tcp::Socket<'static> {
    let mut s = tcp::Socket::new(
        tcp::SocketBuffer::new(vec![0; BUFFER]),
        tcp::SocketBuffer::new(vec![0; BUFFER]),
    );
    s.set_nagle_enabled(false);
    s.set_congestion_control(tcp::CongestionControl::Cubic);
    s
}

/// One host's TCP stack on the simulated network.
#[derive(Clone)]
pub struct TcpHost {
    shared: Arc<Shared>,
}

impl TcpHost {
    /// A stack for `host` at `ip` (which must be one of its interfaces); its driver runs as a
    /// task on the current runtime for as long as the runtime does.
    pub fn new(net: &Network, host: HostId, ip: Ipv4Addr) -> io::Result<TcpHost> {
        let carrier = net
            .bind(host, SocketAddr::new(IpAddr::V4(ip), CARRIER_PORT))
            .map_err(|e| io::Error::other(e.to_string()))?;
        let mut nic = Nic::default();
        let epoch = Instant::now();
        let mut iface = Interface::new(
            Config::new(HardwareAddress::Ip),
            &mut nic,
            smoltcp::time::Instant::from_micros(0),
        );
        // Every simulated address is 10/8: one hop away as far as IP over the carrier goes.
        iface.update_ip_addrs(|a| {
            let o = ip.octets();
            a.push(IpCidr::new(
                Ipv4Address::new(o[0], o[1], o[2], o[3]).into(),
                8,
            ))
            .expect("room for one address");
        });
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                iface,
                sockets: SocketSet::new(Vec::new()),
                nic,
                listeners: Vec::new(),
                dropped: Vec::new(),
                next_port: 49_152,
            }),
            kick: Notify::new(),
            epoch,
        });
        tokio::spawn(drive(shared.clone(), carrier));
        Ok(TcpHost { shared })
    }

    /// Open a connection to `remote`; resolves once established.
    pub async fn connect(&self, remote: SocketAddr) -> io::Result<TcpStream> {
        let IpAddr::V4(v4) = remote.ip() else {
            return Err(io::Error::other("IPv4 only"));
        };
        let handle = {
            let mut st = self.shared.lock();
            let st = &mut *st;
            let port = st.next_port;
            st.next_port = st.next_port.checked_add(1).unwrap_or(49_152);
            let mut s = new_socket();
            let o = v4.octets();
            s.connect(
                st.iface.context(),
                (Ipv4Address::new(o[0], o[1], o[2], o[3]), remote.port()),
                port,
            )
            .map_err(|e| io::Error::other(format!("connect: {e:?}")))?;
            st.sockets.add(s)
        };
        self.shared.kick.notify_one();
        let stream = TcpStream {
            shared: self.shared.clone(),
            handle,
        };
        std::future::poll_fn(|cx| {
            let mut st = self.shared.lock();
            let s = st.sockets.get_mut::<tcp::Socket>(handle);
            match s.state() {
                tcp::State::Established => Poll::Ready(Ok(())),
                tcp::State::SynSent | tcp::State::SynReceived => {
                    s.register_send_waker(cx.waker());
                    Poll::Pending
                }
                other => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    format!("connecting to {remote}: {other}"),
                ))),
            }
        })
        .await?;
        Ok(stream)
    }

    /// Accept connections on `port`.
    pub fn listen(&self, port: u16) -> io::Result<TcpListener> {
        let mut st = self.shared.lock();
        let mut s = new_socket();
        s.listen(port)
            .map_err(|e| io::Error::other(format!("listen on {port}: {e:?}")))?;
        let listening = st.sockets.add(s);
        st.listeners.push(Listener {
            port,
            listening,
            pending: Vec::new(),
            ready: VecDeque::new(),
            waker: None,
        });
        Ok(TcpListener {
            shared: self.shared.clone(),
            index: st.listeners.len() - 1,
        })
    }
}

/// Poll the stack, move its packets to and from the carrier, and sleep until it needs time.
async fn drive(sh: Arc<Shared>, carrier: Arc<SimSocket>) {
    loop {
        let kicked = sh.kick.notified();
        let delay = {
            let mut st = sh.lock();
            let now = sh.now();
            let st = &mut *st;
            st.iface.poll(now, &mut st.nic, &mut st.sockets);
            tend_listeners(st);
            for p in st.nic.tx.drain(..) {
                if p.len() >= 20 && p[0] >> 4 == 4 {
                    let dst = Ipv4Addr::new(p[16], p[17], p[18], p[19]);
                    // A packet the network cannot route is lost, as on a real link.
                    let _ = carrier.send_ip_packet(&p, SocketAddr::new(dst.into(), CARRIER_PORT));
                }
            }
            let dropped = std::mem::take(&mut st.dropped);
            for h in dropped {
                if st.sockets.get::<tcp::Socket>(h).state() == tcp::State::Closed {
                    st.sockets.remove(h);
                } else {
                    st.dropped.push(h);
                }
            }
            st.iface.poll_delay(now, &st.sockets)
        };
        let sleep =
            delay.map(|d| tokio::time::sleep(std::time::Duration::from_micros(d.total_micros())));
        tokio::select! {
            biased;
            r = carrier.recv_from() => sh.lock().nic.rx.push_back(r.data),
            _ = kicked => {}
            _ = async { match sleep { Some(s) => s.await, None => std::future::pending().await } } => {}
        }
    }
}

/// Listening sockets that took a connection become pending (a fresh one listens in their
/// place); pending ones that are established become ready for accept.
///
/// smoltcp has one socket per connection and no SYN queue: a retransmitted SYN (RTT above its
/// 1 s initial RTO) reaches the fresh listener and would open a second half-connection for the
/// same peer, and a half-connection that is reset goes back to listening. Both are removed
/// here, silently, so every connection is accepted once and no stray listener steals a SYN.
fn tend_listeners(st: &mut State) {
    for l in &mut st.listeners {
        let took = st.sockets.get::<tcp::Socket>(l.listening);
        if took.state() != tcp::State::Listen {
            let remote = took.remote_endpoint();
            let taken = l.listening;
            let duplicate = st.sockets.iter().any(|(h, s)| match s {
                smoltcp::socket::Socket::Tcp(t) => {
                    h != taken
                        && t.remote_endpoint() == remote
                        && t.local_endpoint().map(|e| e.port) == Some(l.port)
                        && !matches!(t.state(), tcp::State::Closed | tcp::State::TimeWait)
                }
                #[allow(unreachable_patterns)]
                _ => false,
            });
            if duplicate {
                st.sockets.remove(taken);
            } else {
                l.pending.push(taken);
            }
            let mut s = new_socket();
            s.listen(l.port)
                .expect("the port was listening a moment ago");
            l.listening = st.sockets.add(s);
        }
        let mut woke = false;
        let sockets = &mut st.sockets;
        let dropped = &mut st.dropped;
        l.pending
            .retain(|&h| match sockets.get::<tcp::Socket>(h).state() {
                tcp::State::SynReceived => true,
                tcp::State::Established | tcp::State::CloseWait => {
                    l.ready.push_back(h);
                    woke = true;
                    false
                }
                tcp::State::Listen => {
                    sockets.remove(h);
                    false
                }
                _ => {
                    dropped.push(h);
                    false
                }
            });
        if woke {
            if let Some(w) = l.waker.take() {
                w.wake();
            }
        }
    }
}

/// Accepts connections on one port.
pub struct TcpListener {
    shared: Arc<Shared>,
    index: usize,
}

impl TcpListener {
    /// The next established connection.
    pub async fn accept(&self) -> TcpStream {
        let handle = std::future::poll_fn(|cx| {
            let mut st = self.shared.lock();
            let l = &mut st.listeners[self.index];
            match l.ready.pop_front() {
                Some(h) => Poll::Ready(h),
                None => {
                    l.waker = Some(cx.waker().clone());
                    Poll::Pending
                }
            }
        })
        .await;
        TcpStream {
            shared: self.shared.clone(),
            handle,
        }
    }
}

/// One connection, as a tokio byte stream.
pub struct TcpStream {
    shared: Arc<Shared>,
    handle: SocketHandle,
}

impl std::fmt::Debug for TcpStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("usertcp::TcpStream")
            .field("handle", &self.handle)
            .finish()
    }
}

impl AsyncRead for TcpStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut st = self.shared.lock();
        let s = st.sockets.get_mut::<tcp::Socket>(self.handle);
        if s.can_recv() {
            let n = s
                .recv_slice(buf.initialize_unfilled())
                .map_err(|e| io::Error::other(format!("{e:?}")))?;
            buf.advance(n);
            drop(st);
            self.shared.kick.notify_one(); // the window opened
            Poll::Ready(Ok(()))
        } else if !s.may_recv() {
            Poll::Ready(Ok(())) // the peer's FIN, or the connection is gone
        } else {
            s.register_recv_waker(cx.waker());
            Poll::Pending
        }
    }
}

impl AsyncWrite for TcpStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut st = self.shared.lock();
        let s = st.sockets.get_mut::<tcp::Socket>(self.handle);
        if s.can_send() {
            let n = s
                .send_slice(data)
                .map_err(|e| io::Error::other(format!("{e:?}")))?;
            drop(st);
            self.shared.kick.notify_one();
            Poll::Ready(Ok(n))
        } else if !s.may_send() {
            Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()))
        } else {
            s.register_send_waker(cx.waker());
            Poll::Pending
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Written bytes are in the socket's buffer and the stack was kicked to send them.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.shared
            .lock()
            .sockets
            .get_mut::<tcp::Socket>(self.handle)
            .close();
        self.shared.kick.notify_one();
        Poll::Ready(Ok(()))
    }
}

impl Drop for TcpStream {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        st.sockets.get_mut::<tcp::Socket>(self.handle).close();
        st.dropped.push(self.handle);
        drop(st);
        self.shared.kick.notify_one();
    }
}
