//! The `[aggregate]` settings: aggregate-cache mode (`metfs mount --aggregate`), where the
//! nodes of a job hold the dataset together and each epoch's new shares are filled from the
//! other nodes' caches instead of the capacity tier. The daemon's side is `crate::daemon`'s
//! `aggregate` module; the exchange between nodes is `metfs-shuffle`, one MPI rank per node
//! (the `metfs-exchange` crate), whose [`ShuffleCode`] the `code` setting is.

use serde::{Deserialize, Serialize};

/// How samples cross between nodes: the exchange's type, a flag value here.
pub use metfs_exchange::ShuffleCode;

/// Aggregate-cache mode (`[aggregate]` in the config file, `--aggregate` and `--shuffle-*`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(default, deny_unknown_fields)]
pub struct AggregateConfig {
    /// The nodes hold the dataset together: each epoch is one mini-epoch per node (its share
    /// of a random partition), read from the tier in epoch 0 and afterwards from the other
    /// nodes' caches by `metfs-shuffle`; off: every node reads its shards from the tier.
    #[arg(id = "aggregate.enabled", long = "aggregate", action = clap::ArgAction::Set,
        num_args = 0..=1, require_equals = true, default_missing_value = "true",
        default_value_t = false)]
    pub enabled: bool,
    /// Probability that a node keeps a sample outside its share (as the budget allows): the
    /// side information coded multicast feeds on, and local hits for the uncoded exchange.
    /// 0 keeps the share only, the least disk.
    #[arg(id = "aggregate.extra", long = "shuffle-extra",
        default_value_t = AggregateConfig::default().extra)]
    pub extra: f64,
    /// How samples cross between nodes: `uncoded` (each sent once by one holder) or
    /// `uberShuffle` (coded multicast). Uncoded is the default (docs/BENCHMARKS.md compares
    /// the bytes each sends).
    #[arg(id = "aggregate.code", long = "shuffle-code", value_enum,
        default_value_t = AggregateConfig::default().code)]
    pub code: ShuffleCode,
    /// Seconds a staging waits for the exchange before it fetches what is missing from the
    /// tier (a node died, or `metfs-shuffle` is not running). Long enough for a large epoch
    /// over a slow network, short enough that a dead peer costs one slow epoch: 600 s.
    #[arg(id = "aggregate.timeout_secs", long = "shuffle-timeout-secs",
        default_value_t = AggregateConfig::default().timeout_secs)]
    pub timeout_secs: u64,
}

impl Default for AggregateConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            extra: 0.0,
            code: ShuffleCode::Uncoded,
            timeout_secs: 600,
        }
    }
}
