//! From one epoch's layout to the next: each sample's source (see the module docs of `plan`).

use super::{Layout, PlanError};

/// Where one node gets the samples of its next cache. Each list is ascending by sample id.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodePlan {
    /// Held in the previous epoch: linked, not moved.
    pub local: Vec<u32>,
    /// `(sample, from)`: sent by peer `from`, which held it in the previous epoch.
    pub peer: Vec<(u32, u32)>,
    /// Held by no live node: read from the capacity tier.
    pub tier: Vec<u32>,
    /// Bytes of `local`.
    pub local_bytes: u64,
    /// Bytes of `peer`.
    pub peer_bytes: u64,
    /// Bytes of `tier`.
    pub tier_bytes: u64,
}

/// Every node's sources for the next epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// The epoch being filled.
    pub epoch: u64,
    /// One plan per node rank; a dead node's is empty.
    pub nodes: Vec<NodePlan>,
    /// The ranks that were dead when it was planned, ascending.
    pub dead: Vec<u32>,
}

impl Transition {
    /// Bytes all nodes read from the tier.
    pub fn tier_bytes(&self) -> u64 {
        self.nodes.iter().map(|p| p.tier_bytes).sum()
    }

    /// Bytes all nodes receive from peers.
    pub fn peer_bytes(&self) -> u64 {
        self.nodes.iter().map(|p| p.peer_bytes).sum()
    }

    /// Bytes all nodes link locally.
    pub fn local_bytes(&self) -> u64 {
        self.nodes.iter().map(|p| p.local_bytes).sum()
    }

    /// Whether `node` was dead when this was planned.
    pub fn is_dead(&self, node: u32) -> bool {
        self.dead.binary_search(&node).is_ok()
    }
}

/// The sources of each live node's cache in `next`: local if it held the sample in `prev`,
/// else a live peer that held it, else the tier. With no `prev` (epoch 0) everything comes
/// from the tier. `dead` lists ranks that take no part (they neither send nor receive).
pub fn transition(
    prev: Option<&Layout>,
    next: &Layout,
    sizes: &[u64],
    dead: &[u32],
) -> Result<Transition, PlanError> {
    let n = next.nodes();
    if sizes.len() != next.samples() as usize {
        return Err(PlanError::Mismatch(format!(
            "the catalog has {} samples, the layout of epoch {} {}",
            sizes.len(),
            next.epoch(),
            next.samples()
        )));
    }
    if let Some(prev) = prev {
        if prev.nodes() != n || prev.samples() != next.samples() {
            return Err(PlanError::Mismatch(format!(
                "epoch {} has {} nodes and {} samples, epoch {} has {} nodes and {} samples",
                prev.epoch(),
                prev.nodes(),
                prev.samples(),
                next.epoch(),
                n,
                next.samples()
            )));
        }
        if prev.config().seed != next.config().seed {
            return Err(PlanError::Mismatch(format!(
                "epoch {} was planned with seed {}, epoch {} with seed {}",
                prev.epoch(),
                prev.config().seed,
                next.epoch(),
                next.config().seed
            )));
        }
    }
    let mut alive = vec![true; n as usize];
    for &d in dead {
        if d >= n {
            return Err(PlanError::BadNode { rank: d, nodes: n });
        }
        alive[d as usize] = false;
    }
    let mut sent = vec![0u64; n as usize];
    let mut nodes = Vec::with_capacity(n as usize);
    for i in 0..n {
        let mut plan = NodePlan::default();
        if !alive[i as usize] {
            nodes.push(plan);
            continue;
        }
        for &j in next.cache(i) {
            let size = sizes[j as usize];
            match prev.and_then(|prev| source(prev, i, j, &alive, &sent)) {
                Some(from) if from == i => {
                    plan.local.push(j);
                    plan.local_bytes += size;
                }
                Some(from) => {
                    plan.peer.push((j, from));
                    plan.peer_bytes += size;
                    sent[from as usize] += size;
                }
                None => {
                    plan.tier.push(j);
                    plan.tier_bytes += size;
                }
            }
        }
        nodes.push(plan);
    }
    let mut dead = dead.to_vec();
    dead.sort_unstable();
    dead.dedup();
    Ok(Transition {
        epoch: next.epoch(),
        nodes,
        dead,
    })
}

/// Who gives `node` sample `j`: itself if it held it, else the owner if alive, else the
/// least-loaded live holder, else nobody.
fn source(prev: &Layout, node: u32, j: u32, alive: &[bool], sent: &[u64]) -> Option<u32> {
    if prev.holds(node, j) {
        return Some(node);
    }
    let owner = prev.owner(j);
    if alive.get(owner as usize) == Some(&true) {
        return Some(owner);
    }
    (0..prev.nodes())
        .filter(|&k| k != node && alive[k as usize] && prev.holds(k, j))
        .min_by_key(|&k| (sent[k as usize], k))
}
