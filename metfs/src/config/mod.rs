//! Mount configuration: every setting is declared once, in [`MountSettings`] (flag, key, doc
//! and default together), and read from three layers: a TOML file (`--config`), the
//! environment (`METFS_<FLAG>`, e.g. `METFS_MINI_EPOCHS`), and flags, each overriding the one
//! before. [`Layers`] merges them (with `figment`) and remembers where each value came from,
//! so that an error names the setting and its origin (the file, the variable or the flag).
//! [`MountConfig`] is the resolved, validated form the daemon runs on.
//!
//! Unknown keys are errors naming the key, so a typo never silently falls back to a default.
//! Sizes accept `512MiB`, `20GiB` or plain bytes, as strings or integers; lists accept arrays
//! or one comma-separated string. A bool flag takes `=false` to turn off what a file turned on
//! (`--allow-other=false`). `metfs config --defaults` prints every key with its doc and
//! default ([`reference`](mod@reference)), and tests hold the README's settings table to the same
//! declaration.

pub mod aggregate;
mod check;
mod control;
mod layers;
mod mode;
pub mod reference;
mod resolve;
mod samples;
mod settings;
pub mod share;

use std::path::PathBuf;

use metfs_feedback::config::PolicyConfig;
use metfs_plan::planner::{ClusterCopies, Strategy};
use metfs_prefetcher::stager::StagerConfig;
use metfs_tier::s3::S3Config;
use thiserror::Error;

pub use control::ControlConfig;
pub use layers::{Layers, Origin};
pub use mode::{DdsMode, Mode};
pub use samples::{FormatChoice, SampleConfig};
// The read path lives with the FUSE adapter that serves it (crate `metfs-fs`).
pub use metfs_fs::read_path::{mem_total, ActiveReadPath, ReadPath, CACHED_MAX_MEAN_SAMPLE};
pub use settings::{setting_args, MountSettings, PrefetchRate, Rate, Size, REQUIRED};

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
    /// The config file is not valid TOML.
    #[error("config file {path}: {message}")]
    Parse { path: String, message: String },
    /// A key no setting has.
    #[error("{origin}: {within}unknown field `{key}`, expected {expected}")]
    Unknown {
        key: String,
        /// `[table]: ` for a key of a table.
        within: String,
        origin: Origin,
        expected: String,
    },
    /// A required setting is missing everywhere.
    #[error("missing `{key}`: give --{flag}, set METFS_{env} or set `{key}` in the config file")]
    Missing {
        key: &'static str,
        flag: String,
        env: String,
    },
    /// A setting has an invalid value.
    #[error("`{key}` ({origin}): {message}")]
    Invalid {
        key: String,
        origin: Origin,
        message: String,
    },
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
    /// `clustered`: how small clusters are copied. Default `per-node`, paper 000's rule: a
    /// copied sample is read `nodes` times an epoch, where `per-share` reads it `mini-epochs ×
    /// nodes` times and its copies took 92 to 99.9 % of an epoch's reads on skewed cluster
    /// sizes (docs/EXPERIMENTS.md).
    pub cluster_copies: ClusterCopies,
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
    /// Catalog file (`metfs catalog`) to mount from instead of listing the source. An empty
    /// path (`METFS_CATALOG=`) is none.
    pub catalog: Option<PathBuf>,
    /// Label samples by their first directory level (ImageFolder layout). Default: only when
    /// composition needs labels and the manifest has none.
    pub label_from_dirs: bool,
    /// What a sample is: the dataset's format, sample groups, files in every view, and which
    /// files are part of the dataset (see [`SampleConfig`] for each default).
    pub samples: SampleConfig,
    /// Read path. Default `auto`: `cached` when samples average under 1 MiB and a slot fits in
    /// half of the node's memory, `passthrough` otherwise (see [`ReadPath`]).
    pub read_path: ReadPath,
    /// FUSE worker threads. Default 4: enough to keep several readers' lookups, opens and cache
    /// misses in flight on a small node; cached and passthrough reads bypass them anyway.
    pub fuse_threads: usize,
    /// List each new view through the mount in the background after a switch and the mount,
    /// so that its files' first opens need no lookup round trip (`daemon::prime`). Default on:
    /// the first pass after a switch over 100,000 small files ran 1.34x faster; it costs the
    /// kernel's entries and inodes of the whole view at once instead of as the pass reaches
    /// them (the pass makes them all anyway).
    pub prime_entries: bool,
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
    /// Bytes the daemon may plan to hold for its catalog, plan and views. Default `None`: what
    /// the node has (MemAvailable, the cgroup's limit, the address-space limit), so a dataset
    /// too large for the node fails at mount with the number it needs, not in an allocation.
    pub memory_limit: Option<u64>,
    /// Stager settings.
    pub stager: StagerConfig,
    /// The transform run on each sample while it is staged (`[transform]`), checked: its
    /// program exists.
    pub transform: metfs_prefetcher::transform::TransformConfig,
    /// Control socket limits (`[control]`).
    pub control: ControlConfig,
    /// The mode (plain, `[dds]`, `[aggregate]` or `[share]`) with its settings: one, checked.
    pub mode: Mode,
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

impl MountConfig {
    /// Resolves the layered settings (checked against [`MountSettings`]) into the
    /// configuration a mount runs on: derived defaults filled in, every value validated, one
    /// mode chosen, an error naming the setting and where its value came from (`resolve`).
    pub fn resolve(layers: &Layers) -> Result<Self, ConfigError> {
        resolve::resolve(layers)
    }

    /// The configuration of a TOML text alone (no environment, no flags); `origin` names it in
    /// errors. For tests and tools that build a mount from a file.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, ConfigError> {
        Self::resolve(&Layers::new().toml(text, origin)?)
    }

    /// The composition as a saved position's fingerprint records it: the strategy's name, with
    /// `per-node` for `clustered` plans with that copy rule. Another copy rule is another plan,
    /// and `per-share` plans keep the text they had before the rule was a setting, so their
    /// saved positions still resume.
    pub fn compose_fingerprint(&self) -> String {
        match (self.compose, self.cluster_copies) {
            (Strategy::Clustered, ClusterCopies::PerNode) => format!("{:?}/per-node", self.compose),
            (compose, _) => format!("{compose:?}"),
        }
    }

    /// This configuration with a shared mount's job's own rf policy and rf (from its `hello`
    /// or its saved place), where it gives them.
    pub fn with_job_policy(
        &self,
        rf_policy: Option<metfs_feedback::config::PolicyKind>,
        rf: Option<u32>,
    ) -> MountConfig {
        let mut cfg = self.clone();
        if let Some(p) = rf_policy {
            cfg.policy.kind = p;
        }
        if let Some(rf) = rf {
            cfg.policy.rf = rf;
        }
        cfg
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches};

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        settings: MountSettings,
    }

    /// The layers of a file, an environment and a command line, as `metfs mount` builds them.
    fn layers(file: &str, env: &[(&str, &str)], args: &[&str]) -> Result<Layers, ConfigError> {
        let m = Cli::command()
            .no_binary_name(true)
            .try_get_matches_from(args)
            .unwrap();
        let cli = Cli::from_arg_matches(&m).unwrap();
        Layers::new()
            .toml(file, "/etc/metfs.toml")?
            .env(env.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .flags(&cli.settings, |id| {
                m.value_source(id) == Some(clap::parser::ValueSource::CommandLine)
            })
    }

    const BASE: &str = "source = '/a'\ncache = '/c'\nbudget = '1GiB'\n";

    fn resolve(file: &str, env: &[(&str, &str)], args: &[&str]) -> Result<MountConfig, String> {
        layers(&format!("{BASE}{file}"), env, args)
            .and_then(|l| MountConfig::resolve(&l))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn file_then_env_then_flags_per_setting() {
        let file = "rf = 8\ncompose = 'sequential'\nfuse_threads = 3\nseed = 1\n\
                    [stager]\nconcurrency = 5\nretry_secs = 9\n";
        let env = [
            ("METFS_RF", "6"),
            ("METFS_FUSE_THREADS", "5"),
            ("METFS_STAGER_CONCURRENCY", "7"),
            ("METFS_BUDGET", "2GiB"),
        ];
        let l = layers(
            &format!("{BASE}{file}"),
            &env,
            &["--rf", "2", "--budget", "1000"],
        )
        .unwrap();
        let c = MountConfig::resolve(&l).unwrap();
        // Flags over the environment over the file, each setting on its own.
        assert_eq!(c.policy.rf, 2);
        assert_eq!(c.budget, 1000);
        assert_eq!(c.fuse_threads, 5);
        assert_eq!(c.stager.concurrency, 7);
        assert_eq!(c.stager.retry_secs, 9);
        assert_eq!(c.compose, Strategy::Sequential);
        assert_eq!(c.seed, 1);
        // Untouched settings keep their declared defaults; derived ones follow the cache.
        assert_eq!(c.stager.timeout_secs, StagerConfig::default().timeout_secs);
        assert_eq!(c.read_path, ReadPath::Auto);
        assert_eq!(c.socket, PathBuf::from("/c/metfs.sock"));
        assert_eq!(l.origin("rf"), Origin::Flag("--rf".into()));
        assert_eq!(
            l.origin("fuse_threads"),
            Origin::Env("METFS_FUSE_THREADS".into())
        );
        assert_eq!(
            l.origin("stager.concurrency"),
            Origin::Env("METFS_STAGER_CONCURRENCY".into())
        );
        assert_eq!(l.origin("compose"), Origin::File("/etc/metfs.toml".into()));
        assert_eq!(l.origin("max_open_files"), Origin::Default);
        // A flag left at its default overrides nothing.
        let c = resolve("fuse_threads = 3\n", &[], &["--rf", "2"]).unwrap();
        assert_eq!(c.fuse_threads, 3);
    }

    #[test]
    fn a_bool_the_file_turns_on_is_turned_off_by_a_flag_or_the_environment() {
        let on = "allow_other = true\nlabel_from_dirs = true\n[stager]\nfsync = false\n";
        let c = resolve(on, &[], &[]).unwrap();
        assert!(c.allow_other && c.label_from_dirs && !c.stager.fsync);
        let c = resolve(
            on,
            &[],
            &[
                "--allow-other=false",
                "--label-from-dirs=false",
                "--stager-fsync",
            ],
        )
        .unwrap();
        assert!(!c.allow_other && !c.label_from_dirs && c.stager.fsync);
        let c = resolve(on, &[("METFS_ALLOW_OTHER", "false")], &[]).unwrap();
        assert!(!c.allow_other);
        // A bare switch still turns on, also right before a positional argument.
        let c = resolve("", &[], &["--allow-other", "--hdf5-container=false"]).unwrap();
        assert!(c.allow_other && !c.hdf5_container);
        let err = Cli::command()
            .no_binary_name(true)
            .try_get_matches_from(["--allow-other=maybe"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("--allow-other"), "{err}");
    }

    #[test]
    fn unknown_keys_are_refused_with_their_name_and_file() {
        let err = layers("budgte = '1GiB'\n", &[], &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `budgte`"), "{err}");
        assert!(err.contains("/etc/metfs.toml"), "{err}");
        assert!(
            err.contains("`budget`") && err.contains("`rf_policy`"),
            "{err}"
        );
        let err = resolve("[stager]\nconcurency = 4\n", &[], &[]).unwrap_err();
        assert!(
            err.contains("[stager]: unknown field `concurency`"),
            "{err}"
        );
        assert!(
            err.contains("`concurrency`") && err.contains("/etc/metfs.toml"),
            "{err}"
        );
        let err = resolve("[s3.retry]\nmax_retrys = 4\n", &[], &[]).unwrap_err();
        assert!(err.contains("unknown field `max_retrys`"), "{err}");
        // The environment holds variables of other tools (and metfs's own client settings):
        // only those naming a setting are read. METFS_SOCKET names a daemon to clients; it
        // never moves a mount's socket onto another daemon's.
        let c = resolve(
            "",
            &[
                ("METFS_BIN", "/x"),
                ("METFS_MOUNTPOINT", "/m"),
                ("METFS_SOCKET", "/c/other.sock"),
            ],
            &[],
        )
        .unwrap();
        assert_eq!(c.socket, PathBuf::from("/c/metfs.sock"));
    }

    #[test]
    fn bad_values_name_the_setting_and_where_it_came_from() {
        for (file, env, args, needles) in [
            (
                "fuse_threads = 0\n",
                vec![],
                vec![],
                vec!["`fuse_threads`", "config file /etc/metfs.toml"],
            ),
            (
                "",
                vec![("METFS_FUSE_THREADS", "0")],
                vec![],
                vec!["`fuse_threads`", "METFS_FUSE_THREADS"],
            ),
            (
                "",
                vec![],
                vec!["--fuse-threads", "0"],
                vec!["`fuse_threads`", "--fuse-threads"],
            ),
            (
                "budget = 'lots'\n",
                vec![],
                vec![],
                vec!["`budget`", "config file"],
            ),
            (
                "",
                vec![("METFS_RF", "four")],
                vec![],
                vec!["`rf`", "METFS_RF"],
            ),
            (
                "rf = 300\nrf_max = 200\n",
                vec![],
                vec![],
                vec!["`rf`", "config file"],
            ),
            (
                "",
                vec![],
                vec!["--rf-min", "0"],
                vec!["`rf_min`", "--rf-min"],
            ),
            (
                "[control]\nmax_connections = 0\n",
                vec![],
                vec![],
                vec!["`control.max_connections`"],
            ),
            (
                "prefetch_rate = 'fast'\n",
                vec![],
                vec![],
                vec!["`prefetch_rate`", "config file"],
            ),
            (
                "bollinger_side = 'sideways'\n",
                vec![],
                vec![],
                vec![
                    "`bollinger_side`",
                    "config file",
                    "`below`, `either`, `above`",
                ],
            ),
            (
                "",
                vec![("METFS_BOLLINGER_SIDE", "up")],
                vec![],
                vec!["`bollinger_side`", "METFS_BOLLINGER_SIDE"],
            ),
            (
                "score_metrics = ['1 - ']\n",
                vec![],
                vec![],
                vec!["`score_metrics`"],
            ),
            (
                "",
                vec![],
                vec!["--nodes", "0"],
                vec!["`nodes`", "--nodes", "at least 1 node"],
            ),
            (
                "",
                vec![],
                vec!["--share-jobs", "257"],
                vec![
                    "`share.jobs`",
                    "--share-jobs",
                    "257 must be between 1 and 256",
                ],
            ),
            (
                "[share]\njobs = 0\n",
                vec![],
                vec![],
                vec!["`share.jobs`", "config file", "0 must be between 1 and 256"],
            ),
        ] {
            let err = resolve(file, &env, &args).unwrap_err();
            for n in needles {
                assert!(err.contains(n), "{file:?} {env:?} {args:?}: {err}");
            }
        }
        let err = MountConfig::resolve(&Layers::new())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`source`") && err.contains("--source"),
            "{err}"
        );
        assert!(err.contains("METFS_SOURCE"), "{err}");
    }

    #[test]
    fn a_catalog_file_replaces_the_listing_alone() {
        let c = resolve("catalog = '/shared/d.cat'\n", &[], &[]).unwrap();
        assert_eq!(c.catalog, Some(PathBuf::from("/shared/d.cat")));
        // `METFS_CATALOG=` (a job script's way to turn it off) is no catalog.
        assert_eq!(
            resolve("", &[("METFS_CATALOG", "")], &[]).unwrap().catalog,
            None
        );
        let e = resolve("manifest = '/m.csv'\n", &[], &["--catalog", "/c"]).unwrap_err();
        assert!(e.contains("`catalog`") && e.contains("manifest"), "{e}");
    }

    #[test]
    fn values_read_from_every_layer_in_every_spelling() {
        let c = resolve(
            "rf_policy = 'score'\nscore_metrics = 'loss, 1 - accuracy'\nhdf5_datasets = ['x']\n\
             prefetch_rate = 'auto'\nprefetch_rate_max = '1GiB/s'\n",
            &[("METFS_SCORE_WEIGHTS", "1,0.5"), ("METFS_SCORE_WAIT", "5")],
            &["--hdf5-datasets", "a, b", "--label-dataset", "123"],
        )
        .unwrap();
        assert_eq!(c.policy.kind, metfs_feedback::config::PolicyKind::Score);
        assert_eq!(c.policy.score_metrics.len(), 2);
        assert_eq!(c.policy.score_weights, Some(vec![1.0, 0.5]));
        assert_eq!(c.policy.score_wait, 5);
        assert_eq!(
            c.hdf5_datasets,
            Some(vec!["a".to_string(), "b".to_string()])
        );
        assert_eq!(c.label_dataset.as_deref(), Some("123"));
        assert_eq!(c.prefetch_rate, PrefetchRate::Auto);
        assert_eq!(c.prefetch_rate_max, Some(1 << 30));
        // The policy's key is also accepted as `kind`; a number-like string stays a string.
        let c = resolve("kind = 'bollinger'\n", &[("METFS_JOB", "123")], &[]).unwrap();
        assert_eq!(c.policy.kind, metfs_feedback::config::PolicyKind::Bollinger);
        assert_eq!(c.job, "123");
        let c = MountConfig::from_toml(
            "source = '/a'\ncache = '/c'\nbudget = 4096\nprefetch_rate = '100MiB/s'\n",
            "f",
        )
        .unwrap();
        assert_eq!(c.prefetch_rate, PrefetchRate::Fixed(100 << 20));
        assert_eq!(c.budget, 4096);
        // [s3] keys from the file and its flags.
        let c = resolve(
            "[s3]\nregion = 'garage'\npart_size = '1MiB'\n",
            &[("METFS_ENDPOINT", "http://127.0.0.1:3900")],
            &["--allow-http"],
        )
        .unwrap();
        assert_eq!(c.s3.region.as_deref(), Some("garage"));
        assert_eq!(c.s3.endpoint.as_deref(), Some("http://127.0.0.1:3900"));
        assert_eq!((c.s3.allow_http, c.s3.part_size), (Some(true), 1 << 20));
    }

    #[test]
    fn share_jobs_go_up_to_what_one_sampler_holds() {
        let c = resolve("", &[], &["--share", "--share-jobs", "256"]).unwrap();
        assert_eq!(
            c.mode.shared().map(|s| s.jobs as usize),
            Some(metfs_plan::planner::MAX_JOBS)
        );
    }

    #[test]
    fn a_mount_runs_one_mode() {
        assert_eq!(resolve("", &[], &[]).unwrap().mode, Mode::Plain);
        let shared = resolve("", &[], &["--share"]).unwrap().mode;
        assert!(matches!(shared, Mode::Shared(_)), "{shared:?}");
        let aggregate = resolve("", &[], &["--aggregate"]).unwrap().mode;
        assert!(matches!(aggregate, Mode::Aggregate(_)), "{aggregate:?}");
        let dds = resolve("[dds]\nurl = 'etcd://h:2379/p'\n", &[], &[])
            .unwrap()
            .mode;
        assert!(dds.dds().is_some(), "{dds:?}");
        let e = resolve("", &[], &["--share", "--aggregate"]).unwrap_err();
        assert!(
            e.contains("`aggregate.enabled`") && e.contains("shared mount"),
            "{e}"
        );
        let e = resolve("[dds]\nurl = 'etcd://h:2379/p'\n", &[], &["--share"]).unwrap_err();
        assert!(
            e.contains("`share.enabled`") && e.contains("dynamic sharding"),
            "{e}"
        );
        // A mode's table is checked even when the mode is off.
        let e = resolve("[aggregate]\nextra = 2.0\n", &[], &[]).unwrap_err();
        assert!(e.contains("`aggregate.extra`"), "{e}");
    }

    #[test]
    fn a_fixed_rf_raises_the_default_cap_only() {
        assert_eq!(
            resolve("", &[], &["--rf", "256"]).unwrap().policy.rf_max,
            256
        );
        let err = resolve("rf_max = 100\n", &[], &["--rf", "256"]).unwrap_err();
        assert!(err.contains("`rf`") && err.contains("--rf"), "{err}");
    }
}
