//! [`Broker::builder`]: the one way a broker is assembled with what it serves (decision X12).
//! `qgate broker`, the lab's AMQP workload and loopback baseline, the AMQP benchmark and the
//! tests all go through it: a [`BrokerConfig`] and any number of listeners — QUIC endpoints
//! (real or simulated sockets), TCP listeners with or without TLS, and streams of already
//! accepted byte streams (a user-space TCP on the simulated network) served over TLS.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use futures_util::{Stream as Incoming, StreamExt};
use tokio::task::JoinSet;

use crate::bridge::BridgeConfig;
use crate::broker::{serve_quic, serve_tcp, Broker, BrokerConfig, BrokerError, PerConnection};
use crate::transport::{BoxStream, Stream};

/// Accepted connections of some transport, each to be served over TLS.
type Accepted = Pin<Box<dyn Incoming<Item = BoxStream> + Send>>;

/// What a broker serves, and with which settings; [`BrokerBuilder::start`] runs it.
#[derive(Default)]
pub struct BrokerBuilder {
    config: BrokerConfig,
    quic: Vec<(quinn::Endpoint, Option<PerConnection>)>,
    tcp: Vec<(tokio::net::TcpListener, Option<Arc<rustls::ServerConfig>>)>,
    accepted: Vec<(Accepted, Arc<rustls::ServerConfig>)>,
    bridges: Vec<BridgeConfig>,
}

impl Broker {
    /// A broker with [`BrokerConfig::default`] serving nothing yet.
    pub fn builder() -> BrokerBuilder {
        BrokerBuilder::default()
    }
}

impl BrokerBuilder {
    /// Its settings (limits, timeouts, queues, store, credentials).
    pub fn config(mut self, config: BrokerConfig) -> Self {
        self.config = config;
        self
    }

    /// Serve AMQP on every bidirectional stream of every connection this endpoint accepts
    /// (0-RTT included, decision M2).
    pub fn quic(mut self, endpoint: quinn::Endpoint) -> Self {
        self.quic.push((endpoint, None));
        self
    }

    /// [`quic`](Self::quic), the endpoint's server configuration `base` built from `opts`:
    /// each connection gets a configuration of its own when `opts` ask for one (a qlog file).
    pub fn quic_with(
        mut self,
        endpoint: quinn::Endpoint,
        base: quinn::ServerConfig,
        opts: qgate_transport::TransportOptions,
    ) -> Self {
        let own = opts
            .qlog_dir
            .is_some()
            .then_some(PerConnection { base, opts });
        self.quic.push((endpoint, own));
        self
    }

    /// Serve AMQP on every TCP connection this listener accepts, over TLS when `tls` is given.
    pub fn tcp(
        mut self,
        listener: tokio::net::TcpListener,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> Self {
        self.tcp.push((listener, tls));
        self
    }

    /// Serve AMQP over TLS on every byte stream `incoming` yields (connections some other
    /// transport accepted, e.g. the simulated network's user-space TCP).
    pub fn accepted<S: Stream + 'static>(
        mut self,
        incoming: impl Incoming<Item = S> + Send + 'static,
        tls: Arc<rustls::ServerConfig>,
    ) -> Self {
        let boxed: Accepted = Box::pin(incoming.map(|s| Box::new(s) as BoxStream));
        self.accepted.push((boxed, tls));
        self
    }

    /// Forward a local queue to an upstream broker, store and forward (decision M28).
    pub fn bridge(mut self, bridge: BridgeConfig) -> Self {
        self.bridges.push(bridge);
        self
    }

    /// Start the broker (open its store, recover, declare queues) and serve every listener.
    /// Call within a tokio runtime.
    pub fn start(self) -> Result<RunningBroker, BrokerError> {
        // A bridge of a queue that can never exist would retry for ever.
        if !self.config.auto_create {
            if let Some(b) = self
                .bridges
                .iter()
                .find(|b| !self.config.queues.iter().any(|q| q.name == b.queue))
            {
                return Err(BrokerError::Config(format!(
                    "the bridge of queue '{}' needs it declared in [[broker.queues]] (auto-create is off)",
                    b.queue
                )));
            }
        }
        let broker = Broker::start(self.config)?;
        let mut tasks = JoinSet::new();
        let (mut quic, mut endpoints) = (Vec::new(), Vec::new());
        for (ep, own) in self.quic {
            quic.extend(ep.local_addr().ok());
            endpoints.push(ep.clone());
            tasks.spawn(serve_quic(broker.clone(), ep, own));
        }
        for b in self.bridges {
            tasks.spawn(broker.bridge(b));
        }
        let mut tcp = Vec::new();
        for (l, tls) in self.tcp {
            tcp.extend(l.local_addr().ok());
            tasks.spawn(serve_tcp(broker.clone(), l, tls));
        }
        for (mut incoming, tls) in self.accepted {
            let b = broker.clone();
            tasks.spawn(async move {
                let mut conns = JoinSet::new();
                while let Some(s) = incoming.next().await {
                    let (b, tls) = (b.clone(), tls.clone());
                    conns.spawn(async move { b.serve_tls(s, tls).await });
                    while conns.try_join_next().is_some() {}
                }
            });
        }
        Ok(RunningBroker {
            broker,
            quic,
            endpoints,
            tcp,
            tasks,
        })
    }
}

/// A broker serving its listeners until dropped or shut down.
pub struct RunningBroker {
    broker: Broker,
    quic: Vec<SocketAddr>,
    endpoints: Vec<quinn::Endpoint>,
    tcp: Vec<SocketAddr>,
    tasks: JoinSet<()>,
}

impl RunningBroker {
    /// The broker (queues, statistics, metrics).
    pub fn broker(&self) -> &Broker {
        &self.broker
    }

    /// Local addresses of its QUIC endpoints, in the order given.
    pub fn quic_addrs(&self) -> &[SocketAddr] {
        &self.quic
    }

    /// Local addresses of its TCP listeners, in the order given.
    pub fn tcp_addrs(&self) -> &[SocketAddr] {
        &self.tcp
    }

    /// Stop accepting: every listener's task ends. QUIC and TCP connections in progress end
    /// with their peers or timeouts; connections from [`BrokerBuilder::accepted`] streams end
    /// now (dropping the `RunningBroker` does the same).
    pub fn shutdown(mut self) {
        self.tasks.abort_all();
    }

    /// Stop as a service stops (`qgate broker` on SIGTERM or Ctrl-C): consumers are handed no
    /// more messages and given up to `grace` to settle what they hold ([`Broker::drain`]);
    /// every QUIC connection is closed with "broker shutting down" (its peers learn at once
    /// instead of after their idle timeout) and the close is given up to `grace` to reach
    /// them; every settlement is made durable ([`Broker::flush`]), so none is delivered again
    /// after a restart (decision M32); then as [`shutdown`](Self::shutdown).
    pub async fn close(self, grace: std::time::Duration) {
        self.broker.drain(grace).await;
        for ep in &self.endpoints {
            ep.close(0u32.into(), b"broker shutting down");
        }
        let idle = futures_util::future::join_all(self.endpoints.iter().map(|e| e.wait_idle()));
        let _ = tokio::time::timeout(grace, idle).await;
        if let Err(e) = self.broker.flush().await {
            tracing::error!(target: "qgate_amqp::broker", error = %e, "message store: settlements may not be durable");
        }
        self.shutdown();
    }
}
