//! Reads a manifest and plans one epoch, timing both: the measurement behind
//! `benches/plan_scale.sh` (docs/BENCHMARKS.md, "Planning at scale").
//!
//! ```text
//! cargo run --release -p prefetcher --example plan_scale -- \
//!     --manifest FILE [--strategy stratified] [--nodes 8] [--node-rank 0] \
//!     [--budget 64GiB] [--mini-epochs N] [--seed 0] [--epoch 0] [--json]
//! ```
//!
//! `--budget` is one node's cache budget; a share of a mini-epoch gets half of it, as in the
//! daemon (which also sets aside room for metadata). Arguments are parsed by hand because the
//! library crate has no CLI dependency and this is the only binary in it that needs one.

use std::path::PathBuf;
use std::time::Instant;

use prefetcher::manifest::load_catalog;
use prefetcher::planner::{summarize, PlanConfig, SampleSet, Strategy};
use prefetcher::size::parse_size;

fn main() {
    if let Err(e) = run() {
        eprintln!("plan_scale: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let mut manifest: Option<PathBuf> = None;
    let mut cfg = PlanConfig {
        strategy: Strategy::Stratified,
        seed: 0,
        slot_bytes: 32 << 30,
        mini_epochs: None,
        node_rank: 0,
        nodes: 8,
    };
    let (mut epoch, mut json) = (0u64, false);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--manifest" => manifest = Some(PathBuf::from(val()?)),
            "--strategy" => {
                cfg.strategy = serde_json::from_value(serde_json::Value::String(val()?))
                    .map_err(|e| format!("--strategy: {e}"))?
            }
            "--nodes" => cfg.nodes = val()?.parse().map_err(|e| format!("--nodes: {e}"))?,
            "--node-rank" => {
                cfg.node_rank = val()?.parse().map_err(|e| format!("--node-rank: {e}"))?
            }
            "--budget" => {
                cfg.slot_bytes = parse_size(&val()?).map_err(|e| format!("--budget: {e}"))? / 2
            }
            "--mini-epochs" => {
                cfg.mini_epochs = Some(val()?.parse().map_err(|e| format!("--mini-epochs: {e}"))?)
            }
            "--seed" => cfg.seed = val()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--epoch" => epoch = val()?.parse().map_err(|e| format!("--epoch: {e}"))?,
            "--json" => json = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let manifest = manifest.ok_or("--manifest FILE is required")?;
    let t0 = Instant::now();
    let catalog = load_catalog(&manifest).map_err(|e| e.to_string())?;
    let read = t0.elapsed();
    let t1 = Instant::now();
    let set = SampleSet {
        sizes: catalog.sizes(),
        labels: catalog.labels(),
        clusters: catalog.clusters(),
    };
    let names = match cfg.strategy {
        Strategy::Clustered => catalog.cluster_names(),
        _ => catalog.label_names(),
    };
    let summary = summarize(&set, &cfg, epoch, Some(names)).map_err(|e| e.to_string())?;
    let plan = t1.elapsed();
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())?
        );
    } else {
        print!("{summary}");
    }
    eprintln!(
        "timing: read+catalog {:.2} s, plan+summary {:.2} s, {} samples",
        read.as_secs_f64(),
        plan.as_secs_f64(),
        catalog.len()
    );
    Ok(())
}
