//! Run independent simulations on several threads (by default one per core), keeping the
//! results in input order so output files do not depend on thread timing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// One worker per core.
pub fn default_jobs() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `f` on every item, up to `jobs` at a time; `done(item)` after each. Results in input order.
pub fn run_each<I: Sync, R: Send>(
    items: &[I],
    jobs: usize,
    f: impl Fn(&I) -> R + Sync,
    done: impl Fn(&I) + Sync,
) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<R>>> = Mutex::new((0..items.len()).map(|_| None).collect());
    let workers = jobs.clamp(1, items.len().max(1));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                let r = f(item);
                done(item);
                out.lock().expect("no worker panics while holding the lock")[i] = Some(r);
            });
        }
    });
    out.into_inner()
        .expect("no worker panics while holding the lock")
        .into_iter()
        .map(|r| r.expect("every item ran"))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn keeps_input_order() {
        let items: Vec<u64> = (0..20).collect();
        let seen = std::sync::atomic::AtomicUsize::new(0);
        let out = super::run_each(
            &items,
            3,
            |x| x * 2,
            |_| {
                seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            },
        );
        assert_eq!(out, (0..20).map(|x| x * 2).collect::<Vec<_>>());
        assert_eq!(seen.into_inner(), 20);
    }
}
