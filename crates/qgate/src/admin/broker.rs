//! `qgate broker --admin`: queues with depth and rates, purge; connections, close; bridges;
//! reload (new declared queues).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::Method;
use qgate_admin::{Api, ApiError, Call, Reply, Route};
use qgate_amqp::broker::{Broker, Declared};
use serde_json::json;
use tokio::time::Instant;

use super::{close_connection, differs, reload_config, shared_sections};
use crate::config::BrokerSection;
use crate::config::Config;

/// Rates are measured over this window.
const RATE_WINDOW: Duration = Duration::from_secs(10);
/// How often the queues' counters are sampled for rates.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// Each queue's (enqueued, acked) counters at one moment.
type Sample = (Instant, HashMap<String, (u64, u64)>);

/// Samples, oldest first, over [`RATE_WINDOW`].
#[derive(Default)]
struct Rates {
    samples: VecDeque<Sample>,
}

impl Rates {
    fn sample(&mut self, broker: &Broker, now: Instant) {
        let counts = broker
            .queue_stats()
            .into_iter()
            .map(|q| (q.name, (q.stats.enqueued, q.stats.acked)))
            .collect();
        self.samples.push_back((now, counts));
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) > RATE_WINDOW)
        {
            self.samples.pop_front();
        }
    }

    /// Messages per second into and out of `queue`, from the oldest sample to `now`'s counts.
    fn of(&self, queue: &str, now: Instant, enqueued: u64, acked: u64) -> Option<(f64, f64)> {
        let (t, counts) = self.samples.front()?;
        let secs = now.saturating_duration_since(*t).as_secs_f64();
        let (e0, a0) = counts.get(queue).copied().unwrap_or((0, 0));
        (secs >= 0.5).then(|| {
            (
                enqueued.saturating_sub(e0) as f64 / secs,
                acked.saturating_sub(a0) as f64 / secs,
            )
        })
    }
}

/// The broker's JSON API.
pub struct BrokerApi {
    broker: Broker,
    rates: Arc<Mutex<Rates>>,
    /// The `[broker]` section as running now (start-up, then each reload's declarations).
    started: Mutex<BrokerSection>,
    /// The whole config at start (its shared sections cannot change live).
    config: Config,
}

impl BrokerApi {
    /// The API of `broker`, started from `section`; samples the queues for rates while it
    /// lives (on the current tokio runtime).
    pub fn new(broker: Broker, config: Config) -> BrokerApi {
        let section = config.broker.clone();
        let rates = Arc::new(Mutex::new(Rates::default()));
        tokio::spawn(sample(broker.clone(), Arc::downgrade(&rates)));
        BrokerApi {
            broker,
            rates,
            started: Mutex::new(section),
            config,
        }
    }

    fn queues(&self, limit: usize) -> Reply {
        let now = Instant::now();
        let all = self.broker.queue_stats();
        let total = all.len();
        let rates = self.rates.lock().unwrap_or_else(|e| e.into_inner());
        let rows: Vec<_> = all
            .into_iter()
            .take(limit)
            .map(|q| {
                let r = rates.of(&q.name, now, q.stats.enqueued, q.stats.acked);
                json!({
                    "name": q.name,
                    "depth": q.depth,
                    "ready": q.ready,
                    "unacked": q.unacked,
                    "bytes": q.bytes,
                    "enqueued": q.stats.enqueued,
                    "acked": q.stats.acked,
                    "redelivered": q.stats.released,
                    "expired": q.stats.expired,
                    "refused": q.stats.refused,
                    "purged": q.stats.purged,
                    "in_per_s": r.map(|r| (r.0 * 10.0).round() / 10.0),
                    "out_per_s": r.map(|r| (r.1 * 10.0).round() / 10.0),
                })
            })
            .collect();
        Ok(json!({ "total": total, "queues": rows }))
    }

    fn reload(&self) -> Reply {
        let whole = reload_config()?;
        let new = &whole.broker;
        new.config
            .validate()
            .map_err(|e| ApiError::bad_request(format!("[broker]: {e}")))?;
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        let mut applied = Vec::new();
        let mut kept = Vec::new();
        let mut created = Vec::new();
        let mut restart_queues = Vec::new();
        for d in &new.config.queues {
            let before = started.config.queues.iter().find(|o| o.name == d.name);
            match (self.broker.declare_queue(d), before) {
                (Declared::Created, _) => {
                    applied.push(format!("queue {} declared", d.name));
                    created.push(d.clone());
                }
                (Declared::Full, _) => kept.push(format!(
                    "queue {} not declared: the broker holds max_queues already",
                    d.name
                )),
                (Declared::Exists, Some(o)) if !differs(o, d) => {}
                (Declared::Exists, Some(_)) => {
                    restart_queues.push(format!("queue {}: its new limits", d.name))
                }
                (Declared::Exists, None) => restart_queues.push(format!(
                    "queue {}: a peer created it with the default limits",
                    d.name
                )),
            }
        }
        for o in &started.config.queues {
            if !new.config.queues.iter().any(|d| d.name == o.name) {
                kept.push(format!(
                    "queue {} stays until a restart (no longer declared)",
                    o.name
                ));
            }
        }
        let old = &*started;
        let mut needs_restart = Vec::new();
        for (name, d) in [
            (
                "listeners (quic, tls, tcp)",
                differs(
                    &(&old.quic, &old.tls, &old.tcp),
                    &(&new.quic, &new.tls, &new.tcp),
                ),
            ),
            ("admin", differs(&old.admin, &new.admin)),
            (
                "credentials, anonymous",
                differs(
                    &(&old.credentials, old.anonymous),
                    &(&new.credentials, new.anonymous),
                ),
            ),
            (
                "cert, key, client_ca",
                differs(
                    &(&old.cert, &old.key, &old.client_ca),
                    &(&new.cert, &new.key, &new.client_ca),
                ),
            ),
            ("bridges", differs(&old.bridges, &new.bridges)),
        ] {
            if d {
                needs_restart.push(name.to_string());
            }
        }
        // Queues already declared keep their limits; the broker's other keys need a restart.
        let live_queues = {
            let mut a = old.config.clone();
            let mut b = new.config.clone();
            a.queues.clear();
            b.queues.clear();
            (a, b)
        };
        if differs(&live_queues.0, &live_queues.1) {
            needs_restart.push("broker limits, store and timeouts".into());
        }
        needs_restart.extend(restart_queues);
        needs_restart.extend(shared_sections(&self.config, &whole, false));
        // What runs now: the queues declared are part of it from here on.
        started.config.queues.extend(created);
        Ok(json!({ "applied": applied, "kept": kept, "needs_restart": needs_restart }))
    }
}

async fn sample(broker: Broker, rates: Weak<Mutex<Rates>>) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(r) = rates.upgrade() else { return };
        r.lock()
            .unwrap_or_else(|e| e.into_inner())
            .sample(&broker, Instant::now());
    }
}

const ROUTES: [Route; 6] = [
    Route { method: "GET", path: "queues", about: "queues by name: depth, ready, unacked, bytes, counters, in/out per second over the last 10 s (?limit=N)" },
    Route { method: "POST", path: "queues/{name}/purge", about: "drop a queue's ready messages (delivered, unsettled ones stay)" },
    Route { method: "GET", path: "connections", about: "AMQP connections (?limit=N)" },
    Route { method: "POST", path: "connections/{id}/close", about: "close a connection (the peer hears amqp:connection:forced)" },
    Route { method: "GET", path: "bridges", about: "bridges to upstream brokers: up, forwarded, rejected, connects" },
    Route { method: "POST", path: "reload", about: "read the config file again: new [[broker.queues]] are declared; other changes are listed as needing a restart" },
];

impl Api for BrokerApi {
    fn routes(&self) -> Vec<Route> {
        ROUTES.to_vec()
    }

    fn call<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            let b = &self.broker;
            match (call.method, call.path.as_slice()) {
                (&Method::GET, ["queues"]) => self.queues(call.limit()?),
                (&Method::POST, ["queues", name, "purge"]) => match b.purge(name).await {
                    Some(n) => Ok(json!({ "queue": name, "purged": n })),
                    None => Err(ApiError::not_found(format!("no queue '{name}'"))),
                },
                (&Method::GET, ["connections"]) => {
                    let (rows, total) = b.connection_views(call.limit()?);
                    Ok(json!({ "total": total, "connections": rows }))
                }
                (&Method::POST, ["connections", id, "close"]) => {
                    close_connection(id, "connection", |id| b.close_connection(id))
                }
                (&Method::GET, ["bridges"]) => {
                    use std::sync::atomic::Ordering::Relaxed;
                    Ok(json!(b
                        .bridges()
                        .iter()
                        .map(|(q, up, s)| json!({
                            "queue": q,
                            "upstream": up,
                            "up": s.up.load(Relaxed),
                            "forwarded": s.forwarded.load(Relaxed),
                            "rejected": s.rejected.load(Relaxed),
                            "connects": s.connects.load(Relaxed),
                        }))
                        .collect::<Vec<_>>()))
                }
                (&Method::POST, ["reload"]) => self.reload(),
                _ => Err(call.no_route()),
            }
        })
    }
}
