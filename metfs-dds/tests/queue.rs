//! The dynamic-sharding queue against a real etcd (Debian's `etcd-server`), started by each
//! test on free ports in a temporary directory and killed at the end: claims are exclusive
//! under concurrency, a dead worker's shards come back within its lease TTL and a second, the
//! queue survives `kill -9` of etcd, a job resumed on another worker count completes the
//! epoch with every sample exactly once among DONE shards, a queue of another dataset is
//! refused, and an unreachable etcd gives a clear error.

use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metfs_dds::{
    Batch, Claim, DdsError, DdsUrl, EtcdOptions, OwnedSamples, Queue, QueueMeta, Worker,
    WorkerConfig,
};
use metfs_plan::planner::{epoch_order, ShardSpec, Strategy};

/// A real etcd on free ports with its data in a temporary directory.
struct Etcd {
    dir: tempfile::TempDir,
    client: u16,
    peer: u16,
    child: Option<Child>,
}

/// Two distinct loopback ports that were free just now. Both listeners stay bound until both
/// ports are chosen: a port let go of at once can be handed out again by the next bind, and a
/// server given one port twice fails to start.
fn free_ports() -> (u16, u16) {
    let a = TcpListener::bind("127.0.0.1:0").unwrap();
    let b = TcpListener::bind("127.0.0.1:0").unwrap();
    (
        a.local_addr().unwrap().port(),
        b.local_addr().unwrap().port(),
    )
}

fn free_port() -> u16 {
    free_ports().0
}

/// The body of etcd's `GET /health` on `port` (HTTP/1.0, so the server closes the connection
/// after the answer and the whole reply is what the socket yields).
fn health(port: u16) -> std::io::Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)?;
    Ok(reply
        .split_once("\r\n\r\n")
        .map_or(reply.clone(), |(_, b)| b.to_string()))
}

impl Etcd {
    /// Starts etcd, or returns `None` (after saying so on stderr) when it is not installed and
    /// `METFS_REQUIRE_SERVERS` is unset: a contributor's plain `cargo test` passes and names the
    /// tests it did not run; `scripts/test.sh` sets the variable, so they are never skipped there.
    fn start(test: &str) -> Option<Self> {
        let have = Command::new("etcd")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        let required = std::env::var_os("METFS_REQUIRE_SERVERS").is_some_and(|v| v != "0");
        let why =
            "etcd is not installed (Debian's etcd-server; scripts/install-deps.sh installs it)";
        if !have {
            assert!(!required, "{why} (METFS_REQUIRE_SERVERS is set)");
            // Straight to the process's stderr: the harness captures eprintln! of a passing test.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "not run: dds::{test}: {why}; set METFS_REQUIRE_SERVERS=1 to make this a failure"
            );
            return None;
        }
        let (client, peer) = free_ports();
        let mut e = Etcd {
            dir: tempfile::tempdir().unwrap(),
            client,
            peer,
            child: None,
        };
        e.run();
        Some(e)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Starts etcd on its data directory and waits until it answers.
    fn run(&mut self) {
        let (c, p) = (
            format!("http://127.0.0.1:{}", self.client),
            format!("http://127.0.0.1:{}", self.peer),
        );
        let log = std::fs::File::create(self.dir.path().join("etcd.log")).unwrap();
        let child = Command::new("etcd")
            .args(["--name", "t", "--data-dir"])
            .arg(self.data())
            .args(["--listen-client-urls", &c, "--advertise-client-urls", &c])
            .args([
                "--listen-peer-urls",
                &p,
                "--initial-advertise-peer-urls",
                &p,
            ])
            .args(["--initial-cluster", &format!("t={p}")])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd (Debian's etcd-server; scripts/install-deps.sh installs it)");
        self.child = Some(child);
        self.wait_healthy(Duration::from_secs(60));
    }

    /// Waits for etcd's own health answer (`GET /health` with `"health":"true"`, given once it
    /// has a leader and has served a read), not for an open port: etcd accepts TCP before it
    /// serves, and a client connecting then fails on a busy machine. Panics naming etcd, with
    /// its log, when the process exits or the answer does not come.
    fn wait_healthy(&mut self, limit: Duration) {
        let log = self.dir.path().join("etcd.log");
        let t = Instant::now();
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "etcd on 127.0.0.1:{} exited ({status}) before it was healthy; its log:\n{}",
                    self.client,
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            let last = match health(self.client) {
                Ok(body) if body.contains(r#""health":"true""#) => return,
                Ok(body) => body,
                Err(e) => e.to_string(),
            };
            assert!(
                t.elapsed() < limit,
                "etcd on 127.0.0.1:{} not healthy after {limit:?} (last: {last}); its log:\n{}",
                self.client,
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `kill -9`.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn url(&self, prefix: &str) -> DdsUrl {
        DdsUrl::parse(&format!("etcd://127.0.0.1:{}/{prefix}", self.client)).unwrap()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

fn opts() -> EtcdOptions {
    // Generous: seven etcds fsync at once on a loaded test machine.
    EtcdOptions {
        timeout: Duration::from_secs(10),
        ..Default::default()
    }
}

/// `n` samples of 1..=200 bytes in 4 classes.
fn samples(n: usize) -> Arc<OwnedSamples> {
    Arc::new(OwnedSamples {
        sizes: (0..n).map(|i| 1 + (i as u64 * 7919) % 200).collect(),
        labels: Some((0..n).map(|i| (i % 4) as u32).collect()),
        clusters: None,
    })
}

fn meta(s: &OwnedSamples, shards: u32, seed: u64) -> QueueMeta {
    QueueMeta {
        version: metfs_dds::keys::LAYOUT_VERSION,
        fingerprint: format!("test-{}", s.sizes.len()),
        seed,
        strategy: Strategy::Stratified,
        shards,
        shard_bytes: 1 << 20,
        samples: s.sizes.len() as u64,
        stripes: 1,
        sample_settings: None,
    }
}

async fn queue(etcd: &Etcd, prefix: &str, m: &QueueMeta) -> (Queue, QueueMeta) {
    let q = Queue::connect(&etcd.url(prefix), &opts()).await.unwrap();
    let (m, _) = q.init(m).await.unwrap();
    (q, m)
}

fn cfg(node: &str, ttl: u64, last_epoch: u64) -> WorkerConfig {
    WorkerConfig {
        node: node.into(),
        lease_ttl: Duration::from_secs(ttl),
        depth: 2,
        last_epoch: Some(last_epoch),
    }
}

/// Claims and finishes batches until the queue has nothing left up to the last epoch;
/// returns the batches marked done.
async fn work(mut w: Worker, max_bytes: u64, stop_after: Option<usize>) -> (Vec<Batch>, Worker) {
    let mut done = Vec::new();
    loop {
        if stop_after.is_some_and(|n| done.len() >= n) {
            return (done, w);
        }
        match w.claim(max_bytes).await.unwrap() {
            Claim::Batch(b) => {
                tokio::task::yield_now().await;
                let r = w.done(&b).await.unwrap();
                assert!(r.lost.is_empty(), "{r:?}");
                done.push(b);
            }
            Claim::Wait => w.wait(Duration::from_millis(500)).await,
            Claim::Finished => return (done, w),
        }
    }
}

/// DONE records of `epoch`, read from etcd: shard → node.
async fn done_shards(q: &Queue, epoch: u64) -> BTreeMap<u32, String> {
    let prefix = format!("{}/done/{epoch:010}/", q.url().prefix);
    let mut c = etcd_client::Client::connect(
        q.url()
            .endpoints
            .iter()
            .map(|e| format!("http://{e}"))
            .collect::<Vec<_>>(),
        None,
    )
    .await
    .unwrap();
    let r = c
        .get(
            prefix.clone(),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    r.kvs()
        .iter()
        .map(|kv| {
            let k: u32 = kv.key_str().unwrap()[prefix.len()..].parse().unwrap();
            let h: metfs_dds::Holder = serde_json::from_slice(kv.value()).unwrap();
            (k, h.node)
        })
        .collect()
}

/// Every sample of the epoch exactly once among the DONE shards.
fn assert_exactly_once(s: &OwnedSamples, m: &QueueMeta, epoch: u64, done: &BTreeMap<u32, String>) {
    let spec = ShardSpec {
        strategy: m.strategy,
        seed: m.seed,
        shards: m.shards,
        shard_bytes: m.shard_bytes,
    };
    let o = epoch_order(&s.set(), &spec, epoch).unwrap();
    assert_eq!(
        done.len() as u32,
        m.shards,
        "every shard DONE in epoch {epoch}"
    );
    let mut seen = vec![0u32; s.sizes.len()];
    for &k in done.keys() {
        for &id in o.samples(k) {
            seen[id as usize] += 1;
        }
    }
    assert!(
        seen.iter().all(|&c| c == 1),
        "a sample not seen exactly once in epoch {epoch}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_are_exclusive_under_concurrency() {
    let Some(etcd) = Etcd::start("claims_are_exclusive_under_concurrency") else {
        return;
    };
    exclusive_under_concurrency(&etcd, "excl", 1, 4).await;
}

/// With the never-claimed shards dealt into stripes, each with its own cursor, nodes that
/// claim from different stripes never race, and still: every shard once, every epoch done, and
/// each node's fresh shards of one stripe in the stripe's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_of_a_striped_queue_are_exclusive_under_concurrency() {
    let Some(etcd) = Etcd::start("claims_of_a_striped_queue_are_exclusive_under_concurrency")
    else {
        return;
    };
    // More stripes than a node reads at first: windows, and the wider read once one is used up.
    exclusive_under_concurrency(&etcd, "striped", 20, 8).await;
}

/// `workers` nodes drain two epochs of an 80-shard queue of `stripes` stripes concurrently.
async fn exclusive_under_concurrency(etcd: &Etcd, prefix: &str, stripes: u32, workers: usize) {
    let s = samples(2_000);
    let (q, m) = queue(
        etcd,
        prefix,
        &QueueMeta {
            stripes,
            ..meta(&s, 80, 1)
        },
    )
    .await;
    assert_eq!(m.stripes, stripes);
    // Every worker joins before any claims, so that all of them race from the first claim.
    let mut joined = Vec::new();
    for i in 0..workers {
        let w = Worker::join(q.clone(), m.clone(), s.clone(), cfg(&format!("n{i}"), 5, 1))
            .await
            .unwrap();
        joined.push(w);
    }
    // A slot holds about 3 shards.
    let tasks: Vec<_> = joined
        .into_iter()
        .map(|w| tokio::spawn(work(w, 3 * 2_600, None)))
        .collect();
    let mut claimed: BTreeMap<(u64, u32), usize> = BTreeMap::new();
    for (i, t) in tasks.into_iter().enumerate() {
        let (batches, _w) = t.await.unwrap();
        assert!(!batches.is_empty(), "worker {i} got no work");
        // A node's successive claims from one stripe follow the stripe's order.
        let mut last: BTreeMap<(u64, u32), u32> = BTreeMap::new();
        for b in &batches {
            for &k in &b.shards {
                let key = (b.epoch, k % stripes);
                if let Some(&l) = last.get(&key) {
                    assert!(l < k, "{l} then {k} in {key:?}");
                }
                last.insert(key, k);
            }
        }
        for b in batches {
            assert!(b.bytes <= 3 * 2_600);
            for k in b.shards {
                *claimed.entry((b.epoch, k)).or_default() += 1;
            }
        }
    }
    assert!(claimed.values().all(|&c| c == 1), "a shard claimed twice");
    assert_eq!(claimed.len(), 160, "two epochs of 80 shards");
    for e in 0..2 {
        assert_exactly_once(&s, &m, e, &done_shards(&q, e).await);
    }
    let st = q.status().await.unwrap();
    assert_eq!(st.epochs.len(), 2);
    assert!(st
        .epochs
        .iter()
        .all(|e| e.done == 80 && e.todo == 0 && e.doing == 0));
    let total: f64 = st.nodes.iter().map(|n| n.share).sum();
    assert!((total - 1.0).abs() < 1e-9, "{st:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_takes_what_fits_and_only_after_the_previous_batches() {
    let Some(etcd) = Etcd::start("a_claim_takes_what_fits_and_only_after_the_previous_batches")
    else {
        return;
    };
    let s = samples(400);
    let (q, m) = queue(&etcd, "fit", &meta(&s, 20, 2)).await;
    let mut w = Worker::join(q.clone(), m.clone(), s.clone(), cfg("a", 5, 0))
        .await
        .unwrap();
    let o = w.order(0).unwrap();
    let max = o.bytes[0] + o.bytes[1] + o.bytes[2] / 2;
    let Claim::Batch(b1) = w.claim(max).await.unwrap() else {
        panic!("no batch")
    };
    assert_eq!(
        b1.shards,
        [0, 1],
        "as many shards as fit the slot, in queue order"
    );
    let Claim::Batch(b2) = w.claim(max).await.unwrap() else {
        panic!("no batch")
    };
    // Two batches held (the view served and the slot staged): no third before one is done.
    let e = w.claim(max).await.unwrap_err();
    assert!(matches!(e, DdsError::StillHolding { held: 2, .. }), "{e}");
    w.done(&b1).await.unwrap();
    assert!(matches!(w.claim(max).await.unwrap(), Claim::Batch(_)));
    // A slot smaller than the next shard is a clear error, not an endless wait.
    w.done(&b2).await.unwrap();
    let e = w.claim(1).await.unwrap_err();
    assert!(matches!(e, DdsError::ShardTooLarge { epoch: 0, .. }), "{e}");
}

/// A worker that keeps the head of the queue from its last claim claims in one round trip
/// (a transaction whose `else` branch reads the head again); its first claim reads first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_on_the_head_the_worker_kept_is_one_round_trip() {
    let Some(etcd) = Etcd::start("a_claim_on_the_head_the_worker_kept_is_one_round_trip") else {
        return;
    };
    let s = samples(400);
    let (q, m) = queue(&etcd, "kept", &meta(&s, 20, 2)).await;
    let mut w = Worker::join(q.clone(), m.clone(), s.clone(), cfg("a", 5, 0))
        .await
        .unwrap();
    let max = *w.order(0).unwrap().bytes.iter().max().unwrap();
    let mut trips = Vec::new();
    for _ in 0..4 {
        let before = w.etcd_time().0;
        let Claim::Batch(b) = w.claim(max).await.unwrap() else {
            panic!("no batch")
        };
        trips.push(w.etcd_time().0 - before);
        w.done(&b).await.unwrap();
    }
    assert_eq!(trips, [2, 1, 1, 1], "round trips of each claim");
    // A second worker moves the cursor on: the first one's kept head is stale, its claim fails
    // and gets the head in the same answer, and it still takes the next shards, once each.
    let mut other = Worker::join(q.clone(), m.clone(), s.clone(), cfg("b", 5, 0))
        .await
        .unwrap();
    let Claim::Batch(ob) = other.claim(max).await.unwrap() else {
        panic!("no batch")
    };
    let before = w.etcd_time().0;
    let Claim::Batch(b) = w.claim(max).await.unwrap() else {
        panic!("no batch")
    };
    assert_eq!(
        w.etcd_time().0 - before,
        2,
        "a lost race and the claim after it"
    );
    assert_ne!(b.shards, ob.shards);
    w.done(&b).await.unwrap();
    other.done(&ob).await.unwrap();
}

/// A shard given back while a worker claims on a head it kept (an older epoch's, which comes
/// first) is claimed next: the queue's watch marks the kept head stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_given_back_is_claimed_before_the_kept_heads_fresh_shards() {
    let Some(etcd) =
        Etcd::start("a_shard_given_back_is_claimed_before_the_kept_heads_fresh_shards")
    else {
        return;
    };
    let s = samples(400);
    let (q, m) = queue(&etcd, "stale", &meta(&s, 8, 2)).await;
    let mut leaving = Worker::join(q.clone(), m.clone(), s.clone(), cfg("leaving", 5, 1))
        .await
        .unwrap();
    let mut live = Worker::join(q.clone(), m.clone(), s.clone(), cfg("live", 5, 1))
        .await
        .unwrap();
    let max = 100_000;
    let Claim::Batch(held) = leaving
        .claim(live.order(0).unwrap().bytes[0])
        .await
        .unwrap()
    else {
        panic!("no batch")
    };
    assert_eq!(held.epoch, 0);
    // The live worker drains epoch 0's fresh shards and claims from epoch 1, keeping its head.
    let mut epochs = Vec::new();
    while epochs.last() != Some(&1) {
        let Claim::Batch(b) = live.claim(max).await.unwrap() else {
            panic!("no batch")
        };
        epochs.push(b.epoch);
        live.done(&b).await.unwrap();
    }
    // The other node leaves: its epoch-0 shard goes back to TODO.
    leaving.leave().await.unwrap();
    let t = Instant::now();
    let back = loop {
        // The watch's event may come a moment after the put: until then the kept head (of
        // epoch 1) is used, and the claim takes epoch 1's next fresh shards.
        match live.claim(max).await.unwrap() {
            Claim::Batch(b) if b.epoch == 0 => break b,
            Claim::Batch(b) => {
                live.done(&b).await.unwrap();
            }
            Claim::Wait => live.wait(Duration::from_millis(100)).await,
            Claim::Finished => panic!("finished with a shard of epoch 0 given back"),
        };
        assert!(t.elapsed() < Duration::from_secs(5), "never claimed");
    };
    assert_eq!(back.shards, held.shards);
    live.done(&back).await.unwrap();
    work(live, max, None).await;
    for e in 0..2 {
        assert_exactly_once(&s, &m, e, &done_shards(&q, e).await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_workers_shards_come_back_within_the_lease_and_a_second() {
    let Some(etcd) = Etcd::start("a_dead_workers_shards_come_back_within_the_lease_and_a_second")
    else {
        return;
    };
    let s = samples(600);
    let (q, m) = queue(&etcd, "lease", &meta(&s, 30, 3)).await;
    let ttl = 2;
    let mut dead = Worker::join(q.clone(), m.clone(), s.clone(), cfg("dead", ttl, 0))
        .await
        .unwrap();
    let Claim::Batch(lost) = dead.claim(3 * 1_000).await.unwrap() else {
        panic!("no batch")
    };
    let mut live = Worker::join(q.clone(), m.clone(), s.clone(), cfg("live", ttl, 0))
        .await
        .unwrap();
    // Drain the fresh shards so that the next claim can only be the dead worker's.
    while let Claim::Batch(b) = live.claim(100_000).await.unwrap() {
        live.done(&b).await.unwrap();
    }
    // The node dies: its keep-alive stops, nothing is revoked.
    drop(dead);
    let died = Instant::now();
    let back = loop {
        match live.claim(100_000).await.unwrap() {
            Claim::Batch(b) => break b,
            Claim::Wait => live.wait(Duration::from_millis(200)).await,
            Claim::Finished => panic!("finished while shards were DOING"),
        }
        assert!(
            died.elapsed() < Duration::from_secs(ttl + 5),
            "never given back"
        );
    };
    let took = died.elapsed();
    assert!(
        took <= Duration::from_secs(ttl + 1),
        "given back after {took:?}, lease {ttl} s"
    );
    let mut a = back.shards.clone();
    a.sort_unstable();
    let mut b = lost.shards.clone();
    b.sort_unstable();
    assert_eq!(a, b, "the dead worker's shards, and only those");
    live.done(&back).await.unwrap();
    assert!(matches!(
        live.claim(100_000).await.unwrap(),
        Claim::Finished
    ));
    let done = done_shards(&q, 0).await;
    assert_exactly_once(&s, &m, 0, &done);
    assert!(done.values().all(|n| n == "live"));
    // The same node name joins again at once, with a new incarnation, after a clean leave.
    let inc = live.holder().inc;
    live.leave().await.unwrap();
    let again = Worker::join(q.clone(), m.clone(), s.clone(), cfg("live", ttl, 0))
        .await
        .unwrap();
    assert_eq!(again.holder().inc, inc + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_that_waits_out_a_longer_previous_lease_registers_under_a_fresh_one() {
    let Some(etcd) =
        Etcd::start("a_join_that_waits_out_a_longer_previous_lease_registers_under_a_fresh_one")
    else {
        return;
    };
    let s = samples(60);
    let (q, m) = queue(&etcd, "regrant", &meta(&s, 6, 0)).await;
    // A previous incarnation dies with 5 s left on its lease; the new one's lease is 2 s, so
    // it expires while the join waits (a busy node's slow etcd gave the same, with the
    // fault trial's `etcdserver: requested lease not found` at mount).
    let old = Worker::join(q.clone(), m.clone(), s.clone(), cfg("n", 5, 0))
        .await
        .unwrap();
    let inc = old.holder().inc;
    drop(old);
    let t = Instant::now();
    let again = Worker::join(q.clone(), m.clone(), s.clone(), cfg("n", 2, 0))
        .await
        .unwrap();
    assert!(t.elapsed() >= Duration::from_secs(3), "{:?}", t.elapsed());
    assert_eq!(again.holder().inc, inc + 1);
    // Registered under a live lease: its claims work.
    let (done, _) = work(again, 100_000, None).await;
    assert!(!done.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_survives_etcd_killed_and_restarted_on_its_data_dir() {
    let Some(mut etcd) =
        Etcd::start("the_queue_survives_etcd_killed_and_restarted_on_its_data_dir")
    else {
        return;
    };
    let s = samples(500);
    let (q, m) = queue(&etcd, "restart", &meta(&s, 25, 4)).await;
    let w = Worker::join(q.clone(), m.clone(), s.clone(), cfg("a", 10, 0))
        .await
        .unwrap();
    let (first, mut w) = work(w, 2 * 1_400, Some(3)).await;
    let Claim::Batch(held) = w.claim(2 * 1_400).await.unwrap() else {
        panic!("no batch")
    };
    let before = q.status().await.unwrap();
    etcd.kill();
    // While etcd is down, a claim fails with an error naming etcd, and the worker says so.
    let e = w.done(&held).await.unwrap_err();
    assert!(e.to_string().contains("etcd"), "{e}");
    assert!(w.last_error().is_some());
    etcd.run();
    // The held claim survived (leases are kept across an etcd restart) and completes.
    let t = Instant::now();
    let r = loop {
        match w.done(&held).await {
            Ok(r) => break r,
            Err(_) if t.elapsed() < Duration::from_secs(15) => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert!(r.lost.is_empty(), "{r:?}");
    assert!(w.last_error().is_none());
    let q2 = Queue::connect(&etcd.url("restart"), &opts()).await.unwrap();
    let after = q2.status().await.unwrap();
    assert_eq!(after.meta, before.meta);
    assert_eq!(
        after.epochs[0].done,
        before.epochs[0].done + held.shards.len() as u64
    );
    let (rest, _w) = work(w, 2 * 1_400, None).await;
    let n: usize = first
        .iter()
        .chain(&rest)
        .map(|b| b.shards.len())
        .sum::<usize>()
        + held.shards.len();
    assert_eq!(n, 25);
    assert_exactly_once(&s, &m, 0, &done_shards(&q2, 0).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_resumed_on_fewer_workers_completes_the_epoch_exactly_once() {
    let Some(etcd) = Etcd::start("a_job_resumed_on_fewer_workers_completes_the_epoch_exactly_once")
    else {
        return;
    };
    resumed_on_fewer_workers(&etcd, false).await;
}

/// The same, the new nodes joining after every dead node's lease ran out: nobody was watching
/// when their shards' claims vanished, so the first node to join finds them (its sweep).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_resumed_after_every_node_died_completes_the_epoch_exactly_once() {
    let Some(etcd) =
        Etcd::start("a_job_resumed_after_every_node_died_completes_the_epoch_exactly_once")
    else {
        return;
    };
    resumed_on_fewer_workers(&etcd, true).await;
}

/// Three nodes work on an epoch and die holding a batch each; two other nodes (after the dead
/// nodes' leases ran out if `late`) finish it.
async fn resumed_on_fewer_workers(etcd: &Etcd, late: bool) {
    let s = samples(1_200);
    let (q, m) = queue(etcd, "resume", &meta(&s, 60, 5)).await;
    // Three nodes for about half the epoch; each dies holding one more batch.
    let mut first = BTreeSet::new();
    for i in 0..3 {
        let w = Worker::join(q.clone(), m.clone(), s.clone(), cfg(&format!("a{i}"), 2, 0))
            .await
            .unwrap();
        let (done, mut w) = work(w, 2 * 2_200, Some(5)).await;
        first.extend(done.iter().flat_map(|b| b.shards.clone()));
        assert!(matches!(w.claim(2 * 2_200).await.unwrap(), Claim::Batch(_)));
        drop(w);
    }
    let st = q.status().await.unwrap();
    assert!(st.epochs[0].done > 0 && st.epochs[0].done < 60, "{st:?}");
    if late {
        // The leases (2 s) and etcd's check of them (every 500 ms) run out.
        let t0 = Instant::now();
        while !q
            .status()
            .await
            .unwrap()
            .nodes
            .iter()
            .all(|n| n.live.is_none())
        {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the leases never ran out"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // Two other nodes finish the epoch: the dead nodes' DOING shards come back, nothing DONE
    // is repeated and nothing TODO is skipped.
    let mut tasks = Vec::new();
    for i in 0..2 {
        let w = Worker::join(q.clone(), m.clone(), s.clone(), cfg(&format!("b{i}"), 2, 0))
            .await
            .unwrap();
        tasks.push(tokio::spawn(work(w, 2 * 2_200, None)));
    }
    let mut second = BTreeSet::new();
    for t in tasks {
        let (done, _w) = t.await.unwrap();
        for b in done {
            for k in b.shards {
                assert!(second.insert(k), "shard {k} done twice");
                assert!(!first.contains(&k), "shard {k} was DONE before the resume");
            }
        }
    }
    assert_eq!(first.len() + second.len(), 60);
    let done = done_shards(&q, 0).await;
    assert_exactly_once(&s, &m, 0, &done);
    let st = q.status().await.unwrap();
    assert_eq!(st.epochs[0].doing, 0);
    assert_eq!(st.nodes.len(), 5, "{st:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_of_another_dataset_or_seed_is_refused_naming_both() {
    let Some(etcd) = Etcd::start("a_queue_of_another_dataset_or_seed_is_refused_naming_both")
    else {
        return;
    };
    let s = samples(100);
    let (q, _) = queue(&etcd, "mine", &meta(&s, 10, 6)).await;
    let e = q.init(&meta(&s, 10, 7)).await.unwrap_err().to_string();
    assert!(e.contains("seed 6") && e.contains("seed 7"), "{e}");
    let other = samples(101);
    let e = q.init(&meta(&other, 10, 6)).await.unwrap_err().to_string();
    assert!(e.contains("test-100") && e.contains("test-101"), "{e}");
    assert!(e.contains("etcd://127.0.0.1"), "{e}");
    // A queue made by a metfs of another key layout (one cursor per epoch, layout 1) too.
    let (q1, _) = queue(
        &etcd,
        "old-layout",
        &QueueMeta {
            version: 1,
            ..meta(&s, 10, 6)
        },
    )
    .await;
    let e = q1.init(&meta(&s, 10, 6)).await.unwrap_err().to_string();
    let now = metfs_dds::keys::LAYOUT_VERSION;
    assert!(
        e.contains("queue layout 1") && e.contains(&format!("queue layout {now}")),
        "{e}"
    );
    // The same dataset and seed join the existing queue, whose shard count wins.
    let (m, made) = q.init(&meta(&s, 20, 6)).await.unwrap();
    assert!(!made);
    assert_eq!(m.shards, 10);
    // Reset refuses while a worker is live, then deletes everything.
    let w = Worker::join(q.clone(), m.clone(), s.clone(), cfg("x", 5, 0))
        .await
        .unwrap();
    let e = q.reset(false).await.unwrap_err().to_string();
    assert!(e.contains("live workers (x)"), "{e}");
    w.leave().await.unwrap();
    assert!(q.reset(false).await.unwrap() > 0);
    assert!(q.meta().await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_etcd_is_a_clear_error() {
    let port = free_port();
    let url = DdsUrl::parse(&format!("etcd://127.0.0.1:{port}/q")).unwrap();
    let t = Instant::now();
    let e = Queue::connect(
        &url,
        &EtcdOptions {
            timeout: Duration::from_secs(1),
            ..Default::default()
        },
    )
    .await
    .err()
    .expect("nothing listens there");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("etcd at etcd://127.0.0.1:{port}/q is unreachable")),
        "{msg}"
    );
    // A missing TLS file is named.
    let e = Queue::connect(
        &url,
        &EtcdOptions {
            cacert: Some(Path::new("/nonexistent/ca.pem").into()),
            ..Default::default()
        },
    )
    .await
    .err()
    .unwrap()
    .to_string();
    assert!(e.contains("/nonexistent/ca.pem"), "{e}");
}
