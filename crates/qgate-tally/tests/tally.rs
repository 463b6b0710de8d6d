//! The tally as the process's global allocator: what is charged, to whom, and for how long.

use std::alloc::System;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use qgate_tally::{Account, Tally};

#[global_allocator]
static ALLOC: Tally<System> = Tally(System);

/// One test at a time: one of them claims every free account.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn what_is_allocated_under_an_account_is_charged_until_freed_on_any_thread() {
    let _serial = serial();
    let a = Account::claim().expect("an account");
    assert_eq!(a.live(), 0);
    let outside = vec![0u8; 10_000];
    assert_eq!(a.live(), 0, "nothing allocated outside is charged");
    let inside = {
        let _in = a.enter();
        vec![1u8; 5_000]
    };
    assert_eq!(a.live(), 5_000);
    // Freed on another thread, which has no account entered.
    std::thread::spawn(move || drop(inside)).join().unwrap();
    assert_eq!(a.live(), 0);
    assert_eq!(a.peak(), 5_000);
    drop(outside);
    assert!(a.complete());
}

#[test]
fn a_block_that_grows_keeps_its_account_and_its_new_size() {
    let _serial = serial();
    let a = Account::claim().expect("an account");
    let mut v: Vec<u8> = {
        let _in = a.enter();
        Vec::with_capacity(100)
    };
    assert_eq!(a.live(), 100);
    // Grown outside the account: still its block, now 1 000 bytes.
    v.reserve_exact(1_000);
    assert_eq!(a.live(), v.capacity());
    let b = Account::claim().expect("a second account");
    {
        // Grown under another account: charged to that one.
        let _in = b.enter();
        v.reserve_exact(5_000);
    }
    assert_eq!(a.live(), 0);
    assert_eq!(b.live(), v.capacity());
    drop(v);
    assert_eq!(b.live(), 0);
}

#[test]
fn a_block_that_grows_under_its_account_is_charged_once() {
    let _serial = serial();
    let a = Account::claim().expect("an account");
    let _in = a.enter();
    let mut v: Vec<u8> = Vec::with_capacity(100);
    v.reserve_exact(10_000);
    assert_eq!(a.live(), v.capacity());
    // Not the old and the new block at once, as an allocate-copy-free would count them.
    assert_eq!(a.peak(), v.capacity());
}

#[test]
fn nothing_made_outside_accounts_is_charged() {
    let _serial = serial();
    let a = Account::claim().expect("an account");
    let _in = a.enter();
    let wire = qgate_tally::outside(|| vec![0u8; 5_000]);
    let own = vec![0u8; 1_000];
    assert_eq!(a.live(), 1_000);
    drop((wire, own));
    assert_eq!(a.live(), 0);
}

#[test]
fn a_part_counts_in_its_whole_with_a_peak_of_its_own() {
    let _serial = serial();
    let whole = Account::claim().expect("an account");
    let part = Account::claim_within(&whole).expect("a part");
    assert_eq!(part.parent(), Some(&whole));
    let (a, b) = {
        let _p = part.enter();
        let a = vec![0u8; 3_000];
        let _w = whole.enter();
        (a, vec![0u8; 1_000])
    };
    assert_eq!((part.live(), whole.live()), (3_000, 4_000));
    drop(a);
    assert_eq!((part.live(), whole.live()), (0, 1_000));
    assert_eq!((part.peak(), whole.peak()), (3_000, 4_000));
    drop(b);
    assert_eq!(whole.live(), 0);
    // A part given back before its block is freed: the block still leaves the whole.
    let c = {
        let _p = part.enter();
        vec![0u8; 2_000]
    };
    drop(part);
    assert_eq!(whole.live(), 2_000);
    drop(c);
    assert_eq!(whole.live(), 0);
}

#[test]
fn accounts_are_independent_and_a_given_back_one_is_not_touched_by_its_old_blocks() {
    let _serial = serial();
    let a = Account::claim().expect("an account");
    let b = Account::claim().expect("another");
    let (x, y, z) = {
        let _a = a.enter();
        let x = vec![0u8; 3_000];
        let y = {
            let _b = b.enter();
            vec![0u8; 7_000]
        };
        // Back to a once b's guard is gone.
        (x, y, vec![0u8; 1_000])
    };
    assert_eq!(a.live(), 4_000);
    assert_eq!(b.live(), 7_000);
    drop(b);
    // Claims until b's slot comes back, at its next generation.
    let claims: Vec<Account> = std::iter::from_fn(Account::claim).take(200).collect();
    for c in &claims {
        assert_eq!(c.live(), 0);
    }
    drop(y);
    for c in &claims {
        assert_eq!(c.live(), 0, "a block of an older claim touched a new one");
    }
    drop((x, z));
    assert_eq!(a.live(), 0);
}

#[test]
fn the_peak_restarts_from_what_is_live() {
    let _serial = serial();
    let a = Account::claim().expect("an account");
    let _in = a.enter();
    let big = vec![0u8; 50_000];
    let small = vec![0u8; 1_000];
    drop(big);
    assert_eq!(a.peak(), 51_000);
    a.reset_peak();
    assert_eq!(a.peak(), 1_000);
    drop(small);
    assert_eq!(a.live(), 0);
}

/// Allocates a 4 000-byte buffer on its first poll and keeps it.
struct Holds(Option<Vec<u8>>);

impl Future for Holds {
    type Output = Vec<u8>;
    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Vec<u8>> {
        match self.0.take() {
            None => {
                self.0 = Some(vec![0u8; 4_000]);
                Poll::Pending
            }
            Some(v) => Poll::Ready(v),
        }
    }
}

#[test]
fn a_counted_future_charges_what_its_polls_allocate() {
    let _serial = serial();
    let a = Account::claim().expect("an account");
    let mut f = a.counted(Holds(None));
    let mut cx = Context::from_waker(Waker::noop());
    assert!(Pin::new(&mut f).poll(&mut cx).is_pending());
    assert_eq!(a.live(), 4_000);
    let Poll::Ready(v) = Pin::new(&mut f).poll(&mut cx) else {
        panic!("ready on the second poll")
    };
    drop(f);
    assert_eq!(a.live(), 4_000);
    drop(v);
    assert_eq!(a.live(), 0);
}

#[test]
fn a_future_made_under_an_account_charges_it_wherever_it_is_polled() {
    let _serial = serial();
    let a = Account::claim().expect("an account");
    let mut cx = Context::from_waker(Waker::noop());
    let mut outside = Box::pin(qgate_tally::inherit(Holds(None)));
    let mut inside = {
        let _in = a.enter();
        Box::pin(qgate_tally::inherit(Holds(None)))
    };
    let boxed = a.live();
    assert!(outside.as_mut().poll(&mut cx).is_pending());
    assert_eq!(a.live(), boxed, "made outside: not charged");
    // Polled on another thread, with no account entered there.
    let inside = std::thread::spawn(move || {
        let mut cx = Context::from_waker(Waker::noop());
        assert!(inside.as_mut().poll(&mut cx).is_pending());
        inside
    })
    .join()
    .unwrap();
    assert_eq!(a.live(), boxed + 4_000);
    drop((inside, outside));
    assert_eq!(a.live(), 0);
}

#[test]
fn random_blocks_on_several_threads_add_up() {
    let _serial = serial();
    let a = Account::claim().expect("an account");
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let a = a.clone();
            std::thread::spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t;
                let mut next = move || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                let mut kept: Vec<Vec<u8>> = Vec::new();
                for _ in 0..20_000 {
                    let r = next();
                    if r % 3 == 0 && !kept.is_empty() {
                        let i = (r >> 8) as usize % kept.len();
                        drop(kept.swap_remove(i));
                    } else if r % 3 == 1 && !kept.is_empty() {
                        let i = (r >> 8) as usize % kept.len();
                        kept[i].reserve_exact((r >> 20) as usize % 3_000);
                    } else {
                        let _in = (r % 2 == 0).then(|| a.enter());
                        kept.push(Vec::with_capacity(1 + (r >> 16) as usize % 2_000));
                    }
                }
                kept
            })
        })
        .collect();
    let kept: Vec<Vec<Vec<u8>>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(a.complete());
    assert!(a.live() > 0);
    assert!(a.peak() >= a.live());
    drop(kept);
    assert_eq!(a.live(), 0, "every charged block came back");
}
