//! `metfs report RUN_DIR`: plots and a summary of what MET did to a job and to the capacity
//! tier, from the daemon's event log.
//!
//! Input: `RUN_DIR/events.1.jsonl` (the rotated, older part, if present) then
//! `RUN_DIR/events.jsonl`, one event record per line, as the protocol defines it
//! ([`metfs_protocol::event`]: `v`, `t` in Unix seconds, `event`, and the kind's fields):
//!
//! * `start`: dataset size and files, nm, budget, node rank and count. A second `start` means the
//!   daemon restarted; its tier counter restarts at 0.
//! * `pass_end`: one pass over the current mini-epoch (`sequence`, `pass`, `view_bytes`, `secs`,
//!   the pass's duration, and `verdict`, the policy's wish, not the decision).
//! * `decision`: the answer to the `pass_end` just before it: `repeat`, `advance` or `wait`.
//! * `staged`: a mini-epoch finished staging (`bytes_fetched` in `secs`).
//! * `switch`: the view advanced; `prev_rf` is the passes the previous mini-epoch got (its
//!   effective rf), `prev_wanted_rf` the pass at which its policy first wanted to advance.
//! * `stall_rf`: the mini-epoch being left got bonus passes (pass ends answered `wait` while
//!   its successor staged), so its effective rf exceeds its policy's.
//! * `tier`: the cumulative bytes read from the capacity tier, every few seconds while staging.
//!
//! Unknown event kinds and unknown fields are ignored (a newer daemon may add them within a
//! protocol version); a `pass_end` without `secs` (older logs) takes the time since the
//! previous pass. A line that is not JSON, lacks `t` or `event`, lacks a field its kind
//! requires, has a field of the wrong type, or is of another protocol version is an error
//! naming the file and line, except a torn last line of `events.jsonl` (a crash mid-write),
//! which is skipped with a warning in the summary.
//!
//! Output in `OUT_DIR`:
//!
//! * `rf_per_mini_epoch.png`: the effective rf of each completed mini-epoch against its
//!   sequence number, with the rf the policy wanted where bonus passes raised it, the mean and
//!   the stall-free rf (the paper's Fig. 11);
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
//!   That is the **effective rf**, bonus passes included: with a non-blocking `pass_end` it
//!   exceeds the policy's rf (`prev_wanted_rf`) by the mini-epoch's bonus passes.
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
//!
//! Layout: this file holds the public types and [`report`]; `events` reads the log,
//! `analysis` turns it into the summary (pure), `text` writes `summary.txt`, `series` computes
//! the bandwidth curve (pure) and `plot` draws the PNGs. `curves` draws a benchmark's named
//! curves (`metfs plot`) with the same plotting.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

mod analysis;
mod curves;
mod events;
mod plot;
mod series;
mod text;

pub use curves::{plot_curves, Curves, HLine, Series};
pub use text::summary_text;

use analysis::{analyse, summarise, Analysis};
use events::read_log;
use plot::{draw_bandwidth, draw_histogram, draw_rf, register_font, render_png};

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
    /// A curves document for `metfs plot` cannot be drawn.
    #[error("{path}: {message}")]
    BadCurves {
        /// The curves file.
        path: PathBuf,
        /// What is wrong with it.
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
    /// Passes it got: its effective rf, bonus passes included.
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
    /// Distribution of the effective rf over completed mini-epochs: the passes each got,
    /// bonus passes included.
    pub rf: Option<RfStats>,
    /// Mini-epochs whose rf bonus passes raised above the policy's (`stall_rf` events; 0 in
    /// logs written before the daemon logged them, where the rows' `bonus_passes` tell).
    pub stalled_mini_epochs: u64,
    /// Samples a fault that lasts kept out of their mini-epoch (`deferred` events; one deferred
    /// twice counts twice), and deferred samples a later staging gave (`recovered` events).
    #[serde(default)]
    pub deferred_samples: u64,
    #[serde(default)]
    pub recovered_samples: u64,
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
mod tests;
