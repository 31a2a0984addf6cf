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

/// How the budget splits into slots and metadata.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Budget {
    /// The whole budget.
    pub budget: u64,
    /// Bytes set aside for metadata (catalog, journals, state, log, directories).
    pub reserve: u64,
    /// Most footprint bytes one slot may hold.
    pub slot_bytes: u64,
    /// Accounting granularity: file sizes are rounded up to this.
    pub block: u64,
}

/// Bytes the log and the run's event log may take: the log rotates at 256 KiB (two files),
/// the event log at 512 KiB (two files).
pub const LOG_RESERVE: u64 = 3 << 19;
/// Staging rate of `prefetch_rate = auto` before the first pass has been timed.
pub const AUTO_TRICKLE: u64 = 256 << 10;
/// Share of the current mini-epoch's expected duration that just-in-time pacing keeps as slack:
/// staging aims to finish when 95% of it has passed, and so runs at 1/0.95 = 1.05x the average
/// rate the mini-epoch needs. With rf >= 4 that is at least a fifth of a pass to absorb a slow
/// pass before it turns into a `wait`, and staging that falls behind anyway runs at the cap.
pub const PACING_MARGIN: f64 = 0.05;
const BLOCK: u64 = 4096;

impl Budget {
    /// Splits `budget` for `catalog` whose saved form takes `catalog_bytes`.
    pub fn new(budget: u64, catalog: &Catalog, catalog_bytes: u64) -> Result<Self, DaemonError> {
        Self::with_extra(budget, catalog, catalog_bytes, 0)
    }

    /// As [`Budget::new`], with `extra` more bytes of reserve (e.g. HDF5 file overhead).
    pub fn with_extra(
        budget: u64,
        catalog: &Catalog,
        catalog_bytes: u64,
        extra: u64,
    ) -> Result<Self, DaemonError> {
        // Journals: every sample at most once per slot, as `ID` (<= 11 bytes a line) or
        // `failed ID` (<= 18), plus `complete`; two slots.
        let journals = 2 * (18 * catalog.len() as u64 + BLOCK);
        // Directories: a block each for two slots' directories (+ the slot roots), and for
        // slots/, tmp/ and run/. A directory with many entries grows past one block: ext4 keeps
        // 8 bytes + the name (4-aligned) per entry and never shrinks a directory, so each slot
        // is counted with every sample's entry, and tmp/ (which may once have held a whole
        // slot's files, named `SLOT-ID`, <= 26 bytes) likewise.
        let entries: u64 = (0..catalog.len() as u32)
            .map(|id| (8 + catalog.dir_and_name(id).1.len() as u64).next_multiple_of(4))
            .sum();
        let tmp_entries = 36 * catalog.len() as u64;
        let dirs = 2 * (catalog.dir_count() as u64 + 1) * BLOCK
            + 3 * BLOCK
            + 2 * round_up(entries)
            + round_up(tmp_entries);
        // state.json and its temporary, the lock file, and a metrics file (and its temporary)
        // kept in the cache.
        let state = 8 * BLOCK;
        // Saturating: an absurd catalog or extra makes the reserve exceed any budget, an error
        // below, rather than a wrapped sum.
        let reserve = [journals, dirs, state, LOG_RESERVE, extra]
            .into_iter()
            .fold(round_up(catalog_bytes), u64::saturating_add);
        if budget <= reserve {
            return Err(DaemonError::BudgetBelowReserve {
                budget: format_bytes(budget),
                reserve: format_bytes(reserve),
            });
        }
        Ok(Self {
            budget,
            reserve,
            slot_bytes: (budget - reserve) / 2,
            block: BLOCK,
        })
    }
}

/// A file's footprint in the cache: its size rounded up to the block size.
pub fn round_up(size: u64) -> u64 {
    // Saturating: a size within a block of 2^64 is too large for any budget anyway, and the
    // planner rejects footprints whose sum overflows.
    size.div_ceil(BLOCK).saturating_mul(BLOCK)
}

/// Generations are below this: inode numbers carry the generation in their high 32 bits
/// (`generation << 32 | node`). After `GENERATION_LIMIT - 1` the generation wraps to 1 (see
/// [`next_generation`]).
pub const GENERATION_LIMIT: u64 = 1 << 32;
/// Epochs and sequence numbers in `state.json` are below this: a run of 2^48 mini-epochs is not
/// one metfs will see, and the bound leaves every `+ 1` of a long run room to grow.
pub const POSITION_LIMIT: u64 = 1 << 48;

/// The generation after `g`: one more, or 1 after the last one that fits an inode number. A
/// wrapped generation cannot meet a view still held from before the wrap (that would take
/// four billion switches while one handle stays open), and clients only compare generations
/// for inequality.
pub fn next_generation(g: u64) -> u64 {
    if g + 1 >= GENERATION_LIMIT {
        1
    } else {
        g + 1
    }
}

/// The position saved in `CACHE/state.json`.
///
/// The file is metfs's own, but it is read back as untrusted input: [`SavedState::from_json`]
/// checks every field, and a file that fails is refused with an error naming it, the field,
/// and how to start over (delete it, or mount with `--reset`); it is never silently replaced,
/// since that would restart a long run at epoch 0.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SavedState {
    /// Everything the plan depends on; a different fingerprint starts over (not an error).
    pub fingerprint: String,
    /// Current epoch.
    pub epoch: u64,
    /// Current mini-epoch within the epoch.
    pub mini_epoch: u32,
    /// Generation of the current view (1 ..= `GENERATION_LIMIT - 1`).
    pub generation: u64,
    /// Mini-epochs served so far in the run.
    pub sequence: u64,
    /// The rf history's run.
    #[serde(default)]
    pub run: Option<RunId>,
    /// The job key of the rf history.
    #[serde(default)]
    pub job: Option<String>,
}

impl SavedState {
    /// Parses and checks a saved position (every field but the mini-epoch, which
    /// [`SavedState::check_plan`] checks against the plan). The error names the bad field.
    pub fn from_json(bytes: &[u8]) -> Result<Self, DaemonError> {
        let bad = |reason: String| DaemonError::CorruptState {
            path: "state.json".into(),
            reason,
        };
        let s: SavedState = serde_json::from_slice(bytes).map_err(|e| {
            bad(if e.is_eof() {
                format!("truncated ({e})")
            } else {
                format!("not a saved position ({e})")
            })
        })?;
        if s.generation == 0 || s.generation >= GENERATION_LIMIT {
            return Err(bad(format!(
                "generation {} is out of range (1 to {})",
                s.generation,
                GENERATION_LIMIT - 1
            )));
        }
        if s.epoch >= POSITION_LIMIT {
            return Err(bad(format!(
                "epoch {} is out of range (below {POSITION_LIMIT})",
                s.epoch
            )));
        }
        if s.sequence >= POSITION_LIMIT {
            return Err(bad(format!(
                "sequence {} is out of range (below {POSITION_LIMIT})",
                s.sequence
            )));
        }
        if s.fingerprint.is_empty() {
            return Err(bad("fingerprint is empty".into()));
        }
        Ok(s)
    }

    /// Checks the mini-epoch against a plan of `nm` mini-epochs per epoch (same fingerprint).
    pub fn check_plan(&self, nm: u32) -> Result<(), DaemonError> {
        if self.mini_epoch >= nm {
            return Err(DaemonError::CorruptState {
                path: "state.json".into(),
                reason: format!(
                    "mini_epoch {} is out of range: the plan has {nm} mini-epochs per epoch",
                    self.mini_epoch
                ),
            });
        }
        Ok(())
    }
}

/// Reads `path` (`state.json`): `None` when there is none or `reset` is asked for.
fn load_state(path: &Path, reset: bool) -> Result<Option<SavedState>, DaemonError> {
    let named = |e: DaemonError| match e {
        DaemonError::CorruptState { reason, .. } => DaemonError::CorruptState {
            path: path.display().to_string(),
            reason,
        },
        e => e,
    };
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if reset => {
            tracing::warn!(path = %path.display(), error = %e, "--reset: ignoring an unreadable saved position");
            return Ok(None);
        }
        Err(e) => {
            return Err(DaemonError::CorruptState {
                path: path.display().to_string(),
                reason: format!("cannot be read ({e})"),
            })
        }
    };
    if reset {
        let what = match SavedState::from_json(&bytes) {
            Ok(s) => format!("epoch {} mini-epoch {}", s.epoch, s.mini_epoch),
            Err(e) => e.to_string(),
        };
        tracing::warn!(path = %path.display(), discarded = %what, "--reset: the saved position is discarded; starting at epoch 0");
        return Ok(None);
    }
    SavedState::from_json(&bytes).map(Some).map_err(named)
}

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

fn open_history(
    cfg: &MountConfig,
    dataset: &str,
    job: &str,
    previous: Option<RunId>,
) -> (Option<History>, Option<Vec<u32>>) {
    if let Some(dir) = cfg.history.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    match HistoryStore::open(&cfg.history) {
        Ok((mut store, warnings)) => {
            for w in warnings {
                tracing::warn!("{w}");
            }
            let schedule = store.schedule_excluding(dataset, job, previous);
            let (run, resumed) = store.resume_or_start(dataset, job, previous);
            tracing::info!(history = %cfg.history.display(), run = %run, resumed, job, "recording rf history");
            (
                Some(History {
                    store,
                    dataset: dataset.to_string(),
                    run,
                }),
                schedule,
            )
        }
        Err(e) => {
            tracing::warn!(error = %e, "rf history unavailable; this run is not recorded");
            (None, None)
        }
    }
}

fn build_policy(
    cfg: &MountConfig,
    schedule: Option<Vec<u32>>,
) -> Result<Box<dyn RfPolicy>, DaemonError> {
    if cfg.policy.kind == PolicyKind::Learned {
        tracing::info!(
            mini_epochs = schedule.as_ref().map_or(0, Vec::len),
            "learned rf schedule"
        );
    }
    feedback::config::build_policy(&cfg.policy, schedule)
        .map_err(|e| DaemonError::Setup(format!("rf policy: {e}")))
}

fn lock_cache(paths: &CachePaths) -> Result<std::fs::File, DaemonError> {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&paths.lock)
        .map_err(|e| DaemonError::Cache {
            path: paths.root.display().to_string(),
            reason: e.to_string(),
        })?;
    // SAFETY: flock on an fd we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let mut pid = String::new();
        let _ = f.read_to_string(&mut pid);
        return Err(DaemonError::CacheBusy(
            paths.root.display().to_string(),
            pid.trim().to_string(),
        ));
    }
    let _ = f.set_len(0);
    let _ = f.seek(std::io::SeekFrom::Start(0));
    let _ = write!(f, "{}", std::process::id());
    Ok(f)
}

/// Writes `state.json` atomically (temporary file, fsync, rename).
fn write_saved_state(path: &Path, saved: &SavedState) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(saved).unwrap())
        .and_then(|_| std::fs::File::open(&tmp)?.sync_all())
        .and_then(|_| std::fs::rename(&tmp, path))
}

/// Makes the cache directory private (0700): staged copies of protected source files live in
/// it. A wider one is tightened with a warning; a shared one (sticky, like `/tmp` or
/// `/dev/shm`) or one of another user is refused, since tightening it would lock others out.
fn make_private(root: &Path) -> Result<(), DaemonError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let bad = |reason: String| DaemonError::Cache {
        path: root.display().to_string(),
        reason,
    };
    let md = std::fs::metadata(root).map_err(|e| bad(e.to_string()))?;
    let mode = md.mode() & 0o7777;
    if mode & 0o077 == 0 {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if mode & 0o1000 != 0 || md.uid() != me {
        return Err(bad(format!(
            "a shared directory (mode {mode:o}, owner uid {}) cannot hold the cache, which must \
             be private; name a directory of your own inside it",
            md.uid()
        )));
    }
    tracing::warn!(path = %root.display(), mode = format!("{mode:o}"), "the cache directory was accessible to other users; making it private (0700)");
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| bad(format!("cannot make it private (0700): {e}")))
}

/// Checks that the cache directory exists and is a directory.
pub fn check_cache_dir(cache: &Path) -> Result<(), DaemonError> {
    let bad = |reason: String| DaemonError::Cache {
        path: cache.display().to_string(),
        reason,
    };
    match std::fs::metadata(cache) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(bad(
            "is not a directory (give a directory on node-local storage)".into(),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(bad(
            "does not exist (create it on node-local storage first)".into(),
        )),
        Err(e) => Err(bad(e.to_string())),
    }
}

/// `p` with symlinks resolved; for a path that cannot be resolved itself (a dead mount), its
/// resolved parent joined with its name.
fn resolved(p: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(p).ok().or_else(|| {
        let parent = std::fs::canonicalize(p.parent()?).ok()?;
        Some(parent.join(p.file_name()?))
    })
}

/// Refuses a layout where the source, the cache and the mountpoint overlap (after resolving
/// symlinks): a cache inside the source would be catalogued as samples by a later listing (and
/// serve metfs's own lock file); a source inside the cache would be deleted by its cleanup; a
/// mountpoint inside either hides or loops back into what the daemon reads. Each error names
/// both paths.
pub fn check_places(cfg: &MountConfig, mountpoint: &Path) -> Result<(), DaemonError> {
    check_cache_dir(&cfg.cache)?;
    let mut places: Vec<(&str, &Path, PathBuf)> = Vec::new();
    if !cfg.source.contains("://") {
        if let Some(p) = resolved(Path::new(&cfg.source)) {
            places.push(("source", Path::new(&cfg.source), p));
        }
    }
    if let Some(p) = resolved(&cfg.cache) {
        places.push(("cache directory", &cfg.cache, p));
    }
    if let Some(p) = resolved(mountpoint) {
        places.push(("mountpoint", mountpoint, p));
    }
    for (i, (a, a_path, a_res)) in places.iter().enumerate() {
        for (b, b_path, b_res) in &places[i + 1..] {
            let (inner, inner_path, inner_res, outer, outer_path, outer_res) =
                if a_res.starts_with(b_res) {
                    (a, a_path, a_res, b, b_path, b_res)
                } else if b_res.starts_with(a_res) {
                    (b, b_path, b_res, a, a_path, a_res)
                } else {
                    continue;
                };
            let at = |given: &Path, res: &Path| {
                if given == res {
                    given.display().to_string()
                } else {
                    format!("{} (resolved: {})", given.display(), res.display())
                }
            };
            let how = if inner_res == outer_res {
                "is the same directory as"
            } else {
                "is inside"
            };
            return Err(DaemonError::Setup(format!(
                "the {inner} {} {how} the {outer} {}; give them separate directories",
                at(inner_path, inner_res),
                at(outer_path, outer_res),
            )));
        }
    }
    Ok(())
}

/// Opens the capacity tier named by a source URL.
pub fn open_tier(
    source: &str,
    s3: &prefetcher::s3::S3Config,
    timeout_secs: u64,
) -> Result<Arc<dyn CapacityTier>, DaemonError> {
    if source.starts_with("s3://") {
        return Ok(Arc::new(prefetcher::s3::S3Tier::new(source, s3.clone())?));
    }
    if source.contains("://") {
        return Err(DaemonError::Setup(format!(
            "source {source}: unknown scheme; use a directory or s3://bucket/prefix"
        )));
    }
    Ok(Arc::new(
        PosixTier::new(Path::new(source))?.with_timeout(timeout_secs),
    ))
}

fn needs_labels(s: Strategy) -> bool {
    s == Strategy::Stratified
}

/// Builds (or reuses) the catalog of `tier`, saved at `path`.
pub async fn load_catalog(
    tier: &dyn CapacityTier,
    path: &Path,
    cfg: &MountConfig,
) -> Result<(Catalog, bool, Option<Arc<Containers>>), DaemonError> {
    if cfg.hdf5_container {
        if cfg.source.contains("://") {
            return Err(DaemonError::Setup(format!(
                "source {}: HDF5 container mode needs a POSIX source (rows are read as hyperslabs)",
                cfg.source
            )));
        }
        let listing = tier.list().await?;
        let files: Vec<String> = listing
            .entries
            .iter()
            .map(|e| e.path.clone())
            .filter(|p| {
                let l = p.to_ascii_lowercase();
                [".h5", ".hdf5", ".hdf", ".he5"]
                    .iter()
                    .any(|x| l.ends_with(x))
            })
            .collect();
        if files.is_empty() {
            return Err(DaemonError::Setup(format!(
                "source {}: no HDF5 files (.h5, .hdf5, .hdf, .he5) for container mode",
                cfg.source
            )));
        }
        let root = PathBuf::from(&cfg.source);
        let datasets = cfg.hdf5_datasets.clone();
        let label = cfg.label_dataset.clone();
        let c = tokio::task::spawn_blocking(move || {
            prefetcher::hdf5::open_containers(&root, &files, datasets.as_deref(), label.as_deref())
        })
        .await
        .expect("HDF5 inspection panicked")
        .map_err(|e| DaemonError::Setup(e.to_string()))?;
        let cat = c
            .catalog(tier.url())
            .map_err(|e| DaemonError::Setup(e.to_string()))?;
        tracing::info!(
            containers = c.files().len(),
            rows = c.samples(),
            "HDF5 container mode"
        );
        return Ok((cat, false, Some(Arc::new(c))));
    }
    let (mut cat, reused) = load_plain_catalog(tier, path, cfg).await?;
    if let Some(name) = &cfg.label_hdf5 {
        if !reused || cat.labels().is_none() {
            let root = PathBuf::from(&cfg.source);
            let paths: Vec<String> = (0..cat.len() as u32).map(|i| cat.path(i)).collect();
            let name = name.clone();
            let labels = tokio::task::spawn_blocking(move || {
                prefetcher::hdf5::read_scalar_labels(&root, paths.into_iter(), &name)
            })
            .await
            .expect("HDF5 label reading panicked")
            .map_err(|e| DaemonError::Setup(e.to_string()))?;
            cat.set_labels(labels);
        }
    }
    Ok((cat, reused, None))
}

async fn load_plain_catalog(
    tier: &dyn CapacityTier,
    path: &Path,
    cfg: &MountConfig,
) -> Result<(Catalog, bool), DaemonError> {
    if let Some(manifest) = &cfg.manifest {
        // A manifest replaces the listing; reading it is cheap next to listing millions of
        // files on a parallel file system's metadata server.
        let t = Instant::now();
        let mut cat = prefetcher::manifest::load_catalog(manifest)
            .map_err(|e| DaemonError::Setup(e.to_string()))?;
        if cfg.label_from_dirs || (needs_labels(cfg.compose) && cat.labels().is_none()) {
            cat.label_by_first_dir();
        }
        tracing::info!(
            manifest = %manifest.display(),
            samples = cat.len(),
            bytes = %format_bytes(cat.total_bytes()),
            secs = t.elapsed().as_secs_f64(),
            "catalogue read from the manifest"
        );
        return Ok((cat, false));
    }
    if let Ok(saved) = Catalog::load(path) {
        if saved.source() == tier.url() && tier.catalog_is_current(&saved).await? {
            tracing::info!(samples = saved.len(), "reusing the saved catalog");
            return Ok((saved, true));
        }
    }
    let t = Instant::now();
    let listing = tier.list().await?;
    for (p, why) in &listing.skipped {
        tracing::warn!(path = %p, reason = %why, "not served");
    }
    let mut cat = Catalog::from_entries(tier.url(), listing.entries)?;
    cat.set_dir_stamps(listing.dir_stamps);
    if cfg.label_from_dirs || (needs_labels(cfg.compose) && cat.labels().is_none()) {
        cat.label_by_first_dir();
    }
    tracing::info!(
        samples = cat.len(),
        bytes = %format_bytes(cat.total_bytes()),
        secs = t.elapsed().as_secs_f64(),
        "catalogued the source"
    );
    Ok((cat, false))
}

impl Daemon {
    /// Prepares a mount: locks the cache, catalogues, plans, and stages the current mini-epoch.
    /// Returns the daemon and the lock file (hold it for the daemon's life).
    pub async fn prepare(
        cfg: MountConfig,
        show_progress: bool,
    ) -> Result<(Arc<Daemon>, std::fs::File), DaemonError> {
        let paths = CachePaths::new(&cfg.cache);
        check_cache_dir(&paths.root)?;
        make_private(&paths.root)?;
        let lock = lock_cache(&paths)?;
        for d in [&paths.slots, &paths.tmp] {
            // A symlink here would lead slot deletions and tmp cleanup out of the cache: it is
            // removed (never its target) and a private directory made in its place.
            if std::fs::symlink_metadata(d).is_ok_and(|m| !m.is_dir()) {
                tracing::warn!(path = %d.display(), "not a directory (a symlink?) in the cache; replacing it");
                let _ = std::fs::remove_file(d);
            }
            prefetcher::stager::create_private_dir(d).map_err(|e| DaemonError::Cache {
                path: d.display().to_string(),
                reason: e.to_string(),
            })?;
        }
        let tier = open_tier(&cfg.source, &cfg.s3, cfg.stager.timeout_secs)?;
        let (mut catalog, reused, containers) = load_catalog(&*tier, &paths.catalog, &cfg).await?;
        if catalog.is_empty() {
            return Err(DaemonError::Empty(cfg.source.clone()));
        }
        if needs_labels(cfg.compose) && catalog.labels().is_none() {
            catalog.label_by_first_dir();
        }
        let catalog_bytes = if reused {
            std::fs::metadata(&paths.catalog)
                .map(|m| m.len())
                .unwrap_or(0)
        } else {
            // The old catalog goes first: with its replacement written beside it, the two
            // would take more than the one the budget reserves.
            let _ = std::fs::remove_file(&paths.catalog);
            catalog.save(&paths.catalog)?
        };
        // A container slot holds one HDF5 file per container: rows are packed, so they are not
        // rounded to blocks, and each file carries headers and chunk indexes (1 MiB allowed).
        let extra = containers
            .as_ref()
            .map_or(0, |c| 2 * c.files().len() as u64 * (1 << 20));
        let budget = Budget::with_extra(cfg.budget, &catalog, catalog_bytes, extra)?;
        let footprints: Vec<u64> = if containers.is_some() {
            catalog.sizes().to_vec()
        } else {
            catalog.sizes().iter().map(|&s| round_up(s)).collect()
        };
        let plan_cfg = PlanConfig {
            strategy: cfg.compose,
            seed: cfg.seed,
            slot_bytes: budget.slot_bytes,
            mini_epochs: cfg.mini_epochs,
            node_rank: cfg.node_rank,
            nodes: cfg.nodes,
        };
        let set = SampleSet {
            sizes: &footprints,
            labels: catalog.labels(),
            clusters: catalog.clusters(),
        };
        let nm = match planner::mini_epoch_count(&set, &plan_cfg) {
            Ok(n) => n,
            Err(PlanError::SampleTooLarge { sample, size, .. }) => {
                return Err(DaemonError::BudgetTooSmall {
                    budget: format_bytes(cfg.budget),
                    path: catalog.path(sample),
                    size: format_bytes(size),
                    needed: format_bytes(size.saturating_mul(2).saturating_add(budget.reserve)),
                    reserve: format_bytes(budget.reserve),
                })
            }
            Err(e) => return Err(e.into()),
        };
        let fingerprint = {
            let mut h: u64 = 0xcbf29ce484222325;
            for id in 0..catalog.len() as u32 {
                let (d, n) = catalog.dir_and_name(id);
                fnv(&mut h, d.as_bytes());
                fnv(&mut h, b"/");
                fnv(&mut h, n.as_bytes());
                fnv(&mut h, &catalog.size(id).to_le_bytes());
                fnv(&mut h, catalog.version(id).as_bytes());
            }
            format!(
                "{}|{}|{}|{:?}|{}|{}|{}|{h:016x}",
                cfg.source, budget.slot_bytes, nm, cfg.compose, cfg.seed, cfg.node_rank, cfg.nodes
            )
        };
        let saved = match load_state(&paths.state, cfg.reset)? {
            Some(s) if s.fingerprint == fingerprint => {
                s.check_plan(nm).map_err(|e| match e {
                    DaemonError::CorruptState { reason, .. } => DaemonError::CorruptState {
                        path: paths.state.display().to_string(),
                        reason,
                    },
                    e => e,
                })?;
                Some(s)
            }
            Some(s) => {
                tracing::info!(
                    epoch = s.epoch,
                    mini_epoch = s.mini_epoch,
                    "the dataset or the plan settings changed since the saved position; starting at epoch 0"
                );
                None
            }
            None => None,
        };
        let pacer = Pacer::with_rate(match cfg.prefetch_rate {
            PrefetchRate::Fixed(r) => Some(r),
            // The first mini-epoch is staged at full speed (the job is waiting for it); pacing
            // starts after it (see below).
            PrefetchRate::Auto | PrefetchRate::Unlimited => None,
        });
        let catalog = Arc::new(catalog);
        let stager = Stager::new(
            tier.clone(),
            catalog.clone(),
            paths.slots.clone(),
            paths.tmp.clone(),
            cfg.stager.clone(),
            pacer,
        );
        stager.clean_tmp()?;
        let (epoch, mini_epoch, generation, sequence) = match &saved {
            Some(s) => {
                tracing::info!(
                    epoch = s.epoch,
                    mini_epoch = s.mini_epoch,
                    "resuming where the last mount stopped"
                );
                (s.epoch, s.mini_epoch, s.generation, s.sequence)
            }
            None => (0, 0, 1, 0),
        };
        let cur = (epoch, mini_epoch);
        let succ = successor(cur, nm);
        // Slots that belong to neither the current nor the successor mini-epoch are stale.
        for name in stager.present_slots() {
            if saved.is_none() || (name != slot_name(cur) && name != slot_name(succ)) {
                stager.evict(&name)?;
            }
        }
        if saved.is_none() {
            // Journals without slot directories, from a different plan.
            if let Ok(rd) = std::fs::read_dir(&paths.slots) {
                for e in rd.flatten() {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        let dataset_key = fingerprint
            .split('|')
            .enumerate()
            .filter(|(i, _)| *i != 5)
            .map(|(_, p)| p)
            .collect::<Vec<_>>()
            .join("|");
        let job = saved
            .as_ref()
            .and_then(|s| s.job.clone())
            .unwrap_or_else(|| cfg.job.clone());
        let (history, schedule) =
            open_history(&cfg, &dataset_key, &job, saved.as_ref().and_then(|s| s.run));
        let policy = build_policy(&cfg, schedule)?;
        if saved.is_none() {
            // Saved before the first mini-epoch is staged: a daemon killed while staging it
            // then finds its plan on restart and resumes the slot from its journal, instead of
            // discarding it as a slot of an unknown plan.
            let first = SavedState {
                fingerprint: fingerprint.clone(),
                epoch,
                mini_epoch,
                generation,
                sequence,
                run: history.as_ref().map(|h| h.run),
                job: Some(job.clone()),
            };
            if let Err(e) = write_saved_state(&paths.state, &first) {
                tracing::error!(error = %e, path = %paths.state.display(), "cannot save the position");
            }
        }
        let set = SampleSet {
            sizes: &footprints,
            labels: catalog.labels(),
            clusters: catalog.clusters(),
        };
        let plan = Arc::new(planner::plan_epoch(&set, &plan_cfg, epoch)?);
        let me = &plan.mini_epochs[mini_epoch as usize];
        let spec = SlotSpec {
            name: slot_name(cur),
            samples: me.samples.clone(),
        };
        tracing::info!(
            mini_epochs = nm,
            slot_bytes = %format_bytes(budget.slot_bytes),
            reserve = %format_bytes(budget.reserve),
            epoch, mini_epoch,
            files = me.samples.len(),
            bytes = %format_bytes(me.bytes),
            "staging the first mini-epoch"
        );
        let t = Instant::now();
        let progress: Arc<Progress> = Arc::default();
        let bar = show_progress.then(|| progress_bar(progress.clone()));
        let report = match &containers {
            Some(c) => stager.stage_containers(&spec, c.clone(), progress).await,
            None => stager.stage(&spec, progress).await,
        };
        if let Some((bar, task)) = bar {
            task.abort();
            bar.finish_and_clear();
        }
        let report = report?;
        if cfg.prefetch_rate == PrefetchRate::Auto {
            // Just-in-time pacing starts as a trickle: the first pass end sets the real rate.
            stager.pacer().set_rate(Some(AUTO_TRICKLE));
        }
        tracing::info!(
            fetched = report.fetched,
            resumed = report.resumed,
            failed = report.failed.len(),
            secs = t.elapsed().as_secs_f64(),
            "mini-epoch staged"
        );
        if let Some((id, why)) = report.failed.first() {
            // Samples left out are reported; a first mini-epoch with none staged at all is a
            // wrong source or manifest, not a dataset to train on.
            let (k, n) = (report.failed.len(), me.samples.len());
            let what = match &cfg.manifest {
                Some(m) => format!("manifest {}", m.display()),
                None => format!("source {}", cfg.source),
            };
            if k >= n {
                let _ = stager.evict(&spec.name);
                let hint = if cfg.manifest.is_some() {
                    "; does the manifest belong to this source?"
                } else {
                    ""
                };
                return Err(DaemonError::Setup(format!(
                    "{what}: none of the {n} samples of the first mini-epoch could be staged from {} ({k} missing or unreadable, e.g. `{}`: {why}){hint}",
                    cfg.source,
                    catalog.path(*id)
                )));
            }
            tracing::warn!(
                "{what}: {k} of the first mini-epoch's {n} samples are missing or unreadable at the source and are left out (`metfs status` lists them)"
            );
        }
        let failed: Vec<String> = report
            .failed
            .iter()
            .map(|(id, why)| format!("{}: {why}", catalog.path(*id)))
            .collect();
        let view = Arc::new(Self::view_for(
            &catalog,
            containers.as_deref(),
            &stager,
            &plan,
            cur,
            generation,
            &paths,
        ));
        let mean_sample = catalog.total_bytes() / (catalog.len() as u64).max(1);
        let read_path =
            cfg.read_path
                .resolve(budget.slot_bytes, mean_sample, crate::config::mem_total());
        if cfg.read_path == ReadPath::Auto {
            tracing::info!(
                read_path = read_path.name(),
                slot_bytes = %format_bytes(budget.slot_bytes),
                mean_sample = %format_bytes(mean_sample),
                "read path chosen: cached for samples under 1 MiB when a slot fits in half of the node's memory, else passthrough (pread without CAP_SYS_ADMIN)"
            );
        }
        let fs = Arc::new(FsCore::new(
            view,
            FsSettings {
                max_open_files: cfg.max_open_files,
                max_backing_ids: cfg.max_backing_ids,
                track_kernel_refs: read_path == ReadPath::Cached,
            },
        ));
        let mut plans = BTreeMap::new();
        plans.insert(epoch, plan.clone());
        let mut slot_footprints = BTreeMap::new();
        slot_footprints.insert(
            slot_name(cur),
            me.samples.iter().map(|&s| footprints[s as usize]).sum(),
        );
        let (changed, _) = watch::channel(0u64);
        let active_read_path = Arc::new(ActiveReadPath::new(read_path));
        let daemon = Arc::new(Daemon {
            tier_url: tier.url().to_string(),
            containers,
            me: Mutex::new(std::sync::Weak::new()),
            paths,
            catalog,
            footprints,
            plan_cfg,
            nm,
            budget,
            stager,
            fs,
            read_path,
            active_read_path,
            state: Mutex::new(State {
                epoch,
                mini_epoch,
                passes: 0,
                generation,
                sequence,
                advance_wanted: false,
                bonus_passes: 0,
                next: Next::Idle,
                plans,
                policy,
                draining: BTreeMap::new(),
                evicting: Default::default(),
                last_error: None,
                failed_samples: failed,
                slot_footprints,
                shutting_down: false,
                record: MiniEpochRecord::begin(sequence, epoch, mini_epoch),
                history,
                job,
                meter: Meter::new(),
            }),
            events: crate::events::EventLog::open(&cfg.run_dir),
            changed,
            notifier: Mutex::new(None),
            fingerprint,
            mountpoint: Mutex::new(PathBuf::new()),
            started: Instant::now(),
            shutdown: tokio::sync::Notify::new(),
            cfg,
        });
        *daemon.me.lock().unwrap() = Arc::downgrade(&daemon);
        daemon.save_state();
        daemon.events.emit(
            "start",
            json!({
                "dataset_bytes": daemon.catalog.total_bytes(),
                "dataset_files": daemon.catalog.len(),
                "mini_epochs": nm,
                "view_bytes": daemon.fs.current().bytes(),
                "rf_policy": daemon.cfg.policy.kind.to_string(),
                "budget_bytes": daemon.budget.budget,
                "node_rank": daemon.cfg.node_rank,
                "nodes": daemon.cfg.nodes,
                "epoch": epoch,
                "mini_epoch": mini_epoch,
            }),
        );
        Ok((daemon, lock))
    }

    fn view_for(
        catalog: &Catalog,
        containers: Option<&Containers>,
        stager: &Stager,
        plan: &EpochPlan,
        target: (u64, u32),
        generation: u64,
        paths: &CachePaths,
    ) -> View {
        let name = slot_name(target);
        if let Some(c) = containers {
            let dir = stager.slot_path(&name);
            // A container's bytes change with every mini-epoch: its times are those of the
            // staged copy, so `make`, `rsync` and caches see each generation's new content.
            let files: Vec<(String, u64, Option<prefetcher::catalog::Meta>)> = c
                .files()
                .iter()
                .filter_map(|f| {
                    std::fs::metadata(dir.join(&f.path)).ok().map(|m| {
                        let meta = prefetcher::catalog::Meta::from_metadata(&m);
                        (f.path.clone(), m.len(), Some(meta))
                    })
                })
                .collect();
            return View::from_files(&files, generation, target.0, target.1, &name, &dir);
        }
        let failed = journal_failures(&paths.slots, &name);
        let samples: Vec<u32> = plan.mini_epochs[target.1 as usize]
            .samples
            .iter()
            .copied()
            .filter(|s| !failed.contains(s))
            .collect();
        View::build(
            catalog,
            &samples,
            generation,
            target.0,
            target.1,
            &name,
            &stager.slot_path(&name),
        )
    }

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

    /// Stages successors forever; run as a task.
    pub async fn stager_loop(self: Arc<Self>) {
        let mut rx = self.changed.subscribe();
        // The target that failed last and how many times in a row.
        let mut retries: ((u64, u32), u32) = ((u64::MAX, 0), 0);
        fn failures_in_a_row(r: &((u64, u32), u32), target: (u64, u32)) -> u32 {
            if r.0 == target {
                r.1
            } else {
                0
            }
        }
        loop {
            let job = {
                let mut s = self.state.lock().unwrap();
                if s.shutting_down {
                    return;
                }
                let target = successor((s.epoch, s.mini_epoch), self.nm);
                let busy = match &s.next {
                    Next::Ready { target: t, .. } => *t == target,
                    Next::Staging { .. } => true,
                    Next::Failed {
                        target: t,
                        at,
                        pause,
                        ..
                    } => *t == target && at.elapsed() < *pause,
                    Next::Idle => false,
                };
                if busy || !s.draining.is_empty() {
                    None
                } else {
                    let plan = self.plan_of(&mut s, target.0);
                    let me = &plan.mini_epochs[target.1 as usize];
                    let slot = slot_name(target);
                    let progress: Arc<Progress> = Arc::default();
                    // Known before the stager starts, so the first rate is paced to it.
                    progress.bytes_total.store(me.bytes, Ordering::Relaxed);
                    s.next = Next::Staging {
                        target,
                        slot: slot.clone(),
                        progress: progress.clone(),
                        started: Instant::now(),
                    };
                    s.slot_footprints.insert(
                        slot.clone(),
                        me.samples
                            .iter()
                            .map(|&x| self.footprints[x as usize])
                            .sum(),
                    );
                    // The rate left from the previous staging (possibly the cap, if it ran
                    // late) must not carry over into this one until the next tick.
                    self.pace(&s);
                    Some((
                        target,
                        SlotSpec {
                            name: slot,
                            samples: me.samples.clone(),
                        },
                        progress,
                        me.bytes,
                    ))
                }
            };
            let Some((target, spec, progress, bytes)) = job else {
                // A failed slot is retried after its pause even if nothing else changes.
                let wake = match &self.state.lock().unwrap().next {
                    Next::Failed { at, pause, .. } => pause.saturating_sub(at.elapsed()),
                    _ => Duration::from_secs(5),
                };
                let _ =
                    tokio::time::timeout(wake.max(Duration::from_millis(50)), rx.changed()).await;
                continue;
            };
            tracing::info!(
                epoch = target.0,
                mini_epoch = target.1,
                files = spec.samples.len(),
                bytes = %format_bytes(bytes),
                "staging the next mini-epoch"
            );
            let result = match &self.containers {
                Some(c) => {
                    self.stager
                        .stage_containers(&spec, c.clone(), progress)
                        .await
                }
                None => self.stager.stage(&spec, progress).await,
            };
            {
                let mut s = self.state.lock().unwrap();
                match result {
                    Ok(report) => {
                        retries = ((u64::MAX, 0), 0);
                        tracing::info!(
                            epoch = target.0,
                            mini_epoch = target.1,
                            fetched = report.fetched,
                            resumed = report.resumed,
                            failed = report.failed.len(),
                            secs = report.elapsed.as_secs_f64(),
                            "next mini-epoch staged"
                        );
                        for (id, why) in &report.failed {
                            s.failed_samples
                                .push(format!("{}: {why}", self.catalog.path(*id)));
                            s.last_error = Some(why.clone());
                        }
                        if s.failed_samples.len() > 100 {
                            let cut = s.failed_samples.len() - 100;
                            s.failed_samples.drain(..cut);
                        }
                        s.meter.staged_bytes += report.bytes_fetched;
                        s.meter.staged_secs += report.elapsed.as_secs_f64();
                        if report.bytes_fetched > 0 && report.elapsed.as_secs_f64() > 0.0 {
                            s.meter.last_b2 =
                                Some(report.bytes_fetched as f64 / report.elapsed.as_secs_f64());
                        }
                        self.events.emit(
                            "staged",
                            json!({
                                "epoch": target.0, "mini_epoch": target.1, "bytes": bytes,
                                "bytes_fetched": report.bytes_fetched,
                                "secs": report.elapsed.as_secs_f64(),
                            }),
                        );
                        s.next = Next::Ready {
                            target,
                            slot: spec.name.clone(),
                            report,
                        };
                    }
                    Err(e) => {
                        // The slot keeps what it committed and is resumed after a pause that
                        // grows with each failure in a row (2 s, 4 s, ... at most 60 s): a full
                        // disk or a source outage passes in its own time, and retrying it
                        // flat out would only flood the log and the tier.
                        let failures = failures_in_a_row(&retries, target) + 1;
                        retries = (target, failures);
                        let pause = Duration::from_secs(2u64 << (failures - 1).min(5))
                            .min(Duration::from_secs(60));
                        let cause = if e.is_out_of_space() {
                            "the cache is out of space; free space on its file system"
                        } else {
                            "the tier or the cache failed"
                        };
                        tracing::error!(
                            error = %e,
                            epoch = target.0,
                            mini_epoch = target.1,
                            failures,
                            retry_in_secs = pause.as_secs(),
                            "staging the next mini-epoch failed: {cause}; the current view keeps serving (bonus passes) and staging resumes after the pause"
                        );
                        self.events.emit(
                            "stage_failed",
                            json!({
                                "epoch": target.0, "mini_epoch": target.1,
                                "error": e.to_string(), "out_of_space": e.is_out_of_space(),
                                "failures": failures, "retry_in_secs": pause.as_secs(),
                            }),
                        );
                        s.last_error = Some(e.to_string());
                        s.next = Next::Failed {
                            target,
                            error: e.to_string(),
                            at: Instant::now(),
                            failures,
                            pause,
                        };
                    }
                }
            }
            self.bump();
        }
    }

    /// Evicts retired views whose last handle closed; run as a task.
    pub async fn drain_loop(self: Arc<Self>, mut rx: tokio::sync::mpsc::UnboundedReceiver<u64>) {
        while let Some(gen) = rx.recv().await {
            self.evict_view(gen).await;
        }
    }

    /// Deletes a retired view's slot. The slot stays in `draining` until its files are gone, so
    /// the stager admits no byte of the next slot while they still take space: the budget
    /// holds at every instant, not only between switches. A deletion that fails is reported
    /// and retried with a growing pause; staging waits for it.
    async fn evict_view(&self, gen: u64) {
        let slot = {
            let mut s = self.state.lock().unwrap();
            let Some(slot) = s.draining.get(&gen).cloned() else {
                return;
            };
            // The drain channel and the switch may both ask; one deletion runs.
            if !s.evicting.insert(gen) {
                return;
            }
            slot
        };
        self.fs.retire(gen);
        let mut pause = Duration::from_millis(200);
        loop {
            let stager = self.stager.clone();
            let name = slot.clone();
            let error = match tokio::task::spawn_blocking(move || stager.evict(&name)).await {
                Ok(Ok(())) => break,
                Ok(Err(e)) => e.to_string(),
                Err(e) => e.to_string(),
            };
            tracing::error!(slot = %slot, error = %error, retry_in_s = pause.as_secs_f64(), "eviction failed; staging waits for it");
            {
                let mut s = self.state.lock().unwrap();
                s.last_error = Some(format!("evicting slot {slot}: {error}"));
                if s.shutting_down {
                    s.evicting.remove(&gen);
                    return;
                }
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(30));
        }
        tracing::info!(slot = %slot, "evicted");
        {
            let mut s = self.state.lock().unwrap();
            s.evicting.remove(&gen);
            s.draining.remove(&gen);
            s.slot_footprints.remove(&slot);
        }
        self.bump();
    }

    /// Switches the view to the successor if it is staged. Returns whether it switched.
    async fn try_switch(&self) -> bool {
        let (old, new) = {
            let mut s = self.state.lock().unwrap();
            let succ = successor((s.epoch, s.mini_epoch), self.nm);
            let Next::Ready { target, slot, .. } = &s.next else {
                return false;
            };
            if *target != succ {
                return false;
            }
            let slot = slot.clone();
            let plan = self.plan_of(&mut s, succ.0);
            s.generation = next_generation(s.generation);
            let view = Arc::new(Self::view_for(
                &self.catalog,
                self.containers.as_deref(),
                &self.stager,
                &plan,
                succ,
                s.generation,
                &self.paths,
            ));
            debug_assert_eq!(view.slot, slot);
            let old = self.fs.switch(view.clone());
            s.draining.insert(old.generation, old.slot.clone());
            s.epoch = succ.0;
            s.mini_epoch = succ.1;
            s.passes = 0;
            s.advance_wanted = false;
            s.sequence += 1;
            let fresh = MiniEpochRecord::begin(s.sequence, succ.0, succ.1);
            let rec = std::mem::replace(&mut s.record, fresh);
            self.events.emit(
                "switch",
                json!({
                    "epoch": succ.0, "mini_epoch": succ.1, "generation": s.generation,
                    "sequence": s.sequence, "prev_rf": rec.rf, "prev_wanted_rf": rec.wanted_rf,
                }),
            );
            if let Some(h) = s.history.as_mut() {
                let saved = h
                    .store
                    .record_mini_epoch(h.run, rec)
                    .and_then(|_| h.store.save());
                if let Err(e) = saved {
                    tracing::warn!(error = %e, "cannot record the rf history");
                }
            }
            s.next = Next::Idle;
            s.policy.on_advance();
            (old, view)
        };
        self.save_state();
        tracing::info!(
            epoch = new.epoch,
            mini_epoch = new.mini_epoch,
            generation = new.generation,
            files = new.file_count(),
            "mini-epoch is now current"
        );
        // Drop the kernel's cached entries of the old view before anyone hears of the switch.
        // Every entry the old view gave out as current was delivered before `switch` returned
        // (the core's reply gate), so this reaches all of them.
        let notifier = self.notifier.lock().unwrap().clone();
        if let Some(n) = notifier {
            let names = old.root_names();
            let _ = tokio::task::spawn_blocking(move || {
                for name in names {
                    let _ = n.inval_entry(crate::view::ROOT_INO, &name);
                }
                let _ = n.inval_inode(crate::view::ROOT_INO);
            })
            .await;
        }
        let me = self.me.lock().unwrap().upgrade();
        if self.fs.is_drained(&old) {
            // Deleting a large slot takes a while; the caller must not wait for it. The stager
            // waits (the slot stays in `draining` until its files are gone), so the budget holds.
            if let Some(me) = me {
                let gen = old.generation;
                tokio::spawn(async move { me.evict_view(gen).await });
            } else {
                self.evict_view(old.generation).await;
            }
        } else if self.read_path_now() == ReadPath::Cached {
            if let Some(me) = me {
                tokio::spawn(me.release_kernel_refs(old.generation));
            }
        }
        self.bump();
        true
    }

    /// Lets the kernel forget a retired view's inodes (the cached read path, where they pin
    /// the view). Invalidating the root's entries at the switch drops every unused entry below
    /// them, but an entry in use then (a file open below a directory) stays, and so do entries
    /// replied after the switch with a zero TTL (lookups through an old directory, listings of
    /// a directory opened before the switch): expired, they still sit in the dentry cache,
    /// holding the view, until memory runs short. So every inode of the view the kernel still
    /// holds is pruned, deepest first (`FUSE_NOTIFY_PRUNE`: only that inode's unused entries go,
    /// never the current view's entry of the same name); those in use go once released.
    /// Repeated with a growing pause (at most a second) while the view is retained. Kernels
    /// without prune get the entries invalidated by name instead, except root entries whose
    /// name the current view also has (that would drop the current view's cached subtree).
    async fn release_kernel_refs(self: Arc<Self>, generation: u64) {
        let mut pause = Duration::from_millis(20);
        let mut prune = true;
        loop {
            // Forgets of the entries dropped at the switch arrive in the meantime.
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
            let Some(view) = self.fs.retained(generation) else {
                return;
            };
            let notifier = self.notifier.lock().unwrap().clone();
            let Some(n) = notifier else { return };
            let nodes = view.referenced_nodes();
            if nodes.is_empty() {
                continue;
            }
            let current = self.fs.current();
            let try_prune = prune;
            prune = tokio::task::spawn_blocking(move || {
                if try_prune {
                    let inos: Vec<u64> = nodes.iter().map(|&i| view.ino(i)).collect();
                    match n.prune(&inos) {
                        Ok(()) => return true,
                        Err(e) => {
                            tracing::debug!(error = %e, "kernel has no prune; invalidating by name")
                        }
                    }
                }
                for i in nodes {
                    let node = view.node(i);
                    if node.parent == 0 && current.lookup(0, &node.name).is_ok() {
                        continue;
                    }
                    let _ = n.inval_entry(view.ino(node.parent), &node.name);
                }
                false
            })
            .await
            .unwrap_or(try_prune);
        }
    }

    fn position(&self, s: &State, decision: &str) -> Value {
        json!({
            "decision": decision,
            "generation": s.generation,
            "epoch": s.epoch,
            "mini_epoch": s.mini_epoch,
            "mini_epochs": self.nm,
            "pass": s.passes,
            "rf": s.policy.expected_rf(),
            "next_ready": self.next_ready(s),
        })
    }

    fn next_ready(&self, s: &State) -> bool {
        matches!(&s.next, Next::Ready { target, .. } if *target == successor((s.epoch, s.mini_epoch), self.nm))
    }

    /// Waits until the successor is staged (or the daemon shuts down) and switches.
    async fn switch_blocking(&self) -> Result<(), ProtocolError> {
        let t = Instant::now();
        let r = self.switch_blocking_inner().await;
        self.state.lock().unwrap().meter.blocked_secs += t.elapsed().as_secs_f64();
        r
    }

    async fn switch_blocking_inner(&self) -> Result<(), ProtocolError> {
        loop {
            let mut rx = self.changed.subscribe();
            if self.try_switch().await {
                return Ok(());
            }
            if self.state.lock().unwrap().shutting_down {
                return Err(ProtocolError::new(
                    ErrorCode::ShuttingDown,
                    "the daemon is shutting down",
                ));
            }
            let _ = rx.changed().await;
        }
    }

    /// Handles `pass_end`.
    pub async fn pass_end(
        &self,
        job: Option<String>,
        metrics: Metrics,
        block: bool,
    ) -> Result<Value, ProtocolError> {
        let (reason, want) = {
            let mut s = self.state.lock().unwrap();
            if let Some(j) = job {
                self.adopt_job(&mut s, j)?;
            }
            let state = PassState {
                passes: s.passes + 1,
                sequence: s.sequence,
            };
            let d = s
                .policy
                .on_pass_end(&metrics, &state)
                .map_err(|e| ProtocolError::new(ErrorCode::BadMetrics, e.to_string()))?;
            s.passes = state.passes;
            s.record.add_pass(&d);
            let secs = self.pass_start(&s).elapsed().as_secs_f64();
            s.meter.pass_started = Instant::now();
            s.meter.pass_secs.push_back(secs);
            if s.meter.pass_secs.len() > 16 {
                s.meter.pass_secs.pop_front();
            }
            self.events.emit(
                "pass_end",
                json!({
                    "epoch": s.epoch, "mini_epoch": s.mini_epoch, "sequence": s.sequence,
                    "pass": s.passes, "verdict": d.verdict, "score": d.score,
                    "view_bytes": self.fs.current().bytes(), "secs": secs,
                }),
            );
            self.check_stall_free(&mut s);
            if s.passes == 1 && self.read_path_now() == ReadPath::Cached {
                // The view's data now lives in the mount's page cache.
                let view = self.fs.current();
                tokio::task::spawn_blocking(move || FsCore::drop_slot_pages(&view));
            }
            if d.verdict == Verdict::Advance {
                s.advance_wanted = true;
            }
            (d.reason, s.advance_wanted)
        };
        let decision = if !want {
            "repeat"
        } else if self.try_switch().await {
            "advance"
        } else if block {
            self.switch_blocking().await?;
            "advance"
        } else {
            self.state.lock().unwrap().bonus_passes += 1;
            "wait"
        };
        self.events.emit("decision", json!({"decision": decision}));
        // The next pass starts now: time spent blocked for staging is not part of a pass, or
        // pacing would read its own stalls as slow passes and stage slower still.
        {
            let mut s = self.state.lock().unwrap();
            s.meter.pass_started = Instant::now();
            self.pace(&s);
        }
        let s = self.state.lock().unwrap();
        let mut out = self.position(&s, decision);
        out["reason"] = reason;
        Ok(out)
    }

    /// EB1: bytes the job reads per second, from the view's size and the pass durations.
    fn eb1(&self, s: &State) -> Option<f64> {
        let mean = s.meter.mean_pass()?;
        (mean > 0.0).then(|| self.fs.current().bytes() as f64 / mean)
    }

    /// The stall-free rf, ceil(EB1 / B2), once both are measured.
    fn stall_free_rf(&self, s: &State) -> Option<u32> {
        let b2 = s.meter.b2()?;
        let eb1 = self.eb1(s)?;
        (b2 > 0.0).then(|| (eb1 / b2).ceil().max(1.0) as u32)
    }

    fn check_stall_free(&self, s: &mut State) {
        let Some(sf) = self.stall_free_rf(s) else {
            return;
        };
        if self.cfg.policy.kind == PolicyKind::Fixed
            && self.cfg.policy.rf < sf
            && s.meter.warned_rf != Some(sf)
        {
            s.meter.warned_rf = Some(sf);
            tracing::warn!(
                rf = self.cfg.policy.rf,
                stall_free_rf = sf,
                "the fixed rf is below the stall-free rf ceil(EB1/B2): the job will wait for staging (bonus passes); raise --rf or the tier bandwidth"
            );
        }
    }

    /// Runs periodic work: just-in-time pacing, tier-bandwidth events, the metrics file.
    pub async fn monitor_loop(self: Arc<Self>) {
        // Pacing is retuned four times a second: rate changes cost nothing (see `Pacer`), and
        // the first pass's estimate then takes effect within a quarter of a second.
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        let mut last_tier = u64::MAX;
        let mut n: u64 = 0;
        loop {
            tick.tick().await;
            n += 1;
            self.pace(&self.state.lock().unwrap());
            if n.is_multiple_of(8) {
                let tier = self.stager.tier_bytes_read();
                if tier != last_tier {
                    last_tier = tier;
                    self.events.emit("tier", json!({"tier_bytes_read": tier}));
                }
            }
            if n.is_multiple_of(20) {
                self.write_metrics();
            }
        }
    }

    fn write_metrics(&self) {
        let Some(path) = &self.cfg.metrics_file else {
            return;
        };
        let text = crate::metrics::render(&self.status());
        if let Err(e) = crate::metrics::write_atomic(path, &text) {
            tracing::warn!(path = %path.display(), error = %e, "cannot write the metrics file");
        }
    }

    /// When the running pass began: the later of the previous pass end (or the mount) and the
    /// first lookup in the current view. A job that spends a minute loading its model before
    /// its first read does not make its first pass look a minute longer.
    fn pass_start(&self, s: &State) -> Instant {
        match self.fs.current().first_touch() {
            Some(t) if t > s.meter.pass_started => t,
            _ => s.meter.pass_started,
        }
    }

    /// The expected pass duration: the mean of the timed passes, or before any pass has ended,
    /// an estimate from how far the first pass has come (the share of the view's files looked
    /// up so far), once it has run for a moment over a few percent of the files.
    fn pass_estimate(&self, s: &State) -> Option<f64> {
        if let Some(p) = s.meter.mean_pass() {
            return Some(p);
        }
        let view = self.fs.current();
        let since = view.first_touch()?.elapsed().as_secs_f64();
        let share = view.touched_files() as f64 / view.file_count().max(1) as f64;
        (since >= 0.2 && share >= 0.02).then(|| since / share)
    }

    /// The just-in-time staging rate ([`JustInTime`]): what finishes the successor
    /// `PACING_MARGIN` of the current mini-epoch's expected duration before it is expected to
    /// end, capped by `prefetch_rate_max`. A trickle until the pass duration can be estimated;
    /// the cap (or unlimited) when staging is late.
    fn auto_rate(&self, s: &State) -> Option<u64> {
        let cap = self.cfg.prefetch_rate_max;
        let Next::Staging { progress, .. } = &s.next else {
            return cap;
        };
        let Some(pass_secs) = self.pass_estimate(s) else {
            // No deadline to pace to yet; trickle rather than burst at the cap.
            return Some(AUTO_TRICKLE);
        };
        let jit = JustInTime {
            // Bytes move into a slot a batch at a time; pacing follows them file by file.
            bytes_left: progress.bytes_to_fetch(),
            pass_secs,
            expected_rf: s.policy.expected_rf(),
            passes_done: s.passes as f64,
            pass_elapsed: self.pass_start(s).elapsed().as_secs_f64(),
            margin: PACING_MARGIN,
            cap,
        };
        let rate = jit.rate();
        tracing::trace!(?jit, ?rate, "just-in-time pacing");
        rate
    }

    /// Sets the staging rate when pacing is just in time.
    fn pace(&self, s: &State) {
        if self.cfg.prefetch_rate == PrefetchRate::Auto {
            self.stager.pacer().set_rate(self.auto_rate(s));
        }
    }

    /// Takes the client's job key for the rf history. Before anything is recorded the run is
    /// re-keyed (and a learned policy reloads that job's schedule); later a different key is
    /// an error, since one run has one key.
    fn adopt_job(&self, s: &mut State, job: String) -> Result<(), ProtocolError> {
        if job == s.job {
            return Ok(());
        }
        let fresh = s.passes == 0 && s.record.scores.is_empty();
        let untouched = fresh
            && s.history
                .as_ref()
                .is_none_or(|h| h.store.run(h.run).is_none_or(|r| r.mini_epochs.is_empty()));
        if !untouched {
            return Err(ProtocolError::new(
                ErrorCode::BadRequest,
                format!(
                    "job `{job}`: this mount already records job `{}`; one mount serves one job key",
                    s.job
                ),
            ));
        }
        let mut schedule = None;
        if let Some(h) = s.history.as_mut() {
            schedule = h.store.schedule(&h.dataset, &job);
            h.run = h.store.start_run(&h.dataset, &job);
        }
        if self.cfg.policy.kind == PolicyKind::Learned {
            s.policy = build_policy(&self.cfg, schedule)
                .map_err(|e| ProtocolError::new(ErrorCode::Internal, e.to_string()))?;
        }
        tracing::info!(job = %job, "job key for the rf history");
        s.job = job;
        Ok(())
    }

    /// Handles `advance`: switches now if the successor is staged; otherwise blocks (`wait`)
    /// or answers `wait` and advances at the next pass end that finds it staged.
    pub async fn advance(&self, wait: bool) -> Result<Value, ProtocolError> {
        self.state.lock().unwrap().advance_wanted = true;
        let decision = if self.try_switch().await {
            "advance"
        } else if wait {
            self.switch_blocking().await?;
            "advance"
        } else {
            "wait"
        };
        let s = self.state.lock().unwrap();
        Ok(self.position(&s, decision))
    }

    /// Handles `apply`: a follower moves to exactly (epoch, mini_epoch).
    pub async fn apply(
        &self,
        epoch: u64,
        mini_epoch: u32,
        wait: bool,
    ) -> Result<Value, ProtocolError> {
        let (cur, succ) = {
            let s = self.state.lock().unwrap();
            let cur = (s.epoch, s.mini_epoch);
            (cur, successor(cur, self.nm))
        };
        if (epoch, mini_epoch) == cur {
            let mut s = self.state.lock().unwrap();
            s.passes += 1;
            return Ok(self.position(&s, "repeat"));
        }
        if (epoch, mini_epoch) != succ {
            return Err(ProtocolError::new(
                ErrorCode::BadRequest,
                format!(
                    "cannot apply epoch {epoch} mini-epoch {mini_epoch}: this node is at epoch {} mini-epoch {} and can only move to epoch {} mini-epoch {}",
                    cur.0, cur.1, succ.0, succ.1
                ),
            ));
        }
        self.advance(wait).await
    }

    /// The `status` object.
    pub fn status(&self) -> Value {
        let s = self.state.lock().unwrap();
        let view = self.fs.current();
        let (staging, staging_bytes_done) = match &s.next {
            Next::Idle => (
                json!({"state": if s.draining.is_empty() {"idle"} else {"draining"}}),
                0,
            ),
            Next::Staging {
                target,
                slot,
                progress,
                started,
            } => {
                let done = progress.bytes_done.load(Ordering::Relaxed);
                let total = progress.bytes_total.load(Ordering::Relaxed);
                let secs = started.elapsed().as_secs_f64();
                let fetched = progress.bytes_fetched.load(Ordering::Relaxed);
                let rate = if secs > 0.0 {
                    fetched as f64 / secs
                } else {
                    0.0
                };
                let eta = if rate > 0.0 {
                    Some((total.saturating_sub(done)) as f64 / rate)
                } else {
                    None
                };
                (
                    json!({
                        "state": "staging", "slot": slot, "epoch": target.0, "mini_epoch": target.1,
                        "files_done": progress.files_done.load(Ordering::Relaxed),
                        "files_total": progress.files_total.load(Ordering::Relaxed),
                        "bytes_done": done, "bytes_total": total,
                        "bytes_per_s": rate, "eta_s": eta,
                        "retries": progress.retries.load(Ordering::Relaxed),
                        "last_retry_error": progress.last_retry_error.lock().unwrap().clone(),
                    }),
                    done,
                )
            }
            Next::Ready {
                target,
                slot,
                report,
            } => (
                json!({
                    "state": "ready", "slot": slot, "epoch": target.0, "mini_epoch": target.1,
                    "fetched": report.fetched, "resumed": report.resumed,
                    "failed": report.failed.len(), "secs": report.elapsed.as_secs_f64(),
                }),
                0,
            ),
            Next::Failed {
                target,
                error,
                at,
                failures,
                pause,
            } => (
                json!({
                    "state": "failed", "epoch": target.0, "mini_epoch": target.1, "error": error,
                    "failures": failures,
                    "retry_in_secs": pause.saturating_sub(at.elapsed()).as_secs_f64(),
                }),
                0,
            ),
        };
        let staged_slots: u64 = s
            .slot_footprints
            .iter()
            .filter(|(name, _)| match &s.next {
                Next::Staging { slot, .. } => *name != slot,
                _ => true,
            })
            .map(|(_, b)| *b)
            .sum();
        let meta: u64 = [&self.paths.catalog, &self.paths.state, &self.cfg.log_file]
            .iter()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| round_up(m.len()))
            .sum();
        json!({
            "epoch": s.epoch,
            "mini_epoch": s.mini_epoch,
            "mini_epochs": self.nm,
            "pass": s.passes,
            "rf": s.policy.expected_rf(),
            "rf_policy": s.policy.name(),
            "job": s.job,
            "advance_wanted": s.advance_wanted,
            "generation": s.generation,
            "next_ready": self.next_ready(&s),
            "cache_bytes": staged_slots + round_up(staging_bytes_done) + meta,
            "budget_bytes": self.budget.budget,
            "slot_bytes": self.budget.slot_bytes,
            "reserve_bytes": self.budget.reserve,
            "tier_bytes_read": self.stager.tier_bytes_read(),
            "daemon_bytes_read": self.fs.bytes_read.load(Ordering::Relaxed),
            "daemon_opens": self.fs.opens.load(Ordering::Relaxed),
            "view_files": view.file_count(),
            "view_bytes": view.bytes(),
            "dataset_files": self.catalog.len(),
            "dataset_bytes": self.catalog.total_bytes(),
            "bonus_passes": s.bonus_passes,
            "blocked_seconds": s.meter.blocked_secs,
            "pass_seconds": s.meter.pass_secs.back(),
            "pass_seconds_mean": s.meter.mean_pass(),
            "b2_bytes_per_s": s.meter.b2(),
            "b2_recent_bytes_per_s": s.meter.last_b2,
            "eb1_bytes_per_s": self.eb1(&s),
            "stall_free_rf": self.stall_free_rf(&s),
            "prefetch_rate": self.stager.pacer().rate(),
            "staging": staging,
            "draining_slots": s.draining.len(),
            "draining": self.draining_detail(),
            "open_handles": self.fs.open_handles(),
            "passthrough": self.read_path_now() == ReadPath::Passthrough,
            "read_path": self.read_path_now().name(),
            "last_error": s.last_error,
            "failed_samples": s.failed_samples,
            "source": self.tier_url,
            "mountpoint": self.mountpoint().display().to_string(),
            "socket": self.cfg.socket.display().to_string(),
            "node_rank": self.cfg.node_rank,
            "nodes": self.cfg.nodes,
            "compose": self.cfg.compose,
            "uptime_s": self.started.elapsed().as_secs_f64(),
            "pid": std::process::id(),
        })
    }

    /// What holds each retired view that is not evicted yet: open handles, the kernel's
    /// lookups (entries and inodes it still caches, on the cached read path) and a few of the
    /// paths it holds, so that a view that does not drain can be diagnosed from `status`.
    fn draining_detail(&self) -> Value {
        self.fs
            .retained_views()
            .iter()
            .map(|v| {
                let held: Vec<String> = v
                    .referenced_nodes()
                    .into_iter()
                    .take(5)
                    .map(|i| v.rel_path(i))
                    .collect();
                json!({
                    "generation": v.generation, "slot": v.slot, "open_handles": v.open_handles(),
                    "kernel_refs": v.kernel_refs(), "kernel_held": held,
                })
            })
            .collect()
    }

    /// The `files` object.
    pub fn files(&self) -> Value {
        let view = self.fs.current();
        json!({
            "generation": view.generation,
            "epoch": view.epoch,
            "mini_epoch": view.mini_epoch,
            "mountpoint": self.mountpoint().display().to_string(),
            "files": view.file_paths(),
        })
    }

    /// The `hello` object.
    pub fn hello(&self, job: Option<String>) -> Value {
        json!({
            "protocol": feedback::protocol::PROTOCOL_VERSION,
            "version": env!("CARGO_PKG_VERSION"),
            "mountpoint": self.mountpoint().display().to_string(),
            "job": job,
        })
    }

    /// Starts shutting down: blocked callers are released with `shutting_down`.
    pub fn begin_shutdown(&self) {
        self.state.lock().unwrap().shutting_down = true;
        self.bump();
        self.shutdown.notify_waiters();
        self.shutdown.notify_one();
    }

    /// Saves the position and the rf history (at shutdown).
    pub fn persist(&self) {
        self.save_state();
        let mut s = self.state.lock().unwrap();
        let rec = s.record.clone();
        if let Some(h) = s.history.as_mut() {
            let mut r = Ok(());
            if !rec.scores.is_empty() {
                r = h.store.record_mini_epoch(h.run, rec);
            }
            if let Err(e) = r.and_then(|_| h.store.save()) {
                tracing::warn!(error = %e, "cannot save the rf history");
            }
        }
    }
}

/// A terminal progress bar following a staging run.
fn progress_bar(progress: Arc<Progress>) -> (indicatif::ProgressBar, tokio::task::JoinHandle<()>) {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "staging mini-epoch {bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta} ({msg} files)",
        )
        .expect("static template"),
    );
    let b = bar.clone();
    let task = tokio::spawn(async move {
        loop {
            b.set_length(progress.bytes_total.load(Ordering::Relaxed));
            b.set_position(progress.bytes_done.load(Ordering::Relaxed));
            b.set_message(format!(
                "{}/{}",
                progress.files_done.load(Ordering::Relaxed),
                progress.files_total.load(Ordering::Relaxed)
            ));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    (bar, task)
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
