//! Input checks and the share bound: [`validate`] refuses inputs no strategy can plan, and
//! [`share_bound`] is the most bytes any balanced share can hold (the bound proved in the
//! module docs of the planner), computed from [`SizeStats`] without sorting every size.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::{PlanConfig, PlanError, SampleSet, Strategy};

/// Refuses inputs no strategy can plan. Returns the number of samples.
pub(super) fn validate(samples: &SampleSet<'_>, cfg: &PlanConfig) -> Result<usize, PlanError> {
    if cfg.nodes == 0 || cfg.node_rank >= cfg.nodes {
        return Err(PlanError::BadNode {
            rank: cfg.node_rank,
            nodes: cfg.nodes,
        });
    }
    let n = samples.sizes.len();
    if n == 0 {
        return Err(PlanError::Empty);
    }
    // u32::MAX itself marks copied samples and empty slots.
    if n >= u32::MAX as usize {
        return Err(PlanError::TooManySamples { samples: n });
    }
    for (what, col) in [
        ("labels", samples.labels),
        ("cluster ids", samples.clusters),
    ] {
        if let Some(col) = col {
            if col.len() != n {
                return Err(PlanError::LengthMismatch {
                    what,
                    len: col.len(),
                    samples: n,
                });
            }
        }
    }
    match cfg.strategy {
        Strategy::Stratified if samples.labels.is_none() => {
            return Err(PlanError::MissingClasses(cfg.strategy, "labels"));
        }
        Strategy::Clustered if samples.clusters.is_none() => {
            return Err(PlanError::MissingClasses(cfg.strategy, "cluster ids"));
        }
        _ => {}
    }
    // Every sum the planner makes is of a subset of the sizes; if the whole fits, they do.
    let mut total = 0u64;
    for (i, &s) in samples.sizes.iter().enumerate() {
        total = total
            .checked_add(s)
            .ok_or(PlanError::TotalTooLarge { sample: i as u32 })?;
    }
    // The largest offender, so that one budget increase fixes every sample.
    let (mut id, mut size) = (0usize, 0u64);
    for (i, &s) in samples.sizes.iter().enumerate() {
        if s > size {
            (id, size) = (i, s);
        }
    }
    if size > cfg.slot_bytes {
        return Err(PlanError::SampleTooLarge {
            sample: id as u32,
            size,
            slot_bytes: cfg.slot_bytes,
        });
    }
    Ok(n)
}

/// How many of the largest sizes [`SizeStats`] keeps exactly.
pub(super) const TOP: usize = 64;

/// What the share bound needs to know about a set of sizes.
#[derive(Debug, Clone, Default)]
pub(super) struct SizeStats {
    pub(super) n: u64,
    pub(super) total: u64,
    pub(super) max: u64,
    /// The largest sizes, descending (at most [`TOP`]).
    pub(super) top: Vec<u64>,
}

impl SizeStats {
    pub(super) fn of(sizes: impl Iterator<Item = u64>) -> Self {
        let mut heap: BinaryHeap<Reverse<u64>> = BinaryHeap::with_capacity(TOP + 1);
        let mut st = SizeStats::default();
        for s in sizes {
            st.n += 1;
            st.total = st.total.saturating_add(s);
            st.max = st.max.max(s);
            if heap.len() < TOP {
                heap.push(Reverse(s));
            } else if heap.peek().is_some_and(|r| r.0 < s) {
                heap.pop();
                heap.push(Reverse(s));
            }
        }
        st.top = heap.into_iter().map(|r| r.0).collect();
        st.top.sort_unstable_by(|a, b| b.cmp(a));
        st
    }

    /// An upper bound on the sum of the `k` largest sizes (exact for `k ≤ TOP`).
    pub(super) fn top_sum(&self, k: u64) -> u64 {
        let k = k.min(self.n);
        let exact = (k as usize).min(self.top.len());
        let head: u64 = self.top[..exact]
            .iter()
            .fold(0, |a, &b| a.saturating_add(b));
        let rest = (k - exact as u64).saturating_mul(self.top.last().copied().unwrap_or(0));
        head.saturating_add(rest)
    }
}

/// The most bytes any of `parts` balanced shares can hold when `n` samples of `total` bytes
/// (largest `max`) are spread by [`balance`]; see the module docs for the proof.
/// `top` bounds the sum of the largest samples.
pub(super) fn share_bound(n: u64, total: u64, max: u64, top: &SizeStats, parts: u64) -> u64 {
    if n == 0 {
        return 0;
    }
    let parts = parts.max(1);
    let spread = (u128::from(total) + u128::from(parts - 1) * u128::from(max)) / u128::from(parts);
    let by_spread = u64::try_from(spread).unwrap_or(u64::MAX);
    by_spread.min(top.top_sum(n.div_ceil(parts)))
}
