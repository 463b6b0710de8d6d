//! One struct for every QUIC transport knob qgate exposes, with sane bounded defaults.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use quinn::congestion::{BbrConfig, ControllerFactory, CubicConfig, NewRenoConfig};
use quinn::{AckFrequencyConfig, IdleTimeout, TransportConfig, VarInt};
use serde::{Deserialize, Serialize};

/// The congestion controller a connection uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Congestion {
    /// CUBIC (RFC 9438), quinn's default.
    #[default]
    Cubic,
    /// NewReno (RFC 9002 §7).
    NewReno,
    /// BBR (quinn's experimental BBRv1).
    Bbr,
    /// CUBIC until random loss (loss without a queue) dominates, then BBR (decision G16).
    Auto,
}

impl std::str::FromStr for Congestion {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cubic" => Ok(Congestion::Cubic),
            "new-reno" | "newreno" | "reno" => Ok(Congestion::NewReno),
            "bbr" => Ok(Congestion::Bbr),
            "auto" => Ok(Congestion::Auto),
            other => Err(format!(
                "unknown congestion controller '{other}' (known: cubic, new-reno, bbr, auto)"
            )),
        }
    }
}

/// Bytes the first round trip of a handshake puts on a link: the client's Initial (1200 bytes
/// of UDP payload plus 28 of IPv4 and UDP headers) and what a server may answer before the
/// client's address is validated, three times that (RFC 9000 §8.1).
pub const HANDSHAKE_FLIGHT_BYTES: u64 = 4 * 1228;

/// The ack-eliciting threshold asked of the peer when [`TransportOptions::link_kbps`] declares
/// the radio's rate and [`TransportOptions::ack_eliciting_threshold`] is not set: an ACK after
/// more than 10 packets, i.e. every 11th, or the peer's max_ack_delay (decision T9).
pub const CONSTRAINED_ACK_ELICITING_THRESHOLD: u32 = 10;

/// The largest [`TransportOptions::ack_eliciting_threshold`]: beyond it the peer's ACKs would
/// come from its max_ack_delay timer alone, and loss recovery with them.
pub const MAX_ACK_ELICITING_THRESHOLD: u32 = 1000;

/// QUIC transport settings. Every window is bounded: quinn's connection-wide receive window is
/// unlimited by default, which lets one peer pin memory; here it has a limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TransportOptions {
    /// Congestion controller.
    pub congestion: Congestion,
    /// Initial congestion window in bytes; `None` = the controller's default (RFC 9002 §7.2:
    /// min(10 × max_datagram_size, max(14720, 2 × max_datagram_size))).
    pub initial_window: Option<u64>,
    /// RTT assumed before the first sample, ms (RFC 9002 §6.2.2 suggests 333).
    pub initial_rtt_ms: f64,
    /// Rate of the slowest link this endpoint's packets cross, kbit/s, when it is known (a
    /// constrained radio). The RTT assumed before the first sample is then at least the time
    /// to serialise the handshake's first flights on it ([`HANDSHAKE_FLIGHT_BYTES`]), so a
    /// slow link does not make every handshake packet look lost (decision T6).
    pub link_kbps: Option<f64>,
    /// Ask the peer to acknowledge only after more than this many ack-eliciting packets (or
    /// its max_ack_delay, 25 ms by default), with the ACK frequency extension
    /// (draft-ietf-quic-ack-frequency; out-of-order packets are still acknowledged at once).
    /// It thins the ACKs the *peer* sends: a device's setting spares its downlink, a server's
    /// its clients' uplinks (for all its clients). Unset: RFC 9000's every second packet, or
    /// [`CONSTRAINED_ACK_ELICITING_THRESHOLD`] when `link_kbps` is declared (decision T9).
    /// 1 is RFC 9000's rate, with the extension off; 0 asks for an ACK of every packet.
    pub ack_eliciting_threshold: Option<u32>,
    /// Close a connection after this long without traffic, ms.
    pub idle_timeout_ms: u64,
    /// Send a keep-alive after this long without traffic, ms; `None` = never.
    pub keep_alive_ms: Option<u64>,
    /// Bytes a peer may send on one stream before it is read.
    pub stream_receive_window: u64,
    /// Bytes a peer may send on all streams of a connection before they are read.
    pub receive_window: u64,
    /// Bytes this side buffers for sending per connection.
    pub send_window: u64,
    /// Bidirectional streams the peer may open at once.
    pub max_concurrent_bidi_streams: u32,
    /// Unidirectional streams the peer may open at once.
    pub max_concurrent_uni_streams: u32,
    /// Probe for a larger path MTU than 1200 bytes (RFC 8899 DPLPMTUD).
    pub mtu_discovery: bool,
    /// Interleave streams of equal priority round-robin (quinn's default); off sends each
    /// stream's data before the next one's, in the order written, as a TCP socket would.
    pub send_fairness: bool,
    /// Fix every datagram's UDP payload at most this size (1200..=65527) and turn MTU discovery
    /// off; experiments use it to reproduce a paper's packet size.
    pub max_udp_payload: Option<u16>,
    /// Write one qlog file per connection into this directory (`--qlog-dir`, `$QLOGDIR`);
    /// see [`crate::qlog`].
    pub qlog_dir: Option<PathBuf>,
    /// Count the bytes in flight of every connection built with these options here (not a
    /// setting: a measurement hook, never read from a configuration file).
    #[serde(skip)]
    pub flight: Option<crate::FlightGauge>,
    /// How a server built with these options spawns its tasks and runs its QUIC drivers (a
    /// measurement hook like `flight`: unset in the product; decision U14).
    #[serde(skip)]
    pub tasks: crate::tasks::Tasks,
}

impl Default for TransportOptions {
    fn default() -> Self {
        TransportOptions {
            congestion: Congestion::Cubic,
            initial_window: None,
            initial_rtt_ms: 333.0,
            link_kbps: None,
            ack_eliciting_threshold: None,
            idle_timeout_ms: 30_000,
            keep_alive_ms: None,
            stream_receive_window: 2 * 1024 * 1024,
            receive_window: 8 * 1024 * 1024,
            send_window: 8 * 1024 * 1024,
            max_concurrent_bidi_streams: 100,
            max_concurrent_uni_streams: 100,
            mtu_discovery: true,
            send_fairness: true,
            max_udp_payload: None,
            qlog_dir: None,
            flight: None,
            tasks: crate::tasks::Tasks::default(),
        }
    }
}

/// A transport option out of range; the message names it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("transport option {name}: {problem}")]
pub struct OptionError {
    /// The option.
    pub name: &'static str,
    /// What is wrong.
    pub problem: String,
}

fn err(name: &'static str, problem: impl Into<String>) -> OptionError {
    OptionError {
        name,
        problem: problem.into(),
    }
}

impl TransportOptions {
    /// Check every value's range.
    pub fn validate(&self) -> Result<(), OptionError> {
        if self
            .qlog_dir
            .as_ref()
            .is_some_and(|d| d.as_os_str().is_empty())
        {
            return Err(err(
                "qlog_dir",
                "is empty; name a directory or leave it out",
            ));
        }
        // At most a minute: a larger value would also overflow the conversion to a Duration.
        if !(self.initial_rtt_ms.is_finite()
            && self.initial_rtt_ms > 0.0
            && self.initial_rtt_ms <= 60_000.0)
        {
            return Err(err(
                "initial_rtt_ms",
                "must be a positive number of ms up to 60000",
            ));
        }
        if let Some(k) = self.link_kbps {
            if !(k.is_finite() && k > 0.0) {
                return Err(err("link_kbps", "must be a positive number of kbit/s"));
            }
        }
        if self
            .ack_eliciting_threshold
            .is_some_and(|n| n > MAX_ACK_ELICITING_THRESHOLD)
        {
            return Err(err(
                "ack_eliciting_threshold",
                format!("must be at most {MAX_ACK_ELICITING_THRESHOLD} packets"),
            ));
        }
        if self.idle_timeout_ms == 0 {
            return Err(err("idle_timeout_ms", "must be positive"));
        }
        if VarInt::from_u64(self.idle_timeout_ms).is_err() {
            return Err(err("idle_timeout_ms", "is too large"));
        }
        if self.keep_alive_ms == Some(0) {
            return Err(err(
                "keep_alive_ms",
                "must be positive (omit it to disable)",
            ));
        }
        if let Some(k) = self.keep_alive_ms {
            if k >= self.idle_timeout_ms {
                return Err(err(
                    "keep_alive_ms",
                    format!(
                        "{k} must be shorter than idle_timeout_ms ({})",
                        self.idle_timeout_ms
                    ),
                ));
            }
        }
        for (name, v) in [
            ("stream_receive_window", self.stream_receive_window),
            ("receive_window", self.receive_window),
            ("send_window", self.send_window),
        ] {
            if v < 1200 {
                return Err(err(name, format!("{v} bytes is below one datagram (1200)")));
            }
            if VarInt::from_u64(v).is_err() {
                return Err(err(name, "is too large"));
            }
        }
        if let Some(m) = self.max_udp_payload {
            if !(1200..=65527).contains(&m) {
                return Err(err(
                    "max_udp_payload",
                    format!("{m} is outside 1200..=65527 (QUIC needs 1200)"),
                ));
            }
        }
        if self.initial_window == Some(0) {
            return Err(err("initial_window", "must be positive"));
        }
        Ok(())
    }

    /// The congestion controller factory these options describe (counting into
    /// [`Self::flight`] when set).
    pub fn controller_factory(&self) -> Arc<dyn ControllerFactory + Send + Sync> {
        let inner = self.plain_controller_factory();
        match &self.flight {
            Some(gauge) => Arc::new(crate::flight::CountedFactory {
                inner,
                gauge: gauge.clone(),
            }),
            None => inner,
        }
    }

    fn plain_controller_factory(&self) -> Arc<dyn ControllerFactory + Send + Sync> {
        match self.congestion {
            Congestion::Cubic => self.cubic(),
            Congestion::NewReno => {
                let mut c = NewRenoConfig::default();
                if let Some(w) = self.initial_window {
                    c.initial_window(w);
                }
                Arc::new(c)
            }
            Congestion::Bbr => self.bbr(),
            Congestion::Auto => Arc::new(crate::loss_switch::LossSwitchConfig {
                first: self.cubic(),
                second: self.bbr(),
            }),
        }
    }

    fn bbr(&self) -> Arc<dyn ControllerFactory + Send + Sync> {
        let mut c = BbrConfig::default();
        if let Some(w) = self.initial_window {
            c.initial_window(w);
        }
        Arc::new(c)
    }

    fn cubic(&self) -> Arc<dyn ControllerFactory + Send + Sync> {
        let mut c = CubicConfig::default();
        if let Some(w) = self.initial_window {
            c.initial_window(w);
        }
        Arc::new(c)
    }

    /// The RTT assumed before the first sample: [`Self::initial_rtt_ms`], raised to the
    /// handshake's serialisation time on [`Self::link_kbps`] (at most a minute).
    pub fn effective_initial_rtt_ms(&self) -> f64 {
        self.initial_rtt_ms
            .max(self.initial_rtt_floor_ms())
            .min(60_000.0)
    }

    /// The least initial RTT that makes sense on this link: the handshake's serialisation time
    /// on [`Self::link_kbps`] (0 when the rate is not declared).
    pub fn initial_rtt_floor_ms(&self) -> f64 {
        self.link_kbps
            .map_or(0.0, |k| HANDSHAKE_FLIGHT_BYTES as f64 * 8.0 / k)
    }

    /// The ack-eliciting threshold asked of the peer: [`Self::ack_eliciting_threshold`], or
    /// [`CONSTRAINED_ACK_ELICITING_THRESHOLD`] when the radio's rate is declared; `None`
    /// (also for 1, RFC 9000's own rate) leaves the extension off.
    pub fn effective_ack_eliciting_threshold(&self) -> Option<u32> {
        self.ack_eliciting_threshold
            .or(self.link_kbps.map(|_| CONSTRAINED_ACK_ELICITING_THRESHOLD))
            .filter(|n| *n != 1)
    }

    /// A quinn transport config with these settings.
    pub fn to_quinn(&self) -> Result<TransportConfig, OptionError> {
        self.validate()?;
        let mut t = TransportConfig::default();
        let v = |x: u64| VarInt::from_u64(x).expect("validated");
        t.congestion_controller_factory(self.controller_factory())
            .initial_rtt(Duration::from_secs_f64(
                self.effective_initial_rtt_ms() / 1000.0,
            ))
            .max_idle_timeout(Some(IdleTimeout::from(v(self.idle_timeout_ms))))
            .keep_alive_interval(self.keep_alive_ms.map(Duration::from_millis))
            .stream_receive_window(v(self.stream_receive_window))
            .receive_window(v(self.receive_window))
            .send_window(self.send_window)
            .max_concurrent_bidi_streams(self.max_concurrent_bidi_streams.into())
            .max_concurrent_uni_streams(self.max_concurrent_uni_streams.into())
            .send_fairness(self.send_fairness);
        if !self.mtu_discovery || self.max_udp_payload.is_some() {
            t.mtu_discovery_config(None);
        }
        if let Some(m) = self.max_udp_payload {
            t.initial_mtu(m).min_mtu(m.min(1200));
        }
        if let Some(n) = self.effective_ack_eliciting_threshold() {
            // Decision T9: fewer ACK-only datagrams on a constrained radio.
            let mut a = AckFrequencyConfig::default();
            a.ack_eliciting_threshold(n.into())
                .reordering_threshold(1u32.into());
            t.ack_frequency_config(Some(a));
        }
        Ok(t)
    }

    /// [`to_quinn`](Self::to_quinn) for one connection with `peer`, with a qlog file of its
    /// own when `qlog_dir` is set.
    pub fn connection_transport(
        &self,
        vantage: crate::qlog::Vantage,
        peer: &str,
    ) -> Result<TransportConfig, OptionError> {
        let mut t = self.to_quinn()?;
        if let Some(dir) = &self.qlog_dir {
            t.qlog_stream(crate::qlog::stream(dir, vantage, peer));
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bounded() {
        let o = TransportOptions::default();
        o.validate().unwrap();
        o.to_quinn().unwrap();
    }

    #[test]
    fn a_slow_link_raises_the_initial_rtt_to_the_handshakes_serialisation() {
        let at = |k: Option<f64>| {
            TransportOptions {
                link_kbps: k,
                ..Default::default()
            }
            .effective_initial_rtt_ms()
        };
        assert_eq!(at(None), 333.0);
        // 4 × 1228 bytes at 8 kbit/s take 4.9 s; at 54 Mbit/s the default stands.
        assert!((at(Some(8.0)) - 4912.0).abs() < 1e-9, "{}", at(Some(8.0)));
        assert_eq!(at(Some(54_000.0)), 333.0);
        assert_eq!(at(Some(1e-6)), 60_000.0);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let o = TransportOptions {
                link_kbps: Some(bad),
                ..Default::default()
            };
            assert!(o.validate().unwrap_err().to_string().contains("link_kbps"));
        }
    }

    #[test]
    fn a_declared_radio_asks_the_peer_for_fewer_acks_unless_told_otherwise() {
        let quinn = |o: &TransportOptions| format!("{:?}", o.to_quinn().unwrap());
        let plain = TransportOptions::default();
        assert_eq!(plain.effective_ack_eliciting_threshold(), None);
        assert!(quinn(&plain).contains("ack_frequency_config: None"));
        let radio = TransportOptions {
            link_kbps: Some(16.0),
            ..Default::default()
        };
        assert_eq!(
            radio.effective_ack_eliciting_threshold(),
            Some(CONSTRAINED_ACK_ELICITING_THRESHOLD)
        );
        let want = format!("ack_eliciting_threshold: {CONSTRAINED_ACK_ELICITING_THRESHOLD}");
        assert!(quinn(&radio).contains(&want), "{}", quinn(&radio));
        let told = TransportOptions {
            ack_eliciting_threshold: Some(1),
            ..radio
        };
        assert_eq!(told.effective_ack_eliciting_threshold(), None);
        assert!(quinn(&told).contains("ack_frequency_config: None"));
    }

    #[test]
    fn bad_values_name_the_option() {
        let o = TransportOptions {
            keep_alive_ms: Some(40_000),
            ..Default::default()
        };
        let e = o.validate().unwrap_err().to_string();
        assert!(
            e.contains("keep_alive_ms") && e.contains("shorter than idle_timeout_ms"),
            "{e}"
        );
        for (o, name) in [
            (
                TransportOptions {
                    receive_window: 10,
                    ..Default::default()
                },
                "receive_window",
            ),
            (
                TransportOptions {
                    ack_eliciting_threshold: Some(MAX_ACK_ELICITING_THRESHOLD + 1),
                    ..Default::default()
                },
                "ack_eliciting_threshold",
            ),
        ] {
            let e = o.validate().unwrap_err().to_string();
            assert!(e.contains(name), "{e}");
        }
        assert!("vegas"
            .parse::<Congestion>()
            .unwrap_err()
            .contains("cubic, new-reno, bbr, auto"));
        assert_eq!("auto".parse::<Congestion>(), Ok(Congestion::Auto));
    }

    #[test]
    fn parses_from_toml_and_rejects_unknown_keys() {
        let o: TransportOptions =
            toml::from_str("congestion = \"bbr\"\ninitial_window = 40000").unwrap();
        assert_eq!(o.congestion, Congestion::Bbr);
        assert_eq!(o.initial_window, Some(40_000));
        let e = toml::from_str::<TransportOptions>("congestoin = \"bbr\"").unwrap_err();
        assert!(e.to_string().contains("unknown field `congestoin`"), "{e}");
    }
}
