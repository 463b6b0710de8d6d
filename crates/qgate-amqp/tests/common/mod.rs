//! Test helpers shared by the broker's integration tests.

use std::net::SocketAddr;

use qgate_amqp::broker::{serve_quic, Broker};
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

/// `broker` on a loopback QUIC listener with `scfg`; its address.
pub fn quic_listener(broker: &Broker, scfg: quinn::ServerConfig) -> SocketAddr {
    let ep = endpoint(
        Socket::bind_udp("127.0.0.1:0".parse().unwrap()).unwrap(),
        Some(scfg),
        None,
    )
    .unwrap();
    let addr = ep.local_addr().unwrap();
    tokio::spawn(serve_quic(broker.clone(), ep));
    addr
}
