//! A shared mount (`metfs mount --share`): several jobs on one daemon and one staged store
//! (paper 004, JOADER).
//!
//! * **Jobs.** A job joins with `hello` and its name (`METFS_JOB` in the Python client), and
//!   optionally a subset of the source (a manifest, labels, or a fraction with a seed) and its
//!   own rf policy. It becomes a [`Session`] of that name whose view is the directory
//!   `MNT/<job>`; the mount's root lists the jobs. `hello` answers once the job's first view
//!   is staged and shown, as a plain mount goes live only with its first mini-epoch. A job
//!   leaves with `leave`, or is dropped after `share.idle_secs` without a request (a
//!   `kill -9`'d trainer pins nothing for longer). A second `hello` under a name present is
//!   refused unless it carries the token the first one was given (the client's reconnection).
//! * **Views from one sampler.** Each job's views (its mini-epochs, numbered by sequence like
//!   a queue's batches) come from the store's [`Cohort`]: dependent sampling (corrected
//!   Algorithm 1, `metfs_plan::planner::dsa`) draws every job's views together, so jobs over
//!   overlapping datasets take their shared samples in the same round while each job's own
//!   order stays uniformly random.
//! * **Samples, not files.** The cohort draws samples as the sample settings make them
//!   (`--group-by`, `--always`, `--include`, `--exclude`, `--format` or the detected format:
//!   an image and its mask, a format's shard with its companions), each of its files'
//!   footprint; without them each file is a sample, as before. [`CohortIds`] (`ids`) is the
//!   one place that turns the cohort's ids into files: a job's views, its staging, its kept
//!   slots and what the others drew ahead are files, each view holds whole samples and the
//!   always files (one staged copy, hard-linked into every slot), a format's view has its
//!   index rewritten to exactly its shards (`Store::view_for`), and the store's reference
//!   counts and a job's subset (a manifest names files: a sample is in if any of its files
//!   is) are asked of the cohort by sample. The cohort deals at most a view less the always
//!   files, so every view fits its half share.
//! * **One store.** A job's view is staged into a slot of its own (`<job>.e…-m…`), and every
//!   sample some slot of the store already holds is hard-linked from it, not fetched
//!   (`Store::stage` offers every slot as a donor): a sample two jobs read in the same round is
//!   read from the tier once and stored once, and the store counts each file once.
//! * **Shares.** The budget left after metadata is cut into `share.jobs` equal shares; a job
//!   takes one when it joins (its current and next views, so each of its views is at most half
//!   a share) and a join past the count is refused with the numbers. The shares granted never
//!   exceed the budget, so every job's pinned views fit whatever the others do. Retired slots
//!   are kept as donors (the store's held slots, up to two per share) whatever their bytes,
//!   and a staging that needs room takes it from them in RefCnt's order at the grain of
//!   samples (`Store::room_for`): single samples of kept slots nobody reads any more, those
//!   the fewest jobs still need this epoch (the cohort's reference counts) first, then the
//!   oldest slot's; whole slots only if that is not enough.
//! * **Pace.** With `share.pace = wait` (the default), a job whose view would retire while
//!   another job has drawn some of its samples into a view not staged yet (and no other slot
//!   holds them) is answered `wait` (a bonus pass) instead: it never makes a slower job read
//!   the tier again. It is never held back when every other job is held back too.
//!   With `evict` it moves on.
//!
//! Each job records its rf history as a run of its own in the mount's one history file
//! (`Shared::history`, one copy in memory that every job's writes snapshot), keyed by its name
//! and its dataset; `leave` marks the run finished, a job dropped for its silence leaves it
//! unfinished.
//!
//! * **Restarts.** Each job's place is saved in `CACHE/share.json` (`state`: name and
//!   token, subset, position, rf policy state, its place in the cohort) at every switch, when
//!   its next view is staged, at `leave` and at shutdown, written on a blocking thread after a
//!   snapshot under the sessions' lock; and before every `pass_end` answers, which waits for
//!   that write, so a `kill -9` loses no pass a job was answered for (the write is of every
//!   job's place: milliseconds at the tests' sizes, growing with the datasets; see
//!   docs/RELIABILITY.md). A daemon started on a file of the same settings keeps
//!   every saved job's current slot and prepared next slot (other slots are deleted as before),
//!   checks each current slot as a plain mount's resume does (its seal, else every journaled
//!   copy, fetching only what is missing), shows it at its saved generation, and restores the
//!   job's session, policy state, rf history run and cohort place ([`Cohort::rejoin`]): the job
//!   is present, and its `hello` with name and token is a reconnection. One without a `hello`
//!   is dropped after `share.idle_secs` like a silent job. The cohort's place holds each job's
//!   undrawn samples and drawn views, not the sampler's random state: the restored sampler
//!   draws from a fresh stream (seed and restart count), which keeps each job's order of what
//!   it has left uniform and never draws again what it drew this epoch; reproducing the old
//!   stream would also need the order of every job's requests, which no restart repeats.
//!   A saved job that cannot be resumed (its subset no longer gives its dataset, its kept
//!   slot cannot be staged, its cohort place does not check, the mount's settings changed)
//!   starts over when it joins again, and is told why: its next `hello` carries
//!   `not_resumed` with the reason and where it was, `status` lists it, and the event log has
//!   a `job_not_resumed` record.
//!
//! Layout: this file holds [`Shared`], [`JobMeta`], the job name's check and the small helpers
//! (a request's session, a job's sign of life); `ids` the cohort's ids and their files;
//! `join` a job's `hello`, subset and admission,
//! its `leave` and the dropping of silent jobs; `resume` the save file's snapshot and write,
//! and the resumption of its jobs at start; `cohort` the views the cohort draws, the pace
//! (`holds_back`) and the jobs' status; `state` the save file (`share.json`) itself.

use metfs_fs::lock_order::{Level, OrderedMutex};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::OnceLock;

use crate::config::share::ShareConfig;
use crate::daemon::state::next_generation;
use metfs_feedback::history::HistoryStore;
use metfs_plan::budget::Budget;
use metfs_plan::refcnt::cohort::Cohort;
use metfs_protocol::Subset;
use metfs_protocol::{ErrorCode, NotResumed, PolicyKind, ProtocolError};
use state::ShareSettings;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod cohort;
mod held;
mod ids;
mod join;
mod resume;
pub(super) mod state;

pub(super) use ids::CohortIds;
pub(super) use resume::not_resumed;

/// The jobs of a shared mount and their sampler.
pub(super) struct Shared {
    pub(super) cfg: ShareConfig,
    /// Every job's views, shares and references (lock after the sessions', before the store's).
    pub(super) cohort: OrderedMutex<Cohort>,
    pub(super) jobs: OrderedMutex<BTreeMap<String, JobMeta>>,
    /// The last generation handed out: generations are unique across jobs, since inode
    /// numbers carry them.
    generation: AtomicU64,
    /// Most bytes of one view of a job (half a share).
    pub(super) view_bytes: u64,
    /// What the cohort's ids are (groups of files, or files) and their files.
    pub(super) ids: CohortIds,
    /// Most bytes of samples the cohort deals into one view: `view_bytes` less the always
    /// files every view holds besides them.
    pub(super) dealt_bytes: u64,
    /// The mount's rf history file, one copy for every job: each job records its own run under
    /// its name and its dataset (`None` if the file cannot be used).
    pub(super) history: Option<Arc<OrderedMutex<HistoryStore>>>,
    /// When the last job joined: first views are drawn only [`JOIN_WINDOW`] after it.
    last_join: OrderedMutex<Option<Instant>>,
    /// What the views depend on, saved with the jobs' places (`share.json`).
    pub(super) settings: ShareSettings,
    /// Restarts of this shared mount so far (saved).
    pub(super) restarts: u64,
    /// The saved jobs this start could not resume, each with whether its `hello` was told:
    /// set once when the save file has been read (no lock: never changed after).
    pub(super) not_resumed: OnceLock<Vec<(NotResumed, AtomicBool)>>,
}

/// Jobs joining within this of each other draw their first views together. A job that joins
/// after another has drawn views shares only part of each later view with it (dependent
/// sampling then keeps both orders uniform, so it takes the shared samples in the same round
/// only as often as that allows); the trials of a sweep start within a second of each other.
pub const JOIN_WINDOW: Duration = Duration::from_secs(1);

/// What the daemon keeps of a job besides its session.
pub(super) struct JobMeta {
    token: String,
    last_seen: Instant,
    pub(super) held_back: bool,
    /// What its readers hold of its retired views ([`held`]).
    held_open: held::HeldOpen,
    samples: u64,
    /// What its `hello` asked for, saved so that a restart makes the same dataset and policy.
    subset: Option<Subset>,
    rf_policy: Option<PolicyKind>,
    rf: Option<u32>,
    /// Its dataset's key (see [`dataset_key`]).
    dataset: String,
}

/// The key of a job's dataset, for the rf history and the save file: the source, the sample
/// settings where files are grouped (`samples`: the same ids are other samples under other
/// settings), the count and a digest of the samples (a subset is another dataset).
fn dataset_key(source: &str, samples: Option<&str>, dataset: &[u32]) -> String {
    let mut h = metfs_plan::digest::Fnv1a::new();
    for id in dataset {
        h.write(&id.to_le_bytes());
    }
    let source = match samples {
        Some(s) => format!("{source}|{s}"),
        None => source.to_string(),
    };
    format!("{source}|share|{}|{:016x}", dataset.len(), h.finish())
}

impl Shared {
    /// The jobs of a mount of `budget` over files of `footprints`, whose cohort draws the
    /// samples of `ids` (each sample's footprint its files').
    pub(super) fn new(
        cfg: ShareConfig,
        budget: &Budget,
        footprints: &[u64],
        ids: CohortIds,
        seed: u64,
    ) -> Self {
        let view_bytes = budget.slot_bytes / u64::from(cfg.jobs.max(1));
        let sizes = ids.sizes(footprints).to_vec();
        Self {
            // The store is the daemon's (`Store::room_for`, by the ledger's reference counts),
            // and whatever `share.pace` it holds a job back itself (`holds_back`): the cohort
            // only draws, pins and counts.
            cohort: OrderedMutex::new(
                Level::Cohort,
                Cohort::external(2 * budget.slot_bytes, sizes, seed),
            ),
            jobs: OrderedMutex::new(Level::Jobs, BTreeMap::new()),
            // Generation 1 is the root's (empty) view.
            generation: AtomicU64::new(1),
            view_bytes,
            dealt_bytes: view_bytes,
            ids,
            history: None,
            last_join: OrderedMutex::new(Level::LastJoin, None),
            settings: ShareSettings {
                source: String::new(),
                catalog: String::new(),
                slot_bytes: budget.slot_bytes,
                jobs: cfg.jobs,
                seed,
                transform: None,
                samples: None,
            },
            restarts: 0,
            not_resumed: OnceLock::new(),
            cfg,
        }
    }

    /// The saved jobs this start could not resume (`status`).
    pub(super) fn not_resumed(&self) -> Vec<NotResumed> {
        self.not_resumed
            .get()
            .map(|v| v.iter().map(|n| n.0.clone()).collect())
            .unwrap_or_default()
    }

    /// Why job `name`'s saved place was not resumed, the first time it is asked after the
    /// restart (its first `hello`); `None` after that or if it was resumed.
    fn tell_not_resumed(&self, name: &str) -> Option<NotResumed> {
        let (n, told) = self.not_resumed.get()?.iter().find(|n| n.0.job == name)?;
        (!told.swap(true, Ordering::SeqCst)).then(|| n.clone())
    }

    /// A generation no view has.
    pub(super) fn take_generation(&self) -> u64 {
        // After a wrap, 1 is the root's: skip it.
        let after = |g| match next_generation(g) {
            1 => 2,
            n => n,
        };
        let prev = self
            .generation
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |g| Some(after(g)))
            .expect("the update always succeeds");
        after(prev)
    }
}

/// Checks a job's name: it is a directory name under the mount and part of slot names.
pub fn check_job_name(name: &str) -> Result<(), ProtocolError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(ProtocolError::new(
            ErrorCode::BadRequest,
            format!(
                "job name {name:?} is not valid on a shared mount: use 1 to 64 letters, digits, `_`, `-` or `.`, not starting with `.` (it names the job's directory under the mount)"
            ),
        ))
    }
}

fn bad(message: String) -> ProtocolError {
    ProtocolError::new(ErrorCode::BadRequest, message)
}

/// A 64-bit mix (one SplitMix64 step from `x`), for the `fraction` subset's draw.
fn mix(mut x: u64) -> u64 {
    metfs_planrng::splitmix64(&mut x)
}

impl Shared {
    /// The session of a request on a shared mount: the job it names (required). Counts as
    /// the job's sign of life.
    pub(super) fn session_for(&self, job: Option<&str>) -> Result<String, ProtocolError> {
        let Some(job) = job else {
            return Err(bad(
                "this mount is shared between jobs (--share): name the job (`job`, or METFS_JOB in the Python client)".into(),
            ));
        };
        match self.jobs.lock().unwrap().get_mut(job) {
            Some(m) => {
                m.last_seen = Instant::now();
                Ok(job.to_string())
            }
            None => Err(bad(format!(
                "job {job:?} has not joined this shared mount (or was dropped after {} s without a request); send `hello` with its name first",
                self.cfg.idle_secs
            ))),
        }
    }

    /// Counts as a sign of life of job `name` (a request, or waiting for staging for it).
    pub(super) fn touch(&self, name: &str) {
        if let Some(m) = self.jobs.lock().unwrap().get_mut(name) {
            m.last_seen = Instant::now();
        }
    }
}
