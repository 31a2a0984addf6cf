//! The queue's keys in etcd and the records stored under them. Numbers are zero-padded so that
//! etcd's byte order is numeric order (the oldest epoch and the head of the tail sort first).
//!
//! ```text
//! PREFIX/meta                      QueueMeta: dataset fingerprint, seed, strategy, shard count
//! PREFIX/inc/NODE                  last incarnation of NODE (kept)
//! PREFIX/workers/NODE              Holder of the live incarnation, under its lease
//! PREFIX/stats/NODE                NodeStats (kept)
//! PREFIX/cursor/EPOCH              next shard never claimed in EPOCH (absent: 0)
//! PREFIX/todo/EPOCH/SEQ-SHARD      a shard given back, at the tail (SEQ: etcd revision)
//! PREFIX/doing/EPOCH/SHARD         Holder (kept: says who held it after the lease is gone)
//! PREFIX/claim/EPOCH/SHARD         Holder, under the holder's lease
//! PREFIX/done/EPOCH/SHARD          Holder that finished it
//! ```
//!
//! A shard is TODO while its index is at or past its epoch's cursor or a `todo/` key names it,
//! DOING while `doing/` names it, DONE once `done/` does; every transition is one transaction
//! that moves it between those keys.

use serde::{Deserialize, Serialize};

use metfs_plan::planner::Strategy;

/// The layout version written in [`QueueMeta::version`].
pub const LAYOUT_VERSION: u32 = 1;

/// What a queue was made for; a mount of another dataset or seed is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueMeta {
    pub version: u32,
    /// The dataset fingerprint (catalog identity).
    pub fingerprint: String,
    pub seed: u64,
    pub strategy: Strategy,
    /// Shards per epoch.
    pub shards: u32,
    /// Most bytes in one shard.
    pub shard_bytes: u64,
    /// Samples in the dataset.
    pub samples: u64,
}

/// A worker: a node's daemon in one incarnation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub node: String,
    pub inc: u64,
}

/// A node's totals over the life of the queue (all incarnations).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeStats {
    pub claimed_shards: u64,
    pub claimed_samples: u64,
    pub done_shards: u64,
    pub done_samples: u64,
    /// Shards this node claimed but could not mark done (its lease had expired and the shard
    /// went back to TODO): their samples may be read twice.
    pub lost_shards: u64,
    /// Milliseconds (Unix) of the first claim and of the last shard marked done.
    pub first_claim_ms: u64,
    pub last_done_ms: u64,
}

impl NodeStats {
    /// Samples per second over the node's working time, or 0 before its first done shard.
    pub fn throughput(&self) -> f64 {
        let ms = self.last_done_ms.saturating_sub(self.first_claim_ms);
        if ms == 0 {
            0.0
        } else {
            self.done_samples as f64 * 1000.0 / ms as f64
        }
    }
}

/// Key builder for one queue prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    root: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Self {
        Self {
            root: format!("{}/", prefix.trim_matches('/')),
        }
    }
    /// Everything the queue holds.
    pub fn all(&self) -> String {
        self.root.clone()
    }
    pub fn meta(&self) -> String {
        format!("{}meta", self.root)
    }
    pub fn inc(&self, node: &str) -> String {
        format!("{}inc/{node}", self.root)
    }
    pub fn workers(&self) -> String {
        format!("{}workers/", self.root)
    }
    pub fn worker(&self, node: &str) -> String {
        format!("{}workers/{node}", self.root)
    }
    pub fn stats_all(&self) -> String {
        format!("{}stats/", self.root)
    }
    pub fn stats(&self, node: &str) -> String {
        format!("{}stats/{node}", self.root)
    }
    pub fn cursors(&self) -> String {
        format!("{}cursor/", self.root)
    }
    pub fn cursor(&self, epoch: u64) -> String {
        format!("{}cursor/{epoch:010}", self.root)
    }
    pub fn todo_all(&self) -> String {
        format!("{}todo/", self.root)
    }
    pub fn todo(&self, epoch: u64, seq: i64, shard: u32) -> String {
        format!("{}todo/{epoch:010}/{seq:020}-{shard:010}", self.root)
    }
    pub fn doing_all(&self) -> String {
        format!("{}doing/", self.root)
    }
    pub fn doing(&self, epoch: u64, shard: u32) -> String {
        format!("{}doing/{epoch:010}/{shard:010}", self.root)
    }
    pub fn claim_all(&self) -> String {
        format!("{}claim/", self.root)
    }
    pub fn claim(&self, epoch: u64, shard: u32) -> String {
        format!("{}claim/{epoch:010}/{shard:010}", self.root)
    }
    pub fn done_all(&self) -> String {
        format!("{}done/", self.root)
    }
    pub fn done_epoch(&self, epoch: u64) -> String {
        format!("{}done/{epoch:010}/", self.root)
    }
    pub fn done(&self, epoch: u64, shard: u32) -> String {
        format!("{}done/{epoch:010}/{shard:010}", self.root)
    }

    /// The (epoch, shard) of a `todo/`, `doing/`, `claim/` or `done/` key of this queue.
    pub fn parse_shard(&self, key: &[u8]) -> Option<(Kind, u64, u32)> {
        let key = std::str::from_utf8(key).ok()?.strip_prefix(&self.root)?;
        let (kind, rest) = key.split_once('/')?;
        let kind = match kind {
            "todo" => Kind::Todo,
            "doing" => Kind::Doing,
            "claim" => Kind::Claim,
            "done" => Kind::Done,
            _ => return None,
        };
        let (epoch, last) = rest.split_once('/')?;
        let shard = match kind {
            Kind::Todo => last.split_once('-')?.1,
            _ => last,
        };
        Some((kind, epoch.parse().ok()?, shard.parse().ok()?))
    }

    /// The epoch of a `cursor/` key.
    pub fn parse_cursor(&self, key: &[u8]) -> Option<u64> {
        std::str::from_utf8(key)
            .ok()?
            .strip_prefix(&self.cursors())?
            .parse()
            .ok()
    }

    /// The node of a `workers/` or `stats/` key.
    pub fn parse_node<'a>(&self, key: &'a [u8], under: &str) -> Option<&'a str> {
        std::str::from_utf8(key).ok()?.strip_prefix(under)
    }
}

/// Which state key a shard key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Todo,
    Doing,
    Claim,
    Done,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_keys_round_trip_and_sort_numerically() {
        let k = Keys::new("/jobs/1/");
        assert_eq!(k.meta(), "jobs/1/meta");
        for (key, kind) in [
            (k.todo(3, 77, 12), Kind::Todo),
            (k.doing(3, 12), Kind::Doing),
            (k.claim(3, 12), Kind::Claim),
            (k.done(3, 12), Kind::Done),
        ] {
            assert_eq!(k.parse_shard(key.as_bytes()), Some((kind, 3, 12)));
        }
        assert!(k.todo(2, 900, 1) < k.todo(10, 5, 0));
        assert!(k.todo(2, 9, 7) < k.todo(2, 10, 0));
        assert_eq!(k.parse_cursor(k.cursor(12).as_bytes()), Some(12));
        assert_eq!(k.parse_shard(b"jobs/10/done/0000000001/0000000002"), None);
    }
}
