//! The plan's only source of randomness: `metfs-planrng`'s ChaCha8 stream of `(seed, epoch)`, in the
//! single-node planner's domain (so a plan depends on ChaCha8's specified output alone).

pub(super) use metfs_planrng::PlanRng;

/// The single-node planner's domain. Changing it changes every plan, and a saved position
/// would then resume in another order.
const DOMAIN: metfs_planrng::Domain = metfs_planrng::Domain {
    seed: 0x6A09_E667_F3BC_C909,
    epoch: 0xBB67_AE85_84CA_A73B,
};

/// The stream of `(seed, epoch)`.
pub(super) fn stream(seed: u64, epoch: u64) -> PlanRng {
    PlanRng::new(DOMAIN, seed, epoch)
}
