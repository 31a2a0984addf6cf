//! What keeps a worker's claims honest while it lives and gives them back when it dies: the
//! registration under a lease, the lease's renewal, the watch that requeues a dead holder's
//! shards at once, and the sweep that finds shards orphaned while nobody was watching.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, WatchOptions,
};

use crate::keys::{Holder, Keys, Kind};
use crate::queue::{parse, Queue};
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

/// The lowest epoch whose never-claimed shards are not all taken.
pub(super) async fn start_epoch(
    queue: &Queue,
    shared: &Shared,
    shards: u32,
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
    let mut open = None::<u64>;
    let mut last = None::<u64>;
    for kv in r.kvs() {
        let Some(e) = keys.parse_cursor(kv.key()) else {
            continue;
        };
        let c: u32 = parse(kv.key(), kv.value())?;
        last = Some(last.map_or(e, |l: u64| l.max(e)));
        if c < shards {
            open = Some(open.map_or(e, |o: u64| o.min(e)));
        }
    }
    Ok(open.unwrap_or_else(|| last.map_or(0, |l| l + 1)))
}

/// Gives back a shard whose claim vanished (its holder's lease expired), at the tail.
/// Idempotent: only the first of several racing workers succeeds.
pub(super) async fn requeue(
    client: &Client,
    keys: &Keys,
    epoch: u64,
    shard: u32,
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
            TxnOp::put(keys.todo(epoch, seq, shard), "", None),
        ]);
    match client.kv_client().txn(txn).await {
        Ok(r) => {
            if r.succeeded() {
                tracing::info!(epoch, shard, "dds: shard given back to TODO");
            }
            r.succeeded()
        }
        Err(_) => false,
    }
}

/// Gives back every DOING shard whose claim is gone. Returns how many were given back.
pub(super) async fn sweep(queue: &Queue, shared: &Shared) -> usize {
    let keys = &queue.keys;
    let opts = || Some(GetOptions::new().with_prefix().with_keys_only());
    let mut kv = queue.client.kv_client();
    let Ok(doing) = kv.get(keys.doing_all(), opts()).await else {
        return 0;
    };
    let Ok(claims) = kv.get(keys.claim_all(), opts()).await else {
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
        if let Some((_, e, k)) = keys.parse_shard(kv.key()) {
            if !held.contains(&(e, k)) && requeue(&queue.client, keys, e, k, seq).await {
                n += 1;
            }
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

/// Watches the queue: gives back shards whose claim vanished and wakes a waiting worker.
pub(super) async fn watch_queue(queue: Queue, shared: Arc<Shared>) {
    let keys = queue.keys.clone();
    loop {
        let w = queue
            .client
            .watch_client()
            .watch(keys.all(), Some(WatchOptions::new().with_prefix()))
            .await;
        match w {
            Ok((_watcher, mut stream)) => {
                // Anything orphaned while nobody watched.
                sweep(&queue, &shared).await;
                shared.wake.notify_one();
                loop {
                    match stream.message().await {
                        Ok(Some(resp)) => {
                            let seq = resp.header().map_or(0, |h| h.revision());
                            // A claim deleted together with its DOING key was marked done (or
                            // given back already); only a claim deleted alone, by its lease's
                            // expiry, leaves an orphan.
                            let deleted: Vec<(Kind, u64, u32)> = resp
                                .events()
                                .iter()
                                .filter(|ev| ev.event_type() == EventType::Delete)
                                .filter_map(|ev| keys.parse_shard(ev.kv()?.key()))
                                .collect();
                            for &(kind, e, k) in &deleted {
                                if kind == Kind::Claim && !deleted.contains(&(Kind::Doing, e, k)) {
                                    requeue(&queue.client, &keys, e, k, seq).await;
                                }
                            }
                            shared.wake.notify_one();
                        }
                        Ok(None) => break,
                        Err(e) => {
                            shared.error(format!("queue watch: {e}"));
                            break;
                        }
                    }
                }
            }
            Err(e) => shared.error(format!("queue watch: {e}")),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
