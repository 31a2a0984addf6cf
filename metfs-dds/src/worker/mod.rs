//! One node's daemon on a queue: its lease, its claims and its watch.
//!
//! A [`Worker`] holds a lease (renewed by a background task every third of its TTL) under which
//! it registers as `workers/NODE` with a new incarnation and puts its claims. A second task
//! watches the queue's registrations and given-back shards: when a node's registration is
//! deleted (its lease expired, or it left) its shards are given back to TODO at the tail at
//! once, and a shard given back wakes a worker waiting for work. After the watch is
//! (re)established the task sweeps the whole queue once, so a shard orphaned while nobody was
//! watching (every node dead, or this one cut off) is given back too.
//!
//! Claims follow the queue order: a worker takes the given-back shards of an older epoch first
//! (an epoch completes before the next one grows), else the never-claimed shards of its
//! current epoch from its stripe in the stripe's order, then that epoch's given-back shards; one batch never mixes
//! epochs, since a sample appears once per epoch and a view shows each path once. When its
//! epoch has nothing left to claim the worker moves to the next one, while other nodes may
//! still be finishing the last shards of the old one.
//!
//! A worker that loses its lease (etcd unreachable for longer than the TTL while etcd itself
//! stayed up) joins again with a new incarnation on its next call; batches it held then cannot
//! be marked done (someone else may already read them again) and are reported as lost.
//!
//! A request whose answer is lost (etcd killed mid-request) may still have been applied. A
//! claim in that state is found on the next claim (claims under this worker's name that it
//! does not know of) and returned as the batch; a done retried after it finds the shard DONE
//! by this very claim and counts it done. A claim is one round trip where the head of the queue
//! the worker kept from its last claim still holds (a transaction whose `else` branch reads the
//! head again when it does not), two where it must be read first (the worker's first claim, a
//! shard given back since, or a conclusion that nothing is left); each done is one.
//!
//! This module holds the worker's types, its joining and its lease; `claim` the claims,
//! `done` the marking done, `liveness` the lease's keep-alive, the registration and the watch.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metfs_plan::planner::{epoch_order, EpochOrder, SampleSet, ShardSpec};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::keys::parse;
use crate::keys::{Holder, NodeStats, QueueMeta};
use crate::queue::Queue;
use crate::{etcd, DdsError};

mod claim;
mod done;
mod liveness;
use liveness::{keep_alive, register, requeue_node, start_epoch, watch_queue};

/// The samples a worker cuts shards from (owned, since the worker outlives any borrow).
#[derive(Debug, Clone, Default)]
pub struct OwnedSamples {
    pub sizes: Vec<u64>,
    pub labels: Option<Vec<u32>>,
    pub clusters: Option<Vec<u32>>,
}

impl OwnedSamples {
    pub fn set(&self) -> SampleSet<'_> {
        SampleSet {
            sizes: &self.sizes,
            labels: self.labels.as_deref(),
            clusters: self.clusters.as_deref(),
        }
    }
}

/// How a worker behaves.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The node name (a key component: letters, digits, `.`, `-`, `_`).
    pub node: String,
    /// Lease TTL: how long after this node dies its shards go back to TODO (whole seconds,
    /// at least 2, etcd's minimum).
    pub lease_ttl: Duration,
    /// Batches held at once (DOING): 2 for a daemon, the view it serves and the slot it
    /// stages.
    pub depth: usize,
    /// Last epoch to claim from (`None`: no end).
    pub last_epoch: Option<u64>,
}

/// Shards claimed together for one slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub epoch: u64,
    /// Shard indices, in claim order.
    pub shards: Vec<u32>,
    /// Samples of each shard (`samples` is their concatenation).
    pub lengths: Vec<u32>,
    /// Sample ids of all the shards.
    pub samples: Vec<u32>,
    pub bytes: u64,
    /// Who claimed it (the incarnation at claim time).
    pub holder: Holder,
}

/// The outcome of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    Batch(Batch),
    /// Nothing to claim now, but shards of the last epoch are still DOING elsewhere and may
    /// come back: [`Worker::wait`] and claim again.
    Wait,
    /// Every shard up to the last epoch is DONE.
    Finished,
}

/// The outcome of marking a batch done.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DoneReport {
    pub done: Vec<u32>,
    /// Shards whose claim this worker no longer held (lease expired): someone else reads them.
    pub lost: Vec<u32>,
}

/// State shared with the background tasks.
#[derive(Default)]
struct Shared {
    lease: AtomicI64,
    lease_lost: AtomicBool,
    wake: Notify,
    /// The number of registered nodes when last counted, and when: how widely this node
    /// spreads its reaction to a death (`liveness::reaction_spread`).
    nodes: Mutex<Option<(u64, Instant)>>,
    last_error: Mutex<Option<String>>,
    round_trips: AtomicU64,
    etcd_nanos: AtomicU64,
    /// A shard was given back (a put under `todo/`) since the worker last read the queue's
    /// head: the head it kept may miss it.
    todo_changed: AtomicBool,
}

impl Shared {
    fn error(&self, e: impl ToString) {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
    }
    fn ok(&self) {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// Counts one etcd round trip and its time.
async fn timed<T>(shared: &Shared, f: impl std::future::Future<Output = T>) -> T {
    let t = Instant::now();
    let r = f.await;
    shared.round_trips.fetch_add(1, Ordering::Relaxed);
    shared
        .etcd_nanos
        .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    r
}

/// Most operations in one transaction (etcd's default `--max-txn-ops` is 128).
const MAX_OPS: usize = 120;

/// A node's daemon on a queue.
pub struct Worker {
    queue: Queue,
    meta: QueueMeta,
    spec: ShardSpec,
    samples: Arc<OwnedSamples>,
    cfg: WorkerConfig,
    holder: Holder,
    shared: Arc<Shared>,
    held: VecDeque<(u64, Vec<u32>)>,
    epoch: u64,
    orders: VecDeque<Arc<EpochOrder>>,
    stats: NodeStats,
    /// A claim was sent and its answer lost: it may have been made.
    claim_uncertain: bool,
    /// The head of the queue as this worker last saw it (its last claim's answer).
    head: Option<claim::Head>,
    keepalive: JoinHandle<()>,
    watch: JoinHandle<()>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Without its keep-alive the lease expires after its TTL, exactly as if the node died;
        // `leave` gives the shards back at once instead.
        self.keepalive.abort();
        self.watch.abort();
    }
}

fn holder_bytes(h: &Holder) -> Vec<u8> {
    serde_json::to_vec(h).expect("serializable")
}

fn valid_node(node: &str) -> bool {
    !node.is_empty()
        && node.len() <= 200
        && node
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        && node != "."
        && node != ".."
}

impl Worker {
    /// Joins the queue `meta` describes (see [`Queue::init`]) as `cfg.node`, with a new
    /// incarnation. If a previous incarnation of the node still holds its lease (a restart
    /// right after a `kill -9`), waits for that lease to expire, and refuses with
    /// [`DdsError::NodeLive`] if it does not within its TTL and one second.
    pub async fn join(
        queue: Queue,
        meta: QueueMeta,
        samples: Arc<OwnedSamples>,
        cfg: WorkerConfig,
    ) -> Result<Self, DdsError> {
        if !valid_node(&cfg.node) {
            return Err(DdsError::BadNode(cfg.node.clone()));
        }
        let spec = ShardSpec {
            strategy: meta.strategy,
            seed: meta.seed,
            shards: meta.shards,
            shard_bytes: meta.shard_bytes,
        };
        let first = Arc::new(epoch_order(&samples.set(), &spec, 0)?);
        let shared = Arc::new(Shared::default());
        let keys = queue.keys.clone();
        // The watch runs before this node is registered: a node waiting out its previous
        // incarnation's lease still gives back the shards of nodes that died meanwhile.
        let watch = tokio::spawn(watch_queue(queue.clone(), shared.clone(), cfg.node.clone()));
        let joined = async {
            let (lease, inc) = register(&queue, &shared, &cfg).await?;
            let keepalive = tokio::spawn(keep_alive(
                queue.client.clone(),
                lease,
                cfg.lease_ttl,
                shared.clone(),
            ));
            let rest = async {
                let stats_key = keys.stats(&cfg.node);
                let r = timed(
                    &shared,
                    queue.client.kv_client().get(stats_key.clone(), None),
                )
                .await
                .map_err(etcd("read of the node's totals"))?;
                let stats = match r.kvs().first() {
                    Some(kv) => parse(stats_key.as_bytes(), kv.value())?,
                    None => NodeStats::default(),
                };
                let epoch = start_epoch(&queue, &shared, &meta).await?;
                Ok::<_, DdsError>((stats, epoch))
            }
            .await;
            match rest {
                Ok((stats, epoch)) => Ok((inc, keepalive, stats, epoch)),
                Err(e) => {
                    keepalive.abort();
                    Err(e)
                }
            }
        }
        .await;
        let (inc, keepalive, stats, epoch) = match joined {
            Ok(j) => j,
            Err(e) => {
                watch.abort();
                return Err(e);
            }
        };
        let holder = Holder {
            node: cfg.node.clone(),
            inc,
        };
        Ok(Self {
            queue,
            meta,
            spec,
            samples,
            cfg,
            holder,
            shared,
            held: VecDeque::new(),
            epoch,
            orders: VecDeque::from([first]),
            stats,
            claim_uncertain: false,
            head: None,
            keepalive,
            watch,
        })
    }

    /// This worker's node name and incarnation.
    pub fn holder(&self) -> &Holder {
        &self.holder
    }

    /// The queue record this worker works on.
    pub fn meta(&self) -> &QueueMeta {
        &self.meta
    }

    /// The epoch this worker takes never-claimed shards from.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The node's totals as this worker last wrote them.
    pub fn stats(&self) -> &NodeStats {
        &self.stats
    }

    /// The last etcd error seen by this worker or its tasks, cleared by the next success.
    pub fn last_error(&self) -> Option<String> {
        self.shared
            .last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Round trips to etcd made by the worker's own calls, and their total time.
    pub fn etcd_time(&self) -> (u64, Duration) {
        (
            self.shared.round_trips.load(Ordering::Relaxed),
            Duration::from_nanos(self.shared.etcd_nanos.load(Ordering::Relaxed)),
        )
    }

    /// The order of `epoch` (the last few are kept).
    pub fn order(&mut self, epoch: u64) -> Result<Arc<EpochOrder>, DdsError> {
        if let Some(o) = self.orders.iter().find(|o| o.epoch == epoch) {
            return Ok(o.clone());
        }
        let o = Arc::new(epoch_order(&self.samples.set(), &self.spec, epoch)?);
        if self.orders.len() >= 3 {
            self.orders.pop_front();
        }
        self.orders.push_back(o.clone());
        Ok(o)
    }

    /// Joins again with a new lease and incarnation if the lease was lost.
    async fn ensure_lease(&mut self) -> Result<(), DdsError> {
        if !self.shared.lease_lost.load(Ordering::Acquire) {
            return Ok(());
        }
        let (lease, inc) = register(&self.queue, &self.shared, &self.cfg).await?;
        self.shared.lease_lost.store(false, Ordering::Release);
        self.holder.inc = inc;
        self.keepalive.abort();
        self.keepalive = tokio::spawn(keep_alive(
            self.queue.client.clone(),
            lease,
            self.cfg.lease_ttl,
            self.shared.clone(),
        ));
        tracing::warn!(node = %self.holder.node, inc, "dds: lease lost; joined again");
        Ok(())
    }

    /// Records the outcome of a call for `last_error`. An answer that the lease is gone (it
    /// expired while etcd was away, or etcd lost it) makes the next call join again: the
    /// keep-alive may not have seen it yet, and every claim under the old lease would fail.
    fn after<T>(&self, r: &Result<T, DdsError>) {
        match r {
            Ok(_) => self.shared.ok(),
            Err(e) => {
                if matches!(e, DdsError::Etcd { source, .. } if source.to_string().contains("lease not found"))
                {
                    self.shared.lease_lost.store(true, Ordering::Release);
                }
                self.shared.error(e)
            }
        }
    }

    /// Waits until something changes in the queue, or `max` passes.
    pub async fn wait(&self, max: Duration) {
        let _ = tokio::time::timeout(max, self.shared.wake.notified()).await;
    }

    /// Leaves the queue: revokes the lease, so the shards still held go back to TODO at once.
    pub async fn leave(self) -> Result<(), DdsError> {
        let lease = self.shared.lease.load(Ordering::Acquire);
        self.queue
            .client
            .lease_client()
            .revoke(lease)
            .await
            .map_err(etcd("lease revoke"))?;
        // Give the shards back now rather than when another worker's watch notices.
        requeue_node(&self.queue, &self.holder.node).await;
        Ok(())
    }
}

/// A random wait in `[0, max)`: the one source of the worker's spread (a lost claim race's
/// backoff, a death's reaction). A fresh SipHash key per call (std's `RandomState`) is random
/// enough to spread nodes apart, with no generator to carry.
fn random_wait(max: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let r = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    Duration::from_nanos(r % (max.as_nanos().max(1) as u64))
}
