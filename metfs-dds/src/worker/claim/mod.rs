//! Claiming shards: the queue's head (the given-back shards and the cursors of a window of
//! stripes) as the worker last knew it, or read now; the shards that fit picked (never-claimed
//! ones of one stripe, then given-back ones) and taken in one transaction, whose `else` branch
//! reads the head again for a worker that lost the race; a claim whose answer was lost taken
//! up; and whether a queue with nothing to claim is finished. `head` says why a kept head is
//! safe: the transaction's compares, not the head, decide a claim.
//!
//! A worker takes fresh shards from the stripe its node name hashes to, or the next one with
//! shards left; after each lost race it moves on by a step that depends on the name too, so
//! the losers of one round spread over the stripes instead of meeting again.

use std::sync::atomic::Ordering;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use metfs_plan::planner::EpochOrder;

use crate::keys::{Kind, NodeStats, Stripes};
use crate::{etcd, now_ms, DdsError};

use super::{holder_bytes, timed, Batch, Claim, Worker, MAX_OPS};

mod head;
use head::Back;
pub(crate) use head::Head;

impl Worker {
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

    /// [`Worker::claim`], its outcome not yet recorded.
    async fn claim_inner(&mut self, max_bytes: u64) -> Result<Claim, DdsError> {
        self.ensure_lease().await?;
        if self.claim_uncertain {
            if let Some(b) = self.adopt().await? {
                return Ok(Claim::Batch(b));
            }
        }
        let stripes = self.meta.stripes();
        let mut lost = 0;
        // A worker that went wide stays wide in that epoch: its own stripes stay used up.
        let mut wide = self
            .head
            .as_ref()
            .is_some_and(|h| h.window.is_all(&stripes));
        loop {
            // Past the last epoch only given-back shards are left to claim: one read of the
            // first DOING and TODO keys says whether there is one, without the head.
            if self.cfg.last_epoch.is_some_and(|l| self.epoch > l) {
                match self.left().await? {
                    Left::Nothing => return Ok(Claim::Finished),
                    Left::Doing => return Ok(Claim::Wait),
                    // A given-back shard: claim it on a head read now (a kept one predates it).
                    Left::Todo => self.head = None,
                }
            }
            // The head of the given-back shards and the cursors of this node's window of
            // stripes (of every stripe once the window is used up): as this worker last knew
            // them, or read now.
            let window = if wide {
                Window::all(&stripes)
            } else {
                Window::of(&stripes, &self.holder.node)
            };
            let (head, read_now) = match self.kept_head(window) {
                Some(h) => (h, false),
                None => (self.snapshot(window).await?, true),
            };
            let todo = &head.todo;
            let epoch = match todo.first() {
                Some(&(e, _, _)) if e < self.epoch => e,
                _ => self.epoch,
            };
            if self.cfg.last_epoch.is_some_and(|l| epoch > l) {
                // Someone took the shard `left` saw given back: wait for the next.
                return Ok(match self.left().await? {
                    Left::Nothing => Claim::Finished,
                    Left::Doing | Left::Todo => Claim::Wait,
                });
            }
            let order = self.order(epoch)?;
            // An older epoch's never-claimed shards are all taken: the worker moved past it
            // only once every stripe's cursor reached its end.
            let fresh_from = if epoch == self.epoch {
                self.stripe_to_claim(&stripes, window, &head.cursors, lost)
            } else {
                None
            };
            if fresh_from.is_none() && epoch == self.epoch && !window.is_all(&stripes) {
                // This node's stripes are used up (cursors only move on, so a kept head is
                // right about that); others may not be.
                wide = true;
                continue;
            }
            let Pick { fresh, back, bytes } =
                pick(&order, &stripes, fresh_from, todo, epoch, max_bytes);
            if fresh.is_empty() && back.is_empty() {
                if !read_now {
                    // A kept head may miss shards given back: conclude on a head read now.
                    continue;
                }
                let next = match fresh_from {
                    Some(f) => Some(stripes.shard(f.stripe, f.at)),
                    None => todo.iter().find(|t| t.0 == epoch).map(|t| t.2),
                };
                if let Some(k) = next {
                    return Err(DdsError::ShardTooLarge {
                        epoch,
                        shard: k,
                        bytes: order.bytes[k as usize],
                        max: max_bytes,
                    });
                }
                // Nothing left to claim in this epoch: move on to the next, whose stripes
                // nobody may have claimed from yet (a claim that finds otherwise gets the head
                // in its answer).
                self.epoch = self.epoch.max(epoch + 1);
                wide = false;
                let todo = head.todo.clone();
                let own = Window::of(&stripes, &self.holder.node);
                self.head = Some(Head::untouched(self.epoch, own, todo));
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
            let txn = self
                .claim_txn(epoch, fresh_from, (&fresh, &back), &all, &stats)
                .or_else(head::reads(&self.queue.keys, self.epoch, window));
            // If the answer is lost, the claim may have been made: the next claim looks first.
            self.claim_uncertain = true;
            let r = timed(&self.shared, self.queue.client.kv_client().txn(txn))
                .await
                .map_err(etcd("claim"))?;
            self.claim_uncertain = false;
            if !r.succeeded() {
                // Another worker took some of these shards first; the answer holds the head
                // that beat this claim, good for a retry at once (on the stripe `lost` picks).
                // After a second loss the worker waits a random time, so that the losers of one
                // round do not all crowd the next, and reads the head again after it: a head
                // kept through the wait would be stale, and its retry would lose again to the
                // workers that claim on fresher ones.
                lost += 1;
                if lost == 1 {
                    let keys = &self.queue.keys;
                    self.head = Some(head::parse_head(
                        keys,
                        self.epoch,
                        window,
                        r.op_responses(),
                    )?);
                } else {
                    tokio::time::sleep(race_backoff(lost)).await;
                }
                continue;
            }
            let mut mine = head;
            let moved = fresh_from
                .filter(|_| !fresh.is_empty())
                .map(|f| (f.stripe, f.at + fresh.len() as u32));
            mine.after_claim(moved, &back, r.header().map_or(0, |h| h.revision()));
            self.head = Some(mine);
            self.stats = stats;
            self.held.push_back((epoch, all.clone()));
            return Ok(Claim::Batch(
                self.batch_of(&order, epoch, all, bytes, samples),
            ));
        }
    }

    /// The stripe of `window` this worker takes fresh shards from after `lost` lost races,
    /// given the window's cursors: one of the window's stripes with shards left, picked by a
    /// hash of the node's name and `lost` (so the same on every try of one round, and spread
    /// over what is left: near the end of an epoch, when few stripes have shards, the nodes
    /// that come for them spread evenly instead of meeting on the first one after a used-up
    /// run); `None` when every stripe of the window is used up.
    fn stripe_to_claim(
        &self,
        stripes: &Stripes,
        window: Window,
        cursors: &[(u32, i64)],
        lost: u32,
    ) -> Option<FreshFrom> {
        let left: Vec<FreshFrom> = (0..window.len)
            .filter_map(|i| {
                let s = window.first + i;
                let (at, rev) = cursors.get(i as usize).copied().unwrap_or((0, 0));
                (at < stripes.len(s)).then_some(FreshFrom { stripe: s, at, rev })
            })
            .collect();
        if left.is_empty() {
            return None;
        }
        let h = name_hash(&self.holder.node).rotate_left(17);
        let r = h ^ u64::from(lost).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        Some(left[(mix(r) % left.len() as u64) as usize])
    }

    /// The transaction that claims `fresh` (moving the cursor of its stripe on, compared at
    /// its revision) and takes `back` out of TODO: every shard in `all` DOING under this
    /// worker, its claim under the lease, its `held/` record, and the node's totals `stats`.
    fn claim_txn(
        &self,
        epoch: u64,
        fresh_from: Option<FreshFrom>,
        (fresh, back): (&[u32], &[Back]),
        all: &[u32],
        stats: &NodeStats,
    ) -> Txn {
        let keys = &self.queue.keys;
        let lease = self.shared.lease.load(Ordering::Acquire);
        let hv = holder_bytes(&self.holder);
        let mut cmp = Vec::new();
        let mut then = Vec::new();
        if let (Some(f), false) = (fresh_from, fresh.is_empty()) {
            let ckey = keys.cursor(epoch, f.stripe);
            cmp.push(Compare::mod_revision(ckey.clone(), CompareOp::Equal, f.rev));
            let next = f.at + fresh.len() as u32;
            then.push(TxnOp::put(ckey, next.to_string(), None));
        }
        for (_, key, _) in back {
            cmp.push(Compare::version(key.clone(), CompareOp::Greater, 0));
            then.push(TxnOp::delete(key.clone(), None));
        }
        for &k in all {
            then.push(TxnOp::put(keys.doing(epoch, k), hv.clone(), None));
            then.push(TxnOp::put(
                keys.claim(epoch, k),
                hv.clone(),
                Some(PutOptions::new().with_lease(lease)),
            ));
            then.push(TxnOp::put(keys.held(&self.holder.node, epoch, k), "", None));
        }
        then.push(TxnOp::put(
            keys.stats(&self.holder.node),
            serde_json::to_vec(stats).expect("serializable"),
            None,
        ));
        Txn::new().when(cmp).and_then(then)
    }

    /// The batch of shards `all` of `epoch` (`bytes` and `samples` in all), with their samples
    /// in order.
    fn batch_of(
        &self,
        order: &EpochOrder,
        epoch: u64,
        all: Vec<u32>,
        bytes: u64,
        samples: u64,
    ) -> Batch {
        let mut ids = Vec::with_capacity(samples as usize);
        let mut lengths = Vec::with_capacity(all.len());
        for &k in &all {
            let s = order.samples(k);
            lengths.push(s.len() as u32);
            ids.extend_from_slice(s);
        }
        Batch {
            epoch,
            shards: all,
            lengths,
            samples: ids,
            bytes,
            holder: self.holder.clone(),
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

    /// The head of the queue now: the given-back shards and the cursors of `window` in the
    /// worker's epoch, in one round trip.
    async fn snapshot(&self, window: Window) -> Result<Head, DdsError> {
        let keys = &self.queue.keys;
        // Whatever was given back before this read is in it.
        self.shared.todo_changed.store(false, Ordering::Release);
        let txn = Txn::new().and_then(head::reads(keys, self.epoch, window));
        let r = timed(&self.shared, self.queue.client.kv_client().txn(txn))
            .await
            .map_err(etcd("read of the queue"))?;
        head::parse_head(keys, self.epoch, window, r.op_responses())
    }

    /// The head this worker last knew of for `window` in its epoch, unless a shard was given
    /// back since (then the caller reads it again). Taken: a head is kept only by a claim's
    /// answer.
    fn kept_head(&mut self, window: Window) -> Option<Head> {
        let h = self.head.take()?;
        if self.shared.todo_changed.load(Ordering::Acquire) {
            return None;
        }
        (h.epoch == self.epoch && h.window == window).then_some(h)
    }

    /// What is left of the queue up to the last epoch: DOING and TODO are read in one
    /// transaction (one revision): read apart, a shard given back between the two reads (DOING
    /// to TODO) would be in neither, and a worker would finish while it is left.
    async fn left(&self) -> Result<Left, DdsError> {
        let last = self.cfg.last_epoch.unwrap_or(u64::MAX);
        let keys = &self.queue.keys;
        // The first key of each (keys sort by epoch, zero-padded) says whether any shard up to
        // the last epoch is left: a node waiting at the end of a job reads two keys a second,
        // not every DOING shard of the job (4,096 at 1,024 nodes, from every waiting node).
        let opts = || {
            GetOptions::new()
                .with_prefix()
                .with_keys_only()
                .with_limit(1)
        };
        let txn = Txn::new().and_then([
            TxnOp::get(keys.doing_all(), Some(opts())),
            TxnOp::get(keys.todo_all(), Some(opts())),
        ]);
        let r = timed(&self.shared, self.queue.client.kv_client().txn(txn))
            .await
            .map_err(etcd("read of the queue"))?;
        let mut left = Left::Nothing;
        for o in r.op_responses() {
            let etcd_client::TxnOpResponse::Get(g) = o else {
                continue;
            };
            for kv in g.kvs() {
                match keys.parse_shard(kv.key()) {
                    Some((Kind::Todo, e, _)) if e <= last => return Ok(Left::Todo),
                    Some((Kind::Doing, e, _)) if e <= last => left = Left::Doing,
                    _ => {}
                }
            }
        }
        Ok(left)
    }
}

/// What is left of a queue up to its last epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Left {
    /// Every shard is DONE: the job is finished.
    Nothing,
    /// Shards are DOING elsewhere and none is TODO: they may come back.
    Doing,
    /// A shard is TODO: one to claim.
    Todo,
}

/// Shards picked for one claim: never-claimed ones (of one stripe, from its cursor on),
/// given-back ones (as (epoch, TODO key, shard)), and their bytes together.
struct Pick {
    fresh: Vec<u32>,
    back: Vec<(u64, String, u32)>,
    bytes: u64,
}

/// Where a claim takes never-claimed shards from: a stripe, its cursor and the cursor's
/// revision (0: no cursor key yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FreshFrom {
    stripe: u32,
    at: u32,
    rev: i64,
}

/// The head of `epoch`'s shards that fits in `max_bytes` and one transaction: never-claimed
/// shards of the stripe `fresh_from`, from its cursor on, then the given-back ones in `todo`.
fn pick(
    order: &EpochOrder,
    stripes: &Stripes,
    fresh_from: Option<FreshFrom>,
    todo: &[(u64, String, u32)],
    epoch: u64,
    max_bytes: u64,
) -> Pick {
    // The cursor's put and the totals'; each fresh shard puts DOING, its claim and `held/`,
    // each given-back one deletes its TODO key too.
    let (mut bytes, mut ops) = (0u64, 2usize);
    let mut fresh = Vec::new();
    let mut full = false;
    if let Some(f) = fresh_from {
        for pos in f.at..stripes.len(f.stripe) {
            let k = stripes.shard(f.stripe, pos);
            let b = order.bytes[k as usize];
            if bytes + b > max_bytes || ops + 3 > MAX_OPS {
                full = true;
                break;
            }
            bytes += b;
            ops += 3;
            fresh.push(k);
        }
    }
    let mut back = Vec::new();
    if !full {
        for (e, key, k) in todo.iter().filter(|t| t.0 == epoch) {
            let b = order.bytes[*k as usize];
            if bytes + b > max_bytes || ops + 4 > MAX_OPS {
                break;
            }
            bytes += b;
            ops += 4;
            back.push((*e, key.clone(), *k));
        }
    }
    Pick { fresh, back, bytes }
}

/// A 64-bit finaliser (splitmix64's): spreads nearby inputs over the whole range.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The stripes a claim reads the cursors of: `len` from `first`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    first: u32,
    len: u32,
}

impl Window {
    /// Stripes one node reads first: [`WINDOW`] consecutive ones at a place its name hashes
    /// to. A claim reads a few cursors, not all of a queue's (up to 1,024), yet has a choice
    /// when it loses a race.
    fn of(stripes: &Stripes, node: &str) -> Self {
        let len = WINDOW.min(stripes.count());
        let places = u64::from(stripes.count() - len + 1);
        Self {
            first: (name_hash(node) % places) as u32,
            len,
        }
    }
    /// Every stripe.
    fn all(stripes: &Stripes) -> Self {
        Self {
            first: 0,
            len: stripes.count(),
        }
    }
    fn is_all(&self, stripes: &Stripes) -> bool {
        self.first == 0 && self.len == stripes.count()
    }
}

/// Stripes in a node's window.
const WINDOW: u32 = 8;

/// A hash of a node name that is the same on every node and run (FNV-1a), for its preferred
/// stripe.
fn name_hash(node: &str) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in node.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The wait before a claim that lost `lost` races in a row reads the head again: uniform in
/// [0, 2^min(lost, 6)) ms, so at most 64 ms. Without it every loser of a round retried at once
/// and the next round was as crowded: transactions per claim grew with the job's size (60 at
/// 256 simulated nodes, 645 at 1,024; `benches/nodes.py`).
fn race_backoff(lost: u32) -> Duration {
    super::random_wait(Duration::from_millis(1 << lost.min(6)))
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
