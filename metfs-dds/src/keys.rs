//! The queue's keys in etcd and the records stored under them. Numbers are zero-padded so that
//! etcd's byte order is numeric order (the oldest epoch and the head of the tail sort first).
//!
//! ```text
//! PREFIX/meta                      QueueMeta: dataset fingerprint, seed, strategy, shard count,
//!                                  sample settings
//! PREFIX/inc/NODE                  last incarnation of NODE (kept)
//! PREFIX/workers/NODE              Holder of the live incarnation, under its lease
//! PREFIX/stats/NODE                NodeStats (kept)
//! PREFIX/cursor/EPOCH/STRIPE       next position never claimed in STRIPE of EPOCH (absent: 0)
//! PREFIX/todo/EPOCH/SEQ-SHARD      a shard given back, at the tail (SEQ: etcd revision)
//! PREFIX/doing/EPOCH/SHARD         Holder (kept: says who held it after the lease is gone)
//! PREFIX/claim/EPOCH/SHARD         Holder, under the holder's lease
//! PREFIX/held/NODE/EPOCH/SHARD     empty: NODE holds the shard (kept past the lease, so that
//!                                  the node's death finds its shards without a scan)
//! PREFIX/done/EPOCH/SHARD          Holder that finished it
//! ```
//!
//! A shard is TODO while its position is at or past its stripe's cursor or a `todo/` key names
//! it, DOING while `doing/` names it, DONE once `done/` does; every transition is one
//! transaction that moves it between those keys.
//!
//! # Stripes
//!
//! An epoch's never-claimed shards are dealt into [`Stripes`]: stripe `s` of `S` holds shards
//! `s, s + S, s + 2S, ...`, and has a cursor of its own. A claim of fresh shards compares only
//! its stripe's cursor, so claims of nodes that chose different stripes never race; with one
//! cursor for the epoch every claim raced every other, and at 1,024 simulated nodes the queue
//! spent 645 transactions per claim (`benches/nodes.py`). Since every stripe advances at about
//! the same rate, shards are still taken close to index order.

use serde::{Deserialize, Serialize};

use metfs_plan::planner::Strategy;

/// The layout version written in [`QueueMeta::version`]: 2 has a cursor per stripe and the
/// `held/` index.
pub const LAYOUT_VERSION: u32 = 2;

/// What a queue was made for; a mount of another dataset, seed or sample settings is refused.
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
    /// Samples in the dataset (sample groups where files are grouped).
    pub samples: u64,
    /// Stripes the never-claimed shards of an epoch are dealt into, each with its own cursor
    /// (see the module doc); 1 to [`MAX_STRIPES`].
    pub stripes: u32,
    /// The sample settings the shards were cut under, as the mount describes them (format,
    /// `group_by`, the manifest's group column, `always`, `include`, `exclude`): a mount of
    /// other settings deals other samples and is refused. `None`: every file of the source is
    /// a sample, as in every queue made before sample groups (whose record has no such key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_settings: Option<String>,
}

impl QueueMeta {
    /// How this queue deals its shards into stripes.
    pub fn stripes(&self) -> Stripes {
        Stripes::new(self.shards, self.stripes)
    }
}

/// Shards `0..shards` dealt into `count` stripes: shard `k` is at position `k / count` of
/// stripe `k % count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stripes {
    shards: u32,
    count: u32,
}

impl Stripes {
    /// `count` stripes of `shards` (at least one stripe, and no more than shards).
    pub fn new(shards: u32, count: u32) -> Self {
        Self {
            shards,
            count: count.clamp(1, shards.clamp(1, MAX_STRIPES)),
        }
    }
    /// How many stripes there are.
    pub fn count(&self) -> u32 {
        self.count
    }
    /// Shards in stripe `s`.
    pub fn len(&self, s: u32) -> u32 {
        if s >= self.shards {
            0
        } else {
            (self.shards - s).div_ceil(self.count)
        }
    }
    /// Whether there are no shards at all.
    pub fn is_empty(&self) -> bool {
        self.shards == 0
    }
    /// The shard at position `pos` of stripe `s`.
    pub fn shard(&self, s: u32, pos: u32) -> u32 {
        s + pos * self.count
    }
    /// Shards never claimed, given each stripe's cursor (`cursors[s]`, missing ones 0).
    pub fn fresh_left(&self, cursors: &[u32]) -> u64 {
        (0..self.count)
            .map(|s| {
                let at = cursors.get(s as usize).copied().unwrap_or(0);
                u64::from(self.len(s).saturating_sub(at))
            })
            .sum()
    }
}

/// The stripe count of a new queue of `shards`: one cursor for a queue under 256 shards (tests,
/// a few nodes: shards are taken in exact index order), else one stripe per 16 shards (about
/// four claims' worth), at most [`MAX_STRIPES`]. A job makes several shards per node and epoch,
/// so that is about one stripe per node: claims rarely meet on a cursor even when every node
/// comes back for work at the same moment (the start of a job, the end of a pass).
pub fn default_stripes(shards: u32) -> u32 {
    if shards < 256 {
        1
    } else {
        (shards / 16).min(MAX_STRIPES)
    }
}

/// Most stripes a queue has (their keys have four digits).
pub const MAX_STRIPES: u32 = 1024;

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
    pub fn cursors_of(&self, epoch: u64) -> String {
        format!("{}cursor/{epoch:010}/", self.root)
    }
    pub fn cursor(&self, epoch: u64, stripe: u32) -> String {
        format!("{}cursor/{epoch:010}/{stripe:04}", self.root)
    }
    pub fn held_by(&self, node: &str) -> String {
        format!("{}held/{node}/", self.root)
    }
    pub fn held(&self, node: &str, epoch: u64, shard: u32) -> String {
        format!("{}held/{node}/{epoch:010}/{shard:010}", self.root)
    }
    /// The (epoch, shard) of a `held/NODE/` key of `node`.
    pub fn parse_held(&self, node: &str, key: &[u8]) -> Option<(u64, u32)> {
        let rest = std::str::from_utf8(key)
            .ok()?
            .strip_prefix(&self.held_by(node))?;
        let (e, k) = rest.split_once('/')?;
        Some((e.parse().ok()?, k.parse().ok()?))
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

    /// The (epoch, stripe) of a `cursor/` key.
    pub fn parse_cursor(&self, key: &[u8]) -> Option<(u64, u32)> {
        let rest = std::str::from_utf8(key)
            .ok()?
            .strip_prefix(&self.cursors())?;
        let (e, s) = rest.split_once('/')?;
        Some((e.parse().ok()?, s.parse().ok()?))
    }

    /// Each epoch's stripe cursors, from a listing of `cursors/` (`(key, value)` pairs): a
    /// stripe without a cursor is at 0. Keys that are not cursors are skipped; a cursor whose
    /// value does not parse is an error naming its key.
    pub fn cursors_by_epoch<'a>(
        &self,
        stripes: &Stripes,
        listing: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    ) -> Result<std::collections::BTreeMap<u64, Vec<u32>>, crate::DdsError> {
        let mut cursors: std::collections::BTreeMap<u64, Vec<u32>> = Default::default();
        for (key, value) in listing {
            let Some((e, s)) = self.parse_cursor(key) else {
                continue;
            };
            let c = cursors
                .entry(e)
                .or_insert_with(|| vec![0; stripes.count() as usize]);
            if let Some(at) = c.get_mut(s as usize) {
                *at = parse(key, value)?;
            }
        }
        Ok(cursors)
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

/// The record stored at `key` (JSON, as every value of the queue is written): a value that does
/// not parse is an error naming its key.
pub(crate) fn parse<T: serde::de::DeserializeOwned>(
    key: &[u8],
    v: &[u8],
) -> Result<T, crate::DdsError> {
    serde_json::from_slice(v).map_err(|e| crate::DdsError::BadRecord {
        key: String::from_utf8_lossy(key).into_owned(),
        reason: e.to_string(),
    })
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
        assert_eq!(k.parse_cursor(k.cursor(12, 3).as_bytes()), Some((12, 3)));
        assert!(k.cursor(12, 3).starts_with(&k.cursors_of(12)));
        assert_eq!(k.parse_shard(b"jobs/10/done/0000000001/0000000002"), None);
        assert_eq!(
            k.parse_held("n-1", k.held("n-1", 4, 9).as_bytes()),
            Some((4, 9))
        );
        assert_eq!(k.parse_held("n", k.held("n-1", 4, 9).as_bytes()), None);
    }

    #[test]
    fn default_stripes_grow_with_the_queue_and_stay_bounded() {
        assert_eq!(default_stripes(0), 1);
        assert_eq!(default_stripes(255), 1);
        assert_eq!(default_stripes(256), 16);
        assert_eq!(default_stripes(12_288), 768);
        assert_eq!(default_stripes(1 << 30), MAX_STRIPES);
        assert_eq!(Stripes::new(3, 8).count(), 3, "no empty stripes");
    }

    proptest::proptest! {
        /// The stripes deal every shard exactly once, each stripe in increasing order, and a
        /// stripe's length is what its cursor runs to.
        #[test]
        fn stripes_partition_the_shards(shards in 0u32..2_000, count in 1u32..80) {
            let st = Stripes::new(shards, count);
            let mut seen = vec![0u8; shards as usize];
            for s in 0..st.count() {
                let mut last = None;
                for pos in 0..st.len(s) {
                    let k = st.shard(s, pos);
                    proptest::prop_assert!(k < shards);
                    proptest::prop_assert!(last.is_none_or(|l| l < k));
                    last = Some(k);
                    seen[k as usize] += 1;
                }
            }
            proptest::prop_assert!(seen.iter().all(|&c| c == 1));
            proptest::prop_assert_eq!(st.fresh_left(&[]), u64::from(shards));
            let ends: Vec<u32> = (0..st.count()).map(|s| st.len(s)).collect();
            proptest::prop_assert_eq!(st.fresh_left(&ends), 0);
        }
    }
}
