//! A job of N nodes on one shard queue, simulated: N tokio tasks, each a node's daemon reduced to
//! its queue feed, running the daemon's own [`Worker`] (join under a lease renewed in the
//! background, the watch that gives dead nodes' shards back, claim, done) against a real etcd.
//! `benches/nodes.py` runs it at 8 to 1,024 nodes and prints the tables.
//!
//! usage: dds_nodes --url etcd://HOST:PORT/PREFIX --workers N [--epochs 2]
//!                  [--slots-per-epoch 3] [--pass-ms 2000] [--jitter 0.25] [--rf 1]
//!                  [--lease-secs 10] [--kill-frac 0.01] [--etcd-pid PID] [--seed 1]
//!
//! Each node does what `metfs mount --dds` does with its queue (`metfs/src/daemon/queue.rs`):
//! its daemon comes up at a random moment of the job's first `--start-spread-ms` (2 s),
//! connects and joins (retried every 2 s if etcd does not answer), claims its first batch (a
//! slot's bytes: 4 shards) and stages it for about a pass's time, then, as soon as a view is
//! shown, claims its successor while the pass runs; marks the view's shards DONE when the first pass ends
//! (`--shard-done after-pass`), waits 1 s on `Wait` and retries after 2 s when etcd fails. A
//! pass takes `--pass-ms` ± `--jitter` (drawn per pass, so nodes drift apart as real ones do);
//! `--rf` passes make a view. The queue holds `--slots-per-epoch` slots of 4 shards per node
//! and epoch.
//!
//! `--kill-frac` of the nodes (at least one) die at random moments of the first epoch, each a
//! node that holds a batch at that moment: the task is aborted, which drops its `Worker` and
//! so stops its lease's renewal without revoking anything, as a `kill -9` of the daemon would.
//! The shards the dead node held are read from etcd (its claims) and a watch of the TODO keys
//! times their return: time from the kill to the last of them back in TODO.
//!
//! Measured over the run (from the job's start until every shard is done): join latency (connect
//! and join), claim latency (each `claim` that returned a batch, conflicts and retries inside it
//! included), done latency, etcd's requests by method (its `/metrics`: gRPC messages
//! received, keep-alives included) and watch messages sent, etcd's CPU (`/proc/PID/stat`)
//! and this process's own. At the end the invariant is checked from etcd and from what the
//! nodes were told: every shard of every epoch DONE exactly once (its `done/` key written once,
//! at version 1, and reported done to one node only), no key left TODO, DOING or claimed, and
//! every sample of each epoch in exactly one DONE shard. One JSON object goes to stdout; the
//! exit status is 1 if the invariant does not hold, 2 on bad input.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use metfs_dds::keys::{default_stripes, Keys, LAYOUT_VERSION};
use metfs_dds::{
    Batch, Claim, DdsUrl, EtcdOptions, Holder, OwnedSamples, Queue, QueueMeta, Worker, WorkerConfig,
};
use metfs_plan::planner::Strategy;
use rand::{Rng, SeedableRng};
use serde_json::json;

mod check;
mod kills;
mod measure;
use measure::*;

#[derive(Parser, Debug)]
#[command(about = "N simulated nodes on one dynamic-sharding queue in a real etcd")]
struct Args {
    /// The queue: etcd://HOST:PORT/PREFIX (a fresh prefix).
    #[arg(long)]
    url: String,
    /// Simulated nodes (workers), at least 1.
    #[arg(long)]
    workers: u32,
    /// Epochs to run.
    #[arg(long, default_value_t = 2)]
    epochs: u64,
    /// Slots (batches of 4 shards) per node and epoch: the queue has 4 x this x N shards.
    #[arg(long, default_value_t = 3)]
    slots_per_epoch: u32,
    /// Milliseconds of one pass over a view.
    #[arg(long, default_value_t = 2000)]
    pass_ms: u64,
    /// A pass lasts pass-ms x (1 ± jitter), drawn per pass.
    #[arg(long, default_value_t = 0.25)]
    jitter: f64,
    /// Passes per view (DONE is marked after the first).
    #[arg(long, default_value_t = 1)]
    rf: u32,
    /// Lease TTL in seconds (the daemon's default, --dds-lease-ttl-secs, is 10).
    #[arg(long, default_value_t = 10)]
    lease_secs: u64,
    /// Fraction of the nodes killed mid-run (at least one).
    #[arg(long, default_value_t = 0.01)]
    kill_frac: f64,
    /// etcd's process id, for its CPU time.
    #[arg(long)]
    etcd_pid: Option<u32>,
    /// Stop the job after this many seconds if its epochs are not done by then (0: never), and
    /// report what it did until then.
    #[arg(long, default_value_t = 0)]
    max_run_s: u64,
    /// The nodes' daemons come up at random moments of this many milliseconds.
    #[arg(long, default_value_t = 2000)]
    start_spread_ms: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Stripes of the queue's never-claimed shards, each with its own cursor (0: the default of
    /// a queue a mount makes, one per 256 shards; 1: one cursor per epoch, as before stripes).
    #[arg(long, default_value_t = 0)]
    stripes: u32,
}

/// Shards per slot: a node claims a slot's bytes, about four shards (`--shards-per-slot`'s
/// default).
const SHARDS_PER_SLOT: u32 = 4;
/// Samples per shard, all of one size: the count sets only the planner's work in each node (a
/// thousand simulated nodes share this process's cores with etcd), not etcd's, so it is one.
const SAMPLES_PER_SHARD: u32 = 1;
const SAMPLE_BYTES: u64 = 1 << 20;
/// The daemon's pauses (`metfs/src/daemon/queue.rs`): after `Wait`, and after etcd failed.
const WAIT: Duration = Duration::from_secs(1);
const RETRY: Duration = Duration::from_secs(2);

fn bad(what: &str, why: &str) -> ! {
    eprintln!("dds_nodes: {what}: {why}");
    std::process::exit(2);
}

/// What one node saw.
#[derive(Default)]
struct NodeLog {
    /// When the claim in flight began.
    claiming: Option<Instant>,
    join_ms: Vec<f64>,
    join_errors: u64,
    claim_ms: Vec<f64>,
    /// Of `claim_ms`, the node's first claim (made as the job starts, before its mount goes
    /// live, when every node claims at once).
    first_claim_ms: Vec<f64>,
    wait_claims: u64,
    done_ms: Vec<f64>,
    errors: u64,
    last_error: Option<String>,
    /// (epoch, shard) reported done to this node.
    done: Vec<(u64, u32)>,
    lost: u64,
}

type Shared = Arc<Mutex<NodeLog>>;

fn lock(l: &Shared) -> std::sync::MutexGuard<'_, NodeLog> {
    l.lock().unwrap_or_else(|p| p.into_inner())
}

fn err(log: &Shared, e: impl ToString) {
    let mut l = lock(log);
    l.errors += 1;
    l.last_error = Some(e.to_string());
}

fn pass_time(rng: &mut rand::rngs::StdRng, a: &Args) -> Duration {
    let f = 1.0 + a.jitter * (2.0 * rng.random::<f64>() - 1.0);
    Duration::from_secs_f64(a.pass_ms as f64 * f.max(0.0) / 1000.0)
}

/// `first`: the node's first claim, before its mount goes live (counted apart too).
async fn claim(w: &mut Worker, max: u64, log: &Shared, first: bool) -> Result<Claim, ()> {
    let t = Instant::now();
    lock(log).claiming = Some(t);
    let r = w.claim(max).await;
    lock(log).claiming = None;
    match r {
        Ok(Claim::Batch(b)) => {
            let ms = t.elapsed().as_secs_f64() * 1000.0;
            let mut l = lock(log);
            l.claim_ms.push(ms);
            if first {
                l.first_claim_ms.push(ms);
            }
            Ok(Claim::Batch(b))
        }
        Ok(c) => {
            lock(log).wait_claims += 1;
            Ok(c)
        }
        Err(e) => {
            err(log, e);
            Err(())
        }
    }
}

/// Marks `b` done, retrying every 2 s while etcd fails (the daemon keeps the marks).
async fn done(w: &mut Worker, b: &Batch, log: &Shared) {
    loop {
        let t = Instant::now();
        match w.done(b).await {
            Ok(r) => {
                let mut l = lock(log);
                l.done_ms.push(t.elapsed().as_secs_f64() * 1000.0);
                l.done.extend(r.done.iter().map(|&k| (b.epoch, k)));
                l.lost += r.lost.len() as u64;
                return;
            }
            Err(e) => {
                err(log, e);
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

/// What a node starts from.
struct NodeSetup {
    url: DdsUrl,
    opts: EtcdOptions,
    meta: QueueMeta,
    samples: Arc<OwnedSamples>,
    cfg: WorkerConfig,
    start: Instant,
    /// Who it is once joined (for the kills).
    holder: Arc<Mutex<Option<Holder>>>,
}

/// Connects and joins as the daemon does at mount, retried every 2 s (a mount would fail and
/// be started again); `None` after 10 failures.
async fn join(s: &NodeSetup, log: &Shared) -> Option<Worker> {
    for _ in 0..10 {
        let t = Instant::now();
        let r = async {
            let q = Queue::connect(&s.url, &s.opts).await?;
            Worker::join(q, s.meta.clone(), s.samples.clone(), s.cfg.clone()).await
        }
        .await;
        match r {
            Ok(w) => {
                lock(log).join_ms.push(t.elapsed().as_secs_f64() * 1000.0);
                return Some(w);
            }
            Err(e) => {
                lock(log).join_errors += 1;
                err(log, e);
                tokio::time::sleep(RETRY).await;
            }
        }
    }
    None
}

/// One node's daemon with its queue feed, as `metfs mount --dds` runs it, until the queue is
/// finished.
async fn node(s: NodeSetup, a: Arc<Args>, max: u64, log: Shared, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    tokio::time::sleep_until(s.start.into()).await;
    let Some(mut w) = join(&s, &log).await else {
        return;
    };
    *s.holder.lock().unwrap_or_else(|p| p.into_inner()) = Some(w.holder().clone());
    // The first batch is claimed and staged before the mount goes live; staging a slot takes
    // about as long as a pass over it (the prefetcher reads the next slot during the passes).
    let mut view = loop {
        match claim(&mut w, max, &log, true).await {
            Ok(Claim::Batch(b)) => break b,
            Ok(Claim::Wait) => w.wait(WAIT).await,
            Ok(Claim::Finished) => return,
            Err(()) => tokio::time::sleep(RETRY).await,
        }
    };
    tokio::time::sleep(pass_time(&mut rng, &a)).await;
    loop {
        // The view is shown: its first pass starts and the successor is claimed meanwhile.
        let pass_end = Instant::now() + pass_time(&mut rng, &a);
        let mut marked = false;
        let next = loop {
            if !marked && Instant::now() >= pass_end {
                done(&mut w, &view, &log).await;
                marked = true;
            }
            match claim(&mut w, max, &log, false).await {
                Ok(Claim::Batch(b)) => break Some(b),
                Ok(Claim::Finished) => break None,
                Ok(Claim::Wait) => {
                    let limit = if marked {
                        WAIT
                    } else {
                        WAIT.min(pass_end.saturating_duration_since(Instant::now()))
                    };
                    w.wait(limit).await
                }
                Err(()) => tokio::time::sleep(RETRY).await,
            }
        };
        if !marked {
            tokio::time::sleep_until(pass_end.into()).await;
            done(&mut w, &view, &log).await;
        }
        for _ in 1..a.rf {
            tokio::time::sleep(pass_time(&mut rng, &a)).await;
        }
        match next {
            Some(b) => view = b,
            None => return,
        }
    }
}

/// Refuses settings the simulation cannot run (exit status 2, naming them).
fn check_args(a: &Args) {
    if a.workers == 0 {
        bad("--workers", "0: a job has at least 1 node");
    }
    if a.epochs == 0 || a.slots_per_epoch == 0 || a.rf == 0 || a.pass_ms == 0 {
        bad(
            "--epochs, --slots-per-epoch, --rf, --pass-ms",
            "each must be at least 1",
        );
    }
    if a.lease_secs < 2 {
        bad("--lease-secs", "at least 2 (etcd's minimum TTL)");
    }
    if !(0.0..=1.0).contains(&a.kill_frac) || !(0.0..1.0).contains(&a.jitter) {
        bad(
            "--kill-frac, --jitter",
            "kill-frac in [0, 1], jitter in [0, 1)",
        );
    }
}

/// The job's queue, made in etcd, and what every node is given to join it.
struct Job {
    url: DdsUrl,
    opts: EtcdOptions,
    meta: QueueMeta,
    samples: Arc<OwnedSamples>,
    /// Bytes one claim takes: a slot.
    slot: u64,
    keys: Keys,
}

/// Makes the queue of `a.workers` nodes (`--slots-per-epoch` slots of 4 one-sample shards per
/// node and epoch) at `--url`.
async fn open_queue(a: &Args) -> Job {
    let url = DdsUrl::parse(&a.url).unwrap_or_else(|e| bad("--url", &e.to_string()));
    let opts = EtcdOptions::default();
    let n = a.workers;
    let shards = SHARDS_PER_SLOT * a.slots_per_epoch * n;
    let samples = Arc::new(OwnedSamples {
        sizes: vec![SAMPLE_BYTES; (shards * SAMPLES_PER_SHARD) as usize],
        labels: None,
        clusters: None,
    });
    let meta = QueueMeta {
        version: LAYOUT_VERSION,
        fingerprint: format!("nodes-sim-{n}"),
        seed: a.seed,
        // The cheapest composition to plan, for the same reason; etcd sees the same keys.
        strategy: Strategy::Sequential,
        shards,
        shard_bytes: SAMPLES_PER_SHARD as u64 * SAMPLE_BYTES,
        samples: samples.sizes.len() as u64,
        stripes: if a.stripes == 0 {
            default_stripes(shards)
        } else {
            a.stripes
        },
        sample_settings: None,
    };
    let slot = SHARDS_PER_SLOT as u64 * meta.shard_bytes;
    let q = Queue::connect(&url, &opts)
        .await
        .unwrap_or_else(|e| bad("--url", &e.to_string()));
    let (meta, _) = q
        .init(&meta)
        .await
        .unwrap_or_else(|e| bad("--url", &e.to_string()));
    let keys = Keys::new(&url.prefix);
    Job {
        url,
        opts,
        meta,
        samples,
        slot,
        keys,
    }
}

/// Starts every node: each node's daemon comes up at a random moment of the first
/// `--start-spread-ms`, connects, joins, claims its first batch and stages it, then serves.
fn spawn_nodes(a: &Arc<Args>, job: &Job, t0: Instant, logs: &[Shared]) -> Vec<kills::Task> {
    let mut starts = rand::rngs::StdRng::seed_from_u64(a.seed ^ 0x7374_6172);
    logs.iter()
        .enumerate()
        .map(|(i, log)| {
            let cfg = WorkerConfig {
                node: format!("n{i:04}"),
                lease_ttl: Duration::from_secs(a.lease_secs),
                depth: 2,
                last_epoch: Some(a.epochs - 1),
            };
            let holder = Arc::new(Mutex::new(None));
            let start = Duration::from_millis(starts.random_range(0..a.start_spread_ms.max(1)));
            let t = tokio::spawn(node(
                NodeSetup {
                    url: job.url.clone(),
                    opts: job.opts.clone(),
                    meta: job.meta.clone(),
                    samples: job.samples.clone(),
                    cfg,
                    start: t0 + start,
                    holder: holder.clone(),
                },
                a.clone(),
                job.slot,
                log.clone(),
                a.seed * 1_000_003 + i as u64,
            ));
            (holder, Some(t))
        })
        .collect()
}

/// Waits for every node until the queue is finished, or until `--max-run-s`; true when the
/// job was stopped early.
async fn run_nodes(a: &Args, t0: Instant, tasks: &mut [kills::Task]) -> bool {
    let deadline = (a.max_run_s > 0).then(|| t0 + Duration::from_secs(a.max_run_s));
    let mut cut = false;
    for (_, t) in tasks.iter_mut() {
        let Some(mut t) = t.take() else { continue };
        match deadline {
            None => t.await.expect("node task"),
            Some(d) => match tokio::time::timeout_at(d.into(), &mut t).await {
                Ok(r) => r.expect("node task"),
                Err(_) => {
                    cut = true;
                    t.abort();
                }
            },
        }
    }
    cut
}

/// What the nodes saw, all together.
#[derive(Default)]
struct Totals {
    claim_ms: Vec<f64>,
    first_claim_ms: Vec<f64>,
    /// Every claim but the nodes' first: those made while a pass runs.
    running_claim_ms: Vec<f64>,
    done_ms: Vec<f64>,
    join_ms: Vec<f64>,
    join_errors: u64,
    errors: u64,
    wait_claims: u64,
    lost: u64,
    last_error: Option<String>,
    never_joined: usize,
    /// How many nodes each (epoch, shard) was reported done to.
    told: HashMap<(u64, u32), u32>,
}

fn totals(logs: &[Shared]) -> Totals {
    let mut t = Totals::default();
    for l in logs {
        let l = lock(l);
        t.claim_ms.extend_from_slice(&l.claim_ms);
        t.first_claim_ms.extend_from_slice(&l.first_claim_ms);
        // A node's first claim is the first it made that returned a batch.
        t.running_claim_ms
            .extend(l.claim_ms.iter().skip(l.first_claim_ms.len()));
        t.join_ms.extend_from_slice(&l.join_ms);
        t.join_errors += l.join_errors;
        t.done_ms.extend_from_slice(&l.done_ms);
        t.errors += l.errors;
        t.wait_claims += l.wait_claims;
        t.lost += l.lost;
        t.never_joined += usize::from(l.join_ms.is_empty());
        if l.last_error.is_some() {
            t.last_error.clone_from(&l.last_error);
        }
        for &s in &l.done {
            *t.told.entry(s).or_default() += 1;
        }
    }
    t
}

/// etcd's counters and CPU, and this process's CPU, at one moment.
struct Gauges {
    metrics: HashMap<String, f64>,
    etcd_cpu: f64,
    own_cpu: f64,
}

async fn gauges(endpoint: &str, etcd_pid: Option<&str>) -> Gauges {
    Gauges {
        metrics: metrics(endpoint).await,
        etcd_cpu: etcd_pid.map_or(f64::NAN, cpu_secs),
        own_cpu: cpu_secs("self"),
    }
}

#[tokio::main]
async fn main() {
    let a = Arc::new(Args::parse());
    check_args(&a);
    let job = open_queue(&a).await;
    let endpoint = job.url.endpoints[0].clone();
    let mut observer = metfs_dds::connect(&job.url, &job.opts)
        .await
        .unwrap_or_else(|e| bad("--url", &e.to_string()));
    let requeued: Requeues = Arc::default();
    let watcher = tokio::spawn(watch_todo(
        observer.clone(),
        job.keys.clone(),
        requeued.clone(),
    ));
    let etcd_pid = a.etcd_pid.map(|p| p.to_string());
    let g0 = gauges(&endpoint, etcd_pid.as_deref()).await;
    let t0 = Instant::now();
    let logs: Vec<Shared> = (0..a.workers).map(|_| Shared::default()).collect();
    let mut tasks = spawn_nodes(&a, &job, t0, &logs);
    let killed = kills::kill_some(&a, t0, &mut tasks, &logs).await;
    // What each dead node held: its claims in etcd, once requests in flight have landed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = kills::held(&mut observer, &job.keys, &killed).await;
    let cut = run_nodes(&a, t0, &mut tasks).await;
    let run_s = t0.elapsed().as_secs_f64();
    // Claims still waiting for their answer when the job was stopped.
    let waiting: Vec<f64> = logs
        .iter()
        .filter_map(|l| lock(l).claiming)
        .map(|c| c.elapsed().as_secs_f64() * 1000.0)
        .collect();
    let g1 = gauges(&endpoint, etcd_pid.as_deref()).await;
    watcher.abort();

    // The invariant.
    let t = totals(&logs);
    let mut problems: Vec<String> = Vec::new();
    let twice = t.told.values().filter(|&&c| c > 1).count();
    if twice > 0 {
        problems.push(format!(
            "{twice} shards reported done to more than one node"
        ));
    }
    let done = scan(&mut observer, job.keys.done_all()).await;
    let seen = requeued.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let requeue = kills::requeue_times(&job.keys, &killed, &held, &done, &seen, t0);
    let per_epoch = check::done_keys(
        &mut observer,
        &job.keys,
        &done,
        (&job.meta, &job.samples),
        (a.epochs, cut),
        &mut problems,
    )
    .await;
    let (by_method, watch_sent) = requests(&g0.metrics, &g1.metrics);
    let total: f64 = by_method.values().sum();
    let etcd_cpu = g1.etcd_cpu - g0.etcd_cpu;
    let out = json!({
        "workers": a.workers,
        "epochs": a.epochs,
        "shards_per_epoch": job.meta.shards,
        "stripes": job.meta.stripes,
        "pass_ms": a.pass_ms,
        "rf": a.rf,
        "lease_secs": a.lease_secs,
        "start_spread_ms": a.start_spread_ms,
        "join_ms": summary(t.join_ms),
        "join_errors": t.join_errors,
        "never_joined": t.never_joined,
        "run_s": (run_s * 1000.0).round() / 1000.0,
        "claim_ms": summary(t.claim_ms),
        "first_claim_ms": summary(t.first_claim_ms),
        "running_claim_ms": summary(t.running_claim_ms),
        "done_ms": summary(t.done_ms),
        "wait_claims": t.wait_claims,
        "errors": t.errors,
        "last_error": t.last_error,
        "lost_shards": t.lost,
        "kills": requeue,
        "etcd": {
            "requests": total,
            "requests_per_s": (total / run_s).round(),
            "by_method": by_method,
            "watch_msgs_per_s": (watch_sent / run_s).round(),
            "cpu_s": (etcd_cpu * 100.0).round() / 100.0,
            "server": measure::server_latency(&g0.metrics, &g1.metrics),
            "cpu_cores": (etcd_cpu / run_s * 1000.0).round() / 1000.0,
        },
        "sim_cpu_cores": ((g1.own_cpu - g0.own_cpu) / run_s * 1000.0).round() / 1000.0,
        "finished": !cut,
        "max_run_s": a.max_run_s,
        "done_shards": done.len(),
        "claims_waiting_at_stop": summary(waiting),
        "invariant": {
            "ok": problems.is_empty(),
            "problems": problems,
            "done_per_epoch": per_epoch.values().map(Vec::len).collect::<Vec<_>>(),
        },
    });
    println!("{out}");
    if !problems.is_empty() {
        std::process::exit(1);
    }
}
