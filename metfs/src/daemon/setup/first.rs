//! The session of a plain, queue (`--dds`) or aggregate mount: where it starts (the saved
//! position, the queue's first batch, or the start), the stale slots removed, its rf history
//! and policy, its schedule, and its first mini-epoch staged through [`Store::stage`] before
//! the mount goes live.

use crate::config::DdsMode;
use crate::config::{MountConfig, PrefetchRate};
use crate::daemon::deferred::Deferred;
use crate::daemon::fingerprint::{Fingerprint, SavedFingerprint};
use crate::daemon::mode::ModeState;
use crate::daemon::pacing::AUTO_TRICKLE;
use crate::daemon::queue::{files_of_batch, QueueFeed};
use crate::daemon::samples::{queue_samples, Samples};
use crate::daemon::schedule::QueueState;
use crate::daemon::schedule::{Plans, Schedule};
use crate::daemon::session::{History, Persist, Session, Start, DEFAULT_SESSION};
use crate::daemon::setup::plan::Planned;
use crate::daemon::setup::{
    build_policy, copy_repair, fs_settings, open_history, resolve_read_path, write_saved_state,
    Parts,
};
use crate::daemon::staging::progress_bar;
use crate::daemon::state::SavedState;
use crate::daemon::store::Store;
use crate::daemon::{aggregate, slot_name, successor, CachePaths, Daemon, DaemonError};
use metfs_fs::fs::FsCore;
use metfs_fs::view::View;
use metfs_plan::planner::PlanConfig;
use metfs_plan::size::format_bytes;
use metfs_prefetcher::stager::{Progress, SlotSpec, StageReport};
use metfs_protocol::event;
use metfs_protocol::event::Event;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// What [`Daemon::prepare_session`] starts from: the phases before it.
pub(super) struct First {
    pub(super) cfg: MountConfig,
    pub(super) paths: CachePaths,
    pub(super) tier_url: String,
    /// The store, its book still empty.
    pub(super) store: Store,
    pub(super) planned: Planned,
    pub(super) fingerprint: Fingerprint,
    /// The position to resume, if the state file has one of this plan.
    pub(super) saved: Option<SavedState>,
}

impl Daemon {
    /// Starts (or resumes) the mount's one session and stages its first mini-epoch.
    pub(super) async fn prepare_session(
        f: First,
        show_progress: bool,
    ) -> Result<Arc<Daemon>, DaemonError> {
        let First {
            cfg,
            paths,
            tier_url,
            store,
            planned,
            fingerprint,
            saved,
        } = f;
        let Planned {
            budget,
            footprints: _,
            plan_cfg,
            nm,
            aggregate,
            samples,
        } = planned;
        let queue = join_queue(&cfg, &store, samples.as_deref(), plan_cfg.slot_bytes).await?;
        let start = start_of(saved.as_ref(), queue.as_ref().map(|(_, b)| b));
        let cur = (start.epoch, start.mini_epoch);
        remove_stale_slots(&store, saved.is_some(), cur, successor(cur, nm))?;
        let job = saved
            .as_ref()
            .and_then(|s| s.job.clone())
            .unwrap_or_else(|| cfg.job.clone());
        let (history, replayed) = open_history(
            &cfg,
            &fingerprint.dataset_key(),
            &job,
            saved.as_ref().and_then(|s| s.run),
        )?;
        let policy = build_policy(&cfg, replayed)?;
        if saved.is_none() {
            save_first_position(&paths, &fingerprint, &start, &history, &job);
        }
        let mut schedule = first_schedule(
            queue.as_ref().map(|(_, b)| b),
            aggregate.as_ref(),
            &store,
            plan_cfg,
            nm,
            start.epoch,
        )?;
        let carried = saved_carry(saved.as_ref(), &paths, store.catalog.len() as u32)?;
        let (view, first_members, deferred) = stage_first_view(
            &cfg,
            &store,
            &mut schedule,
            carried.as_ref(),
            &start,
            show_progress,
        )
        .await?;
        let read_path = resolve_read_path(&cfg, &store.catalog, &budget, true);
        let fs = Arc::new(FsCore::new(view.clone(), fs_settings(&cfg, read_path)));
        fs.set_copy_repair(copy_repair(&store.stager));
        let mut session = Session::new(
            DEFAULT_SESSION.to_string(),
            job,
            schedule,
            Some(Persist {
                fingerprint,
                file: paths.state.clone(),
            }),
            start,
            policy,
            history,
            view,
        );
        // What the saved position carried is carried on; what the first staging deferred is
        // carried into the next mini-epochs.
        if let Some(c) = carried {
            session.resume_deferred(c);
        }
        let carry = session.deferred_staged(&store, cur, &first_members, &deferred);
        store.left_out_extras(&carry.extras);
        let mode = match (queue, aggregate) {
            (Some((feed, _)), _) => ModeState::Queue(Box::new(feed)),
            (None, Some(a)) => ModeState::Aggregate(a),
            (None, None) => ModeState::Plain,
        };
        let daemon = Self::assemble(Parts {
            tier_url,
            mode,
            paths,
            store,
            sessions: BTreeMap::from([(DEFAULT_SESSION.to_string(), session)]),
            fs,
            read_path,
            cfg,
        });
        daemon.save_session(DEFAULT_SESSION, false);
        daemon.announce_start(nm, cur)?;
        Ok(daemon)
    }

    /// The last step of a session's setup: the exchange's spec in aggregate mode, and the
    /// `start` event.
    fn announce_start(&self, nm: u32, cur: (u64, u32)) -> Result<(), DaemonError> {
        if let Some(a) = self.mode.aggregate() {
            a.write_exchange_spec(&self.store.catalog, &self.cfg, &self.paths)?;
        }
        self.events.emit(Event::Start(event::Start {
            dataset_bytes: self.store.catalog.total_bytes(),
            dataset_files: self.store.catalog.len() as u64,
            mini_epochs: nm,
            view_bytes: self.surface.core().current().bytes(),
            rf_policy: self.cfg.policy.kind,
            budget_bytes: self.store.budget.budget,
            node_rank: self.cfg.node_rank,
            nodes: self.cfg.nodes,
            epoch: cur.0,
            mini_epoch: cur.1,
        }));
        Ok(())
    }
}

/// Stages the session's first mini-epoch (at `start`) through [`Store::stage`], reusing the
/// successor's slot of a `resumed` run, and returns its view at the start's generation, its
/// members, and the samples it deferred (a plain mount's first staging defers: the job is
/// waiting for it).
async fn stage_first_view(
    cfg: &MountConfig,
    store: &Store,
    schedule: &mut Schedule,
    resumed: Option<&Deferred>,
    start: &Start,
    show_progress: bool,
) -> Result<(Arc<View>, Vec<u32>, Vec<u32>), DaemonError> {
    let cur = (start.epoch, start.mini_epoch);
    // A resumed mini-epoch's slot was staged with the carried samples added to it then.
    let added = resumed.map_or(Vec::new(), |c| c.added_to(cur).to_vec());
    let (mut members, mut members_bytes) = schedule.members(store, cur);
    let mut view_members = schedule.view_members(store, cur);
    if !added.is_empty() {
        members_bytes += store.footprint(&added);
        for list in [&mut members, &mut view_members] {
            list.extend_from_slice(&added);
            list.sort_unstable();
            list.dedup();
        }
    }
    let resumed = resumed.is_some();
    let spec = SlotSpec {
        name: slot_name(cur),
        samples: members.clone(),
        // A resumed run's successor slot may hold samples of the current one.
        reuse_from: match (resumed, schedule.successor(cur)) {
            (true, Some(succ)) => vec![slot_name(succ)],
            _ => Vec::new(),
        },
        defer: cfg.mode.defers(),
    };
    tracing::info!(
        mini_epochs = schedule.mini_epochs(),
        slot_bytes = %format_bytes(store.budget.slot_bytes),
        reserve = %format_bytes(store.budget.reserve),
        epoch = cur.0, mini_epoch = cur.1,
        files = members.len(),
        bytes = %format_bytes(members_bytes),
        "staging the first mini-epoch"
    );
    store.begin_slot(&spec.name, &members);
    let deferred = stage_first(cfg, store, &spec, show_progress).await?;
    let view = Arc::new(store.view_for(&view_members, cur, start.generation, &spec.name));
    Ok((view, members, deferred))
}

/// The carry of a resumed position (empty where it carried nothing); `None` without one, a
/// fresh start. A carry naming a sample outside the catalog of `samples` is a corrupt
/// `state.json`, refused as such.
fn saved_carry(
    saved: Option<&SavedState>,
    paths: &CachePaths,
    samples: u32,
) -> Result<Option<Deferred>, DaemonError> {
    let Some(s) = saved else {
        return Ok(None);
    };
    let carried = s.deferred.clone().unwrap_or_default();
    carried
        .check(samples)
        .map_err(|reason| DaemonError::CorruptState {
            path: paths.state.display().to_string(),
            reason,
        })?;
    Ok(Some(carried))
}

/// The session's schedule at its start: the queue's first batch as sequence 0, the aggregate
/// plan, or the plan of the starting epoch.
fn first_schedule(
    first_batch: Option<&metfs_dds::Batch>,
    aggregate: Option<&Arc<aggregate::Aggregate>>,
    store: &Store,
    plan_cfg: PlanConfig,
    nm: u32,
    epoch: u64,
) -> Result<Schedule, DaemonError> {
    Ok(match (first_batch, aggregate) {
        (Some(first), _) => Schedule::Queue {
            batches: QueueState {
                batches: BTreeMap::from([(0, first.clone())]),
                ..Default::default()
            },
            mini_epochs: nm,
        },
        (None, Some(a)) => Schedule::Aggregate(a.clone()),
        (None, None) => {
            let plan = store.plan_epoch(&plan_cfg, epoch)?;
            Schedule::Plan(Plans::new(plan_cfg, nm, Some((epoch, Arc::new(plan)))))
        }
    })
}

/// Where the session starts: the saved position, or a queue's first batch (sequence 0 of this
/// incarnation), or the start of epoch 0.
fn start_of(saved: Option<&SavedState>, first_batch: Option<&metfs_dds::Batch>) -> Start {
    let (epoch, mini_epoch, generation, sequence) = match (saved, first_batch) {
        (Some(s), _) => {
            tracing::info!(
                epoch = s.epoch,
                mini_epoch = s.mini_epoch,
                "resuming where the last mount stopped"
            );
            (s.epoch, s.mini_epoch, s.generation, s.sequence)
        }
        (None, Some(first)) => (first.epoch, 0, 1, 0),
        (None, None) => (0, 0, 1, 0),
    };
    Start {
        epoch,
        mini_epoch,
        passes: 0,
        generation,
        sequence,
    }
}

/// Removes the slots that belong to neither the current mini-epoch `cur` nor its successor
/// `succ`, and every slot, journal and seal when nothing is resumed (they are of another
/// plan).
fn remove_stale_slots(
    store: &Store,
    resumed: bool,
    cur: (u64, u32),
    succ: (u64, u32),
) -> Result<(), DaemonError> {
    let (cur, succ) = (slot_name(cur), slot_name(succ));
    store.remove_slots_except(|slot| resumed && (slot == cur || slot == succ))?;
    Ok(())
}

/// Saves a fresh plan's position before its first mini-epoch is staged: a daemon killed while
/// staging it then finds its plan on restart and resumes the slot from its journal, instead
/// of discarding it as a slot of an unknown plan.
fn save_first_position(
    paths: &CachePaths,
    fingerprint: &Fingerprint,
    start: &Start,
    history: &Option<History>,
    job: &str,
) {
    let first = SavedState {
        fingerprint: SavedFingerprint::Current(fingerprint.clone()),
        epoch: start.epoch,
        mini_epoch: start.mini_epoch,
        generation: start.generation,
        sequence: start.sequence,
        run: history.as_ref().map(|h| h.run),
        job: Some(job.to_string()),
        deferred: None,
    };
    if let Err(e) = write_saved_state(&paths.state, &first) {
        tracing::error!(error = %e, path = %paths.state.display(), "cannot save the position");
    }
}

/// Stages the first mini-epoch (`spec`, counted in the store's book) through the store, with a
/// progress bar if asked, then starts just-in-time pacing, and fails the mount if nothing of it
/// could be staged.
async fn stage_first(
    cfg: &MountConfig,
    store: &Store,
    spec: &SlotSpec,
    show_progress: bool,
) -> Result<Vec<u32>, DaemonError> {
    let t = Instant::now();
    let progress: Arc<Progress> = Arc::default();
    let bar = show_progress.then(|| progress_bar(progress.clone()));
    let report = store.stage(spec, progress).await;
    if let Some((bar, task)) = bar {
        task.abort();
        bar.finish_and_clear();
    }
    let report = report?;
    if cfg.prefetch_rate == PrefetchRate::Auto {
        // Just-in-time pacing starts as a trickle: the first pass end sets the real rate.
        store.stager.pacer().set_rate(Some(AUTO_TRICKLE));
    }
    tracing::info!(
        fetched = report.fetched,
        resumed = report.resumed,
        failed = report.failed.len(),
        tier_bytes = report.bytes_fetched,
        secs = t.elapsed().as_secs_f64(),
        "mini-epoch staged"
    );
    first_slot_usable(cfg, store, spec, spec.samples.len(), &report)?;
    store.note_failed(
        report
            .failed
            .iter()
            .map(|(id, why)| (store.catalog.path(*id), why.clone())),
    );
    Ok(store.whole_samples(&report.deferred))
}
/// With a queue (`--dds`): joins it as a new incarnation of this node and claims the first
/// batch (as the schedule holds it: [`files_of_batch`]); `None` without one. The queue deals
/// `samples` (groups, where files are grouped; the record names their settings), and a claim
/// takes at most `dealt` bytes of them (a slot less the files in every view).
pub(super) async fn join_queue(
    cfg: &MountConfig,
    store: &Store,
    samples: Option<&Samples>,
    dealt: u64,
) -> Result<Option<(QueueFeed, metfs_dds::Batch)>, DaemonError> {
    let Some(DdsMode { url, settings: dds }) = cfg.mode.dds() else {
        return Ok(None);
    };
    let q = metfs_dds::Queue::connect(url, &dds.etcd_options()).await?;
    let (owned, record) = queue_samples(&cfg.samples, &store.catalog, &store.footprints, samples);
    let meta = metfs_dds::dataset::queue_meta(
        &store.catalog,
        &owned,
        record,
        cfg.compose,
        cfg.seed,
        dealt,
        dds.shards_per_slot,
    )?;
    let (meta, made) = q.init(&meta).await?;
    let node = dds.node(cfg.node_rank);
    let mut worker = metfs_dds::Worker::join(
        q,
        meta,
        Arc::new(owned),
        metfs_dds::WorkerConfig {
            node: node.clone(),
            lease_ttl: dds.lease_ttl(),
            depth: 2,
            last_epoch: None,
        },
    )
    .await?;
    tracing::info!(
        queue = %url,
        node,
        incarnation = worker.holder().inc,
        made,
        samples = worker.meta().sample_settings.as_deref().unwrap_or("files"),
        shard_done = %dds.shard_done,
        "dds: joined the shard queue"
    );
    let first = QueueFeed::first_batch(&mut worker, dealt).await?;
    Ok(Some((
        QueueFeed::new(url.to_string(), dds.shard_done, worker, dealt),
        files_of_batch(store, first),
    )))
}

/// Samples of the first mini-epoch left out are reported; a first mini-epoch with none staged
/// at all is a wrong source or manifest, not a dataset to train on: its slot is deleted and the
/// mount fails naming the source (or manifest) and one sample's error.
pub(super) fn first_slot_usable(
    cfg: &MountConfig,
    store: &Store,
    spec: &SlotSpec,
    members: usize,
    report: &StageReport,
) -> Result<(), DaemonError> {
    if let Some((id, why)) = report.failed.first() {
        let (k, n) = (report.failed.len(), members);
        let what = match &cfg.manifest {
            Some(m) => format!("manifest {}", m.display()),
            None => format!("source {}", cfg.source),
        };
        if k >= n {
            store.remove_now(&spec.name);
            let hint = if cfg.manifest.is_some() {
                "; does the manifest belong to this source?"
            } else {
                ""
            };
            return Err(DaemonError::Setup(format!(
                "{what}: none of the {n} samples of the first mini-epoch could be staged from {} ({k} missing or unreadable, e.g. `{}`: {why}){hint}",
                cfg.source,
                store.catalog.path(*id)
            )));
        }
        tracing::warn!(
            "{what}: {k} of the first mini-epoch's {n} samples are missing or unreadable at the source and are left out (`metfs status` lists them)"
        );
    }
    Ok(())
}
