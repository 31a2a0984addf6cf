//! rf history: what rf each mini-epoch of each run used, kept so a later run can replay it.
//!
//! The paper asks to "remember the optimal strategy for given dataset and model, so this gets
//! automatically reflected in subsequent training runs". [`HistoryStore`] is that memory: one
//! JSON file holding runs, each keyed by a dataset key and a job key, each a list of
//! [`MiniEpochRecord`]s (sequence index, epoch, mini-epoch index, rf, the score of every pass,
//! the last value of every metric the job sent, the decision and reason at the last pass,
//! timestamps). [`HistoryStore::replay`] picks the earlier run to replay and turns it into the
//! rf sequence that `learned` replays.
//!
//! Which run: the *best* run by a [`ReplayMetric`] (the `learned_metric` setting, or the
//! score's first term), compared by each run's final value of it (its value in the last
//! mini-epoch that recorded it), among the finished runs that recorded it or, when none of
//! those finished, among all that did (a plain mount's runs never finish; a shared mount's job
//! finishes its run by leaving, and a job killed at its time limit never does). When no run
//! recorded the metric, the latest finished run; when none finished either, the one that got
//! furthest. The choice and its reason ([`Replay`]) are recorded on the run that
//! replays it (`replayed`) and shown by `metfs status`.
//!
//! Keys are opaque strings chosen by the daemon. The dataset key should change whenever the
//! sequence of mini-epochs would (source, catalog identity, budget, planning strategy, node
//! count), because a schedule is indexed by mini-epoch sequence, and only then (not with the
//! seed or the node's rank, which change what a mini-epoch holds); the job key is what the client
//! says in `hello` (e.g. the model name). A file whose runs are all for other keys is valid and
//! simply has no schedule for this one.
//!
//! Invariants:
//!
//! * **Writes are atomic**: [`HistoryStore::save`] writes a temporary file in the same
//!   directory, fsyncs it, renames it over the old file and fsyncs the directory. A crash leaves
//!   the old file or the new one, never a mix, and no temporary file survives a failed save.
//! * **Nothing is lost, nothing crashes**: a file that cannot be parsed (corrupt, truncated,
//!   another format, a newer format version) is renamed aside to `<name>.corrupt-<unix ms>`
//!   and [`HistoryStore::open`] returns an empty store plus a warning naming both files. Only
//!   an I/O failure (permission denied, renaming aside impossible) is an error, because then
//!   the old file could not be kept.
//! * **Restarts**: the store holds no state outside the file. A restarted daemon opens the file
//!   again and either continues its run ([`HistoryStore::resume_or_start`] with the run id it
//!   kept, e.g. in its staging journal) or starts a new one. Recording a mini-epoch whose
//!   sequence the run already has replaces that record, so re-recording after a restart does
//!   not duplicate it.
//! * **Bounded size**: at most [`MAX_RUNS_PER_KEY`] runs are kept per (dataset, job), plus
//!   the runs kept for replay; starting another drops the oldest, never the one the latest
//!   run replayed (the best so far) nor the latest finished one.
//! * **One writer per file**: the store rewrites the whole file; two daemons sharing one
//!   history file would overwrite each other's runs (give each its own file, or let only the
//!   deciding rank record).
//!
//! File format (compact JSON, one object):
//!
//! ```json
//! {"format":"metfs-rf-history","version":1,"next_run_id":2,"runs":[
//!   {"id":1,"dataset":"…","job":"resnet50","started_unix_ms":…,"updated_unix_ms":…,
//!    "finished":true,"mini_epochs":[
//!      {"sequence":0,"epoch":0,"mini_epoch":0,"rf":5,"wanted_rf":4,
//!       "scores":[1.2,1.1,1.1,1.15,1.1],"metrics":{"loss":0.6,"val_accuracy":0.55},
//!       "verdict":"advance","reason":{"policy":"score",…},
//!       "started_unix_ms":…,"ended_unix_ms":…}]},
//!   {"id":2,…,"replayed":{"run":1,"mini_epochs":40,"why":"best","metric":"min:loss",
//!    "value":0.21,"finished":true,"compared":1},"mini_epochs":[…]}]}
//! ```
//!
//! `metrics` and `replayed` may be absent (a job that sends no metrics, a run that replays
//! nothing, a file written before they were recorded).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

use crate::policy::{PolicyDecision, ReplayMetric, Verdict};
use crate::Metrics;

/// The `format` field of a history file.
pub const FORMAT: &str = "metfs-rf-history";
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Runs kept per (dataset key, job key): enough to compare a few recent runs, few enough that
/// the whole-file rewrite at every mini-epoch stays cheap (a run of 1000 mini-epochs at rf 128
/// is a few MB of scores).
pub const MAX_RUNS_PER_KEY: usize = 8;

/// Errors of the history module.
#[derive(Debug, Error)]
pub enum HistoryError {
    /// Reading, renaming or writing a history file failed.
    #[error("rf history {path}: cannot {op}: {source}")]
    Io {
        /// The file concerned.
        path: PathBuf,
        /// What was being done (`read`, `keep aside`, `write`, ...).
        op: &'static str,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The store could not be encoded as JSON.
    #[error("rf history {path}: cannot encode: {source}")]
    Encode {
        /// The file being written.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: serde_json::Error,
    },
    /// A run id that the store does not hold.
    #[error("rf history has no run {0}")]
    UnknownRun(RunId),
    /// The `learned_metric` setting names a metric that the earlier runs, which did record
    /// metrics, never recorded: most likely a misspelt or renamed metric, which would
    /// otherwise silently replay the latest run instead of the best.
    #[error(
        "rf policy config `learned_metric`: `{setting}` ranks earlier runs by metric `{metric}`, \
         which no earlier run of job `{job}` on this dataset recorded (they recorded: \
         {recorded}); name one of those, or leave `learned_metric` unset to rank by the first \
         score term"
    )]
    UnrecordedMetric {
        /// The setting's value as given (`max:val_accuracy`).
        setting: String,
        /// The metric it reads.
        metric: String,
        /// The job key whose runs were searched.
        job: String,
        /// The metric names those runs did record, comma-separated.
        recorded: String,
    },
}

/// Identifies a run within one history file (ids grow and are never reused in that file).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(transparent)]
pub struct RunId(pub u64);

impl std::fmt::Display for RunId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What happened in one mini-epoch of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MiniEpochRecord {
    /// Position of the mini-epoch in the run (0, 1, 2, ... across epochs); the index a
    /// replayed schedule uses.
    pub sequence: u64,
    /// The epoch it belongs to.
    pub epoch: u64,
    /// Its index within the epoch.
    pub mini_epoch: u32,
    /// Passes actually run over it (the policy's wish, plus any passes spent waiting for the
    /// next mini-epoch to be staged).
    pub rf: u32,
    /// The pass at which the (bounded) policy first said advance; `None` if it never did (a
    /// forced advance). What `learned` replays, since passes spent waiting for staging are a
    /// property of that run's storage, not of the training.
    #[serde(default)]
    pub wanted_rf: Option<u32>,
    /// The score of each pass, in order (`null` for policies without a score).
    pub scores: Vec<Option<f64>>,
    /// The last value of each metric the job sent during the mini-epoch (a metric sent only
    /// at some passes, like a validation accuracy, keeps its latest value). What `learned`
    /// ranks runs by; kept per mini-epoch rather than per pass so the file grows with the
    /// mini-epochs, not with the passes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, f64>,
    /// The policy's verdict at the last pass.
    pub verdict: Option<Verdict>,
    /// The policy's reason at the last pass.
    #[serde(default)]
    pub reason: Value,
    /// When the first pass began to be counted (the record was begun), Unix milliseconds.
    pub started_unix_ms: u64,
    /// When the last pass was added, Unix milliseconds.
    pub ended_unix_ms: u64,
}

impl MiniEpochRecord {
    /// Begins the record of a mini-epoch the view has just switched to.
    pub fn begin(sequence: u64, epoch: u64, mini_epoch: u32) -> Self {
        let now = now_unix_ms();
        Self {
            sequence,
            epoch,
            mini_epoch,
            rf: 0,
            wanted_rf: None,
            scores: Vec::new(),
            metrics: BTreeMap::new(),
            verdict: None,
            reason: Value::Null,
            started_unix_ms: now,
            ended_unix_ms: now,
        }
    }

    /// Adds a pass: the metrics the job sent for it and the decision the (bounded) policy made.
    pub fn add_pass(&mut self, metrics: &Metrics, decision: &PolicyDecision) {
        // A non-finite number cannot be written as JSON; the protocol refuses such metrics and
        // policies never produce such a score, but a record must stay encodable whatever it
        // is fed.
        self.scores.push(decision.score.filter(|s| s.is_finite()));
        for (name, value) in metrics {
            if value.is_finite() {
                self.metrics.insert(name.clone(), *value);
            }
        }
        self.rf = u32::try_from(self.scores.len()).unwrap_or(u32::MAX);
        if decision.verdict == Verdict::Advance && self.wanted_rf.is_none() {
            self.wanted_rf = Some(self.rf);
        }
        self.verdict = Some(decision.verdict);
        self.reason = decision.reason.to_json();
        self.ended_unix_ms = now_unix_ms();
    }

    /// The rf a replay uses for this mini-epoch: `wanted_rf`, else `rf`.
    pub fn replay_rf(&self) -> u32 {
        self.wanted_rf.unwrap_or(self.rf)
    }
}

/// One run: a daemon's training job over one dataset, from its first mini-epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The run's id.
    pub id: RunId,
    /// Dataset key.
    pub dataset: String,
    /// Job key.
    pub job: String,
    /// When the run started, Unix milliseconds.
    pub started_unix_ms: u64,
    /// When the run was last recorded to, Unix milliseconds.
    pub updated_unix_ms: u64,
    /// Whether the run ended normally ([`HistoryStore::finish_run`]).
    #[serde(default)]
    pub finished: bool,
    /// The earlier run this one replayed (a `learned` run) and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replayed: Option<Replay>,
    /// Its mini-epochs, sorted by sequence, one per sequence.
    pub mini_epochs: Vec<MiniEpochRecord>,
}

impl RunRecord {
    /// The replayable schedule: `replay_rf` of mini-epochs 0, 1, 2, ... up to the first gap in
    /// the sequence (a schedule is indexed by sequence, so nothing after a gap can be placed)
    /// or the first record with rf 0.
    pub fn schedule(&self) -> Vec<u32> {
        self.mini_epochs
            .iter()
            .enumerate()
            .take_while(|(i, r)| r.sequence == *i as u64 && r.replay_rf() > 0)
            .map(|(_, r)| r.replay_rf())
            .collect()
    }

    /// The run's final value of metric `name`: its value in the last mini-epoch that recorded
    /// it.
    pub fn final_metric(&self, name: &str) -> Option<f64> {
        self.mini_epochs
            .iter()
            .rev()
            .find_map(|m| m.metrics.get(name).copied())
    }

    /// The run's final value of `metric`'s term (`1 - accuracy` from `accuracy`).
    fn final_value(&self, metric: &ReplayMetric) -> Option<f64> {
        self.final_metric(metric.term().metric())
            .map(|v| metric.term().apply(v))
    }
}

/// Why `learned` replays the run it replays ([`Replay::why`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReplayWhy {
    /// It has the best final value of the metric among the runs that recorded it: the
    /// finished ones, or all of them when none of those finished.
    Best,
    /// No run recorded the metric: the latest finished run.
    Latest,
    /// No run recorded the metric and none finished: the one that got furthest (ties: the
    /// latest).
    Furthest,
}

/// The earlier run `learned` replays and why: recorded on the replaying run (`replayed` in
/// the history file) and reported by `status` (`replay`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Replay {
    /// The replayed run's id in the history file.
    pub run: RunId,
    /// Mini-epochs its schedule covers; the fallback policy decides after them.
    pub mini_epochs: u64,
    /// Why this run: `best`, `latest` (no run recorded the metric) or `furthest` (no run
    /// recorded it and none finished).
    pub why: ReplayWhy,
    /// The metric runs were ranked by, `min:TERM` or `max:TERM`.
    pub metric: String,
    /// The replayed run's final value of the metric; `null` if it did not record it.
    pub value: Option<f64>,
    /// Whether the replayed run ended normally (a shared mount's job that left).
    pub finished: bool,
    /// Runs that recorded the metric, among which the best was taken: the finished ones, or
    /// all of them when none finished (0 unless `why` is `best`).
    pub compared: u64,
}

impl fmt::Display for Replay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "run {} ({} mini-epochs): ", self.run, self.mini_epochs)?;
        match (self.why, self.value) {
            (ReplayWhy::Best, Some(v)) => write!(
                f,
                "the best final {} ({v}) of {} {} run(s) that recorded it",
                self.metric,
                self.compared,
                if self.finished {
                    "finished"
                } else {
                    "unfinished"
                }
            ),
            (ReplayWhy::Best, None) => write!(f, "the best final {}", self.metric),
            (ReplayWhy::Latest, _) => write!(
                f,
                "the latest finished run (no run recorded {})",
                self.metric
            ),
            (ReplayWhy::Furthest, _) => write!(
                f,
                "the one that got furthest (no run recorded {} and none finished)",
                self.metric
            ),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct HistoryFile {
    format: String,
    version: u32,
    next_run_id: u64,
    runs: Vec<RunRecord>,
}

impl HistoryFile {
    fn empty() -> Self {
        Self {
            format: FORMAT.into(),
            version: FORMAT_VERSION,
            next_run_id: 1,
            runs: Vec::new(),
        }
    }
}

/// The rf history file, loaded in memory; [`HistoryStore::save`] writes it back.
#[derive(Debug)]
pub struct HistoryStore {
    path: PathBuf,
    file: HistoryFile,
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Parses a history file, or says why it cannot be used.
fn parse(bytes: &[u8]) -> Result<HistoryFile, String> {
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| format!("not valid JSON ({e})"))?;
    let format = value.get("format").and_then(Value::as_str);
    if format != Some(FORMAT) {
        return Err(format!(
            "not an rf history file (`format` is {}, expected \"{FORMAT}\")",
            value
                .get("format")
                .map_or("missing".into(), |v| v.to_string())
        ));
    }
    match value.get("version").and_then(Value::as_u64) {
        Some(v) if v == u64::from(FORMAT_VERSION) => {}
        Some(v) => {
            return Err(format!(
                "format version {v}, this build reads version {FORMAT_VERSION}"
            ))
        }
        None => return Err("`version` is missing or not a number".into()),
    }
    let mut file: HistoryFile =
        serde_json::from_value(value).map_err(|e| format!("malformed ({e})"))?;
    let mut ids = HashSet::new();
    for run in &mut file.runs {
        if !ids.insert(run.id) {
            return Err(format!("run id {} appears twice", run.id));
        }
        // Keep the sorted-by-sequence invariant even for a hand-edited file.
        run.mini_epochs.sort_by_key(|r| r.sequence);
        run.mini_epochs.dedup_by_key(|r| r.sequence);
    }
    // A hand-edited `next_run_id` must not make a new run reuse an id.
    let max_id = file.runs.iter().map(|r| r.id.0).max().unwrap_or(0);
    file.next_run_id = file.next_run_id.max(max_id + 1);
    Ok(file)
}

/// A name next to `path` that does not exist yet: `<name>.corrupt-<ms>[-n]`.
fn aside_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "history".into());
    let ts = now_unix_ms();
    let mut n = 0u32;
    loop {
        let candidate = if n == 0 {
            format!("{name}.corrupt-{ts}")
        } else {
            format!("{name}.corrupt-{ts}-{n}")
        };
        let p = path.with_file_name(candidate);
        if !p.exists() {
            return p;
        }
        n += 1;
    }
}

impl HistoryStore {
    /// Opens the history at `path`; a missing file is an empty history.
    ///
    /// A file that cannot be parsed is renamed aside (see the module docs) and the store starts
    /// empty; the returned warnings say so, naming both files. Only I/O failures are errors.
    pub fn open(path: impl AsRef<Path>) -> Result<(Self, Vec<String>), HistoryError> {
        let path = path.as_ref().to_path_buf();
        let mut warnings = Vec::new();
        let file = match fs::read(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => HistoryFile::empty(),
            Err(source) => {
                return Err(HistoryError::Io {
                    path,
                    op: "read",
                    source,
                })
            }
            Ok(bytes) => match parse(&bytes) {
                Ok(file) => file,
                Err(why) => {
                    let aside = aside_path(&path);
                    fs::rename(&path, &aside).map_err(|source| HistoryError::Io {
                        path: path.clone(),
                        op: "keep aside the unreadable file",
                        source,
                    })?;
                    warnings.push(format!(
                        "rf history {}: {why}; kept it aside as {} and started an empty history \
                         (learned schedules start over)",
                        path.display(),
                        aside.display()
                    ));
                    HistoryFile::empty()
                }
            },
        };
        Ok((Self { path, file }, warnings))
    }

    /// The file this store reads and writes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every run, oldest first.
    pub fn all_runs(&self) -> &[RunRecord] {
        &self.file.runs
    }

    /// The runs for (dataset, job), oldest first.
    pub fn runs<'a>(
        &'a self,
        dataset_key: &'a str,
        job_key: &'a str,
    ) -> impl Iterator<Item = &'a RunRecord> + 'a {
        self.file
            .runs
            .iter()
            .filter(move |r| r.dataset == dataset_key && r.job == job_key)
    }

    /// A run by id.
    pub fn run(&self, id: RunId) -> Option<&RunRecord> {
        self.file.runs.iter().find(|r| r.id == id)
    }

    fn run_mut(&mut self, id: RunId) -> Result<&mut RunRecord, HistoryError> {
        self.file
            .runs
            .iter_mut()
            .find(|r| r.id == id)
            .ok_or(HistoryError::UnknownRun(id))
    }

    /// Starts a new, empty run for (dataset, job) and returns its id. If the key then has more
    /// than [`MAX_RUNS_PER_KEY`] runs, the oldest are dropped, except the latest finished one
    /// (or the furthest, if none finished) and the one the key's latest replaying run
    /// replayed. Not saved until [`HistoryStore::save`].
    pub fn start_run(&mut self, dataset_key: &str, job_key: &str) -> RunId {
        // The best run by a metric is only known to the caller; the latest replaying run
        // recorded the best of its day, and a better one since is newer, so not the oldest.
        let keep = [
            self.fallback_run(dataset_key, job_key, None).map(|r| r.id),
            self.runs(dataset_key, job_key)
                .filter_map(|r| r.replayed.as_ref())
                .last()
                .map(|p| p.run),
        ];
        let id = RunId(self.file.next_run_id);
        self.file.next_run_id += 1;
        let now = now_unix_ms();
        self.file.runs.push(RunRecord {
            id,
            dataset: dataset_key.into(),
            job: job_key.into(),
            started_unix_ms: now,
            updated_unix_ms: now,
            finished: false,
            replayed: None,
            mini_epochs: Vec::new(),
        });
        let mut excess = self.runs(dataset_key, job_key).count();
        // Runs are in id order, oldest first, so dropping from the front drops the oldest.
        self.file.runs.retain(|r| {
            let drop = excess > MAX_RUNS_PER_KEY
                && r.dataset == dataset_key
                && r.job == job_key
                && !keep.contains(&Some(r.id))
                && r.id != id;
            if drop {
                excess -= 1;
            }
            !drop
        });
        id
    }

    /// Continues run `previous` if the store has it for the same (dataset, job), else starts a
    /// new run. Returns the run id and whether it was resumed.
    pub fn resume_or_start(
        &mut self,
        dataset_key: &str,
        job_key: &str,
        previous: Option<RunId>,
    ) -> (RunId, bool) {
        if let Some(id) = previous {
            if self
                .run(id)
                .is_some_and(|r| r.dataset == dataset_key && r.job == job_key)
            {
                return (id, true);
            }
        }
        (self.start_run(dataset_key, job_key), false)
    }

    /// Records a mini-epoch of `run`, replacing any record with the same sequence. Not saved
    /// until [`HistoryStore::save`].
    pub fn record_mini_epoch(
        &mut self,
        run: RunId,
        record: MiniEpochRecord,
    ) -> Result<(), HistoryError> {
        let r = self.run_mut(run)?;
        match r
            .mini_epochs
            .binary_search_by_key(&record.sequence, |m| m.sequence)
        {
            Ok(i) => r.mini_epochs[i] = record,
            Err(i) => r.mini_epochs.insert(i, record),
        }
        r.updated_unix_ms = now_unix_ms();
        Ok(())
    }

    /// Marks `run` as ended normally (only finished runs are ranked by [`HistoryStore::replay`]).
    pub fn finish_run(&mut self, run: RunId) -> Result<(), HistoryError> {
        let r = self.run_mut(run)?;
        r.finished = true;
        r.updated_unix_ms = now_unix_ms();
        Ok(())
    }

    /// The (dataset, job) pairs the store has runs for.
    pub fn keys(&self) -> Vec<(String, String)> {
        let mut keys: Vec<_> = self
            .file
            .runs
            .iter()
            .map(|r| (r.dataset.clone(), r.job.clone()))
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }

    /// Records on `run` which earlier run it replays and why (or that it replays none).
    pub fn set_replayed(&mut self, run: RunId, replay: Option<Replay>) -> Result<(), HistoryError> {
        self.run_mut(run)?.replayed = replay;
        Ok(())
    }

    /// The runs of (dataset, job) but `exclude` that have something to replay.
    fn replayable<'a>(
        &'a self,
        dataset_key: &'a str,
        job_key: &'a str,
        exclude: Option<RunId>,
    ) -> impl Iterator<Item = &'a RunRecord> + 'a {
        self.runs(dataset_key, job_key)
            .filter(move |r| Some(r.id) != exclude && !r.schedule().is_empty())
    }

    /// The run replayed when no run can be ranked: the latest finished, else the one that got
    /// furthest (ties: the latest). A finished run is a whole training whose schedule held up
    /// end to end; without one, the longest run covers the most mini-epochs.
    fn fallback_run<'a>(
        &'a self,
        dataset_key: &'a str,
        job_key: &'a str,
        exclude: Option<RunId>,
    ) -> Option<&'a RunRecord> {
        self.replayable(dataset_key, job_key, exclude)
            .filter(|r| r.finished)
            .max_by_key(|r| r.id)
            .or_else(|| {
                self.replayable(dataset_key, job_key, exclude)
                    .max_by_key(|r| (r.schedule().len(), r.id))
            })
    }

    /// The earlier run `learned` replays for (dataset, job), why, and its rf sequence; `None`
    /// if the store has no usable run for this key (e.g. only runs of other datasets).
    /// `exclude` is the current run, when a restarted daemon resumes it and must not replay
    /// its own partial record.
    ///
    /// The run with the best final value of `metric` (ties: the latest) among the finished
    /// runs that recorded it, or among all that recorded it when none of those finished; if no
    /// run recorded it, the latest finished run; if none finished, the one that got furthest.
    /// A metric the `learned_metric` setting named ([`ReplayMetric::is_named`]) that
    /// none of these runs recorded, while they did record other metrics, is an error naming
    /// the setting: a misspelt metric would otherwise replay the latest run unnoticed. Runs
    /// that recorded no metric at all (a job that sends none, a file of an older format) do
    /// not refuse it, so that such a history can still be replayed and a new run record one.
    pub fn replay(
        &self,
        dataset_key: &str,
        job_key: &str,
        exclude: Option<RunId>,
        metric: &ReplayMetric,
    ) -> Result<Option<(Replay, Vec<u32>)>, HistoryError> {
        let runs = || self.replayable(dataset_key, job_key, exclude);
        if metric.is_named() && runs().all(|r| r.final_value(metric).is_none()) {
            let recorded: BTreeSet<&str> = runs()
                .flat_map(|r| r.mini_epochs.iter().flat_map(|m| m.metrics.keys()))
                .map(String::as_str)
                .collect();
            if !recorded.is_empty() {
                return Err(HistoryError::UnrecordedMetric {
                    setting: metric.to_string(),
                    metric: metric.term().metric().to_string(),
                    job: job_key.to_string(),
                    recorded: recorded.into_iter().collect::<Vec<_>>().join(", "),
                });
            }
        }
        let comparable: Vec<(&RunRecord, f64)> = runs()
            .filter_map(|r| r.final_value(metric).map(|v| (r, v)))
            .collect();
        // A finished run trained to its end, so its final value is the model's; an unfinished
        // one's is where it stopped. Unfinished runs are ranked only when no finished run can
        // be (a plain mount's runs never finish: only a shared mount's `leave` says a job ended).
        let finished: Vec<(&RunRecord, f64)> = comparable
            .iter()
            .copied()
            .filter(|(r, _)| r.finished)
            .collect();
        let ranked = if finished.is_empty() {
            comparable
        } else {
            finished
        };
        let best = ranked
            .iter()
            .max_by(|(a, va), (b, vb)| metric.compare(*va, *vb).then(a.id.cmp(&b.id)));
        let (run, why) = match best {
            Some((r, _)) => (*r, ReplayWhy::Best),
            None => match self.fallback_run(dataset_key, job_key, exclude) {
                Some(r) if r.finished => (r, ReplayWhy::Latest),
                Some(r) => (r, ReplayWhy::Furthest),
                None => return Ok(None),
            },
        };
        let schedule = run.schedule();
        Ok(Some((
            Replay {
                run: run.id,
                mini_epochs: schedule.len() as u64,
                why,
                metric: metric.to_string(),
                value: run.final_value(metric),
                finished: run.finished,
                compared: if why == ReplayWhy::Best {
                    ranked.len() as u64
                } else {
                    0
                },
            },
            schedule,
        )))
    }

    /// Writes the store to its file atomically (`metfs-durable`: temporary file in the same
    /// directory, fsync, rename, fsync of the directory).
    pub fn save(&self) -> Result<(), HistoryError> {
        self.encode()?.write()
    }

    /// The store as its file holds it, to be written later ([`EncodedHistory::write`]) by a
    /// caller that must not wait for the disk where it holds the store.
    pub fn encode(&self) -> Result<EncodedHistory, HistoryError> {
        let mut bytes = serde_json::to_vec(&self.file).map_err(|source| HistoryError::Encode {
            path: self.path.clone(),
            source,
        })?;
        bytes.push(b'\n');
        Ok(EncodedHistory {
            path: self.path.clone(),
            bytes,
        })
    }
}

/// A history store encoded for its file ([`HistoryStore::encode`]).
#[derive(Debug, Clone)]
pub struct EncodedHistory {
    path: PathBuf,
    bytes: Vec<u8>,
}

impl EncodedHistory {
    /// Writes it atomically, as [`HistoryStore::save`] does.
    pub fn write(&self) -> Result<(), HistoryError> {
        let bytes = &self.bytes;
        match metfs_durable::write(&self.path, bytes, metfs_durable::Durability::FileAndDir) {
            Ok(()) => Ok(()),
            // Some file systems refuse fsync on a directory; the data is already in place
            // then, so say so and go on.
            Err(e @ metfs_durable::DurableError::DirNotSynced { .. }) => {
                tracing::warn!("rf history: {e}");
                Ok(())
            }
            Err(metfs_durable::DurableError::Io { op, source, .. }) => Err(HistoryError::Io {
                path: self.path.clone(),
                op,
                source,
            }),
        }
    }
}

#[cfg(test)]
#[path = "history_tests.rs"]
mod tests;
