//! `metfs dds`: inspect and manage a dynamic-sharding queue in etcd.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
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
    #[arg(long, default_value_t = metfs_dds::dataset::SHARDS_PER_SLOT)]
    shards_per_slot: u32,
    /// Label samples by their first directory level.
    #[arg(long)]
    label_from_dirs: bool,
    #[command(flatten)]
    footprint: FootprintArgs,
}

/// The record `metfs dds init` makes a queue with: shards cut from each sample's footprint
/// under the mount's transform, as a mount with `--dds` cuts them.
fn init_meta(a: &DdsInitArgs) -> Result<metfs_dds::QueueMeta> {
    use metfs_dds::dataset;
    let budget = metfs_plan::size::parse_size(&a.budget).context("--budget")?;
    let (cat, b) = plan_catalog(
        a.manifest.as_deref(),
        a.source.as_deref(),
        a.compose,
        a.label_from_dirs,
        budget,
    )?;
    let samples = dataset::samples(&cat, a.footprint.footprints(&cat)?);
    Ok(dataset::queue_meta(
        &cat,
        &samples,
        a.compose,
        a.seed,
        b.slot_bytes,
        a.shards_per_slot,
    )?)
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
                "{} {url}: dataset {} ({} samples), seed {}, {}, {} shards of at most {}",
                if made { "made" } else { "kept" },
                m.fingerprint,
                m.samples,
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

fn print_dds_status(st: &metfs_dds::QueueStatus) {
    let m = &st.meta;
    println!(
        "queue {}: dataset {} ({} samples), seed {}, {}, {} shards of at most {}",
        st.url,
        m.fingerprint,
        m.samples,
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
        let mut argv = vec!["metfs", "dds", "init", "etcd://127.0.0.1:2379/q"];
        argv.extend(["--manifest", m, "--budget", "256MiB"]);
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
}
