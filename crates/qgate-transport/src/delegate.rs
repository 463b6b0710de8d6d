//! A congestion controller that wraps another ([`Layer`]) writes only what it changes: every
//! method it leaves alone forwards to the controller it wraps, written once here.

use std::any::Any;
// The controller trait's own type: quinn passes the times in.
use std::time::Instant;

use quinn::congestion::{Controller, ControllerMetrics};
use quinn_proto::RttEstimator;

/// quinn's [`Controller`] methods, each forwarding to [`inner`](Layer::inner) unless the layer
/// overrides it. [`Wrapped`] makes a layer a controller (quinn's trait is foreign, so a blanket
/// implementation is not allowed).
pub(crate) trait Layer: Send + Sync + Sized + 'static {
    /// The controller the methods not overridden forward to.
    fn inner(&self) -> &dyn Controller;

    fn inner_mut(&mut self) -> &mut dyn Controller;

    /// The copy `clone_box` makes (quinn's `congestion_state()`).
    fn copy(&self) -> Self;

    fn on_sent(&mut self, now: Instant, bytes: u64, last_packet_number: u64) {
        self.inner_mut().on_sent(now, bytes, last_packet_number)
    }

    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        rtt: &RttEstimator,
    ) {
        self.inner_mut().on_ack(now, sent, bytes, app_limited, rtt)
    }

    fn on_end_acks(
        &mut self,
        now: Instant,
        in_flight: u64,
        app_limited: bool,
        largest_packet_num_acked: Option<u64>,
    ) {
        self.inner_mut()
            .on_end_acks(now, in_flight, app_limited, largest_packet_num_acked)
    }

    fn on_congestion_event(
        &mut self,
        now: Instant,
        sent: Instant,
        is_persistent_congestion: bool,
        lost_bytes: u64,
    ) {
        self.inner_mut()
            .on_congestion_event(now, sent, is_persistent_congestion, lost_bytes)
    }

    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.inner_mut().on_mtu_update(new_mtu)
    }

    fn window(&self) -> u64 {
        self.inner().window()
    }

    fn metrics(&self) -> ControllerMetrics {
        self.inner().metrics()
    }

    fn initial_window(&self) -> u64 {
        self.inner().initial_window()
    }
}

/// A [`Layer`] as quinn's [`Controller`].
pub(crate) struct Wrapped<L>(pub(crate) L);

impl<L: Layer> Controller for Wrapped<L> {
    fn on_sent(&mut self, now: Instant, bytes: u64, last_packet_number: u64) {
        self.0.on_sent(now, bytes, last_packet_number)
    }

    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        rtt: &RttEstimator,
    ) {
        self.0.on_ack(now, sent, bytes, app_limited, rtt)
    }

    fn on_end_acks(
        &mut self,
        now: Instant,
        in_flight: u64,
        app_limited: bool,
        largest_packet_num_acked: Option<u64>,
    ) {
        self.0
            .on_end_acks(now, in_flight, app_limited, largest_packet_num_acked)
    }

    fn on_congestion_event(
        &mut self,
        now: Instant,
        sent: Instant,
        is_persistent_congestion: bool,
        lost_bytes: u64,
    ) {
        self.0
            .on_congestion_event(now, sent, is_persistent_congestion, lost_bytes)
    }

    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.0.on_mtu_update(new_mtu)
    }

    fn window(&self) -> u64 {
        self.0.window()
    }

    fn metrics(&self) -> ControllerMetrics {
        self.0.metrics()
    }

    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(Wrapped(self.0.copy()))
    }

    fn initial_window(&self) -> u64 {
        self.0.initial_window()
    }

    /// The layer itself, so a downcast names the layer's type, not this wrapper's.
    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        Box::new(self.0)
    }
}
