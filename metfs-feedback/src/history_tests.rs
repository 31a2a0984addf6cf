//! Tests of the rf history: records, runs, pruning, and `learned`'s choice of run.

use super::*;
use crate::policy::{Bounds, Reason, Scope};
use proptest::prelude::*;
use serde_json::json;

fn decision(verdict: Verdict, score: Option<f64>) -> PolicyDecision {
    PolicyDecision {
        verdict,
        reason: Reason::Score {
            best: score.unwrap_or(0.0),
            current: score.unwrap_or(0.0),
            improved: false,
            wait: 0,
            wait_th: 1,
            best_scope: Scope::Run,
            passes: 1,
            bounds: Bounds::default(),
        },
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
        r.add_pass(&Metrics::new(), &decision(v, Some(10.0 - p as f64)));
    }
    r
}

/// A metric no test run records unless it says so: the rank falls back to the latest
/// finished run, as before any metric was recorded.
fn unrecorded() -> ReplayMetric {
    ReplayMetric::of_score(
        &crate::policy::WeightedScore::new(vec!["loss".parse().unwrap()], vec![1.0]).unwrap(),
    )
    .unwrap()
}

/// The schedule `learned` replays, ranked by a metric the runs did not record.
fn schedule(h: &HistoryStore, ds: &str, job: &str) -> Option<Vec<u32>> {
    schedule_excluding(h, ds, job, None)
}

fn schedule_excluding(
    h: &HistoryStore,
    ds: &str,
    job: &str,
    exclude: Option<RunId>,
) -> Option<Vec<u32>> {
    h.replay(ds, job, exclude, &unrecorded())
        .unwrap()
        .map(|(_, s)| s)
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
    r.add_pass(&Metrics::new(), &decision(Verdict::Repeat, None));
    r.add_pass(&Metrics::new(), &decision(Verdict::Repeat, Some(f64::NAN)));
    assert_eq!(r.scores, [None, None]);
}

#[test]
fn round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("history.json");
    let (mut h, warnings) = HistoryStore::open(&path).unwrap();
    assert!(warnings.is_empty());
    assert!(h.all_runs().is_empty());
    assert_eq!(schedule(&h, "ds", "job"), None);
    let run = h.start_run("ds", "job");
    h.record_mini_epoch(run, mini_epoch(0, 5, Some(3))).unwrap();
    h.record_mini_epoch(run, mini_epoch(1, 2, Some(2))).unwrap();
    h.finish_run(run).unwrap();
    h.save().unwrap();

    let (h2, warnings) = HistoryStore::open(&path).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(h2.all_runs(), h.all_runs());
    assert_eq!(schedule(&h2, "ds", "job"), Some(vec![3, 2]));
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
        assert_eq!(schedule(&again, "ds", "job").unwrap().len() as u64, seq + 1);
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
        assert_eq!(schedule(&h, "ds", "job"), Some(vec![2]));
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
    assert_eq!(schedule(&h, "cifar@def", "resnet50"), None);
    assert_eq!(schedule(&h, "imagenet@abc", "efficientnet"), None);
    assert_eq!(schedule(&h, "imagenet@abc", "resnet50"), Some(vec![7]));
    // An empty run (started, nothing recorded) has nothing to replay.
    let (mut h, _) = HistoryStore::open(&path).unwrap();
    h.start_run("cifar@def", "resnet50");
    assert_eq!(schedule(&h, "cifar@def", "resnet50"), None);
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
    assert_eq!(schedule(&h, "ds", "job"), Some(vec![4, 5, 3]));
    // A resumed run does not replay itself.
    assert_eq!(schedule_excluding(&h, "ds", "job", Some(run)), None);
    // An unknown id, or one of another key, starts a new run.
    let (other, resumed) = h.resume_or_start("ds", "job", Some(RunId(42)));
    assert!(!resumed && other != run);
    let (third, resumed) = h.resume_or_start("ds2", "job", Some(run));
    assert!(!resumed && third != run && third != other);
}

#[test]
fn without_a_ranked_run_the_latest_finished_run_then_the_longest_is_replayed() {
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
    assert_eq!(schedule(&h, "ds", "job"), Some(vec![2; 4]));
    // Equal length: the most recent.
    let tie = h.start_run("ds", "job");
    for seq in 0..4 {
        h.record_mini_epoch(tie, mini_epoch(seq, 3, Some(3)))
            .unwrap();
    }
    assert_eq!(schedule(&h, "ds", "job"), Some(vec![3; 4]));
    // A finished run wins over longer unfinished ones; the latest finished one among them.
    h.finish_run(short).unwrap();
    assert_eq!(schedule(&h, "ds", "job"), Some(vec![7]));
    h.finish_run(long).unwrap();
    assert_eq!(schedule(&h, "ds", "job"), Some(vec![7]));
    assert_eq!(
        schedule_excluding(&h, "ds", "job", Some(short)),
        Some(vec![2; 4])
    );
    // Why is said: no run recorded the metric, so the latest finished one.
    let (replay, _) = h.replay("ds", "job", None, &unrecorded()).unwrap().unwrap();
    assert_eq!(
        (replay.run, replay.why, replay.value, replay.compared),
        (short, ReplayWhy::Latest, None, 0)
    );
    assert_eq!(replay.metric, "min:loss");
    assert!(replay.to_string().contains("latest finished"), "{replay}");
}

/// A store in memory.
fn store() -> HistoryStore {
    HistoryStore {
        path: PathBuf::from("unused.json"),
        file: HistoryFile::empty(),
    }
}

/// A run of `rf` passes per mini-epoch over two mini-epochs whose last pass sent
/// `metrics` (the first sent others, which a final value must not read).
fn run_ending_with(
    h: &mut HistoryStore,
    rf: u32,
    metrics: &[(&str, f64)],
    finished: bool,
) -> RunId {
    let run = h.start_run("ds", "job");
    for seq in 0..2 {
        let mut rec = MiniEpochRecord::begin(seq, 0, seq as u32);
        for p in 1..=rf {
            let sent: Metrics = if seq == 1 && p == rf {
                metrics.iter().map(|(k, v)| (k.to_string(), *v)).collect()
            } else {
                [
                    ("loss".to_string(), 9.0),
                    ("val_accuracy".to_string(), 0.01),
                ]
                .into()
            };
            let v = if p == rf {
                Verdict::Advance
            } else {
                Verdict::Repeat
            };
            rec.add_pass(&sent, &decision(v, Some(1.0)));
        }
        h.record_mini_epoch(run, rec).unwrap();
    }
    if finished {
        h.finish_run(run).unwrap();
    }
    run
}

fn ranked_by(h: &HistoryStore, metric: &str) -> Result<Option<(Replay, Vec<u32>)>, HistoryError> {
    h.replay("ds", "job", None, &metric.parse().unwrap())
}

#[test]
fn a_record_keeps_the_last_value_of_each_metric() {
    let mut r = MiniEpochRecord::begin(0, 0, 0);
    let pass = |loss: f64, val: Option<f64>| -> Metrics {
        let mut m: Metrics = [("loss".to_string(), loss)].into();
        if let Some(v) = val {
            m.insert("val_accuracy".into(), v);
        }
        m
    };
    r.add_pass(&pass(2.0, Some(0.5)), &decision(Verdict::Repeat, None));
    r.add_pass(&pass(1.5, None), &decision(Verdict::Repeat, None));
    r.add_pass(
        &pass(f64::INFINITY, None),
        &decision(Verdict::Advance, None),
    );
    // Validation sent at the first pass only keeps that value; a non-finite one is not
    // kept over the last finite one.
    assert_eq!(
        r.metrics,
        [("loss".into(), 1.5), ("val_accuracy".into(), 0.5)].into()
    );
    let run = RunRecord {
        id: RunId(1),
        dataset: "ds".into(),
        job: "job".into(),
        started_unix_ms: 0,
        updated_unix_ms: 0,
        finished: true,
        replayed: None,
        mini_epochs: vec![r, MiniEpochRecord::begin(1, 0, 1)],
    };
    assert_eq!(run.final_metric("loss"), Some(1.5));
    assert_eq!(run.final_metric("accuracy"), None);
}

#[test]
fn the_best_run_by_a_lower_is_better_metric_is_replayed() {
    let mut h = store();
    let worse = run_ending_with(&mut h, 2, &[("val_loss", 0.5)], true);
    let best = run_ending_with(&mut h, 3, &[("val_loss", 0.2)], true);
    let latest = run_ending_with(&mut h, 4, &[("val_loss", 0.9)], true);
    // An unfinished run is not ranked against finished ones, however good its last value.
    let unfinished = run_ending_with(&mut h, 5, &[("val_loss", 0.01)], false);
    let (replay, schedule) = ranked_by(&h, "min:val_loss").unwrap().unwrap();
    assert_eq!(schedule, [3, 3]);
    assert_eq!(
        replay,
        Replay {
            run: best,
            mini_epochs: 2,
            why: ReplayWhy::Best,
            metric: "min:val_loss".into(),
            value: Some(0.2),
            finished: true,
            compared: 3,
        }
    );
    assert!(
        replay
            .to_string()
            .contains("best final min:val_loss (0.2) of 3 finished"),
        "{replay}"
    );
    // Ties go to the latest run.
    let tie = run_ending_with(&mut h, 6, &[("val_loss", 0.2)], true);
    assert_eq!(ranked_by(&h, "min:val_loss").unwrap().unwrap().0.run, tie);
    // A resumed run is not ranked against the others.
    let (r, _) = h
        .replay("ds", "job", Some(tie), &"min:val_loss".parse().unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(r.run, best);
    let _ = (worse, latest, unfinished);
}

#[test]
fn the_best_run_by_a_higher_is_better_metric_is_replayed() {
    let mut h = store();
    let low = run_ending_with(&mut h, 2, &[("val_accuracy", 0.6)], true);
    let high = run_ending_with(&mut h, 3, &[("val_accuracy", 0.9)], true);
    run_ending_with(&mut h, 4, &[("val_accuracy", 0.7)], true);
    let (replay, schedule) = ranked_by(&h, "max:val_accuracy").unwrap().unwrap();
    assert_eq!(
        (replay.run, replay.why, schedule),
        (high, ReplayWhy::Best, vec![3, 3])
    );
    // The same ranking as a complement to minimise, and the opposite direction.
    assert_eq!(
        ranked_by(&h, "min:1 - val_accuracy")
            .unwrap()
            .unwrap()
            .0
            .run,
        high
    );
    assert_eq!(
        ranked_by(&h, "min:val_accuracy").unwrap().unwrap().0.run,
        low
    );
    // By default the score's first term: `1 - val_accuracy` weighted 1 is minimised, so
    // the highest accuracy wins; weighted -1 the score rewards it, so the lowest.
    let score = |w: f64| {
        crate::policy::WeightedScore::new(
            vec!["1 - val_accuracy".parse().unwrap(), "loss".parse().unwrap()],
            vec![w, 1.0],
        )
        .unwrap()
    };
    for (w, want) in [(1.0, high), (-1.0, low)] {
        let m = ReplayMetric::of_score(&score(w)).unwrap();
        assert!(!m.is_named());
        let (r, _) = h.replay("ds", "job", None, &m).unwrap().unwrap();
        assert_eq!(r.run, want, "weight {w}");
    }
    // A zero weight does not rank: the next term does.
    let zero = crate::policy::WeightedScore::new(
        vec!["1 - val_accuracy".parse().unwrap(), "loss".parse().unwrap()],
        vec![0.0, 1.0],
    )
    .unwrap();
    assert_eq!(
        ReplayMetric::of_score(&zero).unwrap().to_string(),
        "min:loss"
    );
}

#[test]
fn without_a_finished_run_that_recorded_it_the_unfinished_runs_are_ranked() {
    // A plain mount's runs: none finishes.
    let mut h = store();
    run_ending_with(&mut h, 2, &[("loss", 0.4)], false);
    let best = run_ending_with(&mut h, 3, &[("loss", 0.1)], false);
    run_ending_with(&mut h, 4, &[("loss", 0.3)], false);
    // A finished run that did not record the metric does not outrank them.
    let done = h.start_run("ds", "job");
    h.record_mini_epoch(done, mini_epoch(0, 7, Some(7)))
        .unwrap();
    h.finish_run(done).unwrap();
    let (r, schedule) = ranked_by(&h, "min:loss").unwrap().unwrap();
    assert_eq!(
        (r.run, r.why, r.value, r.finished, r.compared, schedule),
        (best, ReplayWhy::Best, Some(0.1), false, 3, vec![3, 3])
    );
    assert!(r.to_string().contains("of 3 unfinished"), "{r}");
}

#[test]
fn without_a_run_that_recorded_the_metric_the_latest_finished_run_is_replayed() {
    // The default metric (the score's first term) is never refused, whatever the runs
    // recorded.
    let top1 = || {
        let score = crate::policy::WeightedScore::new(vec!["1 - top1".parse().unwrap()], vec![1.0])
            .unwrap();
        ReplayMetric::of_score(&score).unwrap()
    };
    let mut h = store();
    run_ending_with(&mut h, 2, &[("loss", 0.1)], true);
    let latest = run_ending_with(&mut h, 3, &[("loss", 0.3)], true);
    run_ending_with(&mut h, 4, &[("loss", 0.2)], false);
    let (r, schedule) = h.replay("ds", "job", None, &top1()).unwrap().unwrap();
    assert_eq!(
        (r.run, r.why, r.value, r.finished, r.compared, schedule),
        (latest, ReplayWhy::Latest, None, true, 0, vec![3, 3])
    );
    assert!(
        r.to_string()
            .contains("latest finished run (no run recorded min:1 - top1)"),
        "{r}"
    );
    // No run finished either: the one that got furthest.
    let mut h = store();
    let long = run_ending_with(&mut h, 2, &[("loss", 0.1)], false);
    h.record_mini_epoch(long, mini_epoch(2, 2, Some(2)))
        .unwrap();
    run_ending_with(&mut h, 5, &[("loss", 0.1)], false);
    let (r, schedule) = h.replay("ds", "job", None, &top1()).unwrap().unwrap();
    assert_eq!(
        (r.run, r.why, schedule),
        (long, ReplayWhy::Furthest, vec![2, 2, 2])
    );
    assert!(r.to_string().contains("got furthest"), "{r}");
    // Nothing to replay for another key, whatever the metric.
    assert!(h
        .replay("ds", "other", None, &"max:nope".parse().unwrap())
        .unwrap()
        .is_none());
}

#[test]
fn a_named_metric_no_run_recorded_is_refused_naming_the_setting() {
    let mut h = store();
    run_ending_with(&mut h, 2, &[("loss", 0.1), ("val_accuracy", 0.8)], true);
    let e = ranked_by(&h, "max:val_acuracy").unwrap_err();
    assert!(matches!(e, HistoryError::UnrecordedMetric { .. }), "{e}");
    let text = e.to_string();
    for needle in [
        "learned_metric",
        "`max:val_acuracy`",
        "`val_acuracy`",
        "job `job`",
        "loss, val_accuracy",
    ] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
    // Runs that recorded no metric at all do not refuse it: they are replayed as the
    // latest, and the new run records the metric for the next one.
    let mut h = store();
    let old = h.start_run("ds", "job");
    h.record_mini_epoch(old, mini_epoch(0, 4, Some(4))).unwrap();
    h.finish_run(old).unwrap();
    let (r, _) = ranked_by(&h, "max:val_accuracy").unwrap().unwrap();
    assert_eq!((r.run, r.why), (old, ReplayWhy::Latest));
    // And a first run has nothing to refuse.
    assert!(ranked_by(&store(), "max:val_accuracy").unwrap().is_none());
}

#[test]
fn the_replayed_run_is_recorded_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.json");
    let (mut h, _) = HistoryStore::open(&path).unwrap();
    let best = run_ending_with(&mut h, 3, &[("loss", 0.1)], true);
    let (replay, _) = ranked_by(&h, "min:loss").unwrap().unwrap();
    // Runs after it, each replaying it and ending worse, push it to the oldest.
    for _ in 0..2 * MAX_RUNS_PER_KEY {
        let run = run_ending_with(&mut h, 2, &[("loss", 0.5)], true);
        h.set_replayed(run, Some(replay.clone())).unwrap();
    }
    assert!(h.run(best).is_some(), "the best run is kept");
    assert!(h.runs("ds", "job").count() <= MAX_RUNS_PER_KEY + 1);
    assert_eq!(ranked_by(&h, "min:loss").unwrap().unwrap().0.run, best);
    h.save().unwrap();
    let v: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    let last = v["runs"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        last["replayed"],
        json!({"run": best.0, "mini_epochs": 2, "why": "best", "metric": "min:loss",
               "value": 0.1, "finished": true, "compared": 1})
    );
    // The last value of each metric in the mini-epoch: the last pass sent only the loss.
    assert_eq!(
        last["mini_epochs"][1]["metrics"],
        json!({"loss": 0.5, "val_accuracy": 0.01})
    );
    let (again, w) = HistoryStore::open(&path).unwrap();
    assert!(w.is_empty());
    assert_eq!(again.all_runs(), h.all_runs());
    // A run that replays nothing has no such field.
    assert!(v["runs"][0].get("replayed").is_none());
    assert!(matches!(
        h.set_replayed(RunId(999), None),
        Err(HistoryError::UnknownRun(_))
    ));
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
    assert_eq!(schedule(&h, "ds", "job"), Some(vec![3, 4]));
    // A run that starts mid-way (no sequence 0) has nothing to replay.
    let late = h.start_run("ds2", "job");
    h.record_mini_epoch(late, mini_epoch(5, 2, Some(2)))
        .unwrap();
    assert_eq!(schedule(&h, "ds2", "job"), None);
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
    assert_eq!(schedule(&h, "ds", "job"), Some(vec![5]));
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

/// One generated run for the ranking property: per mini-epoch, the value of metric `m`
/// its passes sent (`None`: they sent only `other`), and whether the run finished.
type GenRun = (Vec<Option<u8>>, bool);

/// What `replay` must answer, computed from the generated runs alone: the run (index),
/// why, its final value of `m`, and how many runs were compared.
fn expected_replay(
    runs: &[GenRun],
    higher_is_better: bool,
) -> Option<(usize, ReplayWhy, Option<f64>, u64)> {
    let final_of = |i: usize| runs[i].0.iter().rev().find_map(|v| v.map(f64::from));
    let recorded: Vec<usize> = (0..runs.len()).filter(|&i| final_of(i).is_some()).collect();
    let pool: Vec<usize> = if recorded.iter().any(|&i| runs[i].1) {
        recorded.into_iter().filter(|&i| runs[i].1).collect()
    } else {
        recorded
    };
    // Better value first, then the later run.
    let key = |i: usize| {
        let v = final_of(i).unwrap();
        (if higher_is_better { v } else { -v }, i)
    };
    if let Some(&best) = pool
        .iter()
        .max_by(|&&a, &&b| key(a).partial_cmp(&key(b)).unwrap())
    {
        return Some((best, ReplayWhy::Best, final_of(best), pool.len() as u64));
    }
    if let Some(latest) = (0..runs.len()).rev().find(|&i| runs[i].1) {
        return Some((latest, ReplayWhy::Latest, None, 0));
    }
    (0..runs.len())
        .max_by_key(|&i| (runs[i].0.len(), i))
        .map(|i| (i, ReplayWhy::Furthest, None, 0))
}

proptest! {
    /// `replay` takes the run with the best final value of the metric (lower or higher
    /// better, ties to the later run), finished runs before unfinished ones, else the
    /// latest finished run, else the furthest; whether the metric is the score's term or
    /// named by `learned_metric`, which is refused only when no run recorded it while
    /// some recorded another metric.
    #[test]
    fn replay_ranks_runs_by_their_final_value(
        runs in proptest::collection::vec(
            (proptest::collection::vec(proptest::option::of(0u8..4), 1..5), any::<bool>()),
            0..=MAX_RUNS_PER_KEY,
        ),
        higher_is_better in any::<bool>(),
    ) {
        let mut h = store();
        let mut ids = Vec::new();
        for (values, finished) in &runs {
            let run = h.start_run("ds", "job");
            for (seq, v) in values.iter().enumerate() {
                let mut rec = MiniEpochRecord::begin(seq as u64, 0, seq as u32);
                let sent: Metrics = match v {
                    Some(v) => [("m".to_string(), f64::from(*v))].into(),
                    None => [("other".to_string(), 0.0)].into(),
                };
                rec.add_pass(&sent, &decision(Verdict::Advance, Some(1.0)));
                h.record_mini_epoch(run, rec).unwrap();
            }
            if *finished {
                h.finish_run(run).unwrap();
            }
            ids.push(run);
        }
        // A positive weight minimises the term, a negative one maximises it.
        let weight = if higher_is_better { -1.0 } else { 1.0 };
        let score = crate::policy::WeightedScore::new(vec!["m".parse().unwrap()], vec![weight])
            .unwrap();
        let implied = ReplayMetric::of_score(&score).unwrap();
        let spelled = if higher_is_better { "max:m" } else { "min:m" };
        prop_assert_eq!(implied.to_string(), spelled);
        let want = expected_replay(&runs, higher_is_better);
        let got = h.replay("ds", "job", None, &implied).unwrap();
        match (&got, want) {
            (None, None) => {}
            (Some((r, schedule)), Some((i, why, value, compared))) => {
                prop_assert_eq!(
                    (r.run, r.why, r.value, r.compared, r.finished),
                    (ids[i], why, value, compared, runs[i].1)
                );
                prop_assert_eq!(schedule.len(), runs[i].0.len());
                prop_assert_eq!(r.mini_epochs, runs[i].0.len() as u64);
            }
            (got, want) => prop_assert!(false, "got {:?}, want {:?}", got, want),
        }
        // The same metric named by the setting ranks alike, unless no run recorded it.
        let named = h.replay("ds", "job", None, &spelled.parse().unwrap());
        let none_recorded = runs.iter().all(|(v, _)| v.iter().all(Option::is_none));
        if none_recorded && !runs.is_empty() {
            let refused = matches!(named, Err(HistoryError::UnrecordedMetric { .. }));
            prop_assert!(refused, "{:?}", named);
        } else {
            prop_assert_eq!(named.unwrap().map(|(r, _)| r.run), got.map(|(r, _)| r.run));
        }
    }
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
            rec.add_pass(&Metrics::new(), &decision(Verdict::Repeat, Some(s)));
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
            schedule(&h2, &dataset, &job),
            (!expected.is_empty()).then_some(expected)
        );
        prop_assert_eq!(listing(dir.path()), vec!["h.json".to_string()]);
    }
}
