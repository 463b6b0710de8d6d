//! One resumption's work on a full ticket store (decision G18: one ticket per device slot):
//! take a held ticket, store the new one issued on that connection. Ours against rustls's
//! `ServerSessionMemoryCache`, the store the device listener used before, in the same run.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use qgate_transport::tickets::TicketStore;
use rustls::server::{ServerSessionMemoryCache, StoresServerSessions};

fn key(i: u64) -> Vec<u8> {
    let mut k = vec![0u8; 32];
    k[..8].copy_from_slice(&i.to_le_bytes());
    k
}

fn bench(c: &mut Criterion) {
    let value = vec![7u8; 120];
    for slots in [1_000u64, 10_000, 100_000] {
        let mut group = c.benchmark_group(format!("take+put/{slots}"));
        let stores: [(&str, std::sync::Arc<dyn StoresServerSessions>); 2] = [
            ("rustls", ServerSessionMemoryCache::new(slots as usize)),
            (
                "ours",
                std::sync::Arc::new(TicketStore::new(slots as usize)),
            ),
        ];
        for (name, store) in stores {
            for i in 0..slots {
                store.put(key(i), value.clone());
            }
            // Devices come back in the order they connected (the one whose ticket is oldest),
            // a middle-of-the-queue case for the linear search.
            let mut next = slots;
            group.bench_function(name, |b| {
                b.iter(|| {
                    let back = next - slots + slots / 2;
                    black_box(store.take(&key(back)));
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
