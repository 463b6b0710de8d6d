//! The broker's own counters, each declared once with its metric name and help.

qgate_core::counters! {
    /// What the broker's connections and links have done.
    pub(super) struct Counters => CountersSnapshot {
        /// Connections held now.
        connections_open: gauge "qgate_amqp_connections_open",
            "AMQP connections held, from accept (handshake included) until their state is freed";
        /// Connections accepted or refused.
        connections_total: counter "qgate_amqp_connections", "AMQP connections accepted or refused";
        /// Connections that failed before open.
        connections_failed: counter "qgate_amqp_connections_failed",
            "connections that failed before open (framing, SASL)";
        /// Connections closed on accept for their address's share.
        connections_refused: counter "qgate_amqp_connections_refused",
            "connections closed on accept: their address held max_connections_per_address";
        /// Connections closed on accept for the broker's limit.
        connections_refused_full: counter "qgate_amqp_connections_refused_full",
            "connections closed on accept: the broker held max_connections (decision M33)";
        /// Connections closed by a deadline.
        connections_timed_out: counter "qgate_amqp_connections_timed_out",
            "connections closed by a deadline (handshake, idle, held frame, close, write)";
        /// Connections whose stream came in 0-RTT.
        connections_early: counter "qgate_amqp_connections_early",
            "AMQP connections whose QUIC stream arrived during the handshake (0-RTT)";
        /// Links refused.
        links_refused: counter "qgate_amqp_links_refused", "links refused (unknown address, limits)";
        /// Replayed 0-RTT transfers dropped.
        replays_dropped: counter "qgate_amqp_replays_dropped",
            "replayed 0-RTT transfers accepted without queueing them again";
    }
}
