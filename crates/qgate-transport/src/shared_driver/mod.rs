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
//!
//! Here is the state the parts share; `endpoint` holds the endpoint's handle and budgets,
//! `driver` the task, `connection` and `streams` the application's handles.

mod connection;
mod driver;
mod endpoint;
mod streams;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Waker;
use std::time::{Duration, Instant};

use quinn::{AsyncUdpSocket, Runtime, ServerConfig, TokioRuntime};
use quinn_proto as proto;
use quinn_proto::{ConnectionHandle, Dir, StreamId};

use qgate_core::sync::lock;

pub use connection::Connection;
pub use endpoint::{Endpoint, EndpointStats, Limits};
pub use streams::{BidiStream, RecvStream, SendStream};

/// The clock quinn uses: tokio's, so simulations in virtual time work.
fn now() -> Instant {
    TokioRuntime.now()
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
    /// Until its handshake finishes: closed then if the peer has sent nothing more
    /// ([`Limits::handshake_silence`], decision G26).
    silence_deadline: Option<Instant>,
    /// The client it counts for while handshaking: its address, or its IPv6 /64 (G26).
    client: std::net::IpAddr,
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
    /// Handshakes in progress per client (entries at zero are removed; decision G26).
    handshaking_by_client: HashMap<std::net::IpAddr, usize>,
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
    /// A handshake of `client` ended (connected or drained): its places are given back.
    fn handshake_ended(&mut self, client: std::net::IpAddr) {
        self.handshaking -= 1;
        if let Some(n) = self.handshaking_by_client.get_mut(&client) {
            *n -= 1;
            if *n == 0 {
                self.handshaking_by_client.remove(&client);
            }
        }
    }

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
