//! The spool seen from outside: depth by class and device, for the admin API and `qgate ctl`.

use qgate_core::sync::lock;
use qgate_forward::scheduler::Priority;

use crate::ledger::{class_index, Held};

use super::Spool;

/// What the spool holds in one class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClassView {
    /// Records and bytes held.
    pub held: Held,
    /// Records taken and not yet finished.
    pub in_flight: u64,
    /// When the oldest segment holding undone records began, ms since the Unix epoch.
    pub oldest_at_ms: Option<u64>,
}

/// One device's holding.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeviceView {
    /// Its owner key (the device's address without its port).
    pub owner: String,
    /// Priority records and bytes.
    pub priority: Held,
    /// Best-effort records and bytes.
    pub best_effort: Held,
}

/// The spool seen from outside: depth by class and device.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SpoolView {
    /// Its directory.
    pub dir: String,
    /// Why it is off, if it is.
    pub unavailable: Option<String>,
    /// Priority's holding.
    pub priority: ClassView,
    /// Best effort's holding.
    pub best_effort: ClassView,
    /// The devices holding most bytes, most first (at most 100).
    pub devices: Vec<DeviceView>,
    /// Bytes held at most.
    pub max_bytes: u64,
    /// Records held at most.
    pub max_records: u64,
}

impl Spool {
    /// Depth by class and device.
    pub fn view(&self) -> SpoolView {
        let s = lock(&self.inner.state);
        let class = |c: Priority| {
            let log = &s.logs[class_index(c)];
            ClassView {
                held: s.ledger.class(c),
                in_flight: log.in_flight.len() as u64,
                oldest_at_ms: log
                    .segments
                    .iter()
                    .find(|g| !g.finished())
                    .map(|g| g.first_at_ms),
            }
        };
        let mut devices: Vec<DeviceView> = s
            .ledger
            .owners()
            .map(|(o, h)| DeviceView {
                owner: o.to_owned(),
                best_effort: h[0],
                priority: h[1],
            })
            .collect();
        devices.sort_by_key(|d| std::cmp::Reverse(d.best_effort.bytes + d.priority.bytes));
        devices.truncate(100);
        SpoolView {
            dir: self.inner.cfg.dir.display().to_string(),
            unavailable: s.broken.as_ref().map(|b| b.0.clone()),
            priority: class(Priority::Priority),
            best_effort: class(Priority::BestEffort),
            devices,
            max_bytes: self.inner.cfg.limits.max_bytes,
            max_records: self.inner.cfg.limits.max_records,
        }
    }
}
