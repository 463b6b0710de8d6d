//! The handle to a simulated network: building it (hosts, interfaces, links), binding sockets,
//! changing links while it runs, and reading its counters. Its state and the event loop that
//! moves packets are in `state`; all of it sits behind one mutex, advanced by a single
//! driver task.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use qgate_aqm::QueueStats;
use qgate_link::LinkModel;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::NetError;
use crate::ids::{Direction, HostId, InterfaceId, LinkId};
use crate::socket::SimSocket;
use crate::state::{
    drive, Host, HostDrops, Interface, Link, LinkDir, NetInner, Shared, SimState, SocketSlot,
};
use crate::trace::Trace;
use crate::{LinkParams, LinkStats};

/// Datagrams a socket buffers before it drops arrivals (like a kernel receive buffer).
pub const DEFAULT_SOCKET_RX_LIMIT: usize = 4096;

/// Queueing delays (time in queue, excluding transmission) of the packets a link direction
/// dequeued, with when they left; bounded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SojournLog {
    /// (dequeue time since the network started, sojourn), in order.
    pub samples: Vec<(Duration, Duration)>,
    /// Samples not kept because the limit was reached.
    pub truncated: u64,
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

impl Network {
    /// A new, empty network whose random choices (loss, jitter) all come from `seed`.
    ///
    /// Must be called inside a tokio runtime: it spawns the task that moves packets. Under a
    /// paused clock (`tokio::time::pause`, `start_paused = true`) the network runs in virtual
    /// time; otherwise in real time.
    pub fn new(seed: u64) -> Network {
        let now = Instant::now();
        let shared = Arc::new(Shared {
            state: Mutex::new(SimState::new(seed, now)),
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
