//! Event records: one line of the run's event log (`RUN_DIR/events.jsonl`), written by the
//! daemon (`metfs::events::EventLog`) and read by `metfs report`.
//!
//! Every record has `"v"`, `t` (Unix seconds) and `event`, its kind; the rest depends on the
//! kind. A kind this build does not know reads as [`Event::Other`] (a newer daemon may add
//! kinds within a version; a reader skips them).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Choice, NotResumed, PolicyKind, Version};
use metfs_feedback::policy::Verdict;

/// One line of the event log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Record {
    /// The protocol version.
    #[serde(default)]
    pub v: Version,
    /// When, in Unix seconds.
    pub t: f64,
    /// What happened.
    #[serde(flatten)]
    pub event: Event,
}

/// What happened, by its `event` kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The daemon started (a second `start` in one log is a restart).
    Start(Start),
    /// A pass over the current mini-epoch ended.
    PassEnd(PassEnd),
    /// The answer to a pass end: repeat, advance or wait.
    Decision(DecisionEvent),
    /// A mini-epoch finished staging.
    Staged(Staged),
    /// Staging a mini-epoch failed; it is resumed after a pause.
    StageFailed(StageFailed),
    /// Samples the tier could not give in time were left out of a mini-epoch, carried into a
    /// later one.
    Deferred(Deferred),
    /// Deferred samples a later mini-epoch's staging gave.
    Recovered(Recovered),
    /// The view advanced to the next mini-epoch.
    Switch(Switch),
    /// The mini-epoch the view just left got more passes than its policy's rf: bonus passes
    /// while its successor was staged.
    StallRf(StallRf),
    /// The cumulative bytes read from the capacity tier (every few seconds while it grows).
    Tier(Tier),
    /// A shared mount's restart could not resume a saved job's place: it starts over.
    JobNotResumed(NotResumed),
    /// A job's readers held more of its retired views than `share.held_open_cap` allows: the
    /// oldest were taken back.
    HeldOpenCapped(HeldOpenCapped),
    /// A kind this build does not know; skipped by readers.
    #[serde(other)]
    #[schemars(skip)]
    Other,
}

/// `start`: the daemon's dataset and plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Start {
    /// Bytes in this node's catalog.
    pub dataset_bytes: u64,
    /// Samples in this node's catalog.
    pub dataset_files: u64,
    /// Mini-epochs per epoch.
    pub mini_epochs: u32,
    /// Bytes in the first view.
    pub view_bytes: u64,
    /// The rf policy.
    pub rf_policy: PolicyKind,
    /// The cache budget.
    pub budget_bytes: u64,
    /// This node's rank.
    pub node_rank: u32,
    /// Nodes in the job.
    pub nodes: u32,
    /// The position the daemon starts (or resumes) at.
    pub epoch: u64,
    /// The mini-epoch it starts at.
    pub mini_epoch: u32,
}

/// `pass_end`: one pass over the current mini-epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PassEnd {
    /// The current epoch.
    pub epoch: u64,
    /// The current mini-epoch.
    pub mini_epoch: u32,
    /// Mini-epochs served so far in the run (the mini-epoch's number in the run).
    pub sequence: u64,
    /// The pass's number over this mini-epoch, from 1.
    pub pass: u32,
    /// What the policy wants (the decision event says what happened).
    pub verdict: Verdict,
    /// The pass's score, for policies that compute one.
    pub score: Option<f64>,
    /// Bytes in the view (each pass reads the whole view once).
    pub view_bytes: u64,
    /// The pass's duration in seconds (`null` in logs written before it was measured).
    #[serde(default)]
    pub secs: Option<f64>,
}

/// `decision`: the answer to the pass end just before it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DecisionEvent {
    /// Repeat, advance or wait.
    pub decision: Choice,
}

/// `staged`: a mini-epoch is staged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Staged {
    /// Its epoch.
    pub epoch: u64,
    /// The mini-epoch.
    pub mini_epoch: u32,
    /// Its bytes.
    pub bytes: u64,
    /// Bytes fetched from the tier for it (less than `bytes` on a resume).
    pub bytes_fetched: u64,
    /// Bytes taken from the node's store instead of the tier (0 in logs written before
    /// samples were reused).
    #[serde(default)]
    pub bytes_reused: u64,
    /// Seconds staging took (in aggregate mode, the wait for the exchange included).
    pub secs: f64,
}

/// `stage_failed`: staging a mini-epoch failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StageFailed {
    /// Its epoch.
    pub epoch: u64,
    /// The mini-epoch.
    pub mini_epoch: u32,
    /// Why.
    pub error: String,
    /// The cache's file system is full.
    pub out_of_space: bool,
    /// Failures in a row.
    pub failures: u32,
    /// Seconds until staging resumes.
    pub retry_in_secs: u64,
}

/// `deferred`: a deferring staging left samples out, carried into a later mini-epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Deferred {
    /// The mini-epoch staged without them: its epoch.
    pub epoch: u64,
    /// The mini-epoch.
    pub mini_epoch: u32,
    /// How many.
    pub samples: u64,
    /// The first ten, by path.
    pub paths: Vec<String>,
    /// The tier's error for the first.
    pub error: String,
    /// How far the carried samples moved the mini-epoch's composition, where it is stratified
    /// or clustered; absent otherwise, or where no class moved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_shift: Option<ClassShift>,
}

/// How far deferral moved one mini-epoch's mix of classes (or clusters) from its plan: the
/// class whose count moved most, by how many samples (more: carried in; fewer: left out). A
/// stratified plan holds each class within one sample of its share in every mini-epoch; a
/// shift of `s` samples puts that class at most `s` past its bound.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ClassShift {
    /// The class (or cluster) by name.
    pub class: String,
    /// The samples of it the view holds beyond (positive) or short of (negative) its plan.
    pub samples: i64,
    /// The classes whose count moved at all.
    pub classes_moved: u64,
}

/// `recovered`: deferred samples a staging gave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Recovered {
    /// The mini-epoch they were staged in: its epoch.
    pub epoch: u64,
    /// The mini-epoch.
    pub mini_epoch: u32,
    /// How many.
    pub samples: u64,
    /// The first ten, by path.
    pub paths: Vec<String>,
    /// How far the carried samples moved the mini-epoch's composition (see
    /// [`Deferred::class_shift`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_shift: Option<ClassShift>,
}

/// `held_open_capped`: a job's readers (a frozen reader keeping old files open) held more of
/// its retired views than its cap; the oldest were taken back, so their slots can go (a read
/// of them answers EIO from now on).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HeldOpenCapped {
    /// The job.
    pub job: String,
    /// Bytes of its retired views its readers held, before.
    pub held_bytes: u64,
    /// Its cap (`share.held_open_cap` of its share).
    pub cap_bytes: u64,
    /// The views taken back, by generation (oldest first), and their bytes.
    pub generations: Vec<u64>,
    pub revoked_bytes: u64,
    /// Bytes of held views the daemon cannot take back (read through passthrough opens or
    /// leased direct paths, which the kernel or the reader holds itself).
    pub unrevocable_bytes: u64,
    /// The processes holding those views, where the kernel named them at their opens (not
    /// on the cached path, where it sends no `open`).
    #[serde(default)]
    pub pids: Vec<u32>,
}

/// `switch`: the view advanced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Switch {
    /// The new epoch.
    pub epoch: u64,
    /// The new mini-epoch.
    pub mini_epoch: u32,
    /// The new view's generation.
    pub generation: u64,
    /// The new mini-epoch's number in the run.
    pub sequence: u64,
    /// Passes the previous mini-epoch got: its effective rf, bonus passes included (above
    /// the policy's rf when a `stall_rf` event precedes this one).
    pub prev_rf: u32,
    /// The pass at which its policy first wanted to advance.
    pub prev_wanted_rf: Option<u32>,
}

/// `stall_rf`: bonus passes raised a mini-epoch's rf above its policy's. Written once per such
/// mini-epoch, just before the `switch` that leaves it, so that the effective rf it carries is
/// final (while it grows, `metfs status` shows it: `pass` and `mini_epoch_bonus_passes`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StallRf {
    /// The mini-epoch's epoch.
    pub epoch: u64,
    /// The mini-epoch.
    pub mini_epoch: u32,
    /// Its number in the run.
    pub sequence: u64,
    /// The passes it would have got with its successor staged in time: the pass at which its
    /// policy wanted to advance (`--rf` for `fixed`).
    pub policy_rf: u32,
    /// The passes it got: `policy_rf` plus `bonus_passes`.
    pub effective_rf: u32,
    /// Pass ends answered `wait` because its successor was not staged.
    pub bonus_passes: u32,
    /// ceil(EB1 / B2), the smallest rf that would not have waited, once both are measured.
    pub stall_free_rf: Option<u32>,
}

/// `tier`: cumulative bytes read from the capacity tier since the daemon started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Tier {
    /// The bytes.
    pub tier_bytes_read: u64,
}
