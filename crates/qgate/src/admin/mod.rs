//! The admin port of `qgate server`, `gateway` and `broker` (`qgate_admin`, decision O2): the
//! flags and config keys, the token, each daemon's JSON API, and `qgate ctl`.

mod broker;
pub mod ctl;
mod gateway;
mod server;

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use qgate_admin::{AdminBuilder, RunningAdmin, Token};

use crate::{usage, Failure};

pub use broker::BrokerApi;
pub use gateway::GatewayApi;
pub use server::ServerApi;

/// The environment variable holding the admin token (daemons and `qgate ctl`).
pub const TOKEN_ENV: &str = "QGATE_ADMIN_TOKEN";

/// `--admin` and its token, shared by the daemons.
#[derive(Args, Debug, Clone, Default)]
pub struct AdminArgs {
    /// Admin HTTP port: Prometheus GET /metrics, the JSON API under /api (qgate ctl), GET
    /// /health. PORT (on 127.0.0.1) or HOST:PORT; another host than loopback needs a token
    /// [default: off]
    #[arg(long, value_name = "ADDR", value_parser = parse_addr)]
    pub admin: Option<SocketAddr>,
    /// File holding the admin port's bearer token [default: [admin] token_file, else
    /// $QGATE_ADMIN_TOKEN, else none (loopback only)]
    #[arg(long, value_name = "FILE")]
    pub admin_token_file: Option<PathBuf>,
}

/// `PORT` or `localhost:PORT` (on 127.0.0.1), or `HOST:PORT` with an IP address.
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    let port = s.strip_prefix("localhost:").unwrap_or(s);
    if let Ok(port) = port.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    s.parse()
        .map_err(|_| format!("'{s}' is not PORT or an address like 127.0.0.1:9464"))
}

impl AdminArgs {
    /// The address from the flag, else `section` (the daemon's `admin` key); None: no port.
    pub fn addr(&self, section: Option<&str>) -> Result<Option<SocketAddr>, Failure> {
        match (self.admin, section) {
            (Some(a), _) => Ok(Some(a)),
            (None, Some(s)) => parse_addr(s)
                .map(Some)
                .map_err(|e| usage(format!("admin: {e}"))),
            (None, None) => Ok(None),
        }
    }

    /// The token: the flag's file, else `[admin] token_file`, else `$QGATE_ADMIN_TOKEN`.
    pub fn token(&self, section: &crate::config::AdminSection) -> Result<Option<Token>, Failure> {
        if let Some(f) = self
            .admin_token_file
            .as_ref()
            .or(section.token_file.as_ref())
        {
            warn_if_readable(f);
            return Token::from_file(f).map(Some).map_err(usage);
        }
        env_token()
    }
}

/// A token file other users can read gives them the admin port: say so (it still works).
fn warn_if_readable(f: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(m) = std::fs::metadata(f) {
        if m.permissions().mode() & 0o044 != 0 {
            eprintln!(
                "qgate: warning: the admin token file {} can be read by other users (chmod 600 it)",
                f.display()
            );
        }
    }
}

/// The token in `$QGATE_ADMIN_TOKEN`, if set.
pub fn env_token() -> Result<Option<Token>, Failure> {
    match std::env::var(TOKEN_ENV) {
        Ok(t) if !t.trim().is_empty() => Token::new(&t)
            .map(Some)
            .map_err(|e| usage(format!("{TOKEN_ENV}: {e}"))),
        _ => Ok(None),
    }
}

/// Start the admin port if an address was given; its line for the daemon's start-up message.
pub async fn start(
    args: &AdminArgs,
    section: Option<&str>,
    cfg: &crate::config::Config,
    builder: impl FnOnce() -> AdminBuilder,
) -> Result<Option<(RunningAdmin, String)>, Failure> {
    let Some(addr) = args.addr(section)? else {
        if args.admin_token_file.is_some() {
            return Err(usage(
                "--admin-token-file needs --admin ADDR (the port it guards)",
            ));
        }
        return Ok(None);
    };
    let token = args.token(&cfg.admin)?;
    let auth = if token.is_some() { "token" } else { "no token" };
    let running = builder().token(token).bind(addr).await.map_err(usage)?;
    let line = format!("admin http://{}/ ({auth})", running.addr());
    Ok(Some((running, line)))
}

/// `POST /api/reload`: the config file again, as the daemon was started with it.
pub(crate) fn reload_config() -> Result<crate::config::Config, qgate_admin::ApiError> {
    let Some(path) = crate::config_path() else {
        return Err(qgate_admin::ApiError::conflict(
            "this daemon was started without --config: there is nothing to reload",
        ));
    };
    let mut cfg = crate::config::Config::load(&path)
        .map_err(|e| qgate_admin::ApiError::bad_request(format!("{e:#}")))?;
    crate::apply_overrides(&mut cfg);
    Ok(cfg)
}

/// The shared sections a daemon reads at start (`[admin]`, `[transport]`, and `[history]` when
/// `history`) that differ between `old` and `new`: a reload cannot apply them.
pub(crate) fn shared_sections(
    old: &crate::config::Config,
    new: &crate::config::Config,
    history: bool,
) -> Vec<String> {
    [
        ("[admin]", differs(&old.admin, &new.admin)),
        ("[transport]", differs(&old.transport, &new.transport)),
        ("[history]", history && differs(&old.history, &new.history)),
    ]
    .into_iter()
    .filter(|&(_, d)| d)
    .map(|(n, _)| n.to_string())
    .collect()
}

/// `POST connections/{id}/close` of the gateway and the broker: `close` says whether there was
/// such a connection (`what` names it in the 404).
pub(crate) fn close_connection(
    id: &str,
    what: &str,
    close: impl FnOnce(u64) -> bool,
) -> qgate_admin::Reply {
    let id: u64 = id.parse().map_err(|_| {
        qgate_admin::ApiError::bad_request(format!("'{id}' is not a connection id"))
    })?;
    if close(id) {
        Ok(serde_json::json!({ "closed": id }))
    } else {
        Err(qgate_admin::ApiError::not_found(format!("no {what} {id}")))
    }
}

/// Whether two config values differ (compared as printed: the sections have no `PartialEq`).
pub(crate) fn differs(a: &impl std::fmt::Debug, b: &impl std::fmt::Debug) -> bool {
    format!("{a:?}") != format!("{b:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_port_is_on_loopback() {
        assert_eq!(
            parse_addr("9464").unwrap(),
            "127.0.0.1:9464".parse().unwrap()
        );
        assert_eq!(
            parse_addr("0.0.0.0:1").unwrap(),
            "0.0.0.0:1".parse().unwrap()
        );
        assert!(parse_addr("localhost").is_err());
        assert_eq!(
            parse_addr("localhost:80").unwrap(),
            "127.0.0.1:80".parse().unwrap()
        );
    }
}
