//! rf history: what rf each mini-epoch of each run used, kept so a later run can replay it.
//!
//! The paper asks to "remember the optimal strategy for given dataset and model, so this gets
//! automatically reflected in subsequent training runs". [`HistoryStore`] is that memory: one
//! JSON file holding runs, each keyed by a dataset key and a job key, each a list of
//! [`MiniEpochRecord`]s (sequence index, epoch, mini-epoch index, rf, the score of every pass,
//! the decision and reason at the last pass, timestamps). [`HistoryStore::schedule`] turns the
//! best-suited earlier run into the rf sequence that `learned` replays.
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
//! * **Bounded size**: at most [`MAX_RUNS_PER_KEY`] runs are kept per (dataset, job); starting
//!   another drops the oldest, never the one [`HistoryStore::schedule`] would replay.
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
//!       "scores":[1.2,1.1,1.1,1.15,1.1],"verdict":"advance",
//!       "reason":{"policy":"score",…},"started_unix_ms":…,"ended_unix_ms":…}]}]}
//! ```

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

use crate::policy::{PolicyDecision, Verdict};

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
}

/// Identifies a run within one history file (ids grow and are never reused in that file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
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
            verdict: None,
            reason: Value::Null,
            started_unix_ms: now,
            ended_unix_ms: now,
        }
    }

    /// Adds a pass with the decision the (bounded) policy made for it.
    pub fn add_pass(&mut self, decision: &PolicyDecision) {
        // A non-finite score cannot be written as JSON; policies never produce one, but a
        // record must stay encodable whatever it is fed.
        self.scores.push(decision.score.filter(|s| s.is_finite()));
        self.rf = u32::try_from(self.scores.len()).unwrap_or(u32::MAX);
        if decision.verdict == Verdict::Advance && self.wanted_rf.is_none() {
            self.wanted_rf = Some(self.rf);
        }
        self.verdict = Some(decision.verdict);
        self.reason = decision.reason.clone();
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
    /// than [`MAX_RUNS_PER_KEY`] runs, the oldest are dropped, except the one
    /// [`HistoryStore::schedule`] currently selects. Not saved until [`HistoryStore::save`].
    pub fn start_run(&mut self, dataset_key: &str, job_key: &str) -> RunId {
        let keep = self.chosen_run(dataset_key, job_key, None).map(|r| r.id);
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
            mini_epochs: Vec::new(),
        });
        let mut excess = self.runs(dataset_key, job_key).count();
        // Runs are in id order, oldest first, so dropping from the front drops the oldest.
        self.file.runs.retain(|r| {
            let drop = excess > MAX_RUNS_PER_KEY
                && r.dataset == dataset_key
                && r.job == job_key
                && Some(r.id) != keep
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

    /// Marks `run` as ended normally (preferred by [`HistoryStore::schedule`]).
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

    fn chosen_run(
        &self,
        dataset_key: &str,
        job_key: &str,
        exclude: Option<RunId>,
    ) -> Option<&RunRecord> {
        let eligible = || {
            self.file.runs.iter().filter(|r| {
                r.dataset == dataset_key
                    && r.job == job_key
                    && Some(r.id) != exclude
                    && !r.schedule().is_empty()
            })
        };
        eligible()
            .filter(|r| r.finished)
            .max_by_key(|r| r.id)
            .or_else(|| eligible().max_by_key(|r| (r.schedule().len(), r.id)))
    }

    /// The rf sequence to replay for (dataset, job), from the most recent *finished* run; if no
    /// run finished (a job killed at its time limit never finishes), from the run that got
    /// furthest (ties: the most recent). A finished run is a whole training whose schedule
    /// held up end to end; without one, the longest run covers the most mini-epochs. `None` if
    /// the store has no usable run for this key (e.g. only runs of other datasets).
    pub fn schedule(&self, dataset_key: &str, job_key: &str) -> Option<Vec<u32>> {
        self.schedule_excluding(dataset_key, job_key, None)
    }

    /// As [`HistoryStore::schedule`], ignoring run `exclude` (the current run, when a restarted
    /// daemon resumes it and must not replay its own partial record).
    pub fn schedule_excluding(
        &self,
        dataset_key: &str,
        job_key: &str,
        exclude: Option<RunId>,
    ) -> Option<Vec<u32>> {
        self.chosen_run(dataset_key, job_key, exclude)
            .map(RunRecord::schedule)
    }

    /// Writes the store to its file atomically (`durable`: temporary file in the same
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
        match durable::write(&self.path, bytes, durable::Durability::FileAndDir) {
            Ok(()) => Ok(()),
            // Some file systems refuse fsync on a directory; the data is already in place
            // then, so say so and go on.
            Err(e @ durable::DurableError::DirNotSynced { .. }) => {
                tracing::warn!("rf history: {e}");
                Ok(())
            }
            Err(durable::DurableError::Io { op, source, .. }) => Err(HistoryError::Io {
                path: self.path.clone(),
                op,
                source,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn decision(verdict: Verdict, score: Option<f64>) -> PolicyDecision {
        PolicyDecision {
            verdict,
            reason: json!({"policy": "score", "current": score}),
            score,
        }
    }

    /// A mini-epoch of `rf` passes whose policy wanted out at pass `wanted` (if any).
    fn mini_epoch(sequence: u64, rf: u32, wanted: Option<u32>) -> MiniEpochRecord {
        let mut r = MiniEpochRecord::begin(sequence, sequence / 4, (sequence % 4) as u32);
        for p in 1..=rf {
            let v = if wanted.is_some_and(|w| p >= w) {
                Verdict::Advance
            } else {
                Verdict::Repeat
            };
            r.add_pass(&decision(v, Some(10.0 - p as f64)));
        }
        r
    }

    /// Files in `dir`, by name.
    fn listing(dir: &Path) -> Vec<String> {
        let mut v: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn record_counts_passes_and_the_wish() {
        let r = mini_epoch(5, 6, Some(4));
        assert_eq!((r.rf, r.wanted_rf, r.replay_rf()), (6, Some(4), 4));
        assert_eq!((r.epoch, r.mini_epoch), (1, 1));
        assert_eq!(r.scores, [9.0, 8.0, 7.0, 6.0, 5.0, 4.0].map(Some));
        assert_eq!(r.verdict, Some(Verdict::Advance));
        assert_eq!(r.reason["current"], 4.0);
        assert!(r.started_unix_ms <= r.ended_unix_ms);
        let forced = mini_epoch(0, 3, None);
        assert_eq!((forced.wanted_rf, forced.replay_rf()), (None, 3));
        let mut r = MiniEpochRecord::begin(0, 0, 0);
        r.add_pass(&decision(Verdict::Repeat, None));
        r.add_pass(&decision(Verdict::Repeat, Some(f64::NAN)));
        assert_eq!(r.scores, [None, None]);
    }

    #[test]
    fn round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.json");
        let (mut h, warnings) = HistoryStore::open(&path).unwrap();
        assert!(warnings.is_empty());
        assert!(h.all_runs().is_empty());
        assert_eq!(h.schedule("ds", "job"), None);
        let run = h.start_run("ds", "job");
        h.record_mini_epoch(run, mini_epoch(0, 5, Some(3))).unwrap();
        h.record_mini_epoch(run, mini_epoch(1, 2, Some(2))).unwrap();
        h.finish_run(run).unwrap();
        h.save().unwrap();

        let (h2, warnings) = HistoryStore::open(&path).unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(h2.all_runs(), h.all_runs());
        assert_eq!(h2.schedule("ds", "job"), Some(vec![3, 2]));
        let r = h2.run(run).unwrap();
        assert!(r.finished);
        assert_eq!(r.mini_epochs[0].scores.len(), 5);
        assert_eq!(h2.keys(), [("ds".to_string(), "job".to_string())]);
        // The file is the documented format.
        let v: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        assert_eq!(
            (v["format"].as_str(), v["version"].as_u64()),
            (Some(FORMAT), Some(1))
        );
        assert_eq!(v["runs"][0]["mini_epochs"][0]["wanted_rf"], 3);
        assert!(matches!(
            h.record_mini_epoch(RunId(99), mini_epoch(0, 1, None)),
            Err(HistoryError::UnknownRun(RunId(99)))
        ));
        assert!(matches!(
            h.finish_run(RunId(99)),
            Err(HistoryError::UnknownRun(_))
        ));
    }

    #[test]
    fn save_is_atomic_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.json");
        let (mut h, _) = HistoryStore::open(&path).unwrap();
        let run = h.start_run("ds", "job");
        for seq in 0..5 {
            h.record_mini_epoch(run, mini_epoch(seq, 3, Some(3)))
                .unwrap();
            h.save().unwrap();
            assert_eq!(listing(dir.path()), ["history.json"]);
            // Every save is a complete, parseable file.
            let (again, w) = HistoryStore::open(&path).unwrap();
            assert!(w.is_empty());
            assert_eq!(again.schedule("ds", "job").unwrap().len() as u64, seq + 1);
        }
        // A save into a missing directory fails cleanly, naming the file.
        let (h, _) = HistoryStore::open(dir.path().join("no/such/dir/h.json")).unwrap();
        let e = h.save().unwrap_err();
        assert!(e.to_string().contains("no/such/dir/h.json"), "{e}");
        assert_eq!(listing(dir.path()), ["history.json"]);
    }

    #[test]
    fn corrupt_file_is_kept_aside_with_a_warning() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.json");
        // A good file, then the same file cut in half (a torn copy, a full disk...).
        let (mut h, _) = HistoryStore::open(&path).unwrap();
        let run = h.start_run("ds", "job");
        h.record_mini_epoch(run, mini_epoch(0, 4, Some(4))).unwrap();
        h.save().unwrap();
        let good = fs::read(&path).unwrap();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"{not json".to_vec(), "not valid JSON"),
            (good[..good.len() / 2].to_vec(), "not valid JSON"),
            (Vec::new(), "not valid JSON"),
            (b"{\"runs\": []}".to_vec(), "not an rf history file"),
            (
                format!("{{\"format\":\"{FORMAT}\",\"version\":7}}").into_bytes(),
                "format version 7",
            ),
            (
                format!("{{\"format\":\"{FORMAT}\",\"version\":1,\"runs\":3}}").into_bytes(),
                "malformed",
            ),
            (
                String::from_utf8(good.clone())
                    .unwrap()
                    .replace("\"runs\":[", "\"runs\":[{\"id\":1,\"dataset\":\"x\",\"job\":\"y\",\"started_unix_ms\":0,\"updated_unix_ms\":0,\"mini_epochs\":[]},")
                    .into_bytes(),
                "appears twice",
            ),
        ];
        for (bytes, why) in cases {
            for f in listing(dir.path()) {
                fs::remove_file(dir.path().join(f)).unwrap();
            }
            fs::write(&path, &bytes).unwrap();
            let (mut h, warnings) = HistoryStore::open(&path).unwrap();
            assert_eq!(warnings.len(), 1, "{why}");
            let w = &warnings[0];
            assert!(w.contains(why), "{w}");
            assert!(w.contains(&path.display().to_string()), "{w}");
            let names = listing(dir.path());
            assert_eq!(names.len(), 1, "{names:?}");
            assert!(names[0].starts_with("history.json.corrupt-"), "{names:?}");
            assert!(w.contains(&names[0]), "{w}");
            // Nothing is lost: the old bytes are intact under the new name.
            assert_eq!(fs::read(dir.path().join(&names[0])).unwrap(), bytes);
            // And the store works.
            assert!(h.all_runs().is_empty());
            let run = h.start_run("ds", "job");
            h.record_mini_epoch(run, mini_epoch(0, 2, Some(2))).unwrap();
            h.save().unwrap();
            let (h, w) = HistoryStore::open(&path).unwrap();
            assert!(w.is_empty());
            assert_eq!(h.schedule("ds", "job"), Some(vec![2]));
        }
    }

    #[test]
    fn two_corrupt_files_in_the_same_millisecond_do_not_collide() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.json");
        let first = aside_path(&path);
        fs::write(&first, b"x").unwrap();
        let second = aside_path(&path);
        assert_ne!(first, second);
    }

    #[test]
    fn unreadable_path_is_an_error_and_is_not_moved() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.json");
        fs::create_dir(&path).unwrap();
        let e = HistoryStore::open(&path).unwrap_err();
        assert!(matches!(e, HistoryError::Io { op: "read", .. }), "{e}");
        assert!(e.to_string().contains("history.json"), "{e}");
        assert_eq!(listing(dir.path()), ["history.json"]);
    }

    #[test]
    fn other_datasets_and_jobs_have_no_schedule() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.json");
        let (mut h, _) = HistoryStore::open(&path).unwrap();
        let run = h.start_run("imagenet@abc", "resnet50");
        h.record_mini_epoch(run, mini_epoch(0, 7, Some(7))).unwrap();
        h.save().unwrap();
        let (h, warnings) = HistoryStore::open(&path).unwrap();
        assert!(warnings.is_empty());
        assert_eq!(h.schedule("cifar@def", "resnet50"), None);
        assert_eq!(h.schedule("imagenet@abc", "efficientnet"), None);
        assert_eq!(h.schedule("imagenet@abc", "resnet50"), Some(vec![7]));
        // An empty run (started, nothing recorded) has nothing to replay.
        let (mut h, _) = HistoryStore::open(&path).unwrap();
        h.start_run("cifar@def", "resnet50");
        assert_eq!(h.schedule("cifar@def", "resnet50"), None);
    }

    #[test]
    fn restart_resumes_the_same_run_or_starts_a_new_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history.json");
        let run = {
            let (mut h, _) = HistoryStore::open(&path).unwrap();
            let (run, resumed) = h.resume_or_start("ds", "job", None);
            assert!(!resumed);
            h.record_mini_epoch(run, mini_epoch(0, 4, Some(4))).unwrap();
            h.record_mini_epoch(run, mini_epoch(1, 9, None)).unwrap();
            h.save().unwrap();
            run
        };
        // The daemon restarts and continues its run: mini-epoch 1 is recorded again (it was
        // cut short) and replaces the old record; mini-epoch 2 is appended.
        {
            let (mut h, _) = HistoryStore::open(&path).unwrap();
            assert_eq!(h.resume_or_start("ds", "job", Some(run)), (run, true));
            h.record_mini_epoch(run, mini_epoch(2, 3, Some(3))).unwrap();
            h.record_mini_epoch(run, mini_epoch(1, 5, Some(5))).unwrap();
            h.save().unwrap();
        }
        let (mut h, _) = HistoryStore::open(&path).unwrap();
        assert_eq!(h.all_runs().len(), 1);
        let seqs: Vec<_> = h
            .run(run)
            .unwrap()
            .mini_epochs
            .iter()
            .map(|m| m.sequence)
            .collect();
        assert_eq!(seqs, [0, 1, 2]);
        assert_eq!(h.schedule("ds", "job"), Some(vec![4, 5, 3]));
        // A resumed run does not replay itself.
        assert_eq!(h.schedule_excluding("ds", "job", Some(run)), None);
        // An unknown id, or one of another key, starts a new run.
        let (other, resumed) = h.resume_or_start("ds", "job", Some(RunId(42)));
        assert!(!resumed && other != run);
        let (third, resumed) = h.resume_or_start("ds2", "job", Some(run));
        assert!(!resumed && third != run && third != other);
    }

    #[test]
    fn schedule_prefers_the_latest_finished_run_then_the_longest() {
        let mut h = HistoryStore {
            path: PathBuf::from("unused.json"),
            file: HistoryFile::empty(),
        };
        let long = h.start_run("ds", "job");
        for seq in 0..4 {
            h.record_mini_epoch(long, mini_epoch(seq, 2, Some(2)))
                .unwrap();
        }
        let short = h.start_run("ds", "job");
        h.record_mini_epoch(short, mini_epoch(0, 7, Some(7)))
            .unwrap();
        // No run finished: the one that got furthest.
        assert_eq!(h.schedule("ds", "job"), Some(vec![2; 4]));
        // Equal length: the most recent.
        let tie = h.start_run("ds", "job");
        for seq in 0..4 {
            h.record_mini_epoch(tie, mini_epoch(seq, 3, Some(3)))
                .unwrap();
        }
        assert_eq!(h.schedule("ds", "job"), Some(vec![3; 4]));
        // A finished run wins over longer unfinished ones; the latest finished one among them.
        h.finish_run(short).unwrap();
        assert_eq!(h.schedule("ds", "job"), Some(vec![7]));
        h.finish_run(long).unwrap();
        assert_eq!(h.schedule("ds", "job"), Some(vec![7]));
        assert_eq!(
            h.schedule_excluding("ds", "job", Some(short)),
            Some(vec![2; 4])
        );
    }

    #[test]
    fn schedule_stops_at_a_gap_and_replays_the_wish() {
        let mut h = HistoryStore {
            path: PathBuf::from("unused.json"),
            file: HistoryFile::empty(),
        };
        let run = h.start_run("ds", "job");
        // Mini-epoch 0: the policy wanted out at 3 but staging took until pass 8.
        h.record_mini_epoch(run, mini_epoch(0, 8, Some(3))).unwrap();
        h.record_mini_epoch(run, mini_epoch(1, 4, None)).unwrap();
        h.record_mini_epoch(run, mini_epoch(3, 6, Some(6))).unwrap();
        assert_eq!(h.schedule("ds", "job"), Some(vec![3, 4]));
        // A run that starts mid-way (no sequence 0) has nothing to replay.
        let late = h.start_run("ds2", "job");
        h.record_mini_epoch(late, mini_epoch(5, 2, Some(2)))
            .unwrap();
        assert_eq!(h.schedule("ds2", "job"), None);
    }

    #[test]
    fn runs_per_key_are_bounded_and_the_replayed_run_is_kept() {
        let mut h = HistoryStore {
            path: PathBuf::from("unused.json"),
            file: HistoryFile::empty(),
        };
        let first = h.start_run("ds", "job");
        h.record_mini_epoch(first, mini_epoch(0, 5, Some(5)))
            .unwrap();
        h.finish_run(first).unwrap();
        let other = h.start_run("ds", "other");
        let mut last = first;
        for _ in 0..20 {
            last = h.start_run("ds", "job");
        }
        assert_eq!(h.runs("ds", "job").count(), MAX_RUNS_PER_KEY);
        assert!(h.run(first).is_some(), "the run schedule() replays is kept");
        assert!(h.run(last).is_some());
        assert!(h.run(other).is_some(), "other keys are untouched");
        assert_eq!(h.schedule("ds", "job"), Some(vec![5]));
        // Ids keep growing across keys and pruning.
        assert!(last.0 > other.0);
    }

    #[test]
    fn next_run_id_is_repaired_from_the_runs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.json");
        let (mut h, _) = HistoryStore::open(&path).unwrap();
        let a = h.start_run("ds", "job");
        h.save().unwrap();
        let text = fs::read_to_string(&path)
            .unwrap()
            .replace("\"next_run_id\":2", "\"next_run_id\":0");
        fs::write(&path, text).unwrap();
        let (mut h, w) = HistoryStore::open(&path).unwrap();
        assert!(w.is_empty());
        assert!(h.start_run("ds", "job") > a);
    }

    proptest! {
        /// Scores read back bit for bit (serde_json's `float_roundtrip`).
        #[test]
        fn scores_round_trip_exactly(
            scores in proptest::collection::vec(proptest::num::f64::NORMAL | proptest::num::f64::SUBNORMAL | proptest::num::f64::ZERO, 1..20),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("h.json");
            let (mut h, _) = HistoryStore::open(&path).unwrap();
            let run = h.start_run("ds", "job");
            let mut rec = MiniEpochRecord::begin(0, 0, 0);
            for &s in &scores {
                rec.add_pass(&decision(Verdict::Repeat, Some(s)));
            }
            h.record_mini_epoch(run, rec).unwrap();
            h.save().unwrap();
            let (h2, _) = HistoryStore::open(&path).unwrap();
            let back: Vec<u64> = h2.run(run).unwrap().mini_epochs[0]
                .scores
                .iter()
                .map(|s| s.unwrap().to_bits())
                .collect();
            let want: Vec<u64> = scores.iter().map(|s| s.to_bits()).collect();
            prop_assert_eq!(back, want);
        }
    }

    proptest! {
        /// Any recorded history survives save and open unchanged, and its schedule is the
        /// replay rf of every mini-epoch.
        #[test]
        fn save_open_round_trip(
            rfs in proptest::collection::vec((1u32..50, proptest::option::of(1u32..50)), 0..30),
            dataset in "[a-z0-9@/:._-]{1,30}",
            job in "\\PC{1,20}",
        ) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("h.json");
            let (mut h, _) = HistoryStore::open(&path).unwrap();
            let run = h.start_run(&dataset, &job);
            for (seq, &(rf, wanted)) in rfs.iter().enumerate() {
                let wanted = wanted.filter(|w| *w <= rf);
                h.record_mini_epoch(run, mini_epoch(seq as u64, rf, wanted)).unwrap();
            }
            h.save().unwrap();
            let (h2, w) = HistoryStore::open(&path).unwrap();
            prop_assert!(w.is_empty());
            prop_assert_eq!(h2.all_runs(), h.all_runs());
            let expected: Vec<u32> = rfs
                .iter()
                .map(|&(rf, wanted)| wanted.filter(|w| *w <= rf).unwrap_or(rf))
                .collect();
            prop_assert_eq!(
                h2.schedule(&dataset, &job),
                (!expected.is_empty()).then_some(expected)
            );
            prop_assert_eq!(listing(dir.path()), vec!["h.json".to_string()]);
        }
    }
}
