//! System benchmarks on real loopback sockets (and the simulator's own speed): every result is a
//! ratio against a baseline measured in the same run, because the machines are shared and noisy.

pub mod amqp;
pub mod gateway;
pub mod pipeline;
pub mod spool;
pub mod transport;

/// The gateway every bench measures: on loopback, two backhaul paths (from 127.0.0.2 and
/// 127.0.0.3) to `server`, shaped by `shape` or not, returned once both paths have an RTT.
pub(crate) async fn loopback_gateway(
    opts: &qgate_transport::TransportOptions,
    pki: &qgate_transport::DevPki,
    server: std::net::SocketAddr,
    shape: Option<&qgate_link::LinkParams>,
    batch: bool,
) -> qgate_gateway::builder::RunningGateway {
    use qgate_transport::Socket;
    let bind = |a: &str| Socket::bind_udp(a.parse().expect("valid address")).expect("bind");
    let mut builder = qgate_gateway::gateway::Gateway::builder()
        .with_config(qgate_gateway::gateway::GatewayConfig {
            batch_max_record: if batch {
                qgate_gateway::gateway::GatewayConfig::default().batch_max_record
            } else {
                0
            },
            ..Default::default()
        })
        .with_transport(opts.clone())
        .with_identity(pki.server.clone())
        .with_server_trust(pki.trust())
        .with_device_socket(bind("127.0.0.1:0"));
    for l in ["127.0.0.2:0", "127.0.0.3:0"] {
        builder = match shape {
            Some(params) => builder.with_shaped_path(bind(l), server, params.clone()),
            None => builder.with_path(bind(l), server),
        };
    }
    let running = builder.start().expect("gateway");
    while running
        .gateway
        .paths()
        .table()
        .paths()
        .iter()
        .any(|p| p.rtt.is_none())
    {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    running
}
