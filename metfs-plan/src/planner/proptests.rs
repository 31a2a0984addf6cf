//! Property tests of the planner: on arbitrary catalogs (tiny, huge, skewed sizes; labels and
//! clusters), every strategy's plan keeps the promises [`super::tests`] checks on fixtures,
//! nm is the smallest guaranteed, and the balancing step keeps its three guarantees.

use proptest::prelude::{prop, prop_assert, prop_assert_eq, prop_oneof, proptest, Just};
use proptest::strategy::Strategy as _;

use super::balance::{balance, Scratch};
use super::tests::{all_nodes, cfg, check, set, with_copies};
use super::*;
use metfs_planrng::splitmix64;

fn arb_sizes(n: usize) -> impl proptest::strategy::Strategy<Value = Vec<u64>> {
    prop_oneof![
        prop::collection::vec(0u64..100, n),
        prop::collection::vec(prop_oneof![Just(1u64), Just(1u64), Just(1000u64)], n),
        prop::collection::vec(1u64..1_000_000, n),
    ]
}

fn arb_input(
) -> impl proptest::strategy::Strategy<Value = (Vec<u64>, Vec<u32>, Vec<u32>, u32, u64, Option<u32>)>
{
    (1usize..160, 1u32..9, 1u32..40).prop_flat_map(|(n, ncl, nclu)| {
        (
            arb_sizes(n),
            prop::collection::vec(0..ncl, n),
            prop::collection::vec(0..nclu, n),
            1u32..5,
            0u64..1000,
            prop::option::weighted(0.2, 1u32..12),
        )
    })
}

fn run_property(
    strategy: Strategy,
    copies: ClusterCopies,
    input: (Vec<u64>, Vec<u32>, Vec<u32>, u32, u64, Option<u32>),
) -> Result<(), String> {
    let (sizes, labels, clusters, nodes, frac, req) = input;
    let s = set(&sizes, &labels, &clusters);
    let total: u64 = sizes.iter().sum();
    let max = sizes.iter().copied().max().unwrap();
    let slot = max + total * frac / 1000;
    let c = PlanConfig {
        mini_epochs: req,
        ..with_copies(cfg(strategy, slot, nodes), copies)
    };
    match layout(&s, &c) {
        Err(PlanError::TooFewMiniEpochs { needed, .. }) => {
            let ok = PlanConfig {
                mini_epochs: Some(needed),
                ..c.clone()
            };
            check(&s, &ok, 0)?;
            return Ok(());
        }
        Err(PlanError::TooManyMiniEpochs { .. }) if req.is_some() => return Ok(()),
        Err(PlanError::ClustersTooLarge { .. }) if strategy == Strategy::Clustered => return Ok(()),
        Err(e) => return Err(e.to_string()),
        Ok(lay) if req.is_none() && lay.nm > 1 => {
            // The count is the smallest: one fewer is refused, naming it.
            let fewer = PlanConfig {
                mini_epochs: Some(lay.nm - 1),
                ..c.clone()
            };
            match layout(&s, &fewer) {
                Err(PlanError::TooFewMiniEpochs { needed, .. }) if needed == lay.nm => {}
                other => return Err(format!("nm {} not the smallest: {other:?}", lay.nm)),
            }
        }
        Ok(_) => {}
    }
    let a = check(&s, &c, 0)?;
    let b = check(&s, &c, 1)?;
    if strategy == Strategy::Sequential && a != b {
        return Err("sequential changed between epochs".into());
    }
    if all_nodes(&s, &c, 3) != all_nodes(&s, &c, 3) {
        return Err("not deterministic".into());
    }
    Ok(())
}

/// Sizes anywhere in u64, with many near the top, where sums and roundings overflow.
fn arb_huge_size() -> impl proptest::strategy::Strategy<Value = u64> {
    prop_oneof![
        Just(u64::MAX),
        Just(u64::MAX - 1),
        Just(1u64 << 63),
        Just(0u64),
        (u64::MAX - 10_000)..=u64::MAX,
        0u64..=u64::MAX,
        0u64..1000,
    ]
}

proptest! {
    #![proptest_config(proptest::test_runner::Config { cases: 400, ..Default::default() })]

    /// Any sizes and budget: the planner answers (a plan or an error), never panics or
    /// wraps; a plan's mini-epochs fit the slot and cover the node's share once.
    #[test]
    fn prop_huge_sizes_never_overflow(
        sizes in prop::collection::vec(arb_huge_size(), 1..12),
        slot in prop_oneof![Just(u64::MAX), 0u64..=u64::MAX, 0u64..100_000],
        strategy in prop_oneof![
            Just(Strategy::Sequential),
            Just(Strategy::Random),
            Just(Strategy::Stratified),
            Just(Strategy::Clustered),
        ],
        nodes in 1u32..4,
        req in prop::option::weighted(0.3, 1u32..6),
        copies in prop_oneof![Just(ClusterCopies::PerNode), Just(ClusterCopies::PerShare)],
    ) {
        let labels: Vec<u32> = (0..sizes.len() as u32).map(|i| i % 3).collect();
        let clusters: Vec<u32> = (0..sizes.len() as u32).map(|i| i % 2).collect();
        let s = set(&sizes, &labels, &clusters);
        let c = PlanConfig { mini_epochs: req, ..with_copies(cfg(strategy, slot, nodes), copies) };
        let total = sizes.iter().try_fold(0u64, |a, &b| a.checked_add(b));
        match plan_epoch(&s, &c, 1) {
            Err(PlanError::TotalTooLarge { .. }) => prop_assert!(total.is_none()),
            Err(_) => {}
            Ok(plan) => {
                prop_assert!(total.is_some());
                for me in &plan.mini_epochs {
                    prop_assert!(me.bytes <= slot);
                    let sum = me.samples.iter().map(|&i| u128::from(sizes[i as usize])).sum::<u128>();
                    prop_assert_eq!(sum, u128::from(me.bytes));
                }
                let _ = summarize(&s, &c, 1, None);
            }
        }
    }
}

proptest! {
    #![proptest_config(proptest::test_runner::Config { cases: 160, ..Default::default() })]

    #[test]
    fn prop_sequential(input in arb_input()) {
        prop_assert_eq!(run_property(Strategy::Sequential, ClusterCopies::default(), input), Ok(()));
    }

    #[test]
    fn prop_random(input in arb_input()) {
        prop_assert_eq!(run_property(Strategy::Random, ClusterCopies::default(), input), Ok(()));
    }

    #[test]
    fn prop_stratified(input in arb_input()) {
        prop_assert_eq!(run_property(Strategy::Stratified, ClusterCopies::default(), input), Ok(()));
    }

    /// Per node: every small cluster (fewer samples than nodes) once on every node, whole in
    /// one of its mini-epochs, spread within one over them (checked by `check`).
    #[test]
    fn prop_clustered_per_node(input in arb_input()) {
        prop_assert_eq!(run_property(Strategy::Clustered, ClusterCopies::PerNode, input), Ok(()));
    }

    #[test]
    fn prop_clustered_per_share(input in arb_input()) {
        prop_assert_eq!(run_property(Strategy::Clustered, ClusterCopies::PerShare, input), Ok(()));
    }

    /// The balancing step itself: class counts within one, colour counts within one,
    /// colour bytes within the largest sample.
    #[test]
    fn prop_balance(
        k in 1u32..12,
        groups in prop::collection::vec((1usize..30, 0u8..3), 1..25),
        seed in 0u64..1000,
    ) {
        let mut sizes = Vec::new();
        let mut bounds = vec![0usize];
        let mut x = seed;
        for &(len, kind) in &groups {
            for _ in 0..len {
                x = splitmix64(&mut x);
                sizes.push(match kind { 0 => x % 7, 1 => [1, 1, 1000][(x % 3) as usize], _ => x % 100_000 });
            }
            bounds.push(sizes.len());
        }
        let mut ids: Vec<u32> = (0..sizes.len() as u32).collect();
        let mut color = vec![NONE; sizes.len()];
        let mut rng = super::rng::stream(seed, 0);
        let mut sc = Scratch::default();
        balance(k, &mut ids, &bounds, &sizes, &mut rng, &mut sc, |id, c| {
            assert_eq!(color[id as usize], NONE);
            color[id as usize] = c;
        });
        let ku = k as usize;
        let mut load = vec![0u64; ku];
        let mut count = vec![0usize; ku];
        for (id, &c) in color.iter().enumerate() {
            prop_assert!((c as usize) < ku);
            load[c as usize] += sizes[id];
            count[c as usize] += 1;
        }
        let smax = sizes.iter().copied().max().unwrap();
        prop_assert!(load.iter().max().unwrap() - load.iter().min().unwrap() <= smax);
        prop_assert!(count.iter().max().unwrap() - count.iter().min().unwrap() <= 1);
        for w in bounds.windows(2) {
            let mut per = vec![0usize; ku];
            for id in w[0]..w[1] {
                per[color[id] as usize] += 1;
            }
            let len = w[1] - w[0];
            prop_assert!(per.iter().all(|&p| p == len / ku || p == len.div_ceil(ku)));
        }
    }
}
