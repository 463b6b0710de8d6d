//! A compact QUIC server endpoint: every connection's quinn-proto state machine in one table,
//! driven by one task.
//!
//! quinn gives each connection its own driver task and an event channel whose first block alone
//! is ~7 KB; a gateway holding 10 000 mostly idle device connections pays that, a send buffer and
//! a task 10 000 times (decision G9). Here one driver task moves datagrams, timers and transmits
//! for all connections, and the handles ([`Connection`] and its streams) implement h3's QUIC
//! traits, so HTTP/3 runs on top unchanged. The protocol itself is quinn-proto's: this module is
//! only the I/O shell, on the same sockets (real UDP or simulated) as [`crate::endpoint`].

mod streams;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::future::Future;
use std::io::IoSliceMut;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use bytes::BytesMut;
use quinn::udp::{self, RecvMeta};
use quinn::{AsyncUdpSocket, EndpointConfig, Runtime, ServerConfig, TokioRuntime, UdpPoller};
use quinn_proto as proto;
use quinn_proto::{ConnectionHandle, Dir, StreamEvent, StreamId};

pub use streams::{BidiStream, Opener, RecvStream, SendStream};

use crate::{Socket, TransportError};

/// Connections whose handshake finished but that [`Endpoint::accept`] has not taken yet; more
/// are closed at once (the application is not keeping up).
const MAX_PENDING_ACCEPT: usize = 1024;
/// Datagrams one connection may send per turn before the others get theirs.
const MAX_TRANSMITS_PER_TURN: usize = 32;
/// Rounds of receive/timers/transmit per driver poll before it yields to other tasks.
const ROUNDS_PER_POLL: usize = 16;

/// The clock quinn uses: tokio's, so simulations in virtual time work.
fn now() -> Instant {
    TokioRuntime.now()
}

/// A QUIC server endpoint whose connections share one driver task. Once every handle to it is
/// dropped it accepts no more connections; the driver ends when the last connection has.
pub struct Endpoint {
    shared: Arc<Shared>,
}

impl Clone for Endpoint {
    fn clone(&self) -> Self {
        lock(&self.shared).endpoints += 1;
        Endpoint {
            shared: self.shared.clone(),
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let mut st = lock(&self.shared);
        st.endpoints -= 1;
        if st.endpoints == 0 {
            st.closed = true;
            // Nobody can accept the queued connections any more.
            let st = &mut *st;
            let t = now();
            for id in st.accept_queue.drain(..) {
                if let Some(c) = st.conns.get_mut(&id) {
                    c.refs -= 1;
                    if c.refs == 0 {
                        if let Some(p) = c.proto.as_mut() {
                            p.close(t, 0u32.into(), bytes::Bytes::new());
                        }
                    }
                    st.sched.touch(id, c);
                }
            }
            if let Some(w) = &st.sched.driver {
                w.wake_by_ref();
            }
        }
    }
}

struct Shared {
    state: Mutex<State>,
    local: SocketAddr,
}

fn lock(s: &Shared) -> MutexGuard<'_, State> {
    s.state.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a task waits for on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waiter {
    Read(StreamId),
    Write(StreamId),
    Accept(Dir),
    Open(Dir),
}

/// One connection: its state machine and who waits on it.
struct Conn {
    /// None once drained: the state machine is freed while handles may still be alive.
    proto: Option<proto::Connection>,
    handle: ConnectionHandle,
    remote: SocketAddr,
    /// Why it ended, once it has.
    error: Option<proto::ConnectionError>,
    /// Live handles (connection, opener, streams; a queued accept counts as one).
    refs: usize,
    timer: Option<Instant>,
    dirty: bool,
    waiters: Vec<(Waiter, Waker)>,
}

impl Conn {
    fn wait(&mut self, w: Waiter, waker: &Waker) {
        match self.waiters.iter_mut().find(|(x, _)| *x == w) {
            Some((_, k)) => k.clone_from(waker),
            None => self.waiters.push((w, waker.clone())),
        }
    }

    fn wake(&mut self, w: Waiter) {
        if let Some(i) = self.waiters.iter().position(|(x, _)| *x == w) {
            self.waiters.swap_remove(i).1.wake();
        }
    }

    fn wake_all(&mut self) {
        for (_, k) in self.waiters.drain(..) {
            k.wake();
        }
        self.waiters = Vec::new();
    }

    /// The error handles see once the connection is gone.
    fn gone(&self) -> proto::ConnectionError {
        self.error
            .clone()
            .unwrap_or(proto::ConnectionError::LocallyClosed)
    }
}

/// The driver's to-do list, apart from the connection table so both can be borrowed at once.
#[derive(Default)]
struct Sched {
    dirty: VecDeque<u64>,
    driver: Option<Waker>,
    /// The driver is running and looks at `dirty` before it sleeps: no need to wake it.
    driving: bool,
}

impl Sched {
    /// Queue `id` for the driver (transmit, endpoint and application events, timer).
    fn touch(&mut self, id: u64, conn: &mut Conn) {
        if !conn.dirty {
            conn.dirty = true;
            self.dirty.push_back(id);
            if !self.driving {
                if let Some(w) = &self.driver {
                    w.wake_by_ref();
                }
            }
        }
    }
}

struct State {
    proto: proto::Endpoint,
    socket: Arc<dyn AsyncUdpSocket>,
    poller: Pin<Box<dyn UdpPoller>>,
    conns: HashMap<u64, Box<Conn>>,
    by_handle: HashMap<ConnectionHandle, u64>,
    next_id: u64,
    max_connections: usize,
    timers: BTreeSet<(Instant, u64)>,
    sched: Sched,
    accept_queue: VecDeque<u64>,
    acceptor: Option<Waker>,
    /// A transmit the socket refused (would block), kept with its bytes in `send_buf`.
    blocked: Option<proto::Transmit>,
    send_buf: Vec<u8>,
    /// No more connections are accepted.
    closed: bool,
    /// Live [`Endpoint`] handles.
    endpoints: usize,
}

impl Endpoint {
    /// A server on `socket` with `server`'s TLS and transport settings, holding at most
    /// `max_connections` connections (more are refused during their handshake). `seed` makes
    /// quinn-proto's random choices reproducible, as simulations need.
    pub fn server(
        socket: Socket,
        server: ServerConfig,
        seed: Option<u64>,
        max_connections: usize,
    ) -> Result<Endpoint, TransportError> {
        let socket: Arc<dyn AsyncUdpSocket> = match socket {
            Socket::Udp(s) => {
                let addr = s
                    .local_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_else(|_| "?".into());
                TokioRuntime
                    .wrap_udp_socket(s)
                    .map_err(|source| TransportError::Io { addr, source })?
            }
            Socket::Abstract(s) => s,
        };
        let local = socket.local_addr().map_err(|source| TransportError::Io {
            addr: "?".into(),
            source,
        })?;
        let mut cfg = EndpointConfig::default();
        cfg.rng_seed(seed.map(crate::endpoint::seed_bytes));
        let recv_len = recv_buffer_len(&cfg, socket.as_ref());
        let state = State {
            proto: proto::Endpoint::new(
                Arc::new(cfg),
                Some(Arc::new(server)),
                !socket.may_fragment(),
                None,
            ),
            poller: socket.clone().create_io_poller(),
            socket,
            conns: HashMap::new(),
            by_handle: HashMap::new(),
            next_id: 0,
            max_connections,
            timers: BTreeSet::new(),
            sched: Sched::default(),
            accept_queue: VecDeque::new(),
            acceptor: None,
            blocked: None,
            send_buf: Vec::new(),
            closed: false,
            endpoints: 1,
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            local,
        });
        tokio::spawn(Driver {
            socket: lock(&shared).socket.clone(),
            shared: shared.clone(),
            recv_buf: vec![0; recv_len].into_boxed_slice(),
            sleep: Box::pin(tokio::time::sleep(std::time::Duration::ZERO)),
            sleep_at: None,
        });
        Ok(Endpoint { shared })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local
    }

    /// The next connection whose handshake has finished; `None` once the endpoint is closed.
    pub fn accept(&self) -> impl Future<Output = Option<Connection>> + '_ {
        std::future::poll_fn(move |cx| {
            let mut st = lock(&self.shared);
            if let Some(id) = st.accept_queue.pop_front() {
                // The queue's reference passes to the handle.
                return Poll::Ready(Some(Connection {
                    shared: self.shared.clone(),
                    id,
                }));
            }
            if st.closed {
                return Poll::Ready(None);
            }
            st.acceptor = Some(cx.waker().clone());
            Poll::Pending
        })
    }

    /// Close every connection with `code` and `reason`, and stop accepting.
    pub fn close(&self, code: u32, reason: &[u8]) {
        let mut st = lock(&self.shared);
        st.closed = true;
        let t = now();
        let st = &mut *st;
        for (id, c) in st.conns.iter_mut() {
            if let Some(p) = c.proto.as_mut() {
                p.close(t, code.into(), bytes::Bytes::copy_from_slice(reason));
                st.sched.touch(*id, c);
            }
        }
        for id in st.accept_queue.drain(..) {
            if let Some(c) = st.conns.get_mut(&id) {
                c.refs -= 1;
            }
        }
        if let Some(w) = st.acceptor.take() {
            w.wake();
        }
    }

    /// Connections open now (handshaking, established or closing).
    pub fn open_connections(&self) -> usize {
        lock(&self.shared).by_handle.len()
    }
}

/// Receive buffer for one batch: quinn's own sizing (largest datagram × GRO segments × batch).
fn recv_buffer_len(cfg: &EndpointConfig, socket: &dyn AsyncUdpSocket) -> usize {
    (cfg.get_max_udp_payload_size().min(64 * 1024) as usize)
        * socket.max_receive_segments()
        * udp::BATCH_SIZE
}

/// The one task that drives the endpoint and all its connections.
struct Driver {
    shared: Arc<Shared>,
    socket: Arc<dyn AsyncUdpSocket>,
    recv_buf: Box<[u8]>,
    sleep: Pin<Box<tokio::time::Sleep>>,
    /// Where `sleep` is set (resetting a tokio timer is not free).
    sleep_at: Option<Instant>,
}

impl Future for Driver {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        {
            let mut st = lock(&this.shared);
            st.sched.driving = true;
            if !st
                .sched
                .driver
                .as_ref()
                .is_some_and(|w| w.will_wake(cx.waker()))
            {
                st.sched.driver = Some(cx.waker().clone());
            }
        }
        // The lock is taken per step (a datagram, the due timers, one connection's turn),
        // never for a whole round: application tasks on other threads use the same lock.
        for _ in 0..ROUNDS_PER_POLL {
            let received = this.receive(cx);
            let t = now();
            lock(&this.shared).fire_timers(t);
            let sent = this.drive_dirty(cx, t);
            let mut st = lock(&this.shared);
            if st.closed && st.conns.is_empty() {
                return Poll::Ready(());
            }
            if received || sent || !st.sched.dirty.is_empty() {
                continue;
            }
            if let Some(&(at, _)) = st.timers.first() {
                if this.sleep_at != Some(at) {
                    this.sleep.as_mut().reset(at.into());
                    this.sleep_at = Some(at);
                }
                if this.sleep.as_mut().poll(cx).is_ready() {
                    this.sleep_at = None;
                    continue;
                }
            }
            // Checked `dirty` under this same lock: a handle touching a connection from now
            // on sees `driving == false` and wakes us.
            st.sched.driving = false;
            return Poll::Pending;
        }
        // Still busy: let other tasks run, then come back.
        lock(&this.shared).sched.driving = false;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl Driver {
    /// Read one batch from the socket and hand each datagram to the endpoint; true if any
    /// arrived. The socket is read without the lock.
    fn receive(&mut self, cx: &mut Context<'_>) -> bool {
        let mut metas = [RecvMeta::default(); udp::BATCH_SIZE];
        let chunk = self.recv_buf.len() / udp::BATCH_SIZE;
        let n = {
            let mut iovs: Vec<IoSliceMut<'_>> = self
                .recv_buf
                .chunks_mut(chunk)
                .map(IoSliceMut::new)
                .collect();
            match self.socket.poll_recv(cx, &mut iovs, &mut metas) {
                Poll::Ready(Ok(n)) => n,
                Poll::Ready(Err(e)) => {
                    // quinn treats these as transient too (e.g. ICMP errors surfacing).
                    tracing::debug!(error = %e, "compact endpoint: receive error");
                    cx.waker().wake_by_ref();
                    return false;
                }
                Poll::Pending => return false,
            }
        };
        let t = now();
        for (meta, data) in metas.iter().zip(self.recv_buf.chunks(chunk)).take(n) {
            let stride = meta.stride.max(1);
            for d in data[..meta.len].chunks(stride) {
                let ecn = meta
                    .ecn
                    .and_then(|e| proto::EcnCodepoint::from_bits(e as u8));
                lock(&self.shared).datagram(t, meta.addr, meta.dst_ip, ecn, d);
            }
        }
        true
    }

    /// Give each connection queued now its turn; true if any work was done. Connections
    /// queued meanwhile (by another's endpoint events) wait for the next round, so one busy
    /// connection cannot starve the socket.
    fn drive_dirty(&mut self, cx: &mut Context<'_>, t: Instant) -> bool {
        let queued = lock(&self.shared).sched.dirty.len();
        let mut worked = false;
        for _ in 0..queued {
            let mut st = lock(&self.shared);
            if !st.flush_blocked(cx) {
                return worked;
            }
            let Some(id) = st.sched.dirty.pop_front() else {
                break;
            };
            worked = true;
            if !st.drive(cx, id, t) {
                // The socket is full: resume this connection first once it drains.
                st.sched.dirty.push_front(id);
                if let Some(c) = st.conns.get_mut(&id) {
                    c.dirty = true;
                }
                return true;
            }
        }
        worked
    }
}

impl State {
    fn datagram(
        &mut self,
        t: Instant,
        remote: SocketAddr,
        local_ip: Option<std::net::IpAddr>,
        ecn: Option<proto::EcnCodepoint>,
        data: &[u8],
    ) {
        let mut resp = Vec::new();
        match self
            .proto
            .handle(t, remote, local_ip, ecn, BytesMut::from(data), &mut resp)
        {
            Some(proto::DatagramEvent::ConnectionEvent(h, ev)) => {
                if let Some(id) = self.by_handle.get(&h).copied() {
                    if let Some(c) = self.conns.get_mut(&id) {
                        if let Some(p) = c.proto.as_mut() {
                            p.handle_event(ev);
                        }
                        self.sched.touch(id, c);
                    }
                }
            }
            Some(proto::DatagramEvent::NewConnection(incoming)) => {
                if self.closed || self.by_handle.len() >= self.max_connections {
                    let tx = self.proto.refuse(incoming, &mut resp);
                    self.send_response(&tx, &resp);
                    return;
                }
                match self.proto.accept(incoming, t, &mut resp, None) {
                    Ok((h, conn)) => {
                        let id = self.next_id;
                        self.next_id += 1;
                        let mut c = Box::new(Conn {
                            remote: conn.remote_address(),
                            proto: Some(conn),
                            handle: h,
                            error: None,
                            refs: 0,
                            timer: None,
                            dirty: false,
                            waiters: Vec::new(),
                        });
                        self.sched.touch(id, &mut c);
                        self.conns.insert(id, c);
                        self.by_handle.insert(h, id);
                    }
                    Err(e) => {
                        if let Some(tx) = e.response {
                            self.send_response(&tx, &resp);
                        }
                    }
                }
            }
            Some(proto::DatagramEvent::Response(tx)) => self.send_response(&tx, &resp),
            None => {}
        }
    }

    /// Send an endpoint-level datagram (version negotiation, stateless reset, refusal); if the
    /// socket is full it is dropped, as a full network queue would.
    fn send_response(&self, tx: &proto::Transmit, buf: &[u8]) {
        let _ = self.socket.try_send(&udp_transmit(tx, &buf[..tx.size]));
    }

    fn fire_timers(&mut self, t: Instant) {
        while let Some(&(at, id)) = self.timers.first() {
            if at > t {
                break;
            }
            self.timers.pop_first();
            if let Some(c) = self.conns.get_mut(&id) {
                c.timer = None;
                if let Some(p) = c.proto.as_mut() {
                    p.handle_timeout(t);
                }
                self.sched.touch(id, c);
            }
        }
    }

    /// Retry a transmit the socket refused; false while it still would block.
    fn flush_blocked(&mut self, cx: &mut Context<'_>) -> bool {
        flush(
            self.socket.as_ref(),
            &mut self.poller,
            &mut self.blocked,
            &self.send_buf,
            cx,
        )
    }

    /// One connection's turn: transmits, endpoint events, application events, timer. False if
    /// the socket would block.
    fn drive(&mut self, cx: &mut Context<'_>, id: u64, t: Instant) -> bool {
        let Some(c) = self.conns.get_mut(&id) else {
            return true;
        };
        c.dirty = false;
        let Some(p) = c.proto.as_mut() else {
            return true;
        };
        let segments = self.socket.max_transmit_segments();
        let mut sent = 0;
        loop {
            self.send_buf.clear();
            let Some(tx) = p.poll_transmit(t, segments, &mut self.send_buf) else {
                break;
            };
            self.blocked = Some(tx);
            sent += 1;
            if !flush(
                self.socket.as_ref(),
                &mut self.poller,
                &mut self.blocked,
                &self.send_buf,
                cx,
            ) {
                return false;
            }
            if sent >= MAX_TRANSMITS_PER_TURN {
                // Come back after the others.
                self.sched.touch(id, c);
                break;
            }
        }
        while let Some(ev) = c.proto.as_mut().expect("alive").poll_endpoint_events() {
            if let Some(back) = self.proto.handle_event(c.handle, ev) {
                c.proto.as_mut().expect("alive").handle_event(back);
                self.sched.touch(id, c);
            }
        }
        while let Some(ev) = c.proto.as_mut().expect("alive").poll() {
            match ev {
                proto::Event::Connected => {
                    if self.closed || self.accept_queue.len() >= MAX_PENDING_ACCEPT {
                        c.proto.as_mut().expect("alive").close(
                            t,
                            0u32.into(),
                            bytes::Bytes::from_static(b"server busy"),
                        );
                        self.sched.touch(id, c);
                    } else {
                        c.refs += 1;
                        self.accept_queue.push_back(id);
                        if let Some(w) = self.acceptor.take() {
                            w.wake();
                        }
                    }
                }
                proto::Event::ConnectionLost { reason } => {
                    c.error = Some(reason);
                    c.wake_all();
                }
                proto::Event::Stream(s) => match s {
                    StreamEvent::Opened { dir } => c.wake(Waiter::Accept(dir)),
                    StreamEvent::Readable { id } => c.wake(Waiter::Read(id)),
                    StreamEvent::Writable { id }
                    | StreamEvent::Finished { id }
                    | StreamEvent::Stopped { id, .. } => c.wake(Waiter::Write(id)),
                    StreamEvent::Available { dir } => c.wake(Waiter::Open(dir)),
                },
                proto::Event::HandshakeDataReady
                | proto::Event::DatagramReceived
                | proto::Event::DatagramsUnblocked => {}
            }
        }
        let p = c.proto.as_ref().expect("alive");
        if p.is_drained() {
            // The endpoint freed the handle with the drained event above.
            c.proto = None;
            self.by_handle.remove(&c.handle);
            if let Some(at) = c.timer.take() {
                self.timers.remove(&(at, id));
            }
            c.wake_all();
            if c.refs == 0 {
                self.conns.remove(&id);
            }
            return true;
        }
        let next = c.proto.as_mut().expect("alive").poll_timeout();
        if next != c.timer {
            if let Some(at) = c.timer {
                self.timers.remove(&(at, id));
            }
            if let Some(at) = next {
                self.timers.insert((at, id));
            }
            c.timer = next;
        }
        true
    }
}

/// Send `blocked` (its bytes in `buf`) if there is one; false while the socket would block.
fn flush(
    socket: &dyn AsyncUdpSocket,
    poller: &mut Pin<Box<dyn UdpPoller>>,
    blocked: &mut Option<proto::Transmit>,
    buf: &[u8],
    cx: &mut Context<'_>,
) -> bool {
    let Some(tx) = blocked.take() else {
        return true;
    };
    loop {
        match socket.try_send(&udp_transmit(&tx, &buf[..tx.size])) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                match poller.as_mut().poll_writable(cx) {
                    Poll::Ready(_) => continue,
                    Poll::Pending => {
                        *blocked = Some(tx);
                        return false;
                    }
                }
            }
            // Other send errors lose the datagram; QUIC's recovery resends what matters.
            _ => return true,
        }
    }
}

fn udp_transmit<'a>(t: &proto::Transmit, contents: &'a [u8]) -> udp::Transmit<'a> {
    udp::Transmit {
        destination: t.destination,
        ecn: t.ecn.and_then(|e| udp::EcnCodepoint::from_bits(e as u8)),
        contents,
        segment_size: t.segment_size,
        src_ip: t.src_ip,
    }
}

/// A handle on one connection of a compact [`Endpoint`]; the connection closes (code 0) when
/// the last handle to it, streams included, is dropped.
pub struct Connection {
    shared: Arc<Shared>,
    id: u64,
}

impl Connection {
    /// The peer's address.
    pub fn remote_address(&self) -> SocketAddr {
        self.with(|c, _| c.remote)
    }

    /// Close the connection with an application error code and reason.
    pub fn close(&self, code: u32, reason: &[u8]) {
        self.with(|c, s| {
            if let Some(p) = c.proto.as_mut() {
                p.close(now(), code.into(), bytes::Bytes::copy_from_slice(reason));
            }
            s.touch(self.id, c);
        })
    }

    /// Why the connection ended, if it has.
    pub fn close_reason(&self) -> Option<proto::ConnectionError> {
        self.with(|c, _| c.error.clone())
    }

    /// Run `f` on this connection's state under the endpoint's lock.
    fn with<R>(&self, f: impl FnOnce(&mut Conn, &mut Sched) -> R) -> R {
        let mut st = lock(&self.shared);
        let st = &mut *st;
        let c = st
            .conns
            .get_mut(&self.id)
            .expect("a connection outlives its handles");
        f(c, &mut st.sched)
    }
}

impl Clone for Connection {
    fn clone(&self) -> Self {
        self.with(|c, _| c.refs += 1);
        Connection {
            shared: self.shared.clone(),
            id: self.id,
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let mut st = lock(&self.shared);
        let st = &mut *st;
        let Some(c) = st.conns.get_mut(&self.id) else {
            return;
        };
        c.refs -= 1;
        if c.refs > 0 {
            return;
        }
        match c.proto.as_mut() {
            Some(p) => {
                if c.error.is_none() {
                    p.close(now(), 0u32.into(), bytes::Bytes::new());
                }
                st.sched.touch(self.id, c);
            }
            None => {
                st.conns.remove(&self.id);
            }
        }
    }
}
