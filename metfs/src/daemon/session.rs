//! A session: one consumer's place in the run. It holds the position (epoch, mini-epoch, pass),
//! the plan it follows, its rf policy and rf history, the meter of its passes, the staging of
//! its successor, and its current view. The daemon keeps sessions in a [`Sessions`] map keyed
//! by name; a mount has the one [`DEFAULT_SESSION`] today, and no code path assumes it is the
//! only one: every operation names the session it acts on.

use super::*;

/// The name of the session a plain mount serves (the one every request reaches today).
pub const DEFAULT_SESSION: &str = "default";

/// The staging of a session's successor mini-epoch.
#[derive(Debug)]
pub(super) enum Next {
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
        /// The successor's view, built when its staging ended for the generation after the
        /// session's then current one, so that the switch is a pointer swap. `None`, or a
        /// view of another generation (the position moved since), is built at the switch.
        view: Option<Arc<View>>,
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

/// One consumer's state (see the module doc).
pub(super) struct Session {
    /// The key of this session in [`Sessions`].
    pub(super) name: String,
    /// The plan settings this session follows, and its mini-epochs per epoch.
    pub(super) plan_cfg: PlanConfig,
    pub(super) nm: u32,
    /// Where the position is saved, with the fingerprint saved beside it: `None` for a job of
    /// a shared mount, whose position is not saved (the `share` module).
    pub(super) persist: Option<Persist>,
    pub(super) epoch: u64,
    pub(super) mini_epoch: u32,
    pub(super) passes: u32,
    pub(super) generation: u64,
    pub(super) sequence: u64,
    pub(super) advance_wanted: bool,
    pub(super) bonus_passes: u64,
    pub(super) next: Next,
    /// Plans of the last few epochs (the planner is pure; these are a cache).
    pub(super) plans: BTreeMap<u64, Arc<EpochPlan>>,
    pub(super) policy: Box<dyn RfPolicy>,
    pub(super) record: MiniEpochRecord,
    pub(super) history: Option<History>,
    /// The job key of the rf history.
    pub(super) job: String,
    pub(super) meter: Meter,
    /// The view this session reads now: the one the filesystem core serves for it.
    pub(super) view: Arc<View>,
    /// With `--dds`: the batches claimed from the queue (the mini-epoch is then a sequence
    /// number of this incarnation, the epoch the batch's). On a shared mount: the views the
    /// cohort drew for this job, by sequence, in the same way.
    pub(super) queue: Option<QueueState>,
    /// A job of a shared mount (`share` module): its slots carry its name, its views are
    /// nested under `MNT/<job>`, and its position is not saved.
    pub(super) shared: bool,
    /// In aggregate-cache mode (`aggregate` module): each epoch is one mini-epoch, its slot
    /// the node's cache and its view the node's share, from this plan.
    pub(super) aggregate: Option<Arc<aggregate::Aggregate>>,
}

/// Where a session's position is saved, and the fingerprint of the plan it follows.
pub(super) struct Persist {
    /// Everything the plan depends on; saved with the position.
    pub(super) fingerprint: Fingerprint,
    /// The state file (`CACHE/state.json` for the default session).
    pub(super) file: PathBuf,
}

/// A successor not claimed from the queue yet: matches no staged slot.
pub(super) const UNCLAIMED: (u64, u32) = (u64::MAX, u32::MAX);

/// The sessions of a daemon, by name.
pub(super) type Sessions = BTreeMap<String, Session>;

/// The rf history of a session: the store, the dataset key, and the run being recorded. The
/// store is the daemon's one copy of the history file, shared by the jobs of a shared mount
/// (each records its own run), so that no job's write drops another's records.
pub(super) struct History {
    pub(super) store: Arc<Mutex<HistoryStore>>,
    pub(super) dataset: String,
    pub(super) run: RunId,
    /// The earlier run a `learned` policy replays and why (`status` reports it).
    pub(super) replay: Option<Replay>,
}

/// Measurements of a session's run (issue: bandwidth-conscious MET).
#[derive(Debug)]
pub(super) struct Meter {
    /// When the pass now running began (the previous pass end, or the mount).
    pub(super) pass_started: Instant,
    /// Durations of the last passes, seconds.
    pub(super) pass_secs: std::collections::VecDeque<f64>,
    /// Bytes fetched and seconds spent by completed stagings.
    pub(super) staged_bytes: u64,
    pub(super) staged_secs: f64,
    /// Throughput of the last completed staging.
    pub(super) last_b2: Option<f64>,
    /// Time callers spent blocked waiting for staging.
    pub(super) blocked_secs: f64,
    /// The stall-free rf last warned about.
    pub(super) warned_rf: Option<u32>,
    /// Pass ends of the current mini-epoch answered `wait`: its bonus passes so far.
    pub(super) mini_epoch_bonus: u32,
    /// The effective rf (`status`): mini-epochs completed since the start, their passes, the
    /// last one's, and how many got bonus passes.
    pub(super) completed: u64,
    pub(super) completed_passes: u64,
    pub(super) last_rf: Option<u32>,
    pub(super) stalled: u64,
}

impl Meter {
    pub(super) fn new() -> Self {
        Self {
            pass_started: Instant::now(),
            pass_secs: Default::default(),
            staged_bytes: 0,
            staged_secs: 0.0,
            last_b2: None,
            blocked_secs: 0.0,
            warned_rf: None,
            mini_epoch_bonus: 0,
            completed: 0,
            completed_passes: 0,
            last_rf: None,
            stalled: 0,
        }
    }
    pub(super) fn mean_pass(&self) -> Option<f64> {
        (!self.pass_secs.is_empty())
            .then(|| self.pass_secs.iter().sum::<f64>() / self.pass_secs.len() as f64)
    }
    pub(super) fn b2(&self) -> Option<f64> {
        (self.staged_secs > 0.0).then(|| self.staged_bytes as f64 / self.staged_secs)
    }

    /// Counts a mini-epoch the view leaves after `passes` passes and starts the next one's
    /// bonus passes at 0. One left without a pass (an `advance` before any) is skipped, as
    /// the report skips it: it says nothing of how many passes a mini-epoch takes.
    pub(super) fn end_mini_epoch(&mut self, passes: u32) {
        let bonus = std::mem::take(&mut self.mini_epoch_bonus);
        if passes == 0 {
            return;
        }
        self.completed += 1;
        self.completed_passes += u64::from(passes);
        self.last_rf = Some(passes);
        if bonus > 0 {
            self.stalled += 1;
        }
    }

    /// Mean passes per completed mini-epoch, bonus passes included.
    pub(super) fn effective_rf(&self) -> Option<f64> {
        (self.completed > 0).then(|| self.completed_passes as f64 / self.completed as f64)
    }
}

impl Session {
    /// The current (epoch, mini-epoch).
    pub(super) fn position(&self) -> (u64, u32) {
        (self.epoch, self.mini_epoch)
    }

    /// The mini-epoch after the current one.
    pub(super) fn successor(&self) -> (u64, u32) {
        match &self.queue {
            // From the queue: the claimed batch after the current one, if claimed yet.
            Some(q) => {
                let seq = self.mini_epoch.wrapping_add(1);
                q.batches.get(&seq).map_or(UNCLAIMED, |b| (b.epoch, seq))
            }
            None => successor(self.position(), self.nm),
        }
    }

    /// The samples of mini-epoch `target` and their footprint: a slice of the epoch's plan,
    /// or the claimed batch of that sequence (none if it is not claimed).
    pub(super) fn members(&mut self, store: &Store, target: (u64, u32)) -> (Vec<u32>, u64) {
        if let Some(a) = &self.aggregate {
            return a.cache(target.0);
        }
        if let Some(q) = &self.queue {
            return q
                .batches
                .get(&target.1)
                .map_or((Vec::new(), 0), |b| (b.samples.clone(), b.bytes));
        }
        let plan = self.plan_of(store, target.0);
        let me = &plan.mini_epochs[target.1 as usize];
        (me.samples.clone(), me.bytes)
    }

    /// The samples the view of mini-epoch `target` shows: its members, but in aggregate mode
    /// only the node's share (the slot also holds the extras kept for the exchange).
    pub(super) fn view_members(&mut self, store: &Store, target: (u64, u32)) -> Vec<u32> {
        match &self.aggregate {
            Some(a) => a.share(target.0),
            None => self.members(store, target).0,
        }
    }

    /// The slot of mini-epoch `target`: on a shared mount prefixed by the job's name.
    pub(super) fn slot_of(&self, target: (u64, u32)) -> String {
        if self.shared {
            format!("{}.{}", self.name, slot_name(target))
        } else {
            slot_name(target)
        }
    }

    /// Whether the successor is staged and the view can switch to it now.
    pub(super) fn next_ready(&self) -> bool {
        matches!(&self.next, Next::Ready { target, .. } if *target == self.successor())
    }

    /// The slot this session is staging now, if any.
    pub(super) fn staging_slot(&self) -> Option<&str> {
        match &self.next {
            Next::Staging { slot, .. } => Some(slot),
            _ => None,
        }
    }

    /// The plan of `epoch` (computed over `store`'s samples, and kept for a few epochs).
    pub(super) fn plan_of(&mut self, store: &Store, epoch: u64) -> Arc<EpochPlan> {
        if let Some(p) = self.plans.get(&epoch) {
            return p.clone();
        }
        // The plan was validated for this catalog and config at startup; the planner is a pure
        // function, so a later epoch cannot fail where epoch 0 succeeded.
        let p = Arc::new(
            planner::plan_epoch(&store.sample_set(), &self.plan_cfg, epoch)
                .expect("the planner accepted these inputs at startup"),
        );
        self.remember_plan(epoch, p.clone());
        p
    }

    /// Keeps epoch `epoch`'s plan (made by [`Session::plan_of`] or ahead of need), with the
    /// plans of the two epochs before it at most.
    pub(super) fn remember_plan(&mut self, epoch: u64, plan: Arc<EpochPlan>) {
        self.plans.insert(epoch, plan);
        while self.plans.len() > 3 {
            let first = *self.plans.keys().next().unwrap();
            self.plans.remove(&first);
        }
    }

    /// The position to save, and the file to save it in; `None` for a session whose
    /// position is not saved.
    pub(super) fn saved(&self) -> Option<(SavedState, PathBuf)> {
        let persist = self.persist.as_ref()?;
        let state = SavedState {
            fingerprint: SavedFingerprint::Current(persist.fingerprint.clone()),
            epoch: self.epoch,
            mini_epoch: self.mini_epoch,
            generation: self.generation,
            sequence: self.sequence,
            run: self.history.as_ref().map(|h| h.run),
            job: Some(self.job.clone()),
        };
        Some((state, persist.file.clone()))
    }
}

/// The session named `name`, or the error a client gets for an unknown one.
pub(super) fn session_mut<'a>(
    sessions: &'a mut Sessions,
    name: &str,
) -> Result<&'a mut Session, ProtocolError> {
    sessions.get_mut(name).ok_or_else(|| unknown_session(name))
}

/// The session named `name`, or the error a client gets for an unknown one.
pub(super) fn session_ref<'a>(
    sessions: &'a Sessions,
    name: &str,
) -> Result<&'a Session, ProtocolError> {
    sessions.get(name).ok_or_else(|| unknown_session(name))
}

fn unknown_session(name: &str) -> ProtocolError {
    ProtocolError::new(
        ErrorCode::BadRequest,
        format!("session `{name}`: this daemon has no such session"),
    )
}
