//! The crate's only sources of randomness, both pure functions of their inputs.
//!
//! * [`PlanRng`]: ChaCha8 seeded by a SplitMix64 mix of `(seed, epoch)`, with this module's own
//!   bounded draw (Lemire) and Fisher–Yates shuffle, the approach of `prefetcher`'s planner, so
//!   that a share depends on ChaCha8's specified output alone and never on `rand`'s algorithms.
//!   The mixing constants differ from `prefetcher`'s, so the aggregate shares are not the
//!   single-node plan's order under another name.
//! * [`keep_draw`]: one uniform number per `(seed, node, sample)` from SplitMix64's finaliser.
//!   It is a counter-based draw rather than a stream because each node decides on every sample
//!   independently and the other nodes must reach the same decision without replaying a stream.

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The shares' source of randomness (see the module docs).
pub(crate) struct PlanRng(ChaCha8Rng);

pub(crate) fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl PlanRng {
    pub(crate) fn new(seed: u64, epoch: u64) -> Self {
        let mut a = seed ^ 0x3C6E_F372_FE94_F82B;
        let mut b = epoch ^ 0xA54F_F53A_5F1D_36F1;
        let mut key = [0u8; 32];
        for chunk in key.chunks_mut(8) {
            let w = splitmix64(&mut a) ^ splitmix64(&mut b).rotate_left(17);
            chunk.copy_from_slice(&w.to_le_bytes());
        }
        Self(ChaCha8Rng::from_seed(key))
    }

    /// Uniform in `0..n` (`n ≥ 1`), by Lemire's multiply-and-reject.
    pub(crate) fn below(&mut self, n: u32) -> u32 {
        debug_assert!(n > 0);
        let mut m = u64::from(self.0.next_u32()) * u64::from(n);
        if (m as u32) < n {
            let threshold = n.wrapping_neg() % n;
            while (m as u32) < threshold {
                m = u64::from(self.0.next_u32()) * u64::from(n);
            }
        }
        (m >> 32) as u32
    }

    /// Fisher–Yates.
    pub(crate) fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below((i + 1) as u32) as usize;
            v.swap(i, j);
        }
    }
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
        let mut rng = PlanRng::new(42, 3);
        let draws: Vec<u32> = (0..4).map(|_| rng.below(1000)).collect();
        let again: Vec<u32> = {
            let mut rng = PlanRng::new(42, 3);
            (0..4).map(|_| rng.below(1000)).collect()
        };
        assert_eq!(draws, vec![66, 590, 503, 924]);
        assert_eq!(draws, again);
        let other: Vec<u32> = {
            let mut rng = PlanRng::new(42, 4);
            (0..4).map(|_| rng.below(1000)).collect()
        };
        assert_ne!(draws, other);
        assert_eq!(keep_draw(42, 3, 9), 0.860_969_635_808_858_3);
    }
}
