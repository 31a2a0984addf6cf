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
//! and cover the epoch without any communication. Randomness comes only from `metfs-planrng`:
//! ChaCha8 keyed by a fixed SplitMix64 mix of `(seed, epoch)`, consumed by that crate's own
//! Fisher–Yates and Lemire bounded draws, so no change in `rand`'s algorithms can change a plan
//! (a test pins the digest of a small plan).
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
//! * `clustered`: as stratified over cluster ids, with small clusters copied by one of two
//!   rules ([`ClusterCopies`]). `per-node`, the default and paper 000's rule (its workers are
//!   our nodes): a cluster with fewer samples than nodes (`n_c < nodes`) is copied once to
//!   every node, the whole cluster into one mini-epoch of that node. The copies are spread
//!   over node 0's mini-epochs by the balancing step (one class, `k = nm`, the clusters as
//!   items, from the epoch's stream after the other samples are placed), so mini-epochs hold
//!   within one of the same number of copied clusters and their copy bytes are within the
//!   largest copied cluster of each other; node `r` uses node 0's placement shifted by
//!   `⌊r·nm/nodes⌋` mini-epochs, which keeps its loads the same and puts the nodes' copies of
//!   one cluster in different mini-epochs whenever `nm ≥ nodes`. `per-share`: a cluster with
//!   fewer samples than shares (`n_c < P`) is copied into every share, so each of its samples
//!   is read `P` times an epoch (docs/EXPERIMENTS.md measures what each rule over-weights).
//!
//! # The balancing step and its bound
//!
//! The permuting strategies share one step, `balance`: colour samples, grouped into classes
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
//! * `clustered`, `per-node`: the smallest `nm` for which the bound over the clusters that
//!   are not copied plus the bound of the balancing step over the copied clusters (`k = nm`,
//!   each cluster an item of its bytes) is at most `slot_bytes`; which clusters are copied
//!   does not depend on `nm`, both bounds fall as `nm` grows, and a binary search finds it.
//! * `clustered`, `per-share`: the smallest `nm` for which the bound over the clusters that
//!   are not copied, plus the copies, is at most `slot_bytes`. Copies grow with `nm`, so this
//!   is not monotone; every count from 1 up is tried until one fits.
//!
//! A requested `nm` that these rules cannot guarantee is refused with
//! [`PlanError::TooFewMiniEpochs`], naming the smallest count that is guaranteed.
//!
//! # Cost
//!
//! `O(n log n)` time (sorting within classes), a few `u32` per sample of memory, and no
//! allocation per sample: every buffer is sized once per plan and reused.
//!
//! # Layout
//!
//! This file holds the public types and the two entry points ([`mini_epoch_count`],
//! [`plan_epoch`]); each step has its own file: `rng` (the random stream), `bound` (input
//! checks and the share bound), `layout` (choosing nm), `sequential` (contiguous cuts),
//! `balance` (the balancing step), `assign` (samples to shares, per strategy), `summary`
//! (what `metfs plan` prints) and `shards` (an epoch's order cut into shards, for dynamic
//! sharding). Only this file's items, the summary, the shards and `dsa` are public.
//!
//! `dsa` is the planner for several jobs sharing one node's store: dependent sampling
//! (paper 004), which draws the jobs' orders together so that shared samples land in the same
//! mini-epochs while each job's order stays uniformly random. Its module docs hold the
//! algorithm and the two corrections to the printed pseudo-code.

use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

mod assign;
mod balance;
mod bound;
mod dsa;
mod layout;
mod rng;
mod sequential;
mod shards;
mod summary;

pub use dsa::{
    dependent_orders, dependent_views, DependentSampler, DsaError, SamplingTree, MAX_JOBS,
};
pub use shards::{epoch_order, shard_count, EpochOrder, Shard, ShardSpec};
pub use summary::{
    summarize, ByteStats, ClassCounts, ClassSpread, ClassSummary, NodeBytes, PlanSummary,
    FULL_TABLE_CLASSES, FULL_TABLE_MINI_EPOCHS, LISTED_CLASSES,
};

use assign::assign;
use layout::layout;

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
    /// As stratified, over cluster ids; small clusters are copied as [`ClusterCopies`] says.
    Clustered,
}

/// `clustered`: which small clusters are copied, and where the copies go. The default is
/// paper 000's rule, which reads a copied sample `nodes` times an epoch: `per-share` reads it
/// `mini-epochs × nodes` times, and on skewed cluster sizes its copies took 92 to 99.9 % of
/// the epoch's reads (docs/EXPERIMENTS.md, "Copies of small clusters").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ClusterCopies {
    /// Paper 000's rule: a cluster with fewer samples than nodes is copied once to every node,
    /// the whole cluster into one mini-epoch of that node. A sample of a copied cluster is
    /// read `nodes` times an epoch, whatever the mini-epoch count.
    #[default]
    PerNode,
    /// A cluster with fewer samples than shares (mini-epochs × nodes) is copied into every
    /// share: each of its samples is read mini-epochs × nodes times an epoch.
    PerShare,
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
    /// `clustered`: how small clusters are copied; the other strategies ignore it.
    #[serde(default)]
    pub cluster_copies: ClusterCopies,
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
    /// With `per-share` copies it is the same in every mini-epoch; with `per-node` copies it is
    /// the copied clusters this node was given in this mini-epoch.
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
    /// The samples of the copied clusters (`clustered`), ascending; empty otherwise. With
    /// `per-share` copies every mini-epoch holds all of them; with `per-node` copies each is
    /// in exactly one of this node's mini-epochs (every other node holds it once too).
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
    /// `clustered`: at every mini-epoch count, the copies of the small clusters plus the share
    /// of the rest exceed the budget.
    #[error("clustered: no mini-epoch count fits: {}, and the best count still needs {best} bytes per share, more than {slot_bytes}", copies.rule())]
    ClustersTooLarge {
        best: u64,
        slot_bytes: u64,
        copies: ClusterCopies,
    },
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

impl std::str::FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "sequential" => Ok(Strategy::Sequential),
            "random" => Ok(Strategy::Random),
            "stratified" => Ok(Strategy::Stratified),
            "clustered" => Ok(Strategy::Clustered),
            other => Err(format!(
                "unknown composition `{other}`; expected sequential, random, stratified or clustered"
            )),
        }
    }
}

impl ClusterCopies {
    /// The rule in words, for errors.
    fn rule(self) -> &'static str {
        match self {
            ClusterCopies::PerNode => {
                "clusters smaller than the number of nodes are copied once to every node"
            }
            ClusterCopies::PerShare => {
                "clusters smaller than the number of shares are copied into every share"
            }
        }
    }
}

impl fmt::Display for ClusterCopies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ClusterCopies::PerNode => "per-node",
            ClusterCopies::PerShare => "per-share",
        })
    }
}

impl std::str::FromStr for ClusterCopies {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "per-node" => Ok(ClusterCopies::PerNode),
            "per-share" => Ok(ClusterCopies::PerShare),
            other => Err(format!(
                "unknown cluster copy rule `{other}`; expected per-node or per-share"
            )),
        }
    }
}

/// Marks an empty table slot, and a sample of a copied cluster in an assignment.
const NONE: u32 = u32::MAX;

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
    let a = assign(samples, cfg, &layout, epoch);
    let (nodes, rank) = (cfg.nodes, cfg.node_rank);
    let nm = layout.nm as usize;
    // This node's mini-epoch of a copied sample; `None`: every mini-epoch holds it.
    let copy_in = |id: usize| {
        let cluster = samples.clusters?[id];
        a.copy_mini_epoch(cluster, rank).map(|m| m as usize)
    };
    // Count first so every share is allocated once at its final size.
    let mut counts = vec![0usize; nm];
    let (mut copied, mut everywhere) = (Vec::new(), 0usize);
    for (id, &p) in a.part_of.iter().enumerate() {
        if p == NONE {
            copied.push(id as u32);
            match copy_in(id) {
                Some(m) => counts[m] += 1,
                None => everywhere += 1,
            }
        } else if p % nodes == rank {
            counts[(p / nodes) as usize] += 1;
        }
    }
    let mut mini_epochs: Vec<MiniEpoch> = counts
        .iter()
        .map(|&c| MiniEpoch {
            samples: Vec::with_capacity(c + everywhere),
            bytes: 0,
            copied_bytes: 0,
        })
        .collect();
    for (id, &p) in a.part_of.iter().enumerate() {
        let size = samples.sizes[id];
        if p == NONE {
            let into = match copy_in(id) {
                Some(m) => &mut mini_epochs[m..=m],
                None => &mut mini_epochs[..],
            };
            for me in into {
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

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
