//! Cache misses of jobs sharing one store, by eviction policy and sampler: paper 004's
//! staggered-arrival case (four jobs over random 10 000-sample subsets of 13 333 samples,
//! arriving a quarter epoch apart, two epochs each) at several store sizes, and the same
//! with every job arriving at once; then the sharing cases of whole views through one store
//! against separate stores of the same total budget. Prints Markdown tables
//! (`docs/BENCHMARKS.md` records them).
//!
//! `cargo run -p metfs-plan --example share_sim [-- SCALE]`: SCALE divides every size (default
//! 1, the paper's; 10 runs in a second).

use metfs_plan::refcnt::cohort::Pace;
use metfs_plan::refcnt::sim::{
    simulate, simulate_cohort, staggered_case, CohortJob, CohortSim, SimConfig, SimResult,
};
use metfs_plan::refcnt::Policy;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> Res<()> {
    let scale: u32 = match std::env::args().nth(1) {
        Some(s) => s.parse().map_err(|e| format!("SCALE {s:?}: {e}"))?,
        None => 1,
    };
    let (universe, size) = (13_333 / scale, 10_000 / scale as usize);
    let lookahead = 8;
    println!("| arrivals | store (% of union) | RefCnt+DSA | LRU+DSA | RefCnt/LRU | LRU+ISA |");
    println!("|---|---|---|---|---|---|");
    for (label, stagger) in [("staggered ¼ epoch", size as u64 / 4), ("together", 0)] {
        let jobs = staggered_case(4, universe, size, stagger, 2, 3);
        for pct in [10u64, 25, 50, 75] {
            let capacity = (u64::from(universe) * pct / 100).max(4 * lookahead as u64);
            let run = |policy, dependent| -> Res<SimResult> {
                Ok(simulate(&SimConfig {
                    jobs: jobs.clone(),
                    capacity,
                    lookahead,
                    policy,
                    dependent,
                    seed: 1,
                })?)
            };
            let rc = run(Policy::RefCnt, true)?;
            let lru = run(Policy::Lru, true)?;
            let isa = run(Policy::Lru, false)?;
            println!(
                "| {label} | {pct}% | {} | {} | {:.2}x | {} |",
                rc.misses,
                lru.misses,
                rc.misses as f64 / lru.misses as f64,
                isa.misses
            );
        }
    }
    println!(
        "\n{} reads per run; no run can miss fewer than |D1 ∪ … ∪ D4| (each sample fetched once).",
        4 * 2 * size
    );
    views(scale)
}

/// The sharing cases, whole views at a time: tier bytes through one store of budget B against
/// k stores of B/k, relative to one job alone in a store of B/k.
fn views(scale: u32) -> Res<()> {
    let n = 20_000 / scale;
    let sizes: Vec<u64> = (0..u64::from(n + n / 4))
        .map(|i| 1000 + (i * 7919) % 2000)
        .collect();
    let d: Vec<u32> = (0..n).collect();
    let budget = d.iter().map(|&s| sizes[s as usize]).sum::<u64>() / 2;
    let job = |name: &str, dataset: Vec<u32>, period| CohortJob {
        name: name.into(),
        dataset,
        arrival: 0,
        period,
        rf: 2,
        epochs: 2,
    };
    let run = |jobs: Vec<CohortJob>, budget: u64, k: u64, pace| -> Res<u64> {
        Ok(simulate_cohort(&CohortSim {
            jobs,
            sizes: sizes.clone(),
            budget,
            view_bytes: budget / (2 * k),
            pace,
            seed: 5,
        })?
        .tier_bytes)
    };
    let overlap: Vec<u32> = (n / 4..n + n / 4).collect();
    let cases: Vec<(&str, Vec<CohortJob>, Pace, f64)> = vec![
        (
            "2 jobs, same dataset",
            vec![job("a", d.clone(), 1), job("b", d.clone(), 1)],
            Pace::Wait,
            1.05,
        ),
        (
            "4 jobs, same dataset",
            (0..4)
                .map(|i| job(&format!("t{i}"), d.clone(), 1))
                .collect(),
            Pace::Wait,
            1.1,
        ),
        (
            "2 jobs, one 2x slower, wait",
            vec![job("a", d.clone(), 1), job("b", d.clone(), 2)],
            Pace::Wait,
            1.1,
        ),
        (
            "2 jobs, one 2x slower, evict",
            vec![job("a", d.clone(), 1), job("b", d.clone(), 2)],
            Pace::Evict,
            f64::NAN,
        ),
        (
            "2 jobs, 75% overlap",
            vec![job("a", d.clone(), 1), job("b", overlap, 1)],
            Pace::Wait,
            1.05 * 1.25,
        ),
    ];
    println!("\n| case | one store | separate stores | goal (one store) |");
    println!("|---|---|---|---|");
    for (label, jobs, pace, goal) in cases {
        let k = jobs.len() as u64;
        let one = run(vec![jobs[0].clone()], budget / k, 1, pace)? as f64;
        let shared = run(jobs.clone(), budget, k, pace)? as f64;
        let mut separate = 0.0;
        for j in &jobs {
            separate += run(vec![j.clone()], budget / k, 1, pace)? as f64;
        }
        let goal = if goal.is_nan() {
            "-".to_string()
        } else {
            format!("≤ {goal:.2}x")
        };
        println!(
            "| {label} | {:.2}x | {:.2}x | {goal} |",
            shared / one,
            separate / one
        );
    }
    Ok(())
}
