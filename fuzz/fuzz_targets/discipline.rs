//! The queue disciplines (qgate_aqm) built from an arbitrary spec string and driven by an
//! arbitrary sequence of arrivals, departures and clock steps: no panic, and every packet is
//! accounted for exactly once (dequeued, dropped or still waiting).
#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use qgate_aqm::{BuildContext, DisciplineSpec, Packet, Verdict};

fuzz_target!(|data: &[u8]| {
    let Some(cut) = data.iter().position(|b| *b == b'\n') else {
        return;
    };
    let Ok(spec) = std::str::from_utf8(&data[..cut]).unwrap_or("").parse::<DisciplineSpec>() else {
        return;
    };
    if spec.validate().is_err() {
        return;
    }
    let mut q = spec.build::<u32>(BuildContext {
        seed: 1,
        link_rate_bps: Some(10_000_000),
    });
    let t0 = Instant::now();
    let mut now = t0;
    let (mut offered, mut out, mut dropped_total) = (0usize, 0usize, 0usize);
    let mut dropped = Vec::new();
    for op in data[cut + 1..].chunks(3) {
        match op {
            [0, size, flow] => {
                offered += 1;
                let p = Packet::new(usize::from(*size) * 8 + 40, u64::from(*flow % 8), 0);
                if let Verdict::Dropped(_) = q.enqueue(now, p, &mut dropped) {
                    assert!(!dropped.is_empty(), "a dropped arrival is in the drop list");
                }
            }
            [1, ..] => {
                if q.dequeue(now, &mut dropped).is_some() {
                    out += 1;
                }
            }
            [2, a, b] => now += Duration::from_micros(u64::from(*a) << *b % 24),
            _ => {}
        }
        dropped_total += dropped.len();
        dropped.clear();
        assert_eq!(offered, out + dropped_total + q.backlog().packets);
    }
});
