//! The two-ended chunk planner (paper 001 Algorithms 1 and 2), sans-IO: which chunk each lane
//! (one connection per interface) sends next, and when the lanes have met.
//!
//! With two lanes it is the paper's scheme exactly: lane 0 sends chunks 0, 1, 2, … and lane 1
//! sends n−1, n−2, …; each stops where the other has been, so every chunk is sent once and each
//! lane's chunks arrive in the order they are written (no reordering buffer at the receiver).
//! The general rule (decision U2) covers more lanes, resumes and failed lanes with the same
//! code: a lane keeps walking in its direction over free chunks (skipping chunks the receiver
//! already holds) and, when it meets a chunk another lane has taken (or starts, or its walk
//! ends), it picks a new start:
//! 1. the largest run of free chunks with an end no lane is walking toward: it takes that end
//!    (its first chunk walking forward, or its last walking backward);
//! 2. otherwise the largest run of at least two free chunks, split in the middle: it walks
//!    forward from the middle, leaving the first half's back end open for the next lane.
//!
//! So k lanes work ⌈k/2⌉ segments, each from both ends. A failed lane's taken-but-unconfirmed
//! chunks become free again, to be picked up by the lane walking toward them (or anyone
//! re-planning). Every step is O(1) except re-planning, which scans the chunk table once.
//!
//! Beyond the paper (decision U6): where the lanes meet, a lane with nothing left may
//! [`Planner::steal`] the chunk another lane took last (the one nearest the meeting point, the
//! last in that lane's send queue), so a slow lane's queued chunks do not hold up the end of the
//! file; the victim cancels its request. When nothing is left to steal (each other lane holds
//! only the chunk it is sending), an idle lane may [`Planner::copy`] the chunk another lane will
//! finish last and send it too: whichever copy the receiver confirms first counts, and the
//! other request is cancelled (decision U11). The paper's literal scheme is the planner without
//! steals or copies.

use super::Layout;

/// Most lanes (interfaces) one upload uses.
pub const MAX_LANES: usize = 16;

/// A chunk's state in the planner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nobody has it yet.
    Free,
    /// Lane `.0` has taken it and not yet had it confirmed.
    Taken(u8),
    /// Lane `.0` stole it from another lane; it is not stolen again.
    Stolen(u8),
    /// The receiver holds it.
    Done,
}

/// The direction a lane walks in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Increasing chunk index.
    Forward,
    /// Decreasing chunk index.
    Backward,
}

/// One lane's walk: the chunk it will take next and its direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Walk {
    next: usize,
    dir: Direction,
}

#[derive(Debug, Clone)]
struct Lane {
    up: bool,
    walk: Option<Walk>,
    /// Taken and unconfirmed chunks, oldest first.
    taken: std::collections::VecDeque<usize>,
    /// A chunk another lane holds that this one sends too ([`Planner::copy`]).
    copy: Option<usize>,
}

/// Why the planner refused a call: the shell asked for something impossible.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// No such lane.
    #[error("lane {0} does not exist")]
    NoLane(usize),
    /// No such chunk.
    #[error("chunk {0} is outside the file")]
    NoChunk(usize),
    /// The lane count is 0 or above [`MAX_LANES`].
    #[error("an upload needs 1 to {MAX_LANES} lanes, not {0}")]
    Lanes(usize),
}

/// Decides which chunk goes on which lane. See the module documentation.
#[derive(Debug, Clone)]
pub struct Planner {
    layout: Layout,
    state: Vec<State>,
    lanes: Vec<Lane>,
    done: usize,
}

impl Planner {
    /// A plan for `layout` over `lanes` lanes, all up, nothing held yet.
    pub fn new(layout: Layout, lanes: usize) -> Result<Planner, PlanError> {
        if lanes == 0 || lanes > MAX_LANES {
            return Err(PlanError::Lanes(lanes));
        }
        let mut p = Planner {
            layout,
            state: vec![State::Free; layout.chunks()],
            lanes: vec![
                Lane {
                    up: true,
                    walk: None,
                    taken: std::collections::VecDeque::new(),
                    copy: None,
                };
                lanes
            ],
            done: 0,
        };
        // Every lane gets its start now, in lane order, so the roles do not depend on which
        // lane asks first: lane 0 the front, lane 1 the back, lane 2 the middle, …
        for l in 0..lanes {
            p.lanes[l].walk = p.replan();
        }
        Ok(p)
    }

    /// The file's layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// How many lanes.
    pub fn lanes(&self) -> usize {
        self.lanes.len()
    }

    /// Chunks the receiver holds.
    pub fn done(&self) -> usize {
        self.done
    }

    /// Whether the receiver holds every chunk.
    pub fn is_complete(&self) -> bool {
        self.done == self.state.len()
    }

    /// Chunks `lane` has taken and not had confirmed.
    pub fn taken_by(&self, lane: usize) -> usize {
        self.lanes.get(lane).map_or(0, |l| l.taken.len())
    }

    /// The lane that has taken `chunk` and not had it confirmed, if any.
    pub fn owner(&self, chunk: usize) -> Option<usize> {
        match self.state.get(chunk) {
            Some(State::Taken(l) | State::Stolen(l)) => Some(*l as usize),
            _ => None,
        }
    }

    /// Whether `lane` should go on sending `chunk`: it has taken it, or copies it, and the
    /// receiver does not hold it yet. A request for which this turns false should be
    /// cancelled.
    pub fn sends(&self, lane: usize, chunk: usize) -> bool {
        self.owner(chunk) == Some(lane)
            || self.lanes.get(lane).is_some_and(|l| l.copy == Some(chunk))
    }

    /// The chunk `lane` copies, if any.
    pub fn copy_of(&self, lane: usize) -> Option<usize> {
        self.lanes.get(lane).and_then(|l| l.copy)
    }

    /// Whether `chunk` is held by the receiver.
    pub fn is_done(&self, chunk: usize) -> bool {
        self.state.get(chunk) == Some(&State::Done)
    }

    /// The chunk `lane` should send next, now taken by it; `None` when there is nothing it can
    /// take (the lane is down, or every free chunk is taken; ask again after
    /// [`Planner::fail`] of another lane, since that frees chunks).
    pub fn next(&mut self, lane: usize) -> Result<Option<usize>, PlanError> {
        let l = self.lanes.get(lane).ok_or(PlanError::NoLane(lane))?;
        if !l.up {
            return Ok(None);
        }
        // Continue the walk over free chunks, skipping those already held.
        if let Some(mut w) = l.walk {
            loop {
                match self.state.get(w.next) {
                    Some(State::Free) => return Ok(Some(self.take(lane, w))),
                    Some(State::Done) => match step(w, self.state.len()) {
                        Some(n) => w = n,
                        None => break,
                    },
                    // Met another lane (or the end).
                    _ => break,
                }
            }
        }
        self.lanes[lane].walk = None;
        Ok(self.replan().map(|w| self.take(lane, w)))
    }

    /// The receiver confirmed it holds `chunk` (whoever sent it; also for chunks it held before
    /// the upload resumed).
    pub fn confirm(&mut self, chunk: usize) -> Result<(), PlanError> {
        let s = self.state.get_mut(chunk).ok_or(PlanError::NoChunk(chunk))?;
        match *s {
            State::Done => return Ok(()),
            State::Taken(l) | State::Stolen(l) => forget(&mut self.lanes[l as usize].taken, chunk),
            State::Free => {}
        }
        *s = State::Done;
        self.done += 1;
        self.drop_copies(chunk);
        Ok(())
    }

    /// The receiver no longer holds `chunk` (it lost what it had not made durable, e.g. in a
    /// crash): it is free again. A chunk not done is left alone.
    pub fn unconfirm(&mut self, chunk: usize) -> Result<(), PlanError> {
        let s = self.state.get_mut(chunk).ok_or(PlanError::NoChunk(chunk))?;
        if *s == State::Done {
            *s = State::Free;
            self.done -= 1;
        }
        Ok(())
    }

    /// `lane` gives `chunk` back unsent or unconfirmed (its request failed); another lane (or
    /// this one) may take it again. A chunk the lane does not hold is left alone.
    pub fn release(&mut self, lane: usize, chunk: usize) -> Result<(), PlanError> {
        self.lanes.get(lane).ok_or(PlanError::NoLane(lane))?;
        self.state.get(chunk).ok_or(PlanError::NoChunk(chunk))?;
        if self.lanes[lane].copy == Some(chunk) {
            // Only a copy: the lane that holds the chunk goes on sending it.
            self.lanes[lane].copy = None;
            return Ok(());
        }
        if self.hand_to_copier(lane, chunk) {
            return Ok(());
        }
        let s = &mut self.state[chunk];
        if matches!(*s, State::Taken(l) | State::Stolen(l) if l as usize == lane) {
            *s = State::Free;
            let l = &mut self.lanes[lane];
            forget(&mut l.taken, chunk);
            // It resends this one next, then re-plans where its walk left off.
            let dir = l.walk.map_or(Direction::Forward, |w| w.dir);
            l.walk = Some(Walk { next: chunk, dir });
        }
        Ok(())
    }

    /// `lane` is down (its connection failed on every interface): everything it had taken and
    /// not had confirmed is free again, and it takes nothing until [`Planner::restore`].
    pub fn fail(&mut self, lane: usize) -> Result<(), PlanError> {
        let l = self.lanes.get_mut(lane).ok_or(PlanError::NoLane(lane))?;
        l.up = false;
        l.walk = None;
        l.copy = None;
        for c in std::mem::take(&mut l.taken) {
            // Back in the lane's list for a moment, so a copier can take it over.
            self.lanes[lane].taken.push_back(c);
            if !self.hand_to_copier(lane, c) {
                forget(&mut self.lanes[lane].taken, c);
                self.state[c] = State::Free;
            }
        }
        Ok(())
    }

    /// `lane` can send again; it re-plans at its next [`Planner::next`].
    pub fn restore(&mut self, lane: usize) -> Result<(), PlanError> {
        self.lanes.get_mut(lane).ok_or(PlanError::NoLane(lane))?.up = true;
        Ok(())
    }

    /// For `lane`, which has nothing left to take: the chunk taken last by the lane holding the
    /// most (at least two, and two more than `lane`; it keeps the one it is sending), now
    /// taken by `lane`; a chunk is stolen at most once. The victim
    /// should cancel its request for it ([`Planner::owner`] no longer names it). `None` when
    /// no lane holds two.
    pub fn steal(&mut self, lane: usize) -> Result<Option<usize>, PlanError> {
        if !self.lanes.get(lane).ok_or(PlanError::NoLane(lane))?.up {
            return Ok(None);
        }
        // Only from a lane holding at least two more than the thief, and never a chunk stolen
        // before: so two lanes cannot pass chunks back and forth.
        let mine = self.lanes[lane].taken.len();
        // Nor one another lane copies (decision U11): two lanes send it already.
        let copied = |c: usize| self.lanes.iter().any(|l| l.copy == Some(c));
        let last_unstolen = |v: usize| {
            let t = &self.lanes[v].taken;
            t.back()
                .copied()
                .filter(|&c| t.len() >= 2 && matches!(self.state[c], State::Taken(_)) && !copied(c))
        };
        let victim = (0..self.lanes.len())
            .filter(|&v| v != lane && self.lanes[v].taken.len() >= mine + 2)
            .filter(|&v| last_unstolen(v).is_some())
            .max_by_key(|&v| (self.lanes[v].taken.len(), std::cmp::Reverse(v)));
        let Some(v) = victim else { return Ok(None) };
        let c = self.lanes[v].taken.pop_back().expect("at least two");
        self.state[c] = State::Stolen(lane as u8);
        self.lanes[lane].taken.push_back(c);
        Ok(Some(c))
    }

    /// For `lane`, which holds nothing (no chunk taken, none copied) when nothing is left to
    /// take or steal: a chunk another lane holds, to send as well (the end game, decision
    /// U11). It is the chunk the lane holding the most took last (the one it will finish
    /// last), never one another lane is copying, and `lane` copies at most one at a time. The first
    /// copy the receiver confirms ends both requests ([`Planner::sends`]). `None` when there
    /// is none.
    pub fn copy(&mut self, lane: usize) -> Result<Option<usize>, PlanError> {
        let me = self.lanes.get(lane).ok_or(PlanError::NoLane(lane))?;
        if !me.up || !me.taken.is_empty() || me.copy.is_some() {
            return Ok(None);
        }
        let copied = |c: usize| self.lanes.iter().any(|l| l.copy == Some(c));
        let victim = (0..self.lanes.len())
            .filter(|&v| v != lane && self.lanes[v].up)
            .filter_map(|v| {
                let c = *self.lanes[v].taken.back()?;
                (!copied(c)).then_some((v, c))
            })
            .max_by_key(|&(v, _)| (self.lanes[v].taken.len(), std::cmp::Reverse(v)));
        let Some((_, c)) = victim else {
            return Ok(None);
        };
        self.lanes[lane].copy = Some(c);
        Ok(Some(c))
    }

    /// `lane` no longer sends `chunk` (released or failed): if another lane copies it, that
    /// lane now holds it (not to be stolen again). Whether there was one.
    fn hand_to_copier(&mut self, lane: usize, chunk: usize) -> bool {
        if !matches!(self.state[chunk], State::Taken(l) | State::Stolen(l) if l as usize == lane) {
            return false;
        }
        let Some(copier) = self.lanes.iter().position(|l| l.copy == Some(chunk)) else {
            return false;
        };
        forget(&mut self.lanes[lane].taken, chunk);
        self.lanes[copier].copy = None;
        // Its request went out before any chunk the copier took since.
        self.lanes[copier].taken.push_front(chunk);
        self.state[chunk] = State::Stolen(copier as u8);
        true
    }

    /// `chunk` is held by the receiver: nobody copies it any more.
    fn drop_copies(&mut self, chunk: usize) {
        for l in &mut self.lanes {
            if l.copy == Some(chunk) {
                l.copy = None;
            }
        }
    }

    fn take(&mut self, lane: usize, w: Walk) -> usize {
        debug_assert_eq!(self.state[w.next], State::Free);
        self.state[w.next] = State::Taken(lane as u8);
        let l = &mut self.lanes[lane];
        l.taken.push_back(w.next);
        l.walk = step(w, self.state.len()).or(Some(Walk {
            // Walked off the end: the next call re-plans.
            next: usize::MAX,
            dir: w.dir,
        }));
        w.next
    }

    /// Where a lane with no walk starts (the rules in the module documentation). Runs of free
    /// chunks are cut where a lane's walk begins, so a run's ends are each approached by at
    /// most one lane.
    fn replan(&self) -> Option<Walk> {
        let n = self.state.len();
        let walks: Vec<Walk> = self.lanes.iter().filter_map(|l| l.walk).collect();
        let forward_at = |i: usize| {
            walks.contains(&Walk {
                next: i,
                dir: Direction::Forward,
            })
        };
        let backward_at = |i: usize| {
            walks.contains(&Walk {
                next: i,
                dir: Direction::Backward,
            })
        };
        let free = |i: usize| self.state[i] == State::Free;
        let mut open: Option<(usize, Walk)> = None;
        let mut split: Option<(usize, usize)> = None;
        let mut i = 0;
        while i < n {
            if !free(i) {
                i += 1;
                continue;
            }
            let start = i;
            while !backward_at(i) && i + 1 < n && free(i + 1) && !forward_at(i + 1) {
                i += 1;
            }
            let end = i;
            i += 1;
            let len = end - start + 1;
            let front = !forward_at(start);
            let back = !backward_at(end);
            if (front || back) && open.is_none_or(|(l, _)| len > l) {
                let walk = if front {
                    Walk {
                        next: start,
                        dir: Direction::Forward,
                    }
                } else {
                    Walk {
                        next: end,
                        dir: Direction::Backward,
                    }
                };
                open = Some((len, walk));
            }
            if len >= 2 && split.is_none_or(|(l, _)| len > l) {
                split = Some((len, start + len / 2));
            }
        }
        open.map(|(_, w)| w).or(split.map(|(_, mid)| Walk {
            next: mid,
            dir: Direction::Forward,
        }))
    }
}

/// Drop `chunk` from a lane's taken list (short: at most the lane's requests in flight).
fn forget(taken: &mut std::collections::VecDeque<usize>, chunk: usize) {
    if let Some(i) = taken.iter().position(|&c| c == chunk) {
        taken.remove(i);
    }
}

fn step(w: Walk, n: usize) -> Option<Walk> {
    let next = match w.dir {
        Direction::Forward => w.next.checked_add(1).filter(|&i| i < n)?,
        Direction::Backward => w.next.checked_sub(1)?,
    };
    Some(Walk { next, ..w })
}
