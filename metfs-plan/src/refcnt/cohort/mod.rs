//! A cohort: the jobs sharing one store, at the granularity the daemon works in (views, i.e.
//! mini-epochs). It decides each job's next view, what to fetch and evict for it, and whether
//! a job that runs ahead must wait. Pure, like the rest of [`super`]: the daemon does the I/O.
//!
//! # Views from one sampler
//!
//! All jobs draw from one [`DependentSampler`]. When a job needs its next view and has none
//! drawn, rounds are drawn for *every* job still drawing its epoch, and each round's samples go
//! to the jobs' open views; when any job's next sample would overflow its view, every job's
//! open view is closed at that same round. So a sample two jobs share is usually in the same
//! view of both, and the slower job finds the faster job's views already staged. Views drawn
//! for a job wait in its queue until it gets there. A job joining mid-epoch simply enters the
//! sampler with its whole dataset (the sampler keeps every job's order uniform whatever the
//! others do; `uniform_with_partial_rounds` in the planner's tests). When a job has drawn its
//! whole dataset it leaves the sampler, and re-enters when it needs the first view of its next
//! epoch. The views therefore depend on the seed and on the order of the jobs' requests, not on
//! the seed and epoch alone: a restarted cohort does not redraw the same views.
//!
//! # Saving and restoring a job
//!
//! [`Cohort::saved`] gives a job's place ([`MemberState`]): its views (current, prepared next,
//! queued, open), the epochs it reads and draws, the samples of the drawing epoch it has not
//! drawn yet, and the reads it still owes. [`Cohort::rejoin`] puts it back into a new cohort
//! (a restarted daemon's). The sampler's random state is not saved: the rejoined job re-enters
//! the sampler with its undrawn samples, and the new cohort draws them from its own stream.
//! Each job still draws every sample of its dataset exactly once per epoch, none it drew
//! before the restart, and its order of what is left stays uniformly random (the sampler's
//! uniformity holds from any remaining sets, as for a job joining mid-epoch); views already
//! drawn are kept as they were. Replaying the old stream exactly would need the sampler's
//! groups and the order of every job's requests, which a restart does not reproduce anyway.
//!
//! The owed reads follow from the views (`owed_by_place`): every epoch from the one the job
//! reads to the one it draws is owed whole but for what it has read of the first. Other jobs'
//! requests draw a job's views ahead across as many epochs as it lags behind them, so a job
//! may owe a sample `drawing - reading + 1` reads, not at most two. [`Cohort::rejoin`] takes
//! exactly the places [`Cohort::saved`] gives ([`Cohort::check_place`]; a property test
//! drives joins, draws, advances, leaves and restarts of several jobs and loads every place
//! back).
//!
//! # References, pins and shares
//!
//! A job needs (holds a reference on) every sample of its dataset from the start of each of
//! its epochs until it leaves the view holding it; it pins its current and next views. Its
//! share is twice its view bound, fixed at join; a join whose share does not fit what is left
//! of the budget is refused ([`super::Ledger`]'s rule).
//!
//! # Pace
//!
//! Preparing a job's next view may need room. With [`Pace::Wait`] (the default), if making
//! room would evict a sample already drawn into a view another job has not reached yet (the
//! faster job staged it for both, the slower one is not there yet), the job gets
//! [`Next::Wait`]: it keeps its current view (MET's `wait`: a bonus pass) and asks again
//! later, so a fast job never makes a slow one read the tier twice. It is not made to wait
//! when every other job is waiting too (someone must move). With [`Pace::Evict`] it evicts in
//! RefCnt order and goes on (the paper's behaviour).
//!
//! # Whose store
//!
//! A cohort made with [`Cohort::new`] keeps a model of a pool of single samples in its ledger
//! (what is staged, what goes to make room, the pace above): the simulation's store
//! ([`super::sim`], `examples/share_sim.rs`). A cohort made with [`Cohort::external`] leaves
//! the store to its caller, so that one policy runs, not two that drift: it draws, pins and
//! counts references, and [`Cohort::prepare`] only draws ([`Next::Stage`] with every sample
//! to fetch and nothing to evict; the caller's store knows what it holds). The daemon's
//! store (slots with links between them) makes room by the ledger's reference counts
//! ([`Ledger::refcount`]) and holds jobs back itself.

use std::collections::{BTreeMap, HashSet, VecDeque};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::{JobId, Ledger, LedgerError, Policy};
use crate::planner::{DependentSampler, DsaError, MAX_JOBS};

mod place;

/// What a job that runs ahead of the store does (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pace {
    /// Repeat the current view rather than evict what another job still needs.
    #[default]
    Wait,
    /// Evict in RefCnt order and go on.
    Evict,
}

/// One view of one job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct View {
    /// The job's epoch this view belongs to.
    pub epoch: u64,
    /// Sample ids, ascending.
    pub samples: Vec<u32>,
    /// Sum of their sizes.
    pub bytes: u64,
}

/// The answer of [`Cohort::prepare`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Delete `evict` from the store, fetch `fetch` from the tier; then the next view is ready.
    Stage {
        /// Samples of the next view not in the store yet.
        fetch: Vec<u32>,
        /// Samples to delete first, in eviction order.
        evict: Vec<u32>,
    },
    /// The next view was prepared already.
    Prepared,
    /// Making room would evict what another job still needs: repeat the current view.
    Wait,
}

/// Errors of a cohort, each naming the job.
#[derive(Debug, Error)]
pub enum CohortError {
    #[error("a job named {0:?} is already in this store")]
    DuplicateJob(String),
    #[error("no job named {0:?}")]
    UnknownJob(String),
    #[error("job {job:?}: sample {sample} is not in the catalog ({samples} samples)")]
    UnknownSample {
        job: String,
        sample: u32,
        samples: usize,
    },
    #[error("job {job:?}: sample {sample} is {size} bytes, more than its {view_bytes}-byte view")]
    SampleTooLarge {
        job: String,
        sample: u32,
        size: u64,
        view_bytes: u64,
    },
    #[error("job {job:?}: {source}")]
    Sampler { job: String, source: DsaError },
    #[error("job {job:?}: {source}")]
    Store { job: String, source: LedgerError },
    #[error("job {0:?} has no next view prepared")]
    NotPrepared(String),
    /// A saved place ([`Cohort::rejoin`]) that does not fit the job's dataset.
    #[error("job {job:?}: saved {field}: {reason}")]
    BadSaved {
        job: String,
        field: &'static str,
        reason: String,
    },
}

/// A job's place in a cohort, to save and restore (module docs, "Saving and restoring").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberState {
    /// The epoch whose views are being drawn (or were drawn last).
    pub drawing: u64,
    /// The samples of that epoch not drawn yet; `None` once it is all drawn.
    pub undrawn: Option<Vec<u32>>,
    /// The view being filled by the rounds.
    pub open: View,
    /// Views drawn and not prepared yet, in order.
    pub queue: Vec<View>,
    /// The view the job reads.
    pub current: Option<View>,
    /// Its prepared next view.
    pub next: Option<View>,
    /// The epoch the job reads.
    pub reading: u64,
    /// Reads it still owes, by sample ascending: one per epoch started and not read in yet,
    /// so up to `drawing - reading + 1` (what its views imply: `owed_by_place`).
    pub needs: Vec<(u32, u32)>,
}

struct Member {
    id: JobId,
    dataset: Vec<u32>,
    view_bytes: u64,
    /// The sampler index while this job draws an epoch.
    idx: Option<usize>,
    /// The epoch being drawn (the last one drawn when `idx` is `None`).
    drawing: u64,
    open: View,
    queue: VecDeque<View>,
    current: Option<View>,
    next: Option<View>,
    /// The epoch the job reads (its references are for this one).
    reading: u64,
    waiting: bool,
}

/// The jobs sharing one store (module docs).
pub struct Cohort {
    ledger: Ledger,
    sampler: DependentSampler,
    sizes: Vec<u64>,
    pace: Pace,
    /// The caller keeps the store (module docs, "Whose store").
    external: bool,
    members: BTreeMap<String, Member>,
    next_id: JobId,
}

/// What [`Cohort::members`] reports of one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberStatus {
    pub name: String,
    /// The epoch of its current view (of its first, before it has one).
    pub epoch: u64,
    /// Views drawn for it and not yet prepared.
    pub queued: usize,
    pub share: u64,
    pub waiting: bool,
}

fn empty(epoch: u64) -> View {
    View {
        epoch,
        samples: Vec::new(),
        bytes: 0,
    }
}

impl Cohort {
    /// A cohort over a store of `budget` bytes; `sizes[s]` is sample `s`'s footprint.
    pub fn new(budget: u64, sizes: Vec<u64>, seed: u64, pace: Pace) -> Self {
        Self {
            ledger: Ledger::new(budget, Policy::RefCnt),
            sampler: DependentSampler::new(seed, 0),
            sizes,
            pace,
            external: false,
            members: BTreeMap::new(),
            next_id: 0,
        }
    }

    /// A cohort whose store its caller keeps (module docs, "Whose store"): the ledger counts
    /// references, pins and shares over `budget` bytes, and models no staging.
    pub fn external(budget: u64, sizes: Vec<u64>, seed: u64) -> Self {
        Self {
            external: true,
            ..Self::new(budget, sizes, seed, Pace::Evict)
        }
    }

    /// The store's book.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// A job joins with its dataset and view bound; its share is `2 × view_bytes`.
    pub fn join(
        &mut self,
        name: &str,
        dataset: &[u32],
        view_bytes: u64,
    ) -> Result<(), CohortError> {
        if self.members.contains_key(name) {
            return Err(CohortError::DuplicateJob(name.to_string()));
        }
        // Counted here, not by the sampler alone: a job between epochs is out of the sampler,
        // and would find it full when it comes back.
        if self.members.len() >= MAX_JOBS {
            return Err(CohortError::Sampler {
                job: name.to_string(),
                source: DsaError::TooManyJobs {
                    jobs: self.members.len() + 1,
                    max: MAX_JOBS,
                },
            });
        }
        for &s in dataset {
            let size = *self
                .sizes
                .get(s as usize)
                .ok_or_else(|| CohortError::UnknownSample {
                    job: name.to_string(),
                    sample: s,
                    samples: self.sizes.len(),
                })?;
            if size > view_bytes {
                return Err(CohortError::SampleTooLarge {
                    job: name.to_string(),
                    sample: s,
                    size,
                    view_bytes,
                });
            }
        }
        let store = |source| CohortError::Store {
            job: name.to_string(),
            source,
        };
        let id = self.next_id;
        // Check the dataset (empty, repeats) before taking a share.
        let idx = self
            .sampler
            .add_job(dataset)
            .map_err(|source| CohortError::Sampler {
                job: name.to_string(),
                source,
            })?;
        if let Err(e) = self.ledger.join(id, view_bytes.saturating_mul(2)) {
            self.sampler.remove_job(idx);
            return Err(store(e));
        }
        self.ledger.need(id, dataset).map_err(store)?;
        self.next_id += 1;
        self.members.insert(
            name.to_string(),
            Member {
                id,
                dataset: dataset.to_vec(),
                view_bytes,
                idx: Some(idx),
                drawing: 0,
                open: empty(0),
                queue: VecDeque::new(),
                current: None,
                next: None,
                reading: 0,
                waiting: false,
            },
        );
        Ok(())
    }

    /// A job leaves (or is dropped): its references, pins and share are released.
    pub fn leave(&mut self, name: &str) -> Result<(), CohortError> {
        let m = self
            .members
            .remove(name)
            .ok_or_else(|| CohortError::UnknownJob(name.to_string()))?;
        if let Some(idx) = m.idx {
            self.sampler.remove_job(idx);
        }
        self.ledger
            .leave(m.id)
            .map_err(|source| CohortError::Store {
                job: name.to_string(),
                source,
            })
    }

    /// The job's current view (`None` before its first [`Cohort::advance`]).
    pub fn current(&self, name: &str) -> Option<&View> {
        self.members.get(name)?.current.as_ref()
    }

    /// The job's prepared next view, if any.
    pub fn next_view(&self, name: &str) -> Option<&View> {
        self.members.get(name)?.next.as_ref()
    }

    /// Samples the jobs other than `name` have drawn into views they have not reached yet
    /// (queued, open, or prepared next), of their epoch `epoch` only if given: what they will
    /// still read. A store that drops one of these makes that job fetch it again.
    pub fn drawn_ahead(&self, name: &str, epoch: Option<u64>) -> HashSet<u32> {
        self.drawn_ahead_by(name, epoch, |_| true)
    }

    /// [`Cohort::drawn_ahead`] of only the jobs `by` accepts.
    pub fn drawn_ahead_by(
        &self,
        name: &str,
        epoch: Option<u64>,
        by: impl Fn(&str) -> bool,
    ) -> HashSet<u32> {
        self.members
            .iter()
            .filter(|(n, _)| n.as_str() != name && by(n))
            .flat_map(|(_, m)| m.queue.iter().chain([&m.open]).chain(m.next.as_ref()))
            .filter(|v| epoch.is_none_or(|e| v.epoch == e))
            .flat_map(|v| v.samples.iter().copied())
            .collect()
    }

    /// Every job, by name.
    pub fn members(&self) -> Vec<MemberStatus> {
        self.members
            .iter()
            .map(|(name, m)| MemberStatus {
                name: name.clone(),
                epoch: m.current.as_ref().map_or(m.reading, |v| v.epoch),
                queued: m.queue.len(),
                share: self.ledger.share(m.id).unwrap_or(0),
                waiting: m.waiting,
            })
            .collect()
    }

    /// Prepares the job's next view: draws it if needed, pins it, and says what to fetch and
    /// evict, or to wait (module docs, "Pace").
    pub fn prepare(&mut self, name: &str) -> Result<Next, CohortError> {
        let m = self
            .members
            .get(name)
            .ok_or_else(|| CohortError::UnknownJob(name.to_string()))?;
        if m.next.is_some() {
            return Ok(Next::Prepared);
        }
        self.draw_for(name)?;
        let store = |source| CohortError::Store {
            job: name.to_string(),
            source,
        };
        let m = &self.members[name];
        let (id, view) = (m.id, m.queue.front().expect("drawn").clone());
        let pins: Vec<(u32, u64)> = view
            .samples
            .iter()
            .map(|&s| (s, self.sizes[s as usize]))
            .collect();
        self.ledger.pin(id, &pins).map_err(store)?;
        if self.external {
            let m = self.members.get_mut(name).expect("present");
            m.next = m.queue.pop_front();
            m.waiting = false;
            return Ok(Next::Stage {
                fetch: view.samples,
                evict: Vec::new(),
            });
        }
        let fetch: Vec<u32> = view
            .samples
            .iter()
            .copied()
            .filter(|&s| !self.ledger.is_staged(s))
            .collect();
        let bytes: u64 = fetch.iter().map(|&s| self.sizes[s as usize]).sum();
        if self.pace == Pace::Wait {
            let victims = self.ledger.would_evict(bytes);
            let others_needed = !victims.is_empty() && {
                let drawn: HashSet<u32> = self
                    .members
                    .iter()
                    .filter(|(n, _)| n.as_str() != name)
                    .flat_map(|(_, o)| o.queue.iter().chain([&o.open]))
                    .flat_map(|v| v.samples.iter().copied())
                    .collect();
                victims.iter().any(|s| drawn.contains(s))
            };
            let someone_moves = self.members.iter().any(|(n, o)| n != name && !o.waiting);
            if others_needed && someone_moves {
                let samples: Vec<u32> = pins.iter().map(|p| p.0).collect();
                // Keep the pins of the current view: unpin only what the next view added.
                let keep: Vec<u32> = self.members[name]
                    .current
                    .as_ref()
                    .map(|v| v.samples.clone())
                    .unwrap_or_default();
                let drop: Vec<u32> = samples
                    .into_iter()
                    .filter(|s| keep.binary_search(s).is_err())
                    .collect();
                self.ledger.unpin(id, &drop).map_err(store)?;
                self.members.get_mut(name).expect("present").waiting = true;
                return Ok(Next::Wait);
            }
        }
        let mut evict = Vec::new();
        for &s in &fetch {
            evict.extend(
                self.ledger
                    .stage(s, self.sizes[s as usize])
                    .map_err(store)?
                    .evicted,
            );
        }
        let m = self.members.get_mut(name).expect("present");
        m.next = m.queue.pop_front();
        m.waiting = false;
        Ok(Next::Stage { fetch, evict })
    }

    /// The job is done with its current view and switches to the prepared next one, which it
    /// returns.
    pub fn advance(&mut self, name: &str) -> Result<&View, CohortError> {
        let store = |source| CohortError::Store {
            job: name.to_string(),
            source,
        };
        let m = self
            .members
            .get_mut(name)
            .ok_or_else(|| CohortError::UnknownJob(name.to_string()))?;
        let next = m
            .next
            .take()
            .ok_or_else(|| CohortError::NotPrepared(name.to_string()))?;
        let id = m.id;
        let old = m.current.replace(next);
        m.reading = m.current.as_ref().expect("just set").epoch;
        if let Some(old) = old {
            for &s in &old.samples {
                self.ledger.touch(s);
            }
            self.ledger.consumed(id, &old.samples).map_err(store)?;
            // Unpin what the new current view does not hold.
            let cur = &self.members[name].current.as_ref().expect("set").samples;
            let drop: Vec<u32> = old
                .samples
                .iter()
                .copied()
                .filter(|s| cur.binary_search(s).is_err())
                .collect();
            self.ledger.unpin(id, &drop).map_err(store)?;
        }
        Ok(self.members[name].current.as_ref().expect("set"))
    }

    /// Draws rounds until `name` has a view in its queue.
    fn draw_for(&mut self, name: &str) -> Result<(), CohortError> {
        let sampler_err = |source| CohortError::Sampler {
            job: name.to_string(),
            source,
        };
        loop {
            let m = self.members.get_mut(name).expect("checked");
            if !m.queue.is_empty() {
                return Ok(());
            }
            if m.idx.is_none() {
                // Its epoch is all drawn: it starts drawing its next one, and so does every
                // other job that has drawn all of its current epoch, so that jobs at the same
                // pace draw their next epochs together (a job drawing ahead holds references
                // for both epochs).
                let idle: Vec<String> = self
                    .members
                    .iter()
                    .filter(|(_, m)| m.idx.is_none())
                    .map(|(n, _)| n.clone())
                    .collect();
                for n in idle {
                    let m = self.members.get_mut(&n).expect("member");
                    m.drawing += 1;
                    m.idx = Some(self.sampler.add_job(&m.dataset).map_err(sampler_err)?);
                    m.open = empty(m.drawing);
                    let (id, dataset) = (m.id, m.dataset.clone());
                    self.ledger
                        .need(id, &dataset)
                        .map_err(|source| CohortError::Store {
                            job: n.clone(),
                            source,
                        })?;
                }
            }
            // The jobs drawing stay the same until one of them has drawn its whole epoch, so
            // the bookkeeping for a round is built once for a run of rounds.
            let drawing: Vec<(String, usize)> = self
                .members
                .iter()
                .filter_map(|(n, m)| m.idx.map(|i| (n.clone(), i)))
                .collect();
            let idx: Vec<usize> = drawing.iter().map(|d| d.1).collect();
            let mut owner = [usize::MAX; MAX_JOBS];
            for (k, &i) in idx.iter().enumerate() {
                owner[i] = k;
            }
            loop {
                let picks = self.sampler.draw(&idx).map_err(sampler_err)?;
                let overflow = picks.iter().any(|&(i, s)| {
                    let m = &self.members[&drawing[owner[i]].0];
                    m.open.bytes + self.sizes[s as usize] > m.view_bytes
                });
                if overflow {
                    for m in self.members.values_mut() {
                        if !m.open.samples.is_empty() {
                            let epoch = m.open.epoch;
                            let mut v = std::mem::replace(&mut m.open, empty(epoch));
                            v.samples.sort_unstable();
                            m.queue.push_back(v);
                        }
                    }
                }
                for &(i, s) in &picks {
                    let size = self.sizes[s as usize];
                    let m = self.members.get_mut(&drawing[owner[i]].0).expect("member");
                    m.open.samples.push(s);
                    m.open.bytes += size;
                }
                let finished = idx.iter().any(|&i| self.sampler.remaining(i) == 0);
                if finished || !self.members[name].queue.is_empty() {
                    break;
                }
            }
            // A job that has drawn its whole epoch closes its last view and leaves the sampler.
            for (n, i) in &drawing {
                if self.sampler.remaining(*i) == 0 {
                    let m = self.members.get_mut(n).expect("member");
                    let epoch = m.open.epoch;
                    let mut v = std::mem::replace(&mut m.open, empty(epoch));
                    if !v.samples.is_empty() {
                        v.samples.sort_unstable();
                        m.queue.push_back(v);
                    }
                    self.sampler.remove_job(*i);
                    m.idx = None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
