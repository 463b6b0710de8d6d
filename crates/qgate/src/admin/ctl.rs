//! `qgate ctl`: the admin port's command-line client.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use http::Method;
use qgate_admin::{AdminClient, Token};
use serde_json::Value;

use crate::{usage, Failure, EXIT_HTTP_STATUS};

#[derive(Args, Debug)]
pub struct CtlArgs {
    /// The daemon's admin port: HOST:PORT, PORT (on 127.0.0.1) or http://HOST:PORT (what it
    /// printed at start-up as "admin http://…") [default: the one `admin` key of --config's
    /// [server], [gateway] or [broker], else $QGATE_ADMIN].
    #[arg(long, global = true, value_name = "ADDR")]
    admin: Option<String>,
    /// File holding the admin token [default: $QGATE_ADMIN_TOKEN, else [admin] token_file of
    /// --config, else none].
    #[arg(long, global = true, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Print the daemon's JSON answer as it is (lists are otherwise shown as tables, other
    /// answers as indented JSON).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    what: Ctl,
}

#[derive(Subcommand, Debug)]
enum Ctl {
    /// Whether the daemon can do its job (exit 3 if not).
    Health,
    /// The Prometheus metrics text.
    Metrics,
    /// The daemon's API routes.
    Routes,
    /// Gateway: backhaul paths (up, RTT, hits, traffic).
    Paths,
    /// Gateway: registered devices.
    Sessions {
        /// Most rows.
        #[arg(long, default_value_t = qgate_admin_list_limit())]
        limit: usize,
    },
    /// Gateway or broker: connections.
    Connections {
        /// Most rows.
        #[arg(long, default_value_t = qgate_admin_list_limit())]
        limit: usize,
    },
    /// Gateway or broker: close connection ID.
    Close {
        /// From `connections`.
        id: u64,
    },
    /// Gateway: show the scheduler, or switch to NAME.
    Scheduler {
        /// completion, adaptive, adaptive-packets, round-robin or single.
        name: Option<String>,
    },
    /// Gateway: the spool (held by class and device, oldest, counters); with --purge, drop
    /// spooled records (of --device and/or --class, else all).
    Spool {
        /// Drop spooled records instead of showing them.
        #[arg(long)]
        purge: bool,
        /// With --purge: this device's records (its address, without the port).
        #[arg(long, requires = "purge")]
        device: Option<String>,
        /// With --purge: this class's records, priority or best-effort.
        #[arg(long, requires = "purge", value_parser = ["priority", "best-effort"])]
        class: Option<String>,
    },
    /// Broker: queues with depth and rates.
    Queues,
    /// Broker: drop QUEUE's ready messages.
    Purge {
        /// The queue.
        queue: String,
    },
    /// Broker: bridges to upstream brokers.
    Bridges,
    /// Server or gateway: counters.
    Stats,
    /// Server: where ingested bodies go (and the queue sink's state).
    Sink,
    /// Read the daemon's config file again; says what changed live and what needs a restart.
    Reload,
    /// GET any API path (e.g. `paths`, `/metrics`).
    Get {
        /// Under /api/ unless it starts with '/'.
        path: String,
    },
    /// POST to any API path, with a JSON body.
    Post {
        /// Under /api/ unless it starts with '/'.
        path: String,
        /// The JSON body (e.g. '{"name":"single"}').
        body: Option<String>,
    },
}

fn qgate_admin_list_limit() -> usize {
    qgate_admin::DEFAULT_LIST_LIMIT
}

/// The admin addresses the config file's daemon sections name (`--config FILE ctl …` talks to
/// the one daemon FILE configures, as the systemd unit's reload does).
fn config_admin(cfg: &crate::config::Config) -> Vec<(&'static str, String)> {
    [
        ("[server]", &cfg.server.admin),
        ("[gateway]", &cfg.gateway.admin),
        ("[broker]", &cfg.broker.admin),
    ]
    .into_iter()
    .filter_map(|(s, a)| a.clone().map(|a| (s, a)))
    .collect()
}

pub fn ctl(a: CtlArgs, cfg: &crate::config::Config) -> Result<(), Failure> {
    // The flag, then the environment, then the config file (an operator who cannot read the
    // daemon's token file may still have the token in the environment).
    let token = match (&a.token_file, super::env_token()?, &cfg.admin.token_file) {
        (Some(f), _, _) => Some(Token::from_file(f).map_err(usage)?),
        (None, Some(t), _) => Some(t),
        (None, None, Some(f)) => Some(Token::from_file(f).map_err(usage)?),
        (None, None, None) => None,
    };
    // The flag, then the file the command names, then the environment (an image's default).
    let env = std::env::var("QGATE_ADMIN").ok().filter(|s| !s.is_empty());
    let admin = match (&a.admin, &config_admin(cfg)[..]) {
        (Some(a), _) => a.clone(),
        (None, []) if env.is_some() => env.expect("checked"),
        (None, [(_, one)]) => match super::parse_addr(one) {
            // A daemon bound to every address answers on loopback.
            Ok(sa) if sa.ip().is_unspecified() => {
                let lo: std::net::IpAddr = if sa.is_ipv4() {
                    std::net::Ipv4Addr::LOCALHOST.into()
                } else {
                    std::net::Ipv6Addr::LOCALHOST.into()
                };
                std::net::SocketAddr::new(lo, sa.port()).to_string()
            }
            Ok(sa) => sa.to_string(),
            Err(_) => one.clone(),
        },
        (None, []) => {
            return Err(usage(
                "which daemon? give --admin ADDR (or QGATE_ADMIN): the address it printed as \"admin http://…\"",
            ))
        }
        (None, several) if env.is_none() => {
            let named: Vec<String> = several.iter().map(|(s, a)| format!("{s} {a}")).collect();
            return Err(usage(format!(
                "the config file names several admin ports ({}): give --admin ADDR",
                named.join(", ")
            )));
        }
        (None, _) => env.expect("checked"),
    };
    let admin = &admin;
    let addr = match admin.parse::<u16>() {
        Ok(port) => format!("127.0.0.1:{port}"),
        Err(_) => admin.clone(),
    };
    let client = AdminClient::new(&addr, token).map_err(usage)?;
    let api = |p: &str| {
        if p.starts_with('/') {
            p.to_string()
        } else {
            format!("/api/{p}")
        }
    };
    let (method, path, body): (Method, String, Option<Value>) = match &a.what {
        Ctl::Health => (Method::GET, "/health".into(), None),
        Ctl::Metrics => (Method::GET, "/metrics".into(), None),
        Ctl::Routes => (Method::GET, "/api".into(), None),
        Ctl::Paths => (Method::GET, api("paths"), None),
        Ctl::Sessions { limit } => (Method::GET, api(&format!("sessions?limit={limit}")), None),
        Ctl::Connections { limit } => (
            Method::GET,
            api(&format!("connections?limit={limit}")),
            None,
        ),
        Ctl::Close { id } => (Method::POST, api(&format!("connections/{id}/close")), None),
        Ctl::Scheduler { name: None } => (Method::GET, api("scheduler"), None),
        Ctl::Scheduler { name: Some(n) } => (
            Method::POST,
            api("scheduler"),
            Some(serde_json::json!({ "name": n })),
        ),
        Ctl::Spool { purge: false, .. } => (Method::GET, api("spool"), None),
        Ctl::Spool {
            purge: true,
            device,
            class,
        } => {
            let mut body = serde_json::Map::new();
            if let Some(d) = device {
                body.insert("device".into(), d.clone().into());
            }
            if let Some(c) = class {
                body.insert("class".into(), c.clone().into());
            }
            (Method::POST, api("spool/purge"), Some(Value::Object(body)))
        }
        Ctl::Queues => (Method::GET, api("queues"), None),
        Ctl::Purge { queue } => {
            if queue.is_empty() {
                return Err(usage("give the queue's name"));
            }
            let q = qgate_admin::percent_encode(queue);
            (Method::POST, api(&format!("queues/{q}/purge")), None)
        }
        Ctl::Bridges => (Method::GET, api("bridges"), None),
        Ctl::Stats => (Method::GET, api("stats"), None),
        Ctl::Sink => (Method::GET, api("sink"), None),
        Ctl::Reload => (Method::POST, api("reload"), None),
        Ctl::Get { path } => (Method::GET, api(path), None),
        Ctl::Post { path, body } => {
            let body = match body {
                Some(b) => Some(
                    serde_json::from_str(b)
                        .map_err(|e| usage(format!("the body is not JSON: {e}")))?,
                ),
                None => None,
            };
            (Method::POST, api(path), body)
        }
    };
    let (status, bytes) = crate::runtime()
        .block_on(client.request(method, &path, body.as_ref()))
        .map_err(|e| Failure {
            status: 1,
            error: anyhow::anyhow!("{e}"),
        })?;
    let json: Option<Value> = serde_json::from_slice(&bytes).ok();
    if !status.is_success() {
        let why = json
            .as_ref()
            .and_then(|v| v.get("error"))
            .and_then(Value::as_str)
            .map_or_else(
                || String::from_utf8_lossy(&bytes).trim().to_string(),
                str::to_string,
            );
        // A command for another kind of daemon: say what this one answers.
        let hint = if status == http::StatusCode::NOT_FOUND && why.starts_with("no route") {
            "; `qgate ctl routes` lists what this daemon answers (paths, sessions and scheduler \
             are a gateway's, queues and bridges a broker's, sink a server's)"
        } else {
            ""
        };
        return Err(Failure {
            status: EXIT_HTTP_STATUS,
            error: anyhow::anyhow!("{status}: {why}{hint}"),
        });
    }
    match json {
        Some(v) if a.json => println!("{}", serde_json::to_string_pretty(&v).expect("a Value")),
        Some(v) => print!("{}", render(&v)),
        None => print!("{}", String::from_utf8_lossy(&bytes)),
    }
    Ok(())
}

/// A JSON answer for a terminal: a list of objects (alone, or beside a `total`) as a table,
/// anything else as indented JSON.
fn render(v: &Value) -> String {
    if let Some(rows) = table_rows(v) {
        let mut out = table(rows);
        if let Some(total) = v.get("total").and_then(Value::as_u64) {
            if total as usize > rows.len() {
                out.push_str(&format!(
                    "({} of {total} shown; --limit for more)\n",
                    rows.len()
                ));
            }
        }
        return out;
    }
    format!("{}\n", serde_json::to_string_pretty(v).expect("a Value"))
}

fn table_rows(v: &Value) -> Option<&Vec<Value>> {
    let rows = match v {
        Value::Array(a) => a,
        Value::Object(o) => {
            let mut arrays = o.values().filter_map(Value::as_array);
            let a = arrays.next()?;
            if arrays.next().is_some() || o.len() > 2 {
                return None;
            }
            a
        }
        _ => return None,
    };
    rows.iter().all(Value::is_object).then_some(rows)
}

/// `s` with control characters shown as escapes: names come from peers (a queue may be named
/// with terminal escape sequences or newlines) and must not drive the operator's terminal.
fn visible(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

fn table(rows: &[Value]) -> String {
    let Some(first) = rows.first().and_then(Value::as_object) else {
        return "(none)\n".into();
    };
    let cols: Vec<&String> = first.keys().collect();
    let cell = |v: Option<&Value>| {
        visible(&match v {
            None | Some(Value::Null) => "-".to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) => match n.as_f64() {
                Some(f) if n.is_f64() => format!("{f:.3}")
                    .trim_end_matches('0')
                    .trim_end_matches('.')
                    .to_string(),
                _ => n.to_string(),
            },
            Some(v) => v.to_string(),
        })
    };
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| cols.iter().map(|c| cell(r.get(c.as_str()))).collect())
        .collect();
    let widths: Vec<usize> = cols
        .iter()
        .enumerate()
        .map(|(i, c)| {
            cells
                .iter()
                .map(|r| r[i].len())
                .chain([c.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |vals: Vec<&str>| {
        let mut s = vals
            .iter()
            .zip(&widths)
            .map(|(v, w)| format!("{v:<w$}"))
            .collect::<Vec<_>>()
            .join("  ");
        s.truncate(s.trim_end().len());
        s.push('\n');
        s
    };
    let mut out = line(cols.iter().map(|c| c.as_str()).collect());
    for r in &cells {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lists_become_tables_and_the_rest_stays_json() {
        let v = json!({"total": 3, "sessions": [
            {"id": 1, "rtt_ms": 12.5, "up": true, "server": null},
            {"id": 22, "rtt_ms": 3.0, "up": false, "server": "10.0.0.1:443"},
        ]});
        let t = render(&v);
        assert_eq!(
            t,
            "id  rtt_ms  up     server\n1   12.5    true   -\n22  3       false  10.0.0.1:443\n(2 of 3 shown; --limit for more)\n"
        );
        assert!(render(&json!({"name": "adaptive", "choices": ["a"]})).starts_with("{\n"));
        assert_eq!(render(&json!([])), "(none)\n");
        let evil = render(&json!([{"name": "\u{1b}[31mred\nfake 1"}]));
        assert_eq!(evil, "name\n\\u{1b}[31mred\\nfake 1\n");
    }
}
