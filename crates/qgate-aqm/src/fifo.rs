//! The FIFO and bookkeeping every single-queue discipline shares: admit with a timestamp,
//! refuse with a counted reason, mark or drop on an AQM signal, depart with counters.

use std::collections::VecDeque;
use std::time::Instant;

use crate::{Backlog, DropReason, Dropped, Ecn, Packet, QueueStats, Verdict};

/// A FIFO with its byte count.
#[derive(Debug)]
pub(crate) struct Fifo<T> {
    pub(crate) packets: VecDeque<Packet<T>>,
    pub(crate) bytes: usize,
}

impl<T> Default for Fifo<T> {
    fn default() -> Self {
        Fifo {
            packets: VecDeque::new(),
            bytes: 0,
        }
    }
}

impl<T> Fifo<T> {
    pub(crate) fn push(&mut self, p: Packet<T>) {
        self.bytes += p.size;
        self.packets.push_back(p);
    }

    pub(crate) fn pop(&mut self) -> Option<Packet<T>> {
        let p = self.packets.pop_front()?;
        self.bytes -= p.size;
        Some(p)
    }

    pub(crate) fn len(&self) -> usize {
        self.packets.len()
    }

    pub(crate) fn backlog(&self) -> Backlog {
        Backlog {
            packets: self.packets.len(),
            bytes: self.bytes,
        }
    }
}

/// A FIFO that keeps a discipline's counters.
#[derive(Debug)]
pub(crate) struct CountedFifo<T> {
    pub(crate) fifo: Fifo<T>,
    pub(crate) stats: QueueStats,
}

impl<T> Default for CountedFifo<T> {
    fn default() -> Self {
        CountedFifo {
            fifo: Fifo::default(),
            stats: QueueStats::default(),
        }
    }
}

impl<T> CountedFifo<T> {
    /// Count an arrival (every packet offered to `enqueue`).
    pub(crate) fn offered(&mut self) {
        self.stats.offered += 1;
    }

    /// Refuse `packet` for `reason`: count it and hand it to the caller's drop list.
    pub(crate) fn reject(
        &mut self,
        packet: Packet<T>,
        reason: DropReason,
        dropped: &mut Vec<Dropped<T>>,
    ) -> Verdict {
        self.stats.count_drop(reason);
        dropped.push(Dropped { packet, reason });
        Verdict::Dropped(reason)
    }

    /// An AQM congestion signal for an arriving packet: mark it CE when `may_mark` and it is
    /// ECN-capable (it is then still to be queued: `Ok`), else drop it (`Err` with the verdict).
    pub(crate) fn signal(
        &mut self,
        mut packet: Packet<T>,
        may_mark: bool,
        dropped: &mut Vec<Dropped<T>>,
    ) -> Result<Packet<T>, Verdict> {
        if may_mark && packet.ecn.is_capable() {
            packet.ecn = Ecn::Ce;
            self.stats.marked += 1;
            Ok(packet)
        } else {
            Err(self.reject(packet, DropReason::Aqm, dropped))
        }
    }

    /// Queue `packet`, stamped with `now`.
    pub(crate) fn admit(&mut self, now: Instant, mut packet: Packet<T>) {
        packet.enqueued_at = Some(now);
        self.fifo.push(packet);
        self.stats.enqueued += 1;
        self.stats.observe_backlog(self.fifo.backlog());
    }

    /// Take the head for transmission, counting it.
    pub(crate) fn depart(&mut self) -> Option<Packet<T>> {
        let p = self.fifo.pop()?;
        self.count_departure(&p);
        Some(p)
    }

    /// Count a packet handed to the transmitter.
    pub(crate) fn count_departure(&mut self, p: &Packet<T>) {
        self.stats.dequeued += 1;
        self.stats.dequeued_bytes += p.size as u64;
    }
}
