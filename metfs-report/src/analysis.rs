//! The analysis (pure): from the events to passes, completed mini-epochs (rf, wanted rf,
//! stall-free rf), tier bytes over time and the [`ReportSummary`](super::ReportSummary) with
//! its rf statistics, B2, EB1 and EB2 as defined in the module docs.

use std::path::{Path, PathBuf};

use metfs_plan::model::stall_free_rf;

use super::events::{Event, EventLog, Start, Timed};
use super::{MiniEpochRow, ReportSummary, RfStats};
use metfs_protocol::Choice;

/// One pass, as the analysis sees it.
pub(super) struct Pass {
    pub(super) t: f64,
    pub(super) sequence: Option<u64>,
    pub(super) epoch: Option<u64>,
    pub(super) mini_epoch: Option<u32>,
    pub(super) pass: Option<u32>,
    pub(super) view_bytes: Option<u64>,
    pub(super) secs: Option<f64>,
    pub(super) decision: Option<Choice>,
}

/// Everything the plots and the summary need.
pub(super) struct Analysis {
    pub(super) t0: f64,
    pub(super) t_end: f64,
    pub(super) starts: u64,
    pub(super) last_start: Option<Start>,
    pub(super) passes: Vec<Pass>,
    pub(super) rows: Vec<MiniEpochRow>,
    /// (t, cumulative tier bytes), restarts folded in.
    pub(super) tier: Vec<(f64, f64)>,
    pub(super) tier_source: &'static str,
    pub(super) tier_bytes_read: u64,
    pub(super) staged: u64,
    pub(super) staged_fetched: u64,
    pub(super) staged_secs: f64,
    /// `stall_rf` events: mini-epochs whose rf bonus passes raised.
    pub(super) stalled: u64,
    /// Samples deferred and recovered (`deferred`, `recovered` events).
    pub(super) deferred: u64,
    pub(super) recovered: u64,
    pub(super) warnings: Vec<String>,
}

pub(super) fn analyse(log: EventLog) -> Analysis {
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
    let first_is_start = matches!(log.events.first().map(|e| &e.ev), Some(Event::Start(_)));
    if !first_is_start && !log.events.is_empty() {
        warnings.push(
            "the log does not begin with a `start` event (rotated past the run's start?): totals cover the logged part only"
                .into(),
        );
    }
    let mut x = Tally::default();
    for Timed { t, ev } in log.events {
        x.add(t, ev);
    }
    let (tier_source, tier_bytes_read) = if !x.tier.is_empty() {
        ("tier events", x.tier_offset + x.tier_last)
    } else if x.staged > 0 {
        ("staged events", x.staged_fetched)
    } else {
        ("none", 0)
    };
    let mut tier = x.tier;
    if tier.is_empty() {
        // Staging intervals are the best picture of tier traffic without `tier` events.
        tier = x.staged_points;
        tier.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    let rows = completed_mini_epochs(&x.passes, &x.switches);
    Analysis {
        t0,
        t_end,
        starts: x.starts,
        last_start: x.last_start,
        passes: x.passes,
        rows,
        tier,
        tier_source,
        tier_bytes_read,
        staged: x.staged,
        staged_fetched: x.staged_fetched,
        staged_secs: x.staged_secs,
        stalled: x.stalled,
        deferred: x.deferred,
        recovered: x.recovered,
        warnings,
    }
}

/// What the walk over the events gathers, in the order they were logged.
#[derive(Default)]
struct Tally {
    starts: u64,
    last_start: Option<Start>,
    passes: Vec<Pass>,
    switches: Vec<(Option<u64>, u32, Option<u32>)>,
    /// (t, cumulative tier bytes), restarts folded in.
    tier: Vec<(f64, f64)>,
    tier_offset: u64,
    tier_last: u64,
    staged: u64,
    staged_fetched: u64,
    staged_secs: f64,
    staged_points: Vec<(f64, f64)>,
    stalled: u64,
    deferred: u64,
    recovered: u64,
    /// The time the current pass began, when known: the previous pass_end or start.
    pass_origin: Option<f64>,
}

impl Tally {
    /// Counts event `ev`, logged at `t`.
    fn add(&mut self, t: f64, ev: Event) {
        match ev {
            Event::Start(s) => {
                self.starts += 1;
                self.last_start = Some(s);
                // A restarted daemon counts tier bytes from 0 again.
                self.tier_offset += self.tier_last;
                self.tier_last = 0;
                self.pass_origin = Some(t);
            }
            Event::PassEnd(p) => {
                let secs = p
                    .secs
                    .or_else(|| self.pass_origin.map(|o| (t - o).max(0.0)));
                self.pass_origin = Some(t);
                self.passes.push(Pass {
                    t,
                    sequence: Some(p.sequence),
                    epoch: Some(p.epoch),
                    mini_epoch: Some(p.mini_epoch),
                    pass: Some(p.pass),
                    view_bytes: Some(p.view_bytes),
                    secs,
                    decision: None,
                });
            }
            Event::Decision(d) => {
                // The answer to the pass end just before it.
                if let Some(last) = self.passes.last_mut() {
                    if last.decision.is_none() {
                        last.decision = Some(d.decision);
                    }
                }
            }
            Event::Staged(s) => {
                self.staged += 1;
                let fetched = s.bytes_fetched;
                self.staged_fetched += fetched;
                if let Some(secs) = Some(s.secs).filter(|s| s.is_finite() && *s > 0.0) {
                    self.staged_secs += secs;
                    let before = self.staged_points.last().map_or(0.0, |p| p.1);
                    self.staged_points.push((t - secs, before));
                    self.staged_points.push((t, before + fetched as f64));
                }
            }
            Event::Switch(s) => self
                .switches
                .push((Some(s.sequence), s.prev_rf, s.prev_wanted_rf)),
            Event::Tier(x) => {
                if x.tier_bytes_read < self.tier_last {
                    self.tier_offset += self.tier_last;
                }
                self.tier_last = x.tier_bytes_read;
                self.tier
                    .push((t, (self.tier_offset + self.tier_last) as f64));
            }
            Event::StallRf(_) => self.stalled += 1,
            Event::Deferred(d) => self.deferred += d.samples,
            Event::Recovered(r) => self.recovered += r.samples,
            // Kinds the report does not use.
            Event::StageFailed(_)
            | Event::JobNotResumed(_)
            | Event::HeldOpenCapped(_)
            | Event::Other => {}
        }
    }
}

/// Completed mini-epochs: one per switch, and for sequences whose switch is not in the log but
/// which were followed by a later sequence, one from their passes.
pub(super) fn completed_mini_epochs(
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
        if p.decision == Some(Choice::Wait) {
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
///
/// Written here rather than taken from `statrs` (which the Bollinger band uses): statrs 0.18's
/// `OrderStatistics::percentile` interpolates between ranks and returns an `f64`, whereas
/// an rf percentile in the report must be an rf the run actually used, an integer in
/// `summary.json`.
pub(super) fn percentile(sorted: &[u32], p: f64) -> u32 {
    let n = sorted.len();
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

pub(super) fn rf_stats(rows: &[MiniEpochRow]) -> Option<RfStats> {
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

pub(super) fn summarise(
    a: &Analysis,
    run_dir: &Path,
    files: Vec<PathBuf>,
    events: u64,
) -> ReportSummary {
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
        dataset_bytes: s.map(|s| s.dataset_bytes),
        dataset_files: s.map(|s| s.dataset_files),
        mini_epochs_per_epoch: s.map(|s| s.mini_epochs),
        rf_policy: s.map(|s| s.rf_policy.to_string()),
        budget_bytes: s.map(|s| s.budget_bytes),
        node_rank: s.map(|s| s.node_rank),
        nodes: s.map(|s| s.nodes),
        starts: a.starts,
        mini_epochs_completed: a.rows.len() as u64,
        passes: a.passes.len() as u64,
        bonus_passes: a
            .passes
            .iter()
            .filter(|p| p.decision == Some(Choice::Wait))
            .count() as u64,
        rf: rf_stats(&a.rows),
        stalled_mini_epochs: a.stalled,
        deferred_samples: a.deferred,
        recovered_samples: a.recovered,
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
        stall_free_rf: eb1.zip(b2).and_then(|(e, b)| stall_free_rf(e, b)),
        mean_pass_secs: (!timed.is_empty()).then(|| timed.iter().sum::<f64>() / timed.len() as f64),
        mini_epochs: a.rows.clone(),
    }
}
