//! `metfs dds`: inspect and manage a dynamic-sharding queue in etcd.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use prefetcher::planner::Strategy;
use std::path::PathBuf;
use std::time::Duration;

use crate::plan::plan_catalog;

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
    fn options(&self) -> metfs::dds::EtcdOptions {
        metfs::dds::EtcdOptions {
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
    /// Manifest of the dataset (instead of listing --source).
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// Source directory of the dataset.
    #[arg(long)]
    source: Option<PathBuf>,
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
    #[arg(long, default_value_t = metfs::dds::dataset::SHARDS_PER_SLOT)]
    shards_per_slot: u32,
    /// Label samples by their first directory level.
    #[arg(long)]
    label_from_dirs: bool,
}

pub(super) fn dds_cmd(cmd: DdsCmd) -> Result<()> {
    use metfs::dds::{dataset, DdsUrl, Queue};
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
            let budget = prefetcher::size::parse_size(&a.budget).context("--budget")?;
            let strategy = a.compose;
            let (cat, b) = plan_catalog(
                a.manifest.as_deref(),
                a.source.as_deref(),
                strategy,
                a.label_from_dirs,
                budget,
            )?;
            let footprints = cat
                .sizes()
                .iter()
                .map(|&s| prefetcher::budget::round_up(s))
                .collect();
            let samples = dataset::samples(&cat, footprints);
            let meta = dataset::queue_meta(
                &cat,
                &samples,
                strategy,
                a.seed,
                b.slot_bytes,
                a.shards_per_slot,
            )?;
            let (m, made) = rt.block_on(async {
                let q = Queue::connect(&url, &a.etcd.options()).await?;
                q.init(&meta).await
            })?;
            println!(
                "{} {url}: dataset {} ({} samples), seed {}, {}, {} shards of at most {}",
                if made { "made" } else { "kept" },
                m.fingerprint,
                m.samples,
                m.seed,
                m.strategy,
                m.shards,
                prefetcher::size::format_bytes(m.shard_bytes)
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

fn print_dds_status(st: &metfs::dds::QueueStatus) {
    let m = &st.meta;
    println!(
        "queue {}: dataset {} ({} samples), seed {}, {}, {} shards of at most {}",
        st.url,
        m.fingerprint,
        m.samples,
        m.seed,
        m.strategy,
        m.shards,
        prefetcher::size::format_bytes(m.shard_bytes)
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
