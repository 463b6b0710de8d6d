//! The model of one direction of a link, sans-IO: packets go in with [`LinkModel::send`], time
//! moves with [`LinkModel::handle_timeout`], packets come out with [`LinkModel::poll_deliver`].
//!
//! The simulator drives it from its event queue in virtual time; the real-time emulator drives
//! it from a relay thread's clock; the gateway's egress shaping drives it from its send path. Only
//! the clock differs, so the arithmetic (serialisation, delay, jitter, loss, queueing) exists
//! once.
//!
//! Polling order, as in quinn-proto: at time `now`, first [`LinkModel::handle_timeout`] (which
//! finishes every transmission due by `now`, each at its own scheduled instant, so a late caller
//! does not slow the link down), then [`LinkModel::send`] for packets arriving at `now`, then
//! [`LinkModel::poll_deliver`] until it returns `None`, then sleep until
//! [`LinkModel::poll_timeout`]. Time never goes backwards.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use qgate_aqm::{
    Backlog, BuildContext, DropReason, Dropped, Packet, QueueDiscipline, QueueStats, Verdict,
};
use rand::Rng;
use serde::Serialize;

use crate::{LinkParams, LinkStats, LossState};

/// What happened to a packet at a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TraceEvent {
    /// Entered the link's queue.
    Enqueue,
    /// Reached the far end of the link.
    Deliver,
    /// Dropped by the queue at its limit.
    DropOverflow,
    /// Dropped by the queue's AQM.
    DropAqm,
    /// Lost on the wire by the loss model.
    DropLoss,
    /// Lost because the link was down.
    DropDown,
}

impl TraceEvent {
    /// The name used in CSV traces.
    pub fn as_str(self) -> &'static str {
        match self {
            TraceEvent::Enqueue => "enqueue",
            TraceEvent::Deliver => "deliver",
            TraceEvent::DropOverflow => "drop-overflow",
            TraceEvent::DropAqm => "drop-aqm",
            TraceEvent::DropLoss => "drop-loss",
            TraceEvent::DropDown => "drop-down",
        }
    }
}

/// One observed event, with the queue's occupancy just after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkEvent {
    /// The event's exact time (not the time the caller got round to it).
    pub at: Instant,
    /// Packet size on the wire, bytes.
    pub size: usize,
    /// What happened.
    pub event: TraceEvent,
    /// Packets queued after the event.
    pub queue_packets: usize,
    /// Bytes queued after the event.
    pub queue_bytes: usize,
}

/// Queueing delays (time in queue, excluding transmission) of the packets the link dequeued,
/// with when they left; bounded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SojournLog {
    /// (dequeue time, sojourn), in order.
    pub samples: Vec<(Instant, Duration)>,
    /// Samples not kept because the limit was reached.
    pub truncated: u64,
    limit: usize,
}

/// One direction of a link: a queue discipline in front of a transmitter that clocks packets
/// out at the link's rate, then a wire that delays them (± jitter, never reordering) and loses
/// some. Generic over the caller's payload `P`, which it never reads.
pub struct LinkModel<P> {
    params: LinkParams,
    queue: Box<dyn QueueDiscipline<P>>,
    queue_seed: u64,
    /// The packet being clocked onto the wire and when it is done.
    tx: Option<(Packet<P>, Instant)>,
    /// Packets on the wire with their arrival times, nondecreasing.
    wire: VecDeque<(Instant, Packet<P>)>,
    loss: LossState,
    stats: LinkStats,
    /// CE marks made by queues this link has replaced (the current queue counts its own).
    marked_before: u64,
    sojourns: Option<SojournLog>,
    /// Events not yet taken by [`LinkModel::poll_event`], when observing.
    events: Option<VecDeque<LinkEvent>>,
    /// Scratch for the discipline's drops.
    drops: Vec<Dropped<P>>,
}

impl<P> std::fmt::Debug for LinkModel<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkModel")
            .field("params", &self.params)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<P: Send + 'static> LinkModel<P> {
    /// A link direction with these parameters; its queue discipline draws its random choices
    /// from `queue_seed`. The message names a bad parameter.
    pub fn new(params: LinkParams, queue_seed: u64) -> Result<Self, String> {
        params.validate()?;
        Ok(LinkModel {
            queue: params.queue.build(BuildContext {
                seed: queue_seed,
                link_rate_bps: params.rate_bps,
            }),
            params,
            queue_seed,
            tx: None,
            wire: VecDeque::new(),
            loss: LossState::default(),
            stats: LinkStats::default(),
            marked_before: 0,
            sojourns: None,
            events: None,
            drops: Vec::new(),
        })
    }

    /// Change the parameters at `now`. A new rate applies to packets that start transmitting
    /// afterwards; a new delay, jitter or loss to packets that finish transmitting afterwards.
    /// Taking the link down loses everything queued, being transmitted and on the wire (as
    /// `dropped_down`) and starts the queue discipline afresh (its control state described a
    /// link that is gone). A new queue discipline takes over the queued packets; they leave the
    /// old one through its dequeue, so an AQM may drop some of them on the way (counted as
    /// queue drops).
    pub fn set_params(&mut self, now: Instant, params: LinkParams) -> Result<(), String> {
        params.validate()?;
        let going_down = self.params.up && !params.up;
        let new_queue = self.params.queue != params.queue;
        self.params = params;
        if going_down {
            if let Some((p, _)) = self.tx.take() {
                self.lose_down(now, p.size);
            }
            while let Some((_, p)) = self.wire.pop_front() {
                self.lose_down(now, p.size);
            }
            // Empty the old discipline into the void: whatever it hands out or drops on the
            // way is lost to the outage, not to its AQM (and its marks no longer count).
            let fresh = self.build_queue();
            let mut old = std::mem::replace(&mut self.queue, fresh);
            self.marked_before += old.stats().marked;
            let mut dropped = Vec::new();
            while let Some(p) = old.dequeue(now, &mut dropped) {
                self.lose_down(now, p.size);
            }
            for d in dropped {
                self.lose_down(now, d.packet.size);
            }
        } else if new_queue {
            let fresh = self.build_queue();
            let mut old = std::mem::replace(&mut self.queue, fresh);
            while let Some(mut p) = old.dequeue(now, &mut self.drops) {
                p.enqueued_at = None;
                self.queue.enqueue(now, p, &mut self.drops);
            }
            self.marked_before += old.stats().marked;
            self.count_queue_drops(now);
        }
        Ok(())
    }

    /// A fresh queue discipline from the current parameters.
    fn build_queue(&self) -> Box<dyn QueueDiscipline<P>> {
        self.params.queue.build(BuildContext {
            seed: self.queue_seed,
            link_rate_bps: self.params.rate_bps,
        })
    }

    /// Start the largest-queue counters afresh from the current backlog (a warm-up ended).
    pub fn restart_peaks(&mut self) {
        let b = self.queue.backlog();
        self.stats.max_queue_packets = b.packets;
        self.stats.max_queue_bytes = b.bytes;
    }

    /// Offer a packet to the link at `now` (call [`LinkModel::handle_timeout`] for `now` first).
    pub fn send(&mut self, now: Instant, packet: Packet<P>) {
        let size = packet.size;
        self.stats.sent += 1;
        self.stats.sent_bytes += size as u64;
        if !self.params.up {
            self.lose_down(now, size);
            return;
        }
        let verdict = self.queue.enqueue(now, packet, &mut self.drops);
        let backlog = self.queue.backlog();
        self.stats.max_queue_packets = self.stats.max_queue_packets.max(backlog.packets);
        self.stats.max_queue_bytes = self.stats.max_queue_bytes.max(backlog.bytes);
        if !matches!(verdict, Verdict::Dropped(_)) {
            self.record(now, size, TraceEvent::Enqueue);
        }
        self.count_queue_drops(now);
        if self.tx.is_none() {
            self.start_next(now);
        }
    }

    /// When the link next needs [`LinkModel::handle_timeout`] or has a packet to deliver.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let tx = self.tx.as_ref().map(|(_, done)| *done);
        let wire = self.wire.front().map(|(at, _)| *at);
        match (tx, wire) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The earliest a packet can reach the far end: a lower bound on the next delivery. A
    /// caller that only delivers (the real-time relay) may sleep until this instead of
    /// [`LinkModel::poll_timeout`]: transmissions finished late are finished at their scheduled
    /// instants all the same, so the schedule is identical with one wake-up per delivery
    /// instead of two per packet.
    pub fn poll_delivery_timeout(&self) -> Option<Instant> {
        let tx = self.tx.as_ref().map(|(_, done)| {
            (*done + self.params.delay)
                .checked_sub(self.params.jitter)
                .map_or(*done, |t| t.max(*done))
        });
        let wire = self.wire.front().map(|(at, _)| *at);
        match (tx, wire) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Finish every transmission due by `now`, each at its scheduled instant: the loss model
    /// decides its fate, a survivor goes on the wire, and the next queued packet starts.
    pub fn handle_timeout(&mut self, now: Instant, rng: &mut impl Rng) {
        while let Some((_, done)) = self.tx.as_ref() {
            let done = *done;
            if done > now {
                break;
            }
            let (packet, _) = self.tx.take().expect("checked");
            let size = packet.size;
            if self.loss.lose(&self.params.loss, rng) {
                self.stats.dropped_loss += 1;
                self.stats.dropped_loss_bytes += size as u64;
                self.record(done, size, TraceEvent::DropLoss);
            } else {
                let mut arrive = done + self.params.delay;
                let j = self.params.jitter.as_nanos() as i64;
                if j > 0 {
                    let offset = rng.random_range(-j..=j);
                    let shift = Duration::from_nanos(offset.unsigned_abs());
                    arrive = if offset >= 0 {
                        arrive + shift
                    } else {
                        arrive.checked_sub(shift).unwrap_or(done).max(done)
                    };
                }
                // Jitter never reorders: a packet leaves the wire no earlier than the last.
                if let Some((last, _)) = self.wire.back() {
                    arrive = arrive.max(*last);
                }
                self.wire.push_back((arrive, packet));
            }
            self.start_next(done);
        }
    }

    /// The next packet that has reached the far end by `now`, with its exact arrival time.
    pub fn poll_deliver(&mut self, now: Instant) -> Option<(Instant, Packet<P>)> {
        if self.wire.front().is_none_or(|(at, _)| *at > now) {
            return None;
        }
        let (at, packet) = self.wire.pop_front().expect("checked");
        self.stats.delivered += 1;
        self.stats.delivered_bytes += packet.size as u64;
        self.record(at, packet.size, TraceEvent::Deliver);
        Some((at, packet))
    }

    /// The current parameters.
    pub fn params(&self) -> &LinkParams {
        &self.params
    }

    /// The link's counters.
    pub fn stats(&self) -> LinkStats {
        LinkStats {
            // Marks happen at enqueue (RED, PIE) or dequeue (CoDel, FQ-CoDel): the queue counts
            // both.
            marked: self.marked_before + self.queue.stats().marked,
            ..self.stats
        }
    }

    /// The queue discipline's own counters.
    pub fn queue_stats(&self) -> QueueStats {
        self.queue.stats()
    }

    /// The queue discipline's congestion-signal probability (PIE's p, PID-Delay's U), if it
    /// keeps one.
    pub fn signal_probability(&self) -> Option<f64> {
        self.queue.signal_probability()
    }

    /// The queue delay the discipline steers toward, if its target moves (the stable
    /// PID-Delay's busy-time guard).
    pub fn target_delay(&self) -> Option<Duration> {
        self.queue.target_delay()
    }

    /// What is queued now (not counting the packet being transmitted).
    pub fn backlog(&self) -> Backlog {
        self.queue.backlog()
    }

    /// Packets queued, being transmitted or on the wire.
    pub fn in_flight(&self) -> usize {
        self.queue.backlog().packets + usize::from(self.tx.is_some()) + self.wire.len()
    }

    /// Start logging the queueing delay of every dequeued packet (at most `limit` samples).
    pub fn log_sojourns(&mut self, limit: usize) {
        self.sojourns = Some(SojournLog {
            limit,
            ..Default::default()
        });
    }

    /// Take the queueing delays logged so far (logging continues).
    pub fn take_sojourns(&mut self) -> SojournLog {
        match self.sojourns.as_mut() {
            Some(log) => {
                let limit = log.limit;
                std::mem::replace(
                    log,
                    SojournLog {
                        limit,
                        ..Default::default()
                    },
                )
            }
            None => SojournLog::default(),
        }
    }

    /// Record events for [`LinkModel::poll_event`] (off by default: it costs a copy per event).
    pub fn observe(&mut self, on: bool) {
        self.events = on.then(VecDeque::new);
    }

    /// The oldest event not yet taken, when observing.
    pub fn poll_event(&mut self) -> Option<LinkEvent> {
        self.events.as_mut()?.pop_front()
    }

    fn record(&mut self, at: Instant, size: usize, event: TraceEvent) {
        if let Some(events) = self.events.as_mut() {
            let backlog = self.queue.backlog();
            events.push_back(LinkEvent {
                at,
                size,
                event,
                queue_packets: backlog.packets,
                queue_bytes: backlog.bytes,
            });
        }
    }

    fn lose_down(&mut self, now: Instant, size: usize) {
        self.stats.dropped_down += 1;
        self.record(now, size, TraceEvent::DropDown);
    }

    fn count_queue_drops(&mut self, now: Instant) {
        let mut drops = std::mem::take(&mut self.drops);
        for dropped in drops.drain(..) {
            self.stats.dropped_queue += 1;
            let ev = match dropped.reason {
                DropReason::Overflow => TraceEvent::DropOverflow,
                DropReason::Aqm => TraceEvent::DropAqm,
            };
            self.record(now, dropped.packet.size, ev);
        }
        self.drops = drops;
    }

    /// Put the next queued packet on the transmitter at `at`, if any.
    fn start_next(&mut self, at: Instant) {
        let next = self.queue.dequeue(at, &mut self.drops);
        self.count_queue_drops(at);
        if let Some(p) = next {
            if let Some(log) = self.sojourns.as_mut() {
                if log.samples.len() < log.limit {
                    log.samples.push((at, p.sojourn(at)));
                } else {
                    log.truncated += 1;
                }
            }
            let done = at + self.params.serialisation(p.size);
            self.tx = Some((p, done));
        }
    }
}

#[cfg(test)]
mod tests;
