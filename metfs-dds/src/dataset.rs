//! What a queue is made for, from a catalog: the dataset fingerprint every node computes alike,
//! the samples shards are cut from (cache footprints, so a batch of shards fits a slot), and
//! the queue record with its shard count.
//!
//! A sample here is whatever the caller deals: a file, or a sample group of several files
//! (the mount's `samples` module builds those, with each group's footprint the sum of its
//! files'). The record then names the sample settings, so that every node deals the same
//! samples.

use metfs_plan::digest::{catalog_digest, CatalogDigest};
use metfs_plan::planner::{shard_count, Strategy};
use metfs_tier::catalog::Catalog;

use super::keys::{QueueMeta, LAYOUT_VERSION};
use super::{DdsError, OwnedSamples};

/// The dataset's identity: sample count, total bytes and a hash of every sample's relative
/// path, size, content version and class. The source URL is left out: nodes may mount the
/// same dataset under different paths.
pub fn fingerprint(cat: &Catalog) -> String {
    let h = catalog_digest(cat, CatalogDigest::ContentsAndLabels);
    let total: u64 = cat.sizes().iter().sum();
    format!("{}:{}:{h:016x}", cat.len(), total)
}

/// The samples shards are cut from: each sample's cache footprint (`footprints`, one per
/// sample) with the catalog's labels and cluster ids.
pub fn samples(cat: &Catalog, footprints: Vec<u64>) -> OwnedSamples {
    OwnedSamples {
        sizes: footprints,
        labels: cat.labels().map(<[u32]>::to_vec),
        clusters: cat.clusters().map(<[u32]>::to_vec),
    }
}

/// Shards per slot when a queue is made: a node takes about this many shards each time it
/// comes back for work, which bounds how unevenly the last shards of an epoch fall.
pub const SHARDS_PER_SLOT: u32 = 4;

/// The record of a new queue for this dataset: shards of at most `slot_bytes /
/// shards_per_slot` (or the largest sample, if larger), of `samples` (one entry per sample,
/// a file or a group) cut under `sample_settings` (`None`: every file is a sample).
pub fn queue_meta(
    cat: &Catalog,
    samples: &OwnedSamples,
    sample_settings: Option<String>,
    strategy: Strategy,
    seed: u64,
    slot_bytes: u64,
    shards_per_slot: u32,
) -> Result<QueueMeta, DdsError> {
    let largest = samples.sizes.iter().copied().max().unwrap_or(0);
    let shard_bytes = (slot_bytes / u64::from(shards_per_slot.max(1))).max(largest);
    let shards = shard_count(&samples.set(), strategy, seed, shard_bytes)?;
    Ok(QueueMeta {
        version: LAYOUT_VERSION,
        fingerprint: fingerprint(cat),
        seed,
        strategy,
        shards,
        shard_bytes,
        samples: samples.sizes.len() as u64,
        stripes: crate::keys::default_stripes(shards),
        sample_settings,
    })
}
