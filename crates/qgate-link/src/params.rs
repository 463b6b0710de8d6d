//! The parameters and counters of one direction of a link.

use std::time::Duration;

use qgate_aqm::DisciplineSpec;
use serde::{Deserialize, Serialize};

use crate::LossModel;

/// One direction of a point-to-point link: a transmitter draining a queue at `rate`, then a wire
/// that delays each packet by `delay` (± `jitter`) and loses some of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LinkParams {
    /// Transmit rate in bits per second (IP + UDP headers count); `None` = no serialisation delay.
    pub rate_bps: Option<u64>,
    /// One-way propagation delay.
    #[serde(with = "duration_ms")]
    pub delay: Duration,
    /// Uniform jitter added to the delay, in [−jitter, +jitter]; never reorders packets.
    #[serde(with = "duration_ms")]
    pub jitter: Duration,
    /// Random loss on the wire.
    pub loss: LossModel,
    /// The queue in front of the transmitter.
    pub queue: DisciplineSpec,
    /// Whether the link carries traffic; a down link drops everything queued, in flight and sent.
    pub up: bool,
}

impl Default for LinkParams {
    fn default() -> Self {
        LinkParams {
            rate_bps: None,
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            loss: LossModel::None,
            queue: DisciplineSpec::default(),
            up: true,
        }
    }
}

impl LinkParams {
    /// A link of `rate_bps` and one-way `delay`, no loss, the default drop-tail queue.
    pub fn new(rate_bps: u64, delay: Duration) -> Self {
        LinkParams {
            rate_bps: Some(rate_bps),
            delay,
            ..Default::default()
        }
    }

    /// With this loss model.
    pub fn with_loss(mut self, loss: LossModel) -> Self {
        self.loss = loss;
        self
    }

    /// With this queue.
    pub fn with_queue(mut self, queue: DisciplineSpec) -> Self {
        self.queue = queue;
        self
    }

    /// With this jitter.
    pub fn with_jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }

    /// Time to clock `bytes` onto the wire at this link's rate.
    pub fn serialisation(&self, bytes: usize) -> Duration {
        match self.rate_bps {
            None | Some(0) => Duration::ZERO,
            Some(rate) => {
                Duration::from_nanos(((bytes as u128 * 8 * 1_000_000_000) / rate as u128) as u64)
            }
        }
    }

    /// Check the parameters; the message names the bad one.
    pub fn validate(&self) -> Result<(), String> {
        if self.rate_bps == Some(0) {
            return Err("link rate_bps must be positive (omit it for an unlimited link)".into());
        }
        self.loss.validate()?;
        self.queue.validate().map_err(|e| e.to_string())
    }
}

/// Counters of one link direction. Once the link is idle,
/// `sent = delivered + dropped_loss + dropped_queue + dropped_down`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LinkStats {
    /// Packets offered to the link.
    pub sent: u64,
    /// Bytes offered to the link.
    pub sent_bytes: u64,
    /// Packets that reached the far end.
    pub delivered: u64,
    /// Bytes that reached the far end.
    pub delivered_bytes: u64,
    /// Packets lost on the wire by the loss model.
    pub dropped_loss: u64,
    /// Bytes of those packets (they took airtime at the sender all the same).
    pub dropped_loss_bytes: u64,
    /// Packets dropped by the queue discipline (overflow or AQM).
    pub dropped_queue: u64,
    /// Packets dropped because the link was down.
    pub dropped_down: u64,
    /// Packets the queue marked CE.
    pub marked: u64,
    /// Largest queue seen, in packets (excluding the one being transmitted).
    pub max_queue_packets: usize,
    /// Largest queue seen, in bytes.
    pub max_queue_bytes: usize,
}

/// IPv4 + UDP header bytes added to a datagram's payload when it occupies a link (decision N3:
/// link rates are IP-level).
pub const IPV4_UDP_OVERHEAD: usize = 28;
/// IPv6 + UDP header bytes.
pub const IPV6_UDP_OVERHEAD: usize = 48;

/// The longest one-way delay a link takes, ms (an hour): a longer one is refused with an error
/// rather than overflowing the conversion (found by the `config` fuzz target).
pub const MAX_DELAY_MS: f64 = 3_600_000.0;

/// A delay given in (fractional) milliseconds: non-negative, finite, at most [`MAX_DELAY_MS`].
pub fn delay_from_ms(ms: f64) -> Result<Duration, String> {
    if !(ms.is_finite() && (0.0..=MAX_DELAY_MS).contains(&ms)) {
        return Err(format!(
            "a delay must be a non-negative number of milliseconds up to {MAX_DELAY_MS}, got {ms}"
        ));
    }
    Ok(Duration::from_secs_f64(ms / 1000.0))
}

/// Durations in TOML as (fractional) milliseconds.
mod duration_ms {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64() * 1000.0)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        super::delay_from_ms(f64::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialisation_time() {
        let p = LinkParams::new(10_000_000, Duration::ZERO);
        assert_eq!(p.serialisation(1250), Duration::from_millis(1));
        assert_eq!(LinkParams::default().serialisation(1500), Duration::ZERO);
    }

    #[test]
    fn delays_in_ms_are_checked_not_overflowed() {
        assert_eq!(delay_from_ms(2.5), Ok(Duration::from_micros(2500)));
        assert_eq!(delay_from_ms(MAX_DELAY_MS), Ok(Duration::from_secs(3600)));
        for bad in [-1.0, f64::NAN, f64::INFINITY, MAX_DELAY_MS + 1.0, 4.1e56] {
            assert!(delay_from_ms(bad).is_err(), "{bad}");
        }
    }
}
