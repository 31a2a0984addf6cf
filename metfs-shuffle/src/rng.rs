//! The crate's only sources of randomness, both pure functions of their inputs.
//!
//! * [`stream`]: `metfs-planrng`'s ChaCha8 stream of `(seed, epoch)`, as `metfs-plan`'s planner
//!   uses, so that a share depends on ChaCha8's specified output alone and never on `rand`'s
//!   algorithms; in a domain of its own, so the aggregate shares are not the single-node
//!   plan's order under another name.
//! * [`keep_draw`]: one uniform number per `(seed, node, sample)` from SplitMix64's finaliser.
//!   It is a counter-based draw rather than a stream because each node decides on every sample
//!   independently and the other nodes must reach the same decision without replaying a stream.

use metfs_planrng::{splitmix64, PlanRng};

/// The aggregate planner's domain (see `metfs-planrng`): other words than `metfs-plan`'s, so the
/// shares are not the single-node order. Changing it changes every node's shares.
const DOMAIN: metfs_planrng::Domain = metfs_planrng::Domain {
    seed: 0x3C6E_F372_FE94_F82B,
    epoch: 0xA54F_F53A_5F1D_36F1,
};

/// The shares' stream of `(seed, epoch)`.
pub(crate) fn stream(seed: u64, epoch: u64) -> PlanRng {
    PlanRng::new(DOMAIN, seed, epoch)
}

/// A uniform draw in `[0, 1)` (53 bits) for "does `node` keep `sample` as an extra".
pub(crate) fn keep_draw(seed: u64, node: u32, sample: u32) -> f64 {
    let mut s = seed ^ 0x510E_527F_ADE6_82D1;
    let base = splitmix64(&mut s);
    let mut t = base ^ ((u64::from(node) << 32) | u64::from(sample));
    let z = splitmix64(&mut t);
    (z >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_draw_is_uniform_enough_and_distinct_per_node() {
        let n = 100_000u32;
        let below_quarter = (0..n).filter(|&j| keep_draw(7, 0, j) < 0.25).count();
        assert!((below_quarter as f64 / f64::from(n) - 0.25).abs() < 0.01);
        let same = (0..n)
            .filter(|&j| (keep_draw(7, 0, j) < 0.5) == (keep_draw(7, 1, j) < 0.5))
            .count();
        assert!((same as f64 / f64::from(n) - 0.5).abs() < 0.01);
        assert_eq!(keep_draw(7, 3, 9), keep_draw(7, 3, 9));
        assert_ne!(keep_draw(7, 3, 9), keep_draw(8, 3, 9));
    }

    #[test]
    fn the_stream_is_pinned() {
        // ChaCha8 is specified; this pins the seeding so that shares never change silently.
        let mut rng = stream(42, 3);
        let draws: Vec<u32> = (0..4).map(|_| rng.below(1000)).collect();
        let again: Vec<u32> = {
            let mut rng = stream(42, 3);
            (0..4).map(|_| rng.below(1000)).collect()
        };
        assert_eq!(draws, vec![66, 590, 503, 924]);
        assert_eq!(draws, again);
        let other: Vec<u32> = {
            let mut rng = stream(42, 4);
            (0..4).map(|_| rng.below(1000)).collect()
        };
        assert_ne!(draws, other);
        assert_eq!(keep_draw(42, 3, 9), 0.860_969_635_808_858_3);
    }
}
