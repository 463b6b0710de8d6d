//! What the spool holds, counted, and whether one more record may come in: the spool's policy,
//! sans-IO. Limits hold exactly because a record is counted when it is admitted, before its
//! write, and uncounted if the write fails.

use std::collections::HashMap;

use qgate_forward::scheduler::Priority;

use crate::config::{Limits, OnFull};

/// Records and bytes held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Held {
    /// Records.
    pub records: u64,
    /// Bytes on disk (frames).
    pub bytes: u64,
}

impl Held {
    fn add(&mut self, bytes: u64) {
        self.records += 1;
        self.bytes += bytes;
    }

    fn sub(&mut self, bytes: u64) {
        self.records = self.records.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(bytes);
    }
}

/// Why a record may not come in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its owner holds its whole share of the spool.
    Share,
    /// The spool is full and its class's policy is to refuse.
    Full,
}

/// The answer to a record that asks to come in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// It is counted: write it.
    Yes,
    /// The spool is full, and the class's policy drops the oldest best-effort records: drop at
    /// least this many best-effort bytes and records (one record at least), then ask again.
    MakeRoom,
    /// Refused.
    No(Refusal),
}

/// Index of a class in per-class arrays.
pub fn class_index(c: Priority) -> usize {
    usize::from(c == Priority::Priority)
}

/// The counts and the limits.
#[derive(Debug)]
pub struct Ledger {
    limits: Limits,
    total: Held,
    classes: [Held; 2],
    owners: HashMap<String, [Held; 2]>,
}

impl Ledger {
    /// Nothing held yet.
    pub fn new(limits: Limits) -> Ledger {
        Ledger {
            limits,
            total: Held::default(),
            classes: [Held::default(); 2],
            owners: HashMap::new(),
        }
    }

    /// Whether a record of `bytes` from `owner` in `class` may come in; counted if so.
    pub fn admit(&mut self, owner: &str, class: Priority, bytes: u64) -> Admit {
        let l = &self.limits;
        let mine = self.owners.get(owner).map_or(Held::default(), sum);
        if mine.records + 1 > l.device_records || mine.bytes + bytes > l.device_bytes {
            return Admit::No(Refusal::Share);
        }
        if self.total.records < l.max_records && self.total.bytes + bytes <= l.max_bytes {
            self.add(owner, class, bytes);
            return Admit::Yes;
        }
        let best_effort = self.classes[class_index(Priority::BestEffort)];
        // Room can be made only if dropping every best-effort record would make it.
        let could = best_effort.records > 0
            && self.total.bytes - best_effort.bytes + bytes <= l.max_bytes
            && bytes <= l.max_bytes;
        match l.on_full[class_index(class)] {
            OnFull::DropOldest if could => Admit::MakeRoom,
            _ => Admit::No(Refusal::Full),
        }
    }

    /// Count a record found at start.
    pub fn add(&mut self, owner: &str, class: Priority, bytes: u64) {
        let c = class_index(class);
        self.total.add(bytes);
        self.classes[c].add(bytes);
        self.owners.entry(owner.to_owned()).or_default()[c].add(bytes);
    }

    /// Count what an owner was found holding at start.
    pub fn add_held(&mut self, owner: &str, class: Priority, h: Held) {
        let c = class_index(class);
        for held in [&mut self.total, &mut self.classes[c]] {
            held.records += h.records;
            held.bytes += h.bytes;
        }
        let mine = &mut self.owners.entry(owner.to_owned()).or_default()[c];
        mine.records += h.records;
        mine.bytes += h.bytes;
    }

    /// Whether a record of `bytes` could ever come in: not larger than the spool or a
    /// device's share.
    pub fn fits(&self, bytes: u64) -> bool {
        bytes <= self.limits.max_bytes && bytes <= self.limits.device_bytes
    }

    /// A record left (delivered, dropped, expired) or its write failed.
    pub fn remove(&mut self, owner: &str, class: Priority, bytes: u64) {
        let c = class_index(class);
        self.total.sub(bytes);
        self.classes[c].sub(bytes);
        if let Some(h) = self.owners.get_mut(owner) {
            h[c].sub(bytes);
            if sum(h).records == 0 {
                self.owners.remove(owner);
            }
        }
    }

    /// Uncount everything `owner` holds in `class` (a purge); what it held.
    pub fn forget(&mut self, owner: &str, class: Priority) -> Held {
        let c = class_index(class);
        let Some(h) = self.owners.get_mut(owner) else {
            return Held::default();
        };
        let gone = std::mem::take(&mut h[c]);
        if sum(h).records == 0 {
            self.owners.remove(owner);
        }
        self.total.records -= gone.records;
        self.total.bytes -= gone.bytes;
        self.classes[c].records -= gone.records;
        self.classes[c].bytes -= gone.bytes;
        gone
    }

    /// Everything held.
    pub fn total(&self) -> Held {
        self.total
    }

    /// What one class holds.
    pub fn class(&self, c: Priority) -> Held {
        self.classes[class_index(c)]
    }

    /// What one owner holds, by class (best effort, priority).
    pub fn owner(&self, owner: &str) -> [Held; 2] {
        self.owners.get(owner).copied().unwrap_or_default()
    }

    /// Owners holding anything, with what they hold.
    pub fn owners(&self) -> impl Iterator<Item = (&str, [Held; 2])> {
        self.owners.iter().map(|(o, h)| (o.as_str(), *h))
    }
}

fn sum(h: &[Held; 2]) -> Held {
    Held {
        records: h[0].records + h[1].records,
        bytes: h[0].bytes + h[1].bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Priority::{BestEffort, Priority as Prio};

    fn limits() -> Limits {
        Limits {
            max_bytes: 1000,
            max_records: 10,
            device_bytes: 600,
            device_records: 6,
            on_full: [OnFull::DropOldest, OnFull::Refuse],
            ..Limits::default()
        }
    }

    #[test]
    fn limits_hold_exactly() {
        let mut l = Ledger::new(limits());
        for i in 0..6 {
            assert_eq!(l.admit("a", Prio, 10), Admit::Yes, "{i}");
        }
        // The owner's share: 6 records.
        assert_eq!(l.admit("a", Prio, 10), Admit::No(Refusal::Share));
        for _ in 0..4 {
            assert_eq!(l.admit("b", Prio, 10), Admit::Yes);
        }
        // 10 records: full; priority refuses.
        assert_eq!(l.admit("c", Prio, 10), Admit::No(Refusal::Full));
        // Best effort would drop, but there is no best effort to drop.
        assert_eq!(l.admit("c", BestEffort, 10), Admit::No(Refusal::Full));
        l.remove("b", Prio, 10);
        assert_eq!(l.admit("c", BestEffort, 10), Admit::Yes);
        assert_eq!(l.admit("c", BestEffort, 10), Admit::MakeRoom);
        assert_eq!(
            l.total(),
            Held {
                records: 10,
                bytes: 100
            }
        );
        // Bytes: one owner's share is 600.
        let mut l = Ledger::new(limits());
        assert_eq!(l.admit("a", Prio, 600), Admit::Yes);
        assert_eq!(l.admit("a", Prio, 1), Admit::No(Refusal::Share));
        assert_eq!(l.admit("b", Prio, 400), Admit::Yes);
        assert_eq!(l.admit("c", Prio, 1), Admit::No(Refusal::Full));
    }

    #[test]
    fn a_purge_uncounts_one_owners_class() {
        let mut l = Ledger::new(limits());
        l.add("a", Prio, 10);
        l.add("a", BestEffort, 20);
        l.add("b", BestEffort, 5);
        assert_eq!(
            l.forget("a", BestEffort),
            Held {
                records: 1,
                bytes: 20
            }
        );
        assert_eq!(
            l.class(BestEffort),
            Held {
                records: 1,
                bytes: 5
            }
        );
        assert_eq!(
            l.owner("a")[1],
            Held {
                records: 1,
                bytes: 10
            }
        );
        l.remove("a", Prio, 10);
        assert_eq!(l.owners().count(), 1);
    }
}
