//! MQTT over QUIC in single-stream mode, as EMQX and NanoMQ serve it: ALPN `mqtt`, and one
//! bidirectional stream, opened by the client, carries the whole MQTT connection. The stream
//! goes to the same driver as a TCP socket; this shell only bounds what QUIC adds: the
//! handshake and the stream must come within `connect_timeout`, and a second stream closes the
//! connection.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::time::Instant;

use super::connection::{drive, WRITE_TIMEOUT};
use super::MqttDoor;

/// Application error code: the MQTT connection ended (or the door is closing).
pub const CLOSED: u32 = 0;
/// Application error code: no stream was opened within `connect_timeout`.
pub const NO_STREAM: u32 = 1;
/// Application error code: a second stream was opened (only single-stream mode is served).
pub const SECOND_STREAM: u32 = 2;

/// Take connections on `endpoint` until the task is dropped or the endpoint stops accepting.
pub(super) async fn serve(door: Arc<MqttDoor>, endpoint: quinn::Endpoint) {
    while let Some(incoming) = endpoint.accept().await {
        // Past half the door's connections a client must prove its address with a Retry
        // before it takes a slot, so spoofed Initials cannot hold the slots until their
        // handshakes time out; below it no client pays the extra round trip.
        if incoming.may_retry() && door.crowded() {
            door.stats.quic_retries.fetch_add(1, Ordering::Relaxed);
            let _ = incoming.retry();
            continue;
        }
        let peer = incoming.remote_address();
        door.stats.connections.fetch_add(1, Ordering::Relaxed);
        door.stats.connections_quic.fetch_add(1, Ordering::Relaxed);
        let Some(slot) = door.slot(peer.ip()) else {
            door.stats
                .connections_refused
                .fetch_add(1, Ordering::Relaxed);
            incoming.refuse();
            continue;
        };
        let door = door.clone();
        tokio::spawn(async move {
            let _slot = slot;
            serve_connection(&door, incoming, peer).await;
        });
    }
}

async fn serve_connection(door: &Arc<MqttDoor>, incoming: quinn::Incoming, peer: SocketAddr) {
    let accepted = Instant::now();
    let deadline = accepted + door.cfg.connect_timeout;
    let handshake = async { incoming.accept()?.await };
    let conn = match tokio::time::timeout_at(deadline, handshake).await {
        Ok(Ok(c)) => c,
        // Dropping a handshake in progress closes it.
        _ => {
            door.stats.handshakes_failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    let (send, recv) = match tokio::time::timeout_at(deadline, conn.accept_bi()).await {
        Ok(Ok(s)) => s,
        Ok(Err(_)) => return,
        Err(_) => {
            door.stats.handshakes_failed.fetch_add(1, Ordering::Relaxed);
            conn.close(NO_STREAM.into(), b"no MQTT stream within connect_timeout");
            return;
        }
    };
    let mut io = tokio::io::join(recv, send);
    {
        let served = drive(door, &mut io, peer, accepted);
        tokio::pin!(served);
        tokio::select! {
            // The MQTT connection's end first: then a second stream does not matter.
            biased;
            () = &mut served => {}
            Ok(_) = conn.accept_bi() => {
                door.stats.violations.fetch_add(1, Ordering::Relaxed);
                let why = b"one stream per MQTT connection (single-stream mode)";
                conn.close(SECOND_STREAM.into(), why);
                // The driver sees the connection gone and cleans up.
                served.await;
            }
        }
    }
    // The driver finished the stream: close once the client has it all (a DISCONNECT or a
    // refusing CONNACK included), or the client ends the connection itself.
    // The receiving side is kept until then: dropped, it would ask the client to stop sending,
    // and some clients (aioquic) then fail to close their own side.
    let (_recv, send) = io.into_inner();
    let _ = tokio::time::timeout(WRITE_TIMEOUT, send.stopped()).await;
    conn.close(CLOSED.into(), b"");
}
