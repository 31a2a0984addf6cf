//! Unit tests of [`Paced`].

use super::*;
use crate::policy::Bounded;
use proptest::prelude::*;
use serde_json::Value;

fn params(cap_start: u32, cap_end: u32, gain_fraction: f64) -> PacedParams {
    PacedParams {
        cap_start,
        cap_end,
        gain_fraction,
    }
}

fn paced(cap_start: u32, cap_end: u32) -> Paced {
    Paced::new(params(cap_start, cap_end, 0.5)).unwrap()
}

/// Pass `passes` with the next mini-epoch staged and nothing else said.
fn ready(passes: u32) -> PassState {
    PassState {
        next_ready: Some(true),
        ..PassState::new(passes, 0)
    }
}

fn with_val(passes: u32, v: f64) -> PassState {
    PassState {
        val_loss: Some(v),
        ..ready(passes)
    }
}

fn decide(p: &mut Paced, s: PassState) -> Verdict {
    p.on_pass_end(&Metrics::new(), &s).unwrap().verdict
}

/// Runs one mini-epoch of `vals` (one val_loss per pass) and advances; returns the verdicts.
fn mini_epoch(p: &mut Paced, vals: &[f64]) -> Vec<Verdict> {
    let v = (0..vals.len())
        .map(|i| decide(p, with_val(i as u32 + 1, vals[i])))
        .collect();
    p.on_advance();
    v
}

use Verdict::{Advance as A, Repeat as R};

#[test]
fn no_fresh_data_no_advance() {
    let mut p = paced(1, 1);
    // At the cap, but the next mini-epoch is not staged: repeat.
    let s = PassState {
        next_ready: Some(false),
        ..PassState::new(5, 0)
    };
    let d = p.on_pass_end(&Metrics::new(), &s).unwrap();
    assert_eq!(
        (d.verdict, d.reason.to_json()["why"].clone()),
        (R, "staging".into())
    );
    // Unknown readiness: the stall-free rf is the floor.
    let s = PassState {
        stall_free_rf: Some(3),
        ..PassState::new(2, 0)
    };
    let d = p.on_pass_end(&Metrics::new(), &s).unwrap();
    assert_eq!(
        (d.verdict, d.reason.to_json()["why"].clone()),
        (R, "stall_free".into())
    );
    let s = PassState {
        stall_free_rf: Some(3),
        ..PassState::new(3, 0)
    };
    assert_eq!(decide(&mut p, s), A);
    // Staged: the stall-free estimate no longer holds it back.
    let s = PassState {
        stall_free_rf: Some(9),
        ..ready(1)
    };
    assert_eq!(decide(&mut p, s), A);
}

#[test]
fn the_cap_grows_with_progress() {
    let p = paced(4, 32);
    assert_eq!(p.cap(None), 4);
    assert_eq!(p.cap(Some(0.0)), 4);
    assert_eq!(p.cap(Some(0.5)), 18);
    assert_eq!(p.cap(Some(1.0)), 32);
    // Without held-out signals the cap alone decides: rf = cap.
    let mut p = paced(2, 10);
    let at = |passes, progress| PassState {
        progress: Some(progress),
        ..ready(passes)
    };
    assert_eq!(decide(&mut p, at(1, 0.0)), R);
    let d = p.on_pass_end(&Metrics::new(), &at(2, 0.0)).unwrap();
    assert_eq!(
        (d.verdict, d.reason.to_json()["why"].clone()),
        (A, "cap".into())
    );
    assert_eq!(d.reason.to_json()["held_out"], Value::Null);
    assert_eq!(decide(&mut p, at(5, 0.5)), R);
    assert_eq!(decide(&mut p, at(6, 0.5)), A);
    let d = p.on_pass_end(&Metrics::new(), &at(1, 0.0)).unwrap();
    assert_eq!(d.reason.to_json()["held_out"]["rule"], "schedule");
}

#[test]
fn val_loss_repeats_while_a_repeat_gains_enough_of_a_fresh_pass() {
    let mut p = paced(16, 16);
    // Mini-epoch 0: no fresh pass has been measured yet, so every repeat is tried.
    assert_eq!(mini_epoch(&mut p, &[1.0, 0.9, 0.85]), [R, R, R]);
    // Mini-epoch 1: its first pass gains 0.25 (0.85 -> 0.6): the fresh gain. The first
    // repeat of mini-epoch 0 gained 0.1 < 0.5 * 0.25: no repeat is worth trying.
    let d = p.on_pass_end(&Metrics::new(), &with_val(1, 0.6)).unwrap();
    assert_eq!(d.verdict, A, "{}", d.reason);
    assert_eq!(d.reason.to_json()["held_out"]["rule"], "val_loss");
    assert!((p.learned().fresh_gain.unwrap() - 0.25).abs() < 1e-9);
    p.on_advance();
    // Mini-epoch 2: a fresh pass gains little (0.6 -> 0.55), so the smoothed fresh gain falls
    // to 0.19; a repeat gaining 0.1 >= 0.5 * 0.19 is kept, one gaining 0.01 is not.
    let v = mini_epoch(&mut p, &[0.55, 0.45, 0.44]);
    assert_eq!(v[1..], [R, A]);
    assert!((p.learned().fresh_gain.unwrap() - 0.19).abs() < 1e-9);
}

#[test]
fn fresh_losses_steer_a_target() {
    let mut p = paced(4, 8);
    // At the end of the run the cap is 8: the target decides.
    let late = |passes| PassState {
        progress: Some(1.0),
        ..ready(passes)
    };
    let run = |p: &mut Paced, f: f64| -> u32 {
        let mut passes = 1;
        let first = PassState {
            fresh_loss: Some(f),
            ..late(1)
        };
        let mut v = decide(p, first);
        while v == R {
            passes += 1;
            v = decide(p, late(passes));
        }
        p.on_advance();
        passes
    };
    // The target starts at cap_start.
    assert_eq!(run(&mut p, 2.0), 4);
    // 2.0 -> 1.6 over 4 passes: 0.1 per pass, the first measure: the target grows.
    assert_eq!(run(&mut p, 1.6), 5);
    // 1.6 -> 1.1 over 5: 0.1 per pass, as before: grows again.
    assert_eq!(run(&mut p, 1.1), 6);
    // 1.1 -> 1.08 over 6: far below half the average: halves.
    assert_eq!(run(&mut p, 1.08), 3);
    assert_eq!(p.learned().target, 3);
}

#[test]
fn bad_signals_name_the_field_and_change_nothing() {
    let mut b = Bounded::new(Box::new(paced(2, 8)), 1, 16).unwrap();
    mini_epoch_bounded(&mut b);
    let before = b.state();
    for (s, field) in [
        (
            PassState {
                progress: Some(1.5),
                ..ready(1)
            },
            "progress",
        ),
        (
            PassState {
                progress: Some(f64::NAN),
                ..ready(1)
            },
            "progress",
        ),
        (with_val(1, f64::NAN), "val_loss"),
        (
            PassState {
                fresh_loss: Some(f64::INFINITY),
                ..ready(1)
            },
            "fresh_loss",
        ),
    ] {
        let e = b.on_pass_end(&Metrics::new(), &s).unwrap_err();
        assert!(
            matches!(&e, PolicyError::BadSignal { field: f, .. } if *f == field),
            "{e}"
        );
        assert!(e.to_string().contains(&format!("`{field}`")), "{e}");
        assert_eq!(b.state(), before);
    }
}

fn mini_epoch_bounded(b: &mut Bounded) {
    for (i, v) in [1.0, 0.9].into_iter().enumerate() {
        b.on_pass_end(&Metrics::new(), &with_val(i as u32 + 1, v))
            .unwrap();
    }
    b.on_advance();
}

#[test]
fn parameters_are_checked() {
    for (ps, key) in [
        (params(0, 4, 0.5), "paced_cap_start"),
        (params(8, 4, 0.5), "paced_cap_end"),
        (params(1, 4, 1.5), "paced_gain_fraction"),
        (params(1, 4, f64::NAN), "paced_gain_fraction"),
    ] {
        match Paced::new(ps) {
            Err(PolicyError::BadParameter { name, .. }) => assert_eq!(name, key),
            other => panic!("{ps:?}: {other:?}"),
        }
    }
}

#[test]
fn state_restores_and_refuses_bad_values() {
    let mut p = paced(2, 8);
    mini_epoch(&mut p, &[1.0, 0.9]);
    let saved = p.state();
    assert_eq!(saved.policy, "paced");
    let text = serde_json::to_string(&saved).unwrap();
    let back: PolicyState = serde_json::from_str(&text).unwrap();
    let mut q = paced(2, 8);
    q.restore(&back).unwrap();
    assert_eq!(q, p);
    let mut bad = saved.clone();
    bad.paced.as_mut().unwrap().target = 99;
    assert!(matches!(
        q.restore(&bad),
        Err(PolicyError::BadParameter {
            name: "paced.target",
            ..
        })
    ));
    assert!(q.restore(&PolicyState::named("score")).is_err());
    assert_eq!(q, p);
}

fn signals() -> impl Strategy<Value = (Option<bool>, Option<f64>, Option<f64>, Option<f64>)> {
    (
        proptest::option::of(any::<bool>()),
        proptest::option::of(0.0f64..=1.0),
        proptest::option::of(0.0f64..5.0),
        proptest::option::of(0.0f64..5.0),
    )
}

proptest! {
    /// Whatever the signals: never an advance while the next mini-epoch is not staged, always
    /// one at the cap once it is, never a repeat past it; and a policy restored from a saved
    /// state decides as the original from there on.
    #[test]
    fn staging_and_cap_always_hold(
        script in proptest::collection::vec((1u32..12, signals()), 1..80),
        cut in 0usize..80,
    ) {
        let mut p = paced(2, 9);
        let mut restored: Option<Paced> = None;
        for (i, (passes, (next_ready, progress, val_loss, fresh_loss))) in script.into_iter().enumerate() {
            if i == cut {
                let mut q = paced(2, 9);
                q.restore(&p.state()).unwrap();
                restored = Some(q);
            }
            let s = PassState { passes, sequence: 0, next_ready, stall_free_rf: None, progress, val_loss, fresh_loss };
            let d = p.on_pass_end(&Metrics::new(), &s).unwrap();
            if next_ready == Some(false) {
                prop_assert_eq!(d.verdict, R);
            } else if passes >= p.cap(progress) {
                prop_assert_eq!(d.verdict, A);
            }
            if let Some(q) = restored.as_mut() {
                prop_assert_eq!(&q.on_pass_end(&Metrics::new(), &s).unwrap(), &d);
            }
            if d.verdict == A {
                p.on_advance();
                if let Some(q) = restored.as_mut() { q.on_advance(); }
            }
        }
    }

    /// The cap never shrinks as the run progresses and stays within its two ends.
    #[test]
    fn cap_is_monotone(a in 0.0f64..=1.0, b in 0.0f64..=1.0, start in 1u32..20, extra in 0u32..50) {
        let p = paced(start, start + extra);
        let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
        prop_assert!(p.cap(Some(lo)) <= p.cap(Some(hi)));
        prop_assert!((start..=start + extra).contains(&p.cap(Some(hi))));
    }
}
