//! The endpoint's handle: its budgets, how it starts, and how it hands out connections.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use quinn::udp;
use quinn::{AsyncUdpSocket, EndpointConfig, Runtime, ServerConfig, TokioRuntime};
use quinn_proto as proto;

use super::driver::Driver;
use super::{now, queue, release, ConnCell, Connection, EpState, Shared};
use crate::{Socket, TransportError};
use qgate_core::sync::lock;

/// An endpoint's connection budgets (decision G12).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most connections with state, established or handshaking; a new one beyond is refused
    /// (CONNECTION_REFUSED).
    pub max_connections: usize,
    /// Most handshakes in progress, a budget of their own within `max_connections`; an Initial
    /// beyond it is ignored (the client's own retransmission tries again later).
    pub max_handshakes: usize,
    /// Most handshakes in progress from one client (an IPv4 address or an IPv6 /64, as S10
    /// counts them); its Initials beyond are ignored, so one address cannot take the whole
    /// `max_handshakes` budget (decision G26).
    pub max_handshakes_per_client: usize,
    /// With this many handshakes in progress, a client that has not proved its address is
    /// sent a Retry (RFC 9000 §8.1.2) instead of getting state.
    pub retry_above: usize,
    /// A handshake not finished within this long is closed.
    pub handshake_timeout: Duration,
    /// A handshake whose peer has sent nothing for this long is closed, before
    /// `handshake_timeout` (a client that answered a Retry and went silent, decision G26).
    pub handshake_silence: Duration,
    /// Once the last handle is dropped, the close waits at most this long for the peer to
    /// acknowledge the answers already finished (decision G19).
    pub linger: Duration,
}

impl Limits {
    /// The defaults besides `max_connections`: 256 handshakes, 32 per client, Retry above 16,
    /// 10 s to finish, 3 s of silence, 10 s to linger.
    pub const DEFAULT: Limits = Limits {
        max_connections: 1024,
        max_handshakes: 256,
        max_handshakes_per_client: 32,
        retry_above: 16,
        handshake_timeout: Duration::from_secs(10),
        handshake_silence: Duration::from_secs(3),
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
    /// Initials ignored: their client held its share of the handshake budget (G26).
    pub ignored_share: AtomicU64,
    /// Handshakes closed at their deadline.
    pub handshake_timeouts: AtomicU64,
}

/// A QUIC server endpoint whose connections share one driver task. Once every handle to it is
/// dropped it accepts no more connections; the driver ends when the last connection has.
pub struct Endpoint {
    shared: Arc<Shared>,
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
            handshaking_by_client: HashMap::new(),
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
        Driver::spawn(shared.clone(), recv_len);
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
