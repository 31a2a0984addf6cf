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
        cluster_copies: ClusterCopies::default(),
    }
}

/// `cfg` with the other cluster copy rule spelled out.
pub(super) fn with_copies(c: PlanConfig, cluster_copies: ClusterCopies) -> PlanConfig {
    PlanConfig {
        cluster_copies,
        ..c
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
    let per_node = c.strategy == Strategy::Clustered && c.cluster_copies == ClusterCopies::PerNode;
    let mut seen = vec![0u32; n];
    let mut shares = vec![vec![Vec::new(); nodes]; nm];
    // per-node copies: the mini-epoch of each node holding each copied sample.
    let mut copy_me = vec![vec![None; n]; nodes];
    for (r, plan) in plans.iter().enumerate() {
        if plan.epoch != epoch || plan.mini_epochs.len() != nm || plan.copied != copied {
            return Err(format!("node {r}: wrong shape"));
        }
        for (m, me) in plan.mini_epochs.iter().enumerate() {
            if !me.samples.windows(2).all(|w| w[0] < w[1]) {
                return Err(format!("share ({m},{r}) not ascending"));
            }
            let bytes: u64 = me.samples.iter().map(|&i| s.sizes[i as usize]).sum();
            let cb: u64 = me
                .samples
                .iter()
                .filter(|&&i| is_copied(i))
                .map(|&i| s.sizes[i as usize])
                .sum();
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
                } else if per_node && copy_me[r][id as usize].replace(m).is_some() {
                    return Err(format!("node {r} holds sample {id} twice"));
                }
            }
            if !per_node
                && copied
                    .iter()
                    .any(|id| me.samples.binary_search(id).is_err())
            {
                return Err(format!("share ({m},{r}) lacks a copy"));
            }
        }
    }
    if per_node {
        check_per_node_copies(s, &copied, &copy_me, nm)?;
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
        let below = match c.cluster_copies {
            ClusterCopies::PerShare => nm * nodes,
            ClusterCopies::PerNode => nodes,
        };
        let mut count: BTreeMap<u32, usize> = BTreeMap::new();
        for &cl in s.clusters.unwrap() {
            *count.entry(cl).or_default() += 1;
        }
        for (id, &cl) in s.clusters.unwrap().iter().enumerate() {
            if is_copied(id as u32) != (count[&cl] < below) {
                return Err(format!("cluster {cl} copied wrongly"));
            }
        }
    }
    Ok(shares)
}

/// `per-node` copies: every node holds every copied sample once, a cluster's copy whole in one
/// of its mini-epochs, mini-epochs within one of the same number of copied clusters, and the
/// nodes' copies of a cluster in distinct mini-epochs when there are as many as nodes.
fn check_per_node_copies(
    s: &SampleSet<'_>,
    copied: &[u32],
    copy_me: &[Vec<Option<usize>>],
    nm: usize,
) -> Result<(), String> {
    let clusters = s.clusters.unwrap();
    for (r, at) in copy_me.iter().enumerate() {
        let mut cluster_at: BTreeMap<u32, usize> = BTreeMap::new();
        for &id in copied {
            let m = at[id as usize].ok_or(format!("node {r} lacks copied sample {id}"))?;
            let cl = clusters[id as usize];
            if *cluster_at.entry(cl).or_insert(m) != m {
                return Err(format!("node {r}: cluster {cl} split over mini-epochs"));
            }
        }
        let mut per_me = vec![0usize; nm];
        cluster_at.values().for_each(|&m| per_me[m] += 1);
        let (lo, hi) = (per_me.iter().min().unwrap(), per_me.iter().max().unwrap());
        if hi - lo > 1 {
            return Err(format!(
                "node {r}: copied clusters per mini-epoch {lo}..{hi}"
            ));
        }
    }
    if nm >= copy_me.len() {
        for &id in copied {
            let mut ms: Vec<usize> = copy_me.iter().map(|at| at[id as usize].unwrap()).collect();
            ms.sort_unstable();
            ms.dedup();
            if ms.len() != copy_me.len() {
                return Err(format!("copies of sample {id} share mini-epochs: {ms:?}"));
            }
        }
    }
    Ok(())
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
    for c in every_config(total / 9) {
        for nodes in [1, 2, 3] {
            let c = PlanConfig { nodes, ..c.clone() };
            for epoch in 0..3 {
                check(&s, &c, epoch).unwrap_or_else(|e| {
                    panic!("{} {} x{nodes} e{epoch}: {e}", c.strategy, c.cluster_copies)
                });
            }
        }
    }
}

/// One config per strategy, `clustered` once per copy rule.
fn every_config(slot: u64) -> Vec<PlanConfig> {
    let mut v: Vec<PlanConfig> = [
        Strategy::Sequential,
        Strategy::Random,
        Strategy::Stratified,
        Strategy::Clustered,
    ]
    .into_iter()
    .map(|st| with_copies(cfg(st, slot, 1), ClusterCopies::PerShare))
    .collect();
    v.push(with_copies(
        cfg(Strategy::Clustered, slot, 1),
        ClusterCopies::PerNode,
    ));
    v
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
    for c in every_config(total / 6) {
        let c = PlanConfig { nodes: 2, ..c };
        let strategy = c.strategy;
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
    let mut v: Vec<u64> = every_config(total / 7)
        .into_iter()
        .map(|c| digest(&all_nodes(&s, &PlanConfig { nodes: 3, ..c }, 5)))
        .collect();
    // The fixture has no cluster smaller than 3 nodes; this one has 180 on 4 nodes.
    let (sizes, clusters) = small_clusters();
    let s = SampleSet {
        sizes: &sizes,
        labels: None,
        clusters: Some(&clusters),
    };
    let c = cfg(Strategy::Clustered, sizes.iter().sum::<u64>() / 20, 4);
    v.push(digest(&all_nodes(&s, &c, 5)));
    v
}

/// Plans must not change between builds, machines or library updates: a restarted daemon
/// and every other node must compute the same mini-epochs. If this fails after an
/// intended change to the planner, plans made by older versions will differ from new ones.
#[test]
fn plans_match_pinned_digests() {
    assert_eq!(fixture_digests(), PINNED);
}

/// Sequential, random, stratified, clustered with `per-share` copies (the four pinned before
/// `per-node` copies existed), clustered with `per-node` copies (the same plan: no cluster of
/// the fixture is copied), and `per-node` copies of small clusters.
const PINNED: [u64; 6] = [
    8111104992998749077,
    15552393013689220745,
    6332503907179678073,
    17213624272201197621,
    17213624272201197621,
    11829231214719424845,
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
    let per_share = with_copies(cfg(Strategy::Clustered, 100, 1), ClusterCopies::PerShare);
    let e = mini_epoch_count(&s, &per_share).unwrap_err();
    assert_eq!(
        e,
        PlanError::ClustersTooLarge {
            best: 112,
            slot_bytes: 100,
            copies: ClusterCopies::PerShare,
        }
    );
    assert!(e.to_string().contains("every share"), "{e}");
    // Once per node, the same clusters spread over the mini-epochs fit.
    let per_node = with_copies(cfg(Strategy::Clustered, 100, 2), ClusterCopies::PerNode);
    check(&s, &per_node, 0).unwrap();
    // A copied cluster larger than a share fits no count.
    let sizes = [40u64, 40, 40, 10, 10, 10, 10];
    let clusters = [0u32, 0, 0, 1, 1, 1, 1];
    let s = SampleSet {
        sizes: &sizes,
        labels: None,
        clusters: Some(&clusters),
    };
    let e = mini_epoch_count(&s, &cfg(Strategy::Clustered, 100, 4)).unwrap_err();
    assert_eq!(
        e,
        PlanError::ClustersTooLarge {
            // The 120-byte copy plus the bound of a share of the rest (at most one 10-byte
            // sample; the bound allows 11).
            best: 131,
            slot_bytes: 100,
            copies: ClusterCopies::PerNode,
        }
    );
    assert!(e.to_string().contains("once to every node"), "{e}");
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
    let c = with_copies(cfg(Strategy::Clustered, 1200, 2), ClusterCopies::PerShare);
    let nm = mini_epoch_count(&s, &c).unwrap();
    assert!(nm * 2 > 2);
    check(&s, &c, 0).unwrap();
    let plan = plan_epoch(&s, &c, 0).unwrap();
    assert_eq!(plan.copied, vec![40, 41]);
    assert!(plan.mini_epochs.iter().all(|m| m.copied_bytes == 281));
    let sum = summarize(&s, &c, 0, None).unwrap();
    assert_eq!((sum.copied_samples, sum.copied_bytes), (2, 281));
    assert_eq!(sum.cluster_copies, Some(ClusterCopies::PerShare));
    let cl = sum.classes.as_ref().unwrap();
    assert_eq!((cl.by, cl.classes, cl.copied_classes), ("cluster", 2, 1));
    assert!(sum
        .to_string()
        .contains("copied into every share: 2 samples"));
}

/// Clusters of 1 to 9 samples, 60 of each size, then 3 large ones: on 4 nodes the 180 clusters
/// of 1 to 3 samples are small under the paper's rule.
fn small_clusters() -> (Vec<u64>, Vec<u32>) {
    let (mut sizes, mut clusters) = (Vec::new(), Vec::new());
    let mut cl = 0u32;
    for len in 1..=9u64 {
        for j in 0..60u64 {
            for k in 0..len {
                sizes.push(1000 + (len * 31 + j * 7 + k * 13) % 400);
                clusters.push(cl);
            }
            cl += 1;
        }
    }
    for big in 0..3u64 {
        for k in 0..500u64 {
            sizes.push(800 + (big * 97 + k * 53) % 900);
            clusters.push(cl);
        }
        cl += 1;
    }
    (sizes, clusters)
}

#[test]
fn per_node_copies_small_clusters_once_to_every_node() {
    let (sizes, clusters) = small_clusters();
    let s = SampleSet {
        sizes: &sizes,
        labels: None,
        clusters: Some(&clusters),
    };
    let total: u64 = sizes.iter().sum();
    let nodes = 4u32;
    let small: Vec<u32> = (0..sizes.len() as u32)
        .filter(|&i| clusters[i as usize] < 180)
        .collect();
    for nm in [1u32, 3, 4, 16, 40] {
        let c = PlanConfig {
            mini_epochs: Some(nm),
            ..cfg(Strategy::Clustered, total, nodes)
        };
        assert_eq!(c.cluster_copies, ClusterCopies::PerNode, "the default");
        for epoch in 0..2 {
            // Also: each copy in exactly one mini-epoch of each node, the other samples once
            // an epoch, clusters of 4 samples or more (4 = nodes) not copied.
            check(&s, &c, epoch).unwrap_or_else(|e| panic!("nm {nm} e{epoch}: {e}"));
            let plans = all_nodes(&s, &c, epoch);
            assert_eq!(plans[0].copied, small, "nm {nm}");
            let mut times = vec![0u32; sizes.len()];
            for p in &plans {
                for me in &p.mini_epochs {
                    me.samples.iter().for_each(|&i| times[i as usize] += 1);
                }
            }
            for (id, &t) in times.iter().enumerate() {
                let want = if clusters[id] < 180 { nodes } else { 1 };
                assert_eq!(t, want, "nm {nm}: sample {id} (cluster {})", clusters[id]);
            }
            // 180 copied clusters over nm mini-epochs: within one of even on every node.
            for p in &plans {
                let per_me: Vec<usize> = p
                    .mini_epochs
                    .iter()
                    .map(|me| {
                        let mut cl: Vec<u32> = me
                            .samples
                            .iter()
                            .filter(|&&i| clusters[i as usize] < 180)
                            .map(|&i| clusters[i as usize])
                            .collect();
                        cl.dedup();
                        cl.len()
                    })
                    .collect();
                let even = 180 / nm as usize;
                assert!(
                    per_me
                        .iter()
                        .all(|&k| k == even || k == 180usize.div_ceil(nm as usize)),
                    "nm {nm}: {per_me:?}"
                );
            }
        }
    }
    // One node: nothing is smaller than one node, so nothing is copied.
    let c = cfg(Strategy::Clustered, total, 1);
    assert!(plan_epoch(&s, &c, 0).unwrap().copied.is_empty());
}

#[test]
fn per_node_copies_choose_the_smallest_count_that_fits() {
    let (sizes, clusters) = small_clusters();
    let s = SampleSet {
        sizes: &sizes,
        labels: None,
        clusters: Some(&clusters),
    };
    let total: u64 = sizes.iter().sum();
    for slot in [total / 4, total / 20, total / 100] {
        let c = cfg(Strategy::Clustered, slot, 4);
        let lay = layout(&s, &c).unwrap();
        assert!(lay.bound.unwrap() <= slot);
        check(&s, &c, 0).unwrap();
        if lay.nm > 1 {
            let ask = PlanConfig {
                mini_epochs: Some(lay.nm - 1),
                ..c.clone()
            };
            match mini_epoch_count(&s, &ask) {
                Err(PlanError::TooFewMiniEpochs { needed, bytes, .. }) => {
                    assert_eq!(needed, lay.nm);
                    assert!(bytes > slot);
                }
                other => panic!("{other:?}"),
            }
        }
        // The copies of per-share copying take budget the per-node rule leaves to the rest.
        let ps = with_copies(c.clone(), ClusterCopies::PerShare);
        if let Ok(nm) = mini_epoch_count(&s, &ps) {
            assert!(
                nm >= lay.nm,
                "slot {slot}: per-share {nm} < per-node {}",
                lay.nm
            );
        }
    }
}

#[test]
fn per_node_summary_counts_each_copy_once_per_node() {
    let (sizes, clusters) = small_clusters();
    let s = SampleSet {
        sizes: &sizes,
        labels: None,
        clusters: Some(&clusters),
    };
    let total: u64 = sizes.iter().sum();
    let c = PlanConfig {
        mini_epochs: Some(8),
        ..cfg(Strategy::Clustered, total, 4)
    };
    let sum = summarize(&s, &c, 0, None).unwrap();
    let small: u64 = (0..60).map(|_| 1 + 2 + 3).sum();
    let small_bytes: u64 = sizes
        .iter()
        .zip(&clusters)
        .filter(|(_, &cl)| cl < 180)
        .map(|(&b, _)| b)
        .sum();
    assert_eq!(sum.cluster_copies, Some(ClusterCopies::PerNode));
    assert_eq!((sum.copied_samples, sum.copied_bytes), (small, small_bytes));
    // Each node holds the dataset's share of the rest plus every copy once.
    let held: u64 = sum.node_bytes.iter().map(|n| n.bytes).sum();
    assert_eq!(held, total + 3 * small_bytes);
    let all: u64 = sum.node_bytes.iter().map(|n| n.samples).sum();
    assert_eq!(all, sizes.len() as u64 + 3 * small);
    let cl = sum.classes.as_ref().unwrap();
    assert_eq!(cl.copied_classes, 180);
    for r in cl.spread.iter().filter(|r| r.copied) {
        // Four copies of a cluster, in four different mini-epochs (nm = 8 ≥ 4 nodes).
        assert_eq!((r.min, r.max), (0, r.samples), "{r:?}");
    }
    assert!(sum
        .to_string()
        .contains("copied once to every node, each copy in one of its mini-epochs"));
    let json = serde_json::to_value(&sum).unwrap();
    assert_eq!(json["cluster_copies"], "per-node");
}

#[test]
fn cluster_copies_parse_and_print() {
    for c in [ClusterCopies::PerNode, ClusterCopies::PerShare] {
        assert_eq!(c.to_string().parse::<ClusterCopies>(), Ok(c));
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(json, format!("\"{c}\""));
    }
    let e = "every".parse::<ClusterCopies>().unwrap_err();
    assert!(e.contains("per-node or per-share"), "{e}");
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
