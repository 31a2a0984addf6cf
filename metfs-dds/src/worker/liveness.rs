//! What keeps a worker's claims honest while it lives and gives them back when it dies: the
//! registration under a lease, the lease's renewal, the watch that requeues a dead holder's
//! shards at once, and the sweep that finds shards orphaned while nobody was watching.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, WatchFilterType,
    WatchOptions,
};

use crate::keys::parse;
use crate::keys::{Holder, Keys, QueueMeta};
use crate::queue::Queue;
use crate::{etcd, DdsError};

use super::{holder_bytes, timed, Shared, WorkerConfig};

/// Grants a lease and registers a new incarnation of `cfg.node` under it, waiting out a
/// previous incarnation's lease. Nothing renews the new lease until registration succeeds, so
/// a wait longer than its TTL (a previous incarnation's lease to run out, a slow etcd on a busy
/// node) lets it expire; registering under it then fails with "requested lease not found", and
/// a fresh lease is granted for the next attempt.
pub(super) async fn register(
    queue: &Queue,
    shared: &Shared,
    cfg: &WorkerConfig,
) -> Result<(i64, u64), DdsError> {
    let keys = &queue.keys;
    let ttl = cfg.lease_ttl.as_secs().max(2) as i64;
    let mut kv = queue.client.kv_client();
    let grant = || async {
        let lease = timed(shared, queue.client.lease_client().grant(ttl, None))
            .await
            .map_err(etcd("lease grant"))?
            .id();
        shared.lease.store(lease, Ordering::Release);
        Ok::<i64, DdsError>(lease)
    };
    let mut lease = grant().await?;
    let mut regrants = 0u32;
    let (ik, wk) = (keys.inc(&cfg.node), keys.worker(&cfg.node));
    let mut deadline: Option<Instant> = None;
    let started = Instant::now();
    loop {
        let r = timed(shared, kv.get(ik.clone(), None))
            .await
            .map_err(etcd("read of the node's incarnation"))?;
        let (inc, rev) = match r.kvs().first() {
            Some(x) => (parse::<u64>(ik.as_bytes(), x.value())?, x.mod_revision()),
            None => (0, 0),
        };
        let holder = Holder {
            node: cfg.node.clone(),
            inc: inc + 1,
        };
        let txn = Txn::new()
            .when([
                Compare::version(wk.clone(), CompareOp::Equal, 0),
                Compare::mod_revision(ik.clone(), CompareOp::Equal, rev),
            ])
            .and_then([
                TxnOp::put(ik.clone(), (inc + 1).to_string(), None),
                TxnOp::put(
                    wk.clone(),
                    holder_bytes(&holder),
                    Some(PutOptions::new().with_lease(lease)),
                ),
            ])
            .or_else([TxnOp::get(wk.clone(), None)]);
        let r = match timed(shared, kv.txn(txn)).await {
            Ok(r) => r,
            Err(etcd_client::Error::GRpcStatus(st))
                if st.message().contains("lease not found") && regrants < 5 =>
            {
                regrants += 1;
                tracing::warn!(node = %cfg.node, ttl_secs = ttl, "the registration's lease expired before it was used; granting another");
                lease = grant().await?;
                continue;
            }
            Err(e) => return Err(etcd("registration of the node")(e)),
        };
        if r.succeeded() {
            return Ok((lease, inc + 1));
        }
        // A previous incarnation still holds its lease: wait for it to expire.
        let old = r.op_responses().into_iter().find_map(|o| match o {
            etcd_client::TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.lease()),
            _ => None,
        });
        let now = Instant::now();
        let d = match deadline {
            Some(d) => d,
            None => {
                let left = match old {
                    Some(id) if id != 0 => queue
                        .client
                        .lease_client()
                        .time_to_live(id, None)
                        .await
                        .map(|t| t.ttl().max(0) as u64)
                        .unwrap_or(ttl as u64),
                    _ => 0,
                };
                // etcd revokes an expired lease on its next check (every 500 ms), later on a
                // busy node: a second past the TTL was measured too short (the join gave up
                // 40 ms before the old key went).
                let d = now + Duration::from_secs(left) + Duration::from_secs(3);
                deadline = Some(d);
                d
            }
        };
        if now >= d {
            return Err(DdsError::NodeLive {
                node: cfg.node.clone(),
                inc,
                waited_ms: started.elapsed().as_millis() as u64,
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The lowest epoch whose never-claimed shards are not all taken (some stripe's cursor short
/// of its end), else the one after the last epoch with cursors.
pub(super) async fn start_epoch(
    queue: &Queue,
    shared: &Shared,
    meta: &QueueMeta,
) -> Result<u64, DdsError> {
    let keys = &queue.keys;
    let r = timed(
        shared,
        queue
            .client
            .kv_client()
            .get(keys.cursors(), Some(GetOptions::new().with_prefix())),
    )
    .await
    .map_err(etcd("read of the queue cursors"))?;
    let stripes = meta.stripes();
    let cursors =
        keys.cursors_by_epoch(&stripes, r.kvs().iter().map(|kv| (kv.key(), kv.value())))?;
    let open = cursors
        .iter()
        .find(|(_, c)| stripes.fresh_left(c) > 0)
        .map(|(e, _)| *e);
    let last = cursors.keys().next_back().copied();
    Ok(open.unwrap_or_else(|| last.map_or(0, |l| l + 1)))
}

/// Gives back a shard of `node` whose claim vanished (its holder's lease expired), at the
/// tail. Idempotent: only the first of several racing workers succeeds.
pub(super) async fn requeue(
    client: &Client,
    keys: &Keys,
    node: &str,
    (epoch, shard): (u64, u32),
    seq: i64,
) -> bool {
    let (doing, claim) = (keys.doing(epoch, shard), keys.claim(epoch, shard));
    let txn = Txn::new()
        .when([
            Compare::version(doing.clone(), CompareOp::Greater, 0),
            Compare::version(claim, CompareOp::Equal, 0),
        ])
        .and_then([
            TxnOp::delete(doing, None),
            TxnOp::delete(keys.held(node, epoch, shard), None),
            TxnOp::put(keys.todo(epoch, seq, shard), "", None),
        ]);
    match client.kv_client().txn(txn).await {
        Ok(r) => {
            if r.succeeded() {
                tracing::info!(epoch, shard, node, "dds: shard given back to TODO");
            }
            r.succeeded()
        }
        Err(_) => false,
    }
}

/// Gives back the shards `node` held whose claims are gone (it died, or left): read from its
/// `held/` records, so no scan of the queue. Returns how many were given back.
pub(super) async fn requeue_node(queue: &Queue, node: &str) -> usize {
    let keys = &queue.keys;
    let opts = GetOptions::new().with_prefix().with_keys_only();
    let Ok(r) = queue
        .client
        .kv_client()
        .get(keys.held_by(node), Some(opts))
        .await
    else {
        return 0;
    };
    let seq = r.header().map_or(0, |h| h.revision());
    let mut n = 0;
    for kv in r.kvs() {
        if let Some(shard) = keys.parse_held(node, kv.key()) {
            if requeue(&queue.client, keys, node, shard, seq).await {
                n += 1;
            }
        }
    }
    n
}

/// Gives back every DOING shard whose claim is gone. Returns how many were given back.
pub(super) async fn sweep(queue: &Queue, shared: &Shared) -> usize {
    let keys = &queue.keys;
    let mut kv = queue.client.kv_client();
    let Ok(doing) = kv
        .get(keys.doing_all(), Some(GetOptions::new().with_prefix()))
        .await
    else {
        return 0;
    };
    let opts = GetOptions::new().with_prefix().with_keys_only();
    let Ok(claims) = kv.get(keys.claim_all(), Some(opts)).await else {
        return 0;
    };
    let seq = doing.header().map_or(0, |h| h.revision());
    let held: std::collections::HashSet<(u64, u32)> = claims
        .kvs()
        .iter()
        .filter_map(|kv| keys.parse_shard(kv.key()).map(|(_, e, k)| (e, k)))
        .collect();
    let mut n = 0;
    for kv in doing.kvs() {
        let Some((_, e, k)) = keys.parse_shard(kv.key()) else {
            continue;
        };
        if held.contains(&(e, k)) {
            continue;
        }
        let Ok(h) = parse::<Holder>(kv.key(), kv.value()) else {
            continue;
        };
        if requeue(&queue.client, keys, &h.node, (e, k), seq).await {
            n += 1;
        }
    }
    if n > 0 {
        shared.wake.notify_one();
    }
    n
}

/// Renews the lease every third of its TTL; marks it lost when etcd says it expired.
pub(super) async fn keep_alive(client: Client, lease: i64, ttl: Duration, shared: Arc<Shared>) {
    let period = (ttl / 3).max(Duration::from_millis(300));
    loop {
        match client.lease_client().keep_alive(lease).await {
            Ok((mut keeper, mut stream)) => loop {
                if let Err(e) = keeper.keep_alive().await {
                    shared.error(format!("lease keep-alive: {e}"));
                    break;
                }
                match tokio::time::timeout(ttl.max(Duration::from_secs(1)), stream.message()).await
                {
                    Ok(Ok(Some(resp))) if resp.ttl() <= 0 => {
                        shared.error("the lease expired; joining again at the next claim");
                        shared.lease_lost.store(true, Ordering::Release);
                        shared.wake.notify_one();
                        return;
                    }
                    Ok(Ok(Some(_))) => {}
                    Ok(Ok(None)) => break,
                    Ok(Err(e)) => {
                        shared.error(format!("lease keep-alive: {e}"));
                        break;
                    }
                    Err(_) => {
                        shared.error("lease keep-alive: no answer from etcd");
                        break;
                    }
                }
                tokio::time::sleep(period).await;
            },
            Err(e) => shared.error(format!("lease keep-alive: {e}")),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Watches the queue: gives back the shards of a node whose registration vanished (its lease
/// expired, or it left) and wakes a waiting worker when a shard is given back.
///
/// Two narrow watches, not one of the whole prefix: deletions under `workers/` (one event per
/// node that dies or leaves) and puts under `todo/` (one per shard given back). A watch of the
/// whole prefix sent every claim and every done to every node: 8,747 watch messages a second
/// at 1,024 simulated nodes for a few hundred writes (`benches/nodes.py`). The node's
/// registration and its claims share its lease, so etcd deletes them in one revision; the
/// `held/` records, outside the lease, then say which shards were its. Each watcher waits a
/// random time of up to 2 ms per live node before reading them ([`reaction_spread`]), so
/// that of a thousand nodes a few give the shards back and the rest find nothing left to do,
/// while in a job of a few nodes the shards come back within milliseconds.
pub(super) async fn watch_queue(queue: Queue, shared: Arc<Shared>, me: String) {
    let keys = queue.keys.clone();
    let mut first = true;
    loop {
        let mut wc = queue.client.watch_client();
        let deaths = wc
            .watch(
                keys.workers(),
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_filters([WatchFilterType::NoPut]),
                ),
            )
            .await;
        let backs = wc
            .watch(
                keys.todo_all(),
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_filters([WatchFilterType::NoDelete]),
                ),
            )
            .await;
        match (deaths, backs) {
            (Ok((_w1, mut deaths)), Ok((_w2, mut backs))) => {
                // Anything orphaned while nobody watched: after a watch of this node's ended
                // (it may have missed deaths), or at its first when no other node is
                // registered (every node may have died). A node that joins a live job skips it:
                // the live nodes watched, or swept when their own watches began, and a sweep
                // reads every DOING shard, which a thousand nodes joining at once cannot all do.
                if !first || others_registered(&queue, &me).await != Some(true) {
                    sweep(&queue, &shared).await;
                }
                first = false;
                shared.wake.notify_one();
                loop {
                    tokio::select! {
                        m = deaths.message() => match m {
                            Ok(Some(resp)) => {
                                for ev in resp.events().iter().filter(|ev| ev.event_type() == EventType::Delete) {
                                    let Some(node) = ev.kv().and_then(|kv| keys.parse_node(kv.key(), &keys.workers())) else {
                                        continue;
                                    };
                                    let (queue, shared, node) = (queue.clone(), shared.clone(), node.to_string());
                                    tokio::spawn(async move {
                                        tokio::time::sleep(super::random_wait(reaction_spread(&queue, &shared).await)).await;
                                        if requeue_node(&queue, &node).await > 0 {
                                            shared.wake.notify_one();
                                        }
                                    });
                                }
                            }
                            Ok(None) => break,
                            Err(e) => {
                                shared.error(format!("queue watch: {e}"));
                                break;
                            }
                        },
                        m = backs.message() => match m {
                            Ok(Some(_)) => {
                                shared.todo_changed.store(true, Ordering::Release);
                                shared.wake.notify_one();
                            }
                            Ok(None) => break,
                            Err(e) => {
                                shared.error(format!("queue watch: {e}"));
                                break;
                            }
                        },
                    }
                }
            }
            (Err(e), _) | (_, Err(e)) => shared.error(format!("queue watch: {e}")),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Whether a node other than `me` is registered on the queue (`None`: etcd did not say). The
/// watch may begin before or after `me` registers, so its own registration is not counted.
async fn others_registered(queue: &Queue, me: &str) -> Option<bool> {
    let opts = GetOptions::new()
        .with_prefix()
        .with_keys_only()
        .with_limit(2);
    let r = queue
        .client
        .kv_client()
        .get(queue.keys.workers(), Some(opts))
        .await
        .ok()?;
    let mine = queue.keys.worker(me);
    Some(r.kvs().iter().any(|kv| kv.key() != mine.as_bytes()))
}

/// How long the live nodes spread their reactions to a death over: 2 ms per registered node,
/// at least 2 ms and at most 2 s. The nodes are counted (a count-only read) at this node's
/// first reaction and again when the count is a minute old, not at every death: a death is
/// seen by every node at once, and a thousand counts of a thousand keys at that moment were
/// a load etcd felt.
async fn reaction_spread(queue: &Queue, shared: &Shared) -> Duration {
    const FRESH: Duration = Duration::from_secs(60);
    let known = *shared.nodes.lock().unwrap_or_else(|p| p.into_inner());
    let n = match known {
        Some((n, at)) if at.elapsed() < FRESH => n,
        _ => {
            let opts = GetOptions::new().with_prefix().with_count_only();
            let n = match queue
                .client
                .kv_client()
                .get(queue.keys.workers(), Some(opts))
                .await
            {
                Ok(r) => r.count().max(1) as u64,
                Err(_) => known.map_or(1, |(n, _)| n),
            };
            *shared.nodes.lock().unwrap_or_else(|p| p.into_inner()) = Some((n, Instant::now()));
            n
        }
    };
    Duration::from_millis((2 * n).min(2000))
}
