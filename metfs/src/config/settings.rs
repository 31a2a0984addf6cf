//! [`MountSettings`]: every setting of a mount, declared once.
//!
//! Each field is at the same time a flag of `metfs mount` (clap), a key of the config file and
//! an environment variable (serde, layered by [`super::Layers`]): `--mini-epochs` is the key
//! `mini_epochs` and `METFS_MINI_EPOCHS`. The field's doc comment is its `--help` text, and its
//! default is written once, in its `#[arg]` attribute or, for the nested sections, in their
//! `Default` impls (the policy in `metfs-feedback`, the stager's in `metfs-prefetcher`, S3's in `metfs-tier`, the
//! control socket's in [`super::control`]); the flags show it, and [`MountSettings::default`]
//! is read back from the flags so that the file and the command line cannot disagree. A
//! default that depends on other settings or on the node (`socket` under `cache`, the rank from
//! Slurm) is an `Option` resolved by [`super::MountConfig`], and its doc says
//! `[default: ...]`.
//!
//! Nested sections keep their keys: the stager's are the `[stager]` table and `--stager-*`
//! flags, the transform's `[transform]` and `--transform`, `--transform-*` (`command` is
//! `--transform`), the control socket's `[control]` and `--control-*`, the S3 flags keys of `[s3]`; the
//! rf policy's keys are top-level (`rf`, `rf_policy`, ...), as they always were. Each flag's
//! clap id is its key's dotted path, which is how the layers find a flag's key.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use clap::{ArgAction, Args, CommandFactory, FromArgMatches};
use metfs_feedback::config::PolicyConfig;
use metfs_plan::planner::{ClusterCopies, Strategy};
use metfs_plan::size::{parse_rate, parse_size};
use metfs_prefetcher::stager::StagerConfig;
use metfs_tier::s3::S3Config;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::control::ControlConfig;
use super::ReadPath;

/// Every setting of a mount (see the module doc). Settings without a default are `None` until
/// given; [`super::MountConfig`] checks them and fills in the derived defaults.
#[derive(Debug, Clone, PartialEq, Args, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MountSettings {
    /// Capacity tier: a directory (Lustre, GPFS, NFS, local) or s3://bucket/prefix. Required.
    #[arg(long)]
    pub source: Option<String>,
    /// Cache directory on node-local storage (must exist). metfs owns everything in it.
    /// Required.
    #[arg(long)]
    pub cache: Option<PathBuf>,
    /// Most bytes metfs may keep in the cache directory (slots, temporary files, catalog,
    /// journals, state, log): 512MiB, 20GiB, or bytes. Required.
    #[arg(long)]
    pub budget: Option<Size>,
    /// Mini-epochs per epoch [default: the smallest whose every mini-epoch fits in budget/2].
    #[arg(long)]
    pub mini_epochs: Option<u32>,
    /// How mini-epochs are composed: sequential, random, stratified or clustered; recomposed
    /// each epoch from (seed, epoch). `random` is the least biased choice.
    #[arg(long, default_value_t)]
    pub compose: Strategy,
    /// With compose = clustered, how clusters too small to spread are copied: per-node (paper
    /// 000: a cluster with fewer samples than nodes goes whole to every node, into one of its
    /// mini-epochs) or per-share (a cluster with fewer samples than mini-epochs × nodes goes
    /// into every mini-epoch of every node). per-node, because its copies are read nodes times
    /// an epoch and per-share's mini-epochs × nodes times: on skewed cluster sizes per-share's
    /// copies took 92 to 99.9 % of an epoch's reads, per-node's 0 to 22 % (docs/EXPERIMENTS.md).
    #[arg(long, default_value_t)]
    pub cluster_copies: ClusterCopies,
    /// Seed of every random choice; every node of a job must use the same seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Control socket (mode 0600) [default: CACHE/metfs.sock].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// This node's rank [default: $SLURM_NODEID or 0].
    #[arg(long)]
    pub node_rank: Option<u32>,
    /// Number of nodes sharing the dataset [default: $SLURM_NNODES or 1].
    #[arg(long)]
    pub nodes: Option<u32>,
    /// Manifest (CSV or JSON lines: path, size[, label, cluster, etag|mtime]) to use instead of
    /// listing the source [default: (none)].
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// Catalog file to mount from instead of listing the source: written once per dataset
    /// version by `metfs catalog` (on a shared file system, for every node of a job). Its
    /// source must be this mount's; each sample's size and version are still checked when it
    /// is staged [default: (none)].
    #[arg(long)]
    pub catalog: Option<PathBuf>,
    /// Label samples by their first directory level (ImageFolder layout); labels are also
    /// taken that way when composition needs them and the manifest has none.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", default_value_t = false)]
    pub label_from_dirs: bool,
    /// The dataset's format: auto (detected at mount), files (every file a sample), or
    /// hf-dataset, hf-dataset-dict, mds, litdata, webdataset, tfrecord: the view is then a
    /// directory the format's own loader opens, its index rewritten to the view's shards
    /// (docs/FORMATS.md).
    #[arg(long, default_value_t)]
    pub format: super::FormatChoice,
    /// Files that make one sample, staged and shown together: `stem` (one directory's files
    /// with one name up to the first `.`) or a template of parallel trees such as
    /// `images/{}.png,masks/{}.png` (a sample missing a file is left out and reported)
    /// [default: (none): each file is a sample].
    #[arg(long)]
    pub group_by: Option<String>,
    /// Glob of files shown in every view (a class list, an annotation file), staged once and
    /// never dealt; repeat or separate with commas. A pattern without `/` matches a file name
    /// anywhere [default: (none)].
    #[arg(long, value_delimiter = ',')]
    #[serde(deserialize_with = "de_names")]
    pub always: Option<Vec<String>>,
    /// Glob of the files that are part of the dataset; repeat or separate with commas
    /// [default: (none): every file].
    #[arg(long, value_delimiter = ',')]
    #[serde(deserialize_with = "de_names")]
    pub include: Option<Vec<String>>,
    /// Glob of files that are not part of the dataset (`.DS_Store`, `*.md5`), even where
    /// include matches; repeat or separate with commas [default: (none)].
    #[arg(long, value_delimiter = ',')]
    #[serde(deserialize_with = "de_names")]
    pub exclude: Option<Vec<String>>,
    /// Per-sample HDF5 files: label each by this scalar dataset or root attribute
    /// [default: (none)].
    #[arg(long)]
    pub label_hdf5: Option<String>,
    /// HDF5 container mode: samples are rows (axis 0) of the source's HDF5 files.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", default_value_t = false)]
    pub hdf5_container: bool,
    /// Container mode: the row datasets, comma-separated [default: all of the row count].
    #[arg(long, value_delimiter = ',')]
    #[serde(deserialize_with = "de_names")]
    pub hdf5_datasets: Option<Vec<String>>,
    /// Container mode: 1-D dataset with each row's label (for stratified composition)
    /// [default: (none)].
    #[arg(long)]
    pub label_dataset: Option<String>,
    /// Read path: cached (kernel page cache, no per-open round trip), passthrough (kernel reads
    /// the slot file; needs CAP_SYS_ADMIN), pread (through the daemon), or auto (cached when
    /// samples average under 1 MiB and a slot fits in half of the node's memory, else
    /// passthrough, or pread without CAP_SYS_ADMIN).
    #[arg(long, value_enum, default_value_t)]
    pub read_path: ReadPath,
    /// FUSE worker threads: enough to keep several readers' lookups, opens and cache misses in
    /// flight on a small node; cached and passthrough reads bypass them anyway.
    #[arg(long, default_value_t = 4)]
    pub fuse_threads: usize,
    /// After each switch (and the mount), list the new view through the mount in the
    /// background, so that the kernel holds an entry for each of its files before a reader
    /// opens them: a listing costs the kernel microseconds per entry, a lookup a round trip to
    /// the daemon per file. Off: the kernel learns each file at its first open.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", default_value_t = true)]
    pub prime_entries: bool,
    /// Let other users read the mount; the source's modes and owners are enforced
    /// (default_permissions).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", default_value_t = false)]
    pub allow_other: bool,
    /// Staging bandwidth: a cap such as 200MiB/s, `auto` for just-in-time pacing (staging
    /// finishes just before the current mini-epoch ends), or `unlimited`.
    #[arg(long, default_value_t)]
    pub prefetch_rate: PrefetchRate,
    /// Cap for prefetch_rate = auto, e.g. 1GiB/s; without it, pacing alone decides and stages
    /// at full speed until the first pass has been timed [default: (none)].
    #[arg(long)]
    pub prefetch_rate_max: Option<Rate>,
    /// Backing files kept open for the pread path: well under the descriptor limit the daemon
    /// raises, and plenty for a training job's readers.
    #[arg(long, default_value_t = 4096)]
    pub max_open_files: u64,
    /// Memory the daemon may plan for its catalog, plan and views (about 300 B per file plus
    /// its path), e.g. 4GiB; a dataset that needs more is refused at mount with the number it
    /// needs. Without it, what the node has: the least of MemAvailable, the cgroup's limit
    /// and the address-space limit [default: (what the node has)].
    #[arg(long)]
    pub memory_limit: Option<Size>,
    /// Passthrough backing ids kept: one per file of a large mini-epoch, so that ids live as
    /// long as their view (per-open ids cost ~30% of small-file speed).
    #[arg(long, default_value_t = 1 << 20)]
    pub max_backing_ids: u64,
    /// rf history file; it must outlive node-local caches to help later runs
    /// [default: ~/.local/share/metfs/rf-history.json].
    #[arg(long)]
    pub history: Option<PathBuf>,
    /// Job key of the rf history when the client gives none.
    #[arg(long, default_value = "default")]
    pub job: String,
    /// Run directory with the event log for `metfs report`; its files are capped and counted
    /// in the budget [default: CACHE/run].
    #[arg(long)]
    pub run_dir: Option<PathBuf>,
    /// Prometheus text-format file rewritten every 5 s (node_exporter textfile collector)
    /// [default: (none)].
    #[arg(long)]
    pub metrics_file: Option<PathBuf>,
    /// Log file of the background daemon [default: CACHE/metfs.log].
    #[arg(long)]
    pub log_file: Option<PathBuf>,
    /// The rf policy and its knobs (top-level keys).
    #[command(flatten)]
    pub policy: PolicyConfig,
    /// `[stager]`.
    #[command(flatten)]
    pub stager: StagerConfig,
    /// `[transform]`: preprocessed mini-epochs.
    #[command(flatten)]
    pub transform: metfs_prefetcher::transform::TransformConfig,
    /// `[control]`.
    #[command(flatten)]
    pub control: ControlConfig,
    /// `[s3]`.
    #[command(flatten)]
    pub s3: S3Config,
    /// `[dds]`: dynamic sharding on an etcd queue.
    #[command(flatten)]
    pub dds: metfs_dds::DdsConfig,
    /// `[share]`: several jobs on one store.
    #[command(flatten)]
    pub share: super::share::ShareConfig,
    /// `[aggregate]`: the nodes hold the dataset together (aggregate-cache mode).
    #[command(flatten)]
    pub aggregate: super::aggregate::AggregateConfig,
}

/// The settings whose absence stops a mount (there is no sensible default).
pub const REQUIRED: [&str; 3] = ["source", "cache", "budget"];

/// Internal table of the policy's settings: they are top-level keys in a file, in the
/// environment and on the command line, but a nested struct here (no `serde(flatten)`, which
/// would lose the typed reading of environment strings and the names of unknown keys).
pub(super) const POLICY_TABLE: &str = "policy";

#[derive(clap::Parser)]
struct Only {
    #[command(flatten)]
    settings: MountSettings,
}

impl Default for MountSettings {
    /// The defaults the flags declare (and show in `--help`).
    fn default() -> Self {
        let m = Only::command()
            .no_binary_name(true)
            .get_matches_from(std::iter::empty::<&str>());
        Self::from_arg_matches(&m).expect("the defaults parse")
    }
}

/// Every setting's flag, in declaration order (ids are dotted key paths).
pub fn setting_args() -> Vec<clap::Arg> {
    Only::command().get_arguments().cloned().collect()
}

/// The ids of the policy's flags (top-level keys that live in [`POLICY_TABLE`]).
pub(super) fn policy_ids() -> Vec<String> {
    PolicyConfig::augment_args(clap::Command::new("policy"))
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .collect()
}

/// A size in bytes, written `512MiB`, `20GiB` or as plain bytes (a number or a string).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

impl FromStr for Size {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_size(s).map(Size).map_err(|e| e.to_string())
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl Serialize for Size {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a size: bytes, or a string such as \"512MiB\"")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Size, E> {
                Ok(Size(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Size, E> {
                u64::try_from(v)
                    .map(Size)
                    .map_err(|_| E::custom(format!("{v} is not a size")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Size, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// A bandwidth in bytes per second, written `200MiB/s` (or a number of bytes per second).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate(pub u64);

impl FromStr for Rate {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_rate(s).map(Rate).map_err(|e| e.to_string())
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/s", self.0)
    }
}

impl Serialize for Rate {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// Staging bandwidth setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PrefetchRate {
    /// No cap.
    #[default]
    Unlimited,
    /// A fixed cap in bytes per second.
    Fixed(u64),
    /// Just-in-time pacing from the measured pass duration (capped by `prefetch_rate_max`).
    Auto,
}

impl FromStr for PrefetchRate {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "" | "unlimited" => Ok(PrefetchRate::Unlimited),
            "auto" => Ok(PrefetchRate::Auto),
            r => parse_rate(r)
                .map(PrefetchRate::Fixed)
                .map_err(|e| format!("{e}; or `auto`, or `unlimited`")),
        }
    }
}

impl fmt::Display for PrefetchRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PrefetchRate::Unlimited => f.write_str("unlimited"),
            PrefetchRate::Auto => f.write_str("auto"),
            PrefetchRate::Fixed(r) => write!(f, "{}", Rate(*r)),
        }
    }
}

impl Serialize for PrefetchRate {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PrefetchRate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// Names given as a TOML array or as one comma-separated string.
fn de_names<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Names {
        Items(Vec<String>),
        Text(String),
    }
    Ok(Option::<Names>::deserialize(d)?.map(|n| match n {
        Names::Items(v) => v,
        Names::Text(t) => t.split(',').map(str::to_string).collect(),
    }))
}
