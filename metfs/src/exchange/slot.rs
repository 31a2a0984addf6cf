//! A node's slot of the previous epoch as the exchange reads it: each sample's bytes with the
//! CRC-32 the slot's journal recorded for it.
//!
//! The codec reads whole samples ([`Samples`]), and consecutive coded packets mostly combine
//! consecutive blocks of the same few samples (a sample's blocks start in one column of one
//! table), so loaded samples are kept in a least-recently-used set of at most
//! [`Held::DEFAULT_CAP`] bytes: a sample is read once for all its blocks, and memory stays
//! bounded however large the slot. A sample is *unreadable* when its journal has no CRC for
//! it (not committed) or its file cannot be read; that is remembered too, so it is tried once.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::PathBuf;

use prefetcher::catalog::Catalog;
use prefetcher::stager::read_journal;
use shuffle::coded::Samples;

use crate::daemon::aggregate::slot_of_epoch;

use super::Node;

/// One slot's samples, loaded on demand (module docs).
pub struct Held<'a> {
    catalog: &'a Catalog,
    dir: PathBuf,
    crcs: HashMap<u32, u32>,
    /// Loaded samples (`None`: unreadable) and when each was last asked for.
    loaded: HashMap<u32, (Option<Vec<u8>>, u64)>,
    /// Last use → sample, for eviction.
    by_use: BTreeMap<u64, u32>,
    bytes: usize,
    cap: usize,
    clock: u64,
}

impl<'a> Held<'a> {
    /// Bytes of samples kept loaded by default.
    pub const DEFAULT_CAP: usize = 256 << 20;

    /// The node's slot of epoch `epoch` (with its journal read once), keeping at most `cap`
    /// bytes loaded (besides the samples of one call to [`Held::load`]).
    pub fn open(node: &'a Node, epoch: u64, cap: usize) -> Self {
        let slot = slot_of_epoch(epoch);
        Self {
            catalog: &node.catalog,
            dir: node.spec.slots.join(&slot),
            crcs: read_journal(&node.spec.slots.join(format!("{slot}.journal"))).staged,
            loaded: HashMap::new(),
            by_use: BTreeMap::new(),
            bytes: 0,
            cap,
            clock: 0,
        }
    }

    /// The CRC-32 the slot's journal recorded for `id`, if it committed it.
    pub fn crc(&self, id: u32) -> Option<u32> {
        self.crcs.get(&id).copied()
    }

    /// Reads `id` whole from the slot, with its journaled CRC, without keeping it (the
    /// uncoded exchange sends each sample once).
    pub fn read(&self, id: u32) -> Option<(u32, Vec<u8>)> {
        let crc = self.crc(id)?;
        Some((crc, self.read_file(id)?))
    }

    fn read_file(&self, id: u32) -> Option<Vec<u8>> {
        let mut f = std::fs::File::open(self.dir.join(self.catalog.path(id))).ok()?;
        let mut b = Vec::with_capacity(self.catalog.size(id) as usize);
        f.read_to_end(&mut b).ok()?;
        Some(b)
    }

    /// Makes `ids` available to [`Samples::sample`], evicting the least recently used others
    /// beyond the cap; true when every one of them is readable.
    pub fn load(&mut self, ids: &[u32]) -> bool {
        let mut all = true;
        for &id in ids {
            self.clock += 1;
            let now = self.clock;
            if let Some((data, used)) = self.loaded.get_mut(&id) {
                self.by_use.remove(used);
                *used = now;
                self.by_use.insert(now, id);
                all &= data.is_some();
                continue;
            }
            let data = self.crc(id).and(self.read_file(id));
            all &= data.is_some();
            self.bytes += data.as_ref().map_or(0, Vec::len);
            self.loaded.insert(id, (data, now));
            self.by_use.insert(now, id);
        }
        // Evict, oldest first, never one of `ids` (they are the most recent).
        let oldest_kept = self.clock + 1 - ids.len() as u64;
        while self.bytes > self.cap {
            let Some((&used, &id)) = self.by_use.first_key_value() else {
                break;
            };
            if used >= oldest_kept {
                break;
            }
            self.by_use.remove(&used);
            if let Some((Some(data), _)) = self.loaded.remove(&id) {
                self.bytes -= data.len();
            }
        }
        all
    }
}

impl Samples for Held<'_> {
    fn sample(&self, sample: u32) -> Option<&[u8]> {
        self.loaded.get(&sample)?.0.as_deref()
    }
}
