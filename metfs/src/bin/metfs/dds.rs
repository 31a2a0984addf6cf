//! `metfs dds`: inspect and manage a dynamic-sharding queue in etcd.
//!
//! `metfs dds init` makes the queue a mount with `--dds` would make: it takes the mount's
//! sample settings (`--format`, `--group-by`, `--always`, `--include`, `--exclude`, and a
//! manifest's group column), resolves them by the mount's checks and applies them by the
//! mount's steps (`metfs::daemon::samples`), so its shards are of the same samples, and the
//! queue records the settings a mount must have.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use metfs::config::{FormatChoice, MountSettings, SampleConfig};
use metfs::daemon::samples::{apply, dealt_slot_bytes, queue_samples, Applied, SampleSource};
use metfs_dds::OwnedSamples;
use metfs_plan::planner::Strategy;
use std::path::PathBuf;
use std::time::Duration;

use crate::plan::{plan_catalog, FootprintArgs};

#[derive(Subcommand)]
pub(super) enum DdsCmd {
    /// Show a queue: what it was made for, each epoch's TODO / DOING / DONE shards, and each
    /// node's share of the samples claimed so far and its throughput.
    Status {
        /// The queue: etcd://HOST:PORT[,HOST:PORT...]/PREFIX (etcds:// for TLS).
        url: String,
        #[command(flatten)]
        etcd: EtcdArgs,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Make a queue for a dataset before any node mounts (a mount with --dds makes it
    /// otherwise); an existing queue of the same dataset and seed is kept, another refused.
    Init(Box<DdsInitArgs>),
    /// Delete a queue and all its state (refused while nodes hold leases on it, unless --force).
    Reset {
        /// The queue: etcd://HOST:PORT[,HOST:PORT...]/PREFIX (etcds:// for TLS).
        url: String,
        #[command(flatten)]
        etcd: EtcdArgs,
        /// Delete even while nodes are working on it.
        #[arg(long)]
        force: bool,
    },
}

/// How to reach etcd: the flags and environment variables `etcdctl` uses.
#[derive(Args, Clone, Default)]
pub(super) struct EtcdArgs {
    /// CA bundle of the etcd servers' certificates (turns TLS on).
    #[arg(long, env = "ETCDCTL_CACERT")]
    etcd_cacert: Option<PathBuf>,
    /// Client certificate for mutual TLS.
    #[arg(long, env = "ETCDCTL_CERT")]
    etcd_cert: Option<PathBuf>,
    /// Private key of the client certificate.
    #[arg(long, env = "ETCDCTL_KEY")]
    etcd_key: Option<PathBuf>,
    /// etcd user, NAME or NAME:PASSWORD.
    #[arg(long, env = "ETCDCTL_USER")]
    etcd_user: Option<String>,
    /// Password of --etcd-user (better given by the environment than on the command line).
    #[arg(long, env = "ETCDCTL_PASSWORD", hide_env_values = true)]
    etcd_password: Option<String>,
    /// Seconds before a request to etcd fails.
    #[arg(long, default_value_t = 5)]
    etcd_timeout: u64,
}

impl EtcdArgs {
    fn options(&self) -> metfs_dds::EtcdOptions {
        metfs_dds::EtcdOptions {
            cacert: self.etcd_cacert.clone(),
            cert: self.etcd_cert.clone(),
            key: self.etcd_key.clone(),
            user: self.etcd_user.clone(),
            password: self.etcd_password.clone(),
            timeout: Duration::from_secs(self.etcd_timeout.max(1)),
        }
    }
}

#[derive(Args)]
pub(super) struct DdsInitArgs {
    /// The queue: etcd://HOST:PORT[,HOST:PORT...]/PREFIX (etcds:// for TLS).
    url: String,
    #[command(flatten)]
    etcd: EtcdArgs,
    /// Manifest of the dataset (instead of listing --source; with --source too, a format's
    /// index files are read from it).
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// Source directory of the dataset.
    #[arg(long)]
    source: Option<PathBuf>,
    /// As `metfs mount --format`: auto, files, or the format's name.
    #[arg(long, default_value_t)]
    format: FormatChoice,
    /// As `metfs mount --group-by`: `stem`, or a template such as
    /// `images/{}.png,masks/{}.png`; the queue deals these samples [default: (none)].
    #[arg(long)]
    group_by: Option<String>,
    /// As `metfs mount --always` [default: (none)].
    #[arg(long, value_delimiter = ',')]
    always: Option<Vec<String>>,
    /// As `metfs mount --include` [default: (none)].
    #[arg(long, value_delimiter = ',')]
    include: Option<Vec<String>>,
    /// As `metfs mount --exclude` [default: (none)].
    #[arg(long, value_delimiter = ',')]
    exclude: Option<Vec<String>>,
    /// Budget of each node's cache (sizes the shards): 512MiB, 20GiB, or bytes.
    #[arg(long)]
    budget: String,
    /// Composition of the shards.
    #[arg(long, alias = "strategy", default_value_t)]
    compose: Strategy,
    /// Seed of the composition.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Shards per slot: more gives finer load balancing, at more etcd round trips.
    #[arg(long, default_value_t = metfs_dds::dataset::SHARDS_PER_SLOT)]
    shards_per_slot: u32,
    /// Label samples by their first directory level.
    #[arg(long)]
    label_from_dirs: bool,
    #[command(flatten)]
    footprint: FootprintArgs,
}

impl DdsInitArgs {
    /// The sample settings, resolved by the mount's checks (a transform refused beside them,
    /// as at mount).
    fn sample_config(&self) -> Result<SampleConfig> {
        let parsed = MountSettings {
            format: self.format,
            group_by: self.group_by.clone(),
            always: self.always.clone(),
            include: self.include.clone(),
            exclude: self.exclude.clone(),
            transform: metfs_prefetcher::transform::TransformConfig {
                command: self.footprint.transform().map(str::to_string),
                ..Default::default()
            },
            ..MountSettings::default()
        };
        let given = |id: &str| match id {
            "format" => self.format != FormatChoice::Auto,
            "group_by" => self.group_by.is_some(),
            "always" => self.always.is_some(),
            "include" => self.include.is_some(),
            "exclude" => self.exclude.is_some(),
            "transform.command" => self.footprint.transform().is_some(),
            _ => false,
        };
        Ok(SampleConfig::from_flags(&parsed, given)?)
    }
}

/// The record `metfs dds init` makes a queue with (see [`init_dataset`]).
fn init_meta(a: &DdsInitArgs) -> Result<metfs_dds::QueueMeta> {
    Ok(init_dataset(a)?.0)
}

/// The record `metfs dds init` makes a queue with: shards of the samples a mount of the same
/// settings deals (each file, or each group of files), cut from their footprints under the
/// mount's transform, as a mount with `--dds` cuts them; with the samples and the dataset.
fn init_dataset(a: &DdsInitArgs) -> Result<(metfs_dds::QueueMeta, OwnedSamples, Applied)> {
    use metfs_dds::dataset;
    let budget = metfs_plan::size::parse_size(&a.budget).context("--budget")?;
    let settings = a.sample_config()?;
    let listed = if a.manifest.is_some() {
        None
    } else {
        a.source.as_deref()
    };
    let (cat, b) = plan_catalog(
        a.manifest.as_deref(),
        listed,
        a.compose,
        a.label_from_dirs,
        budget,
    )?;
    let source = a
        .source
        .as_deref()
        .or(a.manifest.as_deref())
        .map_or(String::new(), |p| p.display().to_string());
    let on = SampleSource {
        settings: &settings,
        manifest: a.manifest.as_deref(),
        source: &source,
    };
    let tier = match &a.source {
        Some(src) => Some(metfs_tier::PosixTier::new(src)?),
        None => None,
    };
    let tmp = PrivateTmp::new()?;
    let staged = a.footprint.staged()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let tier_ref = tier.as_ref().map(|t| t as &dyn metfs_tier::CapacityTier);
    let applied = rt.block_on(apply(&on, cat, tier_ref, &tmp.0, staged))?;
    let samples = applied.samples.as_ref();
    let dealt = dealt_slot_bytes(samples, &applied.catalog, budget, b.slot_bytes)?;
    let (owned, record) = queue_samples(&settings, &applied.catalog, &applied.footprints, samples);
    let meta = dataset::queue_meta(
        &applied.catalog,
        &owned,
        record,
        a.compose,
        a.seed,
        dealt,
        a.shards_per_slot,
    )?;
    Ok((meta, owned, applied))
}

/// A private temporary directory for the index files format detection reads, removed on drop.
struct PrivateTmp(PathBuf);

impl PrivateTmp {
    fn new() -> Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = std::env::temp_dir().join(format!("metfs-dds-init.{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .with_context(|| format!("temporary directory {}", dir.display()))?;
        Ok(Self(dir))
    }
}

impl Drop for PrivateTmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(super) fn dds_cmd(cmd: DdsCmd) -> Result<()> {
    use metfs_dds::{DdsUrl, Queue};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match cmd {
        DdsCmd::Status { url, etcd, json } => {
            let url = DdsUrl::parse(&url)?;
            let st = rt.block_on(async {
                let q = Queue::connect(&url, &etcd.options()).await?;
                q.status().await
            })?;
            if json {
                println!("{}", serde_json::to_string(&st)?);
            } else {
                print_dds_status(&st);
            }
        }
        DdsCmd::Init(a) => {
            let url = DdsUrl::parse(&a.url)?;
            let meta = init_meta(&a)?;
            let (m, made) = rt.block_on(async {
                let q = Queue::connect(&url, &a.etcd.options()).await?;
                q.init(&meta).await
            })?;
            println!(
                "{} {url}: dataset {} ({} samples{}), seed {}, {}, {} shards of at most {}",
                if made { "made" } else { "kept" },
                m.fingerprint,
                m.samples,
                samples_note(&m),
                m.seed,
                m.strategy,
                m.shards,
                metfs_plan::size::format_bytes(m.shard_bytes)
            );
        }
        DdsCmd::Reset { url, etcd, force } => {
            let url = DdsUrl::parse(&url)?;
            let n = rt.block_on(async {
                let q = Queue::connect(&url, &etcd.options()).await?;
                q.reset(force).await
            })?;
            println!("reset {url}: {n} keys deleted");
        }
    }
    Ok(())
}

/// The samples' settings of a queue, for its one-line descriptions.
fn samples_note(m: &metfs_dds::QueueMeta) -> String {
    m.sample_settings
        .as_ref()
        .map_or(String::new(), |s| format!(" by {s}"))
}

fn print_dds_status(st: &metfs_dds::QueueStatus) {
    let m = &st.meta;
    println!(
        "queue {}: dataset {} ({} samples{}), seed {}, {}, {} shards of at most {}",
        st.url,
        m.fingerprint,
        m.samples,
        samples_note(m),
        m.seed,
        m.strategy,
        m.shards,
        metfs_plan::size::format_bytes(m.shard_bytes)
    );
    if st.epochs.is_empty() {
        println!("no epoch started");
    }
    for e in &st.epochs {
        println!(
            "epoch {}: {} done, {} doing, {} todo",
            e.epoch, e.done, e.doing, e.todo
        );
    }
    if !st.nodes.is_empty() {
        println!(
            "{:<20} {:>6} {:>6} {:>10} {:>7} {:>10} {:>6} {:>10}",
            "node", "live", "doing", "claimed", "share", "done", "lost", "samples/s"
        );
    }
    for n in &st.nodes {
        println!(
            "{:<20} {:>6} {:>6} {:>10} {:>6.1}% {:>10} {:>6} {:>10.1}",
            n.node,
            n.live.map_or("-".to_string(), |i| format!("#{i}")),
            n.doing,
            n.stats.claimed_samples,
            n.share * 100.0,
            n.stats.done_samples,
            n.stats.lost_shards,
            n.throughput
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Cli, Cmd};
    use clap::Parser;
    use metfs_dds::dataset::{queue_meta, samples, SHARDS_PER_SLOT};
    use metfs_plan::budget::{footprints, Staged};

    fn init_args(manifest: &std::path::Path, extra: &[&str]) -> DdsInitArgs {
        let m = manifest.to_str().unwrap();
        parse_init(&["--manifest", m, "--budget", "256MiB"], extra)
    }

    fn parse_init(args: &[&str], extra: &[&str]) -> DdsInitArgs {
        let mut argv = vec!["metfs", "dds", "init", "etcd://127.0.0.1:2379/q"];
        argv.extend(args);
        argv.extend(extra);
        match Cli::try_parse_from(argv).unwrap().cmd {
            Cmd::Dds(DdsCmd::Init(a)) => *a,
            _ => unreachable!("parsed as dds init"),
        }
    }

    /// `metfs dds init --transform ... --transform-growth G` cuts the shards a mount with the
    /// same transform would cut (it once budgeted every sample at its copy's size, so its shards
    /// held G times the bytes a mount planned for them).
    #[test]
    fn init_budgets_a_transforms_growth_as_a_mount_does() {
        let dir = tempfile::tempdir().unwrap();
        let m = dir.path().join("m.csv");
        let mut text = String::from("path,size\n");
        for i in 0..400 {
            text += &format!("d/s{i},1000000\n");
        }
        std::fs::write(&m, text).unwrap();
        let copied = init_meta(&init_args(&m, &[])).unwrap();
        let grown = init_meta(&init_args(
            &m,
            &["--transform", "prep", "--transform-growth", "3"],
        ))
        .unwrap();
        // What a mount with `--dds --transform prep --transform-growth 3` makes.
        let strategy = Strategy::default();
        let (cat, b) = plan_catalog(Some(&m), None, strategy, false, 256 << 20).unwrap();
        let fp = footprints(cat.sizes(), Staged::Transformed { growth: 3.0 });
        let mount = queue_meta(
            &cat,
            &samples(&cat, fp),
            None,
            strategy,
            0,
            b.slot_bytes,
            SHARDS_PER_SLOT,
        )
        .unwrap();
        assert_eq!(grown, mount);
        assert!(
            grown.shards > 2 * copied.shards,
            "{} shards with growth 3, {} without",
            grown.shards,
            copied.shards
        );
        let bad = init_meta(&init_args(&m, &["--transform-growth", "0"])).unwrap_err();
        assert!(bad.to_string().contains("--transform-growth"), "{bad}");
    }

    /// `images/N.png` (3,000 bytes) and `masks/N.png` (1,000 bytes) for `n` pairs, a class
    /// list, and a stray image without its mask.
    fn pairs(n: usize) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["images", "masks"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        for i in 0..n {
            std::fs::write(dir.path().join(format!("images/{i}.png")), [1u8; 3000]).unwrap();
            std::fs::write(dir.path().join(format!("masks/{i}.png")), [2u8; 1000]).unwrap();
        }
        std::fs::write(dir.path().join("images/stray.png"), [3u8; 3000]).unwrap();
        std::fs::write(dir.path().join("classes.txt"), b"bg fg\n").unwrap();
        dir
    }

    /// `metfs dds init --group-by` deals groups: every shard holds each image with its mask,
    /// its bytes are both files' footprints, the always file is in no shard, and the record
    /// names the settings.
    #[test]
    fn init_deals_groups_with_every_file_counted() {
        let src = pairs(60);
        let s = src.path().to_str().unwrap();
        let group = [
            "--group-by",
            "images/{}.png,masks/{}.png",
            "--always",
            "classes.txt",
        ];
        let a = parse_init(&["--source", s, "--budget", "2MiB"], &group);
        let (meta, owned, applied) = init_dataset(&a).unwrap();
        assert_eq!(
            meta.samples, 60,
            "pairs, not files; the stray image is left out"
        );
        assert_eq!(
            meta.sample_settings.as_deref(),
            Some("group_by 'images/{}.png,masks/{}.png', always 'classes.txt'")
        );
        assert!(meta.shards > 2, "{meta:?}");
        let groups = applied.samples.as_ref().unwrap().groups();
        // A pair's footprint is both files' blocks (the one rule, `budget::footprint`).
        assert!(
            owned.sizes.iter().all(|&b| b == 2 * 4096),
            "{:?}",
            owned.sizes
        );
        let spec = metfs_plan::planner::ShardSpec {
            strategy: meta.strategy,
            seed: meta.seed,
            shards: meta.shards,
            shard_bytes: meta.shard_bytes,
        };
        let order = metfs_plan::planner::epoch_order(&owned.set(), &spec, 0).unwrap();
        let cat = &applied.catalog;
        let mut seen = 0;
        for k in 0..order.shards() {
            let files: Vec<String> = groups
                .files(order.samples(k))
                .into_iter()
                .map(|id| cat.path(id))
                .filter(|p| p != "classes.txt")
                .collect();
            for f in files.iter().filter(|f| f.starts_with("images/")) {
                let mask = f.replacen("images/", "masks/", 1);
                assert!(files.contains(&mask), "shard {k}: {f} without {mask}");
                seen += 1;
            }
            assert!(order.bytes[k as usize] <= meta.shard_bytes);
        }
        assert_eq!(seen, 60);
        // Without the settings the same source is files, and the record says none.
        let files = init_meta(&parse_init(&["--source", s, "--budget", "2MiB"], &[])).unwrap();
        assert_eq!((files.samples, files.sample_settings), (122, None));
    }

    /// A `--group-by` that groups nothing, or that is not a template, is an error naming it.
    #[test]
    fn init_refuses_a_group_by_that_matches_nothing() {
        let src = pairs(4);
        let s = src.path().to_str().unwrap();
        let args = ["--source", s, "--budget", "2MiB"];
        let e = init_meta(&parse_init(&args, &["--group-by", "img/{}.png,msk/{}.png"]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("group_by 'img/{}.png,msk/{}.png' groups no two files"),
            "{e}"
        );
        let e = format!(
            "{:#}",
            init_meta(&parse_init(&args, &["--group-by", "img/{}.png"])).unwrap_err()
        );
        assert!(e.contains("--group-by") && e.contains("two parts"), "{e}");
        let e = init_meta(&parse_init(&args, &["--exclude", "*.jpg"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("exclude '*.jpg' matches no file"), "{e}");
    }
}
