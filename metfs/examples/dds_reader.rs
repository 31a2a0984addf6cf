//! A node that reads a dataset straight from a directory, taking its work from a dynamic-sharding
//! queue (or, with `--static`, from its fixed share of each epoch as `--nodes/--node-rank` give
//! it today). The queue's fault test (`tests/stress/dds_faults.py`) and the straggler benchmark
//! (`benches/dds_straggler.py`) run several of these against one etcd and kill them.
//!
//! usage: dds_reader --source DIR --log FILE (--url etcd://HOST:PORT/PREFIX --node NAME
//!                   | --static RANK/NODES) [--slot BYTES] [--lease SECS] [--epochs N]
//!                   [--rate BYTES_PER_S] [--compose random|stratified] [--seed N]
//!
//! Every sample read is logged as `read EPOCH SHARD ID BYTES` (fsync'd before its shard is
//! marked done), every shard marked done as `done EPOCH SHARD NODE INC` and every shard lost to
//! an expired lease as `lost EPOCH SHARD`; the first line is `start NODE INC`. At the end one
//! JSON line goes to stdout: samples, bytes, seconds, etcd round trips and their seconds, and
//! the seconds spent in claims that gave work and in marking it done (`etcd_busy_secs`).
//! Errors from etcd (down, restarting) are retried every 200 ms, as a daemon would.
//!
//! Each log line goes out in one `write(2)` (`Reader::line`): `writeln!` on an unbuffered file
//! writes each formatted piece with its own call, so a `kill -9` could leave half a line, and the
//! next incarnation's `start` line glued to it would be lost, its reads counted as the dead
//! incarnation's. A restarted reader also ends a torn last line before its `start` line.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metfs_dds::{dataset, Claim, DdsUrl, EtcdOptions, Queue, Worker, WorkerConfig};
use metfs_plan::budget::Staged;
use metfs_plan::planner::{plan_epoch, PlanConfig, Strategy};
use metfs_tier::catalog::Catalog;
use metfs_tier::CapacityTier;

struct Args {
    source: PathBuf,
    log: PathBuf,
    url: Option<String>,
    node: String,
    fixed: Option<(u32, u32)>,
    slot: u64,
    lease: u64,
    epochs: u64,
    rate: u64,
    strategy: Strategy,
    seed: u64,
}

fn args() -> Args {
    let mut a = Args {
        source: PathBuf::new(),
        log: PathBuf::new(),
        url: None,
        node: String::new(),
        fixed: None,
        slot: 1 << 20,
        lease: 2,
        epochs: 1,
        rate: 0,
        strategy: Strategy::Random,
        seed: 0,
    };
    let v: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < v.len() {
        let val = v.get(i + 1).cloned().unwrap_or_default();
        match v[i].as_str() {
            "--source" => a.source = val.into(),
            "--log" => a.log = val.into(),
            "--url" => a.url = Some(val),
            "--node" => a.node = val,
            "--static" => {
                let (r, n) = val.split_once('/').expect("--static RANK/NODES");
                a.fixed = Some((r.parse().unwrap(), n.parse().unwrap()));
            }
            "--slot" => a.slot = val.parse().unwrap(),
            "--lease" => a.lease = val.parse().unwrap(),
            "--epochs" => a.epochs = val.parse().unwrap(),
            "--rate" => a.rate = val.parse().unwrap(),
            "--compose" => {
                a.strategy = match val.as_str() {
                    "stratified" => Strategy::Stratified,
                    "random" => Strategy::Random,
                    s => panic!("--compose {s}: random or stratified"),
                }
            }
            "--seed" => a.seed = val.parse().unwrap(),
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    a
}

struct Reader {
    source: PathBuf,
    log: std::fs::File,
    rate: u64,
    started: Instant,
    bytes: u64,
    samples: u64,
}

impl Reader {
    /// Appends one whole line to the log in a single write (see the module docs).
    fn line(&mut self, text: std::fmt::Arguments) {
        let mut l = text.to_string();
        l.push('\n');
        self.log.write_all(l.as_bytes()).unwrap();
    }

    /// Ends a line a killed incarnation left half written, so the next line stands alone.
    fn end_torn_line(&mut self) {
        use std::io::{Seek, SeekFrom};
        let len = self.log.metadata().unwrap().len();
        if len == 0 {
            return;
        }
        let mut last = [0u8; 1];
        let mut f = self.log.try_clone().unwrap();
        f.seek(SeekFrom::Start(len - 1)).unwrap();
        f.read_exact(&mut last).unwrap();
        if last[0] != b'\n' {
            self.log.write_all(b"\n").unwrap();
        }
    }

    /// Reads one sample at the node's pace and logs it.
    fn read(&mut self, cat: &Catalog, epoch: u64, shard: u32, id: u32) {
        let mut f = std::fs::File::open(self.source.join(cat.path(id))).unwrap();
        let mut buf = Vec::new();
        let n = f.read_to_end(&mut buf).unwrap() as u64;
        assert_eq!(n, cat.size(id), "{}", cat.path(id));
        self.line(format_args!("read {epoch} {shard} {id} {n}"));
        self.bytes += n;
        self.samples += 1;
        if self.rate > 0 {
            let due = Duration::from_secs_f64(self.bytes as f64 / self.rate as f64);
            if let Some(wait) = due.checked_sub(self.started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }

    fn sync(&mut self) {
        self.log.flush().unwrap();
        self.log.sync_data().unwrap();
    }
}

async fn catalog(source: &Path, strategy: Strategy) -> Catalog {
    let tier = metfs_tier::PosixTier::new(source).unwrap();
    let l = tier.list().await.unwrap();
    let mut cat = Catalog::from_entries(tier.url(), l.entries).unwrap();
    if strategy == Strategy::Stratified {
        cat.label_by_first_dir();
    }
    cat
}

/// Retries an etcd call every 200 ms until it succeeds (etcd down or restarting).
macro_rules! retry {
    ($e:expr) => {
        loop {
            match $e {
                Ok(v) => break v,
                Err(e) => {
                    eprintln!("dds_reader: {e}; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    };
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a = args();
    let cat = catalog(&a.source, a.strategy).await;
    let footprints = metfs_plan::budget::footprints(cat.sizes(), Staged::Copy);
    let samples = Arc::new(dataset::samples(&cat, footprints));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(&a.log)
        .unwrap();
    let mut r = Reader {
        source: a.source.clone(),
        log,
        rate: a.rate,
        started: Instant::now(),
        bytes: 0,
        samples: 0,
    };
    if let Some((rank, nodes)) = a.fixed {
        // Today's static sharding: this node's fixed share of every mini-epoch.
        r.end_torn_line();
        r.line(format_args!("start static-{rank} 0"));
        let cfg = PlanConfig {
            strategy: a.strategy,
            seed: a.seed,
            slot_bytes: a.slot,
            mini_epochs: None,
            node_rank: rank,
            nodes,
            cluster_copies: Default::default(),
        };
        for e in 0..a.epochs {
            let plan = plan_epoch(&samples.set(), &cfg, e).unwrap();
            for me in &plan.mini_epochs {
                for &id in &me.samples {
                    r.read(&cat, e, u32::MAX, id);
                }
            }
        }
        r.sync();
        let secs = r.started.elapsed().as_secs_f64();
        println!(
            "{{\"node\":\"static-{rank}\",\"samples\":{},\"bytes\":{},\"secs\":{secs},\"etcd_round_trips\":0,\"etcd_secs\":0}}",
            r.samples, r.bytes
        );
        return;
    }
    let url = DdsUrl::parse(a.url.as_deref().expect("--url")).unwrap();
    let opts = EtcdOptions {
        timeout: Duration::from_secs(2),
        ..Default::default()
    };
    let meta = dataset::queue_meta(
        &cat,
        &samples,
        None,
        a.strategy,
        a.seed,
        a.slot,
        dataset::SHARDS_PER_SLOT,
    )
    .unwrap();
    let queue = retry!(Queue::connect(&url, &opts).await);
    let (meta, _) = retry!(queue.init(&meta).await);
    let cfg = WorkerConfig {
        node: a.node.clone(),
        lease_ttl: Duration::from_secs(a.lease),
        depth: 2,
        last_epoch: Some(a.epochs - 1),
    };
    let mut w =
        retry!(Worker::join(queue.clone(), meta.clone(), samples.clone(), cfg.clone()).await);
    r.end_torn_line();
    r.line(format_args!("start {} {}", a.node, w.holder().inc));
    r.sync();
    r.started = Instant::now();
    // Time spent in claims that gave work and in marking it done: what etcd costs a node
    // while there is work (polls while waiting for the last shards of others cost nothing).
    let mut busy = Duration::ZERO;
    loop {
        let asked = Instant::now();
        match w.claim(a.slot).await {
            Ok(Claim::Batch(b)) => {
                busy += asked.elapsed();
                // Reads block this thread; the lease keep-alive and the watch go on elsewhere.
                tokio::task::block_in_place(|| {
                    let mut at = 0usize;
                    for (&k, &len) in b.shards.iter().zip(&b.lengths) {
                        for &id in &b.samples[at..at + len as usize] {
                            r.read(&cat, b.epoch, k, id);
                        }
                        at += len as usize;
                    }
                    // Every read is durable before the shard can be DONE.
                    r.sync();
                });
                let t = Instant::now();
                let rep = retry!(w.done(&b).await);
                busy += t.elapsed();
                for k in &rep.done {
                    r.line(format_args!(
                        "done {} {k} {} {}",
                        b.epoch, b.holder.node, b.holder.inc
                    ));
                }
                for k in &rep.lost {
                    r.line(format_args!("lost {} {k}", b.epoch));
                }
                r.sync();
            }
            Ok(Claim::Wait) => w.wait(Duration::from_millis(500)).await,
            Ok(Claim::Finished) => break,
            Err(e) => {
                eprintln!("dds_reader: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    let secs = r.started.elapsed().as_secs_f64();
    let (trips, etcd) = w.etcd_time();
    println!(
        "{{\"node\":\"{}\",\"samples\":{},\"bytes\":{},\"secs\":{secs},\"etcd_round_trips\":{trips},\"etcd_secs\":{},\"etcd_busy_secs\":{}}}",
        a.node,
        r.samples,
        r.bytes,
        etcd.as_secs_f64(),
        busy.as_secs_f64()
    );
    let _ = w.leave().await;
}
