//! The connections a broker holds, as the admin port lists and closes them.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::time::Instant;

use super::state::{Broker, Tenancy};

impl Broker {
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

    /// Connections held now: from accept (handshake included) until every task serving one
    /// has ended and its state is freed.
    pub fn connections_open(&self) -> u64 {
        self.inner.counters.connections_open.load(Ordering::Relaxed)
    }
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
