//! `congestion = "auto"` (decision G16): CUBIC until random loss dominates, then BBR.
//!
//! A loss-based controller halves its window at every loss, so on a path that drops packets at
//! random (a radio link, not a full queue) CUBIC stays far below the capacity; BBR models the
//! path's rate and RTT and ignores such loss. Measured in `qgate lab run
//! lab/plans/proxy-backhaul-cc.toml`. A loss epoch is a loss of a packet sent after the previous
//! epoch's loss was detected (as a recovery period counts). It is *random* when the smoothed RTT
//! at its detection is within [`QUEUE_FACTOR`] of the path's minimum (no standing queue), once
//! the RTT estimate rests on [`MIN_RTT_SAMPLES`] acknowledgement batches. [`RANDOM_EPOCHS`]
//! random epochs in a row switch the connection to BBR for good, starting from the window CUBIC
//! had; an epoch behind a queue starts the count again, so a congested path, whose losses come
//! behind a full queue, keeps CUBIC, which shares a bottleneck fairly. Persistent congestion (an
//! outage: nothing acknowledged, so the RTT estimate is stale) and ECN marks never count.

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quinn::congestion::{BbrConfig, Controller, ControllerFactory, ControllerMetrics};
use quinn_proto::RttEstimator;

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
}

impl ControllerFactory for LossSwitchConfig {
    fn build(self: Arc<Self>, now: Instant, current_mtu: u16) -> Box<dyn Controller> {
        let inner = self.first.clone().build(now, current_mtu);
        Box::new(LossSwitch {
            initial_window: inner.initial_window(),
            inner,
            switched_at: None,
            detector: RandomLoss::default(),
            mtu: current_mtu,
        })
    }
}

/// CUBIC until random loss dominates, then BBR.
pub struct LossSwitch {
    inner: Box<dyn Controller>,
    /// The window the connection started with (CUBIC's), whatever runs now.
    initial_window: u64,
    /// When BBR took over.
    switched_at: Option<Instant>,
    detector: RandomLoss,
    mtu: u16,
}

impl Clone for LossSwitch {
    fn clone(&self) -> Self {
        LossSwitch {
            inner: self.inner.clone_box(),
            initial_window: self.initial_window,
            switched_at: self.switched_at,
            detector: self.detector.clone(),
            mtu: self.mtu,
        }
    }
}

impl LossSwitch {
    /// Whether the connection now runs BBR.
    pub fn switched(&self) -> bool {
        self.switched_at.is_some()
    }
}

impl Controller for LossSwitch {
    fn on_sent(&mut self, now: Instant, bytes: u64, last_packet_number: u64) {
        self.inner.on_sent(now, bytes, last_packet_number);
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
        self.inner.on_ack(now, sent, bytes, app_limited, rtt);
    }

    fn on_end_acks(
        &mut self,
        now: Instant,
        in_flight: u64,
        app_limited: bool,
        largest_packet_num_acked: Option<u64>,
    ) {
        self.detector.on_end_acks();
        self.inner
            .on_end_acks(now, in_flight, app_limited, largest_packet_num_acked);
    }

    fn on_congestion_event(
        &mut self,
        now: Instant,
        sent: Instant,
        is_persistent_congestion: bool,
        lost_bytes: u64,
    ) {
        match self.switched_at {
            // Losses of packets sent before BBR took over are CUBIC's epoch, already answered
            // by the switch: BBR would enter recovery on them.
            Some(at) if sent <= at => return,
            Some(_) => {}
            // ECN marks (no bytes lost) are a queue's signal, and an outage leaves a stale RTT
            // estimate: neither is random loss.
            None if lost_bytes > 0
                && !is_persistent_congestion
                && self.detector.on_loss(now, sent) =>
            {
                let mut bbr = BbrConfig::default();
                bbr.initial_window(self.inner.window());
                self.inner = Arc::new(bbr).build(now, self.mtu);
                self.switched_at = Some(now);
                tracing::info!(
                    epochs = self.detector.epochs,
                    window = self.inner.window(),
                    "congestion auto: random loss dominates, switching to BBR"
                );
                return;
            }
            None => {}
        }
        self.inner
            .on_congestion_event(now, sent, is_persistent_congestion, lost_bytes);
    }

    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.mtu = new_mtu;
        self.inner.on_mtu_update(new_mtu);
    }

    fn window(&self) -> u64 {
        self.inner.window()
    }

    fn metrics(&self) -> ControllerMetrics {
        self.inner.metrics()
    }

    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(self.clone())
    }

    fn initial_window(&self) -> u64 {
        self.initial_window
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
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
        let c = Arc::new(LossSwitchConfig { first }).build(t0, 1200);
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
    fn random_loss_switches_to_bbr_from_cubics_window() {
        let t0 = Instant::now();
        let mut c = controller(t0);
        let w0 = c.window();
        c.on_congestion_event(t0 + ms(100), t0 + ms(50), false, 1200);
        let halved = c.window();
        assert!(halved < w0, "CUBIC reacts: {halved} < {w0}");
        assert!(!c.switched());
        c.on_congestion_event(t0 + ms(200), t0 + ms(150), false, 1200);
        let before = c.window();
        c.on_congestion_event(t0 + ms(300), t0 + ms(250), false, 1200);
        assert!(c.switched() && is_bbr(&c));
        // BBR starts from the window CUBIC had when the third loss came; the connection's
        // initial window is still the one it started with.
        assert_eq!(c.window(), before);
        assert_eq!(c.initial_window(), w0);
        assert!(c
            .clone_box()
            .into_any()
            .downcast::<LossSwitch>()
            .unwrap()
            .switched());
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
