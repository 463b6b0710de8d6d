//! `qgate broker`, `qgate send`, `qgate recv`: AMQP 1.0 over QUIC or TCP(+TLS) (paper 003).

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use qgate_amqp::auth::Credentials;
use qgate_amqp::broker::{Broker, BrokerConfig};
use qgate_amqp::client::{self, Connector, RecvSpec, Report, SendSpec};
use qgate_amqp::transport::{self, Scheme, ALPN_AMQP};
use qgate_transport::{
    server_config_with_client_auth, server_endpoint, DevPki, Identity, Socket, TrustRoots,
};

use qgate_amqp::bridge::BridgeConfig;
use qgate_amqp::url::Upstream;

use crate::config::{parse_duration, BridgeSection, BrokerSection, Config};
use crate::{default_dev_pki_dir, dflt, usage, Failure};

#[derive(Args, Debug)]
pub struct BrokerArgs {
    /// UDP address for AMQP over QUIC [default: 0.0.0.0:5671 unless only TCP listeners are given].
    #[arg(long, value_name = "ADDR")]
    quic: Option<SocketAddr>,
    /// TCP address for AMQP over TLS (1.3 or 1.2).
    #[arg(long, value_name = "ADDR")]
    tls: Option<SocketAddr>,
    /// TCP address for plain AMQP.
    #[arg(long, value_name = "ADDR")]
    tcp: Option<SocketAddr>,
    /// Durable store: messages accepted into queues survive a crash [default: $QGATE_HOME/broker.redb].
    #[arg(long, value_name = "FILE")]
    store: Option<PathBuf>,
    /// Keep queues in memory only (no store).
    #[arg(long)]
    memory: bool,
    /// SASL PLAIN users: a TOML file with a [users] table of name = "password".
    #[arg(long, value_name = "FILE")]
    credentials: Option<PathBuf>,
    /// Also admit SASL ANONYMOUS when --credentials is given (always admitted without it).
    #[arg(long)]
    anonymous: bool,
    #[arg(long, help = dflt(
        "Refuse connections that skip the SASL layer (plain AMQP header, go-amqp's default); they are otherwise served as ANONYMOUS while ANONYMOUS is admitted",
        if BrokerConfig::default().plain_amqp { "served" } else { "refused" }))]
    no_plain_amqp: bool,
    /// Refuse links to queues not declared in [[broker.queues]] (amqp:not-found).
    #[arg(long)]
    no_auto_create: bool,
    #[arg(long, help = dflt("Most messages per auto-created queue", BrokerConfig::default().max_messages))]
    max_messages: Option<usize>,
    #[arg(long, value_name = "BYTES", value_parser = crate::parse_size, help = dflt("Most bytes per auto-created queue", BrokerConfig::default().max_bytes))]
    max_bytes: Option<usize>,
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, help = dflt(
        "Protocol header, SASL and open must be done within this (TLS included); a frame held for credit, and the wait for a peer's close, are bounded by it too",
        secs(BrokerConfig::default().handshake_timeout)))]
    handshake_timeout: Option<Duration>,
    #[arg(long, value_name = "DURATION|off", value_parser = qgate_core::units::parse_timeout, help = dflt(
        "Close a connection that receives nothing (or takes no bytes) this long; half is announced as AMQP idle-time-out, and empty frames are sent as often as a peer asks",
        secs(BrokerConfig::default().idle_timeout)))]
    idle_timeout: Option<Duration>,
    #[arg(long, value_name = "N", help = dflt("Most connections held at once, from every address (more are closed on accept)", BrokerConfig::default().max_connections))]
    max_connections: Option<usize>,
    #[arg(long, value_name = "N", help = dflt("Most connections from one IP address at once (more are closed on accept)", BrokerConfig::default().max_connections_per_address))]
    max_connections_per_address: Option<usize>,
    #[arg(long, value_name = "N", help = dflt("Most sessions per AMQP connection", BrokerConfig::default().max_sessions))]
    max_sessions: Option<usize>,
    /// Longest a message waits in an auto-created queue (e.g. 10m) [default: forever].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    ttl: Option<Duration>,
    #[command(flatten)]
    admin: crate::admin::AdminArgs,
    /// PEM certificate chain (with --key) [default: the development certificate].
    #[arg(long, value_name = "FILE", requires = "key")]
    cert: Option<PathBuf>,
    /// PEM key for --cert.
    #[arg(long, value_name = "FILE", requires = "cert")]
    key: Option<PathBuf>,
    /// Clients (QUIC and TLS) must present a certificate signed by this CA (PEM).
    #[arg(long, value_name = "FILE")]
    client_ca: Option<PathBuf>,
    /// Forward the local QUEUE to an upstream broker, store and forward: messages wait here
    /// (durably) while it is unreachable and are settled here only once it accepted them
    /// (repeatable; also [[broker.bridges]]). URL: amqp://[USER:PASS@]HOST[:PORT]/QUEUE,
    /// amqps://… or amqp+quic://….
    #[arg(long, value_name = "QUEUE=URL")]
    bridge: Vec<String>,
    /// CA certificate(s) (PEM) of --bridge's amqps or amqp+quic upstreams [default: the
    /// development CA].
    #[arg(long, value_name = "FILE")]
    bridge_ca: Option<PathBuf>,
}

/// A duration as the flags read it back (`off` for none).
fn secs(d: Duration) -> String {
    qgate_core::units::format_timeout(d)
}

/// The section's broker configuration with the flags over it; the broker validates it.
fn broker_config(a: &BrokerArgs, b: &BrokerSection) -> Result<BrokerConfig, Failure> {
    let mut c = b.config.clone();
    let anonymous = a.anonymous || b.anonymous.unwrap_or(false);
    c.credentials = match a.credentials.clone().or(b.credentials.clone()) {
        Some(f) => Credentials::load(&f, anonymous).map_err(usage)?,
        None => Credentials::anonymous(),
    };
    c.max_messages = a.max_messages.unwrap_or(c.max_messages);
    c.max_bytes = a.max_bytes.unwrap_or(c.max_bytes);
    c.default_ttl = a.ttl.or(c.default_ttl);
    c.handshake_timeout = a.handshake_timeout.unwrap_or(c.handshake_timeout);
    c.idle_timeout = a.idle_timeout.unwrap_or(c.idle_timeout);
    c.max_connections = a.max_connections.unwrap_or(c.max_connections);
    c.max_connections_per_address = a
        .max_connections_per_address
        .unwrap_or(c.max_connections_per_address);
    c.max_sessions = a.max_sessions.unwrap_or(c.max_sessions);
    c.plain_amqp &= !a.no_plain_amqp;
    c.auto_create &= !a.no_auto_create;
    c.store = if a.memory || b.memory.unwrap_or(false) {
        None
    } else {
        Some(
            a.store
                .clone()
                .or(c.store)
                .unwrap_or_else(|| crate::home_file("broker.redb")),
        )
    };
    c.validate()
        .map_err(|e| usage(format!("[broker] or its flags: {e}")))?;
    Ok(c)
}

pub fn broker(a: BrokerArgs, cfg: &Config) -> Result<(), Failure> {
    let b = &cfg.broker;
    let bcfg = broker_config(&a, b)?;
    let tcp = a.tcp.or(b.tcp);
    let tls = a.tls.or(b.tls);
    let quic = a.quic.or(b.quic).or_else(|| {
        (tcp.is_none() && tls.is_none()).then(|| "0.0.0.0:5671".parse().expect("valid"))
    });
    let identity = match (
        a.cert.clone().or(b.cert.clone()),
        a.key.clone().or(b.key.clone()),
    ) {
        (Some(c), Some(k)) => Identity::from_pem_files(&c, &k).map_err(usage)?,
        (None, None) => {
            DevPki::load_or_create(&default_dev_pki_dir())
                .map_err(usage)?
                .server
        }
        _ => return Err(usage("give both a certificate and a key")),
    };
    let client_ca = match a.client_ca.clone().or(b.client_ca.clone()) {
        Some(f) => Some(TrustRoots::from_pem_file(&f).map_err(usage)?),
        None => None,
    };
    let store_path = bcfg.store.clone();
    let mut bridges = b.bridges.clone();
    for spec in &a.bridge {
        let (queue, upstream) = spec
            .split_once('=')
            .filter(|(q, u)| !q.is_empty() && !u.is_empty())
            .ok_or_else(|| usage(format!("--bridge takes QUEUE=URL, not '{spec}'")))?;
        bridges.push(BridgeSection {
            queue: queue.to_string(),
            upstream: upstream.to_string(),
            ca: a.bridge_ca.clone(),
        });
    }
    let bridges = bridges
        .iter()
        .map(|b| bridge_config(b, cfg))
        .collect::<Result<Vec<_>, _>>()?;
    crate::runtime().block_on(async move {
        // Watch for Ctrl-C and SIGTERM before saying the service is up.
        let stop = crate::stop_requested();
        let mut builder = Broker::builder().config(bcfg);
        let mut shown = Vec::new();
        for b in bridges {
            shown.push(format!("bridge {} → {}", b.queue, b.upstream_name));
            builder = builder.bridge(b);
        }
        if let Some(addr) = quic {
            let opts = transport::broker_options(&cfg.transport);
            let scfg =
                server_config_with_client_auth(&identity, &[ALPN_AMQP], &opts, client_ca.as_ref())
                    .map_err(usage)?;
            // Its stateless-reset key from its identity, so a restart resets old connections (T11).
            let ep = server_endpoint(
                Socket::bind_udp(addr).map_err(usage)?,
                scfg.clone(),
                &identity,
                None,
                &opts.tasks,
            )?;
            builder = builder.quic_with(ep, scfg, opts);
        }
        let bind = |addr: SocketAddr| async move {
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding tcp/{addr}"))
        };
        if let Some(addr) = tls {
            let tcfg =
                transport::tls_server_config(&identity, client_ca.as_ref()).map_err(usage)?;
            builder = builder.tcp(bind(addr).await?, Some(tcfg));
        }
        if let Some(addr) = tcp {
            builder = builder.tcp(bind(addr).await?, None);
        }
        let running = builder.start().map_err(usage)?;
        let broker = running.broker().clone();
        let mut listening: Vec<String> = running
            .quic_addrs()
            .iter()
            .map(|a| format!("quic udp/{a}"))
            .collect();
        // TCP listeners in the order given: TLS first.
        let mut tcp_addrs = running.tcp_addrs().iter();
        if tls.is_some() {
            listening.extend(tcp_addrs.next().map(|a| format!("tcp-tls tcp/{a}")));
        }
        listening.extend(tcp_addrs.map(|a| format!("tcp tcp/{a}")));
        let admin = crate::admin::start(&a.admin, b.admin.as_deref(), cfg, || {
            qgate_admin::Admin::builder()
                .metrics(broker.collector())
                .api(crate::admin::BrokerApi::new(broker.clone(), cfg.clone()))
        })
        .await?;
        listening.extend(admin.as_ref().map(|(_, l)| l.clone()));
        listening.extend(shown);
        println!(
            "qgate broker listening: {}; store {}",
            listening.join(", "),
            store_path
                .as_ref()
                .map_or("none (memory only)".to_string(), |p| p
                    .display()
                    .to_string())
        );
        std::io::stdout().flush().ok();
        stop.await;
        eprintln!("qgate: shutting down");
        // Consumers settle what they hold and every settlement is made durable (M32); QUIC
        // peers are told now (TCP peers see their sockets close when the process exits).
        running.close(Duration::from_secs(1)).await;
        for q in broker.queue_stats() {
            eprintln!(
                "qgate: queue {}: {} held, {} enqueued, {} settled",
                q.name, q.depth, q.stats.enqueued, q.stats.acked
            );
        }
        Ok(())
    })
}

/// One bridge from its section: the URL parsed (no password in errors), the upstream resolved at
/// every connection attempt.
fn bridge_config(b: &BridgeSection, cfg: &Config) -> Result<BridgeConfig, Failure> {
    let url = qgate_amqp::url::parse(&b.upstream)
        .and_then(|u| u.password_from(std::env::var("QGATE_AMQP_PASSWORD").ok()))
        .map_err(|e| usage(format!("bridge of queue '{}': {e}", b.queue)))?;
    let trust = match &b.ca {
        Some(f) => TrustRoots::from_pem_file(f).map_err(usage)?,
        None => DevPki::load_or_create(&default_dev_pki_dir())
            .map_err(usage)?
            .trust(),
    };
    // A dead upstream is noticed within seconds, not quinn's 30 s (M20).
    let opts = client::with_idle_timeout(&cfg.transport, client::DEFAULT_IDLE_TIMEOUT);
    let name = url.to_string();
    let address = url.address.clone();
    Ok(BridgeConfig::new(
        &b.queue,
        Upstream::Url { url, trust, opts },
        &address,
        &name,
    ))
}

/// Where a client connects.
#[derive(Args, Debug, Clone)]
pub struct Target {
    /// The broker: HOST:PORT (names are resolved, e.g. broker.example:5671), or a URL
    /// amqp+quic://[USER[:PASSWORD]@]HOST[:PORT]/QUEUE (also amqp:// for TCP, amqps:// for TLS
    /// 1.3), which names the queue and the transport too.
    #[arg(value_name = "BROKER")]
    broker: String,
    /// Queue address (a URL names it in its path instead).
    #[arg(value_name = "QUEUE")]
    queue: Option<String>,
    /// quic, quic-mux (every AMQP connection a stream of one shared QUIC connection: one handshake for all of `send --one-per-connection`'s), tcp-tls (TLS 1.3), tcp-tls12 or tcp [default: the URL's scheme, else quic].
    #[arg(long, value_name = "SCHEME")]
    transport: Option<Scheme>,
    /// Pre-settled (at-most-once) instead of unsettled (at-least-once).
    #[arg(long)]
    settle: bool,
    /// SASL PLAIN user (password from --password or QGATE_AMQP_PASSWORD) [default: ANONYMOUS].
    #[arg(long)]
    user: Option<String>,
    /// SASL PLAIN password.
    #[arg(long, env = "QGATE_AMQP_PASSWORD", hide_env_values = true)]
    password: Option<String>,
    /// CA certificate of the broker, PEM [default: the development CA].
    #[arg(long, value_name = "FILE")]
    ca: Option<PathBuf>,
    /// The name on the broker's certificate [default: the broker's host name; localhost for an
    /// IP address].
    #[arg(long)]
    server_name: Option<String>,
    /// Link name [default: qgate-send / qgate-recv].
    #[arg(long)]
    link_name: Option<String>,
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, help = dflt(
        "Give up on a QUIC broker silent this long (keep-alives every third of it); overrides [transport] idle_timeout_ms",
        secs(client::DEFAULT_IDLE_TIMEOUT)))]
    idle_timeout: Option<Duration>,
    /// TLS client certificate chain, PEM (with --key; quic or tcp-tls).
    #[arg(long, value_name = "FILE", requires = "key")]
    cert: Option<PathBuf>,
    /// Key for --cert, PEM.
    #[arg(long, value_name = "FILE", requires = "cert")]
    key: Option<PathBuf>,
}

/// Where a `send` or `recv` goes, once its BROKER and QUEUE are read.
struct Resolved {
    addr: SocketAddr,
    scheme: Scheme,
    server_name: String,
    queue: String,
    credentials: Option<(String, String)>,
}

impl Target {
    /// BROKER (an address, HOST:PORT or a URL) and QUEUE, with the flags that may override them.
    fn resolve(&self) -> Result<Resolved, Failure> {
        let (host, port, scheme, queue, credentials) = if self.broker.contains("://") {
            let url = qgate_amqp::url::parse(&self.broker)
                .and_then(|u| u.password_from(self.password.clone()))
                .map_err(usage)?;
            let family = |s: Scheme| matches!(s, Scheme::Quic | Scheme::QuicMux);
            let scheme = match self.transport {
                Some(t) if family(t) != family(url.scheme) || (!family(t) && t != url.scheme) => {
                    return Err(usage(format!(
                        "the URL's scheme means --transport {}, not {t}: give one",
                        url.scheme
                    )))
                }
                Some(t) => t,
                None => url.scheme,
            };
            // The parser insists on a queue in the path.
            let queue = match &self.queue {
                Some(q) if *q != url.address => {
                    return Err(usage(format!(
                        "the URL names queue '{}' and QUEUE is '{q}': give one",
                        url.address
                    )))
                }
                _ => url.address.clone(),
            };
            // --user applies to a URL without one; a different user in both is a conflict.
            let credentials = match (url.credentials, &self.user) {
                (Some((u, _)), Some(flag)) if u != *flag => {
                    return Err(usage(format!(
                        "the URL's user is '{u}' and --user is '{flag}': give one"
                    )))
                }
                (Some(c), _) => Some(c),
                (None, Some(u)) => Some((
                    u.clone(),
                    self.password
                        .clone()
                        .ok_or_else(|| usage("--user needs --password (or QGATE_AMQP_PASSWORD)"))?,
                )),
                (None, None) => None,
            };
            (url.host, url.port, scheme, queue, credentials)
        } else {
            let (host, port) = self
                .broker
                .rsplit_once(':')
                .and_then(|(h, p)| Some((h.trim_matches(['[', ']']), p.parse::<u16>().ok()?)))
                .filter(|(h, _)| !h.is_empty())
                .ok_or_else(|| {
                    usage(format!(
                        "'{}' is not a broker: give HOST:PORT or an amqp+quic://HOST/QUEUE URL",
                        self.broker
                    ))
                })?;
            let queue = self.queue.clone().ok_or_else(|| {
                usage("give the QUEUE after the broker (or a URL ending in /QUEUE)")
            })?;
            let credentials = match (&self.user, &self.password) {
                (Some(u), Some(p)) => Some((u.clone(), p.clone())),
                (Some(_), None) => {
                    return Err(usage("--user needs --password (or QGATE_AMQP_PASSWORD)"))
                }
                _ => None,
            };
            (
                host.to_string(),
                port,
                self.transport.unwrap_or(Scheme::Quic),
                queue,
                credentials,
            )
        };
        use std::net::ToSocketAddrs;
        // IPv4 first: the broker's default listeners are 0.0.0.0, and `localhost` often
        // resolves to ::1 first.
        let addr = (host.as_str(), port)
            .to_socket_addrs()
            .map_err(|e| Failure {
                status: 1,
                error: anyhow::anyhow!("cannot resolve the broker's host '{host}': {e}"),
            })?
            .min_by_key(|a| a.is_ipv6())
            .ok_or_else(|| Failure {
                status: 1,
                error: anyhow::anyhow!("the broker's host '{host}' has no address"),
            })?;
        let server_name = self.server_name.clone().unwrap_or_else(|| {
            if host.parse::<std::net::IpAddr>().is_ok() {
                "localhost".into()
            } else {
                host.clone()
            }
        });
        Ok(Resolved {
            addr,
            scheme,
            server_name,
            queue,
            credentials,
        })
    }

    fn connector(&self, cfg: &Config) -> Result<(Connector, String), Failure> {
        let r = self.resolve()?;
        let trust = match &self.ca {
            Some(f) => TrustRoots::from_pem_file(f).map_err(usage)?,
            None => DevPki::load_or_create(&default_dev_pki_dir())
                .map_err(usage)?
                .trust(),
        };
        let sasl = r.credentials.clone();
        // A dead broker is noticed within this, not quinn's 30 s (M20).
        let opts = client::with_idle_timeout(
            &cfg.transport,
            self.idle_timeout.unwrap_or(client::DEFAULT_IDLE_TIMEOUT),
        );
        let c = Connector::new(r.scheme, r.addr, &r.server_name, &trust, sasl, None, &opts)
            .map_err(usage)?;
        let c = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => {
                let id = Identity::from_pem_files(cert, key).map_err(usage)?;
                c.with_client_identity(&trust, &id).map_err(usage)?
            }
            _ => c,
        };
        Ok((c, r.queue))
    }
}

#[derive(Args, Debug)]
pub struct SendArgs {
    #[command(flatten)]
    target: Target,
    /// Messages to send (ignored with --stdin).
    #[arg(long, default_value_t = 1000)]
    count: u64,
    /// Body bytes per message (e.g. 100, 4KiB).
    #[arg(long, default_value_t = 100, value_parser = crate::parse_size)]
    size: usize,
    /// Messages per second [default: as fast as credit allows].
    #[arg(long)]
    rate: Option<f64>,
    /// Send each line of standard input as one message instead.
    #[arg(long)]
    stdin: bool,
    /// Each message on a new connection, its whole opening pipelined in one flight (in 0-RTT
    /// when QUIC holds a ticket): paper 003's multiple-connections case. Bodies up to 64,512
    /// bytes (one frame); --rate paces connections, --window does not apply; each connection
    /// has 10 s.
    #[arg(long)]
    one_per_connection: bool,
    /// Unsettled messages in flight.
    #[arg(long, default_value_t = 500)]
    window: usize,
}

#[derive(Args, Debug)]
pub struct RecvArgs {
    #[command(flatten)]
    target: Target,
    /// Stop after this many messages [default: until --idle passes without one].
    #[arg(long)]
    count: Option<u64>,
    /// Stop after this long without a message.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    idle: Duration,
    /// Link credit.
    #[arg(long, default_value_t = 500)]
    credit: u32,
    /// Print each body (as text) on standard output.
    #[arg(long)]
    print: bool,
}

/// The summary line `send` and `recv` print, which [`parse_send_line`] reads back.
fn report(what: &str, r: &Report, scheme: Scheme) {
    eprintln!(
        "{what} {} messages ({} bytes) over {scheme}{}: startup {:.2} ms, total {:.3} s, {:.0} msg/s",
        r.messages,
        r.bytes,
        if r.zero_rtt { " (0-RTT)" } else { "" },
        r.startup.as_secs_f64() * 1e3,
        r.total.as_secs_f64(),
        r.rate()
    );
}

/// `total` and `startup` from `qgate send`'s summary line: "sent N messages (B bytes) over
/// SCHEME: startup X ms, total Y s, R msg/s".
pub fn parse_send_line(out: &str) -> Option<(f64, f64)> {
    let line = out.lines().rev().find(|l| l.starts_with("sent "))?;
    let after = |key: &str| -> Option<f64> {
        let at = line.find(key)? + key.len();
        line[at..].split_whitespace().next()?.parse().ok()
    };
    Some((after("total ")?, after("startup ")?))
}

pub fn send(a: SendArgs, cfg: &Config) -> Result<(), Failure> {
    if a.rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
        return Err(usage("--rate must be a positive number"));
    }
    let rt = crate::runtime();
    let _in_runtime = rt.enter();
    let (connector, queue) = a.target.connector(cfg)?;
    let spec = SendSpec {
        address: queue,
        settled: a.target.settle,
        window: a.window.max(1),
        rate: a.rate,
        link_name: a
            .target
            .link_name
            .clone()
            .unwrap_or_else(|| "qgate-send".into()),
    };
    let bodies: Box<dyn Iterator<Item = Vec<u8>> + Send> = if a.stdin {
        let lines: Vec<Vec<u8>> = std::io::stdin()
            .lock()
            .lines()
            .collect::<Result<Vec<_>, _>>()
            .context("reading standard input")?
            .into_iter()
            .map(String::into_bytes)
            .collect();
        Box::new(lines.into_iter())
    } else {
        let size = a.size;
        Box::new((0..a.count).map(move |_| vec![b'x'; size]))
    };
    // The report fills as outcomes arrive, so whatever ends the run — success, a failure, a
    // dead broker, Ctrl-C or SIGTERM — the accepted count is printed (M20).
    let mut r = Report::default();
    let started = tokio::time::Instant::now();
    let outcome = rt.block_on(async {
        let run = async {
            if a.one_per_connection {
                one_per_connection(&connector, &spec, bodies, &mut r).await
            } else {
                client::send_into(&connector, &spec, bodies, &mut r).await
            }
        };
        let stop = crate::stop_requested();
        tokio::select! {
            biased;
            o = run => o.map_err(anyhow::Error::from),
            () = stop => Err(anyhow::anyhow!("interrupted")),
        }
    });
    if r.total.is_zero() {
        r.total = started.elapsed();
    }
    report("sent", &r, connector.scheme());
    if let Err(e) = outcome {
        return Err(anyhow::anyhow!(
            "{e:#} (the broker had accepted {} messages{})",
            r.messages,
            if r.rejected > 0 {
                format!(", rejected {}", r.rejected)
            } else {
                String::new()
            }
        )
        .into());
    }
    if r.rejected > 0 {
        return Err(anyhow::anyhow!(
            "the broker refused {} messages (first: {})",
            r.rejected,
            r.first_error.unwrap_or_default()
        )
        .into());
    }
    Ok(())
}

/// Every body on its own pipelined connection; startup is the mean over connections.
async fn one_per_connection(
    connector: &Connector,
    spec: &SendSpec,
    bodies: Box<dyn Iterator<Item = Vec<u8>> + Send>,
    total: &mut Report,
) -> Result<(), qgate_amqp::client::ClientError> {
    let run = client::run_id();
    let start = tokio::time::Instant::now();
    let mut startups = Duration::ZERO;
    let mut zero_rtt = 0u64;
    let mut n = 0u32;
    for (i, body) in bodies.enumerate() {
        // --rate paces the connections as it paces messages on one.
        if let Some(r) = spec.rate.filter(|r| *r > 0.0) {
            tokio::time::sleep_until(start + Duration::from_secs_f64(i as f64 / r)).await;
        }
        let msg = client::message_with_id(
            fe2o3_amqp::types::messaging::MessageId::String(format!("{run:016x}-{i}")),
            body,
        );
        let r = qgate_amqp::oneshot::send_one(
            connector,
            &spec.address,
            &msg,
            spec.settled,
            Duration::from_secs(10),
        )
        .await?;
        n += 1;
        startups += r.startup;
        zero_rtt += u64::from(r.zero_rtt);
        total.messages += r.messages;
        total.bytes += r.bytes;
        total.rejected += r.rejected;
        if total.first_error.is_none() {
            total.first_error = r.first_error;
        }
        total.startup = startups / n;
        total.total = start.elapsed();
        total.zero_rtt = zero_rtt > 0;
    }
    match connector.quic_handshakes() {
        Some(h) => eprintln!(
            "{n} connections over {h} QUIC handshake(s), {zero_rtt} resumed with 0-RTT; startup is the mean per connection"
        ),
        None => eprintln!("{n} connections; startup is the mean per connection"),
    }
    connector.close_shared().await;
    Ok(())
}

pub fn recv(a: RecvArgs, cfg: &Config) -> Result<(), Failure> {
    let rt = crate::runtime();
    let _in_runtime = rt.enter();
    let (connector, queue) = a.target.connector(cfg)?;
    let spec = RecvSpec {
        address: queue,
        settled: a.target.settle,
        count: a.count,
        idle: a.idle,
        credit: a.credit.max(1),
        link_name: a
            .target
            .link_name
            .clone()
            .unwrap_or_else(|| "qgate-recv".into()),
    };
    let out = Arc::new(std::sync::Mutex::new(std::io::stdout()));
    let print = a.print;
    let r = rt
        .block_on(client::receive(&connector, &spec, |b| {
            if print {
                let mut o = out.lock().unwrap_or_else(|e| e.into_inner());
                let _ = o.write_all(b);
                let _ = o.write_all(b"\n");
            }
        }))
        .map_err(anyhow::Error::from)?;
    report("received", &r, connector.scheme());
    if a.count.is_some_and(|n| r.messages < n) {
        return Err(anyhow::anyhow!(
            "received {} of {} messages before --idle",
            r.messages,
            a.count.unwrap_or(0)
        )
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_send_summary_line_is_read() {
        let out = "10 connections over 10 QUIC handshake(s), 9 resumed with 0-RTT; startup is \
                   the mean per connection\nsent 10 messages (1380 bytes) over quic (0-RTT): \
                   startup 1.58 ms, total 0.069 s, 144 msg/s\n";
        assert_eq!(parse_send_line(out), Some((0.069, 1.58)));
        assert_eq!(parse_send_line("qgate: error: refused\n"), None);
    }
}
