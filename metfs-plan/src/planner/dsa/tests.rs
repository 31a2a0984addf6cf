//! Tests of dependent sampling: each job's order is a uniformly random permutation of its
//! dataset (chi-square over fixed seeds, with lockstep and with partial rounds), the printed
//! Algorithm 1 is not, shared samples are drawn together as often as Theorem 1 allows, views
//! partition each dataset (proptest), Definition 1's tree, the sampler's groups against its
//! sets of jobs after any sequence of calls (proptest), the same at 256 jobs, and the errors.

use std::collections::{BTreeSet, HashMap};

use proptest::prelude::{prop, prop_assert, prop_assert_eq, proptest};
use statrs::distribution::{ChiSquared, ContinuousCDF};

use super::column::{select_in_word, SUPER};
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
    critical_at(df, 0.001)
}

/// The critical value at p = `alpha`.
fn critical_at(df: u64, alpha: f64) -> f64 {
    ChiSquared::new(df as f64).unwrap().inverse_cdf(1.0 - alpha)
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
    uniformity_at(datasets, rule, trials, schedule, 0.001)
}

/// [`uniformity`] with the critical value at p = `alpha`.
fn uniformity_at(
    datasets: &[&[u32]],
    rule: Rule,
    trials: u64,
    schedule: impl Fn(usize, usize) -> bool,
    alpha: f64,
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
            (chi_square(c, cells, trials), critical_at(cells - 1, alpha))
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
    // Each spine vertex is one of the sampler's groups, as the module docs say: the samples
    // every job needs, then those whose last job not needing them is order[k − 1].
    let mut s = DependentSampler::new(0, 0);
    for x in &ds {
        s.add_job(x).unwrap();
    }
    s.sync(&t.order);
    check_state(&s).unwrap();
    for k in 0..ds.len() {
        let g = if k == 0 {
            ALL
        } else {
            group_of(t.order[k - 1])
        };
        let mut v: Vec<u32> = s.groups[g as usize]
            .iter()
            .map(|&l| s.samples[l as usize].id)
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
    check_state(&s).unwrap();
    assert!(
        s.groups.iter().all(Vec::is_empty),
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
        Err(DsaError::TooManyJobs {
            jobs: 257,
            max: 256
        })
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

/// Checks the sampler's bookkeeping against its sets of jobs: the order and ranks agree, every
/// sample a job still needs is in the group its level gives (computed afresh) and nowhere else,
/// and each sample's count of jobs and each job's counts agree with the jobs' bitmaps.
fn check_state(s: &DependentSampler) -> Result<(), String> {
    for (k, &j) in s.order.iter().enumerate() {
        if s.rank[j] != k as u32 || s.jobs[j].is_none() {
            return Err(format!("order[{k}] = {j} has rank {}", s.rank[j]));
        }
    }
    for (j, &r) in s.rank.iter().enumerate() {
        if r != NO_RANK && s.order.get(r as usize) != Some(&j) {
            return Err(format!("job {j} has rank {r} but is not there"));
        }
    }
    let mut listed = 0;
    for (g, list) in s.groups.iter().enumerate() {
        if g > 0 && s.rank[g - 1] == NO_RANK && !list.is_empty() {
            return Err(format!("job {} is not in the order but has a group", g - 1));
        }
        for (p, &l) in list.iter().enumerate() {
            let x = s.samples[l as usize];
            if x.group as usize != g || x.pos != p as u32 {
                return Err(format!("sample {l} at {g}/{p} says {x:?}"));
            }
        }
        listed += list.len();
    }
    let mut live = 0;
    for l in 0..s.samples.len() as u32 {
        let x = s.samples[l as usize];
        let holders = (0..s.jobs.len()).filter(|&j| s.needs(l, j)).count();
        if usize::from(x.jobs) != holders {
            return Err(format!("sample {l}: {x:?} but {holders} jobs need it"));
        }
        let want = if holders > 0 {
            live += 1;
            s.last_missing(l, s.order.len())
        } else {
            GONE
        };
        if x.group != want {
            return Err(format!("sample {l}: group {} instead of {want}", x.group));
        }
    }
    if listed != live {
        return Err(format!("{listed} samples in groups, {live} needed"));
    }
    for (j, c) in s.jobs.iter().enumerate() {
        let Some(c) = c else { continue };
        let ones = |w: &[u64]| w.iter().map(|x| u64::from(x.count_ones())).sum::<u64>();
        let blocks_ok = c
            .bits
            .chunks(BLOCK)
            .zip(&c.blocks)
            .all(|(w, &b)| ones(w) == u64::from(b));
        let supers_ok = c
            .bits
            .chunks(BLOCK * SUPER)
            .zip(&c.supers)
            .all(|(w, &n)| ones(w) == u64::from(n));
        if !blocks_ok || !supers_ok || ones(&c.bits) != c.len || c.iter().count() as u64 != c.len {
            return Err(format!("job {j}: counts disagree with its bitmap"));
        }
        for r in [0, c.len / 2, c.len.saturating_sub(1)] {
            if c.len > 0 && c.iter().nth(r as usize) != Some(c.select(r)) {
                return Err(format!("job {j}: select({r}) is not its {r}-th sample"));
            }
        }
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum Op {
    Add(BTreeSet<u32>),
    Remove(usize),
    /// A round for the jobs (by position among the live ones) marked true that have samples
    /// left; all of them if none is marked.
    Draw(Vec<bool>),
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::Strategy;
    proptest::prop_oneof![
        1 => prop::collection::btree_set(0u32..40, 1..30).prop_map(Op::Add),
        1 => (0usize..8).prop_map(Op::Remove),
        6 => prop::collection::vec(proptest::prelude::any::<bool>(), 8).prop_map(Op::Draw),
    ]
}

/// Runs `ops` on a sampler, checking its state after each, every round's picks (each job of
/// the round once, a sample of its dataset it has not drawn), and at the end that every job
/// drawing to the end drew its dataset exactly.
fn run_ops(ops: &[Op], seed: u64) -> Result<(), String> {
    let mut s = DependentSampler::new(seed, 0);
    // Job index → (dataset, drawn so far).
    let mut model: Vec<Option<(BTreeSet<u32>, Vec<u32>)>> = Vec::new();
    let live = |model: &Vec<Option<(BTreeSet<u32>, Vec<u32>)>>| -> Vec<usize> {
        (0..model.len()).filter(|&j| model[j].is_some()).collect()
    };
    let round = |s: &mut DependentSampler,
                 model: &mut Vec<Option<(BTreeSet<u32>, Vec<u32>)>>,
                 jobs: &[usize]|
     -> Result<(), String> {
        let picks = s.draw(jobs).map_err(|e| e.to_string())?;
        let mut who: Vec<usize> = picks.iter().map(|p| p.0).collect();
        who.sort_unstable();
        let mut want = jobs.to_vec();
        want.sort_unstable();
        if who != want {
            return Err(format!("round for {want:?} drew for {who:?}"));
        }
        for (j, e) in picks {
            let (d, got) = model[j].as_mut().expect("live");
            if !d.contains(&e) || got.contains(&e) {
                return Err(format!("job {j} drew {e}: not in its dataset, or twice"));
            }
            got.push(e);
        }
        Ok(())
    };
    for o in ops {
        match o {
            Op::Add(d) => {
                let v: Vec<u32> = d.iter().copied().collect();
                let j = s.add_job(&v).map_err(|e| e.to_string())?;
                if j >= model.len() {
                    model.resize(j + 1, None);
                }
                if model[j].is_some() {
                    return Err(format!("index {j} handed out twice"));
                }
                model[j] = Some((d.clone(), Vec::new()));
            }
            Op::Remove(k) => {
                let l = live(&model);
                if let Some(&j) = l.get(k % l.len().max(1)) {
                    s.remove_job(j);
                    model[j] = None;
                }
            }
            Op::Draw(marks) => {
                let able: Vec<usize> = live(&model)
                    .into_iter()
                    .filter(|&j| s.remaining(j) > 0)
                    .collect();
                let mut jobs: Vec<usize> = able
                    .iter()
                    .enumerate()
                    .filter(|&(k, _)| marks[k % marks.len()])
                    .map(|(_, &j)| j)
                    .collect();
                if jobs.is_empty() {
                    jobs = able;
                }
                if !jobs.is_empty() {
                    round(&mut s, &mut model, &jobs)?;
                }
            }
        }
        check_state(&s)?;
    }
    loop {
        let jobs: Vec<usize> = live(&model)
            .into_iter()
            .filter(|&j| s.remaining(j) > 0)
            .collect();
        if jobs.is_empty() {
            break;
        }
        round(&mut s, &mut model, &jobs)?;
        check_state(&s)?;
    }
    for (j, m) in model.iter().enumerate() {
        if let Some((d, got)) = m {
            let mut got = got.clone();
            got.sort_unstable();
            if got != d.iter().copied().collect::<Vec<_>>() {
                return Err(format!("job {j} drew {got:?}, not its dataset {d:?}"));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

    #[test]
    fn groups_follow_any_sequence_of_calls(
        ops in prop::collection::vec(op(), 1..80),
        seed in 0u64..1000,
    ) {
        let r = run_ops(&ops, seed);
        prop_assert!(r.is_ok(), "{:?}", r);
    }
}

/// Job `j` of 256 over six samples: two or three of them, in a pattern of its own.
fn small_overlapping(jobs: usize) -> Vec<Vec<u32>> {
    let mut rng = super::super::rng::stream(7, 0);
    (0..jobs)
        .map(|j| {
            let mut all: Vec<u32> = (0..6).collect();
            rng.shuffle(&mut all);
            all.truncate(2 + j % 2);
            all
        })
        .collect()
}

#[test]
fn two_hundred_fifty_six_jobs_each_draw_a_uniform_permutation() {
    // The uniformity test above at the most jobs a sampler holds, over tiny overlapping
    // datasets (every pair of jobs shares something, most share all they have). With 256
    // jobs tested at once the critical value is Bonferroni's, p = 0.001 / 256, so that a
    // uniform sampler fails the whole test about as rarely as the three-job one.
    let d = small_overlapping(MAX_JOBS);
    let ds: Vec<&[u32]> = d.iter().map(Vec::as_slice).collect();
    let alpha = 0.001 / MAX_JOBS as f64;
    let lockstep = uniformity_at(&ds, Rule::Corrected, 2_000, |_, _| true, alpha);
    // Rounds for some of the jobs: the sampler regroups its samples whenever the order of a
    // round differs from the last.
    let partial = |round: usize, j: usize| !(round + j).is_multiple_of(3);
    let partial = uniformity_at(&ds, Rule::Corrected, 2_000, partial, alpha);
    for (how, res) in [("lockstep", lockstep), ("partial", partial)] {
        for (j, (stat, crit)) in res.into_iter().enumerate() {
            assert!(
                stat < crit,
                "{how}, job {j}: chi-square {stat:.1} ≥ {crit:.1}"
            );
        }
    }
}

#[test]
fn two_hundred_fifty_six_jobs_take_shared_samples_in_one_round() {
    // 256 jobs over one dataset draw one order.
    let d: Vec<u32> = (0..300).map(|i| i * 5).collect();
    let orders = dependent_orders(&vec![&d[..]; MAX_JOBS], 3, 1).unwrap();
    assert!(orders.iter().all(|o| o == &orders[0]));
    // Theorem 1 with 128 jobs on each side: |D1| = 100 inside |D2| = 125. The D1 jobs always
    // take one sample together (each takes I with probability |D_j − S| / |D_j − S| = 1 after
    // the first), and all 256 do with probability |I| / max = 0.8.
    let d1: Vec<u32> = (0..100).collect();
    let d2: Vec<u32> = (0..125).collect();
    let trials = 1_000u64;
    let mut all = 0;
    for epoch in 0..trials {
        let mut s = DependentSampler::new(3, epoch);
        let idx: Vec<usize> = (0..MAX_JOBS)
            .map(|j| s.add_job(if j % 2 == 0 { &d1 } else { &d2 }).unwrap())
            .collect();
        let picks = s.draw(&idx).unwrap();
        let first = picks[0].1;
        assert!(
            picks.iter().filter(|p| p.0 % 2 == 0).all(|p| p.1 == first),
            "epoch {epoch}: the D1 jobs drew apart"
        );
        all += u64::from(picks.iter().all(|p| p.1 == first));
    }
    let rate = all as f64 / trials as f64;
    assert!((rate - 0.8).abs() < 0.05, "all 256 shared at rate {rate}");
}

#[test]
fn two_hundred_fifty_six_jobs_over_random_subsets_keep_the_books() {
    // Jobs over random halves of 400 samples, more than 64 of them so that a sample's jobs
    // take several words; some leave and others take their indices mid-epoch, some rounds are
    // partial. The groups are checked against the sets of jobs along the way, and each job
    // that drew to the end drew its dataset.
    let mut rng = super::super::rng::stream(9, 0);
    let subset = |rng: &mut super::super::rng::PlanRng| {
        let mut all: Vec<u32> = (0..400).collect();
        rng.shuffle(&mut all);
        all.truncate(150 + rng.below(100) as usize);
        all.into_iter().collect::<BTreeSet<u32>>()
    };
    let mut ops: Vec<Op> = (0..MAX_JOBS).map(|_| Op::Add(subset(&mut rng))).collect();
    for round in 0..60 {
        let marks = (0..8).map(|k| round % 4 != 0 || k % 3 != 0).collect();
        ops.push(Op::Draw(marks));
        if round % 20 == 5 {
            ops.push(Op::Remove(round));
            ops.push(Op::Add(subset(&mut rng)));
        }
    }
    run_ops(&ops, 4).unwrap();
}

#[test]
fn the_job_after_the_most_is_refused_with_the_numbers() {
    let d: Vec<u32> = vec![1, 2, 3];
    let mut s = DependentSampler::new(0, 0);
    for j in 0..MAX_JOBS {
        assert_eq!(s.add_job(&d), Ok(j));
    }
    let e = s.add_job(&d).unwrap_err();
    assert_eq!(
        e,
        DsaError::TooManyJobs {
            jobs: MAX_JOBS + 1,
            max: MAX_JOBS
        }
    );
    assert_eq!(
        e.to_string(),
        "257 jobs is more than the 256 one sampler can hold"
    );
    // One leaves, one more fits, in its index.
    s.remove_job(100);
    assert_eq!(s.add_job(&d), Ok(100));
    check_state(&s).unwrap();
}

proptest! {
    #[test]
    fn a_column_selects_its_samples_in_order(
        locals in prop::collection::btree_set(0u32..200_000, 1..3_000),
        drop in prop::collection::vec(proptest::prelude::any::<prop::sample::Index>(), 0..500),
    ) {
        let v: Vec<u32> = locals.iter().copied().collect();
        let mut c = Column::of(&v);
        let mut left = locals;
        for d in drop {
            if left.is_empty() {
                break;
            }
            let l = *left.iter().nth(d.index(left.len())).expect("in range");
            c.remove(l);
            left.remove(&l);
        }
        let want: Vec<u32> = left.iter().copied().collect();
        prop_assert_eq!(c.len, want.len() as u64);
        prop_assert_eq!(c.iter().collect::<Vec<_>>(), want.clone());
        for (r, &l) in want.iter().enumerate() {
            prop_assert_eq!(c.select(r as u64), l);
            prop_assert!(c.contains(l));
        }
    }

    #[test]
    fn select_in_word_finds_each_set_bit(w in proptest::prelude::any::<u64>()) {
        let mut rest = w;
        for r in 0..w.count_ones() {
            prop_assert_eq!(select_in_word(w, r), rest.trailing_zeros());
            rest &= rest - 1;
        }
    }
}

#[test]
fn a_job_sitting_out_regroups_what_it_alone_missed() {
    // A's group (B's samples A does not have) is half the samples, so A sitting a round out
    // regroups everything rather than that group sample by sample; small groups take the
    // other way. Both leave the books as a fresh build would.
    let a: BTreeSet<u32> = (0..1000).collect();
    let b: BTreeSet<u32> = (0..2000).collect();
    let c: BTreeSet<u32> = (0..1000).step_by(3).chain(1500..1510).collect();
    let both = vec![true; 8];
    let b_only = vec![false, true, false, false, false, false, false, false];
    let ops = vec![
        Op::Add(a),
        Op::Add(b),
        Op::Add(c),
        Op::Draw(both.clone()),
        Op::Draw(b_only),
        Op::Draw(both),
        Op::Remove(2),
        Op::Draw(vec![true; 8]),
    ];
    run_ops(&ops, 1).unwrap();
}
