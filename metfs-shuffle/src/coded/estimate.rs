//! What the coded plan of one epoch will cost, in closed form, before planning it; and the
//! limits past which a mount refuses `uberShuffle` instead of planning for an hour.
//!
//! # The count (paper 002's model, as the planner draws it)
//!
//! Between two epochs a sample moves to its new owner `i` when `i` is not its old owner
//! `o` (probability `1 − 1/n`) and `i` did not keep it as an extra (`1 − p`): the demands
//! are `D = Σ_j (1 − 1/n)(1 − p)` and their points (blocks of `B` bytes, the tables'
//! entries) `E = (1 − 1/n)(1 − p) Σ_j ⌈len_j / B⌉`. A demand's table is `{i, o}` plus each of
//! the other `n − 2` nodes with probability `p` (its extras do not depend on the epoch), so
//! a given table `T` of `m` nodes receives a demand with probability
//! `π_m = m(m − 1)/(n(n − 1)) · p^(m−2) (1 − p)^(n−m)`, and the expected number of distinct
//! tables is `Σ_m C(n, m) (1 − (1 − π_m)^D)`: at `p = 0` at most `n(n − 1)/2` pairs, at
//! `p > 0` and many nodes nearly one table per demand. `p` is the setting, cut to what the
//! budget leaves beside the share (`(budget − T/n)/(T − T/n)` of the rest of the dataset).
//! A unit test compares the count with the tables the planner builds, over node counts,
//! sample counts and `p`.
//!
//! # The limits: points, planning time, and the nodes a [`crate::NodeSet`] holds
//!
//! Every rank computes the whole plan every epoch, one point per block that moves, and the
//! carpool keeps per point its entry in the tables, a sort key and its place in a row; so
//! memory grows with `E` (measured: `metfs-shuffle/examples/coded_scale.rs`, docs/BENCHMARKS.md,
//! "Many nodes: coded shuffling's tables"), and [`MAX_POINTS`] bounds it. Time grows with
//! `E` times the rows the carpool weighs per point, which grow with the holders per sample
//! (`p`) and, past a few dozen holders, with the plan itself: [`Estimate::plan_secs`]
//! models both from the measurements and [`MAX_PLAN_SECS`] bounds it. Nodes beyond
//! [`crate::MAX_NODES`] cannot be planned at all. [`check`] refuses with the estimate and
//! the limit, and the uncoded exchange (one entry per sample, not per block) stays
//! available.

use thiserror::Error;

use crate::MAX_NODES;

/// The most points (blocks that move in one epoch) a coded plan may have: 10 million.
///
/// Every node computes the whole plan every epoch, beside the training job that shares its
/// memory; at the measured [`PEAK_BYTES_PER_POINT`] 10M points take about 2 GiB at the
/// plan's peak (and about 6 s at [`NANOS_PER_POINT`]), which is as much of a training node's
/// memory as the exchange should take. It is about 37 nodes of 10,000 ImageNet-sized samples
/// (28 blocks each) with a node holding two shares, or 360 nodes of 1,000, where the
/// [`MAX_NODES`] of a coding table binds first (docs/BENCHMARKS.md, "Many nodes: coded
/// shuffling's tables"). The uncoded plan of the same epoch has one entry per sample that
/// moves, about 28 times fewer, and takes 100–180 times less memory.
pub const MAX_POINTS: u64 = 10_000_000;

/// Peak planning memory per point, measured by `coded_scale` (150–200 bytes in every run, 200
/// at 128 nodes of 10,000 samples: the carpool's sort key, its rows and index, the tables'
/// entry).
pub const PEAK_BYTES_PER_POINT: u64 = 200;

/// Planning time per point measured by `coded_scale` with few holders per sample (430–600 ns
/// on the 2-core development machine under load, `p = 1/(n − 1)`), rounded up.
pub const NANOS_PER_POINT: u64 = 600;

/// Planning time per subset of a point's holders that the carpool looks up (2 ns; 2.2 fitted
/// to `coded_scale --extra 0.05` at 128 nodes) and per receiver set it scans instead (1 ns;
/// 0.78 fitted to `--extra 0.5` at 128 nodes). A point held by `H` looks up a row for
/// each subset of `H` or, when those outnumber them, scans the receiver sets already filed
/// for its receiver; the estimate takes `min(2 ns · E[2^|H|], 1 ns · E/n)` per point, with
/// `E[2^|H|] = 2(1 + p)^(n − 2)`. So a large `p` (holders by the dozen) costs what it
/// measured: 20 s for 1.8M points at 128 nodes and `p = 0.5`, against 21 s for 35M at
/// `p = 1/127`. The model gave 0.7 to 2.4 times the measured time in every run, most over
/// at 8 nodes (docs/BENCHMARKS.md).
pub const NANOS_PER_SUBSET: f64 = 2.0;

/// See [`NANOS_PER_SUBSET`].
pub const NANOS_PER_KEY: f64 = 1.0;

/// The most estimated planning time (at the development machine's rates above) a coded
/// plan may take: 60 s. The plan is computed by every rank before each exchange, and the
/// exchange must fill the next epoch while the current one trains; a minute is a small
/// part of an epoch worth aggregating, an hour is not.
pub const MAX_PLAN_SECS: f64 = 60.0;

/// Bytes of one entry of a table (a [`super::Point`]).
const ENTRY_BYTES: u64 = std::mem::size_of::<super::Point>() as u64;
/// A column grows by doubling, so its capacity is on average about 1.4 times its entries
/// (the measured tables' bytes over their entries' at 8 and 64 nodes).
const GROWTH: f64 = 1.4;
/// Bytes of a table without its entries: the table, plus one column header per member.
const TABLE_BYTES: u64 = std::mem::size_of::<super::Table>() as u64;
const COLUMN_BYTES: u64 = std::mem::size_of::<Vec<super::Point>>() as u64;

/// The expected size of one epoch's coded plan (module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// Nodes.
    pub nodes: u32,
    /// Samples in the catalog.
    pub samples: u64,
    /// The extra probability the count used (the setting, cut by the budget).
    pub p: f64,
    /// Samples that move between nodes (the uncoded plan's entries).
    pub demands: f64,
    /// Distinct coding tables.
    pub tables: f64,
    /// Points: the tables' entries, one per block that moves.
    pub points: f64,
    /// Bytes of the tables (entries, columns, tables).
    pub table_bytes: f64,
}

impl Estimate {
    /// Peak planning memory at the measured [`PEAK_BYTES_PER_POINT`].
    pub fn peak_bytes(&self) -> f64 {
        self.points * PEAK_BYTES_PER_POINT as f64
    }

    /// Planning time at the measured [`NANOS_PER_POINT`], [`NANOS_PER_SUBSET`] and
    /// [`NANOS_PER_KEY`].
    pub fn plan_secs(&self) -> f64 {
        let n = f64::from(self.nodes);
        let subsets = 2.0 * (1.0 + self.p).powf((n - 2.0).max(0.0));
        let weigh = (subsets * NANOS_PER_SUBSET).min(self.points / n * NANOS_PER_KEY);
        self.points * (NANOS_PER_POINT as f64 + weigh) * 1e-9
    }
}

/// Errors of the estimate and of the limit.
#[derive(Debug, Error, PartialEq)]
pub enum EstimateError {
    /// No nodes.
    #[error("coded shuffling needs at least one node, not 0")]
    NoNodes,
    /// `p` is not a probability.
    #[error("the extra probability must be in [0, 1], not {0}")]
    BadExtra(f64),
    /// More nodes than a coding table can name.
    #[error(
        "--shuffle-code uberShuffle plans at most {MAX_NODES} nodes, not {}: {}; use \
         --shuffle-code uncoded",
        .0.nodes, describe(.0)
    )]
    TooManyNodes(Estimate),
    /// A plan past [`MAX_POINTS`].
    #[error(
        "--shuffle-code uberShuffle would plan {} points (blocks that move) per epoch on \
         every node, more than the limit of {}: {}; use --shuffle-code uncoded (one entry \
         per sample that moves, {} here)",
        count(.0.points), count(MAX_POINTS as f64), describe(.0), count(.0.demands)
    )]
    TooLarge(Estimate),
    /// A plan past [`MAX_PLAN_SECS`].
    #[error(
        "--shuffle-code uberShuffle would take about {} to plan each epoch on every node, \
         more than the limit of {MAX_PLAN_SECS:.0} s: {}; use --shuffle-code uncoded, or a \
         smaller --shuffle-extra (fewer holders per sample)",
        secs(.0.plan_secs()), describe(.0)
    )]
    TooSlow(Estimate),
}

fn count(x: f64) -> String {
    match x {
        x if x >= 1e9 => format!("{:.1}G", x / 1e9),
        x if x >= 1e6 => format!("{:.1}M", x / 1e6),
        x if x >= 1e4 => format!("{:.0}k", x / 1e3),
        x => format!("{x:.0}"),
    }
}

fn bytes(x: f64) -> String {
    let (unit, scale) = match x {
        x if x >= (1u64 << 30) as f64 => ("GiB", (1u64 << 30) as f64),
        x if x >= (1u64 << 20) as f64 => ("MiB", (1u64 << 20) as f64),
        _ => ("KiB", 1024.0),
    };
    format!("{:.1} {unit}", x / scale)
}

fn secs(x: f64) -> String {
    if x < 10.0 {
        format!("{x:.1} s")
    } else {
        format!("{x:.0} s")
    }
}

/// The estimate in words, for the refusals.
fn describe(e: &Estimate) -> String {
    format!(
        "estimated at {} nodes, {} samples and p = {:.3}: {} tables, {} entries ({} of \
         tables), about {} of memory and {} of planning per epoch",
        e.nodes,
        count(e.samples as f64),
        e.p,
        count(e.tables),
        count(e.points),
        bytes(e.table_bytes),
        bytes(e.peak_bytes()),
        secs(e.plan_secs())
    )
}

/// The expected coded plan for samples of `sizes` bytes over `nodes` nodes keeping extras
/// with probability `extra` within `budget` bytes per node, cut into `block_bytes` blocks.
pub fn estimate(
    sizes: &[u64],
    nodes: u32,
    extra: f64,
    budget: u64,
    block_bytes: u32,
) -> Result<Estimate, EstimateError> {
    if nodes == 0 {
        return Err(EstimateError::NoNodes);
    }
    if !(0.0..=1.0).contains(&extra) {
        return Err(EstimateError::BadExtra(extra));
    }
    let block = u64::from(block_bytes.max(1));
    let (total, blocks) = sizes.iter().fold((0u128, 0u128), |(t, b), &s| {
        (t + u128::from(s), b + u128::from(s.div_ceil(block)))
    });
    let n = f64::from(nodes);
    let (total, blocks) = (total as f64, blocks as f64);
    // What the budget leaves beside an even share, over the rest of the dataset.
    let share = total / n;
    let room = if total > share {
        ((budget as f64 - share) / (total - share)).clamp(0.0, 1.0)
    } else {
        1.0
    };
    let p = extra.min(room);
    let moves = (1.0 - 1.0 / n) * (1.0 - p);
    let demands = moves * sizes.len() as f64;
    let points = moves * blocks;
    let (tables, columns) = distinct_tables(nodes, p, demands);
    let table_bytes = points * (ENTRY_BYTES as f64 * GROWTH)
        + tables * TABLE_BYTES as f64
        + columns * COLUMN_BYTES as f64;
    Ok(Estimate {
        nodes,
        samples: sizes.len() as u64,
        p,
        demands,
        tables,
        points,
        table_bytes,
    })
}

/// The expected number of distinct tables that `demands` demands fill, and of their
/// members (columns): `Σ_m C(n, m) (1 − (1 − π_m)^D)` (module docs), in log space so that
/// a thousand nodes neither overflow nor underflow.
fn distinct_tables(nodes: u32, p: f64, demands: f64) -> (f64, f64) {
    if nodes < 2 || demands <= 0.0 {
        return (0.0, 0.0);
    }
    let n = f64::from(nodes);
    let (lp, lq) = (p.ln(), (1.0 - p).ln());
    let mut ln_choose = n.ln() + (n - 1.0).ln() - 2f64.ln(); // C(n, 2)
    let (mut tables, mut columns) = (0.0, 0.0);
    for m in 2..=nodes {
        let mf = f64::from(m);
        if m > 2 {
            ln_choose += (n - mf + 1.0).ln() - mf.ln();
        }
        // ln π_m; p^0 is 1 even at p = 0, (1 − p)^0 even at p = 1.
        let extra = if m > 2 { (mf - 2.0) * lp } else { 0.0 };
        let rest = if m < nodes { (n - mf) * lq } else { 0.0 };
        let ln_pi = (mf * (mf - 1.0)).ln() - (n * (n - 1.0)).ln() + extra + rest;
        if ln_pi == f64::NEG_INFINITY {
            continue;
        }
        let x = demands * ln_pi.exp();
        let filled = if x < 1e-6 {
            // Almost every demand in a table of this size opens a table of its own.
            (ln_choose + demands.ln() + ln_pi).exp()
        } else {
            ln_choose.exp() * -(demands * (-ln_pi.exp()).ln_1p()).exp_m1()
        };
        tables += filled;
        columns += mf * filled;
    }
    (tables, columns)
}

/// Refuses a coded plan past the limits (module docs): more than [`MAX_NODES`] nodes, more
/// than [`MAX_POINTS`] points, or more than [`MAX_PLAN_SECS`] of estimated planning.
pub fn check(estimate: Estimate) -> Result<Estimate, EstimateError> {
    if estimate.nodes > MAX_NODES {
        return Err(EstimateError::TooManyNodes(estimate));
    }
    if estimate.points > MAX_POINTS as f64 {
        return Err(EstimateError::TooLarge(estimate));
    }
    if estimate.plan_secs() > MAX_PLAN_SECS {
        return Err(EstimateError::TooSlow(estimate));
    }
    Ok(estimate)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::coded::{demands, tables};
    use crate::plan::{layout, transition, AggregateConfig};

    /// The real tables between epochs 0 and 1, and the estimate, for the same inputs.
    fn real_and_estimate(nodes: u32, sizes: &[u64], p: f64, block: u32) -> (f64, f64, Estimate) {
        let cfg = AggregateConfig {
            nodes,
            seed: 11,
            budget: sizes.iter().sum(),
            extra: p,
        };
        let a = layout(sizes, &cfg, 0).unwrap();
        let b = layout(sizes, &cfg, 1).unwrap();
        let t = transition(Some(&a), &b, sizes, &[]).unwrap();
        let real = tables(&demands(&a, &t, sizes).unwrap(), block).unwrap();
        let e = estimate(sizes, nodes, p, cfg.budget, block).unwrap();
        (real.tables.len() as f64, real.points as f64, e)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// The closed-form count is within 15% (and a few tables) of what the planner
        /// builds, over node counts, sample counts, sizes and `p`. The count is an
        /// expectation: at least 600 samples keep the draw's spread well inside that.
        #[test]
        fn the_count_matches_the_tables(
            nodes in 2u32..40,
            per_node in 30usize..120,
            p in prop_oneof![Just(0.0), 0.01f64..0.6],
            sizes in proptest::collection::vec(1u64..12_000, 1..64),
        ) {
            let q = (nodes as usize * per_node).max(600);
            let sizes: Vec<u64> = sizes.iter().cycle().take(q).copied().collect();
            let (tables, points, e) = real_and_estimate(nodes, &sizes, p, 4096);
            let near = |est: f64, real: f64| (est - real).abs() <= 0.15 * real + 8.0;
            prop_assert!(near(e.tables, tables), "tables: {} estimated, {tables} real", e.tables);
            prop_assert!(near(e.points, points), "points: {} estimated, {points} real", e.points);
        }
    }

    #[test]
    fn pairs_only_without_extras_and_nothing_moves_on_one_node() {
        let sizes = vec![4096; 20_000];
        let e = estimate(&sizes, 10, 0.0, u64::MAX, 4096).unwrap();
        assert!(e.tables <= 45.0 && e.tables > 44.9, "{}", e.tables);
        assert!((e.points - 18_000.0).abs() < 1e-6, "{}", e.points);
        let one = estimate(&sizes, 1, 0.3, u64::MAX, 4096).unwrap();
        assert_eq!((one.demands, one.tables, one.points), (0.0, 0.0, 0.0));
        // A thousand nodes, all of them holders: no overflow, one table per demand at most.
        let big = estimate(&sizes, 1024, 0.5, u64::MAX, 4096).unwrap();
        assert!(big.tables.is_finite() && big.tables <= big.demands + 1e-6);
    }

    #[test]
    fn the_budget_cuts_p() {
        // 100 samples of 1 KiB on 4 nodes: a share is 25 KiB; 50 KiB leaves room for a
        // third of the other 75.
        let sizes = vec![1024; 100];
        let e = estimate(&sizes, 4, 0.9, 50 * 1024, 1024).unwrap();
        assert!((e.p - 1.0 / 3.0).abs() < 1e-9, "{}", e.p);
        assert!((e.demands - 100.0 * 0.75 * (2.0 / 3.0)).abs() < 1e-9);
    }

    #[test]
    fn zero_nodes_and_bad_p_are_errors() {
        assert_eq!(estimate(&[1], 0, 0.0, 1, 1), Err(EstimateError::NoNodes));
        assert_eq!(
            estimate(&[1], 2, 1.5, 1, 1),
            Err(EstimateError::BadExtra(1.5))
        );
        assert!(EstimateError::NoNodes
            .to_string()
            .contains("at least one node"));
    }

    #[test]
    fn refusals_name_the_estimate_the_limit_and_uncoded() {
        let sizes = vec![110 * 1024; 64 * 10_000];
        let e = estimate(&sizes, 64, 1.0 / 63.0, u64::MAX, 4096).unwrap();
        let msg = check(e).unwrap_err().to_string();
        for want in [
            "64 nodes",
            "640k samples",
            "tables",
            "entries",
            "GiB",
            "s of planning",
        ] {
            assert!(msg.contains(want), "{want}: {msg}");
        }
        assert!(
            msg.contains(&format!("limit of {}", count(MAX_POINTS as f64))),
            "{msg}"
        );
        assert!(msg.contains("use --shuffle-code uncoded"), "{msg}");
        let many = estimate(&[4096; 2000], 129, 0.0, u64::MAX, 4096).unwrap();
        let msg = check(many).unwrap_err().to_string();
        assert!(msg.contains("at most 128 nodes, not 129"), "{msg}");
        let small = estimate(&[4096; 2000], 128, 0.0, u64::MAX, 4096).unwrap();
        assert_eq!(check(small), Ok(small));
        // Half the nodes hold every sample: few points, but dozens of holders each.
        let held = estimate(&vec![32 * 1024; 1_000_000], 128, 0.5, u64::MAX, 4096).unwrap();
        assert!(held.points < MAX_POINTS as f64);
        let msg = check(held).unwrap_err().to_string();
        assert!(
            msg.contains("s to plan each epoch") && msg.contains("limit of 60 s"),
            "{msg}"
        );
        assert!(msg.contains("smaller --shuffle-extra"), "{msg}");
    }
}
