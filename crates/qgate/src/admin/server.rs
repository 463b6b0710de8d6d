//! `qgate server --admin`: ingest counters, the queue sink, reload.

use futures_util::future::BoxFuture;
use http::Method;
use qgate_admin::{Api, Call, Reply, Route};
use qgate_server::ServerMetrics;
use serde_json::json;

use super::{differs, reload_config, shared_sections};
use crate::config::Config;

/// The ingest server's JSON API.
pub struct ServerApi {
    metrics: ServerMetrics,
    started: Config,
}

impl ServerApi {
    /// The API over `metrics` of a server started from `cfg`.
    pub fn new(metrics: ServerMetrics, cfg: Config) -> ServerApi {
        ServerApi {
            metrics,
            started: cfg,
        }
    }
}

const ROUTES: [Route; 3] = [
    Route {
        method: "GET",
        path: "stats",
        about: "ingest counters, and the queue sink's state",
    },
    Route {
        method: "GET",
        path: "sink",
        about: "the queue sink: up, accepted, failed, connects (null for a file sink)",
    },
    Route {
        method: "POST",
        path: "reload",
        about:
            "read the config file again: lists what changed (every [server] key needs a restart)",
    },
];

impl Api for ServerApi {
    fn routes(&self) -> Vec<Route> {
        ROUTES.to_vec()
    }

    fn call<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            match (call.method, call.path.as_slice()) {
                (&Method::GET, ["stats"]) => Ok(json!({
                    "ingest": self.metrics.snapshot(),
                    "sink": self.metrics.upstream(),
                })),
                (&Method::GET, ["sink"]) => Ok(json!(self.metrics.upstream())),
                (&Method::POST, ["reload"]) => {
                    let new = reload_config()?;
                    let mut needs_restart = shared_sections(&self.started, &new, true);
                    if differs(&self.started.server, &new.server) {
                        needs_restart.insert(0, "[server]".into());
                    }
                    Ok(json!({ "applied": [], "needs_restart": needs_restart }))
                }
                _ => Err(call.no_route()),
            }
        })
    }

    fn health(&self) -> Result<(), String> {
        match self.metrics.upstream() {
            Some(q) if !q.up => Err("the queue sink's broker is unreachable".into()),
            _ => Ok(()),
        }
    }
}
