//! Careful resume (RFC 9959) over a congestion controller: a new connection starts at the
//! initial window, confirms that the path's RTT is still the one its history was recorded at,
//! then jumps to half the recorded capacity, paced over one RTT, and either validates the jump
//! or retreats to half of what the jump delivered. Decision H9.
//!
//! This is the decision loop only. The shell (qgate-transport's history controller) feeds it
//! the controller events quinn gives, asks [`CarefulResume::window`] for the window while a
//! careful phase owns it (`None`: the wrapped controller is in charge and sees every event),
//! and, when a phase ends, carries out the returned [`Handover`].
//!
//! Phases (RFC 9959 §3): *Reconnaissance* — the wrapped controller runs from its initial window;
//! every RTT sample is checked against the recorded minimum RTT (`saved.rtt`). The first RTT
//! sample above `rtt_factor` × it (after [`ACK_DELAY_ALLOWANCE`]), a minimum at or below half of it, or a congestion signal ends
//! careful resume (Normal, nothing rebuilt). Once the initial window's worth is acknowledged (or
//! all that was sent), *Unvalidated*: window =
//! saved.capacity / 2; the pipe size starts at the flight size and grows with
//! every acknowledged byte; the window does not grow. It ends at the acknowledgement of the
//! first packet sent after the jump, or after one smoothed RTT: if the flight is then under the
//! initial window or within the pipe size, the window becomes max(pipe, initial window) and the
//! controller takes over; otherwise the window becomes the flight size and *Validating* grows it
//! by slow start until the last packet sent while unvalidated is acknowledged, when the
//! controller takes over at that window. A loss (or ECN mark) of a packet sent since the jump,
//! or an RTT sample above the factor, while unvalidated or validating: *Safe retreat* — window =
//! pipe / 2 (at least `min_window`), not grown, until the last unvalidated packet is acknowledged
//! or lost; then the controller takes over from the pipe size with its own multiplicative
//! decrease (its threshold at β × pipe, β ∈ [0.5, 1] as §3.5 asks: CUBIC's 0.7). Persistent
//! congestion in any phase hands the event to a fresh controller (its minimum window).

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
    /// A jump packet was lost: at half the validated pipe until the jump's packets are settled.
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

/// Why careful resume ended without a validated jump (for metrics and logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Still running, or never started (no usable history).
    None,
    /// The path's RTT was not the saved one: no jump.
    PathChanged,
    /// Congestion before the jump: no jump.
    CongestedBeforeJump,
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
    /// Bytes acknowledged in reconnaissance.
    acked: u64,
    /// Bytes sent in reconnaissance.
    sent: u64,
    /// When the jump happened: packets sent from then on are unvalidated.
    jump_at: Option<Instant>,
    /// The last packet sent while unvalidated.
    last_unvalidated: Option<Instant>,
    /// Set by an acknowledgement that ends the unvalidated phase; acted on at the batch's end,
    /// where the flight size is known.
    unvalidated_done: bool,
    /// The batch acknowledged the last unvalidated packet.
    settled: bool,
    /// The RTT sample showed a path change.
    rtt_grew: bool,
    /// Smallest RTT sample so far.
    min_rtt: Option<Duration>,
    /// The smoothed RTT at the jump.
    jump_rtt: Duration,
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
            acked: 0,
            sent: 0,
            jump_at: None,
            last_unvalidated: None,
            unvalidated_done: false,
            settled: false,
            rtt_grew: false,
            min_rtt: None,
            jump_rtt: Duration::ZERO,
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

    /// A packet of `bytes` left at `now`.
    pub fn on_sent(&mut self, now: Instant, bytes: u64) {
        match self.phase {
            Phase::Reconnaissance => self.sent += bytes,
            Phase::Unvalidated => self.last_unvalidated = Some(now),
            _ => {}
        }
    }

    /// A packet sent at `sent` and carrying `bytes` was acknowledged at `now`; `app_limited`:
    /// the sender was not using its window.
    pub fn on_ack(&mut self, now: Instant, sent: Instant, bytes: u64, app_limited: bool) {
        let sample = now.saturating_duration_since(sent);
        self.min_rtt = Some(self.min_rtt.map_or(sample, |m| m.min(sample)));
        let changed = sample.saturating_sub(ACK_DELAY_ALLOWANCE).as_secs_f64()
            > self.params.rtt_factor * self.saved.rtt.as_secs_f64();
        let after_jump = self.jump_at.is_some_and(|j| sent >= j);
        let last = self.last_unvalidated.is_some_and(|l| sent >= l);
        match self.phase {
            Phase::Reconnaissance => {
                if changed {
                    self.end(Outcome::PathChanged);
                } else {
                    self.acked += bytes;
                }
            }
            Phase::Unvalidated => {
                self.pipe += bytes;
                // Only a sample of a packet sent since the jump reflects the jump's queue.
                self.rtt_grew |= changed && after_jump;
                self.unvalidated_done |= after_jump;
            }
            Phase::Validating => {
                self.pipe += bytes;
                self.rtt_grew |= changed && after_jump;
                if !app_limited {
                    self.cwnd += bytes; // slow start (RFC 9959 §3.4)
                }
                self.settled |= last;
            }
            Phase::SafeRetreat => {
                self.pipe += bytes;
                self.settled |= last;
            }
            Phase::Normal => {}
        }
    }

    /// The acknowledgement batch ended at `now` with `in_flight` bytes outstanding and this
    /// smoothed RTT. Returns the hand-over when a careful phase ends here.
    pub fn on_end_acks(
        &mut self,
        now: Instant,
        in_flight: u64,
        smoothed_rtt: Duration,
    ) -> Option<Handover> {
        match self.phase {
            Phase::Reconnaissance => {
                // RFC 9959 §3.2: once all the initial data is acknowledged the sender MAY
                // jump; it need not wait until it is limited by its window (§4.2 allows the
                // wait). A server's handshake flight is all it sent before a request, so it
                // jumps as the request arrives rather than one round trip later.
                let confirmed = self.acked >= self.params.initial_window
                    || (self.acked > 0 && self.acked >= self.sent);
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
                self.phase = Phase::Unvalidated;
                self.cwnd = self.jump_window();
                self.pipe = in_flight;
                self.jump_at = Some(now);
                self.jump_rtt = smoothed_rtt;
                None
            }
            Phase::Unvalidated => {
                if self.rtt_grew {
                    return self.retreat();
                }
                let overdue = self
                    .jump_at
                    .is_some_and(|j| now.saturating_duration_since(j) > self.jump_rtt);
                if !(self.unvalidated_done || overdue) {
                    return None;
                }
                let iw = self.params.initial_window;
                if in_flight < iw || in_flight <= self.pipe || self.last_unvalidated.is_none() {
                    // The jump was not used (rate-limited): resume from what was delivered.
                    self.end(Outcome::Validated);
                    return Some(Handover {
                        window: self.pipe.max(iw),
                        congestion: None,
                    });
                }
                self.cwnd = in_flight;
                self.phase = Phase::Validating;
                self.settled = false;
                None
            }
            Phase::Validating => {
                if self.rtt_grew {
                    return self.retreat();
                }
                if !self.settled {
                    return None;
                }
                self.end(Outcome::Validated);
                Some(Handover {
                    window: self.cwnd,
                    congestion: None,
                })
            }
            Phase::SafeRetreat => self.settled.then(|| self.leave_retreat()),
            Phase::Normal => None,
        }
    }

    /// Enter safe retreat: half the pipe, at least the minimum window.
    fn retreat(&mut self) -> Option<Handover> {
        self.phase = Phase::SafeRetreat;
        self.outcome = Outcome::Retreated;
        self.cwnd = (self.pipe / 2).max(self.params.min_window);
        // The retreat waits for the last unvalidated packet; if none was sent it is over.
        if self.last_unvalidated.is_none() {
            return Some(self.leave_retreat());
        }
        self.settled = false;
        None
    }

    fn leave_retreat(&mut self) -> Handover {
        self.end(Outcome::Retreated);
        Handover {
            window: self.pipe.max(self.params.min_window),
            congestion: Some(false),
        }
    }

    /// A packet sent at `sent` was found lost (or ECN-marked) at `now`.
    pub fn on_congestion(&mut self, sent: Instant, persistent: bool) -> Option<Handover> {
        if persistent && self.phase != Phase::Normal {
            let was_careful = self.window().is_some();
            self.end(if was_careful {
                Outcome::Retreated
            } else {
                Outcome::CongestedBeforeJump
            });
            return was_careful.then_some(Handover {
                window: self.params.initial_window,
                congestion: Some(true),
            });
        }
        let after_jump = self.jump_at.is_some_and(|j| sent >= j);
        match self.phase {
            Phase::Reconnaissance => {
                self.end(Outcome::CongestedBeforeJump);
                None
            }
            Phase::Unvalidated | Phase::Validating if after_jump => self.retreat(),
            Phase::SafeRetreat if self.last_unvalidated.is_some_and(|l| sent >= l) => {
                Some(self.leave_retreat())
            }
            _ => None,
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

    /// Reconnaissance: send the initial window at 0, all acknowledged at `rtt_ms`.
    fn confirm(c: &mut CarefulResume, t0: Instant, rtt_ms: u64) -> Option<Handover> {
        c.on_sent(t0, IW);
        c.on_ack(ms(t0, rtt_ms), t0, IW, false);
        c.on_end_acks(ms(t0, rtt_ms), 0, Duration::from_millis(rtt_ms))
    }

    #[test]
    fn nothing_to_resume_when_half_the_capacity_is_not_above_the_initial_window() {
        assert_eq!(cr(2 * IW).phase(), Phase::Normal);
        assert_eq!(cr(2 * IW + 2).phase(), Phase::Reconnaissance);
        let mut zero_rtt = CarefulResume::new(
            Saved {
                capacity: 1 << 20,
                rtt: Duration::ZERO,
            },
            cr(0).params,
        );
        assert_eq!(zero_rtt.phase(), Phase::Normal);
        assert_eq!(zero_rtt.window(), None);
        zero_rtt.on_sent(Instant::now(), 1200);
        assert_eq!(zero_rtt.outcome(), Outcome::None);
    }

    #[test]
    fn a_confirmed_path_jumps_to_half_the_capacity_and_validates() {
        let t0 = Instant::now();
        let mut c = cr(400_000);
        assert_eq!(c.window(), None, "the controller runs reconnaissance");
        assert_eq!(confirm(&mut c, t0, 40), None);
        assert_eq!(c.phase(), Phase::Unvalidated);
        assert_eq!(c.window(), Some(200_000));
        // The jump's packets go out paced over the next RTT.
        for i in 0..10 {
            c.on_sent(ms(t0, 40 + 4 * i), 20_000);
        }
        // The first one is acknowledged: the flight (180 KB) is above the pipe (20 KB).
        c.on_ack(ms(t0, 81), ms(t0, 40), 20_000, false);
        assert_eq!(c.on_end_acks(ms(t0, 81), 180_000, RTT), None);
        assert_eq!(c.phase(), Phase::Validating);
        assert_eq!(c.window(), Some(180_000));
        // Validating grows by slow start until the last unvalidated packet is acknowledged.
        c.on_ack(ms(t0, 90), ms(t0, 44), 20_000, false);
        assert_eq!(c.on_end_acks(ms(t0, 90), 160_000, RTT), None);
        assert_eq!(c.window(), Some(200_000));
        c.on_ack(ms(t0, 120), ms(t0, 76), 20_000, false);
        let h = c.on_end_acks(ms(t0, 120), 0, RTT);
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
        c.on_sent(t0, IW);
        c.on_ack(ms(t0, 40), t0, IW / 2, false);
        assert_eq!(c.on_end_acks(ms(t0, 40), IW / 2, RTT), None);
        assert_eq!(
            c.phase(),
            Phase::Reconnaissance,
            "half the window acknowledged"
        );
        c.on_ack(ms(t0, 41), t0, IW / 2, false);
        assert_eq!(c.on_end_acks(ms(t0, 41), 0, RTT), None);
        assert_eq!(c.phase(), Phase::Unvalidated);
        // A sender that sent less than the initial window confirms once all of it is acknowledged.
        let mut c = cr(400_000);
        c.on_sent(t0, 3_000);
        c.on_ack(ms(t0, 40), t0, 3_000, false);
        c.on_end_acks(ms(t0, 40), 0, RTT);
        assert_eq!(c.phase(), Phase::Unvalidated);
    }

    #[test]
    fn congestion_before_the_jump_ends_careful_resume_without_a_rebuild() {
        let t0 = Instant::now();
        let mut c = cr(400_000);
        c.on_sent(t0, IW);
        assert_eq!(c.on_congestion(t0, false), None);
        assert_eq!(
            (c.phase(), c.outcome()),
            (Phase::Normal, Outcome::CongestedBeforeJump)
        );
        let mut c = cr(400_000);
        assert_eq!(
            c.on_congestion(t0, true),
            None,
            "persistent, controller in charge"
        );
        assert_eq!(c.phase(), Phase::Normal);
    }

    #[test]
    fn a_lost_jump_packet_retreats_to_half_the_pipe_until_the_jump_settles() {
        let t0 = Instant::now();
        let mut c = cr(400_000);
        confirm(&mut c, t0, 40);
        for i in 0..10 {
            c.on_sent(ms(t0, 40 + 4 * i), 20_000);
        }
        // A loss of a packet sent before the jump is reconnaissance's: ignored.
        assert_eq!(c.on_congestion(ms(t0, 10), false), None);
        assert_eq!(c.phase(), Phase::Unvalidated);
        c.on_ack(ms(t0, 81), ms(t0, 40), 20_000, false);
        c.on_ack(ms(t0, 85), ms(t0, 44), 20_000, false);
        assert_eq!(c.on_congestion(ms(t0, 48), false), None);
        assert_eq!(c.phase(), Phase::SafeRetreat);
        assert_eq!(c.window(), Some(20_000), "pipe 40 KB / 2");
        // The window does not grow while the jump's packets settle; the pipe does.
        c.on_ack(ms(t0, 95), ms(t0, 52), 20_000, false);
        assert_eq!(c.on_end_acks(ms(t0, 95), 100_000, RTT), None);
        assert_eq!(c.window(), Some(20_000));
        // The last unvalidated packet acknowledged: the controller takes over from the pipe with
        // its own decrease.
        c.on_ack(ms(t0, 120), ms(t0, 76), 20_000, false);
        let h = c.on_end_acks(ms(t0, 120), 0, RTT);
        assert_eq!(
            h,
            Some(Handover {
                window: 80_000,
                congestion: Some(false)
            })
        );
        assert_eq!(c.outcome(), Outcome::Retreated);
    }

    #[test]
    fn the_last_unvalidated_packet_lost_also_ends_the_retreat() {
        let t0 = Instant::now();
        let mut c = cr(400_000);
        confirm(&mut c, t0, 40);
        c.on_sent(ms(t0, 40), 20_000);
        c.on_sent(ms(t0, 50), 20_000);
        assert_eq!(c.on_congestion(ms(t0, 40), false), None);
        assert_eq!(
            c.window(),
            Some(2_400),
            "nothing validated: the minimum window"
        );
        let h = c.on_congestion(ms(t0, 50), false);
        assert_eq!(h.map(|h| h.congestion), Some(Some(false)));
        assert_eq!(c.phase(), Phase::Normal);
    }

    #[test]
    fn rtt_growth_after_the_jump_retreats() {
        let t0 = Instant::now();
        let mut c = cr(400_000);
        confirm(&mut c, t0, 40);
        c.on_sent(ms(t0, 40), 20_000);
        c.on_sent(ms(t0, 60), 20_000);
        // The jump's first packet comes back after 110 ms − 25 > 2 × 40.
        c.on_ack(ms(t0, 150), ms(t0, 40), 20_000, false);
        assert_eq!(c.on_end_acks(ms(t0, 150), 20_000, RTT), None);
        assert_eq!((c.phase(), c.window()), (Phase::SafeRetreat, Some(10_000)));
    }

    #[test]
    fn an_unused_jump_resumes_from_what_was_delivered() {
        let t0 = Instant::now();
        let mut c = cr(400_000);
        confirm(&mut c, t0, 40);
        c.on_sent(ms(t0, 40), 5_000);
        c.on_ack(ms(t0, 80), ms(t0, 40), 5_000, true);
        assert_eq!(
            c.on_end_acks(ms(t0, 80), 0, RTT),
            Some(Handover {
                window: IW,
                congestion: None
            })
        );
        assert_eq!(c.outcome(), Outcome::Validated);
        // Nothing sent at all after the jump: over after one RTT.
        let mut c = cr(400_000);
        confirm(&mut c, t0, 40);
        assert_eq!(c.on_end_acks(ms(t0, 60), 0, RTT), None);
        assert!(c.on_end_acks(ms(t0, 81), 0, RTT).is_some());
    }

    #[test]
    fn persistent_congestion_in_a_careful_phase_hands_the_event_on() {
        let t0 = Instant::now();
        let mut c = cr(400_000);
        confirm(&mut c, t0, 40);
        c.on_sent(ms(t0, 40), 20_000);
        assert_eq!(
            c.on_congestion(ms(t0, 40), true),
            Some(Handover {
                window: IW,
                congestion: Some(true)
            })
        );
        assert_eq!(c.phase(), Phase::Normal);
    }

    /// Random event sequences: the window is owned only in careful phases, never grows in
    /// unvalidated or retreat, never exceeds the jump before validation, and a hand-over comes
    /// exactly once when a careful phase ends.
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
        for _ in 0..2_000 {
            let cap = 10_000 + next(1_000_000);
            let mut c = cr(cap);
            let jump = c.jump_window();
            let mut now = 0u64;
            let mut sent: Vec<u64> = Vec::new();
            let mut handovers = 0;
            let mut was_careful = false;
            for _ in 0..200 {
                now += 1 + next(10);
                let before = (c.phase(), c.window());
                let h = match next(4) {
                    0 => {
                        c.on_sent(ms(t0, now), 1_200);
                        sent.push(now);
                        None
                    }
                    1 if !sent.is_empty() => {
                        let s = sent.remove(next(sent.len() as u64) as usize);
                        c.on_ack(ms(t0, now), ms(t0, s), 1_200, next(4) == 0);
                        None
                    }
                    2 => c.on_end_acks(
                        ms(t0, now),
                        sent.len() as u64 * 1_200,
                        Duration::from_millis(20 + next(60)),
                    ),
                    _ if !sent.is_empty() => {
                        let s = sent.remove(next(sent.len() as u64) as usize);
                        c.on_congestion(ms(t0, s), next(20) == 0)
                    }
                    _ => None,
                };
                was_careful |= c.window().is_some();
                if let Some(h) = h {
                    handovers += 1;
                    assert!(before.1.is_some(), "a hand-over only from a careful phase");
                    assert_eq!(c.phase(), Phase::Normal);
                    assert!(h.window >= 2_400);
                }
                if let (Phase::Unvalidated, Some(w)) = (c.phase(), c.window()) {
                    assert_eq!(w, jump);
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
    }
}
