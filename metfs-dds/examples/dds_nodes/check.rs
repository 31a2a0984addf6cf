//! The run's invariant, from what etcd holds at its end: every shard of every epoch DONE
//! once (its `done/` key written once, at version 1), every sample of an epoch in exactly one
//! DONE shard, and nothing left TODO, DOING or claimed. A job stopped early (`cut`) is held to
//! what holds mid-epoch: no shard DONE twice, no sample in two DONE shards.

use std::collections::BTreeMap;

use etcd_client::Client;
use metfs_dds::keys::{Keys, Kind};
use metfs_dds::{OwnedSamples, QueueMeta};
use metfs_plan::planner::{epoch_order, ShardSpec};

use crate::measure::scan;

/// Checks the `done` keys (from [`scan`]) of a queue of `meta` over `samples`, run for
/// `epochs` (stopped early if `cut`), adding what is wrong to `problems`; returns each
/// epoch's DONE shards.
pub(crate) async fn done_keys(
    observer: &mut Client,
    keys: &Keys,
    done: &[(Vec<u8>, Vec<u8>, i64)],
    (meta, samples): (&QueueMeta, &OwnedSamples),
    (epochs, cut): (u64, bool),
    problems: &mut Vec<String>,
) -> BTreeMap<u64, Vec<u32>> {
    let mut per_epoch: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    let rewritten = done.iter().filter(|(_, _, v)| *v != 1).count();
    if rewritten > 0 {
        problems.push(format!("{rewritten} done keys written more than once"));
    }
    for (k, _, _) in done {
        if let Some((Kind::Done, e, s)) = keys.parse_shard(k) {
            per_epoch.entry(e).or_default().push(s);
        }
    }
    let spec = ShardSpec {
        strategy: meta.strategy,
        seed: meta.seed,
        shards: meta.shards,
        shard_bytes: meta.shard_bytes,
    };
    for e in 0..epochs {
        let got = per_epoch.get(&e).cloned().unwrap_or_default();
        if !cut && got.len() as u32 != meta.shards {
            problems.push(format!(
                "epoch {e}: {} of {} shards DONE",
                got.len(),
                meta.shards
            ));
        }
        let order = epoch_order(&samples.set(), &spec, e).expect("the queue's order");
        let mut count = vec![0u8; samples.sizes.len()];
        for &s in &got {
            for &id in order.samples(s) {
                count[id as usize] = count[id as usize].saturating_add(1);
            }
        }
        // A job stopped early: no sample in two DONE shards; done: every sample in one.
        let off = count.iter().filter(|&&c| c > 1 || (!cut && c != 1)).count();
        if off > 0 {
            problems.push(format!(
                "epoch {e}: {off} samples not in exactly one DONE shard"
            ));
        }
    }
    // A job stopped early leaves shards DOING and TODO: nothing to check there.
    let left = [
        ("TODO", keys.todo_all()),
        ("DOING", keys.doing_all()),
        ("claimed", keys.claim_all()),
    ];
    for (what, prefix) in left.into_iter().filter(|_| !cut) {
        let left = scan(observer, prefix).await.len();
        if left > 0 {
            problems.push(format!("{left} shards left {what}"));
        }
    }
    per_epoch
}
