//! The simulated network: hosts, interfaces, point-to-point links, routing, and the event loop
//! that moves packets through them.
//!
//! All state sits behind one mutex and is advanced by a single driver task that sleeps until the
//! next event. Link arithmetic uses the exact (nanosecond) event times, so serialisation, queueing
//! and propagation are exact; endpoints see deliveries when the tokio clock reaches them, which in
//! paused (virtual) time moves in 1 ms ticks (see docs/decisions.md).

use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;
use std::time::Duration;

use qgate_aqm::{Ecn, Packet, QueueStats};
use qgate_link::LinkModel;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::socket::SimSocket;
use crate::trace::{Trace, TraceRecord};
use crate::{LinkParams, LinkStats};

pub use qgate_link::{IPV4_UDP_OVERHEAD, IPV6_UDP_OVERHEAD};
/// Datagrams a socket buffers before it drops arrivals (like a kernel receive buffer).
pub const DEFAULT_SOCKET_RX_LIMIT: usize = 4096;

/// A host in the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostId(pub(crate) usize);
/// An interface (one address) of a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InterfaceId(pub(crate) usize);
/// A point-to-point link between two interfaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct LinkId(pub(crate) usize);

/// One direction of a link: from the first interface given to [`Network::connect`] to the
/// second (`AtoB`), or back (`BtoA`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Direction {
    /// From the link's first interface to its second.
    AtoB,
    /// From the link's second interface to its first.
    BtoA,
}

impl Direction {
    fn index(self) -> usize {
        self as usize
    }

    /// The other direction of the same link.
    pub fn reverse(self) -> Direction {
        match self {
            Direction::AtoB => Direction::BtoA,
            Direction::BtoA => Direction::AtoB,
        }
    }
}

/// Why a network operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetError {
    /// Another interface already has this address.
    #[error("address {0} is already assigned to an interface")]
    AddressTaken(IpAddr),
    /// The interface is already connected to a link (links are point-to-point).
    #[error("interface {0} is already connected to a link")]
    InterfaceBusy(IpAddr),
    /// The host has no interface with this address.
    #[error("host '{host}' has no interface with address {addr}")]
    NoSuchAddress {
        /// The host's name.
        host: String,
        /// The address asked for.
        addr: IpAddr,
    },
    /// A socket is already bound to this address and port.
    #[error("address {0} is already in use")]
    AddrInUse(SocketAddr),
    /// The host's ephemeral ports are all bound.
    #[error("no free ephemeral port on host '{0}'")]
    NoFreePort(String),
    /// Link parameters failed validation.
    #[error("invalid link parameters: {0}")]
    BadParams(String),
}

/// A datagram in flight.
#[derive(Debug)]
pub(crate) struct Datagram {
    pub(crate) src: SocketAddr,
    pub(crate) dst: SocketAddr,
    pub(crate) data: Box<[u8]>,
}

struct Host {
    name: String,
    interfaces: Vec<InterfaceId>,
    forwarding: bool,
    next_ephemeral: u16,
}

struct Interface {
    host: HostId,
    addr: IpAddr,
    /// The link this interface transmits on, and in which direction.
    link: Option<(LinkId, Direction)>,
}

/// One direction of a link: the shared link model, and when the event queue will next wake it.
struct LinkDir {
    model: LinkModel<Datagram>,
    /// The earliest wake-up for this direction in the event queue, if any.
    wake_at: Option<Instant>,
}

/// Queueing delays (time in queue, excluding transmission) of the packets a link direction
/// dequeued, with when they left; bounded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SojournLog {
    /// (dequeue time since the network started, sojourn), in order.
    pub samples: Vec<(Duration, Duration)>,
    /// Samples not kept because the limit was reached.
    pub truncated: u64,
}

struct Link {
    ends: [InterfaceId; 2],
    dirs: [LinkDir; 2],
}

pub(crate) struct SocketSlot {
    host: HostId,
    local: SocketAddr,
    pub(crate) rx: VecDeque<(Datagram, IpAddr, Option<Ecn>)>,
    rx_limit: usize,
    pub(crate) waker: Option<Waker>,
    pub(crate) dropped_rx: u64,
}

/// A link direction to wake at `at`.
struct Event {
    at: Instant,
    seq: u64,
    link: LinkId,
    dir: Direction,
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    /// Reversed, so the `BinaryHeap` pops the earliest event; ties go in insertion order.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// Counters of things the network dropped outside links.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostDrops {
    /// Datagrams for an address no route leads to, or arriving at a non-forwarding host for an
    /// address it does not own.
    pub unroutable: u64,
    /// Datagrams for a port nobody listens on.
    pub no_listener: u64,
    /// Datagrams dropped because the receiving socket's buffer was full.
    pub socket_overflow: u64,
}

pub(crate) struct SimState {
    hosts: Vec<Host>,
    interfaces: Vec<Interface>,
    links: Vec<Link>,
    addr_index: HashMap<IpAddr, InterfaceId>,
    routes: HashMap<(HostId, IpAddr), Option<InterfaceId>>,
    pub(crate) sockets: Vec<Option<SocketSlot>>,
    /// Sockets by (host, local IP, port); the IP is unspecified for a wildcard bind. Keyed by
    /// host too: two hosts may each have a socket on 0.0.0.0:443.
    bindings: BTreeMap<(HostId, IpAddr, u16), usize>,
    events: BinaryHeap<Event>,
    seq: u64,
    rng: ChaCha8Rng,
    wake: Vec<Waker>,
    trace: Option<Trace>,
    start: Instant,
    seed: u64,
    /// When the driver will next wake by itself; `None` = it waits for a notification.
    driver_wake_at: Option<Instant>,
    host_drops: HostDrops,
}

pub(crate) struct Shared {
    pub(crate) state: Mutex<SimState>,
    pub(crate) notify: Notify,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, SimState> {
        // A panic while holding the lock leaves consistent-enough state for counters and tests.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wake the driver if the state now holds an event earlier than it plans to wake for, then
    /// wake any sockets that received data.
    pub(crate) fn after_change(&self, mut st: MutexGuard<'_, SimState>) {
        let next = st.events.peek().map(|e| e.at);
        let notify = match (next, st.driver_wake_at) {
            (Some(n), Some(w)) => n < w,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if notify {
            st.driver_wake_at = next;
        }
        let wakers = std::mem::take(&mut st.wake);
        drop(st);
        if notify {
            self.notify.notify_one();
        }
        for w in wakers {
            w.wake();
        }
    }
}

/// Aborts the driver task when the last handle (network or socket) is gone.
pub(crate) struct NetInner {
    pub(crate) shared: Arc<Shared>,
    driver: tokio::task::AbortHandle,
}

impl Drop for NetInner {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// A handle to a simulated network. Cheap to clone; all clones and all sockets share it.
#[derive(Clone)]
pub struct Network {
    pub(crate) inner: Arc<NetInner>,
}

impl std::fmt::Debug for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.inner.shared.lock();
        f.debug_struct("Network")
            .field("hosts", &st.hosts.len())
            .field("links", &st.links.len())
            .finish()
    }
}

/// The seed a link direction's queue discipline is built with: the network seed mixed with the
/// link and direction, so every queue has its own reproducible random stream.
fn queue_seed(seed: u64, link: LinkId, dir: Direction) -> u64 {
    let salt = (link.0 as u64 * 2 + dir.index() as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    seed ^ salt
}

/// The unspecified address of `ip`'s family.
fn unspecified(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
    }
}

fn flow_hash(src: SocketAddr, dst: SocketAddr) -> u64 {
    // FNV-1a over the 4-tuple: deterministic across runs (no random hasher seed).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= *b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for a in [src, dst] {
        match a.ip() {
            IpAddr::V4(v4) => eat(&v4.octets()),
            IpAddr::V6(v6) => eat(&v6.octets()),
        }
        eat(&a.port().to_be_bytes());
    }
    h
}

impl Network {
    /// A new, empty network whose random choices (loss, jitter) all come from `seed`.
    ///
    /// Must be called inside a tokio runtime: it spawns the task that moves packets. Under a
    /// paused clock (`tokio::time::pause`, `start_paused = true`) the network runs in virtual
    /// time; otherwise in real time.
    pub fn new(seed: u64) -> Network {
        let now = Instant::now();
        let shared = Arc::new(Shared {
            state: Mutex::new(SimState {
                hosts: Vec::new(),
                interfaces: Vec::new(),
                links: Vec::new(),
                addr_index: HashMap::new(),
                routes: HashMap::new(),
                sockets: Vec::new(),
                bindings: BTreeMap::new(),
                events: BinaryHeap::new(),
                seq: 0,
                rng: ChaCha8Rng::seed_from_u64(seed),
                wake: Vec::new(),
                trace: None,
                start: now,
                seed,
                driver_wake_at: None,
                host_drops: HostDrops::default(),
            }),
            notify: Notify::new(),
        });
        let driver = tokio::spawn(drive(shared.clone())).abort_handle();
        Network {
            inner: Arc::new(NetInner { shared, driver }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, SimState> {
        self.inner.shared.lock()
    }

    /// Add a host. Hosts do not forward packets unless [`Network::set_forwarding`] says so.
    pub fn add_host(&self, name: &str) -> HostId {
        let mut st = self.lock();
        st.hosts.push(Host {
            name: name.to_string(),
            interfaces: Vec::new(),
            forwarding: false,
            next_ephemeral: 49152,
        });
        HostId(st.hosts.len() - 1)
    }

    /// Give `host` an interface with address `addr`.
    pub fn add_interface(&self, host: HostId, addr: IpAddr) -> Result<InterfaceId, NetError> {
        let mut st = self.lock();
        if st.addr_index.contains_key(&addr) {
            return Err(NetError::AddressTaken(addr));
        }
        let id = InterfaceId(st.interfaces.len());
        st.interfaces.push(Interface {
            host,
            addr,
            link: None,
        });
        st.hosts[host.0].interfaces.push(id);
        st.addr_index.insert(addr, id);
        st.routes.clear();
        Ok(id)
    }

    /// Let `host` forward packets not addressed to it (a router).
    pub fn set_forwarding(&self, host: HostId, on: bool) {
        let mut st = self.lock();
        st.hosts[host.0].forwarding = on;
        st.routes.clear();
    }

    /// Connect two interfaces with a point-to-point link; `a_to_b` and `b_to_a` describe the
    /// two directions.
    pub fn connect(
        &self,
        a: InterfaceId,
        b: InterfaceId,
        a_to_b: LinkParams,
        b_to_a: LinkParams,
    ) -> Result<LinkId, NetError> {
        a_to_b.validate().map_err(NetError::BadParams)?;
        b_to_a.validate().map_err(NetError::BadParams)?;
        let mut st = self.lock();
        for i in [a, b] {
            if st.interfaces[i.0].link.is_some() {
                return Err(NetError::InterfaceBusy(st.interfaces[i.0].addr));
            }
        }
        let id = LinkId(st.links.len());
        let seed = st.seed;
        let dir = |params: LinkParams, d: Direction| -> Result<LinkDir, NetError> {
            Ok(LinkDir {
                model: LinkModel::new(params, queue_seed(seed, id, d))
                    .map_err(NetError::BadParams)?,
                wake_at: None,
            })
        };
        let mut dirs = [dir(a_to_b, Direction::AtoB)?, dir(b_to_a, Direction::BtoA)?];
        if st.trace.is_some() {
            for d in dirs.iter_mut() {
                d.model.observe(true);
            }
        }
        st.links.push(Link { ends: [a, b], dirs });
        st.interfaces[a.0].link = Some((id, Direction::AtoB));
        st.interfaces[b.0].link = Some((id, Direction::BtoA));
        st.routes.clear();
        Ok(id)
    }

    /// [`Network::connect`] with the same parameters both ways.
    pub fn connect_symmetric(
        &self,
        a: InterfaceId,
        b: InterfaceId,
        params: LinkParams,
    ) -> Result<LinkId, NetError> {
        self.connect(a, b, params.clone(), params)
    }

    /// Bind a UDP socket on `host`. An unspecified IP (`0.0.0.0`) receives on every interface
    /// of the host; port 0 picks a free ephemeral port.
    pub fn bind(&self, host: HostId, addr: SocketAddr) -> Result<Arc<SimSocket>, NetError> {
        self.bind_with_buffer(host, addr, DEFAULT_SOCKET_RX_LIMIT)
    }

    /// [`Network::bind`] with a receive buffer of `rx_limit` datagrams.
    pub fn bind_with_buffer(
        &self,
        host: HostId,
        addr: SocketAddr,
        rx_limit: usize,
    ) -> Result<Arc<SimSocket>, NetError> {
        let mut st = self.lock();
        let h = &st.hosts[host.0];
        if !addr.ip().is_unspecified()
            && !h
                .interfaces
                .iter()
                .any(|i| st.interfaces[i.0].addr == addr.ip())
        {
            return Err(NetError::NoSuchAddress {
                host: h.name.clone(),
                addr: addr.ip(),
            });
        }
        let port = if addr.port() == 0 {
            st.free_port(host, addr.ip())?
        } else {
            addr.port()
        };
        let local = SocketAddr::new(addr.ip(), port);
        if st.port_taken(host, local) {
            return Err(NetError::AddrInUse(local));
        }
        let slot = SocketSlot {
            host,
            local,
            rx: VecDeque::new(),
            rx_limit: rx_limit.max(1),
            waker: None,
            dropped_rx: 0,
        };
        let id = match st.sockets.iter().position(Option::is_none) {
            Some(i) => {
                st.sockets[i] = Some(slot);
                i
            }
            None => {
                st.sockets.push(Some(slot));
                st.sockets.len() - 1
            }
        };
        st.bindings.insert((host, local.ip(), port), id);
        drop(st);
        Ok(Arc::new(SimSocket::new(self.inner.clone(), id, local)))
    }

    /// The parameters of one direction of a link.
    pub fn params(&self, link: LinkId, dir: Direction) -> LinkParams {
        self.lock().links[link.0].dirs[dir.index()]
            .model
            .params()
            .clone()
    }

    /// Change one direction of a link while the network runs. A new rate or delay applies to
    /// packets that start transmitting afterwards; taking the link down loses everything queued
    /// and in flight; a new queue discipline takes over the queued packets.
    pub fn set_params(
        &self,
        link: LinkId,
        dir: Direction,
        params: LinkParams,
    ) -> Result<(), NetError> {
        params.validate().map_err(NetError::BadParams)?;
        let mut st = self.lock();
        let now = Instant::now();
        st.run_due(now);
        st.links[link.0].dirs[dir.index()]
            .model
            .set_params(now.into_std(), params)
            .map_err(NetError::BadParams)?;
        st.after_link(link, dir);
        self.inner.shared.after_change(st);
        Ok(())
    }

    /// Change one direction of a link with a closure over its current parameters.
    pub fn update(
        &self,
        link: LinkId,
        dir: Direction,
        f: impl FnOnce(&mut LinkParams),
    ) -> Result<(), NetError> {
        let mut p = self.params(link, dir);
        f(&mut p);
        self.set_params(link, dir, p)
    }

    /// Change both directions of a link with the same closure.
    pub fn update_both(&self, link: LinkId, f: impl Fn(&mut LinkParams)) -> Result<(), NetError> {
        self.update(link, Direction::AtoB, &f)?;
        self.update(link, Direction::BtoA, &f)
    }

    /// Counters of one direction of a link.
    pub fn stats(&self, link: LinkId, dir: Direction) -> LinkStats {
        self.lock().links[link.0].dirs[dir.index()].model.stats()
    }

    /// The queue discipline's own counters for one direction of a link.
    pub fn queue_stats(&self, link: LinkId, dir: Direction) -> QueueStats {
        self.lock().links[link.0].dirs[dir.index()]
            .model
            .queue_stats()
    }

    /// The congestion-signal probability of one direction's queue discipline (PIE's p,
    /// PID-Delay's U), if it keeps one.
    pub fn signal_probability(&self, link: LinkId, dir: Direction) -> Option<f64> {
        self.lock().links[link.0].dirs[dir.index()]
            .model
            .signal_probability()
    }

    /// The queue delay one direction's discipline steers toward, if its target moves (the
    /// stable PID-Delay's busy-time guard).
    pub fn target_delay(&self, link: LinkId, dir: Direction) -> Option<Duration> {
        self.lock().links[link.0].dirs[dir.index()]
            .model
            .target_delay()
    }

    /// Packets queued, being transmitted or on the wire, across the network.
    pub fn in_flight(&self) -> usize {
        let st = self.lock();
        st.links
            .iter()
            .flat_map(|l| l.dirs.iter())
            .map(|d| d.model.in_flight())
            .sum::<usize>()
    }

    /// Start logging the queueing delay of every packet this link direction dequeues (at most
    /// `limit` samples).
    pub fn log_sojourns(&self, link: LinkId, dir: Direction, limit: usize) {
        self.lock().links[link.0].dirs[dir.index()]
            .model
            .log_sojourns(limit);
    }

    /// Take the queueing delays logged so far (logging continues).
    pub fn take_sojourns(&self, link: LinkId, dir: Direction) -> SojournLog {
        let mut st = self.lock();
        let start = st.start.into_std();
        let log = st.links[link.0].dirs[dir.index()].model.take_sojourns();
        SojournLog {
            samples: log
                .samples
                .into_iter()
                .map(|(at, d)| (at.saturating_duration_since(start), d))
                .collect(),
            truncated: log.truncated,
        }
    }

    /// Drops that happened at hosts rather than on links.
    pub fn host_drops(&self) -> HostDrops {
        self.lock().host_drops
    }

    /// Start recording a packet trace of at most `limit` records (older records are kept;
    /// later ones are counted as truncated).
    pub fn enable_trace(&self, limit: usize) {
        let mut st = self.lock();
        st.trace = Some(Trace::new(limit));
        for d in st.links.iter_mut().flat_map(|l| l.dirs.iter_mut()) {
            d.model.observe(true);
        }
    }

    /// Take the trace recorded so far (recording continues into a fresh one).
    pub fn take_trace(&self) -> Trace {
        let mut st = self.lock();
        match st.trace.as_mut() {
            Some(t) => t.take(),
            None => Trace::new(0),
        }
    }

    /// Time since the network was created, on the network's clock.
    pub fn elapsed(&self) -> Duration {
        Instant::now() - self.lock().start
    }

    /// The address of an interface.
    pub fn addr(&self, iface: InterfaceId) -> IpAddr {
        self.lock().interfaces[iface.0].addr
    }
}

impl SimState {
    fn port_taken(&self, host: HostId, local: SocketAddr) -> bool {
        let port = local.port();
        let any = unspecified(local.ip());
        if local.ip().is_unspecified() {
            // A wildcard bind conflicts with any bind of the port on this host.
            self.bindings
                .keys()
                .any(|(h, _, p)| *h == host && *p == port)
        } else {
            self.bindings.contains_key(&(host, local.ip(), port))
                || self.bindings.contains_key(&(host, any, port))
        }
    }

    fn free_port(&mut self, host: HostId, ip: IpAddr) -> Result<u16, NetError> {
        for _ in 0..16384 {
            let h = &mut self.hosts[host.0];
            let port = h.next_ephemeral;
            h.next_ephemeral = if port == u16::MAX { 49152 } else { port + 1 };
            if !self.port_taken(host, SocketAddr::new(ip, port)) {
                return Ok(port);
            }
        }
        Err(NetError::NoFreePort(self.hosts[host.0].name.clone()))
    }

    pub(crate) fn unbind(&mut self, id: usize) {
        if let Some(slot) = self.sockets[id].take() {
            self.bindings
                .remove(&(slot.host, slot.local.ip(), slot.local.port()));
        }
    }

    /// After anything touched a link direction: copy its observed events into the trace and
    /// make sure the event queue wakes it when it next has work.
    fn after_link(&mut self, link: LinkId, dir: Direction) {
        let d = &mut self.links[link.0].dirs[dir.index()];
        if let Some(trace) = self.trace.as_mut() {
            let start = self.start.into_std();
            while let Some(e) = d.model.poll_event() {
                trace.push(TraceRecord {
                    at: e.at.saturating_duration_since(start),
                    link,
                    dir,
                    size: e.size,
                    event: e.event,
                    queue_packets: e.queue_packets,
                    queue_bytes: e.queue_bytes,
                });
            }
        }
        if let Some(t) = d.model.poll_timeout().map(Instant::from_std) {
            if d.wake_at.is_none_or(|w| t < w) {
                d.wake_at = Some(t);
                self.seq += 1;
                self.events.push(Event {
                    at: t,
                    seq: self.seq,
                    link,
                    dir,
                });
            }
        }
    }

    /// Process every event due by `now`, in (time, insertion) order, each at its own time: a
    /// send at `now` then finds every link as it is at `now`.
    pub(crate) fn run_due(&mut self, now: Instant) {
        while self.events.peek().is_some_and(|e| e.at <= now) {
            let ev = self.events.pop().expect("peeked");
            self.handle(ev);
        }
    }

    /// The interface `host` sends a datagram for `dst` from: the one whose link peer owns
    /// `dst`, otherwise the first hop of a shortest path through forwarding hosts.
    fn route(&mut self, host: HostId, dst: IpAddr) -> Option<InterfaceId> {
        if let Some(r) = self.routes.get(&(host, dst)) {
            return *r;
        }
        let r = self.compute_route(host, dst);
        self.routes.insert((host, dst), r);
        r
    }

    fn peer(&self, iface: InterfaceId) -> Option<InterfaceId> {
        let (link, dir) = self.interfaces[iface.0].link?;
        let ends = self.links[link.0].ends;
        Some(match dir {
            Direction::AtoB => ends[1],
            Direction::BtoA => ends[0],
        })
    }

    fn compute_route(&self, host: HostId, dst: IpAddr) -> Option<InterfaceId> {
        let target = self.interfaces[self.addr_index.get(&dst)?.0].host;
        for &i in &self.hosts[host.0].interfaces {
            if self
                .peer(i)
                .is_some_and(|p| self.interfaces[p.0].addr == dst)
            {
                return Some(i);
            }
        }
        // Breadth-first over hosts; remember the first interface used on each path.
        let mut first: Vec<Option<InterfaceId>> = vec![None; self.hosts.len()];
        let mut seen = vec![false; self.hosts.len()];
        let mut queue = VecDeque::from([host]);
        seen[host.0] = true;
        while let Some(h) = queue.pop_front() {
            if h != host && !self.hosts[h.0].forwarding && h != target {
                continue;
            }
            for &i in &self.hosts[h.0].interfaces {
                let Some(p) = self.peer(i) else { continue };
                let next = self.interfaces[p.0].host;
                if seen[next.0] {
                    continue;
                }
                seen[next.0] = true;
                first[next.0] = if h == host { Some(i) } else { first[h.0] };
                if next == target {
                    return first[next.0];
                }
                queue.push_back(next);
            }
        }
        None
    }

    /// Send a datagram from a socket at `now`.
    /// `raw`: `data` is a whole IP packet (a user-space stack's), costed at its own size.
    #[allow(clippy::too_many_arguments)] // one internal entry for both socket kinds
    pub(crate) fn send(
        &mut self,
        socket: usize,
        src_ip: Option<IpAddr>,
        dst: SocketAddr,
        ecn: Option<Ecn>,
        data: &[u8],
        now: Instant,
        raw: bool,
    ) -> std::io::Result<()> {
        self.run_due(now);
        let slot = self.sockets[socket]
            .as_ref()
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotConnected))?;
        let host = slot.host;
        let port = slot.local.port();
        let src_ip = src_ip.or(Some(slot.local.ip()).filter(|ip| !ip.is_unspecified()));
        let iface = match src_ip {
            // Source-bound sends leave through that interface (policy routing, as multi-homed
            // hosts configure it), whatever the destination.
            Some(ip) => self.hosts[host.0]
                .interfaces
                .iter()
                .copied()
                .find(|i| self.interfaces[i.0].addr == ip)
                .ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::AddrNotAvailable,
                        format!("no interface with source address {ip}"),
                    )
                })?,
            None => match self.route(host, dst.ip()) {
                Some(i) => i,
                None => {
                    self.host_drops.unroutable += 1;
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::NetworkUnreachable,
                        format!("no route to {}", dst.ip()),
                    ));
                }
            },
        };
        let src = SocketAddr::new(self.interfaces[iface.0].addr, port);
        let overhead = if raw {
            0
        } else if dst.is_ipv4() {
            IPV4_UDP_OVERHEAD
        } else {
            IPV6_UDP_OVERHEAD
        };
        let mut packet = Packet::new(
            data.len() + overhead,
            flow_hash(src, dst),
            Datagram {
                src,
                dst,
                data: data.into(),
            },
        );
        packet.ecn = ecn.unwrap_or_default();
        if self.hosts[host.0]
            .interfaces
            .iter()
            .any(|i| self.interfaces[i.0].addr == dst.ip())
        {
            // To ourselves: no link involved.
            self.deliver_local(host, packet);
            return Ok(());
        }
        match self.interfaces[iface.0].link {
            Some((link, dir)) => {
                self.transmit(link, dir, packet, now);
                Ok(())
            }
            None => {
                self.host_drops.unroutable += 1;
                Err(std::io::Error::new(
                    std::io::ErrorKind::NetworkUnreachable,
                    format!("interface {} has no link", src.ip()),
                ))
            }
        }
    }

    /// Offer a packet to a link direction at `now`.
    fn transmit(&mut self, link: LinkId, dir: Direction, packet: Packet<Datagram>, now: Instant) {
        self.links[link.0].dirs[dir.index()]
            .model
            .send(now.into_std(), packet);
        self.after_link(link, dir);
    }

    /// Wake one link direction at its scheduled time: finish its transmissions and hand what
    /// reached the far end to that host.
    fn handle(&mut self, ev: Event) {
        let now = ev.at;
        let (link, dir) = (ev.link, ev.dir);
        let d = &mut self.links[link.0].dirs[dir.index()];
        if d.wake_at == Some(now) {
            d.wake_at = None;
        }
        d.model.handle_timeout(now.into_std(), &mut self.rng);
        let mut arrived = Vec::new();
        while let Some((_, packet)) = d.model.poll_deliver(now.into_std()) {
            arrived.push(packet);
        }
        self.after_link(link, dir);
        let far = self.links[link.0].ends[1 - dir.index()];
        let host = self.interfaces[far.0].host;
        for packet in arrived {
            self.arrive_at_host(host, packet, now);
        }
    }

    fn arrive_at_host(&mut self, host: HostId, packet: Packet<Datagram>, now: Instant) {
        let dst_ip = packet.payload.dst.ip();
        let owns = self.hosts[host.0]
            .interfaces
            .iter()
            .any(|i| self.interfaces[i.0].addr == dst_ip);
        if owns {
            self.deliver_local(host, packet);
        } else if self.hosts[host.0].forwarding {
            match self
                .route(host, dst_ip)
                .and_then(|i| self.interfaces[i.0].link)
            {
                Some((link, dir)) => self.transmit(link, dir, packet, now),
                None => self.host_drops.unroutable += 1,
            }
        } else {
            self.host_drops.unroutable += 1;
        }
    }

    fn deliver_local(&mut self, host: HostId, packet: Packet<Datagram>) {
        let dst = packet.payload.dst;
        let id = self
            .bindings
            .get(&(host, dst.ip(), dst.port()))
            .or_else(|| {
                self.bindings
                    .get(&(host, unspecified(dst.ip()), dst.port()))
            })
            .copied();
        let Some(id) = id else {
            self.host_drops.no_listener += 1;
            return;
        };
        let slot = self.sockets[id].as_mut().expect("bound socket has a slot");
        if slot.rx.len() >= slot.rx_limit {
            slot.dropped_rx += 1;
            self.host_drops.socket_overflow += 1;
            return;
        }
        let ecn = Some(packet.ecn).filter(|e| e.is_capable());
        slot.rx.push_back((packet.payload, dst.ip(), ecn));
        if let Some(w) = slot.waker.take() {
            self.wake.push(w);
        }
    }
}

/// The driver: sleeps until the next event (or until woken by a send that creates an earlier
/// one), then processes every event that is due, in (time, insertion) order.
async fn drive(shared: Arc<Shared>) {
    loop {
        let next = {
            let mut st = shared.lock();
            let now = Instant::now();
            st.run_due(now);
            let next = st.events.peek().map(|e| e.at);
            st.driver_wake_at = next;
            let wakers = std::mem::take(&mut st.wake);
            drop(st);
            for w in wakers {
                w.wake();
            }
            next
        };
        match next {
            Some(at) => {
                tokio::select! {
                    biased;
                    _ = tokio::time::sleep_until(at) => {}
                    _ = shared.notify.notified() => {}
                }
            }
            None => shared.notify.notified().await,
        }
    }
}
