//! RefCnt (paper 004, §3.2): the book of a store shared by several jobs, and the order in
//! which it evicts. Pure: no I/O, no clock; the daemon tells it what happens and does what it
//! answers.
//!
//! # What it counts
//!
//! * **Reference count** of a sample: how many jobs still need it this epoch. A job's epoch
//!   adds one for each sample of its dataset ([`Ledger::need`]); reading it (the job's view
//!   that held it is done) takes one away ([`Ledger::consumed`]); leaving takes away the rest.
//!   A job that has started its next epoch before finishing this one (it draws ahead) holds
//!   one reference per epoch.
//! * **Pin** of a sample: how many jobs have it in their current or next view
//!   ([`Ledger::pin`], [`Ledger::unpin`]). A pinned sample is never evicted.
//! * **Staged** samples: what the store holds, with each one's bytes and when it was last
//!   staged or read (a logical clock that ticks on every [`Ledger::stage`] and
//!   [`Ledger::touch`]).
//!
//! # Eviction order
//!
//! When staging a sample needs room, victims are taken among the *unpinned* staged samples:
//! lowest reference count first, then least recently used, then lowest sample id (so the
//! order is total and the same everywhere). A sample nobody needs any more this epoch goes
//! before one a slower job will still read; among equals the oldest goes. [`Policy::Lru`]
//! (unpinned, least recently used) is kept as the baseline the simulation compares against.
//!
//! # Shares: why pinned data always fits
//!
//! Each job's share of the budget is fixed when it joins ([`Ledger::join`]): the bytes it may
//! pin at once, which for a mini-epoch job is its current view plus its next one, i.e. twice
//! the byte bound its views are planned with. A join is refused
//! ([`LedgerError::JoinRefused`]) when the shares already granted plus the new one would exceed
//! the budget, and a pin that would take a job past its share is refused
//! ([`LedgerError::OverShare`]). So the pinned bytes, counted once per sample, are at most the
//! sum of the shares, at most the budget: once every unpinned sample is evicted, a pinned
//! sample being staged always finds room. (A sample pinned by two jobs counts against both
//! shares but is stored once; the rule is conservative, never wrong.)

//!
//! # Layout
//!
//! This file is the book ([`Ledger`]); [`cohort`] builds on it the jobs' views, what to fetch
//! and evict for each, and the pace (`wait` or `evict`); [`sim`] runs jobs through either, tick
//! by tick, to count tier reads (the tests and `examples/share_sim.rs`).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use thiserror::Error;

pub mod cohort;
pub mod sim;

/// A job's key in the ledger (the daemon maps job names to these).
pub type JobId = u32;

/// Which unpinned sample goes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Lowest reference count, then least recently used (the module docs).
    #[default]
    RefCnt,
    /// Least recently used only: the baseline.
    Lru,
}

/// Errors of the ledger, each naming the job or sample.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum LedgerError {
    /// The shares granted plus this one exceed the budget.
    #[error("job {job} asks for a share of {share} bytes, but only {free} of the {budget}-byte budget are not yet shared out")]
    JoinRefused {
        job: JobId,
        share: u64,
        free: u64,
        budget: u64,
    },
    /// A job joined twice.
    #[error("job {job} has already joined")]
    DuplicateJob { job: JobId },
    /// The job has not joined (or has left).
    #[error("job {job} has not joined")]
    UnknownJob { job: JobId },
    /// Pinning would take a job past its share.
    #[error("job {job} would pin {pinned} bytes, more than its share of {share}")]
    OverShare { job: JobId, pinned: u64, share: u64 },
    /// Staging a sample found no room even with every unpinned sample evicted (only possible
    /// for a sample nobody pins).
    #[error("no room for sample {sample} ({size} bytes): {pinned} of the {budget}-byte budget are pinned")]
    NoRoom {
        sample: u32,
        size: u64,
        pinned: u64,
        budget: u64,
    },
    /// A staged sample came back with another size.
    #[error("sample {sample} is staged with {staged} bytes, not {size}")]
    SizeChanged { sample: u32, staged: u64, size: u64 },
}

#[derive(Debug, Default)]
struct Job {
    share: u64,
    /// Reads this job still owes each sample (one per epoch it has started and not yet read
    /// the sample in; one more for each epoch it draws ahead of the one it reads).
    needs: HashMap<u32, u32>,
    /// Samples this job pins, with their bytes.
    pins: HashMap<u32, u64>,
    pinned: u64,
}

#[derive(Debug, Clone, Copy)]
struct Staged {
    size: u64,
    last_use: u64,
}

/// The book of a shared store (see the module docs).
#[derive(Debug)]
pub struct Ledger {
    budget: u64,
    policy: Policy,
    jobs: BTreeMap<JobId, Job>,
    /// Reference counts of every sample some job needs.
    refs: HashMap<u32, u32>,
    /// Pin counts of every pinned sample (staged or not), with its bytes.
    pins: HashMap<u32, (u32, u64)>,
    staged: HashMap<u32, Staged>,
    /// Unpinned staged samples in eviction order: (reference count, last use, sample).
    order: BTreeSet<(u32, u64, u32)>,
    /// Bytes of the samples in `order`.
    evictable: u64,
    used: u64,
    pinned: u64,
    clock: u64,
}

/// What [`Ledger::stage`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Staging {
    /// The sample was already staged (a hit): nothing to fetch.
    pub hit: bool,
    /// Samples to delete from the store to make room, in eviction order.
    pub evicted: Vec<u32>,
}

impl Ledger {
    /// An empty book over `budget` bytes.
    pub fn new(budget: u64, policy: Policy) -> Self {
        Self {
            budget,
            policy,
            jobs: BTreeMap::new(),
            refs: HashMap::new(),
            pins: HashMap::new(),
            staged: HashMap::new(),
            order: BTreeSet::new(),
            evictable: 0,
            used: 0,
            pinned: 0,
            clock: 0,
        }
    }

    /// The budget in bytes.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Bytes staged now.
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Bytes of the budget not yet shared out to jobs.
    pub fn unshared(&self) -> u64 {
        self.budget - self.jobs.values().map(|j| j.share).sum::<u64>()
    }

    /// `job`'s share, if it has joined.
    pub fn share(&self, job: JobId) -> Option<u64> {
        self.jobs.get(&job).map(|j| j.share)
    }

    /// How many jobs still need `sample` this epoch.
    pub fn refcount(&self, sample: u32) -> u32 {
        self.refs.get(&sample).copied().unwrap_or(0)
    }

    /// Whether some job pins `sample`.
    pub fn is_pinned(&self, sample: u32) -> bool {
        self.pins.contains_key(&sample)
    }

    /// Whether `sample` is staged.
    pub fn is_staged(&self, sample: u32) -> bool {
        self.staged.contains_key(&sample)
    }

    /// The reads `job` still owes `sample` (its part of the reference count).
    pub fn owed(&self, job: JobId, sample: u32) -> u32 {
        self.jobs
            .get(&job)
            .and_then(|j| j.needs.get(&sample).copied())
            .unwrap_or(0)
    }

    /// The samples that staging `bytes` more would evict now, in order (empty when they fit;
    /// all the unpinned ones when even that is not enough).
    pub fn would_evict(&self, bytes: u64) -> Vec<u32> {
        let mut short = (self.used + bytes).saturating_sub(self.budget);
        let mut out = Vec::new();
        for &(_, _, s) in &self.order {
            if short == 0 {
                break;
            }
            short = short.saturating_sub(self.staged[&s].size);
            out.push(s);
        }
        out
    }

    /// Number of staged samples.
    pub fn staged_count(&self) -> usize {
        self.staged.len()
    }

    /// A job joins with a fixed `share` of the budget (module docs, "Shares").
    pub fn join(&mut self, job: JobId, share: u64) -> Result<(), LedgerError> {
        if self.jobs.contains_key(&job) {
            return Err(LedgerError::DuplicateJob { job });
        }
        let free = self.unshared();
        if share > free {
            return Err(LedgerError::JoinRefused {
                job,
                share,
                free,
                budget: self.budget,
            });
        }
        self.jobs.insert(
            job,
            Job {
                share,
                ..Job::default()
            },
        );
        Ok(())
    }

    /// A job leaves: its references and pins are released and its share returns.
    pub fn leave(&mut self, job: JobId) -> Result<(), LedgerError> {
        let j = self
            .jobs
            .remove(&job)
            .ok_or(LedgerError::UnknownJob { job })?;
        for (s, n) in j.needs {
            self.add_ref(s, -(n as i32));
        }
        for (s, _) in j.pins {
            self.release_pin(s);
        }
        Ok(())
    }

    /// The reads `job` still owes, by sample, ascending: what a restored book gives back to
    /// [`Ledger::need`] (once per read owed).
    pub fn needs_of(&self, job: JobId) -> Vec<(u32, u32)> {
        let mut v: Vec<(u32, u32)> = self
            .jobs
            .get(&job)
            .map(|j| j.needs.iter().map(|(&s, &n)| (s, n)).collect())
            .unwrap_or_default();
        v.sort_unstable();
        v
    }

    /// `job` starts an epoch that reads every one of `samples` once: each gains one reference.
    pub fn need(&mut self, job: JobId, samples: &[u32]) -> Result<(), LedgerError> {
        let j = self
            .jobs
            .get_mut(&job)
            .ok_or(LedgerError::UnknownJob { job })?;
        for &s in samples {
            *j.needs.entry(s).or_insert(0) += 1;
        }
        for &s in samples {
            self.add_ref(s, 1);
        }
        Ok(())
    }

    /// `job` owes `n` more reads of each `(sample, n)`: a restored book's [`Ledger::needs_of`]
    /// given back in one call, whatever the count.
    pub fn owe(&mut self, job: JobId, needs: &[(u32, u32)]) -> Result<(), LedgerError> {
        let j = self
            .jobs
            .get_mut(&job)
            .ok_or(LedgerError::UnknownJob { job })?;
        for &(s, n) in needs {
            *j.needs.entry(s).or_insert(0) += n;
        }
        for &(s, n) in needs {
            self.add_ref(s, n as i32);
        }
        Ok(())
    }

    /// `job` has read `samples` (once each): each loses one of its references (samples it owed
    /// nothing are ignored).
    pub fn consumed(&mut self, job: JobId, samples: &[u32]) -> Result<(), LedgerError> {
        let j = self
            .jobs
            .get_mut(&job)
            .ok_or(LedgerError::UnknownJob { job })?;
        let mut done = Vec::with_capacity(samples.len());
        for &s in samples {
            if let Some(n) = j.needs.get_mut(&s) {
                *n -= 1;
                if *n == 0 {
                    j.needs.remove(&s);
                }
                done.push(s);
            }
        }
        for s in done {
            self.add_ref(s, -1);
        }
        Ok(())
    }

    /// `job` pins `samples` (with their `sizes`); all or none, and never past its share.
    pub fn pin(&mut self, job: JobId, samples: &[(u32, u64)]) -> Result<(), LedgerError> {
        let j = self
            .jobs
            .get_mut(&job)
            .ok_or(LedgerError::UnknownJob { job })?;
        let mut new = HashSet::new();
        let add: u64 = samples
            .iter()
            .filter(|(s, _)| !j.pins.contains_key(s) && new.insert(*s))
            .map(|&(_, size)| size)
            .sum();
        if j.pinned + add > j.share {
            return Err(LedgerError::OverShare {
                job,
                pinned: j.pinned + add,
                share: j.share,
            });
        }
        let mut fresh = Vec::new();
        for &(s, size) in samples {
            if j.pins.insert(s, size).is_none() {
                j.pinned += size;
                fresh.push((s, size));
            }
        }
        for (s, size) in fresh {
            let e = self.pins.entry(s).or_insert((0, size));
            e.0 += 1;
            if e.0 == 1 {
                self.pinned += size;
                self.dequeue(s);
            }
        }
        Ok(())
    }

    /// `job` no longer pins `samples` (those it did not pin are ignored).
    pub fn unpin(&mut self, job: JobId, samples: &[u32]) -> Result<(), LedgerError> {
        let j = self
            .jobs
            .get_mut(&job)
            .ok_or(LedgerError::UnknownJob { job })?;
        let mut gone = Vec::new();
        for s in samples {
            if let Some(size) = j.pins.remove(s) {
                j.pinned -= size;
                gone.push(*s);
            }
        }
        for s in gone {
            self.release_pin(s);
        }
        Ok(())
    }

    /// `sample` (of `size` bytes) must be in the store. A hit only refreshes its last use;
    /// otherwise it is counted as staged and the samples to evict first are returned.
    pub fn stage(&mut self, sample: u32, size: u64) -> Result<Staging, LedgerError> {
        self.clock += 1;
        if let Some(&st) = self.staged.get(&sample) {
            if st.size != size {
                return Err(LedgerError::SizeChanged {
                    sample,
                    staged: st.size,
                    size,
                });
            }
            self.touch(sample);
            return Ok(Staging {
                hit: true,
                evicted: Vec::new(),
            });
        }
        // Room that eviction can make: everything but the pinned staged bytes.
        let pinned_staged = self.used - self.evictable;
        if pinned_staged + size > self.budget {
            return Err(LedgerError::NoRoom {
                sample,
                size,
                pinned: pinned_staged,
                budget: self.budget,
            });
        }
        let mut evicted = Vec::new();
        while self.used + size > self.budget {
            let victim = self
                .order
                .first()
                .expect("unpinned bytes cover the shortfall")
                .2;
            self.dequeue(victim);
            let st = self
                .staged
                .remove(&victim)
                .expect("ordered samples are staged");
            self.used -= st.size;
            evicted.push(victim);
        }
        let st = Staged {
            size,
            last_use: self.clock,
        };
        self.staged.insert(sample, st);
        self.used += size;
        self.enqueue(sample);
        Ok(Staging {
            hit: false,
            evicted,
        })
    }

    /// A staged sample was read: it becomes the most recently used.
    pub fn touch(&mut self, sample: u32) {
        self.clock += 1;
        self.dequeue(sample);
        if let Some(st) = self.staged.get_mut(&sample) {
            st.last_use = self.clock;
        }
        self.enqueue(sample);
    }

    /// The store lost `sample` (deleted outside the ledger's say, e.g. a failed copy).
    pub fn forget(&mut self, sample: u32) {
        self.dequeue(sample);
        if let Some(st) = self.staged.remove(&sample) {
            self.used -= st.size;
        }
    }

    /// Bytes pinned by some job (staged or not).
    pub fn pinned(&self) -> u64 {
        self.pinned
    }

    fn add_ref(&mut self, s: u32, delta: i32) {
        self.dequeue(s);
        let new = self.refcount(s).saturating_add_signed(delta);
        if new == 0 {
            self.refs.remove(&s);
        } else {
            self.refs.insert(s, new);
        }
        self.enqueue(s);
    }

    fn release_pin(&mut self, s: u32) {
        let Some(e) = self.pins.get_mut(&s) else {
            return;
        };
        e.0 -= 1;
        if e.0 > 0 {
            return;
        }
        let size = e.1;
        self.pins.remove(&s);
        self.pinned -= size;
        self.enqueue(s);
    }

    /// `s`'s key in the eviction order, if it is staged (whether or not it is queued).
    fn order_key(&self, s: u32) -> Option<(u32, u64, u32)> {
        let st = self.staged.get(&s)?;
        let r = match self.policy {
            Policy::RefCnt => self.refcount(s),
            Policy::Lru => 0,
        };
        Some((r, st.last_use, s))
    }

    /// Takes `s` out of the eviction order (before its key changes or it is pinned).
    fn dequeue(&mut self, s: u32) {
        if let Some(k) = self.order_key(s) {
            if self.order.remove(&k) {
                self.evictable -= self.staged[&s].size;
            }
        }
    }

    /// Puts `s` into the eviction order if it is staged and unpinned.
    fn enqueue(&mut self, s: u32) {
        if self.pins.contains_key(&s) {
            return;
        }
        if let Some(k) = self.order_key(s) {
            if self.order.insert(k) {
                self.evictable += self.staged[&s].size;
            }
        }
    }
}

#[cfg(test)]
mod tests;
