//! What to emulate: paths (one emulated link each, both directions), a timeline of changes, and
//! the programs to run on either side. Read from TOML, from command-line text, or both.

use std::path::PathBuf;
use std::time::Duration;

pub use qgate_link::ChangeSpec;
use qgate_link::{parse_ms, LinkParams};
use serde::{Deserialize, Serialize};

/// The most paths one run emulates (addresses are 10.77.N.1/2, one TUN pair per path).
pub const MAX_PATHS: usize = 16;

/// The most bytes one link direction may hold on its wire (rate × (delay + jitter)): packets in
/// flight live in the relay's memory, beyond any queue limit.
pub const MAX_WIRE_BYTES: f64 = 256.0 * 1024.0 * 1024.0;

/// The default seed of the loss and jitter draws.
pub const DEFAULT_SEED: u64 = 1;

/// The longest spin before a delivery that may be asked for, ms: above about the gap between
/// packets at a few Mbit/s a relay would never sleep while packets are on the wire.
pub const MAX_SPIN_MS: f64 = 1.0;

/// How long the outside command gets to start (bind its sockets) before COMMAND runs.
pub const DEFAULT_SETTLE: Duration = Duration::from_millis(300);

/// Which way a packet crosses a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Way {
    /// From the inside namespace (COMMAND) to the outside one.
    Uplink,
    /// From the outside namespace to the inside one.
    Downlink,
}

impl Way {
    /// Both ways, uplink first.
    pub const BOTH: [Way; 2] = [Way::Uplink, Way::Downlink];

    /// `uplink` or `downlink`.
    pub fn as_str(self) -> &'static str {
        match self {
            Way::Uplink => "uplink",
            Way::Downlink => "downlink",
        }
    }
}

/// One emulated path: a link whose two directions may differ.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathConfig {
    /// Both directions.
    pub link: ChangeSpec,
    /// Overrides for the uplink (inside → outside).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uplink: Option<ChangeSpec>,
    /// Overrides for the downlink (outside → inside).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downlink: Option<ChangeSpec>,
}

impl PathConfig {
    /// A path with the same link both ways.
    pub fn symmetric(link: &str) -> PathConfig {
        PathConfig {
            link: ChangeSpec::Text(link.into()),
            uplink: None,
            downlink: None,
        }
    }

    /// The parameters of one direction.
    pub fn params(&self, way: Way) -> Result<LinkParams, String> {
        let over = match way {
            Way::Uplink => &self.uplink,
            Way::Downlink => &self.downlink,
        };
        let mut change = self.link.change()?;
        if let Some(o) = over {
            change = change.then(&o.change().map_err(|e| format!("{}: {e}", way.as_str()))?);
        }
        let mut p = LinkParams::default();
        change.apply(&mut p)?;
        check_emulable(&p)?;
        Ok(p)
    }
}

/// What a real-time link must be: rate-limited, and not holding more than [`MAX_WIRE_BYTES`]
/// in flight.
pub fn check_emulable(p: &LinkParams) -> Result<(), String> {
    let Some(rate) = p.rate_bps else {
        // An "unlimited" real link is limited by the relay's CPU, unpredictably.
        return Err(
            "every path needs a rate (rate=…): an unlimited link would run at \
                    whatever speed the relay's CPU allows"
                .into(),
        );
    };
    let wire = rate as f64 / 8.0 * (p.delay + p.jitter).as_secs_f64();
    if wire > MAX_WIRE_BYTES {
        return Err(format!(
            "rate × delay holds {:.0} MiB in flight; at most {:.0} MiB (the relay keeps packets \
             in flight in memory)",
            wire / 1048576.0,
            MAX_WIRE_BYTES / 1048576.0
        ));
    }
    Ok(())
}

/// A change to one path at a time since the start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimedChange {
    /// When, since COMMAND started (`"20s"`, `"1500ms"`).
    pub at: String,
    /// The path, counting from 1.
    pub path: usize,
    /// Which direction (both when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub way: Option<Way>,
    /// The change.
    pub change: ChangeSpec,
}

impl TimedChange {
    /// When it applies.
    pub fn at(&self) -> Result<Duration, String> {
        Ok(Duration::from_secs_f64(parse_ms(&self.at)? / 1000.0))
    }

    /// The directions it changes.
    pub fn ways(&self) -> &'static [Way] {
        match self.way {
            None => &Way::BOTH,
            Some(Way::Uplink) => &[Way::Uplink],
            Some(Way::Downlink) => &[Way::Downlink],
        }
    }
}

impl std::str::FromStr for TimedChange {
    type Err = String;

    /// `[at] 20s path 1 [uplink|downlink] delay=80ms` (also `… path 2 down`).
    fn from_str(s: &str) -> Result<TimedChange, String> {
        let bad = |why: &str| {
            format!("timeline entry '{s}': {why} (expected e.g. 'at 20s path 1 delay=80ms')")
        };
        let mut words = s.split_whitespace().peekable();
        if words.peek() == Some(&"at") {
            words.next();
        }
        let at = words.next().ok_or_else(|| bad("no time"))?.to_string();
        if words.next() != Some("path") {
            return Err(bad("no 'path N'"));
        }
        let path = words
            .next()
            .and_then(|n| n.parse::<usize>().ok())
            .ok_or_else(|| bad("'path' needs a number"))?;
        let way = match words.peek() {
            Some(&"uplink") => Some(Way::Uplink),
            Some(&"downlink") => Some(Way::Downlink),
            _ => None,
        };
        if way.is_some() {
            words.next();
        }
        let change: Vec<&str> = words.collect();
        if change.is_empty() {
            return Err(bad("no change"));
        }
        let t = TimedChange {
            at,
            path,
            way,
            change: ChangeSpec::Text(change.join(",")),
        };
        t.at().map_err(|e| bad(&e))?;
        t.change.change().map_err(|e| bad(&e))?;
        Ok(t)
    }
}

/// A whole emulation: the `[linkem]` table of a config file, or built from flags.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkemConfig {
    /// The paths, path 1 first.
    #[serde(default, rename = "path")]
    pub paths: Vec<PathConfig>,
    /// Changes while COMMAND runs.
    #[serde(default)]
    pub timeline: Vec<TimedChange>,
    /// A shell command run in the outside namespace first (a server); stopped at the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outside: Option<String>,
    /// How long the outside command gets to start before COMMAND runs (`"300ms"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settle: Option<String>,
    /// Seed of the loss and jitter draws.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Counters, queue delay and lateness cover only what happens this long after COMMAND
    /// starts (`"10s"`): the warm-up is left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup: Option<String>,
    /// Directory for counters.csv, queue_delay.csv, lateness.csv (and traces with `trace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub out: Option<PathBuf>,
    /// Write a per-packet trace of every link direction into `out`.
    #[serde(default)]
    pub trace: bool,
    /// Do not ask for real-time priority for the relay threads.
    #[serde(default)]
    pub no_realtime: bool,
    /// Busy-wait instead of sleeping for the last this-long before each scheduled delivery
    /// (`"200us"`, at most [`MAX_SPIN_MS`]): the relay then never waits on a timer wake-up, which
    /// on a virtual machine can be late by milliseconds, at the price of a busy core while
    /// packets are on the wire. Off unless given (decision L12).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spin: Option<String>,
}

impl LinkemConfig {
    /// Check everything that can be checked before touching the system.
    pub fn validate(&self) -> Result<(), String> {
        if self.paths.is_empty() {
            return Err("no path: give at least one --link (or a [[linkem.path]])".into());
        }
        if self.paths.len() > MAX_PATHS {
            return Err(format!(
                "{} paths: at most {MAX_PATHS} are supported",
                self.paths.len()
            ));
        }
        for (i, p) in self.paths.iter().enumerate() {
            for way in Way::BOTH {
                p.params(way).map_err(|e| format!("path {}: {e}", i + 1))?;
            }
        }
        // Each path's parameters as the timeline changes them, in time order.
        let mut state: Vec<[LinkParams; 2]> = self
            .paths
            .iter()
            .map(|p| Ok([p.params(Way::Uplink)?, p.params(Way::Downlink)?]))
            .collect::<Result<_, String>>()?;
        let mut ordered: Vec<&TimedChange> = self.timeline.iter().collect();
        ordered.sort_by_key(|t| t.at().unwrap_or_default());
        for t in ordered {
            t.at()?;
            if t.path == 0 || t.path > self.paths.len() {
                return Err(format!(
                    "timeline at {}: there is no path {} (paths are 1..={})",
                    t.at,
                    t.path,
                    self.paths.len()
                ));
            }
            let change = t
                .change
                .change()
                .map_err(|e| format!("timeline at {}: {e}", t.at))?;
            for way in t.ways() {
                let p = &mut state[t.path - 1][usize::from(*way == Way::Downlink)];
                change
                    .apply(p)
                    .and_then(|()| check_emulable(p))
                    .map_err(|e| format!("timeline at {}, path {}: {e}", t.at, t.path))?;
            }
        }
        self.settle()?;
        self.warmup()?;
        self.spin()?;
        Ok(())
    }

    /// How long before a scheduled delivery the relay stops sleeping and spins (zero: never).
    pub fn spin(&self) -> Result<Duration, String> {
        let Some(s) = &self.spin else {
            return Ok(Duration::ZERO);
        };
        let ms = parse_ms(s).map_err(|e| format!("spin: {e}"))?;
        if ms > MAX_SPIN_MS {
            return Err(format!(
                "spin: {s} is more than {MAX_SPIN_MS} ms (a relay would spin for most of its time; \
                 a few hundred microseconds is what a late timer costs)"
            ));
        }
        Ok(Duration::from_secs_f64(ms / 1000.0))
    }

    /// How long the outside command gets before COMMAND starts.
    pub fn settle(&self) -> Result<Duration, String> {
        match &self.settle {
            None => Ok(DEFAULT_SETTLE),
            Some(s) => Ok(Duration::from_secs_f64(
                parse_ms(s).map_err(|e| format!("settle: {e}"))? / 1000.0,
            )),
        }
    }

    /// The warm-up left out of the statistics.
    pub fn warmup(&self) -> Result<Option<Duration>, String> {
        self.warmup
            .as_deref()
            .map(|w| {
                parse_ms(w)
                    .map(|ms| Duration::from_secs_f64(ms / 1000.0))
                    .map_err(|e| format!("warmup: {e}"))
            })
            .transpose()
    }

    /// The seed of the loss and jitter draws.
    pub fn seed(&self) -> u64 {
        self.seed.unwrap_or(DEFAULT_SEED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeline_text_reads_time_path_way_and_change() {
        let t: TimedChange = "at 20s path 1 delay=80ms".parse().unwrap();
        assert_eq!(t.at().unwrap(), Duration::from_secs(20));
        assert_eq!((t.path, t.way), (1, None));
        assert_eq!(t.change.change().unwrap().delay_ms, Some(80.0));
        let t: TimedChange = "40s path 2 uplink down".parse().unwrap();
        assert_eq!((t.path, t.way), (2, Some(Way::Uplink)));
        assert_eq!(t.change.change().unwrap().up, Some(false));
        let t: TimedChange = "1.5s path 1 rate=1mbit loss=5%".parse().unwrap();
        assert_eq!(t.at().unwrap(), Duration::from_millis(1500));
        assert!(t.change.change().unwrap().loss.is_some());
        for bad in [
            "",
            "at 20s",
            "at 20 path 1 down",
            "at 2s path x down",
            "at 2s path 1",
            "at 2s path 1 colour=red",
        ] {
            assert!(bad.parse::<TimedChange>().is_err(), "{bad}");
        }
    }

    #[test]
    fn toml_form_takes_text_or_tables_and_direction_overrides() {
        let c: LinkemConfig = toml::from_str(
            r#"
            outside = "sleep 5"
            [[path]]
            link = "rate=20mbit,delay=5ms"
            uplink = { rate_mbps = 5 }
            [[path]]
            link = { rate_mbps = 5, delay_ms = 60, queue = "pid-delay" }
            [[timeline]]
            at = "20s"
            path = 2
            way = "downlink"
            change = "down"
            "#,
        )
        .unwrap();
        c.validate().unwrap();
        let up = c.paths[0].params(Way::Uplink).unwrap();
        let down = c.paths[0].params(Way::Downlink).unwrap();
        assert_eq!(up.rate_bps, Some(5_000_000));
        assert_eq!(down.rate_bps, Some(20_000_000));
        assert_eq!(up.delay, Duration::from_millis(5));
        assert_eq!(c.timeline[0].ways(), &[Way::Downlink]);
    }

    #[test]
    fn validation_names_the_problem() {
        let mut c = LinkemConfig::default();
        assert!(c.validate().unwrap_err().contains("no path"));
        c.paths.push(PathConfig::symmetric("delay=5ms"));
        assert!(c.validate().unwrap_err().contains("needs a rate"));
        c.paths[0] = PathConfig::symmetric("rate=1mbit");
        c.timeline.push("at 1s path 3 down".parse().unwrap());
        assert!(c.validate().unwrap_err().contains("no path 3"));
        c.timeline.clear();
        c.settle = Some("soon".into());
        assert!(c.validate().unwrap_err().contains("settle"));
        c.settle = None;
        c.spin = Some("200".into());
        assert!(c.validate().unwrap_err().contains("spin"));
        c.spin = Some("2ms".into());
        assert!(c.validate().unwrap_err().contains("spin"));
        c.spin = Some("250us".into());
        assert_eq!(c.spin().unwrap(), Duration::from_micros(250));
        let e = toml::from_str::<LinkemConfig>("[[path]]\nlink = \"rate=1mbit\"\nspeed = 3")
            .unwrap_err()
            .to_string();
        assert!(e.contains("speed"), "{e}");
    }
}
