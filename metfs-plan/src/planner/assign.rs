//! Composition: the assignment of every sample of the epoch to a share (`m × nodes + r`), for
//! every strategy, from the [`Layout`] and the epoch's random stream. Stratified and clustered
//! plans balance over mini-epochs first and then over each mini-epoch's nodes; `per-node`
//! cluster copies are then spread over the mini-epochs from the same stream.

use super::{
    balance::balance, balance::Scratch, layout::Layout, rng::PlanRng, sequential::sequential_cuts,
    ClusterCopies, PlanConfig, SampleSet, Strategy, NONE,
};

/// Where every sample of one epoch goes, for every node.
#[derive(Debug)]
pub(super) struct Assignment {
    /// Share of every sample (`m × nodes + r`), or [`NONE`] for a sample of a copied cluster.
    pub(super) part_of: Vec<u32>,
    /// `per-node` copies: per cluster id, the mini-epoch of node 0 that holds the cluster's
    /// copy ([`NONE`] for a cluster that is not copied); empty when copies go to every share.
    copy_at: Vec<u32>,
    nm: u32,
    nodes: u32,
}

impl Assignment {
    /// The mini-epoch of node `rank` that holds the copy of the copied cluster `cluster`, or
    /// `None` when every mini-epoch holds one (`per-share`).
    pub(super) fn copy_mini_epoch(&self, cluster: u32, rank: u32) -> Option<u32> {
        let at = *self.copy_at.get(cluster as usize)?;
        debug_assert_ne!(at, NONE, "cluster {cluster} is not copied");
        // Shifting node 0's placement keeps every node's loads (so the layout's bound holds for
        // each) and, with nm ≥ nodes, puts the nodes' copies of a cluster in distinct
        // mini-epochs, so the job does not meet a small cluster `nodes` times at once.
        let shift = u64::from(rank) * u64::from(self.nm) / u64::from(self.nodes);
        Some(((u64::from(at) + shift) % u64::from(self.nm)) as u32)
    }
}

/// Every sample's share, and where the copies of small clusters go.
pub(super) fn assign(
    samples: &SampleSet<'_>,
    cfg: &PlanConfig,
    layout: &Layout,
    epoch: u64,
) -> Assignment {
    let sizes = samples.sizes;
    let n = sizes.len();
    let (nm, nodes) = (layout.nm, cfg.nodes);
    let parts = nm * nodes;
    let mut part_of = vec![NONE; n];
    let mut copy_at = Vec::new();
    match cfg.strategy {
        Strategy::Sequential => {
            let cuts = sequential_cuts(sizes, cfg.slot_bytes, parts as usize);
            for (p, w) in cuts.windows(2).enumerate() {
                part_of[w[0]..w[1]].fill(p as u32);
            }
        }
        Strategy::Random => {
            let mut rng = super::rng::stream(cfg.seed, epoch);
            let mut ids: Vec<u32> = (0..n as u32).collect();
            let mut sc = Scratch::default();
            balance(
                parts,
                &mut ids,
                &[0, n],
                sizes,
                &mut rng,
                &mut sc,
                |id, c| part_of[id as usize] = c,
            );
        }
        Strategy::Stratified => {
            let labels = samples.labels.expect("validated");
            let mut rng = super::rng::stream(cfg.seed, epoch);
            two_level(labels, &[], sizes, nm, nodes, &mut rng, &mut part_of);
        }
        Strategy::Clustered => {
            let clusters = samples.clusters.expect("validated");
            let mut rng = super::rng::stream(cfg.seed, epoch);
            two_level(
                clusters,
                &layout.copied,
                sizes,
                nm,
                nodes,
                &mut rng,
                &mut part_of,
            );
            // Drawn from the same stream after the other samples are placed, so that the
            // plan stays a function of (seed, epoch) and those samples land where a
            // `per-share` plan with the same copied clusters would put them.
            if cfg.cluster_copies == ClusterCopies::PerNode && layout.copied.contains(&true) {
                copy_at = place_copies(clusters, &layout.copied, sizes, nm, &mut rng);
            }
        }
    }
    Assignment {
        part_of,
        copy_at,
        nm,
        nodes,
    }
}

/// `per-node` copies: node 0's mini-epoch for each copied cluster, by the balancing step over
/// the clusters as items of their bytes (one class, `k = nm`), so mini-epochs get within one
/// of the same number of copied clusters and copy bytes within the largest copied cluster.
fn place_copies(
    clusters: &[u32],
    copied: &[bool],
    sizes: &[u64],
    nm: u32,
    rng: &mut PlanRng,
) -> Vec<u32> {
    let mut bytes = vec![0u64; copied.len()];
    for (&c, &s) in clusters.iter().zip(sizes) {
        if copied[c as usize] {
            // The whole dataset's total fits in u64 (validated), so a cluster's does too.
            bytes[c as usize] += s;
        }
    }
    let mut ids: Vec<u32> = (0..copied.len() as u32)
        .filter(|&c| copied[c as usize])
        .collect();
    let mut at = vec![NONE; copied.len()];
    let len = ids.len();
    balance(
        nm,
        &mut ids,
        &[0, len],
        &bytes,
        rng,
        &mut Scratch::default(),
        |c, m| at[c as usize] = m,
    );
    at
}

/// Stratified assignment: classes over mini-epochs, then each mini-epoch's samples over the
/// nodes, so both levels keep every class within one of even. Samples of classes marked in
/// `copied` stay [`NONE`].
pub(super) fn two_level(
    classes: &[u32],
    copied: &[bool],
    sizes: &[u64],
    nm: u32,
    nodes: u32,
    rng: &mut PlanRng,
    part_of: &mut [u32],
) {
    let is_copied = |c: u32| copied.get(c as usize).copied().unwrap_or(false);
    let ncls = classes.iter().max().map_or(0, |&m| m as usize + 1);
    // Counting sort of the planned samples by class: group g = class g.
    let mut starts = vec![0usize; ncls + 1];
    for &c in classes {
        if !is_copied(c) {
            starts[c as usize + 1] += 1;
        }
    }
    for i in 1..starts.len() {
        starts[i] += starts[i - 1];
    }
    let planned = starts[ncls];
    let mut ids = vec![0u32; planned];
    let mut fill = starts.clone();
    for (id, &c) in classes.iter().enumerate() {
        if !is_copied(c) {
            ids[fill[c as usize]] = id as u32;
            fill[c as usize] += 1;
        }
    }
    drop(fill);
    let mut sc = Scratch::default();
    balance(nm, &mut ids, &starts, sizes, rng, &mut sc, |id, m| {
        part_of[id as usize] = m
    });
    if nodes == 1 {
        return;
    }
    // Bucket by mini-epoch, keeping the class grouping (a stable counting sort).
    let mut mstarts = vec![0usize; nm as usize + 1];
    for &id in &ids {
        mstarts[part_of[id as usize] as usize + 1] += 1;
    }
    for i in 1..mstarts.len() {
        mstarts[i] += mstarts[i - 1];
    }
    let mut by_me = vec![0u32; planned];
    let mut fill = mstarts.clone();
    for &id in &ids {
        let m = part_of[id as usize] as usize;
        by_me[fill[m]] = id;
        fill[m] += 1;
    }
    drop(ids);
    let mut bounds = Vec::new();
    for m in 0..nm as usize {
        let slice = &mut by_me[mstarts[m]..mstarts[m + 1]];
        bounds.clear();
        bounds.push(0);
        for i in 1..slice.len() {
            if classes[slice[i] as usize] != classes[slice[i - 1] as usize] {
                bounds.push(i);
            }
        }
        bounds.push(slice.len());
        let base = m as u32 * nodes;
        balance(nodes, slice, &bounds, sizes, rng, &mut sc, |id, r| {
            part_of[id as usize] = base + r
        });
    }
}
