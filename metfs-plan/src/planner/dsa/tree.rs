//! The dependent sampling tree of Definition 1 (paper 004): the structure the sampler's groups
//! follow, built on its own for tests and the examples that check a sampler against it.

use std::collections::BTreeSet;

/// The dependent sampling tree of Definition 1 over datasets sorted by size (ascending, ties
/// by index): the root is the intersection of all, its right child the rest of the smallest
/// dataset, its left child the tree of the others with the root removed; one dataset is a
/// single vertex. Stored as its left spine (`spine[0]` the root, `spine[n−1]` the lone vertex
/// at the bottom) and the right leaves (`leaves[i]` hangs off `spine[i]`, for the `i`-th
/// smallest dataset). The vertices on the path from the root to job `order[i]`'s leaf
/// partition its dataset; the spine's vertices are disjoint (leaves are not: a sample of
/// `D_1 ∩ D_2` outside `D_3` is in the leaves of both); the height is `n − 1`.
///
/// The sampler keeps the spine and not the leaves: `spine[k]` is its group of the samples of
/// level `k` (needed by the jobs `order[k..]`, not by all of `order[k−1..]`), which is how
/// each loop's intersection is a prefix sum of group sizes; a leaf is drawn from by rejection
/// from the job's own samples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SamplingTree {
    /// Job indices, smallest dataset first.
    pub order: Vec<usize>,
    /// The left spine, root first; sorted sample ids.
    pub spine: Vec<Vec<u32>>,
    /// The right leaves: `leaves[i]` is the child of `spine[i]`; sorted sample ids.
    pub leaves: Vec<Vec<u32>>,
}

impl SamplingTree {
    /// Builds the tree by the recursion of Definition 1.
    pub fn build(datasets: &[&[u32]]) -> Self {
        let mut order: Vec<usize> = (0..datasets.len()).collect();
        order.sort_by_key(|&j| (datasets[j].len(), j));
        let mut rest: Vec<BTreeSet<u32>> = order
            .iter()
            .map(|&j| datasets[j].iter().copied().collect())
            .collect();
        let (mut spine, mut leaves) = (Vec::new(), Vec::new());
        let mut k = 0;
        while k < rest.len() {
            if k + 1 == rest.len() {
                spine.push(rest[k].iter().copied().collect());
                break;
            }
            let root: BTreeSet<u32> = rest[k]
                .iter()
                .copied()
                .filter(|s| rest[k + 1..].iter().all(|d| d.contains(s)))
                .collect();
            leaves.push(rest[k].difference(&root).copied().collect());
            spine.push(root.iter().copied().collect());
            for d in &mut rest[k + 1..] {
                d.retain(|s| !root.contains(s));
            }
            k += 1;
        }
        Self {
            order,
            spine,
            leaves,
        }
    }

    /// Edges from the root to the deepest vertex.
    pub fn height(&self) -> usize {
        self.spine.len().saturating_sub(1)
    }
}
