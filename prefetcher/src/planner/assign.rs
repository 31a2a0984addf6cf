//! Composition: the assignment of every sample of the epoch to a share (`m × nodes + r`), for
//! every strategy, from the [`Layout`] and the epoch's random stream. Stratified and clustered
//! plans balance over mini-epochs first and then over each mini-epoch's nodes.

use super::{
    balance::balance, balance::Scratch, layout::Layout, sequential::sequential_cuts, PlanConfig,
    SampleSet, Strategy, NONE,
};

/// Share of every sample (`m × nodes + r`), or [`NONE`] for a sample copied into every share.
pub(super) fn assign(
    samples: &SampleSet<'_>,
    cfg: &PlanConfig,
    layout: &Layout,
    epoch: u64,
) -> Vec<u32> {
    let sizes = samples.sizes;
    let n = sizes.len();
    let (nm, nodes) = (layout.nm, cfg.nodes);
    let parts = nm * nodes;
    let mut part_of = vec![NONE; n];
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
            two_level(labels, &[], sizes, nm, nodes, cfg.seed, epoch, &mut part_of);
        }
        Strategy::Clustered => {
            let clusters = samples.clusters.expect("validated");
            two_level(
                clusters,
                &layout.copied,
                sizes,
                nm,
                nodes,
                cfg.seed,
                epoch,
                &mut part_of,
            );
        }
    }
    part_of
}

/// Stratified assignment: classes over mini-epochs, then each mini-epoch's samples over the
/// nodes, so both levels keep every class within one of even. Samples of classes marked in
/// `copied` stay [`NONE`].
#[allow(clippy::too_many_arguments)]
pub(super) fn two_level(
    classes: &[u32],
    copied: &[bool],
    sizes: &[u64],
    nm: u32,
    nodes: u32,
    seed: u64,
    epoch: u64,
    part_of: &mut [u32],
) {
    let mut rng = super::rng::stream(seed, epoch);
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
    balance(nm, &mut ids, &starts, sizes, &mut rng, &mut sc, |id, m| {
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
        balance(nodes, slice, &bounds, sizes, &mut rng, &mut sc, |id, r| {
            part_of[id as usize] = base + r
        });
    }
}
