//! The daemon: a store of staged samples, views built over it, and a session per consumer.
//!
//! Three seams, each a type of its own:
//!
//! * **Store** ([`Store`], `store/`): the staged samples of the node and their byte budget.
//!   It owns the cache directory's slots (written by the stager), the catalog and each
//!   sample's footprint, the [`Budget`], and the book of slot bytes and draining slots. Only
//!   the store stages into or deletes from the cache.
//! * **View** ([`View`], built by [`Store::view_for`]): one mini-epoch of a slot under the
//!   samples' original paths, at one generation. Views are immutable; the filesystem core
//!   ([`FsCore`]) serves them, and a retired one lives on until no handle and no kernel
//!   reference holds it.
//! * **Session** (`session.rs`): one consumer's place in the run: its position (epoch,
//!   mini-epoch, pass), plan, rf policy, rf history, meter, the staging of its successor, and
//!   its current view. The [`Daemon`] keeps sessions in a map keyed by name; a mount has one,
//!   [`DEFAULT_SESSION`], whose view the mount's root shows. Every operation (`pass_end`,
//!   `advance`, `status`, the switch) names or looks up the session it acts on.
//!
//! Invariants. A session's view is always a complete, verified slot of the store; a switch
//! replaces it in one step (the core's pointer swap) and the old slot drains. The cache holds
//! at most the budget: staging waits while any slot drains (unless the store keeps it as a
//! donor within the budget, each hard-linked file counted once), and a slot leaves `draining`
//! only once its files are deleted (see the store's doc). Locks are taken in one order (*Lock
//! order*, at the end).
//!
//! State machine of a session. It is at (epoch, mini-epoch) with `passes` completed over it.
//! The *successor* is the next mini-epoch of the same epoch, or mini-epoch 0 of the next
//! epoch. A background task stages the successor into its slot as soon as the budget allows;
//! a `pass_end` asks the policy, and when the policy wants to advance and the successor is
//! fully staged, the view switches. If it is not staged yet the answer is `wait`: the job
//! repeats the current mini-epoch (a "bonus" pass, no stall) unless it asked to block.
//!
//! Budget. Each slot holds at most `slot_bytes = (budget - reserve) / 2` bytes of file
//! footprint (sizes rounded up to the block size); `reserve` covers the catalog, journals,
//! state, log and slot directories. See [`Budget`].
//!
//! Switch. The successor's [`View`] is built when its staging ends (for the generation the
//! switch will give it), so under the sessions' lock the switch only swaps it into the
//! [`FsCore`], bumps the session's generation and retires the old slot in the store's book.
//! The position and rf history are written on a blocking thread after the lock (a crash
//! before they land resumes one mini-epoch back, as a crash just before the switch would).
//! Then, before answering the caller, the kernel's cached entries under the root are
//! invalidated, so that when `pass_end` returns `advance` every new lookup already resolves in
//! the new view. The old view is retired and its slot evicted when its last handle closes.
//! Nothing that costs a core (building views, planning an epoch, dropping a view's pages) runs
//! on the switch's path: a 20,000-file switch takes about a millisecond in the daemon.
//!
//! Resume. A session's position is saved in its state file (`state.json` for the default
//! session) with a fingerprint of everything its plan depends on; a later mount with the same
//! fingerprint resumes at the same position and reuses every slot the journal shows as staged.
//!
//! Kernel. The daemon reaches the kernel's caches only through [`KernelCache`] (`kernel.rs`),
//! implemented over the FUSE session in `metfs_fs::fuse` and by a recorder in tests; nothing in
//! this folder imports `fuser` or `metfs_fs::fuse`. After the mount and after each switch it also
//! lists the new view through the mount (`prime.rs`), the one way to have the kernel hold a
//! view's entries before readers open its files.
//!
//! Shared mount (`--share`, `share/`): the jobs are sessions named after them, each view
//! nested under `MNT/<job>`, the views drawn by one cohort (dependent sampling), generations
//! unique across jobs, samples shared between the jobs' slots by hard links.
//!
//! Mode. One [`ModeState`] per daemon (`mode.rs`), made at setup from the configuration's
//! one [`crate::config::Mode`], holds what a mode shares across sessions (the queue's worker,
//! the jobs and their cohort, the aggregate plan) and answers what generic code asks: which
//! session a request acts on, whether a staging has room, what to do before a staging, what a
//! pass end does, the mode's `status` fields. The control socket, the staging loop, the switch
//! and `status` never test which mode runs; a session's `Schedule` answers the per-session
//! questions.
//!
//! Parts. The [`Daemon`] composes parts that own their state behind private fields, and runs
//! only what spans them (`pass_end`, `advance`, `apply`, the switch, `status`, `files`, a job's
//! `hello` and `leave`, the durable writes): the [`Store`]; the sessions; the [`Surface`] (the
//! core, the read path, the mountpoint, the kernel's caches); the [`Lifecycle`] (start,
//! shutdown, the change signal); the pacing of the tier (`pacing.rs`); the mode's state, whose
//! own types hold what only that mode does (`share::Shared`: a job's join, leave and restart,
//! the cohort's draws; `queue::QueueFeed`: the rounds with etcd; `aggregate::Aggregate`: the
//! exchange's spec and inbox), each handed the daemon's parts it needs; and the staging loop
//! (`staging::StagingLoop`), a task of its own, started with the drain and monitor loops by
//! [`Daemon::start_tasks`].
//!
//! Layout: `store`, `session`, `schedule`, `mode`, `surface`, `lifecycle`, `pacing`, `kernel`,
//! `source` (tier and catalog), `share` (jobs, their cohort, their restarts), `setup` (checks,
//! lock, policy, resume, first staging), `staging` (the staging loop, eviction), `switch`
//! (`pass_end`, `advance`, the switch and kernel invalidation), `status` (status, files,
//! metrics, shutdown), `queue` (with `--dds`, mini-epochs claimed from a shard queue in etcd),
//! `aggregate` (the aggregate plan and the exchange's inbox), `state` (`state.json`, the
//! generation's range), `share::state` (`share.json`, a shared mount's jobs' places).
//!
//! # Lock order
//!
//! Every lock the daemon takes, outermost first. A lock may only be taken while holding locks
//! earlier in this list (or none), never while holding a later one. Every item but 1, 16, 18,
//! 23 to 26, 28 and 32 is a `metfs_fs::lock_order::OrderedMutex` or `OrderedRwLock` at its
//! `Level`: a debug build (every test) panics at the first lock taken out of this order, naming
//! both. Those left out are the two tokio mutexes held across awaits (1, 25), locks of crates
//! below `metfs-fs` (23, 24, 26: `metfs-dds`, the stager, the pacer) or generic over their
//! keys (16, 18: the `cache` module), the condition variable's mutex (28, which a `Condvar`
//! needs bare) and the log writer (32, `tracing`'s).
//!
//! 1. `QueueFeed::worker` (tokio, `--dds`): the node's etcd worker; only the staging loop takes
//!    it (`QueueFeed::serve`), across its round trips.
//! 2. `Daemon::persisting`: the order of the position, rf-history and `share.json` writes;
//!    held across those writes (`save_session`, `leave_as`, `write_share`), each snapshot
//!    taken under it.
//! 3. `Daemon::sessions`: every session (position, policy, meter, staging, view).
//! 4. `Shared::cohort` (`--share`): the jobs' views, shares and reference counts.
//! 5. `Shared::jobs`: each job's token, last request and held-back flag.
//! 6. `Shared::last_join`: when the last job joined.
//! 7. `History::store` (on a shared mount the one `Shared::history`): the rf history in memory.
//! 8. `Aggregate::layouts` (`--aggregate`): the layouts of the last epochs.
//! 9. `Aggregate::last_wait`: the last wait for the exchange.
//! 10. `Store::book`: each slot's bytes and samples, held, draining and trimmed slots, errors.
//! 11. `Daemon::me`: the daemon's weak handle on itself.
//! 12. `FsCore::reply_gate`: shared while an entry is resolved and replied, exclusive while a
//!     view switches (or a job's view goes).
//! 13. `FsCore::root_listings`: a shared mount's root listings, by handle.
//! 14. `FsCore::views`: the current view, the jobs' views and the retained ones.
//! 15. `FsCore::handles`: the open handles and the views they pin.
//! 16. The backing-id cache's lock for one key (`metfs_fs::fs`'s `cache` module): held while
//!     that key's passthrough backing id is registered.
//! 17. `FsCore::live_backing`: the passthrough backing ids registered.
//! 18. The caches' own locks (the `cache` module's shards and its map of keys' turns): the
//!     open backing files and the backing ids.
//! 19. `FsCore::drained`: where the generations of drained views are sent.
//! 20. `QueueFeed::retry_at`: when etcd is asked again after a failure.
//! 21. `QueueFeed::pending_done`: the batches to mark DONE.
//! 22. `QueueFeed::snapshot`: the worker's state for `status`.
//! 23. The dds worker's `last_error` (`metfs_dds`): its last etcd error.
//! 24. The stager's `Progress::last_retry_error`: a staging's last retried tier error.
//! 25. `Pacer::turn` (tokio, the stager's): fetches waiting for the rate take turns; held
//!     across the wait.
//! 26. `Pacer::inner`: the staging rate's token bucket.
//! 27. `EventLog::queue`: the event log's queue to its writer.
//! 28. The event log's `written` (with the condition variable `wrote`): lines written so far.
//! 29. `EventLog::done`: the writer's end, taken at close.
//! 30. `Surface::kernel`: the kernel's caches, once mounted.
//! 31. `Surface::mountpoint`: the mountpoint.
//! 32. The log file's writer (`crate::logging`): every `tracing` line takes it, under whatever
//!     locks its caller holds.
//!
//! Where locks nest: `worker` holds `sessions`, `book` and the queue's locks (between its
//! awaits); `persisting` holds `sessions`; `sessions` holds `cohort`, `jobs`, `last_join`, the
//! rf history, the layouts, `last_wait`, `book`, the core's locks (a switch takes
//! `reply_gate`, then `views`), `pending_done`, `snapshot`, `last_retry_error`, the pacer's
//! bucket, the event log and `mountpoint`; `cohort` holds `book` (`Store::room_for` in
//! `ModeState::room`, `note_error` in `serve_cohort`); the FUSE adapter's
//! lookups and READDIRPLUS hold `reply_gate` over `root_listings` (which holds `views` in
//! `opendir`), `views` and `handles`; a backing-id key's lock holds `live_backing` and the
//! caches' own locks (an open registers its backing id); `pending_done` holds `snapshot` and
//! the worker's `last_error` (`QueueFeed::refresh`); `Pacer::turn` holds `Pacer::inner`. Every
//! other lock holds none but the log writer.
//!
//! Await. All but the two tokio mutexes (`worker`, `Pacer::turn`) are `std` locks and none is
//! held across an `.await`; those two are taken with no other lock held.
//!
//! Waiting under a lock. The event log is written by a thread of its own (`crate::events`), so
//! an `emit` under any lock never writes the disk itself: it waits at most 100 ms
//! (`WRITE_WAIT`) for its line, once, since after such a wait runs out emits do not wait until
//! the writer has caught up. What does wait under a lock: a switch under `sessions` waits for
//! the replies in flight under `reply_gate`; a switch whose successor's view was not built
//! ahead reads the slot's journal under `sessions` (`Store::view_for`); `persisting` is held
//! across the durable writes of the state file, `share.json` and the rf history (`leave`
//! waits for it; `share.json` is snapshotted under `sessions` and written after it); a
//! `tracing` line writes the log file in the caller's thread.
//!
//! Not in the list: locks inside a staging (the stager's `made_dirs`, the transform's idle
//! workers), which runs under none of these; the `changed` watch channel; and the control
//! socket's connection semaphore, taken with `try_acquire`, never waited for.

use metfs_fs::lock_order::OrderedMutex;
// What the module docs link to by name.
#[cfg(doc)]
use metfs_fs::{fs::FsCore, view::View};
#[cfg(doc)]
use metfs_plan::budget::Budget;
#[cfg(doc)]
use session::Session;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use metfs_plan::budget::BudgetError;
use metfs_plan::planner::PlanError;
use metfs_protocol::ProtocolError;
use metfs_tier::TierError;
use thiserror::Error;

use crate::config::MountConfig;

/// Errors that stop a mount.
#[derive(Debug, Error)]
pub enum DaemonError {
    /// The cache directory is missing or unusable.
    #[error("cache directory {path}: {reason}")]
    Cache { path: String, reason: String },
    /// Another daemon uses the cache directory.
    #[error("cache directory {0} is in use by another metfs daemon (pid {1})")]
    CacheBusy(String, String),
    /// The tier failed.
    #[error(transparent)]
    Tier(#[from] TierError),
    /// The catalog could not be built or saved.
    #[error(transparent)]
    Catalog(#[from] metfs_tier::catalog::CatalogError),
    /// The budget cannot hold the dataset's largest sample twice.
    #[error("budget {budget} is too small: `{path}` takes {size}, so the budget must be at least {needed} (two slots of at least that file, plus {reserve} of metadata)")]
    BudgetTooSmall {
        budget: String,
        path: String,
        size: String,
        needed: String,
        reserve: String,
    },
    /// The budget does not even cover the metadata.
    #[error(transparent)]
    Budget(#[from] BudgetError),
    /// The planner refused the settings.
    #[error("planning: {0}")]
    Plan(#[from] PlanError),
    /// The first mini-epoch could not be staged.
    #[error(transparent)]
    Stage(#[from] metfs_prefetcher::stager::StageError),
    /// The transform's command cannot be run.
    #[error(transparent)]
    Transform(#[from] metfs_prefetcher::transform::TransformError),
    /// The dataset has no samples.
    #[error("source {0} has no files to serve")]
    Empty(String),
    /// `state.json` is not a valid saved position.
    #[error("saved position {path} is corrupt: {reason}. Delete it, or mount with --reset, to start over at epoch 0 (this discards the position, not the dataset)")]
    CorruptState { path: String, reason: String },
    /// Anything else about the setup.
    #[error("{0}")]
    Setup(String),
    /// The shard queue (`--dds`) cannot be joined.
    #[error(transparent)]
    Samples(#[from] samples::SamplesError),
    #[error("dynamic sharding: {0}")]
    Dds(#[from] metfs_dds::DdsError),
}

/// Files metfs keeps in the cache directory.
#[derive(Debug, Clone)]
pub struct CachePaths {
    /// The cache directory.
    pub root: PathBuf,
    /// Slots and their journals.
    pub slots: PathBuf,
    /// Temporary files being staged.
    pub tmp: PathBuf,
    /// Saved catalog.
    pub catalog: PathBuf,
    /// Saved position.
    pub state: PathBuf,
    /// A shared mount's save file: each job's place (`share::state`).
    pub share: PathBuf,
    /// Lock file (holds the daemon's pid).
    pub lock: PathBuf,
}

impl CachePaths {
    /// Paths under `root`.
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
            slots: root.join("slots"),
            tmp: root.join("tmp"),
            catalog: root.join("catalog.bin"),
            state: root.join("state.json"),
            share: root.join("share.json"),
            lock: root.join("metfs.lock"),
        }
    }
}

pub mod aggregate;
mod deferred;
mod fingerprint;
mod kernel;
mod lifecycle;
pub mod memory;
mod mode;
mod pacing;
mod prime;
mod queue;
pub mod samples;
mod schedule;
mod session;
mod setup;
mod share;
mod source;
mod staging;
mod state;
mod status;
mod store;
mod surface;
mod switch;
mod wire;

pub use fingerprint::{Fingerprint, PlanKind, SavedFingerprint};
pub use kernel::KernelCache;
pub use lifecycle::Lifecycle;
use mode::ModeState;
pub use pacing::{AUTO_TRICKLE, PACING_MARGIN};
use session::Sessions;
pub use session::DEFAULT_SESSION;
use setup::write_saved_state;
pub use setup::{check_cache_dir, check_places};
pub use share::check_job_name;
pub use share::state::{SavedJob, SavedShare, ShareSettings, SHARE_STATE_VERSION};
pub use source::{make_catalog_file, mountable_catalog_file, open_tier, MadeCatalog};
pub use state::{next_generation, SavedState, GENERATION_LIMIT, POSITION_LIMIT};
pub use store::Store;
pub use surface::Surface;

/// A running daemon's shared core: the [`Store`], the [`Session`]s by name, and the
/// filesystem core that serves their views.
pub struct Daemon {
    /// The resolved configuration.
    pub cfg: MountConfig,
    /// Where metfs keeps its files.
    pub paths: CachePaths,
    /// The staged samples and their budget.
    store: Store,
    /// Every session, by name (today the one [`DEFAULT_SESSION`]).
    sessions: OrderedMutex<Sessions>,
    /// The mount as readers and the kernel see it: the core, the read path, the kernel.
    surface: Arc<Surface>,
    /// Start, shutdown and the change signal.
    life: Lifecycle,
    tier_url: String,
    /// A weak handle on the daemon itself, for background tasks started from `&self`.
    me: OrderedMutex<std::sync::Weak<Daemon>>,
    /// The mode's state (`mode.rs`): the queue's worker, the jobs and their cohort, or the
    /// aggregate plan; asked, never tested, by generic code.
    mode: ModeState,
    /// How the staging rate follows the sessions.
    pacing: pacing::Pacing,
    /// Held while a session's position and rf history are written: each write snapshots
    /// the session under this lock, so writes never land out of order.
    persisting: OrderedMutex<()>,
    /// The run's event log.
    pub events: crate::events::EventLog,
    /// Held by one `apply` at a time: the ranks of one node each apply the leader's decision,
    /// and two that both found the view one step short of it would otherwise both advance it.
    apply_one: tokio::sync::Mutex<()>,
}

/// The slot of `(epoch, mini-epoch)`: the stager's [`metfs_prefetcher::stager::slot_name`].
fn slot_name(target: (u64, u32)) -> String {
    metfs_prefetcher::stager::slot_name(target.0, target.1)
}

impl Daemon {
    /// The store of staged samples.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The mount as readers and the kernel see it.
    pub fn surface(&self) -> &Arc<Surface> {
        &self.surface
    }

    /// Start, shutdown and the change signal.
    pub fn life(&self) -> &Lifecycle {
        &self.life
    }

    /// Starts the daemon's background tasks: the staging loop, the eviction of views whose
    /// last handle closed (their generations arrive on `drained`, from the core) and the
    /// periodic work (pacing, tier events, metrics, idle jobs). They run until aborted or the
    /// runtime ends; a shutdown stops the staging loop.
    pub fn start_tasks(
        self: &Arc<Self>,
        drained: tokio::sync::mpsc::UnboundedReceiver<u64>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        vec![
            tokio::spawn(staging::StagingLoop::new(self.clone()).run()),
            tokio::spawn(self.clone().drain_loop(drained)),
            tokio::spawn(self.clone().monitor_loop()),
        ]
    }

    /// The session a request acts on: the job it names on a shared mount, else the default
    /// one ([`ModeState::session_for`]).
    pub(crate) fn session_for(&self, job: Option<&str>) -> Result<String, ProtocolError> {
        self.mode.session_for(job)
    }

    /// Writes session `name`'s position, and its rf history too if `history`, as they are
    /// when the write starts (see `persisting`).
    fn save_session(&self, name: &str, history: bool) {
        let _order = self.persisting.lock().unwrap_or_else(|e| e.into_inner());
        let Some((position, encoded)) = self.sessions.lock().unwrap().get(name).map(|s| {
            let encoded = s
                .history()
                .as_ref()
                .filter(|_| history)
                .map(|h| h.store.lock().unwrap().encode());
            (s.saved(), encoded)
        }) else {
            return;
        };
        if let Some((saved, file)) = position {
            if let Err(e) = write_saved_state(&file, &saved) {
                tracing::error!(error = %e, path = %file.display(), "cannot save the position");
            }
        }
        if let Some(Err(e)) = encoded.map(|h| h.and_then(|h| h.write())) {
            tracing::warn!(session = name, error = %e, "cannot record the rf history");
        }
        // A job of a shared mount: every job's place, in the one save file.
        self.write_share_locked();
    }

    /// As [`Daemon::save_session`], on a blocking thread, so that the caller (a switch, which
    /// answers `pass_end`) does not wait for the disk. A crash before the write lands resumes
    /// at the previous mini-epoch, as a crash just before the switch would.
    fn save_session_soon(&self, name: &str, history: bool) {
        let me = self.me.lock().unwrap().upgrade();
        match (me, tokio::runtime::Handle::try_current()) {
            (Some(me), Ok(rt)) => {
                let name = name.to_string();
                rt.spawn_blocking(move || me.save_session(&name, history));
            }
            _ => self.save_session(name, history),
        }
    }
}

/// The mini-epoch after `cur` in a run with `nm` mini-epochs per epoch.
pub fn successor(cur: (u64, u32), nm: u32) -> (u64, u32) {
    if cur.1 + 1 < nm {
        (cur.0, cur.1 + 1)
    } else {
        (cur.0 + 1, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn successor_wraps_epochs() {
        assert_eq!(successor((0, 0), 3), (0, 1));
        assert_eq!(successor((0, 2), 3), (1, 0));
        assert_eq!(successor((5, 0), 1), (6, 0));
    }

    fn state_json(generation: &str, epoch: &str, mini_epoch: u32) -> Vec<u8> {
        format!(
            r#"{{"fingerprint":"f","epoch":{epoch},"mini_epoch":{mini_epoch},"generation":{generation},"sequence":3,"run":1,"job":"j"}}"#
        )
        .into_bytes()
    }

    fn reason(r: Result<SavedState, DaemonError>) -> String {
        match r {
            Err(DaemonError::CorruptState { reason, .. }) => reason,
            other => panic!("expected a corrupt state, got {other:?}"),
        }
    }

    #[test]
    fn saved_state_fields_are_checked() {
        let ok = SavedState::from_json(&state_json("7", "2", 1)).unwrap();
        assert_eq!((ok.generation, ok.epoch, ok.mini_epoch), (7, 2, 1));
        assert!(ok.check_plan(2).is_ok());
        let e = ok.check_plan(1).unwrap_err().to_string();
        assert!(e.contains("mini_epoch 1") && e.contains("--reset"), "{e}");
        let last = (GENERATION_LIMIT - 1).to_string();
        assert!(SavedState::from_json(&state_json(&last, "0", 0)).is_ok());
        for g in [
            "0".to_string(),
            GENERATION_LIMIT.to_string(),
            u64::MAX.to_string(),
        ] {
            let r = reason(SavedState::from_json(&state_json(&g, "0", 0)));
            assert!(r.contains("generation") && r.contains(&g), "{r}");
        }
        let r = reason(SavedState::from_json(&state_json(
            "1",
            &u64::MAX.to_string(),
            0,
        )));
        assert!(r.contains("epoch"), "{r}");
        assert!(reason(SavedState::from_json(b"\x00garbage")).contains("not a saved position"));
        let full = state_json("7", "2", 1);
        let r = reason(SavedState::from_json(&full[..full.len() / 2]));
        assert!(r.contains("truncated"), "{r}");
        assert!(reason(SavedState::from_json(b"")).contains("truncated"));
        // A negative or fractional number is a type error, not a wrap.
        assert!(SavedState::from_json(&state_json("-1", "0", 0)).is_err());
        assert!(SavedState::from_json(&state_json("1.5", "0", 0)).is_err());
    }

    #[test]
    fn generation_wraps_inside_the_inode_range() {
        assert_eq!(next_generation(1), 2);
        assert_eq!(next_generation(GENERATION_LIMIT - 2), GENERATION_LIMIT - 1);
        assert_eq!(next_generation(GENERATION_LIMIT - 1), 1);
    }
}
