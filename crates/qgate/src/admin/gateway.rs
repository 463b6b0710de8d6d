//! `qgate gateway --admin`: paths, sessions and device connections; close a connection, switch
//! the scheduler, reload the config.

use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use http::Method;
use qgate_admin::{Api, ApiError, Call, Reply, Route};
use qgate_gateway::gateway::Gateway;
use serde_json::json;

use super::{close_connection, differs, reload_config, shared_sections};
use crate::config::Config;

/// The gateway's JSON API.
pub struct GatewayApi {
    gw: Arc<Gateway>,
    /// The config the gateway started with (reload compares against it).
    started: Config,
    /// The scheduler the file named at start or at the last reload: a reload switches only
    /// when the file's choice changed, so an operator's live switch survives unrelated reloads.
    file_scheduler: Mutex<Option<String>>,
    /// Whether `--scheduler` fixed the scheduler (a reload then leaves it alone).
    scheduler_flag: bool,
}

impl GatewayApi {
    /// The API of `gw`, started from `cfg` (`scheduler_flag`: given on the command line).
    pub fn new(gw: Arc<Gateway>, cfg: Config, scheduler_flag: bool) -> GatewayApi {
        GatewayApi {
            gw,
            file_scheduler: Mutex::new(cfg.gateway.scheduler.clone()),
            started: cfg,
            scheduler_flag,
        }
    }

    fn reload(&self) -> Reply {
        let whole = reload_config()?;
        let new = &whole.gateway;
        let started = &self.started.gateway;
        let mut applied = Vec::new();
        let mut kept = Vec::new();
        let mut file_scheduler = self
            .file_scheduler
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if new.scheduler != *file_scheduler {
            // The file's scheduler, or the default where it names none.
            let name = new
                .scheduler
                .as_deref()
                .unwrap_or(qgate_forward::scheduler::DEFAULT_SCHEDULER);
            if self.scheduler_flag {
                kept.push(format!("scheduler {name}: --scheduler fixed it"));
            } else if name == self.gw.scheduler_name() {
                // Already running (switched live to it): keep its state.
                file_scheduler.clone_from(&new.scheduler);
            } else {
                self.gw
                    .set_scheduler(name)
                    .map_err(|e| ApiError::bad_request(format!("gateway.scheduler: {e}")))?;
                applied.push(format!("scheduler = {name}"));
                file_scheduler.clone_from(&new.scheduler);
            }
        }
        let mut needs_restart: Vec<String> = [
            ("admin", differs(&started.admin, &new.admin)),
            ("listen", differs(&started.listen, &new.listen)),
            ("server", differs(&started.server, &new.server)),
            ("ca", differs(&started.ca, &new.ca)),
            // Credentials are read at start: a CA removed or a key rotated takes a restart.
            ("device_ca", differs(&started.device_ca, &new.device_ca)),
            (
                "device_token_key",
                differs(&started.device_token_key, &new.device_token_key),
            ),
            (
                "probe_interval",
                differs(&started.probe_interval, &new.probe_interval),
            ),
            ("paths", differs(&started.paths, &new.paths)),
            ("limits and timeouts", differs(&started.limits, &new.limits)),
        ]
        .into_iter()
        .filter(|&(_, d)| d)
        .map(|(n, _)| n.to_string())
        .collect();
        needs_restart.extend(shared_sections(&self.started, &whole, true));
        Ok(json!({ "applied": applied, "kept": kept, "needs_restart": needs_restart }))
    }
}

/// The answer to a spool route on a gateway without one.
fn no_spool() -> ApiError {
    ApiError::not_found("this gateway has no spool: start it with --spool DIR or [gateway.spool]")
}

const ROUTES: [Route; 11] = [
    Route { method: "GET", path: "paths", about: "backhaul paths: up, RTT, cwnd, loss, hits, requests, bytes" },
    Route { method: "GET", path: "sessions", about: "registered devices, most recently active first (?limit=N)" },
    Route { method: "GET", path: "connections", about: "device connections (?limit=N)" },
    Route { method: "POST", path: "connections/{id}/close", about: "close a device connection (its sessions end)" },
    Route { method: "GET", path: "scheduler", about: "the path scheduler and the choices" },
    Route { method: "POST", path: "scheduler", about: "switch the scheduler: {\"name\": \"adaptive\"}" },
    Route { method: "GET", path: "stats", about: "counters" },
    Route { method: "GET", path: "delay", about: "responses and their summed delay per class (priority, best_effort) since start" },
    Route { method: "GET", path: "spool", about: "the spool: records and bytes held by class and device, oldest, counters" },
    Route { method: "POST", path: "spool/purge", about: "drop spooled records: {\"device\": \"10.0.0.7\"} and/or {\"class\": \"best-effort\"}; {} drops all" },
    Route { method: "POST", path: "reload", about: "read the config file again: the scheduler changes live; other changes are listed as needing a restart" },
];

impl Api for GatewayApi {
    fn routes(&self) -> Vec<Route> {
        ROUTES.to_vec()
    }

    fn call<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            let gw = &self.gw;
            match (call.method, call.path.as_slice()) {
                (&Method::GET, ["paths"]) => Ok(json!(gw.path_views())),
                (&Method::GET, ["sessions"]) => {
                    let (rows, total) = gw.session_views(call.limit()?);
                    Ok(json!({ "total": total, "sessions": rows }))
                }
                (&Method::GET, ["connections"]) => {
                    let (rows, total) = gw.connection_views(call.limit()?);
                    Ok(json!({ "total": total, "connections": rows }))
                }
                (&Method::POST, ["connections", id, "close"]) => {
                    close_connection(id, "device connection", |id| gw.close_connection(id))
                }
                (&Method::GET, ["scheduler"]) => Ok(json!({
                    "name": gw.scheduler_name(),
                    "choices": qgate_forward::scheduler::SCHEDULERS,
                })),
                (&Method::POST, ["scheduler"]) => {
                    let name = call.str_field("name")?;
                    let before = gw.set_scheduler(name).map_err(ApiError::bad_request)?;
                    Ok(json!({ "name": name, "before": before }))
                }
                (&Method::GET, ["stats"]) => {
                    // The counters `/metrics` has, batches (decision G23) included.
                    let mut stats = json!(gw.stats.snapshot());
                    let b = &gw.batch_stats;
                    let n = |c: &std::sync::atomic::AtomicU64| {
                        c.load(std::sync::atomic::Ordering::Relaxed)
                    };
                    stats["batches"] = json!(n(&b.batches));
                    stats["batched_records"] = json!(n(&b.batched));
                    stats["batches_refused"] = json!(n(&b.refused));
                    Ok(stats)
                }
                (&Method::GET, ["delay"]) => {
                    let class = |h: &qgate_gateway::gateway::DelayHistogram| json!({ "count": h.count(), "sum_s": h.sum_s() });
                    Ok(json!({
                        "priority": class(&gw.stats.delay_priority),
                        "best_effort": class(&gw.stats.delay_best_effort),
                    }))
                }
                (&Method::GET, ["spool"]) => {
                    let s = gw.spool().ok_or_else(no_spool)?;
                    let mut v = json!(s.view());
                    v["counters"] = json!(s.stats().snapshot());
                    v["now_ms"] = json!(gw.wall_ms());
                    Ok(v)
                }
                (&Method::POST, ["spool", "purge"]) => {
                    let s = gw.spool().ok_or_else(no_spool)?;
                    let device = call.body.get("device").and_then(|v| v.as_str());
                    let class = match call.body.get("class").and_then(|v| v.as_str()) {
                        None => None,
                        Some("priority") => Some(qgate_forward::scheduler::Priority::Priority),
                        Some("best-effort") => Some(qgate_forward::scheduler::Priority::BestEffort),
                        Some(c) => {
                            return Err(ApiError::bad_request(format!(
                                "class '{c}': priority or best-effort"
                            )))
                        }
                    };
                    let n = s
                        .purge(device, class)
                        .await
                        .map_err(|e| ApiError::conflict(format!("spool purge not saved: {e}")))?;
                    Ok(json!({ "purged": n }))
                }
                (&Method::POST, ["reload"]) => self.reload(),
                _ => Err(call.no_route()),
            }
        })
    }

    fn health(&self) -> Result<(), String> {
        if let Some(why) = self
            .gw
            .spool()
            .and_then(|s| s.unavailable(self.gw.wall_ms()))
        {
            return Err(format!("the spool is off: {why}"));
        }
        if self.gw.path_views().iter().any(|p| p.up) {
            Ok(())
        } else {
            Err("no backhaul path is up".into())
        }
    }
}
