//! One MQTT connection's task, whatever carries it: a TCP socket, a TLS session or a QUIC
//! stream are each a byte stream ([`AsyncRead`] + [`AsyncWrite`]) under the same driver, which
//! reads into the sans-IO [`qgate_mqtt::Connection`] in bounded chunks, writes what it returns,
//! arms its timer, and turns each PUBLISH into a [`DoorRecord`].

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use qgate_core::sync::lock;
use qgate_forward::session::ConnId;
use qgate_mqtt::{Accept, Closed, Connection, Event, Message, ProtocolVersion, QoS, ReasonCode};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{rules, MqttDoor};
use crate::gateway::{DoorRecord, Ingested};

/// Bytes read from a connection at a time.
const READ_CHUNK: usize = 16 * 1024;
/// Output the client does not take within this long (a write, or the close) ends its
/// connection.
pub(super) const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Serve one MQTT connection on `io` until it closes. `accepted` is when its transport
/// connection arrived: the CONNECT deadline counts from there, so a TLS or QUIC handshake
/// spends the same `connect_timeout`.
pub(super) async fn drive<S>(door: &Arc<MqttDoor>, mut io: S, peer: SocketAddr, accepted: Instant)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let conn_id = door.gw.next_connection_id();
    let mut c = Conn {
        door: door.clone(),
        id: conn_id,
        peer,
        codec: Connection::new(door.codec.clone(), accepted.into_std()),
        client: None,
        tasks: JoinSet::new(),
        waiting: VecDeque::new(),
        max: usize::from(door.codec.receive_maximum),
    };
    let mut buf = vec![0u8; READ_CHUNK];
    let never = Arc::new(tokio::sync::Notify::new());
    loop {
        c.handle_events();
        c.start_waiting();
        // TLS holds records until flushed (decision M23).
        let wrote = tokio::time::timeout(WRITE_TIMEOUT, async {
            while let Some(out) = c.codec.poll_transmit() {
                io.write_all(&out).await?;
            }
            io.flush().await
        })
        .await;
        if !matches!(wrote, Ok(Ok(()))) || c.codec.is_closed() {
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
                door.stats.takeovers.fetch_add(1, Ordering::Relaxed);
                let _ = c.codec.close(ReasonCode::SessionTakenOver);
            }
            Some(done) = c.tasks.join_next(), if !c.tasks.is_empty() => {
                if let Ok(done) = done {
                    c.finish(done);
                }
            }
            _ = sleep_until(due) => c.codec.handle_timeout(Instant::now().into_std()),
            r = io.read(&mut buf), if room => match r {
                Ok(0) | Err(_) => break,
                Ok(n) => c.codec.handle_bytes(Instant::now().into_std(), &buf[..n]),
            },
        }
    }
    c.handle_events();
    let _ = tokio::time::timeout(WRITE_TIMEOUT, io.shutdown()).await;
    // Records in the pipeline finish on their own: a client that did not hear of them
    // sends them again (under the same ids) and the server stores them once.
    c.tasks.detach_all();
    if let Some(k) = c.client.take() {
        lock(&door.registry).disconnect(&k.id, conn_id);
    }
    door.gw.end_connection(conn_id);
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
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
