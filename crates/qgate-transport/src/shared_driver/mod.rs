//! A shared-driver QUIC server endpoint: quinn-proto connections without a task or channel each.
//!
//! quinn gives each connection its own driver task and an event channel whose first block alone
//! is ~7 KB; a gateway holding 10 000 mostly idle device connections pays that, a send buffer and
//! a task 10 000 times (decision G9). Here one driver task receives datagrams, fires timers and
//! sends for all connections. Application tasks work on a connection under its own lock and
//! queue it for the driver when they gave it something to send; the turn comes after they
//! yield, so a response's headers, body and end leave in one packet, as with quinn's deferred
//! wake-ups. The handles ([`Connection`] and its streams) implement h3's QUIC traits, so HTTP/3
//! runs on top unchanged. The protocol is quinn-proto's: this module is only the I/O shell, on
//! the same sockets (real UDP or simulated) as [`crate::endpoint`].
//!
//! Locks: the endpoint's table and each connection have their own; a connection's lock may be
//! held while taking the endpoint's, never the other way round.
//!
//! Budgets ([`Limits`], decision G12): established connections and handshakes in progress are
//! counted apart, so a flood of Initials cannot take the slots of devices; above a threshold of
//! handshakes in progress a new client must prove its address with a Retry round trip first
//! (RFC 9000 §8.1.2), which costs the endpoint one stateless packet and no state; a handshake
//! that has not finished within its deadline is closed.

mod streams;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::future::Future;
use std::io::IoSliceMut;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use quinn::udp::{self, RecvMeta};
use quinn::{AsyncUdpSocket, EndpointConfig, Runtime, ServerConfig, TokioRuntime, UdpPoller};
use quinn_proto as proto;
use quinn_proto::{ConnectionHandle, Dir, StreamEvent, StreamId};

pub use streams::{BidiStream, RecvStream, SendStream};

use crate::{Socket, TransportError};
use qgate_core::sync::lock;

/// Connections whose handshake finished but that [`Endpoint::accept`] has not taken yet; more
/// are closed at once (the application is not keeping up).
const MAX_PENDING_ACCEPT: usize = 1024;
/// Datagrams one connection may send per turn before others get theirs.
const MAX_TRANSMITS_PER_TURN: usize = 32;
/// Rounds of receive/timers/queued connections per driver poll before it yields.
const ROUNDS_PER_POLL: usize = 16;

/// An endpoint's connection budgets (decision G12).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most connections with state, established or handshaking; a new one beyond is refused
    /// (CONNECTION_REFUSED).
    pub max_connections: usize,
    /// Most handshakes in progress, a budget of their own within `max_connections`; an Initial
    /// beyond it is ignored (the client's own retransmission tries again later).
    pub max_handshakes: usize,
    /// With this many handshakes in progress, a client that has not proved its address is
    /// sent a Retry (RFC 9000 §8.1.2) instead of getting state.
    pub retry_above: usize,
    /// A handshake not finished within this long is closed.
    pub handshake_timeout: Duration,
    /// Once the last handle is dropped, the close waits at most this long for the peer to
    /// acknowledge the answers already finished (decision G19).
    pub linger: Duration,
}

impl Limits {
    /// The defaults besides `max_connections`: 256 handshakes, Retry above 16, 10 s to finish,
    /// 10 s to linger.
    pub const DEFAULT: Limits = Limits {
        max_connections: 1024,
        max_handshakes: 256,
        retry_above: 16,
        handshake_timeout: Duration::from_secs(10),
        linger: Duration::from_secs(10),
    };

    /// The defaults with `max_connections` established connections.
    pub fn with_connections(max_connections: usize) -> Limits {
        Limits {
            max_connections,
            ..Limits::DEFAULT
        }
    }
}

/// What an endpoint has done with new connections (read any time; exported as metrics).
#[derive(Debug, Default)]
pub struct EndpointStats {
    /// Handshakes in progress now.
    pub handshaking: AtomicUsize,
    /// Established connections now.
    pub established: AtomicUsize,
    /// Retry packets sent to unproved addresses.
    pub retries: AtomicU64,
    /// New connections refused: every established slot taken.
    pub refused_full: AtomicU64,
    /// Initials ignored: the handshake budget was spent.
    pub ignored_busy: AtomicU64,
    /// Handshakes closed at their deadline.
    pub handshake_timeouts: AtomicU64,
}

/// The clock quinn uses: tokio's, so simulations in virtual time work.
fn now() -> Instant {
    TokioRuntime.now()
}

/// A QUIC server endpoint whose connections share one driver task. Once every handle to it is
/// dropped it accepts no more connections; the driver ends when the last connection has.
pub struct Endpoint {
    shared: Arc<Shared>,
}

struct Shared {
    ep: Mutex<EpState>,
    socket: Arc<dyn AsyncUdpSocket>,
    local: SocketAddr,
    stats: Arc<EndpointStats>,
    /// [`Limits::linger`].
    linger: Duration,
}

/// What a task waits for on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waiter {
    Read(StreamId),
    Write(StreamId),
    Accept(Dir),
    Open(Dir),
}

/// One connection: its lock, and whether the driver has it queued.
struct ConnCell {
    id: u64,
    queued: AtomicBool,
    conn: Mutex<Conn>,
}

/// One connection's state machine and who waits on it.
struct Conn {
    /// None once drained: the state machine is freed while handles may still be alive.
    proto: Option<proto::Connection>,
    handle: ConnectionHandle,
    remote: SocketAddr,
    /// Until its handshake finishes: the deadline for it.
    handshake_deadline: Option<Instant>,
    /// Its handshake finished (it counts as established, not handshaking).
    established: bool,
    /// Handed to [`Endpoint::accept`]: after its handshake, or before it once the peer's 0-RTT
    /// data was accepted (decision G18).
    surfaced: bool,
    /// Why it ended, once it has.
    error: Option<proto::ConnectionError>,
    /// Live handles (connection, opener, streams; a queued accept counts as one).
    refs: usize,
    /// The wake-up registered in the endpoint's timer set.
    timer: Option<Instant>,
    waiters: Vec<(Waiter, Waker)>,
    /// A datagram the socket refused (would block), sent first on the next turn.
    blocked: Option<(proto::Transmit, Box<[u8]>)>,
    /// Bidirectional streams the application finished whose data the peer has not acknowledged
    /// yet (at most the peer's concurrent-stream limit: quinn-proto frees a stream's credit
    /// only once its data is acknowledged).
    unacked: Vec<StreamId>,
    /// A graceful close waiting for `unacked` (boxed: most connections never have one).
    linger: Option<Box<Linger>>,
}

/// A close deferred until the peer has acknowledged every finished answer (decision G19).
struct Linger {
    /// The close happens then at the latest.
    until: Instant,
    code: proto::VarInt,
    reason: bytes::Bytes,
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
        for (_, k) in std::mem::take(&mut self.waiters) {
            k.wake();
        }
    }

    /// The application finished the sending half of stream `id`.
    fn finished(&mut self, id: StreamId) {
        if id.dir() == Dir::Bi {
            self.unacked.push(id);
        }
    }

    /// Stream `id`'s sending half is done with: acknowledged, stopped by the peer, or reset.
    fn acked(&mut self, id: StreamId) {
        if let Some(i) = self.unacked.iter().position(|&x| x == id) {
            self.unacked.swap_remove(i);
            if self.unacked.is_empty() {
                // An idle connection keeps no allocation for it (G9).
                self.unacked = Vec::new();
            }
        }
    }

    /// Close without an error: at once if the peer has acknowledged every answer finished, or
    /// once it has, within `linger` (G19). A close discards what is not yet sent (or must be
    /// sent again): a server ending after a GOAWAY would lose the rest of its answers.
    fn close_gracefully(&mut self, linger: Duration, code: proto::VarInt, reason: bytes::Bytes) {
        let Some(p) = self.proto.as_mut() else { return };
        if self.error.is_some() || p.is_closed() || self.linger.is_some() {
            return;
        }
        let t = now();
        if self.unacked.is_empty() {
            p.close(t, code, reason);
        } else {
            self.linger = Some(Box::new(Linger {
                until: t + linger,
                code,
                reason,
            }));
        }
    }
}

/// Set by an operation on a connection that may have given it something to send (the handle
/// then queues the connection for the driver).
struct Touch(bool);

impl Touch {
    fn touch(&mut self) {
        self.0 = true;
    }
}

struct EpState {
    proto: proto::Endpoint,
    conns: HashMap<u64, Arc<ConnCell>>,
    /// The base configuration and options when each connection needs its own (a qlog file).
    per_connection: Option<(ServerConfig, crate::TransportOptions)>,
    by_handle: HashMap<ConnectionHandle, u64>,
    next_id: u64,
    limits: Limits,
    /// Handshakes in progress (accepted, neither connected nor drained).
    handshaking: usize,
    /// Connected and not yet drained.
    established: usize,
    /// Handed to `accept` before their handshake finished, and still handshaking.
    early: usize,
    timers: BTreeSet<(Instant, u64)>,
    /// Connections the driver should give a turn (datagrams arrived, timer due, socket full).
    queue: VecDeque<u64>,
    driver: Option<Waker>,
    /// The driver is running and looks at `queue` before it sleeps: no need to wake it.
    driving: bool,
    /// A send would block: the driver waits for the socket to drain.
    send_blocked: bool,
    accept_queue: VecDeque<u64>,
    acceptor: Option<Waker>,
    /// No more connections are accepted.
    closed: bool,
    /// Live [`Endpoint`] handles.
    endpoints: usize,
}

impl EpState {
    /// Copy the connection gauges into `stats` (read without the endpoint's lock).
    fn publish(&self, stats: &EndpointStats) {
        stats.handshaking.store(self.handshaking, Ordering::Relaxed);
        stats.established.store(self.established, Ordering::Relaxed);
    }

    /// Queue `cell` for a turn of the driver.
    fn enqueue(&mut self, cell: &ConnCell) {
        if !cell.queued.swap(true, Ordering::AcqRel) {
            self.queue.push_back(cell.id);
            if !self.driving {
                if let Some(w) = &self.driver {
                    w.wake_by_ref();
                }
            }
        }
    }
}

impl Endpoint {
    /// A server on `socket` with `server`'s TLS and transport settings (built from `opts`,
    /// which also say whether each connection writes a qlog file), within `limits`. `seed`
    /// makes quinn-proto's random choices reproducible, as simulations need.
    pub fn server(
        socket: Socket,
        server: ServerConfig,
        opts: &crate::TransportOptions,
        seed: Option<u64>,
        limits: Limits,
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
        let per_connection = opts
            .qlog_dir
            .is_some()
            .then(|| (server.clone(), opts.clone()));
        let ep = EpState {
            per_connection,
            proto: proto::Endpoint::new(
                Arc::new(cfg),
                Some(Arc::new(server)),
                !socket.may_fragment(),
                None,
            ),
            conns: HashMap::new(),
            by_handle: HashMap::new(),
            next_id: 0,
            limits,
            handshaking: 0,
            established: 0,
            early: 0,
            timers: BTreeSet::new(),
            queue: VecDeque::new(),
            driver: None,
            driving: false,
            send_blocked: false,
            accept_queue: VecDeque::new(),
            acceptor: None,
            closed: false,
            endpoints: 1,
        };
        let shared = Arc::new(Shared {
            ep: Mutex::new(ep),
            socket: socket.clone(),
            local,
            stats: Arc::default(),
            linger: limits.linger,
        });
        tokio::spawn(Driver {
            shared: shared.clone(),
            poller: socket.create_io_poller(),
            recv_buf: vec![0; recv_len].into_boxed_slice(),
            send_buf: Vec::new(),
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            sleep_at: None,
        });
        Ok(Endpoint { shared })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local
    }

    /// The next connection whose handshake has finished, or whose peer's 0-RTT data was
    /// accepted ([`Connection::is_established`] tells which; decision G18); `None` once the
    /// endpoint is closed.
    pub fn accept(&self) -> impl Future<Output = Option<Connection>> + '_ {
        std::future::poll_fn(move |cx| {
            let mut ep = lock(&self.shared.ep);
            while let Some(id) = ep.accept_queue.pop_front() {
                // The queue's reference passes to the handle.
                if let Some(cell) = ep.conns.get(&id) {
                    return Poll::Ready(Some(Connection {
                        shared: self.shared.clone(),
                        cell: cell.clone(),
                    }));
                }
            }
            if ep.closed {
                return Poll::Ready(None);
            }
            ep.acceptor = Some(cx.waker().clone());
            Poll::Pending
        })
    }

    /// Stop accepting (a draining service): new connections are refused, [`accept`](Self::accept)
    /// ends once the handshakes already finished are taken, and open connections carry on
    /// until they or [`close`](Self::close) end them.
    pub fn stop_accepting(&self) {
        let mut ep = lock(&self.shared.ep);
        ep.closed = true;
        if let Some(w) = ep.acceptor.take() {
            w.wake();
        }
    }

    /// Close every connection with `code` and `reason`, and stop accepting.
    pub fn close(&self, code: u32, reason: &[u8]) {
        let (cells, queued) = {
            let mut ep = lock(&self.shared.ep);
            ep.closed = true;
            if let Some(w) = ep.acceptor.take() {
                w.wake();
            }
            let queued: Vec<u64> = ep.accept_queue.drain(..).collect();
            let cells: Vec<Arc<ConnCell>> = ep.conns.values().cloned().collect();
            (cells, queued)
        };
        let t = now();
        for cell in cells {
            let mut c = lock(&cell.conn);
            if queued.contains(&cell.id) {
                c.refs -= 1;
            }
            if let Some(p) = c.proto.as_mut() {
                p.close(t, code.into(), bytes::Bytes::copy_from_slice(reason));
                queue(&self.shared, &cell);
            } else if c.refs == 0 {
                lock(&self.shared.ep).conns.remove(&cell.id);
            }
        }
    }

    /// Connections open now (handshaking, established or closing).
    pub fn open_connections(&self) -> usize {
        lock(&self.shared.ep).by_handle.len()
    }

    /// What the endpoint has done with new connections; the counters stay readable after the
    /// endpoint is gone.
    pub fn stats(&self) -> Arc<EndpointStats> {
        self.shared.stats.clone()
    }
}

impl Clone for Endpoint {
    fn clone(&self) -> Self {
        lock(&self.shared.ep).endpoints += 1;
        Endpoint {
            shared: self.shared.clone(),
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let queued: Vec<Arc<ConnCell>> = {
            let mut ep = lock(&self.shared.ep);
            ep.endpoints -= 1;
            if ep.endpoints > 0 {
                return;
            }
            ep.closed = true;
            if let Some(w) = &ep.driver {
                w.wake_by_ref();
            }
            let ids: Vec<u64> = ep.accept_queue.drain(..).collect();
            ids.iter()
                .filter_map(|id| ep.conns.get(id).cloned())
                .collect()
        };
        // Nobody can accept the queued connections any more.
        for cell in queued {
            release(&self.shared, &cell, &mut lock(&cell.conn));
        }
    }
}

/// Receive buffer for one batch: quinn's own sizing (largest datagram × GRO segments × batch).
fn recv_buffer_len(cfg: &EndpointConfig, socket: &dyn AsyncUdpSocket) -> usize {
    (cfg.get_max_udp_payload_size().min(64 * 1024) as usize)
        * socket.max_receive_segments()
        * udp::BATCH_SIZE
}

/// Queue `cell` for the driver; a connection already queued (several datagrams or writes
/// before its turn) costs no endpoint lock.
fn queue(shared: &Shared, cell: &ConnCell) {
    if !cell.queued.load(Ordering::Acquire) {
        lock(&shared.ep).enqueue(cell);
    }
}

/// Drop one reference to a connection: the last one closes it (code 0) once the answers it
/// finished are acknowledged, or frees it if it has already drained.
fn release(shared: &Shared, cell: &ConnCell, c: &mut Conn) {
    c.refs -= 1;
    if c.refs > 0 {
        return;
    }
    match c.proto {
        Some(_) => {
            c.close_gracefully(shared.linger, 0u32.into(), bytes::Bytes::new());
            queue(shared, cell);
        }
        None => {
            lock(&shared.ep).conns.remove(&cell.id);
        }
    }
}

/// Hand `cell` to [`Endpoint::accept`] (the queue holds a reference until it is taken).
fn surface(ep: &mut EpState, cell: &ConnCell, c: &mut Conn) {
    c.surfaced = true;
    c.refs += 1;
    ep.accept_queue.push_back(cell.id);
    if let Some(w) = ep.acceptor.take() {
        w.wake();
    }
}

/// One turn of a connection (the driver's, under the connection's lock): due timer, transmits
/// (built in `buf`), endpoint and application events, drain, next timer. If the socket would
/// block, the rest waits for the next turn.
fn drive(shared: &Shared, cell: &ConnCell, c: &mut Conn, t: Instant, buf: &mut Vec<u8>) {
    if c.proto.is_none() {
        return;
    }
    // A due timer (its entry may already be gone from the endpoint's set): handle it, and
    // register whatever comes next even if it looks unchanged.
    let timed_out = c.timer.is_some_and(|at| at <= t);
    if timed_out {
        c.proto.as_mut().expect("alive").handle_timeout(t);
    }
    if c.handshake_deadline.is_some_and(|at| at <= t) {
        c.handshake_deadline = None;
        let p = c.proto.as_mut().expect("alive");
        // A handshake that already failed is draining: nothing to close, nothing to count.
        if !p.is_closed() {
            shared
                .stats
                .handshake_timeouts
                .fetch_add(1, Ordering::Relaxed);
            p.close(
                t,
                0u32.into(),
                bytes::Bytes::from_static(b"handshake timeout"),
            );
        }
    }
    loop {
        if !transmit(shared, cell, c, t, buf) {
            return;
        }
        let mut more = false;
        while let Some(ev) = c.proto.as_mut().expect("alive").poll_endpoint_events() {
            let back = lock(&shared.ep).proto.handle_event(c.handle, ev);
            if let Some(back) = back {
                c.proto.as_mut().expect("alive").handle_event(back);
                more = true;
            }
        }
        if !more {
            break;
        }
    }
    while let Some(ev) = c.proto.as_mut().expect("alive").poll() {
        match ev {
            proto::Event::Connected => {
                let mut ep = lock(&shared.ep);
                if !c.established {
                    c.established = true;
                    c.handshake_deadline = None;
                    ep.handshaking -= 1;
                    ep.established += 1;
                    if c.surfaced {
                        ep.early -= 1;
                    }
                    ep.publish(&shared.stats);
                }
                // A connection handed out early is already open: only the limit closes it.
                if (!c.surfaced && (ep.closed || ep.accept_queue.len() >= MAX_PENDING_ACCEPT))
                    || ep.established > ep.limits.max_connections
                {
                    drop(ep);
                    c.proto.as_mut().expect("alive").close(
                        t,
                        0u32.into(),
                        bytes::Bytes::from_static(b"server busy"),
                    );
                    // Send the close on the next turn.
                    queue(shared, cell);
                } else if !c.surfaced {
                    surface(&mut ep, cell, c);
                }
            }
            proto::Event::ConnectionLost { reason } => {
                c.error = Some(reason);
                c.wake_all();
            }
            proto::Event::Stream(s) => match s {
                StreamEvent::Opened { dir } => c.wake(Waiter::Accept(dir)),
                StreamEvent::Readable { id } => c.wake(Waiter::Read(id)),
                StreamEvent::Writable { id } => c.wake(Waiter::Write(id)),
                StreamEvent::Finished { id } | StreamEvent::Stopped { id, .. } => {
                    c.acked(id);
                    c.wake(Waiter::Write(id));
                }
                StreamEvent::Available { dir } => c.wake(Waiter::Open(dir)),
            },
            proto::Event::HandshakeDataReady
            | proto::Event::DatagramReceived
            | proto::Event::DatagramsUnblocked => {}
        }
    }
    // 0-RTT data accepted: the application may read it now, before the handshake finishes, if
    // the connection would fit once established with the others handed out early (G18).
    let p = c.proto.as_ref().expect("alive");
    if !c.surfaced && !c.established && p.has_0rtt() && !p.is_closed() {
        let mut ep = lock(&shared.ep);
        if !ep.closed
            && ep.accept_queue.len() < MAX_PENDING_ACCEPT
            && ep.established + ep.early < ep.limits.max_connections
        {
            ep.early += 1;
            surface(&mut ep, cell, c);
        }
    }
    let p = c.proto.as_mut().expect("alive");
    if let Some(l) = &c.linger {
        if p.is_closed() || c.unacked.is_empty() || l.until <= t {
            let l = c.linger.take().expect("lingering");
            if !p.is_closed() {
                p.close(t, l.code, l.reason);
                // Send the close on the next turn.
                queue(shared, cell);
            }
        }
    }
    let next = if p.is_drained() {
        None
    } else {
        [
            p.poll_timeout(),
            c.handshake_deadline,
            c.linger.as_ref().map(|l| l.until),
        ]
        .into_iter()
        .flatten()
        .min()
    };
    let drained = p.is_drained();
    if next != c.timer || drained || timed_out {
        let mut ep = lock(&shared.ep);
        if let Some(at) = c.timer {
            ep.timers.remove(&(at, cell.id));
        }
        if let Some(at) = next {
            ep.timers.insert((at, cell.id));
        }
        c.timer = next;
        if drained {
            // The endpoint freed the handle with the drained event above.
            ep.by_handle.remove(&c.handle);
            if c.established {
                ep.established -= 1;
            } else {
                ep.handshaking -= 1;
                if c.surfaced {
                    ep.early -= 1;
                }
            }
            ep.publish(&shared.stats);
            if c.refs == 0 {
                ep.conns.remove(&cell.id);
            }
        }
    }
    if drained {
        c.proto = None;
        c.blocked = None;
        c.wake_all();
    }
}

/// Send what the connection has (at most a turn's worth); false if the socket would block,
/// in which case the connection is queued again and the driver waits for the socket.
fn transmit(shared: &Shared, cell: &ConnCell, c: &mut Conn, t: Instant, buf: &mut Vec<u8>) -> bool {
    if let Some((tx, data)) = c.blocked.take() {
        if !send(shared, cell, &tx, &data) {
            c.blocked = Some((tx, data));
            return false;
        }
    }
    let segments = shared.socket.max_transmit_segments();
    for _ in 0..MAX_TRANSMITS_PER_TURN {
        buf.clear();
        let Some(tx) = c
            .proto
            .as_mut()
            .expect("alive")
            .poll_transmit(t, segments, buf)
        else {
            return true;
        };
        if !send(shared, cell, &tx, &buf[..tx.size]) {
            let data = buf[..tx.size].into();
            c.blocked = Some((tx, data));
            return false;
        }
    }
    // More to send: come back after the others.
    queue(shared, cell);
    true
}

/// Send one datagram; false (and the driver told) if the socket would block. Other errors
/// lose the datagram; QUIC's recovery resends what matters.
fn send(shared: &Shared, cell: &ConnCell, tx: &proto::Transmit, data: &[u8]) -> bool {
    match shared.socket.try_send(&udp_transmit(tx, data)) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
            let mut ep = lock(&shared.ep);
            ep.send_blocked = true;
            ep.enqueue(cell);
            if let Some(w) = &ep.driver {
                w.wake_by_ref();
            }
            false
        }
        _ => true,
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

/// The one task that receives for the endpoint, fires timers, and gives queued connections
/// their turn.
struct Driver {
    shared: Arc<Shared>,
    poller: Pin<Box<dyn UdpPoller>>,
    recv_buf: Box<[u8]>,
    /// Datagrams are built here, for every connection in turn.
    send_buf: Vec<u8>,
    sleep: Pin<Box<tokio::time::Sleep>>,
    /// Where `sleep` is set (resetting a tokio timer is not free).
    sleep_at: Option<Instant>,
}

impl Future for Driver {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        {
            let mut ep = lock(&this.shared.ep);
            ep.driving = true;
            if !ep.driver.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                ep.driver = Some(cx.waker().clone());
            }
        }
        for _ in 0..ROUNDS_PER_POLL {
            let received = this.receive(cx);
            let t = now();
            this.fire_timers(t);
            let worked = this.run_queue(cx, t);
            let mut ep = lock(&this.shared.ep);
            if ep.closed && ep.conns.is_empty() {
                return Poll::Ready(());
            }
            if received || worked || (!ep.queue.is_empty() && !ep.send_blocked) {
                continue;
            }
            if let Some(&(at, _)) = ep.timers.first() {
                if this.sleep_at != Some(at) {
                    this.sleep.as_mut().reset(at.into());
                    this.sleep_at = Some(at);
                }
                if this.sleep.as_mut().poll(cx).is_ready() {
                    this.sleep_at = None;
                    continue;
                }
            }
            // `queue` was checked under this same lock: whoever queues a connection from now
            // on sees `driving == false` and wakes us.
            ep.driving = false;
            return Poll::Pending;
        }
        // Still busy: let other tasks run, then come back.
        lock(&this.shared.ep).driving = false;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl Driver {
    /// Read one batch from the socket and hand each datagram to its connection (queued for a
    /// turn, so several datagrams are answered together); true if any arrived.
    fn receive(&mut self, cx: &mut Context<'_>) -> bool {
        let mut metas = [RecvMeta::default(); udp::BATCH_SIZE];
        let chunk = self.recv_buf.len() / udp::BATCH_SIZE;
        let n = {
            let mut iovs: Vec<IoSliceMut<'_>> = self
                .recv_buf
                .chunks_mut(chunk)
                .map(IoSliceMut::new)
                .collect();
            match self.shared.socket.poll_recv(cx, &mut iovs, &mut metas) {
                Poll::Ready(Ok(n)) => n,
                Poll::Ready(Err(e)) => {
                    // quinn treats these as transient too (e.g. ICMP errors surfacing).
                    tracing::debug!(error = %e, "shared-driver endpoint: receive error");
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
                datagram(&self.shared, t, meta.addr, meta.dst_ip, ecn, d);
            }
        }
        true
    }

    fn fire_timers(&mut self, t: Instant) {
        let mut ep = lock(&self.shared.ep);
        while let Some(&(at, id)) = ep.timers.first() {
            if at > t {
                break;
            }
            ep.timers.pop_first();
            // Its turn handles the timeout (`drive` sees `timer <= now`).
            if let Some(cell) = ep.conns.get(&id).cloned() {
                ep.enqueue(&cell);
            }
        }
    }

    /// Give each connection queued now its turn; true if any work was done.
    fn run_queue(&mut self, cx: &mut Context<'_>, t: Instant) -> bool {
        {
            let mut ep = lock(&self.shared.ep);
            if ep.send_blocked {
                match self.poller.as_mut().poll_writable(cx) {
                    Poll::Ready(_) => ep.send_blocked = false,
                    Poll::Pending => return false,
                }
            }
        }
        let queued = lock(&self.shared.ep).queue.len();
        let mut worked = false;
        for _ in 0..queued {
            let cell = {
                let mut ep = lock(&self.shared.ep);
                if ep.send_blocked {
                    break;
                }
                let Some(id) = ep.queue.pop_front() else {
                    break;
                };
                match ep.conns.get(&id) {
                    Some(cell) => cell.clone(),
                    None => continue,
                }
            };
            cell.queued.store(false, Ordering::Release);
            worked = true;
            drive(
                &self.shared,
                &cell,
                &mut lock(&cell.conn),
                t,
                &mut self.send_buf,
            );
        }
        worked
    }
}

/// One received datagram: to its connection, or a new connection, or an endpoint response.
fn datagram(
    shared: &Shared,
    t: Instant,
    remote: SocketAddr,
    local_ip: Option<std::net::IpAddr>,
    ecn: Option<proto::EcnCodepoint>,
    data: &[u8],
) {
    let mut resp = Vec::new();
    let mut ep = lock(&shared.ep);
    let event = ep
        .proto
        .handle(t, remote, local_ip, ecn, BytesMut::from(data), &mut resp);
    match event {
        Some(proto::DatagramEvent::ConnectionEvent(h, ev)) => {
            let Some(cell) = ep
                .by_handle
                .get(&h)
                .and_then(|id| ep.conns.get(id))
                .cloned()
            else {
                return;
            };
            drop(ep);
            let mut c = lock(&cell.conn);
            if let Some(p) = c.proto.as_mut() {
                p.handle_event(ev);
            }
            drop(c);
            queue(shared, &cell);
        }
        Some(proto::DatagramEvent::NewConnection(incoming)) => {
            // Decision G12: established slots, the handshake budget, then address validation.
            let l = ep.limits;
            // Connections with state (established or handshaking) stay within
            // `max_connections`; the Retry threshold keeps unproved handshakes to a few of them.
            if ep.closed || ep.established + ep.handshaking >= l.max_connections {
                shared.stats.refused_full.fetch_add(1, Ordering::Relaxed);
                let tx = ep.proto.refuse(incoming, &mut resp);
                drop(ep);
                let _ = shared.socket.try_send(&udp_transmit(&tx, &resp[..tx.size]));
                return;
            }
            if ep.handshaking >= l.max_handshakes {
                shared.stats.ignored_busy.fetch_add(1, Ordering::Relaxed);
                ep.proto.ignore(incoming);
                return;
            }
            if ep.handshaking >= l.retry_above
                && !incoming.remote_address_validated()
                && incoming.may_retry()
            {
                match ep.proto.retry(incoming, &mut resp) {
                    Ok(tx) => {
                        shared.stats.retries.fetch_add(1, Ordering::Relaxed);
                        drop(ep);
                        let _ = shared.socket.try_send(&udp_transmit(&tx, &resp[..tx.size]));
                    }
                    Err(e) => ep.proto.ignore(e.into_incoming()),
                }
                return;
            }
            let own = ep.per_connection.as_ref().and_then(|(base, opts)| {
                let peer = incoming.remote_address().to_string();
                crate::server_config_for(base, opts, &peer)
                    .inspect_err(|e| tracing::warn!(error = %e, "per-connection config"))
                    .ok()
                    .flatten()
            });
            match ep.proto.accept(incoming, t, &mut resp, own) {
                Ok((h, conn)) => {
                    let id = ep.next_id;
                    ep.next_id += 1;
                    let cell = Arc::new(ConnCell {
                        id,
                        queued: AtomicBool::new(false),
                        conn: Mutex::new(Conn {
                            remote: conn.remote_address(),
                            handshake_deadline: Some(t + l.handshake_timeout),
                            established: false,
                            surfaced: false,
                            proto: Some(conn),
                            handle: h,
                            error: None,
                            refs: 0,
                            timer: None,
                            waiters: Vec::new(),
                            blocked: None,
                            unacked: Vec::new(),
                            linger: None,
                        }),
                    });
                    ep.conns.insert(id, cell.clone());
                    ep.by_handle.insert(h, id);
                    ep.handshaking += 1;
                    ep.publish(&shared.stats);
                    ep.enqueue(&cell);
                }
                Err(e) => {
                    drop(ep);
                    if let Some(tx) = e.response {
                        let _ = shared.socket.try_send(&udp_transmit(&tx, &resp[..tx.size]));
                    }
                }
            }
        }
        // Version negotiation, stateless reset: if the socket is full it is dropped, as a
        // full network queue would.
        Some(proto::DatagramEvent::Response(tx)) => {
            drop(ep);
            let _ = shared.socket.try_send(&udp_transmit(&tx, &resp[..tx.size]));
        }
        None => {}
    }
}

/// A handle on one connection of a shared-driver [`Endpoint`]; the connection closes (code 0) when
/// the last handle to it, streams included, is dropped, once the peer has acknowledged the
/// answers finished on it (within [`Limits::linger`], decision G19).
pub struct Connection {
    shared: Arc<Shared>,
    cell: Arc<ConnCell>,
}

impl Connection {
    /// The peer's address now (it changes when the peer migrates, RFC 9000 §9).
    pub fn remote_address(&self) -> SocketAddr {
        let c = lock(&self.cell.conn);
        c.proto.as_ref().map_or(c.remote, |p| p.remote_address())
    }

    /// Close the connection with an application error code and reason.
    pub fn close(&self, code: u32, reason: &[u8]) {
        self.close_with(code.into(), reason);
    }

    /// [`close`](Self::close) with any 62-bit code (h3's codes do not fit a u32).
    fn close_with(&self, code: quinn_proto::VarInt, reason: &[u8]) {
        self.apply(|p| p.close(now(), code, bytes::Bytes::copy_from_slice(reason)));
    }

    /// Close without an error once the peer has acknowledged every answer (G19).
    fn close_gracefully(&self, code: quinn_proto::VarInt, reason: &[u8]) {
        let linger = self.shared.linger;
        self.with(|c, s| {
            c.close_gracefully(linger, code, bytes::Bytes::copy_from_slice(reason));
            s.touch();
        })
    }

    /// Run `f` on the state machine if the connection has not drained, and queue the
    /// connection for the driver (whatever `f` queued is sent on its turn).
    fn apply(&self, f: impl FnOnce(&mut proto::Connection)) {
        self.with(|c, s| {
            if let Some(p) = c.proto.as_mut() {
                f(p);
            }
            s.touch();
        })
    }

    /// Whether the handshake has finished. A connection that [`Endpoint::accept`] gave out
    /// before then carries 0-RTT data, which an attacker may have replayed (RFC 9001 §9.2).
    pub fn is_established(&self) -> bool {
        lock(&self.cell.conn).established
    }

    /// Whether the connection is closing or gone, closed by either side (a local close sets no
    /// [`close_reason`](Self::close_reason)).
    pub fn is_closed(&self) -> bool {
        let c = lock(&self.cell.conn);
        c.error.is_some() || c.proto.as_ref().is_none_or(|p| p.is_closed())
    }

    /// Why the connection ended, if it has.
    pub fn close_reason(&self) -> Option<proto::ConnectionError> {
        lock(&self.cell.conn).error.clone()
    }

    /// Run `f` on this connection under its lock; if `f` touched it, queue it for the driver.
    fn with<R>(&self, f: impl FnOnce(&mut Conn, &mut Touch) -> R) -> R {
        let mut c = lock(&self.cell.conn);
        let mut touch = Touch(false);
        let r = f(&mut c, &mut touch);
        if touch.0 {
            queue(&self.shared, &self.cell);
        }
        r
    }
}

impl Clone for Connection {
    fn clone(&self) -> Self {
        lock(&self.cell.conn).refs += 1;
        Connection {
            shared: self.shared.clone(),
            cell: self.cell.clone(),
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        release(&self.shared, &self.cell, &mut lock(&self.cell.conn));
    }
}
