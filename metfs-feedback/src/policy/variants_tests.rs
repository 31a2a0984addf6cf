//! Tests of the paper's other readings of its two policies (issue 51, item 4): Bollinger with
//! population std, N = 20, the current point in its band, the per-mini-epoch window and the
//! `above` side; score with a per-mini-epoch best and a `val_loss`-only score.

use super::*;
use proptest::prelude::*;

fn metric(name: &str, x: f64) -> Metrics {
    [(name.to_string(), x)].into_iter().collect()
}

fn score_of(name: &str, weight: f64) -> WeightedScore {
    WeightedScore::new(vec![MetricTerm::plain(name).unwrap()], vec![weight]).unwrap()
}

fn st(passes: u32) -> PassState {
    PassState::new(passes, 0)
}

/// Feeds `xs` as `loss` scores from pass 1; returns the verdicts.
fn feed(p: &mut dyn RfPolicy, xs: &[f64]) -> Vec<Verdict> {
    xs.iter()
        .enumerate()
        .map(|(i, &x)| {
            p.on_pass_end(&metric("loss", x), &st(i as u32 + 1))
                .unwrap()
                .verdict
        })
        .collect()
}

fn population(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let ma = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - ma) * (x - ma)).sum::<f64>() / n;
    (ma, var.sqrt())
}

use Verdict::{Advance as A, Repeat as R};

#[test]
fn population_std_narrows_the_band() {
    // Window [1.0, 0.9, 0.8, 0.85, 0.75]: population lower 0.687953, sample lower 0.667646;
    // 0.68 is below the first only.
    let mut p = Bollinger::new(score_of("loss", 1.0), 5, 2.0, Scope::Run)
        .unwrap()
        .with_reading(Spread::Population, CurrentPoint::Excluded);
    feed(&mut p, &[1.0, 0.9, 0.8, 0.85, 0.75]);
    let d = p.on_pass_end(&metric("loss", 0.68), &st(6)).unwrap();
    assert_eq!(
        (d.verdict, d.reason.to_json()["spread"].as_str()),
        (A, Some("population"))
    );
    let (ma, std) = population(&[1.0, 0.9, 0.8, 0.85, 0.75]);
    assert!((d.reason.to_json()["lower"].as_f64().unwrap() - (ma - 2.0 * std)).abs() < 1e-12);
}

#[test]
fn the_current_point_can_sit_in_its_own_band() {
    // N = 20, current included, population std: the paper-like chart reading. The band over
    // 19 previous scores and the current one exists from pass 20.
    let mut p = Bollinger::new(score_of("loss", 1.0), 20, 2.0, Scope::PerMiniEpoch)
        .unwrap()
        .with_reading(Spread::Population, CurrentPoint::Included);
    assert_eq!(p.expected_rf(), 20.0);
    let flat: Vec<f64> = (0..19).map(|i| 1.0 + 0.01 * f64::from(i % 2)).collect();
    assert_eq!(feed(&mut p, &flat), [R; 19]);
    // A clear drop is a breakout even with itself in the band (z up to 19/sqrt(20) = 4.25).
    let d = p.on_pass_end(&metric("loss", 0.5), &st(20)).unwrap();
    assert_eq!(d.verdict, A, "{}", d.reason);
    assert_eq!(d.reason.to_json()["current_point"], "included");
    let mut window = flat.clone();
    window.push(0.5);
    let (ma, std) = population(&window);
    assert!((d.reason.to_json()["ma"].as_f64().unwrap() - ma).abs() < 1e-12);
    assert!((d.reason.to_json()["std"].as_f64().unwrap() - std).abs() < 1e-12);
    // Per-mini-epoch scope: the window empties, and the next mini-epoch refills for 19 passes.
    p.on_advance();
    assert_eq!(feed(&mut p, &flat), [R; 19]);
}

#[test]
fn above_leaves_when_a_higher_is_better_score_breaks_out_upwards() {
    // The score is val_accuracy with weight +1: higher is better, so its breakout is upwards.
    let mut p = Bollinger::new(score_of("val_accuracy", 1.0), 5, 2.0, Scope::Run)
        .unwrap()
        .with_side(BandSide::Above);
    for (i, x) in [0.5, 0.52, 0.51, 0.53, 0.52].into_iter().enumerate() {
        let v = p
            .on_pass_end(&metric("val_accuracy", x), &st(i as u32 + 1))
            .unwrap();
        assert_eq!(v.verdict, R);
    }
    let (_, _, lower, upper) = p.band().unwrap();
    let mut q = p.clone();
    // Below the band: a setback, not the breakout `above` waits for.
    let d = q
        .on_pass_end(&metric("val_accuracy", lower - 0.01), &st(6))
        .unwrap();
    assert_eq!(d.verdict, R);
    let d = p
        .on_pass_end(&metric("val_accuracy", upper + 0.01), &st(6))
        .unwrap();
    assert_eq!(
        (d.verdict, d.reason.to_json()["side"].as_str()),
        (A, Some("above"))
    );
}

#[test]
fn score_with_a_per_mini_epoch_best_and_val_loss_alone() {
    // A val_loss-only score: training metrics are not needed, and their absence is no error.
    let mut p = Score::new(score_of("val_loss", 1.0), 2, Scope::PerMiniEpoch).unwrap();
    let at = |p: &mut Score, passes, v| {
        p.on_pass_end(&metric("val_loss", v), &st(passes))
            .unwrap()
            .verdict
    };
    assert_eq!(at(&mut p, 1, 0.8), R);
    assert_eq!(at(&mut p, 2, 0.9), R);
    assert_eq!(at(&mut p, 3, 0.85), A);
    p.on_advance();
    // The best restarts: 0.95 (worse than the run's 0.8) is this mini-epoch's first best.
    assert_eq!(at(&mut p, 1, 0.95), R);
    assert_eq!(p.best(), Some(0.95));
    // A job that sends only training metrics is told what is missing.
    let e = p.on_pass_end(&metric("loss", 0.1), &st(2)).unwrap_err();
    assert!(e.to_string().contains("val_loss"), "{e}");
}

proptest! {
    /// With the current point included, a window of N equal scores never advances, and the
    /// band matches a longhand population computation over the last N scores.
    #[test]
    fn included_band_matches_longhand(
        xs in proptest::collection::vec(-10f64..10.0, 3..40),
        n in 3usize..8,
    ) {
        let mut p = Bollinger::new(score_of("loss", 1.0), n, 1.5, Scope::Run)
            .unwrap()
            .with_reading(Spread::Population, CurrentPoint::Included);
        for (i, &x) in xs.iter().enumerate() {
            let d = p.on_pass_end(&metric("loss", x), &st(i as u32 + 1)).unwrap();
            if i + 1 >= n {
                let (ma, std) = population(&xs[i + 1 - n..=i]);
                prop_assert!((d.reason.to_json()["ma"].as_f64().unwrap() - ma).abs() < 1e-9);
                prop_assert!((d.reason.to_json()["std"].as_f64().unwrap() - std).abs() < 1e-9);
                prop_assert_eq!(d.verdict == A, x < ma - 1.5 * std);
            } else {
                prop_assert_eq!(d.verdict, R);
            }
        }
    }
}
