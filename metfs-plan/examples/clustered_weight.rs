//! How much `clustered` composition over-weights small clusters under each copy rule
//! (`--cluster-copies per-node|per-share`): 1,000 clusters with Zipf-like sizes
//! (`round(L / k^1.1)`, at least 1, for the `k`-th largest; L = 10 000, then 100 000), 8
//! nodes, 16 and 128 mini-epochs. Every node's plan of one epoch is made and each sample's reads counted, so
//! the table is of real plans, not of the rules' formulas. A cluster's weight is its share of
//! the epoch's reads over its share of the dataset (1: read as often as the rest). Prints a
//! Markdown table (`docs/EXPERIMENTS.md` records it).
//!
//! `cargo run -p metfs-plan --example clustered_weight`. Deterministic: the weights depend on
//! the copy rules alone, not on the seed (which only moves samples between shares).

use metfs_plan::planner::{plan_epoch, ClusterCopies, PlanConfig, SampleSet, Strategy};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const CLUSTERS: u32 = 1_000;
const NODES: u32 = 8;
/// Every sample is this big, so a share's bytes are its sample count times this.
const SAMPLE_BYTES: u64 = 128 << 10;

fn main() -> Res<()> {
    for largest in [10_000.0, 100_000.0] {
        dataset(largest)?;
    }
    Ok(())
}

/// The table for clusters of `round(largest / k^1.1)` samples, at least 1.
fn dataset(largest: f64) -> Res<()> {
    let mut clusters = Vec::new();
    for k in 1..=CLUSTERS {
        let len = (largest / f64::from(k).powf(1.1)).round().max(1.0) as usize;
        clusters.extend(std::iter::repeat_n(k - 1, len));
    }
    let n = clusters.len();
    let sizes = vec![SAMPLE_BYTES; n];
    let set = SampleSet {
        sizes: &sizes,
        labels: None,
        clusters: Some(&clusters),
    };
    let mut len = vec![0usize; CLUSTERS as usize];
    clusters.iter().for_each(|&c| len[c as usize] += 1);
    let below = |t: usize| len.iter().filter(|&&l| l < t).count();
    println!(
        "{n} samples in {CLUSTERS} clusters of {} to {}; fewer than 8 samples: {}, than 128: {}, \
         than 1,024: {}",
        len.iter().min().unwrap(),
        len.iter().max().unwrap(),
        below(8),
        below(128),
        below(1024)
    );
    println!();
    println!(
        "| rule | mini-epochs | copied clusters | their samples | reads per epoch of a copied \
         sample / of another | copied samples' share of the epoch | weight of a copied cluster | \
         weight of another cluster | epoch / dataset | largest share |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for copies in [ClusterCopies::PerShare, ClusterCopies::PerNode] {
        for nm in [16u32, 128] {
            row(&set, copies, nm)?;
        }
    }
    println!();
    Ok(())
}

/// One epoch of every node's plan under `copies` at `nm` mini-epochs, as a table row.
fn row(set: &SampleSet<'_>, copies: ClusterCopies, nm: u32) -> Res<()> {
    let n = set.sizes.len();
    let mut reads = vec![0u64; n];
    let (mut copied, mut largest) = (Vec::new(), 0u64);
    for rank in 0..NODES {
        let cfg = PlanConfig {
            strategy: Strategy::Clustered,
            seed: 0,
            // No budget: the rules' weights, not whether their copies fit, are measured here.
            slot_bytes: u64::MAX / 2,
            mini_epochs: Some(nm),
            node_rank: rank,
            nodes: NODES,
            cluster_copies: copies,
        };
        let plan = plan_epoch(set, &cfg, 0)?;
        for me in &plan.mini_epochs {
            me.samples.iter().for_each(|&i| reads[i as usize] += 1);
            largest = largest.max(me.bytes);
        }
        copied = plan.copied;
    }
    let clusters = set.clusters.expect("clustered");
    let mut copied_clusters: Vec<u32> = copied.iter().map(|&i| clusters[i as usize]).collect();
    copied_clusters.dedup();
    let epoch: u64 = reads.iter().sum();
    let copied_reads: u64 = copied.iter().map(|&i| reads[i as usize]).sum();
    let (lo, hi) = copied
        .iter()
        .map(|&i| reads[i as usize])
        .fold((u64::MAX, 0), |(lo, hi), r| (lo.min(r), hi.max(r)));
    let other = (0..n as u32)
        .filter(|i| copied.binary_search(i).is_err())
        .map(|i| reads[i as usize])
        .max()
        .unwrap_or(0);
    assert!(
        other <= 1,
        "a sample of an uncopied cluster was read {other} times"
    );
    let epoch_share = copied_reads as f64 / epoch as f64;
    // A cluster's weight: its share of the epoch's reads over its share of the dataset.
    let weight = |r: u64| r as f64 * n as f64 / epoch as f64;
    let (reads_range, copied_weight) = match (copied.is_empty(), lo == hi) {
        (true, _) => ("- / 1".to_string(), "-".to_string()),
        (false, true) => (format!("{lo} / 1"), format!("{:.3}", weight(lo))),
        (false, false) => (
            format!("{lo}..{hi} / 1"),
            format!("{:.3}..{:.3}", weight(lo), weight(hi)),
        ),
    };
    println!(
        "| {copies} | {nm} | {} | {} ({:.1} %) | {reads_range} | {:.1} % | {copied_weight} | \
         {:.3} | {:.2}x | {:.0} MiB |",
        copied_clusters.len(),
        copied.len(),
        100.0 * copied.len() as f64 / n as f64,
        100.0 * epoch_share,
        weight(1),
        epoch as f64 / n as f64,
        largest as f64 / f64::from(1u32 << 20),
    );
    Ok(())
}
