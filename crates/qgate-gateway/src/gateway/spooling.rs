//! The gateway's side of its spool (issue 50): a record no path can take now (none up, every
//! attempt failed, or the server answered that it or its queue is busy or down) is written to
//! the spool and answered `202 Accepted` with `qgate-spooled: 1`: from then on the gateway owns
//! it. A drain task sends spooled records on when a path is up, priority first, oldest first,
//! through the same scheduler, paths and batches as live records, under their own request ids.
//!
//! Draining leaves live traffic its share (decision K2): drained records in flight are kept
//! to what the paths' congestion windows hold ([`drain_window`]) after live requests, and
//! never below [`DRAIN_FLOOR`], so a spool always empties.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use qgate_spool::spool::CLASSES;
use qgate_spool::{Done, Entry, NewRecord, Spool, SpoolError};
use tokio::time::Instant;

use super::{Admitted, Carried, Gateway, Ingested, Refusal};
use crate::outbound::Facts;

/// Requests in flight (live and drained) below which the spool drains freely, however small
/// the paths' congestion windows (they start small when the paths return).
pub const DRAIN_WINDOW: usize = 256;
/// Bytes a drained record is taken to occupy in a congestion window besides its body: its batch
/// entry's target, request id and device, and its share of packet and frame headers.
const DRAIN_RECORD_OVERHEAD: u64 = 96;
/// Drained records in flight however busy live traffic is: the spool always empties.
pub const DRAIN_FLOOR: usize = 16;
/// Bytes taken from the spool at a time, at most.
const DRAIN_BYTES: u64 = 1 << 20;
/// How often the drain looks for work while nothing wakes it.
const DRAIN_TICK: Duration = Duration::from_millis(100);
/// How often expired records are dropped and the spool's cursors written.
const UPKEEP: Duration = Duration::from_secs(1);
/// Seconds a device refused by a full or failed spool is asked to wait.
const SPOOL_RETRY_AFTER: u16 = 5;

impl Gateway {
    /// The gateway with `spool` (set by the builder).
    pub(crate) fn set_spool(&mut self, spool: Spool) {
        self.spool = Some(spool);
    }

    /// Its spool, if it has one.
    pub fn spool(&self) -> Option<&Spool> {
        self.spool.as_ref()
    }

    /// Now on the wall clock, ms since the Unix epoch, advanced by the runtime's clock.
    pub fn wall_ms(&self) -> u64 {
        let (at, ms) = self.epoch;
        ms + Instant::now().duration_since(at).as_millis() as u64
    }

    /// Keep the record in the spool ([`Ingested::Spooled`]); if the spool refuses, the device
    /// keeps it: the server's own answer `fallback` if there was one, else a refusal (`503`,
    /// or `413` for a record too large for the spool) asking it to try again later.
    pub(crate) async fn spool_record(
        &self,
        facts: &Facts,
        body: Bytes,
        owner: &str,
        fallback: Option<Response<Bytes>>,
    ) -> Ingested {
        let Some(spool) = self.spool.as_ref() else {
            return fallback.map_or_else(
                || {
                    Ingested::Refused(Refusal {
                        status: StatusCode::BAD_GATEWAY,
                        reason: "no spool\n".into(),
                        retry_after: None,
                        session: None,
                    })
                },
                Ingested::Answered,
            );
        };
        let r = NewRecord {
            class: facts
                .class
                .unwrap_or(qgate_forward::scheduler::Priority::BestEffort),
            owner: owner.to_owned(),
            device: facts.device.as_deref().unwrap_or("").to_owned(),
            target: facts.target.to_string(),
            request_id: facts.request_id.as_deref().unwrap_or("").to_owned(),
            body,
        };
        match spool.append(r, self.wall_ms()).await {
            Ok(_) => Ingested::Spooled,
            Err(e) => {
                if let Some(r) = fallback {
                    return Ingested::Answered(r);
                }
                let status = match e {
                    SpoolError::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
                    _ => StatusCode::SERVICE_UNAVAILABLE,
                };
                Ingested::Refused(Refusal {
                    status,
                    reason: format!(
                        "{e}; the server is unreachable now: keep the record and try again\n"
                    ),
                    retry_after: Some(SPOOL_RETRY_AFTER),
                    session: None,
                })
            }
        }
    }

    /// Send spooled records on while the gateway runs: priority first, oldest first, as much
    /// as live traffic leaves room for (decision K2). Also drops expired records and writes
    /// the spool's cursors, paths up or not.
    pub(crate) async fn drain_spool(self: Arc<Self>, spool: Spool) {
        let in_flight = Arc::new(AtomicUsize::new(0));
        let wake = Arc::new(tokio::sync::Notify::new());
        let mut upkeep = Instant::now();
        let mut paused_until = Instant::now();
        let pause = Arc::new(std::sync::Mutex::new(None::<Instant>));
        // The mean body of the records last taken: what a drained record costs the window.
        let mut record_bytes = 0;
        loop {
            tokio::select! {
                // A finished record's wake-up before the tick: either runs the same pass.
                biased;
                _ = wake.notified() => {}
                _ = tokio::time::sleep(DRAIN_TICK) => {}
            }
            let now = Instant::now();
            if now >= upkeep {
                upkeep = now + UPKEEP;
                spool.expire(self.wall_ms()).await;
                if let Err(e) = spool.checkpoint().await {
                    tracing::warn!(target: "qgate_gateway::spool", error = %e, "could not write the spool's cursor");
                }
            }
            if let Some(p) = qgate_core::sync::lock(&pause).take() {
                paused_until = paused_until.max(p);
            }
            if now < paused_until {
                continue;
            }
            let up = self.paths.with_core(|f| f.paths().up().next().is_some());
            if !up {
                continue;
            }
            let mine = in_flight.load(Ordering::Relaxed);
            let (live, cwnd) = self.paths.with_core(|f| {
                let cwnd = f.paths().up().filter_map(|p| p.cwnd).sum::<u64>();
                (f.requests_in_flight().saturating_sub(mine), cwnd)
            });
            let mut room = drain_window(cwnd, record_bytes)
                .saturating_sub(live)
                .max(DRAIN_FLOOR)
                .saturating_sub(mine);
            for class in CLASSES {
                if room == 0 {
                    break;
                }
                let got = spool.take(class, room, DRAIN_BYTES, self.wall_ms()).await;
                room -= got.len();
                if !got.is_empty() {
                    let body: usize = got.iter().map(|e| e.body.len()).sum();
                    record_bytes = (body / got.len()) as u64;
                }
                for e in got {
                    in_flight.fetch_add(1, Ordering::Relaxed);
                    let (gw, spool, in_flight, wake, pause) = (
                        self.clone(),
                        spool.clone(),
                        in_flight.clone(),
                        wake.clone(),
                        pause.clone(),
                    );
                    tokio::spawn(async move {
                        if let Some(wait) = gw.drain_one(&spool, e).await {
                            let until = Instant::now() + wait;
                            let mut p = qgate_core::sync::lock(&pause);
                            *p = Some(p.map_or(until, |q| q.max(until)));
                        }
                        in_flight.fetch_sub(1, Ordering::Relaxed);
                        wake.notify_one();
                    });
                }
            }
        }
    }

    /// Send one spooled record; how long the drain should pause if the server side is busy or
    /// no path could take it.
    async fn drain_one(&self, spool: &Spool, e: Entry) -> Option<Duration> {
        let bytes = e.body.len() as u64;
        let (id, step) = self
            .paths
            .with_core(|f| f.begin_spooled(e.class, bytes, Instant::now().into_std()));
        let mut admitted = Admitted {
            gw: self,
            id,
            over: false,
        };
        let facts = Facts {
            target: e.target.as_str().into(),
            request_id: Some(e.request_id.as_str().into()),
            device: Some(e.device.as_str().into()),
            path: None,
            class: Some(e.class),
        };
        let batchable = !e.target.contains('?') && e.body.len() <= self.cfg.batch_max_record;
        let carried = self
            .carry(
                &mut admitted,
                step,
                &Method::POST,
                facts,
                e.body.clone(),
                batchable,
                true,
            )
            .await;
        drop(admitted);
        match carried {
            Carried::Answered(r) if r.status().is_success() => {
                spool.finish(&[e], Done::Delivered);
                None
            }
            Carried::Answered(r) if is_final_refusal(r.status()) => {
                tracing::warn!(
                    target: "qgate_gateway::spool",
                    request = %e.request_id, status = %r.status(),
                    "the server refused a spooled record for good: dropped"
                );
                spool.finish(&[e], Done::Rejected);
                None
            }
            Carried::Answered(r) => {
                let wait = r
                    .headers()
                    .get(http::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse().ok())
                    .map_or(Duration::from_secs(1), |s: u64| {
                        Duration::from_secs(s.min(60))
                    });
                spool.back(vec![e]);
                Some(wait)
            }
            Carried::NoPath | Carried::Failed | Carried::Refused(_) => {
                spool.back(vec![e]);
                Some(Duration::from_millis(500))
            }
        }
    }
}

/// Drained and live records the paths carry at once without a queue at the sender: the
/// records of `body` bytes that the up paths' congestion windows, `cwnd` bytes together, hold,
/// and at least [`DRAIN_WINDOW`]. Filling no more than the windows keeps a live record from
/// waiting behind drained ones in a send buffer; filling them drains at what the paths carry.
fn drain_window(cwnd: u64, body: u64) -> usize {
    let held = cwnd / (body + DRAIN_RECORD_OVERHEAD);
    DRAIN_WINDOW.max(usize::try_from(held).unwrap_or(usize::MAX))
}

/// A 4xx the server would give the record again however often it is sent.
fn is_final_refusal(s: StatusCode) -> bool {
    s.is_client_error()
        && !matches!(
            s,
            StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_MANY_REQUESTS
        )
        && s.as_u16() != 425
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drain_window_is_what_the_congestion_windows_hold_and_never_below_the_minimum() {
        // Just after the paths return: initial windows, the minimum.
        assert_eq!(drain_window(2 * 14_720, 100), DRAIN_WINDOW);
        // 200 KB of windows over 100-byte records: 1,020 records.
        assert_eq!(drain_window(200_000, 100), 1_020);
        // Before any record was taken the overhead alone counts.
        assert_eq!(drain_window(0, 0), DRAIN_WINDOW);
        assert_eq!(
            drain_window(u64::MAX, 0),
            usize::try_from(u64::MAX / 96).unwrap_or(usize::MAX)
        );
    }
}
