//! The broker handle and the state all its tasks share: settings, queues, store, counters,
//! connections held; starting it.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
// tokio's clock, as everywhere: TTLs and the 0-RTT replay window run in virtual time on the
// simulator (decision M18).
use tokio::time::Instant;

use tokio::sync::Notify;

use super::config::BrokerConfig;
use super::counters::Counters;
use super::message::{decode, sendable};
use super::queue_state::QueueState;
use super::replay::ReplayGuard;
use crate::bridge::BridgeStats;
use crate::queue::{Limits, Queue};
use crate::shim;
use crate::store::{Store, StoreError};

/// Starting the broker failed.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// A setting it cannot run with.
    #[error("broker configuration: {0}")]
    Config(String),
    /// The store.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A stored message that no longer decodes.
    #[error("message store: message {seq} of queue '{queue}' does not decode: {msg}")]
    Corrupt {
        /// Queue.
        queue: String,
        /// Sequence number.
        seq: u64,
        /// Decoder's message.
        msg: String,
    },
}

pub(super) struct Inner {
    pub(super) cfg: BrokerConfig,
    pub(super) queues: Mutex<BTreeMap<String, Arc<QueueState>>>,
    pub(super) store: Option<Store>,
    pub(super) next_consumer: AtomicU64,
    pub(super) counters: Counters,
    pub(super) replays: Mutex<ReplayGuard>,
    /// Connections held, in all and per client (entries at zero are removed).
    held: Mutex<Held>,
    /// Bridges started: (local queue, upstream as shown, counters).
    pub(super) bridges: Mutex<Vec<(String, String, Arc<BridgeStats>)>>,
    /// Connections held, by id, for the admin port's list and close.
    pub(super) conns: Mutex<BTreeMap<u64, std::sync::Weak<Tenancy>>>,
    next_conn: AtomicU64,
    /// A clean stop has begun: consumers are handed no more messages (decision M32).
    pub(super) stopping: std::sync::atomic::AtomicBool,
}

/// One connection's hold on the broker's tables, from accept until its last task ends: the
/// open-connection gauge and its address's count (decision M16).
pub(super) struct Tenancy {
    inner: Arc<Inner>,
    pub(super) addr: Option<IpAddr>,
    /// The client its address counts for: the address, or its IPv6 /64 (decision S10).
    client: Option<IpAddr>,
    pub(super) id: u64,
    pub(super) since: Instant,
    pub(super) kind: &'static str,
    /// Set (and notified) when the operator closes the connection.
    pub(super) forced: (std::sync::atomic::AtomicBool, Notify),
}

impl shim::Watch for Tenancy {
    fn timed_out(&self, _what: shim::Deadline) {
        self.inner
            .counters
            .connections_timed_out
            .fetch_add(1, Ordering::Relaxed);
    }

    fn forced(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            loop {
                let woken = self.forced.1.notified();
                if self.forced.0.load(Ordering::Acquire) {
                    return;
                }
                woken.await;
            }
        })
    }
}

impl Drop for Tenancy {
    fn drop(&mut self) {
        self.inner
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
        self.inner
            .counters
            .connections_open
            .fetch_sub(1, Ordering::Relaxed);
        let mut h = self.inner.held.lock().unwrap_or_else(|e| e.into_inner());
        h.total -= 1;
        if let Some(a) = self.client {
            if let Some(n) = h.per_client.get_mut(&a) {
                *n -= 1;
                if *n == 0 {
                    h.per_client.remove(&a);
                }
            }
        }
    }
}

/// Connections held: in all (against `max_connections`, decision M33) and per client
/// (against `max_connections_per_address`, M16 and S10).
#[derive(Default)]
struct Held {
    total: usize,
    per_client: std::collections::HashMap<IpAddr, usize>,
}

/// Why a connection was refused on accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// Its client held `max_connections_per_address` already (M16).
    PerAddress,
    /// The broker held `max_connections` already (M33).
    Full,
}

impl Refused {
    /// The reason a QUIC connection is closed with.
    pub(super) fn reason(self) -> &'static [u8] {
        match self {
            Refused::PerAddress => b"per-address connection limit",
            Refused::Full => b"broker connection limit",
        }
    }
}

/// The broker; cheap to clone (all clones are the same broker).
#[derive(Clone)]
pub struct Broker {
    pub(super) inner: Arc<Inner>,
}

impl Broker {
    /// Open the store (if configured), recover its messages, declare the configured queues and
    /// start the TTL sweeper. Call within a tokio runtime.
    pub fn start(cfg: BrokerConfig) -> Result<Broker, BrokerError> {
        cfg.validate().map_err(BrokerError::Config)?;
        let (store, recovered) = match &cfg.store {
            Some(p) => {
                let (s, r) = Store::open(p)?;
                (Some(s), r)
            }
            None => (None, Vec::new()),
        };
        let inner = Arc::new(Inner {
            queues: Mutex::new(BTreeMap::new()),
            store,
            next_consumer: AtomicU64::new(1),
            counters: Counters::default(),
            replays: Mutex::new(ReplayGuard::default()),
            held: Mutex::default(),
            bridges: Mutex::new(Vec::new()),
            conns: Mutex::default(),
            next_conn: AtomicU64::new(1),
            stopping: Default::default(),
            cfg,
        });
        let broker = Broker { inner };
        let limits = broker.inner.cfg.default_limits();
        for d in broker.inner.cfg.queues.clone() {
            broker.declare(&d.name, d.limits(limits), d.ttl);
        }
        let n = recovered.len();
        for r in recovered {
            let msg = decode(&r.bytes).map_err(|msg| BrokerError::Corrupt {
                queue: r.queue.clone(),
                seq: r.seq,
                msg,
            })?;
            let q = match broker.find(&r.queue) {
                Some(q) => q,
                None => broker.declare(&r.queue, limits, broker.inner.cfg.default_ttl),
            };
            // Recovered messages are admitted whatever the limits: they were accepted once.
            let mut g = q.lock();
            if !g.insert(r.seq, Arc::new(sendable(msg)), r.bytes.len(), None) {
                let limits = g.limits();
                *g = Queue::new(Limits {
                    max_messages: usize::MAX,
                    max_bytes: usize::MAX,
                });
                tracing::warn!(target: "qgate_amqp::broker", queue = %r.queue, ?limits, "recovered messages exceed the queue's limits");
                g.insert(
                    r.seq,
                    Arc::new(sendable(decode(&r.bytes).expect("decoded above"))),
                    r.bytes.len(),
                    None,
                );
            }
        }
        if n > 0 {
            tracing::info!(target: "qgate_amqp::broker", messages = n, "recovered durable messages");
        }
        let weak = Arc::downgrade(&broker.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                Broker { inner }.sweep().await;
            }
        });
        Ok(broker)
    }

    /// Take a place for a connection from `addr` (None: unknown, e.g. a simulated stream);
    /// refused when the broker holds `max_connections` (decision M33; an in-process bridge is
    /// counted but never refused) or that client (address, or IPv6 /64: S10) holds
    /// `max_connections_per_address` already (counted, M16).
    pub(super) fn tenancy(
        &self,
        addr: Option<IpAddr>,
        kind: &'static str,
    ) -> Result<Arc<Tenancy>, Refused> {
        let c = &self.inner.counters;
        let cfg = &self.inner.cfg;
        c.connections_total.fetch_add(1, Ordering::Relaxed);
        let client = addr.map(qgate_core::quota::client_key);
        {
            let mut h = self.inner.held.lock().unwrap_or_else(|e| e.into_inner());
            if h.total >= cfg.max_connections && kind != "bridge" {
                drop(h);
                c.connections_refused_full.fetch_add(1, Ordering::Relaxed);
                tracing::info!(target: "qgate_amqp::broker", peer = ?addr, limit = cfg.max_connections, "connection refused: the broker's connection limit");
                return Err(Refused::Full);
            }
            if let Some(a) = client {
                let n = h.per_client.entry(a).or_insert(0);
                if *n >= cfg.max_connections_per_address {
                    drop(h);
                    c.connections_refused.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(target: "qgate_amqp::broker", peer = %a, limit = cfg.max_connections_per_address, "connection refused: per-address limit");
                    return Err(Refused::PerAddress);
                }
                *n += 1;
            }
            h.total += 1;
        }
        c.connections_open.fetch_add(1, Ordering::Relaxed);
        let id = self.inner.next_conn.fetch_add(1, Ordering::Relaxed);
        let t = Arc::new(Tenancy {
            inner: self.inner.clone(),
            addr,
            client,
            id,
            since: Instant::now(),
            kind,
            forced: Default::default(),
        });
        self.inner
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, Arc::downgrade(&t));
        Ok(t)
    }
}
