//! `qgate get` and `qgate post`

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use qgate_transport::http3::{H3Client, ALPN_H3};
use qgate_transport::{client_config, connect, endpoint, DevPki, Socket, TrustRoots};

use crate::config::{parse_duration, Config};
use crate::{default_dev_pki_dir, usage, Failure, EXIT_HTTP_STATUS};

/// How long `qgate get/post` waits for the server's handshake unless told.
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Args, Debug)]
pub struct ClientArgs {
    /// https://HOST[:PORT]/PATH (port 443 if omitted).
    url: String,
    /// CA certificate(s) to trust, PEM [default: the development CA, if this machine has one].
    #[arg(long, value_name = "FILE")]
    ca: Option<PathBuf>,
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, help = crate::dflt(
        "Give up if the server has not answered the handshake within this time",
        qgate_core::units::format_duration(DEFAULT_CONNECT_TIMEOUT)))]
    connect_timeout: Option<Duration>,
    #[arg(long, value_name = "BYTES", value_parser = crate::parse_size, help = crate::dflt(
        "Largest response body accepted, bytes", qgate_transport::http3::DEFAULT_MAX_BODY))]
    max_response: Option<usize>,
    /// Print the status line and headers to standard error.
    #[arg(short, long)]
    include: bool,
    /// An extra request header, 'NAME: VALUE' (repeatable), e.g. -H 'qgate-request-id: r-17'.
    #[arg(short = 'H', long = "header", value_name = "NAME: VALUE")]
    headers: Vec<String>,
    /// Start from the congestion window of earlier connections to this server (paper 002);
    /// how is `[history] resume`: careful (RFC 9959, the default) or window (the paper's)
    /// [default: off, or [history] mode].
    #[arg(long, value_enum, value_name = "MODE")]
    history: Option<crate::config::HistoryMode>,
    /// The history database [default: $QGATE_HOME/history.redb].
    #[arg(long, value_name = "FILE")]
    history_store: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct PostArgs {
    #[command(flatten)]
    common: ClientArgs,
    /// The body, as given.
    #[arg(short, long, value_name = "TEXT", conflicts_with = "file")]
    data: Option<String>,
    /// Read the body from FILE (`-` for standard input; the default without --data).
    #[arg(short, long, value_name = "FILE")]
    file: Option<PathBuf>,
}

fn trust(a: &ClientArgs, cfg: &Config) -> Result<TrustRoots, Failure> {
    trust_from(a.ca.clone(), cfg)
}

/// The CA to trust: `ca`, else `[client] ca`, else the development CA if this machine has one.
pub(crate) fn trust_from(ca: Option<PathBuf>, cfg: &Config) -> Result<TrustRoots, Failure> {
    if let Some(ca) = ca.or(cfg.client.ca.clone()) {
        return TrustRoots::from_pem_file(&ca).map_err(usage);
    }
    let dir = default_dev_pki_dir();
    if dir.join("ca.pem").exists() {
        return Ok(DevPki::load_or_create(&dir).map_err(usage)?.trust());
    }
    Err(usage(format!(
        "no CA to trust: pass --ca FILE (the server's CA certificate), or run `qgate server` \
         once on this machine to create the development CA in {}",
        dir.display()
    )))
}

/// `NAME: VALUE` → a header; the error says what is wrong with it.
fn header(h: &str) -> Result<(http::HeaderName, http::HeaderValue), String> {
    let (name, value) = h
        .split_once(':')
        .ok_or_else(|| format!("-H '{h}': write it as 'NAME: VALUE'"))?;
    let name = http::HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| format!("-H '{h}': '{}' is not a valid header name", name.trim()))?;
    let value = http::HeaderValue::from_str(value.trim())
        .map_err(|_| format!("-H '{h}': the value has characters a header cannot carry"))?;
    Ok((name, value))
}

fn request(a: ClientArgs, cfg: &Config, method: http::Method, body: Bytes) -> Result<(), Failure> {
    let target = crate::url::parse(&a.url).map_err(usage)?;
    let headers = a
        .headers
        .iter()
        .map(|h| header(h))
        .collect::<Result<Vec<_>, _>>()
        .map_err(usage)?;
    let trust = trust(&a, cfg)?;
    let timeout = match (a.connect_timeout, &cfg.client.connect_timeout) {
        (Some(t), _) => t,
        (None, Some(s)) => {
            parse_duration(s).map_err(|e| usage(format!("[client] connect_timeout: {e}")))?
        }
        (None, None) => DEFAULT_CONNECT_TIMEOUT,
    };
    let max_response = a
        .max_response
        .or(cfg.client.max_response)
        .unwrap_or(qgate_transport::http3::DEFAULT_MAX_BODY);
    let ccfg = client_config(&trust, &[ALPN_H3], &cfg.transport).map_err(usage)?;
    let include = a.include;
    let history = crate::historycmd::open(a.history, a.history_store.clone(), cfg)?;
    let transport = cfg.transport.clone();
    crate::runtime().block_on(async move {
        let addr = target.resolve().await.map_err(usage)?;
        let ccfg = match &history {
            Some((store, safeguard)) => {
                let peer = qgate_transport::window_history::client_peer_key(&target.host, addr);
                let (c, h) = store.client_config(&ccfg, &transport, &peer, *safeguard).map_err(usage)?;
                tracing::info!(%peer, window = h.decision.window, from_history = h.decision.from_history, jump = h.decision.careful.map(|c| c.capacity / 2), "initial window");
                c
            }
            None => qgate_transport::client_config_for(
                &ccfg,
                &transport,
                &qgate_transport::window_history::client_peer_key(&target.host, addr),
            )
            .map_err(usage)?,
        };
        let bind = if addr.is_ipv4() {
            "0.0.0.0:0"
        } else {
            "[::]:0"
        };
        let ep = endpoint(Socket::bind_udp(bind.parse().expect("valid"))?, None, None)?;
        let conn = tokio::time::timeout(timeout, connect(&ep, &ccfg, addr, &target.host, false))
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "no response from {addr} within {timeout:?}: is a qgate server listening there?"
                )
            })??;
        let h3 = H3Client::new(conn.connection().clone()).await?;
        let mut req = http::Request::builder()
            .method(method)
            .uri(target.uri.clone())
            .body(())
            .context("building the request")?;
        for (k, v) in headers {
            req.headers_mut().append(k, v);
        }
        let resp = h3.request(req, body, max_response).await?;
        h3.close();
        if include {
            eprintln!("HTTP/3 {}", resp.status);
            for (k, v) in &resp.headers {
                eprintln!("{k}: {}", v.to_str().unwrap_or("<binary>"));
            }
        }
        let mut out = std::io::stdout();
        out.write_all(&resp.body).context("writing the response")?;
        // On a terminal the shell's prompt starts on a line of its own; piped, the body is
        // written as it came.
        if std::io::IsTerminal::is_terminal(&out) && !resp.body.ends_with(b"\n") {
            out.write_all(b"\n").context("writing the response")?;
        }
        out.flush().ok();
        ep.wait_idle().await;
        if !resp.status.is_success() {
            return Err(Failure {
                status: EXIT_HTTP_STATUS,
                error: anyhow::anyhow!("{} answered {}", target.url, resp.status),
            });
        }
        Ok(())
    })
}

pub fn get(a: ClientArgs, cfg: &Config) -> Result<(), Failure> {
    request(a, cfg, http::Method::GET, Bytes::new())
}

pub fn post(a: PostArgs, cfg: &Config) -> Result<(), Failure> {
    let body = match (a.data, a.file) {
        (Some(d), _) => Bytes::from(d),
        (None, Some(f)) if f.as_os_str() != "-" => Bytes::from(
            std::fs::read(&f)
                .map_err(|e| usage(format!("cannot read body file {}: {e}", f.display())))?,
        ),
        _ => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .context("reading the body from standard input")?;
            Bytes::from(buf)
        }
    };
    request(a.common, cfg, http::Method::POST, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_parse_or_say_why_not() {
        let (k, v) = header("qgate-request-id:  r-17 ").unwrap();
        assert_eq!(
            (k.as_str(), v.to_str().unwrap()),
            ("qgate-request-id", "r-17")
        );
        assert!(header("no-colon").unwrap_err().contains("'NAME: VALUE'"));
        assert!(header("bad name: x")
            .unwrap_err()
            .contains("not a valid header name"));
        assert!(header("x: a\u{7f}b").unwrap_err().contains("cannot carry"));
    }
}
