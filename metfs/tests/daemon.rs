//! The daemon driven as a library on a temporary POSIX tier: a directory of generated files as
//! the source and another as the cache. Most tests go through `FsCore` (what the FUSE adapter
//! calls) without a mount, doing what the kernel would: `lookup` then `forget`, `opendir` /
//! `readdir` / `release`, `open` / `read` / `release`. One test mounts the view with FUSE and
//! reads it with `std::fs`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use metfs::config::MountConfig;
use metfs::daemon::{Daemon, KernelCache};
use metfs::fs::FsCore;
use metfs::protocol::Choice;
use metfs::view::ROOT_INO;
use prefetcher::catalog::Catalog;
use prefetcher::planner::{self, PlanConfig, SampleSet};
use tokio::task::JoinHandle;

/// Budget of every test: with ~1.7 MiB of reserve, a slot holds ~1.1 MiB, so the ~5 MiB
/// dataset makes several mini-epochs.
const BUDGET: u64 = 4 << 20;

/// A source tree of generated files with sizes from a few bytes to ~90 KiB (many not a
/// multiple of the 4 KiB block), in nested directories; returns each relative path's bytes.
fn make_source(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        // xorshift64: deterministic contents without a dependency.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..110u32 {
        let dir = ["cats", "dogs", "birds/small", "birds/large"][i as usize % 4];
        let size = (next() % 90_000) as usize + 1;
        let bytes: Vec<u8> = (0..size).map(|_| next() as u8).collect();
        let rel = format!("{dir}/s{i:04}.bin");
        let path = root.join(&rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &bytes).unwrap();
        files.insert(rel, bytes);
    }
    files
}

/// A test's tier, cache and the configuration `metfs mount` would resolve for them.
struct Setup {
    _dirs: tempfile::TempDir,
    source: BTreeMap<String, Vec<u8>>,
    cache: PathBuf,
    cfg: MountConfig,
}

fn setup(rf: u32) -> Setup {
    setup_with(rf, "")
}

/// As [`setup`], with more lines of the TOML configuration.
fn setup_with(rf: u32, extra_toml: &str) -> Setup {
    setup_full(rf, BUDGET, extra_toml)
}

/// As [`setup`], with another budget and more lines of the TOML configuration.
fn setup_full(rf: u32, budget: u64, extra_toml: &str) -> Setup {
    setup_in(rf, budget, extra_toml, "src")
}

/// As [`setup_full`], with the source directory named `source_dir`.
fn setup_in(rf: u32, budget: u64, extra_toml: &str, source_dir: &str) -> Setup {
    let dirs = tempfile::tempdir().unwrap();
    let src = dirs.path().join(source_dir);
    let cache = dirs.path().join("cache");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&cache).unwrap();
    let source = make_source(&src);
    // As `metfs mount --config FILE`: a TOML file resolved with no flags over it.
    let toml = format!(
        "source = {:?}\ncache = {:?}\nbudget = {budget}\nrf = {rf}\nseed = 7\n\
         compose = \"random\"\nhistory = {:?}\n{extra_toml}\n",
        src.display().to_string(),
        cache.display().to_string(),
        dirs.path().join("rf-history.json").display().to_string(),
    );
    let cfg = MountConfig::from_toml(&toml, "test config").unwrap();
    Setup {
        _dirs: dirs,
        source,
        cache,
        cfg,
    }
}

/// A prepared daemon with its background tasks started as `metfs mount` starts them.
struct Running {
    daemon: Arc<Daemon>,
    lock: std::fs::File,
    tasks: Vec<JoinHandle<()>>,
}

async fn start(cfg: MountConfig) -> Running {
    let (daemon, lock) = Daemon::prepare(cfg, false).await.expect("prepare");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    daemon.fs().set_drained_sender(tx);
    let tasks = vec![
        tokio::spawn(daemon.clone().stager_loop()),
        tokio::spawn(daemon.clone().drain_loop(rx)),
        tokio::spawn(daemon.clone().monitor_loop()),
    ];
    Running {
        daemon,
        lock,
        tasks,
    }
}

impl Running {
    /// Shuts down as `metfs` does on SIGTERM, then ends the tasks as the process exit would,
    /// and releases the cache lock.
    async fn stop(self) {
        self.daemon.begin_shutdown();
        self.daemon.persist();
        for t in self.tasks {
            t.abort();
            let _ = t.await;
        }
        drop(self.daemon);
        drop(self.lock);
    }
}

/// A field of the status by its protocol name.
fn status_u64(d: &Daemon, key: &str) -> u64 {
    serde_json::to_value(d.status()).unwrap()[key]
        .as_u64()
        .unwrap_or_else(|| panic!("status has no integer `{key}`"))
}

/// Waits (bounded) until the successor mini-epoch is staged.
async fn wait_next_ready(d: &Daemon) {
    for _ in 0..3000 {
        if d.status().next_ready {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the successor was not staged in 30 s: {:?}", d.status());
}

/// Every file of the current view with its bytes, walked as the kernel would.
fn read_view(fs: &FsCore) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    walk(fs, ROOT_INO, "", &mut out);
    out
}

fn walk(fs: &FsCore, dir: u64, prefix: &str, out: &mut BTreeMap<String, Vec<u8>>) {
    let fh = fs.opendir(dir).unwrap();
    let mut names = Vec::new();
    fs.readdir(dir, fh, 0, false, |e| {
        if e.name != "." && e.name != ".." {
            names.push(e.name.to_string());
        }
        false
    })
    .unwrap();
    fs.release(fh);
    for name in names {
        let attr = fs.lookup(dir, &name).unwrap();
        let rel = format!("{prefix}{name}");
        if attr.is_dir {
            walk(fs, attr.ino, &format!("{rel}/"), out);
        } else {
            let opened = fs.open(attr.ino).unwrap();
            let mut bytes = Vec::new();
            loop {
                let chunk = fs.read(opened.fh, bytes.len() as u64, 128 << 10).unwrap();
                if chunk.is_empty() {
                    break;
                }
                bytes.extend_from_slice(&chunk);
            }
            fs.release(opened.fh);
            assert_eq!(bytes.len() as u64, attr.size, "{rel}: size in the view");
            out.insert(rel, bytes);
        }
        fs.forget(attr.ino, 1);
    }
}

/// Asserts that every file in `view` has its source bytes.
fn check_bytes(view: &BTreeMap<String, Vec<u8>>, source: &BTreeMap<String, Vec<u8>>) {
    for (path, bytes) in view {
        let want = source
            .get(path)
            .unwrap_or_else(|| panic!("{path} is in the view but not in the source"));
        assert!(
            bytes == want,
            "{path}: bytes through the view differ from the source"
        );
    }
}

/// The paths of each mini-epoch of `epoch`, computed from the daemon's inputs with the
/// planner (a pure function), independently of the daemon's own plan.
fn planned(cfg: &MountConfig, d: &Daemon, epoch: u64) -> Vec<BTreeSet<String>> {
    let catalog = Catalog::load(&d.paths.catalog).unwrap();
    let footprints: Vec<u64> = catalog
        .sizes()
        .iter()
        .map(|&s| prefetcher::budget::round_up(s))
        .collect();
    let set = SampleSet {
        sizes: &footprints,
        labels: catalog.labels(),
        clusters: catalog.clusters(),
    };
    let plan_cfg = PlanConfig {
        strategy: cfg.compose,
        seed: cfg.seed,
        slot_bytes: status_u64(d, "slot_bytes"),
        mini_epochs: cfg.mini_epochs,
        node_rank: cfg.node_rank,
        nodes: cfg.nodes,
        cluster_copies: cfg.cluster_copies,
    };
    planner::plan_epoch(&set, &plan_cfg, epoch)
        .unwrap()
        .mini_epochs
        .iter()
        .map(|m| m.samples.iter().map(|&s| catalog.path(s)).collect())
        .collect()
}

fn keys(m: &BTreeMap<String, Vec<u8>>) -> BTreeSet<String> {
    m.keys().cloned().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_view_holds_exactly_the_planned_files_with_source_bytes() {
    let t = setup(1);
    let r = start(t.cfg.clone()).await;
    let d = &r.daemon;
    let plan = planned(&t.cfg, d, 0);
    assert!(plan.len() >= 3, "the test wants several mini-epochs");
    let view = read_view(&d.fs());
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
        let reply = tokio::time::timeout(
            Duration::from_secs(60),
            d.pass_end(None, Default::default(), true),
        )
        .await
        .unwrap_or_else(|_| panic!("pass_end {i} did not answer with the run directory blocked"))
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
    let first = d.pass_end(None, Default::default(), false).await.unwrap();
    assert_eq!(first.decision, Choice::Repeat, "{first:?}");
    assert_eq!(first.generation, g0);
    let second = d.pass_end(None, Default::default(), false).await.unwrap();
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
        let view = read_view(&d.fs());
        assert_eq!(keys(&view), plan[k], "files of mini-epoch {k}");
        check_bytes(&view, &t.source);
        for p in view.keys() {
            *served.entry(p.clone()).or_default() += 1;
        }
        seen_plan[k] = keys(&view);
        let g = status_u64(&d, "generation");
        let reply = d.advance(true).await.unwrap();
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
    let view = read_view(&d.fs());
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
        async move { d.pass_end(None, Default::default(), block).await.unwrap() }
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
    let events: Vec<metfs::protocol::Event> = log
        .lines()
        .map(|l| {
            serde_json::from_str::<metfs::protocol::Record>(l)
                .unwrap()
                .event
        })
        .collect();
    let stalls: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            metfs::protocol::Event::StallRf(s) => Some(s.clone()),
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
            metfs::protocol::Event::Switch(s) => Some(s.prev_rf),
            _ => None,
        })
        .collect();
    assert_eq!(prev_rfs, [2, passes, 2], "each switch's effective rf");
    drop(d);
    r.stop().await;
}

/// A `|` in the source path (the fingerprint was once a `|`-joined string split by position):
/// the mount resumes, and its rf history's dataset key is the same on another seed, which the
/// key leaves out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_path_with_bars_resumes_and_keeps_its_history_key() {
    let t = setup_in(1, BUDGET, "", "data|v2|x");
    let source = t.cfg.source.clone();
    assert!(source.ends_with("data|v2|x"), "{source}");
    let r = start(t.cfg.clone()).await;
    let d = r.daemon.clone();
    d.advance(true).await.unwrap();
    let before = d.status();
    drop(d);
    r.stop().await;

    let r = start(t.cfg.clone()).await;
    let after = r.daemon.status();
    assert_eq!(
        (after.epoch, after.mini_epoch, after.generation),
        (before.epoch, before.mini_epoch, before.generation),
        "the position after the restart"
    );
    assert_eq!(after.tier_bytes_read, 0, "the current slot was refetched");
    r.stop().await;

    // Another seed is another plan (a new run at epoch 0), but the same dataset for the history.
    let mut other = t.cfg.clone();
    other.seed += 1;
    let r = start(other).await;
    assert_eq!(
        (r.daemon.status().epoch, r.daemon.status().mini_epoch),
        (0, 0)
    );
    r.stop().await;

    let history: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&t.cfg.history).unwrap()).unwrap();
    let mut keys = BTreeSet::new();
    fn datasets(v: &serde_json::Value, out: &mut BTreeSet<String>) {
        match v {
            serde_json::Value::Object(m) => {
                if let (Some(serde_json::Value::String(d)), Some(_)) =
                    (m.get("dataset"), m.get("job"))
                {
                    out.insert(d.clone());
                }
                m.values().for_each(|x| datasets(x, out));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| datasets(x, out)),
            _ => {}
        }
    }
    datasets(&history, &mut keys);
    assert_eq!(keys.len(), 1, "one dataset key for both seeds: {keys:?}");
    let key = keys.into_iter().next().unwrap();
    let rest = key
        .strip_prefix(&format!("{source}|"))
        .unwrap_or_else(|| panic!("the key starts with the whole source path: {key}"));
    let slot_bytes: u64 = rest
        .split('|')
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("the field after the source is the slot's bytes: {key}"));
    assert!(slot_bytes > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_daemon_on_the_same_cache_resumes_without_refetching() {
    let t = setup(1);
    let r = start(t.cfg.clone()).await;
    let d = r.daemon.clone();
    d.advance(true).await.unwrap();
    // The successor of the new position, staged too, must survive the restart.
    wait_next_ready(&d).await;
    let before = d.status();
    let view_before = read_view(&d.fs());
    assert!(status_u64(&d, "tier_bytes_read") > 0);
    drop(d);
    r.stop().await;

    let r = start(t.cfg.clone()).await;
    let d = r.daemon.clone();
    let after = d.status();
    assert_eq!(
        (after.epoch, after.mini_epoch, after.generation),
        (before.epoch, before.mini_epoch, before.generation),
        "the position after the restart"
    );
    assert_eq!(after.tier_bytes_read, 0, "the current slot was refetched");
    let view_after = read_view(&d.fs());
    assert!(view_after == view_before, "the resumed view differs");
    check_bytes(&view_after, &t.source);
    // The successor is resumed from its journal, not fetched again, and the switch to it works.
    wait_next_ready(&d).await;
    assert_eq!(
        status_u64(&d, "tier_bytes_read"),
        0,
        "the successor was refetched"
    );
    let reply = d.advance(true).await.unwrap();
    assert_eq!(reply.decision, Choice::Advance);
    assert_eq!(reply.generation, before.generation + 1);
    check_bytes(&read_view(&d.fs()), &t.source);
    drop(d);
    r.stop().await;
}

/// Bytes the directory tree under `root` takes on disk (st_blocks * 512, each inode once);
/// entries that vanish while it is walked are skipped.
fn allocated(root: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    // Each inode once: a sample hard-linked into two slots is one file on disk.
    fn walk(p: &Path, seen: &mut BTreeSet<u64>) -> u64 {
        let Ok(md) = std::fs::symlink_metadata(p) else {
            return 0;
        };
        let mut total = if seen.insert(md.ino()) {
            md.blocks() * 512
        } else {
            0
        };
        if md.is_dir() {
            if let Ok(rd) = std::fs::read_dir(p) {
                for e in rd.flatten() {
                    total += walk(&e.path(), seen);
                }
            }
        }
        total
    }
    walk(root, &mut BTreeSet::new())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_never_exceeds_the_budget_across_switches() {
    let t = setup(1);
    // Sampled from before the daemon exists, through the first staging and every switch.
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (stop, peak, cache) = (stop.clone(), peak.clone(), t.cache.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(allocated(&cache), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let r = start(t.cfg.clone()).await;
    let d = r.daemon.clone();
    let nm = status_u64(&d, "mini_epochs");
    for _ in 0..nm + 1 {
        // Reading opens backing files, as a job does: their slot drains when they close.
        check_bytes(&read_view(&d.fs()), &t.source);
        d.advance(true).await.unwrap();
        wait_next_ready(&d).await;
        peak.fetch_max(allocated(&t.cache), Ordering::Relaxed);
    }
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let peak = peak.load(Ordering::Relaxed);
    // The cache must have held two slots at once for the check to mean anything.
    assert!(peak > status_u64(&d, "slot_bytes"), "peak {peak}");
    assert!(
        peak <= BUDGET,
        "the cache took {peak} bytes, over the budget of {BUDGET}"
    );
    drop(d);
    r.stop().await;
}

/// Bytes the staged files under `root` (not the journals) take on disk, each inode once however
/// many names it has (a hard-linked sample is one file in two slots).
fn allocated_once(root: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fn walk(p: &Path, seen: &mut BTreeSet<u64>, total: &mut u64) {
        let Ok(md) = std::fs::symlink_metadata(p) else {
            return;
        };
        if md.is_dir() {
            for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
                walk(&e.path(), seen, total);
            }
        } else if md.is_file()
            && p.extension().is_none_or(|x| x != "journal")
            && seen.insert(md.ino())
        {
            *total += md.blocks() * 512;
        }
    }
    let (mut seen, mut total) = (BTreeSet::new(), 0);
    walk(root, &mut seen, &mut total);
    total
}

/// Checks that `cache_bytes` counts each staged file once: it is the slots' files on disk
/// (each inode once) plus the small metadata files, never the linked files twice.
fn assert_cache_bytes_count_links_once(d: &Daemon, cache: &Path) {
    let counted = status_u64(d, "cache_bytes");
    let on_disk = allocated_once(&cache.join("slots"));
    assert!(
        counted >= on_disk && counted - on_disk < 1 << 20,
        "status counts {counted} bytes, the slots hold {on_disk} (each file once)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dataset_that_fits_one_slot_is_read_from_the_tier_once() {
    // 16 MiB: a slot holds ~7 MiB, the whole ~5 MiB dataset.
    let t = setup_full(1, 16 << 20, "");
    let dataset: u64 = t.source.values().map(|v| v.len() as u64).sum();
    let r = start(t.cfg.clone()).await;
    let d = r.daemon.clone();
    assert_eq!(status_u64(&d, "mini_epochs"), 1);
    for _ in 0..3 {
        wait_next_ready(&d).await;
        // Current and successor hold the same samples: the successor's are links.
        assert_cache_bytes_count_links_once(&d, &t.cache);
        assert_eq!(d.advance(true).await.unwrap().decision, Choice::Advance);
        check_bytes(&read_view(&d.fs()), &t.source);
    }
    wait_next_ready(&d).await;
    assert_eq!(status_u64(&d, "epoch"), 3);
    assert_eq!(
        status_u64(&d, "tier_bytes_read"),
        dataset,
        "samples already on the node were fetched again"
    );
    assert_eq!(status_u64(&d, "reused_bytes"), 4 * dataset);
    drop(d);
    r.stop().await;

    // After a restart, the successor is still taken from the node, not the tier.
    let slots = t.cache.join("slots");
    let journal = slots.join("e000004-m00000.journal");
    std::fs::remove_file(&journal).unwrap();
    std::fs::remove_dir_all(slots.join("e000004-m00000")).unwrap();
    let r = start(t.cfg.clone()).await;
    let d = r.daemon.clone();
    wait_next_ready(&d).await;
    assert_eq!(
        status_u64(&d, "tier_bytes_read"),
        0,
        "refetched after a restart"
    );
    assert_eq!(status_u64(&d, "reused_bytes"), dataset);
    assert_cache_bytes_count_links_once(&d, &t.cache);
    assert_eq!(d.advance(true).await.unwrap().decision, Choice::Advance);
    check_bytes(&read_view(&d.fs()), &t.source);
    // The old slot is gone now: its links are the new slot's alone, still counted.
    for _ in 0..300 {
        if d.status().draining_slots == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    wait_next_ready(&d).await;
    assert_cache_bytes_count_links_once(&d, &t.cache);
    assert!(status_u64(&d, "cache_bytes") <= 16 << 20);
    drop(d);
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dataset_that_fits_the_budget_but_not_one_slot_is_read_from_the_tier_once() {
    // 10 MiB: a slot holds ~4 MiB, so the ~5 MiB dataset makes two mini-epochs, which the
    // budget holds together: each epoch's (random) mini-epochs are all on the node already.
    let budget = 10 << 20;
    let t = setup_full(1, budget, "");
    let dataset: u64 = t.source.values().map(|v| v.len() as u64).sum();
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (stop, peak, cache) = (stop.clone(), peak.clone(), t.cache.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(allocated(&cache), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let r = start(t.cfg.clone()).await;
    let d = r.daemon.clone();
    assert_eq!(status_u64(&d, "mini_epochs"), 2);
    for _ in 0..6 {
        wait_next_ready(&d).await;
        assert_cache_bytes_count_links_once(&d, &t.cache);
        check_bytes(&read_view(&d.fs()), &t.source);
        assert_eq!(d.advance(true).await.unwrap().decision, Choice::Advance);
    }
    wait_next_ready(&d).await;
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    assert_eq!(status_u64(&d, "epoch"), 3);
    assert_eq!(
        status_u64(&d, "tier_bytes_read"),
        dataset,
        "a sample the budget could keep was fetched again"
    );
    let peak = peak.load(Ordering::Relaxed);
    assert!(
        peak <= budget,
        "the cache took {peak} bytes, over the budget of {budget}"
    );
    drop(d);
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_mount_shows_the_view_and_switches() {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: no /dev/fuse");
        return;
    }
    let t = setup(1);
    let mp = tempfile::tempdir().unwrap();
    let r = start(t.cfg.clone()).await;
    let d = r.daemon.clone();
    let adapter = metfs::fuse::FuseAdapter::new(d.fs(), d.active_read_path());
    let mut fcfg = fuser::Config::default();
    fcfg.mount_options = vec![
        fuser::MountOption::FSName("metfs".into()),
        fuser::MountOption::RO,
    ];
    let mpath = mp.path().to_path_buf();
    let (session, notifier) = tokio::task::spawn_blocking(move || {
        let s = fuser::Session::new(adapter, &mpath, &fcfg)?;
        let notifier = metfs::fuse::KernelNotifier::new(&s);
        s.spawn().map(|s| (s, notifier))
    })
    .await
    .unwrap()
    .expect("mount");
    d.mounted(mp.path(), notifier);

    let read_mount = |root: PathBuf| {
        tokio::task::spawn_blocking(move || {
            let mut out = BTreeMap::new();
            let mut stack = vec![root.clone()];
            while let Some(dir) = stack.pop() {
                for e in std::fs::read_dir(&dir).unwrap() {
                    let p = e.unwrap().path();
                    if p.is_dir() {
                        stack.push(p);
                    } else {
                        let rel = p.strip_prefix(&root).unwrap().display().to_string();
                        out.insert(rel, std::fs::read(&p).unwrap());
                    }
                }
            }
            out
        })
    };
    let plan = planned(&t.cfg, &d, 0);
    let view = read_mount(mp.path().to_path_buf()).await.unwrap();
    assert_eq!(keys(&view), plan[0], "files through the mount");
    check_bytes(&view, &t.source);
    d.advance(true).await.unwrap();
    let view = read_mount(mp.path().to_path_buf()).await.unwrap();
    assert_eq!(
        keys(&view),
        plan[1],
        "files through the mount after the switch"
    );
    check_bytes(&view, &t.source);

    tokio::task::spawn_blocking(move || session.umount_and_join())
        .await
        .unwrap()
        .expect("unmount");
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
    assert_eq!(d.session_names(), vec![DEFAULT_SESSION.to_string()]);
    assert_eq!(d.status_of(DEFAULT_SESSION).unwrap().generation, 1);
    for e in [
        d.status_of("trial-7").unwrap_err(),
        d.advance_in("trial-7", false).await.unwrap_err(),
        d.pass_end_in("trial-7", None, Default::default(), false)
            .await
            .unwrap_err(),
        d.apply_in("trial-7", 0, 1, false).await.unwrap_err(),
    ] {
        assert!(e.to_string().contains("`trial-7`"), "{e}");
    }
    assert_eq!(status_u64(&d, "generation"), 1);
    let reply = d.advance_in(DEFAULT_SESSION, true).await.unwrap();
    assert_eq!(reply.decision, Choice::Advance);
    assert_eq!(status_u64(&d, "generation"), 2);
    drop(d);
    r.stop().await;
}

/// A notification the daemon sent to the kernel's caches.
#[derive(Debug, Clone, PartialEq)]
enum Notified {
    Entry(u64, String),
    Inode(u64),
    Prune(Vec<u64>),
}

/// The kernel's caches as a recorder: every call the daemon makes, in order. `prune` fails as
/// on a kernel before 6.18 when `no_prune` is set.
#[derive(Clone, Default)]
struct Recorder {
    calls: Arc<std::sync::Mutex<Vec<Notified>>>,
    no_prune: bool,
}

impl Recorder {
    fn calls(&self) -> Vec<Notified> {
        self.calls.lock().unwrap().clone()
    }
}

impl KernelCache for Recorder {
    fn inval_entry(&self, parent: u64, name: &str) -> std::io::Result<()> {
        let call = Notified::Entry(parent, name.to_string());
        self.calls.lock().unwrap().push(call);
        Ok(())
    }
    fn inval_inode(&self, ino: u64) -> std::io::Result<()> {
        self.calls.lock().unwrap().push(Notified::Inode(ino));
        Ok(())
    }
    fn prune(&self, inodes: &[u64]) -> std::io::Result<()> {
        self.calls
            .lock()
            .unwrap()
            .push(Notified::Prune(inodes.to_vec()));
        if self.no_prune {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        Ok(())
    }
}

/// Waits (bounded) until `cond` holds.
async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) -> Result<(), String> {
    for _ in 0..1000 {
        if cond() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err(format!("{what}: not within 10 s"))
}

/// A switch drops the kernel's cached root entries of the old view, then the root's inode,
/// before `advance` answers: by then every new lookup resolves in the new view.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_invalidates_the_old_roots_entries_before_it_answers() {
    let t = setup_with(1, "read_path = \"pread\"");
    let r = start(t.cfg.clone()).await;
    let d = r.daemon.clone();
    let kernel = Recorder::default();
    let mp = tempfile::tempdir().unwrap();
    d.mounted(mp.path(), kernel.clone());
    let old_names = d.fs().current().root_names();
    assert!(!old_names.is_empty());
    assert!(kernel.calls().is_empty(), "nothing is sent before a switch");
    let reply = d.advance(true).await.unwrap();
    assert_eq!(reply.decision, Choice::Advance);
    let mut want: Vec<Notified> = old_names
        .into_iter()
        .map(|n| Notified::Entry(ROOT_INO, n))
        .collect();
    want.push(Notified::Inode(ROOT_INO));
    assert_eq!(kernel.calls(), want);
    drop(d);
    r.stop().await;
}

/// On the cached read path the kernel's references pin a retired view: after the switch the
/// daemon prunes the inodes of the old view the kernel still holds, the file before its
/// directory, until they are forgotten; then the view drains and its slot is evicted. A kernel
/// without prune gets the entry invalidated by name instead (never a root entry the current
/// view also has), and is not asked to prune again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_view_held_by_the_kernel_is_pruned_until_it_drains() {
    for no_prune in [false, true] {
        let t = setup_with(1, "read_path = \"cached\"");
        let r = start(t.cfg.clone()).await;
        let d = r.daemon.clone();
        let kernel = Recorder {
            no_prune,
            ..Default::default()
        };
        let mp = tempfile::tempdir().unwrap();
        d.mounted(mp.path(), kernel.clone());
        // The kernel looks up a directory and a file in it, and keeps both.
        let fs = d.fs();
        let old = fs.current();
        // `cats` and `dogs` hold files only (`birds` holds directories).
        let dir_name = ["cats", "dogs"]
            .into_iter()
            .find(|n| old.root_names().iter().any(|r| r == n))
            .expect("cats or dogs in the first view")
            .to_string();
        let dir = fs.lookup(ROOT_INO, &dir_name).unwrap();
        let fh = fs.opendir(dir.ino).unwrap();
        let mut file_name = None;
        fs.readdir(dir.ino, fh, 0, false, |e| {
            if e.name != "." && e.name != ".." && file_name.is_none() {
                file_name = Some(e.name.to_string());
            }
            false
        })
        .unwrap();
        fs.release(fh);
        let file_name = file_name.expect("a file in the directory");
        let file = fs.lookup(dir.ino, &file_name).unwrap();
        assert!(!file.is_dir);
        d.advance(true).await.unwrap();
        assert_eq!(status_u64(&d, "draining_slots"), 1, "the old view is held");
        let pruned = |calls: &[Notified]| {
            calls
                .iter()
                .any(|c| matches!(c, Notified::Prune(inos) if inos == &vec![file.ino, dir.ino]))
        };
        if no_prune {
            let entry = Notified::Entry(dir.ino, file_name.clone());
            wait_for("the file's entry invalidated by name", || {
                kernel.calls().contains(&entry)
            })
            .await
            .unwrap_or_else(|e| panic!("{e}: {:?}", kernel.calls()));
            let calls = kernel.calls();
            let prunes = calls
                .iter()
                .filter(|c| matches!(c, Notified::Prune(_)))
                .count();
            assert_eq!(prunes, 1, "asked to prune again after it failed: {calls:?}");
            // After the switch's own invalidations (which end with the root's inode), no
            // root entry the current view also has is invalidated.
            let switch_end = calls
                .iter()
                .position(|c| c == &Notified::Inode(ROOT_INO))
                .unwrap();
            let current = fs.current().root_names();
            for c in &calls[switch_end..] {
                if let Notified::Entry(ROOT_INO, name) = c {
                    assert!(
                        !current.contains(name),
                        "{name}: the current view's entry was invalidated"
                    );
                }
            }
        } else {
            wait_for("the held inodes pruned", || pruned(&kernel.calls()))
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "{e}: {:?} (file {}, dir {})",
                        kernel.calls(),
                        file.ino,
                        dir.ino
                    )
                });
        }
        // The kernel forgets them: the view drains and its slot goes.
        fs.forget(file.ino, 1);
        fs.forget(dir.ino, 1);
        wait_for("the retired view evicted", || {
            status_u64(&d, "draining_slots") == 0
        })
        .await
        .unwrap();
        drop((fs, old));
        drop(d);
        r.stop().await;
    }
}

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
            d.pass_end(None, Default::default(), false).await.unwrap();
        }
    }
    r.stop().await;
    let mut cfg = t.cfg.clone();
    cfg.seed = 8;
    cfg.policy.kind = feedback::config::PolicyKind::Learned;
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
    let first = d.pass_end(None, metrics, false).await.unwrap();
    let reason = first.reason.expect("a policy decision has a reason");
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
                d.pass_end(None, sent, false).await.unwrap();
            }
        }
        r.stop().await;
    }
    let learned = |metric: &str| {
        let mut cfg = t.cfg.clone();
        cfg.reset = true;
        cfg.policy.kind = feedback::config::PolicyKind::Learned;
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
