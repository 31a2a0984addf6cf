//! What the coded plan of one epoch costs as the node count grows, beside the uncoded plan.
//!
//! For each node count and samples per node: ImageNet-like sizes (lognormal, mean ~110 KiB),
//! `--shuffle-extra p = 1/(n − 1)` (a node holds about two shares: its own and as much
//! again of the rest, the side information coding feeds on) within a budget of three shares
//! (so the budget does not cut the extras), and the exchange's 4 KiB block. Two pipelines, each from epoch 0's layout (built outside the measurement):
//!
//! * **uncoded**: epoch 1's layout and the transition (what `metfs-shuffle` plans for
//!   `--shuffle-code uncoded`); its entries are the samples that move.
//! * **coded**: the same, then the demands, the carpool in peers mode and each packet's
//!   sender (what it plans for `uberShuffle`, `--sender peers`, the default).
//!
//! Time is wall time of one run; *peak* is the most bytes allocated at once during the
//! pipeline above what was live before it, counted by this program's global allocator (so
//! it is exact for the plan's heap, and ignores the allocator's own slack). The §2.2 tables
//! (count, entries, bytes: `Vec` capacities, not lengths) are built apart, untimed. Beside
//! them, `metfs_shuffle::coded::estimate`'s closed-form count, which a mount computes before
//! planning; past [`metfs_shuffle::MAX_NODES`] or `--max-points` only the estimate is printed.
//!
//! `cargo run --release -p metfs-shuffle --example coded_scale [-- --quick] [--nodes 8,64]
//! [--per-node 1000,10000] [--max-points N] [--extra P]`; `cargo test -p metfs-shuffle --example coded_scale`
//! runs `--quick` (seconds).

use std::alloc::{GlobalAlloc, Layout as Alloc, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use metfs_shuffle::coded::estimate::{self, Estimate, MAX_POINTS};
use metfs_shuffle::coded::{carpool, demands, tables, Sender, Table};
use metfs_shuffle::plan::{layout, transition, AggregateConfig, Layout, Transition};
use metfs_shuffle::MAX_NODES;

/// The exchange's coding block (`metfs_exchange::coded::BLOCK`).
const BLOCK: u32 = 4096;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting the bytes live and their peak.
struct Counting;

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Alloc) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            grew(l.size());
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Alloc) {
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, l: Alloc, size: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, l, size) };
        if !q.is_null() {
            LIVE.fetch_sub(l.size(), Ordering::Relaxed);
            grew(size);
        }
        q
    }
}

fn grew(size: usize) {
    let now = LIVE.fetch_add(size, Ordering::Relaxed) + size;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Starts a peak measurement: returns the bytes live now.
fn start() -> usize {
    let live = LIVE.load(Ordering::Relaxed);
    PEAK.store(live, Ordering::Relaxed);
    live
}

/// Seconds and peak bytes of `f` (above what was live before it).
fn measure<T>(f: impl FnOnce() -> T) -> (T, f64, usize) {
    let base = start();
    let t0 = Instant::now();
    let out = f();
    let secs = t0.elapsed().as_secs_f64();
    (out, secs, PEAK.load(Ordering::Relaxed) - base)
}

struct Args {
    nodes: Vec<u32>,
    per_node: Vec<u64>,
    max_points: u64,
    /// `--extra P`: this `p` at every node count, within a budget of the whole dataset.
    extra: Option<f64>,
}

impl Args {
    fn quick() -> Self {
        Self {
            nodes: vec![8, 64, 256, 1024],
            per_node: vec![50],
            max_points: 200_000,
            extra: None,
        }
    }

    fn parse() -> Self {
        let mut a = Self {
            nodes: vec![8, 64, 128, 256, 1024],
            per_node: vec![1_000, 10_000],
            max_points: 4 * MAX_POINTS,
            extra: None,
        };
        let list = |v: Option<String>| -> Vec<u64> {
            v.expect("a value")
                .split(',')
                .map(|x| x.trim().parse().expect("a number"))
                .collect()
        };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            match flag.as_str() {
                "--quick" => a = Self::quick(),
                "--nodes" => a.nodes = list(it.next()).into_iter().map(|n| n as u32).collect(),
                "--per-node" => a.per_node = list(it.next()),
                "--max-points" => a.max_points = list(it.next())[0],
                "--extra" => a.extra = it.next().and_then(|p| p.parse().ok()),
                other => panic!("unknown argument {other}"),
            }
        }
        if a.nodes.contains(&0) {
            eprintln!("coded_scale: a node count of 0 cannot be planned (--nodes needs 1 or more)");
            std::process::exit(2);
        }
        a
    }
}

/// ImageNet-like sizes: lognormal, σ = 0.5, mean ~110 KiB, at least 1 KiB (splitmix64).
fn sizes(q: u64, seed: u64) -> Vec<u64> {
    let mut s = seed;
    let mut next = || {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    let (sigma, mean) = (0.5f64, 110.0f64 * 1024.0);
    let mu = mean.ln() - sigma * sigma / 2.0;
    (0..q)
        .map(|_| {
            let (u, v) = (next().max(1e-300), next());
            let z = (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos();
            ((mu + sigma * z).exp() as u64).max(1024)
        })
        .collect()
}

/// One row of the table.
struct Row {
    nodes: u32,
    samples: u64,
    est: Estimate,
    uncoded: (u64, usize, f64, usize),
    coded: Option<Coded>,
}

/// The measured coded plan: tables, entries, table bytes, packets, secs, peak.
struct Coded {
    tables: usize,
    entries: u64,
    table_bytes: usize,
    packets: usize,
    secs: f64,
    peak: usize,
}

fn transition_bytes(t: &Transition) -> usize {
    t.nodes
        .iter()
        .map(|p| p.local.capacity() * 4 + p.peer.capacity() * 8 + p.tier.capacity() * 4)
        .sum()
}

fn table_bytes(t: &Table) -> usize {
    std::mem::size_of::<Table>()
        + t.columns
            .iter()
            .map(|c| std::mem::size_of_val(c) + c.capacity() * 8)
            .sum::<usize>()
}

fn coded(a: &Layout, sizes: &[u64], cfg: &AggregateConfig) -> Coded {
    let ((demands, packets), secs, peak) = measure(|| {
        let b = layout(sizes, cfg, 1).expect("layout");
        let t = transition(Some(a), &b, sizes, &[]).expect("transition");
        let d = demands(a, &t, sizes).expect("demands");
        let c = carpool(&d, BLOCK, Sender::Peers).expect("carpool");
        metfs_shuffle::wire::coded_peers(&c, &d, cfg.nodes).expect("senders");
        (d, c.packets.len())
    });
    let t = tables(&demands, BLOCK).expect("tables");
    Coded {
        tables: t.tables.len(),
        entries: t.points,
        table_bytes: t.tables.iter().map(table_bytes).sum(),
        packets,
        secs,
        peak,
    }
}

fn row(nodes: u32, per_node: u64, args: &Args) -> Row {
    let s = sizes(u64::from(nodes) * per_node, 7);
    let total: u64 = s.iter().sum();
    let largest = s.iter().copied().max().unwrap_or(0);
    let cfg = match args.extra {
        Some(extra) => AggregateConfig {
            nodes,
            seed: 7,
            budget: total,
            extra,
        },
        None => AggregateConfig {
            nodes,
            seed: 7,
            budget: 3 * total.div_ceil(u64::from(nodes)) + 2 * largest,
            extra: if nodes > 1 {
                1.0 / f64::from(nodes - 1)
            } else {
                0.0
            },
        },
    };
    let est = estimate::estimate(&s, nodes, cfg.extra, cfg.budget, BLOCK).expect("estimate");
    let a = layout(&s, &cfg, 0).expect("layout");
    let ((moved, bytes), secs, peak) = measure(|| {
        let b = layout(&s, &cfg, 1).expect("layout");
        let t = transition(Some(&a), &b, &s, &[]).expect("transition");
        let moved: usize = t.nodes.iter().map(|p| p.peer.len()).sum();
        (moved as u64, transition_bytes(&t))
    });
    let coded =
        (nodes <= MAX_NODES && est.points <= args.max_points as f64).then(|| coded(&a, &s, &cfg));
    Row {
        nodes,
        samples: s.len() as u64,
        est,
        uncoded: (moved, bytes, secs, peak),
        coded,
    }
}

fn mib(b: f64) -> String {
    format!("{:.1}", b / (1u64 << 20) as f64)
}

fn print(r: &Row) {
    let (moved, bytes, usecs, upeak) = r.uncoded;
    let e = &r.est;
    let (measured, ratio) = match &r.coded {
        Some(c) => (
            format!(
                "{} | {} | {} | {} | {:.2} | {}",
                c.tables,
                c.entries,
                mib(c.table_bytes as f64),
                c.packets,
                c.secs,
                mib(c.peak as f64)
            ),
            format!(
                "{:.0}x | {:.0}x",
                c.secs / usecs.max(1e-9),
                c.peak as f64 / upeak.max(1) as f64
            ),
        ),
        None => (
            format!(
                "({:.0}) | ({:.0}) | ({}) | — | ({:.0}) | ({})",
                e.tables,
                e.points,
                mib(e.table_bytes),
                e.plan_secs(),
                mib(e.peak_bytes())
            ),
            format!(
                "({:.0}x) | ({:.0}x)",
                e.plan_secs() / usecs.max(1e-9),
                e.peak_bytes() / upeak.max(1) as f64
            ),
        ),
    };
    println!(
        "| {} | {} | {:.4} | {:.0} | {:.0} | {} | {:.1} | {measured} | {moved} | {} | {usecs:.2} \
         | {} | {ratio} | {} |",
        r.nodes,
        r.samples,
        e.p,
        e.tables,
        e.points,
        mib(e.table_bytes),
        e.plan_secs(),
        mib(bytes as f64),
        mib(upeak as f64),
        if estimate::check(*e).is_ok() {
            "plans"
        } else {
            "refused"
        },
    )
}

fn run(args: &Args) -> Vec<Row> {
    println!("# Coded (uberShuffle, peers) against uncoded plan of one epoch, 4 KiB blocks\n");
    println!(
        "Parenthesised: not planned (past {MAX_NODES} nodes or --max-points), the estimate.\n"
    );
    println!(
        "| nodes | samples | p | est. tables | est. entries | est. table MiB | est. s | tables | entries \
         | table MiB | packets | coded s | coded peak MiB | uncoded entries | uncoded MiB \
         | uncoded s | uncoded peak MiB | time ratio | peak ratio | mount |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for &per_node in &args.per_node {
        for &n in &args.nodes {
            let r = row(n, per_node, args);
            print(&r);
            rows.push(r);
        }
    }
    rows
}

fn main() {
    run(&Args::parse());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--quick`: the whole pipeline at each node count, and the estimate within 10% of
    /// the tables and entries wherever the plan was built.
    #[test]
    fn quick() {
        let rows = run(&Args::quick());
        assert_eq!(rows.len(), 4);
        for r in &rows {
            let Some(c) = &r.coded else {
                assert!(r.nodes > MAX_NODES, "{} nodes were not planned", r.nodes);
                continue;
            };
            let near = |est: f64, real: f64| (est - real).abs() <= 0.1 * real + 10.0;
            assert!(near(r.est.tables, c.tables as f64), "{} nodes", r.nodes);
            assert!(near(r.est.points, c.entries as f64), "{} nodes", r.nodes);
        }
    }
}
