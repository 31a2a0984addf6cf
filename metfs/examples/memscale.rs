//! The daemon's memory per catalogued file, structure by structure, without a mount: builds
//! what a daemon holds for a dataset of N files with both views live (the catalog, the store's
//! footprints, the plans of two epochs, the store's members of two slots, the current view and
//! the next one) and prints each structure's heap bytes per catalogued file, counted by a
//! counting allocator, and the process's RSS. Then times lookups and readdirs of the views.
//!
//! usage: memscale [--files N] [--per-dir 1000] [--manifest FILE] [--lookups 1000000]
//!
//! Without `--manifest` the catalog is N files in directories of `--per-dir`, as a POSIX
//! listing gives them (`d00000/f0000000.bin`, a size of 1-4 KiB, the mtime as the version,
//! the source's metadata), labelled by first directory as an ImageFolder tree is. With it, the
//! manifest is loaded as `metfs mount --manifest` loads it (`benches/gen_manifest.py` writes
//! one). Either way the plan has two mini-epochs per epoch (`random`), so each view holds half
//! of the catalogued files, as in `benches/scale.py`; RSS is read after `malloc_trim`, which
//! the daemon also calls after building a catalog or a view.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use metfs_fs::view::View;
use metfs_plan::budget::Staged;
use metfs_plan::planner::{plan_epoch, PlanConfig, SampleSet, Strategy};
use metfs_tier::catalog::{Catalog, CatalogBuilder, Meta};

/// The system allocator, counting the bytes live and the most ever live.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; the counters are atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = System.alloc(l);
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l);
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let q = System.realloc(p, l, new);
        if !q.is_null() {
            let now = LIVE.fetch_add(new, Ordering::Relaxed) + new - l.size();
            LIVE.fetch_sub(l.size(), Ordering::Relaxed);
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

fn rss() -> u64 {
    // SAFETY: malloc_trim only returns free heap pages to the kernel.
    unsafe { libc::malloc_trim(0) };
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

struct Args {
    files: usize,
    per_dir: usize,
    manifest: Option<String>,
    lookups: usize,
}

fn args() -> Args {
    let mut a = Args {
        files: 1_000_000,
        per_dir: 1000,
        manifest: None,
        lookups: 1_000_000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().expect("a value after each flag");
        match k.as_str() {
            "--files" => a.files = v().parse().expect("--files N"),
            "--per-dir" => a.per_dir = v().parse().expect("--per-dir N"),
            "--manifest" => a.manifest = Some(v()),
            "--lookups" => a.lookups = v().parse().expect("--lookups N"),
            _ => panic!("unknown argument {k}; see the module doc"),
        }
    }
    a
}

fn synthetic(files: usize, per_dir: usize) -> Catalog {
    let mut b = CatalogBuilder::with_capacity(files);
    let mut path = String::new();
    for i in 0..files {
        use std::fmt::Write;
        path.clear();
        write!(path, "d{:05}/f{i:07}.bin", i / per_dir).unwrap();
        let mtime = 1_700_000_000_000_000_000i64 + i as i64 * 1_000_003;
        let version = mtime.to_string();
        b.push(&path, 1024 + (i as u64 * 7919) % 3072, &version, None, None)
            .expect("a clean path");
        b.push_meta(Some(Meta {
            mode: 0o644,
            uid: 1000,
            gid: 1000,
            mtime_ns: mtime,
            ctime_ns: mtime,
        }));
    }
    let mut c = b.finish("/tier").expect("unique paths");
    c.label_by_first_dir();
    c
}

/// One row: what a structure adds to the heap, per catalogued file.
fn row(what: &str, bytes: usize, files: usize) {
    println!(
        "{what:<44} {:>9.1} MiB {:>7.1} B/file",
        bytes as f64 / (1 << 20) as f64,
        bytes as f64 / files as f64
    );
}

fn main() {
    let a = args();
    let base_rss = rss();
    let t = Instant::now();
    let before = live();
    let catalog = Arc::new(match &a.manifest {
        Some(m) => {
            let mut c =
                metfs_prefetcher::manifest::load_catalog(Path::new(m)).expect("the manifest");
            if c.labels().is_none() {
                c.label_by_first_dir();
            }
            c
        }
        None => synthetic(a.files, a.per_dir),
    });
    let n = catalog.len();
    let catalog_bytes = live() - before;
    let catalog_peak = PEAK.load(Ordering::Relaxed);
    println!(
        "{n} catalogued files in {} directories, built in {:.1} s (heap peak {:.0} MiB)",
        catalog.dir_count(),
        t.elapsed().as_secs_f64(),
        catalog_peak as f64 / (1 << 20) as f64
    );
    row("catalog", catalog_bytes, n);

    let before = live();
    let footprints = metfs_plan::budget::footprints(catalog.sizes(), Staged::Copy);
    row("store: footprints", live() - before, n);

    let total: u64 = footprints.iter().sum();
    let cfg = PlanConfig {
        strategy: Strategy::Random,
        seed: 7,
        slot_bytes: total / 2 + total / 100 + 4096,
        mini_epochs: Some(2),
        node_rank: 0,
        nodes: 1,
        cluster_copies: Default::default(),
    };
    let set = SampleSet {
        sizes: &footprints,
        labels: catalog.labels(),
        clusters: catalog.clusters(),
    };
    let before = live();
    let plans: Vec<_> = (0..2)
        .map(|e| Arc::new(plan_epoch(&set, &cfg, e).expect("a plan")))
        .collect();
    row("plans of two epochs", live() - before, n);

    // The store's book keeps each slot's members, as the session hands them over.
    let before = live();
    let members: Vec<Arc<Vec<u32>>> = plans[0]
        .mini_epochs
        .iter()
        .map(|m| Arc::new(m.samples.clone()))
        .collect();
    row("store: members of two slots", live() - before, n);

    let mut views = Vec::new();
    for (k, m) in plans[0].mini_epochs.iter().enumerate() {
        PEAK.store(live(), Ordering::Relaxed);
        let before = live();
        let t = Instant::now();
        let v = View::build(
            &catalog,
            &m.samples,
            k as u64 + 1,
            0,
            k as u32,
            &format!("e0-m{k}"),
            Path::new("/cache/slots/e0-m0"),
        );
        let built = t.elapsed().as_secs_f64();
        let peak = PEAK.load(Ordering::Relaxed) - before;
        row(
            &format!("view {k} ({} files, {built:.2} s)", v.file_count()),
            live() - before,
            n,
        );
        println!(
            "{:<44} {:>9.1} MiB {:>7.1} B/file",
            "  its build's peak",
            peak as f64 / (1 << 20) as f64,
            peak as f64 / n as f64
        );
        views.push(v);
    }

    let heap = live();
    let r = rss();
    println!();
    row("heap, all live", heap, n);
    row("RSS (after malloc_trim)", r as usize, n);
    row("RSS less the process before", (r - base_rss) as usize, n);

    // Lookups: each file of the current view by its path from the root, in a random order,
    // as a cold walk of a sample does; readdir: every directory listed with its names.
    let v = &views[0];
    let paths = v.file_paths();
    let mut order: Vec<usize> = (0..paths.len()).collect();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in (1..order.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let count = a.lookups.min(order.len());
    let t = Instant::now();
    let mut found = 0usize;
    for &i in &order[..count] {
        let mut node = 0;
        for part in paths[i].split('/') {
            node = v.lookup(node, part).expect("a file of the view");
        }
        found += v.file_size(node) as usize & 1;
    }
    let lookup_ns = t.elapsed().as_nanos() as f64 / count.max(1) as f64;
    let t = Instant::now();
    let mut listed = 0usize;
    let mut stack = vec![0u32];
    while let Some(d) = stack.pop() {
        for c in v.children(d).expect("a directory") {
            listed += v.name(c).len();
            if v.children(c).is_ok() {
                stack.push(c);
            }
        }
    }
    let readdir_ns = t.elapsed().as_nanos() as f64 / v.file_count().max(1) as f64;
    println!(
        "lookup of a file by its path: {lookup_ns:.0} ns ({count} files); readdir: {readdir_ns:.1} ns per entry ({found} {listed})"
    );
    drop(views);
    drop(members);
    drop(plans);
}
