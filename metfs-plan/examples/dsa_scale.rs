//! What dependent sampling costs as the jobs grow: time per mini-epoch drawn at 4, 64 and 256
//! jobs over random overlapping subsets of one dataset (each job a uniform random subset of
//! 10–50% of it, its fraction drawn per job), with the cost per selected sample and the ratio
//! between job counts. Prints a Markdown table (`docs/BENCHMARKS.md` records it).
//!
//! Every job's view holds `--view` samples, so a mini-epoch is that many rounds of one sample
//! per job, as the cohort cuts them (all jobs' views at the same round). The rounds are timed
//! after the sampler has its jobs and has drawn one round (setup, shown apart: adding the
//! datasets and building the sampler's order). A job count the sampler refuses is reported as
//! refused; `--max-secs` bounds one repetition's drawing, and a mini-epoch not drawn whole in it
//! is extrapolated from the rounds that were (marked `~`).
//!
//! `cargo run --release -p metfs-plan --example dsa_scale -- [--samples N] [--jobs 4,64,256]
//! [--view N] [--mini-epochs N] [--reps N] [--max-secs S]`

use std::time::{Duration, Instant};

use metfs_plan::planner::{DependentSampler, MAX_JOBS};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

struct Args {
    samples: u32,
    jobs: Vec<usize>,
    view: u64,
    mini_epochs: u64,
    reps: u64,
    max_secs: f64,
}

fn args() -> Res<Args> {
    let mut a = Args {
        samples: 1_000_000,
        jobs: vec![4, 64, 256],
        view: 10_000,
        mini_epochs: 3,
        reps: 3,
        max_secs: 60.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let bad = |e: &dyn std::fmt::Display| format!("{flag} {value:?}: {e}");
        match flag.as_str() {
            "--samples" => a.samples = value.parse().map_err(|e| bad(&e))?,
            "--jobs" => {
                a.jobs = value
                    .split(',')
                    .map(|s| s.trim().parse())
                    .collect::<Result<_, _>>()
                    .map_err(|e| bad(&e))?
            }
            "--view" => a.view = value.parse().map_err(|e| bad(&e))?,
            "--mini-epochs" => a.mini_epochs = value.parse().map_err(|e| bad(&e))?,
            "--reps" => a.reps = value.parse().map_err(|e| bad(&e))?,
            "--max-secs" => a.max_secs = value.parse().map_err(|e| bad(&e))?,
            _ => return Err(format!("unknown flag {flag}").into()),
        }
    }
    if a.view == 0 || a.mini_epochs == 0 || a.reps == 0 {
        return Err("--view, --mini-epochs and --reps must be at least 1".into());
    }
    Ok(a)
}

/// A self-contained stream, so that the datasets are the same for every build measured.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn unit(state: &mut u64) -> f64 {
    (splitmix64(state) >> 11) as f64 / (1u64 << 53) as f64
}

/// Job `j`'s dataset in repetition `rep`: each sample in with the job's fraction.
fn dataset(samples: u32, rep: u64, j: usize) -> Vec<u32> {
    let mut state = (rep << 32) ^ j as u64 ^ 0x4453_415F_5343_414C;
    let fraction = 0.10 + 0.40 * unit(&mut state);
    (0..samples)
        .filter(|_| unit(&mut state) < fraction)
        .collect()
}

/// One repetition: (setup, time per mini-epoch, whole mini-epochs drawn, rounds drawn).
fn repetition(a: &Args, jobs: usize, rep: u64) -> Res<(Duration, Duration, u64, u64)> {
    let datasets: Vec<Vec<u32>> = (0..jobs).map(|j| dataset(a.samples, rep, j)).collect();
    let start = Instant::now();
    let mut s = DependentSampler::new(rep, 0);
    let idx: Vec<usize> = datasets
        .iter()
        .map(|d| s.add_job(d))
        .collect::<Result<_, _>>()?;
    s.draw(&idx)?;
    let setup = start.elapsed();
    drop(datasets);
    let smallest = idx.iter().map(|&j| s.remaining(j)).min().unwrap_or(0);
    let want = (a.view * a.mini_epochs).min(smallest);
    let limit = Duration::from_secs_f64(a.max_secs);
    let start = Instant::now();
    let mut rounds = 0;
    while rounds < want {
        s.draw(&idx)?;
        rounds += 1;
        if rounds % 64 == 0 && start.elapsed() > limit {
            break;
        }
    }
    let spent = start.elapsed();
    let per = spent.mul_f64(a.view as f64 / rounds.max(1) as f64);
    Ok((setup, per, rounds / a.view, rounds))
}

/// `secs` in the unit that keeps it between 1 and 1,000.
fn human(secs: f64) -> String {
    match secs {
        s if s >= 1.0 => format!("{s:.2} s"),
        s if s >= 1e-3 => format!("{:.1} ms", s * 1e3),
        s if s >= 1e-6 => format!("{:.1} µs", s * 1e6),
        s => format!("{:.0} ns", s * 1e9),
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

/// The process's peak resident memory so far, from /proc (None elsewhere).
fn peak_rss_mib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib >> 10)
}

fn main() -> Res<()> {
    let a = args()?;
    println!(
        "{} samples, each job a random 10–50% of them; views of {} samples; medians of {} \
         repetitions of {} mini-epochs; at most {} jobs per sampler",
        a.samples, a.view, a.reps, a.mini_epochs, MAX_JOBS
    );
    println!();
    println!(
        "| jobs | time per mini-epoch | per selected sample | time ratio to previous row \
         | jobs ratio | setup | peak RSS |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mut previous: Option<(usize, Duration)> = None;
    for &jobs in &a.jobs {
        if jobs > MAX_JOBS {
            println!("| {jobs} | refused: more than {MAX_JOBS} jobs | | | | | |");
            continue;
        }
        let mut setups = Vec::new();
        let mut pers = Vec::new();
        let mut whole = true;
        for rep in 0..a.reps {
            let (setup, per, done, rounds) = repetition(&a, jobs, rep)?;
            eprintln!(
                "{jobs} jobs, repetition {rep}: setup {setup:.2?}, {rounds} rounds, \
                 {per:.3?} per mini-epoch"
            );
            whole &= done > 0;
            setups.push(setup);
            pers.push(per);
        }
        let per = median(pers);
        let per_sample = per.as_secs_f64() / (a.view as f64 * jobs as f64);
        let mark = if whole { "" } else { "~" };
        let (ratio, jobs_ratio) = match previous {
            Some((pj, pt)) => (
                format!("{:.1}x", per.as_secs_f64() / pt.as_secs_f64()),
                format!("{:.0}x", jobs as f64 / pj as f64),
            ),
            None => ("-".into(), "-".into()),
        };
        println!(
            "| {jobs} | {mark}{} | {mark}{} | {ratio} | {jobs_ratio} | {} | {} |",
            human(per.as_secs_f64()),
            human(per_sample),
            human(median(setups).as_secs_f64()),
            peak_rss_mib().map_or("-".into(), |m| format!("{m} MiB")),
        );
        previous = Some((jobs, per));
    }
    Ok(())
}
