//! The plan's only source of randomness: ChaCha8 seeded by a SplitMix64 mix of
//! `(seed, epoch)`, with this module's own bounded draw (Lemire) and Fisher–Yates shuffle, so
//! that a plan depends on ChaCha8's specified output alone and never on `rand`'s algorithms.

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The plan's only source of randomness. Owning the seeding, the bounded draw and the shuffle
/// means a plan depends on ChaCha8's output alone, which is fixed by its specification.
pub(super) struct PlanRng(ChaCha8Rng);

pub(super) fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl PlanRng {
    pub(super) fn new(seed: u64, epoch: u64) -> Self {
        let mut a = seed ^ 0x6A09_E667_F3BC_C909;
        let mut b = epoch ^ 0xBB67_AE85_84CA_A73B;
        let mut key = [0u8; 32];
        for chunk in key.chunks_mut(8) {
            let w = splitmix64(&mut a) ^ splitmix64(&mut b).rotate_left(17);
            chunk.copy_from_slice(&w.to_le_bytes());
        }
        Self(ChaCha8Rng::from_seed(key))
    }

    /// Uniform in `0..n` (`n ≥ 1`), by Lemire's multiply-and-reject.
    pub(super) fn below(&mut self, n: u32) -> u32 {
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
    pub(super) fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below((i + 1) as u32) as usize;
            v.swap(i, j);
        }
    }
}
