//! One struct for every QUIC transport knob qgate exposes, with sane bounded defaults.

use std::sync::Arc;
use std::time::Duration;

use quinn::congestion::{BbrConfig, ControllerFactory, CubicConfig, NewRenoConfig};
use quinn::{IdleTimeout, TransportConfig, VarInt};
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
}

impl std::str::FromStr for Congestion {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cubic" => Ok(Congestion::Cubic),
            "new-reno" | "newreno" | "reno" => Ok(Congestion::NewReno),
            "bbr" => Ok(Congestion::Bbr),
            other => Err(format!(
                "unknown congestion controller '{other}' (known: cubic, new-reno, bbr)"
            )),
        }
    }
}

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
    /// Count the bytes in flight of every connection built with these options here (not a
    /// setting: a measurement hook, never read from a configuration file).
    #[serde(skip)]
    pub flight: Option<crate::FlightGauge>,
}

impl Default for TransportOptions {
    fn default() -> Self {
        TransportOptions {
            congestion: Congestion::Cubic,
            initial_window: None,
            initial_rtt_ms: 333.0,
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
            flight: None,
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
            Congestion::Cubic => {
                let mut c = CubicConfig::default();
                if let Some(w) = self.initial_window {
                    c.initial_window(w);
                }
                Arc::new(c)
            }
            Congestion::NewReno => {
                let mut c = NewRenoConfig::default();
                if let Some(w) = self.initial_window {
                    c.initial_window(w);
                }
                Arc::new(c)
            }
            Congestion::Bbr => {
                let mut c = BbrConfig::default();
                if let Some(w) = self.initial_window {
                    c.initial_window(w);
                }
                Arc::new(c)
            }
        }
    }

    /// A quinn transport config with these settings.
    pub fn to_quinn(&self) -> Result<TransportConfig, OptionError> {
        self.validate()?;
        let mut t = TransportConfig::default();
        let v = |x: u64| VarInt::from_u64(x).expect("validated");
        t.congestion_controller_factory(self.controller_factory())
            .initial_rtt(Duration::from_secs_f64(self.initial_rtt_ms / 1000.0))
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
        let o = TransportOptions {
            receive_window: 10,
            ..Default::default()
        };
        assert!(o
            .validate()
            .unwrap_err()
            .to_string()
            .contains("receive_window"));
        assert!("vegas"
            .parse::<Congestion>()
            .unwrap_err()
            .contains("cubic, new-reno, bbr"));
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
