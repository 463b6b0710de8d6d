//! `qgate server`

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use qgate_server::{
    CountSink, DedupStore, DirSink, QueueSink, QueueSinkConfig, Server, Sink, UploadLimits,
    Uploads, Upstream, EXPIRE_CHECK_EVERY,
};
use qgate_transport::http3::{BodyBudget, ServeLimits, DEFAULT_MAX_BUFFERED};
use qgate_transport::{Congestion, DevPki, Identity, Socket, TrustRoots};

use crate::config::Config;
use crate::{default_dev_pki_dir, usage, Failure};

/// Where `qgate server` listens unless told.
const DEFAULT_LISTEN: &str = "0.0.0.0:4433";

/// Request ids the durable de-duplication table remembers (~100 bytes each on disk): over a
/// minute of requests at 10,000 a second, far longer than a gateway retries one request (S6).
const DEDUP_CAPACITY: u64 = 1 << 20;

/// How long `qgate server` waits for a queue sink's broker before it listens anyway.
const SINK_STARTUP_WAIT: Duration = Duration::from_secs(5);

/// `--sink`: a directory or a queue.
enum SinkSpec {
    Dir(PathBuf),
    Queue(qgate_amqp::url::AmqpUrl),
}

#[derive(Args, Debug)]
pub struct ServerArgs {
    #[command(flatten)]
    admin: crate::admin::AdminArgs,
    #[arg(short, long, value_name = "ADDR", help = crate::dflt(
        "UDP address to listen on (port 0 picks a free port)", DEFAULT_LISTEN))]
    listen: Option<SocketAddr>,
    /// PEM certificate chain (with --key); without both, a development certificate is used.
    #[arg(long, value_name = "FILE", requires = "key")]
    cert: Option<PathBuf>,
    /// PEM private key matching --cert.
    #[arg(long, value_name = "FILE", requires = "cert")]
    key: Option<PathBuf>,
    /// Directory of the development CA and certificate (created if missing); clients trust
    /// DIR/ca.pem [default: $QGATE_HOME/dev-pki or ~/.local/share/qgate/dev-pki].
    #[arg(long, value_name = "DIR")]
    dev_pki: Option<PathBuf>,
    /// Where each ingested body goes before it is acknowledged: a directory (a file under
    /// DIR/<stream>/, fsynced) or an AMQP 1.0 queue, amqp://[USER[:PASS]@]HOST[:5672]/QUEUE
    /// (amqps://…:5671 for TLS 1.3, amqp+quic://…:5671 for QUIC; '/' in a password as %2F; a
    /// user without a password takes QGATE_AMQP_PASSWORD). Answered 201 only once the broker
    /// accepted it, 503 + Retry-After while it cannot, 413 over the broker's message size;
    /// anything not starting with amqp is a directory. Without it bodies are only counted.
    #[arg(long, value_name = "DIR|URL")]
    sink: Option<String>,
    /// CA certificate(s) (PEM) of an amqps:// or amqp+quic:// sink's broker, e.g. the system
    /// bundle /etc/ssl/certs/ca-certificates.crt for a public one [default: the development
    /// CA of --dev-pki].
    #[arg(long, value_name = "FILE")]
    sink_ca: Option<PathBuf>,
    /// Durable de-duplication table: request ids stored survive a restart [default:
    /// DIR/.dedup.redb with a directory sink, $QGATE_HOME/ingest-dedup-<hash of the broker and
    /// queue>.redb with a queue; none when only counting].
    #[arg(long, value_name = "FILE")]
    dedup_store: Option<PathBuf>,
    /// Receive `qgate upload` files (paper 001) into DIR: each complete file is verified
    /// against its SHA-256 and fsynced before the upload is confirmed [default: off].
    #[arg(long, value_name = "DIR")]
    uploads: Option<PathBuf>,
    #[arg(long, value_name = "SIZE", value_parser = qgate_core::units::parse_bytes, help = crate::dflt(
        "Largest file an upload may announce", UploadLimits::default().max_file_bytes))]
    upload_max_bytes: Option<u64>,
    #[arg(long, value_name = "DAYS", help = crate::dflt(
        "Delete an unfinished upload nobody wrote to for DAYS days (checked at start and hourly); 0 keeps them",
        expire_days(UploadLimits::default().expire_after)))]
    upload_expire_days: Option<u32>,
    #[arg(long, value_name = "BYTES", value_parser = crate::parse_size, help = crate::dflt(
        "Largest request body in bytes; larger ones get 413", ServeLimits::default().max_body))]
    max_body: Option<usize>,
    #[arg(long, value_name = "BYTES", value_parser = crate::parse_size, help = crate::dflt(
        "Request-body bytes held at once over all connections; past it a request gets 503 and Retry-After, unless another client (address, or IPv6 /64) holds more, whose stalest body then gives way",
        DEFAULT_MAX_BUFFERED))]
    max_buffered: Option<usize>,
    #[arg(long, value_name = "N", help = crate::dflt(
        "QUIC connections held at once, handshakes included; more are refused",
        qgate_server::DEFAULT_MAX_CONNECTIONS))]
    max_connections: Option<usize>,
    #[arg(long, value_name = "N", help = crate::dflt(
        "QUIC connections one client (an IPv4 address, or an IPv6 /64) may hold at once",
        qgate_server::DEFAULT_MAX_CONNECTIONS_PER_CLIENT))]
    max_connections_per_client: Option<usize>,
    #[arg(long, value_name = "SIZE", value_parser = qgate_core::units::parse_bytes, help = crate::dflt(
        "Disk space kept free where bodies and uploads are stored: a body or upload that would leave less gets 507, nothing of it stored (also 1% of inodes)",
        qgate_core::units::format_bytes(qgate_server::room::DEFAULT_KEEP_FREE)))]
    keep_free: Option<u64>,
    /// Congestion controller: cubic, new-reno, bbr or auto (CUBIC until random loss dominates, then BBR) [default: cubic].
    #[arg(long, value_name = "NAME")]
    congestion: Option<Congestion>,
    /// Start each client's connection from that client's window history (paper 002); how is
    /// `[history] resume`: careful (RFC 9959, the default) or window (the paper's)
    /// [default: off, or [history] mode].
    #[arg(long, value_enum, value_name = "MODE")]
    history: Option<crate::config::HistoryMode>,
    /// The history database [default: $QGATE_HOME/history.redb].
    #[arg(long, value_name = "FILE")]
    history_store: Option<PathBuf>,
}

pub fn run(a: ServerArgs, cfg: &Config) -> Result<(), Failure> {
    let c = &cfg.server;
    let listen = a
        .listen
        .or(c.listen)
        .unwrap_or_else(|| DEFAULT_LISTEN.parse().expect("valid"));
    let mut transport = cfg.transport.clone();
    if let Some(cc) = a.congestion {
        transport.congestion = cc;
    }
    let pki_dir = a
        .dev_pki
        .or(c.dev_pki.clone())
        .unwrap_or_else(default_dev_pki_dir);
    let identity = match (a.cert.or(c.cert.clone()), a.key.or(c.key.clone())) {
        (Some(cert), Some(key)) => Identity::from_pem_files(&cert, &key).map_err(usage)?,
        (None, None) => {
            let dir = pki_dir.clone();
            let pki = DevPki::load_or_create(&dir).map_err(usage)?;
            eprintln!(
                "qgate: using the development certificate; clients trust {}",
                dir.join("ca.pem").display()
            );
            pki.server
        }
        _ => {
            return Err(usage(
                "give both a certificate and a key ([server] cert and key)",
            ))
        }
    };
    let sink_spec = match a.sink.or(c.sink.clone()) {
        None => None,
        // Any scheme-like start is a URL (a typo such as amqp:/… must not become a directory).
        Some(s) if s.contains("://") || s.to_ascii_lowercase().starts_with("amqp") => {
            Some(SinkSpec::Queue(
                qgate_amqp::url::parse(&s)
                    .and_then(|u| u.password_from(std::env::var("QGATE_AMQP_PASSWORD").ok()))
                    .map_err(usage)?,
            ))
        }
        Some(dir) => Some(SinkSpec::Dir(PathBuf::from(dir))),
    };
    let dedup_path = a
        .dedup_store
        .or(c.dedup_store.clone())
        .or(match &sink_spec {
            Some(SinkSpec::Dir(d)) => Some(d.join(".dedup.redb")),
            // One table per broker and queue: ids stored in another queue are not in this one.
            Some(SinkSpec::Queue(u)) => Some(crate::home_file(&format!(
                "ingest-dedup-{:016x}.redb",
                fnv1a(&format!(
                    "{}://{}:{}/{}",
                    u.scheme, u.host, u.port, u.address
                ))
            ))),
            None => None,
        });
    let sink_ca = a.sink_ca.or(c.sink_ca.clone());
    let limits = ServeLimits {
        max_body: a
            .max_body
            .or(c.max_body)
            .unwrap_or(ServeLimits::default().max_body),
        buffered: BodyBudget::new(
            a.max_buffered
                .or(c.max_buffered)
                .unwrap_or(DEFAULT_MAX_BUFFERED),
        ),
        ..ServeLimits::default()
    };
    if limits.max_body > limits.buffered.total() {
        return Err(usage(format!(
            "--max-body ({}) is larger than --max-buffered ({}): such a body could never be taken",
            limits.max_body,
            limits.buffered.total()
        )));
    }
    let max_connections = a
        .max_connections
        .or(c.max_connections)
        .unwrap_or(qgate_server::DEFAULT_MAX_CONNECTIONS);
    let per_client = a
        .max_connections_per_client
        .or(c.max_connections_per_client)
        .unwrap_or(qgate_server::DEFAULT_MAX_CONNECTIONS_PER_CLIENT);
    if max_connections == 0 || per_client == 0 {
        return Err(usage(
            "--max-connections and --max-connections-per-client must be at least 1",
        ));
    }
    let keep_free = a
        .keep_free
        .or(c.keep_free)
        .unwrap_or(qgate_server::room::DEFAULT_KEEP_FREE);
    let uploads = match a.uploads.or(c.uploads.clone()) {
        Some(dir) => {
            let limits = UploadLimits {
                max_file_bytes: a
                    .upload_max_bytes
                    .or(c.upload_max_bytes)
                    .unwrap_or(UploadLimits::default().max_file_bytes),
                expire_after: match a.upload_expire_days.or(c.upload_expire_days) {
                    None => UploadLimits::default().expire_after,
                    Some(0) => None,
                    Some(d) => Some(Duration::from_secs(u64::from(d) * 86_400)),
                },
                keep_free,
                ..Default::default()
            };
            Some(Uploads::new(&dir, limits).map_err(usage)?)
        }
        None => None,
    };
    let history = crate::historycmd::open(a.history, a.history_store.clone(), cfg)?;
    crate::runtime().block_on(async move {
        // Watch for Ctrl-C and SIGTERM before saying the service is up.
        let stop = crate::stop_requested();
        let (dedup, max_id) = match &dedup_path {
            Some(p) => {
                let (d, max) = DedupStore::open(p, DEDUP_CAPACITY).map_err(|e| {
                    let hint = if e.msg.contains("lock") || e.msg.contains("already open") {
                        " (another server is using it: give each its own --dedup-store)"
                    } else {
                        ""
                    };
                    usage(format!("{e}{hint}"))
                })?;
                (Some(d), max)
            }
            None => (None, 0),
        };
        let sink: Arc<dyn Sink> = match sink_spec {
            None => Arc::new(CountSink::new()),
            Some(SinkSpec::Dir(dir)) => {
                Arc::new(DirSink::open_keeping(&dir, keep_free).map_err(usage)?)
            }
            Some(SinkSpec::Queue(url)) => {
                let trust = match &sink_ca {
                    Some(f) => TrustRoots::from_pem_file(f).map_err(usage)?,
                    None => DevPki::load_or_create(&pki_dir).map_err(usage)?.trust(),
                };
                // A dead broker is noticed within seconds, not quinn's 30 s (M20).
                let opts = qgate_amqp::client::with_idle_timeout(
                    &cfg.transport,
                    qgate_amqp::client::DEFAULT_IDLE_TIMEOUT,
                );
                eprintln!("qgate: ingesting into {url}");
                // Resolved at every connection attempt: a broker not up yet, or moved, is
                // reached once it answers.
                let address = url.address.clone();
                let target = url.to_string();
                let sink = QueueSink::start(
                    Upstream::Url { url, trust, opts },
                    &address,
                    &target,
                    QueueSinkConfig::default(),
                    max_id + 1,
                );
                // Listen once the broker is reached (or after a few seconds without it), so
                // the first devices are not refused only because the server was quicker.
                let wait = tokio::time::Instant::now() + SINK_STARTUP_WAIT;
                while !sink.is_up() && tokio::time::Instant::now() < wait {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                if !sink.is_up() {
                    eprintln!(
                        "qgate: {target} is not reachable yet; ingest requests get 503 until it is"
                    );
                }
                Arc::new(sink)
            }
        };
        let mut builder = Server::builder()
            .socket(Socket::bind_udp(listen).map_err(usage)?)
            .identity(&identity)
            .transport(transport)
            .sink(sink)
            .limits(limits)
            .connection_limits(max_connections, per_client);
        if let Some((store, safeguard)) = history {
            builder = builder.history(store, safeguard);
        }
        if let Some(u) = uploads {
            builder = builder.uploads(u);
        }
        if let Some(d) = dedup {
            builder = builder.dedup_store(d);
        }
        let server = builder.start().map_err(usage)?;
        let api = crate::admin::ServerApi::new(server.metrics.clone(), cfg.clone());
        let metrics = server.metrics.clone();
        let admin = crate::admin::start(&a.admin, c.admin.as_deref(), cfg, || {
            qgate_admin::Admin::builder().metrics(metrics).api(api)
        })
        .await?;
        match &admin {
            Some((_, line)) => println!("qgate server listening on udp/{} (HTTP/3), {line}", server.addr()),
            None => println!("qgate server listening on udp/{} (HTTP/3)", server.addr()),
        }
        if let Some(u) = &server.uploads {
            eprintln!("qgate: receiving uploads into {}", u.root().display());
            tokio::spawn(expire_uploads(u.clone()));
        }
        use std::io::Write;
        std::io::stdout().flush().ok();
        let stats = server.stats.clone();
        stop.await;
        eprintln!(
            "qgate: shutting down: no new connections; waiting up to {}s for requests in flight",
            crate::DRAIN_GRACE.as_secs()
        );
        let left = server.shutdown(crate::DRAIN_GRACE).await;
        if left > 0 {
            eprintln!("qgate: {left} requests were still in flight (their devices retry)");
        }
        drop(admin);
        let s = stats.snapshot();
        eprintln!(
            "qgate: served {} connections, {} requests, stored {} bodies ({} bytes), {} upload chunks ({} bytes), {} uploads complete",
            s.connections, s.requests, s.ingested, s.ingested_bytes, s.upload_chunks, s.upload_bytes, s.uploads_completed
        );
        Ok(())
    })
}

/// `--upload-expire-days` as the help shows it.
fn expire_days(after: Option<Duration>) -> u64 {
    after.map_or(0, |d| d.as_secs() / 86_400)
}

/// Delete expired unfinished uploads now and every [`EXPIRE_CHECK_EVERY`].
async fn expire_uploads(uploads: std::sync::Arc<Uploads>) {
    loop {
        let u = uploads.clone();
        match tokio::task::spawn_blocking(move || u.expire(std::time::SystemTime::now())).await {
            Ok(Ok(gone)) if !gone.is_empty() => eprintln!(
                "qgate: deleted {} unfinished upload(s) nobody wrote to in time: {}",
                gone.len(),
                gone.join(", ")
            ),
            Ok(Err(e)) => eprintln!("qgate: expiring unfinished uploads: {e}"),
            _ => {}
        }
        tokio::time::sleep(EXPIRE_CHECK_EVERY).await;
    }
}

/// FNV-1a, 64 bits: a stable short name for a sink (file names).
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}
