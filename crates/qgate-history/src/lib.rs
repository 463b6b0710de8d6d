//! Paper 002's congestion-window history and careful resume (RFC 9959), sans-IO: the per-peer
//! table and the decision loop, with `now` passed in. qgate-transport persists the table and
//! runs both under quinn's congestion controller; the CLI and the lab configure them.
//!
//! Initial congestion window from the history of earlier connections to the same peer
//! (paper 002 §4, Algorithm 1): record the window when a connection closes and when a 0-RTT
//! resumption completes its handshake; keep an average per peer; start a new 1-RTT connection
//! with max(default, average), clamped to a ceiling. Entries age out; the table is bounded and
//! evicts the least recently used peer. Beyond the paper, an entry also keeps the last
//! connection's smoothed RTT, from which a new connection's RTT estimate starts (decision H8),
//! and a capacity estimate (bytes delivered per minimum RTT) and the last connection's minimum
//! RTT, from which [`Resume::Careful`] jumps once the path is confirmed (decision H9).
//!
//! Times are milliseconds of wall-clock (Unix) time passed in by the caller, so a history
//! survives restarts and simulations can pass virtual time.

pub mod careful_resume;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// How the per-peer average is kept.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Averaging {
    /// Arithmetic mean of every sample (paper 002: "arithmetic mean").
    Mean,
    /// Exponentially weighted: avg ← (1 − weight)·avg + weight·sample (paper 002: "moving
    /// average"); weight in (0, 1].
    Ewma {
        /// Weight of the newest sample.
        weight: f64,
    },
}

/// How a new connection uses its peer's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Resume {
    /// Paper 002 Algorithm 1: start at max(default, the average window recorded at close).
    Window,
    /// Careful resume (RFC 9959, decision H9): start at the default window, confirm the path's
    /// RTT against the last connection's minimum, then jump to half the recorded capacity,
    /// paced over one RTT, and retreat at the first loss or RTT growth. The default: paper
    /// 002's jump at a shared bottleneck lost 6–14 % of its packets in `qgate-lab history`.
    #[default]
    Careful,
}

/// Settings of a history table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HistoryConfig {
    /// Averaging method.
    pub averaging: Averaging,
    /// Never start above this many bytes, whatever the history says.
    pub ceiling_bytes: u64,
    /// Ignore (and drop) entries not updated for this long, ms.
    pub max_age_ms: u64,
    /// At most this many peers; the least recently used is evicted beyond it.
    pub capacity: usize,
    /// Start a connection's RTT estimate from the peer's last smoothed RTT (RFC 9002 §6.2.2)
    /// instead of the configured initial RTT; `false` is paper 002's literal scheme (window
    /// only). Decision H8.
    pub seed_rtt: bool,
    /// How a new connection uses the history.
    pub resume: Resume,
}

/// The EWMA weight of the newest sample when none is configured (paper 002 leaves it open).
pub const DEFAULT_EWMA_WEIGHT: f64 = 0.25;

impl Default for HistoryConfig {
    fn default() -> Self {
        HistoryConfig {
            averaging: Averaging::Ewma {
                weight: DEFAULT_EWMA_WEIGHT,
            },
            // 1 MiB: ~85 Mbit/s at 100 ms, beyond which starting at full speed is reckless.
            ceiling_bytes: 1 << 20,
            // A day.
            max_age_ms: 24 * 3600 * 1000,
            capacity: 10_000,
            seed_rtt: true,
            resume: Resume::default(),
        }
    }
}

impl HistoryConfig {
    /// Check ranges; the message names the field.
    pub fn validate(&self) -> Result<(), String> {
        if let Averaging::Ewma { weight } = self.averaging {
            if !(weight > 0.0 && weight <= 1.0) {
                return Err(format!(
                    "history averaging weight {weight} must be in (0, 1]"
                ));
            }
        }
        if self.capacity == 0 {
            return Err("history capacity must be at least 1".into());
        }
        if self.ceiling_bytes == 0 {
            return Err("history ceiling_bytes must be positive".into());
        }
        Ok(())
    }
}

/// What the table knows about one peer.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Average recorded congestion window, bytes.
    pub avg_cwnd: f64,
    /// Samples averaged.
    pub count: u64,
    /// Smallest RTT seen by the recorded connections, µs (0 = unknown): the reference the
    /// careful-resume safeguard compares a new connection's first RTT with.
    pub min_rtt_us: u64,
    /// Smoothed RTT of the last recorded connection at its end, µs (0 = unknown): a new
    /// connection's initial RTT (RFC 9002 §6.2.2, decision H8).
    pub srtt_us: u64,
    /// Average of the recorded connections' capacity estimates (the most bytes each delivered
    /// per minimum RTT), bytes; 0 = unknown. Careful resume's saved_cwnd (H9).
    pub capacity: f64,
    /// Minimum RTT of the last recorded connection that knew one, µs (0 = unknown): careful
    /// resume's saved_rtt, recent where [`Entry::min_rtt_us`] is the lifetime's (H9).
    pub recent_rtt_us: u64,
    /// When the entry was last updated, Unix ms.
    pub updated_ms: u64,
    /// When the entry was last used or updated, Unix ms (for LRU eviction).
    pub used_ms: u64,
}

/// The initial window chosen for a new connection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decision {
    /// Initial congestion window, bytes.
    pub window: u64,
    /// Whether the history raised it above the default.
    pub from_history: bool,
    /// The RTT the history was recorded at, µs (0 = unknown), for the safeguard.
    pub reference_rtt_us: u64,
    /// The RTT to assume before the first sample, µs (0 = the configured default): the
    /// peer's last smoothed RTT when [`HistoryConfig::seed_rtt`] (decision H8).
    pub initial_rtt_us: u64,
    /// With [`Resume::Careful`], the capacity to resume towards and the recent minimum RTT to
    /// confirm first (`None`: no careful resume).
    pub careful: Option<crate::careful_resume::Saved>,
}

/// What a connection saw besides its window (0 = unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Observed {
    /// Its minimum RTT, µs.
    pub min_us: u64,
    /// Its smoothed RTT when it ended (or when recorded), µs.
    pub srtt_us: u64,
    /// The most bytes it delivered per minimum RTT (RFC 9959 §3.1's capacity).
    pub capacity: u64,
}

/// Per-peer congestion-window history.
#[derive(Debug, Clone)]
pub struct HistoryTable {
    config: HistoryConfig,
    entries: HashMap<String, Entry>,
}

impl HistoryTable {
    /// An empty table.
    pub fn new(config: HistoryConfig) -> Self {
        HistoryTable {
            config,
            entries: HashMap::new(),
        }
    }

    /// A table holding `entries` (e.g. loaded from disk); over-capacity entries are evicted.
    pub fn with_entries(
        config: HistoryConfig,
        entries: impl IntoIterator<Item = (String, Entry)>,
    ) -> Self {
        let mut t = HistoryTable::new(config);
        t.entries.extend(entries);
        t.evict();
        t
    }

    /// The settings.
    pub fn config(&self) -> &HistoryConfig {
        &self.config
    }

    /// Record a window of `cwnd` bytes for `peer` seen at `now_ms`, with the connection's
    /// minimum and final smoothed RTTs (`rtt_us`, µs, 0 if unknown). Returns the updated entry
    /// and the peers evicted to make room.
    pub fn record(
        &mut self,
        peer: &str,
        cwnd: u64,
        rtt_us: Observed,
        now_ms: u64,
    ) -> (Entry, Vec<String>) {
        let Observed {
            min_us,
            srtt_us,
            capacity,
        } = rtt_us;
        let fresh = Entry {
            avg_cwnd: cwnd as f64,
            count: 1,
            min_rtt_us: min_us,
            srtt_us,
            capacity: capacity as f64,
            recent_rtt_us: min_us,
            updated_ms: now_ms,
            used_ms: now_ms,
        };
        let max_age = self.config.max_age_ms;
        let averaging = self.config.averaging;
        let e = self
            .entries
            .entry(peer.to_string())
            .and_modify(|e| {
                if now_ms.saturating_sub(e.updated_ms) > max_age {
                    *e = fresh; // stale history restarts
                    return;
                }
                let ewma =
                    |weight: f64, avg: f64, sample: f64| (1.0 - weight) * avg + weight * sample;
                e.avg_cwnd = match averaging {
                    Averaging::Mean => {
                        e.avg_cwnd + (cwnd as f64 - e.avg_cwnd) / e.count.saturating_add(1) as f64
                    }
                    Averaging::Ewma { weight } => ewma(weight, e.avg_cwnd, cwnd as f64),
                };
                // A connection that measured no capacity (too short) leaves the estimate alone.
                // `count` counts windows, not capacities, so the capacity is an EWMA either way
                // (the configured weight, or the default one under `mean`).
                if capacity > 0 {
                    let weight = match averaging {
                        Averaging::Ewma { weight } => weight,
                        Averaging::Mean => DEFAULT_EWMA_WEIGHT,
                    };
                    e.capacity = if e.capacity > 0.0 {
                        ewma(weight, e.capacity, capacity as f64)
                    } else {
                        capacity as f64
                    };
                }
                e.count = e.count.saturating_add(1);
                if min_us > 0 {
                    e.recent_rtt_us = min_us;
                }
                if min_us > 0 && (e.min_rtt_us == 0 || min_us < e.min_rtt_us) {
                    e.min_rtt_us = min_us;
                }
                if srtt_us > 0 {
                    e.srtt_us = srtt_us;
                }
                e.updated_ms = now_ms;
                e.used_ms = now_ms;
            })
            .or_insert(fresh);
        let out = *e;
        (out, self.evict())
    }

    /// The initial window for a new 1-RTT connection to `peer` at `now_ms`: with
    /// [`Resume::Window`], max(default, average), at most the ceiling (paper 002 Algorithm 1,
    /// line 10); with [`Resume::Careful`], the default, and the capacity to resume towards once
    /// the path is confirmed (H9). A stale entry is dropped.
    pub fn initial_window(&mut self, peer: &str, default: u64, now_ms: u64) -> Decision {
        let none = Decision {
            window: default,
            from_history: false,
            reference_rtt_us: 0,
            initial_rtt_us: 0,
            careful: None,
        };
        let Some(e) = self.entries.get_mut(peer) else {
            return none;
        };
        if now_ms.saturating_sub(e.updated_ms) > self.config.max_age_ms {
            self.entries.remove(peer);
            return none;
        }
        e.used_ms = now_ms;
        let known = Decision {
            reference_rtt_us: e.min_rtt_us,
            initial_rtt_us: if self.config.seed_rtt { e.srtt_us } else { 0 },
            ..none
        };
        if self.config.resume == Resume::Careful {
            // Careful resume starts at the default window; the jump comes once the path is
            // confirmed (RFC 9959). Half the capacity must beat the default to be worth it.
            let saved = crate::careful_resume::Saved {
                capacity: (e.capacity.round() as u64)
                    .min(self.config.ceiling_bytes.saturating_mul(2)),
                rtt: std::time::Duration::from_micros(e.recent_rtt_us),
            };
            let worth = saved.capacity / 2 > default && e.recent_rtt_us > 0;
            return Decision {
                from_history: worth,
                careful: worth.then_some(saved),
                ..known
            };
        }
        let avg = e.avg_cwnd.round() as u64;
        if avg <= default {
            return known;
        }
        Decision {
            window: avg.min(self.config.ceiling_bytes.max(default)),
            from_history: true,
            ..known
        }
    }

    /// The entry for `peer`, if any.
    pub fn get(&self, peer: &str) -> Option<&Entry> {
        self.entries.get(peer)
    }

    /// Every entry, most recently used first.
    pub fn entries(&self) -> Vec<(&str, &Entry)> {
        let mut v: Vec<_> = self.entries.iter().map(|(k, e)| (k.as_str(), e)).collect();
        v.sort_by(|a, b| b.1.used_ms.cmp(&a.1.used_ms).then(a.0.cmp(b.0)));
        v
    }

    /// Forget everything.
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Forget one peer.
    pub fn remove(&mut self, peer: &str) -> Option<Entry> {
        self.entries.remove(peer)
    }

    /// Peers held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Evict least recently used peers beyond capacity; returns them.
    fn evict(&mut self) -> Vec<String> {
        let over = self.entries.len().saturating_sub(self.config.capacity);
        if over == 0 {
            return Vec::new();
        }
        let mut by_age: Vec<(u64, String)> = self
            .entries
            .iter()
            .map(|(k, e)| (e.used_ms, k.clone()))
            .collect();
        by_age.sort();
        let gone: Vec<String> = by_age.into_iter().take(over).map(|(_, k)| k).collect();
        for k in &gone {
            self.entries.remove(k);
        }
        gone
    }
}

/// Whether a new connection's first RTT shows the path much worse than when its history was
/// recorded (the careful-resume check): RTT above `factor` × the reference.
pub fn path_changed(reference_rtt_us: u64, observed_rtt_us: u64, factor: f64) -> bool {
    reference_rtt_us > 0 && observed_rtt_us as f64 > factor * reference_rtt_us as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Paper 002's scheme (window resume).
    fn table(averaging: Averaging) -> HistoryTable {
        HistoryTable::new(HistoryConfig {
            averaging,
            ceiling_bytes: 500_000,
            max_age_ms: 10_000,
            capacity: 3,
            resume: Resume::Window,
            ..Default::default()
        })
    }

    /// A connection whose minimum RTT was `min_us` (its smoothed RTT 0: unknown).
    fn min(min_us: u64) -> Observed {
        Observed {
            min_us,
            ..Default::default()
        }
    }

    #[test]
    fn mean_and_ewma() {
        let mut m = table(Averaging::Mean);
        for (i, c) in [100_000u64, 200_000, 600_000].iter().enumerate() {
            m.record("p", *c, min(0), i as u64);
        }
        assert_eq!(m.get("p").unwrap().avg_cwnd, 300_000.0);
        assert_eq!(m.get("p").unwrap().count, 3);
        let mut e = table(Averaging::Ewma { weight: 0.5 });
        for c in [100_000u64, 200_000, 600_000] {
            e.record("p", c, min(0), 0);
        }
        // 100k → 150k → 375k
        assert_eq!(e.get("p").unwrap().avg_cwnd, 375_000.0);
    }

    #[test]
    fn initial_window_is_max_of_default_and_average_clamped() {
        let mut t = table(Averaging::Mean);
        let d = t.initial_window("p", 14_720, 0);
        assert_eq!(
            (d.window, d.from_history),
            (14_720, false),
            "no history → default"
        );
        t.record("p", 10_000, min(50_000), 0);
        let d = t.initial_window("p", 14_720, 1);
        assert_eq!(
            (d.window, d.from_history),
            (14_720, false),
            "history below default → default"
        );
        assert_eq!(d.reference_rtt_us, 50_000);
        t.record("p", 150_000, min(40_000), 2); // mean 80 000
        assert_eq!(t.initial_window("p", 14_720, 3).window, 80_000);
        t.record("p", 5_000_000, min(0), 4);
        let d = t.initial_window("p", 14_720, 5);
        assert_eq!((d.window, d.from_history), (500_000, true), "ceiling");
        assert_eq!(d.reference_rtt_us, 40_000, "the smallest RTT is kept");
    }

    #[test]
    fn stale_entries_age_out() {
        let mut t = table(Averaging::Mean);
        t.record("p", 100_000, min(0), 0);
        assert!(t.initial_window("p", 14_720, 10_000).from_history);
        assert!(!t.initial_window("p", 14_720, 20_001).from_history);
        assert!(t.get("p").is_none(), "a stale entry is dropped");
        t.record("q", 100_000, min(0), 0);
        t.record("q", 300_000, min(0), 50_000);
        assert_eq!(
            t.get("q").unwrap().count,
            1,
            "a stale entry restarts on record"
        );
    }

    #[test]
    fn least_recently_used_is_evicted() {
        let mut t = table(Averaging::Mean);
        t.record("a", 1, min(0), 1);
        t.record("b", 1, min(0), 2);
        t.record("c", 1, min(0), 3);
        t.initial_window("a", 10, 4); // a is used again
        let (_, evicted) = t.record("d", 1, min(0), 5);
        assert_eq!(evicted, vec!["b".to_string()]);
        assert_eq!(t.len(), 3);
        assert!(t.get("b").is_none() && t.get("a").is_some());
        assert_eq!(t.entries()[0].0, "d");
    }

    #[test]
    fn the_last_smoothed_rtt_seeds_the_next_connection() {
        let mut t = table(Averaging::Mean);
        assert_eq!(t.initial_window("p", 14_720, 0).initial_rtt_us, 0);
        let rtt = |min_us, srtt_us| Observed {
            min_us,
            srtt_us,
            capacity: 0,
        };
        t.record("p", 10_000, rtt(20_000, 90_000), 1);
        // Below the default window the window is not from history, the RTT still is.
        let d = t.initial_window("p", 14_720, 2);
        assert_eq!((d.from_history, d.initial_rtt_us), (false, 90_000));
        // The newest smoothed RTT counts, not an average; an unknown one keeps the last.
        t.record("p", 10_000, rtt(30_000, 40_000), 3);
        t.record("p", 10_000, rtt(0, 0), 4);
        let d = t.initial_window("p", 14_720, 5);
        assert_eq!((d.initial_rtt_us, d.reference_rtt_us), (40_000, 20_000));
        // Paper 002's literal scheme keeps the configured initial RTT.
        let mut literal = HistoryTable::new(HistoryConfig {
            seed_rtt: false,
            resume: Resume::Window,
            ..Default::default()
        });
        literal.record("p", 10_000, rtt(20_000, 90_000), 1);
        assert_eq!(literal.initial_window("p", 14_720, 2).initial_rtt_us, 0);
        // A stale entry seeds nothing.
        assert_eq!(t.initial_window("p", 14_720, 20_000).initial_rtt_us, 0);
    }

    #[test]
    fn careful_resume_keeps_the_default_window_and_resumes_towards_the_averaged_capacity() {
        let mut t = HistoryTable::new(HistoryConfig {
            averaging: Averaging::Ewma { weight: 0.5 },
            ceiling_bytes: 100_000,
            resume: Resume::Careful,
            ..Default::default()
        });
        let seen = |min_us, capacity| Observed {
            min_us,
            srtt_us: min_us,
            capacity,
        };
        assert_eq!(t.initial_window("p", 12_000, 0).careful, None, "no history");
        t.record("p", 30_000, seen(40_000, 20_000), 1);
        let d = t.initial_window("p", 12_000, 2);
        assert_eq!(
            (d.window, d.from_history, d.careful),
            (12_000, false, None),
            "half of 20 KB does not beat the default"
        );
        // The capacity averages like the window; a connection that measured none leaves it;
        // the RTT to confirm is the last connection's minimum, not the lifetime's.
        t.record("p", 30_000, seen(30_000, 60_000), 3);
        t.record("p", 30_000, seen(50_000, 0), 4);
        let d = t.initial_window("p", 12_000, 5);
        assert_eq!(
            d.window, 12_000,
            "careful resume starts at the default window"
        );
        assert!(d.from_history);
        let saved = d.careful.unwrap();
        assert_eq!(saved.capacity, 40_000);
        assert_eq!(saved.rtt, std::time::Duration::from_millis(50));
        assert_eq!(
            d.reference_rtt_us, 30_000,
            "the lifetime minimum is still kept"
        );
        // The ceiling bounds the jump (half the capacity).
        t.record("p", 30_000, seen(50_000, 10_000_000), 6);
        assert_eq!(
            t.initial_window("p", 12_000, 7).careful.unwrap().capacity,
            200_000
        );
    }

    #[test]
    fn path_change_check() {
        assert!(path_changed(40_000, 90_000, 2.0));
        assert!(!path_changed(40_000, 70_000, 2.0));
        assert!(!path_changed(0, 900_000, 2.0), "no reference, no verdict");
    }

    #[test]
    fn config_validation_names_the_field() {
        let c = HistoryConfig {
            averaging: Averaging::Ewma { weight: 0.0 },
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().contains("weight"));
    }
}
