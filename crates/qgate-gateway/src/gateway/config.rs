//! `GatewayConfig`: the gateway's limits and timeouts, and the `[gateway]` keys that set them.

use std::time::Duration;

use qgate_forward::forwarder::ForwarderConfig;
use qgate_forward::path::PathConfig;
use qgate_forward::session::SessionLimits;
use qgate_transport::http3;
use qgate_transport::{
    server_config_resuming, shared_driver, ClientAuth, Identity, Socket, TransportError,
    TransportOptions,
};

use crate::batcher;

/// Gateway limits and timeouts, and the `[gateway]` keys of a config file that set them
/// (durations as `"5s"`). The defaults live here (and in [`SessionLimits::DEFAULT`] and
/// [`shared_driver::Limits::DEFAULT`]); the CLI composes this type and its help reads them from here.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    /// Most devices registered at once.
    pub max_devices: usize,
    /// Most requests one device may have in flight.
    pub max_inflight_per_device: usize,
    /// Most sessions one device connection may register (decision G10).
    pub max_sessions_per_connection: usize,
    /// Most sessions registered from one source IP address (decision G10).
    pub max_sessions_per_address: usize,
    /// A session with nothing in flight and no request for this long expires (decision G10).
    #[serde(with = "qgate_core::units::duration")]
    pub session_idle_timeout: Duration,
    /// Most device handshakes in progress, a budget apart from `max_devices` (decision G12).
    pub max_handshakes: usize,
    /// Most device handshakes in progress from one source IP address (an IPv6 /64 counting
    /// as one); its Initials beyond are ignored and counted (decision G26).
    pub max_handshakes_per_address: usize,
    /// With this many device handshakes in progress, new devices must prove their address
    /// with a QUIC Retry first (decision G12).
    pub retry_above: usize,
    /// A device handshake not finished within this long is closed (decision G12).
    #[serde(with = "qgate_core::units::duration")]
    pub handshake_timeout: Duration,
    /// A device handshake whose peer has sent nothing for this long is closed (decision G26).
    #[serde(with = "qgate_core::units::duration")]
    pub handshake_silence: Duration,
    /// Give up on a forwarded request on one path after this long, and retry on another.
    #[serde(with = "qgate_core::units::duration")]
    pub request_timeout: Duration,
    /// Paths tried per request.
    pub attempts: usize,
    /// Largest request body.
    pub max_body: usize,
    /// Request-body bytes held at once over all device connections (decisions T7, T13): when
    /// they are spent, the client holding the most gives way, or the request gets `503`.
    pub max_buffered: usize,
    /// The server's authority in forwarded URIs, and the name its certificate must carry.
    #[serde(rename = "server_name")]
    pub server_authority: String,
    /// Ingest records of at most this many bytes, of one class, that are ready for the same
    /// backhaul connection at once go in one request to the server's `/batch` (decision G23);
    /// 0: one request per record, as a server from before batches needs (one that answers
    /// `/batch` otherwise still gets every record, alone, after each refused batch).
    pub batch_max_record: usize,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        let s = SessionLimits::DEFAULT;
        let h = shared_driver::Limits::DEFAULT;
        GatewayConfig {
            max_devices: s.max_devices,
            max_inflight_per_device: s.max_inflight,
            max_sessions_per_connection: s.per_connection,
            max_sessions_per_address: s.per_address,
            session_idle_timeout: s.idle,
            max_handshakes: h.max_handshakes,
            max_handshakes_per_address: h.max_handshakes_per_client,
            retry_above: h.retry_above,
            handshake_timeout: h.handshake_timeout,
            handshake_silence: h.handshake_silence,
            request_timeout: Duration::from_secs(5),
            attempts: 3,
            max_body: 1 << 20,
            max_buffered: http3::DEFAULT_MAX_BUFFERED,
            server_authority: "localhost".into(),
            batch_max_record: batcher::DEFAULT_MAX_RECORD,
        }
    }
}

impl GatewayConfig {
    /// The session table's bounds.
    pub fn session_limits(&self) -> SessionLimits {
        SessionLimits {
            max_devices: self.max_devices,
            per_connection: self.max_sessions_per_connection,
            per_address: self.max_sessions_per_address,
            max_inflight: self.max_inflight_per_device,
            idle: self.session_idle_timeout,
        }
    }

    /// The forwarding core's bounds, with probing as `paths` says.
    pub fn forwarder_config(&self, paths: PathConfig) -> ForwarderConfig {
        ForwarderConfig {
            sessions: self.session_limits(),
            paths,
            attempts: self.attempts,
            attempt_timeout: self.request_timeout,
        }
    }

    /// The device-facing endpoint on `socket`: HTTP/3 with `identity` and the
    /// [`device_transport`](Self::device_transport) limits, on a [`shared_driver::Endpoint`] (one
    /// driver task for all device connections, decision G9). It holds at most `max_devices`
    /// plus an eighth (and 16) established connections, room for devices reconnecting while
    /// their old connection times out; more are refused during the handshake. Handshakes have
    /// their own budget and address validation (decision G12). Devices present certificates as
    /// `auth` says (decisions G30, G33).
    pub fn device_endpoint(
        &self,
        socket: Socket,
        identity: &Identity,
        auth: ClientAuth<'_>,
        base: &TransportOptions,
        seed: Option<u64>,
    ) -> Result<shared_driver::Endpoint, TransportError> {
        let opts = self.device_transport(base);
        let limits = shared_driver::Limits {
            max_connections: self.max_devices + self.max_devices / 8 + 16,
            max_handshakes: self.max_handshakes,
            max_handshakes_per_client: self.max_handshakes_per_address,
            retry_above: self.retry_above,
            handshake_timeout: self.handshake_timeout,
            handshake_silence: self.handshake_silence,
            ..shared_driver::Limits::DEFAULT
        };
        // A resumption ticket for every device it may serve, so returning devices use 0-RTT
        // (decision G18).
        let scfg = server_config_resuming(
            identity,
            &[http3::ALPN_H3],
            &opts,
            limits.max_connections,
            auth,
        )?;
        shared_driver::Endpoint::server(socket, scfg, &opts, seed, limits)
    }

    /// Transport options for the device-facing endpoint: `base` with the QUIC stream limits cut
    /// to what one device may use, so flow control enforces the in-flight limit and an idle
    /// device's connection does not pre-allocate 100 + 100 stream slots (~8 KiB, decision G7).
    pub fn device_transport(&self, base: &TransportOptions) -> TransportOptions {
        TransportOptions {
            // One stream per request in flight (registration counts too).
            max_concurrent_bidi_streams: u32::try_from(self.max_inflight_per_device)
                .unwrap_or(u32::MAX)
                .clamp(1, base.max_concurrent_bidi_streams.max(1)),
            // HTTP/3 needs the peer's control, QPACK encoder and QPACK decoder streams
            // (RFC 9114 §6.2, RFC 9204 §4.2), plus one for a grease or extension stream.
            max_concurrent_uni_streams: base.max_concurrent_uni_streams.clamp(3, 4),
            ..base.clone()
        }
    }
}
