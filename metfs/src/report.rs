//! `metfs report RUN_DIR`: plots and a summary of what MET did to a job and to the capacity
//! tier, from the daemon's event log.
//!
//! Input: `RUN_DIR/events.1.jsonl` (the rotated, older part, if present) then
//! `RUN_DIR/events.jsonl`, one JSON object per line with `t` (Unix seconds) and `event`:
//!
//! * `start`: dataset size and files, nm, budget, node rank and count. A second `start` means the
//!   daemon restarted; its tier counter restarts at 0.
//! * `pass_end`: one pass over the current mini-epoch (`sequence`, `pass`, `view_bytes`, and
//!   optionally `secs`, the pass's duration, and `decision`: `repeat`, `advance` or `wait`).
//!   A separate `decision` event right after a `pass_end` supplies the decision when the
//!   `pass_end` has none (`verdict` is the policy's wish, not the decision).
//! * `staged`: a mini-epoch finished staging (`bytes_fetched` in `secs`).
//! * `switch`: the view advanced; `prev_rf` is the passes the previous mini-epoch got,
//!   `prev_wanted_rf` the pass at which its policy first wanted to advance.
//! * `tier`: the cumulative bytes read from the capacity tier, every few seconds while staging.
//!
//! Unknown events and unknown fields are ignored, optional fields may be missing; a line that
//! is not JSON, lacks `t` or `event`, or has a field of the wrong type is an error naming the
//! file and line, except a torn last line of `events.jsonl` (a crash mid-write), which is
//! skipped with a warning in the summary.
//!
//! Output in `OUT_DIR`:
//!
//! * `rf_per_mini_epoch.png`: rf of each completed mini-epoch against its sequence number,
//!   with the rf the policy wanted, the mean and the stall-free rf (the paper's Fig. 11);
//! * `rf_histogram.png`: the distribution of rf (Fig. 11);
//! * `tier_bandwidth.png`: capacity-tier bandwidth over time (the derivative of the cumulative
//!   tier bytes, averaged over a sliding window) against the bandwidth that reading every pass
//!   from the tier would have needed, `view_bytes / pass seconds` per pass (Fig. 12b);
//! * `summary.txt` and `summary.json` ([`ReportSummary`]).
//!
//! Definitions used by the summary:
//!
//! * A mini-epoch is **completed** when a `switch` leaves it. Its rf is the switch's `prev_rf`;
//!   where the switch was rotated out of the log, the highest `pass` seen for that sequence.
//! * **Bytes consumed** through the mount: `view_bytes` summed over passes (each pass reads the
//!   whole view once).
//! * **Tier bytes read**: the last cumulative `tier` value, adding the value before each reset
//!   (restart); without `tier` events, the sum of `staged.bytes_fetched`.
//! * **B2** = Σ `staged.bytes_fetched` / Σ `staged.secs`; **EB1** = Σ `view_bytes` / Σ pass
//!   seconds (a pass's `secs`, else the time since the previous `pass_end` or `start`);
//!   **stall-free rf** = ceil(EB1 / B2); **EB2** = tier bytes read / the run's duration.
//!
//! Text is drawn with an embedded DejaVu Sans (the `dejavu` crate through plotters' `ab_glyph`
//! feature), so reports render on nodes without system fonts or fontconfig.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::prelude::*;
use prefetcher::size::format_bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

/// PNG size of every plot, in pixels.
pub const PLOT_SIZE: (u32, u32) = (1200, 700);

/// File names written into the output directory.
pub const RF_PLOT: &str = "rf_per_mini_epoch.png";
/// The rf histogram.
pub const RF_HISTOGRAM: &str = "rf_histogram.png";
/// The tier bandwidth plot.
pub const BANDWIDTH_PLOT: &str = "tier_bandwidth.png";
/// The text summary.
pub const SUMMARY_TXT: &str = "summary.txt";
/// The JSON summary.
pub const SUMMARY_JSON: &str = "summary.json";

/// Why a report could not be made.
#[derive(Debug, Error)]
pub enum ReportError {
    /// The run directory has no event log.
    #[error("no events.jsonl in {run_dir}: expected the run directory a metfs daemon writes (default CACHE/run)")]
    NoEvents {
        /// The directory given.
        run_dir: PathBuf,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// An event line is not what the daemon writes.
    #[error("{path}, line {line}: {message}")]
    Malformed {
        /// The event file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// What is wrong.
        message: String,
    },
    /// The embedded font could not be loaded.
    #[error("cannot load the embedded font for plots")]
    Font,
    /// Drawing a plot failed.
    #[error("cannot draw {path}: {message}")]
    Plot {
        /// The image.
        path: PathBuf,
        /// The drawing error.
        message: String,
    },
}

/// One completed mini-epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MiniEpochRow {
    /// Position in the run (0, 1, 2, ... across epochs).
    pub sequence: u64,
    /// Epoch, when the log says.
    pub epoch: Option<u64>,
    /// Index within the epoch, when the log says.
    pub mini_epoch: Option<u32>,
    /// Passes it got.
    pub rf: u32,
    /// The pass at which the policy first wanted to advance, if it did.
    pub wanted_rf: Option<u32>,
    /// Passes that ended with `wait` (the successor was not staged yet).
    pub bonus_passes: u64,
}

/// Distribution of rf over completed mini-epochs (nearest-rank percentiles).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RfStats {
    /// Mean rf.
    pub mean: f64,
    /// Smallest rf.
    pub min: u32,
    /// 10th percentile.
    pub p10: u32,
    /// 25th percentile.
    pub p25: u32,
    /// Median.
    pub p50: u32,
    /// 75th percentile.
    pub p75: u32,
    /// 90th percentile.
    pub p90: u32,
    /// Largest rf.
    pub max: u32,
}

/// What `metfs report` found; also written as `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReportSummary {
    /// The run directory read.
    pub run_dir: PathBuf,
    /// Event files read, oldest first.
    pub event_files: Vec<PathBuf>,
    /// Events read (all kinds).
    pub events: u64,
    /// Files written (plots and summaries).
    pub files: Vec<PathBuf>,
    /// Things the reader tolerated (torn last line, log rotated past the run's start, ...).
    pub warnings: Vec<String>,
    /// Seconds from the first to the last event.
    pub duration_secs: f64,
    /// Dataset size from the last `start` event.
    pub dataset_bytes: Option<u64>,
    /// Dataset files from the last `start` event.
    pub dataset_files: Option<u64>,
    /// nm from the last `start` event.
    pub mini_epochs_per_epoch: Option<u32>,
    /// The rf policy from the last `start` event.
    pub rf_policy: Option<String>,
    /// Cache budget from the last `start` event.
    pub budget_bytes: Option<u64>,
    /// This node's rank.
    pub node_rank: Option<u32>,
    /// Nodes in the job.
    pub nodes: Option<u32>,
    /// Daemon starts in the log (more than one means restarts).
    pub starts: u64,
    /// Mini-epochs left by a switch.
    pub mini_epochs_completed: u64,
    /// Passes reported (`pass_end` events).
    pub passes: u64,
    /// Passes that ended with `wait`.
    pub bonus_passes: u64,
    /// rf distribution over completed mini-epochs.
    pub rf: Option<RfStats>,
    /// Mean of the rf the policy wanted, over mini-epochs where it wanted to advance.
    pub wanted_rf_mean: Option<f64>,
    /// Bytes read from the capacity tier.
    pub tier_bytes_read: u64,
    /// Where `tier_bytes_read` comes from: `tier events`, `staged events` or `none`.
    pub tier_bytes_source: String,
    /// Bytes read through the mount (view bytes summed over passes).
    pub bytes_consumed: u64,
    /// `tier_bytes_read / bytes_consumed` (MET aims at about 1 / mean rf).
    pub tier_to_consumed_ratio: Option<f64>,
    /// Mini-epochs staged (`staged` events).
    pub staged_mini_epochs: u64,
    /// Bytes fetched by staging.
    pub staged_bytes_fetched: u64,
    /// B2: average staging throughput.
    pub b2_bytes_per_s: Option<f64>,
    /// EB1: average consumption rate through the mount during passes.
    pub eb1_bytes_per_s: Option<f64>,
    /// EB2: tier bytes read over the run's duration.
    pub eb2_bytes_per_s: Option<f64>,
    /// ceil(EB1 / B2).
    pub stall_free_rf: Option<u32>,
    /// Mean pass duration in seconds.
    pub mean_pass_secs: Option<f64>,
    /// Every completed mini-epoch, in order.
    pub mini_epochs: Vec<MiniEpochRow>,
}

// ---------------------------------------------------------------------------------------
// Reading events

#[derive(Deserialize)]
struct StartEv {
    dataset_bytes: Option<u64>,
    dataset_files: Option<u64>,
    mini_epochs: Option<u32>,
    rf_policy: Option<String>,
    budget_bytes: Option<u64>,
    node_rank: Option<u32>,
    nodes: Option<u32>,
}

#[derive(Deserialize)]
struct PassEndEv {
    epoch: Option<u64>,
    mini_epoch: Option<u32>,
    sequence: Option<u64>,
    pass: Option<u32>,
    decision: Option<String>,
    view_bytes: Option<u64>,
    secs: Option<f64>,
}

#[derive(Deserialize)]
struct StagedEv {
    bytes_fetched: Option<u64>,
    bytes: Option<u64>,
    secs: Option<f64>,
}

#[derive(Deserialize)]
struct SwitchEv {
    sequence: Option<u64>,
    prev_rf: u32,
    prev_wanted_rf: Option<u32>,
}

#[derive(Deserialize)]
struct TierEv {
    tier_bytes_read: u64,
}

#[derive(Deserialize)]
struct DecisionEv {
    decision: Option<String>,
}

/// One event, typed; kinds the report does not use are dropped while reading.
enum Event {
    Start(StartEv),
    PassEnd(PassEndEv),
    Staged(StagedEv),
    Switch(SwitchEv),
    Tier(TierEv),
    Decision(DecisionEv),
}

struct Timed {
    t: f64,
    ev: Event,
}

struct EventLog {
    files: Vec<PathBuf>,
    events: Vec<Timed>,
    lines: u64,
    warnings: Vec<String>,
}

fn malformed(path: &Path, line: u64, message: String) -> ReportError {
    ReportError::Malformed {
        path: path.to_path_buf(),
        line,
        message,
    }
}

fn typed<T: for<'de> Deserialize<'de>>(
    v: Value,
    kind: &str,
    path: &Path,
    line: u64,
) -> Result<T, ReportError> {
    serde_json::from_value(v).map_err(|e| malformed(path, line, format!("`{kind}` event: {e}")))
}

/// Parses one event file's text. `tolerate_torn_tail`: a last line without a newline that is
/// not JSON is reported as a warning instead of an error.
fn parse_events(
    text: &str,
    path: &Path,
    tolerate_torn_tail: bool,
    out: &mut EventLog,
) -> Result<(), ReportError> {
    let torn_candidate = !text.is_empty() && !text.ends_with('\n');
    let n_lines = text.lines().count();
    for (i, raw) in text.lines().enumerate() {
        let line = i as u64 + 1;
        let raw = raw.trim();
        if raw.is_empty() {
            continue;
        }
        let v: Value = match serde_json::from_str(raw) {
            Ok(v) => v,
            Err(e) => {
                if tolerate_torn_tail && torn_candidate && i + 1 == n_lines {
                    out.warnings.push(format!(
                        "{}, line {line}: skipped a torn last line (the daemon stopped mid-write)",
                        path.display()
                    ));
                    continue;
                }
                return Err(malformed(path, line, format!("not a JSON object: {e}")));
            }
        };
        let Value::Object(obj) = &v else {
            return Err(malformed(path, line, "not a JSON object".into()));
        };
        let t = obj
            .get("t")
            .and_then(Value::as_f64)
            .filter(|t| t.is_finite())
            .ok_or_else(|| {
                malformed(path, line, "missing `t` (Unix seconds as a number)".into())
            })?;
        let kind = obj
            .get("event")
            .and_then(Value::as_str)
            .ok_or_else(|| malformed(path, line, "missing `event` (a string)".into()))?
            .to_string();
        out.lines += 1;
        let ev = match kind.as_str() {
            "start" => Event::Start(typed(v, &kind, path, line)?),
            "pass_end" => Event::PassEnd(typed(v, &kind, path, line)?),
            "staged" => Event::Staged(typed(v, &kind, path, line)?),
            "switch" => Event::Switch(typed(v, &kind, path, line)?),
            "tier" => Event::Tier(typed(v, &kind, path, line)?),
            "decision" => Event::Decision(typed(v, &kind, path, line)?),
            _ => continue,
        };
        if let Event::PassEnd(p) = &ev {
            if let Some(s) = p.secs {
                if !(s.is_finite() && s >= 0.0) {
                    return Err(malformed(
                        path,
                        line,
                        format!("`pass_end` event: `secs` must be 0 or more, got {s}"),
                    ));
                }
            }
        }
        out.events.push(Timed { t, ev });
    }
    Ok(())
}

fn read_log(run_dir: &Path) -> Result<EventLog, ReportError> {
    let current = run_dir.join("events.jsonl");
    let older = run_dir.join("events.1.jsonl");
    let mut log = EventLog {
        files: Vec::new(),
        events: Vec::new(),
        lines: 0,
        warnings: Vec::new(),
    };
    let read = |p: &Path| -> Result<Option<String>, ReportError> {
        match std::fs::read_to_string(p) {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(ReportError::Io {
                path: p.to_path_buf(),
                source,
            }),
        }
    };
    let older_text = read(&older)?;
    let current_text = read(&current)?;
    if older_text.is_none() && current_text.is_none() {
        return Err(ReportError::NoEvents {
            run_dir: run_dir.to_path_buf(),
        });
    }
    if let Some(text) = older_text {
        parse_events(&text, &older, false, &mut log)?;
        log.files.push(older);
    }
    if let Some(text) = current_text {
        parse_events(&text, &current, true, &mut log)?;
        log.files.push(current);
    }
    Ok(log)
}

// ---------------------------------------------------------------------------------------
// Analysis (pure)

/// One pass, as the analysis sees it.
struct Pass {
    t: f64,
    sequence: Option<u64>,
    epoch: Option<u64>,
    mini_epoch: Option<u32>,
    pass: Option<u32>,
    view_bytes: Option<u64>,
    secs: Option<f64>,
    decision: Option<String>,
}

/// Everything the plots and the summary need.
struct Analysis {
    t0: f64,
    t_end: f64,
    starts: u64,
    last_start: Option<StartEv>,
    passes: Vec<Pass>,
    rows: Vec<MiniEpochRow>,
    /// (t, cumulative tier bytes), restarts folded in.
    tier: Vec<(f64, f64)>,
    tier_source: &'static str,
    tier_bytes_read: u64,
    staged: u64,
    staged_fetched: u64,
    staged_secs: f64,
    warnings: Vec<String>,
}

fn analyse(log: EventLog) -> Analysis {
    let mut warnings = log.warnings;
    let t0 = log.events.iter().map(|e| e.t).fold(f64::INFINITY, f64::min);
    let t_end = log
        .events
        .iter()
        .map(|e| e.t)
        .fold(f64::NEG_INFINITY, f64::max);
    let (t0, t_end) = if t0.is_finite() {
        (t0, t_end)
    } else {
        (0.0, 0.0)
    };
    let mut starts = 0;
    let mut last_start = None;
    let mut passes: Vec<Pass> = Vec::new();
    let mut switches: Vec<(Option<u64>, u32, Option<u32>)> = Vec::new();
    let mut tier: Vec<(f64, f64)> = Vec::new();
    let (mut tier_offset, mut tier_last) = (0u64, 0u64);
    let (mut staged, mut staged_fetched, mut staged_secs) = (0u64, 0u64, 0.0f64);
    let mut staged_points: Vec<(f64, f64)> = Vec::new();
    // The time the current pass began, when known: the previous pass_end or start.
    let mut pass_origin: Option<f64> = None;
    let first_is_start = matches!(log.events.first().map(|e| &e.ev), Some(Event::Start(_)));
    if !first_is_start && !log.events.is_empty() {
        warnings.push(
            "the log does not begin with a `start` event (rotated past the run's start?): totals cover the logged part only"
                .into(),
        );
    }
    for Timed { t, ev } in log.events {
        match ev {
            Event::Start(s) => {
                starts += 1;
                last_start = Some(s);
                // A restarted daemon counts tier bytes from 0 again.
                tier_offset += tier_last;
                tier_last = 0;
                pass_origin = Some(t);
            }
            Event::PassEnd(p) => {
                let secs = p.secs.or_else(|| pass_origin.map(|o| (t - o).max(0.0)));
                pass_origin = Some(t);
                passes.push(Pass {
                    t,
                    sequence: p.sequence,
                    epoch: p.epoch,
                    mini_epoch: p.mini_epoch,
                    pass: p.pass,
                    view_bytes: p.view_bytes,
                    secs,
                    decision: p.decision,
                });
            }
            Event::Decision(d) => {
                if let (Some(last), Some(dec)) = (passes.last_mut(), d.decision) {
                    if last.decision.is_none() {
                        last.decision = Some(dec);
                    }
                }
            }
            Event::Staged(s) => {
                staged += 1;
                let fetched = s.bytes_fetched.or(s.bytes).unwrap_or(0);
                staged_fetched += fetched;
                if let Some(secs) = s.secs.filter(|s| s.is_finite() && *s > 0.0) {
                    staged_secs += secs;
                    let before = staged_points.last().map_or(0.0, |p| p.1);
                    staged_points.push((t - secs, before));
                    staged_points.push((t, before + fetched as f64));
                }
            }
            Event::Switch(s) => switches.push((s.sequence, s.prev_rf, s.prev_wanted_rf)),
            Event::Tier(x) => {
                if x.tier_bytes_read < tier_last {
                    tier_offset += tier_last;
                }
                tier_last = x.tier_bytes_read;
                tier.push((t, (tier_offset + tier_last) as f64));
            }
        }
    }
    let (tier_source, tier_bytes_read) = if !tier.is_empty() {
        ("tier events", tier_offset + tier_last)
    } else if staged > 0 {
        ("staged events", staged_fetched)
    } else {
        ("none", 0)
    };
    if tier.is_empty() {
        // Staging intervals are the best picture of tier traffic without `tier` events.
        tier = staged_points;
        tier.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    let rows = completed_mini_epochs(&passes, &switches);
    Analysis {
        t0,
        t_end,
        starts,
        last_start,
        passes,
        rows,
        tier,
        tier_source,
        tier_bytes_read,
        staged,
        staged_fetched,
        staged_secs,
        warnings,
    }
}

/// Completed mini-epochs: one per switch, and for sequences whose switch is not in the log but
/// which were followed by a later sequence, one from their passes.
fn completed_mini_epochs(
    passes: &[Pass],
    switches: &[(Option<u64>, u32, Option<u32>)],
) -> Vec<MiniEpochRow> {
    use std::collections::BTreeMap;
    let mut rows: BTreeMap<u64, MiniEpochRow> = BTreeMap::new();
    let mut next_unnumbered = 0u64;
    for &(seq, rf, wanted) in switches {
        // `sequence` is the new mini-epoch's; the completed one is the one before.
        let prev = match seq {
            Some(s) => s.saturating_sub(1),
            None => next_unnumbered,
        };
        next_unnumbered = prev + 1;
        rows.insert(
            prev,
            MiniEpochRow {
                sequence: prev,
                epoch: None,
                mini_epoch: None,
                rf,
                wanted_rf: wanted,
                bonus_passes: 0,
            },
        );
    }
    let max_seq = passes
        .iter()
        .filter_map(|p| p.sequence)
        .chain(switches.iter().filter_map(|s| s.0))
        .max();
    for p in passes {
        let Some(seq) = p.sequence else { continue };
        let completed = max_seq.is_some_and(|m| seq < m);
        if !completed && !rows.contains_key(&seq) {
            continue;
        }
        let row = rows.entry(seq).or_insert_with(|| MiniEpochRow {
            sequence: seq,
            epoch: None,
            mini_epoch: None,
            rf: 0,
            wanted_rf: None,
            bonus_passes: 0,
        });
        row.epoch = row.epoch.or(p.epoch);
        row.mini_epoch = row.mini_epoch.or(p.mini_epoch);
        if p.decision.as_deref() == Some("wait") {
            row.bonus_passes += 1;
        }
    }
    // Rows made from passes alone take the highest pass seen.
    for row in rows.values_mut() {
        if row.rf == 0 {
            row.rf = passes
                .iter()
                .filter(|p| p.sequence == Some(row.sequence))
                .filter_map(|p| p.pass)
                .max()
                .unwrap_or(0);
        }
    }
    rows.into_values().filter(|r| r.rf > 0).collect()
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[u32], p: f64) -> u32 {
    let n = sorted.len();
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

fn rf_stats(rows: &[MiniEpochRow]) -> Option<RfStats> {
    if rows.is_empty() {
        return None;
    }
    let mut v: Vec<u32> = rows.iter().map(|r| r.rf).collect();
    v.sort_unstable();
    Some(RfStats {
        mean: v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64,
        min: v[0],
        p10: percentile(&v, 10.0),
        p25: percentile(&v, 25.0),
        p50: percentile(&v, 50.0),
        p75: percentile(&v, 75.0),
        p90: percentile(&v, 90.0),
        max: v[v.len() - 1],
    })
}

fn summarise(a: &Analysis, run_dir: &Path, files: Vec<PathBuf>, events: u64) -> ReportSummary {
    let bytes_consumed: u64 = a.passes.iter().filter_map(|p| p.view_bytes).sum();
    let (eb1_bytes, eb1_secs) = a
        .passes
        .iter()
        .filter_map(|p| Some((p.view_bytes?, p.secs.filter(|s| *s > 0.0)?)))
        .fold((0.0, 0.0), |(b, s), (vb, ps)| (b + vb as f64, s + ps));
    let timed: Vec<f64> = a.passes.iter().filter_map(|p| p.secs).collect();
    let eb1 = (eb1_secs > 0.0).then(|| eb1_bytes / eb1_secs);
    let b2 = (a.staged_secs > 0.0).then(|| a.staged_fetched as f64 / a.staged_secs);
    let duration = a.t_end - a.t0;
    let wanted: Vec<f64> = a
        .rows
        .iter()
        .filter_map(|r| r.wanted_rf.map(f64::from))
        .collect();
    let s = a.last_start.as_ref();
    ReportSummary {
        run_dir: run_dir.to_path_buf(),
        event_files: Vec::new(),
        events,
        files,
        warnings: a.warnings.clone(),
        duration_secs: duration,
        dataset_bytes: s.and_then(|s| s.dataset_bytes),
        dataset_files: s.and_then(|s| s.dataset_files),
        mini_epochs_per_epoch: s.and_then(|s| s.mini_epochs),
        rf_policy: s.and_then(|s| s.rf_policy.clone()),
        budget_bytes: s.and_then(|s| s.budget_bytes),
        node_rank: s.and_then(|s| s.node_rank),
        nodes: s.and_then(|s| s.nodes),
        starts: a.starts,
        mini_epochs_completed: a.rows.len() as u64,
        passes: a.passes.len() as u64,
        bonus_passes: a
            .passes
            .iter()
            .filter(|p| p.decision.as_deref() == Some("wait"))
            .count() as u64,
        rf: rf_stats(&a.rows),
        wanted_rf_mean: (!wanted.is_empty())
            .then(|| wanted.iter().sum::<f64>() / wanted.len() as f64),
        tier_bytes_read: a.tier_bytes_read,
        tier_bytes_source: a.tier_source.to_string(),
        bytes_consumed,
        tier_to_consumed_ratio: (bytes_consumed > 0)
            .then(|| a.tier_bytes_read as f64 / bytes_consumed as f64),
        staged_mini_epochs: a.staged,
        staged_bytes_fetched: a.staged_fetched,
        b2_bytes_per_s: b2,
        eb1_bytes_per_s: eb1,
        eb2_bytes_per_s: (duration > 0.0).then(|| a.tier_bytes_read as f64 / duration),
        stall_free_rf: match (eb1, b2) {
            (Some(e), Some(b)) if b > 0.0 => Some((e / b).ceil().max(1.0) as u32),
            _ => None,
        },
        mean_pass_secs: (!timed.is_empty()).then(|| timed.iter().sum::<f64>() / timed.len() as f64),
        mini_epochs: a.rows.clone(),
    }
}

fn rate(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() && v >= 0.0 => format!("{}/s", format_bytes(v.round() as u64)),
        _ => "n/a".into(),
    }
}

/// The human-readable summary (`summary.txt`).
pub fn summary_text(s: &ReportSummary) -> String {
    let mut o = String::new();
    let opt = |v: Option<String>| v.unwrap_or_else(|| "n/a".into());
    let _ = writeln!(o, "metfs run report: {}", s.run_dir.display());
    let _ = writeln!(
        o,
        "events:                 {} from {}",
        s.events,
        s.event_files
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(o, "duration:               {:.1} s", s.duration_secs);
    let _ = writeln!(
        o,
        "dataset:                {} in {} files, {} mini-epochs per epoch, budget {}",
        opt(s.dataset_bytes.map(format_bytes)),
        opt(s.dataset_files.map(|v| v.to_string())),
        opt(s.mini_epochs_per_epoch.map(|v| v.to_string())),
        opt(s.budget_bytes.map(format_bytes)),
    );
    let _ = writeln!(
        o,
        "node:                   {} of {}, rf policy {}, daemon starts {}",
        opt(s.node_rank.map(|v| v.to_string())),
        opt(s.nodes.map(|v| v.to_string())),
        s.rf_policy.as_deref().unwrap_or("n/a"),
        s.starts
    );
    let _ = writeln!(
        o,
        "mini-epochs completed:  {} ({} passes, {} bonus passes waiting for staging)",
        s.mini_epochs_completed, s.passes, s.bonus_passes
    );
    match &s.rf {
        Some(r) => {
            let _ = writeln!(
                o,
                "rf:                     mean {:.2}; min {} p10 {} p25 {} median {} p75 {} p90 {} max {}",
                r.mean, r.min, r.p10, r.p25, r.p50, r.p75, r.p90, r.max
            );
        }
        None => {
            let _ = writeln!(o, "rf:                     n/a (no completed mini-epoch)");
        }
    }
    if let Some(w) = s.wanted_rf_mean {
        let _ = writeln!(o, "rf the policy wanted:   mean {w:.2}");
    }
    let _ = writeln!(
        o,
        "tier bytes read:        {} (from {})",
        format_bytes(s.tier_bytes_read),
        s.tier_bytes_source
    );
    let _ = writeln!(
        o,
        "bytes through the mount: {}",
        format_bytes(s.bytes_consumed)
    );
    match s.tier_to_consumed_ratio {
        Some(r) if r > 0.0 => {
            let _ = writeln!(
                o,
                "tier / mount:           {r:.4} (the tier served 1 byte per {:.2} consumed)",
                1.0 / r
            );
        }
        _ => {
            let _ = writeln!(o, "tier / mount:           n/a");
        }
    }
    let _ = writeln!(
        o,
        "staging B2:             {} ({} mini-epochs staged, {} fetched)",
        rate(s.b2_bytes_per_s),
        s.staged_mini_epochs,
        format_bytes(s.staged_bytes_fetched)
    );
    let _ = writeln!(
        o,
        "consumption EB1:        {} (mean pass {})",
        rate(s.eb1_bytes_per_s),
        s.mean_pass_secs
            .map_or("n/a".into(), |v| format!("{v:.2} s"))
    );
    let _ = writeln!(
        o,
        "tier bandwidth EB2:     {} averaged over the run",
        rate(s.eb2_bytes_per_s)
    );
    let _ = writeln!(
        o,
        "stall-free rf:          {}",
        opt(s.stall_free_rf.map(|v| format!("{v} (ceil(EB1 / B2))")))
    );
    for w in &s.warnings {
        let _ = writeln!(o, "warning:                {w}");
    }
    let _ = writeln!(
        o,
        "files:                  {}",
        s.files
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    o
}

// ---------------------------------------------------------------------------------------
// Series for the bandwidth plot (pure)

/// The capacity-tier bandwidth over time: the cumulative byte curve `points` (t, bytes),
/// sampled on `n` evenly spaced times, each value the bytes gained over the preceding window
/// divided by the window. Gaps far longer than the usual spacing between events are idle
/// staging: the bytes reported after a gap are placed in the usual spacing before it, not
/// spread over the gap. Returns (t, bytes/s).
fn smoothed_rate(points: &[(f64, f64)], n: usize) -> Vec<(f64, f64)> {
    if points.len() < 2 || n < 2 {
        return Vec::new();
    }
    let mut gaps: Vec<f64> = points
        .windows(2)
        .map(|w| w[1].0 - w[0].0)
        .filter(|d| *d > 0.0)
        .collect();
    if gaps.is_empty() {
        return Vec::new();
    }
    gaps.sort_by(f64::total_cmp);
    let typical = gaps[gaps.len() / 2];
    let mut curve: Vec<(f64, f64)> = vec![points[0]];
    for w in points.windows(2) {
        let (a, b) = (w[0], w[1]);
        if b.0 - a.0 > 3.0 * typical && b.1 > a.1 {
            curve.push((b.0 - typical, a.1));
        }
        curve.push(b);
    }
    let (start, end) = (curve[0].0, curve[curve.len() - 1].0);
    let span = end - start;
    if span <= 0.0 {
        return Vec::new();
    }
    let window = (3.0 * typical).max(span / 150.0);
    let at = |t: f64| -> f64 {
        // Piecewise-linear interpolation of the cumulative curve.
        let i = curve.partition_point(|p| p.0 <= t);
        if i == 0 {
            return curve[0].1;
        }
        if i == curve.len() {
            return curve[curve.len() - 1].1;
        }
        let (a, b) = (curve[i - 1], curve[i]);
        if b.0 <= a.0 {
            b.1
        } else {
            a.1 + (b.1 - a.1) * (t - a.0) / (b.0 - a.0)
        }
    };
    (0..n)
        .filter_map(|k| {
            let t = start + span * k as f64 / (n - 1) as f64;
            let from = (t - window).max(start);
            let len = t - from;
            (len > 0.0).then(|| (t, (at(t) - at(from)) / len))
        })
        .collect()
}

/// The cumulative bytes read through the mount: each pass adds its `view_bytes` over its
/// duration (when known), so [`smoothed_rate`] of it is the bandwidth that reading every
/// pass from the tier would have needed. Returns (t, bytes).
fn mount_curve(passes: &[Pass]) -> Vec<(f64, f64)> {
    let mut curve: Vec<(f64, f64)> = Vec::new();
    let mut total = 0.0;
    for p in passes {
        let Some(vb) = p.view_bytes else { continue };
        let last_t = curve.last().map_or(f64::NEG_INFINITY, |c| c.0);
        if let Some(secs) = p.secs.filter(|s| *s > 0.0) {
            curve.push(((p.t - secs).max(last_t), total));
        }
        total += vb as f64;
        curve.push((p.t.max(last_t), total));
    }
    curve
}

// ---------------------------------------------------------------------------------------
// Drawing

type DrawResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// The drawing area of one plot: an RGB buffer of [`PLOT_SIZE`].
type Root<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

const FONT: &str = "sans-serif";

fn register_font() -> Result<(), ReportError> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok()
            && plotters::style::register_font(FONT, FontStyle::Bold, dejavu::sans::bold()).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(ReportError::Font)
    }
}

/// A unit for byte rates: divisor and label, chosen so the largest value reads well.
fn rate_unit(max: f64) -> (f64, &'static str) {
    const UNITS: [(f64, &str); 5] = [
        (1.0, "B/s"),
        (1024.0, "KiB/s"),
        (1048576.0, "MiB/s"),
        (1073741824.0, "GiB/s"),
        (1099511627776.0, "TiB/s"),
    ];
    let mut pick = UNITS[0];
    for u in UNITS {
        if max >= u.0 {
            pick = u;
        }
    }
    pick
}

/// An axis label with as many decimals as the axis range calls for.
fn decimals(v: f64, range: f64) -> String {
    if range >= 20.0 {
        format!("{v:.0}")
    } else if range >= 2.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// A unit for elapsed time: divisor and label.
fn time_unit(span: f64) -> (f64, &'static str) {
    if span > 3.0 * 3600.0 {
        (3600.0, "hours")
    } else if span > 3.0 * 60.0 {
        (60.0, "minutes")
    } else {
        (1.0, "seconds")
    }
}

fn no_data(area: &Root<'_>, what: &str) -> DrawResult {
    let (w, h) = area.dim_in_pixel();
    area.draw(&Text::new(
        what.to_string(),
        (w as i32 / 2 - 200, h as i32 / 2),
        (FONT, 22).into_font().color(&RGBColor(120, 120, 120)),
    ))?;
    Ok(())
}

const RF_COLOR: RGBColor = RGBColor(31, 119, 180);
const WANTED_COLOR: RGBColor = RGBColor(255, 127, 14);
const STALL_COLOR: RGBColor = RGBColor(214, 39, 40);
const MEAN_COLOR: RGBColor = RGBColor(44, 160, 44);

fn legend_line(c: RGBColor) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], c.stroke_width(3))
}

fn draw_rf(root: &Root<'_>, s: &ReportSummary) -> DrawResult {
    root.fill(&WHITE)?;
    let rows = &s.mini_epochs;
    let title = format!(
        "rf per mini-epoch ({} completed, policy {})",
        rows.len(),
        s.rf_policy.as_deref().unwrap_or("n/a")
    );
    let x0 = rows.first().map_or(0.0, |r| r.sequence as f64);
    let x1 = rows.last().map_or(1.0, |r| r.sequence as f64);
    let (x0, x1) = if x1 - x0 < 1.0 {
        (x0 - 1.0, x1 + 1.0)
    } else {
        (x0 - 0.5, x1 + 0.5)
    };
    let ymax = rows
        .iter()
        .map(|r| r.rf.max(r.wanted_rf.unwrap_or(0)))
        .chain(s.stall_free_rf)
        .max()
        .unwrap_or(1)
        .max(1) as f64
        * 1.35;
    let mut chart = ChartBuilder::on(root)
        .caption(&title, (FONT, 30))
        .margin(20)
        .x_label_area_size(60)
        .y_label_area_size(80)
        .build_cartesian_2d(x0..x1, 0.0..ymax)?;
    chart
        .configure_mesh()
        .x_desc("mini-epoch (sequence in the run)")
        .y_desc("rf (passes over the mini-epoch)")
        .axis_desc_style((FONT, 22))
        .label_style((FONT, 18))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;
    if rows.is_empty() {
        return no_data(root, "no completed mini-epoch in the log yet");
    }
    let pts: Vec<(f64, f64)> = rows
        .iter()
        .map(|r| (r.sequence as f64, f64::from(r.rf)))
        .collect();
    chart
        .draw_series(LineSeries::new(
            pts.iter().copied(),
            RF_COLOR.stroke_width(2),
        ))?
        .label("rf (passes the mini-epoch got)")
        .legend(legend_line(RF_COLOR));
    let marker = if rows.len() <= 300 { 4 } else { 2 };
    chart.draw_series(
        pts.iter()
            .map(|&p| Circle::new(p, marker, RF_COLOR.filled())),
    )?;
    let wanted: Vec<(f64, f64)> = rows
        .iter()
        .filter_map(|r| {
            let w = r.wanted_rf.filter(|w| *w != r.rf)?;
            Some((r.sequence as f64, f64::from(w)))
        })
        .collect();
    if !wanted.is_empty() {
        chart
            .draw_series(
                wanted
                    .iter()
                    .map(|&p| Cross::new(p, marker + 2, WANTED_COLOR.stroke_width(2))),
            )?
            .label("rf the policy wanted, where it got more (bonus passes)")
            .legend(|(x, y)| Cross::new((x + 12, y), 6, WANTED_COLOR.stroke_width(2)));
    }
    if let Some(st) = &s.rf {
        chart
            .draw_series(DashedLineSeries::new(
                [(x0, st.mean), (x1, st.mean)],
                10,
                6,
                MEAN_COLOR.stroke_width(2),
            ))?
            .label(format!("mean rf {:.1}", st.mean))
            .legend(legend_line(MEAN_COLOR));
    }
    if let Some(sf) = s.stall_free_rf {
        let y = f64::from(sf);
        chart
            .draw_series(DashedLineSeries::new(
                [(x0, y), (x1, y)],
                4,
                4,
                STALL_COLOR.stroke_width(2),
            ))?
            .label(format!("stall-free rf {sf} = ceil(EB1/B2)"))
            .legend(legend_line(STALL_COLOR));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 18))
        .draw()?;
    Ok(())
}

fn draw_histogram(root: &Root<'_>, s: &ReportSummary) -> DrawResult {
    root.fill(&WHITE)?;
    let rfs: Vec<u32> = s.mini_epochs.iter().map(|r| r.rf).collect();
    // The axis starts at rf 1, so the stall-free rf and small rf show in context; bins are
    // whole numbers of passes, at most about 40 of them.
    let min = 1u32;
    let max = rfs
        .iter()
        .copied()
        .chain(s.stall_free_rf)
        .max()
        .unwrap_or(1)
        .max(1);
    let width = max.div_ceil(40).max(1);
    let nbins = (max - min) / width + 1;
    let mut counts = vec![0u32; nbins as usize];
    for &rf in &rfs {
        counts[((rf.max(min) - min) / width) as usize] += 1;
    }
    let lo = f64::from(min) - 0.5;
    let hi = f64::from(min + nbins * width) - 0.5;
    let ymax = f64::from(counts.iter().copied().max().unwrap_or(1).max(1)) * 1.3;
    let title = format!(
        "Distribution of rf over {} mini-epochs{}",
        rfs.len(),
        s.rf.as_ref().map_or(String::new(), |r| format!(
            " (mean {:.1}, median {})",
            r.mean, r.p50
        ))
    );
    let mut chart = ChartBuilder::on(root)
        .caption(&title, (FONT, 30))
        .margin(20)
        .x_label_area_size(60)
        .y_label_area_size(80)
        .build_cartesian_2d(lo..hi, 0.0..ymax)?;
    let xdesc = if width == 1 {
        "rf (passes over the mini-epoch)".to_string()
    } else {
        format!("rf (passes over the mini-epoch), bins of {width}")
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc(xdesc)
        .y_desc("mini-epochs")
        .axis_desc_style((FONT, 22))
        .label_style((FONT, 18))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;
    if rfs.is_empty() {
        return no_data(root, "no completed mini-epoch in the log yet");
    }
    chart
        .draw_series(
            counts
                .iter()
                .enumerate()
                .filter(|(_, c)| **c > 0)
                .map(|(i, &c)| {
                    let b0 = f64::from(min + i as u32 * width) - 0.5;
                    let b1 = b0 + f64::from(width);
                    let pad = 0.08 * f64::from(width);
                    Rectangle::new(
                        [(b0 + pad, 0.0), (b1 - pad, f64::from(c))],
                        RF_COLOR.filled(),
                    )
                }),
        )?
        .label("mini-epochs with this rf")
        .legend(|(x, y)| Rectangle::new([(x, y - 6), (x + 20, y + 6)], RF_COLOR.filled()));
    if let Some(sf) = s.stall_free_rf {
        let x = f64::from(sf);
        if x >= lo && x <= hi {
            chart
                .draw_series(DashedLineSeries::new(
                    [(x, 0.0), (x, ymax)],
                    4,
                    4,
                    STALL_COLOR.stroke_width(2),
                ))?
                .label(format!("stall-free rf {sf}"))
                .legend(legend_line(STALL_COLOR));
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 18))
        .draw()?;
    Ok(())
}

fn draw_bandwidth(root: &Root<'_>, a: &Analysis, s: &ReportSummary) -> DrawResult {
    root.fill(&WHITE)?;
    let tier = smoothed_rate(&a.tier, 400);
    let needed = smoothed_rate(&mount_curve(&a.passes), 400);
    let span = (a.t_end - a.t0).max(1.0);
    let (tdiv, tlabel) = time_unit(span);
    let vmax = tier
        .iter()
        .chain(needed.iter())
        .map(|p| p.1)
        .chain(s.eb1_bytes_per_s)
        .chain(s.eb2_bytes_per_s)
        .fold(0.0, f64::max)
        .max(1.0);
    let (bdiv, blabel) = rate_unit(vmax);
    let x = |t: f64| (t - a.t0) / tdiv;
    let y = |v: f64| v / bdiv;
    let title = "Capacity-tier bandwidth with MET vs reading every pass from the tier";
    // Headroom above the data for the legend.
    let ytop = y(vmax) * 1.45;
    let xtop = span / tdiv;
    let mut chart = ChartBuilder::on(root)
        .caption(title, (FONT, 28))
        .margin(20)
        .x_label_area_size(60)
        .y_label_area_size(90)
        .build_cartesian_2d(0.0..xtop, 0.0..ytop)?;
    let xfmt = |v: &f64| decimals(*v, xtop);
    let yfmt = |v: &f64| decimals(*v, ytop);
    chart
        .configure_mesh()
        .x_desc(format!("time since the first event ({tlabel})"))
        .y_desc(format!("bandwidth ({blabel})"))
        .axis_desc_style((FONT, 22))
        .label_style((FONT, 18))
        .x_label_formatter(&xfmt)
        .y_label_formatter(&yfmt)
        .draw()?;
    if tier.is_empty() && needed.is_empty() {
        return no_data(root, "no tier traffic or timed pass in the log yet");
    }
    if !needed.is_empty() {
        chart
            .draw_series(LineSeries::new(
                needed.iter().map(|p| (x(p.0), y(p.1))),
                WANTED_COLOR.stroke_width(2),
            ))?
            .label("needed without MET: bytes read through the mount per second (smoothed)")
            .legend(legend_line(WANTED_COLOR));
    }
    if !tier.is_empty() {
        chart.draw_series(AreaSeries::new(
            tier.iter().map(|p| (x(p.0), y(p.1))),
            0.0,
            RF_COLOR.mix(0.25),
        ))?;
        chart
            .draw_series(LineSeries::new(
                tier.iter().map(|p| (x(p.0), y(p.1))),
                RF_COLOR.stroke_width(2),
            ))?
            .label(format!(
                "capacity tier with MET ({}, smoothed)",
                a.tier_source
            ))
            .legend(legend_line(RF_COLOR));
    }
    let x1 = span / tdiv;
    if let Some(eb2) = s.eb2_bytes_per_s {
        chart
            .draw_series(DashedLineSeries::new(
                [(0.0, y(eb2)), (x1, y(eb2))],
                10,
                6,
                MEAN_COLOR.stroke_width(2),
            ))?
            .label(format!("EB2, MET average: {}", rate(Some(eb2))))
            .legend(legend_line(MEAN_COLOR));
    }
    if let Some(eb1) = s.eb1_bytes_per_s {
        chart
            .draw_series(DashedLineSeries::new(
                [(0.0, y(eb1)), (x1, y(eb1))],
                4,
                4,
                STALL_COLOR.stroke_width(2),
            ))?
            .label(format!("EB1, consumption average: {}", rate(Some(eb1))))
            .legend(legend_line(STALL_COLOR));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font((FONT, 18))
        .draw()?;
    Ok(())
}

fn plot_err(path: &Path, e: impl std::fmt::Display) -> ReportError {
    ReportError::Plot {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// Draws one plot into an RGB buffer and writes it as a PNG.
///
/// The encoding is done here with the `png` crate rather than by plotters' `bitmap_encoder`
/// (the `image` crate): it drops a large dependency, and unfiltered rows with default
/// compression suit plots (large flat areas), keeping files small and encoding fast even in
/// debug builds.
fn render_png(path: &Path, draw: impl FnOnce(&Root<'_>) -> DrawResult) -> Result<(), ReportError> {
    let (w, h) = PLOT_SIZE;
    let mut buf = vec![0u8; w as usize * h as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut buf, PLOT_SIZE).into_drawing_area();
        draw(&root).map_err(|e| plot_err(path, e))?;
        root.present().map_err(|e| plot_err(path, e))?;
    }
    let io = |source| ReportError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::create(path).map_err(io)?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.set_compression(png::Compression::Default);
    enc.set_filter(png::FilterType::NoFilter);
    enc.set_adaptive_filter(png::AdaptiveFilterType::NonAdaptive);
    let mut writer = enc.write_header().map_err(|e| plot_err(path, e))?;
    writer
        .write_image_data(&buf)
        .map_err(|e| plot_err(path, e))?;
    writer.finish().map_err(|e| plot_err(path, e))?;
    Ok(())
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    std::fs::write(path, bytes).map_err(|source| ReportError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn load(run_dir: &Path, files: Vec<PathBuf>) -> Result<(Analysis, ReportSummary), ReportError> {
    let log = read_log(run_dir)?;
    let event_files = log.files.clone();
    let events = log.lines;
    let analysis = analyse(log);
    let mut summary = summarise(&analysis, run_dir, files, events);
    summary.event_files = event_files;
    Ok((analysis, summary))
}

/// Reads `run_dir`'s event log and writes the plots and summaries into `out_dir` (created if
/// missing; existing report files are replaced). Returns the summary, which lists the files.
pub fn report(run_dir: &Path, out_dir: &Path) -> Result<ReportSummary, ReportError> {
    let names = [
        RF_PLOT,
        RF_HISTOGRAM,
        BANDWIDTH_PLOT,
        SUMMARY_TXT,
        SUMMARY_JSON,
    ];
    let files: Vec<PathBuf> = names.iter().map(|n| out_dir.join(n)).collect();
    let (analysis, summary) = load(run_dir, files.clone())?;
    std::fs::create_dir_all(out_dir).map_err(|source| ReportError::Io {
        path: out_dir.to_path_buf(),
        source,
    })?;
    register_font()?;
    render_png(&files[0], |root| draw_rf(root, &summary))?;
    render_png(&files[1], |root| draw_histogram(root, &summary))?;
    render_png(&files[2], |root| draw_bandwidth(root, &analysis, &summary))?;
    write_file(&files[3], summary_text(&summary).as_bytes())?;
    let json = serde_json::to_vec_pretty(&summary).expect("the summary serializes");
    write_file(&files[4], &json)?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const MIB: u64 = 1 << 20;

    /// The summary without plots or files.
    fn summarize(run_dir: &Path) -> Result<ReportSummary, ReportError> {
        Ok(load(run_dir, Vec::new())?.1)
    }

    /// A synthetic run: 1 GiB dataset, 4 mini-epochs of 256 MiB per epoch, 2 epochs.
    /// Each pass takes 2 s (EB1 = 128 MiB/s); staging takes 8 s per mini-epoch
    /// (B2 = 32 MiB/s), so the stall-free rf is 4. rf per mini-epoch cycles 2, 4, 6, 8; the
    /// rf-2 mini-epochs end with 2 `wait` passes, the passes beyond it (rf the policy wanted
    /// is 2, but it got 4 passes because staging was late).
    fn synthetic() -> (Vec<Value>, Vec<u32>) {
        let view = 256 * MIB;
        let t0 = 1_700_000_000.0;
        let mut ev = vec![json!({
            "t": t0, "event": "start", "dataset_bytes": 4 * view, "dataset_files": 4096,
            "mini_epochs": 4, "view_bytes": view, "rf_policy": "score",
            "budget_bytes": 600 * MIB, "node_rank": 0, "nodes": 1, "future_field": [1, 2]
        })];
        let mut t = t0;
        let mut tier = 0u64;
        let mut rfs = Vec::new();
        for seq in 0..8u64 {
            let wanted = [2u32, 4, 6, 8][seq as usize % 4];
            let rf = wanted.max(4);
            rfs.push(rf);
            // Staging of the next mini-epoch runs during the first 8 s of this one.
            let stage_start = t;
            for pass in 1..=rf {
                t += 2.0;
                // Tier counter every 2 s while staging.
                if t - stage_start <= 8.0 {
                    tier += view / 4;
                    ev.push(json!({"t": t - 0.01, "event": "tier", "tier_bytes_read": tier}));
                }
                let decision = if pass < wanted {
                    "repeat"
                } else if pass < rf {
                    "wait"
                } else {
                    "advance"
                };
                ev.push(json!({
                    "t": t, "event": "pass_end", "epoch": seq / 4, "mini_epoch": seq % 4,
                    "sequence": seq, "pass": pass, "decision": decision,
                    "score": if pass == 1 { Value::Null } else { json!(0.5) },
                    "view_bytes": view
                }));
                if t - stage_start == 8.0 {
                    ev.push(json!({
                        "t": t, "event": "staged", "epoch": (seq + 1) / 4,
                        "mini_epoch": (seq + 1) % 4, "bytes": view, "bytes_fetched": view,
                        "secs": 8.0
                    }));
                }
            }
            ev.push(json!({
                "t": t, "event": "switch", "epoch": (seq + 1) / 4, "mini_epoch": (seq + 1) % 4,
                "generation": seq + 2, "sequence": seq + 1, "prev_rf": rf,
                "prev_wanted_rf": if wanted < rf { json!(wanted) } else { Value::Null }
            }));
            ev.push(json!({"t": t, "event": "unknown_kind", "x": 1}));
        }
        (ev, rfs)
    }

    fn write_events(dir: &Path, name: &str, events: &[Value]) {
        let text: String = events.iter().map(|e| format!("{e}\n")).collect();
        std::fs::write(dir.join(name), text).unwrap();
    }

    fn png_dims(path: &Path) -> (u32, u32) {
        let bytes = std::fs::read(path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{}", path.display());
        let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).unwrap();
        // Something besides the white background was drawn.
        assert!(buf[..info.buffer_size()].iter().any(|&b| b < 128));
        (info.width, info.height)
    }

    #[test]
    fn synthetic_run_gives_plots_and_right_numbers() {
        let run = tempfile::tempdir().unwrap();
        let out = tempfile::tempdir().unwrap();
        let (events, rfs) = synthetic();
        write_events(run.path(), "events.jsonl", &events);
        let s = report(run.path(), &out.path().join("report")).unwrap();
        for f in &s.files {
            assert!(f.exists(), "{}", f.display());
        }
        for name in [RF_PLOT, RF_HISTOGRAM, BANDWIDTH_PLOT] {
            assert_eq!(png_dims(&out.path().join("report").join(name)), PLOT_SIZE);
        }
        let j: Value = serde_json::from_slice(
            &std::fs::read(out.path().join("report").join(SUMMARY_JSON)).unwrap(),
        )
        .unwrap();
        let view = (256 * MIB) as f64;
        let passes: u32 = rfs.iter().sum();
        assert_eq!(rfs, vec![4, 4, 6, 8, 4, 4, 6, 8]);
        assert_eq!(j["mini_epochs_completed"], 8);
        assert_eq!(j["passes"], u64::from(passes));
        assert_eq!(j["bonus_passes"], 4);
        assert_eq!(j["rf"]["mean"], 5.5);
        assert_eq!(j["rf"]["min"], 4);
        assert_eq!(j["rf"]["p25"], 4);
        assert_eq!(j["rf"]["p50"], 4);
        assert_eq!(j["rf"]["p75"], 6);
        assert_eq!(j["rf"]["p90"], 8);
        assert_eq!(j["rf"]["max"], 8);
        assert_eq!(j["wanted_rf_mean"], 2.0);
        assert_eq!(j["bytes_consumed"], u64::from(passes) * 256 * MIB);
        assert_eq!(j["tier_bytes_read"], 8 * 256 * MIB);
        assert_eq!(j["tier_bytes_source"], "tier events");
        let ratio = j["tier_to_consumed_ratio"].as_f64().unwrap();
        assert!((ratio - 8.0 / f64::from(passes)).abs() < 1e-12);
        assert_eq!(j["staged_mini_epochs"], 8);
        assert!((j["b2_bytes_per_s"].as_f64().unwrap() - view / 8.0).abs() < 1e-6);
        assert!((j["eb1_bytes_per_s"].as_f64().unwrap() - view / 2.0).abs() < 1e-6);
        assert_eq!(j["stall_free_rf"], 4);
        assert_eq!(j["mean_pass_secs"], 2.0);
        assert_eq!(j["starts"], 1);
        assert_eq!(j["dataset_files"], 4096);
        assert_eq!(j["mini_epochs_per_epoch"], 4);
        assert_eq!(j["mini_epochs"][1]["bonus_passes"], 0);
        assert_eq!(j["mini_epochs"][4]["bonus_passes"], 2);
        assert_eq!(j["mini_epochs"][4]["epoch"], 1);
        assert_eq!(j["mini_epochs"][4]["wanted_rf"], 2);
        let duration = f64::from(passes) * 2.0;
        assert!((j["duration_secs"].as_f64().unwrap() - duration).abs() < 1e-6);
        assert!((j["eb2_bytes_per_s"].as_f64().unwrap() - 8.0 * view / duration).abs() < 1e-3);
        assert!(j["warnings"].as_array().unwrap().is_empty());
        let text = std::fs::read_to_string(out.path().join("report").join(SUMMARY_TXT)).unwrap();
        assert!(
            text.contains("mini-epochs completed:  8 (44 passes, 4 bonus passes"),
            "{text}"
        );
        assert!(text.contains("stall-free rf:          4"), "{text}");
        // The returned summary is what the JSON file holds.
        assert_eq!(
            serde_json::to_vec_pretty(&s).unwrap(),
            std::fs::read(out.path().join("report").join(SUMMARY_JSON)).unwrap()
        );
    }

    #[test]
    fn rotated_log_is_read_older_first_and_decisions_may_come_separately() {
        let run = tempfile::tempdir().unwrap();
        // The daemon's own shape: `verdict` on pass_end, the decision in its own event,
        // `secs` on pass_end.
        let older = vec![
            json!({"t": 100.0, "event": "start", "mini_epochs": 2, "view_bytes": 100}),
            json!({"t": 101.0, "event": "pass_end", "sequence": 0, "pass": 1, "verdict": "advance", "view_bytes": 100, "secs": 1.0}),
            json!({"t": 101.0, "event": "decision", "decision": "wait"}),
            json!({"t": 102.0, "event": "pass_end", "sequence": 0, "pass": 2, "verdict": "advance", "view_bytes": 100, "secs": 1.0}),
            json!({"t": 102.0, "event": "decision", "decision": "advance"}),
        ];
        let current = vec![
            json!({"t": 102.0, "event": "switch", "sequence": 1, "prev_rf": 2, "prev_wanted_rf": 1}),
            json!({"t": 104.0, "event": "pass_end", "sequence": 1, "pass": 1, "verdict": "advance", "view_bytes": 100, "secs": 2.0}),
            json!({"t": 104.0, "event": "decision", "decision": "advance"}),
            json!({"t": 104.0, "event": "switch", "sequence": 2, "prev_rf": 1, "prev_wanted_rf": 1}),
            json!({"t": 106.0, "event": "pass_end", "sequence": 2, "pass": 1, "verdict": "repeat", "view_bytes": 100}),
        ];
        write_events(run.path(), "events.1.jsonl", &older);
        write_events(run.path(), "events.jsonl", &current);
        let s = summarize(run.path()).unwrap();
        assert!(s.files.is_empty());
        assert_eq!(s.event_files.len(), 2);
        assert!(s.event_files[0].ends_with("events.1.jsonl"));
        assert_eq!(s.mini_epochs_completed, 2);
        assert_eq!(s.passes, 4);
        assert_eq!(s.bonus_passes, 1);
        assert_eq!(s.mini_epochs[0].bonus_passes, 1);
        assert_eq!(s.rf.as_ref().unwrap().mean, 1.5);
        assert_eq!(s.bytes_consumed, 400);
        // The last pass has no `secs`: 2 s since the previous pass_end.
        assert_eq!(s.eb1_bytes_per_s, Some(400.0 / 6.0));
        // No tier or staged events: nothing read from the tier is known.
        assert_eq!(s.tier_bytes_source, "none");
        assert_eq!(s.b2_bytes_per_s, None);
        assert_eq!(s.stall_free_rf, None);
    }

    #[test]
    fn restarts_fold_the_tier_counter_and_missing_switches_come_from_passes() {
        let run = tempfile::tempdir().unwrap();
        let ev = vec![
            // Rotated past the start: no `start` first.
            json!({"t": 10.0, "event": "tier", "tier_bytes_read": 1000}),
            json!({"t": 11.0, "event": "pass_end", "sequence": 5, "pass": 3, "view_bytes": 10}),
            json!({"t": 12.0, "event": "tier", "tier_bytes_read": 1500}),
            json!({"t": 20.0, "event": "start", "mini_epochs": 8}),
            json!({"t": 21.0, "event": "tier", "tier_bytes_read": 200}),
            json!({"t": 22.0, "event": "pass_end", "sequence": 6, "pass": 1, "view_bytes": 10}),
            json!({"t": 23.0, "event": "staged", "bytes_fetched": 300, "secs": 3.0}),
        ];
        write_events(run.path(), "events.jsonl", &ev);
        let s = summarize(run.path()).unwrap();
        assert_eq!(s.tier_bytes_read, 1700);
        assert_eq!(s.starts, 1);
        assert_eq!(s.mini_epochs_completed, 1);
        assert_eq!(s.mini_epochs[0].sequence, 5);
        assert_eq!(s.mini_epochs[0].rf, 3);
        assert_eq!(s.b2_bytes_per_s, Some(100.0));
        assert_eq!(s.warnings.len(), 1, "{:?}", s.warnings);
        assert!(s.warnings[0].contains("start"));
    }

    #[test]
    fn malformed_lines_name_file_and_line() {
        let run = tempfile::tempdir().unwrap();
        let p = run.path().join("events.jsonl");
        let cases = [
            ("{\"t\":1,\"event\":\"start\"}\nnot json\n{\"t\":2,\"event\":\"tier\",\"tier_bytes_read\":1}\n", 2, "not a JSON object"),
            ("{\"t\":1,\"event\":\"start\"}\n{\"event\":\"tier\",\"tier_bytes_read\":1}\n", 2, "missing `t`"),
            ("{\"t\":1}\n", 1, "missing `event`"),
            ("\n{\"t\":1,\"event\":\"switch\",\"prev_rf\":\"many\"}\n", 2, "`switch` event"),
            ("{\"t\":1,\"event\":\"tier\"}\n", 1, "tier_bytes_read"),
            ("[1,2]\n", 1, "not a JSON object"),
        ];
        for (text, line, what) in cases {
            std::fs::write(&p, text).unwrap();
            let e = summarize(run.path()).unwrap_err();
            let msg = e.to_string();
            assert!(
                matches!(e, ReportError::Malformed { line: l, .. } if l == line),
                "{msg}"
            );
            assert!(
                msg.starts_with(&format!("{}, line {line}: ", p.display())),
                "{msg}"
            );
            assert!(msg.contains(what), "{msg}");
        }
        // A torn last line (no newline) is tolerated with a warning ...
        std::fs::write(&p, "{\"t\":1,\"event\":\"start\"}\n{\"t\":2,\"ev").unwrap();
        let s = summarize(run.path()).unwrap();
        assert!(
            s.warnings[0].contains("line 2: skipped a torn last line"),
            "{:?}",
            s.warnings
        );
        // ... but not in the older, rotated file.
        std::fs::write(run.path().join("events.1.jsonl"), "{\"t\":1,\"ev").unwrap();
        let e = summarize(run.path()).unwrap_err();
        assert!(e.to_string().contains("events.1.jsonl, line 1"), "{e}");
    }

    #[test]
    fn empty_or_missing_logs() {
        let run = tempfile::tempdir().unwrap();
        let out = tempfile::tempdir().unwrap();
        let e = report(run.path(), out.path()).unwrap_err();
        assert!(matches!(e, ReportError::NoEvents { .. }));
        assert!(e.to_string().contains("no events.jsonl in"), "{e}");
        std::fs::write(
            run.path().join("events.jsonl"),
            "{\"t\":1,\"event\":\"start\"}\n",
        )
        .unwrap();
        let s = report(run.path(), out.path()).unwrap();
        assert_eq!(s.mini_epochs_completed, 0);
        assert_eq!(s.rf, None);
        for name in [RF_PLOT, RF_HISTOGRAM, BANDWIDTH_PLOT] {
            assert_eq!(png_dims(&out.path().join(name)), PLOT_SIZE);
        }
        assert!(summary_text(&s).contains("rf:                     n/a"));
    }

    #[test]
    fn smoothing_keeps_the_average_and_idle_gaps() {
        // 100 B/s for 10 s (events every second), idle 50 s, 100 B/s for 10 s.
        let mut pts: Vec<(f64, f64)> = (0..=10).map(|i| (i as f64, 100.0 * i as f64)).collect();
        pts.extend((1..=10).map(|i| (60.0 + i as f64, 1000.0 + 100.0 * i as f64)));
        let r = smoothed_rate(&pts, 141);
        // The first sample has no window behind it.
        assert_eq!(r.len(), 140);
        let at = |t: f64| {
            r.iter()
                .min_by(|a, b| (a.0 - t).abs().total_cmp(&(b.0 - t).abs()))
                .unwrap()
                .1
        };
        assert!((at(8.0) - 100.0).abs() < 1e-6, "{}", at(8.0));
        assert!(at(35.0).abs() < 1e-6, "{}", at(35.0));
        assert!((at(68.0) - 100.0).abs() < 1e-6, "{}", at(68.0));
        assert!(smoothed_rate(&pts[..1], 10).is_empty());
    }

    #[test]
    fn mount_curve_spreads_each_pass_over_its_duration() {
        let pass = |t: f64, secs: Option<f64>| Pass {
            t,
            sequence: Some(0),
            epoch: None,
            mini_epoch: None,
            pass: None,
            view_bytes: Some(100),
            secs,
            decision: None,
        };
        let passes: Vec<Pass> = (1..=20)
            .map(|i| pass(2.0 * f64::from(i), Some(2.0)))
            .collect();
        let c = mount_curve(&passes);
        assert_eq!(c[0], (0.0, 0.0));
        assert_eq!(c[c.len() - 1], (40.0, 2000.0));
        let r = smoothed_rate(&c, 50);
        assert!(r.iter().skip(5).all(|p| (p.1 - 50.0).abs() < 1e-6), "{r:?}");
        // A pass whose duration reaches back before the previous one is clamped.
        let c = mount_curve(&[pass(1.0, None), pass(2.0, Some(5.0))]);
        assert_eq!(c, vec![(1.0, 100.0), (1.0, 100.0), (2.0, 200.0)]);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<u32> = (1..=10).collect();
        assert_eq!(percentile(&v, 10.0), 1);
        assert_eq!(percentile(&v, 50.0), 5);
        assert_eq!(percentile(&v, 90.0), 9);
        assert_eq!(percentile(&v, 100.0), 10);
        assert_eq!(percentile(&[7], 25.0), 7);
    }
}
