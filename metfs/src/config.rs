//! Mount configuration: a TOML file (`--config`), the environment, and flags; flags win.
//!
//! Every key of the file has a flag of the same name (`mini_epochs` ↔ `--mini-epochs`).
//! Unknown keys are errors naming the key, so a typo never silently falls back to a default.
//! Sizes accept `512MiB`, `20GiB` or plain bytes, as strings or integers.

use std::path::{Path, PathBuf};

use feedback::config::{parse_metric_list, parse_weight_list, PolicyConfig};
use prefetcher::planner::Strategy;
use prefetcher::s3::S3Config;
use prefetcher::size::{parse_rate, parse_size};
use prefetcher::stager::StagerConfig;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Errors of the configuration module.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("config file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The config file is not valid TOML or has unknown or mistyped keys.
    #[error("config file {path}: {message}")]
    Parse { path: String, message: String },
    /// A required setting is missing everywhere.
    #[error("missing `{0}`: give --{1} or set `{0}` in the config file")]
    Missing(&'static str, &'static str),
    /// A setting has an invalid value.
    #[error("`{key}`: {message}")]
    Invalid { key: &'static str, message: String },
}

/// A size given as bytes or as a string with a unit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SizeValue {
    /// Plain bytes.
    Bytes(u64),
    /// `512MiB`, `20GiB`, ...
    Text(String),
}

impl SizeValue {
    fn bytes(&self, key: &'static str) -> Result<u64, ConfigError> {
        match self {
            SizeValue::Bytes(b) => Ok(*b),
            SizeValue::Text(t) => parse_size(t).map_err(|e| ConfigError::Invalid {
                key,
                message: e.to_string(),
            }),
        }
    }
}

/// How reads of staged files reach the kernel (see `fuse` for the measured trade-offs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ReadPath {
    /// `cached` for samples under [`CACHED_MAX_MEAN_SAMPLE`] on average when a slot fits in
    /// half of the node's memory (repeated passes are then served from the page cache with no
    /// round trip per file), `passthrough` otherwise: large files amortize the round trip of
    /// each open, and the kernel reads them from the slot file's page cache or the NVMe
    /// without a copy through the daemon (measured in `docs/BENCHMARKS.md`).
    #[default]
    Auto,
    /// The kernel sends no `open` and caches file pages for the view's life: after the first
    /// read of a file, reads never reach the daemon. Cache misses are read by the daemon, which
    /// drops the slot file's own pages afterwards so that memory holds each byte once.
    Cached,
    /// Kernel FUSE passthrough (CAP_SYS_ADMIN, kernel >= 6.9): the kernel reads the slot file
    /// itself; each `open` is one round trip to the daemon. Falls back to `pread` if the kernel
    /// refuses.
    Passthrough,
    /// Every `open` and every cache miss goes through the daemon, which `pread`s the slot file;
    /// the page cache is kept across opens.
    Pread,
}

/// Largest mean sample size for which `auto` picks the cached read path. Measured here: at
/// 128 KiB the cached path reads warm files 3x faster than passthrough and cold ones within
/// 10%; at 4 MiB passthrough is 5-25% faster both cold and warm (the kernel copies from the
/// slot file's large folios, and one round trip per open is amortized over 4 MiB).
pub const CACHED_MAX_MEAN_SAMPLE: u64 = 1 << 20;

/// Whether this process has CAP_SYS_ADMIN, which FUSE passthrough needs (bit 21 of the
/// effective capabilities in /proc/self/status).
fn may_passthrough() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << 21) != 0)
}

impl ReadPath {
    /// The path `auto` stands for, given a slot's size, the mean sample size and the node's
    /// memory (bytes).
    pub fn resolve(self, slot_bytes: u64, mean_sample: u64, mem_total: Option<u64>) -> ReadPath {
        match self {
            ReadPath::Auto => match mem_total {
                Some(m) if slot_bytes <= m / 2 && mean_sample < CACHED_MAX_MEAN_SAMPLE => {
                    ReadPath::Cached
                }
                // Without CAP_SYS_ADMIN the kernel refuses passthrough at the first open:
                // an ordinary user gets pread straight away (and `status` says so).
                _ if may_passthrough() => ReadPath::Passthrough,
                _ => ReadPath::Pread,
            },
            other => other,
        }
    }

    /// The name used in logs, status and flags.
    pub fn name(self) -> &'static str {
        match self {
            ReadPath::Auto => "auto",
            ReadPath::Cached => "cached",
            ReadPath::Passthrough => "passthrough",
            ReadPath::Pread => "pread",
        }
    }
}

/// The read path a mount uses now, shared between the daemon (which reports it) and the FUSE
/// adapter (which may have to fall back): it starts as the resolved path and only ever falls
/// back to [`ReadPath::Pread`], when the kernel turns out not to support the chosen one.
#[derive(Debug)]
pub struct ActiveReadPath(std::sync::atomic::AtomicU8);

impl ActiveReadPath {
    /// The path chosen at mount (resolved, never `auto`).
    pub fn new(path: ReadPath) -> Self {
        Self(std::sync::atomic::AtomicU8::new(path as u8))
    }

    /// The path in use now.
    pub fn get(&self) -> ReadPath {
        match self.0.load(std::sync::atomic::Ordering::Relaxed) {
            x if x == ReadPath::Cached as u8 => ReadPath::Cached,
            x if x == ReadPath::Passthrough as u8 => ReadPath::Passthrough,
            x if x == ReadPath::Auto as u8 => ReadPath::Auto,
            _ => ReadPath::Pread,
        }
    }

    /// Falls back to `pread`; true if this call changed the path (so that only one caller
    /// logs it).
    pub fn fall_back(&self) -> bool {
        self.0
            .swap(ReadPath::Pread as u8, std::sync::atomic::Ordering::Relaxed)
            != ReadPath::Pread as u8
    }
}

/// The node's memory in bytes (`MemTotal` of `/proc/meminfo`).
pub fn mem_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Staging bandwidth setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefetchRate {
    /// No cap.
    Unlimited,
    /// A fixed cap in bytes per second.
    Fixed(u64),
    /// Just-in-time pacing from the measured pass duration (capped by `prefetch_rate_max`).
    Auto,
}

/// A list given as one comma-separated string or as a TOML array.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ListValue {
    /// `"loss, 1 - accuracy"`
    Text(String),
    /// `["loss", "1 - accuracy"]`
    Items(Vec<String>),
}

impl ListValue {
    fn joined(&self) -> String {
        match self {
            ListValue::Text(t) => t.clone(),
            ListValue::Items(v) => v.join(","),
        }
    }
}

/// A list of numbers given as one comma-separated string or as a TOML array.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum NumbersValue {
    /// `"1, 0.5"`
    Text(String),
    /// `[1.0, 0.5]`
    Items(Vec<f64>),
}

/// The TOML file's shape; every field optional so that flags and defaults can fill in.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct FileConfig {
    pub source: Option<String>,
    pub cache: Option<PathBuf>,
    pub budget: Option<SizeValue>,
    pub mini_epochs: Option<u32>,
    pub rf: Option<u32>,
    pub compose: Option<Strategy>,
    pub seed: Option<u64>,
    pub socket: Option<PathBuf>,
    pub node_rank: Option<u32>,
    pub nodes: Option<u32>,
    pub manifest: Option<PathBuf>,
    pub label_from_dirs: Option<bool>,
    pub read_path: Option<ReadPath>,
    pub fuse_threads: Option<usize>,
    pub allow_other: Option<bool>,
    pub prefetch_rate: Option<String>,
    pub max_open_files: Option<u64>,
    pub max_backing_ids: Option<u64>,
    pub stager: Option<StagerConfig>,
    pub control: Option<crate::control::ControlConfig>,
    pub log_file: Option<PathBuf>,
    pub rf_policy: Option<String>,
    pub rf_min: Option<u32>,
    pub rf_max: Option<u32>,
    pub score_metrics: Option<ListValue>,
    pub score_weights: Option<NumbersValue>,
    pub score_wait: Option<u32>,
    pub best_scope: Option<String>,
    pub bollinger_window: Option<u32>,
    pub bollinger_k: Option<f64>,
    pub bollinger_scope: Option<String>,
    pub learned_fallback: Option<String>,
    pub history: Option<PathBuf>,
    pub job: Option<String>,
    pub run_dir: Option<PathBuf>,
    pub prefetch_rate_max: Option<String>,
    pub metrics_file: Option<PathBuf>,
    pub s3: Option<S3Config>,
    pub label_hdf5: Option<String>,
    pub hdf5_container: Option<bool>,
    pub hdf5_datasets: Option<ListValue>,
    pub label_dataset: Option<String>,
}

impl FileConfig {
    /// Reads a TOML config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses the text of a TOML config file; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: origin.to_string(),
            message: e.to_string(),
        })
    }
}

/// The resolved configuration of one mount.
#[derive(Debug, Clone)]
pub struct MountConfig {
    /// Capacity tier: a directory, or `s3://bucket/prefix`.
    pub source: String,
    /// Cache directory on node-local storage. It must exist; metfs owns everything in it.
    pub cache: PathBuf,
    /// Most bytes metfs keeps in the cache directory (slots, temporary files, catalog,
    /// journals, state, log).
    pub budget: u64,
    /// Mini-epochs per epoch; `None`: the smallest number whose every mini-epoch fits in half
    /// the budget.
    pub mini_epochs: Option<u32>,
    /// The repeating-factor policy and its knobs (`rf`, `rf_policy`, `rf_min`, `rf_max`,
    /// `score_*`, `bollinger_*`, `learned_fallback`); defaults and reasons are documented on
    /// [`PolicyConfig`].
    pub policy: PolicyConfig,
    /// rf history file (learned schedules). Default `$XDG_DATA_HOME/metfs/rf-history.json`
    /// (`~/.local/share/...`): it must outlive node-local caches to help later runs.
    pub history: PathBuf,
    /// Job key of the rf history when the client gives none. Default `default`.
    pub job: String,
    /// Composition strategy. Default `random`: recomposed each epoch, the least biased choice.
    pub compose: Strategy,
    /// Seed of every random choice. Default 0; every node of a job must use the same seed.
    pub seed: u64,
    /// Control socket. Default `CACHE/metfs.sock`.
    pub socket: PathBuf,
    /// Rank of this node. Default `SLURM_NODEID`, else 0.
    pub node_rank: u32,
    /// Nodes sharing the dataset. Default `SLURM_NNODES`, else 1.
    pub nodes: u32,
    /// Manifest to use instead of listing the source.
    pub manifest: Option<PathBuf>,
    /// Label samples by their first directory level (ImageFolder layout). Default: only when
    /// composition needs labels and the manifest has none.
    pub label_from_dirs: bool,
    /// Read path. Default `auto`: `cached` when samples average under 1 MiB and a slot fits in
    /// half of the node's memory, `passthrough` otherwise (see [`ReadPath`]).
    pub read_path: ReadPath,
    /// FUSE worker threads. Default 4: enough to keep several readers' lookups, opens and cache
    /// misses in flight on a small node; cached and passthrough reads bypass them anyway.
    pub fuse_threads: usize,
    /// Let users other than the mounting one read the mount. Default off.
    pub allow_other: bool,
    /// Staging bandwidth. Default unlimited.
    pub prefetch_rate: PrefetchRate,
    /// Backing files kept open for the pread path. Default 4096, well under the usual
    /// 1024-per-process soft limit raised by the daemon, and plenty for a training job's readers.
    pub max_open_files: u64,
    /// Passthrough backing ids kept. Default 1,048,576: one per file of a large mini-epoch, so
    /// ids live as long as their view (measured: per-open ids cost ~30% of small-file speed).
    pub max_backing_ids: u64,
    /// Stager settings.
    pub stager: StagerConfig,
    /// Control socket limits (`[control]`).
    pub control: crate::control::ControlConfig,
    /// Log file of a background daemon. Default `CACHE/metfs.log`.
    pub log_file: PathBuf,
    /// Run directory for `metfs report` (event log). Default `CACHE/run`; its files are
    /// capped and counted in the budget's reserve.
    pub run_dir: PathBuf,
    /// Cap for `prefetch_rate = auto`, in bytes per second. Default none: just-in-time pacing
    /// alone decides (and stages at full speed until the first pass has been timed).
    pub prefetch_rate_max: Option<u64>,
    /// Prometheus text-format file rewritten every few seconds (for node_exporter's textfile
    /// collector). Default none.
    pub metrics_file: Option<PathBuf>,
    /// S3 settings for `s3://` sources (the `[s3]` table; flags `--endpoint`, `--region`,
    /// `--allow-http`, `--virtual-hosted-style` override its keys; the `AWS_*` environment
    /// fills what neither sets). Defaults and reasons are documented on [`S3Config`].
    pub s3: S3Config,
    /// Per-sample HDF5 files: label each sample by this scalar dataset (or root attribute).
    pub label_hdf5: Option<String>,
    /// Container mode: samples are rows (axis 0) of the source's HDF5 files. Default off.
    pub hdf5_container: bool,
    /// Container mode: the row datasets. Default: every dataset whose first dimension is the
    /// row count.
    pub hdf5_datasets: Option<Vec<String>>,
    /// Container mode: 1-D dataset holding each row's class label (for stratified composition).
    pub label_dataset: Option<String>,
    /// Discard the saved position (`state.json`) and start over at epoch 0 (`--reset`).
    pub reset: bool,
}

fn env_u32(name: &str) -> Option<u32> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

impl MountConfig {
    /// Resolves `file` overlaid with `flags` (flags win) and defaults.
    pub fn resolve(file: FileConfig, flags: FileConfig) -> Result<Self, ConfigError> {
        macro_rules! pick {
            ($f:ident) => {
                flags.$f.clone().or(file.$f.clone())
            };
        }
        let source = pick!(source).ok_or(ConfigError::Missing("source", "source"))?;
        let cache = pick!(cache).ok_or(ConfigError::Missing("cache", "cache"))?;
        let cache = std::path::absolute(&cache).unwrap_or(cache);
        let budget = pick!(budget)
            .ok_or(ConfigError::Missing("budget", "budget"))?
            .bytes("budget")?;
        let nodes = pick!(nodes)
            .or_else(|| env_u32("SLURM_NNODES"))
            .unwrap_or(1);
        let node_rank = pick!(node_rank)
            .or_else(|| env_u32("SLURM_NODEID"))
            .unwrap_or(0);
        if nodes == 0 || node_rank >= nodes {
            return Err(ConfigError::Invalid {
                key: "node_rank",
                message: format!("node rank {node_rank} is not in 0..{nodes}"),
            });
        }
        let policy = resolve_policy(&file, &flags)?;
        if pick!(mini_epochs) == Some(0) {
            return Err(ConfigError::Invalid {
                key: "mini_epochs",
                message: "must be at least 1".into(),
            });
        }
        let prefetch_rate = match pick!(prefetch_rate).as_deref().map(str::trim) {
            None | Some("") | Some("unlimited") => PrefetchRate::Unlimited,
            Some("auto") => PrefetchRate::Auto,
            Some(r) => PrefetchRate::Fixed(parse_rate(r).map_err(|e| ConfigError::Invalid {
                key: "prefetch_rate",
                message: e.to_string(),
            })?),
        };
        let fuse_threads = pick!(fuse_threads).unwrap_or(4);
        if fuse_threads == 0 {
            return Err(ConfigError::Invalid {
                key: "fuse_threads",
                message: "must be at least 1".into(),
            });
        }
        let control = pick!(control).unwrap_or_default();
        if control.max_connections == 0 {
            return Err(ConfigError::Invalid {
                key: "control.max_connections",
                message: "must be at least 1".into(),
            });
        }
        if control.idle_timeout_secs == 0 {
            return Err(ConfigError::Invalid {
                key: "control.idle_timeout_secs",
                message: "must be at least 1".into(),
            });
        }
        let source = if source.contains("://") {
            source
        } else {
            std::path::absolute(&source)
                .map(|p| p.display().to_string())
                .unwrap_or(source)
        };
        let hdf5_container = pick!(hdf5_container).unwrap_or(false);
        let label_hdf5 = pick!(label_hdf5);
        if !prefetcher::hdf5::AVAILABLE {
            // Refused here, before anything is mounted or staged, naming the setting.
            let asked = if hdf5_container {
                Some("hdf5_container")
            } else if label_hdf5.is_some() {
                Some("label_hdf5")
            } else {
                None
            };
            if let Some(key) = asked {
                return Err(ConfigError::Invalid {
                    key,
                    message: "this metfs was built without the `hdf5` feature; rebuild it \
                              with the default features to use HDF5"
                        .into(),
                });
            }
        }
        let prefetch_rate_max = match pick!(prefetch_rate_max) {
            None => None,
            Some(r) => Some(parse_rate(&r).map_err(|e| ConfigError::Invalid {
                key: "prefetch_rate_max",
                message: e.to_string(),
            })?),
        };
        Ok(MountConfig {
            run_dir: pick!(run_dir).unwrap_or_else(|| cache.join("run")),
            prefetch_rate_max,
            metrics_file: pick!(metrics_file),
            label_hdf5,
            hdf5_container,
            hdf5_datasets: pick!(hdf5_datasets).map(|l| {
                l.joined()
                    .split(',')
                    .map(|x| x.trim().to_string())
                    .filter(|x| !x.is_empty())
                    .collect()
            }),
            label_dataset: pick!(label_dataset),
            s3: {
                let mut s3 = file.s3.clone().unwrap_or_default();
                if let Some(f) = &flags.s3 {
                    s3.endpoint = f.endpoint.clone().or(s3.endpoint);
                    s3.region = f.region.clone().or(s3.region);
                    s3.allow_http = f.allow_http.or(s3.allow_http);
                    s3.virtual_hosted_style = f.virtual_hosted_style.or(s3.virtual_hosted_style);
                }
                s3
            },
            socket: pick!(socket).unwrap_or_else(|| cache.join("metfs.sock")),
            log_file: pick!(log_file).unwrap_or_else(|| cache.join("metfs.log")),
            source,
            cache,
            budget,
            mini_epochs: pick!(mini_epochs),
            policy,
            history: pick!(history).unwrap_or_else(default_history),
            job: pick!(job).unwrap_or_else(|| "default".into()),
            compose: pick!(compose).unwrap_or_default(),
            seed: pick!(seed).unwrap_or(0),
            node_rank,
            nodes,
            manifest: pick!(manifest),
            label_from_dirs: pick!(label_from_dirs).unwrap_or(false),
            read_path: pick!(read_path).unwrap_or_default(),
            fuse_threads,
            allow_other: pick!(allow_other).unwrap_or(false),
            prefetch_rate,
            max_open_files: pick!(max_open_files).unwrap_or(4096),
            max_backing_ids: pick!(max_backing_ids).unwrap_or(1 << 20),
            stager: pick!(stager).unwrap_or_default(),
            control,
            reset: false,
        })
    }
}

fn default_history() -> PathBuf {
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("metfs").join("rf-history.json")
}

fn resolve_policy(file: &FileConfig, flags: &FileConfig) -> Result<PolicyConfig, ConfigError> {
    macro_rules! pick {
        ($f:ident) => {
            flags.$f.clone().or(file.$f.clone())
        };
    }
    let inv = |key: &'static str, e: &dyn std::fmt::Display| ConfigError::Invalid {
        key,
        message: e.to_string(),
    };
    let mut p = PolicyConfig::default();
    if let Some(k) = pick!(rf_policy) {
        p.kind = k.parse().map_err(|e| inv("rf_policy", &e))?;
    }
    if let Some(v) = pick!(rf) {
        p.rf = v;
    }
    if let Some(v) = pick!(rf_min) {
        p.rf_min = v;
    }
    if let Some(v) = pick!(rf_max) {
        p.rf_max = v;
    }
    if let Some(v) = pick!(score_metrics) {
        p.score_metrics = parse_metric_list(&v.joined()).map_err(|e| inv("score_metrics", &e))?;
    }
    if let Some(v) = pick!(score_weights) {
        p.score_weights = Some(match v {
            NumbersValue::Items(w) => w,
            NumbersValue::Text(t) => parse_weight_list(&t).map_err(|e| inv("score_weights", &e))?,
        });
    }
    if let Some(v) = pick!(score_wait) {
        p.score_wait = v;
    }
    if let Some(v) = pick!(best_scope) {
        p.best_scope = v.parse().map_err(|e| inv("best_scope", &e))?;
    }
    if let Some(v) = pick!(bollinger_window) {
        p.bollinger_window = v;
    }
    if let Some(v) = pick!(bollinger_k) {
        p.bollinger_k = v;
    }
    if let Some(v) = pick!(bollinger_scope) {
        p.bollinger_scope = v.parse().map_err(|e| inv("bollinger_scope", &e))?;
    }
    if let Some(v) = pick!(learned_fallback) {
        p.learned_fallback = v.parse().map_err(|e| inv("learned_fallback", &e))?;
    }
    // A fixed rf above the default cap raises the cap: asking for rf 256 means 256.
    if p.kind == feedback::config::PolicyKind::Fixed && pick!(rf_max).is_none() {
        p.rf_max = p.rf_max.max(p.rf);
    }
    p.validate().map_err(|e| inv("rf_policy", &e))?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn active_read_path_only_falls_back_to_pread() {
        for p in [ReadPath::Cached, ReadPath::Passthrough, ReadPath::Pread] {
            let a = ActiveReadPath::new(p);
            assert_eq!(a.get(), p);
            assert_eq!(a.fall_back(), p != ReadPath::Pread);
            assert_eq!(a.get(), ReadPath::Pread);
            assert!(!a.fall_back(), "a second fall-back changes nothing");
        }
    }

    #[test]
    fn auto_read_path_follows_memory_and_sample_size() {
        let gib = 1u64 << 30;
        let auto = ReadPath::Auto;
        assert_eq!(
            auto.resolve(4 * gib, 128 << 10, Some(16 * gib)),
            ReadPath::Cached
        );
        // Otherwise passthrough where the kernel allows it (CAP_SYS_ADMIN), else pread.
        let direct = if may_passthrough() {
            ReadPath::Passthrough
        } else {
            ReadPath::Pread
        };
        // A slot larger than half the memory: every pass reads the NVMe.
        assert_eq!(auto.resolve(9 * gib, 128 << 10, Some(16 * gib)), direct);
        // Large samples.
        assert_eq!(auto.resolve(4 * gib, 4 << 20, Some(16 * gib)), direct);
        // Unknown memory: the path that never doubles memory use.
        assert_eq!(auto.resolve(1, 1, None), direct);
        assert_eq!(
            ReadPath::Pread.resolve(1, 1, Some(16 * gib)),
            ReadPath::Pread
        );
    }

    #[test]
    fn flags_win_over_file() {
        let file: FileConfig = toml::from_str(
            "source = '/a'\ncache = '/c'\nbudget = '1GiB'\nrf = 8\ncompose = 'sequential'",
        )
        .unwrap();
        let flags = FileConfig {
            rf: Some(2),
            budget: Some(SizeValue::Bytes(1000)),
            ..Default::default()
        };
        let c = MountConfig::resolve(file, flags).unwrap();
        assert_eq!(c.policy.rf, 2);
        assert_eq!(c.budget, 1000);
        assert_eq!(c.compose, Strategy::Sequential);
        assert_eq!(c.socket, PathBuf::from("/c/metfs.sock"));
    }

    #[test]
    fn bad_config_names_the_key() {
        let err = toml::from_str::<FileConfig>("budgte = '1GiB'").unwrap_err();
        assert!(err.to_string().contains("budgte"), "{err}");
        let file = FileConfig {
            source: Some("/a".into()),
            cache: Some("/c".into()),
            budget: Some(SizeValue::Text("lots".into())),
            ..Default::default()
        };
        let err = MountConfig::resolve(file, FileConfig::default()).unwrap_err();
        assert!(err.to_string().contains("budget"), "{err}");
        let err = MountConfig::resolve(FileConfig::default(), FileConfig::default()).unwrap_err();
        assert!(err.to_string().contains("--source"), "{err}");
    }

    #[test]
    fn rates() {
        let base = || FileConfig {
            source: Some("/a".into()),
            cache: Some("/c".into()),
            budget: Some(SizeValue::Bytes(1 << 30)),
            ..Default::default()
        };
        let mut f = base();
        f.prefetch_rate = Some("auto".into());
        assert_eq!(
            MountConfig::resolve(f, FileConfig::default())
                .unwrap()
                .prefetch_rate,
            PrefetchRate::Auto
        );
        let mut f = base();
        f.prefetch_rate = Some("100MiB/s".into());
        assert_eq!(
            MountConfig::resolve(f, FileConfig::default())
                .unwrap()
                .prefetch_rate,
            PrefetchRate::Fixed(100 << 20)
        );
        let mut f = base();
        f.prefetch_rate = Some("fast".into());
        assert!(MountConfig::resolve(f, FileConfig::default()).is_err());
    }
}
