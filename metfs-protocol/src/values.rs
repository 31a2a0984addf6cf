//! The closed sets of values in replies and requests, each an enum: the schema lists its values
//! and a reader refuses any other. Each is spelled on the wire as the daemon's settings spell
//! it (`--read-path`, `--compose`, `--shard-done`, `--shuffle-code`, `--rf-policy`).
//!
//! The daemon's own enums live in crates that do not depend on this one (`metfs-fs`,
//! `metfs-plan`, `metfs-dds`, `metfs-exchange`); the daemon converts them where it builds a
//! reply. The rf policy is `metfs-feedback`'s [`PolicyKind`], and a policy's reason its
//! [`Reason`] (one shape per policy), both re-exported here.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use metfs_feedback::config::PolicyKind;
pub use metfs_feedback::policy::{Bound, Bounds, HeldOut, LearnedSource, PacedWhy, Reason};

/// How reads of staged files reach the kernel: the read path in use (`auto` resolved, and
/// `pread` after a fall-back from a refused passthrough).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReadPath {
    /// The kernel caches file pages for the view's life; reads rarely reach the daemon.
    Cached,
    /// Kernel FUSE passthrough: the kernel reads the slot file itself.
    Passthrough,
    /// The daemon `pread`s the slot file for every cache miss.
    Pread,
}

/// How samples are composed into mini-epochs (the composition strategy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Compose {
    /// The contiguous split, in catalog (path) order; the same in every epoch.
    Sequential,
    /// A seeded permutation composed afresh each epoch.
    Random,
    /// Each class spread round-robin over the mini-epochs.
    Stratified,
    /// As stratified, over cluster ids.
    Clustered,
}

/// When the shards of a view are marked DONE on a dynamic-sharding queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ShardDone {
    /// At the end of the view's first completed pass.
    #[default]
    AfterPass,
    /// When the view retires after its rf passes.
    AfterRf,
}

/// How samples cross between nodes in aggregate-cache mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ShuffleCode {
    /// Each needed sample is sent once, by one node that holds it.
    Uncoded,
    /// UberShuffle's coded multicast.
    UberShuffle,
}

/// `as_str` (the wire's spelling, as serde writes it) and `Display` of each enum above.
macro_rules! spelled {
    ($($ty:ident { $($variant:ident => $name:literal),+ $(,)? })+) => {$(
        impl $ty {
            /// The value as the protocol spells it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    )+};
}

spelled! {
    ReadPath { Cached => "cached", Passthrough => "passthrough", Pread => "pread" }
    Compose {
        Sequential => "sequential",
        Random => "random",
        Stratified => "stratified",
        Clustered => "clustered",
    }
    ShardDone { AfterPass => "after-pass", AfterRf => "after-rf" }
    ShuffleCode { Uncoded => "uncoded", UberShuffle => "uberShuffle" }
}

/// A sample left out of its mini-epoch, and why (`status.failed_samples`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FailedSample {
    /// The sample's path, relative to the source.
    pub path: String,
    /// Why it was left out (the latest reason, when it failed more than once).
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, to_value};

    /// The spellings are those the settings and earlier daemons use: a client written against
    /// the strings keeps reading them.
    #[test]
    fn values_are_spelled_as_before() {
        assert_eq!(
            to_value([ReadPath::Cached, ReadPath::Passthrough, ReadPath::Pread]).unwrap(),
            json!(["cached", "passthrough", "pread"])
        );
        assert_eq!(
            to_value([
                Compose::Sequential,
                Compose::Random,
                Compose::Stratified,
                Compose::Clustered
            ])
            .unwrap(),
            json!(["sequential", "random", "stratified", "clustered"])
        );
        assert_eq!(
            to_value([ShardDone::AfterPass, ShardDone::AfterRf]).unwrap(),
            json!(["after-pass", "after-rf"])
        );
        assert_eq!(
            to_value([ShuffleCode::Uncoded, ShuffleCode::UberShuffle]).unwrap(),
            json!(["uncoded", "uberShuffle"])
        );
        for k in [
            PolicyKind::Fixed,
            PolicyKind::Score,
            PolicyKind::Bollinger,
            PolicyKind::Learned,
            PolicyKind::Paced,
        ] {
            assert_eq!(to_value(k).unwrap(), json!(k.as_str()));
        }
        for v in [ReadPath::Cached, ReadPath::Passthrough, ReadPath::Pread] {
            assert_eq!(to_value(v).unwrap(), json!(v.to_string()));
        }
        for v in [
            Compose::Sequential,
            Compose::Random,
            Compose::Stratified,
            Compose::Clustered,
        ] {
            assert_eq!(to_value(v).unwrap(), json!(v.to_string()));
        }
        for v in [ShardDone::AfterPass, ShardDone::AfterRf] {
            assert_eq!(to_value(v).unwrap(), json!(v.to_string()));
        }
        for v in [ShuffleCode::Uncoded, ShuffleCode::UberShuffle] {
            assert_eq!(to_value(v).unwrap(), json!(v.to_string()));
        }
        assert!(serde_json::from_value::<ReadPath>(json!("auto")).is_err());
    }
}
