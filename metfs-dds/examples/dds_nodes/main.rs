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

async fn claim(w: &mut Worker, max: u64, log: &Shared) -> Result<Claim, ()> {
    let t = Instant::now();
    lock(log).claiming = Some(t);
    let r = w.claim(max).await;
    lock(log).claiming = None;
    match r {
        Ok(Claim::Batch(b)) => {
            lock(log).claim_ms.push(t.elapsed().as_secs_f64() * 1000.0);
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
        match claim(&mut w, max, &log).await {
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
            match claim(&mut w, max, &log).await {
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

#[tokio::main]
async fn main() {
    let a = Arc::new(Args::parse());
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
    let url = DdsUrl::parse(&a.url).unwrap_or_else(|e| bad("--url", &e.to_string()));
    let endpoint = url.endpoints[0].clone();
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
    let mut observer = metfs_dds::connect(&url, &opts)
        .await
        .unwrap_or_else(|e| bad("--url", &e.to_string()));
    let requeued: Requeues = Arc::default();
    let watcher = tokio::spawn(watch_todo(observer.clone(), keys.clone(), requeued.clone()));

    // The job starts: each node's daemon comes up at a random moment of the first
    // --start-spread-ms, connects, joins, claims its first batch and stages it, then serves.
    let etcd_pid = a.etcd_pid.map(|p| p.to_string());
    let m0 = metrics(&endpoint).await;
    let cpu0 = etcd_pid.as_deref().map_or(f64::NAN, cpu_secs);
    let self0 = cpu_secs("self");
    let t0 = Instant::now();
    let logs: Vec<Shared> = (0..n).map(|_| Shared::default()).collect();
    let mut starts = rand::rngs::StdRng::seed_from_u64(a.seed ^ 0x7374_6172);
    let mut tasks: Vec<_> = logs
        .iter()
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
                    url: url.clone(),
                    opts: opts.clone(),
                    meta: meta.clone(),
                    samples: samples.clone(),
                    cfg,
                    start: t0 + start,
                    holder: holder.clone(),
                },
                a.clone(),
                slot,
                log.clone(),
                a.seed * 1_000_003 + i as u64,
            ));
            (holder, Some(t))
        })
        .collect();

    // The kills: at random moments of the first epoch (once every node is up), each of a node
    // drawn at that moment among those that hold a batch (a node that holds nothing leaves
    // nothing to requeue; on an overloaded queue many have none yet).
    let kills = ((n as f64 * a.kill_frac).round() as u32).max(u32::from(a.kill_frac > 0.0));
    let mut rng = rand::rngs::StdRng::seed_from_u64(a.seed ^ 0x6b69_6c6c);
    let epoch_ms = a.pass_ms * u64::from(a.rf) * u64::from(a.slots_per_epoch);
    let from = a.start_spread_ms + a.pass_ms;
    let mut plan: Vec<u64> = (0..kills)
        .map(|_| rng.random_range(from..from + epoch_ms))
        .collect();
    plan.sort_unstable();
    let mut killed = Vec::new();
    for at in plan {
        tokio::time::sleep_until((t0 + Duration::from_millis(at)).into()).await;
        let holding: Vec<usize> = (0..n as usize)
            .filter(|&i| {
                tasks[i].1.as_ref().is_some_and(|t| !t.is_finished())
                    && !lock(&logs[i]).claim_ms.is_empty()
            })
            .collect();
        if holding.is_empty() {
            continue;
        }
        let v = holding[rng.random_range(0..holding.len())];
        let Some(h) = tasks[v].0.lock().unwrap_or_else(|p| p.into_inner()).clone() else {
            continue;
        };
        let Some(t) = tasks[v].1.take() else { continue };
        // Dropping the task drops its Worker: the lease is no longer renewed, nothing revoked.
        t.abort();
        let _ = t.await;
        killed.push((h, Instant::now(), v));
    }
    // What each dead node held: its claims in etcd, once requests in flight have landed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let claims = scan(&mut observer, keys.claim_all()).await;
    let held: Vec<Vec<(u64, u32)>> = killed
        .iter()
        .map(|(h, _, _)| {
            claims
                .iter()
                .filter(|(_, v, _)| serde_json::from_slice::<Holder>(v).is_ok_and(|x| &x == h))
                .filter_map(|(k, _, _)| keys.parse_shard(k).map(|(_, e, s)| (e, s)))
                .collect()
        })
        .collect();

    // The job runs until every shard is done, or until --max-run-s.
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
    let run_s = t0.elapsed().as_secs_f64();
    // Claims still waiting for their answer when the job was stopped.
    let waiting: Vec<f64> = logs
        .iter()
        .filter_map(|l| lock(l).claiming)
        .map(|c| c.elapsed().as_secs_f64() * 1000.0)
        .collect();
    let cpu1 = etcd_pid.as_deref().map_or(f64::NAN, cpu_secs);
    let self1 = cpu_secs("self");
    let m1 = metrics(&endpoint).await;
    watcher.abort();

    // The invariant.
    let mut problems: Vec<String> = Vec::new();
    let mut told: HashMap<(u64, u32), u32> = HashMap::new();
    let (mut claim_ms, mut done_ms, mut join_ms) = (Vec::new(), Vec::new(), Vec::new());
    let (mut errors, mut wait_claims, mut lost, mut join_errors) = (0u64, 0u64, 0u64, 0u64);
    let mut last_error = None;
    for l in &logs {
        let l = lock(l);
        claim_ms.extend_from_slice(&l.claim_ms);
        join_ms.extend_from_slice(&l.join_ms);
        join_errors += l.join_errors;
        done_ms.extend_from_slice(&l.done_ms);
        errors += l.errors;
        wait_claims += l.wait_claims;
        lost += l.lost;
        if l.last_error.is_some() {
            last_error.clone_from(&l.last_error);
        }
        for &s in &l.done {
            *told.entry(s).or_default() += 1;
        }
    }
    let never_joined = logs.iter().filter(|l| lock(l).join_ms.is_empty()).count();
    let twice = told.values().filter(|&&c| c > 1).count();
    if twice > 0 {
        problems.push(format!(
            "{twice} shards reported done to more than one node"
        ));
    }
    let done = scan(&mut observer, keys.done_all()).await;
    // Requeue time of each kill: until the last shard it held is back in TODO. A shard whose
    // DONE mark was on its way when the node died (it landed after the claims were read, on a
    // loaded etcd) is DONE by the dead node and never requeued: counted apart.
    let done_by: HashMap<(u64, u32), Holder> = done
        .iter()
        .filter_map(|(k, v, _)| {
            let (_, e, s) = keys.parse_shard(k)?;
            Some(((e, s), serde_json::from_slice(v).ok()?))
        })
        .collect();
    let seen = requeued.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let requeue: Vec<serde_json::Value> = killed
        .iter()
        .zip(&held)
        .map(|((h, when, _), shards)| {
            let (landed, back): (Vec<_>, Vec<_>) =
                shards.iter().partition(|s| done_by.get(s) == Some(h));
            let times: Vec<Option<f64>> = back
                .iter()
                .map(|s| {
                    seen.get(s)
                        .and_then(|ts| ts.iter().find(|t| *t >= when))
                        .map(|t| t.duration_since(*when).as_secs_f64())
                })
                .collect();
            let all = times.iter().all(Option::is_some);
            let last = times.iter().flatten().copied().fold(f64::NAN, f64::max);
            let requeue_s = if back.is_empty() || !all {
                serde_json::Value::Null
            } else {
                json!((last * 1000.0).round() / 1000.0)
            };
            json!({
                "node": h.node,
                "at_s": (when.duration_since(t0).as_secs_f64() * 100.0).round() / 100.0,
                "held_shards": shards.len(),
                "done_as_it_died": landed.len(),
                "requeue_s": requeue_s,
            })
        })
        .collect();
    let per_epoch = check::done_keys(
        &mut observer,
        &keys,
        &done,
        (&meta, &samples),
        (a.epochs, cut),
        &mut problems,
    )
    .await;
    let (by_method, watch_sent) = requests(&m0, &m1);
    let total: f64 = by_method.values().sum();
    let etcd_cpu = cpu1 - cpu0;
    let out = json!({
        "workers": n,
        "epochs": a.epochs,
        "shards_per_epoch": meta.shards,
        "stripes": meta.stripes,
        "pass_ms": a.pass_ms,
        "rf": a.rf,
        "lease_secs": a.lease_secs,
        "start_spread_ms": a.start_spread_ms,
        "join_ms": summary(join_ms),
        "join_errors": join_errors,
        "never_joined": never_joined,
        "run_s": (run_s * 1000.0).round() / 1000.0,
        "claim_ms": summary(claim_ms),
        "done_ms": summary(done_ms),
        "wait_claims": wait_claims,
        "errors": errors,
        "last_error": last_error,
        "lost_shards": lost,
        "kills": requeue,
        "etcd": {
            "requests": total,
            "requests_per_s": (total / run_s).round(),
            "by_method": by_method,
            "watch_msgs_per_s": (watch_sent / run_s).round(),
            "cpu_s": (etcd_cpu * 100.0).round() / 100.0,
            "cpu_cores": (etcd_cpu / run_s * 1000.0).round() / 1000.0,
        },
        "sim_cpu_cores": ((self1 - self0) / run_s * 1000.0).round() / 1000.0,
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
