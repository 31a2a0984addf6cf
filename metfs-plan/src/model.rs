//! The paper's analytical model of mini-epoch training (paper 001, sections III.A and IV.C,
//! Eq. 1, Fig. 12): what a given dataset, budget, consumption rate, tier bandwidth and rf
//! schedule cost the capacity tier and the training job.
//!
//! Symbols, as in the paper:
//!
//! | symbol | field | meaning |
//! |---|---|---|
//! | D | [`ModelInputs::dataset_bytes`] | dataset size |
//! | EC_1 | [`ModelInputs::budget_bytes`] | the cache budget on the performance tier |
//! | EB_1 | [`ModelInputs::required_bytes_per_s`] | the rate at which the accelerators consume data when I/O never stalls them |
//! | B_2 | [`ModelInputs::tier_bytes_per_s`] | the rate at which the capacity tier delivers a mini-epoch |
//! | nm | [`ModelOutput::mini_epochs`] | mini-epochs per epoch: given, or `ceil(D / (EC_1 / 2))` |
//! | rf_i, t_i | [`ScheduleEntry`] | passes over mini-epoch i and its wall time |
//!
//! Results:
//!
//! * **stall-free rf** = `ceil(EB_1 / B_2)`: with at least this many passes per mini-epoch the
//!   next mini-epoch is staged before the current one is finished, so the accelerators never
//!   wait for I/O (section III.A).
//! * **EB_2** (Eq. 1), the average capacity-tier bandwidth:
//!   `EB_2 = Σ t_i · MIN(EB_1 / rf_i, B_2) / Σ t_i`. The paper prints `MAX`, but its own
//!   numbers need `MIN`: with `MAX` no rf could bring EB_2 below B_2 = 400 GB/s, whereas the
//!   text reports 400 GB/s reduced to 30.4 GB/s at rf = 128, which is `3.8 TB/s / 128`. It is
//!   also what the physics says: mini-epoch i moves its M bytes from the tier in
//!   `max(rf_i · M / EB_1, M / B_2)` seconds, i.e. at `MIN(EB_1 / rf_i, B_2)`.
//! * **throughput fraction**, the training throughput as a fraction of the I/O-unbounded rate
//!   (Fig. 12a): `MIN(1, rf_i · B_2 / EB_1)` per mini-epoch, averaged with the weights t_i. It
//!   is 1 exactly when rf_i ≥ the stall-free rf.
//!
//! Invariants and conventions:
//!
//! * Pure: no I/O (the caller reads a schedule file, [`parse_schedule`] parses its text), no
//!   clock, no randomness; equal inputs give equal outputs.
//! * Units are whatever the caller's numbers are in; only ratios matter, except that EB_2 comes
//!   out in the unit of EB_1 and B_2. The paper's 30.4 GB/s is reproduced exactly when its
//!   "TB" and "GB" are read as binary units, EB_1 = 3.8 · 2^40 and B_2 = 400 · 2^30 bytes/s
//!   (3.8 · 2^40 / 128 = 30.4 · 2^30; EB_1 / B_2 = 9.728). Read as decimal units the same
//!   inputs give 29.69 · 10^9 (EB_1 / B_2 = 9.5). The stall-free rf is 10 either way.
//! * t_i is the **wall time** of mini-epoch i, stalls included; that is what makes Eq. 1 the
//!   tier bytes divided by the run's time. A schedule entry without t gets the model's own
//!   wall time, `max(rf_i · M / EB_1, M / B_2)` with `M = D / nm`. A fixed rf needs no t: every
//!   mini-epoch is alike and the weights cancel.
//! * The model describes the paper's MET, where a mini-epoch whose rf is below the stall-free
//!   rf makes the accelerators wait for the next one. The metfs daemon by default keeps
//!   repeating instead ("bonus" passes), which raises the effective rf to the stall-free rf at
//!   the price of extra passes; plan with `rf ≥ stall_free_rf` to avoid either.
//! * The model takes the sizes of one consistent scope: the whole job (the paper's
//!   Summit-wide numbers) or one node (its shard, its budget, its share of the tier).
//! * nm defaults to the smallest count whose mini-epochs fit in half the budget. The daemon
//!   keeps a little of the budget for metadata and packs whole samples, so it may plan a few
//!   more mini-epochs than this; pass nm explicitly to model a known plan.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::size::format_bytes;

/// Why the model could not be evaluated or a schedule could not be read.
#[derive(Debug, Error)]
pub enum ModelError {
    /// An input is zero, negative, not finite, or otherwise unusable.
    #[error("{name} {problem} (got {value})")]
    InvalidInput {
        /// The input, as the user knows it (e.g. `tier bandwidth B2`).
        name: &'static str,
        /// What is wrong with it.
        problem: &'static str,
        /// The value given.
        value: String,
    },
    /// The given nm makes mini-epochs larger than half the budget.
    #[error("{mini_epochs} mini-epochs of a {dataset} dataset are {mini_epoch} each, more than half the budget ({half_budget}); use at least {needed} mini-epochs or a budget of at least {budget_needed}")]
    MiniEpochTooLarge {
        /// The nm given.
        mini_epochs: u32,
        /// The dataset size, formatted.
        dataset: String,
        /// The size of one mini-epoch, formatted.
        mini_epoch: String,
        /// Half the budget, formatted.
        half_budget: String,
        /// The smallest nm that fits.
        needed: u64,
        /// The smallest budget that fits, formatted.
        budget_needed: String,
    },
    /// The dataset needs more mini-epochs than a `u32` counts.
    #[error("{dataset} in halves of a {budget} budget is {needed} mini-epochs, more than {max}; raise the budget")]
    TooManyMiniEpochs {
        /// The dataset size, formatted.
        dataset: String,
        /// The budget, formatted.
        budget: String,
        /// The count needed.
        needed: u64,
        /// The largest count supported.
        max: u32,
    },
    /// The rf schedule has no mini-epochs.
    #[error("the rf schedule has no mini-epochs")]
    EmptySchedule,
    /// A schedule file has a malformed line.
    #[error("rf schedule {path}, line {line}: {message}")]
    Schedule {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// What is wrong.
        message: String,
    },
}

/// One mini-epoch of an rf schedule.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ScheduleEntry {
    /// Passes over the mini-epoch (rf_i), at least 1.
    pub rf: u32,
    /// Wall time of the mini-epoch in seconds (t_i), stalls included; `None` lets the model
    /// derive it from the sizes and rates.
    pub t: Option<f64>,
}

/// How many passes each mini-epoch gets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RfSpec {
    /// Every mini-epoch gets the same rf.
    Fixed(u32),
    /// One entry per mini-epoch, in order; it may cover any number of mini-epochs (one epoch,
    /// several, or part of one) and the results average over it.
    Schedule(Vec<ScheduleEntry>),
}

/// The model's inputs. Sizes in bytes, rates in bytes per second (any unit works if used
/// consistently; see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelInputs {
    /// D: dataset size.
    pub dataset_bytes: u64,
    /// EC_1: cache budget; each mini-epoch must fit in half of it.
    pub budget_bytes: u64,
    /// EB_1: the consumption rate of the accelerators when I/O never stalls them.
    pub required_bytes_per_s: f64,
    /// B_2: the capacity tier's bandwidth for staging.
    pub tier_bytes_per_s: f64,
    /// nm, when known; otherwise `ceil(D / (EC_1 / 2))`.
    pub mini_epochs: Option<u32>,
    /// A fixed rf or a per-mini-epoch schedule.
    pub rf: RfSpec,
}

/// The model's estimate for one schedule entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MiniEpochEstimate {
    /// Position in the schedule, from 0.
    pub index: usize,
    /// rf_i.
    pub rf: u32,
    /// t_i in seconds: as given, or derived.
    pub t: f64,
    /// Whether t_i was derived by the model rather than given.
    pub t_derived: bool,
    /// `MIN(EB_1 / rf_i, B_2)`: the tier bandwidth this mini-epoch draws.
    pub eb2_bytes_per_s: f64,
    /// `MIN(1, rf_i · B_2 / EB_1)`.
    pub throughput_fraction: f64,
    /// Whether rf_i is below the stall-free rf, so the accelerators wait for I/O.
    pub stalled: bool,
}

/// What the model predicts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelOutput {
    /// nm: mini-epochs per epoch.
    pub mini_epochs: u32,
    /// `ceil(D / nm)`: the size of one mini-epoch.
    pub mini_epoch_bytes: u64,
    /// `ceil(EB_1 / B_2)`: the smallest rf with no I/O stall.
    pub stall_free_rf: u32,
    /// `EB_1 / B_2` unrounded.
    pub stall_free_rf_exact: f64,
    /// EB_2 (Eq. 1, with MIN): average capacity-tier bandwidth under MET.
    pub eb2_bytes_per_s: f64,
    /// `MIN(EB_1, B_2)`: the tier bandwidth without MET (every epoch read from the tier, rf 1).
    pub baseline_eb2_bytes_per_s: f64,
    /// `baseline / EB_2`: how many times less tier bandwidth MET draws.
    pub io_reduction: f64,
    /// Training throughput as a fraction of the I/O-unbounded rate, t-weighted (Fig. 12a).
    pub throughput_fraction: f64,
    /// `MIN(1, B_2 / EB_1)`: the same fraction without MET.
    pub baseline_throughput_fraction: f64,
    /// Mean rf over the mini-epochs (unweighted).
    pub mean_rf: f64,
    /// Mini-epochs whose rf is below the stall-free rf.
    pub stalled_mini_epochs: u64,
    /// Mini-epochs modelled: nm for a fixed rf, the schedule's length otherwise.
    pub modelled_mini_epochs: u64,
    /// Per-entry estimates of a schedule; empty for a fixed rf (all mini-epochs are alike).
    pub per_mini_epoch: Vec<MiniEpochEstimate>,
}

fn positive_finite(name: &'static str, v: f64) -> Result<f64, ModelError> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(ModelError::InvalidInput {
            name,
            problem: "must be a positive, finite number",
            value: v.to_string(),
        })
    }
}

fn positive_rf(rf: u32) -> Result<u32, ModelError> {
    if rf == 0 {
        Err(ModelError::InvalidInput {
            name: "rf",
            problem: "must be at least 1",
            value: "0".into(),
        })
    } else {
        Ok(rf)
    }
}

/// The stall-free rf, `ceil(EB_1 / B_2)` (module docs): the fewest passes per mini-epoch with
/// which the next mini-epoch is staged before the current one is finished. `None` until B_2 is
/// known to be positive; otherwise at least 1 and at most `u32::MAX` (the cast saturates).
/// Exact for ratios that are whole numbers (9.5 → 10, 10 → 10). The model and `metfs report`
/// both compute it here, so they never disagree.
pub fn stall_free_rf(eb1: f64, b2: f64) -> Option<u32> {
    (b2 > 0.0).then(|| (eb1 / b2).ceil().max(1.0) as u32)
}

/// nm: the given mini-epoch count, checked to fit each mini-epoch in half the budget, or the
/// smallest count that does.
fn mini_epochs_of(inputs: &ModelInputs) -> Result<u32, ModelError> {
    let d = inputs.dataset_bytes;
    let half = inputs.budget_bytes / 2;
    Ok(match inputs.mini_epochs {
        Some(0) => {
            return Err(ModelError::InvalidInput {
                name: "mini-epochs",
                problem: "must be at least 1",
                value: "0".into(),
            })
        }
        Some(nm) => {
            let me = d.div_ceil(u64::from(nm));
            if me > half {
                let needed = if half == 0 { d } else { d.div_ceil(half) };
                return Err(ModelError::MiniEpochTooLarge {
                    mini_epochs: nm,
                    dataset: format_bytes(d),
                    mini_epoch: format_bytes(me),
                    half_budget: format_bytes(half),
                    needed,
                    budget_needed: format_bytes(me.saturating_mul(2)),
                });
            }
            nm
        }
        None => {
            if half == 0 {
                return Err(ModelError::InvalidInput {
                    name: "budget",
                    problem: "must be at least 2 bytes (each mini-epoch fits in half of it)",
                    value: inputs.budget_bytes.to_string(),
                });
            }
            let needed = d.div_ceil(half);
            u32::try_from(needed).map_err(|_| ModelError::TooManyMiniEpochs {
                dataset: format_bytes(d),
                budget: format_bytes(inputs.budget_bytes),
                needed,
                max: u32::MAX,
            })?
        }
    })
}

/// Evaluates the model. Errors on unusable inputs (zero or non-finite rates, rf 0, an empty
/// schedule, a t_i that is negative, all t_i zero, or an nm whose mini-epochs exceed half the
/// budget).
pub fn model(inputs: &ModelInputs) -> Result<ModelOutput, ModelError> {
    let eb1 = positive_finite("required bandwidth EB1", inputs.required_bytes_per_s)?;
    let b2 = positive_finite("tier bandwidth B2", inputs.tier_bytes_per_s)?;
    let d = inputs.dataset_bytes;
    if d == 0 {
        return Err(ModelError::InvalidInput {
            name: "dataset size",
            problem: "must be positive",
            value: "0".into(),
        });
    }
    let nm = mini_epochs_of(inputs)?;
    let mini_epoch_bytes = d.div_ceil(u64::from(nm));
    let m = mini_epoch_bytes as f64;
    let stall_free_rf_exact = eb1 / b2;
    let stall_free_rf = stall_free_rf(eb1, b2).expect("B2 was checked positive");
    let per_rf = |rf: u32| -> (f64, f64, bool) {
        let rf = f64::from(rf);
        let eb2 = (eb1 / rf).min(b2);
        let frac = (rf * b2 / eb1).min(1.0);
        (eb2, frac, rf < stall_free_rf_exact)
    };
    let baseline_eb2 = eb1.min(b2);
    let baseline_frac = (b2 / eb1).min(1.0);

    let (eb2, frac, mean_rf, stalled, modelled, rows) = match &inputs.rf {
        RfSpec::Fixed(rf) => {
            let rf = positive_rf(*rf)?;
            let (eb2, frac, st) = per_rf(rf);
            let stalled = if st { u64::from(nm) } else { 0 };
            (eb2, frac, f64::from(rf), stalled, u64::from(nm), Vec::new())
        }
        RfSpec::Schedule(entries) => {
            if entries.is_empty() {
                return Err(ModelError::EmptySchedule);
            }
            let mut rows = Vec::with_capacity(entries.len());
            for (index, e) in entries.iter().enumerate() {
                let rf = positive_rf(e.rf)?;
                let (eb2, frac, st) = per_rf(rf);
                let (t, t_derived) = match e.t {
                    Some(t) if t.is_finite() && t >= 0.0 => (t, false),
                    Some(t) => {
                        return Err(ModelError::InvalidInput {
                            name: "mini-epoch time t",
                            problem: "must be a finite number of seconds, 0 or more",
                            value: t.to_string(),
                        })
                    }
                    None => ((f64::from(rf) * m / eb1).max(m / b2), true),
                };
                rows.push(MiniEpochEstimate {
                    index,
                    rf,
                    t,
                    t_derived,
                    eb2_bytes_per_s: eb2,
                    throughput_fraction: frac,
                    stalled: st,
                });
            }
            let total_t: f64 = rows.iter().map(|r| r.t).sum();
            if !(total_t > 0.0 && total_t.is_finite()) {
                return Err(ModelError::InvalidInput {
                    name: "sum of mini-epoch times t",
                    problem: "must be positive and finite",
                    value: total_t.to_string(),
                });
            }
            let eb2 = rows.iter().map(|r| r.t * r.eb2_bytes_per_s).sum::<f64>() / total_t;
            let frac = rows
                .iter()
                .map(|r| r.t * r.throughput_fraction)
                .sum::<f64>()
                / total_t;
            let mean_rf = rows.iter().map(|r| f64::from(r.rf)).sum::<f64>() / rows.len() as f64;
            let stalled = rows.iter().filter(|r| r.stalled).count() as u64;
            let n = rows.len() as u64;
            (eb2, frac, mean_rf, stalled, n, rows)
        }
    };
    Ok(ModelOutput {
        mini_epochs: nm,
        mini_epoch_bytes,
        stall_free_rf,
        stall_free_rf_exact,
        eb2_bytes_per_s: eb2,
        baseline_eb2_bytes_per_s: baseline_eb2,
        io_reduction: baseline_eb2 / eb2,
        throughput_fraction: frac,
        baseline_throughput_fraction: baseline_frac,
        mean_rf,
        stalled_mini_epochs: stalled,
        modelled_mini_epochs: modelled,
        per_mini_epoch: rows,
    })
}

fn rate(bytes_per_s: f64) -> String {
    if bytes_per_s.is_finite() && bytes_per_s >= 0.0 && bytes_per_s < u64::MAX as f64 {
        format!("{}/s", format_bytes(bytes_per_s.round() as u64))
    } else {
        format!("{bytes_per_s} B/s")
    }
}

/// The human-readable report that `metfs plan` prints without `--json`.
impl fmt::Display for ModelOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "mini-epochs (nm):        {} of {}",
            self.mini_epochs,
            format_bytes(self.mini_epoch_bytes)
        )?;
        writeln!(
            f,
            "stall-free rf:           {} (EB1/B2 = {:.2})",
            self.stall_free_rf, self.stall_free_rf_exact
        )?;
        writeln!(
            f,
            "mean rf:                 {:.2} over {} mini-epochs, {} below the stall-free rf",
            self.mean_rf, self.modelled_mini_epochs, self.stalled_mini_epochs
        )?;
        writeln!(
            f,
            "tier bandwidth EB2:      {} (without MET: {}, {:.1}x less)",
            rate(self.eb2_bytes_per_s),
            rate(self.baseline_eb2_bytes_per_s),
            self.io_reduction
        )?;
        write!(
            f,
            "training throughput:     {:.1}% of the I/O-unbounded rate (without MET: {:.1}%)",
            100.0 * self.throughput_fraction,
            100.0 * self.baseline_throughput_fraction
        )
    }
}

/// Which syntax a schedule file uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ScheduleFormat {
    Csv,
    JsonLines,
}

/// Parses an rf schedule, the text of the file `path` (which names it in errors and may pick the
/// syntax; the caller reads the file, so the model stays free of I/O): one mini-epoch per record, in order, with `rf` (passes, ≥ 1) and
/// optionally `t` (wall time in seconds).
///
/// Two syntaxes, chosen by extension (`.csv`; `.jsonl`, `.ndjson`, `.json`) or, for any other
/// name, by the first non-blank line (`{` means JSON lines):
///
/// * CSV with a header naming the columns `rf` and optionally `t` (other columns are
///   ignored), or without a header as `rf[,t]`. Lines starting with `#` are comments.
/// * JSON lines: `{"rf": 12, "t": 340.5}` per line; other fields are ignored; `t` may be
///   absent or null. Blank lines are skipped.
///
/// Errors name the file and the 1-based line.
pub fn parse_schedule(text: &str, path: &Path) -> Result<Vec<ScheduleEntry>, ModelError> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let format = match ext.as_deref() {
        Some("csv") => ScheduleFormat::Csv,
        Some("jsonl" | "ndjson" | "json") => ScheduleFormat::JsonLines,
        _ => {
            let first = text.lines().map(str::trim).find(|l| !l.is_empty());
            if first.is_some_and(|l| l.starts_with('{')) {
                ScheduleFormat::JsonLines
            } else {
                ScheduleFormat::Csv
            }
        }
    };
    let entries = match format {
        ScheduleFormat::Csv => parse_csv(text, path)?,
        ScheduleFormat::JsonLines => parse_jsonl(text, path)?,
    };
    if entries.is_empty() {
        return Err(ModelError::Schedule {
            path: path.to_path_buf(),
            line: 1,
            message: "no mini-epochs: expected one line per mini-epoch with rf and optionally t"
                .into(),
        });
    }
    Ok(entries)
}

fn schedule_err(path: &Path, line: u64, message: String) -> ModelError {
    ModelError::Schedule {
        path: path.to_path_buf(),
        line,
        message,
    }
}

fn check_entry(path: &Path, line: u64, rf: u32, t: Option<f64>) -> Result<(), ModelError> {
    if rf == 0 {
        return Err(schedule_err(path, line, "rf must be at least 1".into()));
    }
    if let Some(t) = t {
        if !(t.is_finite() && t >= 0.0) {
            return Err(schedule_err(
                path,
                line,
                format!("t must be a finite number of seconds, 0 or more, got {t}"),
            ));
        }
    }
    Ok(())
}

fn parse_csv(text: &str, path: &Path) -> Result<Vec<ScheduleEntry>, ModelError> {
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .trim(csv::Trim::All)
        .comment(Some(b'#'))
        .from_reader(text.as_bytes());
    // Column positions of rf and t; decided by the first record.
    let mut columns: Option<(usize, Option<usize>)> = None;
    let mut out = Vec::new();
    for rec in rdr.records() {
        let rec = rec.map_err(|e| {
            let line = e.position().map_or(0, |p| p.line());
            schedule_err(path, line, format!("not CSV: {e}"))
        })?;
        let line = rec.position().map_or(0, |p| p.line());
        if rec.iter().all(str::is_empty) {
            continue;
        }
        let (rf_col, t_col) = match columns {
            Some(c) => c,
            None => {
                let first = rec.get(0).unwrap_or("");
                if first.parse::<f64>().is_ok() {
                    // No header: rf[,t].
                    let c = (0, (rec.len() > 1).then_some(1));
                    columns = Some(c);
                    c
                } else {
                    let names: Vec<String> = rec.iter().map(str::to_ascii_lowercase).collect();
                    let rf = names.iter().position(|n| n == "rf").ok_or_else(|| {
                        schedule_err(
                            path,
                            line,
                            format!(
                                "the header has no `rf` column (found: {}); expected `rf,t`",
                                rec.iter().collect::<Vec<_>>().join(", ")
                            ),
                        )
                    })?;
                    let t = names.iter().position(|n| n == "t");
                    columns = Some((rf, t));
                    continue;
                }
            }
        };
        let rf_text = rec.get(rf_col).unwrap_or("");
        let rf: u32 = rf_text.parse().map_err(|_| {
            schedule_err(
                path,
                line,
                format!("rf `{rf_text}` is not a whole number of passes"),
            )
        })?;
        let t = match t_col.and_then(|c| rec.get(c)) {
            None | Some("") => None,
            Some(s) => Some(s.parse::<f64>().map_err(|_| {
                schedule_err(path, line, format!("t `{s}` is not a number of seconds"))
            })?),
        };
        check_entry(path, line, rf, t)?;
        out.push(ScheduleEntry { rf, t });
    }
    Ok(out)
}

fn parse_jsonl(text: &str, path: &Path) -> Result<Vec<ScheduleEntry>, ModelError> {
    #[derive(Deserialize)]
    struct Line {
        rf: u32,
        #[serde(default)]
        t: Option<f64>,
    }
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i as u64 + 1;
        let raw = raw.trim();
        if raw.is_empty() {
            continue;
        }
        let l: Line = serde_json::from_str(raw).map_err(|e| {
            schedule_err(
                path,
                line,
                format!("expected {{\"rf\": <passes>, \"t\": <seconds>}}: {e}"),
            )
        })?;
        check_entry(path, line, l.rf, l.t)?;
        out.push(ScheduleEntry { rf: l.rf, t: l.t });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stall_free_rf_is_the_ceiling_of_eb1_over_b2_and_at_least_one() {
        assert_eq!(stall_free_rf(9.5, 1.0), Some(10));
        assert_eq!(stall_free_rf(10.0, 1.0), Some(10));
        assert_eq!(stall_free_rf(3.0e8, 1.0e9), Some(1));
        assert_eq!(stall_free_rf(0.0, 1.0e9), Some(1));
        assert_eq!(stall_free_rf(1.0e300, 1.0e-10), Some(u32::MAX));
        assert_eq!(stall_free_rf(1.0e9, 0.0), None);
    }

    const TIB: f64 = (1u64 << 40) as f64;
    const GIB: f64 = (1u64 << 30) as f64;

    /// Units for the paper's "TB" and "GB": decimal (1e12, 1e9) or binary (2^40, 2^30).
    const DECIMAL: (f64, f64) = (1e12, 1e9);
    const BINARY: (f64, f64) = (TIB, GIB);

    /// The paper's DeepCAM-on-Summit setting (section IV.C): 20 TB, EB1 = 3.8 TB/s,
    /// B2 = 400 GB/s.
    fn summit((tb, gb): (f64, f64), nm: Option<u32>, rf: RfSpec) -> ModelInputs {
        ModelInputs {
            dataset_bytes: (20.0 * tb) as u64,
            // Summit has ~4600 nodes with 1.6 TB of NVMe; any budget that fits nm = 128 does.
            budget_bytes: (1000.0 * tb) as u64,
            required_bytes_per_s: 3.8 * tb,
            tier_bytes_per_s: 400.0 * gb,
            mini_epochs: nm,
            rf,
        }
    }

    #[test]
    fn deepcam_eb2_at_nm_rf_128_binary_units_is_30_4() {
        let out = model(&summit(BINARY, Some(128), RfSpec::Fixed(128))).unwrap();
        assert_eq!(out.mini_epochs, 128);
        assert_eq!(out.mini_epoch_bytes, 160 << 30);
        let gib_s = out.eb2_bytes_per_s / GIB;
        assert!((gib_s - 30.4).abs() < 1e-9, "EB2 = {gib_s} GiB/s");
        assert_eq!(out.throughput_fraction, 1.0);
        assert_eq!(out.stalled_mini_epochs, 0);
        // "reduced from 400GB/s": the baseline reads every epoch at B2.
        assert!((out.baseline_eb2_bytes_per_s / GIB - 400.0).abs() < 1e-9);
        // 3.8 TiB / 400 GiB = 9.728.
        assert!((out.stall_free_rf_exact - 9.728).abs() < 1e-12);
        assert_eq!(out.stall_free_rf, 10);
    }

    #[test]
    fn deepcam_eb2_at_nm_rf_128_decimal_units_is_about_30() {
        let out = model(&summit(DECIMAL, Some(128), RfSpec::Fixed(128))).unwrap();
        let gb_s = out.eb2_bytes_per_s / 1e9;
        assert!((gb_s - 29.6875).abs() < 1e-9, "EB2 = {gb_s} GB/s");
        assert!((out.baseline_eb2_bytes_per_s - 400e9).abs() < 1.0);
        assert!((out.stall_free_rf_exact - 9.5).abs() < 1e-12);
        assert!((out.io_reduction - 128.0 / 9.5).abs() < 1e-9);
    }

    #[test]
    fn deepcam_throughput_peaks_from_rf_10() {
        for units in [DECIMAL, BINARY] {
            let at = |rf| {
                model(&summit(units, Some(128), RfSpec::Fixed(rf)))
                    .unwrap()
                    .throughput_fraction
            };
            let out = model(&summit(units, Some(128), RfSpec::Fixed(1))).unwrap();
            assert_eq!(out.stall_free_rf, 10);
            let ratio = out.stall_free_rf_exact;
            // rf 1 runs at B2/EB1: 65,000 samples/s * 0.105 ≈ 6,842 samples/s (decimal).
            assert!((at(1) - 1.0 / ratio).abs() < 1e-12);
            let mut prev = 0.0;
            for rf in 1..=9 {
                let f = at(rf);
                assert!(f < 1.0 && f > prev, "rf {rf}: {f}");
                assert!((f - f64::from(rf) / ratio).abs() < 1e-12);
                prev = f;
            }
            for rf in [10, 11, 16, 64, 128] {
                assert_eq!(at(rf), 1.0, "rf {rf}");
            }
        }
        let dec = model(&summit(DECIMAL, Some(128), RfSpec::Fixed(9))).unwrap();
        assert!((dec.throughput_fraction - 9.0 * 0.4 / 3.8).abs() < 1e-12);
    }

    #[test]
    fn eq1_uses_min_not_max() {
        // With MAX, EB2 could never drop below B2; with MIN, low rf draws B2 and high rf
        // draws EB1 / rf.
        let out = model(&summit(DECIMAL, Some(128), RfSpec::Fixed(4))).unwrap();
        assert!((out.eb2_bytes_per_s - 400e9).abs() < 1.0);
        let out = model(&summit(DECIMAL, Some(128), RfSpec::Fixed(19))).unwrap();
        assert!((out.eb2_bytes_per_s - 200e9).abs() < 1.0);
    }

    #[test]
    fn nm_defaults_to_halves_of_the_budget() {
        let mut i = summit(DECIMAL, None, RfSpec::Fixed(8));
        i.dataset_bytes = 1000;
        i.budget_bytes = 100;
        assert_eq!(model(&i).unwrap().mini_epochs, 20);
        i.budget_bytes = 101; // half is 50 (whole bytes)
        assert_eq!(model(&i).unwrap().mini_epochs, 20);
        i.budget_bytes = 99; // half is 49
        let out = model(&i).unwrap();
        assert_eq!(out.mini_epochs, 21);
        assert_eq!(out.mini_epoch_bytes, 48);
        i.budget_bytes = 10_000;
        assert_eq!(model(&i).unwrap().mini_epochs, 1);
    }

    #[test]
    fn given_nm_must_fit_half_the_budget() {
        let mut i = summit(DECIMAL, Some(10), RfSpec::Fixed(8));
        i.dataset_bytes = 1000;
        i.budget_bytes = 100;
        let e = model(&i).unwrap_err();
        assert!(matches!(
            e,
            ModelError::MiniEpochTooLarge { needed: 20, .. }
        ));
        assert!(e.to_string().contains("at least 20 mini-epochs"), "{e}");
    }

    #[test]
    fn schedule_is_time_weighted() {
        // Two mini-epochs: rf 2 (stalled, draws B2 = 400 GB/s, fraction 0.2105) for 10 s, and
        // rf 38 (draws 100 GB/s, fraction 1) for 30 s.
        let sched = RfSpec::Schedule(vec![
            ScheduleEntry {
                rf: 2,
                t: Some(10.0),
            },
            ScheduleEntry {
                rf: 38,
                t: Some(30.0),
            },
        ]);
        let out = model(&summit(DECIMAL, Some(128), sched)).unwrap();
        let eb2 = (10.0 * 400e9 + 30.0 * 100e9) / 40.0;
        assert!((out.eb2_bytes_per_s - eb2).abs() < 1.0);
        let frac = (10.0 * (2.0 * 0.4 / 3.8) + 30.0) / 40.0;
        assert!((out.throughput_fraction - frac).abs() < 1e-12);
        assert_eq!(out.stalled_mini_epochs, 1);
        assert_eq!(out.modelled_mini_epochs, 2);
        assert_eq!(out.mean_rf, 20.0);
        assert_eq!(out.per_mini_epoch.len(), 2);
        assert!(out.per_mini_epoch[0].stalled && !out.per_mini_epoch[1].stalled);
    }

    #[test]
    fn schedule_without_times_equals_tier_bytes_over_wall_time() {
        // Derived t_i are wall times, so EB2 is the tier bytes divided by the total time.
        let i = summit(
            DECIMAL,
            Some(128),
            RfSpec::Schedule(vec![
                ScheduleEntry { rf: 1, t: None },
                ScheduleEntry { rf: 5, t: None },
                ScheduleEntry { rf: 50, t: None },
            ]),
        );
        let out = model(&i).unwrap();
        let m = out.mini_epoch_bytes as f64;
        let times: Vec<f64> = [1.0f64, 5.0, 50.0]
            .iter()
            .map(|rf| (rf * m / 3.8e12).max(m / 0.4e12))
            .collect();
        let total: f64 = times.iter().sum();
        assert!((out.eb2_bytes_per_s - 3.0 * m / total).abs() / out.eb2_bytes_per_s < 1e-12);
        // Throughput: passes done over the time an unstalled run needs for them.
        let useful = 56.0 * m / 3.8e12;
        assert!((out.throughput_fraction - useful / total).abs() < 1e-12);
        assert!(out.per_mini_epoch.iter().all(|r| r.t_derived));
    }

    #[test]
    fn fixed_rf_equals_a_uniform_schedule() {
        let fixed = model(&summit(DECIMAL, Some(128), RfSpec::Fixed(7))).unwrap();
        let sched = model(&summit(
            DECIMAL,
            Some(128),
            RfSpec::Schedule(vec![
                ScheduleEntry {
                    rf: 7,
                    t: Some(3.0)
                };
                128
            ]),
        ))
        .unwrap();
        assert!((fixed.eb2_bytes_per_s - sched.eb2_bytes_per_s).abs() < 1e-3);
        assert!((fixed.throughput_fraction - sched.throughput_fraction).abs() < 1e-12);
        assert_eq!(fixed.stalled_mini_epochs, sched.stalled_mini_epochs);
    }

    #[test]
    fn bad_inputs_are_named() {
        let mut i = summit(DECIMAL, Some(128), RfSpec::Fixed(0));
        assert!(model(&i).unwrap_err().to_string().contains("rf"));
        i.rf = RfSpec::Fixed(1);
        i.tier_bytes_per_s = 0.0;
        assert!(model(&i).unwrap_err().to_string().contains("B2"));
        i.tier_bytes_per_s = 1.0;
        i.required_bytes_per_s = f64::NAN;
        assert!(model(&i).unwrap_err().to_string().contains("EB1"));
        i.required_bytes_per_s = 1.0;
        i.rf = RfSpec::Schedule(vec![]);
        assert!(matches!(model(&i), Err(ModelError::EmptySchedule)));
        i.rf = RfSpec::Schedule(vec![ScheduleEntry {
            rf: 1,
            t: Some(0.0),
        }]);
        assert!(model(&i).unwrap_err().to_string().contains("sum"));
        i.rf = RfSpec::Fixed(1);
        i.dataset_bytes = 0;
        assert!(model(&i).unwrap_err().to_string().contains("dataset"));
        i.dataset_bytes = 10;
        i.mini_epochs = None;
        i.budget_bytes = 1;
        assert!(model(&i).unwrap_err().to_string().contains("budget"));
    }

    #[test]
    fn output_serializes_with_the_documented_keys() {
        let out = model(&summit(DECIMAL, Some(128), RfSpec::Fixed(128))).unwrap();
        let v = serde_json::to_value(&out).unwrap();
        for k in [
            "mini_epochs",
            "stall_free_rf",
            "eb2_bytes_per_s",
            "throughput_fraction",
        ] {
            assert!(v.get(k).is_some(), "{k}");
        }
        let text = out.to_string();
        assert!(text.contains("stall-free rf:           10"), "{text}");
        assert!(text.contains("100.0%"), "{text}");
    }

    #[test]
    fn schedules_in_csv_and_json_lines() {
        let p = Path::new("s.csv");
        let with_header = "# Fig. 11 style\nrf,t,note\n12,30.5,a\n3,,b\n\n128,400,c\n";
        assert_eq!(
            parse_schedule(with_header, p).unwrap(),
            vec![
                ScheduleEntry {
                    rf: 12,
                    t: Some(30.5)
                },
                ScheduleEntry { rf: 3, t: None },
                ScheduleEntry {
                    rf: 128,
                    t: Some(400.0)
                },
            ]
        );
        let no_header = "12, 30.5\n3\n";
        assert_eq!(
            parse_schedule(no_header, Path::new("sched")).unwrap(),
            vec![
                ScheduleEntry {
                    rf: 12,
                    t: Some(30.5)
                },
                ScheduleEntry { rf: 3, t: None },
            ]
        );
        let jsonl =
            "{\"rf\": 12, \"t\": 30.5, \"epoch\": 0}\n\n{\"rf\": 3, \"t\": null}\n{\"rf\":4}\n";
        let want = vec![
            ScheduleEntry {
                rf: 12,
                t: Some(30.5),
            },
            ScheduleEntry { rf: 3, t: None },
            ScheduleEntry { rf: 4, t: None },
        ];
        assert_eq!(parse_schedule(jsonl, Path::new("s.jsonl")).unwrap(), want);
        assert_eq!(parse_schedule(jsonl, Path::new("sched")).unwrap(), want);
    }

    #[test]
    fn schedule_errors_name_file_and_line() {
        let e = parse_schedule("rf,t\n1,2\nx,3\n", Path::new("/d/s.csv")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "rf schedule /d/s.csv, line 3: rf `x` is not a whole number of passes"
        );
        let e = parse_schedule(
            "# rf per mini-epoch\nrf,t\n\n1,2\nx,3\n",
            Path::new("s.csv"),
        )
        .unwrap_err();
        assert!(e.to_string().contains("line 5: rf `x`"), "{e}");
        let e = parse_schedule("rf,t\n0,2\n", Path::new("s.csv")).unwrap_err();
        assert!(
            e.to_string().contains("line 2: rf must be at least 1"),
            "{e}"
        );
        let e = parse_schedule("rf,t\n1,-2\n", Path::new("s.csv")).unwrap_err();
        assert!(e.to_string().contains("line 2: t must be"), "{e}");
        let e = parse_schedule("passes,t\n1,2\n", Path::new("s.csv")).unwrap_err();
        assert!(
            e.to_string().contains("line 1: the header has no `rf`"),
            "{e}"
        );
        let e = parse_schedule("{\"rf\":1}\n{\"rf\":\"a\"}\n", Path::new("s.jsonl")).unwrap_err();
        assert!(e.to_string().contains("s.jsonl, line 2:"), "{e}");
        let e = parse_schedule("{\"t\":1}\n", Path::new("s.jsonl")).unwrap_err();
        assert!(e.to_string().contains("line 1:"), "{e}");
        let e = parse_schedule("rf,t\n", Path::new("s.csv")).unwrap_err();
        assert!(e.to_string().contains("no mini-epochs"), "{e}");
    }
}
