//! Unit tests of the policies.

use super::*;
use proptest::prelude::*;
use serde_json::{json, Value};

fn st(passes: u32) -> PassState {
    PassState::new(passes, 0)
}

fn at(sequence: u64, passes: u32) -> PassState {
    PassState::new(passes, sequence)
}

fn loss(x: f64) -> Metrics {
    [("loss".to_string(), x)].into_iter().collect()
}

/// A score that is just the loss, so test sequences are the scores themselves.
fn loss_score() -> WeightedScore {
    WeightedScore::new(vec![MetricTerm::plain("loss").unwrap()], vec![1.0]).unwrap()
}

/// Feeds one mini-epoch's scores; returns the verdicts and the decisions' reasons.
fn feed(p: &mut dyn RfPolicy, seq: u64, scores: &[f64]) -> Vec<(Verdict, Value)> {
    scores
        .iter()
        .enumerate()
        .map(|(i, &s)| {
            let d = p.on_pass_end(&loss(s), &at(seq, i as u32 + 1)).unwrap();
            (d.verdict, d.reason.to_json())
        })
        .collect()
}

fn verdicts(v: &[(Verdict, Value)]) -> Vec<Verdict> {
    v.iter().map(|(v, _)| *v).collect()
}

use Verdict::{Advance as A, Repeat as R};

#[test]
fn fixed_advances_after_rf_passes() {
    let mut p = Fixed::new(3).unwrap();
    let m = Metrics::new();
    assert_eq!(p.on_pass_end(&m, &st(1)).unwrap().verdict, Verdict::Repeat);
    assert_eq!(p.on_pass_end(&m, &st(2)).unwrap().verdict, Verdict::Repeat);
    assert_eq!(p.on_pass_end(&m, &st(3)).unwrap().verdict, Verdict::Advance);
    assert_eq!(p.on_pass_end(&m, &st(4)).unwrap().verdict, Verdict::Advance);
    assert!(Fixed::new(0).is_err());
}

#[test]
fn bounds_hold() {
    let m = Metrics::new();
    let mut b = Bounded::new(Box::new(Fixed::new(1).unwrap()), 2, 3).unwrap();
    let d = b.on_pass_end(&m, &st(1)).unwrap();
    assert_eq!(d.verdict, Verdict::Repeat);
    assert_eq!(d.reason.to_json()["bound"], "rf_min");
    assert_eq!(b.on_pass_end(&m, &st(2)).unwrap().verdict, Verdict::Advance);
    let mut b = Bounded::new(Box::new(Fixed::new(10).unwrap()), 1, 3).unwrap();
    assert_eq!(b.on_pass_end(&m, &st(2)).unwrap().verdict, Verdict::Repeat);
    let d = b.on_pass_end(&m, &st(3)).unwrap();
    assert_eq!(d.verdict, Verdict::Advance);
    assert_eq!(d.reason.to_json()["bound"], "rf_max");
    assert_eq!(b.expected_rf(), 3.0);
    assert!(Bounded::new(Box::new(Fixed::new(1).unwrap()), 3, 2).is_err());
}

#[test]
fn metric_terms_parse() {
    let t: MetricTerm = "loss".parse().unwrap();
    assert_eq!((t.metric(), t.is_complement()), ("loss", false));
    for spec in [
        "1 - accuracy",
        "1-accuracy",
        "  1 -accuracy ",
        "1- accuracy",
    ] {
        let t: MetricTerm = spec.parse().unwrap();
        assert_eq!(
            (t.metric(), t.is_complement()),
            ("accuracy", true),
            "{spec}"
        );
        assert_eq!(t.to_string(), "1 - accuracy");
    }
    // A name that starts with 1 but has no `-` is a plain name.
    let t: MetricTerm = "1st_loss".parse().unwrap();
    assert_eq!((t.metric(), t.is_complement()), ("1st_loss", false));
    for (spec, needle) in [
        ("", "empty"),
        ("1 -", "empty"),
        ("1 - ", "empty"),
        ("2 - accuracy", "whitespace"),
        ("val acc", "whitespace"),
        ("a,b", "commas"),
        ("-loss", "negative weight"),
    ] {
        let e = spec.parse::<MetricTerm>().unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("score_metrics"), "{spec}: {msg}");
        assert!(msg.contains(needle), "{spec}: {msg}");
    }
    // Serde uses the same spelling.
    let t: MetricTerm = serde_json::from_str("\"1-val_accuracy\"").unwrap();
    assert_eq!(serde_json::to_string(&t).unwrap(), "\"1 - val_accuracy\"");
    assert!(serde_json::from_str::<MetricTerm>("\"1 - \"").is_err());
}

#[test]
fn weighted_score_is_the_dot_product_of_fig6() {
    let m: Metrics = [("loss", 0.5), ("accuracy", 0.8), ("val_accuracy", 0.7)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    let s = WeightedScore::paper_default().eval(&m, "score").unwrap();
    assert!((s - (0.5 + 0.2 + 0.3)).abs() < 1e-12, "{s}");
    let w = WeightedScore::new(default_terms(), vec![1.0, 0.5, 2.0]).unwrap();
    let s = w.eval(&m, "score").unwrap();
    assert!((s - (0.5 + 0.1 + 0.6)).abs() < 1e-12, "{s}");

    assert!(WeightedScore::new(vec![], vec![]).is_err());
    let e = WeightedScore::new(default_terms(), vec![1.0]).unwrap_err();
    assert!(e.to_string().contains("score_weights"), "{e}");
    assert!(e.to_string().contains("1 weights for 3 metrics"), "{e}");
    assert!(WeightedScore::new(default_terms(), vec![0.0; 3]).is_err());
    assert!(WeightedScore::new(default_terms(), vec![1.0, f64::NAN, 1.0]).is_err());
}

#[test]
fn missing_metric_is_a_clear_error_on_the_first_pass() {
    let mut p = Score::new(WeightedScore::paper_default(), 3, Scope::Run).unwrap();
    let m: Metrics = [("loss".to_string(), 0.5), ("acc".to_string(), 0.9)]
        .into_iter()
        .collect();
    let e = p.on_pass_end(&m, &st(1)).unwrap_err();
    assert_eq!(
        e,
        PolicyError::MissingMetric {
            policy: "score",
            metric: "accuracy".into(),
            sent: "acc, loss".into()
        }
    );
    let msg = e.to_string();
    assert!(
        msg.contains("`accuracy`") && msg.contains("acc, loss"),
        "{msg}"
    );
    // The failed pass changed nothing.
    assert_eq!((p.best(), p.wait()), (None, 0));

    let e = p.on_pass_end(&Metrics::new(), &st(1)).unwrap_err();
    assert!(e.to_string().contains("no metrics"), "{e}");

    let mut b = Bollinger::new(WeightedScore::paper_default(), 5, 2.0, Scope::Run).unwrap();
    let e = b.on_pass_end(&loss(1.0), &st(1)).unwrap_err();
    assert!(
        matches!(&e, PolicyError::MissingMetric { policy: "bollinger", metric, .. } if metric == "accuracy"),
        "{e}"
    );
    assert_eq!(b.recent.len(), 0);
}

#[test]
fn overflowing_score_is_an_error() {
    let w = WeightedScore::new(vec![MetricTerm::plain("loss").unwrap()], vec![1e300]).unwrap();
    let mut p = Score::new(w, 3, Scope::Run).unwrap();
    let e = p.on_pass_end(&loss(1e300), &st(1)).unwrap_err();
    assert!(matches!(e, PolicyError::NonFiniteScore { .. }), "{e}");
    assert_eq!(p.best(), None);
}

#[test]
fn score_counts_waits_exactly_as_fig6() {
    let mut p = Score::new(loss_score(), 3, Scope::Run).unwrap();
    // 5 improves (from +inf), 4 improves, 4 is equal (not an improvement: wait 1),
    // 4.5 is worse (wait 2), 4 is equal again (wait 3 >= wait_th: advance).
    let out = feed(&mut p, 0, &[5.0, 4.0, 4.0, 4.5, 4.0]);
    assert_eq!(verdicts(&out), [R, R, R, R, A]);
    let waits: Vec<_> = out
        .iter()
        .map(|(_, r)| r["wait"].as_u64().unwrap())
        .collect();
    assert_eq!(waits, [0, 0, 1, 2, 3]);
    assert_eq!(
        out[4].1,
        json!({"policy": "score", "best": 4.0, "current": 4.0, "improved": false,
               "wait": 3, "wait_th": 3, "best_scope": "run", "passes": 5})
    );
    assert_eq!(out[1].1["improved"], true);
}

#[test]
fn score_improvement_resets_wait() {
    let mut p = Score::new(loss_score(), 3, Scope::Run).unwrap();
    let out = feed(&mut p, 0, &[5.0, 6.0, 6.0, 4.0, 6.0, 6.0, 6.0]);
    assert_eq!(verdicts(&out), [R, R, R, R, R, R, A]);
    let waits: Vec<_> = out
        .iter()
        .map(|(_, r)| r["wait"].as_u64().unwrap())
        .collect();
    assert_eq!(waits, [0, 1, 2, 0, 1, 2, 3]);
    // Called again while the daemon waits for staging: still advance, wait keeps counting.
    let d = p.on_pass_end(&loss(6.0), &st(8)).unwrap();
    assert_eq!(
        (d.verdict, d.reason.to_json()["wait"].clone()),
        (A, json!(4))
    );
    // An improvement while waiting changes the policy's mind (the daemon has latched).
    let d = p.on_pass_end(&loss(3.0), &st(9)).unwrap();
    assert_eq!((d.verdict, d.score), (R, Some(3.0)));
}

#[test]
fn score_wait_restarts_per_mini_epoch_and_best_follows_scope() {
    // Run scope: best (4.0) survives the advance, wait restarts at 0.
    let mut p = Score::new(loss_score(), 3, Scope::Run).unwrap();
    feed(&mut p, 0, &[5.0, 4.0, 4.0, 4.0, 4.0]);
    p.on_advance();
    assert_eq!((p.best(), p.wait()), (Some(4.0), 0));
    let out = feed(&mut p, 1, &[4.5, 4.2, 4.1]);
    assert_eq!(verdicts(&out), [R, R, A]); // rf = wait_th: never beat the run's best.
    p.on_advance();
    let out = feed(&mut p, 2, &[3.9, 4.0, 4.0, 4.0]);
    assert_eq!(verdicts(&out), [R, R, R, A]);

    // Per-mini-epoch scope: best restarts, so 4.5 is the first improvement.
    let mut p = Score::new(loss_score(), 3, Scope::PerMiniEpoch).unwrap();
    feed(&mut p, 0, &[5.0, 4.0, 4.0, 4.0, 4.0]);
    p.on_advance();
    assert_eq!((p.best(), p.wait()), (None, 0));
    let out = feed(&mut p, 1, &[4.5, 4.2, 4.1, 4.1, 4.1, 4.1]);
    assert_eq!(verdicts(&out), [R, R, R, R, R, A]);
    assert_eq!(out[5].1["best_scope"], "per_mini_epoch");
}

#[test]
fn score_expected_rf_follows_completed_mini_epochs() {
    let mut p = Score::new(loss_score(), 3, Scope::Run).unwrap();
    assert_eq!(p.expected_rf(), 3.0);
    assert_eq!(
        Score::new(loss_score(), 3, Scope::PerMiniEpoch)
            .unwrap()
            .expected_rf(),
        4.0
    );
    feed(&mut p, 0, &[5.0, 4.0, 4.0, 4.0, 4.0]);
    p.on_advance();
    assert_eq!(p.expected_rf(), 5.0);
    feed(&mut p, 1, &[4.0, 4.0, 4.0]);
    p.on_advance();
    assert_eq!(p.expected_rf(), 4.0);
    // A forced advance before any pass does not count as an rf of 0.
    p.on_advance();
    assert_eq!(p.expected_rf(), 4.0);
    assert!(Score::new(loss_score(), 0, Scope::Run).is_err());
}

/// Sample mean and standard deviation computed longhand, for checking the band.
fn longhand(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let ma = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - ma) * (x - ma)).sum::<f64>() / (n - 1.0);
    (ma, var.sqrt())
}

#[test]
fn bollinger_fills_then_compares_against_the_previous_window() {
    let mut p = Bollinger::new(loss_score(), 5, 2.0, Scope::Run).unwrap();
    let out = feed(&mut p, 0, &[1.0, 0.9, 0.8, 0.85, 0.75]);
    assert_eq!(verdicts(&out), [R; 5]);
    for (i, (_, r)) in out.iter().enumerate() {
        assert_eq!(r["filling"], true);
        assert_eq!(r["have"], i);
    }
    // Window [1.0, 0.9, 0.8, 0.85, 0.75]: MA = 4.3 / 5 = 0.86; squared deviations
    // .0196 + .0016 + .0036 + .0001 + .0121 = .037; sample variance .037 / 4 = .00925;
    // std = 0.096177; lower = 0.86 - 2 * 0.096177 = 0.667646.
    let (ma, std, lower, upper) = p.band().unwrap();
    assert!((ma - 0.86).abs() < 1e-12);
    assert!((std - 0.00925f64.sqrt()).abs() < 1e-12);
    assert!((lower - 0.667_646).abs() < 1e-6, "{lower}");
    assert!((upper - 1.052_354).abs() < 1e-6, "{upper}");
    // 0.68 would be below a population-std band (0.86 - 2 * 0.086023 = 0.687953) but is
    // inside the sample-std band: repeat.
    let d = p.on_pass_end(&loss(0.68), &st(6)).unwrap();
    assert_eq!(d.verdict, R);
    assert!((d.reason.to_json()["lower"].as_f64().unwrap() - lower).abs() < 1e-15);
    assert_eq!(d.reason.to_json()["current"], 0.68);
    for key in ["ma", "std", "lower", "upper", "current", "window", "k"] {
        assert!(d.reason.to_json().get(key).is_some(), "{key}: {}", d.reason);
    }
    // 0.68 joined the window and 1.0 left it; the band is recomputed from those five.
    let w = [0.9, 0.8, 0.85, 0.75, 0.68];
    let (ma, std) = longhand(&w);
    let lower = ma - 2.0 * std;
    let (ma2, std2, lower2, _) = p.band().unwrap();
    assert!((ma2 - ma).abs() < 1e-12 && (std2 - std).abs() < 1e-12);
    assert!((lower2 - lower).abs() < 1e-12);
    // A score just above the lower band repeats; just below advances.
    let mut q = p.clone();
    assert_eq!(
        q.on_pass_end(&loss(lower + 1e-9), &st(7)).unwrap().verdict,
        R
    );
    let d = p.on_pass_end(&loss(lower - 1e-9), &st(7)).unwrap();
    assert_eq!(d.verdict, A);
    assert_eq!(d.score, Some(lower - 1e-9));
}

#[test]
fn bollinger_current_score_is_not_in_its_own_band() {
    // The previous five scores are [1, 1, 1, 1, 1] (std 0) and the current is 0.99: a
    // breakout that including the current score in the window would hide.
    let mut p = Bollinger::new(loss_score(), 5, 2.0, Scope::Run).unwrap();
    feed(&mut p, 0, &[1.0; 5]);
    let d = p.on_pass_end(&loss(1.0), &st(6)).unwrap();
    assert_eq!(
        d.verdict, R,
        "equal to the band's lower edge is not below it"
    );
    assert_eq!(
        (
            d.reason.to_json()["std"].as_f64(),
            d.reason.to_json()["lower"].as_f64()
        ),
        (Some(0.0), Some(1.0))
    );
    let d = p.on_pass_end(&loss(0.99), &st(7)).unwrap();
    assert_eq!(d.verdict, A);
    // With 0.99 in the window the largest possible z-score of one value among five is
    // (5 - 1) / sqrt(5) = 1.79 < K = 2: the rule could never fire.
    let (ma, std) = longhand(&[1.0, 1.0, 1.0, 1.0, 0.99]);
    assert!((ma - 0.99) / std < 2.0);
}

#[test]
fn bollinger_either_side_also_leaves_above_the_band() {
    // Window [1.0, 0.9, 0.8, 0.85, 0.75]: upper = 1.052354 (see the test above).
    let mut below = Bollinger::new(loss_score(), 5, 2.0, Scope::Run).unwrap();
    feed(&mut below, 0, &[1.0, 0.9, 0.8, 0.85, 0.75]);
    let mut either = below.clone().with_side(BandSide::Either);
    let (_, _, lower, upper) = either.band().unwrap();
    // A jump above the band: a setback. `below` repeats, `either` advances.
    let d = below
        .clone()
        .on_pass_end(&loss(upper + 1e-9), &st(6))
        .unwrap();
    assert_eq!(
        (d.verdict, d.reason.to_json()["side"].as_str()),
        (R, Some("below"))
    );
    let d = either
        .clone()
        .on_pass_end(&loss(upper + 1e-9), &st(6))
        .unwrap();
    assert_eq!(
        (d.verdict, d.reason.to_json()["side"].as_str()),
        (A, Some("either"))
    );
    // On the edge and inside, both repeat; below the band, both advance.
    for (score, want) in [(upper, R), (0.9, R), (lower, R), (lower - 1e-9, A)] {
        assert_eq!(
            either
                .clone()
                .on_pass_end(&loss(score), &st(6))
                .unwrap()
                .verdict,
            want
        );
        assert_eq!(
            below
                .clone()
                .on_pass_end(&loss(score), &st(6))
                .unwrap()
                .verdict,
            want
        );
    }
    assert_eq!("either".parse::<BandSide>(), Ok(BandSide::Either));
    assert_eq!("above".parse::<BandSide>(), Ok(BandSide::Above));
    assert!("sideways"
        .parse::<BandSide>()
        .unwrap_err()
        .contains("`below`, `either` or `above`"));
    let _ = either.on_pass_end(&loss(0.8), &st(6)).unwrap();
}

#[test]
fn bollinger_window_scope() {
    // Run scope: the window survives the advance, so the next mini-epoch is judged at once.
    let mut p = Bollinger::new(loss_score(), 3, 1.0, Scope::Run).unwrap();
    feed(&mut p, 0, &[10.0, 9.0, 8.0]);
    p.on_advance();
    // Window [10, 9, 8]: MA 9, std 1, lower 8 (K = 1).
    let out = feed(&mut p, 1, &[7.5]);
    assert_eq!(verdicts(&out), [A]);
    assert_eq!(out[0].1["ma"], 9.0);
    assert_eq!(out[0].1["std"], 1.0);
    assert_eq!(out[0].1["lower"], 8.0);
    assert_eq!(out[0].1["upper"], 10.0);

    // Per-mini-epoch scope: the window empties at the advance and refills.
    let mut p = Bollinger::new(loss_score(), 3, 1.0, Scope::PerMiniEpoch).unwrap();
    feed(&mut p, 0, &[10.0, 9.0, 8.0]);
    p.on_advance();
    let out = feed(&mut p, 1, &[7.5, 7.0, 6.5, 5.0]);
    assert_eq!(verdicts(&out), [R, R, R, A]);
    assert_eq!(out[2].1["filling"], true);
    assert_eq!(out[3].1["window_scope"], "per_mini_epoch");
    assert_eq!(p.expected_rf(), 3.0);
}

#[test]
fn bollinger_parameters() {
    assert!(Bollinger::new(loss_score(), 1, 2.0, Scope::Run).is_err());
    for k in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let e = Bollinger::new(loss_score(), 5, k, Scope::Run).unwrap_err();
        assert!(e.to_string().contains("bollinger_k"), "{e}");
    }
    let p = Bollinger::new(loss_score(), 5, 2.0, Scope::Run).unwrap();
    assert_eq!(p.expected_rf(), 6.0);
}

#[test]
fn bollinger_under_bounded_stops_at_rf_max_while_filling() {
    let inner = Bollinger::new(loss_score(), 5, 2.0, Scope::Run).unwrap();
    let mut b = Bounded::new(Box::new(inner), 1, 3).unwrap();
    let out = feed(&mut b, 0, &[1.0, 0.9, 0.8]);
    assert_eq!(verdicts(&out), [R, R, A]);
    assert_eq!(out[2].1["bound"], "rf_max");
    assert_eq!(out[2].1["filling"], true);
}

#[test]
fn learned_replays_then_falls_back() {
    let mut p = Learned::new(vec![2, 3], Box::new(Fixed::new(5).unwrap())).unwrap();
    assert_eq!(p.expected_rf(), 2.0);
    let out = feed(&mut p, 0, &[1.0, 1.0]);
    assert_eq!(verdicts(&out), [R, A]);
    assert_eq!(
        out[1].1,
        json!({"policy": "learned", "source": "history", "sequence": 0, "rf": 2,
               "passes": 2, "schedule_len": 2})
    );
    p.on_advance();
    assert_eq!(p.expected_rf(), 3.0);
    assert_eq!(verdicts(&feed(&mut p, 1, &[1.0; 3])), [R, R, A]);
    p.on_advance();
    assert_eq!(p.expected_rf(), 5.0);
    let out = feed(&mut p, 2, &[1.0; 5]);
    assert_eq!(verdicts(&out), [R, R, R, R, A]);
    assert_eq!(out[4].1["source"], "fallback");
    assert_eq!(out[4].1["fallback"]["policy"], "fixed");
    assert_eq!(p.name(), "learned");
    assert!(Learned::new(vec![2, 0], Box::new(Fixed::new(5).unwrap())).is_err());
}

#[test]
fn learned_follows_the_sequence_it_is_told() {
    // A resumed run starts at sequence 1: it replays schedule[1], not schedule[0].
    let mut p = Learned::new(vec![2, 4], Box::new(Fixed::new(9).unwrap())).unwrap();
    assert_eq!(verdicts(&feed(&mut p, 1, &[1.0; 4])), [R, R, R, A]);
    assert_eq!(p.expected_rf(), 4.0);
}

#[test]
fn learned_fallback_sees_every_pass() {
    let fb = Score::new(WeightedScore::paper_default(), 3, Scope::Run).unwrap();
    let mut p = Learned::new(vec![2], Box::new(fb)).unwrap();
    // The score fallback needs accuracy even while the history is replayed.
    let e = p.on_pass_end(&loss(1.0), &st(1)).unwrap_err();
    assert!(matches!(e, PolicyError::MissingMetric { .. }), "{e}");

    let fb = Score::new(loss_score(), 2, Scope::Run).unwrap();
    let mut p = Learned::new(vec![2], Box::new(fb)).unwrap();
    let d = p.on_pass_end(&loss(3.0), &at(0, 1)).unwrap();
    assert_eq!(d.score, Some(3.0), "replayed passes still report the score");
    p.on_pass_end(&loss(2.0), &at(0, 2)).unwrap();
    p.on_advance();
    // The fallback's best (2.0) was learned during replay: two non-improving passes end
    // the mini-epoch.
    let out = feed(&mut p, 1, &[2.5, 2.0]);
    assert_eq!(verdicts(&out), [R, A]);
    assert_eq!(out[1].1["fallback"]["best"], 2.0);
}

#[test]
fn replay_metric_spelling_says_the_direction() {
    for (spec, metric, complement, higher, shown) in [
        ("min:val_loss", "val_loss", false, false, "min:val_loss"),
        (
            "max:val_accuracy",
            "val_accuracy",
            false,
            true,
            "max:val_accuracy",
        ),
        (
            " min:1-accuracy ",
            "accuracy",
            true,
            false,
            "min:1 - accuracy",
        ),
        ("max: 1 - error", "error", true, true, "max:1 - error"),
    ] {
        let m: ReplayMetric = spec.parse().unwrap();
        assert_eq!(
            (
                m.term().metric(),
                m.term().is_complement(),
                m.higher_is_better()
            ),
            (metric, complement, higher),
            "{spec}"
        );
        assert!(m.is_named());
        assert_eq!(m.to_string(), shown);
        assert_eq!(shown.parse::<ReplayMetric>().unwrap(), m);
    }
    let min: ReplayMetric = "min:loss".parse().unwrap();
    let max: ReplayMetric = "max:loss".parse().unwrap();
    assert_eq!(min.compare(0.1, 0.2), std::cmp::Ordering::Greater);
    assert_eq!(max.compare(0.1, 0.2), std::cmp::Ordering::Less);
    // A bare name does not say whether lower or higher is better: refused, naming the key.
    for (spec, needle) in [
        ("val_accuracy", "min:TERM"),
        ("best:loss", "min:TERM"),
        ("min:", "empty"),
        ("max:val acc", "whitespace"),
        ("min:-loss", "signs"),
    ] {
        let e = spec.parse::<ReplayMetric>().unwrap_err();
        let PolicyError::BadParameter { name, reason } = &e else {
            panic!("{spec}: {e}");
        };
        assert_eq!(*name, "learned_metric", "{spec}");
        assert!(
            reason.contains(needle) && reason.contains(spec.trim()),
            "{spec}: {reason}"
        );
    }
}

#[test]
fn learned_rf_is_bounded() {
    let l = Learned::new(vec![200, 1], Box::new(Fixed::new(4).unwrap())).unwrap();
    let mut b = Bounded::new(Box::new(l), 2, 128).unwrap();
    let d = b.on_pass_end(&loss(1.0), &at(0, 128)).unwrap();
    assert_eq!(
        (d.verdict, d.reason.to_json()["bound"].clone()),
        (A, json!("rf_max"))
    );
    b.on_advance();
    let d = b.on_pass_end(&loss(1.0), &at(1, 1)).unwrap();
    assert_eq!(
        (d.verdict, d.reason.to_json()["bound"].clone()),
        (R, json!("rf_min"))
    );
    assert_eq!(b.on_pass_end(&loss(1.0), &at(1, 2)).unwrap().verdict, A);
}

/// Answers a scripted verdict per pass, to drive [`Bounded`] with arbitrary decisions.
struct Scripted(Vec<bool>, usize);

impl RfPolicy for Scripted {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Fixed
    }
    fn on_pass_end(&mut self, _: &Metrics, _: &PassState) -> Result<PolicyDecision, PolicyError> {
        let advance = self.0[self.1 % self.0.len()];
        self.1 += 1;
        Ok(PolicyDecision {
            verdict: if advance { A } else { R },
            reason: Reason::Fixed {
                rf: 0,
                passes: 0,
                bounds: Bounds::default(),
            },
            score: None,
        })
    }
    fn expected_rf(&self) -> f64 {
        self.0.len() as f64 * 1000.0
    }
}

proptest! {
    /// Whatever the inner policy says, every mini-epoch ends within [rf_min, rf_max].
    #[test]
    fn bounded_rf_always_within_bounds(
        script in proptest::collection::vec(any::<bool>(), 1..64),
        rf_min in 1u32..10,
        extra in 0u32..20,
    ) {
        let rf_max = rf_min + extra;
        let mut b = Bounded::new(Box::new(Scripted(script, 0)), rf_min, rf_max).unwrap();
        prop_assert!(b.expected_rf() <= rf_max as f64);
        for seq in 0..10u64 {
            let mut passes = 0;
            loop {
                passes += 1;
                let d = b.on_pass_end(&Metrics::new(), &at(seq, passes)).unwrap();
                if d.verdict == A {
                    break;
                }
                prop_assert!(passes < rf_max);
            }
            prop_assert!((rf_min..=rf_max).contains(&passes), "rf {}", passes);
            b.on_advance();
        }
    }

    /// A strictly decreasing score always improves, so `score` never advances before rf_max.
    #[test]
    fn decreasing_score_runs_to_rf_max(
        start in -1e3f64..1e3,
        steps in proptest::collection::vec(1e-6f64..10.0, 1..200),
        wait in 1u32..6,
        rf_max in 1u32..40,
        per in any::<bool>(),
    ) {
        let scope = if per { Scope::PerMiniEpoch } else { Scope::Run };
        let inner = Score::new(loss_score(), wait, scope).unwrap();
        let mut b = Bounded::new(Box::new(inner), 1, rf_max).unwrap();
        let (mut x, mut passes, mut seq) = (start, 0u32, 0u64);
        for step in steps {
            x -= step;
            passes += 1;
            let d = b.on_pass_end(&loss(x), &at(seq, passes)).unwrap();
            prop_assert_eq!(d.reason.to_json()["wait"].as_u64(), Some(0));
            if passes < rf_max {
                prop_assert_eq!(d.verdict, R);
            } else {
                prop_assert_eq!(d.verdict, A);
                b.on_advance();
                passes = 0;
                seq += 1;
            }
        }
    }

    /// The band agrees with a longhand sample mean / std over the previous N scores.
    #[test]
    fn bollinger_matches_longhand(
        scores in proptest::collection::vec(-100f64..100.0, 2..60),
        window in 2usize..8,
        k in 0.1f64..3.0,
    ) {
        let mut p = Bollinger::new(loss_score(), window, k, Scope::Run).unwrap();
        for (i, &s) in scores.iter().enumerate() {
            let d = p.on_pass_end(&loss(s), &st(i as u32 + 1)).unwrap();
            if i < window {
                prop_assert_eq!(d.verdict, R);
                prop_assert_eq!(&d.reason.to_json()["filling"], &json!(true));
            } else {
                let (ma, std) = longhand(&scores[i - window..i]);
                let lower = ma - k * std;
                let got = d.reason.to_json()["lower"].as_f64().unwrap();
                prop_assert!((got - lower).abs() <= 1e-9 * (1.0 + lower.abs()));
                // Away from the edge, the verdict is the longhand one.
                if (s - lower).abs() > 1e-9 * (1.0 + lower.abs()) {
                    prop_assert_eq!(d.verdict == A, s < lower);
                }
            }
        }
    }

    /// A constant score never leaves the band below.
    #[test]
    fn bollinger_constant_score_never_advances(x in -1e6f64..1e6, n in 2usize..10) {
        let mut p = Bollinger::new(loss_score(), n, 2.0, Scope::Run).unwrap();
        for i in 0..40u32 {
            prop_assert_eq!(p.on_pass_end(&loss(x), &st(i + 1)).unwrap().verdict, R);
        }
    }

    /// Any term spelling that parses prints back to itself after a second parse.
    #[test]
    fn metric_term_roundtrip(name in "[A-Za-z_][A-Za-z0-9_./]{0,20}", complement in any::<bool>()) {
        let spec = if complement { format!("1-{name}") } else { name.clone() };
        let t: MetricTerm = spec.parse().unwrap();
        prop_assert_eq!(t.metric(), name.as_str());
        prop_assert_eq!(t.to_string().parse::<MetricTerm>().unwrap(), t);
    }
}

/// A policy restored from its saved state (through JSON, as the daemon's save file holds it)
/// decides every later pass as the original does, and a state of another policy or out of
/// range is refused, naming the field, with the policy unchanged.
#[test]
fn a_restored_policy_continues_as_the_original() {
    let makers: Vec<fn() -> Box<dyn RfPolicy>> = vec![
        || Box::new(Fixed::new(2).unwrap()),
        || Box::new(Score::new(loss_score(), 2, Scope::Run).unwrap()),
        || Box::new(Bollinger::new(loss_score(), 3, 1.0, Scope::Run).unwrap()),
        || {
            let fb = Box::new(Score::new(loss_score(), 1, Scope::Run).unwrap());
            Box::new(Bounded::new(Box::new(Learned::new(vec![2, 1], fb).unwrap()), 1, 9).unwrap())
        },
    ];
    let scores = [5.0, 4.0, 4.5, 4.4, 3.0, 3.1, 3.2, 2.0, 2.5, 2.6];
    for make in makers {
        let mut a = make();
        for (seq, chunk) in scores[..6].chunks(2).enumerate() {
            feed(a.as_mut(), seq as u64, chunk);
            a.on_advance();
        }
        feed(a.as_mut(), 3, &[3.3]);
        let saved: PolicyState =
            serde_json::from_str(&serde_json::to_string(&a.state()).unwrap()).unwrap();
        let mut b = make();
        b.restore(&saved).unwrap();
        assert_eq!(b.state(), a.state(), "{}", a.name());
        assert_eq!(b.expected_rf(), a.expected_rf(), "{}", a.name());
        for (i, &s) in scores[6..].iter().enumerate() {
            let st = at(3, i as u32 + 2);
            let (da, db) = (
                a.on_pass_end(&loss(s), &st).unwrap(),
                b.on_pass_end(&loss(s), &st).unwrap(),
            );
            assert_eq!(
                (da.verdict, da.reason),
                (db.verdict, db.reason),
                "{}",
                a.name()
            );
        }
    }
    let mut p = Score::new(loss_score(), 2, Scope::Run).unwrap();
    let before = p.state();
    let e = p.restore(&PolicyState::named("bollinger")).unwrap_err();
    assert!(e.to_string().contains("`policy`"), "{e}");
    let mut s = PolicyState::named("score");
    s.recent_rf = vec![0];
    assert!(p.restore(&s).unwrap_err().to_string().contains("recent_rf"));
    s.recent_rf = vec![1; 9];
    assert!(p.restore(&s).unwrap_err().to_string().contains("recent_rf"));
    let mut b = Bollinger::new(loss_score(), 2, 1.0, Scope::Run).unwrap();
    let mut w = PolicyState::named("bollinger");
    w.window = vec![1.0, 2.0, 3.0];
    assert!(b.restore(&w).unwrap_err().to_string().contains("window"));
    assert_eq!(p.state(), before);
}
