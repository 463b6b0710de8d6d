//! Durations as people write them in config files and flags: `250ms`, `1.5s`, `2m` (at most a
//! day). One parser for the CLI and every crate's serde configuration.

use std::time::Duration;

/// Parse `250ms`, `10s`, `1.5s`, `2m`; positive, at most a day.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("duration '{s}' needs a unit: ms, s or m (e.g. 10s)"))?;
    let (num, unit) = s.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("duration '{s}': '{num}' is not a number"))?;
    let secs = match unit {
        "ms" => v / 1000.0,
        "s" => v,
        "m" | "min" => v * 60.0,
        _ => {
            return Err(format!(
                "duration '{s}': unknown unit '{unit}' (use ms, s or m)"
            ))
        }
    };
    if !secs.is_finite() || secs <= 0.0 || secs > 86_400.0 {
        return Err(format!("duration '{s}' must be positive and at most a day"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A duration as [`parse_duration`] reads it back (`1.5s`).
pub fn format_duration(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

/// A timeout: a duration, or `off` / `0` for none ([`Duration::ZERO`]).
pub fn parse_timeout(s: &str) -> Result<Duration, String> {
    match s.trim() {
        "off" | "0" => Ok(Duration::ZERO),
        s => parse_duration(s),
    }
}

/// A timeout as [`parse_timeout`] reads it back (`off` for none).
pub fn format_timeout(d: Duration) -> String {
    if d.is_zero() {
        "off".into()
    } else {
        format_duration(d)
    }
}

/// `#[serde(with = "qgate_core::units::duration")]`: a `Duration` written as `"10s"`.
pub mod duration {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    /// Write as `"1.5s"`.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format_duration(*d))
    }

    /// Read `"250ms"`, `"10s"`, `"2m"`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        super::parse_duration(&s).map_err(serde::de::Error::custom)
    }
}

/// `#[serde(with = "qgate_core::units::timeout")]`: a `Duration` written as `"10s"`, or
/// `"off"` for none (zero).
pub mod timeout {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    /// Write as `"1.5s"` or `"off"`.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format_timeout(*d))
    }

    /// Read `"250ms"`, `"10s"`, `"2m"`, `"off"`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        super::parse_timeout(&s).map_err(serde::de::Error::custom)
    }
}

/// `#[serde(default, with = "qgate_core::units::optional_duration")]`: an optional `Duration`
/// written as `"10s"` (absent: none).
pub mod optional_duration {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    /// Write as `"1.5s"` (none is skipped by the caller's `skip_serializing_if`).
    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_str(&super::format_duration(*d)),
            None => s.serialize_none(),
        }
    }

    /// Read `"250ms"`, `"10s"`, `"2m"`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let s = String::deserialize(d)?;
        super::parse_duration(&s)
            .map(Some)
            .map_err(serde::de::Error::custom)
    }
}

/// Parse a byte count: `65536`, `64KiB`, `64k`, `1.5MB`, `2MiB`, `1GB` (k/KB = 1000,
/// KiB = 1024, and so on; at most 2^62).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("size '{t}': '{num}' is not a number"))?;
    let scale: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "k" | "K" | "kB" | "KB" => 1e3,
        "KiB" | "Ki" => 1024.0,
        "M" | "MB" => 1e6,
        "MiB" | "Mi" => 1024.0 * 1024.0,
        "G" | "GB" => 1e9,
        "GiB" | "Gi" => 1024.0 * 1024.0 * 1024.0,
        u => {
            return Err(format!(
                "size '{t}': unknown unit '{u}' (use B, KB, KiB, MB, MiB, GB or GiB)"
            ))
        }
    };
    let bytes = v * scale;
    if !bytes.is_finite() || bytes > (1u64 << 62) as f64 || bytes.fract() != 0.0 {
        return Err(format!(
            "size '{t}' must be a whole number of bytes up to 2^62"
        ));
    }
    Ok(bytes as u64)
}

/// A byte count as [`parse_bytes`] reads it back: whole bytes, or binary units with one
/// decimal where that is exact enough to say (`512B`, `64KiB`, `1.5GiB`).
pub fn format_bytes(b: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in UNITS {
        if b >= size {
            let v = b as f64 / size as f64;
            return if b.is_multiple_of(size) {
                format!("{}{unit}", b / size)
            } else {
                format!("{v:.1}{unit}")
            };
        }
    }
    format!("{b}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_are_written_back() {
        assert_eq!(format_bytes(512), "512B");
        assert_eq!(format_bytes(64 << 10), "64KiB");
        assert_eq!(format_bytes(3 << 29), "1.5GiB");
        assert_eq!(format_bytes(1 << 30), "1GiB");
        for b in [0, 512, 64 << 10, 1 << 30, 5 << 20] {
            assert_eq!(parse_bytes(&format_bytes(b)), Ok(b));
        }
    }

    #[test]
    fn byte_counts() {
        assert_eq!(parse_bytes("65536"), Ok(65536));
        assert_eq!(parse_bytes("64KiB"), Ok(65536));
        assert_eq!(parse_bytes("64k"), Ok(64_000));
        assert_eq!(parse_bytes("1.5MB"), Ok(1_500_000));
        assert_eq!(parse_bytes("2 MiB"), Ok(2 << 20));
        assert_eq!(parse_bytes("1GB"), Ok(1_000_000_000));
        assert!(parse_bytes("1.5").unwrap_err().contains("whole number"));
        assert!(parse_bytes("10mb")
            .unwrap_err()
            .contains("unknown unit 'mb'"));
        assert!(parse_bytes("x").unwrap_err().contains("not a number"));
        assert!(parse_bytes("9999999999GiB").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("10").unwrap_err().contains("needs a unit"));
        assert!(parse_duration("10h")
            .unwrap_err()
            .contains("unknown unit 'h'"));
        assert!(parse_duration("0s").unwrap_err().contains("positive"));
        assert_eq!(
            parse_duration(&format_duration(Duration::from_millis(1500))).unwrap(),
            Duration::from_millis(1500)
        );
    }
}
