//! Choosing nm: the epoch-independent [`Layout`] of a plan (the mini-epoch count and, for
//! `clustered`, which clusters are copied). Each strategy gets the smallest count its
//! guarantee allows, and a requested count the guarantee cannot meet is refused naming the
//! smallest one that can.

use super::{
    bound::share_bound, bound::validate, bound::SizeStats, sequential::even_cuts_largest,
    ClusterCopies, PlanConfig, PlanError, SampleSet, Strategy,
};

/// The epoch-independent shape of a plan.
#[derive(Debug, Clone)]
pub(super) struct Layout {
    pub(super) nm: u32,
    /// `clustered`: per cluster id, whether it is copied; empty otherwise.
    pub(super) copied: Vec<bool>,
    /// Bytes of the copied clusters: in every share (`per-share`), or in each node's epoch
    /// (`per-node`).
    pub(super) copied_bytes: u64,
    /// Guaranteed largest share, copies included (permuting strategies; `None` for
    /// `sequential`, whose shares are known exactly once cut).
    pub(super) bound: Option<u64>,
}

pub(super) fn too_many(requested: u32, n: usize, nodes: u32) -> Option<PlanError> {
    let shares = u64::from(requested) * u64::from(nodes);
    (requested as usize > n || shares >= u64::from(u32::MAX)).then_some(
        PlanError::TooManyMiniEpochs {
            requested,
            samples: n,
        },
    )
}

pub(super) fn layout(samples: &SampleSet<'_>, cfg: &PlanConfig) -> Result<Layout, PlanError> {
    let n = validate(samples, cfg)?;
    if let Some(req) = cfg.mini_epochs {
        if let Some(e) = too_many(req, n, cfg.nodes) {
            return Err(e);
        }
    }
    match cfg.strategy {
        Strategy::Sequential => sequential_layout(samples.sizes, cfg),
        Strategy::Random | Strategy::Stratified => balanced_layout(samples.sizes, cfg),
        Strategy::Clustered => clustered_layout(samples, cfg),
    }
}

/// Smallest `nm` in `1..=hi` for which the non-increasing predicate `fits` holds (`fits(hi)`
/// must hold).
pub(super) fn smallest(hi: u64, fits: impl Fn(u64) -> bool) -> u64 {
    let (mut lo, mut hi) = (1u64, hi);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo
}

pub(super) fn balanced_layout(sizes: &[u64], cfg: &PlanConfig) -> Result<Layout, PlanError> {
    let n = sizes.len() as u64;
    let st = SizeStats::of(sizes.iter().copied());
    let nodes = u64::from(cfg.nodes);
    let bound = |nm: u64| share_bound(st.n, st.total, st.max, &st, nm * nodes);
    // With nm = n every share holds at most one sample, which validate() showed fits.
    let needed = smallest(n, |nm| bound(nm) <= cfg.slot_bytes);
    let nm = match cfg.mini_epochs {
        None => needed,
        Some(req) if req == 0 || bound(u64::from(req)) > cfg.slot_bytes => {
            return Err(PlanError::TooFewMiniEpochs {
                requested: req,
                bytes: if req == 0 {
                    st.total
                } else {
                    bound(u64::from(req))
                },
                slot_bytes: cfg.slot_bytes,
                needed: needed as u32,
            });
        }
        Some(req) => u64::from(req),
    };
    Ok(Layout {
        nm: nm as u32,
        copied: Vec::new(),
        copied_bytes: 0,
        bound: Some(bound(nm)),
    })
}

/// Fewest contiguous runs of at most `slot` bytes that cover `sizes` (greedy packing is
/// optimal for contiguous runs).
pub(super) fn fewest_runs(sizes: &[u64], slot: u64) -> u64 {
    let (mut runs, mut cur) = (0u64, 0u64);
    for &s in sizes {
        if runs == 0 || cur + s > slot {
            runs += 1;
            cur = 0;
        }
        cur += s;
    }
    runs
}

pub(super) fn sequential_layout(sizes: &[u64], cfg: &PlanConfig) -> Result<Layout, PlanError> {
    let runs = fewest_runs(sizes, cfg.slot_bytes);
    let needed = runs.div_ceil(u64::from(cfg.nodes)) as u32;
    let nm = match cfg.mini_epochs {
        None => needed,
        Some(req) if req == 0 || u64::from(req) * u64::from(cfg.nodes) < runs => {
            let parts = (u64::from(req) * u64::from(cfg.nodes)).max(1) as usize;
            return Err(PlanError::TooFewMiniEpochs {
                requested: req,
                bytes: even_cuts_largest(sizes, parts),
                slot_bytes: cfg.slot_bytes,
                needed,
            });
        }
        Some(req) => req,
    };
    Ok(Layout {
        nm,
        copied: Vec::new(),
        copied_bytes: 0,
        bound: None,
    })
}

/// Per-cluster facts the clustered layout scans over.
pub(super) struct ClusterTable {
    /// Cluster ids by ascending sample count.
    pub(super) by_count: Vec<u32>,
    pub(super) count: Vec<u64>,
    pub(super) bytes: Vec<u64>,
    /// `suffix_max[i]`: largest sample among clusters `by_count[i..]`.
    pub(super) suffix_max: Vec<u64>,
    pub(super) all: SizeStats,
}

impl ClusterTable {
    pub(super) fn new(sizes: &[u64], clusters: &[u32]) -> Self {
        let ncl = clusters.iter().max().map_or(0, |&m| m as usize + 1);
        let (mut count, mut bytes, mut max) = (vec![0u64; ncl], vec![0u64; ncl], vec![0u64; ncl]);
        for (&c, &s) in clusters.iter().zip(sizes) {
            let c = c as usize;
            count[c] += 1;
            bytes[c] = bytes[c].saturating_add(s);
            max[c] = max[c].max(s);
        }
        let mut by_count: Vec<u32> = (0..ncl as u32).filter(|&c| count[c as usize] > 0).collect();
        by_count.sort_unstable_by_key(|&c| (count[c as usize], c));
        let mut suffix_max = vec![0u64; by_count.len() + 1];
        for i in (0..by_count.len()).rev() {
            suffix_max[i] = suffix_max[i + 1].max(max[by_count[i] as usize]);
        }
        Self {
            by_count,
            count,
            bytes,
            suffix_max,
            all: SizeStats::of(sizes.iter().copied()),
        }
    }

    /// Scans mini-epoch counts `from..=to` in order, calling `visit(nm, copied clusters
    /// (prefix of by_count), copied bytes, guaranteed share)` until it returns true.
    pub(super) fn scan(
        &self,
        nodes: u64,
        from: u64,
        to: u64,
        mut visit: impl FnMut(u64, usize, u64, u64) -> bool,
    ) {
        let (mut idx, mut copied_n, mut copied_bytes) = (0usize, 0u64, 0u64);
        for nm in from..=to {
            let parts = nm * nodes;
            while idx < self.by_count.len() && self.count[self.by_count[idx] as usize] < parts {
                let c = self.by_count[idx] as usize;
                copied_n += self.count[c];
                copied_bytes = copied_bytes.saturating_add(self.bytes[c]);
                idx += 1;
            }
            let rest = share_bound(
                self.all.n - copied_n,
                self.all.total - copied_bytes,
                self.suffix_max[idx],
                &self.all,
                parts,
            );
            if visit(nm, idx, copied_bytes, rest.saturating_add(copied_bytes)) {
                return;
            }
            // Past the largest cluster everything is copied and nothing changes any more.
            if idx == self.by_count.len() {
                return;
            }
        }
    }

    /// The smallest count in `from..=to` that fits, and the least any count there needs.
    pub(super) fn first_fit(
        &self,
        nodes: u64,
        from: u64,
        to: u64,
        slot: u64,
    ) -> (Option<u64>, u64) {
        let (mut found, mut best) = (None, u64::MAX);
        self.scan(nodes, from, to, |nm, _, _, need| {
            best = best.min(need);
            if need <= slot {
                found = Some(nm);
            }
            found.is_some()
        });
        (found, best)
    }
}

pub(super) fn clustered_layout(
    samples: &SampleSet<'_>,
    cfg: &PlanConfig,
) -> Result<Layout, PlanError> {
    let clusters = samples.clusters.expect("validated");
    let table = ClusterTable::new(samples.sizes, clusters);
    match cfg.cluster_copies {
        ClusterCopies::PerNode => per_node_layout(&table, cfg),
        ClusterCopies::PerShare => per_share_layout(&table, cfg),
    }
}

/// `per-node` copies: the clusters with fewer samples than nodes, whatever `nm`. A share holds
/// at most the bound of the rest over `nm × nodes` shares plus the heaviest mini-epoch of the
/// copies balanced over `nm` (the balancing step's bound with the clusters as items); both fall
/// as `nm` grows, so the smallest count that fits is found by binary search.
fn per_node_layout(table: &ClusterTable, cfg: &PlanConfig) -> Result<Layout, PlanError> {
    let n = table.all.n;
    let nodes = u64::from(cfg.nodes);
    let slot = cfg.slot_bytes;
    let idx = table
        .by_count
        .partition_point(|&c| table.count[c as usize] < nodes);
    let small = &table.by_count[..idx];
    let copied_n: u64 = small.iter().map(|&c| table.count[c as usize]).sum();
    let copies = SizeStats::of(small.iter().map(|&c| table.bytes[c as usize]));
    let bound = |nm: u64| {
        let rest = share_bound(
            n - copied_n,
            table.all.total - copies.total,
            table.suffix_max[idx],
            &table.all,
            nm * nodes,
        );
        rest.saturating_add(share_bound(copies.n, copies.total, copies.max, &copies, nm))
    };
    // The bound falls with nm, so if the most mini-epochs allowed do not fit, none does.
    let best = bound(n);
    if best > slot {
        return Err(PlanError::ClustersTooLarge {
            best,
            slot_bytes: slot,
            copies: cfg.cluster_copies,
        });
    }
    let needed = smallest(n, |nm| bound(nm) <= slot);
    let nm = match cfg.mini_epochs {
        None => needed,
        Some(req) if req == 0 || bound(u64::from(req)) > slot => {
            return Err(PlanError::TooFewMiniEpochs {
                requested: req,
                bytes: bound(u64::from(req.max(1))),
                slot_bytes: slot,
                needed: needed as u32,
            });
        }
        Some(req) => u64::from(req),
    };
    let mut copied = vec![false; table.count.len()];
    for &c in small {
        copied[c as usize] = true;
    }
    Ok(Layout {
        nm: nm as u32,
        copied,
        copied_bytes: copies.total,
        bound: Some(bound(nm)),
    })
}

/// `per-share` copies: the clusters with fewer samples than `nm × nodes`, in every share.
fn per_share_layout(table: &ClusterTable, cfg: &PlanConfig) -> Result<Layout, PlanError> {
    let n = table.all.n;
    let nodes = u64::from(cfg.nodes);
    let slot = cfg.slot_bytes;
    let too_large = |best| PlanError::ClustersTooLarge {
        best,
        slot_bytes: slot,
        copies: cfg.cluster_copies,
    };
    let nm = match cfg.mini_epochs {
        None => {
            let (found, best) = table.first_fit(nodes, 1, n, slot);
            found.ok_or_else(|| too_large(best))?
        }
        Some(req) => {
            let mut need = u64::MAX;
            table.scan(
                nodes,
                u64::from(req.max(1)),
                u64::from(req.max(1)),
                |_, _, _, b| {
                    need = b;
                    true
                },
            );
            if req == 0 || need > slot {
                // Prefer the next count up that fits; copies make smaller counts fit sometimes
                // when larger ones do not, so fall back to the smallest overall.
                let above = table.first_fit(nodes, u64::from(req) + 1, n, slot).0;
                let (overall, best) = table.first_fit(nodes, 1, n, slot);
                let needed = above.or(overall).ok_or_else(|| too_large(best))?;
                return Err(PlanError::TooFewMiniEpochs {
                    requested: req,
                    bytes: need,
                    slot_bytes: slot,
                    needed: needed as u32,
                });
            }
            u64::from(req)
        }
    };
    let mut copied = vec![false; table.count.len()];
    let (mut copied_bytes, mut bound) = (0, 0);
    table.scan(nodes, nm, nm, |_, idx, cb, b| {
        for &c in &table.by_count[..idx] {
            copied[c as usize] = true;
        }
        (copied_bytes, bound) = (cb, b);
        true
    });
    Ok(Layout {
        nm: nm as u32,
        copied,
        copied_bytes,
        bound: Some(bound),
    })
}
