//! The daemon: position in the run, slots, policy, and the view switch.
//!
//! State machine. The daemon is at (epoch, mini-epoch) with `passes` completed over it. The
//! *successor* is the next mini-epoch of the same epoch, or mini-epoch 0 of the next epoch. A
//! background task stages the successor into its slot as soon as the budget allows; a
//! `pass_end` asks the policy, and when the policy wants to advance and the successor is fully
//! staged, the view switches. If it is not staged yet the answer is `wait`: the job repeats the
//! current mini-epoch (a "bonus" pass, no stall) unless it asked to block.
//!
//! Budget. The cache holds at most two slots plus metadata: the current slot and either the
//! successor (staging or staged) or a *draining* slot (the previous view, still held by open
//! handles, or still being deleted). Staging of the successor starts only once no slot is
//! draining, and a slot leaves `draining` only after its files are deleted, so the third slot
//! never exists, not even for an instant. Each slot holds at most `slot_bytes = (budget - reserve) / 2` bytes of file
//! footprint (sizes rounded up to the block size); `reserve` covers the catalog, journals,
//! state, log and slot directories. See [`Budget`].
//!
//! Switch. Under the state lock: build the new [`View`], swap it into the [`FsCore`], bump the
//! generation, persist the position. Then, before answering the caller, invalidate the kernel's
//! cached entries under the root, so that when `pass_end` returns `advance` every new lookup
//! already resolves in the new view. The old view is retired and its slot evicted when its last
//! handle closes.
//!
//! Resume. The position is saved in `state.json` with a fingerprint of everything the plan
//! depends on; a later mount with the same fingerprint resumes at the same position and reuses
//! every slot the journal shows as staged.
//!
//! Layout: `setup` (checks, lock, tier, catalog, policy, resume, first staging), `staging` (the
//! staging loop, eviction, pacing), `switch` (`pass_end`, `advance`, the switch and kernel
//! invalidation), `status` (status, files, metrics, shutdown), `budget`, `state` (`state.json`).
//! Every submodule adds methods to the one [`Daemon`] defined here, over the one [`State`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use feedback::config::PolicyKind;
use feedback::history::{HistoryStore, MiniEpochRecord, RunId};
use feedback::policy::{PassState, RfPolicy, Verdict};
use feedback::protocol::{ErrorCode, Metrics, ProtocolError};
use prefetcher::catalog::Catalog;
use prefetcher::hdf5::Containers;
use prefetcher::pacer::{JustInTime, Pacer};
use prefetcher::planner::{self, EpochPlan, PlanConfig, PlanError, SampleSet, Strategy};
use prefetcher::size::format_bytes;
use prefetcher::stager::{journal_failures, Progress, SlotSpec, StageReport, Stager};
use prefetcher::tier::{CapacityTier, PosixTier, TierError};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use thiserror::Error;
use tokio::sync::watch;

use crate::config::{ActiveReadPath, MountConfig, PrefetchRate, ReadPath};
use crate::fs::{FsCore, FsSettings};
use crate::view::View;

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
    Catalog(#[from] prefetcher::catalog::CatalogError),
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
    #[error("budget {budget} is too small: metadata alone needs {reserve}")]
    BudgetBelowReserve { budget: String, reserve: String },
    /// The planner refused the settings.
    #[error("planning: {0}")]
    Plan(#[from] PlanError),
    /// The first mini-epoch could not be staged.
    #[error(transparent)]
    Stage(#[from] prefetcher::stager::StageError),
    /// The dataset has no samples.
    #[error("source {0} has no files to serve")]
    Empty(String),
    /// `state.json` is not a valid saved position.
    #[error("saved position {path} is corrupt: {reason}. Delete it, or mount with --reset, to start over at epoch 0 (this discards the position, not the dataset)")]
    CorruptState { path: String, reason: String },
    /// Anything else about the setup.
    #[error("{0}")]
    Setup(String),
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
            lock: root.join("metfs.lock"),
        }
    }
}

mod budget;
mod setup;
mod staging;
mod state;
mod status;
mod switch;

pub use budget::*;
pub use setup::*;
use staging::*;
pub use state::*;

#[derive(Debug)]
enum Next {
    Idle,
    Staging {
        target: (u64, u32),
        slot: String,
        progress: Arc<Progress>,
        started: Instant,
    },
    Ready {
        target: (u64, u32),
        slot: String,
        report: StageReport,
    },
    Failed {
        target: (u64, u32),
        error: String,
        at: Instant,
        /// Failures in a row of this target.
        failures: u32,
        /// How long after `at` it is staged again.
        pause: Duration,
    },
}

struct State {
    epoch: u64,
    mini_epoch: u32,
    passes: u32,
    generation: u64,
    sequence: u64,
    advance_wanted: bool,
    bonus_passes: u64,
    next: Next,
    plans: BTreeMap<u64, Arc<EpochPlan>>,
    policy: Box<dyn RfPolicy>,
    draining: BTreeMap<u64, String>,
    /// Generations of `draining` whose slot is being deleted now.
    evicting: std::collections::BTreeSet<u64>,
    last_error: Option<String>,
    failed_samples: Vec<String>,
    slot_footprints: BTreeMap<String, u64>,
    shutting_down: bool,
    record: MiniEpochRecord,
    history: Option<History>,
    job: String,
    meter: Meter,
}

/// Measurements of the run (issue: bandwidth-conscious MET).
#[derive(Debug)]
struct Meter {
    /// When the pass now running began (the previous pass end, or the mount).
    pass_started: Instant,
    /// Durations of the last passes, seconds.
    pass_secs: std::collections::VecDeque<f64>,
    /// Bytes fetched and seconds spent by completed stagings.
    staged_bytes: u64,
    staged_secs: f64,
    /// Throughput of the last completed staging.
    last_b2: Option<f64>,
    /// Time callers spent blocked waiting for staging.
    blocked_secs: f64,
    /// The stall-free rf last warned about.
    warned_rf: Option<u32>,
}

impl Meter {
    fn new() -> Self {
        Self {
            pass_started: Instant::now(),
            pass_secs: Default::default(),
            staged_bytes: 0,
            staged_secs: 0.0,
            last_b2: None,
            blocked_secs: 0.0,
            warned_rf: None,
        }
    }
    fn mean_pass(&self) -> Option<f64> {
        (!self.pass_secs.is_empty())
            .then(|| self.pass_secs.iter().sum::<f64>() / self.pass_secs.len() as f64)
    }
    fn b2(&self) -> Option<f64> {
        (self.staged_secs > 0.0).then(|| self.staged_bytes as f64 / self.staged_secs)
    }
}

/// A running daemon's shared core.
pub struct Daemon {
    /// The resolved configuration.
    pub cfg: MountConfig,
    /// Where metfs keeps its files.
    pub paths: CachePaths,
    catalog: Arc<Catalog>,
    footprints: Vec<u64>,
    plan_cfg: PlanConfig,
    nm: u32,
    budget: Budget,
    stager: Stager,
    fs: Arc<FsCore>,
    /// The read path chosen at mount (`auto` resolved).
    read_path: ReadPath,
    /// The read path in use: `read_path` until the kernel refuses it, then `pread`.
    active_read_path: Arc<ActiveReadPath>,
    state: Mutex<State>,
    changed: watch::Sender<u64>,
    notifier: Mutex<Option<crate::fuse::KernelNotifier>>,
    fingerprint: String,
    mountpoint: Mutex<PathBuf>,
    tier_url: String,
    started: Instant,
    containers: Option<Arc<Containers>>,
    /// A weak handle on the daemon itself, for background tasks started from `&self`.
    me: Mutex<std::sync::Weak<Daemon>>,
    /// The run's event log.
    pub events: crate::events::EventLog,
    /// Fired when the daemon should unmount and exit.
    pub shutdown: tokio::sync::Notify,
}

fn slot_name(target: (u64, u32)) -> String {
    format!("e{:06}-m{:05}", target.0, target.1)
}

fn fnv(hash: &mut u64, bytes: &[u8]) {
    for b in bytes {
        *hash ^= *b as u64;
        *hash = hash.wrapping_mul(0x100000001b3);
    }
}

/// The rf history of this mount: the store, the dataset key, and the run being recorded.
struct History {
    store: HistoryStore,
    dataset: String,
    run: RunId,
}

impl Daemon {
    /// The filesystem core, for the FUSE adapter.
    pub fn fs(&self) -> Arc<FsCore> {
        self.fs.clone()
    }

    /// The read path in use, shared with the FUSE adapter (which falls back to `pread` if the
    /// kernel does not support the chosen path).
    pub fn active_read_path(&self) -> Arc<ActiveReadPath> {
        self.active_read_path.clone()
    }

    /// The read path chosen at mount.
    pub fn read_path(&self) -> ReadPath {
        self.read_path
    }

    /// The read path in use now.
    fn read_path_now(&self) -> ReadPath {
        self.active_read_path.get()
    }

    /// Records the mountpoint and the kernel notifier once mounted.
    pub fn mounted(&self, mountpoint: &Path, notifier: crate::fuse::KernelNotifier) {
        *self.mountpoint.lock().unwrap() = mountpoint.to_path_buf();
        *self.notifier.lock().unwrap() = Some(notifier);
    }

    /// The mountpoint.
    pub fn mountpoint(&self) -> PathBuf {
        self.mountpoint.lock().unwrap().clone()
    }

    fn plan_of(&self, s: &mut State, epoch: u64) -> Arc<EpochPlan> {
        if let Some(p) = s.plans.get(&epoch) {
            return p.clone();
        }
        let set = SampleSet {
            sizes: &self.footprints,
            labels: self.catalog.labels(),
            clusters: self.catalog.clusters(),
        };
        // The plan was validated for this catalog and config at startup; the planner is a pure
        // function, so a later epoch cannot fail where epoch 0 succeeded.
        let p = Arc::new(
            planner::plan_epoch(&set, &self.plan_cfg, epoch)
                .expect("the planner accepted these inputs at startup"),
        );
        s.plans.insert(epoch, p.clone());
        while s.plans.len() > 3 {
            let first = *s.plans.keys().next().unwrap();
            s.plans.remove(&first);
        }
        p
    }

    fn save_state(&self) {
        let s = self.state.lock().unwrap();
        let saved = SavedState {
            fingerprint: self.fingerprint.clone(),
            epoch: s.epoch,
            mini_epoch: s.mini_epoch,
            generation: s.generation,
            sequence: s.sequence,
            run: s.history.as_ref().map(|h| h.run),
            job: Some(s.job.clone()),
        };
        drop(s);
        if let Err(e) = write_saved_state(&self.paths.state, &saved) {
            tracing::error!(error = %e, path = %self.paths.state.display(), "cannot save the position");
        }
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
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
    use prefetcher::catalog::CatalogEntry;

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

    proptest::proptest! {
        /// Any budget, catalog sizes and metadata sizes up to u64::MAX: the split never panics,
        /// and when it succeeds two slots and the reserve fit in the budget.
        #[test]
        fn prop_budget_never_overflows(
            budget in proptest::prelude::any::<u64>(),
            sizes in proptest::collection::vec(proptest::prelude::any::<u64>(), 1..6),
            catalog_bytes in proptest::prelude::any::<u64>(),
            extra in proptest::prop_oneof![proptest::strategy::Just(0u64), proptest::prelude::any::<u64>()],
        ) {
            let cat = Catalog::from_entries(
                "s",
                sizes.iter().enumerate().map(|(i, &s)| CatalogEntry::new(format!("d/f{i}"), s)),
            )
            .unwrap();
            let _ = cat.total_bytes();
            if let Ok(b) = Budget::with_extra(budget, &cat, catalog_bytes, extra) {
                let used = u128::from(b.slot_bytes) * 2 + u128::from(b.reserve);
                proptest::prop_assert!(used <= u128::from(budget));
            }
            for &s in &sizes {
                proptest::prop_assert!(round_up(s) >= s);
            }
        }
    }

    #[test]
    fn budget_reserve_and_slots() {
        let cat = Catalog::from_entries(
            "s",
            (0..100).map(|i| CatalogEntry::new(format!("d{}/f{i}", i % 4), 1000)),
        )
        .unwrap();
        let b = Budget::new(64 << 20, &cat, 5000).unwrap();
        assert!(b.reserve > LOG_RESERVE);
        assert_eq!(b.slot_bytes, (b.budget - b.reserve) / 2);
        assert!(Budget::new(1 << 20, &cat, 5000).is_err());
        assert_eq!(round_up(0), 0);
        assert_eq!(round_up(1), 4096);
        assert_eq!(round_up(4096), 4096);
    }
}
