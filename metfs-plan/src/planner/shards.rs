//! Shards for dynamic sharding: one epoch's order of every sample, cut into `K` shards that
//! nodes claim from a shared queue instead of owning a fixed share.
//!
//! The order is a pure function of (samples, strategy, seed, shard count, epoch), so every
//! node computes the same one and a shard travels as three integers, (epoch, offset, length)
//! into it (paper 003, §V-C1). It is built with the planner's own steps on one node: the
//! samples are composed into `K` parts exactly as `K` mini-epochs would be (`sequential`: the
//! contiguous cuts; `random`: the balancing step over all samples; `stratified`: every class
//! spread over the parts, `⌊n_c/K⌋` or `⌈n_c/K⌉` of class `c` in each; `clustered`: the same
//! over cluster ids, with no copies, since a copied sample would be claimed by several nodes
//! and counted twice), and the parts are laid end to end. Part `k` is shard `k`; inside it the
//! samples are in ascending id (catalog path) order.
//!
//! The shard count is fixed when a queue is made (it is stored with the queue), never derived
//! from the node count, so a job restarted on another number of nodes cuts the same shards.
//! [`shard_count`] picks the smallest `K` whose guaranteed largest shard (the planner's share
//! bound) is at most the given byte size.

use super::{
    assign::two_level,
    balance::{balance, Scratch},
    bound::validate,
    layout::{layout, too_many},
    sequential::sequential_cuts,
    ClusterCopies, PlanConfig, PlanError, SampleSet, Strategy,
};

/// What an epoch's order depends on besides the samples and the epoch. Stored with a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardSpec {
    /// Composition of the shards.
    pub strategy: Strategy,
    /// Seed of every random choice.
    pub seed: u64,
    /// Number of shards per epoch (`K`).
    pub shards: u32,
    /// Most bytes a shard may hold (the cuts of `sequential` respect it; the permuting
    /// strategies are guaranteed under it by the choice of `shards`).
    pub shard_bytes: u64,
}

/// One shard: `length` samples from `offset` in the order of `epoch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub epoch: u64,
    pub offset: u64,
    pub length: u64,
}

/// One epoch's order of every sample and its cut into shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochOrder {
    pub epoch: u64,
    /// Every sample id exactly once.
    pub order: Vec<u32>,
    /// `K + 1` offsets: shard `k` is `order[offsets[k]..offsets[k + 1]]`.
    pub offsets: Vec<usize>,
    /// Bytes of each shard.
    pub bytes: Vec<u64>,
}

impl EpochOrder {
    /// Number of shards.
    pub fn shards(&self) -> u32 {
        self.bytes.len() as u32
    }

    /// Shard `k` as (epoch, offset, length). Panics if `k` is out of range.
    pub fn shard(&self, k: u32) -> Shard {
        let (a, b) = (self.offsets[k as usize], self.offsets[k as usize + 1]);
        Shard {
            epoch: self.epoch,
            offset: a as u64,
            length: (b - a) as u64,
        }
    }

    /// The sample ids of shard `k`, ascending. Panics if `k` is out of range.
    pub fn samples(&self, k: u32) -> &[u32] {
        &self.order[self.offsets[k as usize]..self.offsets[k as usize + 1]]
    }
}

fn one_node(spec_strategy: Strategy, seed: u64, slot_bytes: u64, nm: Option<u32>) -> PlanConfig {
    // Clustered shards are composed like stratified ones over cluster ids (no copies), so
    // they are laid out by the same rule.
    let strategy = match spec_strategy {
        Strategy::Clustered => Strategy::Stratified,
        s => s,
    };
    PlanConfig {
        strategy,
        seed,
        slot_bytes,
        mini_epochs: nm,
        node_rank: 0,
        nodes: 1,
        // Laid out as stratified, which copies nothing.
        cluster_copies: ClusterCopies::default(),
    }
}

/// Labels stand in for cluster ids when `clustered` is laid out as stratified.
fn classes<'a>(samples: &SampleSet<'a>, strategy: Strategy) -> SampleSet<'a> {
    match strategy {
        Strategy::Clustered => SampleSet {
            sizes: samples.sizes,
            labels: samples.clusters,
            clusters: samples.clusters,
        },
        _ => *samples,
    }
}

/// The smallest shard count whose largest shard is guaranteed to hold at most `shard_bytes`.
///
/// Errors as [`mini_epoch_count`](super::mini_epoch_count) on one node (a sample larger than
/// `shard_bytes`, no samples, missing labels or cluster ids).
pub fn shard_count(
    samples: &SampleSet<'_>,
    strategy: Strategy,
    seed: u64,
    shard_bytes: u64,
) -> Result<u32, PlanError> {
    let samples = classes(samples, strategy);
    layout(&samples, &one_node(strategy, seed, shard_bytes, None)).map(|l| l.nm)
}

/// The order of `epoch` and its cut into `spec.shards` shards. Pure and deterministic.
///
/// Errors: the input checks of the planner, [`PlanError::TooFewMiniEpochs`] when `spec.shards`
/// shards cannot keep every shard within `spec.shard_bytes`, and
/// [`PlanError::TooManyMiniEpochs`] for more shards than samples.
pub fn epoch_order(
    samples: &SampleSet<'_>,
    spec: &ShardSpec,
    epoch: u64,
) -> Result<EpochOrder, PlanError> {
    let samples = classes(samples, spec.strategy);
    let cfg = one_node(
        spec.strategy,
        spec.seed,
        spec.shard_bytes,
        Some(spec.shards),
    );
    // The same checks (and the same refusal of a count that cannot fit) as a plan of K
    // mini-epochs on one node.
    layout(&samples, &cfg)?;
    let n = validate(&samples, &cfg)?;
    if let Some(e) = too_many(spec.shards, n, 1) {
        return Err(e);
    }
    let k = spec.shards;
    let sizes = samples.sizes;
    let mut part_of = vec![0u32; n];
    match spec.strategy {
        Strategy::Sequential => {
            let cuts = sequential_cuts(sizes, spec.shard_bytes, k as usize);
            for (p, w) in cuts.windows(2).enumerate() {
                part_of[w[0]..w[1]].fill(p as u32);
            }
        }
        Strategy::Random => {
            let mut rng = super::rng::stream(spec.seed, epoch);
            let mut ids: Vec<u32> = (0..n as u32).collect();
            let mut sc = Scratch::default();
            balance(k, &mut ids, &[0, n], sizes, &mut rng, &mut sc, |id, c| {
                part_of[id as usize] = c
            });
        }
        Strategy::Stratified | Strategy::Clustered => {
            let labels = samples.labels.expect("validated");
            two_level(
                labels,
                &[],
                sizes,
                k,
                1,
                &mut super::rng::stream(spec.seed, epoch),
                &mut part_of,
            );
        }
    }
    // A counting sort by part keeps ascending ids inside each shard.
    let mut offsets = vec![0usize; k as usize + 1];
    for &p in &part_of {
        offsets[p as usize + 1] += 1;
    }
    for i in 1..offsets.len() {
        offsets[i] += offsets[i - 1];
    }
    let mut order = vec![0u32; n];
    let mut bytes = vec![0u64; k as usize];
    let mut fill = offsets.clone();
    for (id, &p) in part_of.iter().enumerate() {
        order[fill[p as usize]] = id as u32;
        fill[p as usize] += 1;
        bytes[p as usize] += sizes[id];
    }
    Ok(EpochOrder {
        epoch,
        order,
        offsets,
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(strategy: Strategy, shards: u32, shard_bytes: u64) -> ShardSpec {
        ShardSpec {
            strategy,
            seed: 7,
            shards,
            shard_bytes,
        }
    }

    #[test]
    fn every_sample_once_in_every_strategy_and_shards_fit() {
        let sizes: Vec<u64> = (0..500).map(|i| 100 + (i * 37 % 900)).collect();
        let labels: Vec<u32> = (0..500).map(|i| (i * 7 % 5) as u32).collect();
        let set = SampleSet {
            sizes: &sizes,
            labels: Some(&labels),
            clusters: Some(&labels),
        };
        for strategy in [
            Strategy::Sequential,
            Strategy::Random,
            Strategy::Stratified,
            Strategy::Clustered,
        ] {
            let k = shard_count(&set, strategy, 7, 20_000).unwrap();
            let sp = spec(strategy, k, 20_000);
            let o = epoch_order(&set, &sp, 3).unwrap();
            assert_eq!(o.shards(), k);
            let mut seen = o.order.clone();
            seen.sort_unstable();
            assert_eq!(seen, (0..500).collect::<Vec<u32>>(), "{strategy}");
            let mut next = 0u64;
            for s in 0..k {
                let sh = o.shard(s);
                assert_eq!((sh.epoch, sh.offset), (3, next));
                next += sh.length;
                assert!(o.bytes[s as usize] <= 20_000, "{strategy} shard {s}");
                let b: u64 = o.samples(s).iter().map(|&i| sizes[i as usize]).sum();
                assert_eq!(b, o.bytes[s as usize]);
            }
            // Pure: the same inputs give the same order.
            assert_eq!(o, epoch_order(&set, &sp, 3).unwrap());
        }
    }

    #[test]
    fn stratified_shards_hold_every_class_within_one_of_even() {
        let sizes = vec![10u64; 203];
        let labels: Vec<u32> = (0..203)
            .map(|i| if i < 150 { 0 } else { 1 + i % 3 })
            .collect();
        let set = SampleSet {
            sizes: &sizes,
            labels: Some(&labels),
            clusters: None,
        };
        let k = 8;
        let o = epoch_order(&set, &spec(Strategy::Stratified, k, 1_000), 0).unwrap();
        for c in 0..4u32 {
            let n_c = labels.iter().filter(|&&l| l == c).count() as u64;
            for s in 0..k {
                let got = o
                    .samples(s)
                    .iter()
                    .filter(|&&i| labels[i as usize] == c)
                    .count() as u64;
                assert!(
                    got == n_c / u64::from(k) || got == n_c.div_ceil(u64::from(k)),
                    "class {c} shard {s}: {got} of {n_c}"
                );
            }
        }
    }

    #[test]
    fn epochs_differ_but_the_cut_does_not_depend_on_nodes() {
        let sizes = vec![5u64; 100];
        let set = SampleSet {
            sizes: &sizes,
            labels: None,
            clusters: None,
        };
        let sp = spec(Strategy::Random, 10, 100);
        let (a, b) = (
            epoch_order(&set, &sp, 0).unwrap(),
            epoch_order(&set, &sp, 1).unwrap(),
        );
        assert_ne!(a.order, b.order);
        assert!(a.offsets.windows(2).all(|w| w[1] - w[0] == 10));
    }

    #[test]
    fn too_few_shards_for_the_shard_size_are_refused() {
        let sizes = vec![100u64; 10];
        let set = SampleSet {
            sizes: &sizes,
            labels: None,
            clusters: None,
        };
        let e = epoch_order(&set, &spec(Strategy::Random, 2, 300), 0).unwrap_err();
        assert!(
            matches!(e, PlanError::TooFewMiniEpochs { needed: 4, .. }),
            "{e}"
        );
        let e = epoch_order(&set, &spec(Strategy::Random, 11, 300), 0).unwrap_err();
        assert!(matches!(e, PlanError::TooManyMiniEpochs { .. }), "{e}");
    }
}
