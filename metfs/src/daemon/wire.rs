//! The daemon's values as the protocol spells them: each domain enum (the read path, the
//! composition, a queue's done rule, the shuffle code) mapped to its wire enum in
//! `metfs_protocol::values`, exhaustively, so a new variant fails to build until it has a
//! spelling. The protocol cannot depend on the crates that own these types (they depend on it,
//! or pull in etcd and S3), hence the functions here rather than `From` impls there.

use crate::config::aggregate::ShuffleCode;
use crate::config::ReadPath;
use metfs_dds::ShardDone;
use metfs_plan::planner::Strategy;
use metfs_protocol::values;

/// The read path in use, as `status` reports it.
pub(super) fn wire_read_path(p: ReadPath) -> values::ReadPath {
    match p {
        ReadPath::Cached => values::ReadPath::Cached,
        ReadPath::Passthrough => values::ReadPath::Passthrough,
        ReadPath::Pread => values::ReadPath::Pread,
        // The path in use is resolved at mount (`ActiveReadPath`); were it not, the daemon
        // would read through `pread`.
        ReadPath::Auto => {
            debug_assert!(false, "the read path in use is never `auto`");
            values::ReadPath::Pread
        }
    }
}

/// The composition strategy, as `status` reports it.
pub(super) fn wire_compose(s: Strategy) -> values::Compose {
    match s {
        Strategy::Sequential => values::Compose::Sequential,
        Strategy::Random => values::Compose::Random,
        Strategy::Stratified => values::Compose::Stratified,
        Strategy::Clustered => values::Compose::Clustered,
    }
}

/// When a queue's shards are marked done, as `status.dds` reports it.
pub(super) fn wire_shard_done(d: ShardDone) -> values::ShardDone {
    match d {
        ShardDone::AfterPass => values::ShardDone::AfterPass,
        ShardDone::AfterRf => values::ShardDone::AfterRf,
    }
}

/// How samples cross between nodes, as `status.aggregate` reports it.
pub(super) fn wire_shuffle_code(c: ShuffleCode) -> values::ShuffleCode {
    match c {
        ShuffleCode::Uncoded => values::ShuffleCode::Uncoded,
        ShuffleCode::UberShuffle => values::ShuffleCode::UberShuffle,
    }
}
