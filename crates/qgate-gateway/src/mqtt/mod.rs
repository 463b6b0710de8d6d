//! The MQTT front door (issue 51): MQTT 3.1.1 and 5.0 clients PUBLISH records over TCP, TLS or
//! QUIC, and the records go down the same pipeline as HTTP/3 ones ([`Gateway::ingest`]).
//!
//! A thin shell around the sans-IO [`qgate_mqtt::Connection`]: each transport ([`listen`]: TCP,
//! [`tls`] on TCP, [`quic`]) hands one byte stream per MQTT connection to the one driver
//! (`connection`), which turns each PUBLISH into a [`DoorRecord`](crate::gateway::DoorRecord).
//! The door's own decisions (topic → stream, class, client ids and takeover, request ids) are
//! in [`rules`].
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
//! - **Transports**: TCP; TLS 1.3 or 1.2 on TCP; QUIC with ALPN `mqtt` in single-stream mode
//!   (one bidirectional stream, opened by the client, per MQTT connection; a second stream
//!   closes the connection; QUIC's idle timeout is the longest keep-alive's, so MQTT's
//!   keep-alive decides). TLS and QUIC use the gateway's device-facing certificate.
//! - **Bounds**: connections (global and per address, whatever the transport, handshakes
//!   included), remembered sessions, the codec's packet size and receive maximum; the TLS or
//!   QUIC handshake and the QUIC stream must come within `connect_timeout`, as the CONNECT
//!   (past half the connections, a QUIC client first proves its address with a Retry); a
//!   connection has at most `receive_maximum` records in the pipeline and stops reading while
//!   full; a QoS 0 message that finds no room is dropped and counted.
//! - **Not yet**: subscriptions (refused by the codec); QUIC's multi-stream mode; client
//!   certificates and authentication (issue 49): any client id is taken, so the door listens on
//!   loopback unless the operator says otherwise.

pub mod config;
mod connection;
pub mod listen;
pub mod quic;
pub mod rules;
pub mod tls;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use qgate_core::sync::lock;

pub use config::MqttConfig;

use crate::gateway::Gateway;

qgate_core::counters! {
    /// What the MQTT door has done.
    pub struct MqttStats => MqttSnapshot {
        /// Connections taken (TCP, TLS and QUIC).
        connections: counter "qgate_gateway_mqtt_connections",
            "MQTT connections taken (TCP, TLS and QUIC)";
        /// TLS connections taken.
        connections_tls: counter "qgate_gateway_mqtt_connections_tls", "MQTT TLS connections taken";
        /// QUIC connections taken.
        connections_quic: counter "qgate_gateway_mqtt_connections_quic",
            "MQTT QUIC connections taken";
        /// Connections closed at once: the door or the address had its most.
        connections_refused: counter "qgate_gateway_mqtt_connections_refused",
            "MQTT connections closed at once: the door or the address had its most";
        /// QUIC clients asked to prove their address (a Retry): the door was half full.
        quic_retries: counter "qgate_gateway_mqtt_quic_retries",
            "MQTT QUIC clients sent a Retry to prove their address: the door was half full";
        /// TLS or QUIC handshakes that failed, or did not end (with a QUIC stream opened)
        /// within `connect_timeout`.
        handshakes_failed: counter "qgate_gateway_mqtt_handshakes_failed",
            "MQTT TLS or QUIC handshakes failed or not done (stream opened) within connect_timeout";
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

    /// Whether at least half the door's connections are open.
    fn crowded(&self) -> bool {
        let open: usize = lock(&self.per_address).values().sum();
        open >= self.cfg.max_connections / 2
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

/// Whether the door is open to anyone: bound to an address that is not loopback.
pub fn open_to_anyone(addr: SocketAddr) -> bool {
    !addr.ip().is_loopback()
}
