//! Dynamic data sharding (paper 003, §V-C): nodes take their work from a shared queue of
//! shards in etcd instead of owning a fixed share of every mini-epoch.
//!
//! # Shards and states
//!
//! An epoch's order is a pure function of (catalog, seed, epoch, composition)
//! ([`metfs_plan::planner::epoch_order`]), so every node computes it; a shard is
//! (epoch, offset, length) into it. Shards move TODO → DOING → DONE:
//!
//! * **claim** (TODO → DOING): one transaction takes the head of the queue (never-claimed
//!   shards of one stripe in its order, then shards given back, oldest first) and records the
//!   claiming worker, node name and incarnation, under the worker's lease. Two workers racing
//!   for the same shards compare the same keys, so exactly one transaction succeeds; workers
//!   that take from different stripes ([`keys::Stripes`]) compare different cursors and do not
//!   race at all. A worker claims
//!   only when it holds fewer than `depth` batches (the view it serves and the slot it stages),
//!   and only as many shards as fit the byte size of its next slot: a slow node comes back
//!   for work less often and so takes less of the epoch (the paper's load balancing).
//! * **done** (DOING → DONE): one transaction that succeeds only while the claim is still the
//!   worker's own.
//! * **requeue** (DOING → TODO, at the tail): the claim key lives under the worker's lease, so
//!   when a node dies its claims vanish after the lease TTL, together with its registration.
//!   Every live worker watches the registrations' deletions and gives the dead node's shards
//!   back at once, found from its `held/` records; a worker that joins also sweeps the whole
//!   queue for them, so they are requeued even when every node died.
//!
//! Delivery is at least once: an epoch is complete when every shard is DONE, and each shard is
//! DONE exactly once. The samples that can be read twice are those of shards a worker held
//! when it died or lost its lease (they are given back and read again by someone else);
//! [`keys::NodeStats::lost_shards`] counts them.
//!
//! # Where the state lives
//!
//! Only in etcd ([`keys`] has the layout): etcd persists it, so the queue survives the death
//! of any metfs process, and a restart of etcd on its data directory keeps it. A queue records
//! the dataset fingerprint, seed, strategy, shard count and sample settings it was made for
//! and refuses a worker of another dataset, seed or sample settings, naming both. A sample is
//! a file or a sample group (an image and its mask): the queue deals sample ids, and the mount
//! turns them into files.
//!
//! # Modules
//!
//! `url` (addresses and connection options), `mount` (the `[dds]` settings of a mount and
//! the node name), `dataset` (fingerprint and shard size from a
//! catalog), `keys` (the key layout and records), `queue`
//! (make, inspect and reset a queue), `worker` (a node's claims, lease and watch).

use std::path::PathBuf;

use thiserror::Error;

pub mod dataset;
pub mod keys;
pub mod mount;
pub mod queue;
pub mod url;
pub mod worker;

pub use keys::{Holder, NodeStats, QueueMeta};
pub use mount::{DdsConfig, ShardDone};
pub use queue::{EpochStatus, NodeStatus, Queue, QueueStatus};
pub use url::{connect, DdsUrl, EtcdOptions};
pub use worker::{Batch, Claim, DoneReport, OwnedSamples, Worker, WorkerConfig};

/// Errors of dynamic sharding.
#[derive(Debug, Error)]
pub enum DdsError {
    /// The queue address does not parse.
    #[error("bad queue address {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    /// etcd does not answer.
    #[error("etcd at {url} is unreachable: {reason}")]
    Unreachable { url: String, reason: String },
    /// A request to etcd failed.
    #[error("etcd {what} failed: {source}")]
    Etcd {
        what: &'static str,
        // Boxed: the client's error is large and every Result here carries it.
        #[source]
        source: Box<etcd_client::Error>,
    },
    /// A TLS file could not be read.
    #[error("cannot read {path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The queue was made for another dataset, seed or composition.
    #[error("the queue at {url} was made for {queue}, but this node has {ours}; use another prefix, or `metfs dds reset {url}` to start over")]
    Mismatch {
        url: String,
        queue: String,
        ours: String,
    },
    /// The queue deals other samples than this node would: it was made under other sample
    /// settings (`group_by`, `always`, `include`, `exclude`, the format).
    #[error("the queue at {url} was made with {queue}, but this node has {ours}; mount with the queue's sample settings, use another prefix, or `metfs dds reset {url}` to start over")]
    SamplesMismatch {
        url: String,
        queue: String,
        ours: String,
    },
    /// No queue at this prefix.
    #[error("no queue at {url}: make one with `metfs dds init` or a `metfs mount --dds`")]
    NotInitialized { url: String },
    /// Another incarnation of this node name still holds its lease.
    #[error("node {node:?} is already working on this queue (incarnation {inc}) and its lease did not expire within {waited_ms} ms; is another daemon using the same --node-name?")]
    NodeLive {
        node: String,
        inc: u64,
        waited_ms: u64,
    },
    /// A record in etcd does not parse.
    #[error("queue record {key} is not valid: {reason}")]
    BadRecord { key: String, reason: String },
    /// The queue's shards cannot be cut from this catalog.
    #[error("the queue's shards do not fit this dataset: {0}")]
    Order(#[from] metfs_plan::planner::PlanError),
    /// The next shard is larger than a whole slot.
    #[error("shard {shard} of epoch {epoch} holds {bytes} bytes, more than the {max} bytes of a slot; make the queue with smaller shards")]
    ShardTooLarge {
        epoch: u64,
        shard: u32,
        bytes: u64,
        max: u64,
    },
    /// A claim while the worker still holds `depth` batches.
    #[error("node {node:?} still holds {held} batches; mark them done before claiming more")]
    StillHolding { node: String, held: usize },
    /// A node name that cannot be a key component.
    #[error("bad node name {0:?}: use letters, digits, '.', '-' and '_'")]
    BadNode(String),
    /// Every shard of every epoch of the queue is DONE: there is nothing left to serve.
    #[error("every shard of the queue is done; make a new queue (another prefix, or `metfs dds reset`) to train again")]
    Finished,
    /// `reset` while workers are live.
    #[error("the queue at {url} has live workers ({nodes}); stop them first or pass --force")]
    LiveWorkers { url: String, nodes: String },
}

fn etcd(what: &'static str) -> impl FnOnce(etcd_client::Error) -> DdsError {
    move |source| DdsError::Etcd {
        what,
        source: Box::new(source),
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
