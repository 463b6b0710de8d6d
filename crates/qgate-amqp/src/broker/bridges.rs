//! The bridges a broker runs (decision M28): each one's in-process connection to the broker
//! and its counters.

use std::net::SocketAddr;
use std::sync::Arc;

use qgate_transport::TransportOptions;

use super::state::Broker;
use crate::bridge::{BridgeConfig, BridgeStats};
use crate::client::Connector;
use crate::transport::{BoxStream, Dialer, Scheme};

impl Broker {
    /// Forward `cfg.queue` to its upstream until the returned future is dropped (decision
    /// M28); its counters show in [`Broker::metrics`].
    pub fn bridge(
        &self,
        cfg: BridgeConfig,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let stats = Arc::new(BridgeStats::default());
        self.inner
            .bridges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((cfg.queue.clone(), cfg.upstream_name.clone(), stats.clone()));
        crate::bridge::run(local_connector(self), cfg, stats)
    }

    /// The bridges' counters: (local queue, upstream, counters).
    pub fn bridges(&self) -> Vec<(String, String, Arc<BridgeStats>)> {
        self.inner
            .bridges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// A connector whose connections are in-process pipes served by `broker` as trusted.
fn local_connector(broker: &Broker) -> Connector {
    let b = broker.clone();
    let dial: Dialer = Arc::new(move |_| {
        let b = b.clone();
        Box::pin(async move {
            let (ours, theirs) = tokio::io::duplex(256 * 1024);
            tokio::spawn(async move { b.serve_trusted(theirs).await });
            Ok(Box::new(ours) as BoxStream)
        })
    });
    let unused: SocketAddr = ([127, 0, 0, 1], 0).into();
    Connector::new(
        Scheme::Tcp,
        unused,
        "localhost",
        &Default::default(),
        None,
        None,
        &TransportOptions::default(),
    )
    .expect("a plain connector needs nothing that can fail")
    .with_dialer(dial)
}
