//! Live heap bytes per account: what the lab's memory measurements read (decision U14).
//!
//! Paper 001 asks what a receiver actually holds, and neither quinn nor noq says how many bytes
//! wait in a stream's reassembly: a received datagram is copied once into a buffer the stream
//! keeps slices of until the application reads them. So the allocations made while an
//! endpoint's own tasks run are charged to an [`Account`] ([`Account::counted`] wraps a future,
//! [`Account::enter`] a stretch of code), and stay charged until they are freed, wherever and
//! on whichever thread that happens. [`Tally`] wraps the process's global allocator to do the
//! bookkeeping: a side table from each charged block to its account and size, in shards under
//! spin locks, which never allocates.
//!
//! With no account claimed it costs a thread-local read per allocation and an atomic load per
//! free. A process whose global allocator is not a [`Tally`] can claim no account
//! ([`Account::claim`] checks), so a measurement never reads a silent zero.

#![warn(missing_docs)]

use std::alloc::{GlobalAlloc, Layout};
use std::cell::{Cell, UnsafeCell};
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

/// How many accounts may be claimed at once.
pub const ACCOUNTS: usize = 64;
const SHARDS: usize = 64;
const SHARD_SLOTS: usize = 1 << 13;
/// A shard takes no entry beyond this, so probes stay short; a block it refuses is not charged
/// and its account says so ([`Account::complete`]).
const SHARD_FILL: usize = SHARD_SLOTS * 3 / 4;
/// An entry's size field; a larger block is refused like one a full shard refuses.
const SIZE_BITS: u32 = 40;
/// A token is the slot + 1 in its low 7 bits and the slot's generation above them, so a block
/// charged before its account was given back never touches the next claimer's counts.
const SLOT_BITS: u32 = 7;
const GEN_MASK: u32 = (1 << 17) - 1;

thread_local! {
    /// The token of the account this thread's allocations are charged to; 0 = none.
    static CURRENT: Cell<u32> = const { Cell::new(0) };
}

struct Slot {
    used: AtomicBool,
    generation: AtomicU32,
    live: AtomicUsize,
    peak: AtomicUsize,
    lost: AtomicBool,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            used: AtomicBool::new(false),
            generation: AtomicU32::new(0),
            live: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            lost: AtomicBool::new(false),
        }
    }
}

static SLOTS: [Slot; ACCOUNTS] = [const { Slot::new() }; ACCOUNTS];
/// Charged blocks not yet freed, over every account: while 0, a free looks nothing up.
static CHARGED: AtomicUsize = AtomicUsize::new(0);
/// Made by the first claim, never freed.
static TABLE: OnceLock<Box<[Shard]>> = OnceLock::new();

/// A part of the side table: open addressing with linear probing, under a spin lock (a lock
/// that allocates could not be taken inside the allocator).
struct Shard {
    locked: AtomicBool,
    entries: UnsafeCell<Entries>,
}

// The entries are only touched with `locked` held.
unsafe impl Sync for Shard {}

struct Entries {
    len: usize,
    /// Block addresses; 0 = empty.
    keys: Box<[usize]>,
    /// Token << SIZE_BITS | size.
    values: Box<[u64]>,
}

impl Shard {
    fn new() -> Shard {
        Shard {
            locked: AtomicBool::new(false),
            entries: UnsafeCell::new(Entries {
                len: 0,
                keys: vec![0; SHARD_SLOTS].into_boxed_slice(),
                values: vec![0; SHARD_SLOTS].into_boxed_slice(),
            }),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Entries) -> R) -> R {
        while self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        // SAFETY: the lock is held until `f` returns.
        let r = f(unsafe { &mut *self.entries.get() });
        self.locked.store(false, Ordering::Release);
        r
    }
}

/// A block's shard and its home index there.
fn place(p: usize) -> (usize, usize) {
    let h = ((p >> 4) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    ((h >> 58) as usize, (h >> 20) as usize & (SHARD_SLOTS - 1))
}

impl Entries {
    fn insert(&mut self, key: usize, home: usize, value: u64) -> bool {
        if self.len >= SHARD_FILL {
            return false;
        }
        let mut i = home;
        while self.keys[i] != 0 {
            i = (i + 1) & (SHARD_SLOTS - 1);
        }
        self.keys[i] = key;
        self.values[i] = value;
        self.len += 1;
        true
    }

    /// Remove `key`, shifting the entries after it back so that no probe needs a tombstone.
    fn remove(&mut self, key: usize, home: usize) -> Option<u64> {
        let mask = SHARD_SLOTS - 1;
        let mut i = home;
        loop {
            match self.keys[i] {
                0 => return None,
                k if k == key => break,
                _ => i = (i + 1) & mask,
            }
        }
        let value = self.values[i];
        let mut hole = i;
        let mut j = (i + 1) & mask;
        while self.keys[j] != 0 {
            let own = place(self.keys[j]).1;
            // The entry at j may fill the hole if the hole lies on its probe path.
            if (j.wrapping_sub(own) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.keys[hole] = self.keys[j];
                self.values[hole] = self.values[j];
                hole = j;
            }
            j = (j + 1) & mask;
        }
        self.keys[hole] = 0;
        self.len -= 1;
        Some(value)
    }
}

fn current() -> u32 {
    CURRENT.try_with(Cell::get).unwrap_or(0)
}

/// The slot a token names, if the token is of its current generation.
fn slot_of(token: u32) -> Option<&'static Slot> {
    let s = &SLOTS[(token & ((1 << SLOT_BITS) - 1)) as usize - 1];
    (s.generation.load(Ordering::Relaxed) & GEN_MASK == token >> SLOT_BITS).then_some(s)
}

/// Charge the block at `p` of `size` bytes to the account of `token` (0: to none).
fn put(token: u32, p: *mut u8, size: usize) {
    if token == 0 || p.is_null() {
        return;
    }
    let (Some(table), Some(slot)) = (TABLE.get(), slot_of(token)) else {
        return;
    };
    let (shard, home) = place(p as usize);
    let value = (u64::from(token) << SIZE_BITS) | size as u64;
    if (size as u64) >> SIZE_BITS != 0 || !table[shard].with(|e| e.insert(p as usize, home, value))
    {
        slot.lost.store(true, Ordering::Relaxed);
        return;
    }
    CHARGED.fetch_add(1, Ordering::Relaxed);
    let live = slot
        .live
        .fetch_add(size, Ordering::Relaxed)
        .wrapping_add(size);
    slot.peak.fetch_max(live, Ordering::Relaxed);
}

/// Uncharge the block at `p` if it is charged: its token and size.
fn take(p: *mut u8) -> Option<(u32, usize)> {
    if CHARGED.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let table = TABLE.get()?;
    let (shard, home) = place(p as usize);
    let value = table[shard].with(|e| e.remove(p as usize, home))?;
    CHARGED.fetch_sub(1, Ordering::Relaxed);
    let token = (value >> SIZE_BITS) as u32;
    let size = (value & ((1 << SIZE_BITS) - 1)) as usize;
    if let Some(slot) = slot_of(token) {
        slot.live.fetch_sub(size, Ordering::Relaxed);
    }
    Some((token, size))
}

/// The global allocator `A`, charging what is allocated under an entered [`Account`] to it:
/// `#[global_allocator] static ALLOC: Tally<MiMalloc> = Tally(MiMalloc);`.
pub struct Tally<A>(pub A);

// SAFETY: every call goes to `A` with the caller's arguments; the bookkeeping around it never
// allocates, and an entry is removed before its block is freed, so an address handed out again
// is never found charged.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Tally<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { self.0.alloc(layout) };
        put(current(), p, layout.size());
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { self.0.alloc_zeroed(layout) };
        put(current(), p, layout.size());
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        take(p);
        // SAFETY: the caller's contract, passed on.
        unsafe { self.0.dealloc(p, layout) }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let token = current();
        if token != 0 {
            // Charged to the account entered now, whichever (if any) the old block was.
            // SAFETY: the caller guarantees a valid size for `layout.align()`.
            let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
            // SAFETY: `new` is non-zero-sized as the caller guarantees; `p` holds
            // `layout.size()` bytes and is freed with its own layout.
            unsafe {
                let q = self.alloc(new);
                if !q.is_null() {
                    std::ptr::copy_nonoverlapping(p, q, layout.size().min(new_size));
                    self.dealloc(p, layout);
                }
                return q;
            }
        }
        let charged = take(p);
        // SAFETY: the caller's contract, passed on.
        let q = unsafe { self.0.realloc(p, layout, new_size) };
        if let Some((token, size)) = charged {
            // A block that moves keeps its account; one that could not grow keeps its size.
            if q.is_null() {
                put(token, p, size);
            } else {
                put(token, q, new_size);
            }
        }
        q
    }
}

/// A claim on one of the [`ACCOUNTS`] counters; clones share it, and it is given back when the
/// last one is dropped.
#[derive(Clone)]
pub struct Account(Arc<Claim>);

struct Claim {
    slot: usize,
    token: u32,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let s = &SLOTS[self.slot];
        // Blocks still charged to this claim now name an old generation: freeing them later
        // touches no counter.
        s.generation.fetch_add(1, Ordering::Relaxed);
        s.used.store(false, Ordering::Release);
    }
}

impl Account {
    /// A fresh account at zero; `None` when every account is taken, or when the process's
    /// global allocator is not a [`Tally`] (nothing would be charged).
    pub fn claim() -> Option<Account> {
        TABLE.get_or_init(|| (0..SHARDS).map(|_| Shard::new()).collect());
        let (slot, s) = SLOTS.iter().enumerate().find(|(_, s)| {
            s.used
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        })?;
        s.live.store(0, Ordering::Relaxed);
        s.peak.store(0, Ordering::Relaxed);
        s.lost.store(false, Ordering::Relaxed);
        let generation = s.generation.load(Ordering::Relaxed) & GEN_MASK;
        let account = Account(Arc::new(Claim {
            slot,
            token: (slot as u32 + 1) | (generation << SLOT_BITS),
        }));
        account.counts().then_some(account)
    }

    /// Whether an allocation under this account is charged to it.
    fn counts(&self) -> bool {
        let before = self.live();
        let probe = {
            let _in = self.enter();
            std::hint::black_box(Box::new([0u8; 64]))
        };
        let charged = self.live() >= before + 64;
        drop(probe);
        charged
    }

    fn slot(&self) -> &'static Slot {
        &SLOTS[self.0.slot]
    }

    /// Bytes charged to this account and not yet freed.
    pub fn live(&self) -> usize {
        self.slot().live.load(Ordering::Relaxed)
    }

    /// The most that were live at once since the claim or the last [`reset_peak`](Self::reset_peak).
    pub fn peak(&self) -> usize {
        self.slot().peak.load(Ordering::Relaxed)
    }

    /// Start the peak again from what is live now.
    pub fn reset_peak(&self) {
        let s = self.slot();
        s.peak
            .store(s.live.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Whether every block allocated under this account was charged (false if the side table
    /// had no room for one: the counts are then too low).
    pub fn complete(&self) -> bool {
        !self.slot().lost.load(Ordering::Relaxed)
    }

    /// Charge what this thread allocates to this account until the guard is dropped.
    pub fn enter(&self) -> Entered {
        Entered {
            previous: CURRENT.replace(self.0.token),
            _thread: PhantomData,
        }
    }

    /// `future`, with what it allocates while it is polled charged to this account.
    pub fn counted<F: Future>(&self, future: F) -> Counted<F> {
        Counted {
            account: self.clone(),
            future,
        }
    }
}

impl PartialEq for Account {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl fmt::Debug for Account {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Account")
            .field("live", &self.live())
            .field("peak", &self.peak())
            .finish()
    }
}

/// While it lives, this thread's allocations are charged to an account
/// ([`Account::enter`]); dropping it restores the account entered before.
pub struct Entered {
    previous: u32,
    /// The account is the thread's: the guard must be dropped where it was made.
    _thread: PhantomData<*const ()>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        let _ = CURRENT.try_with(|c| c.set(self.previous));
    }
}

/// A future whose polls are charged to an account ([`Account::counted`]).
pub struct Counted<F> {
    account: Account,
    future: F,
}

impl<F: Future> Future for Counted<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let _in = self.account.enter();
        // SAFETY: `future` is pinned with `self` (structural pinning): it is never moved out,
        // and `Counted` has no `Drop` and is `Unpin` only when `F` is.
        unsafe { self.map_unchecked_mut(|s| &mut s.future) }.poll(cx)
    }
}

/// `future`, with what its polls allocate charged to the account entered where this is called
/// (to none if none is): a task spawned by a counted one is counted too, so a server's request
/// tasks charge its account. Without an account it costs two thread-local writes a poll.
pub fn inherit<F: Future>(future: F) -> Inherited<F> {
    Inherited {
        token: current(),
        future,
    }
}

/// A future charged to the account entered where it was made ([`inherit`]).
pub struct Inherited<F> {
    token: u32,
    future: F,
}

impl<F: Future> Future for Inherited<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let _in = Entered {
            previous: CURRENT.replace(self.token),
            _thread: PhantomData,
        };
        // SAFETY: as for `Counted`: `future` is structurally pinned.
        unsafe { self.map_unchecked_mut(|s| &mut s.future) }.poll(cx)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn no_account_is_claimed_where_the_allocator_does_not_count() {
        // This test binary's allocator is the system's, not a `Tally`.
        for _ in 0..super::ACCOUNTS + 1 {
            assert!(super::Account::claim().is_none());
        }
    }
}
