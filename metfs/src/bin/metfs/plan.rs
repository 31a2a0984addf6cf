//! `metfs plan` and `metfs manifest`: a dataset's plan, the bandwidth model and manifests, without
//! mounting.

use anyhow::{anyhow, Context, Result};
use clap::Args;
use metfs::logging;
use metfs_plan::budget::footprints;
use metfs_plan::planner::Strategy;
use metfs_prefetcher::transform::TransformConfig;
use std::path::PathBuf;

#[derive(Clone, Copy, clap::ValueEnum)]
pub(super) enum FormatArg {
    Csv,
    Jsonl,
}

#[derive(Args)]
pub(super) struct PlanArgs {
    /// Model mode: dataset size D, e.g. 8.8TiB.
    #[arg(long)]
    dataset_size: Option<String>,
    /// Model mode: bandwidth the accelerators consume (EB1), e.g. 3.8TiB/s.
    #[arg(long)]
    required_bw: Option<String>,
    /// Model mode: capacity-tier bandwidth (B2), e.g. 400GiB/s.
    #[arg(long)]
    tier_bw: Option<String>,
    /// Model mode: a fixed rf.
    #[arg(long)]
    rf: Option<u32>,
    /// Model mode: a file of per-mini-epoch `rf` and `t` (CSV or JSON lines).
    #[arg(long)]
    rf_schedule: Option<PathBuf>,
    /// Manifest to plan (instead of listing --source).
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// Source directory to list and plan.
    #[arg(long)]
    source: Option<PathBuf>,
    /// Budget of each node's cache: 512MiB, 20GiB, or bytes.
    #[arg(long)]
    budget: String,
    /// Composition strategy.
    #[arg(long, alias = "strategy", default_value_t)]
    compose: Strategy,
    /// With --compose clustered, how small clusters are copied: per-node or per-share (as
    /// `metfs mount --cluster-copies`).
    #[arg(long, default_value_t)]
    cluster_copies: metfs_plan::planner::ClusterCopies,
    /// Mini-epochs per epoch [default: the smallest that fits].
    #[arg(long)]
    mini_epochs: Option<u32>,
    /// Seed of the composition.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Number of nodes.
    #[arg(long, default_value_t = 1)]
    nodes: u32,
    /// The node whose shares are listed (every node's bytes are summarized).
    #[arg(long, default_value_t = 0)]
    node_rank: u32,
    /// The epoch to plan.
    #[arg(long, default_value_t = 0)]
    epoch: u64,
    /// Label samples by their first directory level.
    #[arg(long)]
    label_from_dirs: bool,
    #[command(flatten)]
    footprint: FootprintArgs,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// What decides a sample's footprint in the budget beyond its size: the mount's transform.
/// `metfs plan` and `metfs dds init` take the mount's flags so that they budget each sample as
/// the mount will (`metfs_plan::budget::footprint`, the one rule).
#[derive(Args, Clone)]
pub(super) struct FootprintArgs {
    /// The mount's `--transform` command, if it has one: samples are then budgeted at
    /// --transform-growth times their size (the command itself is not run here).
    #[arg(long)]
    transform: Option<String>,
    /// As `metfs mount --transform-growth`: most bytes a transformed sample may take, as a
    /// multiple of its source size.
    #[arg(long, default_value_t = TransformConfig::default().growth)]
    transform_growth: f64,
}

impl FootprintArgs {
    /// How the mount stages each sample: copied, or transformed at its growth.
    pub(super) fn staged(&self) -> Result<metfs_plan::budget::Staged> {
        let g = self.transform_growth;
        anyhow::ensure!(
            g.is_finite() && g > 0.0,
            "--transform-growth: {g} must be a positive number"
        );
        let transform = TransformConfig {
            command: self.transform.clone(),
            growth: g,
            ..TransformConfig::default()
        };
        Ok(transform.staged())
    }

    /// Each sample's footprint in the budget, by the mount's rule.
    pub(super) fn footprints(&self, cat: &metfs_tier::catalog::Catalog) -> Result<Vec<u64>> {
        Ok(footprints(cat.sizes(), self.staged()?))
    }

    /// The mount's transform command, if any.
    pub(super) fn transform(&self) -> Option<&str> {
        self.transform.as_deref()
    }
}

pub(super) fn manifest_cmd(
    source: &std::path::Path,
    format: FormatArg,
    labels: bool,
) -> Result<()> {
    use metfs_tier::CapacityTier;
    let tier = metfs_tier::PosixTier::new(source)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let listed = rt.block_on(tier.catalog())?;
    for (p, why) in &listed.skipped {
        eprintln!("metfs: not listed: {p}: {why}");
    }
    let mut cat = listed.catalog;
    if labels {
        cat.label_by_first_dir();
    }
    let format = match format {
        FormatArg::Csv => metfs_prefetcher::manifest::ManifestFormat::Csv,
        FormatArg::Jsonl => metfs_prefetcher::manifest::ManifestFormat::Jsonl,
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    metfs_prefetcher::manifest::write_manifest(&cat, &mut out, format)?;
    std::io::Write::flush(&mut out)?;
    Ok(())
}

/// The rf schedule in the file `path` (the model parses its text: `parse_schedule`).
fn read_schedule(path: &std::path::Path) -> Result<Vec<metfs_plan::model::ScheduleEntry>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read rf schedule {}", path.display()))?;
    Ok(metfs_plan::model::parse_schedule(&text, path)?)
}

fn model_cmd(a: &PlanArgs, dataset: &str) -> Result<()> {
    use metfs_plan::model::{model, ModelInputs, RfSpec};
    use metfs_plan::size::{parse_rate, parse_size};
    let need = |v: &Option<String>, flag: &str| {
        v.clone()
            .ok_or_else(|| anyhow!("model mode needs {flag} (with --dataset-size)"))
    };
    let inputs = ModelInputs {
        dataset_bytes: parse_size(dataset).context("--dataset-size")?,
        budget_bytes: parse_size(&a.budget).context("--budget")?,
        required_bytes_per_s: parse_rate(&need(&a.required_bw, "--required-bw")?)
            .context("--required-bw")? as f64,
        tier_bytes_per_s: parse_rate(&need(&a.tier_bw, "--tier-bw")?).context("--tier-bw")? as f64,
        mini_epochs: a.mini_epochs,
        rf: match (a.rf, &a.rf_schedule) {
            (Some(n), None) => RfSpec::Fixed(n),
            (None, Some(p)) => RfSpec::Schedule(read_schedule(p)?),
            _ => anyhow::bail!("model mode needs exactly one of --rf N or --rf-schedule FILE"),
        },
    };
    let out = model(&inputs)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!("{out}");
    }
    Ok(())
}

/// The catalog of --manifest or --source (labelled as a mount would label it) and the budget
/// split a mount of it would use.
pub(super) fn plan_catalog(
    manifest: Option<&std::path::Path>,
    source: Option<&std::path::Path>,
    strategy: Strategy,
    label_from_dirs: bool,
    budget: u64,
) -> Result<(metfs_tier::catalog::Catalog, metfs_plan::budget::Budget)> {
    let mut cat = match (manifest, source) {
        (Some(m), None) => metfs_prefetcher::manifest::load_catalog(m)?,
        (None, Some(src)) => {
            use metfs_tier::CapacityTier;
            let tier = metfs_tier::PosixTier::new(src)?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(tier.catalog())?.catalog
        }
        _ => anyhow::bail!("give exactly one of --manifest FILE or --source DIR"),
    };
    if label_from_dirs || (strategy == Strategy::Stratified && cat.labels().is_none()) {
        cat.label_by_first_dir();
    }
    // The daemon saves the catalog in the cache; its size is estimated here without writing it.
    let names: u64 = (0..cat.len() as u32)
        .map(|i| cat.dir_and_name(i).1.len() as u64)
        .sum();
    let catalog_bytes = names + 24 * cat.len() as u64;
    let b = metfs_plan::budget::Budget::new(budget, &cat, catalog_bytes, logging::LOG_RESERVE)?;
    Ok((cat, b))
}

pub(super) fn plan_cmd(a: PlanArgs) -> Result<()> {
    use metfs_plan::planner::{summarize, PlanConfig, SampleSet};
    if let Some(d) = a.dataset_size.clone() {
        return model_cmd(&a, &d);
    }
    let budget = metfs_plan::size::parse_size(&a.budget).context("--budget")?;
    let strategy = a.compose;
    let (cat, b) = plan_catalog(
        a.manifest.as_deref(),
        a.source.as_deref(),
        strategy,
        a.label_from_dirs,
        budget,
    )?;
    let footprints = a.footprint.footprints(&cat)?;
    let set = SampleSet {
        sizes: &footprints,
        labels: cat.labels(),
        clusters: cat.clusters(),
    };
    let cfg = PlanConfig {
        strategy,
        seed: a.seed,
        slot_bytes: b.slot_bytes,
        mini_epochs: a.mini_epochs,
        node_rank: a.node_rank,
        nodes: a.nodes,
        cluster_copies: a.cluster_copies,
    };
    let names: Option<Vec<String>> = match strategy {
        Strategy::Clustered => cat.clusters().map(|c| {
            let n = c.iter().copied().max().map_or(0, |m| m + 1);
            (0..n).map(|i| cat.cluster_name(i).to_string()).collect()
        }),
        _ => cat.labels().map(|_| {
            (0..cat.label_count() as u32)
                .map(|i| cat.label_name(i).to_string())
                .collect()
        }),
    };
    let summary = summarize(&set, &cfg, a.epoch, names.as_deref()).map_err(|e| match e {
        metfs_plan::planner::PlanError::SampleTooLarge { sample, size, .. } => anyhow!(
            "budget {} is too small: `{}` takes {}, so the budget must be at least {}",
            metfs_plan::size::format_bytes(budget),
            cat.path(sample),
            metfs_plan::size::format_bytes(size),
            metfs_plan::size::format_bytes(size.saturating_mul(2).saturating_add(b.reserve))
        ),
        e => e.into(),
    })?;
    /// What `metfs plan` prints: the plan's summary and the budget and dataset it is for.
    #[derive(serde::Serialize)]
    struct PlanOutput<S> {
        #[serde(flatten)]
        summary: S,
        budget_bytes: u64,
        slot_bytes: u64,
        reserve_bytes: u64,
        dataset_files: usize,
        dataset_bytes: u64,
    }
    let v = PlanOutput {
        summary,
        budget_bytes: budget,
        slot_bytes: b.slot_bytes,
        reserve_bytes: b.reserve,
        dataset_files: cat.len(),
        dataset_bytes: cat.total_bytes(),
    };
    if a.json {
        let v = serde_json::to_string(&v)?;
        println!("{v}");
    } else {
        println!("{}", serde_json::to_string_pretty(&v)?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use metfs_plan::model::ScheduleEntry;

    #[test]
    fn read_schedule_reads_a_file_and_names_missing_ones() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.csv");
        std::fs::write(&p, "rf,t\n10,1\n").unwrap();
        assert_eq!(
            read_schedule(&p).unwrap(),
            vec![ScheduleEntry {
                rf: 10,
                t: Some(1.0)
            }]
        );
        let missing = dir.path().join("nope.csv");
        let e = read_schedule(&missing).unwrap_err();
        assert!(
            format!("{e:#}").contains("cannot read rf schedule"),
            "{e:#}"
        );
        assert!(format!("{e:#}").contains("nope.csv"), "{e:#}");
    }
}
