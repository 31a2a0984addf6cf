//! Tests of dependent sampling: each job's order is a uniformly random permutation of its
//! dataset (chi-square over fixed seeds, with lockstep and with partial rounds), the printed
//! Algorithm 1 is not, shared samples are drawn together as often as Theorem 1 allows, views
//! partition each dataset (proptest), Definition 1's tree, and the errors.

use std::collections::{BTreeSet, HashMap};

use proptest::prelude::{prop, prop_assert, prop_assert_eq, proptest};
use statrs::distribution::{ChiSquared, ContinuousCDF};

use super::*;

/// Pearson's statistic of `counts` against equal expectations over `cells` cells.
fn chi_square(counts: &HashMap<Vec<u32>, u64>, cells: u64, trials: u64) -> f64 {
    let expected = trials as f64 / cells as f64;
    let seen: f64 = counts
        .values()
        .map(|&c| (c as f64 - expected).powi(2) / expected)
        .sum();
    // Cells never seen contribute `expected` each.
    seen + (cells - counts.len() as u64) as f64 * expected
}

fn factorial(n: usize) -> u64 {
    (1..=n as u64).product()
}

/// The critical value at p = 0.001: a uniform sampler exceeds it once in a thousand seeds'
/// worth of experiments, and the seeds are fixed, so the test is deterministic.
fn critical(df: u64) -> f64 {
    ChiSquared::new(df as f64).unwrap().inverse_cdf(0.999)
}

/// Counts each job's whole order over `trials` epochs; `schedule(round)` says which jobs draw
/// in that round (those with nothing left are skipped).
fn permutation_counts(
    datasets: &[&[u32]],
    rule: Rule,
    trials: u64,
    schedule: impl Fn(usize, usize) -> bool,
) -> Vec<HashMap<Vec<u32>, u64>> {
    let mut counts = vec![HashMap::new(); datasets.len()];
    for epoch in 0..trials {
        let mut s = DependentSampler::with_rule(11, epoch, rule);
        for d in datasets {
            s.add_job(d).unwrap();
        }
        let mut orders = vec![Vec::new(); datasets.len()];
        let mut round = 0;
        loop {
            let mut jobs: Vec<usize> = (0..datasets.len())
                .filter(|&j| s.remaining(j) > 0 && schedule(round, j))
                .collect();
            if jobs.is_empty() {
                jobs = (0..datasets.len())
                    .filter(|&j| s.remaining(j) > 0)
                    .collect();
            }
            if jobs.is_empty() {
                break;
            }
            for (j, e) in s.draw(&jobs).unwrap() {
                orders[j].push(e);
            }
            round += 1;
        }
        for (j, o) in orders.into_iter().enumerate() {
            *counts[j].entry(o).or_insert(0) += 1;
        }
    }
    counts
}

/// For each job, (statistic, critical value) of its orders against the uniform permutation.
fn uniformity(
    datasets: &[&[u32]],
    rule: Rule,
    trials: u64,
    schedule: impl Fn(usize, usize) -> bool,
) -> Vec<(f64, f64)> {
    let counts = permutation_counts(datasets, rule, trials, schedule);
    counts
        .iter()
        .zip(datasets)
        .map(|(c, d)| {
            let cells = factorial(d.len());
            for order in c.keys() {
                let mut sorted = order.clone();
                sorted.sort_unstable();
                let mut want = d.to_vec();
                want.sort_unstable();
                assert_eq!(sorted, want, "an order is not a permutation of the dataset");
            }
            (chi_square(c, cells, trials), critical(cells - 1))
        })
        .collect()
}

/// Three jobs whose loops reach a non-empty S often: the smallest dataset is not inside the
/// others, and the two larger ones share more with each other than with it.
const OVERLAP: [&[u32]; 3] = [&[0, 1, 2], &[1, 2, 3, 4], &[2, 3, 4, 5, 6]];
/// Nested datasets, as the paper's "varying in size" case.
const NESTED: [&[u32]; 3] = [&[0, 1], &[0, 1, 2, 3], &[0, 1, 2, 3, 4]];

#[test]
fn each_job_order_is_a_uniform_permutation() {
    for datasets in [&OVERLAP[..], &NESTED[..]] {
        for (j, (stat, crit)) in uniformity(datasets, Rule::Corrected, 24_000, |_, _| true)
            .into_iter()
            .enumerate()
        {
            assert!(
                stat < crit,
                "job {j} of {datasets:?}: chi-square {stat:.1} ≥ {crit:.1}"
            );
        }
    }
}

#[test]
fn uniform_with_partial_rounds() {
    // The daemon draws for the jobs that need a view, not always for all: job 0 draws alone
    // every third round, job 2 skips every other round.
    let schedule = |round: usize, j: usize| match j {
        0 => true,
        1 => !round.is_multiple_of(3),
        _ => !round.is_multiple_of(2) && !round.is_multiple_of(3),
    };
    for (j, (stat, crit)) in uniformity(&OVERLAP, Rule::Corrected, 24_000, schedule)
        .into_iter()
        .enumerate()
    {
        assert!(stat < crit, "job {j}: chi-square {stat:.1} ≥ {crit:.1}");
    }
}

#[test]
fn the_printed_rule_is_not_uniform() {
    // The same experiment as above with Algorithm 1 as printed: some job's orders are far from
    // uniform, which is why the corrections exist (and that the test above can fail).
    let worst = uniformity(&OVERLAP, Rule::Printed, 24_000, |_, _| true)
        .into_iter()
        .map(|(stat, crit)| stat / crit)
        .fold(0.0, f64::max);
    assert!(
        worst > 2.0,
        "printed rule: worst chi-square / critical = {worst:.2}"
    );
}

#[test]
fn first_draws_are_uniform_on_larger_datasets() {
    // A different view of Theorem 2 on datasets too large to count permutations: for each job,
    // which sample it draws at positions 0 and 3 is uniform over its dataset.
    let d: Vec<Vec<u32>> = vec![
        (0..12).collect(),
        (6..20).collect(),
        (3..9).chain(14..24).collect(),
        (0..24).step_by(2).collect(),
    ];
    let ds: Vec<&[u32]> = d.iter().map(Vec::as_slice).collect();
    let trials = 8_000;
    for pos in [0usize, 3] {
        let mut counts = vec![HashMap::new(); ds.len()];
        for epoch in 0..trials {
            let orders = dependent_orders(&ds, 5, epoch).unwrap();
            for (j, o) in orders.iter().enumerate() {
                *counts[j].entry(vec![o[pos]]).or_insert(0u64) += 1;
            }
        }
        for (j, c) in counts.iter().enumerate() {
            let n = ds[j].len() as u64;
            let (stat, crit) = (chi_square(c, n, trials), critical(n - 1));
            assert!(stat < crit, "job {j} position {pos}: {stat:.1} ≥ {crit:.1}");
        }
    }
}

#[test]
fn equal_datasets_give_equal_orders() {
    let d: Vec<u32> = (0..500).map(|i| i * 3).collect();
    let orders = dependent_orders(&[&d, &d, &d, &d], 9, 4).unwrap();
    assert!(orders.iter().all(|o| o == &orders[0]));
    assert_ne!(orders[0], d, "the order is shuffled");
    // Another epoch, another order.
    assert_ne!(dependent_orders(&[&d], 9, 5).unwrap()[0], orders[0]);
}

#[test]
fn shared_draws_reach_the_bound_of_theorem_1() {
    // Two jobs, |D1| = 100 inside |D2| = 125: in the first round they draw the same sample
    // with probability |I| / max = 0.8 (Theorem 1's optimum); independent draws would share
    // with probability 1/125.
    let d1: Vec<u32> = (0..100).collect();
    let d2: Vec<u32> = (0..125).collect();
    let trials = 4000u64;
    let mut same = 0;
    for epoch in 0..trials {
        let mut s = DependentSampler::new(3, epoch);
        s.add_job(&d1).unwrap();
        s.add_job(&d2).unwrap();
        let p = s.draw(&[0, 1]).unwrap();
        same += u64::from(p[0].1 == p[1].1);
    }
    let rate = same as f64 / trials as f64;
    assert!((rate - 0.8).abs() < 0.03, "shared rate {rate}");
}

#[test]
fn overlapping_jobs_share_most_of_their_views() {
    // 75% overlap, equal sizes and views: the union of the two jobs' mini-epoch k is close to
    // |D1 ∪ D2| / nm, i.e. each shared sample is in the same mini-epoch of both.
    let d1: Vec<u32> = (0..4000).collect();
    let d2: Vec<u32> = (1000..5000).collect();
    let sizes = vec![1u64; 5000];
    let views = dependent_views(&[&d1, &d2], &sizes, &[400, 400], 1, 0).unwrap();
    assert_eq!(views[0].len(), 10);
    assert_eq!(views[1].len(), 10);
    let mut staged = 0;
    for (a, b) in views[0].iter().zip(&views[1]) {
        let union: BTreeSet<u32> = a.samples.iter().chain(&b.samples).copied().collect();
        staged += union.len();
    }
    // Staging each mini-epoch's union reads every sample of D1 ∪ D2 exactly once.
    assert_eq!(staged, 5000);
}

/// Checks the promises of `dependent_views` for one input.
fn check_views(
    datasets: &[Vec<u32>],
    sizes: &[u64],
    view_bytes: &[u64],
    epoch: u64,
) -> Result<(), String> {
    let ds: Vec<&[u32]> = datasets.iter().map(Vec::as_slice).collect();
    let views = dependent_views(&ds, sizes, view_bytes, 2, epoch).map_err(|e| e.to_string())?;
    let again = dependent_views(&ds, sizes, view_bytes, 2, epoch).map_err(|e| e.to_string())?;
    if views != again {
        return Err("not deterministic".into());
    }
    for (j, job) in views.iter().enumerate() {
        let mut all: Vec<u32> = Vec::new();
        for v in job {
            if v.samples.is_empty() || !v.samples.windows(2).all(|w| w[0] < w[1]) {
                return Err(format!("job {j}: an empty or unsorted view"));
            }
            let bytes: u64 = v.samples.iter().map(|&s| sizes[s as usize]).sum();
            if bytes != v.bytes || bytes > view_bytes[j] {
                return Err(format!("job {j}: view of {bytes} bytes"));
            }
            all.extend(&v.samples);
        }
        all.sort_unstable();
        let mut want = datasets[j].clone();
        want.sort_unstable();
        if all != want {
            return Err(format!("job {j}: views do not partition the dataset"));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    #[test]
    fn views_partition_each_dataset(
        universe in 1usize..120,
        jobs in 1usize..6,
        picks in prop::collection::vec(prop::collection::vec(0u32..1000, 1..120), 6),
        sizes in prop::collection::vec(1u64..50, 120),
        extra in prop::collection::vec(0u64..200, 6),
        epoch in 0u64..5,
    ) {
        let datasets: Vec<Vec<u32>> = picks[..jobs]
            .iter()
            .map(|p| {
                let set: BTreeSet<u32> = p.iter().map(|&s| s % universe as u32).collect();
                // A shuffled-looking input order: datasets need not be sorted.
                set.into_iter().rev().collect()
            })
            .collect();
        let view_bytes: Vec<u64> = extra[..jobs].iter().map(|&e| 49 + e).collect();
        let r = check_views(&datasets, &sizes, &view_bytes, epoch);
        prop_assert!(r.is_ok(), "{:?}", r);
    }

    #[test]
    fn orders_are_permutations_and_equal_datasets_stay_together(
        universe in 1u32..200,
        a in prop::collection::btree_set(0u32..200, 1..100),
        seed in 0u64..1000,
    ) {
        let a: Vec<u32> = a.into_iter().map(|s| s % universe).collect::<BTreeSet<_>>().into_iter().collect();
        let b: Vec<u32> = (0..universe).collect();
        let orders = dependent_orders(&[&a, &b, &a], seed, 0).unwrap();
        prop_assert_eq!(&orders[0], &orders[2]);
        let mut sb = orders[1].clone();
        sb.sort_unstable();
        prop_assert_eq!(sb, b);
    }
}

/// Checks Definition 1 on `datasets`: root is the intersection of all, each right leaf the rest
/// of its dataset, vertices disjoint, root-to-leaf paths cover each dataset, height n − 1.
fn check_tree(datasets: &[&[u32]]) -> SamplingTree {
    let t = SamplingTree::build(datasets);
    let n = datasets.len();
    assert_eq!(t.spine.len(), n);
    assert_eq!(t.leaves.len(), n - 1);
    assert_eq!(t.height(), n - 1);
    let sets: Vec<BTreeSet<u32>> = datasets
        .iter()
        .map(|d| d.iter().copied().collect())
        .collect();
    let all: BTreeSet<u32> = sets.iter().skip(1).fold(sets[0].clone(), |acc, s| {
        acc.intersection(s).copied().collect()
    });
    if n > 1 {
        assert_eq!(t.spine[0], all.iter().copied().collect::<Vec<_>>(), "root");
    }
    // The spine's vertices are disjoint. Leaves may share samples with each other and with
    // spine vertices below them (a sample of D_1 ∩ D_3 outside D_2 is in D_1's leaf and on the
    // spine under D_2): the tree keeps only the intersections of suffixes.
    let mut on_spine = BTreeSet::new();
    for v in &t.spine {
        for &s in v {
            assert!(on_spine.insert(s), "sample {s} in two spine vertices");
        }
    }
    for (i, &j) in t.order.iter().enumerate() {
        // Job order[i]'s path: spine[0..=i], then its leaf (the last job ends at spine[n−1]).
        // The vertices on it partition the dataset.
        let mut path: Vec<u32> = t.spine[..=i].iter().flatten().copied().collect();
        if i + 1 < n {
            path.extend(&t.leaves[i]);
        }
        path.sort_unstable();
        assert_eq!(
            path,
            sets[j].iter().copied().collect::<Vec<_>>(),
            "path of job {j}"
        );
    }
    let sizes: Vec<usize> = t.order.iter().map(|&j| sets[j].len()).collect();
    assert!(sizes.windows(2).all(|w| w[0] <= w[1]));
    t
}

#[test]
fn tree_of_nested_datasets() {
    let d: Vec<Vec<u32>> = vec![(0..40).collect(), (0..10).collect(), (0..25).collect()];
    let ds: Vec<&[u32]> = d.iter().map(Vec::as_slice).collect();
    let t = check_tree(&ds);
    assert_eq!(t.order, vec![1, 2, 0]);
    // Nested: each spine vertex is a ring of the onion, every right leaf is empty.
    assert_eq!(t.spine[0], (0..10).collect::<Vec<_>>());
    assert_eq!(t.spine[1], (10..25).collect::<Vec<_>>());
    assert_eq!(t.spine[2], (25..40).collect::<Vec<_>>());
    assert!(t.leaves.iter().all(Vec::is_empty));
}

#[test]
fn tree_of_random_datasets_matches_the_sampler() {
    // The paper's random case: four samples of 10 000 from 0..13 333 (scaled down by 10).
    let mut rng = super::super::rng::stream(1, 2);
    let d: Vec<Vec<u32>> = (0..4)
        .map(|i| {
            let mut all: Vec<u32> = (0..1333).collect();
            rng.shuffle(&mut all);
            all.truncate(1000 - 50 * i);
            all
        })
        .collect();
    let ds: Vec<&[u32]> = d.iter().map(Vec::as_slice).collect();
    let t = check_tree(&ds);
    assert!(
        t.spine[0].len() > 200,
        "four random samples of 64% to 75% share about 23%"
    );
    // Each vertex is the union of the sampler's buckets the module docs name.
    let mut s = DependentSampler::new(0, 0);
    for x in &ds {
        s.add_job(x).unwrap();
    }
    let suffix = |k: usize| t.order[k..].iter().fold(0u64, |m, &j| m | 1 << j);
    for k in 0..ds.len() {
        let (t_k, prev) = (suffix(k), (k > 0).then(|| suffix(k - 1)));
        let mut v: Vec<u32> = s
            .buckets
            .iter()
            .filter(|b| b.mask & t_k == t_k && prev.is_none_or(|p| b.mask & p != p))
            .flat_map(|b| b.items.iter().map(|&l| s.ids[l as usize]))
            .collect();
        v.sort_unstable();
        assert_eq!(v, t.spine[k], "vertex {k}");
    }
    // A single dataset is one vertex.
    let one = check_tree(&ds[..1]);
    assert_eq!(one.spine[0].len(), ds[0].len());
}

#[test]
fn leaving_and_joining_mid_epoch() {
    let mut s = DependentSampler::new(4, 0);
    let a: Vec<u32> = (0..50).collect();
    let b: Vec<u32> = (25..75).collect();
    let ja = s.add_job(&a).unwrap();
    let jb = s.add_job(&b).unwrap();
    let mut got_a = Vec::new();
    for _ in 0..20 {
        for (j, e) in s.draw(&[ja, jb]).unwrap() {
            if j == ja {
                got_a.push(e);
            }
        }
    }
    s.remove_job(jb);
    assert_eq!(s.remaining(jb), 0);
    // The freed index is reused by the next job, which draws its whole dataset.
    let jc = s.add_job(&b).unwrap();
    assert_eq!(jc, jb);
    let mut got_c = Vec::new();
    while s.remaining(ja) + s.remaining(jc) > 0 {
        let jobs: Vec<usize> = [ja, jc]
            .into_iter()
            .filter(|&j| s.remaining(j) > 0)
            .collect();
        for (j, e) in s.draw(&jobs).unwrap() {
            if j == ja {
                got_a.push(e)
            } else {
                got_c.push(e)
            }
        }
    }
    got_a.sort_unstable();
    got_c.sort_unstable();
    assert_eq!(got_a, a);
    assert_eq!(got_c, b);
    assert!(
        s.buckets.is_empty(),
        "nothing left once every job drew everything"
    );
}

#[test]
fn bad_input_names_the_job() {
    let d: Vec<u32> = vec![1, 2, 3];
    assert_eq!(
        dependent_orders(&[&d, &[4, 5, 4]], 0, 0),
        Err(DsaError::Duplicate { job: 1, sample: 4 })
    );
    assert_eq!(
        dependent_orders(&[&d, &[]], 0, 0),
        Err(DsaError::EmptyDataset { job: 1 })
    );
    let many = vec![&d[..]; MAX_JOBS + 1];
    assert_eq!(
        dependent_orders(&many, 0, 0),
        Err(DsaError::TooManyJobs { jobs: 65, max: 64 })
    );
    assert_eq!(
        dependent_views(&[&d], &[1, 1, 9, 1], &[5], 0, 0),
        Err(DsaError::SampleTooLarge {
            job: 0,
            sample: 2,
            size: 9,
            view_bytes: 5
        })
    );
    assert_eq!(
        dependent_views(&[&d], &[1, 1], &[5], 0, 0),
        Err(DsaError::UnknownSample {
            job: 0,
            sample: 2,
            samples: 2
        })
    );
    assert_eq!(
        dependent_views(&[&d], &[1; 4], &[5, 5], 0, 0),
        Err(DsaError::LengthMismatch {
            datasets: 1,
            views: 2
        })
    );
    let mut s = DependentSampler::new(0, 0);
    let j = s.add_job(&d).unwrap();
    assert_eq!(s.draw(&[j, j]), Err(DsaError::RepeatedJob { job: j }));
    assert_eq!(s.draw(&[7]), Err(DsaError::Exhausted { job: 7 }));
    for _ in 0..3 {
        s.draw(&[j]).unwrap();
    }
    assert_eq!(s.draw(&[j]), Err(DsaError::Exhausted { job: j }));
}
