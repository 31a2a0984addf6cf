//! The planners' seeded randomness: a pure function of `(seed, epoch)`.
//!
//! [`PlanRng`] is ChaCha8 keyed by a SplitMix64 mix of `(seed, epoch)`, with its own bounded
//! draw (Lemire's multiply-and-reject) and Fisher–Yates shuffle. Owning the keying, the draw
//! and the shuffle means a plan depends on ChaCha8's output alone, which its specification
//! fixes, and never on `rand`'s algorithms, which may change between versions: a saved
//! position resumes in the same plan after an upgrade, and every node of a job computes the
//! same plan.
//!
//! Each planner keys its streams in a [`Domain`] of its own (two words mixed into the seed and
//! the epoch), so that two planners given the same seed do not draw the same numbers: the
//! aggregate-cache shares (`metfs-shuffle`) are not the single-node order (`metfs-plan`) under
//! another name.
//!
//! A crate of its own because `metfs-plan` and `metfs-shuffle` both plan with it and neither depends
//! on the other.

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The two words a planner mixes into `(seed, epoch)` before keying (see the crate docs).
#[derive(Clone, Copy, Debug)]
pub struct Domain {
    /// XORed into the seed.
    pub seed: u64,
    /// XORed into the epoch.
    pub epoch: u64,
}

/// A planner's stream of random numbers for one `(seed, epoch)` (see the crate docs).
pub struct PlanRng(ChaCha8Rng);

/// SplitMix64's step: advances `state` and returns its mix. Also a counter-based hash when
/// `state` is set from the inputs each time.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl PlanRng {
    /// The stream of `(seed, epoch)` in `domain`.
    pub fn new(domain: Domain, seed: u64, epoch: u64) -> Self {
        let mut a = seed ^ domain.seed;
        let mut b = epoch ^ domain.epoch;
        let mut key = [0u8; 32];
        for chunk in key.chunks_mut(8) {
            let w = splitmix64(&mut a) ^ splitmix64(&mut b).rotate_left(17);
            chunk.copy_from_slice(&w.to_le_bytes());
        }
        Self(ChaCha8Rng::from_seed(key))
    }

    /// Uniform in `0..n` (`n ≥ 1`), by Lemire's multiply-and-reject.
    pub fn below(&mut self, n: u32) -> u32 {
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
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below((i + 1) as u32) as usize;
            v.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Domain = Domain { seed: 1, epoch: 2 };

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut r = PlanRng::new(D, 9, 0);
        let mut seen = [false; 7];
        for _ in 0..1000 {
            let x = r.below(7);
            assert!(x < 7);
            seen[x as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(PlanRng::new(D, 9, 0).below(1), 0);
    }

    #[test]
    fn shuffle_permutes() {
        let mut v: Vec<u32> = (0..100).collect();
        PlanRng::new(D, 3, 4).shuffle(&mut v);
        assert_ne!(v, (0..100).collect::<Vec<_>>());
        v.sort_unstable();
        assert_eq!(v, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn domains_seeds_and_epochs_give_other_streams() {
        let draw = |d: Domain, s, e| {
            let mut r = PlanRng::new(d, s, e);
            (0..4).map(|_| r.below(1 << 30)).collect::<Vec<_>>()
        };
        let base = draw(D, 5, 6);
        assert_eq!(base, draw(D, 5, 6));
        assert_ne!(base, draw(Domain { seed: 3, epoch: 2 }, 5, 6));
        assert_ne!(base, draw(D, 7, 6));
        assert_ne!(base, draw(D, 5, 7));
    }
}
