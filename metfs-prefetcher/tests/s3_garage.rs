//! The S3 tier against a real S3 server: Garage, started on loopback by each test with
//! `scripts/garage.sh` (install it once with `scripts/garage.sh install`), with credentials that
//! the server checks. A fault-injecting proxy (`tests/faultproxy.py`) sits between the tier and
//! Garage where the test says so.
//!
//! Every test owns its server (own directory, own ports), so tests run in parallel and a test
//! may kill and restart its server.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use metfs_tier::catalog::Catalog;
use metfs_tier::pacer::Pacer;
use metfs_tier::s3::{S3Config, S3RetryConfig, S3Tier, Secret};
use metfs_tier::{CapacityTier, SampleRef, TierError};
use object_store::path::Path as ObjPath;
use object_store::{ObjectStoreExt, PutPayload};
use rand::{RngCore, SeedableRng};

const BUCKET: &str = "metfs";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
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

/// Deterministic pseudo-random bytes.
fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rand_chacha::ChaCha8Rng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// A Garage server owned by one test; stopped on drop.
struct Garage {
    dir: tempfile::TempDir,
    port: u16,
    rpc_port: u16,
    key: String,
    secret: String,
}

impl Garage {
    /// Starts a server, or returns `None` (after saying so on stderr) when Garage is not
    /// installed and `METFS_REQUIRE_SERVERS` is unset: a contributor's plain `cargo test` passes
    /// and names the S3 tests it did not run, while `scripts/test.sh` sets the variable, so that
    /// the test command can never skip them silently.
    fn start(test: &str) -> Option<Self> {
        let have = Command::new("sh")
            .args([
                "-c",
                "command -v garage >/dev/null || test -x \"$HOME/.cargo/bin/garage\"",
            ])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        let required = std::env::var_os("METFS_REQUIRE_SERVERS").is_some_and(|v| v != "0");
        let why = "Garage is not installed: run `scripts/garage.sh install` once on this machine \
             (cargo install garage --version 2.5.0 --locked, about 16 minutes on 2 cores)";
        if !have {
            assert!(!required, "{why} (METFS_REQUIRE_SERVERS is set)");
            // Straight to the process's stderr: the harness captures eprintln! of a passing test.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "not run: s3_garage::{test}: {why}; set METFS_REQUIRE_SERVERS=1 to make this a failure"
            );
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let (port, rpc_port) = free_ports();
        let mut g = Self {
            dir,
            port,
            rpc_port,
            key: String::new(),
            secret: String::new(),
        };
        // A port that was free when `free_ports` let go of it can be taken again before Garage
        // binds it (by another test's server or by an outgoing connection's source port):
        // Garage then exits, or serves RPC without S3, which garage.sh reports at once. That is
        // the ports' luck, not the server's health, so a start that fails is tried again on
        // fresh ports, and the failure is still shown.
        let mut tries = 1;
        while let Err(why) = g.try_start() {
            assert!(
                tries < 3,
                "garage.sh start failed {tries} times; last: {why}"
            );
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "s3_garage::{test}: start on ports {}/{} failed, trying fresh ones: {why}",
                g.port,
                g.rpc_port
            );
            // A fresh directory too: a server that timed out may not have let go of its own.
            g.dir = tempfile::tempdir().unwrap();
            (g.port, g.rpc_port) = free_ports();
            tries += 1;
        }
        let creds = std::fs::read_to_string(g.dir.path().join("credentials")).unwrap();
        let field = |name: &str| {
            creds
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name}=")))
                .unwrap()
                .to_string()
        };
        g.key = field("GARAGE_DEFAULT_ACCESS_KEY");
        g.secret = field("GARAGE_DEFAULT_SECRET_KEY");
        Some(g)
    }

    fn script(&self, args: &[&str]) -> std::process::Output {
        Command::new("bash")
            .arg(repo().join("scripts/garage.sh"))
            .args(args)
            .output()
            .expect("running scripts/garage.sh")
    }

    fn try_start(&self) -> Result<(), String> {
        let out = self.script(&[
            "start",
            self.dir.path().to_str().unwrap(),
            &self.port.to_string(),
            &self.rpc_port.to_string(),
        ]);
        if out.status.success() {
            return Ok(());
        }
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }

    /// Starts the server again on the same ports (the test's tier already points at them).
    fn run_start(&self) {
        if let Err(why) = self.try_start() {
            panic!("garage.sh start failed: {why}");
        }
    }

    /// Kills the server with SIGKILL, as a crash would.
    fn kill(&self) {
        let pid: i32 = std::fs::read_to_string(self.dir.path().join("garage.pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // SAFETY: plain kill(2) on the pid this test's server runs under.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
        // Gone, or a zombie waiting for a parent that is not this test.
        let alive = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| {
                    !s.rsplit(')')
                        .next()
                        .unwrap_or("")
                        .trim_start()
                        .starts_with('Z')
                })
                .unwrap_or(false)
        };
        let t = Instant::now();
        while alive() && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Tier settings for this server (or for a proxy in front of it at `endpoint`).
    fn config_via(&self, endpoint: &str) -> S3Config {
        S3Config {
            endpoint: Some(endpoint.to_string()),
            region: Some("garage".into()),
            allow_http: Some(true),
            access_key_id: Some(self.key.clone()),
            secret_access_key: Some(Secret::new(self.secret.clone())),
            ..Default::default()
        }
    }

    fn config(&self) -> S3Config {
        self.config_via(&self.endpoint())
    }

    fn tier(&self, prefix: &str) -> S3Tier {
        S3Tier::new(&format!("s3://{BUCKET}/{prefix}"), self.config()).unwrap()
    }
}

impl Drop for Garage {
    fn drop(&mut self) {
        let _ = self.script(&["stop", self.dir.path().to_str().unwrap()]);
    }
}

/// Uploads `objects` (full keys) with object_store.
async fn upload(tier: &S3Tier, objects: &[(String, Vec<u8>)]) {
    let store = tier.store();
    futures::stream::iter(objects)
        .for_each_concurrent(16, |(key, bytes)| {
            let store = store.clone();
            async move {
                store
                    .put(
                        &ObjPath::parse(key).unwrap(),
                        PutPayload::from(bytes.clone()),
                    )
                    .await
                    .unwrap_or_else(|e| panic!("uploading {key}: {e}"));
            }
        })
        .await;
}

/// Uploads keys that object_store cannot express (`..`, `//`, trailing `/`) with botocore
/// (installed with awscli).
fn upload_raw_keys(g: &Garage, keys: &[&str]) {
    let script = r#"
import sys, botocore.session, botocore.config
ep, key, secret, bucket = sys.argv[1:5]
c = botocore.session.get_session().create_client('s3', endpoint_url=ep, region_name='garage',
    aws_access_key_id=key, aws_secret_access_key=secret,
    config=botocore.config.Config(s3={'addressing_style': 'path'}))
for k in sys.argv[5:]:
    c.put_object(Bucket=bucket, Key=k, Body=b'raw')
"#;
    let out = Command::new("python3")
        .args(["-c", script, &g.endpoint(), &g.key, &g.secret, BUCKET])
        .args(keys)
        .output()
        .expect("python3 with botocore (pip install awscli)");
    assert!(
        out.status.success(),
        "raw upload failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn sample(e: &metfs_tier::catalog::CatalogEntry) -> SampleRef {
    SampleRef {
        path: e.path.clone(),
        size: e.size,
        version: e.version.clone(),
        durable: true,
    }
}

/// Fetches `s` into a new file under `dir` and returns the bytes written to it.
async fn fetch_bytes(
    tier: &S3Tier,
    s: &SampleRef,
    dir: &Path,
    pacer: &Pacer,
) -> Result<Vec<u8>, TierError> {
    let path = dir.join(s.path.replace('/', "_"));
    let f = Arc::new(std::fs::File::create(&path).unwrap());
    let n = tier.fetch(s, f, pacer).await?;
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(n as usize, bytes.len(), "{}: reported size", s.path);
    Ok(bytes)
}

fn tree() -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = vec![
        ("ds/cats/1.jpg".into(), data(1, 131_072)),
        ("ds/cats/2.jpg".into(), data(2, 1_000)),
        ("ds/dogs/deep/3.jpg".into(), data(3, 77_777)),
        ("ds/empty".into(), Vec::new()),
        ("ds/a b+c é.txt".into(), data(4, 12)),
        ("ds2/not-mine".into(), data(5, 10)),
        ("other/x".into(), data(6, 10)),
    ];
    for i in 0..40 {
        v.push((format!("ds/many/{i:03}"), data(100 + i, 4096 + i as usize)));
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_fetches_and_verifies_a_tree() {
    let Some(g) = Garage::start("lists_fetches_and_verifies_a_tree") else {
        return;
    };
    let tier = g.tier("ds");
    let objects = tree();
    upload(&tier, &objects).await;

    let listing = tier.list().await.unwrap();
    assert!(listing.skipped.is_empty(), "{:?}", listing.skipped);
    let mine: Vec<_> = objects
        .iter()
        .filter(|(k, _)| k.starts_with("ds/"))
        .collect();
    assert_eq!(listing.entries.len(), mine.len());
    for e in &listing.entries {
        assert!(
            e.version.starts_with('"'),
            "ETag as the server sends it: {}",
            e.version
        );
    }
    let cat = Catalog::from_entries(tier.url(), listing.entries.clone()).unwrap();
    assert!(tier.catalog_is_current(&cat).await.unwrap());

    let dir = tempfile::tempdir().unwrap();
    let pacer = Pacer::unlimited();
    for (key, bytes) in mine {
        let rel = key.strip_prefix("ds/").unwrap();
        let e = listing.entries.iter().find(|e| e.path == rel).unwrap();
        assert_eq!(e.size as usize, bytes.len());
        let got = fetch_bytes(&tier, &sample(e), dir.path(), &pacer)
            .await
            .unwrap();
        assert!(got == *bytes, "{key}: bytes differ");
    }

    // A new object, a deleted one and a rewritten one each make the catalog stale.
    upload(&tier, &[("ds/new".into(), data(9, 5))]).await;
    assert!(!tier.catalog_is_current(&cat).await.unwrap());
    tier.store()
        .delete(&ObjPath::parse("ds/new").unwrap())
        .await
        .unwrap();
    assert!(tier.catalog_is_current(&cat).await.unwrap());
    upload(&tier, &[("ds/cats/2.jpg".into(), data(99, 1_000))]).await;
    assert!(!tier.catalog_is_current(&cat).await.unwrap());
    // A catalog made elsewhere (a manifest) is never vouched for.
    let other = Catalog::from_entries("manifest.csv", listing.entries).unwrap();
    assert!(!tier.catalog_is_current(&other).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paginates_and_reads_the_environment() {
    let Some(g) = Garage::start("paginates_and_reads_the_environment") else {
        return;
    };
    // Credentials and endpoint only from AWS_* variables (passed in, not set process-wide).
    let env = vec![
        ("AWS_ENDPOINT_URL".to_string(), g.endpoint()),
        ("AWS_REGION".into(), "garage".into()),
        ("AWS_ALLOW_HTTP".into(), "true".into()),
        ("AWS_ACCESS_KEY_ID".into(), g.key.clone()),
        ("AWS_SECRET_ACCESS_KEY".into(), g.secret.clone()),
    ];
    let tier = S3Tier::with_env(&format!("s3://{BUCKET}/p"), S3Config::default(), env).unwrap();
    // Garage pages at 1000 keys: 2,345 keys need three pages.
    let objects: Vec<(String, Vec<u8>)> = (0..2345)
        .map(|i| (format!("p/d{}/k{i:05}", i % 7), vec![(i % 251) as u8; 3]))
        .collect();
    upload(&tier, &objects).await;
    let l = tier.list().await.unwrap();
    assert_eq!(l.entries.len(), 2345);
    let cat = Catalog::from_entries(tier.url(), l.entries).unwrap();
    assert_eq!(cat.len(), 2345);
    assert!(tier.catalog_is_current(&cat).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_objects_come_in_ranged_parts() {
    let Some(g) = Garage::start("large_objects_come_in_ranged_parts") else {
        return;
    };
    let cfg = S3Config {
        part_size: 1 << 20,
        max_parallel_parts: 4,
        ..g.config()
    };
    let tier = S3Tier::new(&format!("s3://{BUCKET}/big"), cfg).unwrap();
    let big = data(7, (20 << 20) + 123);
    let exact = data(8, 3 << 20);
    upload(
        &tier,
        &[
            ("big/a.bin".into(), big.clone()),
            ("big/b.bin".into(), exact.clone()),
        ],
    )
    .await;
    let l = tier.list().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (name, want) in [("a.bin", &big), ("b.bin", &exact)] {
        let e = l.entries.iter().find(|e| e.path == name).unwrap();
        let got = fetch_bytes(&tier, &sample(e), dir.path(), &Pacer::unlimited())
            .await
            .unwrap();
        assert!(got == *want, "{name}: bytes differ");
        // Paced: 256 KiB pieces, and the cap holds.
        let paced = Pacer::with_rate(Some(64 << 20));
        let t = Instant::now();
        let got = fetch_bytes(&tier, &sample(e), dir.path(), &paced)
            .await
            .unwrap();
        assert!(got == *want, "{name} (paced): bytes differ");
        let floor = (want.len() as f64 / (64 << 20) as f64) - 0.15;
        assert!(
            t.elapsed().as_secs_f64() >= floor,
            "{name}: paced fetch took {:?}, the cap allows no less than {floor:.2} s",
            t.elapsed()
        );
    }
    // Without a catalogued ETag the first part pins the version.
    let e = l.entries.iter().find(|e| e.path == "a.bin").unwrap();
    let unversioned = SampleRef {
        version: String::new(),
        ..sample(e)
    };
    let got = fetch_bytes(&tier, &unversioned, dir.path(), &Pacer::unlimited())
        .await
        .unwrap();
    assert!(got == big);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_and_deleted_objects_are_reported() {
    let Some(g) = Garage::start("changed_and_deleted_objects_are_reported") else {
        return;
    };
    let cfg = S3Config {
        part_size: 1 << 20,
        ..g.config()
    };
    let tier = S3Tier::new(&format!("s3://{BUCKET}/ds"), cfg).unwrap();
    upload(
        &tier,
        &[
            ("ds/small".into(), data(1, 1000)),
            ("ds/large".into(), data(2, 5 << 20)),
            ("ds/gone".into(), data(3, 10)),
            ("ds/resized".into(), data(4, 100)),
        ],
    )
    .await;
    let l = tier.list().await.unwrap();
    let s = |p: &str| sample(l.entries.iter().find(|e| e.path == p).unwrap());
    // Re-uploaded after cataloguing: same size, other bytes, so only the ETag tells.
    upload(
        &tier,
        &[
            ("ds/small".into(), data(11, 1000)),
            ("ds/large".into(), data(12, 5 << 20)),
            ("ds/resized".into(), data(4, 101)),
        ],
    )
    .await;
    tier.store()
        .delete(&ObjPath::parse("ds/gone").unwrap())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = Pacer::unlimited();
    for name in ["small", "large", "resized"] {
        let err = fetch_bytes(&tier, &s(name), dir.path(), &p)
            .await
            .unwrap_err();
        eprintln!("{name}: {err}");
        assert!(matches!(err, TierError::Changed { .. }), "{name}: {err:?}");
        assert!(err.to_string().contains(name), "names the key: {err}");
    }
    // The size check holds even without an ETag to compare.
    let unversioned = SampleRef {
        version: String::new(),
        ..s("resized")
    };
    let err = fetch_bytes(&tier, &unversioned, dir.path(), &p)
        .await
        .unwrap_err();
    assert!(matches!(err, TierError::Changed { .. }), "{err:?}");
    let err = fetch_bytes(&tier, &s("gone"), dir.path(), &p)
        .await
        .unwrap_err();
    assert!(matches!(err, TierError::NotFound { .. }), "{err:?}");
    assert!(err.to_string().contains("gone"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_and_missing_bucket() {
    let Some(g) = Garage::start("wrong_credentials_and_missing_bucket") else {
        return;
    };
    let good = g.tier("ds");
    upload(&good, &[("ds/x".into(), data(1, 100))]).await;
    let l = good.list().await.unwrap();
    let x = sample(&l.entries[0]);
    let dir = tempfile::tempdir().unwrap();

    let wrong_secret = "0123456789abcdef0123456789abcdef-wrong-secret";
    for (key, what, hint) in [
        (g.key.clone(), "wrong secret", "secret key does not match"),
        (
            "GK000000000000000000000000".to_string(),
            "unknown key",
            "not known to the server",
        ),
    ] {
        let cfg = S3Config {
            access_key_id: Some(key),
            secret_access_key: Some(Secret::new(wrong_secret)),
            ..g.config()
        };
        let tier = S3Tier::new(&format!("s3://{BUCKET}/ds"), cfg).unwrap();
        assert!(!format!("{tier:?}").contains(wrong_secret));
        let err = tier.list().await.unwrap_err();
        eprintln!("{what}: {err}");
        assert!(matches!(err, TierError::Auth { .. }), "{what}: {err:?}");
        assert!(err.to_string().contains(hint), "{what}: {err}");
        let text = format!("{err} {err:?}");
        assert!(!text.contains(wrong_secret), "{what}: secret in {text}");
        assert!(!text.contains(&g.secret), "{what}: real secret in {text}");
        let err = fetch_bytes(&tier, &x, dir.path(), &Pacer::unlimited())
            .await
            .unwrap_err();
        assert!(matches!(err, TierError::Auth { .. }), "{what}: {err:?}");
        assert!(!format!("{err} {err:?}").contains(wrong_secret));
    }

    let tier = S3Tier::new("s3://no-such-bucket/ds", g.config()).unwrap();
    let err = tier.list().await.unwrap_err();
    eprintln!("missing bucket: {err}");
    assert!(
        matches!(err, TierError::BadSource { .. }) && err.to_string().contains("no-such-bucket"),
        "{err:?}"
    );
    let err = fetch_bytes(&tier, &x, dir.path(), &Pacer::unlimited())
        .await
        .unwrap_err();
    assert!(matches!(err, TierError::BadSource { .. }), "{err:?}");

    // Wrong region: Garage refuses the signature scope.
    let cfg = S3Config {
        region: Some("us-east-1".into()),
        ..g.config()
    };
    let tier = S3Tier::new(&format!("s3://{BUCKET}/ds"), cfg).unwrap();
    let err = tier.list().await.unwrap_err();
    eprintln!("wrong region: {err}");
    assert!(
        matches!(err, TierError::BadSource { .. } | TierError::Auth { .. }),
        "{err:?}"
    );
    assert!(!format!("{err:?}").contains(&g.secret));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_escape_the_view_are_left_out_and_named() {
    let Some(g) = Garage::start("keys_that_escape_the_view_are_left_out_and_named") else {
        return;
    };
    let tier = g.tier("ds");
    upload(
        &tier,
        &[
            ("ds/ok/1".into(), data(1, 10)),
            ("ds/f".into(), data(2, 10)),
            ("ds/f/g".into(), data(3, 10)),
        ],
    )
    .await;
    let bad = ["ds/a/../b", "ds//abs", "ds/a//b", "ds/dir/", "ds/./x"];
    upload_raw_keys(&g, &bad);
    let l = tier.list().await.unwrap();
    let mut paths: Vec<_> = l.entries.iter().map(|e| e.path.as_str()).collect();
    paths.sort();
    assert_eq!(paths, ["f/g", "ok/1"]);
    let reason = |key: &str| {
        l.skipped
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, why)| why.clone())
            .unwrap_or_else(|| panic!("{key} not reported in {:?}", l.skipped))
    };
    assert!(reason("ds/a/../b").contains("`..`"));
    assert!(reason("ds/a/../b").contains("ds/a/../b"));
    assert!(reason("ds//abs").contains("absolute"));
    assert!(reason("ds/a//b").contains("empty path segment"));
    assert!(reason("ds/dir/").contains("directory marker"));
    assert!(reason("ds/./x").contains("`.`"));
    assert!(reason("ds/f").contains("directory"));
    let cat = Catalog::from_entries(tier.url(), l.entries).unwrap();
    assert!(tier.catalog_is_current(&cat).await.unwrap());
    // Such paths are refused at fetch time too.
    let dir = tempfile::tempdir().unwrap();
    for p in ["a/../b", "/abs", "a//b"] {
        let s = SampleRef {
            path: p.into(),
            size: 3,
            version: String::new(),
            durable: true,
        };
        let f = Arc::new(std::fs::File::create(dir.path().join("x")).unwrap());
        let err = tier.fetch(&s, f, &Pacer::unlimited()).await.unwrap_err();
        assert!(matches!(err, TierError::Escapes { .. }), "{p}: {err:?}");
    }
}

/// The fault proxy, stopped on drop.
struct FaultProxy {
    child: Child,
    port: u16,
    stats: PathBuf,
    _dir: tempfile::TempDir,
}

impl FaultProxy {
    fn start(target_port: u16, seed: u64, slowdown: f64, reset: f64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let stats = dir.path().join("stats.json");
        let mut child = Command::new("python3")
            .arg(repo().join("tests/faultproxy.py"))
            .args(["--target", &format!("127.0.0.1:{target_port}")])
            .args(["--seed", &seed.to_string()])
            .args(["--slowdown", &slowdown.to_string()])
            .args(["--reset", &reset.to_string()])
            .args(["--max-seconds", "300"])
            .args(["--stats", stats.to_str().unwrap()])
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .strip_prefix("listening 127.0.0.1:")
            .unwrap_or_else(|| panic!("faultproxy said {line:?}"))
            .parse()
            .unwrap();
        Self {
            child,
            port,
            stats,
            _dir: dir,
        }
    }

    fn stats(&self) -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(&self.stats).unwrap()).unwrap()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetches_complete_through_a_faulty_network() {
    let Some(g) = Garage::start("fetches_complete_through_a_faulty_network") else {
        return;
    };
    let direct = g.tier("ds");
    let mut objects: Vec<(String, Vec<u8>)> = (0..120)
        .map(|i| {
            (
                format!("ds/small/{i:03}"),
                data(i, 20_000 + 997 * i as usize),
            )
        })
        .collect();
    objects.push(("ds/large/a".into(), data(1000, 6 << 20)));
    objects.push(("ds/large/b".into(), data(1001, (3 << 20) + 5)));
    upload(&direct, &objects).await;

    let proxy = FaultProxy::start(g.port, 42, 0.15, 0.15);
    let cfg = S3Config {
        part_size: 1 << 20,
        retry: S3RetryConfig {
            // Many faults in a row are likely over hundreds of requests; keep waits short.
            max_retries: 12,
            max_backoff_ms: 500,
            ..Default::default()
        },
        ..g.config_via(&format!("http://127.0.0.1:{}", proxy.port))
    };
    let tier = S3Tier::new(&format!("s3://{BUCKET}/ds"), cfg).unwrap();
    let l = tier.list().await.unwrap();
    assert_eq!(l.entries.len(), objects.len());
    let dir = tempfile::tempdir().unwrap();
    let pacer = Pacer::unlimited();
    let results: Vec<_> = futures::stream::iter(&l.entries)
        .map(|e| {
            let tier = &tier;
            let dir = dir.path();
            let pacer = &pacer;
            async move { (e, fetch_bytes(tier, &sample(e), dir, pacer).await) }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    for (e, r) in results {
        let want = &objects
            .iter()
            .find(|(k, _)| k == &format!("ds/{}", e.path))
            .unwrap()
            .1;
        let got = r.unwrap_or_else(|err| panic!("{}: {err}", e.path));
        assert!(got == *want, "{}: bytes differ", e.path);
    }
    let stats = proxy.stats();
    assert!(
        stats["slowdowns"].as_u64().unwrap() > 0 && stats["resets"].as_u64().unwrap() > 0,
        "the proxy injected no faults: {stats}"
    );
    eprintln!("faults injected: {stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_crash_and_restart_during_fetch() {
    let Some(g) = Garage::start("server_crash_and_restart_during_fetch") else {
        return;
    };
    let cfg = S3Config {
        part_size: 1 << 20,
        ..g.config()
    };
    let tier = Arc::new(S3Tier::new(&format!("s3://{BUCKET}/ds"), cfg).unwrap());
    let objects: Vec<(String, Vec<u8>)> = (0..4)
        .map(|i| (format!("ds/big{i}"), data(i, 12 << 20)))
        .chain((0..40).map(|i| (format!("ds/s{i:02}"), data(100 + i, 50_000))))
        .collect();
    upload(&tier, &objects).await;
    let l = tier.list().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // About 4 s of transfer at 24 MiB/s, so the restart lands in the middle.
    let pacer = Pacer::with_rate(Some(24 << 20));
    let fetches = {
        let tier = tier.clone();
        let entries = l.entries.clone();
        let dir = dir.path().to_path_buf();
        let pacer = pacer.clone();
        tokio::spawn(async move {
            futures::stream::iter(entries)
                .map(|e| {
                    let tier = tier.clone();
                    let dir = dir.clone();
                    let pacer = pacer.clone();
                    async move {
                        let r = fetch_bytes(&tier, &sample(&e), &dir, &pacer).await;
                        (e, r)
                    }
                })
                .buffer_unordered(16)
                .collect::<Vec<_>>()
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(!fetches.is_finished(), "the fetches ended before the crash");
    g.kill();
    tokio::time::sleep(Duration::from_millis(800)).await;
    g.run_start();
    let results = tokio::time::timeout(Duration::from_secs(120), fetches)
        .await
        .expect("fetches hang after the restart")
        .unwrap();
    let mut failed = 0;
    for (e, r) in results {
        let want = &objects
            .iter()
            .find(|(k, _)| k == &format!("ds/{}", e.path))
            .unwrap()
            .1;
        match r {
            // Whatever completed is the object's bytes.
            Ok(got) => assert!(got == *want, "{}: wrong bytes after a restart", e.path),
            Err(err) => {
                failed += 1;
                eprintln!("{}: failed during the restart: {err}", e.path);
                assert!(
                    matches!(err, TierError::Unreachable { .. } | TierError::Io { .. }),
                    "{}: {err:?}",
                    e.path
                );
            }
        }
    }
    eprintln!("{failed} fetches failed cleanly during the restart");
    // After the restart everything can be fetched again, and the data survived.
    for e in &l.entries {
        let want = &objects
            .iter()
            .find(|(k, _)| k == &format!("ds/{}", e.path))
            .unwrap()
            .1;
        let got = fetch_bytes(&tier, &sample(e), dir.path(), &Pacer::unlimited())
            .await
            .unwrap();
        assert!(got == *want, "{}", e.path);
    }
}
