//! The lab's scenarios run and measure what they claim to.

use std::collections::BTreeMap;

use qgate_lab::bench::transport::{sim_speed, SimSpeedConfig};
use qgate_lab::demo::transport::{self as demo, DemoConfig};
use qgate_netsim::LossModel;

#[test]
fn sim_speed_measures_a_saturated_flow() {
    let cfg = SimSpeedConfig {
        virtual_secs: 5.0,
        repeats: 2,
        ..Default::default()
    };
    let mut calls = 0;
    let r = sim_speed(cfg, |_| calls += 1);
    assert_eq!(calls, 2);
    assert_eq!(r.speedup.n, 2);
    // One bulk flow fills most of a 10 Mbit/s link (slow start included in 5 s).
    assert!(
        r.goodput_mbps.mean > 8.0 && r.goodput_mbps.mean <= 10.0,
        "{:?}",
        r.goodput_mbps
    );
}

#[test]
fn demo_answers_every_request_and_delay_tracks_the_path() {
    let cfg = DemoConfig {
        clients: 4,
        requests: 30,
        ..Default::default()
    };
    let r = qgate_lab::virtual_time(demo::run(cfg.clone())).unwrap();
    assert_eq!((r.ok, r.failed), (120, 0));
    assert_eq!(r.server.ingested, 120);
    // RTT = 2 × (5 + 20) ms; a request and its response take about one RTT.
    assert!(
        r.delay_ms.mean >= 50.0 && r.delay_ms.mean < 60.0,
        "{:?}",
        r.delay_ms
    );

    // With 5 % loss on the backbone every request is still answered, later on average.
    let mut lossy = cfg;
    lossy.backbone.loss = LossModel::Bernoulli { p: 0.05 };
    let l = qgate_lab::virtual_time(demo::run(lossy)).unwrap();
    assert_eq!((l.ok, l.failed), (120, 0));
    assert!(l.backbone_up.dropped_loss > 0);
    assert!(l.delay_ms.mean > r.delay_ms.mean);
}

#[test]
fn demo_rejects_bad_config_by_name() {
    let cfg = DemoConfig {
        requests: 0,
        ..Default::default()
    };
    let e = qgate_lab::virtual_time(demo::run(cfg)).unwrap_err();
    assert!(e.contains("demo.requests = 0"), "{e}");
}

#[test]
fn aqm_run_is_sane_and_deterministic() {
    use qgate_lab::plan::{run::run_variant, Options};
    let plan = qgate_lab::papers::paper004::plan().unwrap();
    let v = plan
        .variants(&Options {
            seeds: Some(1),
            schemes: vec!["pid-delay".into()],
            points: Some(vec![0]),
            set: vec![
                ("workloads.flows.sources".into(), 3.into()),
                ("plan.duration_s".into(), 8.into()),
                ("workloads.flows.warmup_s".into(), 2.into()),
            ],
            ..Default::default()
        })
        .unwrap();
    assert_eq!(v.len(), 1);
    let t = std::time::Instant::now();
    let rec = run_variant(&v[0]).unwrap();
    let a = qgate_lab::papers::paper004::run_result(&v[0], &rec);
    eprintln!("aqm run: {:?} wall; {a:?}", t.elapsed());
    assert!(a.spec.starts_with("pid-delay"), "{}", a.spec);
    assert!(
        a.total_goodput_mbps > 3.0 && a.total_goodput_mbps < 10.0,
        "{}",
        a.total_goodput_mbps
    );
    assert_eq!(a.flow_goodput_mbps.len(), 3);
    assert_eq!(a.flow_rtt_ms.len(), 3);
    // What crossed the bottleneck (with headers) is at least the goodput, at most capacity.
    assert!(
        a.utilisation * 10.0 >= a.total_goodput_mbps && a.utilisation <= 1.0,
        "{}",
        a.utilisation
    );
    assert!(a.random_losses > 0);
    assert_eq!(rec.series["flows.goodput_mbps"].len(), 8);
    let b = run_variant(&v[0]).unwrap();
    assert_eq!(
        rec.scalars, b.scalars,
        "the same variant gives the same numbers"
    );
}

#[test]
fn history_series_learns_and_starts_higher() {
    use qgate_lab::plan::{run::run_variant, Options};
    let plans = qgate_lab::papers::paper002::plans().unwrap();
    let variants = plans[0]
        .0
        .variants(&Options {
            seeds: Some(1),
            schemes: vec!["default".into(), "history-ewma".into()],
            points: Some(vec![0]),
            set: vec![("workloads.dl.runs".into(), 4.into())],
            ..Default::default()
        })
        .unwrap()
        .into_iter()
        .filter(|v| v.point.as_ref().is_some_and(|p| p.sweep == "1MB"))
        .collect::<Vec<_>>();
    assert_eq!(variants.len(), 2);
    let t = std::time::Instant::now();
    let d = run_variant(&variants[0]).unwrap();
    let h = run_variant(&variants[1]).unwrap();
    eprintln!(
        "history series: {:?} wall\n{:?}\n{:?}",
        t.elapsed(),
        d.scalars,
        h.scalars
    );
    assert_eq!(
        (d.scalars["dl.completed"], h.scalars["dl.completed"]),
        (4.0, 4.0)
    );
    assert_eq!(d.scalars["dl.from_history"], 0.0);
    assert_eq!(
        h.scalars["dl.from_history"], 0.75,
        "every run but the first"
    );
    let iw = |r: &qgate_lab::plan::run::Record| r.samples["dl.initial_window_kb"].clone();
    let default_iw = iw(&d)[0].1;
    assert!(iw(&d).iter().all(|s| s.1 == default_iw));
    assert!(
        iw(&h).iter().all(|s| s.1 > default_iw),
        "history starts higher: {:?} vs {default_iw}",
        iw(&h)
    );
    assert!(h.samples["dl.latency_s"]
        .iter()
        .chain(&d.samples["dl.latency_s"])
        .all(|s| s.1 > 0.038));
}

#[test]
fn proxy_point_runs_for_every_scheme() {
    use qgate_lab::plan::{run::run_variant, Options};
    let plan = qgate_lab::papers::paper000::plan().unwrap();
    let variants: Vec<_> = plan
        .variants(&Options {
            quick: true,
            ..Default::default()
        })
        .unwrap()
        .into_iter()
        .filter(|v| {
            v.point
                .as_ref()
                .is_some_and(|p| p.sweep == "delay-hetero" && p.x == 30.0)
        })
        .collect();
    assert_eq!(variants.len(), 5);
    let t = std::time::Instant::now();
    let mut means = Vec::new();
    for v in &variants {
        let r = run_variant(v).unwrap();
        assert_eq!(r.scalars["gw.failed"], 0.0, "{}", v.scheme);
        assert_eq!(
            r.samples["gw.response_ms"].len(),
            10 * 32,
            "{}: every request answered",
            v.scheme
        );
        means.push((v.scheme.clone(), r.scalars["gw.response_ms_mean"]));
    }
    eprintln!("proxy: {means:?} in {:?}", t.elapsed());
    // Paths at 30/60/90 ms: the single path is the fastest one here; round-robin uses all three.
    let get = |s: &str| means.iter().find(|m| m.0 == s).unwrap().1;
    let (rr, ad) = (get("round-robin"), get("adaptive"));
    assert!(ad < rr, "adaptive {ad} ms vs round-robin {rr} ms");
    // Per request, completion keeps nearly everything on the fastest path and does not pay
    // adaptive's cost of parking best-effort devices on the slow ones.
    let co = get("completion");
    assert!(co < ad, "completion {co} ms vs adaptive {ad} ms");
}

#[test]
fn proxy_devices_sending_both_classes_split_each_device_in_two() {
    use qgate_lab::plan::{run::run_variant, Options};
    let plan = qgate_lab::papers::paper000::plan().unwrap();
    let variants: Vec<_> = plan
        .variants(&Options {
            quick: true,
            set: vec![(
                "workloads.gw.classes".into(),
                toml::Value::String("both".into()),
            )],
            schemes: vec!["adaptive-packets".into()],
            ..Default::default()
        })
        .unwrap()
        .into_iter()
        .filter(|v| {
            v.point
                .as_ref()
                .is_some_and(|p| p.sweep == "delay-hetero" && p.x == 10.0)
        })
        .collect();
    assert_eq!(variants.len(), 1);
    let r = run_variant(&variants[0]).unwrap();
    assert_eq!(r.scalars["gw.failed"], 0.0);
    // Ten devices, 32 requests each, alternating classes: 160 of each.
    assert_eq!(r.samples["gw.priority_ms"].len(), 160);
    assert_eq!(r.samples["gw.best_effort_ms"].len(), 160);
    // Priority requests take the lowest RTT (path 1); best-effort sessions are spread by the
    // packets each path has carried, so paths 2 and 3 carry some.
    assert_eq!(r.scalars["gw.path1_priority_share"], 1.0);
    assert!(
        r.scalars["gw.path2_share"] + r.scalars["gw.path3_share"] > 0.1,
        "{:?}",
        r.scalars
    );
}

/// The scalars of one run (seed 1) of `scheme` at point `x` of `sweep` in the shipped plan
/// `lab/plans/PLAN`, with the plan's keys in `set` overridden.
fn shipped_point(
    plan: &str,
    scheme: &str,
    sweep: &str,
    x: f64,
    set: &[(&str, toml::Value)],
) -> BTreeMap<String, f64> {
    shipped_point_seed(plan, scheme, sweep, x, 1, set)
}

/// [`shipped_point`] with the plan's seed `seed` (1, 2, ...).
fn shipped_point_seed(
    plan: &str,
    scheme: &str,
    sweep: &str,
    x: f64,
    seed: u64,
    set: &[(&str, toml::Value)],
) -> BTreeMap<String, f64> {
    use qgate_lab::plan::{run::run_variant, Loaded, Options};
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../lab/plans")
        .join(plan);
    let variants = Loaded::read(&path)
        .unwrap()
        .variants(&Options {
            seeds: Some(seed),
            schemes: vec![scheme.into()],
            set: set
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            ..Default::default()
        })
        .unwrap();
    // The point's runs, one per seed in order: the last is seed `seed`'s.
    let v = variants
        .iter()
        .filter(|v| {
            v.point
                .as_ref()
                .is_some_and(|p| p.sweep == sweep && p.x == x)
        })
        .nth(seed as usize - 1)
        .unwrap_or_else(|| panic!("{plan}: no point {sweep} {x} seed {seed}"));
    run_variant(v).unwrap().scalars
}

#[test]
fn auto_congestion_leaves_cubic_under_random_loss_and_keeps_it_without() {
    let mean = |sweep: &str, x: f64, scheme: &str| {
        let r = shipped_point("proxy-backhaul-cc.toml", scheme, sweep, x, &[]);
        assert_eq!(r["gw.failed"], 0.0, "{scheme} at {sweep} {x}");
        r["gw.response_ms_mean"]
    };
    // 5 % random loss: CUBIC halves its window at every loss; auto hands over to BBR.
    let (cubic, auto) = (
        mean("loss", 5.0, "single-cubic"),
        mean("loss", 5.0, "single-auto"),
    );
    assert!(auto * 3.0 < cubic, "auto {auto} ms vs cubic {cubic} ms");
    // Losses behind a full drop-tail queue: auto never switches, so the run is CUBIC's.
    let (cubic, auto) = (
        mean("congested", 5.0, "single-cubic"),
        mean("congested", 5.0, "single-auto"),
    );
    assert_eq!(auto, cubic);
}

#[test]
fn several_backhaul_connections_lift_cubic_under_random_loss() {
    use qgate_lab::plan::{Loaded, Options};
    let mean = |scheme: &str| {
        let r = shipped_point("proxy-backhaul-conns.toml", scheme, "loss", 5.0, &[]);
        assert_eq!(r["gw.failed"], 0.0, "{scheme}");
        assert_eq!(r["gw.unfinished"], 0.0, "{scheme}");
        r["gw.response_ms_mean"]
    };
    // 5 % random loss on path 1: one CUBIC window collapses; four share the requests, so the
    // path's window is four collapsed ones (decision G21).
    let (one, four) = (mean("single-cubic-1"), mean("single-cubic-4"));
    assert!(four * 2.0 < one, "4 connections {four} ms vs 1: {one} ms");
    // A path may not have none.
    let cc = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../lab/plans/proxy-backhaul-cc.toml");
    let e = Loaded::read(&cc)
        .unwrap()
        .variants(&Options {
            set: vec![(
                "workloads.gw.connections_per_path".into(),
                toml::Value::Integer(0),
            )],
            ..Default::default()
        })
        .map(|_| ())
        .unwrap_err();
    assert!(e.to_string().contains("connections_per_path"), "{e}");
}

#[test]
fn an_upload_run_repeats_exactly_for_its_seed() {
    // The receiver writes chunks to disk; on tokio's blocking pool that finished at no fixed
    // point among one virtual instant's events and runs drifted in the last digits (U12).
    let run = || {
        shipped_point(
            "paper001-upload.toml",
            "two-ended",
            "receive-window",
            100.0,
            &[("workloads.up.bytes", toml::Value::Integer(2_000_000))],
        )
    };
    let first = run();
    assert_eq!(first["up.completed"], 1.0, "{first:?}");
    // Without the fix 4 of 5 runs of this test failed with 4 repeats; 9 make a miss rarer.
    for _ in 0..9 {
        assert_eq!(run(), first);
    }
}

#[test]
fn a_cancelled_chunk_request_repeats_exactly_for_its_seed() {
    // Lane 2's copy of a chunk lane 1 takes over is cancelled while it sends; with an unbiased
    // select! between the cancel and the exchange, how much of the body went out first was
    // tokio's unseeded draw, and this point's completion was 3.692 or 3.733 s (3 of 12 runs
    // apart; decision U12 (e)).
    let run = || {
        shipped_point_seed(
            "paper001-requirement.toml",
            "two-ended",
            "receive-100ms",
            160_000.0,
            4,
            &[],
        )
    };
    let first = run();
    assert_eq!(first["up.completed"], 1.0, "{first:?}");
    // One run in four differed: eight repeats miss a regression about one time in ten.
    for _ in 0..8 {
        assert_eq!(run(), first);
    }
}

#[test]
fn the_constrained_profile_asks_for_fewer_acks_on_a_slow_radio() {
    // Ten one-message connections at 8 kbit/s with the constrained profile (decision T9):
    // its ack-eliciting threshold against RFC 9000's ACK of every second packet.
    let run = |set: &[(&str, toml::Value)]| {
        let r = shipped_point(
            "paper003-sweep.toml",
            "quic-constrained",
            "bandwidth",
            8.0,
            set,
        );
        assert_eq!(
            (r["amqp.send_messages"], r["amqp.send_failed"]),
            (10.0, 0.0)
        );
        (r["amqp.send_wire_bytes"], r["amqp.send_total_s"])
    };
    let (bytes, secs) = run(&[]);
    let every_second = [(
        "workloads.amqp.ack_eliciting_threshold",
        toml::Value::Integer(1),
    )];
    let (rfc_bytes, rfc_secs) = run(&every_second);
    // Measured 55 k against 58 k bytes and 43 against 45 s: ACK-only datagrams of ~50 bytes
    // take 50 ms each at this rate.
    assert!(bytes < 0.97 * rfc_bytes, "{bytes} vs {rfc_bytes} bytes");
    assert!(secs < rfc_secs, "{secs} vs {rfc_secs} s");
}

#[test]
fn amqp_quick_plans_deliver_everything_and_netsim_is_deterministic() {
    use qgate_lab::papers::paper003::{
        loopback, netsim_points, workload, Case, Point, Rep, Transport, PLANS,
    };
    use qgate_lab::plan::run::{run_all, run_variant};
    use qgate_lab::plan::Options;
    let opts = Options {
        quick: true,
        ..Default::default()
    };
    let mut points: Vec<(Point, Vec<Rep>)> = Vec::new();
    let mut sweep = None;
    let mut multi = None;
    for s in &PLANS {
        let loaded = s.load().unwrap();
        let variants = loaded.variants(&opts).unwrap();
        let records = run_all(&variants, 2, |_, _, _| {}).unwrap();
        points.extend(netsim_points(s.case, &variants, &records).unwrap());
        match s.case {
            Case::Sweep => sweep = Some((variants, records)),
            Case::Multi => multi = Some(loaded.overridden(&opts).unwrap()),
            _ => {}
        }
    }
    for (p, reps) in &points {
        assert_eq!(reps.len(), p.reps, "{}", p.label());
        for r in reps {
            assert_eq!(r.send.failed, 0, "{}", p.label());
            assert_eq!(r.send.messages, p.messages, "{}", p.label());
            if p.case == Case::Multi {
                let recv = r.recv.as_ref().expect("the multi case receives");
                assert_eq!(recv.messages, p.messages, "{}: all received", p.label());
            }
            // Per-connection cases resume with 0-RTT after the first connection; quic-mux
            // opens one QUIC connection (no ticket yet) and carries every later AMQP
            // connection on it.
            if p.transport == Transport::QuicMux {
                assert_eq!(r.send.zero_rtt, 0, "{}", p.label());
            } else if p.case != Case::Single && p.transport.name().starts_with("quic") {
                assert_eq!(r.send.zero_rtt, p.messages - 1, "{}", p.label());
            }
        }
    }
    let find = |case: Case, sweep: &str, t: Transport, x: &dyn Fn(&Point) -> bool| {
        points
            .iter()
            .find(|(p, _)| p.case == case && p.sweep == sweep && p.transport == t && x(p))
            .map(|(_, r)| r[0].send.clone())
            .expect("point in the plan")
    };
    // The channel matters in the direction it must: slower, longer and lossier cost time.
    let q = Transport::Quic;
    let slow = find(Case::Sweep, "bandwidth", q, &|p| {
        p.channel.rate_bps == 8_000
    });
    let fast = find(Case::Sweep, "bandwidth", q, &|p| {
        p.channel.rate_bps == 512_000
    });
    assert!(slow.total_s > 5.0 * fast.total_s, "{slow:?} vs {fast:?}");
    let near = find(Case::Sweep, "delay", q, &|p| {
        p.channel.delay.as_millis() == 2
    });
    let far = find(Case::Sweep, "delay", q, &|p| {
        p.channel.delay.as_millis() == 602
    });
    assert!(far.total_s > 10.0 * near.total_s, "{far:?} vs {near:?}");
    let lossy = find(Case::Sweep, "loss", q, &|p| p.channel.loss > 0.1);
    let clean = find(Case::Sweep, "loss", q, &|p| p.channel.loss == 0.0);
    assert!(lossy.total_s > clean.total_s, "{lossy:?} vs {clean:?}");
    let energy = |t| find(Case::Energy, "default", t, &|_| true);
    let e = energy(q);
    assert!(e.energy_j > 0.0 && e.wire_bytes > 10.0 * 138.0, "{e:?}");
    // The same channel for both transports: 0-RTT QUIC starts sooner than TCP+TLS, which
    // puts fewer bytes on the wire.
    let t = energy(Transport::TcpTls13);
    assert!(
        e.startup_ms < t.startup_ms && e.total_s < t.total_s,
        "{e:?} {t:?}"
    );
    assert!(e.wire_bytes > t.wire_bytes, "{e:?} {t:?}");
    // Path-MTU probes are bytes a one-message connection never profits from.
    let off = energy(Transport::QuicPmtudOff);
    assert!(off.wire_bytes < e.wire_bytes && off.failed == 0, "{off:?}");
    // Same variant, same numbers.
    let (variants, records) = sweep.expect("the sweep plan ran");
    let i = variants
        .iter()
        .position(|v| {
            v.scheme == "quic"
                && v.point
                    .as_ref()
                    .is_some_and(|a| a.sweep == "loss" && a.x > 10.0)
        })
        .expect("the lossy quic run");
    let again = run_variant(&variants[i]).unwrap();
    assert_eq!(again.scalars, records[i].scalars);
    // The same workload on real loopback sockets with the kernel's TCP.
    let multi = multi.expect("the multi plan ran");
    let (p, reps) = loopback(
        Case::Multi,
        workload(&multi).unwrap(),
        Transport::TcpTls13,
        1,
    );
    let r = &reps[0];
    assert_eq!((r.send.messages, r.send.failed), (p.messages, 0), "{r:?}");
    assert_eq!(
        r.recv.as_ref().map(|s| s.messages),
        Some(p.messages),
        "{r:?}"
    );
    assert!(r.send.wire_bytes.is_nan(), "no link to count on loopback");
}

#[test]
fn amqp_plan_reaches_a_multi_homed_broker_and_counts_what_a_failed_connection_settled() {
    use qgate_lab::plan::run::run_all;
    use qgate_lab::plan::{Loaded, Options};
    // The broker has a link to each client: each must use the broker's address facing it.
    let plan = r#"
[plan]
name = "t"
duration_s = 600
seeds = 1
[topology]
hosts = [{ name = "broker" }, { name = "dev" }, { name = "rx" }]
[[topology.links]]
name = "radio"
a = "dev"
b = "broker"
rate_mbps = 1
delay_ms = 20
[[topology.links]]
name = "rxl"
a = "rx"
b = "broker"
rate_mbps = 1
delay_ms = 20
[[workloads]]
kind = "amqp"
name = "m"
broker = "broker"
sender = "dev"
receiver = "rx"
messages = 4
[[schemes]]
name = "quic"
[[schemes]]
name = "tcp"
set = { "workloads.m.transport" = "tcp-tls13" }
"#;
    let l = Loaded::parse(plan, std::path::Path::new("t.toml")).unwrap();
    let v = l.variants(&Options::default()).unwrap();
    let r = run_all(&v, 2, |_, _, _| {}).unwrap();
    for rec in &r {
        let get = |k: &str| rec.scalars[&format!("m.{k}")];
        assert_eq!(
            get("send_messages"),
            4.0,
            "{}: {:?}",
            rec.scheme,
            rec.scalars
        );
        assert_eq!(
            get("recv_messages"),
            4.0,
            "{}: {:?}",
            rec.scheme,
            rec.scalars
        );
        assert_eq!(get("recv_missing") + get("send_missing"), 0.0);
    }
    // One connection for 50 messages; the radio goes down after some were settled and stays
    // down: the settled ones count, the rest are missing, the connection failed.
    let down = format!(
        "{}\n[[timeline]]\nat_s = 0.5\nlink = \"radio\"\nset = {{ up = false }}\n",
        plan.replace(
            "messages = 4",
            "messages = 50\nconnections = \"one\"\ntimeout_s = 60"
        )
        .replace("receiver = \"rx\"\n", "")
    );
    let l = Loaded::parse(&down, std::path::Path::new("t.toml")).unwrap();
    let v = l.variants(&Options::default()).unwrap();
    for rec in run_all(&v, 2, |_, _, _| {}).unwrap() {
        let get = |k: &str| rec.scalars[&format!("m.{k}")];
        let (sent, missing) = (get("send_messages"), get("send_missing"));
        assert!(
            sent > 0.0 && missing > 0.0,
            "{}: {:?}",
            rec.scheme,
            rec.scalars
        );
        assert_eq!(sent + missing, 50.0);
        assert_eq!(get("send_failed"), 1.0);
    }
    // One connection that would need ~40 s (1000 messages, one 40 ms round trip each) in a
    // 5 s run: it is cut at the deadline, not 30 s after it (which would fail the run).
    let short = plan
        .replace("duration_s = 600", "duration_s = 5")
        .replace("messages = 4", "messages = 1000\nconnections = \"one\"")
        .replace("receiver = \"rx\"\n", "");
    let l = Loaded::parse(&short, std::path::Path::new("t.toml")).unwrap();
    let v = l.variants(&Options::default()).unwrap();
    for rec in run_all(&v, 2, |_, _, _| {}).unwrap() {
        let get = |k: &str| rec.scalars[&format!("m.{k}")];
        assert!(
            get("send_total_s") <= 5.0,
            "{}: {:?}",
            rec.scheme,
            rec.scalars
        );
        assert!(get("send_messages") > 10.0 && get("send_missing") > 0.0);
        assert_eq!(get("send_messages") + get("send_missing"), 1000.0);
    }
}

#[test]
fn user_space_tcp_carries_bytes_in_order_over_a_lossy_simulated_link() {
    use qgate_netsim::tcp::TcpHost;
    use qgate_netsim::{LinkParams, LossModel, Network};
    use std::net::{Ipv4Addr, SocketAddr};
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let got = qgate_lab::virtual_time(async {
        let net = Network::new(11);
        let (a, b) = (net.add_host("a"), net.add_host("b"));
        let ia = net.add_interface(a, "10.0.0.1".parse().unwrap()).unwrap();
        let ib = net.add_interface(b, "10.0.0.2".parse().unwrap()).unwrap();
        let p = LinkParams::new(2_000_000, Duration::from_millis(20))
            .with_loss(LossModel::Bernoulli { p: 0.05 });
        net.connect_symmetric(ia, ib, p).unwrap();
        let ha = TcpHost::new(&net, a, Ipv4Addr::new(10, 0, 0, 1)).unwrap();
        let hb = TcpHost::new(&net, b, Ipv4Addr::new(10, 0, 0, 2)).unwrap();
        let l = hb.listen(7000).unwrap();
        // The server echoes everything back, then closes.
        tokio::spawn(async move {
            let mut s = l.accept().await;
            let mut buf = vec![0u8; 4096];
            loop {
                let n = s.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                s.write_all(&buf[..n]).await.unwrap();
            }
            s.shutdown().await.unwrap();
        });
        let c = ha
            .connect(SocketAddr::new("10.0.0.2".parse().unwrap(), 7000))
            .await
            .unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let (mut r, mut w) = tokio::io::split(c);
        let send = data.clone();
        let writer = tokio::spawn(async move {
            w.write_all(&send).await.unwrap();
            w.shutdown().await.unwrap();
        });
        let mut back = Vec::new();
        tokio::time::timeout(Duration::from_secs(600), r.read_to_end(&mut back))
            .await
            .expect("done within 10 simulated minutes")
            .unwrap();
        writer.await.unwrap();
        (data, back, net.elapsed())
    });
    let (sent, back, took) = got;
    assert_eq!(back.len(), sent.len());
    assert!(back == sent, "every byte back, in order, despite 5 % loss");
    // 400 kB over 2 Mbit/s needs at least 1.6 s; loss makes it longer, not shorter.
    assert!(took > Duration::from_millis(1600), "{took:?}");
}

#[test]
fn the_fe2o3_client_closes_in_virtual_time() {
    // fe2o3-amqp's engines busy-loop while waiting for the peer's end/close; with the client's
    // read side ended after its close, a paused clock still advances and the run finishes.
    use qgate_amqp::broker::Broker;
    use qgate_amqp::client::{self, Connector, RecvSpec, SendSpec};
    use qgate_amqp::transport::ALPN_AMQP;
    use qgate_netsim::{LinkParams, Network};
    use qgate_transport::{endpoint, server_config, DevPki, Socket, TransportOptions};
    use std::time::Duration;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = qgate_lab::virtual_time(async {
            let net = Network::new(5);
            let (a, b) = (net.add_host("client"), net.add_host("broker"));
            let ia = net.add_interface(a, "10.0.0.1".parse().unwrap()).unwrap();
            let ib = net.add_interface(b, "10.0.0.2".parse().unwrap()).unwrap();
            net.connect_symmetric(
                ia,
                ib,
                LinkParams::new(10_000_000, Duration::from_millis(50)),
            )
            .unwrap();
            let pki = DevPki::generate(&[]).unwrap();
            let opts = TransportOptions::default();
            let baddr = "10.0.0.2:5671".parse().unwrap();
            let scfg = server_config(&pki.server, &[ALPN_AMQP], &opts).unwrap();
            let ep = endpoint(
                Socket::from(net.bind(b, baddr).unwrap()),
                Some(scfg),
                Some(1),
            )
            .unwrap();
            let _broker = Broker::builder().quic(ep).start().unwrap();
            let cep = endpoint(
                Socket::from(net.bind(a, "10.0.0.1:0".parse().unwrap()).unwrap()),
                None,
                Some(2),
            )
            .unwrap();
            let c =
                Connector::on_endpoint(cep, baddr, "localhost", &pki.trust(), None, &opts).unwrap();
            let sent = client::send(
                &c,
                &SendSpec {
                    address: "q".into(),
                    settled: false,
                    window: 10,
                    rate: None,
                    link_name: "s".into(),
                },
                (0..20u8).map(|i| vec![i; 50]),
            )
            .await
            .unwrap();
            let got = client::receive(
                &c,
                &RecvSpec {
                    address: "q".into(),
                    settled: false,
                    count: Some(20),
                    idle: Duration::from_secs(30),
                    credit: 10,
                    link_name: "r".into(),
                },
                |_| {},
            )
            .await
            .unwrap();
            (sent.messages, got.messages, net.elapsed())
        });
        let _ = tx.send(r);
    });
    let (sent, got, took) = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("finished within a minute of wall time (no frozen clock)");
    assert_eq!((sent, got), (20, 20));
    // Two connections at 100 ms RTT: a few RTTs each, virtual time.
    assert!(
        took > Duration::from_millis(400) && took < Duration::from_secs(30),
        "{took:?}"
    );
}
