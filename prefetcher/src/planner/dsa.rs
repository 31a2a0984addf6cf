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
//! acceptance test is exact integer arithmetic (`below(d) < c`), so the same inputs give the
//! same orders everywhere. Samples are kept in buckets by the set of jobs that still need them
//! (a bit mask, as the paper's bitmap implementation); every intersection above is a union of
//! buckets, so a loop costs `O(buckets)` (at most `min(2^jobs, samples)`) and a round
//! `O(jobs · buckets)`. At most [`MAX_JOBS`] jobs share one sampler.
//!
//! # Views
//!
//! [`dependent_views`] cuts the jobs' joint orders into mini-epochs at the *same* rounds for
//! every job (a cut is made when any job's next sample would overflow its view), so a sample
//! two jobs drew in one round is in the same mini-epoch of both. Jobs whose datasets end
//! earlier simply have fewer mini-epochs.

use std::collections::{BTreeSet, HashMap};

use thiserror::Error;

use super::rng::PlanRng;
use super::MiniEpoch;

/// The most jobs one sampler holds (one bit each in a mask).
pub const MAX_JOBS: usize = 64;

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

/// Samples needed by exactly the same jobs.
#[derive(Debug, Clone)]
struct Bucket {
    mask: u64,
    items: Vec<u32>,
}

/// The state of one epoch's dependent sampling over several jobs; see the module docs.
pub struct DependentSampler {
    rng: PlanRng,
    rule: Rule,
    /// Local index → sample id.
    ids: Vec<u32>,
    /// Sample id → local index.
    local: HashMap<u32, u32>,
    /// Local index → jobs that have not drawn it yet.
    mask: Vec<u64>,
    /// Local index → position in its bucket (meaningless when its mask is 0).
    pos: Vec<u32>,
    buckets: Vec<Bucket>,
    bucket_of: HashMap<u64, usize>,
    /// Job → samples it has not drawn yet; `None` for a free job index.
    remaining: Vec<Option<u64>>,
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
            ids: Vec::new(),
            local: HashMap::new(),
            mask: Vec::new(),
            pos: Vec::new(),
            buckets: Vec::new(),
            bucket_of: HashMap::new(),
            remaining: Vec::new(),
        }
    }

    /// Adds a job that will draw every sample of `dataset` once; returns its index (the lowest
    /// free one). Errors: [`DsaError::TooManyJobs`], [`DsaError::EmptyDataset`],
    /// [`DsaError::Duplicate`]; on error nothing changes.
    pub fn add_job(&mut self, dataset: &[u32]) -> Result<usize, DsaError> {
        let job = match self.remaining.iter().position(Option::is_none) {
            Some(j) => j,
            None if self.remaining.len() < MAX_JOBS => self.remaining.len(),
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
        let mut seen = BTreeSet::new();
        for &s in dataset {
            if !seen.insert(s) {
                return Err(DsaError::Duplicate { job, sample: s });
            }
        }
        let bit = 1u64 << job;
        for &s in dataset {
            let l = match self.local.get(&s) {
                Some(&l) => l,
                None => {
                    let l = self.ids.len() as u32;
                    self.ids.push(s);
                    self.local.insert(s, l);
                    self.mask.push(0);
                    self.pos.push(0);
                    l
                }
            };
            let old = self.mask[l as usize];
            self.remask(l, old | bit);
        }
        if job == self.remaining.len() {
            self.remaining.push(Some(dataset.len() as u64));
        } else {
            self.remaining[job] = Some(dataset.len() as u64);
        }
        Ok(job)
    }

    /// Removes a job (it finished or left); its index becomes free. Samples only it still
    /// needed leave the sampler.
    pub fn remove_job(&mut self, job: usize) {
        let Some(slot) = self.remaining.get_mut(job) else {
            return;
        };
        if slot.take().is_none() {
            return;
        }
        let bit = 1u64 << job;
        for l in 0..self.mask.len() as u32 {
            let m = self.mask[l as usize];
            if m & bit != 0 {
                self.remask(l, m & !bit);
            }
        }
    }

    /// How many samples `job` has not drawn yet this epoch (0 for an unknown job).
    pub fn remaining(&self, job: usize) -> u64 {
        self.remaining.get(job).copied().flatten().unwrap_or(0)
    }

    /// One round: each of `jobs` draws one sample it has not drawn yet. Returns
    /// `(job, sample id)` pairs in the order the jobs decided (jobs that shared a draw are
    /// adjacent). Errors: [`DsaError::Exhausted`], [`DsaError::RepeatedJob`].
    pub fn draw(&mut self, jobs: &[usize]) -> Result<Vec<(usize, u32)>, DsaError> {
        let mut all = 0u64;
        for &j in jobs {
            if self.remaining(j) == 0 {
                return Err(DsaError::Exhausted { job: j });
            }
            if all & (1 << j) != 0 {
                return Err(DsaError::RepeatedJob { job: j });
            }
            all |= 1 << j;
        }
        let mut order = jobs.to_vec();
        order.sort_by_key(|&j| (self.remaining(j), j));
        let mut picks = Vec::with_capacity(order.len());
        // Draws are applied only after every job has decided: the sets the loops see (S, I and
        // each |R_j|) are those at the start of the round.
        let mut taken: Vec<(u32, u64)> = Vec::with_capacity(order.len());
        // `t` is the mask of the undecided jobs; `prev` that of the previous loop, so that
        // S = {mask ⊇ prev} (the undecided jobs only shrink, so every earlier loop's
        // intersection lies in the latest one's superset).
        let mut prev: Option<u64> = None;
        let mut u = 0;
        while u < order.len() {
            let t = order[u..].iter().fold(0u64, |m, &j| m | 1 << j);
            let s = prev.map_or(0, |p| self.superset_count(p));
            let sup_t = self.superset_count(t);
            let i_len = sup_t - s;
            let in_i = |m: u64| m & t == t && prev.is_none_or(|p| m & p != p);
            let mut c = i_len;
            let mut k = u;
            while k < order.len() {
                let rem = self.remaining(order[k]);
                let d = rem - s;
                debug_assert!(d > 0, "a sorted undecided job has samples outside S");
                if self.rng.below(d as u32) as u64 >= c {
                    break;
                }
                c = match self.rule {
                    Rule::Corrected => d,
                    #[cfg(test)]
                    Rule::Printed => rem,
                };
                k += 1;
            }
            if k > u {
                let l = self.pick(in_i, i_len);
                let takers = order[u..k].iter().fold(0u64, |m, &j| m | 1 << j);
                taken.push((l, takers));
                picks.extend(order[u..k].iter().map(|&j| (j, self.ids[l as usize])));
                u = k;
            } else {
                let j = order[u];
                let bit = 1u64 << j;
                let rem = self.remaining(j);
                let l = match self.rule {
                    // R_1 ∖ (S ∪ I) = {mask ∋ j, mask ⊉ t}: S ∪ I is everything ⊇ t.
                    Rule::Corrected => self.pick(|m| m & bit != 0 && m & t != t, rem - sup_t),
                    #[cfg(test)]
                    Rule::Printed => self.pick(|m| m & bit != 0 && !in_i(m), rem - i_len),
                };
                taken.push((l, bit));
                picks.push((j, self.ids[l as usize]));
                u += 1;
            }
            prev = Some(t);
        }
        for (l, takers) in taken {
            self.take(l, takers);
        }
        Ok(picks)
    }

    /// Samples still needed by every job of `t` (and maybe others).
    fn superset_count(&self, t: u64) -> u64 {
        self.buckets
            .iter()
            .filter(|b| b.mask & t == t)
            .map(|b| b.items.len() as u64)
            .sum()
    }

    /// A uniform draw among the samples whose masks pass `keep`, of which there are `n > 0`.
    fn pick(&mut self, keep: impl Fn(u64) -> bool, n: u64) -> u32 {
        debug_assert!(n > 0);
        let mut r = u64::from(self.rng.below(n as u32));
        for b in &self.buckets {
            if !keep(b.mask) {
                continue;
            }
            let len = b.items.len() as u64;
            if r < len {
                return b.items[r as usize];
            }
            r -= len;
        }
        unreachable!("the count of matching samples was computed from the same buckets")
    }

    /// The jobs in `takers` have drawn local sample `l`.
    fn take(&mut self, l: u32, takers: u64) {
        let m = self.mask[l as usize];
        debug_assert_eq!(m & takers, takers);
        self.remask(l, m & !takers);
        for j in 0..MAX_JOBS {
            if takers & (1 << j) != 0 {
                if let Some(r) = self.remaining[j].as_mut() {
                    *r -= 1;
                }
            }
        }
    }

    /// Moves local sample `l` to the bucket of `new` (out of every bucket when 0).
    fn remask(&mut self, l: u32, new: u64) {
        let old = self.mask[l as usize];
        if old == new {
            return;
        }
        if old != 0 {
            let b = self.bucket_of[&old];
            let p = self.pos[l as usize] as usize;
            let items = &mut self.buckets[b].items;
            items.swap_remove(p);
            if let Some(&moved) = items.get(p) {
                self.pos[moved as usize] = p as u32;
            }
            if items.is_empty() {
                // Drop the bucket so that loops only walk live ones.
                self.buckets.swap_remove(b);
                self.bucket_of.remove(&old);
                if let Some(moved) = self.buckets.get(b) {
                    self.bucket_of.insert(moved.mask, b);
                }
            }
        }
        if new != 0 {
            let b = match self.bucket_of.get(&new) {
                Some(&b) => b,
                None => {
                    self.buckets.push(Bucket {
                        mask: new,
                        items: Vec::new(),
                    });
                    self.bucket_of.insert(new, self.buckets.len() - 1);
                    self.buckets.len() - 1
                }
            };
            self.pos[l as usize] = self.buckets[b].items.len() as u32;
            self.buckets[b].items.push(l);
        }
        self.mask[l as usize] = new;
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

/// The dependent sampling tree of Definition 1 over datasets sorted by size (ascending, ties
/// by index): the root is the intersection of all, its right child the rest of the smallest
/// dataset, its left child the tree of the others with the root removed; one dataset is a
/// single vertex. Stored as its left spine (`spine[0]` the root, `spine[n−1]` the lone vertex
/// at the bottom) and the right leaves (`leaves[i]` hangs off `spine[i]`, for the `i`-th
/// smallest dataset). The vertices on the path from the root to job `order[i]`'s leaf
/// partition its dataset; the spine's vertices are disjoint (leaves are not: a sample of
/// `D_1 ∩ D_2` outside `D_3` is in the leaves of both); the height is `n − 1`.
///
/// The sampler never stores this tree: its vertices are unions of the sampler's mask buckets
/// (`spine[k]` holds the samples whose mask contains the jobs `order[k..]` but not
/// `order[k−1..]`), which is how each loop's intersection is found in `O(buckets)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SamplingTree {
    /// Job indices, smallest dataset first.
    pub order: Vec<usize>,
    /// The left spine, root first; sorted sample ids.
    pub spine: Vec<Vec<u32>>,
    /// The right leaves: `leaves[i]` is the child of `spine[i]`; sorted sample ids.
    pub leaves: Vec<Vec<u32>>,
}

impl SamplingTree {
    /// Builds the tree by the recursion of Definition 1.
    pub fn build(datasets: &[&[u32]]) -> Self {
        let mut order: Vec<usize> = (0..datasets.len()).collect();
        order.sort_by_key(|&j| (datasets[j].len(), j));
        let mut rest: Vec<BTreeSet<u32>> = order
            .iter()
            .map(|&j| datasets[j].iter().copied().collect())
            .collect();
        let (mut spine, mut leaves) = (Vec::new(), Vec::new());
        let mut k = 0;
        while k < rest.len() {
            if k + 1 == rest.len() {
                spine.push(rest[k].iter().copied().collect());
                break;
            }
            let root: BTreeSet<u32> = rest[k]
                .iter()
                .copied()
                .filter(|s| rest[k + 1..].iter().all(|d| d.contains(s)))
                .collect();
            leaves.push(rest[k].difference(&root).copied().collect());
            spine.push(root.iter().copied().collect());
            for d in &mut rest[k + 1..] {
                d.retain(|s| !root.contains(s));
            }
            k += 1;
        }
        Self {
            order,
            spine,
            leaves,
        }
    }

    /// Edges from the root to the deepest vertex.
    pub fn height(&self) -> usize {
        self.spine.len().saturating_sub(1)
    }
}

#[cfg(test)]
#[path = "dsa_tests.rs"]
mod tests;
