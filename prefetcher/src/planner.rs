//! The planner: a pure function from (samples, seed, epoch, node rank, node count, budget,
//! strategy) to one epoch's mini-epochs for one node.
//!
//! INTERFACE FILE — the implementation is being written; the public types and function
//! signatures below are the contract the daemon codes against.

use serde::{Deserialize, Serialize};
use thiserror::Error;

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
    /// Sample ids of this node's share, in the order the plan chose.
    pub samples: Vec<u32>,
    /// Sum of the sizes of `samples`.
    pub bytes: u64,
}

/// One epoch's plan for one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochPlan {
    /// The epoch this plan is for.
    pub epoch: u64,
    /// The mini-epochs in order; always `mini_epochs` of them.
    pub mini_epochs: Vec<MiniEpoch>,
}

/// Errors of the planner.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PlanError {
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
    /// More mini-epochs than samples.
    #[error("{requested} mini-epochs is more than the {samples} samples")]
    TooManyMiniEpochs { requested: u32, samples: usize },
}
