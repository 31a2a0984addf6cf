//! The Prometheus metrics file: the daemon's status as text exposition format, for
//! node_exporter's textfile collector (`--collector.textfile.directory`, which reads `*.prom`).
//!
//! [`render`] turns the daemon's [`Status`] (the object `metfs status --json` prints) into
//! metrics;
//! [`write_atomic`] replaces the file so that a collector never reads half of it. The daemon
//! calls both every few seconds when `--metrics-file` is set.
//!
//! Design and invariants:
//!
//! * **One table, one source of truth**: [`METRICS`] maps each status field to a metric name,
//!   type, unit and help text; `docs/METRICS.md` documents the same table. Values are read
//!   from the typed [`Status`] (a renamed field does not compile), and each entry's field
//!   name is tested against the protocol's schema. A registry crate
//!   (`prometheus`, `prometheus-client`) would need every field mirrored into registered metric
//!   objects and kept in step with the status; the status already is the snapshot, so this
//!   module only formats it.
//! * **Naming**: every name starts with `metfs_`, uses base units (`_bytes`, `_seconds`,
//!   `bytes_per_second` for rates), and counters end in `_total`.
//! * **Absent means absent**: a value that is `null` (not measured yet: B2 before the first
//!   staging) or belongs to another staging state produces no sample and no
//!   `# HELP`/`# TYPE` lines, so it never shows as 0.
//! * **Labels**: every sample carries `node` (the node rank) and `mountpoint`, so several
//!   daemons on one node (one file each) never collide in the collector.
//!   Label values are escaped as the format requires (`\\`, `\"`, `\n`).
//! * **Numbers**: integers are printed exactly, floats in Rust's shortest round-trip form,
//!   booleans as 0/1, non-finite floats as `NaN`, `+Inf`, `-Inf`.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use metfs_protocol::{Staging, Status};

/// Prometheus metric types used here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A value that goes up and down.
    Gauge,
    /// A value that only grows (resets when the daemon restarts); name ends in `_total`.
    Counter,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
        }
    }
}

/// A sample's value, read from the status.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    /// An integer, printed exactly.
    Int(u64),
    /// A float.
    Float(f64),
    /// A flag, printed as 0 or 1.
    Flag(bool),
}

/// One metric: where its value comes from and how it is described.
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    /// Full name, `metfs_` prefix included.
    pub name: &'static str,
    /// Gauge or counter.
    pub kind: Kind,
    /// The status field it reports (`staging.x` for a field of the staging object), as
    /// `docs/METRICS.md` names it.
    pub field: &'static str,
    /// Reads the value; `None` leaves the metric out.
    pub value: fn(&Status) -> Option<Num>,
    /// `# HELP` text.
    pub help: &'static str,
}

const fn m(
    name: &'static str,
    kind: Kind,
    field: &'static str,
    value: fn(&Status) -> Option<Num>,
    help: &'static str,
) -> Metric {
    Metric {
        name,
        kind,
        field,
        value,
        help,
    }
}

use Kind::{Counter, Gauge};
use Num::{Flag, Float, Int};

/// A field of the staging object while a mini-epoch is being staged.
macro_rules! staging {
    ($f:ident, $num:expr) => {
        |s: &Status| match &s.staging {
            Staging::Staging { $f, .. } => Some($num(*$f)),
            _ => None,
        }
    };
}

/// Every metric [`render`] can write, in output order.
pub const METRICS: &[Metric] = &[
    m("metfs_epoch", Gauge, "epoch", |s| Some(Int(s.epoch)), "Current epoch, from 0."),
    m("metfs_mini_epoch", Gauge, "mini_epoch", |s| Some(Int(u64::from(s.mini_epoch))), "Index of the current mini-epoch within its epoch, from 0."),
    m("metfs_mini_epochs", Gauge, "mini_epochs", |s| Some(Int(u64::from(s.mini_epochs))), "Mini-epochs per epoch (nm)."),
    m("metfs_pass", Gauge, "pass", |s| Some(Int(u64::from(s.pass))), "Passes completed over the current mini-epoch."),
    m("metfs_rf", Gauge, "rf", |s| Some(Float(s.rf)), "Repeating factor the rf policy expects for the current mini-epoch (fractional for adaptive policies)."),
    m("metfs_stall_free_rf", Gauge, "stall_free_rf", |s| s.stall_free_rf.map(|x| Int(u64::from(x))), "Smallest rf with no wait for staging: ceil(EB1 / B2)."),
    m("metfs_advance_wanted", Gauge, "advance_wanted", |s| Some(Flag(s.advance_wanted)), "1 when the policy wants to advance and the job is waiting for the next mini-epoch."),
    m("metfs_view_generation", Gauge, "generation", |s| Some(Int(s.generation)), "Generation of the view; grows by one at every switch to the next mini-epoch."),
    m("metfs_next_ready", Gauge, "next_ready", |s| Some(Flag(s.next_ready)), "1 when the next mini-epoch is fully staged."),
    m("metfs_cache_bytes", Gauge, "cache_bytes", |s| Some(Int(s.cache_bytes)), "Bytes the cache directory holds: slots, staging progress and metadata."),
    m("metfs_cache_budget_bytes", Gauge, "budget_bytes", |s| Some(Int(s.budget_bytes)), "Cache budget (EC1)."),
    m("metfs_cache_reserve_bytes", Gauge, "reserve_bytes", |s| Some(Int(s.reserve_bytes)), "Part of the budget kept for metadata (catalog, journals, logs)."),
    m("metfs_slot_bytes", Gauge, "slot_bytes", |s| Some(Int(s.slot_bytes)), "Largest size of one mini-epoch slot: (budget - reserve) / 2."),
    m("metfs_view_files", Gauge, "view_files", |s| Some(Int(s.view_files)), "Files in the current view (the current mini-epoch)."),
    m("metfs_view_bytes", Gauge, "view_bytes", |s| Some(Int(s.view_bytes)), "Bytes in the current view."),
    m("metfs_dataset_files", Gauge, "dataset_files", |s| Some(Int(s.dataset_files)), "Samples in this node's dataset catalog."),
    m("metfs_dataset_bytes", Gauge, "dataset_bytes", |s| Some(Int(s.dataset_bytes)), "Bytes in this node's dataset catalog."),
    m("metfs_tier_read_bytes_total", Counter, "tier_bytes_read", |s| Some(Int(s.tier_bytes_read)), "Bytes read from the capacity tier since the daemon started."),
    m("metfs_bonus_passes_total", Counter, "bonus_passes", |s| Some(Int(s.bonus_passes)), "Passes that ended waiting for the next mini-epoch to be staged."),
    m("metfs_blocked_seconds_total", Counter, "blocked_seconds", |s| Some(Float(s.blocked_seconds)), "Seconds callers spent blocked waiting for the next mini-epoch."),
    m("metfs_pass_seconds", Gauge, "pass_seconds", |s| s.pass_seconds.map(Float), "Duration of the last pass."),
    m("metfs_pass_mean_seconds", Gauge, "pass_seconds_mean", |s| s.pass_seconds_mean.map(Float), "Mean duration of recent passes."),
    m("metfs_staging_bandwidth_bytes_per_second", Gauge, "b2_bytes_per_s", |s| s.b2_bytes_per_s.map(Float), "B2: average staging throughput from the capacity tier."),
    m("metfs_staging_recent_bandwidth_bytes_per_second", Gauge, "b2_recent_bytes_per_s", |s| s.b2_recent_bytes_per_s.map(Float), "B2 of the most recent staging."),
    m("metfs_consumption_bandwidth_bytes_per_second", Gauge, "eb1_bytes_per_s", |s| s.eb1_bytes_per_s.map(Float), "EB1: bytes per second the job reads through the mount during passes."),
    m("metfs_prefetch_rate_limit_bytes_per_second", Gauge, "prefetch_rate", |s| s.prefetch_rate.map(Int), "Current cap on staging bandwidth (absent when unlimited)."),
    m("metfs_staging_done_bytes", Gauge, "staging.bytes_done", staging!(bytes_done, Int), "Bytes of the next mini-epoch staged so far."),
    m("metfs_staging_total_bytes", Gauge, "staging.bytes_total", staging!(bytes_total, Int), "Bytes of the next mini-epoch to stage."),
    m("metfs_staging_done_files", Gauge, "staging.files_done", staging!(files_done, Int), "Files of the next mini-epoch staged so far."),
    m("metfs_staging_total_files", Gauge, "staging.files_total", staging!(files_total, Int), "Files of the next mini-epoch to stage."),
    m("metfs_staging_current_bandwidth_bytes_per_second", Gauge, "staging.bytes_per_s", staging!(bytes_per_s, Float), "Staging throughput of the next mini-epoch so far."),
    m("metfs_staging_eta_seconds", Gauge, "staging.eta_s", |s| match &s.staging { Staging::Staging { eta_s, .. } => eta_s.map(Float), _ => None }, "Estimated seconds until the next mini-epoch is staged."),
    m("metfs_draining_slots", Gauge, "draining_slots", |s| Some(Int(s.draining_slots)), "Old slots still held by open files (on the cached read path: by the kernel's references to their inodes)."),
    m("metfs_open_handles", Gauge, "open_handles", |s| Some(Int(s.open_handles)), "File handles open on the mount."),
    m("metfs_passthrough", Gauge, "passthrough", |s| Some(Flag(s.passthrough)), "1 when reads use kernel FUSE passthrough."),
    m("metfs_daemon_read_bytes_total", Counter, "daemon_bytes_read", |s| Some(Int(s.daemon_bytes_read)), "Bytes the daemon read for the kernel (cache misses on the cached path, every read on the pread path)."),
    m("metfs_daemon_spliced_bytes_total", Counter, "daemon_bytes_spliced", |s| Some(Int(s.daemon_bytes_spliced)), "Of the bytes the daemon read for the kernel, those answered by splice from the slot file (no copy in the daemon)."),
    m("metfs_failed_samples", Gauge, "failed_samples", |s| Some(Int(s.failed_samples.len() as u64)), "Samples that recently failed to stage (at most the last 100 are remembered)."),
    m("metfs_deferred_samples", Gauge, "deferred_samples", |s| Some(Int(s.deferred_samples)), "Samples a fault that lasts kept out, carried now into a later mini-epoch."),
    m("metfs_deferrals_total", Counter, "deferrals", |s| Some(Int(s.deferrals)), "Samples deferred to a later mini-epoch (a sample deferred twice counts twice)."),
    m("metfs_recovered_samples_total", Counter, "recovered_samples", |s| Some(Int(s.recovered_samples)), "Deferred samples a later staging gave."),
    m("metfs_error", Gauge, "last_error", |s| Some(Flag(s.last_error.is_some())), "1 when the daemon has an error to report (see metfs status)."),
    m("metfs_nodes", Gauge, "nodes", |s| Some(Int(u64::from(s.nodes))), "Nodes in the job."),
    m("metfs_uptime_seconds", Gauge, "uptime_s", |s| Some(Float(s.uptime_s)), "Seconds since the daemon started."),
];

/// Formats a value as the exposition format reads it.
fn number(v: Num) -> String {
    match v {
        Num::Flag(b) => if b { "1" } else { "0" }.to_string(),
        Num::Int(u) => u.to_string(),
        Num::Float(f) => float(f),
    }
}

fn float(f: f64) -> String {
    if f.is_nan() {
        "NaN".into()
    } else if f == f64::INFINITY {
        "+Inf".into()
    } else if f == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        // Rust prints the shortest string that reads back as the same f64, never with an
        // exponent, which Prometheus (Go's ParseFloat) reads.
        format!("{f}")
    }
}

/// Escapes a label value: backslash, double quote and newline.
fn escape(v: &str) -> String {
    let mut o = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o
}

/// Escapes `# HELP` text: backslash and newline.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Renders the daemon's status as Prometheus text exposition format (version 0.0.4):
/// `# HELP` and `# TYPE` before each metric's sample, every sample labelled with `node` and
/// `mountpoint`, plus `metfs_info` (value 1) whose labels carry the rf policy, the
/// composition strategy, the job and the read path. Values that are null are left out. The
/// output ends with a newline.
pub fn render(status: &Status) -> String {
    let common: [(&str, String); 2] = [
        ("node", status.node_rank.to_string()),
        ("mountpoint", status.mountpoint.clone()),
    ];
    let labels = |extra: &[(&str, String)]| -> String {
        let all: Vec<String> = common
            .iter()
            .chain(extra.iter())
            .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
            .collect();
        if all.is_empty() {
            String::new()
        } else {
            format!("{{{}}}", all.join(","))
        }
    };
    let mut out = String::new();
    for metric in METRICS {
        let Some(value) = (metric.value)(status).map(number) else {
            continue;
        };
        let _ = writeln!(out, "# HELP {} {}", metric.name, escape_help(metric.help));
        let _ = writeln!(out, "# TYPE {} {}", metric.name, metric.kind.as_str());
        let _ = writeln!(out, "{}{} {}", metric.name, labels(&[]), value);
    }
    // The label-only `metfs_info` metric carries these status strings as labels.
    let info = [
        (
            "rf_policy",
            status.rf_policy.map_or(String::new(), |k| k.to_string()),
        ),
        ("compose", status.compose.to_string()),
        ("job", status.job.clone()),
        ("read_path", status.read_path.to_string()),
    ];
    let _ = writeln!(
        out,
        "# HELP metfs_info Constant 1; the labels describe the daemon's configuration."
    );
    let _ = writeln!(out, "# TYPE metfs_info gauge");
    let _ = writeln!(out, "metfs_info{} 1", labels(&info));
    out
}

/// Writes `text` to `path` atomically (`metfs-durable`): into a temporary file in the same directory
/// (named `.<file name>.<random>.tmp`, which the textfile collector's `*.prom` pattern skips),
/// then renamed over `path`, so readers see the old file or the new one, never a part. The file
/// is made readable by everyone (0644), as node_exporter usually runs as another user. No
/// fsync: after a crash a stale or missing metrics file is harmless and the next write
/// replaces it.
pub fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
    // A snapshot rewritten every few seconds: whole for the collector, not crash-proof.
    metfs_durable::write_with(path, metfs_durable::Durability::Atomic, |f| {
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
        f.write_all(text.as_bytes())
    })
    .map_err(|e| std::io::Error::new(e.io_error().kind(), e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};

    fn full_status() -> Status {
        serde_json::from_str(
            r#"{
            "epoch": 3, "mini_epoch": 7, "mini_epochs": 16, "pass": 2, "rf": 5.5,
            "rf_policy": "bollinger", "job": "resnet \"50\"", "advance_wanted": false,
            "read_path": "cached", "daemon_bytes_read": 4096,
            "generation": 55, "next_ready": true, "cache_bytes": 123456789,
            "budget_bytes": 17179869184, "slot_bytes": 8000000000, "reserve_bytes": 4096,
            "tier_bytes_read": 18446744073709551615, "reused_bytes": 0, "view_files": 1000,
            "view_bytes": 1073741824, "dataset_files": 16000, "dataset_bytes": 17179869184,
            "bonus_passes": 4, "blocked_seconds": 12.25, "pass_seconds": 3.5,
            "pass_seconds_mean": 3.25, "b2_bytes_per_s": 1.5e8, "b2_recent_bytes_per_s": null,
            "eb1_bytes_per_s": 3.0e8, "stall_free_rf": 2, "prefetch_rate": null,
            "staging": {"state": "staging", "slot": "s1", "epoch": 3, "mini_epoch": 8,
                        "files_done": 10, "files_total": 100,
                        "bytes_done": 1000, "bytes_total": 10000, "bytes_per_s": 2.5e7,
                        "eta_s": 0.125, "bytes_reused": 0, "retries": 0,
                        "last_retry_error": null},
            "kept_slots": 0, "draining_slots": 0, "draining": [], "open_handles": 12, "passthrough": true,
            "daemon_opens": 9, "daemon_lookups": 4, "primed_entries": 20, "primed_generation": 1,
            "last_error": "tier: 503\nretrying",
            "failed_samples": [{"path": "a", "reason": "gone"}, {"path": "b", "reason": "io"}],
            "source": "s3://bucket/prefix", "mountpoint": "/mnt/m\\e\"t", "socket": "/tmp/s",
            "node_rank": 1, "nodes": 4, "compose": "random", "uptime_s": 99.5, "pid": 42,
            "some_future_field": {"x": 1}
        }"#,
        )
        .unwrap()
    }

    /// A parsed sample: name, labels, value.
    type Sample = (String, Vec<(String, String)>, f64);

    fn valid_name(n: &str) -> bool {
        let mut cs = n.chars();
        matches!(cs.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
            && cs.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }

    /// Parses exposition text strictly enough to catch format mistakes: every sample's
    /// family has HELP then TYPE before it, names and label names are valid, label values are
    /// properly quoted and escaped, values are numbers.
    fn parse(text: &str) -> Vec<Sample> {
        assert!(text.ends_with('\n'));
        let mut help: HashSet<String> = HashSet::new();
        let mut types: HashMap<String, String> = HashMap::new();
        let mut samples = Vec::new();
        let mut series = HashSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, _) = rest.split_once(' ').expect("HELP has text");
                assert!(valid_name(name), "{line}");
                assert!(help.insert(name.to_string()), "second HELP: {line}");
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("TYPE has a kind");
                assert!(help.contains(name), "TYPE before HELP: {line}");
                assert!(["gauge", "counter"].contains(&kind), "{line}");
                assert!(
                    types.insert(name.to_string(), kind.to_string()).is_none(),
                    "second TYPE: {line}"
                );
                continue;
            }
            assert!(!line.starts_with('#') && !line.is_empty(), "{line:?}");
            let name_end = line.find(['{', ' ']).unwrap();
            let name = &line[..name_end];
            assert!(valid_name(name), "{line}");
            assert!(name.starts_with("metfs_"), "{line}");
            let kind = types.get(name).unwrap_or_else(|| panic!("no TYPE: {line}"));
            assert_eq!(kind == "counter", name.ends_with("_total"), "{line}");
            let mut rest = &line[name_end..];
            let mut labels = Vec::new();
            if let Some(r) = rest.strip_prefix('{') {
                let mut chars = r.char_indices().peekable();
                loop {
                    let (start, _) = *chars.peek().unwrap();
                    let eq = r[start..].find('=').unwrap() + start;
                    let lname = &r[start..eq];
                    assert!(valid_name(lname) && !lname.starts_with("__"), "{line}");
                    while chars.peek().unwrap().0 <= eq {
                        chars.next();
                    }
                    assert_eq!(chars.next().unwrap().1, '"', "{line}");
                    let mut v = String::new();
                    loop {
                        match chars.next().unwrap().1 {
                            '\\' => match chars.next().unwrap().1 {
                                '\\' => v.push('\\'),
                                '"' => v.push('"'),
                                'n' => v.push('\n'),
                                c => panic!("bad escape \\{c} in {line}"),
                            },
                            '"' => break,
                            '\n' => panic!("raw newline in {line}"),
                            c => v.push(c),
                        }
                    }
                    labels.push((lname.to_string(), v));
                    match chars.next().unwrap() {
                        (_, ',') => continue,
                        (i, '}') => {
                            rest = &r[i + 1..];
                            break;
                        }
                        (_, c) => panic!("unexpected {c} in {line}"),
                    }
                }
            }
            let value = rest.strip_prefix(' ').expect("space before the value");
            let v: f64 = match value {
                "NaN" => f64::NAN,
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                s => s.parse().unwrap_or_else(|_| panic!("bad value: {line}")),
            };
            assert!(
                series.insert(line[..line.len() - value.len()].to_string()),
                "duplicate: {line}"
            );
            samples.push((name.to_string(), labels, v));
        }
        // No family without a sample.
        let names: HashSet<&str> = samples.iter().map(|s| s.0.as_str()).collect();
        assert_eq!(names.len(), types.len());
        samples
    }

    fn get<'a>(s: &'a [Sample], name: &str) -> Option<&'a Sample> {
        s.iter().find(|x| x.0 == name)
    }

    #[test]
    fn full_status_renders_valid_exposition_text() {
        let text = render(&full_status());
        let s = parse(&text);
        let v = |n: &str| {
            get(&s, n)
                .unwrap_or_else(|| panic!("{n} missing in\n{text}"))
                .2
        };
        assert_eq!(v("metfs_epoch"), 3.0);
        assert_eq!(v("metfs_rf"), 5.5);
        assert_eq!(v("metfs_next_ready"), 1.0);
        assert_eq!(v("metfs_advance_wanted"), 0.0);
        assert_eq!(v("metfs_passthrough"), 1.0);
        assert_eq!(v("metfs_cache_budget_bytes"), (1u64 << 34) as f64);
        assert_eq!(v("metfs_tier_read_bytes_total"), u64::MAX as f64);
        assert!(text.contains("metfs_tier_read_bytes_total{node=\"1\",mountpoint=\"/mnt/m\\\\e\\\"t\"} 18446744073709551615\n"), "{text}");
        assert_eq!(v("metfs_bonus_passes_total"), 4.0);
        assert_eq!(v("metfs_blocked_seconds_total"), 12.25);
        assert_eq!(v("metfs_staging_bandwidth_bytes_per_second"), 1.5e8);
        assert_eq!(v("metfs_consumption_bandwidth_bytes_per_second"), 3.0e8);
        assert_eq!(v("metfs_stall_free_rf"), 2.0);
        assert_eq!(v("metfs_staging_done_bytes"), 1000.0);
        assert_eq!(v("metfs_staging_eta_seconds"), 0.125);
        assert_eq!(v("metfs_failed_samples"), 2.0);
        assert_eq!(v("metfs_error"), 1.0);
        assert_eq!(v("metfs_nodes"), 4.0);
        assert_eq!(v("metfs_uptime_seconds"), 99.5);
        // null: left out, with its HELP and TYPE.
        assert!(get(&s, "metfs_staging_recent_bandwidth_bytes_per_second").is_none());
        assert!(get(&s, "metfs_prefetch_rate_limit_bytes_per_second").is_none());
        assert!(!text.contains("metfs_prefetch_rate_limit"));
        // Labels on every sample; info labels escaped.
        for (name, labels, _) in &s {
            assert_eq!(labels[0], ("node".into(), "1".into()), "{name}");
            assert_eq!(
                labels[1],
                ("mountpoint".into(), "/mnt/m\\e\"t".into()),
                "{name}"
            );
        }
        let info = get(&s, "metfs_info").unwrap();
        assert_eq!(info.2, 1.0);
        assert!(info.1.contains(&("rf_policy".into(), "bollinger".into())));
        assert!(info.1.contains(&("read_path".into(), "cached".into())));
        assert!(info.1.contains(&("job".into(), "resnet \"50\"".into())));
        assert!(info.1.contains(&("compose".into(), "random".into())));
        // The source URL and other strings are not exported.
        assert!(!text.contains("bucket"));
        // Every name in the table appears in docs/METRICS.md.
        let docs = include_str!("../../docs/METRICS.md");
        for m in METRICS {
            assert!(
                docs.contains(&format!("`{}`", m.name)),
                "{} undocumented",
                m.name
            );
        }
        assert!(docs.contains("`metfs_info`"));
    }

    #[test]
    fn values_not_measured_yet_are_left_out() {
        let mut st = full_status();
        st.b2_bytes_per_s = None;
        st.eb1_bytes_per_s = None;
        st.stall_free_rf = None;
        st.pass_seconds = None;
        st.staging = Staging::Idle;
        st.last_error = None;
        let s = parse(&render(&st));
        assert!(get(&s, "metfs_epoch").is_some());
        assert!(get(&s, "metfs_staging_bandwidth_bytes_per_second").is_none());
        assert!(get(&s, "metfs_stall_free_rf").is_none());
        assert!(get(&s, "metfs_staging_done_bytes").is_none());
        assert_eq!(get(&s, "metfs_error").unwrap().2, 0.0);
    }

    /// Each entry's field, as docs/METRICS.md names it, is a field of the protocol's status
    /// (a renamed field fails here and in the schema test, not silently in the docs).
    #[test]
    fn every_metric_names_a_status_field_of_the_schema() {
        let schema = metfs_protocol::schema();
        let status = &schema["$defs"]["StatusReply"]["properties"];
        let staging = serde_json::to_string(&schema["$defs"]["Staging"]).unwrap();
        for m in METRICS {
            match m.field.strip_prefix("staging.") {
                Some(f) => assert!(staging.contains(&format!("\"{f}\"")), "{}", m.field),
                None => assert!(
                    status.get(m.field).is_some(),
                    "{} not in the status",
                    m.field
                ),
            }
            let docs = include_str!("../../docs/METRICS.md");
            assert!(
                docs.contains(&format!("| `{}` | `{}` |", m.name, m.field)),
                "docs/METRICS.md has no row `{}` | `{}`",
                m.name,
                m.field
            );
        }
    }

    #[test]
    fn numbers_format_as_prometheus_reads_them() {
        assert_eq!(float(f64::NAN), "NaN");
        assert_eq!(float(f64::INFINITY), "+Inf");
        assert_eq!(float(f64::NEG_INFINITY), "-Inf");
        assert_eq!(float(1e-7), "0.0000001");
        assert_eq!(float(0.1), "0.1");
        assert_eq!(number(Num::Int(u64::MAX)), "18446744073709551615");
        assert_eq!(number(Num::Flag(false)), "0");
        let big = 1.2345678901234567e300;
        assert_eq!(float(big).parse::<f64>().unwrap(), big);
    }

    #[test]
    fn every_table_entry_is_well_formed() {
        let mut seen = HashSet::new();
        for m in METRICS {
            assert!(
                valid_name(m.name) && m.name.starts_with("metfs_"),
                "{}",
                m.name
            );
            assert_eq!(
                m.kind == Kind::Counter,
                m.name.ends_with("_total"),
                "{}",
                m.name
            );
            assert!(seen.insert(m.name), "{} twice", m.name);
            assert!(!m.help.is_empty() && !m.help.contains('\n'));
        }
    }

    #[test]
    fn write_atomic_replaces_and_leaves_no_temporary() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("metfs.prom");
        write_atomic(&p, "a 1\n").unwrap();
        write_atomic(&p, &render(&full_status())).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        parse(&text);
        let names: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["metfs.prom".to_string()]);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        // A directory that does not exist: an error, and nothing left behind.
        let bad = d.path().join("missing").join("m.prom");
        assert!(write_atomic(&bad, "x 1\n").is_err());
        assert!(write_atomic(Path::new("/"), "x 1\n").is_err());
    }
}
