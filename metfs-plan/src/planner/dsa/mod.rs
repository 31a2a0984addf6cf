//! Dependent sampling (DSA, paper 004, Algorithms 1–2): several jobs over overlapping datasets
//! draw their epoch orders together, so that a sample two jobs share is drawn by both in the
//! same *round* (and so lands in the same mini-epoch of both and is staged once), while each
//! job's own order stays a uniformly random permutation of its own dataset (Theorem 2).
//!
//! # Rounds
//!
//! Each job keeps the set `R_j` of samples it has not drawn yet this epoch. In a round, every
//! job taking part draws one sample of its `R_j`:
//!
//! 1. The jobs are sorted by `|R_j|`, ascending (ties by job index). `S ← ∅`.
//! 2. *Selecting* (Algorithm 1, corrected below). While undecided jobs remain:
//!    `I ← ⋂ R_j ∖ S` over them and `c ← |I|`. In sorted order, each job takes `I` with
//!    probability `c / (|R_j| − |S|)` and then sets `c ← |R_j| − |S|`; the first job that
//!    declines stops the loop. The jobs that took `I` share **one** uniform draw from `I`
//!    (Algorithm 2, shared sampling). If no job took `I`, the first undecided job draws
//!    uniformly from `R_1 ∖ (S ∪ I)` alone. Then `S ← S ∪ I`.
//! 3. Once every job has decided, each removes what it drew from its `R_j` (removing a shared
//!    draw at once would shrink `S` for the later loops of the same round). A sample one job drew stays in the other
//!    jobs' sets (the paper's *compensation*), so each job still draws every sample of its
//!    dataset exactly once per epoch.
//!
//! Once a job declines `I`, every later job in the sorted order declines it too, so the
//! undecided jobs are always a suffix of the sorted order; this is why the intersections worth
//! computing are those of suffixes, the vertices of the dependent sampling tree
//! ([`SamplingTree`], Definition 1).
//!
//! # The two corrections to the printed Algorithm 1
//!
//! Lemma 2 (appendix D.3) says a job enters a loop with probability `(|D| − |S|)/|D|`, so to
//! draw `I` with the right marginal `|I|/|D|` it must take `I` with probability
//! `|I|/(|D| − |S|)` *given* that it entered. Along the sorted jobs that is the chain
//! `c/(|D_1|−|S|) · (|D_1|−|S|)/(|D_2|−|S|) · …`, so after the first job the numerator must
//! be `c = |D_j| − |S|`. The printed line 13 sets `c ← |D|`, which makes the chain
//! `|I|/(|D_1|−|S|) · |D_1|/(|D_2|−|S|)`: too large once `S` is not empty, so later jobs take
//! shared samples too often and their orders are no longer uniform.
//!
//! When no job takes `I`, the printed line 17 has the first job draw from `D_1 ∖ I`. But `S`
//! holds the intersections of earlier loops that this job already declined; drawing them again
//! here gives them extra weight. Its draw must come from `D_1 ∖ (S ∪ I)`, of size
//! `|D_1| − |S| − |I|`; then every sample of `D_1` has probability exactly `1/|D_1|`.
//!
//! The tests check both: each job's order is a uniformly random permutation (chi-square over
//! the permutations, fixed seeds), and the printed rule (kept, test-only, as [`Rule::Printed`])
//! fails the same test.
//!
//! # Determinism and cost
//!
//! All randomness comes from the planner's `PlanRng` seeded by `(seed, epoch)`; each
//! acceptance test is exact integer arithmetic (`below(d) < c`, no draw when `c = 0` or
//! `c ≥ d` settles it), so the same inputs and calls give the same orders everywhere.
//!
//! A sample's *level*, for the jobs of a round in their sorted order `σ`, is the smallest `u`
//! such that every job of `σ[u..]` still needs it (one more than the position of the last job
//! of `σ` that does not; 0 when all do). The samples of level `u` are the `u`-th vertex of the
//! left spine of the dependent sampling tree ([`SamplingTree`]), and the sampler keeps them
//! in one list per level (a *group*, named by that last job, so that a job's position can
//! change without touching the samples). Then `|⋂ R_j|` over a suffix `σ[u..]` is a prefix sum
//! of the group sizes, `I` is a run of consecutive groups, and `R_1 ∖ (S ∪ I)` is the samples
//! of `R_1` above level `u` (the paper's right leaf, never built): a draw from it takes a
//! uniform sample of `R_1` and, unless `S ∪ I` is empty, tries again while the sample is at
//! level `u` or below. Each job keeps its samples as a bitmap with counts per block, so that
//! the `r`-th is found in a few cache lines. A draw raises the sample's level at most to its
//! highest taker's. So a round costs `O(1)` per selected sample, whatever the number of
//! samples and of distinct sets of jobs, once its jobs are sorted: `O(jobs · log jobs)` when
//! their order changed since the last round, `O(jobs)` to see that it did not. (Buckets of
//! samples by their set of jobs, the paper's bitmaps, would be summed in every loop,
//! `O(jobs · buckets)` a round, and with many jobs over random subsets nearly every sample has
//! a set of its own.) A job draws alone with probability `|R_1 ∖ (S ∪ I)| / (|R_1| − |S|)`
//! and then takes `|R_1| / |R_1 ∖ (S ∪ I)|` tries on average: `|R_1| / (|R_1| − |S|)` per loop,
//! 1 when `S` is empty. With many jobs over random subsets, the jobs of all but the last few
//! loops of a round have nothing in common and draw alone from all their samples; a round
//! makes those draws first and reads their bitmaps together, so that the reads overlap.
//!
//! The groups are built for the last round's `σ`. A job leaving `σ` (it finished, left, or sits
//! a round out) regroups only its own group's samples (or all, if that group is large); any
//! other change (a job joining, or the order of the others changing, as rounds for some of
//! the jobs do) rebuilds the groups from the jobs' bitmaps, 64 samples at a time. When every
//! job draws in every round, as the cohort and [`dependent_orders`] have them, `σ` only changes
//! when a job joins or finishes. Memory: a bit per sample and job, and some 30 bytes per
//! sample. At most [`MAX_JOBS`] jobs share one sampler.
//!
//! # Views
//!
//! [`dependent_views`] cuts the jobs' joint orders into mini-epochs at the *same* rounds for
//! every job (a cut is made when any job's next sample would overflow its view), so a sample
//! two jobs drew in one round is in the same mini-epoch of both. Jobs whose datasets end
//! earlier simply have fewer mini-epochs.

use std::collections::HashMap;

use thiserror::Error;

use super::rng::PlanRng;
use super::MiniEpoch;
use column::{select_in_line, Column, BLOCK};

mod column;
mod tree;

pub use tree::SamplingTree;

/// The most jobs one sampler holds (and the tests draw with): twice the 128 datasets of paper
/// 004's cost test. A shared mount's `share.jobs` is bounded by it.
pub const MAX_JOBS: usize = 256;

/// Errors of dependent sampling, each naming the job (its index in the caller's list).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DsaError {
    /// More jobs than a sampler holds.
    #[error("{jobs} jobs is more than the {max} one sampler can hold")]
    TooManyJobs { jobs: usize, max: usize },
    /// A job's dataset is empty.
    #[error("job {job}: its dataset has no samples")]
    EmptyDataset { job: usize },
    /// A job's dataset names one sample twice.
    #[error("job {job}: sample {sample} appears twice in its dataset")]
    Duplicate { job: usize, sample: u32 },
    /// A round named a job that is not in the sampler, or has drawn all its samples.
    #[error("job {job} has nothing left to draw this epoch (or is not in the sampler)")]
    Exhausted { job: usize },
    /// A round named the same job twice.
    #[error("job {job} is named twice in one round")]
    RepeatedJob { job: usize },
    /// A sample is bigger than the job's view may hold.
    #[error("job {job}: sample {sample} is {size} bytes, more than its {view_bytes}-byte view")]
    SampleTooLarge {
        job: usize,
        sample: u32,
        size: u64,
        view_bytes: u64,
    },
    /// A sample id has no size.
    #[error("job {job}: sample {sample} is not in the catalog ({samples} samples)")]
    UnknownSample {
        job: usize,
        sample: u32,
        samples: usize,
    },
    /// `view_bytes` does not have one entry per job.
    #[error("{datasets} datasets but {views} view sizes")]
    LengthMismatch { datasets: usize, views: usize },
}

/// Which selecting rule a sampler follows. Only the corrected rule is public; the printed one
/// exists so that a test can show it is not uniform.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rule {
    /// Algorithm 1 with both corrections (module docs).
    Corrected,
    /// Algorithm 1 as printed: `c ← |D|` and the lone draw from `D_1 ∖ I`.
    #[cfg(test)]
    Printed,
}

/// The group of the samples every job of the order needs (level 0); job `j`'s is `1 + j`.
const ALL: u16 = 0;
/// The group of a sample no job needs any more (in no list).
const GONE: u16 = u16::MAX;
/// The rank of a job that is not in the order.
const NO_RANK: u32 = u32::MAX;

/// What the sampler keeps of one local sample, together so that a draw reads it at once.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// Its id.
    id: u32,
    /// Its group: [`ALL`], `1 + j` when `j` is the last job of the order that no longer needs
    /// it, or [`GONE`].
    group: u16,
    /// Jobs that still need it.
    jobs: u16,
    /// Its position in its group's list.
    pos: u32,
}

/// The state of one epoch's dependent sampling over several jobs; see the module docs.
pub struct DependentSampler {
    rng: PlanRng,
    rule: Rule,
    /// Sample id → local index.
    local: HashMap<u32, u32>,
    /// Local index → the sample.
    samples: Vec<Sample>,
    /// Job index → its samples not drawn yet; `None` for a free index.
    jobs: Vec<Option<Column>>,
    /// The jobs the groups are built for, in a round's order (ascending remaining, ties by
    /// index).
    order: Vec<usize>,
    /// Job index → its position in `order`, [`NO_RANK`] when not in it.
    rank: Vec<u32>,
    /// Group → its samples; a job not in `order` has an empty group.
    groups: Vec<Vec<u32>>,
    /// Rounds drawn, and job index → the last round that named it.
    round: u64,
    seen: Vec<u64>,
}

impl DependentSampler {
    /// An empty sampler for `epoch`; its draws depend only on `(seed, epoch)` and the calls
    /// made on it.
    pub fn new(seed: u64, epoch: u64) -> Self {
        Self::with_rule(seed, epoch, Rule::Corrected)
    }

    pub(super) fn with_rule(seed: u64, epoch: u64, rule: Rule) -> Self {
        Self {
            rng: super::rng::stream(seed ^ 0x4453_415F_4A4F_4253, epoch),
            rule,
            local: HashMap::new(),
            samples: Vec::new(),
            jobs: Vec::new(),
            order: Vec::new(),
            rank: Vec::new(),
            groups: vec![Vec::new()],
            round: 0,
            seen: Vec::new(),
        }
    }

    /// Adds a job that will draw every sample of `dataset` once; returns its index (the lowest
    /// free one). Errors: [`DsaError::TooManyJobs`], [`DsaError::EmptyDataset`],
    /// [`DsaError::Duplicate`]; on error nothing changes.
    pub fn add_job(&mut self, dataset: &[u32]) -> Result<usize, DsaError> {
        let job = match self.jobs.iter().position(Option::is_none) {
            Some(j) => j,
            None if self.jobs.len() < MAX_JOBS => self.jobs.len(),
            None => {
                return Err(DsaError::TooManyJobs {
                    jobs: MAX_JOBS + 1,
                    max: MAX_JOBS,
                })
            }
        };
        if dataset.is_empty() {
            return Err(DsaError::EmptyDataset { job });
        }
        let mut sorted = dataset.to_vec();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(DsaError::Duplicate { job, sample: w[0] });
        }
        if job == self.jobs.len() {
            self.jobs.push(None);
            self.rank.push(NO_RANK);
            self.groups.push(Vec::new());
            self.seen.push(0);
        }
        // The job is not in the order yet: a sample only it needs is above every job there.
        let outside = self.order.last().map_or(ALL, |&j| group_of(j));
        let mut locals = sorted;
        for l in locals.iter_mut() {
            let s = *l;
            *l = match self.local.get(&s) {
                Some(&l) => l,
                None => {
                    let l = self.samples.len() as u32;
                    self.local.insert(s, l);
                    self.samples.push(Sample {
                        id: s,
                        group: GONE,
                        jobs: 0,
                        pos: 0,
                    });
                    l
                }
            };
            if self.samples[*l as usize].jobs == 0 {
                self.regroup(*l, outside);
            }
            self.samples[*l as usize].jobs += 1;
        }
        self.jobs[job] = Some(Column::of(&locals));
        Ok(job)
    }

    /// Removes a job (it finished or left); its index becomes free. Samples only it still
    /// needed leave the sampler.
    pub fn remove_job(&mut self, job: usize) {
        let Some(gone) = self.jobs.get_mut(job).and_then(Option::take) else {
            return;
        };
        for l in gone.iter() {
            self.samples[l as usize].jobs -= 1;
            if self.samples[l as usize].jobs == 0 {
                self.regroup(l, GONE);
            }
        }
        if self.rank[job] != NO_RANK {
            self.leave_order(job);
        }
    }

    /// How many samples `job` has not drawn yet this epoch (0 for an unknown job).
    pub fn remaining(&self, job: usize) -> u64 {
        self.jobs
            .get(job)
            .and_then(Option::as_ref)
            .map_or(0, |c| c.len)
    }

    /// The samples `job` has not drawn yet this epoch, ascending by id (none for an unknown
    /// job): what a saved cohort gives back to [`DependentSampler::add_job`] after a restart.
    pub fn undrawn(&self, job: usize) -> Vec<u32> {
        let Some(Some(c)) = self.jobs.get(job) else {
            return Vec::new();
        };
        let mut ids: Vec<u32> = c.iter().map(|l| self.samples[l as usize].id).collect();
        ids.sort_unstable();
        ids
    }

    /// One round: each of `jobs` draws one sample it has not drawn yet. Returns
    /// `(job, sample id)` pairs in the order the jobs decided (jobs that shared a draw are
    /// adjacent). Errors: [`DsaError::Exhausted`], [`DsaError::RepeatedJob`].
    pub fn draw(&mut self, jobs: &[usize]) -> Result<Vec<(usize, u32)>, DsaError> {
        if let Some(&j) = jobs.iter().find(|&&j| self.remaining(j) == 0) {
            return Err(DsaError::Exhausted { job: j });
        }
        self.round += 1;
        for &j in jobs {
            if std::mem::replace(&mut self.seen[j], self.round) == self.round {
                return Err(DsaError::RepeatedJob { job: j });
            }
        }
        let order = self.round_order(jobs);
        let n = order.len();
        let sup = self.suffix_sizes(&order);
        // Draws are applied only after every job has decided: the sets the loops see (S, I and
        // each |R_j|) are those at the start of the round. Each entry: the sample and the
        // range of `order` that took it.
        let mut taken: Vec<(u32, usize, usize)> = Vec::with_capacity(n);
        // The jobs whose suffix has no sample in common (all but the last few of many jobs over
        // random subsets) each decline an empty I without a draw and draw alone from all their
        // samples: the draws the loop below would make, in its order. They are made first,
        // then the bitmap lines they fall in are read, then searched, so that the reads, which
        // do not wait on one another, overlap (the same for the samples' own records below).
        let alone = sup.iter().take_while(|&&x| x == 0).count();
        let spots: Vec<(usize, u32)> = order[..alone]
            .iter()
            .map(|&j| {
                let r = self.rng.below(self.remaining(j) as u32);
                self.column(j).locate(u64::from(r))
            })
            .collect();
        let lines: Vec<[u64; BLOCK]> = order
            .iter()
            .zip(&spots)
            .map(|(&j, &(b, _))| self.column(j).block(b))
            .collect();
        for (u, (line, (b, r))) in lines.iter().zip(spots).enumerate() {
            taken.push((select_in_line(line, b, r), u, u + 1));
        }
        // The previous loop's first job: S is everything of its level or below (the undecided
        // jobs only shrink, so every earlier loop's intersection lies in the latest one's).
        let mut prev = alone.checked_sub(1);
        let mut u = alone;
        while u < n {
            let here = u;
            let s = prev.map_or(0, |p| sup[p]);
            let sup_t = sup[here];
            let i_len = sup_t - s;
            let mut c = i_len;
            let mut k = here;
            while k < n {
                let rem = self.remaining(order[k]);
                let d = rem - s;
                debug_assert!(d > 0, "a sorted undecided job has samples outside S");
                let takes = c >= d || (c > 0 && u64::from(self.rng.below(d as u32)) < c);
                if !takes {
                    break;
                }
                c = match self.rule {
                    Rule::Corrected => d,
                    #[cfg(test)]
                    Rule::Printed => rem,
                };
                k += 1;
            }
            let l = if k > here {
                // I = the levels above S's, up to this loop's: the groups of order[p..here],
                // after the samples every job needs in the first loop.
                let l = self.pick_grouped(prev.is_none(), prev.unwrap_or(0), here, i_len);
                u = k;
                l
            } else {
                let j = order[here];
                let rem = self.remaining(j);
                let level = here as u32;
                let l = match self.rule {
                    // R_1 ∖ (S ∪ I): its samples above this loop's level.
                    Rule::Corrected => {
                        self.pick_own(j, rem - sup_t, sup_t == 0, |me, l| me.level(l) > level)
                    }
                    #[cfg(test)]
                    Rule::Printed => {
                        let low = prev.map(|p| p as u32);
                        self.pick_own(j, rem - i_len, i_len == 0, |me, l| {
                            let v = me.level(l);
                            !(v <= level && low.is_none_or(|p| v > p))
                        })
                    }
                };
                u += 1;
                l
            };
            taken.push((l, here, u));
            prev = Some(here);
        }
        Ok(self.apply(&order, taken))
    }

    /// The round's jobs sorted by samples left (ties by index), the sampler's order kept in
    /// step. When every job draws in every round the order stays sorted: checked in O(jobs),
    /// which keeps a round's cost linear in its jobs.
    fn round_order(&mut self, jobs: &[usize]) -> Vec<usize> {
        let key = |j: usize| (self.remaining(j), j);
        let same = jobs.len() == self.order.len()
            && jobs.iter().all(|&j| self.rank[j] != NO_RANK)
            && self.order.windows(2).all(|w| key(w[0]) < key(w[1]));
        if same {
            self.order.clone()
        } else {
            let mut order = jobs.to_vec();
            order.sort_unstable_by_key(|&j| key(j));
            self.sync(&order);
            order
        }
    }

    /// `sup[u]` = |⋂ R_j| over `order[u..]`: the samples of level `u` or below.
    fn suffix_sizes(&self, order: &[usize]) -> Vec<u64> {
        let mut sup = Vec::with_capacity(order.len());
        let mut below = self.groups[ALL as usize].len() as u64;
        for &j in order {
            sup.push(below);
            below += self.groups[group_of(j) as usize].len() as u64;
        }
        sup
    }

    /// Applies a round's draws, all decided first: each entry of `taken` is a sample and the
    /// range of `order` that took it. Returns each job's pick.
    fn apply(&mut self, order: &[usize], taken: Vec<(u32, usize, usize)>) -> Vec<(usize, u32)> {
        let mut picks = Vec::with_capacity(order.len());
        for &(l, from, to) in &taken {
            let id = self.samples[l as usize].id;
            picks.extend(order[from..to].iter().map(|&j| (j, id)));
        }
        for (l, from, to) in taken {
            self.take(l, &order[from..to]);
        }
        picks
    }

    fn needs(&self, l: u32, job: usize) -> bool {
        self.jobs[job].as_ref().is_some_and(|c| c.contains(l))
    }

    fn column(&self, job: usize) -> &Column {
        self.jobs[job].as_ref().expect("a drawing job")
    }

    /// The level of local sample `l`, which some job still needs.
    fn level(&self, l: u32) -> u32 {
        match self.samples[l as usize].group {
            ALL => 0,
            g => {
                let r = self.rank[g as usize - 1];
                debug_assert!(r != NO_RANK, "a sample's group is a job in the order");
                r + 1
            }
        }
    }

    /// The group local sample `l` would have if only `order[..before]` were considered:
    /// that of the last of them that does not need it.
    fn last_missing(&self, l: u32, before: usize) -> u16 {
        self.order[..before]
            .iter()
            .rev()
            .find(|&&j| !self.needs(l, j))
            .map_or(ALL, |&j| group_of(j))
    }

    /// Moves local sample `l` into group `g` (out of every group for [`GONE`]).
    fn regroup(&mut self, l: u32, g: u16) {
        let old = self.samples[l as usize].group;
        if old == g {
            return;
        }
        if old != GONE {
            let list = &mut self.groups[old as usize];
            let p = self.samples[l as usize].pos as usize;
            list.swap_remove(p);
            if let Some(&moved) = list.get(p) {
                self.samples[moved as usize].pos = p as u32;
            }
        }
        if g != GONE {
            let list = &mut self.groups[g as usize];
            self.samples[l as usize].pos = list.len() as u32;
            list.push(l);
        }
        self.samples[l as usize].group = g;
    }

    /// Makes the groups those of `want` (sorted as a round sorts its jobs); module docs.
    fn sync(&mut self, want: &[usize]) {
        if self.order == want {
            return;
        }
        let mut wanted = vec![false; self.jobs.len()];
        for &j in want {
            wanted[j] = true;
        }
        let stay = self.order.iter().copied().filter(|&j| wanted[j]);
        if stay.eq(want.iter().copied()) {
            let leaving: Vec<usize> = self.order.iter().copied().filter(|&j| !wanted[j]).collect();
            for j in leaving {
                self.leave_order(j);
            }
        } else {
            self.rebuild(want);
        }
    }

    /// Takes `job` out of the order: only the samples it was the last to miss move, down to
    /// the last job before it that misses them (or all are regrouped, if they are many).
    fn leave_order(&mut self, job: usize) {
        let p = self.rank[job] as usize;
        if self.groups[group_of(job) as usize].len() > 64 + self.samples.len() / 8 {
            let mut order = self.order.clone();
            order.remove(p);
            self.rebuild(&order);
            return;
        }
        self.order.remove(p);
        self.rank[job] = NO_RANK;
        for (k, &j) in self.order.iter().enumerate().skip(p) {
            self.rank[j] = k as u32;
        }
        let members = std::mem::take(&mut self.groups[group_of(job) as usize]);
        for l in members {
            self.samples[l as usize].group = GONE;
            let g = self.last_missing(l, p);
            self.regroup(l, g);
        }
    }

    /// Builds the groups of `order` from the jobs' bitmaps, 64 samples at a time: from the
    /// last job down, each takes the samples still unplaced that it does not need.
    fn rebuild(&mut self, order: &[usize]) {
        for &j in &self.order {
            self.rank[j] = NO_RANK;
        }
        self.order = order.to_vec();
        for (k, &j) in order.iter().enumerate() {
            self.rank[j] = k as u32;
        }
        for g in &mut self.groups {
            g.clear();
        }
        let mut unplaced = vec![0u64; self.samples.len().div_ceil(64)];
        for (l, s) in self.samples.iter_mut().enumerate() {
            if s.jobs > 0 {
                unplaced[l / 64] |= 1 << (l % 64);
            }
            s.group = GONE;
        }
        for &j in order.iter().rev() {
            let column = self.jobs[j].as_ref().expect("a job in the order");
            let mut left = false;
            for (w, u) in unplaced.iter_mut().enumerate() {
                let missing = *u & !column.bits.get(w).copied().unwrap_or(0);
                if missing != 0 {
                    place(&mut self.samples, &mut self.groups, w, missing, group_of(j));
                    *u &= !missing;
                }
                left |= *u != 0;
            }
            if !left {
                return;
            }
        }
        for (w, &u) in unplaced.iter().enumerate() {
            place(&mut self.samples, &mut self.groups, w, u, ALL);
        }
    }

    /// A uniform draw from the groups of `order[from..to]`, after [`ALL`]'s if `all`; they
    /// hold `n > 0` samples.
    fn pick_grouped(&mut self, all: bool, from: usize, to: usize, n: u64) -> u32 {
        debug_assert!(n > 0);
        let mut r = u64::from(self.rng.below(n as u32));
        let groups = all
            .then_some(ALL)
            .into_iter()
            .chain(self.order[from..to].iter().map(|&j| group_of(j)));
        for g in groups {
            let list = &self.groups[g as usize];
            let len = list.len() as u64;
            if r < len {
                return list[r as usize];
            }
            r -= len;
        }
        unreachable!("the count of matching samples was computed from the same groups")
    }

    /// A uniform draw among `job`'s samples that pass `keep`, of which there are `n > 0`;
    /// all of them pass if `every`, else by rejection.
    fn pick_own(
        &mut self,
        job: usize,
        n: u64,
        every: bool,
        keep: impl Fn(&Self, u32) -> bool,
    ) -> u32 {
        debug_assert!(n > 0);
        let len = self.remaining(job);
        if every {
            let r = self.rng.below(len as u32);
            return self.column(job).select(u64::from(r));
        }
        // Eight times the expected tries fail once in about 3,000 draws; a scan then settles
        // it, so that a count that disagreed with the sets would fail here, not spin.
        for _ in 0..64 + 8 * len / n {
            let r = self.rng.below(len as u32);
            let l = self.column(job).select(u64::from(r));
            if keep(self, l) {
                return l;
            }
        }
        let r = self.rng.below(n as u32) as usize;
        self.column(job)
            .iter()
            .filter(|&l| keep(self, l))
            .nth(r)
            .expect("the count of matching samples was computed from the same sets")
    }

    /// The jobs `takers` (all in the order) have drawn local sample `l`.
    fn take(&mut self, l: u32, takers: &[usize]) {
        let mut top = (0, ALL);
        for &j in takers {
            self.jobs[j].as_mut().expect("a drawing job").remove(l);
            let level = self.rank[j] + 1;
            if level > top.0 {
                top = (level, group_of(j));
            }
        }
        let s = &mut self.samples[l as usize];
        s.jobs -= takers.len() as u16;
        if s.jobs == 0 {
            self.regroup(l, GONE);
        } else if top.0 > self.level(l) {
            self.regroup(l, top.1);
        }
    }
}

/// Job `j`'s group.
fn group_of(j: usize) -> u16 {
    1 + j as u16
}

/// Puts the samples of word `w` set in `bits` into group `g`, in ascending order.
fn place(samples: &mut [Sample], groups: &mut [Vec<u32>], w: usize, mut bits: u64, g: u16) {
    while bits != 0 {
        let l = w * 64 + bits.trailing_zeros() as usize;
        bits &= bits - 1;
        samples[l].group = g;
        samples[l].pos = groups[g as usize].len() as u32;
        groups[g as usize].push(l as u32);
    }
}

/// Each job's order of `epoch`: all jobs draw in every round until each has drawn its whole
/// dataset. `orders[j]` is a permutation of `datasets[j]`; a sample two jobs share is often at
/// the same position in both (always, for equal datasets).
pub fn dependent_orders(
    datasets: &[&[u32]],
    seed: u64,
    epoch: u64,
) -> Result<Vec<Vec<u32>>, DsaError> {
    let mut orders: Vec<Vec<u32>> = datasets
        .iter()
        .map(|d| Vec::with_capacity(d.len()))
        .collect();
    joint_rounds(datasets, seed, epoch, Rule::Corrected, |picks| {
        for &(j, s) in picks {
            orders[j].push(s);
        }
    })?;
    Ok(orders)
}

/// Runs the rounds of `dependent_orders`, handing each round's picks to `round`.
pub(super) fn joint_rounds(
    datasets: &[&[u32]],
    seed: u64,
    epoch: u64,
    rule: Rule,
    mut round: impl FnMut(&[(usize, u32)]),
) -> Result<(), DsaError> {
    if datasets.len() > MAX_JOBS {
        return Err(DsaError::TooManyJobs {
            jobs: datasets.len(),
            max: MAX_JOBS,
        });
    }
    let mut sampler = DependentSampler::with_rule(seed, epoch, rule);
    for (j, d) in datasets.iter().enumerate() {
        // Indices are handed out in order, so job j gets index j.
        let got = sampler.add_job(d).map_err(|e| match e {
            DsaError::EmptyDataset { .. } => DsaError::EmptyDataset { job: j },
            DsaError::Duplicate { sample, .. } => DsaError::Duplicate { job: j, sample },
            other => other,
        })?;
        debug_assert_eq!(got, j);
    }
    let mut active: Vec<usize> = (0..datasets.len()).collect();
    while !active.is_empty() {
        let picks = sampler.draw(&active)?;
        round(&picks);
        active.retain(|&j| sampler.remaining(j) > 0);
    }
    Ok(())
}

/// Each job's mini-epochs of `epoch` (`views[j]`), cut from the joint orders at the same rounds
/// for every job: a round whose sample would push any job's view past its `view_bytes[j]`
/// starts a new mini-epoch for every job. Samples in a mini-epoch are ascending by id, as in
/// [`super::plan_epoch`]. The mini-epochs of one job partition its dataset.
pub fn dependent_views(
    datasets: &[&[u32]],
    sizes: &[u64],
    view_bytes: &[u64],
    seed: u64,
    epoch: u64,
) -> Result<Vec<Vec<MiniEpoch>>, DsaError> {
    if datasets.len() != view_bytes.len() {
        return Err(DsaError::LengthMismatch {
            datasets: datasets.len(),
            views: view_bytes.len(),
        });
    }
    for (j, d) in datasets.iter().enumerate() {
        for &s in d.iter() {
            let size = *sizes.get(s as usize).ok_or(DsaError::UnknownSample {
                job: j,
                sample: s,
                samples: sizes.len(),
            })?;
            if size > view_bytes[j] {
                return Err(DsaError::SampleTooLarge {
                    job: j,
                    sample: s,
                    size,
                    view_bytes: view_bytes[j],
                });
            }
        }
    }
    let empty = || MiniEpoch {
        samples: Vec::new(),
        bytes: 0,
        copied_bytes: 0,
    };
    let mut views: Vec<Vec<MiniEpoch>> = vec![Vec::new(); datasets.len()];
    let mut open: Vec<MiniEpoch> = (0..datasets.len()).map(|_| empty()).collect();
    joint_rounds(datasets, seed, epoch, Rule::Corrected, |picks| {
        let overflow = picks
            .iter()
            .any(|&(j, s)| open[j].bytes + sizes[s as usize] > view_bytes[j]);
        if overflow {
            for (j, v) in open.iter_mut().enumerate() {
                if !v.samples.is_empty() {
                    views[j].push(std::mem::replace(v, empty()));
                }
            }
        }
        for &(j, s) in picks {
            open[j].samples.push(s);
            open[j].bytes += sizes[s as usize];
        }
    })?;
    for (j, v) in open.into_iter().enumerate() {
        if !v.samples.is_empty() {
            views[j].push(v);
        }
    }
    for job in &mut views {
        for v in job.iter_mut() {
            v.samples.sort_unstable();
        }
    }
    Ok(views)
}

#[cfg(test)]
mod tests;
