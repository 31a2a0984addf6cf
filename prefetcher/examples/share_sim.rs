//! Cache misses of jobs sharing one store, by eviction policy and sampler: paper 004's
//! staggered-arrival case (four jobs over random 10 000-sample subsets of 13 333 samples,
//! arriving a quarter epoch apart, two epochs each) at several store sizes, and the same
//! with every job arriving at once. Prints a Markdown table (`docs/BENCHMARKS.md` records it).
//!
//! `cargo run -p prefetcher --example share_sim [-- SCALE]`: SCALE divides every size (default
//! 1, the paper's; 10 runs in a second).

use prefetcher::refcnt::sim::{simulate, staggered_case, SimConfig, SimResult};
use prefetcher::refcnt::Policy;

fn main() -> Result<(), Box<dyn std::error::Error>> {
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
            let run = |policy, dependent| -> Result<SimResult, Box<dyn std::error::Error>> {
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
    Ok(())
}
