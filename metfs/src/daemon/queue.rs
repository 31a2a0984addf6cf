//! The queue feed (`metfs mount --dds`): the session's mini-epochs are the batches its node's
//! [`Worker`] claims from the shard queue in etcd (`metfs_dds`), not slices of its own plan.
//!
//! * **Positions.** From a queue, a session's mini-epoch is a sequence number of this daemon
//!   (0 for the first batch, then 1, 2, ...) and its epoch is the batch's. The successor is
//!   the batch claimed after the current one; until it is claimed there is none (the
//!   `schedule` module), and `pass_end` answers `wait` (a bonus pass), as for a successor still
//!   staging. A restarted daemon is a new incarnation: it keeps no slot or position of the
//!   one before (their shards went back to the queue with its lease) and starts from its
//!   next claim.
//! * **One talker.** Only the staging loop talks to etcd, through [`QueueFeed::serve`]
//!   at the top of each round: first it marks DONE the batches handed over (a claim is
//!   refused while the worker holds two batches, the view and the successor), then it claims
//!   the successor when there is none, for at most one slot's bytes. `pass_end` and the switch
//!   only hand batches over ([`QueueFeed::mark_done`]), so no request waits for etcd.
//! * **DONE.** With `after-pass` (the default) at the end of the view's first pass, with
//!   `after-rf` when the view retires. A batch is handed over once ([`crate::daemon::schedule::QueueState::mark`]).
//! * **Samples of several files.** Where files are grouped (`group_by`, a format's shards, the
//!   manifest's group column) the queue deals groups; a claimed batch becomes the files of its
//!   groups and the files in every view ([`files_of_batch`]) before the schedule sees it, so
//!   a view holds whole groups (the store leaves out a group a file of which failed) and its
//!   budget counts every file. Claims take at most a slot less the files in every view.
//! * **Deferred samples.** A claimed batch whose samples the tier keeps failing past
//!   `defer_after_secs` is staged without them, as on a plain mount; they are the node's to
//!   carry into its next claimed mini-epoch, which claims that much less (at most half a
//!   claim less). The batch is marked DONE as any other: its shards are read, less what is
//!   carried, and a carried sample reaches the job when the tier gives it. A node that is
//!   killed while it carries samples loses them for that epoch (a new incarnation keeps no
//!   position; the lease returns only shards not yet DONE).
//! * **etcd away.** The view keeps serving (bonus passes), DONE marks wait in order and are
//!   sent again, claims are retried every two seconds, and `status` shows the worker's last
//!   error until a round trip succeeds.

use std::sync::atomic::AtomicBool;

use crate::daemon::session::Sessions;
use crate::daemon::session::DEFAULT_SESSION;
use crate::daemon::store::Store;
use metfs_dds::{Batch, Claim, DdsError, ShardDone, Worker};
use metfs_fs::lock_order::{Level, OrderedMutex};
use metfs_plan::size::format_bytes;
use metfs_protocol::reply::DdsStatus;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// A daemon's worker on its queue, and what the staging loop has still to send.
pub(super) struct QueueFeed {
    /// The queue's address, for `status`.
    pub(super) url: String,
    pub(super) shard_done: ShardDone,
    /// Most bytes of samples one claim takes: a slot less the files in every view.
    claim_bytes: u64,
    worker: tokio::sync::Mutex<Worker>,
    /// Batches to mark DONE, oldest first.
    pending_done: OrderedMutex<Vec<Batch>>,
    /// Every shard of every epoch is DONE: nothing more to claim.
    finished: AtomicBool,
    /// What `status` shows, refreshed after each round of [`QueueFeed::serve`].
    snapshot: OrderedMutex<DdsStatus>,
    /// After a failed round trip, etcd is not asked again before this (the staging loop also
    /// wakes for every `pass_end`).
    retry_at: OrderedMutex<Option<Instant>>,
}

impl QueueFeed {
    pub(super) fn new(
        url: String,
        shard_done: ShardDone,
        worker: Worker,
        claim_bytes: u64,
    ) -> Self {
        let feed = Self {
            url,
            shard_done,
            claim_bytes,
            worker: tokio::sync::Mutex::new(worker),
            pending_done: OrderedMutex::new(Level::PendingDone, Vec::new()),
            finished: AtomicBool::new(false),
            snapshot: OrderedMutex::new(Level::QueueSnapshot, DdsStatus::default()),
            retry_at: OrderedMutex::new(Level::RetryAt, None),
        };
        if let Ok(w) = feed.worker.try_lock() {
            feed.refresh(&w);
        }
        feed
    }

    /// Hands `batch` over to be marked DONE by the staging loop.
    pub(super) fn mark_done(&self, batch: Batch) {
        self.pending_done.lock().unwrap().push(batch);
    }

    /// The worker's state for `status`.
    pub(super) fn status(&self) -> DdsStatus {
        self.snapshot.lock().unwrap().clone()
    }

    fn refresh(&self, w: &Worker) {
        let st = w.stats();
        let (round_trips, etcd) = w.etcd_time();
        *self.snapshot.lock().unwrap() = DdsStatus {
            url: self.url.clone(),
            node: w.holder().node.clone(),
            incarnation: w.holder().inc,
            shard_done: super::wire::wire_shard_done(self.shard_done),
            epoch: w.epoch(),
            shards: w.meta().shards,
            claimed_shards: st.claimed_shards,
            claimed_samples: st.claimed_samples,
            done_shards: st.done_shards,
            done_samples: st.done_samples,
            lost_shards: st.lost_shards,
            samples_per_sec: st.throughput(),
            pending_done: self.pending_done.lock().unwrap().len() as u64,
            etcd_round_trips: round_trips,
            etcd_secs: etcd.as_secs_f64(),
            finished: self.finished.load(Ordering::Relaxed),
            last_error: w.last_error(),
        };
    }

    /// Claims the first batch of a mount (waiting while every shard left is held elsewhere).
    pub(super) async fn first_batch(
        worker: &mut Worker,
        max_bytes: u64,
    ) -> Result<Batch, DdsError> {
        loop {
            match worker.claim(max_bytes).await? {
                Claim::Batch(b) => return Ok(b),
                Claim::Wait => worker.wait(Duration::from_secs(1)).await,
                Claim::Finished => return Err(DdsError::Finished),
            }
        }
    }
}

/// `batch`, claimed from the queue, as the session's schedule holds it: where samples are
/// groups, its `samples` (sample ids, as the queue deals them) become the files of those
/// samples and the files in every view ([`metfs_plan::groups::SampleGroups::files`]), and its
/// `bytes` their footprint. Its shards and their lengths (in samples) stay the queue's, for
/// its DONE marks and the node's counts.
pub(super) fn files_of_batch(store: &Store, mut batch: Batch) -> Batch {
    if let Some(s) = &store.samples {
        batch.samples = s.groups().files(&batch.samples);
        batch.bytes = store.footprint(&batch.samples);
    }
    batch
}

/// How many bytes of samples to claim when the session carries `carried` bytes of deferred
/// samples: what is left of a claim's `full` for them to join the mini-epoch, but at least
/// half of it, so that a long fault's carry never stops the node claiming (what does not fit
/// waits for a later mini-epoch).
fn claim_size(full: u64, carried: u64) -> u64 {
    full.saturating_sub(carried).max(full / 2)
}

/// Pause before the next try after etcd failed.
const RETRY: Duration = Duration::from_secs(2);

impl QueueFeed {
    /// One round of the queue feed (see the module doc): sends the DONE marks handed over,
    /// then claims the default session's successor (of `sessions`) if it has none; etcd's
    /// failures are noted in `store`. Returns how long the
    /// staging loop may sleep before the next round if nothing else wakes it (`None`: no
    /// queue, or nothing to wait for).
    pub(super) async fn serve(
        &self,
        sessions: &OrderedMutex<Sessions>,
        store: &Store,
    ) -> Option<Duration> {
        let feed = self;
        if let Some(at) = *feed.retry_at.lock().unwrap() {
            let left = at.saturating_duration_since(Instant::now());
            if !left.is_zero() {
                return Some(left);
            }
        }
        let mut w = feed.worker.lock().await;
        let pause = self.round(&mut w, sessions, store).await;
        *feed.retry_at.lock().unwrap() = (pause == Some(RETRY)).then(|| Instant::now() + RETRY);
        feed.refresh(&w);
        pause
    }

    /// One round with the worker `w` held: the DONE marks, then the claim.
    async fn round(
        &self,
        w: &mut Worker,
        sessions: &OrderedMutex<Sessions>,
        store: &Store,
    ) -> Option<Duration> {
        let feed = self;
        let pending = std::mem::take(&mut *feed.pending_done.lock().unwrap());
        let mut left = pending.into_iter();
        while let Some(b) = left.next() {
            match w.done(&b).await {
                Ok(r) => {
                    if !r.lost.is_empty() {
                        tracing::warn!(
                            epoch = b.epoch,
                            shards = ?r.lost,
                            "dds: these shards went back to the queue before they were marked done (the lease expired); another node reads them again"
                        );
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "dds: cannot mark shards done; retrying");
                    store.note_error(format!("dds: {e}"));
                    let mut back = vec![b];
                    back.extend(left);
                    let mut p = feed.pending_done.lock().unwrap();
                    back.append(&mut p);
                    *p = back;
                    return Some(RETRY);
                }
            }
        }
        if feed.finished.load(Ordering::Relaxed) {
            return None;
        }
        let (wanted, carried) = {
            let ss = sessions.lock().unwrap();
            ss.get(DEFAULT_SESSION).map_or((false, 0), |s| {
                (
                    s.successor().is_none() && s.schedule().by_sequence(),
                    s.carried_bytes(store),
                )
            })
        };
        if !wanted {
            return None;
        }
        match w.claim(claim_size(feed.claim_bytes, carried)).await {
            Ok(Claim::Batch(b)) => {
                let b = files_of_batch(store, b);
                tracing::info!(
                    epoch = b.epoch,
                    shards = b.shards.len(),
                    samples = b.lengths.iter().map(|&n| u64::from(n)).sum::<u64>(),
                    files = b.samples.len(),
                    bytes = %format_bytes(b.bytes),
                    "dds: claimed the next mini-epoch"
                );
                let mut ss = sessions.lock().unwrap();
                if let Some(s) = ss.get_mut(DEFAULT_SESSION) {
                    let seq = s.mini_epoch().wrapping_add(1);
                    if let Some(q) = s.schedule_mut().queue_mut() {
                        q.batches.insert(seq, b);
                    }
                }
                None
            }
            Ok(Claim::Wait) => {
                w.wait(Duration::from_secs(1)).await;
                Some(Duration::ZERO)
            }
            Ok(Claim::Finished) => {
                tracing::info!("dds: every shard of the queue is done; the view keeps serving");
                feed.finished.store(true, Ordering::Relaxed);
                None
            }
            Err(DdsError::StillHolding { .. }) => Some(Duration::from_millis(200)),
            Err(e) => {
                tracing::warn!(error = %e, "dds: cannot claim the next mini-epoch; the view keeps serving, retrying");
                store.note_error(format!("dds: {e}"));
                Some(RETRY)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::claim_size;

    #[test]
    fn a_carry_shrinks_the_claim_to_at_most_half() {
        assert_eq!(claim_size(1000, 0), 1000);
        assert_eq!(claim_size(1000, 300), 700);
        assert_eq!(claim_size(1000, 600), 500, "at least half a claim");
        assert_eq!(claim_size(1000, u64::MAX), 500);
    }
}
