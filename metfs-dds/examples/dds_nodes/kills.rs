//! The kills: `--kill-frac` of the nodes die at random moments of the first epoch, each a node
//! that holds a batch at that moment, as a `kill -9` of its daemon would (the task is aborted,
//! which drops its `Worker`: the lease is no longer renewed and nothing is revoked). What each
//! held is read from its claims in etcd, and the TODO keys' watch times its return: from the
//! kill to the last of its shards back in TODO.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::Client;
use metfs_dds::keys::Keys;
use metfs_dds::Holder;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::measure::scan;
use crate::{lock, Args, Shared};

/// A node's task, and who it is once joined. The task is taken when it is killed or awaited.
pub(crate) type Task = (
    Arc<Mutex<Option<Holder>>>,
    Option<tokio::task::JoinHandle<()>>,
);

/// A node killed: who, when, and its index.
pub(crate) type Killed = (Holder, Instant, usize);

/// Kills `--kill-frac` of the nodes (at least one where it is not 0) at random moments of the
/// first epoch, once every node is up: each a node drawn at that moment among those that hold
/// a batch (a node that holds nothing leaves nothing to requeue; on an overloaded queue many
/// have none yet).
pub(crate) async fn kill_some(
    a: &Args,
    t0: Instant,
    tasks: &mut [Task],
    logs: &[Shared],
) -> Vec<Killed> {
    let n = a.workers;
    let kills = ((n as f64 * a.kill_frac).round() as u32).max(u32::from(a.kill_frac > 0.0));
    let mut rng = rand::rngs::StdRng::seed_from_u64(a.seed ^ 0x6b69_6c6c);
    let epoch_ms = a.pass_ms * u64::from(a.rf) * u64::from(a.slots_per_epoch);
    let from = a.start_spread_ms + a.pass_ms;
    let mut plan: Vec<u64> = (0..kills)
        .map(|_| rng.random_range(from..from + epoch_ms))
        .collect();
    plan.sort_unstable();
    let mut killed = Vec::new();
    for at in plan {
        tokio::time::sleep_until((t0 + Duration::from_millis(at)).into()).await;
        let holding: Vec<usize> = (0..n as usize)
            .filter(|&i| {
                tasks[i].1.as_ref().is_some_and(|t| !t.is_finished())
                    && !lock(&logs[i]).claim_ms.is_empty()
            })
            .collect();
        if holding.is_empty() {
            continue;
        }
        let v = holding[rng.random_range(0..holding.len())];
        let Some(h) = tasks[v].0.lock().unwrap_or_else(|p| p.into_inner()).clone() else {
            continue;
        };
        let Some(t) = tasks[v].1.take() else { continue };
        // Dropping the task drops its Worker: the lease is no longer renewed, nothing revoked.
        t.abort();
        let _ = t.await;
        killed.push((h, Instant::now(), v));
    }
    killed
}

/// The (epoch, shard)s each of `killed` held: its claims in etcd.
pub(crate) async fn held(
    observer: &mut Client,
    keys: &Keys,
    killed: &[Killed],
) -> Vec<Vec<(u64, u32)>> {
    let claims = scan(observer, keys.claim_all()).await;
    killed
        .iter()
        .map(|(h, _, _)| {
            claims
                .iter()
                .filter(|(_, v, _)| serde_json::from_slice::<Holder>(v).is_ok_and(|x| &x == h))
                .filter_map(|(k, _, _)| keys.parse_shard(k).map(|(_, e, s)| (e, s)))
                .collect()
        })
        .collect()
}

/// Each kill's report: when, what it held, and its requeue time, until the last shard it
/// held is back in TODO (`seen`: the watch's times). A shard whose DONE mark was on its way
/// when the node died (it landed after the claims were read, on a loaded etcd) is DONE by the
/// dead node and never requeued: counted apart.
pub(crate) fn requeue_times(
    keys: &Keys,
    killed: &[Killed],
    held: &[Vec<(u64, u32)>],
    done: &[(Vec<u8>, Vec<u8>, i64)],
    seen: &HashMap<(u64, u32), Vec<Instant>>,
    t0: Instant,
) -> Vec<serde_json::Value> {
    let done_by: HashMap<(u64, u32), Holder> = done
        .iter()
        .filter_map(|(k, v, _)| {
            let (_, e, s) = keys.parse_shard(k)?;
            Some(((e, s), serde_json::from_slice(v).ok()?))
        })
        .collect();
    killed
        .iter()
        .zip(held)
        .map(|((h, when, _), shards)| {
            let (landed, back): (Vec<_>, Vec<_>) =
                shards.iter().partition(|s| done_by.get(s) == Some(h));
            let times: Vec<Option<f64>> = back
                .iter()
                .map(|s| {
                    seen.get(s)
                        .and_then(|ts| ts.iter().find(|t| *t >= when))
                        .map(|t| t.duration_since(*when).as_secs_f64())
                })
                .collect();
            let all = times.iter().all(Option::is_some);
            let last = times.iter().flatten().copied().fold(f64::NAN, f64::max);
            let requeue_s = if back.is_empty() || !all {
                serde_json::Value::Null
            } else {
                json!((last * 1000.0).round() / 1000.0)
            };
            json!({
                "node": h.node,
                "at_s": (when.duration_since(t0).as_secs_f64() * 100.0).round() / 100.0,
                "held_shards": shards.len(),
                "done_as_it_died": landed.len(),
                "requeue_s": requeue_s,
            })
        })
        .collect()
}
