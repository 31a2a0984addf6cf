//! What the simulation measures beside the nodes' own logs: etcd's request counters (its
//! `/metrics`) and CPU time (`/proc`), percentiles, the TODO keys' watch that times each dead
//! node's requeue, and the scan of the queue that checks every shard was done exactly once.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, EventType, GetOptions, WatchOptions};
use metfs_dds::keys::{Keys, Kind};
use serde_json::json;

/// etcd's `/metrics` as (name with labels → value), by plain HTTP/1.0 on its client port.
pub(crate) async fn metrics(endpoint: &str) -> HashMap<String, f64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut out = HashMap::new();
    let Ok(mut s) = tokio::net::TcpStream::connect(endpoint).await else {
        return out;
    };
    let req = format!("GET /metrics HTTP/1.0\r\nHost: {endpoint}\r\n\r\n");
    if s.write_all(req.as_bytes()).await.is_err() {
        return out;
    }
    let mut body = String::new();
    let _ = s.read_to_string(&mut body).await;
    let kept = |l: &&str| {
        l.starts_with("grpc_server_msg_") || SERVER_HISTOGRAMS.iter().any(|(h, _)| l.starts_with(h))
    };
    for line in body.lines().filter(kept) {
        if let Some((k, v)) = line.rsplit_once(' ') {
            if let Ok(v) = v.parse::<f64>() {
                out.insert(k.to_string(), v);
            }
        }
    }
    out
}

/// etcd's own histograms of how long it took, by name and the label a series must carry:
/// a transaction's handling in its gRPC server (only with `--metrics extensive`), its WAL's
/// fsync, and its backend's commit.
const SERVER_HISTOGRAMS: [(&str, &str); 3] = [
    ("grpc_server_handling_seconds_bucket", "grpc_method=\"Txn\""),
    ("etcd_disk_wal_fsync_duration_seconds_bucket", ""),
    ("etcd_disk_backend_commit_duration_seconds_bucket", ""),
];

/// etcd's own latencies between two reads of its metrics, as JSON: per histogram of
/// [`SERVER_HISTOGRAMS`], the count and the upper bounds (ms) of the buckets that hold the
/// 50th and 99th percentiles (a histogram says no more than its bucket); `null` for one etcd
/// did not export.
pub(crate) fn server_latency(
    before: &HashMap<String, f64>,
    after: &HashMap<String, f64>,
) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for (name, label) in SERVER_HISTOGRAMS {
        // le -> observations up to it (cumulative), summed over the series that match.
        let mut buckets: BTreeMap<u64, f64> = BTreeMap::new();
        for (k, v) in after
            .iter()
            .filter(|(k, _)| k.starts_with(name) && k.contains(label))
        {
            let Some(le) = k.split("le=\"").nth(1).and_then(|r| r.split('"').next()) else {
                continue;
            };
            let le_us = if le == "+Inf" {
                u64::MAX
            } else {
                le.parse::<f64>()
                    .map_or(u64::MAX, |x| (x * 1e6).round() as u64)
            };
            *buckets.entry(le_us).or_default() += v - before.get(k).copied().unwrap_or(0.0);
        }
        let key = name
            .trim_end_matches("_bucket")
            .trim_end_matches("_seconds")
            .trim_end_matches("_duration");
        let n = buckets.get(&u64::MAX).copied().unwrap_or(0.0);
        if buckets.is_empty() {
            out.insert(key.to_string(), serde_json::Value::Null);
            continue;
        }
        let at = |q: f64| {
            buckets.iter().find(|(_, c)| **c >= q * n).map(|(le, _)| {
                if *le == u64::MAX {
                    f64::INFINITY
                } else {
                    *le as f64 / 1000.0
                }
            })
        };
        out.insert(
            key.to_string(),
            json!({ "n": n, "p50_le_ms": at(0.5), "p99_le_ms": at(0.99) }),
        );
    }
    serde_json::Value::Object(out)
}

/// gRPC messages received by etcd per method, and watch messages sent, between two reads.
pub(crate) fn requests(
    before: &HashMap<String, f64>,
    after: &HashMap<String, f64>,
) -> (BTreeMap<String, f64>, f64) {
    let mut by = BTreeMap::new();
    let mut watch_sent = 0.0;
    for (k, v) in after {
        let d = v - before.get(k).copied().unwrap_or(0.0);
        let method = k
            .split("grpc_method=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or("?")
            .to_string();
        if k.starts_with("grpc_server_msg_received_total") {
            if d > 0.0 {
                *by.entry(method).or_insert(0.0) += d;
            }
        } else if k.starts_with("grpc_server_msg_sent_total")
            && method == "Watch"
            && k.contains("etcdserverpb.Watch")
        {
            watch_sent += d;
        }
    }
    (by, watch_sent)
}

/// CPU seconds (user + system) of a process, from `/proc/PID/stat`.
pub(crate) fn cpu_secs(pid: &str) -> f64 {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return f64::NAN;
    };
    // Fields after the command name (which may hold spaces) start at field 3.
    let rest = s.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11).and_then(|u| u.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|u| u.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks / hz
}

/// Nearest-rank percentile of sorted values.
pub(crate) fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[i.clamp(1, sorted.len()) - 1]
}

pub(crate) fn summary(mut v: Vec<f64>) -> serde_json::Value {
    v.sort_by(f64::total_cmp);
    let r = |x: f64| (x * 100.0).round() / 100.0;
    json!({
        "n": v.len(),
        "p50": r(pct(&v, 50.0)),
        "p90": r(pct(&v, 90.0)),
        "p99": r(pct(&v, 99.0)),
        "max": r(v.last().copied().unwrap_or(f64::NAN)),
    })
}

/// Every (epoch, shard) put in TODO, with when.
pub(crate) type Requeues = Arc<Mutex<HashMap<(u64, u32), Vec<Instant>>>>;

pub(crate) async fn watch_todo(mut client: Client, keys: Keys, seen: Requeues) {
    // Watched again from the next revision whenever the stream ends, so no event is missed.
    let mut next = 0i64;
    loop {
        let mut opts = WatchOptions::new().with_prefix();
        if next > 0 {
            opts = opts.with_start_revision(next);
        }
        let (_w, mut stream) = match client.watch(keys.todo_all(), Some(opts)).await {
            Ok(w) => w,
            Err(e) => {
                eprintln!("dds_nodes: the TODO watch failed ({e}); watching again");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        loop {
            let resp = match stream.message().await {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(e) => {
                    eprintln!("dds_nodes: the TODO watch ended ({e}); watching again");
                    break;
                }
            };
            let now = Instant::now();
            if let Some(h) = resp.header() {
                next = next.max(h.revision() + 1);
            }
            for ev in resp.events() {
                if ev.event_type() != EventType::Put {
                    continue;
                }
                let Some(kv) = ev.kv() else { continue };
                next = next.max(kv.mod_revision() + 1);
                if let Some((Kind::Todo, e, k)) = keys.parse_shard(kv.key()) {
                    seen.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .entry((e, k))
                        .or_default()
                        .push(now);
                }
            }
        }
    }
}

/// Keys under `prefix` with their values and versions (retried while a loaded etcd times out).
pub(crate) async fn scan(client: &mut Client, prefix: String) -> Vec<(Vec<u8>, Vec<u8>, i64)> {
    let mut tries = 0;
    let r = loop {
        match client
            .get(prefix.clone(), Some(GetOptions::new().with_prefix()))
            .await
        {
            Ok(r) => break r,
            Err(e) if tries < 20 => {
                tries += 1;
                eprintln!("dds_nodes: read of {prefix} failed ({e}); retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("read of {prefix} failed 20 times: {e}"),
        }
    };
    r.kvs()
        .iter()
        .map(|kv| (kv.key().to_vec(), kv.value().to_vec(), kv.version()))
        .collect()
}
