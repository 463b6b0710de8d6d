//! The one task that does every connection's I/O: it receives datagrams, admits new
//! connections within the budgets, fires timers, and gives each queued connection its turn.

use std::future::Future;
use std::io::IoSliceMut;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use quinn::udp::{self, RecvMeta};
use quinn::UdpPoller;
use quinn_proto as proto;
use quinn_proto::StreamEvent;

use super::{now, queue, Conn, ConnCell, EpState, Shared, Waiter};
use qgate_core::sync::lock;

/// Connections whose handshake finished but that [`Endpoint::accept`](super::Endpoint::accept)
/// has not taken yet; more
/// are closed at once (the application is not keeping up).
const MAX_PENDING_ACCEPT: usize = 1024;
/// Datagrams one connection may send per turn before others get theirs.
const MAX_TRANSMITS_PER_TURN: usize = 32;
/// Rounds of receive/timers/queued connections per driver poll before it yields.
const ROUNDS_PER_POLL: usize = 16;

/// Hand `cell` to [`Endpoint::accept`](super::Endpoint::accept) (the queue holds a reference until it is taken).
fn surface(ep: &mut EpState, cell: &ConnCell, c: &mut Conn) {
    c.surfaced = true;
    c.refs += 1;
    ep.accept_queue.push_back(cell.id);
    if let Some(w) = ep.acceptor.take() {
        w.wake();
    }
}

/// Announce every stream the peer may open again at once (MAX_STREAMS, decision T14).
/// quinn-proto announces new stream credit only once more than an eighth of the limit has been
/// freed: 2 of a device's 8 request streams, so with 7 held a finished one gave nothing back.
/// Lowering the limit by one and restoring it queues the announcement whenever a stream has
/// been freed since the last one (and nothing otherwise); the limit is unchanged.
fn announce_streams(p: &mut proto::Connection) {
    let n = p.max_concurrent_streams(proto::Dir::Bi);
    if n >= 8 {
        p.set_max_concurrent_streams(proto::Dir::Bi, proto::VarInt::from_u64(n - 1).expect("< n"));
        p.set_max_concurrent_streams(proto::Dir::Bi, proto::VarInt::from_u64(n).expect("was n"));
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
    if c.handshake_deadline.is_some_and(|at| at <= t)
        || c.silence_deadline.is_some_and(|at| at <= t)
    {
        c.handshake_deadline = None;
        c.silence_deadline = None;
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
    announce_streams(c.proto.as_mut().expect("alive"));
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
                    c.silence_deadline = None;
                    ep.handshake_ended(c.client);
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
            c.silence_deadline,
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
                ep.handshake_ended(c.client);
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
pub(super) struct Driver {
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
    /// Start the driver of `shared`'s endpoint, receiving into `recv_len` bytes.
    pub(super) fn spawn(shared: Arc<Shared>, recv_len: usize) {
        tokio::spawn(Driver {
            poller: shared.socket.clone().create_io_poller(),
            shared,
            recv_buf: vec![0; recv_len].into_boxed_slice(),
            send_buf: Vec::new(),
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            sleep_at: None,
        });
    }

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
            let silence = ep.limits.handshake_silence;
            drop(ep);
            let mut c = lock(&cell.conn);
            if let Some(p) = c.proto.as_mut() {
                p.handle_event(ev);
            }
            // The peer of a handshake spoke: its silence is counted from now (G26).
            if c.silence_deadline.is_some() {
                c.silence_deadline = Some(t + silence);
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
            // Decision G26: each client (address, or IPv6 /64) a share of the budget, so one
            // that answers Retries and goes silent holds a few handshakes, not all of them.
            let client = qgate_core::quota::client_key(incoming.remote_address().ip());
            if ep
                .handshaking_by_client
                .get(&client)
                .is_some_and(|&n| n >= l.max_handshakes_per_client.max(1))
            {
                shared.stats.ignored_share.fetch_add(1, Ordering::Relaxed);
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
                            silence_deadline: Some(t + l.handshake_silence),
                            client,
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
                    *ep.handshaking_by_client.entry(client).or_insert(0) += 1;
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
