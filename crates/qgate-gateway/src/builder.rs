//! [`GatewayBuilder`]: the one way a gateway is assembled — by the CLI on real sockets, and by
//! the lab, the benchmarks and the tests on simulated ones (s2n-quic's `Server::builder()`
//! style: every part has a default, the caller names only what differs).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use qgate_forward::forwarder::Forwarder;
use qgate_forward::path::PathConfig;
use qgate_forward::scheduler::{self, Scheduler};
use qgate_transport::http3::ALPN_H3;
use qgate_transport::{
    client_config, shared_driver, ClientAuth, Congestion, Identity, Socket, TransportError,
    TransportOptions, TrustRoots,
};

use crate::gateway::{Gateway, GatewayConfig};
use crate::paths::{
    Backhaul, BackhaulHistory, PathManager, DEFAULT_CONNECTIONS_PER_PATH, MAX_CONNECTIONS_PER_PATH,
};

/// Why a gateway could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A required part is missing.
    #[error("gateway builder: {0} not given")]
    Missing(&'static str),
    /// The scheduler name is unknown.
    #[error("{0}")]
    Scheduler(String),
    /// A path asks for no connection, or for more than a path may have.
    #[error("a backhaul path's connections must be 1 to {MAX_CONNECTIONS_PER_PATH}, not {0}")]
    Connections(usize),
    /// A QUIC endpoint or TLS configuration failed.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// An MQTT door's TCP listener could not be opened.
    #[error("MQTT door on tcp/{0}: {1}")]
    Mqtt(SocketAddr, std::io::Error),
    /// The MQTT door's configuration is wrong.
    #[error("[gateway.mqtt] {0}")]
    MqttConfig(String),
    /// The operating system's randomness could not be read.
    #[error("reading /dev/urandom for the Hash ID generator: {0}")]
    Entropy(std::io::Error),
}

/// How one backhaul path is built, beyond its socket and server address.
#[derive(Debug, Clone, Default)]
pub struct PathOptions {
    /// Shape its egress to a rate and a queue discipline (decision L8): the standing queue
    /// forms in the gateway, under the discipline, instead of in a bloated modem. `/metrics`
    /// reports the shaper's drops, marks and backlog.
    pub shape: Option<qgate_link::LinkParams>,
    /// Its connections' congestion controller; `None`: the gateway transport's (decision G16:
    /// `auto` or BBR where random loss dominates).
    pub congestion: Option<Congestion>,
    /// Its QUIC connections to the server; `None`: [`DEFAULT_CONNECTIONS_PER_PATH`]. Requests
    /// go on the one with the fewest out (decision G21).
    pub connections: Option<usize>,
}

/// Assembles a [`Gateway`]: backhaul paths, the device listener, the scheduler, history and
/// randomness. [`start`](Self::start) needs a tokio runtime.
pub struct GatewayBuilder {
    config: GatewayConfig,
    scheduler: Option<Box<dyn Scheduler>>,
    path_config: PathConfig,
    transport: TransportOptions,
    paths: Vec<(Socket, SocketAddr, PathOptions)>,
    device_socket: Option<Socket>,
    identity: Option<Identity>,
    device_ca: Option<TrustRoots>,
    device_tokens: Option<qgate_transport::token::TokenKey>,
    trust: Option<TrustRoots>,
    history: Option<BackhaulHistory>,
    seed: Option<u64>,
    spool: Option<qgate_spool::Spool>,
    mqtt: Option<crate::mqtt::MqttConfig>,
    mqtt_listen: crate::mqtt::listen::Listen,
}

impl Gateway {
    /// A builder with every default: scheduler [`DEFAULT_SCHEDULER`](qgate_forward::scheduler::DEFAULT_SCHEDULER), [`GatewayConfig::default`],
    /// [`PathConfig::default`], [`TransportOptions::default`], no history, randomness from the
    /// operating system.
    pub fn builder() -> GatewayBuilder {
        GatewayBuilder {
            config: GatewayConfig::default(),
            scheduler: None,
            path_config: PathConfig::default(),
            transport: TransportOptions::default(),
            paths: Vec::new(),
            device_socket: None,
            identity: None,
            device_ca: None,
            device_tokens: None,
            trust: None,
            history: None,
            seed: None,
            spool: None,
            mqtt: None,
            mqtt_listen: Default::default(),
        }
    }
}

impl GatewayBuilder {
    /// Limits and timeouts.
    pub fn with_config(mut self, config: GatewayConfig) -> Self {
        self.config = config;
        self
    }

    /// The scheduler, by name (`single`, `round-robin`, `adaptive`, …).
    pub fn with_scheduler(mut self, name: &str) -> Result<Self, BuildError> {
        self.scheduler = Some(scheduler::by_name(name).map_err(BuildError::Scheduler)?);
        Ok(self)
    }

    /// Probe and path-table settings.
    pub fn with_path_config(mut self, config: PathConfig) -> Self {
        self.path_config = config;
        self
    }

    /// QUIC settings of both sides (the device side has its stream limits cut, decision G7).
    pub fn with_transport(mut self, opts: TransportOptions) -> Self {
        self.transport = opts;
        self
    }

    /// Add a backhaul path: a socket bound to the path's local address, and the server's
    /// address on that path. Paths are numbered in the order added.
    pub fn with_path(self, socket: Socket, server: SocketAddr) -> Self {
        self.with_backhaul(socket, server, PathOptions::default())
    }

    /// Add a backhaul path built with `options`.
    pub fn with_backhaul(
        mut self,
        socket: Socket,
        server: SocketAddr,
        options: PathOptions,
    ) -> Self {
        self.paths.push((socket, server, options));
        self
    }

    /// Add a backhaul path whose egress is shaped to `shape` ([`PathOptions::shape`]).
    pub fn with_shaped_path(
        self,
        socket: Socket,
        server: SocketAddr,
        shape: qgate_link::LinkParams,
    ) -> Self {
        let options = PathOptions {
            shape: Some(shape),
            ..Default::default()
        };
        self.with_backhaul(socket, server, options)
    }

    /// The socket devices reach the gateway on.
    pub fn with_device_socket(mut self, socket: Socket) -> Self {
        self.device_socket = Some(socket);
        self
    }

    /// The certificate devices see.
    pub fn with_identity(mut self, identity: Identity) -> Self {
        self.identity = Some(identity);
        self
    }

    /// Devices must present a certificate signed by `ca`; each is known by the identity it
    /// names (decision G30), which the gateway forwards as `qgate-device`. Without it any
    /// client that reaches the device port may register, known by its address.
    pub fn with_device_ca(mut self, ca: TrustRoots) -> Self {
        self.device_ca = Some(ca);
        self
    }

    /// Devices may prove who they are with a token signed by the operator's key (decision
    /// G33): `authorization: Bearer <JWT>` on the first request of a connection. With a device
    /// CA as well, a certificate becomes optional.
    pub fn with_device_tokens(mut self, key: qgate_transport::token::TokenKey) -> Self {
        self.device_tokens = Some(key);
        self
    }

    /// The roots the server's certificate is checked against.
    pub fn with_server_trust(mut self, trust: TrustRoots) -> Self {
        self.trust = Some(trust);
        self
    }

    /// Backhaul connections start from their path's window history (paper 002).
    pub fn with_history(mut self, history: Option<BackhaulHistory>) -> Self {
        self.history = history;
        self
    }

    /// Keep records no path can take in `spool`, answered as stored, and drain them when a
    /// path returns (issue 50).
    pub fn with_spool(mut self, spool: qgate_spool::Spool) -> Self {
        self.spool = Some(spool);
        self
    }

    /// Open the MQTT front door (issue 51) on TCP `addr` with `config`. It takes any client
    /// id until devices have identities (issue 49): bound to an address that is not loopback,
    /// the gateway says in its first log line that the door is open to anyone.
    pub fn with_mqtt(self, addr: SocketAddr, config: crate::mqtt::MqttConfig) -> Self {
        let mut b = self.with_mqtt_config(config);
        b.mqtt_listen.tcp = Some(crate::mqtt::listen::TcpListen::Addr(addr));
        b
    }

    /// The MQTT door on a listener the caller bound (tests; systemd sockets).
    pub fn with_mqtt_listener(
        self,
        listener: std::net::TcpListener,
        config: crate::mqtt::MqttConfig,
    ) -> Self {
        let mut b = self.with_mqtt_config(config);
        b.mqtt_listen.tcp = Some(crate::mqtt::listen::TcpListen::Listener(listener));
        b
    }

    /// The MQTT door's limits, for whichever transports it listens on (the defaults unless
    /// given).
    pub fn with_mqtt_config(mut self, config: crate::mqtt::MqttConfig) -> Self {
        self.mqtt = Some(config);
        self
    }

    /// MQTT over TLS on TCP `addr`, presenting the device-facing identity; the same rule on
    /// addresses other than loopback as [`with_mqtt`](Self::with_mqtt).
    pub fn with_mqtt_tls(mut self, addr: SocketAddr) -> Self {
        self.mqtt_listen.tls = Some(crate::mqtt::listen::TcpListen::Addr(addr));
        self
    }

    /// MQTT over QUIC (ALPN `mqtt`, single-stream mode) on UDP `addr`, presenting the
    /// device-facing identity; the same rule on addresses other than loopback.
    pub fn with_mqtt_quic(mut self, addr: SocketAddr) -> Self {
        self.mqtt_listen.quic = Some(addr);
        self
    }

    /// Make every random choice (Hash IDs, quinn's connection IDs) follow `seed`, as
    /// simulations need. Without it randomness comes from the operating system: a deployed
    /// gateway's Hash IDs must be unguessable.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Connect the paths, open the device listener and serve devices.
    pub fn start(self) -> Result<RunningGateway, BuildError> {
        if self.paths.is_empty() {
            return Err(BuildError::Missing("a backhaul path"));
        }
        let socket = self
            .device_socket
            .ok_or(BuildError::Missing("the device socket"))?;
        let identity = self
            .identity
            .ok_or(BuildError::Missing("the device-facing identity"))?;
        let trust = self
            .trust
            .ok_or(BuildError::Missing("the server trust roots"))?;
        let scheduler = match self.scheduler {
            Some(s) => s,
            None => {
                scheduler::by_name(scheduler::DEFAULT_SCHEDULER).map_err(BuildError::Scheduler)?
            }
        };
        // Seeds per endpoint and for Hash IDs (decision X6).
        let seed = self.seed;
        let ccfg = client_config(&trust, &[ALPN_H3], &self.transport)?;
        let mut backhaul = Vec::with_capacity(self.paths.len());
        let mut shapers = Vec::with_capacity(self.paths.len());
        for (k, (sock, server, options)) in (1u64..).zip(self.paths) {
            let path_seed = seed.map(|s| s * 10 + k);
            let sock = match options.shape {
                Some(params) => {
                    let (sock, handle) = sock.shaped(params, path_seed.unwrap_or(k))?;
                    shapers.push(Some(handle));
                    sock
                }
                None => {
                    shapers.push(None);
                    sock
                }
            };
            let connections = options.connections.unwrap_or(DEFAULT_CONNECTIONS_PER_PATH);
            if !(1..=MAX_CONNECTIONS_PER_PATH).contains(&connections) {
                return Err(BuildError::Connections(connections));
            }
            let mut path = Backhaul::new(sock, server, &self.config.server_authority, path_seed)?;
            path.congestion = options.congestion;
            path.connections = connections;
            backhaul.push(path);
        }
        let hash_seed = match seed {
            Some(s) => {
                let mut b = [0u8; 32];
                b[..8].copy_from_slice(&s.to_le_bytes());
                b
            }
            None => os_random()?,
        };
        let core = Forwarder::new(
            backhaul.len(),
            self.config.forwarder_config(self.path_config),
            scheduler,
            hash_seed,
            tokio::time::Instant::now().into_std(),
        );
        let paths = PathManager::start_with_history(
            backhaul,
            ccfg,
            self.transport.clone(),
            core,
            self.history,
        );
        let endpoint = self.config.device_endpoint(
            socket,
            &identity,
            match (&self.device_ca, &self.device_tokens) {
                (None, _) => ClientAuth::Off,
                (Some(ca), None) => ClientAuth::Required(ca),
                (Some(ca), Some(_)) => ClientAuth::Optional(ca),
            },
            &self.transport,
            seed.map(|s| s + 1),
        )?;
        let mqtt = if self.mqtt.is_none() && self.mqtt_listen.is_empty() {
            None
        } else {
            let cfg = self.mqtt.unwrap_or_default();
            cfg.check().map_err(BuildError::MqttConfig)?;
            let quic_seed = seed.map(|s| s + 2);
            let bound = crate::mqtt::listen::bind(
                self.mqtt_listen,
                &cfg,
                &identity,
                &self.transport,
                quic_seed,
            )?;
            Some((bound, cfg))
        };
        let mut gateway = Gateway::new(paths, self.config);
        gateway.shapers = shapers;
        gateway.devices_authenticated = self.device_ca.is_some() || self.device_tokens.is_some();
        gateway.devices_by_certificate = self.device_ca.is_some();
        gateway.device_tokens = self.device_tokens;
        if let Some(s) = self.spool.clone() {
            gateway.set_spool(s);
        }
        let gateway = Arc::new(gateway);
        let task = tokio::spawn(gateway.clone().serve_devices(endpoint.clone()));
        let drain = self
            .spool
            .map(|s| tokio::spawn(gateway.clone().drain_spool(s)));
        let mqtt = match mqtt {
            None => None,
            Some((bound, cfg)) => {
                let salt = match seed {
                    Some(s) => s.rotate_left(17) ^ 0x6d71_7474,
                    None => u64::from_le_bytes(os_random()?[..8].try_into().expect("8 bytes")),
                };
                let door = crate::mqtt::MqttDoor::new(gateway.clone(), cfg, salt);
                Some(bound.serve(&door))
            }
        };
        Ok(RunningGateway {
            gateway,
            endpoint,
            task,
            drain,
            mqtt,
        })
    }
}

fn os_random() -> Result<[u8; 32], BuildError> {
    let mut s = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut s))
        .map_err(BuildError::Entropy)?;
    Ok(s)
}

/// A gateway serving devices. Dropping it stops the device listener (the gateway itself lives
/// while requests hold it).
pub struct RunningGateway {
    /// The gateway.
    pub gateway: Arc<Gateway>,
    /// The device listener.
    pub endpoint: shared_driver::Endpoint,
    task: tokio::task::JoinHandle<()>,
    /// The spool's drain, if the gateway has a spool.
    drain: Option<tokio::task::JoinHandle<()>>,
    /// The MQTT door's listeners, if it has a door.
    mqtt: Option<crate::mqtt::listen::Running>,
}

impl RunningGateway {
    /// Where devices reach it.
    pub fn addr(&self) -> SocketAddr {
        self.endpoint.local_addr()
    }

    /// Where MQTT clients reach it over TCP, if its MQTT door listens there.
    pub fn mqtt_addr(&self) -> Option<SocketAddr> {
        self.mqtt.as_ref().and_then(|m| m.tcp)
    }

    /// Where MQTT clients reach it over TLS, if its MQTT door listens there.
    pub fn mqtt_tls_addr(&self) -> Option<SocketAddr> {
        self.mqtt.as_ref().and_then(|m| m.tls)
    }

    /// Where MQTT clients reach it over QUIC, if its MQTT door listens there.
    pub fn mqtt_quic_addr(&self) -> Option<SocketAddr> {
        self.mqtt
            .as_ref()
            .and_then(|m| m.quic.as_ref().map(|(_, a)| *a))
    }

    /// Stop taking MQTT connections (open ones carry on until they close).
    pub fn stop_mqtt(&self) {
        if let Some(m) = &self.mqtt {
            m.stop();
        }
    }

    /// Wait until every path has an RTT sample (connected and probed), at most `limit`;
    /// whether they all have.
    pub async fn paths_measured(&self, limit: Duration) -> bool {
        let until = tokio::time::Instant::now() + limit;
        loop {
            let all = self
                .gateway
                .paths()
                .table()
                .paths()
                .iter()
                .all(|p| p.rtt.is_some());
            if all {
                return true;
            }
            if tokio::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for RunningGateway {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(d) = &self.drain {
            d.abort();
        }
        self.stop_mqtt();
    }
}
