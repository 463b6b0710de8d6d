//! A full ticket store (decision G18: one ticket per device slot), ours against rustls's
//! `ServerSessionMemoryCache` (the store the device listener used before) in the same run:
//! `take+put` is a returning device (its ticket taken, the new one stored; the taken ticket sits
//! in the middle of the storing order), `put` a new device (the oldest ticket evicted).

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use qgate_transport::tickets::TicketStore;
use rustls::server::{ServerSessionMemoryCache, StoresServerSessions};

fn key(i: u64) -> Vec<u8> {
    let mut k = vec![0u8; 32];
    k[..8].copy_from_slice(&i.to_le_bytes());
    k
}

fn full(name: &str, slots: u64, value: &[u8]) -> Arc<dyn StoresServerSessions> {
    let store: Arc<dyn StoresServerSessions> = match name {
        "rustls" => ServerSessionMemoryCache::new(slots as usize),
        _ => Arc::new(TicketStore::new(slots as usize)),
    };
    for i in 0..slots {
        store.put(key(i), value.to_vec());
    }
    store
}

fn bench(c: &mut Criterion) {
    let value = vec![7u8; 120];
    for slots in [1_000u64, 10_000, 100_000] {
        let mut group = c.benchmark_group(format!("take+put/{slots}"));
        for name in ["rustls", "ours"] {
            let store = full(name, slots, &value);
            // Keys next - slots .. next are held; the one taken is in the middle of them.
            let mut next = slots;
            assert!(
                store.take(&key(slots / 2)).is_some(),
                "{name} holds the ticket"
            );
            store.put(key(next), value.clone());
            next += 1;
            group.bench_function(name, |b| {
                b.iter(|| {
                    black_box(store.take(&key(next - slots + slots / 2)));
                    store.put(key(next), value.clone());
                    next += 1;
                })
            });
        }
        group.finish();
        let mut group = c.benchmark_group(format!("put/{slots}"));
        for name in ["rustls", "ours"] {
            let store = full(name, slots, &value);
            let mut next = slots;
            group.bench_function(name, |b| {
                b.iter(|| {
                    store.put(key(next), value.clone());
                    next += 1;
                })
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
