//! `pass_end`'s signals reach the policy: the paced policy sees the successor staged, the
//! run's progress and held-out losses, and a signal out of range is refused, naming the field,
//! with the session as it was.

use metfs_feedback::policy::JobSignals;
use metfs_protocol::{Choice, ErrorCode};

use crate::common::*;

fn metrics(pairs: &[(&str, f64)]) -> metfs_feedback::Metrics {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_sees_the_signals_and_bad_ones_change_nothing() {
    let t = setup(4);
    let mut cfg = t.cfg.clone();
    cfg.policy.kind = metfs_feedback::config::PolicyKind::Paced;
    cfg.policy.paced_cap_start = 2;
    cfg.policy.paced_cap_end = 6;
    let r = start(cfg).await;
    let d = r.daemon.clone();
    wait_next_ready(&d).await;
    let before = serde_json::to_value(d.status()).unwrap();
    for (m, signals, field) in [
        (
            metrics(&[]),
            JobSignals {
                progress: Some(1.5),
                fresh_loss: None,
            },
            "progress",
        ),
        (
            metrics(&[]),
            JobSignals {
                progress: None,
                fresh_loss: Some(f64::NAN),
            },
            "fresh_loss",
        ),
        (
            metrics(&[("val_loss", f64::INFINITY)]),
            JobSignals::default(),
            "val_loss",
        ),
    ] {
        let e = d
            .pass_end("default", None, m, signals, false)
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::BadMetrics, "{e}");
        assert!(e.message.contains(&format!("`{field}`")), "{e}");
        let now = serde_json::to_value(d.status()).unwrap();
        assert_eq!(
            (&now["pass"], &now["generation"]),
            (&before["pass"], &before["generation"])
        );
    }
    // Early in the run the cap is 2: the first pass repeats (no held-out gain known yet), the
    // second advances at the cap, the successor being staged.
    let signals = JobSignals {
        progress: Some(0.0),
        fresh_loss: Some(2.0),
    };
    let first = d
        .pass_end(
            "default",
            None,
            metrics(&[("val_loss", 1.0)]),
            signals,
            false,
        )
        .await
        .unwrap();
    let reason = first.reason.clone().unwrap().to_json();
    assert_eq!(first.decision, Choice::Repeat, "{reason}");
    assert_eq!(
        (&reason["policy"], &reason["cap"], &reason["next_ready"]),
        (&"paced".into(), &2.into(), &true.into()),
        "{reason}"
    );
    let second = d
        .pass_end(
            "default",
            None,
            metrics(&[("val_loss", 0.9)]),
            JobSignals {
                progress: Some(0.1),
                fresh_loss: None,
            },
            false,
        )
        .await
        .unwrap();
    assert_eq!(second.decision, Choice::Advance, "{:?}", second.reason);
    assert_eq!(second.reason.unwrap().to_json()["why"], "cap");
    r.stop().await;
}
