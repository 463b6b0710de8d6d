//! A change to a link's parameters in the units people write (Mbit/s, ms), as TOML tables and as
//! a compact text form (`rate=20mbit,delay=5ms,loss=0.01,queue=pid-delay`): the one description
//! of a link that plans, timelines and the real-time emulator's `--link` all read.

use std::str::FromStr;

use qgate_aqm::DisciplineSpec;
use serde::{Deserialize, Serialize};

use crate::{delay_from_ms, LinkParams, LossModel};

/// A queue discipline written as a spec string (`"pie:limit=500"`) or a table
/// (`{ kind = "pie", limit = 500 }`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum QueueSpec {
    /// `kind` or `kind:key=value,…`.
    Text(String),
    /// The tagged table form.
    Table(DisciplineSpec),
}

impl QueueSpec {
    /// The discipline it names.
    pub fn discipline(&self) -> Result<DisciplineSpec, String> {
        match self {
            QueueSpec::Text(s) => s.parse().map_err(|e: qgate_aqm::SpecError| e.to_string()),
            QueueSpec::Table(d) => Ok(d.clone()),
        }
    }
}

/// A change to one or both directions of a link; every field is optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkChange {
    /// Rate, Mbit/s (0 = unlimited).
    pub rate_mbps: Option<f64>,
    /// One-way propagation delay, ms.
    pub delay_ms: Option<f64>,
    /// Uniform jitter on the delay, ms (never reorders).
    pub jitter_ms: Option<f64>,
    /// Random loss on the wire.
    pub loss: Option<LossModel>,
    /// The queue in front of the transmitter.
    pub queue: Option<QueueSpec>,
    /// Whether the link carries traffic.
    pub up: Option<bool>,
}

impl LinkChange {
    /// Apply to `p`; the message names the bad field.
    pub fn apply(&self, p: &mut LinkParams) -> Result<(), String> {
        if let Some(r) = self.rate_mbps {
            if !(r.is_finite() && r >= 0.0) {
                return Err(format!("rate_mbps = {r}: must be a non-negative number"));
            }
            let bps = (r * 1e6).round();
            if r > 0.0 && bps < 1.0 {
                return Err(format!(
                    "rate_mbps = {r}: below 1 bit/s (0 means unlimited)"
                ));
            }
            p.rate_bps = (bps >= 1.0).then_some(bps as u64);
        }
        if let Some(d) = self.delay_ms {
            p.delay = delay_from_ms(d).map_err(|e| format!("delay_ms: {e}"))?;
        }
        if let Some(j) = self.jitter_ms {
            p.jitter = delay_from_ms(j).map_err(|e| format!("jitter_ms: {e}"))?;
        }
        if let Some(l) = self.loss {
            l.validate().map_err(|e| format!("loss: {e}"))?;
            p.loss = l;
        }
        if let Some(q) = &self.queue {
            p.queue = q.discipline().map_err(|e| format!("queue: {e}"))?;
        }
        if let Some(u) = self.up {
            p.up = u;
        }
        p.validate()
    }

    /// `other`'s fields where it has them, else this one's.
    pub fn then(&self, other: &LinkChange) -> LinkChange {
        LinkChange {
            rate_mbps: other.rate_mbps.or(self.rate_mbps),
            delay_ms: other.delay_ms.or(self.delay_ms),
            jitter_ms: other.jitter_ms.or(self.jitter_ms),
            loss: other.loss.or(self.loss),
            queue: other.queue.clone().or_else(|| self.queue.clone()),
            up: other.up.or(self.up),
        }
    }
}

/// A link change as the compact text (`"rate=20mbit,delay=5ms"`) or as a table of
/// [`LinkChange`] fields (`{ rate_mbps = 20, delay_ms = 5 }`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ChangeSpec {
    /// The compact text form.
    Text(String),
    /// The table form.
    Table(Box<LinkChange>),
}

/// By hand rather than `untagged`, so a bad key in the table form is named in the error
/// instead of "did not match any variant".
impl<'de> Deserialize<'de> for ChangeSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = ChangeSpec;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a link as text (\"rate=20mbit,delay=5ms\") or a table")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ChangeSpec, E> {
                Ok(ChangeSpec::Text(v.to_string()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<ChangeSpec, A::Error> {
                LinkChange::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(|c| ChangeSpec::Table(Box::new(c)))
            }
        }
        d.deserialize_any(V)
    }
}

impl ChangeSpec {
    /// The change it describes; the message names the problem.
    pub fn change(&self) -> Result<LinkChange, String> {
        match self {
            ChangeSpec::Text(s) => s.parse(),
            ChangeSpec::Table(c) => {
                c.apply(&mut LinkParams::default())?;
                Ok((**c).clone())
            }
        }
    }
}

impl ChangeSpec {
    /// The parameters it gives a default link (the form of a complete description, such as
    /// a shaper's `rate` and `queue`).
    pub fn params(&self) -> Result<LinkParams, String> {
        let mut p = LinkParams::default();
        self.change()?.apply(&mut p)?;
        Ok(p)
    }
}

/// The keys of the compact form; any other `key=value` after `queue=` belongs to the queue.
const KEYS: &[&str] = &[
    "rate", "delay", "jitter", "loss", "burst", "queue", "up", "down",
];

impl FromStr for LinkChange {
    type Err = String;

    /// The compact form: comma-separated `rate=20mbit` (`bit`, `kbit`, `mbit`, `gbit`; 0 or
    /// `unlimited`), `delay=5ms` and `jitter=1ms` (`us`, `ms`, `s`), `loss=0.01` or `loss=1%`
    /// (Bernoulli; with `burst=N`, Gilbert–Elliott losses in bursts of N packets on average),
    /// `queue=KIND[:key=value,…]` (the queue's own keys follow it), and `up` or `down`.
    fn from_str(s: &str) -> Result<LinkChange, String> {
        let mut c = LinkChange::default();
        let (mut loss, mut burst) = (None, None);
        let mut queue: Option<String> = None;
        let mut seen: Vec<String> = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = match part.split_once('=') {
                Some((k, v)) => (k.trim(), Some(v.trim())),
                None => (part, None),
            };
            let key_l = key.to_ascii_lowercase();
            if KEYS.contains(&key_l.as_str()) {
                // `up` and `down` are one setting.
                let slot = if key_l == "down" {
                    "up".to_string()
                } else {
                    key_l.clone()
                };
                if seen.contains(&slot) {
                    return Err(format!("'{key}' is given twice"));
                }
                seen.push(slot);
            }
            if !KEYS.contains(&key_l.as_str()) {
                match queue.as_mut() {
                    Some(q) => {
                        q.push(if q.contains(':') { ',' } else { ':' });
                        q.push_str(part);
                        continue;
                    }
                    None => {
                        return Err(format!(
                            "unknown link key '{key}' (expected one of {})",
                            KEYS.join(", ")
                        ))
                    }
                }
            }
            let need = || value.ok_or_else(|| format!("'{key}' needs a value ({key}=…)"));
            match key_l.as_str() {
                "rate" => c.rate_mbps = Some(parse_rate_mbps(need()?)?),
                "delay" => c.delay_ms = Some(parse_ms(need()?).map_err(|e| format!("delay: {e}"))?),
                "jitter" => {
                    c.jitter_ms = Some(parse_ms(need()?).map_err(|e| format!("jitter: {e}"))?)
                }
                "loss" => loss = Some(parse_probability(need()?)?),
                "burst" => {
                    let v = need()?;
                    burst = Some(
                        v.parse::<f64>()
                            .ok()
                            .filter(|b| b.is_finite() && *b >= 1.0)
                            .ok_or_else(|| {
                                format!("burst = '{v}': a mean burst length in packets, ≥ 1")
                            })?,
                    );
                }
                "queue" => queue = Some(need()?.to_string()),
                "up" | "down" => {
                    if value.is_some() {
                        return Err(format!("'{key}' takes no value"));
                    }
                    c.up = Some(key_l == "up");
                }
                _ => unreachable!("KEYS checked above"),
            }
        }
        c.loss = match (loss, burst) {
            (Some(p), None) => Some(LossModel::Bernoulli { p }),
            (Some(p), Some(b)) => Some(LossModel::bursty(p, b)),
            (None, Some(_)) => return Err("'burst' needs 'loss' (the long-run loss rate)".into()),
            (None, None) => None,
        };
        if let Some(q) = queue {
            let d: DisciplineSpec = q.parse().map_err(|e: qgate_aqm::SpecError| e.to_string())?;
            c.queue = Some(QueueSpec::Table(d));
        }
        // Check the values as they will be applied (ranges, the queue's own parameters).
        c.apply(&mut LinkParams::default())?;
        Ok(c)
    }
}

/// A rate such as `20mbit`, `512kbit`, `1.5gbit`, `9600bit` (also `Mbit/s`), in Mbit/s; `0` and
/// `unlimited` mean no rate limit. `bps` is refused: tc reads it as bytes per second.
pub fn parse_rate_mbps(s: &str) -> Result<f64, String> {
    let t = s.trim().to_ascii_lowercase();
    if t == "unlimited" || t == "0" {
        return Ok(0.0);
    }
    let t = t.strip_suffix("/s").unwrap_or(&t);
    if t.ends_with("bps") {
        return Err(format!(
            "rate '{s}': bps is ambiguous (tc reads it as bytes/s): write kbit, mbit or gbit"
        ));
    }
    let (num, scale) = [("gbit", 1e3), ("mbit", 1.0), ("kbit", 1e-3), ("bit", 1e-6)]
        .iter()
        .find_map(|(unit, scale)| t.strip_suffix(unit).map(|n| (n, *scale)))
        .ok_or_else(|| {
            if t.chars().all(|c| c.is_ascii_digit() || c == '.') {
                format!("rate '{s}' has no unit: write e.g. 20mbit, 512kbit")
            } else {
                format!("rate '{s}': unknown unit (bit, kbit, mbit, gbit)")
            }
        })?;
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("rate '{s}': '{num}' is not a number"))?;
    let mbps = v * scale;
    if !(mbps.is_finite() && mbps >= 0.0) {
        return Err(format!("rate '{s}' must be a non-negative number"));
    }
    if mbps > MAX_RATE_MBPS {
        return Err(format!("rate '{s}' is above 1 Tbit/s"));
    }
    Ok(mbps)
}

/// The fastest rate a link description accepts, Mbit/s (1 Tbit/s: far above anything emulated,
/// far below where conversions to bit/s lose meaning).
pub const MAX_RATE_MBPS: f64 = 1e6;

/// A duration such as `5ms`, `250us`, `1.5s`, in milliseconds.
pub fn parse_ms(s: &str) -> Result<f64, String> {
    let t = s.trim().to_ascii_lowercase();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix("us").or_else(|| t.strip_suffix("µs")) {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1e3)
    } else {
        return Err(format!("'{s}' has no unit: write e.g. 5ms, 250us, 1s"));
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("'{s}': '{num}' is not a number"))?;
    let ms = v * scale;
    delay_from_ms(ms)?;
    Ok(ms)
}

/// A probability written as `0.01` or `1%`.
fn parse_probability(s: &str) -> Result<f64, String> {
    let (num, scale) = match s.strip_suffix('%') {
        Some(n) => (n, 0.01),
        None => (s, 1.0),
    };
    num.trim()
        .parse::<f64>()
        .ok()
        .map(|v| v * scale)
        .filter(|p| (0.0..=1.0).contains(p))
        .ok_or_else(|| format!("loss = '{s}': a probability in [0, 1] (0.01 or 1%)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_form_reads_every_key() {
        let c: LinkChange = "rate=20mbit, delay=5ms,jitter=250us,loss=1%,queue=pid-delay"
            .parse()
            .unwrap();
        assert_eq!(c.rate_mbps, Some(20.0));
        assert_eq!(c.delay_ms, Some(5.0));
        assert_eq!(c.jitter_ms, Some(0.25));
        assert_eq!(c.loss, Some(LossModel::Bernoulli { p: 0.01 }));
        assert_eq!(
            c.queue.unwrap().discipline().unwrap(),
            "pid-delay".parse().unwrap()
        );
        assert_eq!(c.up, None);
        let down: LinkChange = "down".parse().unwrap();
        assert_eq!(down.up, Some(false));
        let ge: LinkChange = "loss=0.02,burst=4".parse().unwrap();
        assert_eq!(ge.loss, Some(LossModel::bursty(0.02, 4.0)));
    }

    #[test]
    fn queue_parameters_follow_the_queue() {
        let c: LinkChange = "rate=10mbit,queue=droptail,packets=64,delay=25ms"
            .parse()
            .unwrap();
        assert_eq!(
            c.queue.unwrap().discipline().unwrap(),
            "droptail:packets=64".parse().unwrap()
        );
        assert_eq!(c.delay_ms, Some(25.0));
        let c: LinkChange = "queue=pie:limit=100,target_ms=5".parse().unwrap();
        assert_eq!(
            c.queue.unwrap().discipline().unwrap(),
            "pie:limit=100,target_ms=5".parse().unwrap()
        );
    }

    #[test]
    fn rates_and_durations_in_their_units() {
        assert_eq!(parse_rate_mbps("1.5Gbit").unwrap(), 1500.0);
        assert_eq!(parse_rate_mbps("512kbit").unwrap(), 0.512);
        assert_eq!(parse_rate_mbps("20Mbit/s").unwrap(), 20.0);
        assert_eq!(parse_rate_mbps("unlimited").unwrap(), 0.0);
        assert_eq!(parse_ms("1.5s").unwrap(), 1500.0);
        assert_eq!(parse_ms("250us").unwrap(), 0.25);
    }

    #[test]
    fn bad_input_names_the_problem() {
        for (text, says) in [
            ("rate=20", "no unit"),
            ("rate=20mbps", "ambiguous"),
            ("rate=fast", "unknown unit"),
            ("rate=.mbit", "not a number"),
            ("rate=-5mbit", "non-negative"),
            ("rate=1e30gbit", "above 1 Tbit/s"),
            ("rate=10mbit,rate=20mbit", "twice"),
            ("down,up", "twice"),
            ("delay=5", "no unit"),
            ("delay=-5ms", "non-negative"),
            ("loss=2", "probability"),
            ("burst=3", "needs 'loss'"),
            ("colour=red", "unknown link key"),
            ("queue=nosuch", "nosuch"),
            ("queue=pie,bogus=1", "bogus"),
            ("rate", "needs a value"),
            ("down=1", "takes no value"),
        ] {
            let e = text.parse::<LinkChange>().unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
