//! Live heap bytes per account: what the lab's memory measurements read (decision U14).
//!
//! Paper 001 asks what a receiver actually holds, and neither quinn nor noq says how many bytes
//! wait in a stream's reassembly: a received datagram is copied once into a buffer the stream
//! keeps slices of until the application reads them. So the allocations made while an
//! endpoint's own tasks run are charged to an [`Account`] ([`Account::counted`] wraps a future,
//! [`Account::enter`] a stretch of code, [`inherit`] passes it to the tasks a task spawns), and
//! stay charged until they are freed, wherever and on whichever thread that happens. [`Tally`]
//! wraps the process's global allocator to do the bookkeeping: a side table from each charged
//! block to its account and size, in shards under spin locks, which never allocates.
//!
//! Where no account was ever claimed (every product process) it costs a thread-local read per
//! allocation, an atomic load per free and both per reallocation; once blocks are charged,
//! every free looks its block up in the table until they are all freed. A process whose global
//! allocator is not a [`Tally`] can claim no account ([`Account::claim`] checks), so a
//! measurement never reads a silent zero.

#![warn(missing_docs)]

use std::alloc::{GlobalAlloc, Layout};
use std::cell::{Cell, RefCell, UnsafeCell};
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
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
/// A slot's words hold its generation in their top 17 bits, then (`state`) a lost flag, then
/// bytes.
const GEN_SHIFT: u32 = 47;
const LOST: u64 = 1 << 46;
const BYTES: u64 = LOST - 1;

thread_local! {
    /// The token of the account this thread's allocations are charged to; 0 = none. Read in
    /// the allocator: a `const` cell without a destructor, so reading it never allocates.
    static CURRENT: Cell<u32> = const { Cell::new(0) };
    /// The account entered, for the futures made under it ([`inherit`]); never touched in
    /// the allocator.
    static ENTERED: RefCell<Option<Account>> = const { RefCell::new(None) };
}

struct Slot {
    used: AtomicBool,
    /// Generation, lost flag and live bytes in one word: a count meant for an earlier claim
    /// of the slot, late on another thread, fails the generation check of the same
    /// compare-and-swap that would apply it, so it never lands in a later claim's.
    state: AtomicU64,
    /// Generation and peak bytes: an earlier claim's value is smaller, so it never wins
    /// `fetch_max`.
    peak: AtomicU64,
    /// The token of the account this one's blocks are charged to as well (0: none).
    parent: AtomicU32,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            used: AtomicBool::new(false),
            state: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            parent: AtomicU32::new(0),
        }
    }

    /// Add `size` bytes (`None`: set the lost flag) if the slot is still of `generation`.
    fn charge(&self, generation: u64, size: Option<u64>) {
        let Some(size) = size else {
            self.update(generation, |v| v | LOST);
            return;
        };
        if let Some(now) = self.update(generation, |v| v + size) {
            self.peak
                .fetch_max((generation << GEN_SHIFT) | (now & BYTES), Ordering::Relaxed);
        }
    }

    /// Apply `f` to the state if it is still of `generation`; the state after.
    fn update(&self, generation: u64, f: impl Fn(u64) -> u64) -> Option<u64> {
        self.state
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                (v >> GEN_SHIFT == generation).then(|| f(v))
            })
            .ok()
            .map(f)
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
    /// The token of the account's parent when the block was charged (0: none), so the
    /// parent is uncharged even after the account itself was given back.
    parents: Box<[u32]>,
}

impl Shard {
    fn new() -> Shard {
        Shard {
            locked: AtomicBool::new(false),
            entries: UnsafeCell::new(Entries {
                len: 0,
                keys: vec![0; SHARD_SLOTS].into_boxed_slice(),
                values: vec![0; SHARD_SLOTS].into_boxed_slice(),
                parents: vec![0; SHARD_SLOTS].into_boxed_slice(),
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
    fn insert(&mut self, key: usize, home: usize, value: u64, parent: u32) -> bool {
        if self.len >= SHARD_FILL {
            return false;
        }
        let mut i = home;
        while self.keys[i] != 0 {
            i = (i + 1) & (SHARD_SLOTS - 1);
        }
        self.keys[i] = key;
        self.values[i] = value;
        self.parents[i] = parent;
        self.len += 1;
        true
    }

    /// Remove `key`, shifting the entries after it back so that no probe needs a tombstone.
    fn remove(&mut self, key: usize, home: usize) -> Option<(u64, u32)> {
        let mask = SHARD_SLOTS - 1;
        let mut i = home;
        loop {
            match self.keys[i] {
                0 => return None,
                k if k == key => break,
                _ => i = (i + 1) & mask,
            }
        }
        let value = (self.values[i], self.parents[i]);
        let mut hole = i;
        let mut j = (i + 1) & mask;
        while self.keys[j] != 0 {
            let own = place(self.keys[j]).1;
            // The entry at j may fill the hole if the hole lies on its probe path.
            if (j.wrapping_sub(own) & mask) >= (j.wrapping_sub(hole) & mask) {
                self.keys[hole] = self.keys[j];
                self.values[hole] = self.values[j];
                self.parents[hole] = self.parents[j];
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

/// The slot a token names, and the generation it was claimed at.
fn slot_of(token: u32) -> (&'static Slot, u64) {
    (
        &SLOTS[(token & ((1 << SLOT_BITS) - 1)) as usize - 1],
        u64::from(token >> SLOT_BITS),
    )
}

/// Charge the block at `p` of `size` bytes to the account of `token` (0: to none).
fn put(token: u32, p: *mut u8, size: usize) {
    if token == 0 || p.is_null() {
        return;
    }
    let Some(table) = TABLE.get() else {
        return;
    };
    let (slot, generation) = slot_of(token);
    if slot.state.load(Ordering::Relaxed) >> GEN_SHIFT != generation {
        // Given back: nothing to charge. (An entry made just as it is given back stays in the
        // table naming the old generation, and counts nowhere when it is freed.)
        return;
    }
    // Stable while this call runs: an account charged here is entered on this thread, and
    // so claimed, or is the owner a reallocation keeps, checked above.
    let parent = slot.parent.load(Ordering::Acquire);
    let (shard, home) = place(p as usize);
    let value = (u64::from(token) << SIZE_BITS) | size as u64;
    let stored = (size as u64) >> SIZE_BITS == 0
        && table[shard].with(|e| e.insert(p as usize, home, value, parent));
    if stored {
        CHARGED.fetch_add(1, Ordering::Relaxed);
    }
    let size = stored.then_some(size as u64);
    slot.charge(generation, size);
    if parent != 0 {
        let (ps, pg) = slot_of(parent);
        ps.charge(pg, size);
    }
}

/// Uncharge the block at `p` if it is charged: its token and size.
fn take(p: *mut u8) -> Option<(u32, usize)> {
    if CHARGED.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let table = TABLE.get()?;
    let (shard, home) = place(p as usize);
    let (value, parent) = table[shard].with(|e| e.remove(p as usize, home))?;
    CHARGED.fetch_sub(1, Ordering::Relaxed);
    let token = (value >> SIZE_BITS) as u32;
    let size = value & ((1 << SIZE_BITS) - 1);
    // Each by its own generation: a block freed after its account was given back still leaves
    // the parent, which may live on.
    for t in [token, parent] {
        if t != 0 {
            let (s, g) = slot_of(t);
            s.update(g, |v| (v & !BYTES) | (v & BYTES).saturating_sub(size));
        }
    }
    Some((token, size as usize))
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
        let old = take(p);
        // SAFETY: the caller's contract, passed on (`A` may grow or shrink in place).
        let q = unsafe { self.0.realloc(p, layout, new_size) };
        if q.is_null() {
            // The block stays as it was.
            if let Some((was, size)) = old {
                put(was, p, size);
            }
        } else {
            // The entered account's now, or else still its own.
            let owner = if token != 0 {
                token
            } else {
                old.map_or(0, |o| o.0)
            };
            put(owner, q, new_size);
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
    /// The account this one's blocks also count in, kept claimed while this one is.
    parent: Option<Account>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let s = &SLOTS[self.slot];
        // Blocks still charged to this claim now name an old generation: freeing them later
        // touches no counter. (The generation wraps after 2^17 claims of one slot.)
        s.state.fetch_add(1 << GEN_SHIFT, Ordering::Relaxed);
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
        let generation = s.state.load(Ordering::Relaxed) >> GEN_SHIFT;
        s.state.store(generation << GEN_SHIFT, Ordering::Relaxed);
        s.parent.store(0, Ordering::Relaxed);
        let account = Account(Arc::new(Claim {
            slot,
            token: (slot as u32 + 1) | ((generation as u32) << SLOT_BITS),
            parent: None,
        }));
        let counts = account.counts();
        account.reset_peak();
        counts.then_some(account)
    }

    /// A fresh account whose blocks count in `parent` too: a part of what `parent` counts,
    /// with a peak of its own. One level only: a part of a part does not count in the
    /// grandparent. `None` as for [`claim`](Self::claim).
    pub fn claim_within(parent: &Account) -> Option<Account> {
        let mut part = Account::claim()?;
        Arc::get_mut(&mut part.0)
            .expect("a fresh claim has one handle")
            .parent = Some(parent.clone());
        part.slot().parent.store(parent.0.token, Ordering::Release);
        Some(part)
    }

    /// The account this one's blocks also count in ([`claim_within`](Self::claim_within)).
    pub fn parent(&self) -> Option<&Account> {
        self.0.parent.as_ref()
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
        (self.slot().state.load(Ordering::Relaxed) & BYTES) as usize
    }

    /// The most that were live at once since the claim or the last [`reset_peak`](Self::reset_peak).
    pub fn peak(&self) -> usize {
        (self.slot().peak.load(Ordering::Relaxed) & BYTES) as usize
    }

    /// Start the peak again from what is live now.
    pub fn reset_peak(&self) {
        let v = self.slot().state.load(Ordering::Relaxed);
        self.slot()
            .peak
            .store((v & !(LOST | BYTES)) | (v & BYTES), Ordering::Relaxed);
    }

    /// Whether every block allocated under this account was charged (false if the side table
    /// had no room for one: the counts are then too low).
    pub fn complete(&self) -> bool {
        self.slot().state.load(Ordering::Relaxed) & LOST == 0
    }

    /// Charge what this thread allocates to this account until the guard is dropped; futures
    /// made meanwhile with [`inherit`] are charged to it too.
    pub fn enter(&self) -> Entered {
        // `ENTERED` first: its first use on a thread may allocate, which must not be charged.
        let account = ENTERED.with(|e| e.replace(Some(self.clone())));
        Entered {
            previous: CURRENT.replace(self.0.token),
            account,
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
/// ([`Account::enter`]); dropping it restores the account entered before. It holds the
/// account's claim, so the account outlives it.
pub struct Entered {
    previous: u32,
    /// The account entered before.
    account: Option<Account>,
    /// The account is the thread's: the guard must be dropped where it was made.
    _thread: PhantomData<*const ()>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        let _ = CURRENT.try_with(|c| c.set(self.previous));
        let previous = self.account.take();
        let _ = ENTERED.try_with(|e| e.replace(previous));
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

/// `future`, with what its polls allocate charged to the account entered where this is called:
/// a task spawned by a counted one is counted too, so a server's request tasks charge its
/// account. It holds the account's claim while it lives; made under none, it only polls
/// `future`.
pub fn inherit<F: Future>(future: F) -> Inherited<F> {
    Inherited {
        account: ENTERED.try_with(|e| e.borrow().clone()).ok().flatten(),
        future,
    }
}

/// A future charged to the account entered where it was made ([`inherit`]).
pub struct Inherited<F> {
    account: Option<Account>,
    future: F,
}

impl<F: Future> Future for Inherited<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let _in = self.account.as_ref().map(Account::enter);
        // SAFETY: as for `Counted`: `future` is structurally pinned.
        unsafe { self.map_unchecked_mut(|s| &mut s.future) }.poll(cx)
    }
}

/// `f`, with nothing it allocates charged to any account: a simulated network's own work done
/// inside a host's send is the wire's memory, not the host's.
pub fn outside<R>(f: impl FnOnce() -> R) -> R {
    let _none = Entered {
        previous: CURRENT.replace(0),
        account: ENTERED.try_with(|e| e.replace(None)).ok().flatten(),
        _thread: PhantomData,
    };
    f()
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
