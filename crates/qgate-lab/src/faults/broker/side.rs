//! The broker of the broker scenario: started, stopped as a killed process would be, and started
//! again on the same store and address.

use std::net::SocketAddr;
use std::time::Duration;

use qgate_amqp::broker::{serve_quic, Broker, BrokerConfig, BrokerError};
use qgate_amqp::store::StoreError;
use qgate_amqp::transport::ALPN_AMQP;
use qgate_netsim::{HostId, Network};
use qgate_transport::{endpoint, server_config, DevPki, Socket, TransportOptions};
use tokio::task::JoinHandle;
use tokio::time::sleep;

/// The broker: started, stopped, started again on the same store and address.
pub(super) struct BrokerSide {
    pub(super) net: Network,
    pub(super) host: HostId,
    pub(super) addr: SocketAddr,
    pub(super) cfg: BrokerConfig,
    pub(super) pki: DevPki,
    pub(super) seed: u64,
    pub(super) starts: u64,
    pub(super) running: Option<(Broker, quinn::Endpoint, JoinHandle<()>)>,
}

/// Open the broker (and its store) on a blocking thread. The old broker's store file stays
/// locked until its writer task has ended and its last commit (on a blocking thread, in real
/// time) is done; waiting for that here, where virtual time stands still, keeps the run
/// deterministic.
fn start_blocking(rt: &tokio::runtime::Handle, cfg: &BrokerConfig) -> Result<Broker, BrokerError> {
    let _in = rt.enter();
    let mut tries = 0;
    loop {
        match Broker::start(cfg.clone()) {
            Err(BrokerError::Store(StoreError::Open { .. })) if tries < 400 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            r => return r,
        }
    }
}

impl BrokerSide {
    pub(super) async fn start(&mut self) -> Result<(), String> {
        let mut last = String::new();
        let mut broker = None;
        // If the store is still held after the blocking wait, something in virtual time holds
        // it (a task still serving the old broker): let time pass and try again.
        for _ in 0..50 {
            let (rt, cfg) = (tokio::runtime::Handle::current(), self.cfg.clone());
            match tokio::task::spawn_blocking(move || start_blocking(&rt, &cfg)).await {
                Ok(Ok(b)) => {
                    broker = Some(b);
                    break;
                }
                Ok(Err(e)) => last = e.to_string(),
                Err(e) => last = e.to_string(),
            }
            sleep(Duration::from_millis(100)).await;
        }
        let broker = broker.ok_or_else(|| format!("broker start: {last}"))?;
        // The old endpoint holds the address until its connections have drained.
        let mut sock = None;
        for _ in 0..100 {
            match self.net.bind(self.host, self.addr) {
                Ok(s) => {
                    sock = Some(s);
                    break;
                }
                Err(e) => last = e.to_string(),
            }
            sleep(Duration::from_millis(100)).await;
        }
        let sock = sock.ok_or_else(|| format!("broker bind: {last}"))?;
        let scfg = server_config(&self.pki.server, &[ALPN_AMQP], &TransportOptions::default())
            .map_err(|e| e.to_string())?;
        let ep = endpoint(
            Socket::from(sock),
            Some(scfg),
            Some(self.seed.wrapping_mul(7919).wrapping_add(self.starts)),
        )
        .map_err(|e| e.to_string())?;
        self.starts += 1;
        let serve = tokio::spawn(serve_quic(broker.clone(), ep.clone(), None));
        self.running = Some((broker, ep, serve));
        Ok(())
    }

    /// Stop as a killed process would, as far as clients can tell: every connection closed at
    /// once, nothing more answered. The store closes when the last task serving it ends.
    pub(super) fn stop(&mut self) {
        if let Some((broker, ep, serve)) = self.running.take() {
            ep.close(0u32.into(), b"broker restart");
            serve.abort();
            drop(broker);
        }
    }

    pub(super) fn broker(&self) -> Option<&Broker> {
        self.running.as_ref().map(|(b, _, _)| b)
    }
}
