//! Cost of one enqueue + one dequeue per discipline, in steady state: a standing queue of 100
//! packets from 8 flows, time advancing one 1500-byte serialisation at 10 Mbit/s per step.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use qgate_aqm::{BuildContext, DisciplineSpec, Packet};

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("enqueue+dequeue");
    for kind in DisciplineSpec::KINDS {
        let spec: DisciplineSpec = kind.parse().unwrap();
        let mut q = spec.build::<u64>(BuildContext {
            seed: 1,
            link_rate_bps: Some(10_000_000),
        });
        let t0 = Instant::now();
        let step = Duration::from_micros(1200);
        let mut t = t0;
        let mut dropped = Vec::with_capacity(64);
        let mut id = 0u64;
        for _ in 0..100 {
            q.enqueue(t, Packet::new(1500, id % 8, id), &mut dropped);
            id += 1;
        }
        group.bench_function(*kind, |b| {
            b.iter(|| {
                t += step;
                q.enqueue(t, Packet::new(1500, id % 8, id), &mut dropped);
                id += 1;
                let p = q.dequeue(t, &mut dropped);
                if p.is_none() {
                    // Keep the queue standing if an AQM drained it.
                    for _ in 0..50 {
                        q.enqueue(t, Packet::new(1500, id % 8, id), &mut dropped);
                        id += 1;
                    }
                }
                dropped.clear();
                black_box(p)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
