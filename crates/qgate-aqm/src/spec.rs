//! Naming a discipline and its parameters, from TOML or from a command-line string.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{DropTail, QueueDiscipline};

/// A queue discipline by name with its parameters: the form configs and flags use.
///
/// TOML: `queue = { kind = "droptail", packets = 1000 }`. Flag: `droptail:packets=1000` or
/// `droptail:bytes=150000`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum DisciplineSpec {
    /// FIFO with a packet limit and an optional byte limit.
    Droptail {
        /// Packet limit (default 1000, the paper-004 scenario's buffer).
        #[serde(default)]
        packets: Option<usize>,
        /// Byte limit; when set, arrivals that would exceed it are dropped.
        #[serde(default)]
        bytes: Option<usize>,
    },
}

/// The packet limit a drop-tail queue gets when none is given.
pub const DEFAULT_PACKET_LIMIT: usize = 1000;

impl Default for DisciplineSpec {
    fn default() -> Self {
        DisciplineSpec::Droptail {
            packets: None,
            bytes: None,
        }
    }
}

/// A discipline string or table that cannot be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// The name before `:` is not a known discipline.
    #[error("unknown queue discipline '{0}' (known: droptail)")]
    UnknownKind(String),
    /// A `key=value` parameter is not known for this discipline.
    #[error("queue discipline '{kind}' has no parameter '{key}' (known: {known})")]
    UnknownParam {
        /// The discipline.
        kind: String,
        /// The offending key.
        key: String,
        /// The keys it does take.
        known: &'static str,
    },
    /// A parameter's value is malformed or out of range.
    #[error("queue discipline parameter '{key}': {problem}")]
    BadValue {
        /// The parameter.
        key: String,
        /// What is wrong with it.
        problem: String,
    },
}

impl DisciplineSpec {
    /// Check the parameters' ranges.
    pub fn validate(&self) -> Result<(), SpecError> {
        match self {
            DisciplineSpec::Droptail { packets, bytes } => {
                if *packets == Some(0) {
                    return Err(bad("packets", "must be at least 1"));
                }
                if *bytes == Some(0) {
                    return Err(bad("bytes", "must be at least 1"));
                }
                Ok(())
            }
        }
    }

    /// Build the discipline this spec names.
    pub fn build<T: Send + 'static>(&self) -> Box<dyn QueueDiscipline<T>> {
        match self {
            DisciplineSpec::Droptail { packets, bytes } => match (packets, bytes) {
                (_, Some(b)) => {
                    let mut q = DropTail::with_byte_limit(*b);
                    if let Some(p) = packets {
                        q = q.with_packet_cap(*p);
                    }
                    Box::new(q)
                }
                (p, None) => Box::new(DropTail::with_packet_limit(
                    p.unwrap_or(DEFAULT_PACKET_LIMIT),
                )),
            },
        }
    }
}

fn bad(key: &str, problem: &str) -> SpecError {
    SpecError::BadValue {
        key: key.to_string(),
        problem: problem.to_string(),
    }
}

fn parse_usize(key: &str, value: &str) -> Result<usize, SpecError> {
    value
        .parse()
        .map_err(|_| bad(key, &format!("'{value}' is not a whole number")))
}

impl FromStr for DisciplineSpec {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Self, SpecError> {
        let (kind, params) = s.split_once(':').unwrap_or((s, ""));
        let params = params.split(',').filter(|p| !p.trim().is_empty()).map(|p| {
            p.split_once('=')
                .map(|(k, v)| (k.trim(), v.trim()))
                .ok_or_else(|| bad(p, "expected key=value"))
        });
        let spec = match kind.trim() {
            "droptail" | "drop-tail" => {
                let (mut packets, mut bytes) = (None, None);
                for kv in params {
                    let (k, v) = kv?;
                    match k {
                        "packets" => packets = Some(parse_usize(k, v)?),
                        "bytes" => bytes = Some(parse_usize(k, v)?),
                        _ => {
                            return Err(SpecError::UnknownParam {
                                kind: "droptail".into(),
                                key: k.into(),
                                known: "packets, bytes",
                            })
                        }
                    }
                }
                DisciplineSpec::Droptail { packets, bytes }
            }
            other => return Err(SpecError::UnknownKind(other.to_string())),
        };
        spec.validate()?;
        Ok(spec)
    }
}

impl fmt::Display for DisciplineSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DisciplineSpec::Droptail { packets, bytes } => {
                write!(f, "droptail")?;
                let mut sep = ':';
                if let Some(p) = packets {
                    write!(f, "{sep}packets={p}")?;
                    sep = ',';
                }
                if let Some(b) = bytes {
                    write!(f, "{sep}bytes={b}")?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_round_trips() {
        for s in [
            "droptail",
            "droptail:packets=64",
            "droptail:bytes=15000",
            "droptail:packets=5,bytes=9000",
        ] {
            let spec: DisciplineSpec = s.parse().unwrap();
            assert_eq!(spec.to_string(), s);
        }
    }

    #[test]
    fn rejects_with_a_message_naming_the_problem() {
        let e = "red:min=5".parse::<DisciplineSpec>().unwrap_err();
        assert!(
            e.to_string().contains("unknown queue discipline 'red'"),
            "{e}"
        );
        let e = "droptail:pkts=5".parse::<DisciplineSpec>().unwrap_err();
        assert!(e.to_string().contains("no parameter 'pkts'"), "{e}");
        let e = "droptail:packets=lots"
            .parse::<DisciplineSpec>()
            .unwrap_err();
        assert!(
            e.to_string().contains("'lots' is not a whole number"),
            "{e}"
        );
        let e = "droptail:packets=0".parse::<DisciplineSpec>().unwrap_err();
        assert!(e.to_string().contains("at least 1"), "{e}");
    }

    #[test]
    fn builds_a_bounded_queue() {
        let spec: DisciplineSpec = "droptail:packets=3".parse().unwrap();
        let mut q = spec.build::<()>();
        let now = std::time::Instant::now();
        let mut dropped = Vec::new();
        for _ in 0..5 {
            q.enqueue(now, crate::Packet::new(10, 0, ()), &mut dropped);
        }
        assert_eq!(q.backlog().packets, 3);
        assert_eq!(dropped.len(), 2);
    }
}
