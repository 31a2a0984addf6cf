//! A tick-by-tick simulation of jobs sharing one store, to compare eviction policies and
//! samplers the way paper 004 does (appendix A.2: cache misses for a given cache size). Used
//! by the tests and by `examples/share_sim.rs`, whose output `docs/BENCHMARKS.md` records.
//!
//! Every sample is one unit of bytes. A job arrives at its tick, joins the [`Ledger`] with a
//! share of `lookahead` units, and keeps its next `lookahead` samples drawn, pinned and staged
//! (a miss when the sample was not staged already: a read of the capacity tier). Every
//! `period` ticks it reads the first of them, which unpins it and takes away its reference.
//! After `epochs` passes over its dataset it leaves. Draws come from one [`DependentSampler`]
//! for all jobs (DSA; a job's next epoch re-enters it) or, for comparison, from one sampler
//! per job and epoch (independent shuffles, the paper's ISA).

use std::collections::VecDeque;

use thiserror::Error;

use super::cohort::{Cohort, CohortError, Next, Pace};
use super::{JobId, Ledger, LedgerError, Policy};
use crate::planner::{DependentSampler, DsaError};

/// One simulated job.
#[derive(Debug, Clone)]
pub struct SimJob {
    /// Its dataset (distinct sample ids).
    pub dataset: Vec<u32>,
    /// The tick it arrives at.
    pub arrival: u64,
    /// Ticks per sample read (1 is the fastest).
    pub period: u64,
    /// Epochs it runs before leaving.
    pub epochs: u32,
}

/// One simulation.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub jobs: Vec<SimJob>,
    /// Store capacity in samples.
    pub capacity: u64,
    /// Samples each job keeps drawn and pinned ahead of its reads (its share).
    pub lookahead: usize,
    pub policy: Policy,
    /// DSA (`true`) or independent shuffles.
    pub dependent: bool,
    pub seed: u64,
}

/// What a simulation counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SimResult {
    /// Samples staged from the tier.
    pub misses: u64,
    /// Samples read by jobs.
    pub reads: u64,
    /// Ticks until the last job left.
    pub ticks: u64,
}

/// Errors of a simulation.
#[derive(Debug, Error)]
pub enum SimError {
    #[error("sampler: {0}")]
    Sampler(#[from] DsaError),
    #[error("store: {0}")]
    Ledger(#[from] LedgerError),
    #[error("job {job}: period must be at least 1")]
    ZeroPeriod { job: usize },
}

struct Run {
    /// This epoch's sampler index (in the shared sampler, or in its own).
    idx: usize,
    own: Option<DependentSampler>,
    queue: VecDeque<u32>,
    epoch: u32,
    arrived: bool,
    done: bool,
}

/// One round of draws for the runs `want`: together from the shared sampler (dependent
/// sampling), or each from its own. Returns (run, sample) pairs.
fn draw_round(
    dependent: bool,
    runs: &mut [Run],
    shared: &mut DependentSampler,
    want: &[usize],
) -> Result<Vec<(usize, u32)>, SimError> {
    let mut picks = Vec::new();
    if dependent {
        let idx: Vec<usize> = want.iter().map(|&j| runs[j].idx).collect();
        for (i, e) in shared.draw(&idx)? {
            let j = want[idx.iter().position(|&x| x == i).expect("drawn for it")];
            picks.push((j, e));
        }
    } else {
        for &j in want {
            let r = &mut runs[j];
            let own = r.own.as_mut().expect("independent runs own a sampler");
            picks.extend(own.draw(&[r.idx])?.into_iter().map(|(_, e)| (j, e)));
        }
    }
    Ok(picks)
}

/// Runs one simulation to the end.
pub fn simulate(cfg: &SimConfig) -> Result<SimResult, SimError> {
    if let Some(job) = cfg.jobs.iter().position(|j| j.period == 0) {
        return Err(SimError::ZeroPeriod { job });
    }
    let mut ledger = Ledger::new(cfg.capacity, cfg.policy);
    let mut shared = DependentSampler::new(cfg.seed, 0);
    let mut runs: Vec<Run> = cfg
        .jobs
        .iter()
        .map(|_| Run {
            idx: 0,
            own: None,
            queue: VecDeque::new(),
            epoch: 0,
            arrived: false,
            done: false,
        })
        .collect();
    let mut res = SimResult::default();
    let start = |j: usize, run: &mut Run, shared: &mut DependentSampler| -> Result<(), SimError> {
        let d = &cfg.jobs[j].dataset;
        if cfg.dependent {
            run.idx = shared.add_job(d)?;
        } else {
            let mut own =
                DependentSampler::new(cfg.seed ^ ((j as u64) << 32), u64::from(run.epoch));
            run.idx = own.add_job(d)?;
            run.own = Some(own);
        }
        Ok(())
    };
    let mut tick = 0u64;
    while runs.iter().any(|r| !r.done) {
        for (j, run) in runs.iter_mut().enumerate() {
            if !run.arrived && cfg.jobs[j].arrival <= tick {
                run.arrived = true;
                ledger.join(j as JobId, cfg.lookahead as u64)?;
                ledger.need(j as JobId, &cfg.jobs[j].dataset)?;
                start(j, run, &mut shared)?;
            }
        }
        // Refill every lookahead, drawing for all the jobs that need a sample in one round.
        loop {
            let want: Vec<usize> = (0..runs.len())
                .filter(|&j| {
                    let r = &runs[j];
                    let left = match &r.own {
                        Some(own) => own.remaining(r.idx),
                        None => shared.remaining(r.idx),
                    };
                    r.arrived && !r.done && r.queue.len() < cfg.lookahead && left > 0
                })
                .collect();
            if want.is_empty() {
                break;
            }
            for (j, e) in draw_round(cfg.dependent, &mut runs, &mut shared, &want)? {
                runs[j].queue.push_back(e);
                ledger.pin(j as JobId, &[(e, 1)])?;
                if !ledger.stage(e, 1)?.hit {
                    res.misses += 1;
                }
            }
        }
        for (j, run) in runs.iter_mut().enumerate() {
            let job = &cfg.jobs[j];
            if !run.arrived || run.done || !(tick - job.arrival).is_multiple_of(job.period) {
                continue;
            }
            if let Some(e) = run.queue.pop_front() {
                ledger.touch(e);
                ledger.consumed(j as JobId, &[e])?;
                ledger.unpin(j as JobId, &[e])?;
                res.reads += 1;
            }
            let left = match &run.own {
                Some(own) => own.remaining(run.idx),
                None => shared.remaining(run.idx),
            };
            if run.queue.is_empty() && left == 0 {
                if run.own.take().is_none() {
                    shared.remove_job(run.idx);
                }
                run.epoch += 1;
                if run.epoch < job.epochs {
                    ledger.need(j as JobId, &job.dataset)?;
                    start(j, run, &mut shared)?;
                } else {
                    run.done = true;
                    ledger.leave(j as JobId)?;
                }
            }
        }
        tick += 1;
    }
    res.ticks = tick;
    Ok(res)
}

/// The paper's cache-policy case with staggered arrivals (§5.2 "arriving at different moments",
/// appendix A.2 "utterly random scene"): `jobs` datasets of `size` samples, each drawn
/// uniformly from `0..universe`, arriving `stagger` ticks apart, at the same speed.
pub fn staggered_case(
    jobs: usize,
    universe: u32,
    size: usize,
    stagger: u64,
    epochs: u32,
    seed: u64,
) -> Vec<SimJob> {
    let mut pick = DependentSampler::new(seed, u64::MAX);
    (0..jobs)
        .map(|j| {
            // A uniform subset: the first `size` draws of a shuffle of the universe.
            let all: Vec<u32> = (0..universe).collect();
            let k = pick.add_job(&all).expect("a fresh sampler takes a job");
            let dataset: Vec<u32> = (0..size)
                .map(|_| pick.draw(&[k]).expect("size ≤ universe")[0].1)
                .collect();
            pick.remove_job(k);
            SimJob {
                dataset,
                arrival: j as u64 * stagger,
                period: 1,
                epochs,
            }
        })
        .collect()
}

/// One job of a [`simulate_cohort`] run.
#[derive(Debug, Clone)]
pub struct CohortJob {
    pub name: String,
    pub dataset: Vec<u32>,
    /// The tick it arrives at.
    pub arrival: u64,
    /// Ticks per sample read: a pass over a view of `n` samples takes `n × period` ticks.
    pub period: u64,
    /// Passes per view (a fixed rf).
    pub rf: u32,
    /// Epochs it runs before leaving.
    pub epochs: u64,
}

/// A run of jobs through one [`Cohort`] (one daemon, one store).
#[derive(Debug, Clone)]
pub struct CohortSim {
    pub jobs: Vec<CohortJob>,
    /// Footprint of each sample.
    pub sizes: Vec<u64>,
    pub budget: u64,
    /// Every job's view bound (its share is twice this).
    pub view_bytes: u64,
    pub pace: Pace,
    pub seed: u64,
}

/// What one job did in a [`simulate_cohort`] run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CohortJobResult {
    pub passes: u64,
    /// Passes beyond rf, made while its next view could not be staged.
    pub bonus_passes: u64,
    /// Samples read over all passes.
    pub samples_read: u64,
    /// Tick of its arrival and of its departure.
    pub ticks: u64,
}

/// What a [`simulate_cohort`] run counted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CohortResult {
    /// Bytes fetched from the capacity tier.
    pub tier_bytes: u64,
    pub jobs: Vec<CohortJobResult>,
}

/// Runs jobs through one cohort until each has done its epochs. Staging is instant; a job that
/// gets [`Next::Wait`] makes a bonus pass and asks again at its end.
pub fn simulate_cohort(cfg: &CohortSim) -> Result<CohortResult, CohortError> {
    struct Run {
        arrived: bool,
        done: bool,
        pass_end: u64,
        passes_on_view: u32,
        res: CohortJobResult,
    }
    let mut cohort = Cohort::new(cfg.budget, cfg.sizes.clone(), cfg.seed, cfg.pace);
    let mut runs: Vec<Run> = cfg
        .jobs
        .iter()
        .map(|_| Run {
            arrived: false,
            done: false,
            pass_end: 0,
            passes_on_view: 0,
            res: CohortJobResult::default(),
        })
        .collect();
    let mut tier = 0u64;
    // Prepares `job`'s next view; true when it is ready.
    let prepare = |cohort: &mut Cohort, job: &CohortJob, tier: &mut u64| {
        match cohort.prepare(&job.name)? {
            Next::Stage { fetch, .. } => {
                // A view of an epoch the job will not run is never fetched in earnest.
                if cohort
                    .next_view(&job.name)
                    .is_some_and(|v| v.epoch < job.epochs)
                {
                    *tier += fetch.iter().map(|&s| cfg.sizes[s as usize]).sum::<u64>();
                }
                Ok::<bool, CohortError>(true)
            }
            Next::Prepared => Ok(true),
            Next::Wait => Ok(false),
        }
    };
    let mut tick = 0u64;
    while runs.iter().any(|r| !r.done) {
        // Every job arriving now joins before any draws: trials started together draw
        // together.
        for (j, job) in cfg.jobs.iter().enumerate() {
            if !runs[j].arrived && job.arrival == tick {
                cohort.join(&job.name, &job.dataset, cfg.view_bytes)?;
            }
        }
        for (j, job) in cfg.jobs.iter().enumerate() {
            let run = &mut runs[j];
            if run.done {
                continue;
            }
            if !run.arrived {
                if job.arrival > tick {
                    continue;
                }
                run.arrived = true;
                run.res.ticks = tick;
                prepare(&mut cohort, job, &mut tier)?;
                let n = cohort.advance(&job.name)?.samples.len() as u64;
                run.pass_end = tick + n * job.period;
                prepare(&mut cohort, job, &mut tier)?;
                continue;
            }
            if run.pass_end > tick {
                continue;
            }
            let n = cohort.current(&job.name).map_or(0, |v| v.samples.len()) as u64;
            run.res.passes += 1;
            run.res.samples_read += n;
            run.passes_on_view += 1;
            let mut pass_len = n;
            if run.passes_on_view >= job.rf {
                if prepare(&mut cohort, job, &mut tier)? {
                    let v = cohort.advance(&job.name)?;
                    let epoch = v.epoch;
                    pass_len = v.samples.len() as u64;
                    run.passes_on_view = 0;
                    if epoch >= job.epochs {
                        cohort.leave(&job.name)?;
                        run.done = true;
                        run.res.ticks = tick - run.res.ticks;
                        continue;
                    }
                    prepare(&mut cohort, job, &mut tier)?;
                } else {
                    run.res.bonus_passes += 1;
                }
            }
            run.pass_end = tick + pass_len * job.period;
        }
        tick += 1;
    }
    Ok(CohortResult {
        tier_bytes: tier,
        jobs: runs.into_iter().map(|r| r.res).collect(),
    })
}
