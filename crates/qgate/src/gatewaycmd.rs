//! `qgate gateway` and `qgate device`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use clap::Args;
use qgate_forward::path::PathConfig;
use qgate_gateway::device::Device;
use qgate_gateway::gateway::{Gateway, GatewayConfig};
use qgate_transport::http3::{H3Client, ALPN_H3};
use qgate_transport::{client_config_with_identity, connect, endpoint, DevPki, Socket, TrustRoots};

use crate::config::{parse_duration, Config};
use crate::{default_dev_pki_dir, dflt, usage, Failure};

/// Where `qgate gateway` listens for devices unless told.
const DEFAULT_LISTEN: &str = "0.0.0.0:4443";

#[derive(Args, Debug)]
pub struct GatewayArgs {
    #[command(flatten)]
    admin: crate::admin::AdminArgs,
    #[arg(long, value_name = "ADDR", help = dflt("Device-facing UDP address", DEFAULT_LISTEN))]
    listen: Option<SocketAddr>,
    /// The server's address, for paths that do not name their own.
    #[arg(long, value_name = "ADDR")]
    server: Option<SocketAddr>,
    /// A backhaul path: LOCAL_ADDR or LOCAL_ADDR=SERVER_ADDR (repeat; replaces the config's
    /// paths, and with them their shape, congestion and connections, which only the config file
    /// sets).
    #[arg(long = "path", value_name = "LOCAL[=SERVER]")]
    paths: Vec<String>,
    #[arg(long, value_name = "NAME", help = dflt(
        "Path choice: completion (per request, ours), adaptive or adaptive-packets (paper 000, hits as devices or as packets), round-robin or single", qgate_forward::scheduler::DEFAULT_SCHEDULER))]
    scheduler: Option<String>,
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, help = dflt(
        "Routine probe period", secs(PathConfig::default().probe_interval)))]
    probe_interval: Option<Duration>,
    /// CA certificate(s) of the server, PEM [default: the development CA].
    #[arg(long, value_name = "FILE")]
    ca: Option<PathBuf>,
    /// Devices must present a client certificate signed by this CA (PEM; `qgate pki` makes
    /// one), and are known by the name it gives them [default: [gateway] device_ca, else
    /// devices are not authenticated: keep the device port on loopback then].
    #[arg(long, value_name = "FILE")]
    device_ca: Option<PathBuf>,
    /// Devices may prove who they are with a token signed by this Ed25519 key (PEM public
    /// key; `qgate pki token-key` makes one) [default: [gateway] device_token_key].
    #[arg(long, value_name = "FILE")]
    device_token_key: Option<PathBuf>,
    #[arg(long, help = dflt("Most devices at once", GatewayConfig::default().max_devices))]
    max_devices: Option<usize>,
    #[arg(long, help = dflt("Most requests in flight per device", GatewayConfig::default().max_inflight_per_device))]
    max_inflight_per_device: Option<usize>,
    #[arg(long, help = dflt("Most sessions one device connection may register", GatewayConfig::default().max_sessions_per_connection))]
    max_sessions_per_connection: Option<usize>,
    #[arg(long, help = dflt("Most sessions registered from one source IP address", GatewayConfig::default().max_sessions_per_address))]
    max_sessions_per_address: Option<usize>,
    #[arg(long, value_name = "DURATION", value_parser = parse_duration,
          help = dflt("A session with nothing in flight expires after this long idle", secs(GatewayConfig::default().session_idle_timeout)))]
    session_idle_timeout: Option<Duration>,
    #[arg(long, help = dflt("Most device handshakes in progress, a budget of their own", GatewayConfig::default().max_handshakes))]
    max_handshakes: Option<usize>,
    #[arg(long, value_name = "N", help = dflt("Most device handshakes in progress from one source IP address (an IPv6 /64 counts as one)", GatewayConfig::default().max_handshakes_per_address))]
    max_handshakes_per_address: Option<usize>,
    #[arg(long, value_name = "N", help = dflt("With N handshakes in progress, new devices must first pass a QUIC Retry (address validation)", GatewayConfig::default().retry_above))]
    retry_above: Option<usize>,
    #[arg(long, value_name = "DURATION", value_parser = parse_duration,
          help = dflt("A device handshake not finished within this long is closed", secs(GatewayConfig::default().handshake_timeout)))]
    handshake_timeout: Option<Duration>,
    #[arg(long, value_name = "DURATION", value_parser = parse_duration,
          help = dflt("A device handshake whose peer sends nothing for this long is closed", secs(GatewayConfig::default().handshake_silence)))]
    handshake_silence: Option<Duration>,
    #[arg(long, value_name = "DURATION", value_parser = parse_duration,
          help = dflt("Per-attempt timeout of a forwarded request", secs(GatewayConfig::default().request_timeout)))]
    request_timeout: Option<Duration>,
    #[arg(long, value_name = "BYTES", value_parser = crate::parse_size, help = dflt("Largest request body, bytes", GatewayConfig::default().max_body))]
    max_body: Option<usize>,
    #[arg(long, value_name = "BYTES", value_parser = crate::parse_size, help = dflt("Request-body bytes held at once over all device connections; past it the heaviest client's body gives way, or the request gets 503", GatewayConfig::default().max_buffered))]
    max_buffered: Option<usize>,
    #[arg(long, value_name = "BYTES", value_parser = crate::parse_size, help = dflt("Ingest records up to this size, of one class, that are ready for a backhaul connection at once go to the server in one request (/batch); 0: each alone", GatewayConfig::default().batch_max_record))]
    batch_max_record: Option<usize>,
    /// The name on the server's certificate [default: localhost].
    #[arg(long, value_name = "NAME")]
    server_name: Option<String>,
    /// Backhaul connections start from their path's window history (paper 002)
    /// [default: ewma; off to disable].
    #[arg(long, value_enum, value_name = "MODE")]
    history: Option<crate::config::HistoryMode>,
    #[arg(long, value_name = "FILE", help = format!(
        "The history database [default: $QGATE_HOME/{}]", crate::historycmd::GATEWAY_STORE))]
    history_store: Option<PathBuf>,
    /// Keep records no backhaul path can take in DIR, answered 202 with qgate-spooled: 1, and
    /// send them on when a path returns (limits in [gateway.spool]) [default: [gateway.spool]
    /// dir, else off].
    #[arg(long, value_name = "DIR")]
    spool: Option<PathBuf>,
    /// Open the MQTT front door (3.1.1 and 5.0 over TCP) on ADDR, e.g. 127.0.0.1:1883; limits and
    /// priority_topics in [gateway.mqtt] [default: [gateway.mqtt] listen, else off]. No
    /// authentication yet: an address other than loopback lets anyone publish.
    #[arg(long, value_name = "ADDR")]
    mqtt: Option<SocketAddr>,
    /// Open the MQTT door over TLS on ADDR (e.g. 127.0.0.1:8883), with the certificate the
    /// device port presents [default: [gateway.mqtt] tls_listen, else off].
    #[arg(long, value_name = "ADDR")]
    mqtt_tls: Option<SocketAddr>,
    /// Open the MQTT door over QUIC on UDP ADDR (ALPN mqtt, one stream per MQTT connection,
    /// as EMQX serves it; e.g. 127.0.0.1:14567) [default: [gateway.mqtt] quic_listen, else off].
    #[arg(long, value_name = "ADDR")]
    mqtt_quic: Option<SocketAddr>,
}

/// Where the MQTT door listens over TCP when neither `[gateway.mqtt]` nor a flag names an
/// address.
const DEFAULT_MQTT: &str = "127.0.0.1:1883";

fn secs(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

fn dur(name: &str, v: &Option<String>) -> Result<Option<Duration>, Failure> {
    v.as_deref()
        .map(parse_duration)
        .transpose()
        .map_err(|e| usage(format!("[gateway] {name}: {e}")))
}

fn trust(ca: Option<PathBuf>) -> Result<(TrustRoots, DevPki), Failure> {
    let pki = DevPki::load_or_create(&default_dev_pki_dir()).map_err(usage)?;
    let roots = match ca {
        Some(f) => TrustRoots::from_pem_file(&f).map_err(usage)?,
        None => pki.trust(),
    };
    Ok((roots, pki))
}

pub fn gateway(a: GatewayArgs, cfg: &Config) -> Result<(), Failure> {
    let g = &cfg.gateway;
    let listen = a
        .listen
        .or(g.listen)
        .unwrap_or_else(|| DEFAULT_LISTEN.parse().expect("valid"));
    let default_server = a.server.or(g.server);
    let mut paths: Vec<(SocketAddr, SocketAddr)> = Vec::new();
    // Egress shaping and controller per path (config only), checked before anything binds.
    let mut options: Vec<qgate_gateway::builder::PathOptions> = Vec::new();
    if a.paths.is_empty() {
        for p in &g.paths {
            let shape = match &p.shape {
                Some(spec) => {
                    let params = spec
                        .params()
                        .and_then(|p| qgate_transport::shaped::validate_shape(&p).map(|()| p))
                        .map_err(|e| usage(format!("path {}: shape: {e}", p.local)))?;
                    Some(params)
                }
                None => None,
            };
            let max = qgate_gateway::paths::MAX_CONNECTIONS_PER_PATH;
            if p.connections.is_some_and(|n| !(1..=max).contains(&n)) {
                return Err(usage(format!(
                    "path {}: connections must be 1 to {max}",
                    p.local
                )));
            }
            options.push(qgate_gateway::builder::PathOptions {
                shape,
                congestion: p.congestion,
                connections: p.connections,
            });
            let server = p.server.or(default_server).ok_or_else(|| {
                usage(format!(
                    "path {}: no server address (set gateway.server or the path's server)",
                    p.local
                ))
            })?;
            paths.push((p.local, server));
        }
    } else {
        for spec in &a.paths {
            let (local, server) = match spec.split_once('=') {
                Some((l, s)) => (l, Some(s)),
                None => (spec.as_str(), None),
            };
            let local: SocketAddr = local.parse().map_err(|_| {
                usage(format!(
                    "--path '{spec}': '{local}' is not an address like 127.0.0.2:0"
                ))
            })?;
            let server = match server {
                Some(s) => s.parse().map_err(|_| {
                    usage(format!("--path '{spec}': '{s}' is not a server address"))
                })?,
                None => default_server.ok_or_else(|| {
                    usage(format!(
                        "--path '{spec}': no server address (give LOCAL=SERVER or --server)"
                    ))
                })?,
            };
            paths.push((local, server));
            options.push(Default::default());
        }
    }
    if paths.is_empty() {
        return Err(usage(
            "no backhaul paths: give --path LOCAL[=SERVER] (repeatable) or [[gateway.paths]]",
        ));
    }
    let history = crate::historycmd::open_default_on(
        a.history,
        a.history_store.clone(),
        cfg,
        crate::historycmd::GATEWAY_STORE,
    )
    .map(|(store, safeguard)| qgate_gateway::paths::BackhaulHistory { store, safeguard });
    let scheduler_flag = a.scheduler.is_some();
    let sched_name = a
        .scheduler
        .clone()
        .or(g.scheduler.clone())
        .unwrap_or_else(|| qgate_forward::scheduler::DEFAULT_SCHEDULER.into());
    let mut pcfg = PathConfig::default();
    if let Some(p) = a
        .probe_interval
        .or(dur("probe_interval", &g.probe_interval)?)
    {
        pcfg.probe_interval = p;
    }
    // Flags override the config file's values, which override the crate's defaults.
    let mut gcfg = g.limits.clone();
    let flags = [
        (a.max_devices, &mut gcfg.max_devices),
        (a.max_inflight_per_device, &mut gcfg.max_inflight_per_device),
        (a.max_body, &mut gcfg.max_body),
        (a.max_buffered, &mut gcfg.max_buffered),
        (a.batch_max_record, &mut gcfg.batch_max_record),
        (
            a.max_sessions_per_connection,
            &mut gcfg.max_sessions_per_connection,
        ),
        (
            a.max_sessions_per_address,
            &mut gcfg.max_sessions_per_address,
        ),
        (a.max_handshakes, &mut gcfg.max_handshakes),
        (
            a.max_handshakes_per_address,
            &mut gcfg.max_handshakes_per_address,
        ),
        (a.retry_above, &mut gcfg.retry_above),
    ];
    for (flag, field) in flags {
        if let Some(v) = flag {
            *field = v;
        }
    }
    if gcfg.max_body > gcfg.max_buffered {
        return Err(usage(format!(
            "max_body ({}) is larger than max_buffered ({}): such a body could never be taken",
            gcfg.max_body, gcfg.max_buffered
        )));
    }
    for (flag, field) in [
        (a.request_timeout, &mut gcfg.request_timeout),
        (a.session_idle_timeout, &mut gcfg.session_idle_timeout),
        (a.handshake_timeout, &mut gcfg.handshake_timeout),
        (a.handshake_silence, &mut gcfg.handshake_silence),
    ] {
        if let Some(v) = flag {
            *field = v;
        }
    }
    if let Some(n) = a.server_name.clone() {
        gcfg.server_authority = n;
    }
    let (trust, pki) = trust(a.ca.or(g.ca.clone()))?;
    let device_ca = match a.device_ca.as_ref().or(g.device_ca.as_ref()) {
        Some(f) => Some(TrustRoots::from_pem_file(f).map_err(|e| {
            usage(format!(
                "device_ca {}: {e} (a PEM file with the CA that signs device certificates; `qgate pki ca` makes one)",
                f.display()
            ))
        })?),
        None => None,
    };
    let device_tokens = match a.device_token_key.as_ref().or(g.device_token_key.as_ref()) {
        Some(f) => Some(
            std::fs::read_to_string(f)
                .map_err(|e| e.to_string())
                .and_then(|pem| qgate_transport::token::TokenKey::from_pem(&pem))
                .map_err(|e| {
                    usage(format!(
                        "device_token_key {}: {e} (a PEM Ed25519 public key; `qgate pki token-key` makes one)",
                        f.display()
                    ))
                })?,
        ),
        None => None,
    };
    let spool_cfg = match (&a.spool, &g.spool) {
        (None, None) => None,
        (flag, section) => {
            let mut section = section.clone().unwrap_or(crate::config::SpoolSection {
                dir: PathBuf::new(),
                max_bytes: None,
                max_records: None,
                max_age: None,
                device_max_bytes: None,
                device_max_records: None,
                on_full_priority: None,
                on_full_best_effort: None,
                keep_free: None,
            });
            if let Some(d) = flag {
                section.dir = d.clone();
            }
            Some(
                section
                    .config()
                    .map_err(|e| usage(format!("[gateway.spool] {e}")))?,
            )
        }
    };
    let spool = match spool_cfg {
        Some(c) => {
            let dir = c.dir.clone();
            Some(qgate_spool::Spool::open(c).map_err(|e| {
                usage(format!(
                    "spool {}: {e} (a directory this user may create and write)",
                    dir.display()
                ))
            })?)
        }
        None => None,
    };

    crate::runtime().block_on(async move {
        // Watch for Ctrl-C and SIGTERM before saying the service is up.
        let stop = crate::stop_requested();
        let mut builder = Gateway::builder()
            .with_config(gcfg)
            .with_scheduler(&sched_name)
            .map_err(usage)?
            .with_path_config(pcfg)
            .with_transport(cfg.transport.clone())
            .with_history(history)
            .with_identity(pki.server.clone())
            .with_server_trust(trust)
            .with_device_socket(Socket::bind_udp(listen).map_err(usage)?);
        for ((local, server), options) in paths.iter().zip(&options) {
            let socket = Socket::bind_udp(*local).map_err(usage)?;
            builder = builder.with_backhaul(socket, *server, options.clone());
        }
        let devices_note = if device_ca.is_some() && device_tokens.is_some() {
            ", devices by certificate or token"
        } else if device_tokens.is_some() {
            ", devices by token"
        } else if device_ca.is_some() {
            ", devices by certificate"
        } else if listen.ip().is_loopback() {
            ", devices unauthenticated (loopback only)"
        } else {
            // Said first and loudly: anyone who reaches the port may register (issue 49).
            tracing::warn!(%listen, "the device port is OPEN TO ANYONE: devices are not authenticated (set [gateway] device_ca or --device-ca)");
            ", devices UNAUTHENTICATED: OPEN TO ANYONE"
        };
        if let Some(ca) = device_ca {
            builder = builder.with_device_ca(ca);
        }
        if let Some(key) = device_tokens {
            builder = builder.with_device_tokens(key);
        }
        let spool_note = spool.as_ref().map_or(String::new(), |s| {
            format!(", spool {}", s.config().dir.display())
        });
        if let Some(s) = spool {
            builder = builder.with_spool(s);
        }
        let section = g.mqtt.clone().unwrap_or_default();
        let tcp = a.mqtt.or(section.listen);
        let tls = a.mqtt_tls.or(section.tls_listen);
        let quic = a.mqtt_quic.or(section.quic_listen);
        if g.mqtt.is_some() || tcp.is_some() || tls.is_some() || quic.is_some() {
            // A [gateway.mqtt] section naming no listener opens TCP on the default address.
            let tcp = tcp.or_else(|| {
                (tls.is_none() && quic.is_none()).then(|| DEFAULT_MQTT.parse().expect("valid"))
            });
            builder = match tcp {
                Some(t) => builder.with_mqtt(t, section.config),
                None => builder.with_mqtt_config(section.config),
            };
            if let Some(t) = tls {
                builder = builder.with_mqtt_tls(t);
            }
            if let Some(q) = quic {
                builder = builder.with_mqtt_quic(q);
            }
        }
        let running = builder.start()?;
        let doors: Vec<String> = [
            ("tcp", running.mqtt_addr()),
            ("tls", running.mqtt_tls_addr()),
            ("quic", running.mqtt_quic_addr()),
        ]
        .into_iter()
        .filter_map(|(what, addr)| {
            let m = addr?;
            Some(if qgate_gateway::mqtt::open_to_anyone(m) {
                format!("{what}/{m} OPEN TO ANYONE (no authentication yet)")
            } else {
                format!("{what}/{m}")
            })
        })
        .collect();
        let mqtt_note = if doors.is_empty() {
            String::new()
        } else {
            format!(", MQTT on {}", doors.join(", "))
        };
        let local = running.addr();
        let gw = running.gateway.clone();
        let admin = crate::admin::start(&a.admin, g.admin.as_deref(), cfg, || {
            qgate_admin::Admin::builder().metrics(gw.collector()).api(
                crate::admin::GatewayApi::new(gw.clone(), cfg.clone(), scheduler_flag),
            )
        })
        .await?;
        println!(
            "qgate gateway listening on udp/{local} (HTTP/3{devices_note}){mqtt_note}, {}, scheduler {sched_name}{spool_note}{}",
            crate::count(paths.len() as u64, "path", "paths"),
            admin
                .as_ref()
                .map_or(String::new(), |(_, l)| format!(", {l}"))
        );
        use std::io::Write;
        std::io::stdout().flush().ok();
        stop.await;
        // No new device connections; requests on the open ones are forwarded and answered
        // until none is in flight or the grace ends; then every device connection closes and
        // the devices retry or go elsewhere.
        running.endpoint.stop_accepting();
        running.stop_mqtt();
        eprintln!(
            "qgate: shutting down: no new connections; waiting up to {}s for requests in flight",
            crate::DRAIN_GRACE.as_secs()
        );
        let deadline = tokio::time::Instant::now() + crate::DRAIN_GRACE;
        while gw.requests_in_flight() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let left = gw.requests_in_flight();
        running.endpoint.close(0, b"gateway shutting down");
        let s = gw.stats.snapshot();
        eprintln!(
            "qgate: registered {}, forwarded {} ({} retried on another path, {} failed, {} refused){}",
            crate::count(s.registered, "device", "devices"),
            crate::count(s.forwarded, "request", "requests"),
            s.retried,
            s.failed,
            s.refused,
            if left > 0 { format!("; {left} still in flight") } else { String::new() }
        );
        drop(admin);
        Ok(())
    })
}

#[derive(Args, Debug)]
pub struct DeviceArgs {
    /// The gateway: https://HOST:PORT
    gateway: String,
    /// Priority class 1 (lowest-RTT path) instead of best effort.
    #[arg(long)]
    priority: bool,
    /// Records to send.
    #[arg(long, default_value_t = 10)]
    count: usize,
    /// Bytes per record (e.g. 50, 1KiB).
    #[arg(long, default_value_t = 50, value_parser = crate::parse_size)]
    size: usize,
    /// Records per second (0 = as fast as answers come back).
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Stop sending new records after this long, even if --count are not all sent (e.g. 30s).
    #[arg(long = "for", value_name = "DURATION", value_parser = parse_duration)]
    for_: Option<Duration>,
    /// Records in flight at once: with --rate each starts on its schedule while earlier ones
    /// are unanswered, up to this many (the gateway's max_inflight_per_device also applies).
    #[arg(long, default_value_t = 1)]
    inflight: usize,
    /// Write each record's outcome to FILE as CSV: record, sent_s (when its first try started,
    /// from the device's start), delay_ms (from then to its answer, retries included), path, bytes.
    #[arg(long, value_name = "FILE")]
    delays: Option<PathBuf>,
    /// Ingest stream on the server.
    #[arg(long, default_value = "device")]
    stream: String,
    /// Send this file's contents, cut into records of --size bytes (instead of --count
    /// generated records).
    #[arg(long, value_name = "FILE", conflicts_with = "count")]
    file: Option<PathBuf>,
    /// CA certificate(s) of the gateway, PEM [default: the development CA].
    #[arg(long, value_name = "FILE")]
    ca: Option<PathBuf>,
    /// This device's certificate, PEM (`qgate pki issue NAME`), for a gateway that
    /// authenticates devices; with --key.
    #[arg(long, value_name = "FILE", requires = "key")]
    cert: Option<PathBuf>,
    /// The private key of --cert, PEM.
    #[arg(long, value_name = "FILE", requires = "cert")]
    key: Option<PathBuf>,
    /// A file holding this device's token (`qgate pki token NAME`), for a gateway that takes
    /// device tokens; sent when the device registers.
    #[arg(long, value_name = "FILE")]
    token: Option<PathBuf>,
    /// Start from the window history of earlier connections to this gateway (paper 002)
    /// [default: ewma; off to disable].
    #[arg(long, value_enum, value_name = "MODE")]
    history: Option<crate::config::HistoryMode>,
    #[arg(long, value_name = "FILE", help = format!(
        "The history database [default: $QGATE_HOME/{}]", crate::historycmd::DEVICE_STORE))]
    history_store: Option<PathBuf>,
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, help = crate::dflt(
        "Keep sending a record the gateway could not pass on (503 or 502: the server's queue or every backhaul path down; waiting as Retry-After says) for this long before giving up",
        qgate_core::units::format_duration(DEFAULT_RETRY_FOR)))]
    retry_for: Option<Duration>,
}

/// How long `qgate device` keeps retrying one record unless told.
const DEFAULT_RETRY_FOR: Duration = Duration::from_secs(60);

pub fn device(a: DeviceArgs, cfg: &Config) -> Result<(), Failure> {
    let target = crate::url::parse(&a.gateway).map_err(usage)?;
    if a.count == 0 || a.size > 1 << 20 || !(a.rate.is_finite() && a.rate >= 0.0) {
        return Err(usage(
            "--count must be positive, --size at most 1 MiB, --rate a non-negative number",
        ));
    }
    // The records to send: a file cut into --size pieces, or --count generated ones.
    let records: Vec<Bytes> = match &a.file {
        Some(f) => {
            let data =
                std::fs::read(f).map_err(|e| usage(format!("cannot read {}: {e}", f.display())))?;
            if data.is_empty() {
                return Err(usage(format!("{} is empty", f.display())));
            }
            data.chunks(a.size.max(1))
                .map(Bytes::copy_from_slice)
                .collect()
        }
        None => vec![Bytes::from(vec![b'r'; a.size]); a.count],
    };
    // Created before anything is sent, so a path that cannot be written fails at once.
    let mut delays_csv = match &a.delays {
        Some(f) => {
            let mut w = std::io::BufWriter::new(
                std::fs::File::create(f)
                    .map_err(|e| usage(format!("--delays {}: {e}", f.display())))?,
            );
            use std::io::Write;
            writeln!(w, "record,sent_s,delay_ms,path,bytes")
                .map_err(|e| usage(format!("--delays {}: {e}", f.display())))?;
            Some(w)
        }
        None => None,
    };
    let (roots, _) = trust(a.ca)?;
    let me = match (&a.cert, &a.key) {
        (Some(c), Some(k)) => Some(
            qgate_transport::Identity::from_pem_files(c, k)
                .map_err(|e| usage(format!("--cert/--key: {e}")))?,
        ),
        _ => None,
    };
    let ccfg = client_config_with_identity(&roots, &[ALPN_H3], &cfg.transport, me.as_ref())
        .map_err(usage)?;
    let token = match &a.token {
        Some(f) => Some(
            std::fs::read_to_string(f)
                .map_err(|e| usage(format!("--token {}: {e}", f.display())))?
                .trim()
                .to_owned(),
        ),
        None => None,
    };
    let history = crate::historycmd::open_default_on(
        a.history,
        a.history_store.clone(),
        cfg,
        crate::historycmd::DEVICE_STORE,
    );
    let transport = cfg.transport.clone();
    crate::runtime().block_on(async move {
        let addr = target.resolve().await.map_err(usage)?;
        // With history on, this connection starts from the window of earlier ones to the gateway.
        let ccfg = match &history {
            Some((store, safeguard)) => {
                let peer = qgate_transport::window_history::client_peer_key(&target.host, addr);
                store
                    .client_config(&ccfg, &transport, &peer, *safeguard)
                    .map_err(usage)?
                    .0
            }
            None => qgate_transport::client_config_for(
                &ccfg,
                &transport,
                &qgate_transport::window_history::client_peer_key(&target.host, addr),
            )
            .map_err(usage)?,
        };
        let ep = endpoint(
            Socket::bind_udp("0.0.0.0:0".parse().expect("valid"))?,
            None,
            None,
        )?;
        let conn = tokio::time::timeout(
            Duration::from_secs(10),
            connect(&ep, &ccfg, addr, &target.host, false),
        )
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "no response from {addr} within 10s: is a qgate gateway listening there?"
            )
        })??;
        // Each record goes under its own request id, the same on every retry of it, so the
        // server stores a record once however often it is sent (decision G18).
        let h3 = H3Client::new(conn.connection().clone()).await?;
        let dev = match &token {
            Some(t) => Device::register_with_token(h3, a.priority, t).await?,
            None => Device::register(h3, a.priority).await?,
        }
        .with_request_ids(qgate_gateway::device::random_id_seed()?);
        let hash = dev.hash_id().unwrap_or_default();
        eprintln!("registered, Hash ID {hash}");
        let mut delays = Vec::with_capacity(records.len());
        let mut by_path = std::collections::BTreeMap::new();
        let start = tokio::time::Instant::now();
        let retry_for = a.retry_for.unwrap_or(DEFAULT_RETRY_FOR);
        let retries = std::sync::atomic::AtomicU64::new(0);
        let path = format!("/ingest/{}", a.stream);
        // One record, retried as the gateway's Retry-After says: (index, first try, outcome).
        let send_one = |i: usize| {
            let (dev, path, retries, record) = (&dev, &path, &retries, records[i].clone());
            async move {
                let first_try = tokio::time::Instant::now();
                let id = dev.next_request_id();
                loop {
                    match dev.send_as(path, record.clone(), id.as_deref()).await {
                        Ok(s) => return Ok((i, first_try, s)),
                        Err(e) => match e.retry_in() {
                            Some(wait) if first_try.elapsed() + wait <= retry_for => {
                                use std::sync::atomic::Ordering;
                                if retries.fetch_add(1, Ordering::Relaxed) == 0 {
                                    eprintln!(
                                        "qgate: {e}; retrying (up to {retry_for:?} per record)"
                                    );
                                }
                                tokio::time::sleep(wait).await;
                            }
                            _ => return Err((i, e)),
                        },
                    }
                }
            }
        };
        // Records start on their schedule (--rate) whatever is still unanswered, up to
        // --inflight at once: an open loop, so a slow answer does not delay the next record.
        let inflight = a.inflight.max(1);
        let mut pending = futures_util::stream::FuturesUnordered::new();
        let (mut launched, mut sent) = (0usize, 0usize);
        let mut more = true;
        loop {
            while more && pending.len() < inflight {
                if launched == records.len() || a.for_.is_some_and(|d| start.elapsed() >= d) {
                    more = false;
                    break;
                }
                if a.rate > 0.0
                    && tokio::time::Instant::now()
                        < start + Duration::from_secs_f64(launched as f64 / a.rate)
                {
                    break;
                }
                pending.push(send_one(launched));
                launched += 1;
            }
            if pending.is_empty() && !more {
                break;
            }
            // When the next record is due (with --rate; unused without).
            let due = if a.rate > 0.0 {
                start + Duration::from_secs_f64(launched as f64 / a.rate)
            } else {
                start
            };
            let done = tokio::select! {
                biased;
                d = futures_util::StreamExt::next(&mut pending), if !pending.is_empty() => d,
                _ = tokio::time::sleep_until(due), if more && a.rate > 0.0 && pending.len() < inflight => None,
            };
            let Some(done) = done else { continue };
            let (i, first_try, s) = done.map_err(|(i, e)| {
                anyhow::anyhow!(
                    "{e} (record {} of {}; {sent} acknowledged before it)",
                    i + 1,
                    records.len()
                )
            })?;
            // From the record's first try to its answer, retries included.
            let delay = first_try.elapsed();
            delays.push(delay.as_secs_f64() * 1000.0);
            let path = s.path.map_or("?".to_string(), |p| p.to_string());
            if let Some(w) = delays_csv.as_mut() {
                use std::io::Write;
                writeln!(
                    w,
                    "{i},{:.6},{:.3},{path},{}",
                    (first_try - start).as_secs_f64(),
                    delay.as_secs_f64() * 1000.0,
                    records[i].len()
                )
                .map_err(|e| anyhow::anyhow!("writing --delays: {e}"))?;
            }
            *by_path.entry(path).or_insert(0) += 1;
            sent += 1;
        }
        drop(pending);
        let retries = retries.into_inner();
        if let Some(mut w) = delays_csv.take() {
            use std::io::Write;
            w.flush()
                .map_err(|e| anyhow::anyhow!("writing --delays: {e}"))?;
        }
        dev.client().close();
        if sent == 0 {
            return Err(
                anyhow::anyhow!("no record was sent (--for ended before the first)").into(),
            );
        }
        let records = &records[..sent];
        let mut sorted = delays.clone();
        sorted.sort_by(|a, b| a.total_cmp(b));
        let q = |f: f64| sorted[((sorted.len() as f64 * f) as usize).min(sorted.len() - 1)];
        let s = qgate_core::summary::Summary::of(&delays);
        println!(
            "sent {} records of {} B ({} B) in {:.2} s",
            records.len(),
            a.size,
            records.iter().map(|r| r.len()).sum::<usize>(),
            start.elapsed().as_secs_f64()
        );
        println!(
            "response delay {:.2} ms; p50 {:.2} ms, p99 {:.2} ms",
            s,
            q(0.5),
            q(0.99)
        );
        if retries > 0 {
            println!("retries: {retries} (the gateway could not pass a record on)");
        }
        println!(
            "paths used: {}",
            by_path
                .iter()
                .map(|(p, n)| format!("{p}: {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        ep.wait_idle().await;
        Ok(())
    })
}
