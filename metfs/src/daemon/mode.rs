//! The mode's state in a running daemon: one [`ModeState`] per daemon, made at setup from the
//! configuration's [`crate::config::Mode`].
//!
//! Generic code (the control socket, the staging loop, the switch, `status`) never tests which
//! mode runs: it asks the mode state what it needs to know, and each answer is written once,
//! here, by mode:
//!
//! | question | plain | `--dds` | `--aggregate` | `--share` |
//! |---|---|---|---|---|
//! | the session of a request ([`ModeState::session_for`]) | the default | the default | the default | the job named |
//! | stage while a slot drains? ([`ModeState::stages_while_draining`]) | no | no | no | yes, each staging checks its room |
//! | room for a staging ([`ModeState::room`]) | fits | fits | fits | the store's policy by reference counts |
//! | before a staging ([`ModeState::before_staging`]) | nothing | nothing | open the epoch's inbox | nothing |
//! | a switch's generation ([`ModeState::generation_after`]) | the session's next | same | same | unique across jobs |
//! | after a pass ([`ModeState::pass_ended`]) | nothing | DONE marks (`after-pass`) | nothing | the save file, durably |
//! | a retired view's batch ([`ModeState::retired`]) | none | DONE mark | none | none |
//! | defer samples the tier keeps failing? ([`crate::config::Mode::defers`]: the first staging asks before the mode state exists) | yes | yes | yes | no |
//! | before the staging loop's round ([`ModeState::before_round`]) | nothing | DONE marks, the next claim | nothing | the cohort's draws |
//! | the monitor's tick ([`ModeState::tick`]) | nothing | nothing | nothing | idle jobs dropped, the held-open cap |
//!
//! A session's [`super::schedule::Schedule`] answers the per-session questions (its
//! successor, members, slot names); this type answers those of the daemon as a whole (the
//! queue's worker, the cohort of jobs, the exchange between nodes).
//!
//! **Invariant:** the mode state is fixed at setup and never changes; a mode's shared state
//! (the queue feed, the jobs and their cohort, the aggregate plan) is reached only through it.

use std::path::Path;
use std::sync::Arc;

use metfs_fs::lock_order::OrderedMutex;

use crate::config::share::ShareEvict;
use metfs_dds::{Batch, ShardDone};
use metfs_protocol::reply::{AggregateStatus, DdsStatus, ExchangeStatus};
use metfs_protocol::{JobStatus, NotResumed, ProtocolError};

use super::aggregate::{inbox_of_epoch, Aggregate};
use super::queue::QueueFeed;
use super::session::{Session, Sessions, DEFAULT_SESSION};
use super::share::Shared;
use super::state::next_generation;
use super::store::{Room, Store};

/// What the running daemon keeps of its mode (module doc).
pub(super) enum ModeState {
    /// One job, its plan its own.
    Plain,
    /// One job fed by the node's worker on the shard queue.
    Queue(Box<QueueFeed>),
    /// One job whose epochs after the first come from the other nodes' caches.
    Aggregate(Arc<Aggregate>),
    /// Several jobs on one store, their views drawn by one cohort.
    Shared(Box<Shared>),
}

/// The fields of `status` that only a mode has.
pub(super) struct ModeStatus {
    pub(super) dds: Option<DdsStatus>,
    pub(super) jobs: Option<Vec<JobStatus>>,
    pub(super) not_resumed: Option<Vec<NotResumed>>,
    pub(super) aggregate: Option<AggregateStatus>,
}

impl ModeState {
    /// The queue feed, with `--dds`.
    pub(super) fn queue(&self) -> Option<&QueueFeed> {
        match self {
            ModeState::Queue(q) => Some(q.as_ref()),
            _ => None,
        }
    }

    /// The jobs and their cohort, with `--share`.
    pub(super) fn shared(&self) -> Option<&Shared> {
        match self {
            ModeState::Shared(s) => Some(s.as_ref()),
            _ => None,
        }
    }

    /// The aggregate plan, with `--aggregate`.
    pub(super) fn aggregate(&self) -> Option<&Arc<Aggregate>> {
        match self {
            ModeState::Aggregate(a) => Some(a),
            _ => None,
        }
    }

    /// The session a request acts on: on a shared mount the job it names (required, and
    /// counted as its sign of life), else the default session.
    pub(super) fn session_for(&self, job: Option<&str>) -> Result<String, ProtocolError> {
        match self {
            ModeState::Shared(sh) => sh.session_for(job),
            _ => Ok(DEFAULT_SESSION.to_string()),
        }
    }

    /// The session whose view a `files` request lists: the job's on a shared mount (which
    /// must name one), `None` for the view the mount's root shows.
    pub(super) fn files_session(&self, job: Option<&str>) -> Result<Option<String>, ProtocolError> {
        match self {
            ModeState::Shared(sh) => sh.session_for(job).map(Some),
            _ => Ok(None),
        }
    }

    /// The session a `status` request reports: the job named on a shared mount; `None` for
    /// the default session, or on a shared mount without a job, the store alone.
    pub(super) fn status_session(
        &self,
        job: Option<&str>,
    ) -> Result<Option<String>, ProtocolError> {
        match (self, job) {
            (ModeState::Shared(sh), Some(j)) => sh.session_for(Some(j)).map(Some),
            _ => Ok(None),
        }
    }

    /// The session `status` without a job reports: none on a shared mount (the store's state
    /// and every job), else the default one.
    pub(super) fn default_status_session(&self) -> Option<&'static str> {
        match self {
            ModeState::Shared(_) => None,
            _ => Some(DEFAULT_SESSION),
        }
    }

    /// The mode's own round before the staging loop looks for a successor to stage: with a
    /// queue, the DONE marks and the next claim ([`QueueFeed::serve`]); on a shared mount,
    /// the jobs' next views drawn by the cohort ([`Shared::serve_cohort`]). Returns how long
    /// the loop may sleep if nothing else wakes it (`None`: nothing to wait for).
    pub(super) async fn before_round(
        &self,
        sessions: &OrderedMutex<Sessions>,
        store: &Store,
    ) -> Option<std::time::Duration> {
        match self {
            ModeState::Queue(feed) => feed.serve(sessions, store).await,
            ModeState::Shared(sh) => {
                sh.serve_cohort(&mut sessions.lock().unwrap(), store);
                None
            }
            ModeState::Plain | ModeState::Aggregate(_) => None,
        }
    }

    /// The mode's share of the monitor's periodic work: on a shared mount, dropping the jobs
    /// silent for `share.idle_secs` ([`Shared::reap_idle`]).
    pub(super) fn tick(&self, d: &Arc<super::Daemon>) {
        if let ModeState::Shared(sh) = self {
            sh.reap_idle(d);
            sh.cap_held_open(d);
        }
    }

    /// Counts as a sign of life of job `name` (a request, or waiting for staging for it).
    pub(super) fn touch(&self, name: &str) {
        if let ModeState::Shared(sh) = self {
            sh.touch(name);
        }
    }

    /// Whether a staging may start while a retired slot still drains. A single job's
    /// staging waits (the budget holds two slots); a shared mount's stagings each check
    /// their own room ([`ModeState::room`]), since one job's frozen reader must not stop
    /// the others.
    pub(super) fn stages_while_draining(&self) -> bool {
        matches!(self, ModeState::Shared(_))
    }

    /// Whether a staging of `samples` fits the store now. On a shared mount the files on the
    /// node and the new slot must fit the budget: held slots are let go by the store's policy
    /// (`share.evict`: the cohort's reference counts, or oldest first).
    pub(super) fn room(&self, store: &Store, samples: &[u32]) -> Room {
        let ModeState::Shared(sh) = self else {
            return Room::Fits;
        };
        let cohort = sh.cohort.lock().unwrap();
        match sh.cfg.evict {
            // The store's ids are files, the ledger's the cohort's samples.
            ShareEvict::Refcnt => {
                store.room_for(samples, |x| sh.ids.refcount_of_file(cohort.ledger(), x))
            }
            // All equal: the oldest goes first.
            ShareEvict::Lru => store.room_for(samples, |_| 0),
        }
    }

    /// Prepares a staging of `target` and returns the slots it may link from besides the
    /// store's own: in aggregate mode, the epoch's inbox, which the exchange fills (opened
    /// now that its bytes are counted).
    pub(super) fn before_staging(&self, slots: &Path, target: (u64, u32)) -> Vec<String> {
        match self {
            ModeState::Aggregate(_) if target.0 > 0 => {
                Aggregate::open_inbox(slots, target.0);
                vec![inbox_of_epoch(target.0)]
            }
            _ => Vec::new(),
        }
    }

    /// The aggregate plan whose exchange a staging of `target` waits for (epochs after the
    /// first), else `None`.
    pub(super) fn exchange_for(&self, target: (u64, u32)) -> Option<&Arc<Aggregate>> {
        self.aggregate().filter(|_| target.0 > 0)
    }

    /// The generation a switch away from generation `current` gives the new view: the
    /// session's next, or on a shared mount one no job's view has (inode numbers carry it).
    pub(super) fn generation_after(&self, current: u64) -> u64 {
        match self {
            ModeState::Shared(sh) => sh.take_generation(),
            _ => next_generation(current),
        }
    }

    /// Whether a view built ahead for a switch from generation `current` into `slot` is
    /// still the one the switch gives: of that slot, and of the generation the switch would
    /// give (on a shared mount its generation was reserved for it).
    pub(super) fn prebuilt_fits(&self, built: (u64, &str), current: u64, slot: &str) -> bool {
        let (generation, built_slot) = built;
        built_slot == slot
            && match self {
                ModeState::Shared(_) => true,
                _ => generation == next_generation(current),
            }
    }

    /// Whether session `s`'s switch must wait for the other jobs (`share.pace = wait`).
    pub(super) fn holds_back(&self, store: &Store, ss: &Sessions, s: &Session) -> bool {
        match self {
            ModeState::Shared(sh) => s.next_ready() && sh.holds_back(store, ss, s),
            _ => false,
        }
    }

    /// At job `name`'s switch on a shared mount: moves it to its next view in the cohort and
    /// returns what the other jobs have drawn ahead (what the slot it leaves may be kept
    /// for). Nothing elsewhere.
    pub(super) fn advance_job(&self, name: &str) -> Vec<u32> {
        match self {
            ModeState::Shared(sh) => sh.advance_job(name),
            _ => Vec::new(),
        }
    }

    /// The batch of a retired view, which still needs its DONE mark, handed to the queue.
    pub(super) fn retired(&self, batch: Option<Batch>) {
        if let (ModeState::Queue(feed), Some(b)) = (self, batch) {
            feed.mark_done(b);
        }
    }

    /// After a pass of session `s` ended: from a queue with `after-pass`, the view's shards
    /// are DONE once read once. Returns whether a DONE mark was handed over (the staging loop
    /// sends it).
    pub(super) fn pass_ended(&self, s: &mut Session) -> bool {
        let ModeState::Queue(feed) = self else {
            return false;
        };
        let (passes, mini_epoch) = (s.passes(), s.mini_epoch());
        if passes != 1 || feed.shard_done != ShardDone::AfterPass {
            return false;
        }
        let Some(batch) = s
            .schedule_mut()
            .queue_mut()
            .and_then(|q| q.mark(mini_epoch))
        else {
            return false;
        };
        feed.mark_done(batch);
        true
    }

    /// Whether every `pass_end` saves the jobs' places before it answers (a shared mount's
    /// `share.json`; a single job's position is saved at its switches).
    pub(super) fn saves_every_pass(&self) -> bool {
        matches!(self, ModeState::Shared(_))
    }

    /// The fields of `status` that belong to the mode.
    pub(super) fn status(&self, ss: &Sessions) -> ModeStatus {
        ModeStatus {
            dds: self.queue().map(|q| q.status()),
            jobs: self.shared().map(|sh| sh.job_statuses(ss)),
            not_resumed: self.shared().map(|sh| sh.not_resumed()),
            aggregate: self.aggregate().map(|a| aggregate_status(a)),
        }
    }
}

/// `status`'s account of aggregate-cache mode.
fn aggregate_status(a: &Aggregate) -> AggregateStatus {
    AggregateStatus {
        rank: a.rank,
        nodes: a.settings().nodes,
        extra: a.settings().extra,
        code: super::wire::wire_shuffle_code(a.code),
        last_exchange: a.last_wait.lock().unwrap().map(|w| ExchangeStatus {
            epoch: w.epoch,
            complete: w.complete,
            wait_s: w.secs,
        }),
    }
}
