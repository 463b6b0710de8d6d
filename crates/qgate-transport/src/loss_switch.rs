//! `congestion = "auto"` (decision G16): CUBIC until random loss dominates, then BBR.
//!
//! A loss-based controller halves its window at every loss, so on a path that drops packets at
//! random (a radio link, not a full queue) CUBIC stays far below the capacity; BBR models the
//! path's rate and RTT and ignores such loss. Measured in `qgate-lab run
//! lab/plans/proxy-backhaul-cc.toml`. A loss epoch is a loss of a packet sent after the previous
//! epoch's loss was detected (as a recovery period counts). It is *random* when the smoothed RTT
//! at its detection is within [`QUEUE_FACTOR`] of the path's minimum (no standing queue), once
//! the RTT estimate rests on [`MIN_RTT_SAMPLES`] acknowledgement batches. [`RANDOM_EPOCHS`]
//! random epochs in a row hand the connection to BBR for good. BBR runs in the shadow from the
//! start, fed every event, so it takes over warm (its rate and RTT measured, its start-up
//! behind it); an epoch behind a queue starts the count again, so a congested path, whose losses come
//! behind a full queue, keeps CUBIC, which shares a bottleneck fairly. Persistent congestion (an
//! outage: nothing acknowledged, so the RTT estimate is stale) and ECN marks never count.

use std::sync::Arc;
use std::time::{Duration, Instant};

use quinn::congestion::{Controller, ControllerFactory};
use quinn_proto::RttEstimator;

use crate::delegate::{Layer, Wrapped};

/// A loss detected while the smoothed RTT is at most this × the minimum RTT came without a queue.
pub const QUEUE_FACTOR: f64 = 1.25;

/// Random loss epochs in a row before the switch.
pub const RANDOM_EPOCHS: u32 = 3;

/// Acknowledgement batches before the RTT estimate is trusted: quinn hands a controller the
/// estimate from before each batch's own sample, so the first batches see the configured
/// initial RTT (smoothed = minimum) or a single sample.
pub const MIN_RTT_SAMPLES: u32 = 8;

/// Counts loss epochs that came without a queue: the decision, apart from the controllers.
#[derive(Debug, Clone, Default)]
pub struct RandomLoss {
    /// The latest smoothed and minimum RTT seen in an acknowledgement.
    rtt: Option<(Duration, Duration)>,
    /// Acknowledgement batches ended so far (up to [`MIN_RTT_SAMPLES`]).
    batches: u32,
    /// When the current epoch's loss was detected: a loss of a packet sent before it belongs
    /// to that epoch.
    epoch_start: Option<Instant>,
    /// Random epochs in a row so far.
    pub epochs: u32,
}

impl RandomLoss {
    /// An acknowledgement arrived with these RTT estimates.
    pub fn on_rtt(&mut self, smoothed: Duration, min: Duration) {
        if self.batches > 0 {
            self.rtt = Some((smoothed, min));
        }
    }

    /// A batch of acknowledgements ended.
    pub fn on_end_acks(&mut self) {
        self.batches = (self.batches + 1).min(MIN_RTT_SAMPLES);
    }

    /// A packet sent at `sent` was found lost at `now`; true once random loss dominates.
    pub fn on_loss(&mut self, now: Instant, sent: Instant) -> bool {
        if self.epoch_start.is_some_and(|e| sent <= e) {
            return self.dominates();
        }
        self.epoch_start = Some(now);
        match self.rtt {
            // Too early to tell a queue by: neither random nor congestion.
            _ if self.batches < MIN_RTT_SAMPLES => {}
            None => {}
            Some((smoothed, min)) if smoothed.as_secs_f64() <= QUEUE_FACTOR * min.as_secs_f64() => {
                self.epochs += 1
            }
            Some(_) => self.epochs = 0,
        }
        self.dominates()
    }

    /// Whether enough random loss epochs in a row have been seen.
    pub fn dominates(&self) -> bool {
        self.epochs >= RANDOM_EPOCHS
    }
}

/// Builds [`LossSwitch`] controllers.
pub struct LossSwitchConfig {
    /// The controller a connection starts with (CUBIC).
    pub first: Arc<dyn ControllerFactory + Send + Sync>,
    /// The controller it switches to (BBR), run in the shadow from the start.
    pub second: Arc<dyn ControllerFactory + Send + Sync>,
}

impl ControllerFactory for LossSwitchConfig {
    fn build(self: Arc<Self>, now: Instant, current_mtu: u16) -> Box<dyn Controller> {
        let inner = self.first.clone().build(now, current_mtu);
        Box::new(Wrapped(LossSwitch {
            initial_window: inner.initial_window(),
            inner,
            shadow: Some(self.second.clone().build(now, current_mtu)),
            detector: RandomLoss::default(),
        }))
    }
}

/// CUBIC until random loss dominates, then BBR.
pub struct LossSwitch {
    /// The controller in charge: CUBIC, then BBR.
    inner: Box<dyn Controller>,
    /// BBR while CUBIC is in charge, fed every event from the connection's start, so that it
    /// takes over with the path's rate and RTT measured (and its start-up behind it) rather
    /// than starting cold mid-transfer. `None` once it took over.
    shadow: Option<Box<dyn Controller>>,
    /// The window the connection started with (CUBIC's), whatever runs now.
    initial_window: u64,
    detector: RandomLoss,
}

impl Clone for LossSwitch {
    fn clone(&self) -> Self {
        LossSwitch {
            inner: self.inner.clone_box(),
            shadow: self.shadow.as_ref().map(|s| s.clone_box()),
            initial_window: self.initial_window,
            detector: self.detector.clone(),
        }
    }
}

impl LossSwitch {
    /// Whether the connection now runs BBR.
    pub fn switched(&self) -> bool {
        self.shadow.is_none()
    }

    /// Both controllers while CUBIC is in charge, BBR alone after.
    fn each(&mut self, mut f: impl FnMut(&mut dyn Controller)) {
        if let Some(s) = &mut self.shadow {
            f(s.as_mut());
        }
        f(self.inner.as_mut());
    }
}

impl Layer for LossSwitch {
    fn inner(&self) -> &dyn Controller {
        self.inner.as_ref()
    }

    fn inner_mut(&mut self) -> &mut dyn Controller {
        self.inner.as_mut()
    }

    fn copy(&self) -> LossSwitch {
        self.clone()
    }

    fn on_sent(&mut self, now: Instant, bytes: u64, last_packet_number: u64) {
        self.each(|c| c.on_sent(now, bytes, last_packet_number));
    }

    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        rtt: &RttEstimator,
    ) {
        self.detector.on_rtt(rtt.get(), rtt.min());
        self.each(|c| c.on_ack(now, sent, bytes, app_limited, rtt));
    }

    fn on_end_acks(
        &mut self,
        now: Instant,
        in_flight: u64,
        app_limited: bool,
        largest_packet_num_acked: Option<u64>,
    ) {
        self.detector.on_end_acks();
        self.each(|c| c.on_end_acks(now, in_flight, app_limited, largest_packet_num_acked));
    }

    fn on_congestion_event(
        &mut self,
        now: Instant,
        sent: Instant,
        is_persistent_congestion: bool,
        lost_bytes: u64,
    ) {
        self.each(|c| c.on_congestion_event(now, sent, is_persistent_congestion, lost_bytes));
        // ECN marks (no bytes lost) are a queue's signal, and an outage leaves a stale RTT
        // estimate: neither is random loss.
        if !self.switched()
            && lost_bytes > 0
            && !is_persistent_congestion
            && self.detector.on_loss(now, sent)
        {
            if let Some(bbr) = self.shadow.take() {
                self.inner = bbr;
                tracing::info!(
                    epochs = self.detector.epochs,
                    window = self.inner.window(),
                    "congestion auto: random loss dominates, switching to BBR"
                );
            }
        }
    }

    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.each(|c| c.on_mtu_update(new_mtu));
    }

    fn initial_window(&self) -> u64 {
        self.initial_window
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A detector past its warm-up, with this RTT.
    fn warm(smoothed: u64, min: u64) -> RandomLoss {
        let mut d = RandomLoss::default();
        for _ in 0..MIN_RTT_SAMPLES {
            d.on_end_acks();
        }
        d.on_rtt(ms(smoothed), ms(min));
        d
    }

    #[test]
    fn the_first_estimates_are_not_trusted() {
        let t0 = Instant::now();
        let mut d = RandomLoss::default();
        // Before any batch ended, the estimate is the configured initial RTT: ignored.
        d.on_rtt(ms(333), ms(333));
        assert!(!d.on_loss(t0 + ms(10), t0));
        for _ in 0..MIN_RTT_SAMPLES - 1 {
            d.on_end_acks();
        }
        d.on_rtt(ms(20), ms(20));
        assert!(!d.on_loss(t0 + ms(100), t0 + ms(50)));
        assert_eq!(
            d.epochs, 0,
            "a loss before {MIN_RTT_SAMPLES} batches is not counted"
        );
        d.on_end_acks();
        assert!(!d.on_loss(t0 + ms(200), t0 + ms(150)));
        assert_eq!(d.epochs, 1);
    }

    #[test]
    fn only_loss_without_a_queue_counts_once_per_epoch() {
        let t0 = Instant::now();
        let mut d = warm(24, 20); // 1.2 × min: no queue
        assert!(!d.on_loss(t0 + ms(100), t0 + ms(50)));
        assert_eq!(d.epochs, 1);
        // Packets sent before that loss was found are the same epoch.
        assert!(!d.on_loss(t0 + ms(110), t0 + ms(90)));
        assert!(!d.on_loss(t0 + ms(120), t0 + ms(100)));
        assert_eq!(d.epochs, 1);
        // Exactly the factor still counts; the third random epoch in a row decides.
        d.on_rtt(ms(25), ms(20));
        assert!(!d.on_loss(t0 + ms(200), t0 + ms(150)));
        assert!(d.on_loss(t0 + ms(300), t0 + ms(250)));
        assert_eq!(d.epochs, RANDOM_EPOCHS);
        assert!(d.dominates());
    }

    #[test]
    fn an_epoch_behind_a_queue_starts_the_count_again() {
        let t0 = Instant::now();
        let mut d = warm(20, 20);
        let mut at = 0;
        let mut epoch = |d: &mut RandomLoss, smoothed: u64| {
            at += 100;
            d.on_rtt(ms(smoothed), ms(20));
            d.on_loss(t0 + ms(at), t0 + ms(at - 50))
        };
        // Random, random, queue (1.5 × min), … never three random in a row: CUBIC for good.
        for _ in 0..50 {
            assert!(!epoch(&mut d, 20));
            assert!(!epoch(&mut d, 21));
            assert!(!epoch(&mut d, 30));
            assert_eq!(d.epochs, 0);
        }
        assert!(!epoch(&mut d, 20));
        assert!(!epoch(&mut d, 20));
        assert!(epoch(&mut d, 20));
    }

    fn controller(t0: Instant) -> LossSwitch {
        let first: Arc<dyn ControllerFactory + Send + Sync> =
            Arc::new(quinn::congestion::CubicConfig::default());
        let second: Arc<dyn ControllerFactory + Send + Sync> =
            Arc::new(quinn::congestion::BbrConfig::default());
        let c = Arc::new(LossSwitchConfig { first, second }).build(t0, 1200);
        let mut c = *c.into_any().downcast::<LossSwitch>().expect("a LossSwitch");
        c.detector = warm(20, 20);
        c
    }

    fn is_bbr(c: &LossSwitch) -> bool {
        c.inner
            .clone_box()
            .into_any()
            .is::<quinn::congestion::Bbr>()
    }

    #[test]
    fn random_loss_hands_over_to_the_shadow_bbr() {
        let t0 = Instant::now();
        let mut c = controller(t0);
        let w0 = c.window();
        // Both controllers see what is sent.
        c.on_sent(t0 + ms(1), 1200, 1);
        c.on_congestion_event(t0 + ms(100), t0 + ms(50), false, 1200);
        let halved = c.window();
        assert!(halved < w0, "CUBIC is in charge: {halved} < {w0}");
        assert!(!c.switched() && !is_bbr(&c));
        c.on_congestion_event(t0 + ms(200), t0 + ms(150), false, 1200);
        let shadow = c.shadow.as_ref().unwrap().clone_box();
        c.on_congestion_event(t0 + ms(300), t0 + ms(250), false, 1200);
        assert!(c.switched() && is_bbr(&c) && c.shadow.is_none());
        // The shadow takes over with its own state, the same loss included; the connection's
        // initial window is still the one it started with.
        let mut expected = shadow;
        expected.on_congestion_event(t0 + ms(300), t0 + ms(250), false, 1200);
        assert_eq!(c.window(), expected.window());
        assert_eq!(c.initial_window(), w0);
        let copy = Wrapped(c)
            .clone_box()
            .into_any()
            .downcast::<LossSwitch>()
            .unwrap();
        assert!(copy.switched() && is_bbr(&copy));
    }

    #[test]
    fn congestion_behind_a_queue_outages_and_ecn_keep_cubic() {
        let t0 = Instant::now();
        let mut c = controller(t0);
        c.detector.on_rtt(ms(60), ms(20));
        for k in 1..=10u64 {
            c.on_congestion_event(t0 + ms(100 * k), t0 + ms(100 * k - 50), false, 1200);
        }
        c.detector.on_rtt(ms(20), ms(20));
        for k in 11..=20u64 {
            // ECN: no bytes lost.
            c.on_congestion_event(t0 + ms(100 * k), t0 + ms(100 * k - 50), false, 0);
        }
        for k in 21..=30u64 {
            // An outage: persistent congestion, the RTT estimate from before it.
            c.on_congestion_event(t0 + ms(100 * k), t0 + ms(100 * k - 50), true, 12_000);
        }
        assert!(!c.switched() && !is_bbr(&c));
    }
}
