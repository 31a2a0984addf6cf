use proptest::prelude::*;

use super::*;

fn config(nodes: u32, seed: u64, budget: u64, extra: f64) -> AggregateConfig {
    AggregateConfig {
        nodes,
        seed,
        budget,
        extra,
    }
}

/// Sizes and a budget that always fits: twice the even split plus the largest sample.
fn sizes_and_budget() -> impl Strategy<Value = (Vec<u64>, u32, u64)> {
    (prop::collection::vec(0u64..1000, 1..300), 1u32..9).prop_map(|(sizes, n)| {
        let total: u64 = sizes.iter().sum();
        let largest = sizes.iter().copied().max().unwrap_or(0);
        let budget = 2 * total / u64::from(n) + largest + 1;
        (sizes, n, budget)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn shares_partition_the_catalog_every_epoch(
        (sizes, n, budget) in sizes_and_budget(),
        seed: u64,
        epoch in 0u64..1000,
        extra in 0.0f64..=1.0,
    ) {
        let cfg = config(n, seed, budget, extra);
        let l = layout(&sizes, &cfg, epoch).unwrap();
        let mut seen = vec![0u32; sizes.len()];
        for i in 0..n {
            prop_assert!(l.share(i).windows(2).all(|w| w[0] < w[1]));
            prop_assert!(l.cache(i).windows(2).all(|w| w[0] < w[1]));
            let share_bytes: u64 = l.share(i).iter().map(|&j| sizes[j as usize]).sum();
            let cache_bytes: u64 = l.cache(i).iter().map(|&j| sizes[j as usize]).sum();
            prop_assert_eq!(share_bytes, l.share_bytes(i));
            prop_assert_eq!(cache_bytes, l.cache_bytes(i));
            prop_assert!(cache_bytes <= budget);
            for &j in l.share(i) {
                seen[j as usize] += 1;
                prop_assert_eq!(l.owner(j), i);
                prop_assert!(l.holds(i, j));
            }
        }
        prop_assert!(seen.iter().all(|&c| c == 1));
        // Within one sample of the even split by bytes.
        let total: u64 = sizes.iter().sum();
        let largest = sizes.iter().copied().max().unwrap();
        for i in 0..n {
            prop_assert!(l.share_bytes(i) <= total / u64::from(n) + largest + 1);
        }
        // Same inputs, same layout.
        prop_assert_eq!(layout(&sizes, &cfg, epoch).unwrap(), l);
    }

    #[test]
    fn every_needed_sample_has_exactly_one_source(
        (sizes, n, budget) in sizes_and_budget(),
        seed: u64,
        epoch in 0u64..1000,
        extra in 0.0f64..=1.0,
        dead_mask in 0u32..512,
    ) {
        let cfg = config(n, seed, budget, extra);
        let prev = layout(&sizes, &cfg, epoch).unwrap();
        let next = layout(&sizes, &cfg, epoch + 1).unwrap();
        let dead: Vec<u32> = (0..n).filter(|r| dead_mask >> r & 1 == 1).collect();
        let t = transition(Some(&prev), &next, &sizes, &dead).unwrap();
        prop_assert_eq!(t.nodes.len(), n as usize);
        for i in 0..n {
            let plan = &t.nodes[i as usize];
            if dead.contains(&i) {
                prop_assert_eq!(plan, &NodePlan::default());
                continue;
            }
            let mut got: Vec<u32> = plan.local.iter().copied()
                .chain(plan.peer.iter().map(|&(j, _)| j))
                .chain(plan.tier.iter().copied())
                .collect();
            got.sort_unstable();
            prop_assert_eq!(&got[..], next.cache(i), "node {} sources", i);
            for &j in &plan.local {
                prop_assert!(prev.holds(i, j));
            }
            for &(j, from) in &plan.peer {
                prop_assert!(from != i && !dead.contains(&from) && prev.holds(from, j));
                prop_assert!(!prev.holds(i, j));
            }
            for &j in &plan.tier {
                prop_assert!((0..n).all(|k| dead.contains(&k) || !prev.holds(k, j)));
            }
        }
        if dead.is_empty() {
            // Every sample is in some share, so someone holds it: no tier reads.
            prop_assert_eq!(t.tier_bytes(), 0);
            prop_assert!(t.nodes.iter().all(|p| p.tier.is_empty()));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Samples of several files laid out and expanded to files: a sample's files share their
    /// node, holders and source; the always files are in every share and cache and, after
    /// epoch 0, always linked locally; files of no sample are nowhere; the bytes are the files'.
    #[test]
    fn files_of_a_sample_travel_together_and_the_always_files_stay(
        file_sizes in prop::collection::vec(0u64..1000, 3..200),
        cut in prop::collection::vec(any::<bool>(), 200),
        n in 2u32..6,
        seed: u64,
        epoch in 0u64..100,
        extra in 0.0f64..=1.0,
    ) {
        let files = file_sizes.len() as u32;
        // The last file is always, the one before it in no sample; runs of the rest are samples.
        let (always, loose) = (vec![files - 1], files - 2);
        let mut units: Vec<Vec<u32>> = vec![];
        for f in 0..loose {
            if units.is_empty() || cut[f as usize] {
                units.push(vec![f]);
            } else {
                units.last_mut().unwrap().push(f);
            }
        }
        let unit_sizes: Vec<u64> =
            units.iter().map(|u| u.iter().map(|&f| file_sizes[f as usize]).sum()).collect();
        let always_bytes = file_sizes[always[0] as usize];
        let total: u64 = unit_sizes.iter().sum();
        let largest = unit_sizes.iter().copied().max().unwrap_or(0);
        let dealt = 2 * total / u64::from(n) + largest + 1;
        let cfg = config(n, seed, dealt, extra);
        let members = |s: u32| -> &[u32] { &units[s as usize] };
        let lay = |e: u64| {
            layout(&unit_sizes, &cfg, e).unwrap().over_files(&file_sizes, &members, &always, dealt + always_bytes)
        };
        let (prev, next) = (lay(epoch), lay(epoch + 1));
        prop_assert_eq!(next.samples(), files);
        prop_assert_eq!(next.owner(loose), NO_OWNER);
        for i in 0..n {
            prop_assert!(next.share(i).contains(&always[0]) && next.cache(i).contains(&always[0]));
            prop_assert!(!next.cache(i).contains(&loose));
            let bytes: u64 = next.cache(i).iter().map(|&f| file_sizes[f as usize]).sum();
            prop_assert_eq!(bytes, next.cache_bytes(i));
            prop_assert!(bytes <= next.config().budget);
            for u in &units {
                let held: Vec<bool> = u.iter().map(|&f| next.holds(i, f)).collect();
                prop_assert!(held.iter().all(|&h| h == held[0]), "node {} holds part of {:?}", i, u);
            }
        }
        let t = transition(Some(&prev), &next, &file_sizes, &[]).unwrap();
        for plan in &t.nodes {
            prop_assert!(plan.local.contains(&always[0]));
            prop_assert!(plan.tier.is_empty());
            for u in &units {
                let from: Vec<Option<u32>> = u.iter().map(|f| plan.peer.iter().find(|p| p.0 == *f).map(|p| p.1)).collect();
                prop_assert!(from.iter().all(|x| *x == from[0]), "{:?} comes from {:?}", u, from);
            }
        }
    }
}

#[test]
fn epoch_zero_reads_everything_from_the_tier() {
    let sizes = vec![10u64; 100];
    let cfg = config(4, 1, 1000, 0.2);
    let l = layout(&sizes, &cfg, 0).unwrap();
    let t = transition(None, &l, &sizes, &[]).unwrap();
    let cached: u64 = (0..4).map(|i| l.cache_bytes(i)).sum();
    assert_eq!(t.tier_bytes(), cached);
    assert_eq!(t.peer_bytes() + t.local_bytes(), 0);
}

#[test]
fn a_dead_owner_is_replaced_by_a_holder_then_the_tier() {
    let sizes = vec![1u64; 2000];
    let cfg = config(4, 9, 2000, 0.3);
    let prev = layout(&sizes, &cfg, 0).unwrap();
    let next = layout(&sizes, &cfg, 1).unwrap();
    let t = transition(Some(&prev), &next, &sizes, &[2]).unwrap();
    assert!(t.is_dead(2) && t.nodes[2] == NodePlan::default());
    let mut from_holder = 0;
    let mut from_tier = 0;
    for i in [0u32, 1, 3] {
        for &(j, from) in &t.nodes[i as usize].peer {
            if prev.owner(j) == 2 {
                assert_ne!(from, 2);
                from_holder += 1;
            }
        }
        for &j in &t.nodes[i as usize].tier {
            assert_eq!(prev.owner(j), 2);
            assert!([0, 1, 3].iter().all(|&k| !prev.holds(k, j)));
            from_tier += 1;
        }
    }
    // With p = 0.3 about 0.7^2·… of node 2's share is held by nobody else: both happen.
    assert!(
        from_holder > 0 && from_tier > 0,
        "{from_holder} {from_tier}"
    );
}

#[test]
fn extras_are_kept_across_epochs_and_near_p() {
    let n = 4u32;
    let sizes = vec![1u64; 20_000];
    let cfg = config(n, 5, 20_000, 0.25);
    let a = layout(&sizes, &cfg, 3).unwrap();
    let b = layout(&sizes, &cfg, 4).unwrap();
    for i in 0..n {
        // A sample outside both shares is held in both epochs or in neither.
        for j in 0..20_000u32 {
            if a.owner(j) != i && b.owner(j) != i {
                assert_eq!(a.holds(i, j), b.holds(i, j));
            }
        }
        // α = 1/n + p(1 − 1/n) = 0.4375.
        assert!((a.alpha(i) - 0.4375).abs() < 0.01, "{}", a.alpha(i));
    }
    assert_ne!(a.share(0), b.share(0));
}

#[test]
fn a_tight_budget_cuts_the_extras_not_the_share() {
    let sizes = vec![10u64; 1000];
    let cfg = config(4, 5, 3000, 1.0);
    let l = layout(&sizes, &cfg, 0).unwrap();
    for i in 0..4 {
        assert_eq!(l.cache_bytes(i), 3000);
        assert_eq!(l.share_bytes(i), 2500);
    }
}

#[test]
fn shares_are_equal_counts_for_equal_sizes() {
    let sizes = vec![7u64; 1003];
    let l = layout(&sizes, &config(4, 1, 10_000, 0.0), 0).unwrap();
    let counts: Vec<usize> = (0..4).map(|i| l.share(i).len()).collect();
    assert!(
        counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1,
        "{counts:?}"
    );
    assert_eq!(counts.iter().sum::<usize>(), 1003);
}

#[test]
fn a_dataset_larger_than_the_aggregate_budget_is_refused_with_the_numbers() {
    let sizes = vec![100u64; 1000];
    let err = layout(&sizes, &config(8, 1, 12_000, 0.1), 0).unwrap_err();
    assert_eq!(
        err,
        PlanError::DoesNotFit {
            total: 100_000,
            samples: 1000,
            nodes: 8,
            budget: 12_000,
            aggregate: 96_000,
            missing: 4_000,
        }
    );
    let text = err.to_string();
    for number in [
        "100000",
        "1000 samples",
        "8 nodes",
        "12000",
        "96000",
        "4000 bytes short",
    ] {
        assert!(text.contains(number), "{text}");
    }
}

#[test]
fn other_bad_inputs() {
    let sizes = vec![100u64, 5000];
    assert_eq!(
        layout(&sizes, &config(4, 1, 1000, 0.0), 0).unwrap_err(),
        PlanError::SampleTooLarge {
            sample: 1,
            size: 5000,
            budget: 1000
        }
    );
    assert_eq!(
        layout(&[], &config(4, 1, 1000, 0.0), 0).unwrap_err(),
        PlanError::Empty
    );
    assert_eq!(
        layout(&sizes, &config(0, 1, 1000, 0.0), 0).unwrap_err(),
        PlanError::NoNodes
    );
    assert!(matches!(
        layout(&sizes, &config(4, 1, 9000, 1.5), 0),
        Err(PlanError::BadExtra(_))
    ));
    // Fits in aggregate (200 ≤ 2 × 100), but a share holding both samples cannot.
    let err = layout(&[100, 100], &config(2, 1, 100, 0.0), 0);
    assert!(err.is_ok(), "{err:?}");
    let err = layout(&[60, 60, 60], &config(2, 1, 95, 0.0), 0).unwrap_err();
    assert!(
        matches!(
            err,
            PlanError::ShareTooLarge {
                share: 120,
                budget: 95,
                ..
            }
        ),
        "{err}"
    );
    // Layouts of different catalogs or seeds do not make a transition.
    let a = layout(&sizes, &config(2, 1, 6000, 0.0), 0).unwrap();
    let b = layout(&sizes, &config(2, 2, 6000, 0.0), 1).unwrap();
    assert!(matches!(
        transition(Some(&a), &b, &sizes, &[]),
        Err(PlanError::Mismatch(_))
    ));
    assert!(matches!(
        transition(None, &a, &[1], &[]),
        Err(PlanError::Mismatch(_))
    ));
    assert_eq!(
        transition(None, &a, &sizes, &[7]).unwrap_err(),
        PlanError::BadNode { rank: 7, nodes: 2 }
    );
}
