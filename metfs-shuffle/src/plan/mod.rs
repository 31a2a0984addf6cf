//! The aggregate-cache planner: a pure function from (catalog sizes, node count, seed, byte
//! budget per node, extra probability `p`, epoch) to what every node holds in that epoch, and
//! from two consecutive epochs to where every node gets each sample of the next one.
//!
//! # Shares
//!
//! Epoch `e`'s shares `S(e, 0..n)` are a uniformly random partition of the catalog: the
//! sample ids are permuted by `metfs-planrng`'s stream (ChaCha8, as in `metfs-plan`) seeded
//! from `(seed, e)` and the permuted order is cut into `n` contiguous runs of (as nearly as
//! the sizes allow) equal bytes: run `i` ends at the first position where the bytes so far
//! reach `(i+1)·T/n`. With equal sizes this
//! is the paper's equal-count split (counts differ by at most one); with mixed sizes it keeps
//! every share within one sample of `T/n` bytes, which is what the budget cares about. An
//! all-empty catalog (`T = 0`) is cut by count.
//!
//! # Caches and the extras
//!
//! Node `i` holds `C(e, i) = S(e, i) ∪ X(e, i)`. The extras `X(e, i)` are the samples outside
//! the share whose draw `u(seed, i, j)` is below `p`, taken in increasing draw order while they
//! fit in the budget left by the share (a sample too big for what is left is skipped, the walk
//! goes on). The draw depends on `(seed, node, sample)` but **not on the epoch**: a node's
//! extras are kept from epoch to epoch. Redrawing them every epoch would make each node fetch
//! a fresh `p`-fraction of the dataset every epoch, the very traffic the cache exists to save,
//! while the paper's analysis (Theorem 1) needs only that, at each epoch, each node holds each
//! sample outside its share independently with probability `p`, which one draw per
//! `(node, sample)` gives at every epoch (the shares are drawn independently of it). Only the
//! budget cut moves with the epoch, since the share it leaves room for changes; the few
//! extras it lets in that the node did not hold are fetched like any other sample.
//!
//! With a large enough budget the expected fraction a node holds is `α = 1/n + p(1 − 1/n)`,
//! the paper's `p = (s − q/n)/(q − q/n)` read backwards.
//!
//! # The transition
//!
//! [`transition`] lists, for each live node of epoch `e + 1`, where each sample of
//! `C(e + 1, i)` comes from, exactly one source per sample:
//! 1. **local**: the node held it in epoch `e` (the daemon links it);
//! 2. **peer**: else its epoch-`e` owner (the node whose share held it, which always holds
//!    it) if alive; else the live holder that has been given the fewest bytes to send so far
//!    (ties to the lowest rank). The owner first because each node then sends what leaves its
//!    own share, about the same amount for every node, and because it needs no holder lookup;
//! 3. **tier**: else (epoch 0, or every holder dead).
//!
//! So after epoch 0 the tier is read only for samples whose every holder is dead: every
//! sample is in some share, and its owner holds it. Dead nodes receive nothing.
//!
//! # Samples of several files
//!
//! Where a sample is several files, the layout is computed over the samples and expanded to
//! files ([`Layout::over_files`]): a sample's files go where it goes, files in every view are
//! in every share and cache (so every node holds them, and the transition links them), and
//! files of no sample are in none. The transition then works on files unchanged, and a
//! sample's files, held by the same nodes, come from the same source.
//!
//! # Invariants (tested)
//!
//! * The shares partition `0..N` every epoch (less the files in every view, in every share);
//!   each share and each cache fits the budget.
//! * Same inputs, same layout (the epoch and seed are the only randomness).
//! * Each sample of each live node's next cache has exactly one source; a peer source held
//!   the sample and is alive; no tier reads after epoch 0 unless holders died.

mod layout;
mod transition;

#[cfg(test)]
mod tests;

pub use layout::{layout, Layout, NO_OWNER};
pub use transition::{transition, NodePlan, Transition};

use thiserror::Error;

/// The settings of aggregate-cache mode that a layout depends on, the same on every node.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AggregateConfig {
    /// Number of nodes (ranks `0..nodes`).
    pub nodes: u32,
    /// Seed of every random choice.
    pub seed: u64,
    /// Most bytes one node may hold for one epoch (its share plus its extras).
    pub budget: u64,
    /// Probability `p` that a node keeps a sample outside its share (budget permitting).
    pub extra: f64,
}

/// Errors of the planner.
#[derive(Debug, Error, PartialEq)]
pub enum PlanError {
    /// No nodes.
    #[error("aggregate mode needs at least one node")]
    NoNodes,
    /// The catalog is empty.
    #[error("the dataset has no samples")]
    Empty,
    /// More samples than sample ids can count.
    #[error("the dataset has {0} samples, more than 2^32")]
    TooManySamples(usize),
    /// The sizes add up to more than 2^64 bytes.
    #[error("the sizes of the samples add up to more than 2^64 bytes (past sample {sample})")]
    TotalTooLarge { sample: u32 },
    /// `p` is not a probability.
    #[error("the extra probability must be in [0, 1], not {0}")]
    BadExtra(f64),
    /// One sample does not fit a node's budget.
    #[error("sample {sample} is {size} bytes, more than the {budget}-byte budget of one node")]
    SampleTooLarge { sample: u32, size: u64, budget: u64 },
    /// The dataset is larger than the nodes' budgets together.
    #[error(
        "the dataset does not fit the aggregate budget: {total} bytes in {samples} samples, \
         but {nodes} nodes × {budget} bytes = {aggregate} bytes ({missing} bytes short); \
         use more nodes or a larger budget"
    )]
    DoesNotFit {
        total: u64,
        samples: u32,
        nodes: u32,
        budget: u64,
        aggregate: u128,
        missing: u128,
    },
    /// The dataset fits the aggregate budget, but one epoch's random share does not fit its
    /// node (less than about one sample of slack per node).
    #[error(
        "epoch {epoch}: node {node}'s share is {share} bytes, more than its {budget}-byte \
         budget; the dataset ({total} bytes) leaves {slack} bytes of slack per node, less \
         than the largest sample ({largest} bytes) the random cut may add"
    )]
    ShareTooLarge {
        epoch: u64,
        node: u32,
        share: u64,
        budget: u64,
        total: u64,
        slack: u64,
        largest: u64,
    },
    /// Two layouts (or a layout and a catalog) that do not belong together.
    #[error("layouts do not match: {0}")]
    Mismatch(String),
    /// A dead node's rank is out of range.
    #[error("node rank {rank} is not in 0..{nodes}")]
    BadNode { rank: u32, nodes: u32 },
}
