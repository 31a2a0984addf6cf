//! A session: one consumer's place in the run. It holds the position (epoch, mini-epoch, pass),
//! the plan it follows, its rf policy and rf history, the meter of its passes, the staging of
//! its successor, and its current view. The daemon keeps sessions in a [`Sessions`] map keyed
//! by name; a mount has the one [`DEFAULT_SESSION`] today, and no code path assumes it is the
//! only one: every operation names the session it acts on.

use crate::daemon::deferred::Deferred;
use crate::daemon::fingerprint::{Fingerprint, SavedFingerprint};
use crate::daemon::schedule::Schedule;
use crate::daemon::state::SavedState;
use crate::daemon::store::Store;
use metfs_feedback::history::{HistoryStore, MiniEpochRecord, Replay, RunId};
use metfs_feedback::policy::{JobSignals, PassState, RfPolicy};
use metfs_fs::lock_order::OrderedMutex;
use metfs_fs::view::View;
use metfs_prefetcher::stager::{Progress, StageReport};
use metfs_protocol::{Choice, Decision, ErrorCode, Metrics, ProtocolError};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a staging's deferred samples came to ([`Session::deferred_staged`]).
pub(super) struct Carry {
    /// Carried samples the staging was given to stage (recovered, or deferred again).
    pub(super) added: Vec<u32>,
    /// Deferred samples of the view, carried into the next mini-epochs.
    pub(super) carried: Vec<u32>,
    /// Carried samples the staging gave.
    pub(super) recovered: Vec<u32>,
    /// Deferred samples the view was not to show, left out for good.
    pub(super) extras: Vec<u32>,
}

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
        /// When the first of them happened: past `stager.defer_after_secs`, the next try
        /// defers what the tier still cannot give.
        since: Instant,
        /// How long after `at` it is staged again.
        pause: Duration,
    },
}

/// One consumer's state (see the module doc).
pub(super) struct Session {
    /// The key of this session in [`Sessions`].
    name: String,
    /// Where its mini-epochs come from: the run mode's part of the session.
    schedule: Schedule,
    /// Where the position is saved, with the fingerprint saved beside it: `None` for a job of
    /// a shared mount, whose position is not saved (the `share` module).
    persist: Option<Persist>,
    // The position: read through its getters, changed only by the transitions below.
    epoch: u64,
    mini_epoch: u32,
    passes: u32,
    generation: u64,
    sequence: u64,
    advance_wanted: bool,
    bonus_passes: u64,
    next: Next,
    policy: Box<dyn RfPolicy>,
    record: MiniEpochRecord,
    history: Option<History>,
    /// The job key of the rf history.
    job: String,
    meter: Meter,
    /// The view this session reads now: the one the filesystem core serves for it.
    view: Arc<View>,
    /// Samples the tier could not give in time, carried into later mini-epochs.
    deferred: Deferred,
}

/// The mini-epoch a switch left ([`Session::switch_to`]).
pub(super) struct Left {
    /// It was the empty view a job of a shared mount joined with: nothing to record.
    pub(super) from_lobby: bool,
    /// Its queue batch, if it still needs its DONE mark.
    pub(super) batch: Option<metfs_dds::Batch>,
    pub(super) epoch: u64,
    pub(super) mini_epoch: u32,
    pub(super) sequence: u64,
    /// Passes over it (0 from the lobby), and how many were bonus passes.
    pub(super) passes: u32,
    pub(super) bonus: u32,
    /// Its record for the rf history.
    pub(super) record: MiniEpochRecord,
}

/// Where a new session starts: its position, generation and the mini-epochs it has switched
/// (a resumed session's own, a new one's 0).
pub(super) struct Start {
    pub(super) epoch: u64,
    pub(super) mini_epoch: u32,
    pub(super) passes: u32,
    pub(super) generation: u64,
    pub(super) sequence: u64,
}

/// Where a session's position is saved, and the fingerprint of the plan it follows.
pub(super) struct Persist {
    /// Everything the plan depends on; saved with the position.
    pub(super) fingerprint: Fingerprint,
    /// The state file (`CACHE/state.json` for the default session).
    pub(super) file: PathBuf,
}

/// The sessions of a daemon, by name.
pub(super) type Sessions = BTreeMap<String, Session>;

/// The rf history of a session: the store, the dataset key, and the run being recorded. The
/// store is the daemon's one copy of the history file, shared by the jobs of a shared mount
/// (each records its own run), so that no job's write drops another's records.
pub(super) struct History {
    pub(super) store: Arc<OrderedMutex<HistoryStore>>,
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
    /// A session named `name` recording its rf history as job `job`, starting at `start` with
    /// `view` current and nothing staged.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        name: String,
        job: String,
        schedule: Schedule,
        persist: Option<Persist>,
        start: Start,
        policy: Box<dyn RfPolicy>,
        history: Option<History>,
        view: Arc<View>,
    ) -> Self {
        Self {
            name,
            schedule,
            persist,
            epoch: start.epoch,
            mini_epoch: start.mini_epoch,
            passes: start.passes,
            generation: start.generation,
            sequence: start.sequence,
            advance_wanted: false,
            bonus_passes: 0,
            next: Next::Idle,
            policy,
            record: MiniEpochRecord::begin(start.sequence, start.epoch, start.mini_epoch),
            history,
            job,
            meter: Meter::new(),
            deferred: Deferred::default(),
            view,
        }
    }

    /// The current (epoch, mini-epoch).
    pub(super) fn position(&self) -> (u64, u32) {
        (self.epoch, self.mini_epoch)
    }

    /// Its key in [`Sessions`] (a shared mount's job name).
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// Where its mini-epochs come from.
    pub(super) fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Its schedule, for what a mode's own code hands it (a cohort's draws, a queue's marks).
    pub(super) fn schedule_mut(&mut self) -> &mut Schedule {
        &mut self.schedule
    }

    /// Its rf policy.
    pub(super) fn policy(&self) -> &dyn RfPolicy {
        &*self.policy
    }

    /// The record of the current mini-epoch for the rf history.
    pub(super) fn record(&self) -> &MiniEpochRecord {
        &self.record
    }

    /// Its rf history, if the mount records one.
    pub(super) fn history(&self) -> Option<&History> {
        self.history.as_ref()
    }

    /// The job key of its rf history.
    pub(super) fn job(&self) -> &str {
        &self.job
    }

    /// The measurements of its passes and stagings.
    pub(super) fn meter(&self) -> &Meter {
        &self.meter
    }

    /// The view it reads now (changed only by [`Session::switch_to`]).
    pub(super) fn view(&self) -> &Arc<View> {
        &self.view
    }

    /// Its epoch.
    pub(super) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Its mini-epoch (a job's view sequence).
    pub(super) fn mini_epoch(&self) -> u32 {
        self.mini_epoch
    }

    /// Passes completed over the current view.
    pub(super) fn passes(&self) -> u32 {
        self.passes
    }

    /// The current view's generation.
    pub(super) fn generation(&self) -> u64 {
        self.generation
    }

    /// Views switched to so far (the rf history's and the event log's sequence).
    pub(super) fn sequence(&self) -> u64 {
        self.sequence
    }

    /// Whether the policy or a client asked to move on, and the switch has not happened yet.
    pub(super) fn advance_wanted(&self) -> bool {
        self.advance_wanted
    }

    /// Pass ends answered `wait` since the start.
    pub(super) fn bonus_passes(&self) -> u64 {
        self.bonus_passes
    }

    // The transitions: the only writers of the position.

    /// A pass over the current view ended; returns the passes over it now.
    pub(super) fn end_pass(&mut self) -> u32 {
        self.passes += 1;
        self.passes
    }

    /// The policy's decision on the pass ending now, with `metrics`; the pass is not counted
    /// yet ([`Session::pass_ended`] does, once the decision stands).
    ///
    /// The policy also sees whether the successor is staged, the stall-free rf
    /// (`stall_free_rf`, once measured), the job's `signals` and the metric `val_loss`.
    pub(super) fn decide(
        &mut self,
        metrics: &Metrics,
        signals: JobSignals,
        stall_free_rf: Option<u32>,
    ) -> Result<metfs_feedback::policy::PolicyDecision, metfs_feedback::policy::PolicyError> {
        let state = PassState {
            next_ready: Some(self.next_ready()),
            stall_free_rf,
            ..signals.state(self.passes + 1, self.sequence, metrics)
        };
        self.policy.on_pass_end(metrics, &state)
    }

    /// A pass of `secs` ended with `metrics` and the policy's `decision`: counted, recorded
    /// for the rf history and timed (the last 16 passes), and the next pass starts now.
    pub(super) fn pass_ended(
        &mut self,
        metrics: &Metrics,
        decision: &metfs_feedback::policy::PolicyDecision,
        secs: f64,
    ) {
        self.end_pass();
        self.record.add_pass(metrics, decision);
        self.meter.pass_started = Instant::now();
        self.meter.pass_secs.push_back(secs);
        if self.meter.pass_secs.len() > 16 {
            self.meter.pass_secs.pop_front();
        }
    }

    /// The next pass starts now (time blocked for a staging is not part of a pass).
    pub(super) fn restart_pass_clock(&mut self) {
        self.meter.pass_started = Instant::now();
    }

    /// The client waited `secs` for a staging.
    pub(super) fn blocked_for(&mut self, secs: f64) {
        self.meter.blocked_secs += secs;
    }

    /// EB1: bytes the job reads per second, from the view's size and the pass durations.
    pub(super) fn eb1(&self) -> Option<f64> {
        let mean = self.meter.mean_pass()?;
        (mean > 0.0).then(|| self.view.bytes() as f64 / mean)
    }

    /// The stall-free rf once EB1 and B2 are measured (the model's
    /// [`metfs_plan::model::stall_free_rf`], the one definition).
    pub(super) fn stall_free_rf(&self) -> Option<u32> {
        metfs_plan::model::stall_free_rf(self.eb1()?, self.meter.b2()?)
    }

    /// Warns when a fixed `rf` is below the stall-free rf: the job will wait for staging.
    /// Once, then again only when the stall-free rf has doubled: the estimate moves with every
    /// pass, and a warning per pass (seen: hundreds a second with short passes) buries the log.
    pub(super) fn check_stall_free(&mut self, fixed_rf: Option<u32>) {
        let (Some(sf), Some(rf)) = (self.stall_free_rf(), fixed_rf) else {
            return;
        };
        let due = self
            .meter
            .warned_rf
            .is_none_or(|w| sf >= w.saturating_mul(2));
        if rf < sf && due {
            self.meter.warned_rf = Some(sf);
            tracing::warn!(
                rf,
                stall_free_rf = sf,
                "the fixed rf is below the stall-free rf ceil(EB1/B2): the job will wait for staging (bonus passes); raise --rf or the tier bandwidth"
            );
        }
    }

    /// The answer to `pass_end`, `advance` and `apply`: `choice` and the position after it.
    pub(super) fn decision(&self, choice: Choice) -> Decision {
        Decision {
            decision: choice,
            generation: self.generation,
            epoch: self.epoch,
            mini_epoch: self.mini_epoch,
            mini_epochs: self.schedule.mini_epochs(),
            pass: self.passes,
            rf: self.policy.expected_rf(),
            next_ready: self.next_ready(),
            reason: None,
        }
    }

    /// Takes job key `job` for its rf history, recording as `run` (replaying `replay`) and,
    /// for a learned policy, deciding by `policy` from now on. Only before anything of the
    /// run is recorded (the caller checks).
    pub(super) fn rekey(
        &mut self,
        job: String,
        run: Option<(RunId, Option<Replay>)>,
        policy: Option<Box<dyn RfPolicy>>,
    ) {
        if let (Some(h), Some((run, replay))) = (self.history.as_mut(), run) {
            h.run = run;
            h.replay = replay;
        }
        if let Some(p) = policy {
            self.policy = p;
        }
        self.job = job;
    }

    /// The session should move on at the first chance (a policy's verdict, `advance`).
    pub(super) fn want_advance(&mut self) {
        self.advance_wanted = true;
    }

    /// A pass end wanted to move on and the successor was not ready: the job repeats its
    /// view once more.
    pub(super) fn take_bonus_pass(&mut self) {
        self.bonus_passes += 1;
        self.meter.mini_epoch_bonus += 1;
    }

    /// The staging of its successor `target` into `slot` began.
    pub(super) fn staging_started(
        &mut self,
        target: (u64, u32),
        slot: String,
        progress: Arc<Progress>,
    ) {
        self.next = Next::Staging {
            target,
            slot,
            progress,
            started: Instant::now(),
        };
    }

    /// The staging of its successor ended with `next` (ready, or failed); a staged slot
    /// counts in the meter's B2.
    pub(super) fn staging_ended(&mut self, next: Next) {
        if let Next::Ready { report, .. } = &next {
            let secs = report.elapsed.as_secs_f64();
            self.meter.staged_bytes += report.bytes_fetched;
            self.meter.staged_secs += secs;
            if report.bytes_fetched > 0 && secs > 0.0 {
                self.meter.last_b2 = Some(report.bytes_fetched as f64 / secs);
            }
        }
        self.next = next;
    }

    /// The staging of its successor, if any.
    pub(super) fn next(&self) -> &Next {
        &self.next
    }

    /// The switch to mini-epoch `succ`, shown by `view`: the schedule retires the old
    /// mini-epoch, the meter counts it, the position moves on by one view, and the staging
    /// and the policy start over. Returns what was left, for the event log, the rf history
    /// and the queue.
    pub(super) fn switch_to(&mut self, succ: (u64, u32), view: Arc<View>) -> Left {
        // A job of a shared mount leaving the empty view it joined with has no mini-epoch to
        // record.
        let from_lobby = self.schedule.before_first_view();
        let batch = self.schedule.retire(self.mini_epoch);
        let passes = if from_lobby { 0 } else { self.passes };
        let bonus = self.meter.mini_epoch_bonus;
        self.meter.end_mini_epoch(passes);
        let left = (self.epoch, self.mini_epoch, self.sequence);
        self.generation = view.generation;
        self.view = view;
        self.epoch = succ.0;
        self.mini_epoch = succ.1;
        self.passes = 0;
        self.advance_wanted = false;
        self.sequence += 1;
        let fresh = MiniEpochRecord::begin(self.sequence, succ.0, succ.1);
        let record = std::mem::replace(&mut self.record, fresh);
        self.next = Next::Idle;
        self.policy.on_advance();
        Left {
            from_lobby,
            batch,
            epoch: left.0,
            mini_epoch: left.1,
            sequence: left.2,
            passes,
            bonus,
            record,
        }
    }

    /// The mini-epoch after the current one, once it is known (module docs of `schedule`).
    pub(super) fn successor(&self) -> Option<(u64, u32)> {
        self.schedule.successor(self.position())
    }

    /// The samples of mini-epoch `target` and their footprint, with the deferred samples that
    /// fit in its slot.
    pub(super) fn members(&mut self, store: &Store, target: (u64, u32)) -> (Vec<u32>, u64) {
        let (mut samples, mut bytes) = self.schedule.members(store, target);
        let slot = store.budget().slot_bytes;
        self.deferred
            .add_to(target, &mut samples, &mut bytes, slot, |id| {
                store.footprint(&[id])
            });
        (samples, bytes)
    }

    /// The samples the view of mini-epoch `target` shows (the deferred ones staged with it
    /// included).
    pub(super) fn view_members(&mut self, store: &Store, target: (u64, u32)) -> Vec<u32> {
        let mut members = self.schedule.view_members(store, target);
        let added = self.deferred.added_to(target);
        if !added.is_empty() {
            members.extend_from_slice(added);
            members.sort_unstable();
            members.dedup();
        }
        members
    }

    /// Carries on what a saved position carried (at a resume, before the first staging's
    /// outcome is handed to [`Session::deferred_staged`]).
    pub(super) fn resume_deferred(&mut self, carried: Deferred) {
        self.deferred = carried;
    }

    /// The deferred samples after a staging of mini-epoch `target` (its slot's `members`)
    /// that left out `deferred`: those its view was to show are carried on; the others (an
    /// aggregate node's extras, kept only for the exchange) are left out for good; the
    /// carried ones it gave are recovered.
    pub(super) fn deferred_staged(
        &mut self,
        store: &Store,
        target: (u64, u32),
        members: &[u32],
        deferred: &[u32],
    ) -> Carry {
        // Nearly every staging defers nothing: the view's members (a set as large as the view)
        // are asked for only when something was deferred.
        let (carried, extras): (Vec<u32>, Vec<u32>) = if deferred.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            let shown: std::collections::HashSet<u32> =
                self.view_members(store, target).into_iter().collect();
            deferred.iter().partition(|id| shown.contains(id))
        };
        let recovered = self.deferred.staged(members, &carried);
        Carry {
            added: self.deferred.added_to(target).to_vec(),
            carried,
            recovered,
            extras,
        }
    }

    /// The footprint of the samples carried now (what a mini-epoch must leave room for).
    pub(super) fn carried_bytes(&self, store: &Store) -> u64 {
        store.footprint(&self.deferred.carried_ids())
    }

    /// Samples carried now, deferrals so far, carried samples recovered.
    pub(super) fn deferred_counts(&self) -> (u64, u64, u64) {
        let (d, r) = self.deferred.totals();
        (self.deferred.carried(), d, r)
    }

    /// The slot of mini-epoch `target`.
    pub(super) fn slot_of(&self, target: (u64, u32)) -> String {
        self.schedule.slot_of(target)
    }

    /// Whether the successor is staged and the view can switch to it now.
    pub(super) fn next_ready(&self) -> bool {
        matches!(&self.next, Next::Ready { target, .. } if Some(*target) == self.successor())
    }

    /// The slot this session is staging now, if any.
    pub(super) fn staging_slot(&self) -> Option<&str> {
        match &self.next {
            Next::Staging { slot, .. } => Some(slot),
            _ => None,
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
            deferred: self.deferred.saved(),
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
