//! The AMQP 1.0 broker: named queues, competing consumers, pre-settled and unsettled delivery,
//! credit-based back-pressure, redelivery, TTL, size limits, durable queues, SASL, metrics.
//!
//! Connection, session and link state machines are fe2o3-amqp's; everything a broker adds —
//! queues, routing, durability, redelivery — is here, on top of the sans-IO [`Queue`].

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
// tokio's clock, as everywhere: TTLs and the 0-RTT replay window run in virtual time on the
// simulator (decision M18).
use tokio::time::Instant;

use fe2o3_amqp::acceptor::{
    ConnectionAcceptor, LinkAcceptor, LinkEndpoint, ListenerSessionHandle, SessionAcceptor,
};
use fe2o3_amqp::link::delivery::DeliveryInfo;
use fe2o3_amqp::link::delivery::Sendable;
use fe2o3_amqp::link::receiver::CreditMode;
use fe2o3_amqp::link::{Receiver, Sender};
use fe2o3_amqp::types::definitions::{self, AmqpError};
use fe2o3_amqp::types::messaging::message::__private::{Deserializable, Serializable};
use fe2o3_amqp::types::messaging::{Body, Message, Outcome};
use fe2o3_amqp::types::primitives::Value;
use futures_util::stream::{FuturesOrdered, FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use tokio::sync::Notify;

use qgate_core::metrics;

use crate::auth::Credentials;
use crate::bridge::{BridgeConfig, BridgeStats};
use crate::queue::{ConsumerId, Limits, Queue, QueueStats};
use crate::shim;
use crate::store::{Store, StoreError};
use crate::transport::Stream;

/// What the broker stores and forwards: any AMQP message, body kept as decoded values.
pub type AmqpMessage = Message<Body<Value>>;
type Item = Arc<Sendable<Body<Value>>>;

/// One queue declared in the configuration (`[[broker.queues]]`).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueDecl {
    /// Its address.
    pub name: String,
    /// Most messages held [default: the broker's `max_messages`].
    #[serde(default)]
    pub max_messages: Option<usize>,
    /// Most message bytes held [default: the broker's `max_bytes`].
    #[serde(default)]
    pub max_bytes: Option<usize>,
    /// Longest a message waits (the message's own header TTL applies if shorter) [default:
    /// forever].
    #[serde(default, with = "qgate_core::units::optional_duration")]
    pub ttl: Option<Duration>,
}

impl QueueDecl {
    /// Its limits, the broker's `default` where it sets none.
    pub fn limits(&self, default: Limits) -> Limits {
        Limits {
            max_messages: self.max_messages.unwrap_or(default.max_messages),
            max_bytes: self.max_bytes.unwrap_or(default.max_bytes),
        }
    }
}

/// The largest `max_frame_size` a broker may announce (1 MiB).
pub const MAX_FRAME_SIZE: u32 = 1 << 20;

/// Broker settings, and the `[broker]` keys of a config file that set them (durations as
/// `"30s"`, timeouts also `"off"`). The defaults live here and in [`Limits::default`]; the CLI
/// composes this type and its help reads them from here.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BrokerConfig {
    /// Container id in the broker's open frame.
    pub container_id: String,
    /// Largest frame accepted and announced (AMQP 1.0 §2.7.1 max-frame-size).
    pub max_frame_size: u32,
    /// Queues created at start.
    pub queues: Vec<QueueDecl>,
    /// Create a queue when a link names an unknown address (with the default limits and
    /// TTL); if false, such links are refused with `amqp:not-found`.
    pub auto_create: bool,
    /// Most messages per queue, unless its declaration says otherwise.
    pub max_messages: usize,
    /// Most message bytes per queue, unless its declaration says otherwise.
    pub max_bytes: usize,
    /// TTL of auto-created queues (none: forever).
    #[serde(rename = "ttl", with = "qgate_core::units::optional_duration")]
    pub default_ttl: Option<Duration>,
    /// Most queues (auto-creation stops there).
    pub max_queues: usize,
    /// Durable store file; `None` keeps queues in memory only.
    pub store: Option<PathBuf>,
    /// Credit a producer link is given (refilled as the broker settles its messages).
    pub producer_credit: u32,
    /// Most unsettled deliveries per consumer link.
    pub consumer_window: usize,
    /// Producers stop getting credit while a queue holds this fraction of `max_messages` or
    /// bytes, and resume below it: a slow consumer slows producers instead of filling memory.
    pub high_water: f64,
    /// SASL (from a credentials file: not a config key of its own).
    #[serde(skip)]
    pub credentials: Credentials,
    /// Protocol header → SASL → open must be done within this, a frame held for credit waits
    /// at most this, and so does the broker's close for the peer's (decision M16).
    #[serde(with = "qgate_core::units::duration")]
    pub handshake_timeout: Duration,
    /// A connection that receives nothing for this long is closed (`amqp:resource-limit-
    /// exceeded`), and one whose peer takes no bytes for this long; half of it is announced as
    /// the broker's idle-time-out (AMQP 1.0 §2.4.5). Zero: never (decision M16).
    #[serde(with = "qgate_core::units::timeout")]
    pub idle_timeout: Duration,
    /// Most connections from one IP address at once; more are closed on accept (M16).
    pub max_connections_per_address: usize,
    /// Most sessions per connection (a begin beyond is a framing error).
    pub max_sessions: usize,
    /// While ANONYMOUS is admitted, also accept a connection that skips the SASL layer and
    /// starts with the plain AMQP header, as go-amqp does by default (decision M19).
    pub plain_amqp: bool,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        let limits = Limits::default();
        BrokerConfig {
            container_id: "qgate-broker".into(),
            max_frame_size: 65_536,
            queues: Vec::new(),
            auto_create: true,
            max_messages: limits.max_messages,
            max_bytes: limits.max_bytes,
            default_ttl: None,
            max_queues: 10_000,
            store: None,
            producer_credit: 500,
            consumer_window: 1000,
            high_water: 0.8,
            credentials: Credentials::anonymous(),
            handshake_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            max_connections_per_address: 256,
            max_sessions: shim::DEFAULT_MAX_SESSIONS,
            plain_amqp: true,
        }
    }
}

impl BrokerConfig {
    /// The limits of a queue that declares none.
    pub fn default_limits(&self) -> Limits {
        Limits {
            max_messages: self.max_messages,
            max_bytes: self.max_bytes,
        }
    }

    /// Refuse settings the broker cannot run with; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("max_messages", self.max_messages),
            ("max_bytes", self.max_bytes),
            ("max_queues", self.max_queues),
            ("producer_credit", self.producer_credit as usize),
            ("consumer_window", self.consumer_window),
            (
                "max_connections_per_address",
                self.max_connections_per_address,
            ),
            ("max_sessions", self.max_sessions),
            ("max_frame_size", self.max_frame_size as usize),
        ];
        if let Some((key, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{key} must be at least 1"));
        }
        // AMQP 1.0 §2.7.1: max-frame-size is at least 512. Messages larger than a frame span
        // several, so a bigger frame buys nothing but a bigger buffer a peer can fill.
        if !(shim::MIN_MAX_FRAME_SIZE..=MAX_FRAME_SIZE).contains(&self.max_frame_size) {
            return Err(format!(
                "max_frame_size must be in [{}, {MAX_FRAME_SIZE}] (AMQP 1.0 §2.7.1)",
                shim::MIN_MAX_FRAME_SIZE
            ));
        }
        if !(self.high_water > 0.0 && self.high_water <= 1.0) {
            return Err(format!(
                "high_water must be in (0, 1], not {}",
                self.high_water
            ));
        }
        let mut names = std::collections::BTreeSet::new();
        for q in &self.queues {
            if q.name.is_empty() {
                return Err("a declared queue has an empty name".into());
            }
            if !names.insert(&q.name) {
                return Err(format!("queue '{}' is declared twice", q.name));
            }
            if q.max_messages == Some(0) || q.max_bytes == Some(0) {
                return Err(format!(
                    "queue '{}': max_messages and max_bytes must be at least 1",
                    q.name
                ));
            }
        }
        Ok(())
    }
}

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

/// A delivery on its way into a queue.
struct Staged {
    info: DeliveryInfo,
    seq: u64,
    msg: AmqpMessage,
    size: usize,
    expires: Option<Instant>,
    stored: Result<(), String>,
    /// The 0-RTT replay key to forget if the message does not make it in.
    replay_key: Option<u64>,
}

struct QueueState {
    name: String,
    q: Mutex<Queue<Item>>,
    ttl: Option<Duration>,
    /// Wakes a consumer when a message arrives (chained: a consumer that takes one and sees
    /// more wakes the next).
    arrived: Notify,
    /// Wakes producers waiting for the queue to drain below the high-water mark.
    drained: Notify,
}

impl QueueState {
    /// Return once the queue is at or below `high_msgs` messages and `high_bytes`.
    async fn wait_below(&self, high_msgs: usize, high_bytes: usize) {
        loop {
            let drained = self.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            let (depth, bytes) = {
                let g = self.lock();
                (g.depth(), g.bytes())
            };
            if depth <= high_msgs && bytes <= high_bytes {
                return;
            }
            drained.await;
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue<Item>> {
        self.q.lock().unwrap_or_else(|e| e.into_inner())
    }
}

qgate_core::counters! {
    /// What the broker's connections and links have done.
    struct Counters => CountersSnapshot {
        /// Connections held now.
        connections_open: gauge "qgate_amqp_connections_open",
            "AMQP connections held, from accept (handshake included) until their state is freed";
        /// Connections accepted or refused.
        connections_total: counter "qgate_amqp_connections", "AMQP connections accepted or refused";
        /// Connections that failed before open.
        connections_failed: counter "qgate_amqp_connections_failed",
            "connections that failed before open (framing, SASL)";
        /// Connections closed on accept for their address's share.
        connections_refused: counter "qgate_amqp_connections_refused",
            "connections closed on accept: their address held max_connections_per_address";
        /// Connections closed by a deadline.
        connections_timed_out: counter "qgate_amqp_connections_timed_out",
            "connections closed by a deadline (handshake, idle, held frame, close, write)";
        /// Connections whose stream came in 0-RTT.
        connections_early: counter "qgate_amqp_connections_early",
            "AMQP connections whose QUIC stream arrived during the handshake (0-RTT)";
        /// Links refused.
        links_refused: counter "qgate_amqp_links_refused", "links refused (unknown address, limits)";
        /// Replayed 0-RTT transfers dropped.
        replays_dropped: counter "qgate_amqp_replays_dropped",
            "replayed 0-RTT transfers accepted without queueing them again";
    }
}

struct Inner {
    cfg: BrokerConfig,
    queues: Mutex<BTreeMap<String, Arc<QueueState>>>,
    store: Option<Store>,
    next_consumer: AtomicU64,
    counters: Counters,
    replays: Mutex<ReplayGuard>,
    /// Connections held per source address (entries at zero are removed).
    per_address: Mutex<std::collections::HashMap<IpAddr, usize>>,
    /// Bridges started: (local queue, upstream as shown, counters).
    bridges: Mutex<Vec<(String, String, Arc<BridgeStats>)>>,
    /// Connections held, by id, for the admin port's list and close.
    conns: Mutex<BTreeMap<u64, std::sync::Weak<Tenancy>>>,
    next_conn: AtomicU64,
}

/// One connection's hold on the broker's tables, from accept until its last task ends: the
/// open-connection gauge and its address's count (decision M16).
struct Tenancy {
    inner: Arc<Inner>,
    addr: Option<IpAddr>,
    /// The client its address counts for: the address, or its IPv6 /64 (decision S10).
    client: Option<IpAddr>,
    id: u64,
    since: Instant,
    kind: &'static str,
    /// Set (and notified) when the operator closes the connection.
    forced: (std::sync::atomic::AtomicBool, Notify),
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
        if let Some(a) = self.client {
            let mut m = self
                .inner
                .per_address
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if let Some(n) = m.get_mut(&a) {
                *n -= 1;
                if *n == 0 {
                    m.remove(&a);
                }
            }
        }
    }
}

/// The broker; cheap to clone (all clones are the same broker).
#[derive(Clone)]
pub struct Broker {
    inner: Arc<Inner>,
}

fn amqp_error(condition: AmqpError, description: impl Into<String>) -> definitions::Error {
    definitions::Error {
        condition: condition.into(),
        description: Some(description.into()),
        info: None,
    }
}

/// Encode a message as AMQP 1.0 sections (what the store keeps).
pub fn encode(msg: &AmqpMessage) -> Vec<u8> {
    serde_amqp::to_vec(&Serializable(msg)).expect("a decoded message encodes")
}

/// Decode sections written by [`encode`].
pub fn decode(bytes: &[u8]) -> Result<AmqpMessage, String> {
    serde_amqp::from_slice::<Deserializable<AmqpMessage>>(bytes)
        .map(|d| d.0)
        .map_err(|e| e.to_string())
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
            per_address: Mutex::new(std::collections::HashMap::new()),
            bridges: Mutex::new(Vec::new()),
            conns: Mutex::default(),
            next_conn: AtomicU64::new(1),
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
                tracing::warn!(queue = %r.queue, ?limits, "recovered messages exceed the queue's limits");
                g.insert(
                    r.seq,
                    Arc::new(sendable(decode(&r.bytes).expect("decoded above"))),
                    r.bytes.len(),
                    None,
                );
            }
        }
        if n > 0 {
            tracing::info!(messages = n, "recovered durable messages");
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

    fn queues(&self) -> MutexGuard<'_, BTreeMap<String, Arc<QueueState>>> {
        self.inner.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn replays(&self) -> MutexGuard<'_, ReplayGuard> {
        self.inner.replays.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn find(&self, name: &str) -> Option<Arc<QueueState>> {
        self.queues().get(name).cloned()
    }

    fn declare(&self, name: &str, limits: Limits, ttl: Option<Duration>) -> Arc<QueueState> {
        Self::declare_in(&mut self.queues(), name, limits, ttl)
    }

    /// Queue `name` in `queues` (whose lock the caller holds, so a check and its declaration
    /// are one step), created if missing.
    fn declare_in(
        queues: &mut BTreeMap<String, Arc<QueueState>>,
        name: &str,
        limits: Limits,
        ttl: Option<Duration>,
    ) -> Arc<QueueState> {
        queues
            .entry(name.to_string())
            .or_insert_with(|| {
                Arc::new(QueueState {
                    name: name.to_string(),
                    q: Mutex::new(Queue::new(limits)),
                    ttl,
                    arrived: Notify::new(),
                    drained: Notify::new(),
                })
            })
            .clone()
    }

    /// The queue at `address`, created if allowed; a refusal is counted.
    fn resolve(&self, address: Option<&str>) -> Result<Arc<QueueState>, definitions::Error> {
        let r = self.lookup(address);
        if r.is_err() {
            self.inner
                .counters
                .links_refused
                .fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    fn lookup(&self, address: Option<&str>) -> Result<Arc<QueueState>, definitions::Error> {
        let Some(name) = address.filter(|a| !a.is_empty()) else {
            return Err(amqp_error(
                AmqpError::InvalidField,
                "the link has no address (source for receivers, target for senders)",
            ));
        };
        // One lock from the check to the creation, so racing creators cannot pass the cap.
        let mut queues = self.queues();
        if let Some(q) = queues.get(name) {
            return Ok(q.clone());
        }
        if !self.inner.cfg.auto_create {
            return Err(amqp_error(
                AmqpError::NotFound,
                format!("no queue '{name}'"),
            ));
        }
        if queues.len() >= self.inner.cfg.max_queues {
            return Err(amqp_error(
                AmqpError::ResourceLimitExceeded,
                format!("queue limit ({}) reached", self.inner.cfg.max_queues),
            ));
        }
        Ok(Self::declare_in(
            &mut queues,
            name,
            self.inner.cfg.default_limits(),
            self.inner.cfg.default_ttl,
        ))
    }

    /// Declare `decl` unless a queue has its name already (a config reload adds queues; it
    /// does not change live ones).
    pub fn declare_queue(&self, decl: &QueueDecl) -> Declared {
        // One lock for the check and the declaration: an auto-create between them must not
        // turn this queue's declared limits into the defaults.
        let mut queues = self.queues();
        if queues.contains_key(&decl.name) {
            return Declared::Exists;
        }
        if queues.len() >= self.inner.cfg.max_queues {
            return Declared::Full;
        }
        let limits = self.inner.cfg.default_limits();
        Self::declare_in(&mut queues, &decl.name, decl.limits(limits), decl.ttl);
        drop(queues);
        tracing::info!(queue = decl.name, "queue declared");
        Declared::Created
    }

    /// Remove every ready message of queue `name` (delivered, unsettled ones stay with their
    /// consumers); the store forgets them too, committed before this returns, in a task of its
    /// own so that a caller that gives up waiting cannot leave purged messages stored (to come
    /// back at a restart). None if there is no such queue.
    pub async fn purge(&self, name: &str) -> Option<usize> {
        let q = self.find(name)?;
        let mut purged = Vec::new();
        q.lock().purge(&mut purged);
        q.drained.notify_waiters();
        let n = purged.len();
        if let Some(s) = self.inner.store.clone() {
            let queue = q.name.clone();
            let forget = tokio::spawn(async move {
                for seq in purged {
                    s.delete(&queue, seq).await;
                }
                if let Err(e) = s.sync().await {
                    tracing::error!(error = %e, "purged messages may come back at a restart");
                }
            });
            let _ = forget.await;
        }
        tracing::info!(queue = name, messages = n, "queue purged");
        Some(n)
    }

    /// Up to `limit` connections held, by id, and how many there are in all.
    pub fn connection_views(&self, limit: usize) -> (Vec<ConnectionView>, usize) {
        let now = Instant::now();
        // The tenancies are dropped after the lock is released: the last one's drop takes it.
        let (held, total): (Vec<Arc<Tenancy>>, usize) = {
            let conns = self.inner.conns.lock().unwrap_or_else(|e| e.into_inner());
            let held = conns
                .values()
                .filter_map(std::sync::Weak::upgrade)
                .take(limit)
                .collect();
            (held, conns.len())
        };
        let rows = held
            .iter()
            .map(|t| ConnectionView {
                id: t.id,
                address: t.addr.map(|a| a.to_string()),
                kind: t.kind,
                age_s: now.saturating_duration_since(t.since).as_secs(),
            })
            .collect();
        drop(held);
        (rows, total)
    }

    /// Close connection `id` (the peer hears `amqp:connection:forced`); false if there is none.
    pub fn close_connection(&self, id: u64) -> bool {
        let t = self
            .inner
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .and_then(std::sync::Weak::upgrade);
        match t {
            Some(t) => {
                t.forced.0.store(true, Ordering::Release);
                t.forced.1.notify_waiters();
                true
            }
            None => false,
        }
    }

    /// Drop expired messages everywhere (the store forgets them too).
    async fn sweep(&self) {
        let queues: Vec<_> = self.queues().values().cloned().collect();
        let now = Instant::now();
        for q in queues {
            let mut expired = Vec::new();
            q.lock().expire(now, &mut expired);
            if !expired.is_empty() {
                q.drained.notify_waiters();
            }
            if let Some(s) = &self.inner.store {
                for seq in expired {
                    s.delete(&q.name, seq).await;
                }
            }
        }
    }

    /// Take a place for a connection from `addr` (None: unknown, e.g. a simulated stream);
    /// None when that client (address, or IPv6 /64: S10) holds `max_connections_per_address`
    /// already (counted, M16).
    fn tenancy(&self, addr: Option<IpAddr>, kind: &'static str) -> Option<Arc<Tenancy>> {
        let c = &self.inner.counters;
        c.connections_total.fetch_add(1, Ordering::Relaxed);
        let client = addr.map(qgate_core::quota::client_key);
        if let Some(a) = client {
            let mut m = self
                .inner
                .per_address
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let n = m.entry(a).or_insert(0);
            if *n >= self.inner.cfg.max_connections_per_address {
                drop(m);
                c.connections_refused.fetch_add(1, Ordering::Relaxed);
                tracing::info!(peer = %a, limit = self.inner.cfg.max_connections_per_address, "connection refused: per-address limit");
                return None;
            }
            *n += 1;
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
        Some(t)
    }

    /// Serve one AMQP connection on `io` until it closes. Bad framing, failed SASL or a
    /// protocol error end this connection only.
    pub async fn serve<S: Stream>(&self, io: S) {
        self.serve_from(io, None).await
    }

    /// [`Broker::serve`] for a connection from `peer`, counted against its address's limit.
    pub async fn serve_from<S: Stream>(&self, io: S, peer: Option<IpAddr>) {
        if let Some(t) = self.tenancy(peer, "tcp") {
            self.serve_guarded(io, false, t).await
        }
    }

    /// [`Broker::serve`] for a QUIC stream, whose first bytes may be 0-RTT data and so may be
    /// replayed: its transfers must carry a message-id, and a repeat of one is settled without
    /// queueing it again (decision M9). `early_hint`: the stream was accepted while the
    /// handshake was still running (counted; quinn cannot tell a server for certain, so every
    /// QUIC connection is guarded).
    pub async fn serve_quic_stream<S: Stream>(&self, io: S, early_hint: bool) {
        self.serve_quic_stream_from(io, early_hint, None).await
    }

    /// [`Broker::serve_quic_stream`] for a stream from `peer`, counted against its limit.
    pub async fn serve_quic_stream_from<S: Stream>(
        &self,
        io: S,
        early_hint: bool,
        peer: Option<IpAddr>,
    ) {
        if early_hint {
            self.inner
                .counters
                .connections_early
                .fetch_add(1, Ordering::Relaxed);
        }
        if let Some(t) = self.tenancy(peer, "quic") {
            self.serve_guarded(io, true, t).await
        }
    }

    fn shim_config(&self) -> shim::ShimConfig {
        let cfg = &self.inner.cfg;
        shim::ShimConfig {
            max_frame: cfg.max_frame_size,
            buffer: 256 * 1024,
            handshake_timeout: cfg.handshake_timeout,
            idle_timeout: cfg.idle_timeout,
            max_sessions: cfg.max_sessions.max(1),
        }
    }

    /// Serve an in-process connection (a [bridge](crate::bridge)'s own consumer): admitted as
    /// ANONYMOUS whatever the credentials, since it never leaves the process, and never
    /// counted against an address.
    pub(crate) async fn serve_trusted<S: Stream>(&self, io: S) {
        if let Some(t) = self.tenancy(None, "bridge") {
            self.serve_as(io, false, t, true).await
        }
    }

    /// Forward `cfg.queue` to its upstream until the returned future is dropped (decision
    /// M28); its counters show in [`Broker::metrics`].
    pub fn bridge(
        &self,
        cfg: BridgeConfig,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let stats = Arc::new(BridgeStats::default());
        self.inner
            .bridges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((cfg.queue.clone(), cfg.upstream_name.clone(), stats.clone()));
        crate::bridge::run(self.clone(), cfg, stats)
    }

    /// The bridges' counters: (local queue, upstream, counters).
    pub fn bridges(&self) -> Vec<(String, String, Arc<BridgeStats>)> {
        self.inner
            .bridges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    async fn serve_guarded<S: Stream>(&self, io: S, early: bool, tenancy: Arc<Tenancy>) {
        self.serve_as(io, early, tenancy, false).await
    }

    async fn serve_as<S: Stream>(&self, io: S, early: bool, tenancy: Arc<Tenancy>, trusted: bool) {
        let c = &self.inner.counters;
        // The shim holds the tenancy until both its pumps end (M16).
        let mut io = shim::shim(io, self.shim_config(), tenancy.clone());
        // The peer's protocol header picks the layer (the shim has checked it, and bounds the
        // wait for it): SASL, or, while anonymous peers are admitted, plain AMQP (M19).
        let mut head = [0u8; 8];
        if tokio::io::AsyncReadExt::read_exact(&mut io, &mut head)
            .await
            .is_err()
        {
            c.connections_failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let io = shim::Replayed::new(head, io);
        let cfg = &self.inner.cfg;
        let builder = ConnectionAcceptor::builder()
            .container_id(cfg.container_id.clone())
            .max_frame_size(cfg.max_frame_size);
        let plain = cfg.plain_amqp && cfg.credentials.admits_anonymous();
        let credentials = if trusted {
            crate::auth::Credentials::anonymous()
        } else {
            cfg.credentials.clone()
        };
        let accepted = if plain && head == *b"AMQP\x00\x01\x00\x00" {
            builder.build().accept(io).await
        } else {
            builder.sasl_acceptor(credentials).build().accept(io).await
        };
        let mut conn = match accepted {
            Ok(conn) => conn,
            Err(e) => {
                c.connections_failed.fetch_add(1, Ordering::Relaxed);
                tracing::info!(error = %e, "AMQP connection refused");
                return;
            }
        };
        let sessions = SessionAcceptor::builder()
            .incoming_window(65_536)
            .outgoing_window(65_536)
            .build();
        while let Ok(session) = sessions.accept(&mut conn).await {
            let broker = self.clone();
            tokio::spawn(async move { broker.serve_session(session, early).await });
        }
        let _ = conn.close().await;
        drop(tenancy);
    }

    async fn serve_session(&self, mut session: ListenerSessionHandle, early: bool) {
        // Decision M26: every link announces the largest message the shim lets through, so a
        // sender refuses a larger one itself instead of streaming it into a closed connection.
        let links = LinkAcceptor::builder()
            .max_message_size(crate::shim::MAX_PARTIAL as u64)
            .build();
        loop {
            match links.accept(&mut session).await {
                Ok(LinkEndpoint::Sender(s)) => {
                    let b = self.clone();
                    tokio::spawn(async move { b.consumer(s).await });
                }
                Ok(LinkEndpoint::Receiver(r)) => {
                    let b = self.clone();
                    tokio::spawn(async move { b.producer(r, early).await });
                }
                Err(e) => {
                    // The session ended, or one attach was bad (fe2o3 answered it).
                    tracing::debug!(error = ?e, "link accept ended");
                    if session.is_ended() {
                        break;
                    }
                }
            }
        }
        let _ = session.end().await;
    }

    /// A link on which a peer sends to a queue.
    async fn producer(&self, mut r: Receiver, early: bool) {
        let address = r
            .target()
            .as_ref()
            .and_then(|t| t.address.clone())
            .map(|a| a.to_string());
        let q = match self.resolve(address.as_deref()) {
            Ok(q) => q,
            Err(e) => {
                let _ = r.close_with_error(e).await;
                return;
            }
        };
        r.set_credit_mode(CreditMode::Auto(self.inner.cfg.producer_credit));
        if r.set_credit(self.inner.cfg.producer_credit).await.is_err() {
            return;
        }
        let limits = q.lock().limits();
        let high = (
            (limits.max_messages as f64 * self.inner.cfg.high_water) as usize,
            (limits.max_bytes as f64 * self.inner.cfg.high_water) as usize,
        );
        // Deliveries whose durable write is under way, in arrival order: the store commits in
        // order, so they complete in order, and several share one fsync (group commit).
        let mut pending = FuturesOrdered::new();
        let window = self.inner.cfg.producer_credit.max(1) as usize;
        let mut open = true;
        while open || !pending.is_empty() {
            tokio::select! {
                biased;
                Some(done) = pending.next(), if !pending.is_empty() => {
                    // Everything the same commit made durable is settled in one disposition (M30).
                    let mut ready = vec![done];
                    while let Some(Some(d)) = pending.next().now_or_never() {
                        ready.push(d);
                    }
                    if !self.admit(&q, &mut r, ready, high, open).await {
                        open = false;
                    }
                }
                d = r.recv::<Body<Value>>(), if open && pending.len() < window => {
                    let d = match d {
                        Ok(d) => d,
                        Err(e) => {
                            tracing::debug!(queue = %q.name, error = ?e, "producer link ended");
                            open = false;
                            continue;
                        }
                    };
                    match self.stage(&q, d, early) {
                        Ok(fut) => pending.push_back(fut),
                        Err((info, Some(e))) => {
                            if r.reject(info, e).await.is_err() {
                                open = false;
                            }
                        }
                        Err((info, None)) => {
                            // A replayed 0-RTT transfer: it is already queued once.
                            if r.accept(info).await.is_err() {
                                open = false;
                            }
                        }
                    }
                }
            }
        }
        let _ = r.close().await;
    }

    /// Reserve a place for a delivery and start its durable write; the returned future
    /// resolves when it is committed (at once for memory-only brokers). Err(None): a replay of
    /// a 0-RTT transfer already taken (settle it, queue nothing).
    #[allow(clippy::type_complexity)]
    fn stage(
        &self,
        q: &Arc<QueueState>,
        d: fe2o3_amqp::link::delivery::Delivery<Body<Value>>,
        early: bool,
    ) -> Result<
        futures_util::future::BoxFuture<'static, Staged>,
        (DeliveryInfo, Option<definitions::Error>),
    > {
        let info = DeliveryInfo::from(&d);
        let msg = d.into_message();
        let bytes = encode(&msg);
        let size = bytes.len();
        let replay_key = if early {
            let Some(id) = msg.properties.as_ref().and_then(|p| p.message_id.as_ref()) else {
                return Err((
                    info,
                    Some(amqp_error(
                        AmqpError::PreconditionFailed,
                        "a transfer over QUIC needs a message-id (0-RTT replay protection)",
                    )),
                ));
            };
            let key = replay_key(&q.name, id, &bytes);
            if !self.replays().first_time(key, Instant::now()) {
                self.inner
                    .counters
                    .replays_dropped
                    .fetch_add(1, Ordering::Relaxed);
                return Err((info, None));
            }
            Some(key)
        } else {
            None
        };
        let header_ttl = msg
            .header
            .as_ref()
            .and_then(|h| h.ttl)
            .map(|ms| Duration::from_millis(ms as u64));
        let ttl = match (header_ttl, q.ttl) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let expires = ttl.map(|t| Instant::now() + t);
        let reserved = q.lock().reserve(size);
        let seq = reserved.map_err(|refused| {
            if let Some(k) = replay_key {
                self.replays().forget(k);
            }
            (
                info.clone(),
                Some(amqp_error(
                    AmqpError::ResourceLimitExceeded,
                    format!("{}: {refused}", q.name),
                )),
            )
        })?;
        let store = self.inner.store.clone();
        let name = q.name.clone();
        Ok(Box::pin(async move {
            let stored = match store {
                Some(s) => s.put(&name, seq, bytes).await.map_err(|e| e.to_string()),
                None => Ok(()),
            };
            Staged {
                info,
                seq,
                msg,
                size,
                expires,
                stored,
                replay_key,
            }
        }))
    }

    /// Deliveries whose writes are done: put them in the queue and settle them with the producer
    /// (one disposition for all that were accepted), after waiting out back-pressure. False
    /// when the link is gone.
    async fn admit(
        &self,
        q: &QueueState,
        r: &mut Receiver,
        staged: Vec<Staged>,
        (high_msgs, high_bytes): (usize, usize),
        open: bool,
    ) -> bool {
        let mut accepted = Vec::with_capacity(staged.len());
        let mut alive = open;
        for s in staged {
            let refused = match s.stored {
                Err(e) => {
                    tracing::error!(queue = %q.name, error = %e, "could not store a message");
                    Some(amqp_error(
                        AmqpError::InternalError,
                        format!("message store: {e}"),
                    ))
                }
                Ok(()) => {
                    let inserted =
                        q.lock()
                            .insert(s.seq, Arc::new(sendable(s.msg)), s.size, s.expires);
                    if inserted {
                        None
                    } else {
                        if let Some(store) = &self.inner.store {
                            store.delete(&q.name, s.seq).await;
                            // Synced before the producer hears "refused": a crash must not
                            // bring the message back beside its retry (M30 leaves deletions
                            // of settled messages unsynced, not these).
                            if let Err(e) = store.sync().await {
                                tracing::error!(queue = %q.name, error = %e, "message store sync failed");
                            }
                        }
                        Some(amqp_error(
                            AmqpError::ResourceLimitExceeded,
                            format!("{}: queue is full", q.name),
                        ))
                    }
                }
            };
            match refused {
                None => {
                    accepted.push(s.info);
                    q.arrived.notify_one();
                    // Back-pressure, one delivery at a time as before ranges: the next is not
                    // queued, and none of these is settled (settling refills the producer's
                    // credit), while the queue is above its high-water mark.
                    if alive {
                        q.wait_below(high_msgs, high_bytes).await;
                    }
                }
                Some(e) => {
                    if let Some(k) = s.replay_key {
                        self.replays().forget(k);
                    }
                    alive = alive && r.reject(s.info, e).await.is_ok();
                }
            }
        }
        if accepted.is_empty() || !alive {
            // Whatever was stored is queued; a producer that is gone resends (at-least-once).
            return alive;
        }
        if accepted.len() == 1 {
            r.accept(accepted.pop().expect("one")).await.is_ok()
        } else {
            r.accept_all(accepted).await.is_ok()
        }
    }

    /// A link on which a peer receives from a queue: competing with the queue's other consumers,
    /// up to `consumer_window` deliveries outstanding; whatever is outstanding when the link or
    /// its connection goes goes back to the queue.
    async fn consumer(&self, mut s: Sender) {
        let address = s
            .source()
            .as_ref()
            .and_then(|t| t.address.clone())
            .map(|a| a.to_string());
        let q = match self.resolve(address.as_deref()) {
            Ok(q) => q,
            Err(e) => {
                let _ = s.close_with_error(e).await;
                return;
            }
        };
        let id: ConsumerId = self.inner.next_consumer.fetch_add(1, Ordering::Relaxed);
        let window = self.inner.cfg.consumer_window.max(1);
        let mut inflight = FuturesUnordered::new();
        'link: loop {
            while let Some(Some((seq, outcome))) = inflight.next().now_or_never() {
                if !self.settle(&q, id, seq, outcome).await {
                    break 'link;
                }
            }
            if inflight.len() >= window {
                if let Some((seq, outcome)) = inflight.next().await {
                    if !self.settle(&q, id, seq, outcome).await {
                        break 'link;
                    }
                }
                continue;
            }
            let arrived = q.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            let mut expired = Vec::new();
            let (taken, more) = {
                let mut g = q.lock();
                let t = g.take(id, false, Instant::now(), &mut expired);
                (t, g.ready() > 0)
            };
            self.forget(&q, expired).await;
            match taken {
                Some(t) => {
                    if more {
                        q.arrived.notify_one();
                    }
                    let item = if t.redeliveries > 0 {
                        Arc::new(redelivered(&t.msg, t.redeliveries))
                    } else {
                        t.msg
                    };
                    match s.send_batchable_ref(&item).await {
                        Ok(fut) => {
                            let seq = t.seq;
                            inflight.push(async move { (seq, fut.await.ok()) });
                        }
                        Err(e) => {
                            tracing::debug!(queue = %q.name, error = ?e, "consumer link ended");
                            q.lock().release(id, t.seq, false);
                            q.arrived.notify_one();
                            break 'link;
                        }
                    }
                }
                None => {
                    tokio::select! {
                        // Outcomes first, then the link's end, then news (decision U12: no
                        // unseeded draw among branches ready at once).
                        biased;
                        Some((seq, outcome)) = inflight.next(), if !inflight.is_empty() => {
                            if !self.settle(&q, id, seq, outcome).await {
                                break 'link;
                            }
                        }
                        _ = s.on_detach() => break 'link,
                        _ = &mut arrived => {}
                    }
                }
            }
        }
        // Outcomes that arrived before the detach still count (the peer settled them). Each
        // delivery is polled directly: `FuturesUnordered::next` may answer Pending while another
        // thread is mid-way through waking one of them, which lost outcomes under load (the
        // messages came back as released and were delivered twice).
        let settled: Vec<(u64, Option<Outcome>)> = std::pin::Pin::new(&mut inflight)
            .iter_pin_mut()
            .filter_map(|f| f.now_or_never())
            .collect();
        drop(inflight);
        for (seq, outcome) in settled {
            self.settle(&q, id, seq, outcome).await;
        }
        let back = q.lock().consumer_gone(id);
        if back > 0 {
            tracing::debug!(queue = %q.name, messages = back, "redelivering a gone consumer's messages");
            q.arrived.notify_one();
        }
        let _ = s.close().await;
    }

    /// Apply a consumer's outcome for `seq`; false when the delivery failed (the link or its
    /// session is gone).
    async fn settle(
        &self,
        q: &QueueState,
        id: ConsumerId,
        seq: u64,
        outcome: Option<Outcome>,
    ) -> bool {
        let alive = outcome.is_some();
        let gone = match outcome {
            // Accepted, or rejected (a message the consumer cannot process is not retried).
            Some(Outcome::Accepted(_)) | Some(Outcome::Rejected(_)) => q.lock().ack(id, seq),
            Some(Outcome::Released(_)) => {
                q.lock().release(id, seq, false);
                q.arrived.notify_one();
                false
            }
            // Modified, or the link failed before an outcome arrived.
            _ => {
                q.lock().release(id, seq, true);
                q.arrived.notify_one();
                false
            }
        };
        if gone {
            q.drained.notify_waiters();
            if let Some(store) = &self.inner.store {
                store.delete(&q.name, seq).await;
            }
        }
        alive
    }

    async fn forget(&self, q: &QueueState, expired: Vec<u64>) {
        if expired.is_empty() {
            return;
        }
        q.drained.notify_waiters();
        if let Some(store) = &self.inner.store {
            for seq in expired {
                store.delete(&q.name, seq).await;
            }
        }
    }

    /// Depth and counters of every queue.
    pub fn queue_stats(&self) -> Vec<QueueReport> {
        self.queues()
            .values()
            .map(|q| {
                let g = q.lock();
                QueueReport {
                    name: q.name.clone(),
                    depth: g.depth(),
                    ready: g.ready(),
                    unacked: g.unacked(),
                    bytes: g.bytes(),
                    stats: g.stats(),
                }
            })
            .collect()
    }

    /// The broker's metrics as a registry collector (decision O1).
    pub fn collector(&self) -> BrokerMetrics {
        BrokerMetrics(self.clone())
    }

    /// The broker's metrics text (OpenMetrics), as the admin port serves it.
    pub fn metrics(&self) -> String {
        metrics::render(self.collector())
    }
}

/// Reads the broker's queues, connections and bridges at scrape time.
#[derive(Clone)]
pub struct BrokerMetrics(Broker);

impl std::fmt::Debug for BrokerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BrokerMetrics")
    }
}

impl metrics::Collector for BrokerMetrics {
    fn encode(&self, mut e: metrics::DescriptorEncoder) -> std::fmt::Result {
        let b = &self.0;
        let qs = b.queue_stats();
        let by_queue = |f: &dyn Fn(&QueueReport) -> u64| {
            qs.iter()
                .map(move |q| ([("queue", q.name.as_str())], f(q)))
                .collect::<Vec<_>>()
        };
        for (name, help, f) in [
            (
                "qgate_amqp_queue_depth",
                "messages held (ready + unsettled)",
                &(|q: &QueueReport| q.depth as u64) as &dyn Fn(&QueueReport) -> u64,
            ),
            (
                "qgate_amqp_queue_ready",
                "messages waiting for a consumer",
                &|q| q.ready as u64,
            ),
            (
                "qgate_amqp_queue_unacked",
                "messages delivered, not yet settled",
                &|q| q.unacked as u64,
            ),
            ("qgate_amqp_queue_bytes", "message bytes held", &|q| {
                q.bytes as u64
            }),
        ] {
            metrics::gauges(&mut e, name, help, by_queue(f))?;
        }
        for (name, help, f) in [
            (
                "qgate_amqp_enqueued",
                "messages accepted into the queue",
                &(|q: &QueueReport| q.stats.enqueued) as &dyn Fn(&QueueReport) -> u64,
            ),
            ("qgate_amqp_acked", "messages settled by consumers", &|q| {
                q.stats.acked
            }),
            (
                "qgate_amqp_redelivered",
                "messages put back for redelivery",
                &|q| q.stats.released,
            ),
            ("qgate_amqp_expired", "messages dropped by TTL", &|q| {
                q.stats.expired
            }),
            (
                "qgate_amqp_refused",
                "messages refused by the queue's limits",
                &|q| q.stats.refused,
            ),
        ] {
            metrics::counters(&mut e, name, help, by_queue(f))?;
        }
        let cfg = &b.inner.cfg;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        b.inner.counters.snapshot().encode(&mut e)?;
        metrics::gauge(
            &mut e,
            "qgate_amqp_max_connections_per_address",
            "configured limit of connections per source address",
            cfg.max_connections_per_address as u64,
        )?;
        metrics::gauge(
            &mut e,
            "qgate_amqp_handshake_timeout_seconds",
            "configured handshake deadline",
            cfg.handshake_timeout.as_secs_f64(),
        )?;
        metrics::gauge(
            &mut e,
            "qgate_amqp_idle_timeout_seconds",
            "configured idle timeout (0: none)",
            cfg.idle_timeout.as_secs_f64(),
        )?;
        let bridges = b.bridges();
        let by_bridge = |f: &dyn Fn(&BridgeStats) -> u64| {
            bridges
                .iter()
                .map(|(q, up, st)| ([("queue", q.as_str()), ("upstream", up.as_str())], f(st)))
                .collect::<Vec<_>>()
        };
        for (name, help, f) in [
            (
                "qgate_amqp_bridge_forwarded",
                "messages the upstream accepted (then forgotten here)",
                &(|s: &BridgeStats| r(&s.forwarded)) as &dyn Fn(&BridgeStats) -> u64,
            ),
            (
                "qgate_amqp_bridge_rejected",
                "messages the upstream refused for good (dropped)",
                &|s| r(&s.rejected),
            ),
            (
                "qgate_amqp_bridge_connects",
                "connections opened to the upstream",
                &|s| r(&s.connects),
            ),
        ] {
            metrics::counters(&mut e, name, help, by_bridge(f))?;
        }
        metrics::gauges(
            &mut e,
            "qgate_amqp_bridge_up",
            "1 while the upstream link is attached",
            by_bridge(&|s| u64::from(s.up.load(Ordering::Relaxed))),
        )
    }
}

/// What [`Broker::declare_queue`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Declared {
    /// The queue was created.
    Created,
    /// A queue of that name exists (declared before or auto-created): it keeps its limits.
    Exists,
    /// The broker holds `max_queues` already.
    Full,
}

/// One connection, as the admin port lists it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ConnectionView {
    /// Its id (for closing it).
    pub id: u64,
    /// The peer's IP address, when known.
    pub address: Option<String>,
    /// `quic`, `tls`, `tcp` or `bridge` (a bridge's own consumer).
    pub kind: &'static str,
    /// Seconds since it was accepted.
    pub age_s: u64,
}

/// One queue's state for reports.
#[derive(Debug, Clone)]
pub struct QueueReport {
    /// Address.
    pub name: String,
    /// Ready + unsettled.
    pub depth: usize,
    /// Waiting for a consumer.
    pub ready: usize,
    /// Delivered, not settled.
    pub unacked: usize,
    /// Bytes held.
    pub bytes: usize,
    /// Counters.
    pub stats: QueueStats,
}

/// Transfers from 0-RTT connections seen recently: a replayed flight repeats queue, message-id
/// and bytes exactly, so a repeat within [`REPLAY_WINDOW`] is settled without queueing it
/// again. Bounded: beyond [`REPLAY_KEYS`] the oldest keys go first.
#[derive(Debug, Default)]
struct ReplayGuard {
    seen: std::collections::HashMap<u64, Instant>,
    order: std::collections::VecDeque<(u64, Instant)>,
}

/// How long a 0-RTT transfer is remembered (longer than a session ticket is accepted).
const REPLAY_WINDOW: Duration = Duration::from_secs(24 * 3600);
/// Most remembered transfers (~50 bytes each).
const REPLAY_KEYS: usize = 1 << 18;

impl ReplayGuard {
    /// Record `key`; false if it was seen within the window.
    fn first_time(&mut self, key: u64, now: Instant) -> bool {
        while let Some(&(k, t)) = self.order.front() {
            if self.order.len() < REPLAY_KEYS && now.duration_since(t) < REPLAY_WINDOW {
                break;
            }
            self.order.pop_front();
            if self.seen.get(&k) == Some(&t) {
                self.seen.remove(&k);
            }
        }
        if self.seen.contains_key(&key) {
            return false;
        }
        self.seen.insert(key, now);
        self.order.push_back((key, now));
        true
    }

    fn forget(&mut self, key: u64) {
        self.seen.remove(&key);
    }
}

fn replay_key(queue: &str, id: &fe2o3_amqp::types::messaging::MessageId, bytes: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    queue.hash(&mut h);
    format!("{id:?}").hash(&mut h);
    bytes.hash(&mut h);
    h.finish()
}

fn sendable(msg: AmqpMessage) -> Sendable<Body<Value>> {
    Sendable::builder().message(msg).build()
}

/// A copy for redelivery with the header's delivery-count and first-acquirer updated (AMQP 1.0
/// §3.2.1).
fn redelivered(item: &Sendable<Body<Value>>, count: u32) -> Sendable<Body<Value>> {
    let mut s = item.clone();
    let h = s.message.header.get_or_insert_with(Default::default);
    h.delivery_count = h.delivery_count.max(count);
    h.first_acquirer = false;
    s
}

/// What each QUIC connection's own configuration is derived from (a qlog file each).
pub struct PerConnection {
    /// The endpoint's server configuration.
    pub base: quinn::ServerConfig,
    /// The options it was built from.
    pub opts: qgate_transport::TransportOptions,
}

/// Serve AMQP on every bidirectional stream of every connection `endpoint` accepts.
pub async fn serve_quic(broker: Broker, endpoint: quinn::Endpoint, own: Option<PerConnection>) {
    let own = own.map(Arc::new);
    while let Some(incoming) = endpoint.accept().await {
        let broker = broker.clone();
        let own = own.clone();
        tokio::spawn(async move {
            let peer = incoming.remote_address().to_string();
            let cfg = own.as_ref().and_then(|p| {
                qgate_transport::server_config_for(&p.base, &p.opts, &peer)
                    .inspect_err(|e| tracing::warn!(%peer, error = %e, "per-connection config"))
                    .ok()
                    .flatten()
            });
            let conn = match cfg {
                Some(cfg) => incoming.accept_with(cfg),
                None => incoming.accept(),
            };
            let conn = match conn {
                Ok(c) => c,
                Err(_) => return,
            };
            // 0-RTT: streams opened in early data are served before the handshake completes
            // (decision M2 says what may ride in them).
            // A stream accepted before the handshake completes was opened in 0-RTT data.
            let handshaken = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let conn = match conn.into_0rtt() {
                Ok((c, done)) => {
                    let h = handshaken.clone();
                    tokio::spawn(async move {
                        done.await;
                        h.store(true, Ordering::Release);
                    });
                    c
                }
                Err(connecting) => match connecting.await {
                    Ok(c) => {
                        handshaken.store(true, Ordering::Release);
                        c
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "QUIC handshake failed");
                        return;
                    }
                },
            };
            let peer = conn.remote_address().ip();
            // AMQP rides on bidirectional streams only: grant no more unidirectional ones
            // than the listener's options did (transport::broker_options grants none).
            conn.set_max_concurrent_uni_streams(0u32.into());
            while let Ok((send, recv)) = conn.accept_bi().await {
                let broker = broker.clone();
                let early = !handshaken.load(Ordering::Acquire);
                if early {
                    broker
                        .inner
                        .counters
                        .connections_early
                        .fetch_add(1, Ordering::Relaxed);
                }
                // Every stream is an AMQP connection and takes a place of its address (M16);
                // the first one refused closes the QUIC connection, so a peer cannot open and
                // drop streams at line rate against the limit (decision M25).
                let Some(t) = broker.tenancy(Some(peer), "quic") else {
                    conn.close(1u32.into(), b"per-address connection limit");
                    break;
                };
                tokio::spawn(async move {
                    broker
                        .serve_guarded(tokio::io::join(recv, send), true, t)
                        .await
                });
            }
        });
    }
}

/// Serve AMQP on every TCP connection `listener` accepts, with TLS when `tls` is given.
pub async fn serve_tcp(
    broker: Broker,
    listener: tokio::net::TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
) {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let broker = broker.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let kind = if acceptor.is_some() { "tls" } else { "tcp" };
            let Some(tenancy) = broker.tenancy(Some(peer.ip()), kind) else {
                return;
            };
            match acceptor {
                None => broker.serve_guarded(tcp, false, tenancy).await,
                // The TLS handshake is part of the handshake deadline (M16).
                Some(a) => {
                    match tokio::time::timeout(broker.inner.cfg.handshake_timeout, a.accept(tcp))
                        .await
                    {
                        Ok(Ok(tls)) => broker.serve_guarded(tls, false, tenancy).await,
                        Ok(Err(e)) => tracing::info!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => {
                            shim::Watch::timed_out(&*tenancy, shim::Deadline::Handshake);
                            tracing::info!(%peer, "TLS handshake timed out");
                        }
                    }
                }
            }
        });
    }
}

impl Broker {
    /// The TLS server handshake on `io` (any byte stream: a user-space TCP on the simulated
    /// network, say), then serve the AMQP connection over it.
    pub async fn serve_tls<S: Stream>(&self, io: S, tls: Arc<rustls::ServerConfig>) {
        let Some(tenancy) = self.tenancy(None, "tls") else {
            return;
        };
        let accept = tokio_rustls::TlsAcceptor::from(tls).accept(io);
        match tokio::time::timeout(self.inner.cfg.handshake_timeout, accept).await {
            Ok(Ok(s)) => self.serve_guarded(s, false, tenancy).await,
            Ok(Err(e)) => tracing::info!(error = %e, "TLS handshake failed"),
            Err(_) => shim::Watch::timed_out(&*tenancy, shim::Deadline::Handshake),
        }
    }

    /// Connections held now: from accept (handshake included) until every task serving one
    /// has ended and its state is freed.
    pub fn connections_open(&self) -> u64 {
        self.inner.counters.connections_open.load(Ordering::Relaxed)
    }
}
