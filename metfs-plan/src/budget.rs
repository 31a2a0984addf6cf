//! The byte budget of a node's cache: what one slot may hold once the reserve for metadata is
//! set aside, and what one sample takes of it. It sits beside the planner because the
//! planner's `slot_bytes` comes from it, and `metfs plan` must compute the same split as a
//! mount does.
//!
//! [`footprint`] is the one rule of a sample's share of the budget: its size in whole blocks,
//! a transform's growth, or a packed row's bytes ([`Staged`]). Every planner of slots (the
//! daemon, `metfs plan`, `metfs dds init`, the aggregate exchange, tests and examples) calls
//! it, so that a queue, an exchange plan and a mount budget the same bytes for a sample.
//!
//! The reserve covers everything in the cache directory that is not a staged sample: the saved
//! catalog, two slots' journals, the directories (counted with their entries, since ext4 never
//! shrinks a directory), a few small files of the cache's owner (its position, lock and
//! metrics file, with their temporaries), and whatever more the caller keeps there (`extra`:
//! its logs, HDF5 container headers).

use thiserror::Error;

use crate::size::format_bytes;
use crate::CatalogSamples;

/// Why a budget cannot be split.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum BudgetError {
    /// The budget does not even cover the metadata.
    #[error("budget {budget} is too small: metadata alone needs {reserve}")]
    BelowReserve { budget: String, reserve: String },
}

/// Accounting granularity: file sizes are rounded up to this.
pub const BLOCK: u64 = 4096;

/// How the budget splits into slots and metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Budget {
    /// The whole budget.
    pub budget: u64,
    /// Bytes set aside for metadata (catalog, journals, state, logs, directories).
    pub reserve: u64,
    /// Most footprint bytes one slot may hold.
    pub slot_bytes: u64,
    /// Accounting granularity: file sizes are rounded up to this.
    pub block: u64,
}

impl Budget {
    /// Splits `budget` for `catalog`, whose saved form takes `catalog_bytes`, keeping `extra`
    /// more bytes of reserve for the caller's own files (see the module doc).
    pub fn new<C: CatalogSamples + ?Sized>(
        budget: u64,
        catalog: &C,
        catalog_bytes: u64,
        extra: u64,
    ) -> Result<Self, BudgetError> {
        // Journals: every sample at most once per slot, as `ID` (<= 11 bytes a line) or
        // `failed ID` (<= 18), plus `complete`; two slots.
        let journals = 2 * (18 * catalog.len() as u64 + BLOCK);
        // Directories: a block each for two slots' directories (+ the slot roots), and for
        // slots/, tmp/ and run/. A directory with many entries grows past one block: ext4 keeps
        // 8 bytes + the name (4-aligned) per entry and never shrinks a directory, so each slot
        // is counted with every sample's entry, and tmp/ (which may once have held a whole
        // slot's files, named `SLOT-ID`, <= 26 bytes) likewise.
        let entries: u64 = (0..catalog.len() as u32)
            .map(|id| (8 + catalog.dir_and_name(id).1.len() as u64).next_multiple_of(4))
            .sum();
        let tmp_entries = 36 * catalog.len() as u64;
        let dirs = 2 * (catalog.dir_count() as u64 + 1) * BLOCK
            + 3 * BLOCK
            + 2 * round_up(entries)
            + round_up(tmp_entries);
        // The position and its temporary, the lock file, and a metrics file (and its
        // temporary) kept in the cache.
        let state = 8 * BLOCK;
        // Saturating: an absurd catalog or extra makes the reserve exceed any budget, an error
        // below, rather than a wrapped sum.
        let reserve = [journals, dirs, state, extra]
            .into_iter()
            .fold(round_up(catalog_bytes), u64::saturating_add);
        if budget <= reserve {
            return Err(BudgetError::BelowReserve {
                budget: format_bytes(budget),
                reserve: format_bytes(reserve),
            });
        }
        Ok(Self {
            budget,
            reserve,
            slot_bytes: (budget - reserve) / 2,
            block: BLOCK,
        })
    }
}

/// How a sample is kept in a slot, which decides its [`footprint`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Staged {
    /// Copied as a file of its own.
    Copy,
    /// Transformed into a file of its own of at most `growth` times its size (the transform
    /// refuses a larger output, so the budget holds whatever it writes).
    Transformed {
        /// The most an output may take, as a multiple of the sample's size.
        growth: f64,
    },
    /// A row packed into an HDF5 container file: rows are not rounded to blocks, and each
    /// container's headers and chunk indexes are in the reserve (the caller's `extra`).
    Row,
}

/// The bytes a sample of `size` source bytes takes of a slot's budget when kept as `staged`:
/// a copy, its size in whole [`BLOCK`]s; a transformed sample, `growth` times its size in
/// whole blocks, at least one (an empty sample may become a small array); a packed row, its
/// bytes. The one rule: the plan, the queue's shards, the exchange and the transform's size
/// check all take a sample's footprint from here.
pub fn footprint(size: u64, staged: Staged) -> u64 {
    match staged {
        Staged::Copy => round_up(size),
        Staged::Transformed { growth } => round_up((size as f64 * growth).ceil() as u64).max(BLOCK),
        Staged::Row => size,
    }
}

/// [`footprint`] of every size in `sizes`, in order: what the planner's `SampleSet` takes.
pub fn footprints(sizes: &[u64], staged: Staged) -> Vec<u64> {
    sizes.iter().map(|&s| footprint(s, staged)).collect()
}

/// `size` rounded up to whole blocks: what a metadata file (a journal, a directory, the saved
/// catalog) takes of the cache. A sample's share of the budget is [`footprint`]'s, never this.
pub fn round_up(size: u64) -> u64 {
    // Saturating: a size within a block of 2^64 is too large for any budget anyway, and the
    // planner rejects footprints whose sum overflows.
    size.div_ceil(BLOCK).saturating_mul(BLOCK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_catalog::Samples;

    proptest::proptest! {
        /// Any budget, catalog sizes and metadata sizes up to u64::MAX: the split never panics,
        /// and when it succeeds two slots and the reserve fit in the budget.
        #[test]
        fn prop_budget_never_overflows(
            budget in proptest::prelude::any::<u64>(),
            sizes in proptest::collection::vec(proptest::prelude::any::<u64>(), 1..6),
            catalog_bytes in proptest::prelude::any::<u64>(),
            extra in proptest::prop_oneof![proptest::strategy::Just(0u64), proptest::prelude::any::<u64>()],
        ) {
            let cat = Samples::new(sizes.clone(), 1);
            if let Ok(b) = Budget::new(budget, &cat, catalog_bytes, extra) {
                let used = u128::from(b.slot_bytes) * 2 + u128::from(b.reserve);
                proptest::prop_assert!(used <= u128::from(budget));
            }
            for &s in &sizes {
                proptest::prop_assert!(round_up(s) >= s);
                proptest::prop_assert!(footprint(s, Staged::Copy) >= s);
            }
        }
    }

    #[test]
    fn budget_reserve_and_slots() {
        let cat = Samples::new(vec![1000; 100], 4);
        let extra = 3 << 19;
        let b = Budget::new(64 << 20, &cat, 5000, extra).unwrap();
        assert!(b.reserve > extra);
        assert_eq!(b.slot_bytes, (b.budget - b.reserve) / 2);
        // The extra reserve comes out of the slots, byte for byte (up to the halving).
        let without = Budget::new(64 << 20, &cat, 5000, 0).unwrap();
        assert_eq!(without.reserve + extra, b.reserve);
        let e = Budget::new(1 << 20, &cat, 5000, extra).unwrap_err();
        assert!(
            e.to_string().contains("budget 1.00 MiB is too small"),
            "{e}"
        );
        assert_eq!(round_up(0), 0);
        assert_eq!(round_up(1), 4096);
        assert_eq!(round_up(4096), 4096);
    }

    #[test]
    fn footprint_by_how_a_sample_is_kept() {
        assert_eq!(footprint(0, Staged::Copy), 0);
        assert_eq!(footprint(1, Staged::Copy), BLOCK);
        assert_eq!(footprint(BLOCK, Staged::Copy), BLOCK);
        assert_eq!(footprint(BLOCK + 1, Staged::Copy), 2 * BLOCK);
        // A transform's growth is budgeted, in whole blocks, at least one.
        let t = |growth| Staged::Transformed { growth };
        assert_eq!(footprint(3000, t(2.0)), 2 * BLOCK);
        assert_eq!(footprint(3000, t(1.0)), BLOCK);
        assert_eq!(footprint(0, t(1.0)), BLOCK);
        assert_eq!(footprint(10_000, t(0.5)), 2 * BLOCK);
        // Packed rows are not rounded.
        assert_eq!(footprint(3000, Staged::Row), 3000);
        assert_eq!(footprints(&[1, 5000], Staged::Copy), vec![BLOCK, 2 * BLOCK]);
        // Saturating: a size within a block of 2^64 gives the largest footprint, not a wrap.
        assert_eq!(footprint(u64::MAX, Staged::Copy), u64::MAX);
    }
}
