//! Properties every discipline must keep, on random traffic: never above its limit; every
//! offered packet dequeued, still queued or dropped exactly once; counters consistent; FIFO
//! within a flow; CE marks only on ECN-capable packets.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use qgate_aqm::{BuildContext, DisciplineSpec, Ecn, Packet};

#[derive(Debug, Clone)]
enum Op {
    Enqueue { flow: u64, size: usize, ect: bool },
    Dequeue,
    Wait(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u64..5, 40usize..1600, any::<bool>()).prop_map(|(flow, size, ect)| Op::Enqueue { flow, size, ect }),
        3 => Just(Op::Dequeue),
        1 => (0u64..50_000).prop_map(Op::Wait),
    ]
}

fn specs(limit: usize) -> Vec<DisciplineSpec> {
    [
        format!("droptail:packets={limit}"),
        format!("red:limit={limit},w_q=0.05,min_th=1,max_th=3"),
        format!("pie:limit={limit},target_ms=1,max_burst_ms=0"),
        format!("codel:limit={limit},target_ms=1,interval_ms=5"),
        format!("codel:limit={limit},target_ms=1,interval_ms=5,ecn=true"),
        format!("fq-codel:limit={limit},flows=4,quantum=300,target_ms=1,interval_ms=5"),
        format!("pid-delay:limit={limit},target_ms=1,period_ms=2"),
        format!("pid-delay:limit={limit},target_ms=1,period_ms=2,ecn=true"),
    ]
    .iter()
    .map(|s| s.parse().unwrap())
    .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn every_discipline_keeps_its_invariants(ops in proptest::collection::vec(op(), 1..600),
                                             limit in 1usize..40, seed: u64) {
        for spec in specs(limit) {
            let mut q = spec.build::<(u64, u32, bool)>(BuildContext { seed, link_rate_bps: Some(10_000_000) });
            let t0 = Instant::now();
            let mut t = Duration::ZERO;
            let mut dropped = Vec::new();
            let mut out = Vec::new();
            let mut next_id = 0u32;
            for op in &ops {
                match op {
                    Op::Enqueue { flow, size, ect } => {
                        let mut p = Packet::new(*size, *flow, (*flow, next_id, *ect));
                        if *ect { p.ecn = Ecn::Ect0; }
                        q.enqueue(t0 + t, p, &mut dropped);
                        next_id += 1;
                    }
                    Op::Dequeue => {
                        if let Some(p) = q.dequeue(t0 + t, &mut dropped) { out.push(p); }
                    }
                    Op::Wait(us) => t += Duration::from_micros(*us),
                }
                prop_assert!(q.backlog().packets <= limit, "{spec}: backlog {} > {limit}", q.backlog().packets);
            }
            let s = q.stats();
            prop_assert_eq!(s.offered, next_id as u64, "{}", spec);
            prop_assert_eq!(s.dequeued, out.len() as u64, "{}", spec);
            prop_assert_eq!(s.dropped_overflow + s.dropped_aqm, dropped.len() as u64, "{}", spec);
            prop_assert_eq!(s.enqueued, s.dequeued + s.dropped_after_enqueue + q.backlog().packets as u64, "{}", spec);
            prop_assert_eq!(s.offered, s.enqueued + s.dropped_overflow + s.dropped_aqm - s.dropped_after_enqueue, "{}", spec);
            // CE only where the sender said ECN-capable.
            for p in &out {
                if p.ecn == Ecn::Ce { prop_assert!(p.payload.2, "{}: CE on a not-ECT packet", spec); }
            }
            // FIFO within each flow.
            let mut last: BTreeMap<u64, u32> = BTreeMap::new();
            for p in &out {
                let (flow, id, _) = p.payload;
                if let Some(prev) = last.insert(flow, id) { prop_assert!(id > prev, "{}: flow {} reordered", spec, flow); }
            }
            // Drain: every packet accounted for exactly once.
            let mut drained = Vec::new();
            let later = t0 + t + Duration::from_secs(1);
            while let Some(p) = q.dequeue(later, &mut dropped) { drained.push(p); }
            prop_assert_eq!(q.backlog().packets, 0);
            prop_assert_eq!(q.backlog().bytes, 0);
            let ids: Vec<u32> = out.iter().chain(drained.iter()).map(|p| p.payload.1)
                .chain(dropped.iter().map(|d| d.packet.payload.1)).collect();
            let unique: BTreeSet<u32> = ids.iter().copied().collect();
            prop_assert_eq!(unique.len(), ids.len(), "{}: a packet counted twice", spec);
            prop_assert_eq!(unique, (0..next_id).collect::<BTreeSet<_>>(), "{}: a packet lost", spec);
        }
    }
}

/// ECN: each AQM marks ECN-capable packets where its RFC says so, instead of dropping them.
#[test]
fn aqms_mark_ecn_capable_packets_instead_of_dropping() {
    // Overload every discipline with ECT(0) packets: 1500 B arriving every 0.8 ms, served every
    // 1.2 ms (10 Mbit/s), for 20 s.
    for spec in [
        "pie:ecn=true",
        "codel:ecn=true",
        "fq-codel",
        "pid-delay:ecn=true",
        "red:ecn=true",
    ] {
        let spec: DisciplineSpec = spec.parse().unwrap();
        let mut q = spec.build::<()>(BuildContext {
            seed: 5,
            link_rate_bps: Some(10_000_000),
        });
        let t0 = Instant::now();
        let mut dropped = Vec::new();
        let (mut t_in, mut t_out) = (Duration::ZERO, Duration::ZERO);
        let mut ce_out = 0u64;
        while t_in < Duration::from_secs(20) {
            while t_out <= t_in {
                if let Some(p) = q.dequeue(t0 + t_out, &mut dropped) {
                    ce_out += u64::from(p.ecn == Ecn::Ce);
                }
                t_out += Duration::from_micros(1200);
            }
            let mut p = Packet::new(1500, 1, ());
            p.ecn = Ecn::Ect0;
            q.enqueue(t0 + t_in, p, &mut dropped);
            t_in += Duration::from_micros(800);
        }
        let s = q.stats();
        assert!(s.marked > 0, "{spec}: no marks: {s:?}");
        assert!(ce_out > 0, "{spec}: no CE packet left the queue");
        // PIE and PID-Delay stop marking above 10 % and drop instead (RFC 8033 §5.1), so only
        // CoDel-based queues are mark-only under this overload.
        if spec.kind().contains("codel") {
            assert_eq!(s.dropped_aqm, 0, "{spec}: {s:?}");
        }
    }
}
