//! A connection's handle, which the application and its streams hold.

use std::net::SocketAddr;
use std::sync::Arc;

use quinn_proto as proto;

use super::{now, queue, release, Conn, ConnCell, Shared, Touch};
use qgate_core::sync::lock;

/// A handle on one connection of a shared-driver [`Endpoint`](super::Endpoint); the connection closes (code 0) when
/// the last handle to it, streams included, is dropped, once the peer has acknowledged the
/// answers finished on it (within [`Limits::linger`](super::Limits::linger), decision G19).
pub struct Connection {
    pub(super) shared: Arc<Shared>,
    pub(super) cell: Arc<ConnCell>,
}

impl Connection {
    /// The peer's address now (it changes when the peer migrates, RFC 9000 §9).
    pub fn remote_address(&self) -> SocketAddr {
        let c = lock(&self.cell.conn);
        c.proto.as_ref().map_or(c.remote, |p| p.remote_address())
    }

    /// Close the connection with an application error code and reason.
    pub fn close(&self, code: u32, reason: &[u8]) {
        self.close_with(code.into(), reason);
    }

    /// [`close`](Self::close) with any 62-bit code (h3's codes do not fit a u32).
    pub(super) fn close_with(&self, code: quinn_proto::VarInt, reason: &[u8]) {
        self.apply(|p| p.close(now(), code, bytes::Bytes::copy_from_slice(reason)));
    }

    /// Close without an error once the peer has acknowledged every answer (G19).
    pub(super) fn close_gracefully(&self, code: quinn_proto::VarInt, reason: &[u8]) {
        let linger = self.shared.linger;
        self.with(|c, s| {
            c.close_gracefully(linger, code, bytes::Bytes::copy_from_slice(reason));
            s.touch();
        })
    }

    /// Run `f` on the state machine if the connection has not drained, and queue the
    /// connection for the driver (whatever `f` queued is sent on its turn).
    pub(super) fn apply(&self, f: impl FnOnce(&mut proto::Connection)) {
        self.with(|c, s| {
            if let Some(p) = c.proto.as_mut() {
                f(p);
            }
            s.touch();
        })
    }

    /// Whether the handshake has finished. A connection that [`Endpoint::accept`](super::Endpoint::accept) gave out
    /// before then carries 0-RTT data, which an attacker may have replayed (RFC 9001 §9.2).
    pub fn is_established(&self) -> bool {
        lock(&self.cell.conn).established
    }

    /// What TLS says of the peer (its certificate chain), once it has shown one: read it with
    /// [`peer_id::peer_identity`](crate::peer_id::peer_identity).
    pub fn peer_identity(&self) -> Option<Box<dyn std::any::Any>> {
        lock(&self.cell.conn)
            .proto
            .as_ref()
            .and_then(|p| p.crypto_session().peer_identity())
    }

    /// Whether the connection is closing or gone, closed by either side (a local close sets no
    /// [`close_reason`](Self::close_reason)).
    pub fn is_closed(&self) -> bool {
        let c = lock(&self.cell.conn);
        c.error.is_some() || c.proto.as_ref().is_none_or(|p| p.is_closed())
    }

    /// Why the connection ended, if it has.
    pub fn close_reason(&self) -> Option<proto::ConnectionError> {
        lock(&self.cell.conn).error.clone()
    }

    /// Run `f` on this connection under its lock; if `f` touched it, queue it for the driver.
    pub(super) fn with<R>(&self, f: impl FnOnce(&mut Conn, &mut Touch) -> R) -> R {
        let mut c = lock(&self.cell.conn);
        let mut touch = Touch(false);
        let r = f(&mut c, &mut touch);
        if touch.0 {
            queue(&self.shared, &self.cell);
        }
        r
    }
}

impl Clone for Connection {
    fn clone(&self) -> Self {
        lock(&self.cell.conn).refs += 1;
        Connection {
            shared: self.shared.clone(),
            cell: self.cell.clone(),
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        release(&self.shared, &self.cell, &mut lock(&self.cell.conn));
    }
}
