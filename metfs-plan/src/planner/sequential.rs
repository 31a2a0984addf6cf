//! The `sequential` strategy's cuts: the catalog order cut into contiguous shares, each cut
//! as near the even byte position as the budget and the rest of the sequence allow.

pub(super) fn prefix_sums(sizes: &[u64]) -> Vec<u64> {
    let mut prefix = Vec::with_capacity(sizes.len() + 1);
    let mut acc = 0u64;
    prefix.push(0);
    for &s in sizes {
        acc = acc.saturating_add(s);
        prefix.push(acc);
    }
    prefix
}

/// Index `i` whose prefix sum is nearest to `target` (the earlier one on a tie).
pub(super) fn nearest_cut(prefix: &[u64], target: u64) -> usize {
    let t = prefix.partition_point(|&p| p < target);
    if t == 0 {
        return 0;
    }
    if t == prefix.len() || target - prefix[t - 1] <= prefix[t] - target {
        t - 1
    } else {
        t
    }
}

/// The largest of `parts` contiguous runs cut at the even byte positions, with no budget:
/// what a too-small mini-epoch count would put in one share.
pub(super) fn even_cuts_largest(sizes: &[u64], parts: usize) -> u64 {
    let prefix = prefix_sums(sizes);
    let total = *prefix.last().unwrap_or(&0);
    let mut prev = 0usize;
    let mut largest = 0;
    for j in 1..=parts {
        let ideal = (u128::from(total) * j as u128 / parts as u128) as u64;
        let cut = if j == parts {
            sizes.len()
        } else {
            nearest_cut(&prefix, ideal).max(prev)
        };
        largest = largest.max(prefix[cut] - prefix[prev]);
        prev = cut;
    }
    largest
}

/// Cuts the catalog order into `parts` contiguous runs of at most `slot` bytes, each cut as
/// near the even byte position as the budget and the rest of the sequence allow. Needs
/// `fewest_runs(sizes, slot) ≤ parts`. Returns `parts + 1` cut positions.
pub(super) fn sequential_cuts(sizes: &[u64], slot: u64, parts: usize) -> Vec<usize> {
    let n = sizes.len();
    let prefix = prefix_sums(sizes);
    let total = prefix[n];
    // fewest[i]: fewest runs of at most `slot` bytes covering samples i..; right to left with
    // a sliding window, since the farthest end of a run starting at i never grows as i falls.
    let mut fewest = vec![0u32; n + 1];
    let (mut end, mut window) = (n, 0u64);
    for i in (0..n).rev() {
        window += sizes[i];
        while window > slot {
            end -= 1;
            window -= sizes[end];
        }
        fewest[i] = fewest[end] + 1;
    }
    let mut cuts = Vec::with_capacity(parts + 1);
    cuts.push(0);
    let mut start = 0usize;
    for j in 0..parts {
        let left = parts - j;
        if left == 1 {
            cuts.push(n);
            break;
        }
        let limit = prefix[start].saturating_add(slot);
        let cap_end = prefix.partition_point(|&p| p <= limit) - 1;
        let spare = n - start >= left;
        // Leave every later share a sample when there are enough to go round.
        let hi = if spare {
            cap_end.min(n - (left - 1))
        } else {
            cap_end
        };
        // The earliest end after which the rest still fits in the shares that remain.
        let rest_fits = start + fewest[start..].partition_point(|&f| f as usize > left - 1);
        let lo = if spare {
            rest_fits.max(start + 1)
        } else {
            rest_fits
        };
        debug_assert!(lo <= hi, "sequential cut infeasible: {lo} > {hi}");
        let ideal = (u128::from(total) * (j as u128 + 1) / parts as u128) as u64;
        let cut = nearest_cut(&prefix, ideal).clamp(lo, hi);
        cuts.push(cut);
        start = cut;
    }
    cuts
}
