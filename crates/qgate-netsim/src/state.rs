//! The network's state behind its one mutex, how it moves packets (routing, links, delivery to
//! sockets), and the driver task that advances it. Both the [`Network`](crate::Network) handle
//! and its sockets hold it, so it lives apart from either.
//!
//! The driver sleeps until the next event. Link arithmetic uses the exact (nanosecond) event
//! times, so serialisation, queueing and propagation are exact; endpoints see deliveries when the
//! tokio clock reaches them, which in paused (virtual) time moves in 1 ms ticks (see
//! docs/decisions.md).

use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;

use qgate_aqm::{Ecn, Packet};
use qgate_link::{LinkModel, IPV4_UDP_OVERHEAD, IPV6_UDP_OVERHEAD};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::NetError;
use crate::ids::{Direction, HostId, InterfaceId, LinkId};
use crate::trace::{Trace, TraceRecord};

/// A datagram in flight.
#[derive(Debug)]
pub(crate) struct Datagram {
    pub(crate) src: SocketAddr,
    pub(crate) dst: SocketAddr,
    pub(crate) data: Box<[u8]>,
}

pub(crate) struct Host {
    pub(crate) name: String,
    pub(crate) interfaces: Vec<InterfaceId>,
    pub(crate) forwarding: bool,
    pub(crate) next_ephemeral: u16,
}

pub(crate) struct Interface {
    pub(crate) host: HostId,
    pub(crate) addr: IpAddr,
    /// The link this interface transmits on, and in which direction.
    pub(crate) link: Option<(LinkId, Direction)>,
}

/// One direction of a link: the shared link model, and when the event queue will next wake it.
pub(crate) struct LinkDir {
    pub(crate) model: LinkModel<Datagram>,
    /// The earliest wake-up for this direction in the event queue, if any.
    pub(crate) wake_at: Option<Instant>,
}

pub(crate) struct Link {
    pub(crate) ends: [InterfaceId; 2],
    pub(crate) dirs: [LinkDir; 2],
}

pub(crate) struct SocketSlot {
    pub(crate) host: HostId,
    pub(crate) local: SocketAddr,
    pub(crate) rx: VecDeque<(Datagram, IpAddr, Option<Ecn>)>,
    pub(crate) rx_limit: usize,
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
    pub(crate) hosts: Vec<Host>,
    pub(crate) interfaces: Vec<Interface>,
    pub(crate) links: Vec<Link>,
    pub(crate) addr_index: HashMap<IpAddr, InterfaceId>,
    pub(crate) routes: HashMap<(HostId, IpAddr), Option<InterfaceId>>,
    pub(crate) sockets: Vec<Option<SocketSlot>>,
    /// Sockets by (host, local IP, port); the IP is unspecified for a wildcard bind. Keyed by
    /// host too: two hosts may each have a socket on 0.0.0.0:443.
    pub(crate) bindings: BTreeMap<(HostId, IpAddr, u16), usize>,
    events: BinaryHeap<Event>,
    seq: u64,
    rng: ChaCha8Rng,
    wake: Vec<Waker>,
    pub(crate) trace: Option<Trace>,
    pub(crate) start: Instant,
    pub(crate) seed: u64,
    /// When the driver will next wake by itself; `None` = it waits for a notification.
    driver_wake_at: Option<Instant>,
    pub(crate) host_drops: HostDrops,
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
    pub(crate) driver: tokio::task::AbortHandle,
}

impl Drop for NetInner {
    fn drop(&mut self) {
        self.driver.abort();
    }
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

impl SimState {
    /// An empty network whose random choices all come from `seed`, started at `start`.
    pub(crate) fn new(seed: u64, start: Instant) -> SimState {
        SimState {
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
            start,
            seed,
            driver_wake_at: None,
            host_drops: HostDrops::default(),
        }
    }

    pub(crate) fn port_taken(&self, host: HostId, local: SocketAddr) -> bool {
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

    pub(crate) fn free_port(&mut self, host: HostId, ip: IpAddr) -> Result<u16, NetError> {
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
    pub(crate) fn after_link(&mut self, link: LinkId, dir: Direction) {
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
pub(crate) async fn drive(shared: Arc<Shared>) {
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
