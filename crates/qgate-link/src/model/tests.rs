//! The link model driven in memory by a virtual clock.

use super::*;
use crate::LossModel;
use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

const MS: Duration = Duration::from_millis(1);

/// Drive `link` until it is idle, delivering at each exact timeout; returns (arrival, id).
fn drain(link: &mut LinkModel<u32>, rng: &mut ChaCha8Rng) -> Vec<(Instant, u32)> {
    let mut out = Vec::new();
    while let Some(t) = link.poll_timeout() {
        link.handle_timeout(t, rng);
        while let Some((at, p)) = link.poll_deliver(t) {
            assert_eq!(at, t.min(at), "delivered before its time");
            out.push((at, p.payload));
        }
    }
    out
}

fn packet(id: u32, size: usize) -> Packet<u32> {
    Packet::new(size, 1, id)
}

#[test]
fn one_packet_takes_serialisation_plus_delay() {
    let t0 = Instant::now();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut link = LinkModel::new(LinkParams::new(10_000_000, 25 * MS), 1).unwrap();
    link.send(t0, packet(7, 1250));
    assert_eq!(link.poll_timeout(), Some(t0 + MS));
    let got = drain(&mut link, &mut rng);
    assert_eq!(got, vec![(t0 + 26 * MS, 7)]);
    let s = link.stats();
    assert_eq!((s.sent, s.delivered, s.delivered_bytes), (1, 1, 1250));
}

#[test]
fn a_burst_leaves_at_the_link_rate_in_order() {
    let t0 = Instant::now();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut link = LinkModel::new(LinkParams::new(8_000_000, 10 * MS), 1).unwrap();
    for id in 0..100 {
        link.send(t0, packet(id, 1000)); // 1 ms each at 8 Mbit/s
    }
    let got = drain(&mut link, &mut rng);
    assert_eq!(got.len(), 100);
    for (i, (at, id)) in got.iter().enumerate() {
        assert_eq!(*id, i as u32);
        assert_eq!(*at, t0 + 10 * MS + (i as u32 + 1) * MS);
    }
    assert_eq!(link.stats().max_queue_packets, 99);
}

#[test]
fn a_late_caller_gets_the_same_schedule() {
    // The real-time relay wakes late; the link's times must not drift because of it.
    let t0 = Instant::now();
    let params = LinkParams::new(10_000_000, 5 * MS).with_jitter(MS);
    let run = |step: Option<Duration>| {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let mut link = LinkModel::new(params.clone(), 1).unwrap();
        for id in 0..50 {
            link.send(t0, packet(id, 1500));
        }
        match step {
            None => drain(&mut link, &mut rng),
            Some(step) => {
                let mut out = Vec::new();
                let mut now = t0;
                while link.in_flight() > 0 {
                    now += step;
                    link.handle_timeout(now, &mut rng);
                    while let Some((at, p)) = link.poll_deliver(now) {
                        out.push((at, p.payload));
                    }
                }
                out
            }
        }
    };
    let exact = run(None);
    assert_eq!(exact.len(), 50);
    assert_eq!(run(Some(Duration::from_micros(700))), exact);
    assert_eq!(run(Some(7 * MS)), exact);
}

#[test]
fn waking_only_for_deliveries_gives_the_same_schedule() {
    let t0 = Instant::now();
    let params = LinkParams::new(2_000_000, 5 * MS)
        .with_jitter(2 * MS)
        .with_loss(LossModel::Bernoulli { p: 0.1 })
        .with_queue("pie".parse().unwrap());
    let run = |lazy: bool| {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let mut link = LinkModel::new(params.clone(), 3).unwrap();
        let mut out = Vec::new();
        let mut wakes = 0;
        let mut now = t0;
        let mut next_send = 0u32;
        loop {
            let send_at = (next_send < 300).then(|| t0 + next_send * Duration::from_micros(1700));
            let wake = if lazy {
                link.poll_delivery_timeout()
            } else {
                link.poll_timeout()
            };
            let Some(t) = [send_at, wake].into_iter().flatten().min() else {
                break;
            };
            assert!(t >= now);
            now = t;
            wakes += 1;
            link.handle_timeout(now, &mut rng);
            while let Some((at, p)) = link.poll_deliver(now) {
                out.push((at, p.payload));
            }
            if send_at == Some(now) {
                link.send(now, packet(next_send, 1000));
                next_send += 1;
            }
        }
        (out, wakes, link.stats())
    };
    let (exact, exact_wakes, exact_stats) = run(false);
    let (lazy, lazy_wakes, lazy_stats) = run(true);
    assert!(exact.len() > 200);
    assert_eq!(lazy, exact);
    assert_eq!(lazy_stats, exact_stats);
    assert!(lazy_wakes < exact_wakes, "{lazy_wakes} vs {exact_wakes}");
}

#[test]
fn jitter_stays_in_bounds_and_never_reorders() {
    let t0 = Instant::now();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut link =
        LinkModel::new(LinkParams::new(100_000_000, 20 * MS).with_jitter(5 * MS), 1).unwrap();
    let mut sent_at = Vec::new();
    let mut now = t0;
    let mut got = Vec::new();
    for id in 0..2000u32 {
        now += Duration::from_micros(200);
        link.handle_timeout(now, &mut rng);
        while let Some((at, p)) = link.poll_deliver(now) {
            got.push((at, p.payload));
        }
        link.send(now, packet(id, 1000));
        sent_at.push(now);
    }
    got.extend(drain(&mut link, &mut rng));
    assert_eq!(got.len(), 2000);
    let mut spread = Vec::new();
    for (i, (at, id)) in got.iter().enumerate() {
        assert_eq!(*id, i as u32, "reordered");
        // 80 µs serialisation, then 20 ms ± 5 ms (or later, to keep order).
        let d = *at - sent_at[i];
        assert!(d >= Duration::from_micros(15_080), "{d:?}");
        spread.push(d);
    }
    let max = spread.iter().max().unwrap();
    let min = spread.iter().min().unwrap();
    assert!(*max - *min > 4 * MS, "jitter applied: {min:?}..{max:?}");
}

#[test]
fn bernoulli_loss_through_the_link_is_within_bounds() {
    let t0 = Instant::now();
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let p = 0.05;
    let mut link = LinkModel::new(
        LinkParams::new(1_000_000_000, MS).with_loss(LossModel::Bernoulli { p }),
        1,
    )
    .unwrap();
    let n = 40_000u32;
    for id in 0..n {
        link.send(t0 + Duration::from_micros(id as u64 * 20), packet(id, 1000));
        link.handle_timeout(t0 + Duration::from_micros(id as u64 * 20), &mut rng);
    }
    let got = drain(&mut link, &mut rng);
    let s = link.stats();
    assert_eq!(s.delivered as usize, got.len());
    assert_eq!(s.sent, s.delivered + s.dropped_loss);
    let rate = s.dropped_loss as f64 / n as f64;
    let se = (p * (1.0 - p) / n as f64).sqrt();
    assert!((rate - p).abs() < 5.0 * se, "loss {rate} vs {p} ± {se}");
}

#[test]
fn going_down_loses_everything_and_sending_while_down_is_counted() {
    let t0 = Instant::now();
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let params = LinkParams::new(1_000_000, 50 * MS);
    let mut link = LinkModel::new(params.clone(), 1).unwrap();
    for id in 0..10 {
        link.send(t0, packet(id, 1250)); // 10 ms each
    }
    link.handle_timeout(t0 + 25 * MS, &mut rng); // two on the wire, one transmitting, 7 queued
    assert_eq!(link.in_flight(), 10);
    let down = LinkParams {
        up: false,
        ..params.clone()
    };
    link.set_params(t0 + 25 * MS, down).unwrap();
    assert_eq!(link.in_flight(), 0);
    assert_eq!(link.poll_timeout(), None);
    link.send(t0 + 30 * MS, packet(99, 100));
    link.set_params(t0 + 40 * MS, params).unwrap();
    link.send(t0 + 40 * MS, packet(100, 1250));
    let got = drain(&mut link, &mut rng);
    assert_eq!(got, vec![(t0 + 100 * MS, 100)]);
    let s = link.stats();
    assert_eq!((s.sent, s.delivered, s.dropped_down), (12, 1, 11));
}

#[test]
fn down_with_a_new_queue_loses_the_backlog_to_the_outage_and_comes_back_with_the_new_queue() {
    let t0 = Instant::now();
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    let params = LinkParams::new(1_000_000, MS).with_queue("codel".parse().unwrap());
    let mut link = LinkModel::new(params.clone(), 1).unwrap();
    // A standing queue long enough for CoDel to be dropping when the link goes down.
    for i in 0..400u32 {
        let now = t0 + Duration::from_micros(i as u64 * 1000);
        link.handle_timeout(now, &mut rng);
        while link.poll_deliver(now).is_some() {}
        link.send(now, packet(i, 250));
    }
    let at = t0 + Duration::from_millis(400);
    link.handle_timeout(at, &mut rng);
    let before = link.stats();
    let queued = link.in_flight() as u64;
    let down = LinkParams {
        up: false,
        queue: "droptail:packets=3".parse().unwrap(),
        ..params.clone()
    };
    link.set_params(at, down.clone()).unwrap();
    let after = link.stats();
    assert_eq!(
        after.dropped_down - before.dropped_down,
        queued,
        "all lost to the outage"
    );
    assert_eq!(
        after.dropped_queue, before.dropped_queue,
        "none blamed on the AQM"
    );
    link.set_params(at, LinkParams { up: true, ..down })
        .unwrap();
    for i in 0..10 {
        link.send(at, packet(1000 + i, 250));
    }
    assert_eq!(
        link.backlog().packets,
        3,
        "the new drop-tail:3 queue is in force"
    );
}

#[test]
fn a_new_queue_takes_over_the_backlog() {
    let t0 = Instant::now();
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let params = LinkParams::new(1_000_000, MS);
    let mut link = LinkModel::new(params.clone(), 1).unwrap();
    for id in 0..20 {
        link.send(t0, packet(id, 1250));
    }
    let small = params.with_queue("droptail:packets=5".parse().unwrap());
    link.set_params(t0, small).unwrap();
    assert_eq!(link.backlog().packets, 5);
    let got = drain(&mut link, &mut rng);
    assert_eq!(got.len(), 6, "the transmitting packet and five queued");
    let s = link.stats();
    assert_eq!(s.dropped_queue, 14);
    assert_eq!(s.sent, s.delivered + s.dropped_queue);
}

#[test]
fn observed_events_add_up_to_the_counters() {
    let t0 = Instant::now();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let params = LinkParams::new(2_000_000, 3 * MS)
        .with_loss(LossModel::Bernoulli { p: 0.1 })
        .with_queue("droptail:packets=8".parse().unwrap());
    let mut link = LinkModel::new(params, 1).unwrap();
    link.observe(true);
    for id in 0..200 {
        let now = t0 + Duration::from_micros(id as u64 * 2000);
        link.handle_timeout(now, &mut rng);
        while link.poll_deliver(now).is_some() {}
        for k in 0..3 {
            link.send(now, packet(id * 3 + k, 700));
        }
    }
    drain(&mut link, &mut rng);
    let mut counts = std::collections::HashMap::new();
    let mut last = t0;
    let mut deliver_times = Vec::new();
    while let Some(e) = link.poll_event() {
        *counts.entry(e.event).or_insert(0u64) += 1;
        if e.event == TraceEvent::Deliver {
            assert!(e.at >= last);
            last = e.at;
            deliver_times.push(e.at);
        }
    }
    let s = link.stats();
    let n = |e| counts.get(&e).copied().unwrap_or(0);
    assert_eq!(n(TraceEvent::Deliver), s.delivered);
    assert_eq!(n(TraceEvent::DropLoss), s.dropped_loss);
    assert_eq!(n(TraceEvent::DropOverflow), s.dropped_queue);
    assert_eq!(n(TraceEvent::Enqueue), s.sent - s.dropped_queue);
    assert!(s.dropped_queue > 0 && s.dropped_loss > 0);
}

#[test]
fn sojourns_are_logged_up_to_the_limit() {
    let t0 = Instant::now();
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let mut link = LinkModel::new(LinkParams::new(8_000_000, MS), 1).unwrap();
    link.log_sojourns(3);
    for id in 0..5 {
        link.send(t0, packet(id, 1000));
    }
    drain(&mut link, &mut rng);
    let log = link.take_sojourns();
    let waits: Vec<Duration> = log.samples.iter().map(|(_, d)| *d).collect();
    assert_eq!(waits, vec![Duration::ZERO, MS, 2 * MS]);
    assert_eq!(log.truncated, 2);
}

#[derive(Debug, Clone)]
enum Op {
    Send { gap_us: u64, size: usize },
    Wait { us: u64 },
    Down,
    Up,
    Rate { kbps: u64 },
    Queue { packets: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0u64..3000, 40usize..1500).prop_map(|(gap_us, size)| Op::Send { gap_us, size }),
        2 => (0u64..20_000).prop_map(|us| Op::Wait { us }),
        1 => Just(Op::Down),
        1 => Just(Op::Up),
        1 => (64u64..50_000).prop_map(|kbps| Op::Rate { kbps }),
        1 => (1usize..50).prop_map(|packets| Op::Queue { packets }),
    ]
}

/// Move the link to `now` and take what it delivers.
fn step(
    link: &mut LinkModel<u32>,
    now: Instant,
    got: &mut Vec<(Instant, u32)>,
    rng: &mut ChaCha8Rng,
) -> Result<(), TestCaseError> {
    link.handle_timeout(now, rng);
    while let Some((at, p)) = link.poll_deliver(now) {
        prop_assert!(at <= now);
        got.push((at, p.payload));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever happens, every packet is accounted for exactly once, deliveries come in order
    /// of sending and of time, and nothing arrives before its serialisation and delay.
    #[test]
    fn every_packet_is_accounted_for(
        ops in proptest::collection::vec(op(), 1..200),
        loss in 0.0f64..0.3,
        delay_ms in 0u32..100,
        jitter_ms in 0u32..10,
        seed in any::<u64>(),
    ) {
        let t0 = Instant::now();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut params = LinkParams::new(1_000_000, delay_ms * MS)
            .with_jitter(jitter_ms * MS)
            .with_loss(LossModel::Bernoulli { p: loss })
            .with_queue("droptail:packets=30".parse().unwrap());
        let mut link = LinkModel::new(params.clone(), seed).unwrap();
        let mut now = t0;
        let mut sent = Vec::new();
        let mut got: Vec<(Instant, u32)> = Vec::new();
        for op in ops {
            match op {
                Op::Send { gap_us, size } => {
                    now += Duration::from_micros(gap_us);
                    step(&mut link, now, &mut got, &mut rng)?;
                    let id = sent.len() as u32;
                    sent.push((now, size));
                    link.send(now, packet(id, size));
                }
                Op::Wait { us } => {
                    now += Duration::from_micros(us);
                    step(&mut link, now, &mut got, &mut rng)?;
                }
                Op::Down => params.up = false,
                Op::Up => params.up = true,
                Op::Rate { kbps } => params.rate_bps = Some(kbps * 1000),
                Op::Queue { packets } => {
                    params.queue = format!("droptail:packets={packets}").parse().unwrap()
                }
            }
            if matches!(op, Op::Down | Op::Up | Op::Rate { .. } | Op::Queue { .. }) {
                step(&mut link, now, &mut got, &mut rng)?;
                link.set_params(now, params.clone()).unwrap();
            }
        }
        got.extend(drain(&mut link, &mut rng));
        let s = link.stats();
        prop_assert_eq!(link.in_flight(), 0);
        prop_assert_eq!(s.sent as usize, sent.len());
        prop_assert_eq!(s.sent, s.delivered + s.dropped_loss + s.dropped_queue + s.dropped_down);
        prop_assert_eq!(s.delivered as usize, got.len());
        let mut last = (t0, None::<u32>);
        for (at, id) in &got {
            prop_assert!(*at >= last.0, "out of time order");
            prop_assert!(last.1.is_none_or(|l| *id > l), "reordered");
            let (sent_at, _) = sent[*id as usize];
            prop_assert!(*at > sent_at, "arrived before it was sent");
            last = (*at, Some(*id));
        }
    }
}
