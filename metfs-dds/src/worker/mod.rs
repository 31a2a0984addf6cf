//! One node's daemon on a queue: its lease, its claims and its watch.
//!
//! A [`Worker`] holds a lease (renewed by a background task every third of its TTL) under which
//! it registers as `workers/NODE` with a new incarnation and puts its claims. A second task
//! watches the queue: a claim deleted by etcd (its holder's lease expired) is given back to
//! TODO at the tail at once, and any change wakes a worker waiting for work. After the watch is
//! (re)established the task sweeps the whole queue once, so a shard orphaned while nobody was
//! watching (every node dead, or this one cut off) is given back too.
//!
//! Claims follow the queue order: a worker takes the given-back shards of an older epoch first
//! (an epoch completes before the next one grows), else the never-claimed shards of its
//! current epoch in index order, then that epoch's given-back shards; one batch never mixes
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
//! by this very claim and counts it done. Each claim is two round trips (one consistent read of
//! the queue head and the cursor, one transaction) and each done one.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, WatchOptions,
};
use metfs_plan::planner::{epoch_order, EpochOrder, SampleSet, ShardSpec};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use super::keys::{Holder, Keys, Kind, NodeStats, QueueMeta};
use super::queue::{parse, Queue};
use super::{etcd, now_ms, DdsError};

mod liveness;
use liveness::{keep_alive, register, start_epoch, sweep, watch_queue};

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
    last_error: Mutex<Option<String>>,
    round_trips: AtomicU64,
    etcd_nanos: AtomicU64,
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
        let watch = tokio::spawn(watch_queue(queue.clone(), shared.clone()));
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
                let epoch = start_epoch(&queue, &shared, meta.shards).await?;
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

    /// Claims the next shards of the queue that fit in `max_bytes` together (see the module
    /// docs for the order). Refused while the worker holds `depth` batches.
    pub async fn claim(&mut self, max_bytes: u64) -> Result<Claim, DdsError> {
        if self.held.len() >= self.cfg.depth {
            return Err(DdsError::StillHolding {
                node: self.holder.node.clone(),
                held: self.held.len(),
            });
        }
        let r = self.claim_inner(max_bytes).await;
        self.after(&r);
        r
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

    async fn claim_inner(&mut self, max_bytes: u64) -> Result<Claim, DdsError> {
        self.ensure_lease().await?;
        if self.claim_uncertain {
            if let Some(b) = self.adopt().await? {
                return Ok(Claim::Batch(b));
            }
        }
        let keys = self.queue.keys.clone();
        let shards = self.meta.shards;
        let mut lost = 0;
        loop {
            // One consistent read of the head of the given-back shards and of the cursor.
            let (todo, cur) = self.snapshot().await?;
            let epoch = match todo.first() {
                Some(&(e, _, _)) if e < self.epoch => e,
                _ => self.epoch,
            };
            if self.cfg.last_epoch.is_some_and(|l| epoch > l) {
                return self.finished_or_wait(todo.is_empty()).await;
            }
            let order = self.order(epoch)?;
            let ckey = keys.cursor(epoch);
            // An older epoch's never-claimed shards are all taken: the worker moved past it
            // only once its cursor reached the end.
            let (cursor, cursor_rev) = if epoch == self.epoch {
                cur
            } else {
                (shards, 0)
            };
            // Pick the head that fits: never-claimed shards, then given-back ones.
            let (mut bytes, mut ops) = (0u64, 2usize);
            let mut fresh = Vec::new();
            let mut full = false;
            for k in cursor..shards {
                let b = order.bytes[k as usize];
                if bytes + b > max_bytes || ops + 2 > MAX_OPS {
                    full = true;
                    break;
                }
                bytes += b;
                ops += 2;
                fresh.push(k);
            }
            let mut back = Vec::new();
            if !full {
                for (e, key, k) in todo.iter().filter(|t| t.0 == epoch) {
                    let b = order.bytes[*k as usize];
                    if bytes + b > max_bytes || ops + 3 > MAX_OPS {
                        break;
                    }
                    bytes += b;
                    ops += 3;
                    back.push((*e, key.clone(), *k));
                }
            }
            if fresh.is_empty() && back.is_empty() {
                let next = if cursor < shards {
                    Some(cursor)
                } else {
                    todo.iter().find(|t| t.0 == epoch).map(|t| t.2)
                };
                if let Some(k) = next {
                    return Err(DdsError::ShardTooLarge {
                        epoch,
                        shard: k,
                        bytes: order.bytes[k as usize],
                        max: max_bytes,
                    });
                }
                // Nothing left to claim in this epoch: move on to the next.
                self.epoch = self.epoch.max(epoch + 1);
                continue;
            }
            let all: Vec<u32> = fresh
                .iter()
                .copied()
                .chain(back.iter().map(|b| b.2))
                .collect();
            let samples: u64 = all.iter().map(|&k| order.shard(k).length).sum();
            let mut stats = self.stats.clone();
            stats.claimed_shards += all.len() as u64;
            stats.claimed_samples += samples;
            if stats.first_claim_ms == 0 {
                stats.first_claim_ms = now_ms();
            }
            let lease = self.shared.lease.load(Ordering::Acquire);
            let hv = holder_bytes(&self.holder);
            let mut cmp = Vec::new();
            let mut then = Vec::new();
            if !fresh.is_empty() {
                cmp.push(Compare::mod_revision(
                    ckey.clone(),
                    CompareOp::Equal,
                    cursor_rev,
                ));
                let next = cursor + fresh.len() as u32;
                then.push(TxnOp::put(ckey.clone(), next.to_string(), None));
            }
            for (_, key, _) in &back {
                cmp.push(Compare::version(key.clone(), CompareOp::Greater, 0));
                then.push(TxnOp::delete(key.clone(), None));
            }
            for &k in &all {
                then.push(TxnOp::put(keys.doing(epoch, k), hv.clone(), None));
                then.push(TxnOp::put(
                    keys.claim(epoch, k),
                    hv.clone(),
                    Some(PutOptions::new().with_lease(lease)),
                ));
            }
            then.push(TxnOp::put(
                keys.stats(&self.holder.node),
                serde_json::to_vec(&stats).expect("serializable"),
                None,
            ));
            let txn = Txn::new().when(cmp).and_then(then);
            // If the answer is lost, the claim may have been made: the next claim looks first.
            self.claim_uncertain = true;
            let r = timed(&self.shared, self.queue.client.kv_client().txn(txn))
                .await
                .map_err(etcd("claim"))?;
            self.claim_uncertain = false;
            if !r.succeeded() {
                // Another worker took some of these shards first: read the head again, after a
                // random wait, so that the losers of one round do not all crowd the next.
                lost += 1;
                tokio::time::sleep(race_backoff(lost)).await;
                continue;
            }
            self.stats = stats;
            self.held.push_back((epoch, all.clone()));
            let mut ids = Vec::with_capacity(samples as usize);
            let mut lengths = Vec::with_capacity(all.len());
            for &k in &all {
                let s = order.samples(k);
                lengths.push(s.len() as u32);
                ids.extend_from_slice(s);
            }
            return Ok(Claim::Batch(Batch {
                epoch,
                shards: all,
                lengths,
                samples: ids,
                bytes,
                holder: self.holder.clone(),
            }));
        }
    }

    /// Takes up the shards of a claim whose answer was lost (etcd went away mid-request): they
    /// are DOING under this worker's name and would otherwise stay so until its lease ends.
    async fn adopt(&mut self) -> Result<Option<Batch>, DdsError> {
        let keys = self.queue.keys.clone();
        let r = timed(
            &self.shared,
            self.queue
                .client
                .kv_client()
                .get(keys.claim_all(), Some(GetOptions::new().with_prefix())),
        )
        .await
        .map_err(etcd("read of the claims"))?;
        self.claim_uncertain = false;
        let hv = holder_bytes(&self.holder);
        let mut mine: Vec<(u64, u32)> = r
            .kvs()
            .iter()
            .filter(|kv| kv.value() == hv.as_slice())
            .filter_map(|kv| keys.parse_shard(kv.key()).map(|(_, e, k)| (e, k)))
            .filter(|(e, k)| !self.held.iter().any(|(he, hs)| he == e && hs.contains(k)))
            .collect();
        let Some(&(epoch, _)) = mine.first() else {
            return Ok(None);
        };
        // A claim is one transaction of one epoch.
        mine.retain(|(e, _)| *e == epoch);
        let order = self.order(epoch)?;
        let shards: Vec<u32> = mine.iter().map(|(_, k)| *k).collect();
        let mut ids = Vec::new();
        let mut lengths = Vec::new();
        let mut bytes = 0;
        for &k in &shards {
            let s = order.samples(k);
            lengths.push(s.len() as u32);
            ids.extend_from_slice(s);
            bytes += order.bytes[k as usize];
        }
        let samples = ids.len() as u64;
        self.stats.claimed_shards += shards.len() as u64;
        self.stats.claimed_samples += samples;
        self.held.push_back((epoch, shards.clone()));
        tracing::info!(epoch, ?shards, "dds: took up a claim whose answer was lost");
        Ok(Some(Batch {
            epoch,
            shards,
            lengths,
            samples: ids,
            bytes,
            holder: self.holder.clone(),
        }))
    }

    /// The head of the given-back shards, oldest epoch first, as (epoch, key, shard), and the
    /// cursor of the worker's epoch with its revision, in one round trip.
    async fn snapshot(&self) -> Result<(Vec<(u64, String, u32)>, (u32, i64)), DdsError> {
        let keys = &self.queue.keys;
        let opts = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_sort(SortTarget::Key, SortOrder::Ascend)
            .with_limit(256);
        let ckey = keys.cursor(self.epoch);
        let txn = Txn::new().and_then([
            TxnOp::get(keys.todo_all(), Some(opts)),
            TxnOp::get(ckey.clone(), None),
        ]);
        let r = timed(&self.shared, self.queue.client.kv_client().txn(txn))
            .await
            .map_err(etcd("read of the queue"))?;
        let mut gets = r.op_responses().into_iter().filter_map(|o| match o {
            etcd_client::TxnOpResponse::Get(g) => Some(g),
            _ => None,
        });
        let (Some(todo), Some(cursor)) = (gets.next(), gets.next()) else {
            return Err(DdsError::BadRecord {
                key: ckey,
                reason: "etcd answered the read with fewer results than asked".into(),
            });
        };
        let todo = todo
            .kvs()
            .iter()
            .filter_map(|kv| {
                let (kind, e, k) = keys.parse_shard(kv.key())?;
                (kind == Kind::Todo).then(|| (e, String::from_utf8_lossy(kv.key()).into_owned(), k))
            })
            .collect();
        let cur = match cursor.kvs().first() {
            Some(kv) => (
                parse::<u32>(ckey.as_bytes(), kv.value())?,
                kv.mod_revision(),
            ),
            None => (0, 0),
        };
        Ok((todo, cur))
    }

    /// `Finished` when no shard up to the last epoch is DOING or TODO, else `Wait`. Both are
    /// read in one transaction (one revision): read apart, a shard given back between the two
    /// reads (DOING to TODO) would be in neither, and a worker would finish while it is left.
    /// `no_todo` is what the caller's own earlier read saw; a TODO shard there means `Wait`.
    async fn finished_or_wait(&self, no_todo: bool) -> Result<Claim, DdsError> {
        if !no_todo {
            return Ok(Claim::Wait);
        }
        let last = self.cfg.last_epoch.unwrap_or(u64::MAX);
        let keys = &self.queue.keys;
        let opts = || GetOptions::new().with_prefix().with_keys_only();
        let txn = Txn::new().and_then([
            TxnOp::get(keys.doing_all(), Some(opts())),
            TxnOp::get(keys.todo_all(), Some(opts())),
        ]);
        let r = timed(&self.shared, self.queue.client.kv_client().txn(txn))
            .await
            .map_err(etcd("read of the queue"))?;
        let left = r.op_responses().into_iter().any(|o| match o {
            etcd_client::TxnOpResponse::Get(g) => g.kvs().iter().any(|kv| {
                keys.parse_shard(kv.key()).is_some_and(|(kind, e, _)| {
                    matches!(kind, Kind::Doing | Kind::Todo) && e <= last
                })
            }),
            _ => false,
        });
        Ok(if left { Claim::Wait } else { Claim::Finished })
    }

    /// Waits until something changes in the queue, or `max` passes.
    pub async fn wait(&self, max: Duration) {
        let _ = tokio::time::timeout(max, self.shared.wake.notified()).await;
    }

    /// Marks `batch` DONE: each shard whose claim this worker still holds moves to DONE in one
    /// transaction; the others are reported lost.
    pub async fn done(&mut self, batch: &Batch) -> Result<DoneReport, DdsError> {
        let r = self.done_inner(batch).await;
        self.after(&r);
        r
    }

    async fn done_inner(&mut self, batch: &Batch) -> Result<DoneReport, DdsError> {
        let keys = self.queue.keys.clone();
        let hv = holder_bytes(&batch.holder);
        let e = batch.epoch;
        let ops = |k: u32| {
            (
                Compare::value(keys.claim(e, k), CompareOp::Equal, hv.clone()),
                [
                    TxnOp::delete(keys.claim(e, k), None),
                    TxnOp::delete(keys.doing(e, k), None),
                    TxnOp::put(keys.done(e, k), hv.clone(), None),
                ],
            )
        };
        let totals = |report: &DoneReport| {
            let mut stats = self.stats.clone();
            for (k, len) in batch.shards.iter().zip(&batch.lengths) {
                if report.done.contains(k) {
                    stats.done_shards += 1;
                    stats.done_samples += u64::from(*len);
                } else {
                    stats.lost_shards += 1;
                }
            }
            stats.last_done_ms = now_ms();
            stats
        };
        let stats_op = |stats: &NodeStats| {
            TxnOp::put(
                keys.stats(&self.holder.node),
                serde_json::to_vec(stats).expect("serializable"),
                None,
            )
        };
        // A batch that fits one transaction (the usual case) updates the totals in it too.
        let single = batch.shards.len() * 3 < MAX_OPS;
        let all_done = totals(&DoneReport {
            done: batch.shards.clone(),
            lost: Vec::new(),
        });
        let mut report = DoneReport::default();
        let mut settled_one_by_one = false;
        for chunk in batch.shards.chunks(MAX_OPS / 3) {
            let (cmp, then): (Vec<_>, Vec<_>) = chunk.iter().map(|&k| ops(k)).unzip();
            let mut then: Vec<TxnOp> = then.into_iter().flatten().collect();
            if single {
                then.push(stats_op(&all_done));
            }
            let txn = Txn::new().when(cmp).and_then(then);
            let r = timed(&self.shared, self.queue.client.kv_client().txn(txn))
                .await
                .map_err(etcd("marking shards done"))?;
            if r.succeeded() {
                report.done.extend_from_slice(chunk);
                continue;
            }
            // Some claim is no longer ours: settle shard by shard. A shard already DONE by
            // this very claim (a retry after an answer lost on the way) counts as done.
            settled_one_by_one = true;
            for &k in chunk {
                let (c, t) = ops(k);
                let txn = Txn::new()
                    .when([c])
                    .and_then(t)
                    .or_else([TxnOp::get(keys.done(e, k), None)]);
                let r = timed(&self.shared, self.queue.client.kv_client().txn(txn))
                    .await
                    .map_err(etcd("marking a shard done"))?;
                let ours = r.succeeded()
                    || r.op_responses().iter().any(|o| {
                        matches!(o, etcd_client::TxnOpResponse::Get(g)
                            if g.kvs().first().is_some_and(|kv| kv.value() == hv.as_slice()))
                    });
                if ours {
                    report.done.push(k);
                } else {
                    report.lost.push(k);
                }
            }
        }
        let stats = totals(&report);
        if !single || settled_one_by_one {
            timed(
                &self.shared,
                self.queue
                    .client
                    .kv_client()
                    .txn(Txn::new().and_then([stats_op(&stats)])),
            )
            .await
            .map_err(etcd("update of the node's totals"))?;
        }
        self.stats = stats;
        if let Some(i) = self
            .held
            .iter()
            .position(|(he, hs)| *he == batch.epoch && *hs == batch.shards)
        {
            self.held.remove(i);
        }
        if !report.lost.is_empty() {
            tracing::warn!(
                node = %self.holder.node,
                epoch = e,
                lost = ?report.lost,
                "dds: shards were given back before they were done (lease expired); their samples are read again elsewhere"
            );
        }
        Ok(report)
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
        sweep(&self.queue, &self.shared).await;
        Ok(())
    }
}

/// The wait before a claim that lost `lost` races in a row reads the head again: uniform in
/// [0, 2^min(lost, 6)) ms, so at most 64 ms. Without it every loser of a round retried at once
/// and the next round was as crowded: transactions per claim grew with the job's size (60 at
/// 256 simulated nodes, 645 at 1,024; `benches/nodes.py`).
fn race_backoff(lost: u32) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let cap_us = 1000u64 << lost.min(6);
    // A fresh SipHash key per call (std's RandomState): random enough to spread retries, and no
    // generator to carry.
    let r = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    Duration::from_micros(r % cap_us)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn race_backoff_stays_under_its_cap_and_varies() {
        for lost in 1..10 {
            let cap = Duration::from_millis(1 << lost.min(6));
            let waits: Vec<_> = (0..64).map(|_| super::race_backoff(lost)).collect();
            assert!(waits.iter().all(|w| *w < cap), "{lost}: {waits:?}");
            assert!(waits.iter().any(|w| *w != waits[0]), "{lost}: {waits:?}");
        }
    }
}
