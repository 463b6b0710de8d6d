//! The MQTT front door over TCP (issue 51): MQTT 3.1.1 and 5.0 clients PUBLISH records, which
//! go down the same pipeline as HTTP/3 ones ([`Gateway::ingest`]).
//!
//! A thin shell around the sans-IO [`qgate_mqtt::Connection`]: one task per TCP connection
//! reads into the codec in bounded chunks, writes what it returns, arms its timer, and turns
//! each PUBLISH into a [`DoorRecord`]. The door's own decisions (topic → stream, class, client
//! ids and takeover, request ids) are in [`rules`].
//!
//! - **Stream**: the topic with `/` as `.` (`sensors/room1` → `/ingest/sensors.room1`); a topic
//!   that is not a stream name is refused with 0x90 Topic Name invalid.
//! - **Class**: user property `qgate-priority` (`1`/`0`), else `priority_topics`, else best effort.
//! - **Acknowledgement**: PUBACK (QoS 1) or PUBREC (QoS 2) only once the server has stored the
//!   record or the spool holds it; otherwise 5.0 clients get the reason ([`rules::reason_for`])
//!   and 3.1.1 clients are disconnected, so they send it again.
//! - **Request ids**: a QoS 1/2 message's id is remembered by packet id in its client's session,
//!   so a copy sent again with DUP goes under the same id and the server stores it once; QoS 0
//!   messages get a fresh id each.
//! - **Bounds**: connections (global and per address), remembered sessions, the codec's packet
//!   size and receive maximum; a connection has at most `receive_maximum` records in the
//!   pipeline and stops reading its socket while full; a QoS 0 message that finds no room is
//!   dropped and counted.
//! - **Not yet**: subscriptions (refused by the codec), TLS and QUIC, authentication (issue 49):
//!   any client id is taken, so the door listens on loopback unless the operator says otherwise.

pub mod config;
pub mod rules;

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use qgate_core::sync::lock;
use qgate_forward::session::ConnId;
use qgate_mqtt::{Accept, Closed, Connection, Event, Message, ProtocolVersion, QoS, ReasonCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Instant;

pub use config::MqttConfig;

use crate::gateway::{DoorRecord, Gateway, Ingested};

/// Bytes read from a socket at a time.
const READ_CHUNK: usize = 16 * 1024;
/// A write the client does not take within this long closes its connection.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

qgate_core::counters! {
    /// What the MQTT door has done.
    pub struct MqttStats => MqttSnapshot {
        /// TCP connections taken.
        connections: counter "qgate_gateway_mqtt_connections", "MQTT TCP connections taken";
        /// TCP connections closed at once: the door or the address had its most.
        connections_refused: counter "qgate_gateway_mqtt_connections_refused",
            "MQTT TCP connections closed at once: the door or the address had its most";
        /// Open MQTT connections.
        open: gauge "qgate_gateway_mqtt_open_connections", "open MQTT connections";
        /// CONNECTs accepted.
        connects: counter "qgate_gateway_mqtt_connects", "MQTT CONNECTs accepted";
        /// CONNECTs refused: bad client id, or every session slot held.
        connects_refused: counter "qgate_gateway_mqtt_connects_refused",
            "MQTT CONNECTs refused: bad client id or every session slot held";
        /// Connections closed because a newer one took their client id.
        takeovers: counter "qgate_gateway_mqtt_takeovers",
            "MQTT connections closed because a newer one took their client id";
        /// Connections closed for a protocol violation or a limit.
        violations: counter "qgate_gateway_mqtt_violations",
            "MQTT connections closed for a protocol violation or a limit";
        /// QoS 0 PUBLISHes.
        publish_qos0: counter "qgate_gateway_mqtt_publish_qos0", "MQTT QoS 0 messages received";
        /// QoS 1 PUBLISHes.
        publish_qos1: counter "qgate_gateway_mqtt_publish_qos1", "MQTT QoS 1 messages received";
        /// QoS 2 PUBLISHes.
        publish_qos2: counter "qgate_gateway_mqtt_publish_qos2", "MQTT QoS 2 messages received";
        /// Messages stored by the server or the spool.
        stored: counter "qgate_gateway_mqtt_stored",
            "MQTT messages stored by the server or the spool";
        /// Messages refused: their topic is not a stream name (0x90).
        refused_topic: counter "qgate_gateway_mqtt_refused_topic",
            "MQTT messages refused: topic not a stream name (0x90)";
        /// Messages neither the server nor the spool took.
        refused_not_stored: counter "qgate_gateway_mqtt_refused_not_stored",
            "MQTT messages neither the server nor the spool took";
        /// QoS 0 messages dropped: the connection had its most in the pipeline.
        dropped_qos0: counter "qgate_gateway_mqtt_dropped_qos0",
            "MQTT QoS 0 messages dropped: the connection had its most in the pipeline";
    }
}

/// The MQTT door of one gateway.
pub struct MqttDoor {
    gw: Arc<Gateway>,
    cfg: MqttConfig,
    codec: qgate_mqtt::Config,
    stats: Arc<MqttStats>,
    registry: Mutex<rules::Registry>,
    per_address: Mutex<HashMap<IpAddr, usize>>,
    /// Request ids are `m-<salt><n>`: a salt per door start, so a restarted gateway never
    /// reuses one.
    salt: u64,
    next: AtomicU64,
}

impl MqttDoor {
    /// The door for `gw`; `salt` starts its request ids (random, or from the gateway's seed).
    pub fn new(gw: Arc<Gateway>, cfg: MqttConfig, salt: u64) -> Arc<MqttDoor> {
        let codec = cfg.codec(gw.config().max_inflight_per_device);
        let stats = gw.mqtt_stats();
        Arc::new(MqttDoor {
            registry: Mutex::new(rules::Registry::new(cfg.max_sessions)),
            per_address: Mutex::default(),
            codec,
            stats,
            salt,
            next: AtomicU64::new(0),
            cfg,
            gw,
        })
    }

    /// Its counters.
    pub fn stats(&self) -> &Arc<MqttStats> {
        &self.stats
    }

    /// Take connections on `listener` until the task is dropped.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    tracing::warn!(error = %e, "MQTT accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            self.stats.connections.fetch_add(1, Ordering::Relaxed);
            let Some(slot) = self.slot(peer.ip()) else {
                self.stats
                    .connections_refused
                    .fetch_add(1, Ordering::Relaxed);
                drop(stream);
                continue;
            };
            let door = self.clone();
            tokio::spawn(async move {
                let _slot = slot;
                door.serve_connection(stream, peer).await;
            });
        }
    }

    /// A connection slot for `ip`, if the door and the address have room.
    fn slot(self: &Arc<Self>, ip: IpAddr) -> Option<Slot> {
        let mut per = lock(&self.per_address);
        let open: usize = per.values().sum();
        let mine = per.get(&ip).copied().unwrap_or(0);
        if open >= self.cfg.max_connections || mine >= self.cfg.max_connections_per_address {
            return None;
        }
        *per.entry(ip).or_default() += 1;
        self.stats.open.fetch_add(1, Ordering::Relaxed);
        Some(Slot {
            door: self.clone(),
            ip,
        })
    }

    async fn serve_connection(self: &Arc<Self>, stream: TcpStream, peer: SocketAddr) {
        let _ = stream.set_nodelay(true);
        let conn_id = self.gw.next_connection_id();
        let mut c = Conn {
            door: self.clone(),
            id: conn_id,
            peer,
            codec: Connection::new(self.codec.clone(), Instant::now().into_std()),
            client: None,
            tasks: JoinSet::new(),
            waiting: VecDeque::new(),
            max: usize::from(self.codec.receive_maximum),
        };
        let (mut rd, mut wr) = stream.into_split();
        let mut buf = vec![0u8; READ_CHUNK];
        let never = Arc::new(tokio::sync::Notify::new());
        loop {
            c.handle_events();
            c.start_waiting();
            let mut failed = false;
            while let Some(out) = c.codec.poll_transmit() {
                match tokio::time::timeout(WRITE_TIMEOUT, wr.write_all(&out)).await {
                    Ok(Ok(())) => {}
                    _ => {
                        failed = true;
                        break;
                    }
                }
            }
            if failed || c.codec.is_closed() {
                break;
            }
            let room = c.tasks.len() < c.max && c.waiting.is_empty();
            let due = c.codec.poll_timeout().map(Instant::from_std);
            let taken = c
                .client
                .as_ref()
                .map_or(never.clone(), |k| k.taken_over.clone());
            tokio::select! {
                // A takeover first, then finished records (their acknowledgements before more
                // input), then the codec's deadlines, which the peer's bytes do not lift, and
                // last the peer's bytes.
                biased;
                _ = taken.notified() => {
                    self.stats.takeovers.fetch_add(1, Ordering::Relaxed);
                    let _ = c.codec.close(ReasonCode::SessionTakenOver);
                }
                Some(done) = c.tasks.join_next(), if !c.tasks.is_empty() => {
                    if let Ok(done) = done {
                        c.finish(done);
                    }
                }
                _ = sleep_until(due) => c.codec.handle_timeout(Instant::now().into_std()),
                r = rd.read(&mut buf), if room => match r {
                    Ok(0) | Err(_) => break,
                    Ok(n) => c.codec.handle_bytes(Instant::now().into_std(), &buf[..n]),
                },
            }
        }
        c.handle_events();
        let _ = wr.shutdown().await;
        // Records in the pipeline finish on their own: a client that did not hear of them
        // sends them again (under the same ids) and the server stores them once.
        c.tasks.detach_all();
        if let Some(k) = c.client.take() {
            lock(&self.registry).disconnect(&k.id, conn_id);
        }
        self.gw.end_connection(conn_id);
    }
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// A connection's place in the door's bounds, given back on drop.
struct Slot {
    door: Arc<MqttDoor>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut per = lock(&self.door.per_address);
        if let Some(n) = per.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                per.remove(&self.ip);
            }
        }
        self.door.stats.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The client a connection serves, once its CONNECT is accepted.
struct Client {
    id: String,
    memory: Arc<Mutex<rules::Memory>>,
    taken_over: Arc<tokio::sync::Notify>,
}

/// How one record's ingest ended: its packet id (QoS 1/2) and whether it is stored.
struct Done {
    packet_id: Option<u16>,
    outcome: Result<(), ReasonCode>,
}

/// One MQTT connection's state in its task.
struct Conn {
    door: Arc<MqttDoor>,
    id: ConnId,
    peer: SocketAddr,
    codec: Connection,
    client: Option<Client>,
    /// Records in the pipeline, at most `max`.
    tasks: JoinSet<Done>,
    /// QoS 1/2 messages waiting for room (the codec's receive maximum bounds them).
    waiting: VecDeque<Message>,
    max: usize,
}

impl Conn {
    fn handle_events(&mut self) {
        while let Some(ev) = self.codec.poll_event() {
            match ev {
                Event::Connect(req) => self.on_connect(&req),
                Event::Publish(m) => self.on_publish(m),
                Event::Closed(why) => {
                    if matches!(why, Closed::Violation(_)) {
                        self.door.stats.violations.fetch_add(1, Ordering::Relaxed);
                    }
                    tracing::debug!(peer = %self.peer, ?why, "MQTT connection closed");
                }
            }
        }
    }

    fn on_connect(&mut self, req: &qgate_mqtt::ConnectRequest) {
        let stats = &self.door.stats;
        let assigned = req.client_id.is_empty();
        let client_id = if assigned {
            format!("qgate-{:x}-{}", self.door.salt, self.id)
        } else if rules::valid_client_id(&req.client_id) {
            req.client_id.clone()
        } else {
            stats.connects_refused.fetch_add(1, Ordering::Relaxed);
            let _ = self.codec.refuse(ReasonCode::ClientIdentifierNotValid);
            return;
        };
        let keep = match req.protocol {
            ProtocolVersion::V5 => req.session_expiry > 0,
            _ => !req.clean_start,
        };
        let claimed = lock(&self.door.registry).connect(&client_id, self.id, req.clean_start, keep);
        let Some(claimed) = claimed else {
            stats.connects_refused.fetch_add(1, Ordering::Relaxed);
            let _ = self.codec.refuse(ReasonCode::ServerBusy);
            return;
        };
        let accept = Accept {
            session_present: claimed.session_present,
            assigned_client_id: assigned.then(|| client_id.clone()),
            user_properties: Vec::new(),
        };
        if self.codec.accept(accept).is_err() {
            lock(&self.door.registry).disconnect(&client_id, self.id);
            return;
        }
        stats.connects.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(peer = %self.peer, client = %client_id, took_over = claimed.took_over, "MQTT client connected");
        self.client = Some(Client {
            id: client_id,
            memory: claimed.memory,
            taken_over: claimed.taken_over,
        });
    }

    fn on_publish(&mut self, m: Message) {
        let stats = &self.door.stats;
        match m.qos {
            QoS::AtMostOnce => {
                stats.publish_qos0.fetch_add(1, Ordering::Relaxed);
                if self.tasks.len() >= self.max {
                    stats.dropped_qos0.fetch_add(1, Ordering::Relaxed);
                } else {
                    self.start(m);
                }
            }
            QoS::AtLeastOnce | QoS::ExactlyOnce => {
                let c = if m.qos == QoS::AtLeastOnce {
                    &stats.publish_qos1
                } else {
                    &stats.publish_qos2
                };
                c.fetch_add(1, Ordering::Relaxed);
                self.waiting.push_back(m);
            }
        }
    }

    fn start_waiting(&mut self) {
        while self.tasks.len() < self.max {
            let Some(m) = self.waiting.pop_front() else {
                return;
            };
            self.start(m);
        }
    }

    /// Hand message `m` to the pipeline (or refuse it at once).
    fn start(&mut self, m: Message) {
        let door = &self.door;
        let Some(stream) = rules::stream_of(&m.topic) else {
            door.stats.refused_topic.fetch_add(1, Ordering::Relaxed);
            return self.finish(Done {
                packet_id: m.packet_id,
                outcome: Err(ReasonCode::TopicNameInvalid),
            });
        };
        let Some(client) = &self.client else {
            return;
        };
        let fresh = || door.next.fetch_add(1, Ordering::Relaxed);
        let n = match m.packet_id {
            Some(p) => lock(&client.memory).number(p, m.dup, fresh),
            None => fresh(),
        };
        let class = rules::class_of(&m, &door.cfg.priority_topics);
        let (gw, conn, peer) = (door.gw.clone(), self.id, self.peer);
        let rec_id: Arc<str> = rules::request_id(door.salt, n).into();
        let packet_id = m.packet_id;
        let body: Bytes = m.payload;
        let stats = door.stats.clone();
        self.tasks.spawn(async move {
            let received = Instant::now();
            let session = gw.paths().with_core(|f| {
                f.session_for(conn, peer, class, received.into_std())
                    .map(|(h, _)| h)
            });
            let outcome = match session {
                Err(e) => Err(rules::reason_for(&gw.registration_refusal(peer, e))),
                Ok(session) => {
                    let rec = DoorRecord {
                        conn,
                        session,
                        device: peer,
                        owner: peer.ip().to_string(),
                        identity: None,
                        method: Method::POST,
                        target: format!("{}/{stream}", qgate_forward::protocol::INGEST_PATH).into(),
                        request_id: Some(rec_id),
                        body,
                        received,
                    };
                    match gw.ingest(rec).await {
                        i if i.is_stored() => Ok(()),
                        Ingested::Refused(r) => Err(rules::reason_for(&r)),
                        Ingested::Answered(r) => Err(rules::reason_for_status(r.status())),
                        Ingested::Spooled => Ok(()),
                    }
                }
            };
            match outcome {
                Ok(()) => stats.stored.fetch_add(1, Ordering::Relaxed),
                Err(_) => stats.refused_not_stored.fetch_add(1, Ordering::Relaxed),
            };
            Done { packet_id, outcome }
        });
    }

    /// A record's ingest ended: acknowledge or refuse its QoS 1/2 PUBLISH.
    fn finish(&mut self, done: Done) {
        let Some(p) = done.packet_id else {
            return;
        };
        let _ = match done.outcome {
            Ok(()) => self.codec.ack(p),
            Err(reason) => self.codec.nack(p, reason),
        };
    }
}

/// Whether the door is open to anyone: bound to an address that is not loopback.
pub fn open_to_anyone(addr: SocketAddr) -> bool {
    !addr.ip().is_loopback()
}
