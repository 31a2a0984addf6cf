//! Passes through a view: the first view, pass ends and switches over an epoch, the rf under a slow tier, and sessions by name.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use metfs_protocol::Choice;

use crate::common::*;
use metfs::daemon::DEFAULT_SESSION;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_view_holds_exactly_the_planned_files_with_source_bytes() {
    let t = setup(1);
    let r = start(t.cfg.clone()).await;
    let d = &r.daemon;
    let plan = planned(&t.cfg, d, 0);
    assert!(plan.len() >= 3, "the test wants several mini-epochs");
    let view = read_view(&d.surface().fs());
    assert_eq!(keys(&view), plan[0], "files of mini-epoch 0");
    check_bytes(&view, &t.source);
    let st = d.status();
    assert_eq!((st.epoch, st.mini_epoch), (0, 0));
    assert_eq!(st.view_files, plan[0].len() as u64);
    r.stop().await;
}

/// A run directory whose writes block (its `events.jsonl` a FIFO nobody reads, so opening it
/// blocks) delays no `pass_end`: the event log writes on its own thread, outside the sessions
/// lock. Before, the first event blocked the daemon, and every reply with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_directory_whose_writes_block_does_not_delay_pass_end() {
    let runs = tempfile::tempdir().unwrap();
    let fifo = runs.path().join("events.jsonl");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo on a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let t = setup_with(
        2,
        &format!("run_dir = {:?}", runs.path().display().to_string()),
    );
    let r = tokio::time::timeout(Duration::from_secs(120), start(t.cfg.clone()))
        .await
        .expect("prepare finished with the run directory blocked");
    let d = r.daemon.clone();
    wait_next_ready(&d).await;
    for i in 0..6 {
        let reply = tokio::time::timeout(Duration::from_secs(60), bare_pass_end(&d, true))
            .await
            .unwrap_or_else(|_| {
                panic!("pass_end {i} did not answer with the run directory blocked")
            })
            .unwrap();
        assert!(
            reply.decision == Choice::Repeat || reply.decision == Choice::Advance,
            "{reply:?}"
        );
    }
    assert!(status_u64(&d, "generation") >= 3, "the view advanced");
    // Unblock the log's writer: open the FIFO for reading and take what it writes.
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let mut f = std::fs::File::open(&fifo).unwrap();
        std::io::Read::read_to_string(&mut f, &mut text).unwrap();
        text
    });
    assert!(
        d.events.close(Duration::from_secs(60)),
        "the queued events are written once the directory unblocks"
    );
    drop(d);
    r.stop().await;
    let text = reader.join().unwrap();
    assert!(
        text.lines().any(|l| l.contains(r#""event":"pass_end""#)),
        "the queued events are written once the directory unblocks: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pass_end_and_advance_walk_an_epoch_serving_every_sample_once() {
    let t = setup(2);
    let r = start(t.cfg.clone()).await;
    let d = r.daemon.clone();
    let plan = planned(&t.cfg, &d, 0);
    let nm = plan.len();
    assert_eq!(status_u64(&d, "mini_epochs"), nm as u64);

    // rf = 2: the first pass end repeats, the second advances once the successor is staged.
    wait_next_ready(&d).await;
    let g0 = status_u64(&d, "generation");
    let first = bare_pass_end(&d, false).await.unwrap();
    assert_eq!(first.decision, Choice::Repeat, "{first:?}");
    assert_eq!(first.generation, g0);
    let second = bare_pass_end(&d, false).await.unwrap();
    assert_eq!(second.decision, Choice::Advance, "{second:?}");
    assert_eq!(second.generation, g0 + 1);
    assert_eq!(second.mini_epoch, 1);

    // Then `advance` (blocking until staged) through the rest of the epoch.
    let mut served: BTreeMap<String, usize> = BTreeMap::new();
    let mut seen_plan = vec![BTreeSet::new(); nm];
    seen_plan[0] = plan[0].clone();
    for p in &plan[0] {
        *served.entry(p.clone()).or_default() += 1;
    }
    for k in 1..nm {
        let view = read_view(&d.surface().fs());
        assert_eq!(keys(&view), plan[k], "files of mini-epoch {k}");
        check_bytes(&view, &t.source);
        for p in view.keys() {
            *served.entry(p.clone()).or_default() += 1;
        }
        seen_plan[k] = keys(&view);
        let g = status_u64(&d, "generation");
        let reply = d.advance(DEFAULT_SESSION, true).await.unwrap();
        assert_eq!(reply.decision, Choice::Advance, "{reply:?}");
        assert_eq!(reply.generation, g + 1);
        let want = if k + 1 < nm { (0, k + 1) } else { (1, 0) };
        assert_eq!((reply.epoch, reply.mini_epoch), (want.0, want.1 as u32));
    }
    assert_eq!(
        served.keys().cloned().collect::<BTreeSet<_>>(),
        keys(&t.source),
        "one epoch serves every sample"
    );
    let twice: Vec<_> = served.iter().filter(|(_, &n)| n != 1).collect();
    assert!(twice.is_empty(), "served more than once: {twice:?}");
    // Epoch 1 starts with its own (recomposed) first mini-epoch.
    let view = read_view(&d.surface().fs());
    assert_eq!(keys(&view), planned(&t.cfg, &d, 1)[0]);
    check_bytes(&view, &t.source);
    r.stop().await;
}

/// A fixed rf is a minimum with a non-blocking `pass_end`: while a slow tier stages the next
/// mini-epoch, pass ends answer `wait` and the job trains bonus passes. Status shows the
/// effective rf above the policy's, the event log has one `stall_rf` for that mini-epoch, and
/// a blocking `pass_end` keeps the rf exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_tier_raises_a_fixed_rf_unless_pass_end_blocks() {
    // A mini-epoch (about 1 MiB) takes about half a second to stage at this cap, far longer
    // than the passes below.
    let t = setup_with(2, "prefetch_rate = \"2MiB/s\"");
    let r = start(t.cfg.clone()).await;
    let d = r.daemon.clone();
    let pass = |block: bool| {
        let d = d.clone();
        async move { bare_pass_end(&d, block).await.unwrap() }
    };

    // Mini-epoch 0: its successor is staged before the first pass, so rf 2 exactly.
    wait_next_ready(&d).await;
    assert_eq!(pass(false).await.decision, Choice::Repeat);
    assert_eq!(pass(false).await.decision, Choice::Advance);
    let st = d.status();
    assert_eq!(
        (st.effective_rf, st.last_rf, st.completed_mini_epochs),
        (Some(2.0), Some(2), 1)
    );
    assert_eq!(st.stalled_mini_epochs, 0);

    // Mini-epoch 1: its successor stages at the cap while passes of ~10 ms end.
    let (mut passes, mut waits) = (0u32, 0u32);
    loop {
        let reply = pass(false).await;
        passes += 1;
        match reply.decision {
            Choice::Repeat => assert_eq!(passes, 1, "{reply:?}"),
            Choice::Wait => waits += 1,
            Choice::Advance => break,
        }
        if waits == 1 && reply.decision == Choice::Wait {
            let st = d.status();
            assert_eq!((st.pass, st.mini_epoch_bonus_passes), (2, 1), "{st:?}");
            assert_eq!(st.rf, 2.0);
        }
        assert!(passes < 5000, "mini-epoch 2 was not staged");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        waits > 0,
        "the successor was staged before the second pass ended"
    );
    assert_eq!(
        passes,
        2 + waits,
        "every pass after the second is a bonus pass"
    );
    let st = d.status();
    assert_eq!(st.rf, 2.0, "the policy's rf is unchanged");
    assert_eq!(st.last_rf, Some(passes));
    assert_eq!(st.completed_mini_epochs, 2);
    assert_eq!(st.effective_rf, Some(f64::from(2 + passes) / 2.0));
    assert!(st.effective_rf.unwrap() > 2.0);
    assert_eq!((st.stalled_mini_epochs, st.mini_epoch_bonus_passes), (1, 0));

    // Mini-epoch 2 with a blocking pass_end: no bonus pass, the rf is the policy's.
    assert_eq!(pass(false).await.decision, Choice::Repeat);
    assert_eq!(pass(true).await.decision, Choice::Advance);
    let st = d.status();
    assert_eq!(st.last_rf, Some(2));
    assert_eq!((st.completed_mini_epochs, st.stalled_mini_epochs), (3, 1));
    assert_eq!(st.effective_rf, Some(f64::from(4 + passes) / 3.0));

    assert!(
        d.events.flush(Duration::from_secs(30)),
        "the event log wrote"
    );
    let log = std::fs::read_to_string(t.cache.join("run").join("events.jsonl")).unwrap();
    let events: Vec<metfs_protocol::Event> = log
        .lines()
        .map(|l| {
            serde_json::from_str::<metfs_protocol::Record>(l)
                .unwrap()
                .event
        })
        .collect();
    let stalls: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            metfs_protocol::Event::StallRf(s) => Some(s.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        stalls.len(),
        1,
        "one stall_rf, for mini-epoch 1: {stalls:?}"
    );
    let s = &stalls[0];
    assert_eq!((s.epoch, s.mini_epoch, s.sequence), (0, 1, 1), "{s:?}");
    assert_eq!(
        (s.policy_rf, s.effective_rf, s.bonus_passes),
        (2, passes, waits)
    );
    assert!(
        s.stall_free_rf.is_some_and(|sf| sf > 2),
        "the stall-free rf is measured and above the fixed rf: {s:?}"
    );
    let prev_rfs: Vec<u32> = events
        .iter()
        .filter_map(|e| match e {
            metfs_protocol::Event::Switch(s) => Some(s.prev_rf),
            _ => None,
        })
        .collect();
    assert_eq!(prev_rfs, [2, passes, 2], "each switch's effective rf");
    drop(d);
    r.stop().await;
}

/// The daemon keeps its sessions by name: a plain mount has the default one, the requests of
/// the socket reach it, and a request for a session the daemon does not have is refused with an
/// error naming it, leaving the default session where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_name_their_session_and_an_unknown_one_is_refused() {
    use metfs::daemon::DEFAULT_SESSION;
    let t = setup(1);
    let r = start(t.cfg.clone()).await;
    let d = r.daemon.clone();
    assert_eq!(d.status_of(DEFAULT_SESSION).unwrap().generation, 1);
    for e in [
        d.status_of("trial-7").unwrap_err(),
        d.advance("trial-7", false).await.unwrap_err(),
        d.pass_end(
            "trial-7",
            None,
            Default::default(),
            Default::default(),
            false,
        )
        .await
        .unwrap_err(),
        d.apply("trial-7", 0, 1, false).await.unwrap_err(),
    ] {
        assert!(e.to_string().contains("`trial-7`"), "{e}");
    }
    assert_eq!(status_u64(&d, "generation"), 1);
    let reply = d.advance(DEFAULT_SESSION, true).await.unwrap();
    assert_eq!(reply.decision, Choice::Advance);
    assert_eq!(status_u64(&d, "generation"), 2);
    drop(d);
    r.stop().await;
}

/// The ranks of one node each apply the leader's decision to their node's daemon, at once:
/// every one of them lands on exactly the position applied, never one further (three ranks
/// per node once left the view a mini-epoch past the leader's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_applies_of_one_decision_move_the_view_once() {
    let t = setup(1);
    let r = start(t.cfg.clone()).await;
    let d = r.daemon.clone();
    for _ in 0..3 {
        let st = d.status();
        let target = if st.mini_epoch + 1 < st.mini_epochs {
            (st.epoch, st.mini_epoch + 1)
        } else {
            (st.epoch + 1, 0)
        };
        let applies: Vec<_> = (0..3)
            .map(|_| {
                let d = d.clone();
                tokio::spawn(
                    async move { d.apply(DEFAULT_SESSION, target.0, target.1, true).await },
                )
            })
            .collect();
        for a in applies {
            let got = a.await.unwrap().unwrap();
            assert_eq!((got.epoch, got.mini_epoch), target);
        }
        let st = d.status();
        assert_eq!(
            (st.epoch, st.mini_epoch),
            target,
            "the view moved past the decision"
        );
    }
    drop(d);
    r.stop().await;
}
