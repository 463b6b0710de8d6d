//! Careful resume (RFC 9959) over a congestion controller: a new connection starts at the
//! initial window, confirms that the path's RTT is still the one its history was recorded at,
//! then jumps to half the recorded capacity, paced by the sender, and either validates the jump
//! or retreats to half of what it had validated. Decision H9.
//!
//! This is the decision loop only. The shell (qgate-transport's `window_history` controller)
//! feeds it the controller events quinn gives, asks [`CarefulResume::window`] for the window
//! while a careful phase owns it (`None`: the wrapped controller is in charge), and, when a
//! phase ends, carries out the returned [`Handover`].
//!
//! Phases (RFC 9959 §3):
//! - *Reconnaissance*: the wrapped controller runs from its initial window. An RTT sample above
//!   `rtt_factor` × the saved minimum RTT (after [`ACK_DELAY_ALLOWANCE`]), a minimum at or below
//!   half of it, or any congestion ends careful resume (Normal, nothing rebuilt). Once the
//!   initial window's worth is acknowledged, or all that was in flight but one datagram,
//!   *Unvalidated* (unless the controller's own window already reaches the jump).
//! - *Unvalidated*: window = saved.capacity / 2, not grown; the pipe size starts at the flight
//!   size and grows with every acknowledged byte. It ends when a packet sent since the jump is
//!   acknowledged (packet numbers, as the RFC counts), or one smoothed RTT after the jump (also
//!   checked when the sender next sends, so an idle connection does not keep an old jump): a
//!   flight under the initial window or within the pipe size means the jump was not used, and
//!   the controller takes over at max(pipe, initial window); otherwise the window becomes the
//!   flight size and *Validating* grows it by slow start until the last packet sent while
//!   unvalidated is acknowledged (or nothing is in flight), when the controller takes over at
//!   that window.
//! - *Safe retreat*, on any congestion signal or an RTT sample above the factor while
//!   unvalidated or validating: window = half the pipe size at that moment (at least
//!   `min_window`), not grown, until the last unvalidated packet is acknowledged (or nothing is
//!   in flight); then a controller built at that pipe size takes one congestion event, so its own
//!   decrease sets its window and threshold (CUBIC: 0.7 × pipe; RFC 9959 sets the threshold at
//!   β × pipe and lets slow start climb there from pipe / 2, which this skips).
//! - Persistent congestion while a careful phase owns the window hands the event to a fresh
//!   controller (its minimum window); in reconnaissance the controller already has it.

// `Instant` is the controller trait's own type: quinn passes the times in (virtual under a
// paused clock); nothing here reads a clock.
use std::time::{Duration, Instant};

/// What a connection's history holds for its peer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Saved {
    /// Bytes the path delivered per minimum RTT at the recorded connections' best (RFC 9959
    /// §3.1 saved_cwnd), at most twice the history's ceiling (the table clamps it: the
    /// ceiling is RFC 9959's max_jump).
    pub capacity: u64,
    /// The recorded connections' recent minimum RTT (saved_rtt).
    pub rtt: Duration,
}

/// Settings of one connection's careful resume.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// The controller's initial window, bytes.
    pub initial_window: u64,
    /// An RTT sample above this × the saved RTT means the path changed.
    pub rtt_factor: f64,
    /// The least window a retreat leaves (RFC 9002 §7.2: two datagrams).
    pub min_window: u64,
}

/// RFC 9959 §4.2.1: a current RTT more than ten times the saved one indicates a path change.
/// Our default factor is the stricter history safeguard's (H4); this is the bound without one.
pub const RFC_RTT_FACTOR: f64 = 10.0;

/// A sample is send → acknowledgement, so it includes the peer's delay in acknowledging, up to
/// its max_ack_delay (RFC 9000 §18.2's default, 25 ms, which quinn uses): that much is not
/// counted against the path.
pub const ACK_DELAY_ALLOWANCE: Duration = Duration::from_millis(25);

/// The phase a connection is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// At the initial window, checking the path.
    Reconnaissance,
    /// At the jump window, paced; nothing validated yet.
    Unvalidated,
    /// The jump is being acknowledged; the window grows by slow start.
    Validating,
    /// Congestion or RTT growth during the jump: at half the validated pipe until the jump's
    /// packets are settled.
    SafeRetreat,
    /// Careful resume is over: the controller is in charge.
    Normal,
}

/// How a careful phase hands the window back to the controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handover {
    /// Build a fresh controller with this initial window…
    pub window: u64,
    /// …then give it this congestion event, if any (`Some(persistent)`).
    pub congestion: Option<bool>,
}

/// How careful resume ended (for metrics and logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Still running, never started (no usable history) or not needed (the controller's own
    /// window reached the jump first).
    None,
    /// The path's RTT was not the saved one: no jump.
    PathChanged,
    /// Congestion before the jump: no jump.
    CongestedBeforeJump,
    /// The sender did not use the jump (it had less to send).
    Unused,
    /// The jump was acknowledged: validated.
    Validated,
    /// The jump met congestion or RTT growth: safe retreat.
    Retreated,
}

/// One connection's careful-resume state.
#[derive(Debug, Clone)]
pub struct CarefulResume {
    saved: Saved,
    params: Params,
    phase: Phase,
    outcome: Outcome,
    /// The window while a careful phase owns it.
    cwnd: u64,
    /// Bytes acknowledged since the jump, plus the flight at the jump (RFC 9959 PipeSize).
    pipe: u64,
    /// The pipe size when the retreat began.
    retreat_pipe: u64,
    /// Bytes acknowledged in reconnaissance.
    acked: u64,
    /// Bytes in flight at the last acknowledgement batch.
    in_flight: u64,
    /// When the jump happened, and the smoothed RTT then.
    jumped: Option<(Instant, Duration)>,
    /// The first and the last packet number sent while unvalidated.
    first_pn: Option<u64>,
    last_pn: Option<u64>,
    /// An RTT sample showed a path change while the jump was unvalidated or validating.
    rtt_grew: bool,
    /// Smallest RTT sample so far.
    min_rtt: Option<Duration>,
}

impl CarefulResume {
    /// Careful resume towards `saved`; [`Phase::Normal`] from the start when the jump would not
    /// exceed the initial window (nothing to resume).
    pub fn new(saved: Saved, params: Params) -> Self {
        let phase = if saved.capacity / 2 > params.initial_window && !saved.rtt.is_zero() {
            Phase::Reconnaissance
        } else {
            Phase::Normal
        };
        CarefulResume {
            saved,
            params,
            phase,
            outcome: Outcome::None,
            cwnd: params.initial_window,
            pipe: 0,
            retreat_pipe: 0,
            acked: 0,
            in_flight: 0,
            jumped: None,
            first_pn: None,
            last_pn: None,
            rtt_grew: false,
            min_rtt: None,
        }
    }

    /// The window to jump to.
    pub fn jump_window(&self) -> u64 {
        self.saved.capacity / 2
    }

    /// The phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// How it ended.
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// The window while a careful phase owns it; `None` while the controller is in charge.
    pub fn window(&self) -> Option<u64> {
        match self.phase {
            Phase::Unvalidated | Phase::Validating | Phase::SafeRetreat => Some(self.cwnd),
            Phase::Reconnaissance | Phase::Normal => None,
        }
    }

    fn end(&mut self, outcome: Outcome) {
        self.phase = Phase::Normal;
        self.outcome = outcome;
    }

    /// A transmission ending with packet number `pn` left at `now`. Returns the hand-over when
    /// an unused jump has outlived its round trip.
    pub fn on_sent(&mut self, now: Instant, pn: u64) -> Option<Handover> {
        if self.phase != Phase::Unvalidated {
            return None;
        }
        if self.first_pn.is_none() && self.overdue(now) {
            // The connection idled past the jump's round trip: the path was checked too long
            // ago for the jump.
            return self.finish_unvalidated();
        }
        self.first_pn.get_or_insert(pn);
        self.last_pn = Some(pn);
        None
    }

    fn overdue(&self, now: Instant) -> bool {
        self.jumped
            .is_some_and(|(at, rtt)| now.saturating_duration_since(at) > rtt)
    }

    /// A packet sent at `sent` and carrying `bytes` was acknowledged at `now`; `app_limited`:
    /// the sender was not using its window.
    pub fn on_ack(&mut self, now: Instant, sent: Instant, bytes: u64, app_limited: bool) {
        let sample = now.saturating_duration_since(sent);
        self.min_rtt = Some(self.min_rtt.map_or(sample, |m| m.min(sample)));
        let changed = sample.saturating_sub(ACK_DELAY_ALLOWANCE).as_secs_f64()
            > self.params.rtt_factor * self.saved.rtt.as_secs_f64();
        match self.phase {
            Phase::Reconnaissance if changed => self.end(Outcome::PathChanged),
            Phase::Reconnaissance => self.acked += bytes,
            Phase::Unvalidated => {
                self.pipe += bytes;
                self.rtt_grew |= changed;
            }
            Phase::Validating => {
                self.pipe += bytes;
                self.rtt_grew |= changed;
                if !app_limited {
                    self.cwnd += bytes; // slow start (RFC 9959 §3.4)
                }
            }
            Phase::SafeRetreat | Phase::Normal => {}
        }
    }

    /// The acknowledgement batch ended at `now`: `in_flight` bytes outstanding, `largest` the
    /// largest packet number it acknowledged, `window` the controller's own window, and this
    /// smoothed RTT (zero if none yet). Returns the hand-over when a careful phase ends here.
    pub fn on_end_acks(
        &mut self,
        now: Instant,
        in_flight: u64,
        largest: Option<u64>,
        window: u64,
        smoothed_rtt: Duration,
    ) -> Option<Handover> {
        self.in_flight = in_flight;
        let reached = |pn: Option<u64>| matches!((largest, pn), (Some(l), Some(p)) if l >= p);
        // Everything sent is settled (acknowledged or declared lost).
        let settled = |pn: Option<u64>| reached(pn) || in_flight == 0;
        match self.phase {
            Phase::Reconnaissance => {
                // RFC 9959 §3.2: once the initial data is acknowledged the sender MAY jump; it
                // need not wait until it is limited by its window (§4.2 allows the wait). A
                // QUIC server's first flight ends with a 1-RTT packet (new connection IDs) that
                // the client acknowledges a round trip after the handshake: up to one datagram
                // (half the minimum window) may still be out.
                let confirmed = self.acked >= self.params.initial_window
                    || (self.acked > 0 && in_flight <= self.params.min_window / 2);
                if !confirmed {
                    return None;
                }
                // RFC 9959 §3.2: a minimum RTT at or below half the saved one is another path.
                if self
                    .min_rtt
                    .is_some_and(|m| m.as_secs_f64() <= self.saved.rtt.as_secs_f64() / 2.0)
                {
                    self.end(Outcome::PathChanged);
                    return None;
                }
                if window >= self.jump_window() {
                    self.end(Outcome::None); // slow start got there first
                    return None;
                }
                self.phase = Phase::Unvalidated;
                self.cwnd = self.jump_window();
                self.pipe = in_flight;
                let rtt = if smoothed_rtt.is_zero() {
                    self.saved.rtt
                } else {
                    smoothed_rtt
                };
                self.jumped = Some((now, rtt));
                None
            }
            Phase::Unvalidated => {
                if self.rtt_grew {
                    return self.retreat();
                }
                if reached(self.first_pn) || self.overdue(now) {
                    return self.finish_unvalidated();
                }
                None
            }
            Phase::Validating => {
                if self.rtt_grew {
                    return self.retreat();
                }
                if !settled(self.last_pn) {
                    return None;
                }
                self.end(Outcome::Validated);
                Some(Handover {
                    window: self.cwnd,
                    congestion: None,
                })
            }
            Phase::SafeRetreat => settled(self.last_pn).then(|| self.leave_retreat()),
            Phase::Normal => None,
        }
    }

    /// The unvalidated phase is over: either the jump was not used, or validating begins at
    /// the flight size (RFC 9959 §3.3).
    fn finish_unvalidated(&mut self) -> Option<Handover> {
        let iw = self.params.initial_window;
        let flight = self.in_flight;
        if flight < iw || flight <= self.pipe || self.first_pn.is_none() {
            self.end(Outcome::Unused);
            return Some(Handover {
                window: self.pipe.max(iw),
                congestion: None,
            });
        }
        self.cwnd = flight;
        self.phase = Phase::Validating;
        None
    }

    /// Enter safe retreat: half the pipe, at least the minimum window.
    fn retreat(&mut self) -> Option<Handover> {
        self.phase = Phase::SafeRetreat;
        self.outcome = Outcome::Retreated;
        self.retreat_pipe = self.pipe.max(self.params.min_window);
        self.cwnd = (self.pipe / 2).max(self.params.min_window);
        // The retreat waits for the last unvalidated packet; if none was sent it is over.
        if self.last_pn.is_none() {
            return Some(self.leave_retreat());
        }
        None
    }

    fn leave_retreat(&mut self) -> Handover {
        self.end(Outcome::Retreated);
        Handover {
            window: self.retreat_pipe,
            congestion: Some(false),
        }
    }

    /// A congestion signal (a loss, an ECN mark; `persistent` congestion).
    pub fn on_congestion(&mut self, persistent: bool) -> Option<Handover> {
        match self.phase {
            Phase::Normal => None,
            Phase::Reconnaissance => {
                self.end(Outcome::CongestedBeforeJump);
                None
            }
            Phase::Unvalidated | Phase::Validating | Phase::SafeRetreat if persistent => {
                self.end(Outcome::Retreated);
                Some(Handover {
                    window: self.params.initial_window,
                    congestion: Some(true),
                })
            }
            Phase::Unvalidated | Phase::Validating => self.retreat(),
            Phase::SafeRetreat => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IW: u64 = 12_000;
    const RTT: Duration = Duration::from_millis(40);

    fn cr(capacity: u64) -> CarefulResume {
        CarefulResume::new(
            Saved { capacity, rtt: RTT },
            Params {
                initial_window: IW,
                rtt_factor: 2.0,
                min_window: 2_400,
            },
        )
    }

    fn ms(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    /// Reconnaissance: packets 0–9 (the initial window) sent at 0, all acknowledged at `rtt_ms`.
    fn confirm(c: &mut CarefulResume, t0: Instant, rtt_ms: u64) -> Option<Handover> {
        for pn in 0..10 {
            assert_eq!(c.on_sent(t0, pn), None);
        }
        c.on_ack(ms(t0, rtt_ms), t0, IW, false);
        let rtt = Duration::from_millis(rtt_ms);
        c.on_end_acks(ms(t0, rtt_ms), 0, Some(9), IW, rtt)
    }

    /// The jump's packets 10–19, 20 kB each, sent 4 ms apart from 40 ms.
    fn send_jump(c: &mut CarefulResume, t0: Instant) {
        for i in 0..10 {
            assert_eq!(c.on_sent(ms(t0, 40 + 4 * i), 10 + i), None);
        }
    }

    #[test]
    fn nothing_to_resume_when_half_the_capacity_is_not_above_the_initial_window() {
        assert_eq!(cr(2 * IW).phase(), Phase::Normal);
        assert_eq!(cr(2 * IW + 2).phase(), Phase::Reconnaissance);
        let zero_rtt = CarefulResume::new(
            Saved {
                capacity: 1 << 20,
                rtt: Duration::ZERO,
            },
            cr(0).params,
        );
        assert_eq!((zero_rtt.phase(), zero_rtt.window()), (Phase::Normal, None));
    }

    #[test]
    fn a_confirmed_path_jumps_to_half_the_capacity_and_validates() {
        let t0 = Instant::now();
        let mut c = cr(400_000);
        assert_eq!(c.window(), None, "the controller runs reconnaissance");
        assert_eq!(confirm(&mut c, t0, 40), None);
        assert_eq!(c.phase(), Phase::Unvalidated);
        assert_eq!(c.window(), Some(200_000));
        send_jump(&mut c, t0);
        // Packet 10 acknowledged: the flight (180 kB) is above the pipe (20 kB): validating.
        c.on_ack(ms(t0, 81), ms(t0, 40), 20_000, false);
        assert_eq!(c.on_end_acks(ms(t0, 81), 180_000, Some(10), IW, RTT), None);
        assert_eq!(c.phase(), Phase::Validating);
        assert_eq!(c.window(), Some(180_000));
        // Validating grows by slow start until the last unvalidated packet (19) is acknowledged.
        c.on_ack(ms(t0, 90), ms(t0, 44), 20_000, false);
        assert_eq!(c.on_end_acks(ms(t0, 90), 160_000, Some(11), IW, RTT), None);
        assert_eq!(c.window(), Some(200_000));
        c.on_ack(ms(t0, 120), ms(t0, 76), 20_000, false);
        let h = c.on_end_acks(ms(t0, 120), 40_000, Some(19), IW, RTT);
        assert_eq!(
            h,
            Some(Handover {
                window: 220_000,
                congestion: None
            })
        );
        assert_eq!(
            (c.phase(), c.outcome()),
            (Phase::Normal, Outcome::Validated)
        );
        assert_eq!(c.window(), None);
    }

    #[test]
    fn packets_are_told_apart_by_number_not_by_send_time() {
        // With a paused clock a reconnaissance packet and the jump's first share a time stamp:
        // the acknowledgement of the earlier one must not end the unvalidated phase.
        let t0 = Instant::now();
        let mut c = cr(400_000);
        for pn in 0..10 {
            c.on_sent(t0, pn);
        }
        c.on_ack(ms(t0, 40), t0, IW, false);
        c.on_end_acks(ms(t0, 40), 2_400, Some(7), IW, RTT); // 8, 9 still out
        assert_eq!(c.phase(), Phase::Unvalidated);
        c.on_sent(ms(t0, 40), 10);
        c.on_sent(ms(t0, 40), 11);
        c.on_ack(ms(t0, 41), t0, 2_400, false);
        assert_eq!(c.on_end_acks(ms(t0, 41), 40_000, Some(9), IW, RTT), None);
        assert_eq!(c.phase(), Phase::Unvalidated, "9 was sent before the jump");
        c.on_ack(ms(t0, 80), ms(t0, 40), 20_000, false);
        c.on_end_acks(ms(t0, 80), 60_000, Some(10), IW, RTT);
        assert_eq!(c.phase(), Phase::Validating);
    }

    #[test]
    fn the_rtt_check_uses_the_factor_and_half_the_saved_rtt() {
        let t0 = Instant::now();
        // 106 ms − the 25 ms ack-delay allowance > 2 × 40 ms: another path, no jump, nothing
        // rebuilt.
        let mut c = cr(400_000);
        assert_eq!(confirm(&mut c, t0, 106), None);
        assert_eq!(
            (c.phase(), c.outcome()),
            (Phase::Normal, Outcome::PathChanged)
        );
        // Exactly 2 × is still the path.
        let mut c = cr(400_000);
        confirm(&mut c, t0, 105);
        assert_eq!(c.phase(), Phase::Unvalidated);
        // A minimum at half the saved RTT is a different (shorter) path.
        let mut c = cr(400_000);
        confirm(&mut c, t0, 20);
        assert_eq!(
            (c.phase(), c.outcome()),
            (Phase::Normal, Outcome::PathChanged)
        );
        let mut c = cr(400_000);
        confirm(&mut c, t0, 21);
        assert_eq!(c.phase(), Phase::Unvalidated);
    }

    #[test]
    fn reconnaissance_waits_for_the_initial_data_to_be_acknowledged() {
        let t0 = Instant::now();
        let mut c = cr(400_000);
        c.on_sent(t0, 0);
        c.on_ack(ms(t0, 40), t0, IW / 2, false);
        assert_eq!(c.on_end_acks(ms(t0, 40), IW / 2, Some(0), IW, RTT), None);
        assert_eq!(
            c.phase(),
            Phase::Reconnaissance,
            "half the window acknowledged"
        );
        c.on_ack(ms(t0, 41), t0, IW / 2, false);
        assert_eq!(c.on_end_acks(ms(t0, 41), IW, Some(1), IW, RTT), None);
        assert_eq!(c.phase(), Phase::Unvalidated);
        // A sender with less than the initial window out confirms once at most one datagram
        // (half the minimum window) is in flight: a server's handshake flight.
        let mut c = cr(400_000);
        c.on_ack(ms(t0, 40), t0, 3_000, false);
        c.on_end_acks(ms(t0, 40), 1_201, Some(0), IW, RTT);
        assert_eq!(c.phase(), Phase::Reconnaissance);
        c.on_end_acks(ms(t0, 41), 1_200, Some(1), IW, RTT);
        assert_eq!(c.phase(), Phase::Unvalidated);
    }

    #[test]
    fn no_jump_when_the_controller_already_reached_it() {
        let t0 = Instant::now();
        let mut c = cr(100_000);
        c.on_ack(ms(t0, 40), t0, IW, false);
        assert_eq!(c.on_end_acks(ms(t0, 40), 0, Some(9), 50_000, RTT), None);
        assert_eq!((c.phase(), c.outcome()), (Phase::Normal, Outcome::None));
    }

    #[test]
    fn congestion_before_the_jump_ends_careful_resume_without_a_rebuild() {
        let mut c = cr(400_000);
        assert_eq!(c.on_congestion(false), None);
        assert_eq!(
            (c.phase(), c.outcome()),
            (Phase::Normal, Outcome::CongestedBeforeJump)
        );
        let mut c = cr(400_000);
        assert_eq!(
            c.on_congestion(true),
            None,
            "persistent, controller in charge"
        );
        assert_eq!(c.phase(), Phase::Normal);
    }

    #[test]
    fn a_loss_in_the_jump_retreats_to_half_the_pipe_until_the_jump_settles() {
        let t0 = Instant::now();
        let mut c = cr(400_000);
        confirm(&mut c, t0, 40);
        send_jump(&mut c, t0);
        c.on_ack(ms(t0, 81), ms(t0, 40), 20_000, false);
        c.on_end_acks(ms(t0, 81), 180_000, Some(10), IW, RTT);
        c.on_ack(ms(t0, 85), ms(t0, 44), 20_000, false);
        // Any loss now, even of a packet sent before the jump, is a congestion signal.
        assert_eq!(c.on_congestion(false), None);
        assert_eq!(c.phase(), Phase::SafeRetreat);
        assert_eq!(c.window(), Some(20_000), "pipe 40 kB / 2");
        // Neither the window nor what the hand-over starts from grows while the jump settles.
        c.on_ack(ms(t0, 95), ms(t0, 52), 20_000, false);
        assert_eq!(c.on_congestion(false), None);
        assert_eq!(c.on_end_acks(ms(t0, 95), 100_000, Some(12), IW, RTT), None);
        assert_eq!(c.window(), Some(20_000));
        c.on_ack(ms(t0, 120), ms(t0, 76), 20_000, false);
        let h = c.on_end_acks(ms(t0, 120), 20_000, Some(19), IW, RTT);
        assert_eq!(
            h,
            Some(Handover {
                window: 40_000,
                congestion: Some(false)
            }),
            "the controller's own decrease from the pipe at the loss"
        );
        assert_eq!(c.outcome(), Outcome::Retreated);
    }

    #[test]
    fn nothing_in_flight_also_ends_the_retreat() {
        let t0 = Instant::now();
        let mut c = cr(400_000);
        confirm(&mut c, t0, 40);
        c.on_sent(ms(t0, 40), 10);
        c.on_sent(ms(t0, 50), 11);
        assert_eq!(c.on_congestion(false), None);
        assert_eq!(
            c.window(),
            Some(2_400),
            "nothing validated: the minimum window"
        );
        assert_eq!(c.on_end_acks(ms(t0, 90), 1_200, Some(10), IW, RTT), None);
        let h = c.on_end_acks(ms(t0, 95), 0, Some(10), IW, RTT);
        assert_eq!(h.map(|h| h.congestion), Some(Some(false)));
        assert_eq!(c.phase(), Phase::Normal);
    }

    #[test]
    fn rtt_growth_in_the_jump_retreats() {
        let t0 = Instant::now();
        let mut c = cr(400_000);
        confirm(&mut c, t0, 40);
        c.on_sent(ms(t0, 40), 10);
        c.on_sent(ms(t0, 60), 11);
        // The jump's first packet comes back after 110 ms − 25 > 2 × 40.
        c.on_ack(ms(t0, 150), ms(t0, 40), 20_000, false);
        assert_eq!(c.on_end_acks(ms(t0, 150), 20_000, Some(10), IW, RTT), None);
        assert_eq!((c.phase(), c.window()), (Phase::SafeRetreat, Some(10_000)));
    }

    #[test]
    fn an_unused_jump_resumes_from_what_was_delivered() {
        let t0 = Instant::now();
        let mut c = cr(400_000);
        confirm(&mut c, t0, 40);
        c.on_sent(ms(t0, 40), 10);
        c.on_ack(ms(t0, 80), ms(t0, 40), 5_000, true);
        assert_eq!(
            c.on_end_acks(ms(t0, 80), 0, Some(10), IW, RTT),
            Some(Handover {
                window: IW,
                congestion: None
            })
        );
        assert_eq!(c.outcome(), Outcome::Unused);
    }

    #[test]
    fn an_idle_connection_does_not_keep_an_old_jump() {
        let t0 = Instant::now();
        let mut c = cr(400_000);
        confirm(&mut c, t0, 40);
        assert_eq!(c.window(), Some(200_000));
        // Nothing to send for a minute; the next packet must not go out at the jump.
        let h = c.on_sent(ms(t0, 60_000), 10);
        assert_eq!(
            h,
            Some(Handover {
                window: IW,
                congestion: None
            })
        );
        assert_eq!((c.phase(), c.outcome()), (Phase::Normal, Outcome::Unused));
        // Within the round trip the jump stands.
        let mut c = cr(400_000);
        confirm(&mut c, t0, 40);
        assert_eq!(c.on_sent(ms(t0, 79), 10), None);
        assert_eq!(c.phase(), Phase::Unvalidated);
    }

    #[test]
    fn persistent_congestion_in_a_careful_phase_hands_the_event_on() {
        let t0 = Instant::now();
        let mut c = cr(400_000);
        confirm(&mut c, t0, 40);
        c.on_sent(ms(t0, 40), 10);
        assert_eq!(
            c.on_congestion(true),
            Some(Handover {
                window: IW,
                congestion: Some(true)
            })
        );
        assert_eq!(c.phase(), Phase::Normal);
    }

    /// Random event sequences (packet numbers rising, time stamps often equal): the window is
    /// owned only in careful phases, is the jump while unvalidated, never grows in retreat nor
    /// above what the retreat began from, and a hand-over comes exactly once, when a careful
    /// phase ends.
    #[test]
    fn random_event_sequences_keep_the_invariants() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let t0 = Instant::now();
        let mut phases_seen = std::collections::HashSet::new();
        for _ in 0..3_000 {
            let cap = 10_000 + next(1_000_000);
            let mut c = cr(cap);
            let jump = c.jump_window();
            let (mut now, mut pn) = (0u64, 0u64);
            let mut out: Vec<(u64, u64)> = Vec::new(); // (pn, sent at)
            let mut handovers = 0;
            let mut was_careful = false;
            let mut retreat_start = None;
            for _ in 0..200 {
                now += next(3) * next(20); // often the same instant
                let before = (c.phase(), c.window());
                let h = match next(5) {
                    0 | 1 => {
                        pn += 1;
                        out.push((pn, now));
                        c.on_sent(ms(t0, now), pn)
                    }
                    2 if !out.is_empty() => {
                        let (_, at) = out.remove(next(out.len() as u64) as usize);
                        c.on_ack(ms(t0, now), ms(t0, at), 1_200, next(4) == 0);
                        None
                    }
                    3 => c.on_end_acks(
                        ms(t0, now),
                        out.len() as u64 * 6_000,
                        out.first().map(|p| p.0.saturating_sub(1)).or(Some(pn)),
                        IW + next(3) * 40_000,
                        Duration::from_millis(next(80)),
                    ),
                    _ if !out.is_empty() => {
                        out.remove(next(out.len() as u64) as usize);
                        c.on_congestion(next(20) == 0)
                    }
                    _ => None,
                };
                phases_seen.insert(format!("{:?}", c.phase()));
                was_careful |= c.window().is_some();
                if let Some(h) = h {
                    handovers += 1;
                    assert!(before.1.is_some(), "a hand-over only from a careful phase");
                    assert_eq!(c.phase(), Phase::Normal);
                    assert!(h.window >= 2_400);
                    if let Some(start) = retreat_start.filter(|_| h.congestion == Some(false)) {
                        assert!(h.window <= start, "{} > {start}", h.window);
                    }
                }
                if c.phase() == Phase::Unvalidated {
                    assert_eq!(c.window(), Some(jump));
                }
                if c.phase() == Phase::SafeRetreat && before.0 != Phase::SafeRetreat {
                    // Twice the retreat window, or the minimum: the pipe at the loss.
                    retreat_start = Some((c.window().unwrap() * 2 + 1).max(2_400));
                }
                if let ((Phase::SafeRetreat, Some(a)), Some(b)) = (before, c.window()) {
                    assert!(b <= a, "no growth in retreat");
                }
                if before.0 == Phase::Normal {
                    assert_eq!(c.phase(), Phase::Normal, "normal is final");
                }
            }
            if c.phase() == Phase::Normal && was_careful {
                assert_eq!(handovers, 1, "one hand-over per careful run");
            }
            assert!(handovers <= 1);
        }
        for p in [
            "Reconnaissance",
            "Unvalidated",
            "Validating",
            "SafeRetreat",
            "Normal",
        ] {
            assert!(
                phases_seen.contains(p),
                "{p} never reached: {phases_seen:?}"
            );
        }
    }
}
