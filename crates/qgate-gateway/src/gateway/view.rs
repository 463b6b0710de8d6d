//! What the admin port shows of a running gateway, and the actions it may take on it
//! (`qgate_admin`; issue 17 item 3). Views are plain serializable rows, built under each table's
//! lock and released before they are encoded.

use std::sync::atomic::Ordering;

use qgate_forward::scheduler;
use qgate_forward::session::ConnId;
use serde::Serialize;
use tokio::time::Instant;

use super::{lock, Gateway};

/// One backhaul path.
#[derive(Debug, Clone, Serialize)]
pub struct PathView {
    /// Its id (its place in the configuration).
    pub id: usize,
    /// Whether it carries traffic.
    pub up: bool,
    /// Smoothed RTT from the gateway's probes, ms.
    pub rtt_ms: Option<f64>,
    /// QUIC's smoothed RTT of its connection, ms.
    pub quic_rtt_ms: Option<f64>,
    /// Congestion window, bytes.
    pub cwnd: Option<u64>,
    /// Fraction of packets lost, recent.
    pub loss: f64,
    /// Devices assigned to it.
    pub hits: u32,
    /// Request bytes sent on it and not yet answered.
    pub queued_bytes: u64,
    /// Requests forwarded on it.
    pub requests: u64,
    /// Request body bytes forwarded on it.
    pub bytes: u64,
    /// The server address its connection reaches, while connected.
    pub server: Option<String>,
    /// Its live QUIC connections (decision G21).
    pub connections: usize,
}

/// One registered device.
#[derive(Debug, Clone, Serialize)]
pub struct SessionView {
    /// The first 8 hex digits of its Hash ID: enough to tell devices apart, too few to act as
    /// the device (the full id is its credential).
    pub hash_prefix: String,
    /// The device connection that registered it.
    pub connection: ConnId,
    /// The address it registered from.
    pub device: String,
    /// `priority` or `best-effort`.
    pub class: &'static str,
    /// Its backhaul path, once assigned.
    pub path: Option<usize>,
    /// Requests in flight.
    pub in_flight: usize,
    /// Milliseconds since its last request (or registration).
    pub idle_ms: u64,
}

/// One device connection.
#[derive(Debug, Clone, Serialize)]
pub struct ConnectionView {
    /// Its id (as in [`SessionView::connection`]).
    pub id: ConnId,
    /// The device's address now.
    pub remote: String,
    /// The identity its certificate or token names, once it has shown one (G30, G33).
    pub identity: Option<String>,
    /// Sessions it holds.
    pub sessions: usize,
}

impl Gateway {
    /// Every path, in id order.
    pub fn path_views(&self) -> Vec<PathView> {
        let table = self.paths.table();
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        table
            .paths()
            .iter()
            .enumerate()
            .map(|(i, p)| PathView {
                id: i,
                up: p.up,
                rtt_ms: p.rtt.map(ms),
                quic_rtt_ms: p.quic_rtt.map(ms),
                cwnd: p.cwnd,
                loss: p.loss,
                hits: p.hits,
                queued_bytes: p.queued_bytes,
                requests: self
                    .per_path
                    .get(i)
                    .map_or(0, |n| n.load(Ordering::Relaxed)),
                bytes: self
                    .per_path_bytes
                    .get(i)
                    .map_or(0, |n| n.load(Ordering::Relaxed)),
                server: self
                    .paths
                    .connection(p.id)
                    .map(|c| c.remote_address().to_string()),
                connections: self.paths.live_connections(p.id),
            })
            .collect()
    }

    /// Up to `limit` sessions, longest idle last, and how many there are in all. The core's
    /// lock (which forwarding and the path driver take too) is held only to copy the rows.
    pub fn session_views(&self, limit: usize) -> (Vec<SessionView>, usize) {
        let now = Instant::now().into_std();
        let rows: Vec<qgate_forward::session::Session> = self
            .paths
            .with_core(|f| f.sessions().iter().cloned().collect());
        let total = rows.len();
        let mut rows: Vec<SessionView> = rows
            .into_iter()
            .map(|s| SessionView {
                hash_prefix: s.hash.to_string()[..8].to_string(),
                connection: s.conn,
                device: s.device.to_string(),
                class: s.priority.name(),
                path: s.path.map(|p| p.0),
                in_flight: s.inflight,
                idle_ms: now.saturating_duration_since(s.last_seen).as_millis() as u64,
            })
            .collect();
        rows.sort_by_key(|r| (r.idle_ms, r.connection));
        rows.truncate(limit);
        (rows, total)
    }

    /// Up to `limit` device connections, by id, and how many there are in all.
    pub fn connection_views(&self, limit: usize) -> (Vec<ConnectionView>, usize) {
        let mut per_conn = std::collections::HashMap::<ConnId, usize>::new();
        self.paths.with_core(|f| {
            for s in f.sessions().iter() {
                *per_conn.entry(s.conn).or_default() += 1;
            }
        });
        let conns = lock(&self.conns);
        let mut ids: Vec<ConnId> = conns.keys().copied().collect();
        let total = ids.len();
        ids.sort_unstable();
        ids.truncate(limit);
        let rows = ids
            .into_iter()
            .map(|id| {
                let (c, known) = &conns[&id];
                ConnectionView {
                    id,
                    remote: c.remote_address().to_string(),
                    identity: known.get().map(|(name, _)| name.to_string()),
                    sessions: per_conn.get(&id).copied().unwrap_or(0),
                }
            })
            .collect();
        (rows, total)
    }

    /// Close device connection `id` (its sessions end with it); false if there is none.
    pub fn close_connection(&self, id: ConnId) -> bool {
        match lock(&self.conns).get(&id) {
            Some((c, _)) => {
                // H3_NO_ERROR (RFC 9114 §8.1): the device may reconnect at once.
                c.close(0x100, b"closed by the operator");
                true
            }
            None => false,
        }
    }

    /// Requests being forwarded now (a graceful stop waits for them).
    pub fn requests_in_flight(&self) -> usize {
        self.paths.with_core(|f| f.requests_in_flight())
    }

    /// The scheduler's name.
    pub fn scheduler_name(&self) -> &'static str {
        self.paths.with_core(|f| f.scheduler_name())
    }

    /// Choose paths with scheduler `name` from now on (sessions keep their paths until they
    /// are assigned again); returns the previous one's name.
    pub fn set_scheduler(&self, name: &str) -> Result<&'static str, String> {
        let next = scheduler::by_name(name)?;
        let before = self.paths.with_core(|f| {
            let before = f.scheduler_name();
            f.set_scheduler(next);
            before
        });
        tracing::info!(from = before, to = name, "scheduler switched");
        Ok(before)
    }
}
