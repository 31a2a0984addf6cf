//! The byte budget: what one slot may hold once the reserve for metadata is set aside, file
//! footprints rounded up to blocks, and the generation's range inside an inode number.

use super::*;

/// How the budget splits into slots and metadata.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Budget {
    /// The whole budget.
    pub budget: u64,
    /// Bytes set aside for metadata (catalog, journals, state, log, directories).
    pub reserve: u64,
    /// Most footprint bytes one slot may hold.
    pub slot_bytes: u64,
    /// Accounting granularity: file sizes are rounded up to this.
    pub block: u64,
}

/// Bytes the log and the run's event log may take: the log rotates at 256 KiB (two files),
/// the event log at 512 KiB (two files).
pub const LOG_RESERVE: u64 = 3 << 19;
/// Staging rate of `prefetch_rate = auto` before the first pass has been timed.
pub const AUTO_TRICKLE: u64 = 256 << 10;
/// Share of the current mini-epoch's expected duration that just-in-time pacing keeps as slack:
/// staging aims to finish when 95% of it has passed, and so runs at 1/0.95 = 1.05x the average
/// rate the mini-epoch needs. With rf >= 4 that is at least a fifth of a pass to absorb a slow
/// pass before it turns into a `wait`, and staging that falls behind anyway runs at the cap.
pub const PACING_MARGIN: f64 = 0.05;
pub(super) const BLOCK: u64 = 4096;

impl Budget {
    /// Splits `budget` for `catalog` whose saved form takes `catalog_bytes`.
    pub fn new(budget: u64, catalog: &Catalog, catalog_bytes: u64) -> Result<Self, DaemonError> {
        Self::with_extra(budget, catalog, catalog_bytes, 0)
    }

    /// As [`Budget::new`], with `extra` more bytes of reserve (e.g. HDF5 file overhead).
    pub fn with_extra(
        budget: u64,
        catalog: &Catalog,
        catalog_bytes: u64,
        extra: u64,
    ) -> Result<Self, DaemonError> {
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
        // state.json and its temporary, the lock file, and a metrics file (and its temporary)
        // kept in the cache.
        let state = 8 * BLOCK;
        // Saturating: an absurd catalog or extra makes the reserve exceed any budget, an error
        // below, rather than a wrapped sum.
        let reserve = [journals, dirs, state, LOG_RESERVE, extra]
            .into_iter()
            .fold(round_up(catalog_bytes), u64::saturating_add);
        if budget <= reserve {
            return Err(DaemonError::BudgetBelowReserve {
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

/// A file's footprint in the cache: its size rounded up to the block size.
pub fn round_up(size: u64) -> u64 {
    // Saturating: a size within a block of 2^64 is too large for any budget anyway, and the
    // planner rejects footprints whose sum overflows.
    size.div_ceil(BLOCK).saturating_mul(BLOCK)
}

/// Generations are below this: inode numbers carry the generation in their high 32 bits
/// (`generation << 32 | node`). After `GENERATION_LIMIT - 1` the generation wraps to 1 (see
/// [`next_generation`]).
pub const GENERATION_LIMIT: u64 = 1 << 32;
/// Epochs and sequence numbers in `state.json` are below this: a run of 2^48 mini-epochs is not
/// one metfs will see, and the bound leaves every `+ 1` of a long run room to grow.
pub const POSITION_LIMIT: u64 = 1 << 48;

/// The generation after `g`: one more, or 1 after the last one that fits an inode number. A
/// wrapped generation cannot meet a view still held from before the wrap (that would take
/// four billion switches while one handle stays open), and clients only compare generations
/// for inequality.
pub fn next_generation(g: u64) -> u64 {
    if g + 1 >= GENERATION_LIMIT {
        1
    } else {
        g + 1
    }
}
