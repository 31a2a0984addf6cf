//! A node's slot of the previous epoch as the exchange reads it: each sample's bytes with the
//! CRC-32 the slot's journal recorded for it.
//!
//! The codec reads whole samples ([`Samples`]), and consecutive coded packets mostly combine
//! consecutive blocks of the same few samples (a sample's blocks start in one column of one
//! table), so loaded samples are kept in a least-recently-used set of at most
//! [`Held::DEFAULT_CAP`] bytes: a sample is read once for all its blocks, and memory stays
//! bounded however large the slot. A sample is *unreadable* when its journal has no CRC for
//! it (not committed) or its file cannot be read; that is remembered too, so it is tried once.
//!
//! # The extra rank's tier
//!
//! The extra rank ([`super::SenderMode::Extra`]) has no slot: [`Held::open`] gives it the
//! daemons' POSIX tier instead, read the same way. A sample is read there only if its path
//! stays inside the tier's root, and is readable only if its length is the catalog's and its
//! version (modification time) the one the daemons catalogued: a changed source is not sent,
//! and the nodes' daemons find out for themselves when they fetch it. Its CRC-32 is computed
//! from the bytes read (the tier has no journal); the receiver checks it as any other. The
//! bytes read are counted ([`Held::tier_bytes`]).

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};

use metfs_prefetcher::stager::SlotJournal;
use metfs_shuffle::coded::Samples;
use metfs_tier::catalog::Catalog;
use metfs_tier::posix_version;

use crate::spec::slot_of_epoch;

use super::Node;

/// One slot's samples, loaded on demand (module docs).
pub struct Held<'a> {
    catalog: &'a Catalog,
    dir: PathBuf,
    /// Journaled CRCs (a slot), or those of the samples read so far (the tier).
    crcs: HashMap<u32, u32>,
    /// Reading the extra rank's tier, not a slot.
    tier: bool,
    /// Bytes read from the tier.
    tier_bytes: u64,
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
    /// On the extra rank: its tier (module docs), whatever the epoch.
    pub fn open(node: &'a Node, epoch: u64, cap: usize) -> Self {
        let slot = slot_of_epoch(epoch);
        let (dir, crcs, tier) = match node.tier() {
            Some(root) => (root.to_path_buf(), HashMap::new(), true),
            None => (
                node.spec.slots.join(&slot),
                SlotJournal::of(&node.spec.slots, &slot).read().staged,
                false,
            ),
        };
        Self {
            catalog: &node.catalog,
            dir,
            crcs,
            tier,
            tier_bytes: 0,
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

    /// Bytes read from the tier so far (0 for a slot).
    pub fn tier_bytes(&self) -> u64 {
        self.tier_bytes
    }

    /// Reads `id` whole from the slot, with its journaled CRC, without keeping it (a node sends
    /// each sample once); from the tier with the CRC of what was read, kept loaded (the extra
    /// rank sends a sample to each node that needs it).
    pub fn read(&mut self, id: u32) -> Option<(u32, Vec<u8>)> {
        if self.tier {
            // Kept loaded: a sample several nodes need is read from the tier once.
            if !self.load(&[id]) {
                return None;
            }
            return Some((self.crc(id)?, self.sample(id)?.to_vec()));
        }
        let crc = self.crc(id)?;
        Some((
            crc,
            self.read_file(&self.dir.join(self.catalog.path(id)), id)?,
        ))
    }

    fn read_file(&self, path: &Path, id: u32) -> Option<Vec<u8>> {
        let mut f = std::fs::File::open(path).ok()?;
        let mut b = Vec::with_capacity(self.catalog.size(id) as usize);
        f.read_to_end(&mut b).ok()?;
        Some(b)
    }

    /// Reads `id` from the tier if it is the catalogued sample (module docs).
    fn read_tier(&mut self, id: u32) -> Option<Vec<u8>> {
        let rel = self.catalog.path(id);
        let why = match std::fs::canonicalize(self.dir.join(&rel)) {
            Err(e) => e.to_string(),
            Ok(p) if !p.starts_with(&self.dir) => "it resolves outside the tier".into(),
            Ok(p) => match std::fs::metadata(&p) {
                Err(e) => e.to_string(),
                Ok(md) => {
                    let version = self.catalog.version(id);
                    if md.len() != self.catalog.size(id) {
                        format!(
                            "{} bytes, the catalog says {}",
                            md.len(),
                            self.catalog.size(id)
                        )
                    } else if !version.is_empty() && posix_version(&md) != version {
                        "modified since the daemons catalogued it".into()
                    } else {
                        match self.read_file(&p, id) {
                            Some(b) if b.len() as u64 == self.catalog.size(id) => {
                                self.tier_bytes += b.len() as u64;
                                return Some(b);
                            }
                            Some(b) => format!(
                                "{} bytes read, the catalog says {}",
                                b.len(),
                                self.catalog.size(id)
                            ),
                            None => "cannot be read".into(),
                        }
                    }
                }
            },
        };
        tracing::warn!(sample = %rel, "the extra rank cannot send it from the tier ({why}); its receivers fetch it themselves");
        None
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
            let data = if self.tier {
                let data = self.read_tier(id);
                if let Some(b) = &data {
                    self.crcs.insert(id, crc32fast::hash(b));
                }
                data
            } else {
                self.crc(id)
                    .and_then(|_| self.read_file(&self.dir.join(self.catalog.path(id)), id))
            };
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
