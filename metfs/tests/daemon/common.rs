//! Shared fixtures of the daemon tests: a generated source tree and its tier, cache and
//! configuration, a started daemon and its shutdown, walks of the view through `FsCore`, the
//! planner's expected mini-epochs, on-disk accounting of the cache, and a recording kernel cache.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use metfs::config::MountConfig;
use metfs::daemon::{Daemon, KernelCache};
use metfs_fs::fs::FsCore;
use metfs_fs::view::ROOT_INO;
use metfs_plan::planner::{self, PlanConfig, SampleSet};
use metfs_tier::catalog::Catalog;
use tokio::task::JoinHandle;

/// Budget of every test: with ~1.7 MiB of reserve, a slot holds ~1.1 MiB, so the ~5 MiB
/// dataset makes several mini-epochs.
pub(crate) const BUDGET: u64 = 4 << 20;

/// A source tree of generated files with sizes from a few bytes to ~90 KiB (many not a
/// multiple of the 4 KiB block), in nested directories; returns each relative path's bytes.
pub(crate) fn make_source(root: &Path) -> BTreeMap<String, Vec<u8>> {
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
pub(crate) struct Setup {
    _dirs: tempfile::TempDir,
    pub(crate) source: BTreeMap<String, Vec<u8>>,
    pub(crate) cache: PathBuf,
    pub(crate) cfg: MountConfig,
}

pub(crate) fn setup(rf: u32) -> Setup {
    setup_with(rf, "")
}

/// As [`setup`], with more lines of the TOML configuration.
pub(crate) fn setup_with(rf: u32, extra_toml: &str) -> Setup {
    setup_full(rf, BUDGET, extra_toml)
}

/// As [`setup`], with another budget and more lines of the TOML configuration.
pub(crate) fn setup_full(rf: u32, budget: u64, extra_toml: &str) -> Setup {
    setup_in(rf, budget, extra_toml, "src")
}

/// As [`setup_full`], with the source directory named `source_dir`.
pub(crate) fn setup_in(rf: u32, budget: u64, extra_toml: &str, source_dir: &str) -> Setup {
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
pub(crate) struct Running {
    pub(crate) daemon: Arc<Daemon>,
    lock: std::fs::File,
    tasks: Vec<JoinHandle<()>>,
}

pub(crate) async fn start(cfg: MountConfig) -> Running {
    let (daemon, lock) = Daemon::prepare(cfg, false).await.expect("prepare");
    run(daemon, lock)
}

/// Starts a prepared daemon's background tasks, as [`start`] does after `prepare`.
pub(crate) fn run(daemon: Arc<Daemon>, lock: std::fs::File) -> Running {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    daemon.surface().fs().set_drained_sender(tx);
    let tasks = daemon.start_tasks(rx);
    Running {
        daemon,
        lock,
        tasks,
    }
}

impl Running {
    /// Shuts down as `metfs` does on SIGTERM, then ends the tasks as the process exit would,
    /// and releases the cache lock.
    pub(crate) async fn stop(self) {
        self.daemon.life().begin_shutdown();
        self.daemon.persist();
        let d = self.daemon.clone();
        let _ = tokio::task::spawn_blocking(move || d.store().seal_slots()).await;
        for t in self.tasks {
            t.abort();
            let _ = t.await;
        }
        drop(self.daemon);
        drop(self.lock);
    }
}

/// A field of the status by its protocol name.
pub(crate) fn status_u64(d: &Daemon, key: &str) -> u64 {
    serde_json::to_value(d.status()).unwrap()[key]
        .as_u64()
        .unwrap_or_else(|| panic!("status has no integer `{key}`"))
}

/// Waits (bounded) until the successor mini-epoch is staged.
pub(crate) async fn wait_next_ready(d: &Daemon) {
    for _ in 0..3000 {
        if d.status().next_ready {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the successor was not staged in 30 s: {:?}", d.status());
}

/// Every file of the current view with its bytes, walked as the kernel would.
pub(crate) fn read_view(fs: &FsCore) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    walk(fs, ROOT_INO, "", &mut out);
    out
}

pub(crate) fn walk(fs: &FsCore, dir: u64, prefix: &str, out: &mut BTreeMap<String, Vec<u8>>) {
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
            let opened = fs.open(attr.ino, 0).unwrap();
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
pub(crate) fn check_bytes(view: &BTreeMap<String, Vec<u8>>, source: &BTreeMap<String, Vec<u8>>) {
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
pub(crate) fn planned(cfg: &MountConfig, d: &Daemon, epoch: u64) -> Vec<BTreeSet<String>> {
    let catalog = Catalog::load(&d.paths.catalog).unwrap();
    let footprints = metfs_plan::budget::footprints(catalog.sizes(), cfg.transform.staged());
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

pub(crate) fn keys(m: &BTreeMap<String, Vec<u8>>) -> BTreeSet<String> {
    m.keys().cloned().collect()
}

/// Bytes the directory tree under `root` takes on disk (st_blocks * 512, each inode once);
/// entries that vanish while it is walked are skipped.
pub(crate) fn allocated(root: &Path) -> u64 {
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

/// Bytes the staged files under `root` (not the journals) take on disk, each inode once however
/// many names it has (a hard-linked sample is one file in two slots).
pub(crate) fn allocated_once(root: &Path) -> u64 {
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
pub(crate) fn assert_cache_bytes_count_links_once(d: &Daemon, cache: &Path) {
    let counted = status_u64(d, "cache_bytes");
    let on_disk = allocated_once(&cache.join("slots"));
    assert!(
        counted >= on_disk && counted - on_disk < 1 << 20,
        "status counts {counted} bytes, the slots hold {on_disk} (each file once)"
    );
}

/// A notification the daemon sent to the kernel's caches.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Notified {
    Entry(u64, String),
    Inode(u64),
    Prune(Vec<u64>),
}

/// The kernel's caches as a recorder: every call the daemon makes, in order. `prune` fails as
/// on a kernel before 6.18 when `no_prune` is set.
#[derive(Clone, Default)]
pub(crate) struct Recorder {
    pub(crate) calls: Arc<std::sync::Mutex<Vec<Notified>>>,
    pub(crate) no_prune: bool,
}

impl Recorder {
    pub(crate) fn calls(&self) -> Vec<Notified> {
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
pub(crate) async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) -> Result<(), String> {
    for _ in 0..1000 {
        if cond() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err(format!("{what}: not within 10 s"))
}

/// The default session's pass end with no metrics or signals: what a job that reports nothing
/// sends (`block`: wait for the successor rather than take a bonus pass).
pub(crate) async fn bare_pass_end(
    d: &Daemon,
    block: bool,
) -> Result<metfs_protocol::Decision, metfs_protocol::ProtocolError> {
    d.pass_end(
        metfs::daemon::DEFAULT_SESSION,
        None,
        Default::default(),
        Default::default(),
        block,
    )
    .await
}
