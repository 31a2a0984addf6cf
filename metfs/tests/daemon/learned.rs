//! The learned policy replays a recorded schedule.

use metfs::daemon::Daemon;

use crate::common::*;
use metfs::daemon::DEFAULT_SESSION;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn learned_replays_a_schedule_recorded_under_another_seed() {
    // A run at a fixed rf of 3 records its schedule; a run with another seed over the same data
    // replays it: the seed reorders the samples, not the sequence of mini-epochs, so it is not
    // part of the rf history's dataset key.
    let t = setup(3);
    let r = start(t.cfg.clone()).await;
    let d = r.daemon.clone();
    for _ in 0..2 {
        wait_next_ready(&d).await;
        for _ in 0..3 {
            bare_pass_end(&d, false).await.unwrap();
        }
    }
    r.stop().await;
    let mut cfg = t.cfg.clone();
    cfg.seed = 8;
    cfg.policy.kind = metfs_feedback::config::PolicyKind::Learned;
    let r = start(cfg).await;
    let d = r.daemon.clone();
    let st = serde_json::to_value(d.status()).unwrap();
    assert_eq!(st["rf_policy"], "learned", "{st}");
    // No run recorded the default metric (`loss`) and a plain mount's runs never finish.
    assert_eq!(
        (&st["replay"]["run"], &st["replay"]["why"]),
        (&1.into(), &"furthest".into()),
        "{st}"
    );
    assert_eq!(
        st["rf"], 3.0,
        "the recorded rf of the first mini-epoch: {st}"
    );
    // The fallback (score) wants metrics; the schedule decides.
    let metrics = [("loss", 1.0), ("accuracy", 0.5), ("val_accuracy", 0.5)]
        .map(|(k, v)| (k.to_string(), v))
        .into();
    let first = d
        .pass_end(DEFAULT_SESSION, None, metrics, Default::default(), false)
        .await
        .unwrap();
    let reason = first
        .reason
        .expect("a policy decision has a reason")
        .to_json();
    assert_eq!(reason["source"], "history", "{reason}");
    assert_eq!(reason["rf"], 3, "{reason}");
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn learned_replays_the_run_that_ended_best_and_says_why() {
    // Three runs at fixed rfs 2, 3 and 4 end with validation losses 0.5, 0.2 and 0.4:
    // ranked by `min:val_loss`, learned replays the second (rf 3), not the latest (rf 4).
    let t = setup(2);
    for (rf, val_loss) in [(2u32, 0.5), (3, 0.2), (4, 0.4)] {
        let mut cfg = t.cfg.clone();
        cfg.policy.rf = rf;
        // A new run each time, not the saved position's run resumed.
        cfg.reset = true;
        let r = start(cfg).await;
        let d = r.daemon.clone();
        for _ in 0..2 {
            wait_next_ready(&d).await;
            for _ in 0..rf {
                let sent = [("val_loss".to_string(), val_loss)].into();
                d.pass_end(DEFAULT_SESSION, None, sent, Default::default(), false)
                    .await
                    .unwrap();
            }
        }
        r.stop().await;
    }
    let learned = |metric: &str| {
        let mut cfg = t.cfg.clone();
        cfg.reset = true;
        cfg.policy.kind = metfs_feedback::config::PolicyKind::Learned;
        cfg.policy.learned_metric = Some(metric.parse().unwrap());
        cfg
    };
    let r = start(learned("min:val_loss")).await;
    let st = serde_json::to_value(r.daemon.status()).unwrap();
    assert_eq!(st["rf"], 3.0, "{st}");
    let replay = st["replay"].clone();
    assert_eq!(
        replay,
        serde_json::json!({"run": 2, "mini_epochs": 2, "why": "best", "metric": "min:val_loss",
                           "value": 0.2, "finished": false, "compared": 3}),
        "{st}"
    );
    r.stop().await;
    // The history file says the same on the learned run.
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&t.cfg.history).unwrap()).unwrap();
    let last = file["runs"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["replayed"], replay, "{last}");
    // A metric the runs did not record is refused at mount, naming the setting.
    let Err(e) = Daemon::prepare(learned("max:val_accuracy"), false).await else {
        panic!("a metric no run recorded was accepted");
    };
    let e = e.to_string();
    assert!(
        e.contains("learned_metric") && e.contains("`val_accuracy`") && e.contains("val_loss"),
        "{e}"
    );
}
