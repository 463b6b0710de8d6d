//! `congestion = "auto"` (decision G16): CUBIC until random loss dominates, then BBR.
//!
//! A loss-based controller halves its window at every loss, so on a path that drops packets at
//! random (a radio link, not a full queue) CUBIC stays far below the capacity; BBR models the
//! path's rate and RTT and ignores such loss. Measured in `qgate lab run
//! lab/plans/proxy-backhaul-cc.toml`. A loss is *random* when it comes without a queue: the
//! smoothed RTT when it is detected is within [`QUEUE_FACTOR`] of the path's minimum. After
//! [`RANDOM_EPOCHS`] such loss epochs (a loss of a packet sent after the previous counted one,
//! as a recovery period counts), the connection switches to BBR for good, starting from the
//! window CUBIC had. Losses behind a standing queue keep CUBIC, which shares a congested
//! bottleneck fairly.

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quinn::congestion::{BbrConfig, Controller, ControllerFactory, ControllerMetrics};
use quinn_proto::RttEstimator;

/// A loss detected while the smoothed RTT is below this × the minimum RTT came without a queue.
pub const QUEUE_FACTOR: f64 = 1.25;

/// Random loss epochs before the switch.
pub const RANDOM_EPOCHS: u32 = 3;

/// Counts loss epochs that came without a queue: the decision, apart from the controllers.
#[derive(Debug, Clone, Default)]
pub struct RandomLoss {
    /// The latest smoothed and minimum RTT seen in an acknowledgement.
    rtt: Option<(Duration, Duration)>,
    /// When the last counted epoch's loss was detected: a loss of a packet sent before it
    /// belongs to that epoch.
    epoch_start: Option<Instant>,
    /// Random epochs so far.
    pub epochs: u32,
}

impl RandomLoss {
    /// An acknowledgement arrived with these RTT estimates.
    pub fn on_rtt(&mut self, smoothed: Duration, min: Duration) {
        self.rtt = Some((smoothed, min));
    }

    /// A packet sent at `sent` was found lost at `now`; true once random loss dominates.
    pub fn on_loss(&mut self, now: Instant, sent: Instant) -> bool {
        if self.epoch_start.is_some_and(|e| sent <= e) {
            return self.dominates();
        }
        // Without an RTT sample there is nothing to tell a queue by: not counted.
        let Some((smoothed, min)) = self.rtt else {
            return self.dominates();
        };
        self.epoch_start = Some(now);
        if smoothed.as_secs_f64() <= QUEUE_FACTOR * min.as_secs_f64() {
            self.epochs += 1;
        }
        self.dominates()
    }

    /// Whether enough random loss epochs have been seen.
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
        Box::new(LossSwitch {
            inner: self.first.clone().build(now, current_mtu),
            switched: false,
            detector: RandomLoss::default(),
            mtu: current_mtu,
        })
    }
}

/// CUBIC until random loss dominates, then BBR.
pub struct LossSwitch {
    inner: Box<dyn Controller>,
    switched: bool,
    detector: RandomLoss,
    mtu: u16,
}

impl Clone for LossSwitch {
    fn clone(&self) -> Self {
        LossSwitch {
            inner: self.inner.clone_box(),
            switched: self.switched,
            detector: self.detector.clone(),
            mtu: self.mtu,
        }
    }
}

impl LossSwitch {
    /// Whether the connection now runs BBR.
    pub fn switched(&self) -> bool {
        self.switched
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
        // ECN marks (no bytes lost) are a queue's signal, never random loss.
        if !self.switched && lost_bytes > 0 && self.detector.on_loss(now, sent) {
            let mut bbr = BbrConfig::default();
            bbr.initial_window(self.inner.window());
            self.inner = Arc::new(bbr).build(now, self.mtu);
            self.switched = true;
            tracing::debug!(
                epochs = self.detector.epochs,
                window = self.inner.window(),
                "random loss dominates: BBR"
            );
            return;
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
        self.inner.initial_window()
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

    #[test]
    fn only_loss_without_a_queue_counts_once_per_epoch() {
        let t0 = Instant::now();
        let mut d = RandomLoss::default();
        // No RTT yet: nothing to tell a queue by.
        assert!(!d.on_loss(t0, t0));
        assert_eq!(d.epochs, 0);
        d.on_rtt(ms(24), ms(20)); // 1.2 × min: no queue
        assert!(!d.on_loss(t0 + ms(100), t0 + ms(50)));
        assert_eq!(d.epochs, 1);
        // Packets sent before that loss was found are the same epoch.
        assert!(!d.on_loss(t0 + ms(110), t0 + ms(90)));
        assert!(!d.on_loss(t0 + ms(120), t0 + ms(100)));
        assert_eq!(d.epochs, 1);
        // Behind a standing queue (1.5 × min) a loss is congestion: a new epoch, not counted.
        d.on_rtt(ms(30), ms(20));
        assert!(!d.on_loss(t0 + ms(200), t0 + ms(150)));
        assert_eq!(d.epochs, 1);
        // Exactly the factor still counts; the third random epoch decides.
        d.on_rtt(ms(25), ms(20));
        assert!(!d.on_loss(t0 + ms(300), t0 + ms(250)));
        assert!(d.on_loss(t0 + ms(400), t0 + ms(350)));
        assert_eq!(d.epochs, RANDOM_EPOCHS);
        assert!(d.dominates());
    }

    fn controller(t0: Instant) -> LossSwitch {
        let first: Arc<dyn ControllerFactory + Send + Sync> =
            Arc::new(quinn::congestion::CubicConfig::default());
        let c = Arc::new(LossSwitchConfig { first }).build(t0, 1200);
        *c.into_any().downcast::<LossSwitch>().expect("a LossSwitch")
    }

    #[test]
    fn random_loss_switches_to_bbr_from_cubics_window() {
        let t0 = Instant::now();
        let mut c = controller(t0);
        let w0 = c.window();
        c.detector.on_rtt(ms(20), ms(20));
        c.on_congestion_event(t0 + ms(100), t0 + ms(50), false, 1200);
        let halved = c.window();
        assert!(halved < w0, "CUBIC reacts: {halved} < {w0}");
        assert!(!c.switched());
        c.on_congestion_event(t0 + ms(200), t0 + ms(150), false, 1200);
        let before = c.window();
        c.on_congestion_event(t0 + ms(300), t0 + ms(250), false, 1200);
        assert!(c.switched());
        // BBR starts from the window CUBIC had when the third loss came.
        assert!(c
            .inner
            .clone_box()
            .into_any()
            .is::<quinn::congestion::Bbr>());
        assert_eq!(c.window(), before);
        // Further losses go to BBR, which does not halve.
        let w = c.window();
        c.on_congestion_event(t0 + ms(400), t0 + ms(350), false, 1200);
        assert_eq!(c.window(), w);
        assert!(c
            .clone_box()
            .into_any()
            .downcast::<LossSwitch>()
            .unwrap()
            .switched());
    }

    #[test]
    fn congestion_behind_a_queue_and_ecn_keep_cubic() {
        let t0 = Instant::now();
        let mut c = controller(t0);
        c.detector.on_rtt(ms(60), ms(20));
        for k in 1..=10u64 {
            c.on_congestion_event(t0 + ms(100 * k), t0 + ms(100 * k - 50), false, 1200);
        }
        assert!(!c.switched());
        c.detector.on_rtt(ms(20), ms(20));
        for k in 11..=20u64 {
            // ECN: no bytes lost.
            c.on_congestion_event(t0 + ms(100 * k), t0 + ms(100 * k - 50), false, 0);
        }
        assert!(!c.switched());
        assert!(c
            .inner
            .clone_box()
            .into_any()
            .is::<quinn::congestion::Cubic>());
    }
}
