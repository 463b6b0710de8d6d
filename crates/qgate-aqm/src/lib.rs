//! Sans-IO queue disciplines for qgate.
//!
//! A [`QueueDiscipline`] owns the packets waiting in front of a link transmitter. It has no clock
//! and no tasks: every call takes `now`, and every decision (accept, mark, drop) is returned to the
//! caller, who owns the link. The simulated network (`qgate-netsim`) and the gateway's egress
//! shaper drive the same implementations.
//!
//! Implemented: [`DropTail`] (by packets or bytes), [`Red`] (Floyd–Jacobson, gentle, ns-3
//! defaults), [`Pie`] (RFC 8033), [`Codel`] (RFC 8289, Linux arithmetic), [`FqCodel`]
//! (RFC 8290) and [`PidDelay`] (paper 004, and our stable variant). [`DisciplineSpec`] names any of them with its
//! parameters, from TOML or a `kind:key=value` string.

mod busy_guard;
mod codel;
mod droptail;
mod fifo;
mod fqcodel;
mod piddelay;
mod pie;
mod red;
mod rng;
mod spec;
pub mod stability;

pub use codel::{Codel, CodelParams, CodelQueue, CodelState};
pub use droptail::DropTail;
pub use fqcodel::{FqCodel, FqCodelParams};
pub use piddelay::{
    Branch, PidController, PidDelay, PidDelayParams, STABLE_BUSY, STABLE_KI_PER_KP, STABLE_KP,
    STABLE_MAX_ALLOWANCE_MS, STABLE_PHASE_MARGIN_DEG, STABLE_TARGET_MS,
};
pub use pie::{Pie, PieParams};
pub use red::{Red, RedParams};
pub use rng::SplitMix64;
pub use spec::{BuildContext, DisciplineSpec, SpecError, DEFAULT_PACKET_LIMIT};

use std::time::{Duration, Instant};

/// ECN codepoint carried in a packet's IP header (RFC 3168 §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Ecn {
    /// Not ECN-capable transport.
    #[default]
    NotEct,
    /// ECN-capable, ECT(0).
    Ect0,
    /// ECN-capable, ECT(1) (L4S).
    Ect1,
    /// Congestion experienced.
    Ce,
}

impl Ecn {
    /// Whether a discipline may mark this packet instead of dropping it (RFC 3168 §5).
    pub fn is_capable(self) -> bool {
        !matches!(self, Ecn::NotEct)
    }
}

/// A packet as a queue discipline sees it: its size, its flow and its ECN field, plus the
/// caller's payload, which the discipline never looks at.
#[derive(Debug, Clone)]
pub struct Packet<T> {
    /// Size on the wire in bytes (what byte limits and rates count).
    pub size: usize,
    /// A hash of the flow's 5-tuple, for flow-aware disciplines.
    pub flow: u64,
    /// The packet's ECN codepoint; a discipline that marks sets it to [`Ecn::Ce`].
    pub ecn: Ecn,
    /// When the packet entered the queue; set by the discipline on enqueue.
    pub enqueued_at: Option<Instant>,
    /// The caller's data.
    pub payload: T,
}

impl<T> Packet<T> {
    /// A packet of `size` bytes in flow `flow`, not ECN-capable.
    pub fn new(size: usize, flow: u64, payload: T) -> Self {
        Packet {
            size,
            flow,
            ecn: Ecn::NotEct,
            enqueued_at: None,
            payload,
        }
    }

    /// How long the packet has waited, if it has been enqueued.
    pub fn sojourn(&self, now: Instant) -> Duration {
        self.enqueued_at
            .map(|t| now.saturating_duration_since(t))
            .unwrap_or_default()
    }
}

/// Why a packet was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// The queue was at its packet or byte limit (tail drop, or FQ-CoDel's fattest-flow drop).
    Overflow,
    /// The active queue management chose to drop (early drop, control-law drop).
    Aqm,
}

/// What happened to a packet offered to [`QueueDiscipline::enqueue`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Queued unchanged.
    Enqueued,
    /// Queued with its ECN field set to CE instead of being dropped.
    Marked,
    /// Not queued; the packet is in the drop list.
    Dropped(DropReason),
}

/// A packet a discipline dropped, with the reason.
#[derive(Debug, Clone)]
pub struct Dropped<T> {
    /// The dropped packet.
    pub packet: Packet<T>,
    /// Why it was dropped.
    pub reason: DropReason,
}

/// Current queue occupancy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Packets waiting.
    pub packets: usize,
    /// Bytes waiting.
    pub bytes: usize,
}

/// Counters every discipline keeps. Invariant: `enqueued = dequeued + dropped_after_enqueue +
/// backlog.packets`, and every offered packet is either enqueued or counted in a drop counter once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Packets offered to `enqueue`.
    pub offered: u64,
    /// Packets that entered the queue.
    pub enqueued: u64,
    /// Packets handed to the transmitter.
    pub dequeued: u64,
    /// Bytes handed to the transmitter.
    pub dequeued_bytes: u64,
    /// Packets dropped because a limit was reached.
    pub dropped_overflow: u64,
    /// Packets dropped by the AQM's decision.
    pub dropped_aqm: u64,
    /// Packets dropped after they had been queued (head drops, fattest-flow drops).
    pub dropped_after_enqueue: u64,
    /// Packets marked CE instead of dropped.
    pub marked: u64,
    /// The largest backlog seen, in packets.
    pub max_backlog_packets: usize,
    /// The largest backlog seen, in bytes.
    pub max_backlog_bytes: usize,
}

impl QueueStats {
    /// Count one dropped packet under its reason.
    pub fn count_drop(&mut self, reason: DropReason) {
        match reason {
            DropReason::Overflow => self.dropped_overflow += 1,
            DropReason::Aqm => self.dropped_aqm += 1,
        }
    }

    /// Record the backlog after an enqueue, for the high-water marks.
    pub fn observe_backlog(&mut self, backlog: Backlog) {
        self.max_backlog_packets = self.max_backlog_packets.max(backlog.packets);
        self.max_backlog_bytes = self.max_backlog_bytes.max(backlog.bytes);
    }
}

/// A queue in front of a link transmitter.
///
/// Sans-IO: the caller passes `now` to every call and receives every decision. Dropped packets
/// are appended to `dropped` (the arriving packet on a tail drop, or queued packets on a head or
/// fattest-flow drop), so the caller can count and trace each one exactly once.
pub trait QueueDiscipline<T>: Send {
    /// The discipline's short name (`droptail`, `red`, `pie`, `codel`, `fq-codel`, `pid-delay`,
    /// `pid-delay-stable`).
    fn name(&self) -> &'static str;

    /// Offer a packet arriving at `now`.
    fn enqueue(
        &mut self,
        now: Instant,
        packet: Packet<T>,
        dropped: &mut Vec<Dropped<T>>,
    ) -> Verdict;

    /// Take the next packet to transmit at `now`, or `None` if the queue is empty. Packets the
    /// discipline drops at the head on the way are appended to `dropped`. The caller asks when
    /// its transmitter is free (a work-conserving link), so `None` means the link idles until
    /// the next enqueue: PID-Delay's busy-time guard measures idle time that way.
    fn dequeue(&mut self, now: Instant, dropped: &mut Vec<Dropped<T>>) -> Option<Packet<T>>;

    /// Packets and bytes waiting.
    fn backlog(&self) -> Backlog;

    /// The discipline's counters.
    fn stats(&self) -> QueueStats;

    /// The probability with which the discipline currently signals congestion (drops or
    /// marks) an arriving packet, for disciplines that keep one as their state (PIE's p,
    /// PID-Delay's U); `None` for the others. The lab traces it.
    fn signal_probability(&self) -> Option<f64> {
        None
    }

    /// The queue delay the discipline currently steers toward, for disciplines whose target
    /// moves (the stable PID-Delay's τ0 plus its busy-time guard's allowance); `None` for the
    /// others. The lab traces it.
    fn target_delay(&self) -> Option<Duration> {
        None
    }
}
