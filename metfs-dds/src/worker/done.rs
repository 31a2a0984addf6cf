//! Marking a batch DONE: each shard whose claim this worker still holds moves to DONE, in one
//! transaction per chunk of shards (with the node's totals when the batch fits one); a chunk
//! with a claim no longer ours is settled shard by shard, and the shards lost are reported.

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use crate::keys::{Keys, NodeStats};
use crate::{etcd, now_ms, DdsError};

use super::{holder_bytes, timed, Batch, DoneReport, Worker, MAX_OPS};

impl Worker {
    /// Marks `batch` DONE: each shard whose claim this worker still holds moves to DONE in one
    /// transaction; the others are reported lost.
    pub async fn done(&mut self, batch: &Batch) -> Result<DoneReport, DdsError> {
        let r = self.done_inner(batch).await;
        self.after(&r);
        r
    }

    /// [`Worker::done`], its outcome not yet recorded.
    async fn done_inner(&mut self, batch: &Batch) -> Result<DoneReport, DdsError> {
        let keys = self.queue.keys.clone();
        let hv = holder_bytes(&batch.holder);
        // A batch that fits one transaction (the usual case) updates the totals in it too.
        let single = batch.shards.len() * 4 < MAX_OPS;
        let all_done = self.totals(
            batch,
            &DoneReport {
                done: batch.shards.clone(),
                lost: Vec::new(),
            },
        );
        let mut report = DoneReport::default();
        let mut settled_one_by_one = false;
        for chunk in batch.shards.chunks(MAX_OPS / 4) {
            let (cmp, then): (Vec<_>, Vec<_>) = chunk
                .iter()
                .map(|&k| done_ops(&keys, &batch.holder.node, (batch.epoch, k), &hv))
                .unzip();
            let mut then: Vec<TxnOp> = then.into_iter().flatten().collect();
            if single {
                then.push(self.stats_op(&all_done));
            }
            let txn = Txn::new().when(cmp).and_then(then);
            let r = timed(&self.shared, self.queue.client.kv_client().txn(txn))
                .await
                .map_err(etcd("marking shards done"))?;
            if r.succeeded() {
                report.done.extend_from_slice(chunk);
                continue;
            }
            settled_one_by_one = true;
            self.settle_one_by_one(batch, chunk, &mut report).await?;
        }
        let stats = self.totals(batch, &report);
        if !single || settled_one_by_one {
            timed(
                &self.shared,
                self.queue
                    .client
                    .kv_client()
                    .txn(Txn::new().and_then([self.stats_op(&stats)])),
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
                epoch = batch.epoch,
                lost = ?report.lost,
                "dds: shards were given back before they were done (lease expired); their samples are read again elsewhere"
            );
        }
        Ok(report)
    }

    /// Some claim of `chunk` is no longer ours: settles it shard by shard into `report`. A
    /// shard already DONE by this very claim (a retry after an answer lost on the way) counts
    /// as done.
    async fn settle_one_by_one(
        &self,
        batch: &Batch,
        chunk: &[u32],
        report: &mut DoneReport,
    ) -> Result<(), DdsError> {
        let keys = &self.queue.keys;
        let hv = holder_bytes(&batch.holder);
        let e = batch.epoch;
        for &k in chunk {
            let (c, t) = done_ops(keys, &batch.holder.node, (e, k), &hv);
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
        Ok(())
    }

    /// The node's totals once `batch` is settled as `report` says.
    fn totals(&self, batch: &Batch, report: &DoneReport) -> NodeStats {
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
    }

    /// The put of the node's totals.
    fn stats_op(&self, stats: &NodeStats) -> TxnOp {
        TxnOp::put(
            self.queue.keys.stats(&self.holder.node),
            serde_json::to_vec(stats).expect("serializable"),
            None,
        )
    }
}

/// Shard `k` of epoch `e` moved to DONE, if its claim is still `hv`'s (of `node`): the
/// comparison, and the claim, DOING and `held/` deleted, DONE put.
fn done_ops(keys: &Keys, node: &str, (e, k): (u64, u32), hv: &[u8]) -> (Compare, [TxnOp; 4]) {
    (
        Compare::value(keys.claim(e, k), CompareOp::Equal, hv.to_vec()),
        [
            TxnOp::delete(keys.claim(e, k), None),
            TxnOp::delete(keys.doing(e, k), None),
            TxnOp::delete(keys.held(node, e, k), None),
            TxnOp::put(keys.done(e, k), hv.to_vec(), None),
        ],
    )
}
