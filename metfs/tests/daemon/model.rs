//! A model-based property test of a shared mount's store and sessions: what runs (the daemon,
//! its Store, its sessions' schedules, the staging loop and the drain loop, on a real cache
//! directory), driven by random sequences of the operations jobs perform (join, pass end,
//! open a file and hold it across switches, close, leave, pause), and checked after every step
//! against a model of what each job must see:
//!
//! * **Budget.** The cache's distinct bytes on disk (each inode once) never exceed the budget,
//!   whatever the stagings, retirements, trims and evictions running in the background do.
//! * **Current and pinned slots are never evicted.** Every file of every job's current view,
//!   and every file a job holds open from an older view, reads back its source's bytes, but
//!   for views taken back past `share.held_open_cap`, whose reads answer EIO (never other
//!   bytes) and whose job's status counts them.
//! * **Generations and positions are monotone.** A job's generation never goes back, and its
//!   mini-epoch moves by one at a switch, from 0 at its first view.
//! * **Each epoch is its dataset once.** Every epoch a job has finished is a partition of the
//!   dataset over the views it showed (the model records each view once, at the step that
//!   switched to it: switches only happen in the requests this test makes).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use metfs::daemon::Daemon;
use metfs_fs::fs::{FsCore, FsError};
use metfs_fs::view::ROOT_INO;
use proptest::prelude::*;

use crate::common::*;

/// Jobs the budget is shared between (and the most that join).
const JOBS: usize = 3;
/// Large enough for a few samples per view of each job (the samples are up to ~90 KiB).
const BUDGET: u64 = 6 << 20;

#[derive(Debug, Clone)]
enum Op {
    /// A pass over the job's view ends (`pass_end`, not blocking: `wait` while its successor
    /// is not staged or it is held back); with `ready`, once its successor is staged (waited
    /// for, a second at most), as a job whose passes take longer than a staging.
    PassEnd(usize, bool),
    /// The job opens the first file of its current view and holds it.
    Hold(usize),
    /// The job closes every file it holds.
    Release(usize),
    /// The job leaves; a later step may join it again, as a new job of the same name.
    Leave(usize),
    /// The job joins (again).
    Join(usize),
    /// Time passes: the staging loop and the drain loop run.
    Pause(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let job = 0..JOBS;
    prop_oneof![
        12 => (job.clone(), any::<bool>()).prop_map(|(j, ready)| Op::PassEnd(j, ready)),
        2 => job.clone().prop_map(Op::Hold),
        2 => job.clone().prop_map(Op::Release),
        1 => job.clone().prop_map(Op::Leave),
        1 => job.prop_map(Op::Join),
        3 => (1u64..40).prop_map(Op::Pause),
    ]
}

/// What the model knows of one job.
#[derive(Default)]
struct JobModel {
    /// The last generation and mini-epoch it showed.
    generation: u64,
    mini_epoch: Option<u32>,
    /// The files of each view it showed, by (epoch, mini-epoch).
    views: BTreeMap<(u64, u32), BTreeSet<String>>,
    /// Files it holds open: (handle, path in the dataset).
    held: Vec<(u64, String)>,
}

fn name(j: usize) -> String {
    format!("j{j}")
}

/// Every job's current view through the core: job name -> (path in the dataset -> bytes).
fn views(fs: &FsCore) -> BTreeMap<String, BTreeMap<String, Vec<u8>>> {
    let mut out: BTreeMap<String, BTreeMap<String, Vec<u8>>> = BTreeMap::new();
    for (path, bytes) in read_view(fs) {
        let (job, rel) = path.split_once('/').expect("a job's directory");
        out.entry(job.to_string())
            .or_default()
            .insert(rel.to_string(), bytes);
    }
    out
}

/// Opens `rel` in job `job`'s view; the handle. The lookups are forgotten once the file is
/// open, as a kernel forgets its entries in time (here no kernel is told to, and a lookup
/// never forgotten would keep its view from draining for ever).
fn open_in(fs: &FsCore, job: &str, rel: &str) -> u64 {
    let mut ino = ROOT_INO;
    let mut looked_up = Vec::new();
    for part in std::iter::once(job).chain(rel.split('/')) {
        let attr = fs.lookup(ino, part).expect("in the view");
        ino = attr.ino;
        looked_up.push(ino);
    }
    let fh = fs.open(ino, 0).expect("open").fh;
    for ino in looked_up {
        fs.forget(ino, 1);
    }
    fh
}

fn read_all(fs: &FsCore, fh: u64) -> Result<Vec<u8>, FsError> {
    let mut bytes = Vec::new();
    loop {
        let chunk = fs.read(fh, bytes.len() as u64, 128 << 10)?;
        if chunk.is_empty() {
            return Ok(bytes);
        }
        bytes.extend_from_slice(&chunk);
    }
}

async fn join(d: &Daemon, j: usize) {
    d.greet(Some(name(j)), None, None, None, None)
        .await
        .unwrap_or_else(|e| panic!("{} cannot join: {e:?}", name(j)));
}

/// Checks every invariant of the module docs after a step, and records the views shown.
fn check(
    t: &Setup,
    d: &Daemon,
    model: &mut BTreeMap<usize, JobModel>,
    step: usize,
    op: &Op,
) -> Result<(), TestCaseError> {
    let on_disk = allocated(&t.cache);
    prop_assert!(
        on_disk <= BUDGET,
        "step {step} ({op:?}): the cache takes {on_disk} bytes, over the budget {BUDGET}"
    );
    let fs = d.surface().fs();
    let shown = views(&fs);
    let status = d.status();
    let jobs = status.jobs.clone().unwrap_or_default();
    for (&j, m) in model.iter_mut() {
        let n = name(j);
        let st = jobs.iter().find(|s| s.name == n);
        prop_assert!(st.is_some(), "step {step}: {n} is not in status");
        let st = st.unwrap();
        prop_assert!(
            st.generation >= m.generation,
            "step {step}: {n}'s generation went back from {} to {}",
            m.generation,
            st.generation
        );
        let files = shown.get(&n).cloned().unwrap_or_default();
        for (rel, bytes) in &files {
            prop_assert!(
                t.source.get(rel) == Some(bytes),
                "step {step} ({op:?}): {n}/{rel} differs from the source"
            );
        }
        if let Some(me) = st.mini_epoch {
            match m.mini_epoch {
                None => prop_assert_eq!(me, 0, "step {}: {}'s first view", step, n),
                Some(prev) => prop_assert!(
                    me == prev || me == prev + 1,
                    "step {step}: {n} moved from mini-epoch {prev} to {me}"
                ),
            }
            let names: BTreeSet<String> = files.keys().cloned().collect();
            let recorded = m.views.entry((st.epoch, me)).or_insert(names.clone());
            prop_assert!(
                *recorded == names,
                "step {step}: {n}'s view {:?} changed without a switch",
                (st.epoch, me)
            );
        }
        m.generation = st.generation;
        m.mini_epoch = st.mini_epoch;
        for (fh, rel) in &m.held {
            match read_all(&fs, *fh) {
                Ok(bytes) => prop_assert!(
                    t.source.get(rel) == Some(&bytes),
                    "step {step} ({op:?}): {n} holds {rel} open from an older view, and it no longer reads back the source's bytes"
                ),
                // Past `share.held_open_cap` a job's oldest held views are taken back: a read
                // of one answers EIO, never other bytes, and the job's status says so.
                Err(FsError::Revoked) => {
                    // The monitor may have taken it back since `status` above: ask again.
                    let now = d.status().jobs.unwrap_or_default();
                    let revoked = now.iter().find(|s| s.name == n).map_or(0, |s| s.revoked_bytes);
                    prop_assert!(
                        revoked > 0,
                        "step {step} ({op:?}): {n}'s held {rel} was taken back, but its status says nothing was"
                    );
                }
                Err(e) => prop_assert!(false, "step {step} ({op:?}): {n} reads its held {rel}: {e}"),
            }
        }
    }
    Ok(())
}

/// Every epoch a job finished (one before its current) is its dataset once.
fn check_epochs(t: &Setup, model: &BTreeMap<usize, JobModel>) -> Result<(), TestCaseError> {
    let dataset: BTreeSet<&String> = t.source.keys().collect();
    for (j, m) in model {
        let Some(&(last, _)) = m.views.keys().next_back() else {
            continue;
        };
        for epoch in 0..last {
            let mut seen: BTreeSet<&String> = BTreeSet::new();
            for ((e, _), files) in &m.views {
                if *e != epoch {
                    continue;
                }
                for f in files {
                    prop_assert!(seen.insert(f), "j{j} epoch {epoch}: {f} in two views");
                }
            }
            prop_assert_eq!(&seen, &dataset, "j{} epoch {}: not the dataset", j, epoch);
        }
    }
    Ok(())
}

async fn run_case(ops: Vec<Op>, evict: &str) -> Result<(), TestCaseError> {
    let t = setup_full(
        1,
        BUDGET,
        &format!(
            "prefetch_rate = \"unlimited\"\nrf_policy = \"fixed\"\n[share]\nenabled = true\njobs = {JOBS}\nevict = \"{evict}\"\n"
        ),
    );
    let r = start(t.cfg.clone()).await;
    let d = r.daemon.clone();
    let mut model: BTreeMap<usize, JobModel> = BTreeMap::new();
    // The jobs join together (each `hello` answers once its first view is staged).
    let joins: Vec<_> = (0..2)
        .map(|j| {
            let d = d.clone();
            tokio::spawn(async move { join(&d, j).await })
        })
        .collect();
    for (j, h) in joins.into_iter().enumerate() {
        h.await.expect("join task");
        model.insert(j, JobModel::default());
    }
    check(&t, &d, &mut model, 0, &Op::Join(0))?;
    for (step, op) in ops.iter().enumerate() {
        // A step that does not finish is a failure of its own (a job waiting forever), with
        // what the daemon says of its jobs at that moment.
        let done = tokio::time::timeout(STEP_LIMIT, apply(&t, &d, &mut model, step, op)).await;
        match done {
            Ok(r) => r?,
            Err(_) => {
                return Err(TestCaseError::fail(format!(
                    "step {step} ({op:?}) did not finish in {STEP_LIMIT:?}: {:#?}",
                    d.status()
                )))
            }
        }
    }
    check_epochs(&t, &model)?;
    for m in model.values_mut() {
        for (fh, _) in m.held.drain(..) {
            d.surface().fs().release(fh);
        }
    }
    r.stop().await;
    Ok(())
}

/// Longer than any step takes on a loaded machine (a staging of a few samples).
const STEP_LIMIT: Duration = Duration::from_secs(60);

/// One step: the operation, then the checks.
async fn apply(
    t: &Setup,
    d: &Arc<Daemon>,
    model: &mut BTreeMap<usize, JobModel>,
    step: usize,
    op: &Op,
) -> Result<(), TestCaseError> {
    {
        let fs = d.surface().fs();
        match op {
            Op::PassEnd(j, ready) if model.contains_key(j) => {
                let n = name(*j);
                if *ready {
                    let staged = || {
                        d.status()
                            .jobs
                            .unwrap_or_default()
                            .iter()
                            .any(|s| s.name == n && s.next_ready)
                    };
                    for _ in 0..100 {
                        if staged() {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                d.pass_end(
                    &n,
                    Some(n.clone()),
                    Default::default(),
                    Default::default(),
                    false,
                )
                .await
                .map_err(|e| TestCaseError::fail(format!("pass_end of {n}: {e:?}")))?;
            }
            Op::Hold(j) if model.contains_key(j) => {
                let n = name(*j);
                let first = views(&fs).get(&n).and_then(|v| v.keys().next().cloned());
                if let Some(rel) = first {
                    let fh = open_in(&fs, &n, &rel);
                    model.get_mut(j).unwrap().held.push((fh, rel));
                }
            }
            Op::Release(j) if model.contains_key(j) => {
                for (fh, _) in model.get_mut(j).unwrap().held.drain(..) {
                    fs.release(fh);
                }
            }
            Op::Leave(j) if model.contains_key(j) => {
                let mut m = model.remove(j).unwrap();
                for (fh, _) in m.held.drain(..) {
                    fs.release(fh);
                }
                check_epochs(t, &BTreeMap::from([(*j, m)]))?;
                d.leave(&name(*j))
                    .await
                    .map_err(|e| TestCaseError::fail(format!("leave: {e:?}")))?;
            }
            Op::Join(j) if !model.contains_key(j) => {
                // A job's first view needs room, and a file held open keeps its blocks however
                // its slot goes: while other jobs hold files of their old views, the join may
                // rightly wait. Once they close them, it must finish.
                let d2 = d.clone();
                let j2 = *j;
                let mut task = tokio::spawn(async move { join(&d2, j2).await });
                match tokio::time::timeout(Duration::from_secs(10), &mut task).await {
                    Ok(r) => r.expect("join task"),
                    Err(_) => {
                        for m in model.values_mut() {
                            for (fh, _) in m.held.drain(..) {
                                fs.release(fh);
                            }
                        }
                        task.await.expect("join task");
                    }
                }
                model.insert(*j, JobModel::default());
            }
            Op::Pause(ms) => tokio::time::sleep(Duration::from_millis(*ms)).await,
            _ => return Ok(()),
        }
    }
    check(t, d, model, step + 1, op)
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(4)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        // Each case runs a daemon on a real cache: shrinking would rerun dozens of them.
        max_shrink_iters: 8,
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_shared_store_keeps_its_budget_its_current_and_held_files_and_each_epoch_whole(
        ops in proptest::collection::vec(op(), 40..120),
        lru in any::<bool>(),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(run_case(ops, if lru { "lru" } else { "refcnt" }))?;
    }
}
