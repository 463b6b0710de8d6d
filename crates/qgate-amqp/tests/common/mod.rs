//! Test helpers shared by the broker's integration tests.

use std::net::SocketAddr;

use qgate_amqp::broker::{Broker, BrokerConfig};
use qgate_amqp::builder::RunningBroker;
use qgate_amqp::client::Connector;
use qgate_amqp::transport::Scheme;
use qgate_transport::{endpoint, DevPki, Socket, TransportOptions};

/// A connector to a broker at `addr` whose certificate `pki` issued.
pub fn connector_to(
    scheme: Scheme,
    addr: SocketAddr,
    pki: &DevPki,
    sasl: Option<(&str, &str)>,
) -> Connector {
    Connector::new(
        scheme,
        addr,
        "localhost",
        &pki.trust(),
        sasl.map(|(u, p)| (u.to_string(), p.to_string())),
        None,
        &TransportOptions::default(),
    )
    .unwrap()
}

/// A broker with `cfg` on a loopback QUIC listener with `scfg`, and its address (the broker
/// stops when the returned value is dropped).
pub fn quic_broker_with(
    cfg: BrokerConfig,
    scfg: quinn::ServerConfig,
) -> (RunningBroker, SocketAddr) {
    let ep = endpoint(
        Socket::bind_udp("127.0.0.1:0".parse().unwrap()).unwrap(),
        Some(scfg),
        None,
    )
    .unwrap();
    let running = Broker::builder().config(cfg).quic(ep).start().unwrap();
    let addr = running.quic_addrs()[0];
    (running, addr)
}
