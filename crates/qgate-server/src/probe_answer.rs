//! The path-probe responder (paper 000 Fig. 2 steps 2–3).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;

use crate::ServerStats;

/// Answer every Path Request datagram on `conn` with its ACK Response at once (paper 000 Fig. 2
/// steps 2–3); anything else is counted and ignored. Ends with the connection.
pub async fn answer_probes(conn: quinn::Connection, stats: Arc<ServerStats>) {
    use qgate_forward::probe::ProbeMsg;
    while let Ok(d) = conn.read_datagram().await {
        match ProbeMsg::decode(&d) {
            Ok(ProbeMsg::Request(seq)) => {
                let answer = Bytes::copy_from_slice(&ProbeMsg::Response(seq).encode());
                if conn.send_datagram(answer).is_ok() {
                    stats.probes.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(ProbeMsg::Response(_)) | Err(_) => {
                stats.bad_probes.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
