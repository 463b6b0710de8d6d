//! The one record pipeline every front door hands its records to (ARCHITECTURE principle 3):
//! a door parses a request or a PUBLISH into a [`DoorRecord`] under a session it holds, and
//! [`Gateway::ingest`] carries it — admitted by the core, sent on the paths it chooses, or kept
//! in the spool — and says how it ended ([`Ingested`]), which the door renders in its own
//! protocol (an HTTP/3 response, a PUBACK or PUBREC).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use qgate_forward::protocol::{self as wire, SPOOLED_HEADER};
use qgate_forward::scheduler::Priority;
use qgate_forward::session::{ConnId, HashId, SessionError};
use tokio::time::Instant;

use super::{spoolable_status, text, Admitted, Carried, Gateway, Noise};
use crate::outbound::Facts;

/// A record as a front door hands it to the gateway.
#[derive(Debug, Clone)]
pub struct DoorRecord {
    /// The door's connection, to which `session` is bound.
    pub conn: ConnId,
    /// The session it goes under (its class, its in-flight limit).
    pub session: HashId,
    /// Where it came from, for the server's sink and the logs.
    pub device: SocketAddr,
    /// Whose share of the spool it counts against, and behind whose spooled records it queues:
    /// its identity, else its address without the port.
    pub owner: String,
    /// The device's authenticated identity (decision G30), forwarded as `qgate-device` in place
    /// of its address.
    pub identity: Option<Arc<str>>,
    /// `POST` for records.
    pub method: Method,
    /// Path and query at the server: `/ingest/<stream>` for a record.
    pub target: Arc<str>,
    /// The id the server stores it under (and de-duplicates by), already in its forwarded form;
    /// `None`: the gateway's own, unique per attempt chain.
    pub request_id: Option<Arc<str>>,
    pub body: Bytes,
    /// When the door received it: the response delay counts from here.
    pub received: Instant,
}

/// How [`Gateway::ingest`] ended.
#[derive(Debug)]
pub enum Ingested {
    /// The server answered, as its response says: a 2xx means it stored the record.
    Answered(Response<Bytes>),
    /// The gateway's spool holds the record and sends it on later: the gateway owns it now.
    Spooled,
    /// Neither the server nor the spool took it: the device keeps it.
    Refused(Refusal),
}

/// Why a record was not taken, as a door tells its device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The HTTP status that says it (an MQTT door maps it to a reason code).
    pub status: StatusCode,
    /// Human-readable, ending in a newline.
    pub reason: String,
    /// Seconds the device is asked to wait before it tries again.
    pub retry_after: Option<u16>,
    /// The session's refusal, when that is why.
    pub session: Option<SessionError>,
}

impl Refusal {
    fn new(status: StatusCode, reason: &str) -> Refusal {
        Refusal {
            status,
            reason: reason.to_owned(),
            retry_after: None,
            session: None,
        }
    }

    /// As an HTTP response.
    pub fn into_response(self) -> Response<Bytes> {
        let mut resp = text(self.status, self.reason);
        if let Some(s) = self.retry_after {
            resp.headers_mut()
                .insert(http::header::RETRY_AFTER, http::HeaderValue::from(s));
        }
        resp
    }
}

impl Ingested {
    /// Whether the record is stored: by the server (a 2xx) or by the spool.
    pub fn is_stored(&self) -> bool {
        match self {
            Ingested::Answered(r) => r.status().is_success(),
            Ingested::Spooled => true,
            Ingested::Refused(_) => false,
        }
    }

    /// As the HTTP/3 door answers it: the server's response, `202` with `qgate-spooled: 1`,
    /// or the refusal.
    pub fn into_response(self) -> Response<Bytes> {
        match self {
            Ingested::Answered(r) => r,
            Ingested::Spooled => {
                let mut resp = text(
                    StatusCode::ACCEPTED,
                    "spooled: the gateway holds this record and sends it on when the server can take it\n",
                );
                resp.headers_mut()
                    .insert(SPOOLED_HEADER, http::HeaderValue::from_static("1"));
                resp
            }
            Ingested::Refused(r) => r.into_response(),
        }
    }
}

impl Gateway {
    /// Carry one record from any door: the core admits it under its session (bound to its
    /// connection, with room in flight) and plans its attempts; each goes out on its path
    /// here, again on another path under the same request id when one fails. With a spool, a
    /// record no path can take (or that the server answers 502/503/504) is kept there, and a
    /// device with records of its class in the spool queues behind them.
    pub async fn ingest(&self, rec: DoorRecord) -> Ingested {
        let DoorRecord {
            conn,
            session,
            device,
            owner,
            identity,
            method,
            target,
            request_id,
            body,
            received,
        } = rec;
        let bytes = body.len() as u64;
        let begun = self
            .paths
            .with_core(|f| f.begin(&session, conn, bytes, Instant::now().into_std()));
        let (id, class, step) = match begun {
            Ok(b) => b,
            Err(e) => return Ingested::Refused(self.refusal(conn, device, e)),
        };
        // Handed back however this future ends, dropped mid-way included.
        let mut admitted = Admitted {
            gw: self,
            id,
            over: false,
        };
        let rid: Arc<str> = request_id.unwrap_or_else(|| id.to_string().into());
        let (path, query) = match target.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (&*target, None),
        };
        let record = wire::is_record(method.as_str(), path);
        let batchable = query.is_none() && body.len() <= self.cfg.batch_max_record && record;
        // Built once for every attempt (only the path and urgency change). Who sent it and
        // which path carried it are for the server's sink (S7).
        let facts = Facts {
            target: target.clone(),
            request_id: Some(rid.clone()),
            device: Some(identity.unwrap_or_else(|| device.to_string().into())),
            path: None,
            class: Some(class),
        };
        let spool = self.spool.as_ref().filter(|_| record);
        let outcome = if spool.is_some_and(|s| s.holds(&owner, class)) {
            // Its earlier records of this class wait in the spool: it queues behind them, so
            // the server gets them in the order the device sent them.
            drop(admitted);
            self.spool_record(&facts, body, &owner, None).await
        } else {
            let carried = self
                .carry(
                    &mut admitted,
                    step,
                    &method,
                    facts.clone(),
                    body.clone(),
                    batchable,
                    spool.is_some(),
                )
                .await;
            match carried {
                // The server or its queue is busy or down: the spool holds it meanwhile.
                Carried::Answered(r) if spool.is_some() && spoolable_status(r.status()) => {
                    self.spool_record(&facts, body, &owner, Some(r)).await
                }
                Carried::Answered(r) => Ingested::Answered(r),
                Carried::NoPath | Carried::Failed if spool.is_some() => {
                    self.spool_record(&facts, body, &owner, None).await
                }
                Carried::NoPath | Carried::Failed => {
                    self.stats.failed.fetch_add(1, Ordering::Relaxed);
                    noisy_warn!(self, Noise::Failed, %device, request = %rid, "failed on every backhaul path");
                    Ingested::Refused(Refusal::new(
                        StatusCode::BAD_GATEWAY,
                        "the server is unreachable on every backhaul path\n",
                    ))
                }
                Carried::Refused(e) => Ingested::Refused(self.refusal(conn, device, e)),
            }
        };
        if outcome.is_stored() {
            match class {
                Priority::Priority => self.stats.delay_priority.record(received.elapsed()),
                Priority::BestEffort => self.stats.delay_best_effort.record(received.elapsed()),
            }
        }
        outcome
    }
}
