//! The broker under faults: producers and consumers on the real `qgate_amqp` broker over QUIC,
//! all on the simulated network in virtual time, with the same code as a deployment (the
//! broker's `serve_quic`, its redb store, `client::Connector` / `Client` with the CLI's 5 s idle
//! timeout).
//!
//! Topology: broker —(1 Gbit/s, 0.5 ms)— switch —(20 Mbit/s, 10 ms)— each producer and each
//! consumer on its own host and link. One queue, `telemetry`, durable (a redb store in a fresh
//! temporary directory, removed at the end).
//!
//! - Producers (4; 2 quick) each offer a message every 50 ms (20/s) for the workload (60 s;
//!   30 s quick), message-id `p{k}-{seq}`, unsettled, up to [`WINDOW`](clients::WINDOW) in flight. A producer
//!   keeps every message not yet accepted and sends it again on its next connection
//!   (at-least-once); after the workload it keeps trying for up to [`FLUSH`].
//! - Consumers (2; 1 quick) receive and accept, noting every message-id and how often.
//! - Every client reconnects after a failure (connect and attach bounded by [`OP_TIMEOUT`]),
//!   with a backoff from 200 ms doubling to 2 s.
//!
//! Faults, drawn from the seed:
//! - link cuts (6; 4 quick): a random client's link goes down, half of the time for 1–3 s
//!   (QUIC rides it out: the 5 s idle timeout has not passed), half of the time for 6–9 s (the
//!   connection dies of the idle timeout and the client reconnects). Cuts avoid the restart.
//! - a broker restart at 40 % of the workload: its endpoint is closed and the broker dropped
//!   (its store closes when the last task serving it ends), and 2 s later a new broker starts on
//!   the same store file and the same address. Consumers take nothing for the 3 s before it, so
//!   the broker stops holding a backlog, ready and delivered-unsettled, that the new broker must
//!   recover from the store.
//!
//! Recovery: after a cut, from the link coming back until that client's next success (an
//! accepted outcome for a producer, a message for a consumer); after the restart, from the new
//! broker's start until a 1 s window holds 80 % of the offered rate of accepted outcomes.

mod clients;
mod side;
mod tally;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use qgate_amqp::broker::BrokerConfig;
use qgate_amqp::client::{self, Connector};
use qgate_netsim::{LinkId, LinkParams, Network};
use qgate_transport::{endpoint, DevPki, Socket, TransportOptions};
use rand::{Rng, SeedableRng};
use tokio::sync::watch;
use tokio::time::{sleep, sleep_until, timeout, Instant};

use self::clients::{consume, produce, OP_TIMEOUT};
use self::side::BrokerSide;
use self::tally::{tally, Clock, Shared, Tally};
use super::{recovered_after, Outcome, Recovery};

/// Messages per second per producer.
const RATE: f64 = 20.0;
/// After the workload, producers retry what is not accepted for at most this long.
const FLUSH: Duration = Duration::from_secs(15);
/// Then consumers get at most this long to receive every accepted message.
const DRAIN: Duration = Duration::from_secs(20);
/// The broker is down this long when it restarts.
const RESTART_GAP: Duration = Duration::from_secs(2);
/// Consumers take nothing for this long before the restart, so that the broker holds a
/// backlog (ready and delivered-unsettled messages) when it stops.
const PAUSE: f64 = 3.0;
/// Link of every client to the switch.
const CLIENT_BPS: u64 = 20_000_000;
const CLIENT_DELAY: Duration = Duration::from_millis(10);

fn ip(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

/// A client's link goes down at `start` for `len` s.
#[derive(Debug, Clone)]
struct Cut {
    /// Client index: producers first, then consumers.
    victim: usize,
    start: f64,
    len: f64,
}

/// `n` cuts at random: each within [2, workload − 3] s, not overlapping `[lo, hi]` (the
/// restart) nor another cut of the same client.
fn plan_cuts(
    rng: &mut rand_chacha::ChaCha8Rng,
    n: usize,
    clients: usize,
    workload: f64,
    (lo, hi): (f64, f64),
) -> Vec<Cut> {
    let mut cuts: Vec<Cut> = Vec::new();
    let mut tries = 0;
    while cuts.len() < n && tries < 10_000 {
        tries += 1;
        let victim = rng.random_range(0..clients);
        let len = if rng.random_bool(0.5) {
            rng.random_range(1.0..3.0)
        } else {
            rng.random_range(6.0..9.0)
        };
        let start: f64 = rng.random_range(2.0..workload - 3.0);
        let start = (start * 10.0).round() / 10.0;
        let len = (len * 10.0_f64).round() / 10.0;
        let end = start + len;
        let overlaps = |a: f64, b: f64| start < b && a < end;
        if end > workload - 3.0
            || overlaps(lo, hi)
            || cuts
                .iter()
                .any(|c| c.victim == victim && overlaps(c.start - 1.0, c.start + c.len + 1.0))
        {
            continue;
        }
        cuts.push(Cut { victim, start, len });
    }
    cuts.sort_by(|a, b| a.start.total_cmp(&b.start));
    cuts
}

/// A fresh directory for this run's store.
fn store_dir(seed: u64) -> PathBuf {
    static RUN: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!(
        "qgate-faults-broker-{}-{seed}-{}",
        std::process::id(),
        RUN.fetch_add(1, Ordering::Relaxed)
    ))
}

/// The scenario (see the module's documentation).
pub async fn run(seed: u64, quick: bool) -> Outcome {
    let (producers, consumers, workload, n_cuts) = if quick {
        (2usize, 1usize, 30.0_f64, 4)
    } else {
        (4, 2, 60.0, 6)
    };
    let dir = store_dir(seed);
    let _ = std::fs::remove_dir_all(&dir);

    // The network: every host on its own link to a switch.
    let net = Network::new(seed);
    let switch = net.add_host("switch");
    net.set_forwarding(switch, true);
    let attach = |name: &str, n: u8, params: LinkParams| {
        let h = net.add_host(name);
        let i = net.add_interface(h, ip(10, 0, n, 1)).expect("address");
        let s = net.add_interface(switch, ip(10, 0, n, 2)).expect("address");
        (h, net.connect_symmetric(i, s, params).expect("link"))
    };
    let (bhost, _) = attach(
        "broker",
        0,
        LinkParams::new(1_000_000_000, Duration::from_micros(500)),
    );
    let baddr = SocketAddr::new(ip(10, 0, 0, 1), qgate_amqp::transport::AMQPS_PORT);
    let pki = DevPki::generate(&[]).expect("PKI");
    let trust = pki.trust();
    let mut side = BrokerSide {
        net: net.clone(),
        host: bhost,
        addr: baddr,
        cfg: BrokerConfig {
            store: Some(dir.join("broker.redb")),
            ..BrokerConfig::default()
        },
        pki,
        seed,
        starts: 0,
        running: None,
    };
    side.start().await.expect("the broker starts");

    // The clients: the CLI's transport settings (a dead broker noticed within 5 s).
    let copts =
        client::with_idle_timeout(&TransportOptions::default(), client::DEFAULT_IDLE_TIMEOUT);
    let clients = producers + consumers;
    let mut links: Vec<LinkId> = Vec::new();
    let mut connectors: Vec<Connector> = Vec::new();
    for i in 0..clients {
        let name = if i < producers {
            format!("producer{i}")
        } else {
            format!("consumer{}", i - producers)
        };
        let n = 1 + i as u8;
        let (h, link) = attach(&name, n, LinkParams::new(CLIENT_BPS, CLIENT_DELAY));
        let sock = net
            .bind(h, SocketAddr::new(ip(10, 0, n, 1), 0))
            .expect("port");
        let ep = endpoint(
            Socket::from(sock),
            None,
            Some(seed.wrapping_mul(31).wrapping_add(n as u64)),
        )
        .expect("endpoint");
        connectors.push(
            Connector::on_endpoint(ep, baddr, "localhost", &trust, None, &copts)
                .expect("connector"),
        );
        links.push(link);
    }

    // The faults.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x0b10_ce12);
    let restart_at = (workload * 0.4).round();
    let gap = RESTART_GAP.as_secs_f64();
    let cuts = plan_cuts(
        &mut rng,
        n_cuts,
        clients,
        workload,
        (restart_at - PAUSE - 1.0, restart_at + gap + 5.0),
    );

    let t: Shared = Arc::new(Mutex::new(Tally {
        ok: vec![Vec::new(); clients],
        ..Default::default()
    }));
    let clock = Clock(Instant::now());
    let total = (workload * RATE) as u64;
    let give_up = clock.at(workload) + FLUSH;
    let (done_tx, done_rx) = watch::channel(false);
    let mut producing = Vec::new();
    let mut consuming = Vec::new();
    for (i, c) in connectors.into_iter().enumerate() {
        let t = t.clone();
        if i < producers {
            producing.push(tokio::spawn(produce(i, c, clock, total, give_up, t)));
        } else {
            consuming.push(tokio::spawn(consume(
                i,
                c,
                clock,
                (restart_at - PAUSE, restart_at),
                done_rx.clone(),
                t,
            )));
        }
    }

    // Cuts and the restart, in time order.
    let fault_net = net.clone();
    let fault_cuts = cuts.clone();
    let faults = tokio::spawn(async move {
        let mut events: Vec<(f64, usize, bool)> = Vec::new();
        for c in &fault_cuts {
            events.push((c.start, c.victim, false));
            events.push((c.start + c.len, c.victim, true));
        }
        events.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut restart: Option<(f64, Option<f64>, String)> = None;
        let mut recovered = 0usize;
        let mut ev = events.into_iter().peekable();
        loop {
            let next_cut = ev.peek().map(|e| e.0);
            let restart_due = restart.is_none().then_some(restart_at);
            match (next_cut, restart_due) {
                (Some(a), r) if r.is_none_or(|r| a < r) => {
                    let (at, victim, up) = ev.next().expect("peeked");
                    sleep_until(clock.at(at)).await;
                    let _ = fault_net.update_both(links[victim], |l| l.up = up);
                }
                (_, Some(r)) => {
                    sleep_until(clock.at(r)).await;
                    let stopped = clock.s();
                    side.stop();
                    sleep(RESTART_GAP).await;
                    let (back, err) = match side.start().await {
                        Ok(()) => (Some(clock.s()), String::new()),
                        Err(e) => (None, e),
                    };
                    recovered = side.broker().map_or(0, |b| {
                        b.queue_stats().iter().map(|q| q.depth).sum::<usize>()
                    });
                    restart = Some((stopped, back, err));
                }
                _ => break,
            }
        }
        (side, restart.expect("the restart ran"), recovered)
    });

    for p in producing {
        let _ = p.await;
    }
    let producers_done = Instant::now();
    // Drain: until every accepted message has been received, or DRAIN has passed.
    loop {
        let all_in = {
            let g = tally(&t);
            g.accepted.keys().all(|id| g.deliveries.contains_key(id))
        };
        if all_in || Instant::now() >= producers_done + DRAIN {
            break;
        }
        sleep(Duration::from_millis(100)).await;
    }
    let _ = done_tx.send(true);
    for c in consuming {
        let _ = timeout(OP_TIMEOUT * 3, c).await;
    }
    let (mut side, (stopped, back, restart_error), recovered) =
        faults.await.expect("the fault task");
    let depth = side
        .broker()
        .map(|b| b.queue_stats().iter().map(|q| q.depth).sum::<usize>())
        .unwrap_or(0);
    side.stop();
    let _ = std::fs::remove_dir_all(&dir);

    let g = tally(&t);
    let accepted = g.accepted.len() as u64;
    let delivered = g
        .accepted
        .keys()
        .filter(|id| g.deliveries.contains_key(*id))
        .count() as u64;
    let duplicated: u64 = g
        .deliveries
        .values()
        .map(|n| (*n as u64).saturating_sub(1))
        .sum();
    let unacknowledged = g
        .deliveries
        .keys()
        .filter(|id| !g.accepted.contains_key(*id))
        .count();
    let mut recoveries: Vec<Recovery> = cuts
        .iter()
        .map(|c| {
            let end = c.start + c.len;
            let who = if c.victim < producers {
                format!("producer {}", c.victim)
            } else {
                format!("consumer {}", c.victim - producers)
            };
            Recovery {
                kind: "a client's link down, then its next success",
                fault: format!("{who} link down {:.1} s", c.len),
                start_s: c.start,
                end_s: end,
                recovery_s: g.ok[c.victim].iter().find(|x| **x >= end).map(|x| x - end),
            }
        })
        .collect();
    let mut times = g.accept_times.clone();
    times.sort_by(f64::total_cmp);
    let need = (0.8 * RATE * producers as f64).ceil() as usize;
    recoveries.push(Recovery {
        kind: "broker restart (2 s down, same store)",
        fault: if restart_error.is_empty() {
            "broker restart".into()
        } else {
            format!("broker restart (failed: {restart_error})")
        },
        start_s: stopped,
        end_s: back.unwrap_or(stopped),
        recovery_s: back.and_then(|b| recovered_after(&times, b, 1.0, need)),
    });
    recoveries.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    let counters = vec![
        ("offered".to_string(), g.offered as f64),
        (
            "producer reconnects".into(),
            g.producer_connects.saturating_sub(producers as u64) as f64,
        ),
        (
            "consumer reconnects".into(),
            g.consumer_connects.saturating_sub(consumers as u64) as f64,
        ),
        (
            "failed connection attempts".into(),
            g.connect_failures as f64,
        ),
        ("connections in 0-RTT".into(), g.zero_rtt as f64),
        (
            "attempts failed: 0-RTT rejected".into(),
            g.zero_rtt_rejected as f64,
        ),
        ("resent".into(), g.resent as f64),
        ("outcomes not accepted".into(), g.not_accepted as f64),
        (
            "producer connections found closed".into(),
            g.connections_lost as f64,
        ),
        ("producer stalls".into(), g.stalls as f64),
        ("redeliveries".into(), g.redeliveries as f64),
        (
            "delivered, never acknowledged".into(),
            unacknowledged as f64,
        ),
        (
            "messages the restarted broker recovered".into(),
            recovered as f64,
        ),
        ("queue depth at end".into(), depth as f64),
    ];
    Outcome {
        scenario: "broker",
        seed,
        accepted,
        delivered,
        lost: accepted - delivered,
        duplicated,
        pending: g.pending,
        recoveries,
        counters,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_run_loses_nothing_and_recovers_from_the_restart() {
        let o = crate::virtual_time(run(1, true));
        assert!(o.accepted > 0, "{o:?}");
        assert_eq!(o.lost, 0, "{o:?}");
        assert_eq!(o.delivered, o.accepted, "{o:?}");
        let restart = o
            .recoveries
            .iter()
            .find(|r| r.fault.starts_with("broker restart"))
            .expect("a restart");
        assert!(restart.recovery_s.is_some(), "{o:?}");
    }
}
