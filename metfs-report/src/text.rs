//! The human-readable summary (`summary.txt`), written from the same
//! [`ReportSummary`](super::ReportSummary) that `summary.json` serializes.

use std::fmt::Write as _;

use metfs_plan::size::format_bytes;

use super::ReportSummary;

pub(super) fn rate(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() && v >= 0.0 => format!("{}/s", format_bytes(v.round() as u64)),
        _ => "n/a".into(),
    }
}

/// The human-readable summary (`summary.txt`).
pub fn summary_text(s: &ReportSummary) -> String {
    let mut o = String::new();
    write_run(&mut o, s);
    write_rf(&mut o, s);
    write_traffic(&mut o, s);
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

/// `v`, or "n/a".
fn opt(v: Option<String>) -> String {
    v.unwrap_or_else(|| "n/a".into())
}

/// The run: its events, duration, dataset, node and passes.
fn write_run(o: &mut String, s: &ReportSummary) {
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
}

/// The effective replication factor, and the one the policy wanted.
fn write_rf(o: &mut String, s: &ReportSummary) {
    match &s.rf {
        Some(r) => {
            let _ = writeln!(
                o,
                "effective rf:           mean {:.2}; min {} p10 {} p25 {} median {} p75 {} p90 {} max {}",
                r.mean, r.min, r.p10, r.p25, r.p50, r.p75, r.p90, r.max
            );
            let _ = writeln!(
                o,
                "                        (passes per mini-epoch, bonus passes included; {} of {} mini-epochs got bonus passes, stall_rf events)",
                s.stalled_mini_epochs, s.mini_epochs_completed
            );
        }
        None => {
            let _ = writeln!(o, "effective rf:           n/a (no completed mini-epoch)");
        }
    }
    if s.deferred_samples > 0 || s.recovered_samples > 0 {
        let _ = writeln!(
            o,
            "deferred samples:       {} deferred to a later mini-epoch, {} recovered",
            s.deferred_samples, s.recovered_samples
        );
    }
    if let Some(w) = s.wanted_rf_mean {
        let _ = writeln!(o, "rf the policy wanted:   mean {w:.2}");
    }
}

/// The bytes read from the tier and through the mount, and the rates B2, EB1 and EB2.
fn write_traffic(o: &mut String, s: &ReportSummary) {
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
}
