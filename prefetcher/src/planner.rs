//! The planner: a pure function from (samples, seed, epoch, node rank, node count, budget,
//! strategy) to one epoch's mini-epochs for one node.
//!
//! # Shares
//!
//! An epoch is `nm` mini-epochs; each mini-epoch is split between the `nodes` nodes. The unit
//! the budget applies to is one node's part of one mini-epoch, a *share*: there are
//! `P = nm × nodes` of them, numbered `m × nodes + r` (mini-epoch `m`, node `r`). Every node
//! computes the assignment of *all* samples to shares, from the same inputs and the same
//! random stream, and keeps its own; that is why the shares of different nodes are disjoint
//! and cover the epoch without any communication. Randomness comes only from
//! [`ChaCha8Rng`] seeded by a fixed SplitMix64 mix of `(seed, epoch)`, consumed by this
//! module's own Fisher–Yates and Lemire bounded draws, so no change in `rand`'s algorithms can
//! change a plan (a test pins the digest of a small plan).
//!
//! # Strategies
//!
//! * `sequential`: the paper's contiguous split. The catalog order is cut into `P`
//!   contiguous shares; each cut is placed as close to the even byte position `j·T/P` as the
//!   file sizes allow while every share stays within the budget and the rest of the sequence
//!   still fits in the shares that remain. Identical every epoch.
//! * `random`: a seeded, byte- and count-balanced random partition into the `P` shares.
//! * `stratified`: each class is spread over the mini-epochs so that every mini-epoch holds
//!   `⌊n_c/nm⌋` or `⌈n_c/nm⌉` samples of class `c` (paper 000, Fig. 4), then inside each
//!   mini-epoch over the nodes the same way; composed afresh each epoch.
//! * `clustered`: as stratified over cluster ids; clusters with fewer samples than shares
//!   (`n_c < P`) are copied into every share (paper 000: strata smaller than the number of
//!   parts go to every part). Their bytes count against every share's budget.
//!
//! # The balancing step and its bound
//!
//! The permuting strategies share one step, [`balance`]: colour samples, grouped into classes
//! (one class for `random`), with `k` colours so that
//! 1. each colour gets `⌊n_c/k⌋` or `⌈n_c/k⌉` samples of every class,
//! 2. colour sample counts differ by at most one, and
//! 3. colour byte totals differ by at most `s_max`, the largest sample.
//!
//! It works in two phases. *Remainders*: each class contributes `n_c mod k < k` random samples.
//! They are sorted by size (descending) and cut into sweeps of `k`; each sweep gives every
//! colour exactly one sample, and no colour gets two remainder samples of one class. That is a
//! proper `k`-edge-colouring of the bipartite multigraph (sweeps × classes), which exists by
//! König's theorem (both sides have degree ≤ k) and is built by the classic alternating-path
//! method. Because the sweeps are consecutive blocks of a sorted sequence, *any* such colouring
//! leaves colour totals within `max₀ − max_last + max_last ≤ s_max` of each other: sweep `j`
//! spans at most `max_j − max_{j+1}`, and these telescope. *Full rounds*: the other
//! `⌊n_c/k⌋·k` samples of each class are sorted by size and cut into blocks of `k`; a random
//! permutation of each block deals one sample to each of `k` bundles, so bundle totals again
//! differ by at most the class's largest sample (telescoping). Bundles are matched to colours
//! largest-to-lightest; for colours `p` lighter than `q` that gives `p` the larger bundle, so
//! the spread after the match is at most `max(spread before, bundle spread) ≤ s_max`.
//!
//! With totals within `s_max` of each other, the heaviest of `k` colours holding `T` bytes has
//! at most `(T + (k−1)·s_max)/k`. `random` balances all `P` shares at once; `stratified` and
//! `clustered` balance mini-epochs (`k = nm`) and then each mini-epoch's nodes (`k = nodes`),
//! which keeps both the per-mini-epoch and the per-node class counts within one, and composes
//! to the same bound: `(T + (nm−1)s)/nm` per mini-epoch, then
//! `((T + (nm−1)s)/nm + (nodes−1)s)/nodes = (T + (P−1)s)/P` per share. Since share sample
//! counts differ by at most one, a share also never holds more than the `⌈n/P⌉` largest
//! samples. The guaranteed bound is the smaller of the two.
//!
//! # Choosing nm
//!
//! [`mini_epoch_count`] gives the same `nm` for every epoch. With no request it is, exactly:
//! * `sequential`: the smallest `nm` for which `nm × nodes` contiguous shares of at most
//!   `slot_bytes` can cover the catalog order (greedy packing gives the fewest such shares, and
//!   the cutting above always succeeds with that many);
//! * `random`, `stratified`: the smallest `nm` whose guaranteed bound above is at most
//!   `slot_bytes` (the bound falls as `nm` grows, so a binary search finds it; when only single
//!   samples fit, that is `⌈n/nodes⌉`, where every share holds at most one sample);
//! * `clustered`: the smallest `nm` for which the bound over the clusters that are not copied,
//!   plus the copies, is at most `slot_bytes`. Copies grow with `nm`, so this is not monotone;
//!   every count from 1 up is tried until one fits.
//!
//! A requested `nm` that these rules cannot guarantee is refused with
//! [`PlanError::TooFewMiniEpochs`], naming the smallest count that is guaranteed.
//!
//! # Cost
//!
//! `O(n log n)` time (sorting within classes), a few `u32` per sample of memory, and no
//! allocation per sample: every buffer is sized once per plan and reused.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::size::format_bytes;

/// How samples are composed into mini-epochs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// The paper's contiguous split, in catalog (path) order; the same in every epoch.
    Sequential,
    /// A seeded permutation composed afresh each epoch.
    #[default]
    Random,
    /// Each class spread round-robin over the mini-epochs (paper 000).
    Stratified,
    /// As stratified, over cluster ids; clusters smaller than the number of parts are copied to
    /// every part.
    Clustered,
}

/// What the planner knows of each sample, indexed by sample id.
#[derive(Debug, Clone, Copy)]
pub struct SampleSet<'a> {
    /// Planning cost of each sample in bytes (its footprint in the cache).
    pub sizes: &'a [u64],
    /// Class id of each sample (required by `Stratified`).
    pub labels: Option<&'a [u32]>,
    /// Cluster id of each sample (required by `Clustered`).
    pub clusters: Option<&'a [u32]>,
}

/// Inputs of a plan other than the samples and the epoch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanConfig {
    /// Composition strategy.
    pub strategy: Strategy,
    /// Seed of every random choice.
    pub seed: u64,
    /// Most bytes one node's share of one mini-epoch may hold (half the slot budget).
    pub slot_bytes: u64,
    /// Number of mini-epochs per epoch; `None` picks the smallest that always fits.
    pub mini_epochs: Option<u32>,
    /// This node's rank in `0..nodes`.
    pub node_rank: u32,
    /// Number of nodes sharing the epoch.
    pub nodes: u32,
}

/// One mini-epoch as seen by one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MiniEpoch {
    /// Sample ids of this node's share, in ascending id (catalog path) order, so staging walks
    /// the source directory by directory. Includes the copied samples, if any.
    pub samples: Vec<u32>,
    /// Sum of the sizes of `samples` (copies included); never more than the slot budget.
    pub bytes: u64,
    /// The part of `bytes` that is copies of small clusters (`clustered` only; 0 otherwise).
    #[serde(default)]
    pub copied_bytes: u64,
}

/// One epoch's plan for one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochPlan {
    /// The epoch this plan is for.
    pub epoch: u64,
    /// The mini-epochs in order; always `mini_epochs` of them.
    pub mini_epochs: Vec<MiniEpoch>,
    /// Samples copied into every share of every mini-epoch (`clustered`: the clusters with
    /// fewer samples than there are shares), ascending; empty otherwise.
    #[serde(default)]
    pub copied: Vec<u32>,
}

/// Errors of the planner.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PlanError {
    /// The sizes add up to more than 2^64 bytes.
    #[error("the sizes of the samples add up to more than 2^64 bytes (past sample {sample})")]
    TotalTooLarge { sample: u32 },
    /// A single sample is larger than a mini-epoch may be.
    #[error(
        "sample {sample} is {size} bytes, more than the {slot_bytes} bytes a mini-epoch may hold"
    )]
    SampleTooLarge {
        sample: u32,
        size: u64,
        slot_bytes: u64,
    },
    /// The dataset has no samples.
    #[error("the dataset has no samples")]
    Empty,
    /// The strategy needs labels or clusters that the samples lack.
    #[error("strategy {0:?} needs {1}, but the catalog has none")]
    MissingClasses(Strategy, &'static str),
    /// Bad node rank or count.
    #[error("node rank {rank} is not in 0..{nodes}")]
    BadNode { rank: u32, nodes: u32 },
    /// A requested mini-epoch count cannot fit the slot budget.
    #[error("{requested} mini-epochs cannot fit: one would hold {bytes} bytes, more than {slot_bytes}; at least {needed} are needed")]
    TooFewMiniEpochs {
        requested: u32,
        bytes: u64,
        slot_bytes: u64,
        needed: u32,
    },
    /// More mini-epochs than samples (or more shares than share ids can count).
    #[error("{requested} mini-epochs is more than the {samples} samples")]
    TooManyMiniEpochs { requested: u32, samples: usize },
    /// `clustered`: at every mini-epoch count, the clusters that must be copied into every
    /// share plus the share of the rest exceed the budget.
    #[error("clustered: no mini-epoch count fits: clusters smaller than the number of shares are copied into every share, and the best count still needs {best} bytes per share, more than {slot_bytes}")]
    ClustersTooLarge { best: u64, slot_bytes: u64 },
    /// `labels` or `clusters` does not have one entry per sample.
    #[error("the sample set has {samples} sizes but {len} {what}")]
    LengthMismatch {
        what: &'static str,
        len: usize,
        samples: usize,
    },
    /// More samples than `u32` sample ids can name.
    #[error("{samples} samples is more than a plan can hold (4,294,967,294)")]
    TooManySamples { samples: usize },
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Strategy::Sequential => "sequential",
            Strategy::Random => "random",
            Strategy::Stratified => "stratified",
            Strategy::Clustered => "clustered",
        })
    }
}

/// Marks an empty table slot, and a sample copied into every share in an assignment.
const NONE: u32 = u32::MAX;

// ---------------------------------------------------------------------------------------------
// Randomness

/// The plan's only source of randomness. Owning the seeding, the bounded draw and the shuffle
/// means a plan depends on ChaCha8's output alone, which is fixed by its specification.
struct PlanRng(ChaCha8Rng);

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl PlanRng {
    fn new(seed: u64, epoch: u64) -> Self {
        let mut a = seed ^ 0x6A09_E667_F3BC_C909;
        let mut b = epoch ^ 0xBB67_AE85_84CA_A73B;
        let mut key = [0u8; 32];
        for chunk in key.chunks_mut(8) {
            let w = splitmix64(&mut a) ^ splitmix64(&mut b).rotate_left(17);
            chunk.copy_from_slice(&w.to_le_bytes());
        }
        Self(ChaCha8Rng::from_seed(key))
    }

    /// Uniform in `0..n` (`n ≥ 1`), by Lemire's multiply-and-reject.
    fn below(&mut self, n: u32) -> u32 {
        debug_assert!(n > 0);
        let mut m = u64::from(self.0.next_u32()) * u64::from(n);
        if (m as u32) < n {
            let threshold = n.wrapping_neg() % n;
            while (m as u32) < threshold {
                m = u64::from(self.0.next_u32()) * u64::from(n);
            }
        }
        (m >> 32) as u32
    }

    /// Fisher–Yates.
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below((i + 1) as u32) as usize;
            v.swap(i, j);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Checks and the share bound

/// Refuses inputs no strategy can plan. Returns the number of samples.
fn validate(samples: &SampleSet<'_>, cfg: &PlanConfig) -> Result<usize, PlanError> {
    if cfg.nodes == 0 || cfg.node_rank >= cfg.nodes {
        return Err(PlanError::BadNode {
            rank: cfg.node_rank,
            nodes: cfg.nodes,
        });
    }
    let n = samples.sizes.len();
    if n == 0 {
        return Err(PlanError::Empty);
    }
    // u32::MAX itself marks copied samples and empty slots.
    if n >= u32::MAX as usize {
        return Err(PlanError::TooManySamples { samples: n });
    }
    for (what, col) in [
        ("labels", samples.labels),
        ("cluster ids", samples.clusters),
    ] {
        if let Some(col) = col {
            if col.len() != n {
                return Err(PlanError::LengthMismatch {
                    what,
                    len: col.len(),
                    samples: n,
                });
            }
        }
    }
    match cfg.strategy {
        Strategy::Stratified if samples.labels.is_none() => {
            return Err(PlanError::MissingClasses(cfg.strategy, "labels"));
        }
        Strategy::Clustered if samples.clusters.is_none() => {
            return Err(PlanError::MissingClasses(cfg.strategy, "cluster ids"));
        }
        _ => {}
    }
    // Every sum the planner makes is of a subset of the sizes; if the whole fits, they do.
    let mut total = 0u64;
    for (i, &s) in samples.sizes.iter().enumerate() {
        total = total
            .checked_add(s)
            .ok_or(PlanError::TotalTooLarge { sample: i as u32 })?;
    }
    // The largest offender, so that one budget increase fixes every sample.
    let (mut id, mut size) = (0usize, 0u64);
    for (i, &s) in samples.sizes.iter().enumerate() {
        if s > size {
            (id, size) = (i, s);
        }
    }
    if size > cfg.slot_bytes {
        return Err(PlanError::SampleTooLarge {
            sample: id as u32,
            size,
            slot_bytes: cfg.slot_bytes,
        });
    }
    Ok(n)
}

/// How many of the largest sizes [`SizeStats`] keeps exactly.
const TOP: usize = 64;

/// What the share bound needs to know about a set of sizes.
#[derive(Debug, Clone, Default)]
struct SizeStats {
    n: u64,
    total: u64,
    max: u64,
    /// The largest sizes, descending (at most [`TOP`]).
    top: Vec<u64>,
}

impl SizeStats {
    fn of(sizes: impl Iterator<Item = u64>) -> Self {
        let mut heap: BinaryHeap<Reverse<u64>> = BinaryHeap::with_capacity(TOP + 1);
        let mut st = SizeStats::default();
        for s in sizes {
            st.n += 1;
            st.total = st.total.saturating_add(s);
            st.max = st.max.max(s);
            if heap.len() < TOP {
                heap.push(Reverse(s));
            } else if heap.peek().is_some_and(|r| r.0 < s) {
                heap.pop();
                heap.push(Reverse(s));
            }
        }
        st.top = heap.into_iter().map(|r| r.0).collect();
        st.top.sort_unstable_by(|a, b| b.cmp(a));
        st
    }

    /// An upper bound on the sum of the `k` largest sizes (exact for `k ≤ TOP`).
    fn top_sum(&self, k: u64) -> u64 {
        let k = k.min(self.n);
        let exact = (k as usize).min(self.top.len());
        let head: u64 = self.top[..exact]
            .iter()
            .fold(0, |a, &b| a.saturating_add(b));
        let rest = (k - exact as u64).saturating_mul(self.top.last().copied().unwrap_or(0));
        head.saturating_add(rest)
    }
}

/// The most bytes any of `parts` balanced shares can hold when `n` samples of `total` bytes
/// (largest `max`) are spread by [`balance`]; see the module docs for the proof.
/// `top` bounds the sum of the largest samples.
fn share_bound(n: u64, total: u64, max: u64, top: &SizeStats, parts: u64) -> u64 {
    if n == 0 {
        return 0;
    }
    let parts = parts.max(1);
    let spread = (u128::from(total) + u128::from(parts - 1) * u128::from(max)) / u128::from(parts);
    let by_spread = u64::try_from(spread).unwrap_or(u64::MAX);
    by_spread.min(top.top_sum(n.div_ceil(parts)))
}

// ---------------------------------------------------------------------------------------------
// Choosing nm

/// The epoch-independent shape of a plan.
#[derive(Debug, Clone)]
struct Layout {
    nm: u32,
    /// `clustered`: per cluster id, whether it is copied into every share; empty otherwise.
    copied: Vec<bool>,
    /// Bytes of the copies in every share.
    copied_bytes: u64,
    /// Guaranteed largest share, copies included (permuting strategies; `None` for
    /// `sequential`, whose shares are known exactly once cut).
    bound: Option<u64>,
}

fn too_many(requested: u32, n: usize, nodes: u32) -> Option<PlanError> {
    let shares = u64::from(requested) * u64::from(nodes);
    (requested as usize > n || shares >= u64::from(u32::MAX)).then_some(
        PlanError::TooManyMiniEpochs {
            requested,
            samples: n,
        },
    )
}

fn layout(samples: &SampleSet<'_>, cfg: &PlanConfig) -> Result<Layout, PlanError> {
    let n = validate(samples, cfg)?;
    if let Some(req) = cfg.mini_epochs {
        if let Some(e) = too_many(req, n, cfg.nodes) {
            return Err(e);
        }
    }
    match cfg.strategy {
        Strategy::Sequential => sequential_layout(samples.sizes, cfg),
        Strategy::Random | Strategy::Stratified => balanced_layout(samples.sizes, cfg),
        Strategy::Clustered => clustered_layout(samples, cfg),
    }
}

/// Smallest `nm` in `1..=hi` for which the non-increasing predicate `fits` holds (`fits(hi)`
/// must hold).
fn smallest(hi: u64, fits: impl Fn(u64) -> bool) -> u64 {
    let (mut lo, mut hi) = (1u64, hi);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

fn balanced_layout(sizes: &[u64], cfg: &PlanConfig) -> Result<Layout, PlanError> {
    let n = sizes.len() as u64;
    let st = SizeStats::of(sizes.iter().copied());
    let nodes = u64::from(cfg.nodes);
    let bound = |nm: u64| share_bound(st.n, st.total, st.max, &st, nm * nodes);
    // With nm = n every share holds at most one sample, which validate() showed fits.
    let needed = smallest(n, |nm| bound(nm) <= cfg.slot_bytes);
    let nm = match cfg.mini_epochs {
        None => needed,
        Some(req) if req == 0 || bound(u64::from(req)) > cfg.slot_bytes => {
            return Err(PlanError::TooFewMiniEpochs {
                requested: req,
                bytes: if req == 0 {
                    st.total
                } else {
                    bound(u64::from(req))
                },
                slot_bytes: cfg.slot_bytes,
                needed: needed as u32,
            });
        }
        Some(req) => u64::from(req),
    };
    Ok(Layout {
        nm: nm as u32,
        copied: Vec::new(),
        copied_bytes: 0,
        bound: Some(bound(nm)),
    })
}

/// Fewest contiguous runs of at most `slot` bytes that cover `sizes` (greedy packing is
/// optimal for contiguous runs).
fn fewest_runs(sizes: &[u64], slot: u64) -> u64 {
    let (mut runs, mut cur) = (0u64, 0u64);
    for &s in sizes {
        if runs == 0 || cur + s > slot {
            runs += 1;
            cur = 0;
        }
        cur += s;
    }
    runs
}

fn sequential_layout(sizes: &[u64], cfg: &PlanConfig) -> Result<Layout, PlanError> {
    let runs = fewest_runs(sizes, cfg.slot_bytes);
    let needed = runs.div_ceil(u64::from(cfg.nodes)) as u32;
    let nm = match cfg.mini_epochs {
        None => needed,
        Some(req) if req == 0 || u64::from(req) * u64::from(cfg.nodes) < runs => {
            let parts = (u64::from(req) * u64::from(cfg.nodes)).max(1) as usize;
            return Err(PlanError::TooFewMiniEpochs {
                requested: req,
                bytes: even_cuts_largest(sizes, parts),
                slot_bytes: cfg.slot_bytes,
                needed,
            });
        }
        Some(req) => req,
    };
    Ok(Layout {
        nm,
        copied: Vec::new(),
        copied_bytes: 0,
        bound: None,
    })
}

/// Per-cluster facts the clustered layout scans over.
struct ClusterTable {
    /// Cluster ids by ascending sample count.
    by_count: Vec<u32>,
    count: Vec<u64>,
    bytes: Vec<u64>,
    /// `suffix_max[i]`: largest sample among clusters `by_count[i..]`.
    suffix_max: Vec<u64>,
    all: SizeStats,
}

impl ClusterTable {
    fn new(sizes: &[u64], clusters: &[u32]) -> Self {
        let ncl = clusters.iter().max().map_or(0, |&m| m as usize + 1);
        let (mut count, mut bytes, mut max) = (vec![0u64; ncl], vec![0u64; ncl], vec![0u64; ncl]);
        for (&c, &s) in clusters.iter().zip(sizes) {
            let c = c as usize;
            count[c] += 1;
            bytes[c] = bytes[c].saturating_add(s);
            max[c] = max[c].max(s);
        }
        let mut by_count: Vec<u32> = (0..ncl as u32).filter(|&c| count[c as usize] > 0).collect();
        by_count.sort_unstable_by_key(|&c| (count[c as usize], c));
        let mut suffix_max = vec![0u64; by_count.len() + 1];
        for i in (0..by_count.len()).rev() {
            suffix_max[i] = suffix_max[i + 1].max(max[by_count[i] as usize]);
        }
        Self {
            by_count,
            count,
            bytes,
            suffix_max,
            all: SizeStats::of(sizes.iter().copied()),
        }
    }

    /// Scans mini-epoch counts `from..=to` in order, calling `visit(nm, copied clusters
    /// (prefix of by_count), copied bytes, guaranteed share)` until it returns true.
    fn scan(
        &self,
        nodes: u64,
        from: u64,
        to: u64,
        mut visit: impl FnMut(u64, usize, u64, u64) -> bool,
    ) {
        let (mut idx, mut copied_n, mut copied_bytes) = (0usize, 0u64, 0u64);
        for nm in from..=to {
            let parts = nm * nodes;
            while idx < self.by_count.len() && self.count[self.by_count[idx] as usize] < parts {
                let c = self.by_count[idx] as usize;
                copied_n += self.count[c];
                copied_bytes = copied_bytes.saturating_add(self.bytes[c]);
                idx += 1;
            }
            let rest = share_bound(
                self.all.n - copied_n,
                self.all.total - copied_bytes,
                self.suffix_max[idx],
                &self.all,
                parts,
            );
            if visit(nm, idx, copied_bytes, rest.saturating_add(copied_bytes)) {
                return;
            }
            // Past the largest cluster everything is copied and nothing changes any more.
            if idx == self.by_count.len() {
                return;
            }
        }
    }

    /// The smallest count in `from..=to` that fits, and the least any count there needs.
    fn first_fit(&self, nodes: u64, from: u64, to: u64, slot: u64) -> (Option<u64>, u64) {
        let (mut found, mut best) = (None, u64::MAX);
        self.scan(nodes, from, to, |nm, _, _, need| {
            best = best.min(need);
            if need <= slot {
                found = Some(nm);
            }
            found.is_some()
        });
        (found, best)
    }
}

fn clustered_layout(samples: &SampleSet<'_>, cfg: &PlanConfig) -> Result<Layout, PlanError> {
    let clusters = samples.clusters.expect("validated");
    let n = samples.sizes.len() as u64;
    let nodes = u64::from(cfg.nodes);
    let slot = cfg.slot_bytes;
    let table = ClusterTable::new(samples.sizes, clusters);
    let nm = match cfg.mini_epochs {
        None => {
            let (found, best) = table.first_fit(nodes, 1, n, slot);
            found.ok_or(PlanError::ClustersTooLarge {
                best,
                slot_bytes: slot,
            })?
        }
        Some(req) => {
            let mut need = u64::MAX;
            table.scan(
                nodes,
                u64::from(req.max(1)),
                u64::from(req.max(1)),
                |_, _, _, b| {
                    need = b;
                    true
                },
            );
            if req == 0 || need > slot {
                // Prefer the next count up that fits; copies make smaller counts fit sometimes
                // when larger ones do not, so fall back to the smallest overall.
                let above = table.first_fit(nodes, u64::from(req) + 1, n, slot).0;
                let (overall, best) = table.first_fit(nodes, 1, n, slot);
                let needed = above.or(overall).ok_or(PlanError::ClustersTooLarge {
                    best,
                    slot_bytes: slot,
                })?;
                return Err(PlanError::TooFewMiniEpochs {
                    requested: req,
                    bytes: need,
                    slot_bytes: slot,
                    needed: needed as u32,
                });
            }
            u64::from(req)
        }
    };
    let mut copied = vec![false; table.count.len()];
    let (mut copied_bytes, mut bound) = (0, 0);
    table.scan(nodes, nm, nm, |_, idx, cb, b| {
        for &c in &table.by_count[..idx] {
            copied[c as usize] = true;
        }
        (copied_bytes, bound) = (cb, b);
        true
    });
    Ok(Layout {
        nm: nm as u32,
        copied,
        copied_bytes,
        bound: Some(bound),
    })
}

// ---------------------------------------------------------------------------------------------
// Sequential cuts

fn prefix_sums(sizes: &[u64]) -> Vec<u64> {
    let mut prefix = Vec::with_capacity(sizes.len() + 1);
    let mut acc = 0u64;
    prefix.push(0);
    for &s in sizes {
        acc = acc.saturating_add(s);
        prefix.push(acc);
    }
    prefix
}

/// Index `i` whose prefix sum is nearest to `target` (the earlier one on a tie).
fn nearest_cut(prefix: &[u64], target: u64) -> usize {
    let t = prefix.partition_point(|&p| p < target);
    if t == 0 {
        return 0;
    }
    if t == prefix.len() || target - prefix[t - 1] <= prefix[t] - target {
        t - 1
    } else {
        t
    }
}

/// The largest of `parts` contiguous runs cut at the even byte positions, with no budget:
/// what a too-small mini-epoch count would put in one share.
fn even_cuts_largest(sizes: &[u64], parts: usize) -> u64 {
    let prefix = prefix_sums(sizes);
    let total = *prefix.last().unwrap_or(&0);
    let mut prev = 0usize;
    let mut largest = 0;
    for j in 1..=parts {
        let ideal = (u128::from(total) * j as u128 / parts as u128) as u64;
        let cut = if j == parts {
            sizes.len()
        } else {
            nearest_cut(&prefix, ideal).max(prev)
        };
        largest = largest.max(prefix[cut] - prefix[prev]);
        prev = cut;
    }
    largest
}

/// Cuts the catalog order into `parts` contiguous runs of at most `slot` bytes, each cut as
/// near the even byte position as the budget and the rest of the sequence allow. Needs
/// `fewest_runs(sizes, slot) ≤ parts`. Returns `parts + 1` cut positions.
fn sequential_cuts(sizes: &[u64], slot: u64, parts: usize) -> Vec<usize> {
    let n = sizes.len();
    let prefix = prefix_sums(sizes);
    let total = prefix[n];
    // fewest[i]: fewest runs of at most `slot` bytes covering samples i..; right to left with
    // a sliding window, since the farthest end of a run starting at i never grows as i falls.
    let mut fewest = vec![0u32; n + 1];
    let (mut end, mut window) = (n, 0u64);
    for i in (0..n).rev() {
        window += sizes[i];
        while window > slot {
            end -= 1;
            window -= sizes[end];
        }
        fewest[i] = fewest[end] + 1;
    }
    let mut cuts = Vec::with_capacity(parts + 1);
    cuts.push(0);
    let mut start = 0usize;
    for j in 0..parts {
        let left = parts - j;
        if left == 1 {
            cuts.push(n);
            break;
        }
        let limit = prefix[start].saturating_add(slot);
        let cap_end = prefix.partition_point(|&p| p <= limit) - 1;
        let spare = n - start >= left;
        // Leave every later share a sample when there are enough to go round.
        let hi = if spare {
            cap_end.min(n - (left - 1))
        } else {
            cap_end
        };
        // The earliest end after which the rest still fits in the shares that remain.
        let rest_fits = start + fewest[start..].partition_point(|&f| f as usize > left - 1);
        let lo = if spare {
            rest_fits.max(start + 1)
        } else {
            rest_fits
        };
        debug_assert!(lo <= hi, "sequential cut infeasible: {lo} > {hi}");
        let ideal = (u128::from(total) * (j as u128 + 1) / parts as u128) as u64;
        let cut = nearest_cut(&prefix, ideal).clamp(lo, hi);
        cuts.push(cut);
        start = cut;
    }
    cuts
}

// ---------------------------------------------------------------------------------------------
// Balancing

/// One remainder sample in the sweep colouring.
#[derive(Debug, Clone, Copy)]
struct Rem {
    size: u64,
    group: u32,
    id: u32,
}

/// (group, colour) → remainder edge: dense when small enough, hashed otherwise, so a huge
/// `groups × k` never allocates a huge table.
#[derive(Debug, Default)]
struct GroupTable {
    k: usize,
    dense: Option<Vec<u32>>,
    sparse: HashMap<u64, u32>,
}

/// Largest dense (group, colour) table, in entries.
const DENSE_LIMIT: usize = 1 << 24;

impl GroupTable {
    fn reset(&mut self, groups: usize, k: usize) {
        self.k = k;
        match groups.checked_mul(k).filter(|&e| e <= DENSE_LIMIT) {
            Some(entries) => {
                let mut v = self.dense.take().unwrap_or_default();
                v.clear();
                v.resize(entries, NONE);
                self.dense = Some(v);
            }
            None => {
                self.dense = None;
                self.sparse.clear();
            }
        }
    }
    fn get(&self, g: u32, c: u32) -> u32 {
        match &self.dense {
            Some(v) => v[g as usize * self.k + c as usize],
            None => *self
                .sparse
                .get(&(u64::from(g) * self.k as u64 + u64::from(c)))
                .unwrap_or(&NONE),
        }
    }
    fn set(&mut self, g: u32, c: u32, e: u32) {
        match &mut self.dense {
            Some(v) => v[g as usize * self.k + c as usize] = e,
            None => {
                let key = u64::from(g) * self.k as u64 + u64::from(c);
                if e == NONE {
                    self.sparse.remove(&key);
                } else {
                    self.sparse.insert(key, e);
                }
            }
        }
    }
}

/// Buffers [`balance`] reuses across calls, so planning allocates per plan, not per sample.
#[derive(Debug, Default)]
struct Scratch {
    loads: Vec<u64>,
    tie: Vec<u32>,
    rem: Vec<Rem>,
    rem_color: Vec<u32>,
    sweep_tab: Vec<u32>,
    group_local: Vec<u32>,
    group_tab: GroupTable,
    free: Vec<u32>,
    path: Vec<u32>,
    order: Vec<u32>,
    pairs: Vec<(u64, u32, u32)>,
    bsum: Vec<u64>,
    border: Vec<u32>,
    corder: Vec<u32>,
    bcolor: Vec<u32>,
}

/// Colours `ids` with `k` colours (see the module docs for the three guarantees and the
/// proof), calling `out(id, colour)` once per sample. Group `g` is
/// `ids[bounds[g]..bounds[g + 1]]`; groups are reordered in place.
fn balance(
    k: u32,
    ids: &mut [u32],
    bounds: &[usize],
    sizes: &[u64],
    rng: &mut PlanRng,
    sc: &mut Scratch,
    mut out: impl FnMut(u32, u32),
) {
    let ku = k as usize;
    let groups = bounds.len().saturating_sub(1);
    if ku <= 1 {
        ids.iter().for_each(|&id| out(id, 0));
        return;
    }
    sc.loads.clear();
    sc.loads.resize(ku, 0);
    // Equal loads are broken by a random colour order, so no mini-epoch or node is always
    // first in line for the heaviest bundle.
    sc.tie.clear();
    sc.tie.extend(0..k);
    rng.shuffle(&mut sc.tie);

    // Phase 1: a random n_c mod k samples of each class, coloured by sorted sweeps.
    sc.rem.clear();
    for g in 0..groups {
        let slice = &mut ids[bounds[g]..bounds[g + 1]];
        rng.shuffle(slice);
        let r = slice.len() % ku;
        sc.rem.extend(slice[..r].iter().map(|&id| Rem {
            size: sizes[id as usize],
            group: g as u32,
            id,
        }));
    }
    sc.rem
        .sort_unstable_by(|a, b| b.size.cmp(&a.size).then(a.id.cmp(&b.id)));
    color_remainders(k, groups, sc, rng);
    for (r, &c) in sc.rem.iter().zip(&sc.rem_color) {
        sc.loads[c as usize] += r.size;
        out(r.id, c);
    }

    // Phase 2: the full rounds of each class, as size-stratified bundles matched
    // largest-to-lightest.
    let mut order = std::mem::take(&mut sc.order);
    order.clear();
    order.extend(0..groups as u32);
    rng.shuffle(&mut order);
    for &g in &order {
        let slice = &mut ids[bounds[g as usize]..bounds[g as usize + 1]];
        let r = slice.len() % ku;
        let full = &mut slice[r..];
        if full.is_empty() {
            continue;
        }
        // Ties keep the shuffled order, so equal sizes still land in random bundles.
        sc.pairs.clear();
        sc.pairs.extend(
            full.iter()
                .enumerate()
                .map(|(i, &id)| (sizes[id as usize], i as u32, id)),
        );
        sc.pairs
            .sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for (dst, p) in full.iter_mut().zip(&sc.pairs) {
            *dst = p.2;
        }
        for block in full.chunks_mut(ku) {
            rng.shuffle(block);
        }
        sc.bsum.clear();
        sc.bsum.resize(ku, 0);
        for (i, &id) in full.iter().enumerate() {
            sc.bsum[i % ku] += sizes[id as usize];
        }
        sc.border.clear();
        sc.border.extend(0..k);
        sc.border.sort_unstable_by(|&a, &b| {
            sc.bsum[b as usize]
                .cmp(&sc.bsum[a as usize])
                .then(a.cmp(&b))
        });
        sc.corder.clear();
        sc.corder.extend(0..k);
        sc.corder.sort_unstable_by(|&a, &b| {
            (sc.loads[a as usize], sc.tie[a as usize])
                .cmp(&(sc.loads[b as usize], sc.tie[b as usize]))
        });
        sc.bcolor.clear();
        sc.bcolor.resize(ku, 0);
        for (&b, &c) in sc.border.iter().zip(&sc.corder) {
            sc.bcolor[b as usize] = c;
        }
        for (i, &id) in full.iter().enumerate() {
            out(id, sc.bcolor[i % ku]);
        }
        for (b, &c) in sc.bcolor.iter().enumerate() {
            sc.loads[c as usize] += sc.bsum[b];
        }
    }
    sc.order = order;
}

/// Properly edge-colours the remainder multigraph (sweeps of `k` consecutive entries of
/// `sc.rem` × groups) with `k` colours into `sc.rem_color`.
fn color_remainders(k: u32, groups: usize, sc: &mut Scratch, rng: &mut PlanRng) {
    let ku = k as usize;
    let r = sc.rem.len();
    sc.rem_color.clear();
    sc.rem_color.resize(r, NONE);
    if r == 0 {
        return;
    }
    let sweeps = r.div_ceil(ku);
    sc.sweep_tab.clear();
    sc.sweep_tab.resize(sweeps * ku, NONE);
    sc.group_local.clear();
    sc.group_local.resize(groups, NONE);
    let mut local = 0u32;
    for e in &sc.rem {
        let slot = &mut sc.group_local[e.group as usize];
        if *slot == NONE {
            *slot = local;
            local += 1;
        }
    }
    sc.group_tab.reset(local as usize, ku);
    for s in 0..sweeps {
        // The sweep's free colours in random order: the first fit is a random fit.
        sc.free.clear();
        sc.free.extend(0..k);
        rng.shuffle(&mut sc.free);
        for e in s * ku..r.min((s + 1) * ku) {
            let g = sc.group_local[sc.rem[e].group as usize];
            let fit = sc.free.iter().position(|&c| sc.group_tab.get(g, c) == NONE);
            let c = match fit {
                Some(p) => sc.free.swap_remove(p),
                None => {
                    // Every colour free in this sweep is taken by the group: free one with an
                    // alternating path (König). `b` exists since a group has < k remainders.
                    let a = sc.free.swap_remove(0);
                    let start = rng.below(k);
                    let b = (0..k)
                        .map(|t| (start + t) % k)
                        .find(|&c| sc.group_tab.get(g, c) == NONE)
                        .expect("a group has fewer remainder samples than colours");
                    flip_path(sc, g, a, b, ku);
                    a
                }
            };
            sc.rem_color[e] = c;
            sc.sweep_tab[s * ku + c as usize] = e as u32;
            sc.group_tab.set(g, c, e as u32);
        }
    }
}

/// Swaps colours `a` and `b` along the `a`/`b` path that starts at group `g` with its
/// `a`-edge. `b` is free at `g`, so the path is simple and cannot reach the current sweep
/// (where `a` is free); afterwards `a` is free at both.
fn flip_path(sc: &mut Scratch, g: u32, a: u32, b: u32, ku: usize) {
    #[cfg(test)]
    tests::FLIPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    sc.path.clear();
    let (mut at_group, mut v, mut col) = (true, g, a);
    loop {
        let e = if at_group {
            sc.group_tab.get(v, col)
        } else {
            sc.sweep_tab[v as usize * ku + col as usize]
        };
        if e == NONE {
            break;
        }
        sc.path.push(e);
        v = if at_group {
            (e as usize / ku) as u32
        } else {
            sc.group_local[sc.rem[e as usize].group as usize]
        };
        at_group = !at_group;
        col = if col == a { b } else { a };
    }
    for &e in &sc.path {
        let (c, gl) = (
            sc.rem_color[e as usize],
            sc.group_local[sc.rem[e as usize].group as usize],
        );
        sc.sweep_tab[(e as usize / ku) * ku + c as usize] = NONE;
        sc.group_tab.set(gl, c, NONE);
    }
    for &e in &sc.path {
        let gl = sc.group_local[sc.rem[e as usize].group as usize];
        let c = if sc.rem_color[e as usize] == a { b } else { a };
        sc.rem_color[e as usize] = c;
        sc.sweep_tab[(e as usize / ku) * ku + c as usize] = e;
        sc.group_tab.set(gl, c, e);
    }
}

// ---------------------------------------------------------------------------------------------
// Assignment of all samples to shares

/// Share of every sample (`m × nodes + r`), or [`NONE`] for a sample copied into every share.
fn assign(samples: &SampleSet<'_>, cfg: &PlanConfig, layout: &Layout, epoch: u64) -> Vec<u32> {
    let sizes = samples.sizes;
    let n = sizes.len();
    let (nm, nodes) = (layout.nm, cfg.nodes);
    let parts = nm * nodes;
    let mut part_of = vec![NONE; n];
    match cfg.strategy {
        Strategy::Sequential => {
            let cuts = sequential_cuts(sizes, cfg.slot_bytes, parts as usize);
            for (p, w) in cuts.windows(2).enumerate() {
                part_of[w[0]..w[1]].fill(p as u32);
            }
        }
        Strategy::Random => {
            let mut rng = PlanRng::new(cfg.seed, epoch);
            let mut ids: Vec<u32> = (0..n as u32).collect();
            let mut sc = Scratch::default();
            balance(
                parts,
                &mut ids,
                &[0, n],
                sizes,
                &mut rng,
                &mut sc,
                |id, c| part_of[id as usize] = c,
            );
        }
        Strategy::Stratified => {
            let labels = samples.labels.expect("validated");
            two_level(labels, &[], sizes, nm, nodes, cfg.seed, epoch, &mut part_of);
        }
        Strategy::Clustered => {
            let clusters = samples.clusters.expect("validated");
            two_level(
                clusters,
                &layout.copied,
                sizes,
                nm,
                nodes,
                cfg.seed,
                epoch,
                &mut part_of,
            );
        }
    }
    part_of
}

/// Stratified assignment: classes over mini-epochs, then each mini-epoch's samples over the
/// nodes, so both levels keep every class within one of even. Samples of classes marked in
/// `copied` stay [`NONE`].
#[allow(clippy::too_many_arguments)]
fn two_level(
    classes: &[u32],
    copied: &[bool],
    sizes: &[u64],
    nm: u32,
    nodes: u32,
    seed: u64,
    epoch: u64,
    part_of: &mut [u32],
) {
    let mut rng = PlanRng::new(seed, epoch);
    let is_copied = |c: u32| copied.get(c as usize).copied().unwrap_or(false);
    let ncls = classes.iter().max().map_or(0, |&m| m as usize + 1);
    // Counting sort of the planned samples by class: group g = class g.
    let mut starts = vec![0usize; ncls + 1];
    for &c in classes {
        if !is_copied(c) {
            starts[c as usize + 1] += 1;
        }
    }
    for i in 1..starts.len() {
        starts[i] += starts[i - 1];
    }
    let planned = starts[ncls];
    let mut ids = vec![0u32; planned];
    let mut fill = starts.clone();
    for (id, &c) in classes.iter().enumerate() {
        if !is_copied(c) {
            ids[fill[c as usize]] = id as u32;
            fill[c as usize] += 1;
        }
    }
    drop(fill);
    let mut sc = Scratch::default();
    balance(nm, &mut ids, &starts, sizes, &mut rng, &mut sc, |id, m| {
        part_of[id as usize] = m
    });
    if nodes == 1 {
        return;
    }
    // Bucket by mini-epoch, keeping the class grouping (a stable counting sort).
    let mut mstarts = vec![0usize; nm as usize + 1];
    for &id in &ids {
        mstarts[part_of[id as usize] as usize + 1] += 1;
    }
    for i in 1..mstarts.len() {
        mstarts[i] += mstarts[i - 1];
    }
    let mut by_me = vec![0u32; planned];
    let mut fill = mstarts.clone();
    for &id in &ids {
        let m = part_of[id as usize] as usize;
        by_me[fill[m]] = id;
        fill[m] += 1;
    }
    drop(ids);
    let mut bounds = Vec::new();
    for m in 0..nm as usize {
        let slice = &mut by_me[mstarts[m]..mstarts[m + 1]];
        bounds.clear();
        bounds.push(0);
        for i in 1..slice.len() {
            if classes[slice[i] as usize] != classes[slice[i - 1] as usize] {
                bounds.push(i);
            }
        }
        bounds.push(slice.len());
        let base = m as u32 * nodes;
        balance(nodes, slice, &bounds, sizes, &mut rng, &mut sc, |id, r| {
            part_of[id as usize] = base + r
        });
    }
}

// ---------------------------------------------------------------------------------------------
// Public entry points

/// The number of mini-epochs per epoch for this dataset and configuration: the same for every
/// epoch. See the module docs ("Choosing nm") for exactly which count is chosen.
///
/// Errors: [`PlanError::SampleTooLarge`] (the largest offending sample),
/// [`PlanError::TooFewMiniEpochs`] / [`PlanError::TooManyMiniEpochs`] for a requested count,
/// [`PlanError::ClustersTooLarge`], and the input checks ([`PlanError::Empty`],
/// [`PlanError::BadNode`], [`PlanError::MissingClasses`], [`PlanError::LengthMismatch`]).
pub fn mini_epoch_count(samples: &SampleSet<'_>, cfg: &PlanConfig) -> Result<u32, PlanError> {
    layout(samples, cfg).map(|l| l.nm)
}

/// This node's (`cfg.node_rank` of `cfg.nodes`) share of each of the mini-epochs of `epoch`.
/// Pure and deterministic: the same inputs give the same plan on every machine.
pub fn plan_epoch(
    samples: &SampleSet<'_>,
    cfg: &PlanConfig,
    epoch: u64,
) -> Result<EpochPlan, PlanError> {
    let layout = layout(samples, cfg)?;
    let part_of = assign(samples, cfg, &layout, epoch);
    let (nodes, rank) = (cfg.nodes, cfg.node_rank);
    let nm = layout.nm as usize;
    // Count first so every share is allocated once at its final size.
    let mut counts = vec![0usize; nm];
    let mut copied = Vec::new();
    for (id, &p) in part_of.iter().enumerate() {
        if p == NONE {
            copied.push(id as u32);
        } else if p % nodes == rank {
            counts[(p / nodes) as usize] += 1;
        }
    }
    let mut mini_epochs: Vec<MiniEpoch> = counts
        .iter()
        .map(|&c| MiniEpoch {
            samples: Vec::with_capacity(c + copied.len()),
            bytes: 0,
            copied_bytes: 0,
        })
        .collect();
    for (id, &p) in part_of.iter().enumerate() {
        let size = samples.sizes[id];
        if p == NONE {
            for me in &mut mini_epochs {
                me.samples.push(id as u32);
                me.bytes += size;
                me.copied_bytes += size;
            }
        } else if p % nodes == rank {
            let me = &mut mini_epochs[(p / nodes) as usize];
            me.samples.push(id as u32);
            me.bytes += size;
        }
    }
    debug_assert!(mini_epochs.iter().all(|me| me.bytes <= cfg.slot_bytes));
    Ok(EpochPlan {
        epoch,
        mini_epochs,
        copied,
    })
}

// ---------------------------------------------------------------------------------------------
// Summary

/// Smallest, largest and mean of a set of byte counts.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ByteStats {
    /// Smallest value.
    pub min: u64,
    /// Largest value.
    pub max: u64,
    /// Mean value.
    pub mean: f64,
}

impl ByteStats {
    fn of(values: impl Iterator<Item = u64> + Clone) -> Self {
        let (mut min, mut max, mut sum, mut n) = (u64::MAX, 0u64, 0u128, 0u64);
        for v in values {
            min = min.min(v);
            max = max.max(v);
            sum += u128::from(v);
            n += 1;
        }
        if n == 0 {
            return Self {
                min: 0,
                max: 0,
                mean: 0.0,
            };
        }
        Self {
            min,
            max,
            mean: sum as f64 / n as f64,
        }
    }
}

/// One node's part of the epoch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeBytes {
    /// Node rank.
    pub node: u32,
    /// Samples over all its shares (copies counted once per share).
    pub samples: u64,
    /// Bytes over all its shares.
    pub bytes: u64,
    /// Its largest share.
    pub largest_share: u64,
    /// Its smallest share.
    pub smallest_share: u64,
}

/// How one class is spread over the mini-epochs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassSpread {
    /// Class name (or id when no names were given).
    pub class: String,
    /// Samples of the class in the dataset.
    pub samples: u64,
    /// Even count per mini-epoch: `samples / nm`.
    pub ideal: f64,
    /// Fewest samples of the class in one mini-epoch (all nodes).
    pub min: u64,
    /// Most samples of the class in one mini-epoch (all nodes).
    pub max: u64,
    /// Copied into every share (`clustered`, small clusters): each mini-epoch holds all of it.
    pub copied: bool,
}

/// Per-mini-epoch counts of one class (small class counts only).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassCounts {
    /// Class name (or id).
    pub class: String,
    /// Samples of the class in each mini-epoch (all nodes).
    pub counts: Vec<u64>,
}

/// Class balance of a plan: over labels, or over clusters for `clustered`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassSummary {
    /// `"label"` or `"cluster"`.
    pub by: &'static str,
    /// Distinct classes with at least one sample.
    pub classes: usize,
    /// Classes copied into every share.
    pub copied_classes: usize,
    /// Largest `|count − ideal|` over the classes that are not copied and the mini-epochs.
    pub max_deviation: f64,
    /// Full table of counts, only when there are at most [`FULL_TABLE_CLASSES`] classes and
    /// [`FULL_TABLE_MINI_EPOCHS`] mini-epochs.
    pub per_mini_epoch: Option<Vec<ClassCounts>>,
    /// Min and max per class over the mini-epochs, in class id order, for the first
    /// [`LISTED_CLASSES`] classes.
    pub spread: Vec<ClassSpread>,
    /// True when `spread` stops before the last class.
    pub truncated: bool,
}

/// Most classes for which [`ClassSummary::per_mini_epoch`] is filled in.
pub const FULL_TABLE_CLASSES: usize = 16;
/// Most mini-epochs for which [`ClassSummary::per_mini_epoch`] is filled in.
pub const FULL_TABLE_MINI_EPOCHS: usize = 64;
/// Most classes listed in [`ClassSummary::spread`].
pub const LISTED_CLASSES: usize = 1000;
/// Class balance is left out when `classes × nm` exceeds this many counters.
const MAX_CLASS_COUNTERS: usize = 1 << 26;

/// What `metfs plan` reports about one epoch's plan, for every node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlanSummary {
    /// Composition strategy.
    pub strategy: Strategy,
    /// The epoch summarised.
    pub epoch: u64,
    /// Seed of the plan.
    pub seed: u64,
    /// Number of nodes.
    pub nodes: u32,
    /// The node that asked.
    pub node_rank: u32,
    /// Samples in the dataset.
    pub samples: u64,
    /// Bytes in the dataset.
    pub total_bytes: u64,
    /// Budget of one share (half the slot budget of a node).
    pub slot_bytes: u64,
    /// Mini-epochs per epoch.
    pub mini_epochs: u32,
    /// True when the count was requested rather than chosen.
    pub mini_epochs_requested: bool,
    /// The most any share can hold in any epoch: the proven bound the count was chosen by for
    /// the permuting strategies, the exact largest share for `sequential`.
    pub share_bound: u64,
    /// Whole mini-epochs (all nodes, copies once per share).
    pub mini_epoch_bytes: ByteStats,
    /// Every node's share of every mini-epoch.
    pub share_bytes: ByteStats,
    /// Fewest and most samples in one share.
    pub share_samples: (u64, u64),
    /// Per node.
    pub node_bytes: Vec<NodeBytes>,
    /// Samples copied into every share.
    pub copied_samples: u64,
    /// Bytes of those copies in every share.
    pub copied_bytes: u64,
    /// Class balance, when the samples have labels (or clusters, for `clustered`).
    pub classes: Option<ClassSummary>,
}

/// Plans `epoch` for every node and summarises it: the mini-epoch count, bytes per
/// mini-epoch and per share, per-node bytes, copies, and how evenly classes are spread.
/// `label_names` names the class ids the summary groups by (labels, or clusters for
/// `clustered`); ids are shown when it is `None`.
pub fn summarize(
    samples: &SampleSet<'_>,
    cfg: &PlanConfig,
    epoch: u64,
    label_names: Option<&[String]>,
) -> Result<PlanSummary, PlanError> {
    let layout = layout(samples, cfg)?;
    let part_of = assign(samples, cfg, &layout, epoch);
    let sizes = samples.sizes;
    let (nm, nodes) = (layout.nm as usize, cfg.nodes as usize);
    let parts = nm * nodes;
    let mut share = vec![0u64; parts];
    let mut count = vec![0u64; parts];
    let (mut copied_samples, mut copied_bytes) = (0u64, 0u64);
    for (&p, &s) in part_of.iter().zip(sizes) {
        if p == NONE {
            copied_samples += 1;
            copied_bytes += s;
        } else {
            share[p as usize] += s;
            count[p as usize] += 1;
        }
    }
    debug_assert_eq!(copied_bytes, layout.copied_bytes);
    // Shares fit (validated), but totals over nodes and mini-epochs count the copies of small
    // clusters many times; these are report figures, so they saturate rather than wrap.
    for (b, c) in share.iter_mut().zip(count.iter_mut()) {
        *b = b.saturating_add(copied_bytes);
        *c += copied_samples;
    }
    let me_bytes: Vec<u64> = share
        .chunks(nodes)
        .map(|c| c.iter().fold(0u64, |a, &b| a.saturating_add(b)))
        .collect();
    let node_bytes = (0..nodes)
        .map(|r| {
            let mine = || (0..nm).map(|m| share[m * nodes + r]);
            NodeBytes {
                node: r as u32,
                samples: (0..nm).map(|m| count[m * nodes + r]).sum(),
                bytes: mine().fold(0, u64::saturating_add),
                largest_share: mine().max().unwrap_or(0),
                smallest_share: mine().min().unwrap_or(0),
            }
        })
        .collect();
    let share_stats = ByteStats::of(share.iter().copied());
    let classes = match cfg.strategy {
        Strategy::Clustered => samples.clusters.map(|c| ("cluster", c)),
        _ => samples.labels.map(|l| ("label", l)),
    }
    .and_then(|(by, col)| class_summary(by, col, &part_of, &layout.copied, nm, nodes, label_names));
    Ok(PlanSummary {
        strategy: cfg.strategy,
        epoch,
        seed: cfg.seed,
        nodes: cfg.nodes,
        node_rank: cfg.node_rank,
        samples: sizes.len() as u64,
        total_bytes: sizes.iter().sum(),
        slot_bytes: cfg.slot_bytes,
        mini_epochs: layout.nm,
        mini_epochs_requested: cfg.mini_epochs.is_some(),
        share_bound: layout.bound.unwrap_or(share_stats.max),
        mini_epoch_bytes: ByteStats::of(me_bytes.iter().copied()),
        share_bytes: share_stats,
        share_samples: (
            count.iter().copied().min().unwrap_or(0),
            count.iter().copied().max().unwrap_or(0),
        ),
        node_bytes,
        copied_samples,
        copied_bytes,
        classes,
    })
}

fn class_summary(
    by: &'static str,
    col: &[u32],
    part_of: &[u32],
    copied: &[bool],
    nm: usize,
    nodes: usize,
    names: Option<&[String]>,
) -> Option<ClassSummary> {
    let ncls = col.iter().max().map_or(0, |&m| m as usize + 1);
    if ncls.checked_mul(nm)? > MAX_CLASS_COUNTERS {
        return None;
    }
    let mut counts = vec![0u64; ncls * nm];
    let mut totals = vec![0u64; ncls];
    for (&c, &p) in col.iter().zip(part_of) {
        totals[c as usize] += 1;
        if p != NONE {
            counts[c as usize * nm + p as usize / nodes] += 1;
        }
    }
    let is_copied = |c: usize| copied.get(c).copied().unwrap_or(false);
    for c in 0..ncls {
        if is_copied(c) {
            counts[c * nm..(c + 1) * nm].fill(totals[c]);
        }
    }
    let name = |c: usize| {
        names
            .and_then(|n| n.get(c))
            .cloned()
            .unwrap_or_else(|| c.to_string())
    };
    let present: Vec<usize> = (0..ncls).filter(|&c| totals[c] > 0).collect();
    let mut max_deviation = 0f64;
    for &c in present.iter().filter(|&&c| !is_copied(c)) {
        let ideal = totals[c] as f64 / nm as f64;
        for &k in &counts[c * nm..(c + 1) * nm] {
            max_deviation = max_deviation.max((k as f64 - ideal).abs());
        }
    }
    let per_mini_epoch = (present.len() <= FULL_TABLE_CLASSES && nm <= FULL_TABLE_MINI_EPOCHS)
        .then(|| {
            present
                .iter()
                .map(|&c| ClassCounts {
                    class: name(c),
                    counts: counts[c * nm..(c + 1) * nm].to_vec(),
                })
                .collect()
        });
    let spread = present
        .iter()
        .take(LISTED_CLASSES)
        .map(|&c| {
            let row = &counts[c * nm..(c + 1) * nm];
            ClassSpread {
                class: name(c),
                samples: totals[c],
                ideal: totals[c] as f64 / nm as f64,
                min: row.iter().copied().min().unwrap_or(0),
                max: row.iter().copied().max().unwrap_or(0),
                copied: is_copied(c),
            }
        })
        .collect();
    Some(ClassSummary {
        by,
        classes: present.len(),
        copied_classes: present.iter().filter(|&&c| is_copied(c)).count(),
        max_deviation,
        per_mini_epoch,
        spread,
        truncated: present.len() > LISTED_CLASSES,
    })
}

impl fmt::Display for PlanSummary {
    /// A short human report; the JSON form (serde) has everything.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = format_bytes;
        writeln!(
            f,
            "plan: {} composition, epoch {}, seed {}, {} node(s), this node {}",
            self.strategy, self.epoch, self.seed, self.nodes, self.node_rank
        )?;
        writeln!(
            f,
            "dataset: {} samples, {}; budget per share {}",
            self.samples,
            b(self.total_bytes),
            b(self.slot_bytes)
        )?;
        writeln!(
            f,
            "mini-epochs: {} ({}); no share of any epoch can exceed {}",
            self.mini_epochs,
            if self.mini_epochs_requested {
                "requested"
            } else {
                "the smallest that always fits"
            },
            b(self.share_bound)
        )?;
        writeln!(
            f,
            "mini-epoch bytes: min {}, max {}, mean {}",
            b(self.mini_epoch_bytes.min),
            b(self.mini_epoch_bytes.max),
            b(self.mini_epoch_bytes.mean as u64)
        )?;
        writeln!(
            f,
            "share bytes: min {}, max {}, mean {}; samples per share {}..{}",
            b(self.share_bytes.min),
            b(self.share_bytes.max),
            b(self.share_bytes.mean as u64),
            self.share_samples.0,
            self.share_samples.1
        )?;
        for nb in &self.node_bytes {
            writeln!(
                f,
                "node {}: {} samples, {} over the epoch, shares {}..{}{}",
                nb.node,
                nb.samples,
                b(nb.bytes),
                b(nb.smallest_share),
                b(nb.largest_share),
                if nb.node == self.node_rank {
                    " (this node)"
                } else {
                    ""
                }
            )?;
        }
        if self.copied_samples > 0 {
            writeln!(
                f,
                "copied into every share: {} samples, {}",
                self.copied_samples,
                b(self.copied_bytes)
            )?;
        }
        if let Some(c) = &self.classes {
            writeln!(
                f,
                "{}s: {} ({} copied); per mini-epoch counts are within {:.2} of even",
                c.by, c.classes, c.copied_classes, c.max_deviation
            )?;
            if let Some(table) = &c.per_mini_epoch {
                for row in table {
                    writeln!(f, "  {}: {:?}", row.class, row.counts)?;
                }
            } else {
                // The widest spreads are the interesting ones with a thousand classes.
                let mut rows: Vec<&ClassSpread> = c.spread.iter().collect();
                rows.sort_by_key(|r| Reverse(r.max - r.min));
                for r in rows.iter().take(5) {
                    writeln!(
                        f,
                        "  {}: {}..{} per mini-epoch (even {:.1}){}",
                        r.class,
                        r.min,
                        r.max,
                        r.ideal,
                        if r.copied { ", copied" } else { "" }
                    )?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::{prop, prop_assert, prop_assert_eq, prop_oneof, proptest, Just};
    use proptest::strategy::Strategy as _;
    use std::collections::BTreeMap;
    use std::sync::atomic::AtomicUsize;

    /// Alternating-path flips performed, to show the tests reach that code.
    pub(super) static FLIPS: AtomicUsize = AtomicUsize::new(0);

    fn cfg(strategy: Strategy, slot_bytes: u64, nodes: u32) -> PlanConfig {
        PlanConfig {
            strategy,
            seed: 7,
            slot_bytes,
            mini_epochs: None,
            node_rank: 0,
            nodes,
        }
    }

    fn set<'a>(sizes: &'a [u64], labels: &'a [u32], clusters: &'a [u32]) -> SampleSet<'a> {
        SampleSet {
            sizes,
            labels: Some(labels),
            clusters: Some(clusters),
        }
    }

    /// Every node's plan of `epoch`.
    fn all_nodes(s: &SampleSet<'_>, c: &PlanConfig, epoch: u64) -> Vec<EpochPlan> {
        (0..c.nodes)
            .map(|r| {
                let cfg = PlanConfig {
                    node_rank: r,
                    ..c.clone()
                };
                plan_epoch(s, &cfg, epoch).unwrap()
            })
            .collect()
    }

    /// Checks every promise of the module for one epoch; returns shares[m][r] without copies.
    fn check(s: &SampleSet<'_>, c: &PlanConfig, epoch: u64) -> Result<Vec<Vec<Vec<u32>>>, String> {
        let n = s.sizes.len();
        let lay = layout(s, c).map_err(|e| e.to_string())?;
        let nm = lay.nm as usize;
        let nodes = c.nodes as usize;
        let plans = all_nodes(s, c, epoch);
        let copied: Vec<u32> = plans[0].copied.clone();
        let is_copied = |id: u32| copied.binary_search(&id).is_ok();
        let mut seen = vec![0u32; n];
        let mut shares = vec![vec![Vec::new(); nodes]; nm];
        for (r, plan) in plans.iter().enumerate() {
            if plan.epoch != epoch || plan.mini_epochs.len() != nm || plan.copied != copied {
                return Err(format!("node {r}: wrong shape"));
            }
            for (m, me) in plan.mini_epochs.iter().enumerate() {
                if !me.samples.windows(2).all(|w| w[0] < w[1]) {
                    return Err(format!("share ({m},{r}) not ascending"));
                }
                let bytes: u64 = me.samples.iter().map(|&i| s.sizes[i as usize]).sum();
                let cb: u64 = copied.iter().map(|&i| s.sizes[i as usize]).sum();
                if bytes != me.bytes || cb != me.copied_bytes {
                    return Err(format!("share ({m},{r}) bytes wrong"));
                }
                if me.bytes > c.slot_bytes {
                    return Err(format!(
                        "share ({m},{r}) holds {} > {}",
                        me.bytes, c.slot_bytes
                    ));
                }
                if let Some(b) = lay.bound {
                    if me.bytes > b {
                        return Err(format!("share ({m},{r}) {} above bound {b}", me.bytes));
                    }
                }
                for &id in &me.samples {
                    if !is_copied(id) {
                        seen[id as usize] += 1;
                        shares[m][r].push(id);
                    }
                }
                if copied
                    .iter()
                    .any(|id| me.samples.binary_search(id).is_err())
                {
                    return Err(format!("share ({m},{r}) lacks a copy"));
                }
            }
        }
        for (id, &k) in seen.iter().enumerate() {
            if !is_copied(id as u32) && k != 1 {
                return Err(format!("sample {id} planned {k} times"));
            }
        }
        let size = |ids: &Vec<u32>| ids.iter().map(|&i| s.sizes[i as usize]).sum::<u64>();
        let planned_max = (0..n as u32)
            .filter(|&i| !is_copied(i))
            .map(|i| s.sizes[i as usize])
            .max()
            .unwrap_or(0);
        match c.strategy {
            Strategy::Sequential => {
                let flat: Vec<u32> = shares.iter().flatten().flatten().copied().collect();
                if flat != (0..n as u32).collect::<Vec<_>>() {
                    return Err("sequential shares are not contiguous in order".into());
                }
            }
            _ => {
                let counts: Vec<usize> = shares.iter().flatten().map(Vec::len).collect();
                let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
                if hi - lo > 1 {
                    return Err(format!("share sample counts {lo}..{hi}"));
                }
                for (m, me) in shares.iter().enumerate() {
                    let b: Vec<u64> = me.iter().map(size).collect();
                    let spread = b.iter().max().unwrap() - b.iter().min().unwrap();
                    if spread > planned_max {
                        return Err(format!(
                            "mini-epoch {m} node bytes spread {spread} > {planned_max}"
                        ));
                    }
                }
                let me_bytes: Vec<u64> =
                    shares.iter().map(|me| me.iter().map(size).sum()).collect();
                let spread = me_bytes.iter().max().unwrap() - me_bytes.iter().min().unwrap();
                if c.strategy != Strategy::Random && spread > planned_max {
                    return Err(format!("mini-epoch bytes spread {spread} > {planned_max}"));
                }
            }
        }
        let classes = match c.strategy {
            Strategy::Stratified => s.labels,
            Strategy::Clustered => s.clusters,
            _ => None,
        };
        if let Some(col) = classes {
            let mut total: BTreeMap<u32, usize> = BTreeMap::new();
            for (id, &cl) in col.iter().enumerate() {
                if !is_copied(id as u32) {
                    *total.entry(cl).or_default() += 1;
                }
            }
            for (&cl, &t) in &total {
                for (m, me) in shares.iter().enumerate() {
                    let per_node: Vec<usize> = me
                        .iter()
                        .map(|ids| ids.iter().filter(|&&i| col[i as usize] == cl).count())
                        .collect();
                    let k: usize = per_node.iter().sum();
                    if k < t / nm || k > t.div_ceil(nm) {
                        return Err(format!("class {cl}: {k} in mini-epoch {m}, ideal {t}/{nm}"));
                    }
                    let (lo, hi) = (
                        per_node.iter().min().unwrap(),
                        per_node.iter().max().unwrap(),
                    );
                    if hi - lo > 1 {
                        return Err(format!("class {cl} mini-epoch {m}: nodes hold {lo}..{hi}"));
                    }
                }
            }
        }
        if c.strategy == Strategy::Clustered {
            let parts = nm * nodes;
            let mut count: BTreeMap<u32, usize> = BTreeMap::new();
            for &cl in s.clusters.unwrap() {
                *count.entry(cl).or_default() += 1;
            }
            for (id, &cl) in s.clusters.unwrap().iter().enumerate() {
                if is_copied(id as u32) != (count[&cl] < parts) {
                    return Err(format!("cluster {cl} copied wrongly"));
                }
            }
        }
        Ok(shares)
    }

    fn digest(plans: &[EpochPlan]) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |x: u64| {
            for b in x.to_le_bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        };
        for p in plans {
            for me in &p.mini_epochs {
                eat(u64::MAX);
                me.samples.iter().for_each(|&i| eat(u64::from(i)));
            }
        }
        h
    }

    /// A fixed dataset: 600 samples, lognormal-ish sizes, 5 labels, clusters of 1..40.
    fn fixture() -> (Vec<u64>, Vec<u32>, Vec<u32>) {
        let mut x: u64 = 1;
        let mut next = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            x >> 33
        };
        let sizes = (0..600)
            .map(|_| 1000 + next() % 5000 + (next() % 50) * (next() % 200))
            .collect();
        let labels = (0..600).map(|_| (next() % 5) as u32).collect();
        let clusters = (0..600)
            .map(|i| {
                if i < 560 {
                    (next() % 8) as u32
                } else {
                    8 + (i % 3) as u32
                }
            })
            .collect();
        (sizes, labels, clusters)
    }

    #[test]
    fn every_strategy_keeps_its_promises_on_a_fixture() {
        let (sizes, labels, clusters) = fixture();
        let s = set(&sizes, &labels, &clusters);
        let total: u64 = sizes.iter().sum();
        for strategy in [
            Strategy::Sequential,
            Strategy::Random,
            Strategy::Stratified,
            Strategy::Clustered,
        ] {
            for nodes in [1, 2, 3] {
                let c = cfg(strategy, total / 9, nodes);
                for epoch in 0..3 {
                    check(&s, &c, epoch)
                        .unwrap_or_else(|e| panic!("{strategy} x{nodes} e{epoch}: {e}"));
                }
            }
        }
    }

    #[test]
    fn two_nodes_are_disjoint_and_cover() {
        let (sizes, labels, clusters) = fixture();
        let s = set(&sizes, &labels, &clusters);
        let c = cfg(Strategy::Random, sizes.iter().sum::<u64>() / 5, 2);
        let plans = all_nodes(&s, &c, 4);
        for m in 0..plans[0].mini_epochs.len() {
            let a = &plans[0].mini_epochs[m].samples;
            let b = &plans[1].mini_epochs[m].samples;
            assert!(
                a.iter().all(|x| b.binary_search(x).is_err()),
                "overlap in {m}"
            );
        }
        let mut all: Vec<u32> = plans
            .iter()
            .flat_map(|p| p.mini_epochs.iter().flat_map(|m| m.samples.clone()))
            .collect();
        all.sort_unstable();
        assert_eq!(all, (0..600).collect::<Vec<u32>>());
    }

    #[test]
    fn compositions_change_between_epochs_but_not_between_calls() {
        let (sizes, labels, clusters) = fixture();
        let s = set(&sizes, &labels, &clusters);
        let total: u64 = sizes.iter().sum();
        for strategy in [
            Strategy::Random,
            Strategy::Stratified,
            Strategy::Clustered,
            Strategy::Sequential,
        ] {
            let c = cfg(strategy, total / 6, 2);
            let e0 = all_nodes(&s, &c, 0);
            assert_eq!(e0, all_nodes(&s, &c, 0), "{strategy} not deterministic");
            let e1 = all_nodes(&s, &c, 1);
            if strategy == Strategy::Sequential {
                assert_eq!(e0[0].mini_epochs, e1[0].mini_epochs);
            } else {
                assert_ne!(e0[0].mini_epochs, e1[0].mini_epochs, "{strategy} repeats");
            }
            let other_seed = PlanConfig {
                seed: 8,
                ..c.clone()
            };
            if strategy != Strategy::Sequential {
                assert_ne!(
                    e0,
                    all_nodes(&s, &other_seed, 0),
                    "{strategy} ignores the seed"
                );
            }
        }
    }

    fn fixture_digests() -> Vec<u64> {
        let (sizes, labels, clusters) = fixture();
        let s = set(&sizes, &labels, &clusters);
        let total: u64 = sizes.iter().sum();
        [
            Strategy::Sequential,
            Strategy::Random,
            Strategy::Stratified,
            Strategy::Clustered,
        ]
        .into_iter()
        .map(|st| digest(&all_nodes(&s, &cfg(st, total / 7, 3), 5)))
        .collect()
    }

    /// Plans must not change between builds, machines or library updates: a restarted daemon
    /// and every other node must compute the same mini-epochs. If this fails after an
    /// intended change to the planner, plans made by older versions will differ from new ones.
    #[test]
    fn plans_match_pinned_digests() {
        assert_eq!(fixture_digests(), PINNED);
    }

    const PINNED: [u64; 4] = [
        8111104992998749077,
        15552393013689220745,
        6332503907179678073,
        17213624272201197621,
    ];

    #[test]
    fn same_plan_in_another_process() {
        const VAR: &str = "METFS_PLANNER_DIGEST_CHILD";
        if std::env::var_os(VAR).is_some() {
            println!("digests={:?}", fixture_digests());
            return;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "planner::tests::same_plan_in_another_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(VAR, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout
            .find("digests=")
            .and_then(|at| stdout[at..].lines().next())
            .unwrap_or_else(|| panic!("child printed no digest: {stdout}"));
        assert_eq!(line, format!("digests={:?}", fixture_digests()));
    }

    #[test]
    fn nm_is_the_smallest_guaranteed() {
        let (sizes, labels, clusters) = fixture();
        let s = set(&sizes, &labels, &clusters);
        let total: u64 = sizes.iter().sum();
        for slot in [total / 3, total / 10, total / 40, 20_000] {
            for nodes in [1u32, 4] {
                for st in [Strategy::Random, Strategy::Stratified] {
                    let c = cfg(st, slot, nodes);
                    let nm = mini_epoch_count(&s, &c).unwrap() as u64;
                    let stats = SizeStats::of(sizes.iter().copied());
                    let b =
                        |nm: u64| share_bound(600, total, stats.max, &stats, nm * u64::from(nodes));
                    assert!(b(nm) <= slot);
                    assert!(nm == 1 || b(nm - 1) > slot, "{st} nm {nm} not smallest");
                    // Asking for one fewer is refused and names nm.
                    if nm > 1 {
                        let ask = PlanConfig {
                            mini_epochs: Some(nm as u32 - 1),
                            ..c.clone()
                        };
                        match mini_epoch_count(&s, &ask) {
                            Err(PlanError::TooFewMiniEpochs { needed, bytes, .. }) => {
                                assert_eq!(u64::from(needed), nm);
                                assert!(bytes > slot);
                            }
                            other => panic!("{other:?}"),
                        }
                    }
                }
                let c = cfg(Strategy::Sequential, slot, nodes);
                let nm = mini_epoch_count(&s, &c).unwrap() as u64;
                let runs = fewest_runs(&sizes, slot);
                assert!(nm * u64::from(nodes) >= runs && (nm - 1) * u64::from(nodes) < runs);
            }
        }
    }

    #[test]
    fn singletons_when_only_one_sample_fits() {
        let sizes = vec![10u64, 9, 10, 8, 10];
        let s = SampleSet {
            sizes: &sizes,
            labels: None,
            clusters: None,
        };
        let c = cfg(Strategy::Random, 12, 2);
        assert_eq!(mini_epoch_count(&s, &c).unwrap(), 3);
        check(&s, &c, 0).unwrap();
        let c = cfg(Strategy::Sequential, 12, 1);
        assert_eq!(mini_epoch_count(&s, &c).unwrap(), 5);
    }

    #[test]
    fn errors() {
        let sizes = vec![5u64, 50, 7, 50];
        let labels = [0u32; 4];
        let plain = SampleSet {
            sizes: &sizes,
            labels: None,
            clusters: None,
        };
        let c = cfg(Strategy::Random, 40, 1);
        assert_eq!(
            mini_epoch_count(&plain, &c),
            Err(PlanError::SampleTooLarge {
                sample: 1,
                size: 50,
                slot_bytes: 40
            })
        );
        let c = cfg(Strategy::Stratified, 100, 1);
        assert_eq!(
            mini_epoch_count(&plain, &c),
            Err(PlanError::MissingClasses(Strategy::Stratified, "labels"))
        );
        let c = cfg(Strategy::Clustered, 100, 1);
        assert!(matches!(
            mini_epoch_count(&plain, &c),
            Err(PlanError::MissingClasses(..))
        ));
        let c = PlanConfig {
            node_rank: 2,
            ..cfg(Strategy::Random, 100, 2)
        };
        assert_eq!(
            mini_epoch_count(&plain, &c),
            Err(PlanError::BadNode { rank: 2, nodes: 2 })
        );
        let c = cfg(Strategy::Random, 100, 0);
        assert!(matches!(
            mini_epoch_count(&plain, &c),
            Err(PlanError::BadNode { .. })
        ));
        let empty = SampleSet {
            sizes: &[],
            labels: None,
            clusters: None,
        };
        assert_eq!(
            mini_epoch_count(&empty, &cfg(Strategy::Random, 1, 1)),
            Err(PlanError::Empty)
        );
        let short = SampleSet {
            sizes: &sizes,
            labels: Some(&labels[..2]),
            clusters: None,
        };
        assert!(matches!(
            mini_epoch_count(&short, &cfg(Strategy::Random, 100, 1)),
            Err(PlanError::LengthMismatch {
                what: "labels",
                len: 2,
                samples: 4
            })
        ));
        let c = PlanConfig {
            mini_epochs: Some(5),
            ..cfg(Strategy::Random, 100, 1)
        };
        assert_eq!(
            mini_epoch_count(&plain, &c),
            Err(PlanError::TooManyMiniEpochs {
                requested: 5,
                samples: 4
            })
        );
        let c = PlanConfig {
            mini_epochs: Some(0),
            ..cfg(Strategy::Random, 100, 1)
        };
        assert!(matches!(
            mini_epoch_count(&plain, &c),
            Err(PlanError::TooFewMiniEpochs { requested: 0, .. })
        ));
        for st in [Strategy::Sequential, Strategy::Random] {
            let c = PlanConfig {
                mini_epochs: Some(1),
                ..cfg(st, 100, 1)
            };
            match mini_epoch_count(&plain, &c) {
                Err(PlanError::TooFewMiniEpochs {
                    requested: 1,
                    bytes,
                    slot_bytes: 100,
                    needed,
                }) => {
                    assert!(bytes > 100 && needed >= 2, "{st}: {bytes} {needed}");
                }
                other => panic!("{st}: {other:?}"),
            }
        }
        // Every cluster is tiny, so every share would hold a copy of everything.
        let clusters = vec![0u32, 1, 2, 3];
        let s = SampleSet {
            sizes: &sizes,
            labels: None,
            clusters: Some(&clusters),
        };
        assert_eq!(
            mini_epoch_count(&s, &cfg(Strategy::Clustered, 100, 1)),
            Err(PlanError::ClustersTooLarge {
                best: 112,
                slot_bytes: 100
            })
        );
    }

    #[test]
    fn clustered_copies_small_clusters_everywhere_and_counts_them() {
        // Cluster 0: 40 samples; cluster 1: 2 samples (fewer than the shares).
        let sizes: Vec<u64> = (0..42).map(|i| 100 + i).collect();
        let clusters: Vec<u32> = (0..42).map(|i| u32::from(i >= 40)).collect();
        let s = SampleSet {
            sizes: &sizes,
            labels: None,
            clusters: Some(&clusters),
        };
        let c = cfg(Strategy::Clustered, 1200, 2);
        let nm = mini_epoch_count(&s, &c).unwrap();
        assert!(nm * 2 > 2);
        check(&s, &c, 0).unwrap();
        let plan = plan_epoch(&s, &c, 0).unwrap();
        assert_eq!(plan.copied, vec![40, 41]);
        assert!(plan.mini_epochs.iter().all(|m| m.copied_bytes == 281));
        let sum = summarize(&s, &c, 0, None).unwrap();
        assert_eq!((sum.copied_samples, sum.copied_bytes), (2, 281));
        let cl = sum.classes.unwrap();
        assert_eq!((cl.by, cl.classes, cl.copied_classes), ("cluster", 2, 1));
    }

    #[test]
    fn summary_reports_counts_and_bounds() {
        let (sizes, labels, clusters) = fixture();
        let s = set(&sizes, &labels, &clusters);
        let total: u64 = sizes.iter().sum();
        let c = cfg(Strategy::Stratified, total / 9, 2);
        let names: Vec<String> = (0..5).map(|i| format!("class{i}")).collect();
        let sum = summarize(&s, &c, 0, Some(&names)).unwrap();
        assert_eq!(sum.mini_epochs, mini_epoch_count(&s, &c).unwrap());
        assert_eq!(sum.samples, 600);
        assert_eq!(sum.total_bytes, total);
        assert!(sum.share_bytes.max <= sum.share_bound && sum.share_bound <= c.slot_bytes);
        assert_eq!(sum.node_bytes.iter().map(|n| n.bytes).sum::<u64>(), total);
        let cl = sum.classes.as_ref().unwrap();
        assert!(cl.max_deviation < 1.0);
        let table = cl.per_mini_epoch.as_ref().unwrap();
        assert_eq!(table[0].class, "class0");
        assert_eq!(
            table
                .iter()
                .map(|r| r.counts.iter().sum::<u64>())
                .sum::<u64>(),
            600
        );
        let text = sum.to_string();
        assert!(
            text.contains("stratified") && text.contains("class0"),
            "{text}"
        );
        let json = serde_json::to_value(&sum).unwrap();
        assert_eq!(json["strategy"], "stratified");
        // A thousand classes: no full table, a capped list.
        let many: Vec<u32> = (0..600).map(|i| i % 300).collect();
        let s2 = SampleSet {
            sizes: &sizes,
            labels: Some(&many),
            clusters: None,
        };
        let sum = summarize(&s2, &c, 0, None).unwrap();
        let cl = sum.classes.unwrap();
        assert!(cl.per_mini_epoch.is_none() && cl.spread.len() == 300 && !cl.truncated);
    }

    fn arb_sizes(n: usize) -> impl proptest::strategy::Strategy<Value = Vec<u64>> {
        prop_oneof![
            prop::collection::vec(0u64..100, n),
            prop::collection::vec(prop_oneof![Just(1u64), Just(1u64), Just(1000u64)], n),
            prop::collection::vec(1u64..1_000_000, n),
        ]
    }

    fn arb_input(
    ) -> impl proptest::strategy::Strategy<Value = (Vec<u64>, Vec<u32>, Vec<u32>, u32, u64, Option<u32>)>
    {
        (1usize..160, 1u32..9, 1u32..40).prop_flat_map(|(n, ncl, nclu)| {
            (
                arb_sizes(n),
                prop::collection::vec(0..ncl, n),
                prop::collection::vec(0..nclu, n),
                1u32..5,
                0u64..1000,
                prop::option::weighted(0.2, 1u32..12),
            )
        })
    }

    fn run_property(
        strategy: Strategy,
        input: (Vec<u64>, Vec<u32>, Vec<u32>, u32, u64, Option<u32>),
    ) -> Result<(), String> {
        let (sizes, labels, clusters, nodes, frac, req) = input;
        let s = set(&sizes, &labels, &clusters);
        let total: u64 = sizes.iter().sum();
        let max = sizes.iter().copied().max().unwrap();
        let slot = max + total * frac / 1000;
        let c = PlanConfig {
            mini_epochs: req,
            ..cfg(strategy, slot, nodes)
        };
        match layout(&s, &c) {
            Err(PlanError::TooFewMiniEpochs { needed, .. }) => {
                let ok = PlanConfig {
                    mini_epochs: Some(needed),
                    ..c.clone()
                };
                check(&s, &ok, 0)?;
                return Ok(());
            }
            Err(PlanError::TooManyMiniEpochs { .. }) if req.is_some() => return Ok(()),
            Err(PlanError::ClustersTooLarge { .. }) if strategy == Strategy::Clustered => {
                return Ok(())
            }
            Err(e) => return Err(e.to_string()),
            Ok(_) => {}
        }
        let a = check(&s, &c, 0)?;
        let b = check(&s, &c, 1)?;
        if strategy == Strategy::Sequential && a != b {
            return Err("sequential changed between epochs".into());
        }
        if all_nodes(&s, &c, 3) != all_nodes(&s, &c, 3) {
            return Err("not deterministic".into());
        }
        Ok(())
    }

    /// Sizes anywhere in u64, with many near the top, where sums and roundings overflow.
    fn arb_huge_size() -> impl proptest::strategy::Strategy<Value = u64> {
        prop_oneof![
            Just(u64::MAX),
            Just(u64::MAX - 1),
            Just(1u64 << 63),
            Just(0u64),
            (u64::MAX - 10_000)..=u64::MAX,
            0u64..=u64::MAX,
            0u64..1000,
        ]
    }

    proptest! {
        #![proptest_config(proptest::test_runner::Config { cases: 400, ..Default::default() })]

        /// Any sizes and budget: the planner answers (a plan or an error), never panics or
        /// wraps; a plan's mini-epochs fit the slot and cover the node's share once.
        #[test]
        fn prop_huge_sizes_never_overflow(
            sizes in prop::collection::vec(arb_huge_size(), 1..12),
            slot in prop_oneof![Just(u64::MAX), 0u64..=u64::MAX, 0u64..100_000],
            strategy in prop_oneof![
                Just(Strategy::Sequential),
                Just(Strategy::Random),
                Just(Strategy::Stratified),
                Just(Strategy::Clustered),
            ],
            nodes in 1u32..4,
            req in prop::option::weighted(0.3, 1u32..6),
        ) {
            let labels: Vec<u32> = (0..sizes.len() as u32).map(|i| i % 3).collect();
            let clusters: Vec<u32> = (0..sizes.len() as u32).map(|i| i % 2).collect();
            let s = set(&sizes, &labels, &clusters);
            let c = PlanConfig { mini_epochs: req, ..cfg(strategy, slot, nodes) };
            let total = sizes.iter().try_fold(0u64, |a, &b| a.checked_add(b));
            match plan_epoch(&s, &c, 1) {
                Err(PlanError::TotalTooLarge { .. }) => prop_assert!(total.is_none()),
                Err(_) => {}
                Ok(plan) => {
                    prop_assert!(total.is_some());
                    for me in &plan.mini_epochs {
                        prop_assert!(me.bytes <= slot);
                        let sum = me.samples.iter().map(|&i| u128::from(sizes[i as usize])).sum::<u128>();
                        prop_assert_eq!(sum, u128::from(me.bytes));
                    }
                    let _ = summarize(&s, &c, 1, None);
                }
            }
        }
    }

    proptest! {
        #![proptest_config(proptest::test_runner::Config { cases: 160, ..Default::default() })]

        #[test]
        fn prop_sequential(input in arb_input()) {
            prop_assert_eq!(run_property(Strategy::Sequential, input), Ok(()));
        }

        #[test]
        fn prop_random(input in arb_input()) {
            prop_assert_eq!(run_property(Strategy::Random, input), Ok(()));
        }

        #[test]
        fn prop_stratified(input in arb_input()) {
            prop_assert_eq!(run_property(Strategy::Stratified, input), Ok(()));
        }

        #[test]
        fn prop_clustered(input in arb_input()) {
            prop_assert_eq!(run_property(Strategy::Clustered, input), Ok(()));
        }

        /// The balancing step itself: class counts within one, colour counts within one,
        /// colour bytes within the largest sample.
        #[test]
        fn prop_balance(
            k in 1u32..12,
            groups in prop::collection::vec((1usize..30, 0u8..3), 1..25),
            seed in 0u64..1000,
        ) {
            let mut sizes = Vec::new();
            let mut bounds = vec![0usize];
            let mut x = seed;
            for &(len, kind) in &groups {
                for _ in 0..len {
                    x = splitmix64(&mut x);
                    sizes.push(match kind { 0 => x % 7, 1 => [1, 1, 1000][(x % 3) as usize], _ => x % 100_000 });
                }
                bounds.push(sizes.len());
            }
            let mut ids: Vec<u32> = (0..sizes.len() as u32).collect();
            let mut color = vec![NONE; sizes.len()];
            let mut rng = PlanRng::new(seed, 0);
            let mut sc = Scratch::default();
            balance(k, &mut ids, &bounds, &sizes, &mut rng, &mut sc, |id, c| {
                assert_eq!(color[id as usize], NONE);
                color[id as usize] = c;
            });
            let ku = k as usize;
            let mut load = vec![0u64; ku];
            let mut count = vec![0usize; ku];
            for (id, &c) in color.iter().enumerate() {
                prop_assert!((c as usize) < ku);
                load[c as usize] += sizes[id];
                count[c as usize] += 1;
            }
            let smax = sizes.iter().copied().max().unwrap();
            prop_assert!(load.iter().max().unwrap() - load.iter().min().unwrap() <= smax);
            prop_assert!(count.iter().max().unwrap() - count.iter().min().unwrap() <= 1);
            for w in bounds.windows(2) {
                let mut per = vec![0usize; ku];
                for id in w[0]..w[1] {
                    per[color[id] as usize] += 1;
                }
                let len = w[1] - w[0];
                prop_assert!(per.iter().all(|&p| p == len / ku || p == len.div_ceil(ku)));
            }
        }
    }

    #[test]
    fn alternating_paths_are_exercised() {
        // Many classes of k - 1 samples force sweeps where a class holds every free colour.
        let k = 5u32;
        let mut sizes = Vec::new();
        let mut bounds = vec![0];
        for g in 0..200u64 {
            for j in 0..4u64 {
                sizes.push((g * 7919 + j * 104_729) % 1000);
            }
            bounds.push(sizes.len());
        }
        let before = FLIPS.load(std::sync::atomic::Ordering::Relaxed);
        let mut ids: Vec<u32> = (0..sizes.len() as u32).collect();
        let mut color = vec![NONE; sizes.len()];
        balance(
            k,
            &mut ids,
            &bounds,
            &sizes,
            &mut PlanRng::new(1, 1),
            &mut Scratch::default(),
            |id, c| color[id as usize] = c,
        );
        assert!(
            FLIPS.load(std::sync::atomic::Ordering::Relaxed) > before,
            "no flip happened"
        );
        for w in bounds.windows(2) {
            let mut cs: Vec<u32> = color[w[0]..w[1]].to_vec();
            cs.sort_unstable();
            cs.dedup();
            assert_eq!(cs.len(), 4, "a class got one colour twice");
        }
    }

    #[test]
    fn rng_is_stable() {
        let mut r = PlanRng::new(1, 2);
        let v: Vec<u32> = (0..4).map(|_| r.below(1000)).collect();
        let mut r2 = PlanRng::new(1, 2);
        assert_eq!(v, (0..4).map(|_| r2.below(1000)).collect::<Vec<_>>());
        assert_ne!(
            PlanRng::new(1, 3).below(u32::MAX),
            PlanRng::new(1, 2).below(u32::MAX)
        );
    }
}
