//! `qgate upload`: the device side of the two-ended multi-homed upload (paper 001).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use qgate_chunks::{FileInfo, Layout, DEFAULT_CHUNK};
use qgate_core::units::{format_duration, parse_bytes};
use qgate_transport::Socket;
use qgate_upload::{sha256, Lane, Upload, UploadError, CONNECT_TIMEOUT, DEFAULT_REQUEST_TIMEOUT};

use crate::config::{parse_duration, Config};
use crate::{usage, Failure, EXIT_HTTP_STATUS};

#[derive(Args, Debug)]
pub struct UploadArgs {
    /// The file to upload.
    file: PathBuf,
    /// https://HOST[:PORT][/upload/NAME] — the server (`qgate server --uploads DIR`); NAME
    /// defaults to FILE's name.
    url: String,
    /// Send over the interface with this local address; once per interface. The first sends
    /// the file from its start, the second from its end, and they meet (more split the file
    /// into segments worked from both ends). Without it: one connection from any address.
    #[arg(long, value_name = "ADDR")]
    via: Vec<IpAddr>,
    #[arg(long, value_name = "SIZE", value_parser = parse_bytes, help = crate::dflt(
        "Chunk size (e.g. 64KiB, 256k); each chunk is one request",
        format!("{}KiB", DEFAULT_CHUNK / 1024)))]
    chunk: Option<u64>,
    /// CA certificate(s) to trust, PEM [default: the development CA, if this machine has one].
    #[arg(long, value_name = "FILE")]
    ca: Option<PathBuf>,
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, help = crate::dflt(
        &format!("Give a chunk up and retry it after this long; a handshake after this or {}, \
                  whichever is shorter (a server never reached fails the upload; one lost \
                  mid-upload is retried until it is back)", format_duration(CONNECT_TIMEOUT)),
        format_duration(DEFAULT_REQUEST_TIMEOUT)))]
    timeout: Option<Duration>,
    /// No progress bar.
    #[arg(short, long)]
    quiet: bool,
}

pub fn run(a: UploadArgs, cfg: &Config) -> Result<(), Failure> {
    let target = crate::url::parse(&a.url).map_err(usage)?;
    let file_name = a.file.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let name = match target.uri.path() {
        "" | "/" | "/upload" | "/upload/" => file_name.to_string(),
        p => match p.strip_prefix("/upload/") {
            Some(n) => n.to_string(),
            None => {
                return Err(usage(format!(
                    "invalid URL '{}': the path must be /upload/NAME (or empty)",
                    a.url
                )))
            }
        },
    };
    if !qgate_server::upload_receiver::valid_name(&name) {
        return Err(usage(format!(
            "upload name '{name}': use 1-128 characters of A-Z a-z 0-9 . _ - not starting with '.' \
             (give one in the URL: https://HOST:PORT/upload/NAME)"
        )));
    }
    let chunk = a.chunk.unwrap_or(DEFAULT_CHUNK);
    let file = std::fs::File::open(&a.file)
        .map_err(|e| usage(format!("cannot open {}: {e}", a.file.display())))?;
    let size = file
        .metadata()
        .map_err(|e| usage(format!("cannot read {}: {e}", a.file.display())))?
        .len();
    let layout = Layout::new(size, chunk).map_err(usage)?;
    if a.via.len() > qgate_chunks::MAX_LANES {
        return Err(usage(format!(
            "at most {} --via interfaces",
            qgate_chunks::MAX_LANES
        )));
    }
    let trust = crate::client::trust_from(a.ca.clone(), cfg)?;
    let timeout = a.timeout.unwrap_or(DEFAULT_REQUEST_TIMEOUT);
    let source: Arc<std::fs::File> = Arc::new(file);

    let bar = |len: u64, tmpl: &str| {
        let pb = if a.quiet {
            ProgressBar::hidden()
        } else {
            ProgressBar::new(len)
        };
        pb.set_style(ProgressStyle::with_template(tmpl).expect("valid template"));
        pb
    };
    let hashing = bar(
        size,
        "checksum [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes}",
    );
    let digest = sha256(&*source, size, |done| hashing.set_position(done))
        .map_err(|e| usage(format!("cannot read {}: {e}", a.file.display())))?;
    hashing.finish_and_clear();
    let info = FileInfo {
        layout,
        sha256: digest,
    };

    crate::runtime().block_on(async move {
        let server = target.resolve().await.map_err(usage)?;
        let locals: Vec<IpAddr> = if a.via.is_empty() {
            vec![if server.is_ipv4() {
                IpAddr::from([0u8; 4])
            } else {
                IpAddr::from([0u16; 8])
            }]
        } else {
            a.via.clone()
        };
        let mut up = Upload::builder()
            .trust(trust)
            .server_name(&target.host)
            .name(&name)
            .request_timeout(timeout)
            .transport(cfg.transport.clone())
            .file(info, source);
        let bind = |ip: IpAddr| {
            Socket::bind_udp(SocketAddr::new(ip, 0))
                .map_err(|e| usage(format!("--via {ip}: {e} (is it an address of this machine?)")))
        };
        for (i, ip) in locals.iter().enumerate() {
            if locals[..i].contains(ip) {
                return Err(usage(format!("--via {ip} is given twice")));
            }
            if ip.is_ipv4() != server.is_ipv4() {
                return Err(usage(format!(
                    "--via {ip} and the server's address {} are not the same IP version",
                    server.ip()
                )));
            }
            // Each interface's backup is the next one (paper 001 §3.1).
            let backup = (locals.len() > 1)
                .then(|| bind(locals[(i + 1) % locals.len()]))
                .transpose()?;
            up = up.lane(Lane {
                socket: bind(*ip)?,
                server,
                backup,
            });
        }
        let progress = up.progress();
        let pb = bar(
            size,
            "{prefix} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {msg}",
        );
        pb.set_prefix(name.clone());
        let lanes = locals.len();
        let watch = {
            let pb = pb.clone();
            let progress = progress.clone();
            tokio::spawn(async move {
                let mut last = vec![0u64; lanes];
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                loop {
                    tick.tick().await;
                    let mut msg = Vec::new();
                    for (i, prev) in last.iter_mut().enumerate() {
                        let l = progress.lane(i);
                        let b = l.bytes.load(Ordering::Relaxed);
                        let up = if !l.up.load(Ordering::Relaxed) {
                            " (down)"
                        } else if l.on_backup.load(Ordering::Relaxed) {
                            " (on backup)"
                        } else {
                            ""
                        };
                        msg.push(format!("{}: {:.1} Mbit/s{up}", i + 1, (b - *prev) as f64 * 8e-6));
                        *prev = b;
                    }
                    pb.set_position(progress.held_at_start() + progress.bytes());
                    pb.set_message(msg.join("  "));
                }
            })
        };
        // Ctrl-C or SIGTERM: either way the user hears how to resume.
        let stop = crate::stop_requested();
        let result = tokio::select! {
            biased;
            r = up.run() => r,
            () = stop => {
                pb.finish_and_clear();
                return Err(Failure {
                    status: 130,
                    error: anyhow::anyhow!(
                        "interrupted; the server keeps what it received: run the same command again to resume"
                    ),
                });
            }
        };
        watch.abort();
        pb.finish_and_clear();
        match result {
            Ok(r) => {
                let secs = r.elapsed.as_secs_f64();
                let sent: u64 = r.lanes.iter().map(|l| l.bytes).sum();
                println!(
                    "uploaded {name}: {size} bytes, SHA-256 {} verified by the server, in {secs:.2} s ({:.2} Mbit/s){}",
                    qgate_chunks::hex(&info.sha256),
                    sent as f64 * 8e-6 / secs.max(1e-9),
                    if r.resumed_bytes > 0 {
                        format!("; {} bytes were already there", r.resumed_bytes)
                    } else {
                        String::new()
                    }
                );
                let n = |n: u64, one: &str, many: &str| {
                    format!("{n} {}", if n == 1 { one } else { many })
                };
                for (i, l) in r.lanes.iter().enumerate() {
                    println!(
                        "  interface {} ({}): {}, {}, {:.2} Mbit/s, {}, {}, {}",
                        i + 1,
                        locals[i],
                        n(l.chunks, "chunk", "chunks"),
                        n(l.bytes, "byte", "bytes"),
                        l.bytes as f64 * 8e-6 / secs.max(1e-9),
                        n(l.failed, "failed request", "failed requests"),
                        n(l.connects, "connection", "connections"),
                        n(l.migrations, "move to the backup", "moves to the backup"),
                    );
                }
                Ok(())
            }
            Err(e @ UploadError::Refused { .. }) => Err(Failure {
                status: EXIT_HTTP_STATUS,
                error: anyhow::anyhow!("{e}"),
            }),
            Err(e) => Err(Failure::from(anyhow::anyhow!("{e}"))),
        }
    })
}
