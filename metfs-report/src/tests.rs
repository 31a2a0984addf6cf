//! Unit tests of the report: event reading, the analysis on hand-written logs, the summary
//! text, and the plots written as PNG files.

use serde_json::Value;

use super::analysis::{percentile, Pass};
use super::series::{mount_curve, smoothed_rate};
use super::*;
use metfs_feedback::policy::Verdict;
use metfs_protocol::event::{DecisionEvent, PassEnd, Staged, StallRf, Start, Switch, Tier};
use metfs_protocol::{Choice, Event, Record, Version};
use serde_json::json;

const MIB: u64 = 1 << 20;

/// One event-log line as the daemon writes it.
fn rec(t: f64, event: Event) -> Value {
    serde_json::to_value(Record {
        v: Version,
        t,
        event,
    })
    .unwrap()
}

fn start(t: f64, mini_epochs: u32, view_bytes: u64) -> Value {
    rec(
        t,
        Event::Start(Start {
            dataset_bytes: u64::from(mini_epochs) * view_bytes,
            dataset_files: 4096,
            mini_epochs,
            view_bytes,
            rf_policy: metfs_protocol::PolicyKind::Score,
            budget_bytes: 600 * MIB,
            node_rank: 0,
            nodes: 1,
            epoch: 0,
            mini_epoch: 0,
        }),
    )
}

/// A pass end of mini-epoch `sequence` (epoch 0, mini-epoch = sequence).
fn pass_end(
    t: f64,
    sequence: u64,
    pass: u32,
    verdict: Verdict,
    view: u64,
    secs: Option<f64>,
) -> Value {
    rec(
        t,
        Event::PassEnd(PassEnd {
            epoch: 0,
            mini_epoch: sequence as u32,
            sequence,
            pass,
            verdict,
            score: None,
            view_bytes: view,
            secs,
        }),
    )
}

fn decision(t: f64, decision: Choice) -> Value {
    rec(t, Event::Decision(DecisionEvent { decision }))
}

fn switch(t: f64, sequence: u64, prev_rf: u32, prev_wanted_rf: Option<u32>) -> Value {
    rec(
        t,
        Event::Switch(Switch {
            epoch: 0,
            mini_epoch: sequence as u32,
            generation: sequence + 1,
            sequence,
            prev_rf,
            prev_wanted_rf,
        }),
    )
}

fn tier(t: f64, tier_bytes_read: u64) -> Value {
    rec(t, Event::Tier(Tier { tier_bytes_read }))
}

fn staged(t: f64, bytes: u64, secs: f64) -> Value {
    rec(
        t,
        Event::Staged(Staged {
            epoch: 0,
            mini_epoch: 1,
            bytes,
            bytes_fetched: bytes,
            bytes_reused: 0,
            secs,
        }),
    )
}

/// A `start` line as text.
fn start_line() -> String {
    start(1.0, 2, 100).to_string()
}

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
    let mut first = start(t0, 4, view);
    // A field this build does not know is ignored.
    first["future_field"] = json!([1, 2]);
    let mut ev = vec![first];
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
                ev.push(super::tests::tier(t - 0.01, tier));
            }
            let (verdict, answer) = if pass < wanted {
                (Verdict::Repeat, Choice::Repeat)
            } else if pass < rf {
                (Verdict::Advance, Choice::Wait)
            } else {
                (Verdict::Advance, Choice::Advance)
            };
            ev.push(rec(
                t,
                Event::PassEnd(PassEnd {
                    epoch: seq / 4,
                    mini_epoch: (seq % 4) as u32,
                    sequence: seq,
                    pass,
                    verdict,
                    score: (pass > 1).then_some(0.5),
                    view_bytes: view,
                    secs: None,
                }),
            ));
            ev.push(decision(t, answer));
            if t - stage_start == 8.0 {
                ev.push(staged(t, view, 8.0));
            }
        }
        // As the daemon writes it: before the switch leaving a mini-epoch with bonus passes.
        if wanted < rf {
            ev.push(rec(
                t,
                Event::StallRf(StallRf {
                    epoch: seq / 4,
                    mini_epoch: (seq % 4) as u32,
                    sequence: seq,
                    policy_rf: wanted,
                    effective_rf: rf,
                    bonus_passes: rf - wanted,
                    stall_free_rf: Some(4),
                }),
            ));
        }
        ev.push(rec(
            t,
            Event::Switch(Switch {
                epoch: (seq + 1) / 4,
                mini_epoch: ((seq + 1) % 4) as u32,
                generation: seq + 2,
                sequence: seq + 1,
                prev_rf: rf,
                prev_wanted_rf: (wanted < rf).then_some(wanted),
            }),
        ));
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
    assert_eq!(j["stalled_mini_epochs"], 2);
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
    assert!(
        text.contains("effective rf:           mean 5.50;"),
        "{text}"
    );
    assert!(
        text.contains("2 of 8 mini-epochs got bonus passes"),
        "{text}"
    );
    // The returned summary is what the JSON file holds.
    assert_eq!(
        serde_json::to_vec_pretty(&s).unwrap(),
        std::fs::read(out.path().join("report").join(SUMMARY_JSON)).unwrap()
    );
}

#[test]
fn rotated_log_is_read_older_first_and_decisions_may_come_separately() {
    let run = tempfile::tempdir().unwrap();
    // The daemon's own shape: `verdict` on pass_end, the decision in its own event.
    let older = vec![
        start(100.0, 2, 100),
        pass_end(101.0, 0, 1, Verdict::Advance, 100, Some(1.0)),
        decision(101.0, Choice::Wait),
        pass_end(102.0, 0, 2, Verdict::Advance, 100, Some(1.0)),
        decision(102.0, Choice::Advance),
    ];
    let current = vec![
        switch(102.0, 1, 2, Some(1)),
        pass_end(104.0, 1, 1, Verdict::Advance, 100, Some(2.0)),
        decision(104.0, Choice::Advance),
        switch(104.0, 2, 1, Some(1)),
        // Written before pass durations were measured: no `secs`.
        pass_end(106.0, 2, 1, Verdict::Repeat, 100, None),
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
        tier(10.0, 1000),
        pass_end(11.0, 5, 3, Verdict::Repeat, 10, None),
        tier(12.0, 1500),
        start(20.0, 8, 10),
        tier(21.0, 200),
        pass_end(22.0, 6, 1, Verdict::Repeat, 10, None),
        staged(23.0, 300, 3.0),
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
    let s = start_line();
    let cases = [
        (
            format!("{s}\nnot json\n{{\"t\":2,\"event\":\"tier\",\"tier_bytes_read\":1}}\n"),
            2,
            "not a JSON object",
        ),
        (
            format!("{s}\n{{\"event\":\"tier\",\"tier_bytes_read\":1}}\n"),
            2,
            "missing `t`",
        ),
        ("{\"t\":1}\n".into(), 1, "missing `event`"),
        (
            "\n{\"t\":1,\"event\":\"switch\",\"prev_rf\":\"many\"}\n".into(),
            2,
            "`switch` event",
        ),
        (
            "{\"t\":1,\"event\":\"tier\"}\n".into(),
            1,
            "tier_bytes_read",
        ),
        (
            "{\"t\":1,\"event\":\"start\",\"mini_epochs\":2}\n".into(),
            1,
            "`start` event: missing field",
        ),
        ("[1,2]\n".into(), 1, "not a JSON object"),
        // Another major version of the protocol: refused, naming both versions.
        (
            "{\"v\":2,\"t\":1,\"event\":\"tier\",\"tier_bytes_read\":1}\n".into(),
            1,
            "protocol version 2 is not supported: this build speaks version 1",
        ),
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
    std::fs::write(&p, format!("{s}\n{{\"t\":2,\"ev")).unwrap();
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
    std::fs::write(run.path().join("events.jsonl"), start_line() + "\n").unwrap();
    let s = report(run.path(), out.path()).unwrap();
    assert_eq!(s.mini_epochs_completed, 0);
    assert_eq!(s.rf, None);
    for name in [RF_PLOT, RF_HISTOGRAM, BANDWIDTH_PLOT] {
        assert_eq!(png_dims(&out.path().join(name)), PLOT_SIZE);
    }
    assert!(summary_text(&s).contains("effective rf:           n/a"));
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
