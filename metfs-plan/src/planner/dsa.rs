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

use std::collections::{BTreeSet, HashMap};

use thiserror::Error;

use super::rng::PlanRng;
use super::MiniEpoch;

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

/// Words per block of a [`Column`]: 512 bits, one cache line.
const BLOCK: usize = 8;
/// Blocks per super-block of a [`Column`].
const SUPER: usize = 64;

/// One job's samples not drawn yet: a bitmap over local indices with its count per block and
/// per super-block, so that the `r`-th of them is found by reading two short arrays and one
/// cache line of the bitmap; a bit per sample of the sampler whatever the job's share.
#[derive(Debug)]
struct Column {
    bits: Vec<u64>,
    blocks: Vec<u16>,
    supers: Vec<u32>,
    len: u64,
}

impl Column {
    /// The column of `locals`, all distinct.
    fn of(locals: &[u32]) -> Self {
        let top = locals.iter().max().map_or(0, |&l| l as usize / 64 + 1);
        let mut bits = vec![0u64; top];
        for &l in locals {
            bits[l as usize / 64] |= 1 << (l % 64);
        }
        let blocks: Vec<u16> = bits
            .chunks(BLOCK)
            .map(|b| b.iter().map(|w| w.count_ones() as u16).sum())
            .collect();
        let supers = blocks
            .chunks(SUPER)
            .map(|s| s.iter().map(|&b| u32::from(b)).sum())
            .collect();
        Self {
            bits,
            blocks,
            supers,
            len: locals.len() as u64,
        }
    }

    fn contains(&self, l: u32) -> bool {
        self.bits
            .get(l as usize / 64)
            .is_some_and(|w| w >> (l % 64) & 1 != 0)
    }

    fn remove(&mut self, l: u32) {
        let w = l as usize / 64;
        debug_assert!(self.contains(l));
        self.bits[w] &= !(1 << (l % 64));
        self.blocks[w / BLOCK] -= 1;
        self.supers[w / BLOCK / SUPER] -= 1;
        self.len -= 1;
    }

    /// The `r`-th sample (0-based, ascending), `r < len`.
    fn select(&self, r: u64) -> u32 {
        let (b, r) = self.locate(r);
        self.select_in_block(b, r)
    }

    /// The block holding the `r`-th sample and its rank there, from the counts alone (small,
    /// and mostly in cache).
    fn locate(&self, mut r: u64) -> (usize, u32) {
        let mut s = 0;
        while r >= u64::from(self.supers[s]) {
            r -= u64::from(self.supers[s]);
            s += 1;
        }
        let mut b = s * SUPER;
        while r >= u64::from(self.blocks[b]) {
            r -= u64::from(self.blocks[b]);
            b += 1;
        }
        (b, r as u32)
    }

    /// Block `b`'s words, zeros past the bitmap's end.
    fn block(&self, b: usize) -> [u64; BLOCK] {
        let mut line = [0; BLOCK];
        let words = &self.bits[b * BLOCK..self.bits.len().min((b + 1) * BLOCK)];
        line[..words.len()].copy_from_slice(words);
        line
    }

    /// The `r`-th sample of block `b`.
    fn select_in_block(&self, b: usize, r: u32) -> u32 {
        select_in_line(&self.block(b), b, r)
    }

    /// Its samples, ascending.
    fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.bits.iter().enumerate().flat_map(|(i, &w)| {
            let mut w = w;
            std::iter::from_fn(move || {
                (w != 0).then(|| {
                    let bit = w.trailing_zeros();
                    w &= w - 1;
                    (i * 64) as u32 + bit
                })
            })
        })
    }
}

/// The `r`-th sample of block `b`, whose words are `line`. Nothing branches on the words.
fn select_in_line(line: &[u64; BLOCK], b: usize, mut r: u32) -> u32 {
    let (mut at, mut found) = (0, false);
    for &w in line {
        let ones = w.count_ones();
        let past = !found & (r >= ones);
        r -= if past { ones } else { 0 };
        at += usize::from(past);
        found |= !past;
    }
    ((b * BLOCK + at) * 64) as u32 + select_in_word(line[at], r)
}

const BYTES: u64 = 0x0101_0101_0101_0101;

/// The position of the `r`-th set bit of `w` (`r` below its count): the byte by the running
/// counts of its bytes, all eight compared at once, then a table.
fn select_in_word(w: u64, r: u32) -> u32 {
    let s = w - ((w >> 1) & 0x5555_5555_5555_5555);
    let s = (s & 0x3333_3333_3333_3333) + ((s >> 2) & 0x3333_3333_3333_3333);
    let counts = (s + (s >> 4)) & 0x0F0F_0F0F_0F0F_0F0F;
    // Byte i: set bits in bytes 0..=i (at most 64, so a byte's top bit stays clear).
    let running = counts.wrapping_mul(BYTES);
    let high = 0x8080_8080_8080_8080u64;
    let at_most_r = (((u64::from(r) * BYTES) | high) - running) & high;
    let byte = ((at_most_r >> 7).wrapping_mul(BYTES) >> 56) as u32;
    let before = ((running << 8) >> (8 * byte)) as u32 & 0xFF;
    let bits = (w >> (8 * byte)) as usize & 0xFF;
    8 * byte + u32::from(SELECT_IN_BYTE[bits][(r - before) as usize])
}

/// `SELECT_IN_BYTE[b][k]`: the position of the `k`-th set bit of byte `b`.
static SELECT_IN_BYTE: [[u8; 8]; 256] = {
    let mut table = [[0u8; 8]; 256];
    let mut b = 0;
    while b < 256 {
        let (mut k, mut bit) = (0, 0);
        while bit < 8 {
            if b >> bit & 1 == 1 {
                table[b][k] = bit as u8;
                k += 1;
            }
            bit += 1;
        }
        b += 1;
    }
    table
};

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
        // When every job draws in every round the order stays sorted: checked in O(jobs),
        // which keeps a round's cost linear in its jobs.
        let key = |j: usize| (self.remaining(j), j);
        let same = jobs.len() == self.order.len()
            && jobs.iter().all(|&j| self.rank[j] != NO_RANK)
            && self.order.windows(2).all(|w| key(w[0]) < key(w[1]));
        let order = if same {
            self.order.clone()
        } else {
            let mut order = jobs.to_vec();
            order.sort_unstable_by_key(|&j| key(j));
            self.sync(&order);
            order
        };
        let n = order.len();
        // sup[u] = |⋂ R_j| over order[u..]: the samples of level u or below.
        let mut sup = Vec::with_capacity(n);
        let mut below = self.groups[ALL as usize].len() as u64;
        for &j in &order {
            sup.push(below);
            below += self.groups[group_of(j) as usize].len() as u64;
        }
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
        let mut picks = Vec::with_capacity(n);
        for &(l, from, to) in &taken {
            let id = self.samples[l as usize].id;
            picks.extend(order[from..to].iter().map(|&j| (j, id)));
        }
        for (l, from, to) in taken {
            self.take(l, &order[from..to]);
        }
        Ok(picks)
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

/// The dependent sampling tree of Definition 1 over datasets sorted by size (ascending, ties
/// by index): the root is the intersection of all, its right child the rest of the smallest
/// dataset, its left child the tree of the others with the root removed; one dataset is a
/// single vertex. Stored as its left spine (`spine[0]` the root, `spine[n−1]` the lone vertex
/// at the bottom) and the right leaves (`leaves[i]` hangs off `spine[i]`, for the `i`-th
/// smallest dataset). The vertices on the path from the root to job `order[i]`'s leaf
/// partition its dataset; the spine's vertices are disjoint (leaves are not: a sample of
/// `D_1 ∩ D_2` outside `D_3` is in the leaves of both); the height is `n − 1`.
///
/// The sampler keeps the spine and not the leaves: `spine[k]` is its group of the samples of
/// level `k` (needed by the jobs `order[k..]`, not by all of `order[k−1..]`), which is how
/// each loop's intersection is a prefix sum of group sizes; a leaf is drawn from by rejection
/// from the job's own samples.
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
