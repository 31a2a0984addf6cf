//! The daemon's fault handling on an injected tier (`metfs_tier::testing`): the source is
//! a `MemoryTier` of the generated files, wrapped in a `FaultyTier` that scripts the fault by
//! fetch number, handed to `Daemon::prepare_with_tier`. Each fault strikes while the successor
//! of the first mini-epoch stages: a source outage, a full cache, samples that change, a fetch
//! that hangs. A real full disk needs a small file system mounted (root; `tests/` does it with a
//! tmpfs): here the cache is full as a tier's write into it sees it, the `ENOSPC` that both real
//! tiers report as `TierError::Local`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metfs::daemon::Daemon;
use metfs_protocol::reply::Staging;
use metfs_protocol::{Choice, Event};
use metfs_tier::testing::{Failure, FaultId, FaultyTier, Hang, MemoryTier, Op, Rule};

use crate::common::*;
use metfs::daemon::DEFAULT_SESSION;

/// The source's URL: a scheme, so that nothing takes it for a directory.
const URL: &str = "memory://faults";

/// A test's setup with its source in memory behind a fault injector.
struct Faulty {
    t: Setup,
    mem: Arc<MemoryTier>,
    tier: Arc<FaultyTier>,
}

/// rf `rf`, staging at full speed (auto pacing would trickle until a pass is timed, and stretch
/// the stall watch by its waits), `stager` the lines of the `[stager]` table.
fn faulty(rf: u32, stager: &str) -> Faulty {
    let mut t = setup_with(
        rf,
        &format!("prefetch_rate = \"unlimited\"\n[stager]\n{stager}"),
    );
    t.cfg.source = URL.to_string();
    let mem = Arc::new(MemoryTier::with_files(URL, t.source.clone()));
    let tier = Arc::new(FaultyTier::new(mem.clone()));
    Faulty { t, mem, tier }
}

impl Faulty {
    /// Makes every fetch of `paths` fail with `EIO` (a dead OST) until each returned rule ends.
    fn dead<'a>(&self, paths: impl IntoIterator<Item = &'a String>) -> Vec<FaultId> {
        paths
            .into_iter()
            .map(|p| {
                self.tier.add(
                    Rule::fetches(..)
                        .of_path(p.clone())
                        .fail(Failure::Io(libc::EIO)),
                )
            })
            .collect()
    }

    /// The daemon prepared on the faulty tier (the first mini-epoch staged, no fault yet), its
    /// cache lock, and the plan of epoch 0.
    async fn prepare(&self) -> (Arc<Daemon>, std::fs::File, Vec<BTreeSet<String>>) {
        let (d, lock) = Daemon::prepare_with_tier(self.t.cfg.clone(), false, self.tier.clone())
            .await
            .expect("prepare");
        let plan = planned(&self.t.cfg, &d, 0);
        assert!(plan.len() >= 3, "the test wants several mini-epochs");
        assert_eq!(
            self.tier.calls(Op::Fetch),
            plan[0].len() as u64,
            "the first mini-epoch took one fetch per sample"
        );
        (d, lock, plan)
    }
}

/// Waits (bounded) until the successor's staging has failed, and returns the status then.
async fn wait_failed(d: &Daemon) -> metfs_protocol::reply::Status {
    wait_for("the successor's staging to fail", || {
        matches!(d.status().staging, Staging::Failed { .. })
    })
    .await
    .unwrap();
    d.status()
}

/// What the cache holds that is not a whole copy of its sample: every file of `tmp/`, and
/// every file of the successor's slot (epoch 0's second mini-epoch, settled when this is asked:
/// failed and pausing, or staged) whose bytes are not its source's (a copy cut short, or of a
/// version replaced since). Copies of a slot not yet complete are written at their own paths,
/// so a partial copy left behind would be found there. Other slots are left alone: after a
/// switch the next staging writes its copies and the retired slot is deleted meanwhile.
fn partial_copies(cache: &std::path::Path, source: &BTreeMap<String, Vec<u8>>) -> Vec<String> {
    fn files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => files(&e.path(), out),
                Ok(_) => out.push(e.path()),
                Err(_) => {}
            }
        }
    }
    let mut left: Vec<String> = std::fs::read_dir(cache.join("tmp"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
        .map(|e| format!("tmp/{}", e.file_name().to_string_lossy()))
        .collect();
    let slot = cache
        .join("slots")
        .join(metfs_prefetcher::stager::slot_name(0, 1));
    let mut found = Vec::new();
    files(&slot, &mut found);
    for f in found {
        let rel = f.strip_prefix(&slot).unwrap().to_string_lossy();
        if source.get(rel.as_ref()) != Some(&std::fs::read(&f).unwrap()) {
            left.push(f.strip_prefix(cache).unwrap().display().to_string());
        }
    }
    left
}

/// A `pass_end` that must answer promptly whatever the tier is doing.
async fn prompt_pass_end(d: &Daemon) -> Choice {
    tokio::time::timeout(Duration::from_secs(2), bare_pass_end(d, false))
        .await
        .expect("pass_end answered within 2 s")
        .unwrap()
        .decision
}

/// Asserts that every sample of `paths` was fetched from the tier exactly once.
fn fetched_once<'a>(tier: &FaultyTier, paths: impl IntoIterator<Item = &'a String>) {
    let counts = tier.fetch_counts();
    let wrong: BTreeMap<&String, u64> = paths
        .into_iter()
        .map(|p| (p, counts.get(p).copied().unwrap_or(0)))
        .filter(|(_, n)| *n != 1)
        .collect();
    assert!(wrong.is_empty(), "fetched other than once: {wrong:?}");
}

/// An outage of the source while the next mini-epoch stages: its fetches are retried (status
/// shows the retries), then the slot fails as a whole; meanwhile the current view keeps
/// serving its bytes and a pass end answers `wait`. Once the source answers again staging
/// resumes after its pause, keeping what it committed: every sample is fetched exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_during_staging_keeps_the_view_and_staging_resumes_after_it() {
    let f = faulty(1, "retry_secs = 1");
    let (d, lock, plan) = f.prepare().await;
    // A few of the successor's samples arrive, then the source stops answering.
    let first = f.tier.calls(Op::Fetch);
    let outage = f.tier.fail_fetches(first + 5.., Failure::Unreachable);
    let r = run(d.clone(), lock);

    let mut retried = false;
    wait_for("the successor's staging to fail", || {
        match d.status().staging {
            Staging::Staging {
                retries,
                last_retry_error,
                ..
            } => {
                if retries > 0 {
                    retried = true;
                    let e = last_retry_error.unwrap_or_default();
                    assert!(e.contains("unreachable"), "{e}");
                }
                false
            }
            Staging::Failed { .. } => true,
            _ => false,
        }
    })
    .await
    .unwrap();
    assert!(
        retried,
        "the outage's fetches were retried before the slot failed"
    );
    let st = d.status();
    let Staging::Failed {
        error,
        failures,
        defers,
        ..
    } = &st.staging
    else {
        unreachable!()
    };
    assert!(error.contains("unreachable"), "{error}");
    assert_eq!(*failures, 1);
    assert!(!defers, "the next try is long before the defer bound");
    assert!(!st.next_ready);
    assert!(
        st.failed_samples.is_empty(),
        "an outage leaves no sample out"
    );

    // The current view keeps serving; the job is told to wait, not advanced.
    assert_eq!(prompt_pass_end(&d).await, Choice::Wait);
    let view = read_view(&d.surface().fs());
    assert_eq!(keys(&view), plan[0]);
    check_bytes(&view, &f.t.source);
    assert_eq!(status_u64(&d, "generation"), 1);

    f.tier.end(outage);
    wait_next_ready(&d).await;
    assert!(d.status().failed_samples.is_empty());
    assert_eq!(prompt_pass_end(&d).await, Choice::Advance);
    let view = read_view(&d.surface().fs());
    assert_eq!(
        keys(&view),
        plan[1],
        "the whole successor, nothing left out"
    );
    check_bytes(&view, &f.t.source);
    fetched_once(&f.tier, plan[0].iter().chain(&plan[1]));
    let left = partial_copies(&f.t.cache, &f.t.source);
    assert!(left.is_empty(), "{left:?}");
    drop(d);
    r.stop().await;
}

/// The cache fills while the next mini-epoch stages: the slot fails at once as out of space
/// (status, the log's `stage_failed` event), no sample is left out for it and no partial copy
/// stays behind, the view keeps serving and a pass end answers `wait`; once writes fit again
/// staging resumes and the successor is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_cache_fails_the_slot_drops_no_sample_and_staging_resumes() {
    let f = faulty(1, "");
    let (d, lock, plan) = f.prepare().await;
    let first = f.tier.calls(Op::Fetch);
    let full = f.tier.fail_fetches(first + 5.., Failure::CacheFull);
    let r = run(d.clone(), lock);

    let st = wait_failed(&d).await;
    let Staging::Failed { error, .. } = &st.staging else {
        unreachable!()
    };
    assert!(error.contains("No space left"), "{error}");
    assert!(
        st.last_error
            .as_deref()
            .unwrap_or("")
            .contains("No space left"),
        "{:?}",
        st.last_error
    );
    assert!(st.failed_samples.is_empty(), "a full cache drops no sample");
    assert!(!st.next_ready);
    let left = partial_copies(&f.t.cache, &f.t.source);
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(prompt_pass_end(&d).await, Choice::Wait);
    let view = read_view(&d.surface().fs());
    assert_eq!(keys(&view), plan[0]);
    check_bytes(&view, &f.t.source);

    f.tier.end(full);
    wait_next_ready(&d).await;
    assert!(d.status().failed_samples.is_empty());
    assert_eq!(prompt_pass_end(&d).await, Choice::Advance);
    let view = read_view(&d.surface().fs());
    assert_eq!(
        keys(&view),
        plan[1],
        "the whole successor, nothing left out"
    );
    check_bytes(&view, &f.t.source);
    fetched_once(&f.tier, plan[0].iter().chain(&plan[1]));

    assert!(
        d.events.flush(Duration::from_secs(30)),
        "the event log wrote"
    );
    let log = std::fs::read_to_string(f.t.cache.join("run").join("events.jsonl")).unwrap();
    let failed: Vec<_> = log
        .lines()
        .filter_map(|l| {
            match serde_json::from_str::<metfs_protocol::Record>(l)
                .ok()?
                .event
            {
                Event::StageFailed(s) => Some(s),
                _ => None,
            }
        })
        .collect();
    assert!(!failed.is_empty(), "a stage_failed event");
    assert!(failed.iter().all(|s| s.out_of_space), "{failed:?}");
    assert_eq!((failed[0].epoch, failed[0].mini_epoch), (0, 1));
    drop(d);
    r.stop().await;
}

/// Samples of the next mini-epoch that change at the source after the listing are never
/// served with bytes of two versions: one replaced just before its fetch (refused at the
/// fetch's first check) and one replaced halfway through its copy (the copy mixes both
/// versions; the check after it refuses it). Both are left out of the slot, as the stager's
/// rule for a sample changed since cataloguing says, and status names them; the rest of the
/// successor is served whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sample_that_changes_while_staged_is_left_out_and_named() {
    let f = faulty(1, "");
    let (d, lock, plan) = f.prepare().await;
    let source = &f.t.source;
    // The one changed in the middle of its copy spans several of the tier's pieces.
    let during = plan[1]
        .iter()
        .find(|p| source[*p].len() > 40_000)
        .expect("a large sample in the successor")
        .clone();
    let before = plan[1].iter().find(|p| **p != during).unwrap().clone();
    let flipped = |p: &str| source[p].iter().map(|b| !b).collect::<Vec<u8>>();
    // Same sizes: only the versions tell the change.
    let first = f.tier.calls(Op::Fetch);
    let change = f
        .tier
        .add(Rule::fetches(first..).of_path(before.clone()).run({
            let (mem, path, bytes) = (f.mem.clone(), before.clone(), flipped(&before));
            move || {
                mem.put(&path, bytes.clone());
            }
        }));
    f.mem.replace_during_next_fetch(&during, flipped(&during));
    let r = run(d.clone(), lock);

    wait_next_ready(&d).await;
    f.tier.end(change);
    let st = d.status();
    let Staging::Ready { failed, .. } = &st.staging else {
        panic!("{:?}", st.staging)
    };
    assert_eq!(*failed, 2, "{:?}", st.failed_samples);
    for p in [&before, &during] {
        assert!(
            st.failed_samples
                .iter()
                .any(|f| f.path == *p && f.reason.contains("changed")),
            "status names {p}: {:?}",
            st.failed_samples
        );
        assert_eq!(f.tier.fetched(p), 0, "{p}: no fetch of it succeeded");
        assert_eq!(f.mem.get(p).unwrap().0, flipped(p), "{p} did change");
    }
    let mixed: BTreeMap<String, Vec<u8>> = source
        .iter()
        .map(|(p, b)| (p.clone(), if *p == during { Vec::new() } else { b.clone() }))
        .collect();
    let left = partial_copies(&f.t.cache, &mixed);
    assert!(left.is_empty(), "the mixed copy is gone: {left:?}");

    assert_eq!(prompt_pass_end(&d).await, Choice::Advance);
    let view = read_view(&d.surface().fs());
    let mut want = plan[1].clone();
    want.remove(&before);
    want.remove(&during);
    assert_eq!(keys(&view), want, "the changed samples are left out");
    // Every file served has its catalogued (original) bytes.
    check_bytes(&view, source);
    drop(d);
    r.stop().await;
}

/// A fetch that hangs holds up neither `pass_end` nor status: both answer at once while it
/// hangs. The stager's stall watch abandons it after `timeout_secs`, the slot fails (status
/// says no progress), and the next attempt stages the successor whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_fetch_blocks_neither_pass_end_nor_status() {
    let f = faulty(1, "timeout_secs = 1");
    let (d, lock, plan) = f.prepare().await;
    let first = f.tier.calls(Op::Fetch);
    f.tier
        .hang_fetches(first + 3..first + 4, Hang::UntilReleased);
    let r = run(d.clone(), lock);

    wait_for("a fetch to hang", || f.tier.hanging() == 1)
        .await
        .unwrap();
    let t0 = Instant::now();
    let st = tokio::task::spawn_blocking({
        let d = d.clone();
        move || d.status()
    });
    let st = tokio::time::timeout(Duration::from_secs(1), st)
        .await
        .expect("status answered within 1 s")
        .unwrap();
    assert!(!st.next_ready);
    assert_eq!(prompt_pass_end(&d).await, Choice::Wait);
    let reply = tokio::time::timeout(Duration::from_secs(2), d.advance(DEFAULT_SESSION, false))
        .await
        .expect("a non-blocking advance answered within 2 s")
        .unwrap();
    assert_eq!(reply.decision, Choice::Wait, "{reply:?}");
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "answers came while the fetch hung"
    );

    let st = wait_failed(&d).await;
    let Staging::Failed { error, .. } = &st.staging else {
        unreachable!()
    };
    assert!(error.contains("no progress"), "{error}");
    assert_eq!(f.tier.hanging(), 0, "the stalled fetch was abandoned");
    assert!(st.failed_samples.is_empty(), "a hang leaves no sample out");

    wait_next_ready(&d).await;
    assert_eq!(prompt_pass_end(&d).await, Choice::Advance);
    let view = read_view(&d.surface().fs());
    assert_eq!(keys(&view), plan[1]);
    check_bytes(&view, &f.t.source);
    fetched_once(&f.tier, &plan[1]);
    f.tier.release();
    drop(d);
    r.stop().await;
}

/// A fault that lasts (a dead OST: two samples of the successor answer `EIO` until it is
/// repaired): past `defer_after_secs` the successor is staged deferring, completes without
/// them and the view moves on; `status` counts and names them. Once the tier gives them again
/// they come in a later mini-epoch, whole and with their bytes, counted as recovered and off
/// the failed list; every sample of the epoch is read once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samples_a_lasting_fault_holds_are_deferred_and_come_later() {
    let f = faulty(1, "retry_secs = 1\ndefer_after_secs = 2");
    let (d, lock, plan) = f.prepare().await;
    let dead: Vec<String> = plan[1].iter().take(2).cloned().collect();
    let faults = f.dead(&dead);
    let r = run(d.clone(), lock);
    let t = Instant::now();
    // Failed once (retries for 1 s), paused 2 s: the next try is past the 2 s bound, and
    // `status` says it will defer.
    let st = wait_failed(&d).await;
    assert!(
        matches!(st.staging, Staging::Failed { defers: true, .. }),
        "{:?}",
        st.staging
    );
    wait_next_ready(&d).await;
    let st = d.status();
    assert_eq!(st.deferred_samples, 2, "{:?}", st.failed_samples);
    assert!(
        t.elapsed() >= Duration::from_secs(2),
        "deferred before the bound"
    );
    for p in &dead {
        assert!(
            st.failed_samples
                .iter()
                .any(|s| &s.path == p && s.reason.starts_with("deferred to a later mini-epoch")),
            "{p} not listed as deferred: {:?}",
            st.failed_samples
        );
    }
    assert_eq!(prompt_pass_end(&d).await, Choice::Advance);
    let view = read_view(&d.surface().fs());
    let want: BTreeSet<String> = plan[1]
        .difference(&dead.iter().cloned().collect())
        .cloned()
        .collect();
    assert_eq!(keys(&view), want, "the successor without the dead samples");
    check_bytes(&view, &f.t.source);

    // Repaired: the carried samples arrive with a later mini-epoch. Every view to the end of
    // epoch 0 (and, if they were carried past it, until they came) is read.
    for id in faults {
        f.tier.end(id);
    }
    let mut epoch0: BTreeMap<String, u32> = BTreeMap::new();
    for p in plan[0].iter().chain(&want) {
        *epoch0.entry(p.clone()).or_default() += 1;
    }
    let mut dead_seen: BTreeMap<String, u32> = BTreeMap::new();
    for _ in 0..plan.len() + 3 {
        let st = d.status();
        if st.epoch >= 1 && st.recovered_samples == 2 {
            break;
        }
        wait_next_ready(&d).await;
        assert_eq!(prompt_pass_end(&d).await, Choice::Advance);
        let view = read_view(&d.surface().fs());
        check_bytes(&view, &f.t.source);
        let epoch = status_u64(&d, "epoch");
        for p in keys(&view) {
            if dead.contains(&p) {
                *dead_seen.entry(p.clone()).or_default() += 1;
            }
            if epoch == 0 && !dead.contains(&p) {
                *epoch0.entry(p).or_default() += 1;
            }
        }
    }
    let st = d.status();
    assert_eq!(
        (st.deferred_samples, st.deferrals, st.recovered_samples),
        (0, 2, 2)
    );
    assert!(
        st.failed_samples.iter().all(|s| !dead.contains(&s.path)),
        "recovered samples are off the failed list: {:?}",
        st.failed_samples
    );
    let others: BTreeSet<String> = plan
        .iter()
        .flatten()
        .filter(|p| !dead.contains(p))
        .cloned()
        .collect();
    assert_eq!(
        epoch0.keys().cloned().collect::<BTreeSet<_>>(),
        others,
        "epoch 0 read whole"
    );
    assert!(
        epoch0.values().all(|&n| n == 1),
        "read more than once: {epoch0:?}"
    );
    for p in &dead {
        assert!(
            dead_seen.get(p).is_some_and(|&n| n >= 1),
            "{p} came back: {dead_seen:?}"
        );
    }
    // The event log says it, and `metfs report` counts it.
    let log = std::fs::read_to_string(f.t.cfg.run_dir.join("events.jsonl")).unwrap();
    assert!(
        log.contains("\"deferred\"") && log.contains("\"recovered\""),
        "{log}"
    );
    let out = tempfile::tempdir().unwrap();
    let summary = metfs_report::report(&f.t.cfg.run_dir, out.path()).unwrap();
    assert_eq!(
        (summary.deferred_samples, summary.recovered_samples),
        (2, 2)
    );
    drop(d);
    r.stop().await;
}

/// A sample carried when the daemon stops is carried on by the next one on the same cache: it
/// comes in the same epoch once the tier gives it, every other sample of the epoch is read once,
/// and the counts go on from where they were (not counted again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samples_carried_at_a_restart_still_come_in_their_epoch() {
    let f = faulty(1, "retry_secs = 1\ndefer_after_secs = 2");
    let (d, lock, plan) = f.prepare().await;
    // The two smallest of mini-epoch 1: carried, they find room in a later mini-epoch of the
    // epoch (a carried sample waits for a mini-epoch with room for it).
    let mut by_size: Vec<&String> = plan[1].iter().collect();
    by_size.sort_by_key(|p| f.t.source[p.as_str()].len());
    let dead: BTreeSet<String> = by_size.into_iter().take(2).cloned().collect();
    let faults = f.dead(&dead);
    assert!(
        plan.len() >= 4,
        "the test wants a restart two mini-epochs on"
    );
    let r = run(d.clone(), lock);
    let mut epoch0: BTreeMap<String, u32> = BTreeMap::new();
    for p in &plan[0] {
        *epoch0.entry(p.clone()).or_default() += 1;
    }
    // Mini-epochs 1 and 2 come without them: deferred, carried into 2, deferred again.
    for _ in 0..2 {
        wait_next_ready(&d).await;
        assert_eq!(prompt_pass_end(&d).await, Choice::Advance);
        let view = read_view(&d.surface().fs());
        assert!(keys(&view).is_disjoint(&dead));
        for p in keys(&view) {
            *epoch0.entry(p).or_default() += 1;
        }
    }
    assert_eq!(d.status().deferred_samples, 2);
    drop(d);
    r.stop().await;
    let saved = std::fs::read_to_string(f.t.cfg.cache.join("state.json")).unwrap();
    assert!(
        saved.contains("\"deferred\""),
        "the carry is saved: {saved}"
    );

    // Repaired, and the same cache mounted again.
    for id in faults {
        f.tier.end(id);
    }
    let (d, lock) = Daemon::prepare_with_tier(f.t.cfg.clone(), false, f.tier.clone())
        .await
        .expect("resume");
    let st = d.status();
    assert_eq!(
        (st.epoch, st.mini_epoch),
        (0, 2),
        "resumed where it stopped"
    );
    let mut came: BTreeSet<String> = keys(&read_view(&d.surface().fs()))
        .intersection(&dead)
        .cloned()
        .collect();
    let r = run(d.clone(), lock);
    loop {
        wait_next_ready(&d).await;
        assert_eq!(prompt_pass_end(&d).await, Choice::Advance);
        if status_u64(&d, "epoch") >= 1 {
            break;
        }
        let view = read_view(&d.surface().fs());
        check_bytes(&view, &f.t.source);
        for p in keys(&view) {
            if dead.contains(&p) {
                came.insert(p);
            } else {
                *epoch0.entry(p).or_default() += 1;
            }
        }
    }
    assert_eq!(came, dead, "the carried samples came in epoch 0");
    assert!(
        epoch0.values().all(|&n| n == 1),
        "read more than once: {epoch0:?}"
    );
    let st = d.status();
    assert_eq!((st.deferred_samples, st.recovered_samples), (0, 2));
    assert!(st.deferrals >= 2, "{}", st.deferrals);
    drop(d);
    r.stop().await;
}

/// A saved carry that names a sample the catalog does not have is a corrupt position: the mount
/// is refused naming `state.json` and the sample, nothing is staged over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saved_carry_outside_the_catalog_is_refused() {
    let f = faulty(1, "retry_secs = 1\ndefer_after_secs = 2");
    let (d, lock, _) = f.prepare().await;
    let r = run(d.clone(), lock);
    drop(d);
    r.stop().await;
    let path = f.t.cfg.cache.join("state.json");
    let mut state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    state["deferred"] = serde_json::json!({
        "carried": [4_000_000_000u32],
        "added": null,
        "deferred_total": 1,
        "recovered_total": 0
    });
    std::fs::write(&path, state.to_string()).unwrap();
    let e = match Daemon::prepare_with_tier(f.t.cfg.clone(), false, f.tier.clone()).await {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a carry outside the catalog was accepted"),
    };
    assert!(
        e.contains("state.json") && e.contains("sample 4000000000"),
        "{e}"
    );
}

/// The same fault at mount: the first mini-epoch is staged deferring, so the mount succeeds
/// without the dead sample after `retry_secs`, and `status` names it as deferred.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mount_defers_what_a_lasting_fault_holds() {
    let f = faulty(1, "retry_secs = 1\ndefer_after_secs = 2");
    // The first mini-epoch's samples are the plan's; which one is dead is found by a dry
    // mount, whose catalog and plan the second one repeats (same seed, same source).
    let dead = {
        let probe = faulty(1, "retry_secs = 1\ndefer_after_secs = 2");
        let (d, _lock, plan) = probe.prepare().await;
        drop(d);
        plan[0].iter().next().unwrap().clone()
    };
    let fault = f.tier.add(
        Rule::fetches(..)
            .of_path(dead.clone())
            .fail(Failure::Io(libc::EIO)),
    );
    let (d, lock) = Daemon::prepare_with_tier(f.t.cfg.clone(), false, f.tier.clone())
        .await
        .expect("the mount succeeds without the dead sample");
    let st = d.status();
    assert_eq!(st.deferred_samples, 1);
    assert!(
        st.failed_samples.iter().any(|s| s.path == dead),
        "{:?}",
        st.failed_samples
    );
    let view = read_view(&d.surface().fs());
    assert!(!view.contains_key(&dead));
    check_bytes(&view, &f.t.source);
    f.tier.end(fault);
    let r = run(d.clone(), lock);
    wait_next_ready(&d).await;
    assert_eq!(prompt_pass_end(&d).await, Choice::Advance);
    wait_for("the dead sample's recovery", || {
        d.status().recovered_samples == 1
    })
    .await
    .unwrap();
    drop(d);
    r.stop().await;
}
