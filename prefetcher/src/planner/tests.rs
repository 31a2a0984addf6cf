//! Unit tests of the planner: every strategy's promises on fixtures, pinned digests, errors, and
//! the summary.

use super::balance::{balance, Scratch};
use super::bound::{share_bound, SizeStats};
use super::layout::fewest_runs;
use super::*;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicUsize;

/// Alternating-path flips performed, to show the tests reach that code.
pub(super) static FLIPS: AtomicUsize = AtomicUsize::new(0);

pub(super) fn cfg(strategy: Strategy, slot_bytes: u64, nodes: u32) -> PlanConfig {
    PlanConfig {
        strategy,
        seed: 7,
        slot_bytes,
        mini_epochs: None,
        node_rank: 0,
        nodes,
    }
}

pub(super) fn set<'a>(sizes: &'a [u64], labels: &'a [u32], clusters: &'a [u32]) -> SampleSet<'a> {
    SampleSet {
        sizes,
        labels: Some(labels),
        clusters: Some(clusters),
    }
}

/// Every node's plan of `epoch`.
pub(super) fn all_nodes(s: &SampleSet<'_>, c: &PlanConfig, epoch: u64) -> Vec<EpochPlan> {
    (0..c.nodes)
        .map(|r| {
            let cfg = PlanConfig {
                node_rank: r,
                ..c.clone()
            };
            plan_epoch(s, &cfg, epoch).unwrap()
        })
        .collect()
}

/// Checks every promise of the module for one epoch; returns shares[m][r] without copies.
pub(super) fn check(
    s: &SampleSet<'_>,
    c: &PlanConfig,
    epoch: u64,
) -> Result<Vec<Vec<Vec<u32>>>, String> {
    let n = s.sizes.len();
    let lay = layout(s, c).map_err(|e| e.to_string())?;
    let nm = lay.nm as usize;
    let nodes = c.nodes as usize;
    let plans = all_nodes(s, c, epoch);
    let copied: Vec<u32> = plans[0].copied.clone();
    let is_copied = |id: u32| copied.binary_search(&id).is_ok();
    let mut seen = vec![0u32; n];
    let mut shares = vec![vec![Vec::new(); nodes]; nm];
    for (r, plan) in plans.iter().enumerate() {
        if plan.epoch != epoch || plan.mini_epochs.len() != nm || plan.copied != copied {
            return Err(format!("node {r}: wrong shape"));
        }
        for (m, me) in plan.mini_epochs.iter().enumerate() {
            if !me.samples.windows(2).all(|w| w[0] < w[1]) {
                return Err(format!("share ({m},{r}) not ascending"));
            }
            let bytes: u64 = me.samples.iter().map(|&i| s.sizes[i as usize]).sum();
            let cb: u64 = copied.iter().map(|&i| s.sizes[i as usize]).sum();
            if bytes != me.bytes || cb != me.copied_bytes {
                return Err(format!("share ({m},{r}) bytes wrong"));
            }
            if me.bytes > c.slot_bytes {
                return Err(format!(
                    "share ({m},{r}) holds {} > {}",
                    me.bytes, c.slot_bytes
                ));
            }
            if let Some(b) = lay.bound {
                if me.bytes > b {
                    return Err(format!("share ({m},{r}) {} above bound {b}", me.bytes));
                }
            }
            for &id in &me.samples {
                if !is_copied(id) {
                    seen[id as usize] += 1;
                    shares[m][r].push(id);
                }
            }
            if copied
                .iter()
                .any(|id| me.samples.binary_search(id).is_err())
            {
                return Err(format!("share ({m},{r}) lacks a copy"));
            }
        }
    }
    for (id, &k) in seen.iter().enumerate() {
        if !is_copied(id as u32) && k != 1 {
            return Err(format!("sample {id} planned {k} times"));
        }
    }
    let size = |ids: &Vec<u32>| ids.iter().map(|&i| s.sizes[i as usize]).sum::<u64>();
    let planned_max = (0..n as u32)
        .filter(|&i| !is_copied(i))
        .map(|i| s.sizes[i as usize])
        .max()
        .unwrap_or(0);
    match c.strategy {
        Strategy::Sequential => {
            let flat: Vec<u32> = shares.iter().flatten().flatten().copied().collect();
            if flat != (0..n as u32).collect::<Vec<_>>() {
                return Err("sequential shares are not contiguous in order".into());
            }
        }
        _ => {
            let counts: Vec<usize> = shares.iter().flatten().map(Vec::len).collect();
            let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            if hi - lo > 1 {
                return Err(format!("share sample counts {lo}..{hi}"));
            }
            for (m, me) in shares.iter().enumerate() {
                let b: Vec<u64> = me.iter().map(size).collect();
                let spread = b.iter().max().unwrap() - b.iter().min().unwrap();
                if spread > planned_max {
                    return Err(format!(
                        "mini-epoch {m} node bytes spread {spread} > {planned_max}"
                    ));
                }
            }
            let me_bytes: Vec<u64> = shares.iter().map(|me| me.iter().map(size).sum()).collect();
            let spread = me_bytes.iter().max().unwrap() - me_bytes.iter().min().unwrap();
            if c.strategy != Strategy::Random && spread > planned_max {
                return Err(format!("mini-epoch bytes spread {spread} > {planned_max}"));
            }
        }
    }
    let classes = match c.strategy {
        Strategy::Stratified => s.labels,
        Strategy::Clustered => s.clusters,
        _ => None,
    };
    if let Some(col) = classes {
        let mut total: BTreeMap<u32, usize> = BTreeMap::new();
        for (id, &cl) in col.iter().enumerate() {
            if !is_copied(id as u32) {
                *total.entry(cl).or_default() += 1;
            }
        }
        for (&cl, &t) in &total {
            for (m, me) in shares.iter().enumerate() {
                let per_node: Vec<usize> = me
                    .iter()
                    .map(|ids| ids.iter().filter(|&&i| col[i as usize] == cl).count())
                    .collect();
                let k: usize = per_node.iter().sum();
                if k < t / nm || k > t.div_ceil(nm) {
                    return Err(format!("class {cl}: {k} in mini-epoch {m}, ideal {t}/{nm}"));
                }
                let (lo, hi) = (
                    per_node.iter().min().unwrap(),
                    per_node.iter().max().unwrap(),
                );
                if hi - lo > 1 {
                    return Err(format!("class {cl} mini-epoch {m}: nodes hold {lo}..{hi}"));
                }
            }
        }
    }
    if c.strategy == Strategy::Clustered {
        let parts = nm * nodes;
        let mut count: BTreeMap<u32, usize> = BTreeMap::new();
        for &cl in s.clusters.unwrap() {
            *count.entry(cl).or_default() += 1;
        }
        for (id, &cl) in s.clusters.unwrap().iter().enumerate() {
            if is_copied(id as u32) != (count[&cl] < parts) {
                return Err(format!("cluster {cl} copied wrongly"));
            }
        }
    }
    Ok(shares)
}

fn digest(plans: &[EpochPlan]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |x: u64| {
        for b in x.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for p in plans {
        for me in &p.mini_epochs {
            eat(u64::MAX);
            me.samples.iter().for_each(|&i| eat(u64::from(i)));
        }
    }
    h
}

/// A fixed dataset: 600 samples, lognormal-ish sizes, 5 labels, clusters of 1..40.
fn fixture() -> (Vec<u64>, Vec<u32>, Vec<u32>) {
    let mut x: u64 = 1;
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        x >> 33
    };
    let sizes = (0..600)
        .map(|_| 1000 + next() % 5000 + (next() % 50) * (next() % 200))
        .collect();
    let labels = (0..600).map(|_| (next() % 5) as u32).collect();
    let clusters = (0..600)
        .map(|i| {
            if i < 560 {
                (next() % 8) as u32
            } else {
                8 + (i % 3) as u32
            }
        })
        .collect();
    (sizes, labels, clusters)
}

#[test]
fn every_strategy_keeps_its_promises_on_a_fixture() {
    let (sizes, labels, clusters) = fixture();
    let s = set(&sizes, &labels, &clusters);
    let total: u64 = sizes.iter().sum();
    for strategy in [
        Strategy::Sequential,
        Strategy::Random,
        Strategy::Stratified,
        Strategy::Clustered,
    ] {
        for nodes in [1, 2, 3] {
            let c = cfg(strategy, total / 9, nodes);
            for epoch in 0..3 {
                check(&s, &c, epoch)
                    .unwrap_or_else(|e| panic!("{strategy} x{nodes} e{epoch}: {e}"));
            }
        }
    }
}

#[test]
fn two_nodes_are_disjoint_and_cover() {
    let (sizes, labels, clusters) = fixture();
    let s = set(&sizes, &labels, &clusters);
    let c = cfg(Strategy::Random, sizes.iter().sum::<u64>() / 5, 2);
    let plans = all_nodes(&s, &c, 4);
    for m in 0..plans[0].mini_epochs.len() {
        let a = &plans[0].mini_epochs[m].samples;
        let b = &plans[1].mini_epochs[m].samples;
        assert!(
            a.iter().all(|x| b.binary_search(x).is_err()),
            "overlap in {m}"
        );
    }
    let mut all: Vec<u32> = plans
        .iter()
        .flat_map(|p| p.mini_epochs.iter().flat_map(|m| m.samples.clone()))
        .collect();
    all.sort_unstable();
    assert_eq!(all, (0..600).collect::<Vec<u32>>());
}

#[test]
fn compositions_change_between_epochs_but_not_between_calls() {
    let (sizes, labels, clusters) = fixture();
    let s = set(&sizes, &labels, &clusters);
    let total: u64 = sizes.iter().sum();
    for strategy in [
        Strategy::Random,
        Strategy::Stratified,
        Strategy::Clustered,
        Strategy::Sequential,
    ] {
        let c = cfg(strategy, total / 6, 2);
        let e0 = all_nodes(&s, &c, 0);
        assert_eq!(e0, all_nodes(&s, &c, 0), "{strategy} not deterministic");
        let e1 = all_nodes(&s, &c, 1);
        if strategy == Strategy::Sequential {
            assert_eq!(e0[0].mini_epochs, e1[0].mini_epochs);
        } else {
            assert_ne!(e0[0].mini_epochs, e1[0].mini_epochs, "{strategy} repeats");
        }
        let other_seed = PlanConfig {
            seed: 8,
            ..c.clone()
        };
        if strategy != Strategy::Sequential {
            assert_ne!(
                e0,
                all_nodes(&s, &other_seed, 0),
                "{strategy} ignores the seed"
            );
        }
    }
}

fn fixture_digests() -> Vec<u64> {
    let (sizes, labels, clusters) = fixture();
    let s = set(&sizes, &labels, &clusters);
    let total: u64 = sizes.iter().sum();
    [
        Strategy::Sequential,
        Strategy::Random,
        Strategy::Stratified,
        Strategy::Clustered,
    ]
    .into_iter()
    .map(|st| digest(&all_nodes(&s, &cfg(st, total / 7, 3), 5)))
    .collect()
}

/// Plans must not change between builds, machines or library updates: a restarted daemon
/// and every other node must compute the same mini-epochs. If this fails after an
/// intended change to the planner, plans made by older versions will differ from new ones.
#[test]
fn plans_match_pinned_digests() {
    assert_eq!(fixture_digests(), PINNED);
}

const PINNED: [u64; 4] = [
    8111104992998749077,
    15552393013689220745,
    6332503907179678073,
    17213624272201197621,
];

#[test]
fn same_plan_in_another_process() {
    const VAR: &str = "METFS_PLANNER_DIGEST_CHILD";
    if std::env::var_os(VAR).is_some() {
        println!("digests={:?}", fixture_digests());
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "planner::tests::same_plan_in_another_process",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(VAR, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .find("digests=")
        .and_then(|at| stdout[at..].lines().next())
        .unwrap_or_else(|| panic!("child printed no digest: {stdout}"));
    assert_eq!(line, format!("digests={:?}", fixture_digests()));
}

#[test]
fn nm_is_the_smallest_guaranteed() {
    let (sizes, labels, clusters) = fixture();
    let s = set(&sizes, &labels, &clusters);
    let total: u64 = sizes.iter().sum();
    for slot in [total / 3, total / 10, total / 40, 20_000] {
        for nodes in [1u32, 4] {
            for st in [Strategy::Random, Strategy::Stratified] {
                let c = cfg(st, slot, nodes);
                let nm = mini_epoch_count(&s, &c).unwrap() as u64;
                let stats = SizeStats::of(sizes.iter().copied());
                let b = |nm: u64| share_bound(600, total, stats.max, &stats, nm * u64::from(nodes));
                assert!(b(nm) <= slot);
                assert!(nm == 1 || b(nm - 1) > slot, "{st} nm {nm} not smallest");
                // Asking for one fewer is refused and names nm.
                if nm > 1 {
                    let ask = PlanConfig {
                        mini_epochs: Some(nm as u32 - 1),
                        ..c.clone()
                    };
                    match mini_epoch_count(&s, &ask) {
                        Err(PlanError::TooFewMiniEpochs { needed, bytes, .. }) => {
                            assert_eq!(u64::from(needed), nm);
                            assert!(bytes > slot);
                        }
                        other => panic!("{other:?}"),
                    }
                }
            }
            let c = cfg(Strategy::Sequential, slot, nodes);
            let nm = mini_epoch_count(&s, &c).unwrap() as u64;
            let runs = fewest_runs(&sizes, slot);
            assert!(nm * u64::from(nodes) >= runs && (nm - 1) * u64::from(nodes) < runs);
        }
    }
}

#[test]
fn singletons_when_only_one_sample_fits() {
    let sizes = vec![10u64, 9, 10, 8, 10];
    let s = SampleSet {
        sizes: &sizes,
        labels: None,
        clusters: None,
    };
    let c = cfg(Strategy::Random, 12, 2);
    assert_eq!(mini_epoch_count(&s, &c).unwrap(), 3);
    check(&s, &c, 0).unwrap();
    let c = cfg(Strategy::Sequential, 12, 1);
    assert_eq!(mini_epoch_count(&s, &c).unwrap(), 5);
}

#[test]
fn errors() {
    let sizes = vec![5u64, 50, 7, 50];
    let labels = [0u32; 4];
    let plain = SampleSet {
        sizes: &sizes,
        labels: None,
        clusters: None,
    };
    let c = cfg(Strategy::Random, 40, 1);
    assert_eq!(
        mini_epoch_count(&plain, &c),
        Err(PlanError::SampleTooLarge {
            sample: 1,
            size: 50,
            slot_bytes: 40
        })
    );
    let c = cfg(Strategy::Stratified, 100, 1);
    assert_eq!(
        mini_epoch_count(&plain, &c),
        Err(PlanError::MissingClasses(Strategy::Stratified, "labels"))
    );
    let c = cfg(Strategy::Clustered, 100, 1);
    assert!(matches!(
        mini_epoch_count(&plain, &c),
        Err(PlanError::MissingClasses(..))
    ));
    let c = PlanConfig {
        node_rank: 2,
        ..cfg(Strategy::Random, 100, 2)
    };
    assert_eq!(
        mini_epoch_count(&plain, &c),
        Err(PlanError::BadNode { rank: 2, nodes: 2 })
    );
    let c = cfg(Strategy::Random, 100, 0);
    assert!(matches!(
        mini_epoch_count(&plain, &c),
        Err(PlanError::BadNode { .. })
    ));
    let empty = SampleSet {
        sizes: &[],
        labels: None,
        clusters: None,
    };
    assert_eq!(
        mini_epoch_count(&empty, &cfg(Strategy::Random, 1, 1)),
        Err(PlanError::Empty)
    );
    let short = SampleSet {
        sizes: &sizes,
        labels: Some(&labels[..2]),
        clusters: None,
    };
    assert!(matches!(
        mini_epoch_count(&short, &cfg(Strategy::Random, 100, 1)),
        Err(PlanError::LengthMismatch {
            what: "labels",
            len: 2,
            samples: 4
        })
    ));
    let c = PlanConfig {
        mini_epochs: Some(5),
        ..cfg(Strategy::Random, 100, 1)
    };
    assert_eq!(
        mini_epoch_count(&plain, &c),
        Err(PlanError::TooManyMiniEpochs {
            requested: 5,
            samples: 4
        })
    );
    let c = PlanConfig {
        mini_epochs: Some(0),
        ..cfg(Strategy::Random, 100, 1)
    };
    assert!(matches!(
        mini_epoch_count(&plain, &c),
        Err(PlanError::TooFewMiniEpochs { requested: 0, .. })
    ));
    for st in [Strategy::Sequential, Strategy::Random] {
        let c = PlanConfig {
            mini_epochs: Some(1),
            ..cfg(st, 100, 1)
        };
        match mini_epoch_count(&plain, &c) {
            Err(PlanError::TooFewMiniEpochs {
                requested: 1,
                bytes,
                slot_bytes: 100,
                needed,
            }) => {
                assert!(bytes > 100 && needed >= 2, "{st}: {bytes} {needed}");
            }
            other => panic!("{st}: {other:?}"),
        }
    }
    // Every cluster is tiny, so every share would hold a copy of everything.
    let clusters = vec![0u32, 1, 2, 3];
    let s = SampleSet {
        sizes: &sizes,
        labels: None,
        clusters: Some(&clusters),
    };
    assert_eq!(
        mini_epoch_count(&s, &cfg(Strategy::Clustered, 100, 1)),
        Err(PlanError::ClustersTooLarge {
            best: 112,
            slot_bytes: 100
        })
    );
}

#[test]
fn clustered_copies_small_clusters_everywhere_and_counts_them() {
    // Cluster 0: 40 samples; cluster 1: 2 samples (fewer than the shares).
    let sizes: Vec<u64> = (0..42).map(|i| 100 + i).collect();
    let clusters: Vec<u32> = (0..42).map(|i| u32::from(i >= 40)).collect();
    let s = SampleSet {
        sizes: &sizes,
        labels: None,
        clusters: Some(&clusters),
    };
    let c = cfg(Strategy::Clustered, 1200, 2);
    let nm = mini_epoch_count(&s, &c).unwrap();
    assert!(nm * 2 > 2);
    check(&s, &c, 0).unwrap();
    let plan = plan_epoch(&s, &c, 0).unwrap();
    assert_eq!(plan.copied, vec![40, 41]);
    assert!(plan.mini_epochs.iter().all(|m| m.copied_bytes == 281));
    let sum = summarize(&s, &c, 0, None).unwrap();
    assert_eq!((sum.copied_samples, sum.copied_bytes), (2, 281));
    let cl = sum.classes.unwrap();
    assert_eq!((cl.by, cl.classes, cl.copied_classes), ("cluster", 2, 1));
}

#[test]
fn summary_reports_counts_and_bounds() {
    let (sizes, labels, clusters) = fixture();
    let s = set(&sizes, &labels, &clusters);
    let total: u64 = sizes.iter().sum();
    let c = cfg(Strategy::Stratified, total / 9, 2);
    let names: Vec<String> = (0..5).map(|i| format!("class{i}")).collect();
    let sum = summarize(&s, &c, 0, Some(&names)).unwrap();
    assert_eq!(sum.mini_epochs, mini_epoch_count(&s, &c).unwrap());
    assert_eq!(sum.samples, 600);
    assert_eq!(sum.total_bytes, total);
    assert!(sum.share_bytes.max <= sum.share_bound && sum.share_bound <= c.slot_bytes);
    assert_eq!(sum.node_bytes.iter().map(|n| n.bytes).sum::<u64>(), total);
    let cl = sum.classes.as_ref().unwrap();
    assert!(cl.max_deviation < 1.0);
    let table = cl.per_mini_epoch.as_ref().unwrap();
    assert_eq!(table[0].class, "class0");
    assert_eq!(
        table
            .iter()
            .map(|r| r.counts.iter().sum::<u64>())
            .sum::<u64>(),
        600
    );
    let text = sum.to_string();
    assert!(
        text.contains("stratified") && text.contains("class0"),
        "{text}"
    );
    let json = serde_json::to_value(&sum).unwrap();
    assert_eq!(json["strategy"], "stratified");
    // A thousand classes: no full table, a capped list.
    let many: Vec<u32> = (0..600).map(|i| i % 300).collect();
    let s2 = SampleSet {
        sizes: &sizes,
        labels: Some(&many),
        clusters: None,
    };
    let sum = summarize(&s2, &c, 0, None).unwrap();
    let cl = sum.classes.unwrap();
    assert!(cl.per_mini_epoch.is_none() && cl.spread.len() == 300 && !cl.truncated);
}

#[test]
fn alternating_paths_are_exercised() {
    // Many classes of k - 1 samples force sweeps where a class holds every free colour.
    let k = 5u32;
    let mut sizes = Vec::new();
    let mut bounds = vec![0];
    for g in 0..200u64 {
        for j in 0..4u64 {
            sizes.push((g * 7919 + j * 104_729) % 1000);
        }
        bounds.push(sizes.len());
    }
    let before = FLIPS.load(std::sync::atomic::Ordering::Relaxed);
    let mut ids: Vec<u32> = (0..sizes.len() as u32).collect();
    let mut color = vec![NONE; sizes.len()];
    balance(
        k,
        &mut ids,
        &bounds,
        &sizes,
        &mut super::rng::stream(1, 1),
        &mut Scratch::default(),
        |id, c| color[id as usize] = c,
    );
    assert!(
        FLIPS.load(std::sync::atomic::Ordering::Relaxed) > before,
        "no flip happened"
    );
    for w in bounds.windows(2) {
        let mut cs: Vec<u32> = color[w[0]..w[1]].to_vec();
        cs.sort_unstable();
        cs.dedup();
        assert_eq!(cs.len(), 4, "a class got one colour twice");
    }
}

#[test]
fn rng_is_stable() {
    let mut r = super::rng::stream(1, 2);
    let v: Vec<u32> = (0..4).map(|_| r.below(1000)).collect();
    let mut r2 = super::rng::stream(1, 2);
    assert_eq!(v, (0..4).map(|_| r2.below(1000)).collect::<Vec<_>>());
    assert_ne!(
        super::rng::stream(1, 3).below(u32::MAX),
        super::rng::stream(1, 2).below(u32::MAX)
    );
}
