//! Partial copies of large samples, continued instead of fetched again.
//!
//! A sample of at least [`RESUME_MIN_BYTES`] with a catalogued version is copied into
//! `TMP/<slot>-<id>.part` (whatever the slot's `Landing`; the committer renames it into the
//! slot), and before the copy's first byte its **sidecar** `TMP/<slot>-<id>.part.src` is
//! written: the sample's path, size and version, and the boot the copy was written in. An
//! attempt at that sample (a retry after the tier's passing error, the slot staged again after
//! a failure, a restart after `kill -9`) that finds both continues the copy from its length
//! with [`metfs_tier::CapacityTier::fetch_from`]; only the rest is read from the tier and
//! counted. A tier that cannot serve a range answers `None`, and the copy starts again at 0.
//!
//! Invariants:
//! * A partial is continued only when its sidecar is, byte for byte, the one this attempt would
//!   write. A partial of another version of the sample (its size or stamp changed), of another
//!   sample under the same id (another catalog), or from before a reboot (whose unsynced tail
//!   may be lost) is removed and the copy starts at 0. A `.part` without its sidecar is never
//!   continued.
//! * A tier copies in order (`fetch` and `fetch_from` alike), so a partial's length is a
//!   prefix of the sample; the tier checks the source's size and version before and after the
//!   rest, so the prefix and the rest are of one version.
//! * The copy's journaled CRC is read back from the whole file, as every large copy's is.
//! * The sidecar goes once the copy is complete, before the copy is handed to the committer.
//! * A partial is kept only when its fetch ended with the tier's passing error, so no writer of
//!   it is left. A fetch dropped (its slot failed) or timed out (its blocking copy may still
//!   write), or one that failed for the sample's own reason or the cache's, takes the partial
//!   and its sidecar with it.
//! * Partials outlive a staging only as this slot's, and only while it is not complete: a
//!   staging keeps those of the samples it still has to fetch and removes the rest, one that
//!   completes and an eviction of the slot remove them all, and a start removes those of a
//!   slot that is gone.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use metfs_tier::{SampleRef, TierError};

use super::copy::{create_copy, is_samples_own};
use super::{cache_err, Landing, Miss, Stager};

/// Smallest sample whose interrupted copy is continued: a smaller one costs little to fetch
/// again, and its sidecar would cost a create and an unlink per copy.
pub const RESUME_MIN_BYTES: u64 = 8 << 20;

/// Suffix of a partial copy's name in `TMP/`.
const PART: &str = ".part";

/// Suffix added to a partial's name for its sidecar.
const SIDECAR: &str = ".src";

/// A partial copy opened for an attempt: where it is, the file, and how many bytes it holds.
pub(super) struct Partial {
    pub(super) path: PathBuf,
    pub(super) file: std::fs::File,
    pub(super) from: u64,
}

impl Stager {
    /// Whether `sample`'s copy is written as a partial that a later attempt may continue.
    pub(super) fn resumable(&self, sample: &SampleRef) -> bool {
        sample.size >= RESUME_MIN_BYTES && !sample.version.is_empty()
    }

    /// The file an attempt at sample `id` writes, and how many bytes of it are there already:
    /// a large sample's partial copy (`partial`), continued where it is of this very sample,
    /// or a new file where `landing` puts it.
    pub(super) fn open_attempt(
        &self,
        slot_name: &str,
        id: u32,
        dst: &Path,
        sample: &SampleRef,
        landing: Landing,
    ) -> Result<(PathBuf, std::fs::File, u64), Miss> {
        let (tmp, r) = if self.resumable(sample) {
            let tmp = self.tmp_dir.join(format!("{slot_name}-{id}"));
            match self.open_partial(slot_name, id, sample) {
                Ok(Partial { path, file, from }) => return Ok((path, file, from)),
                Err(e) => (tmp, Err(e)),
            }
        } else {
            let tmp = self.landing_path(slot_name, id, dst, landing);
            let r = create_copy(&tmp, landing);
            (tmp, r)
        };
        match r {
            Ok(f) => Ok((tmp, f, 0)),
            Err(e) if e.raw_os_error() == Some(libc::ENAMETOOLONG) => Err(Miss::Sample(format!(
                "`{}`: creating {}: {e}",
                sample.path,
                tmp.display()
            ))),
            Err(e) => Err(Miss::Slot(cache_err(&tmp)(e))),
        }
    }

    /// Opens the partial copy of sample `id` of `slot_name` for an attempt: the one left by an
    /// earlier attempt at this very sample, from its length, or a new one (its sidecar written
    /// first) from 0.
    pub(super) fn open_partial(
        &self,
        slot_name: &str,
        id: u32,
        sample: &SampleRef,
    ) -> std::io::Result<Partial> {
        let path = self.tmp_dir.join(format!("{slot_name}-{id}{PART}"));
        let side = sidecar_of(&path);
        let expected = sidecar_text(sample);
        let matches = std::fs::read(&side).is_ok_and(|s| s == expected.as_bytes());
        if matches {
            if let Ok(md) = std::fs::symlink_metadata(&path) {
                if md.is_file() && md.len() < sample.size {
                    let file = std::fs::OpenOptions::new()
                        .read(true)
                        .write(true)
                        .open(&path)?;
                    return Ok(Partial {
                        path,
                        file,
                        from: md.len(),
                    });
                }
            }
        }
        remove_partial(&path);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&side)
            .and_then(|mut f| std::io::Write::write_all(&mut f, expected.as_bytes()))?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        Ok(Partial {
            path,
            file,
            from: 0,
        })
    }
}

impl Stager {
    /// Removes the partial copies of slot `slot_name` (its eviction: nothing stages it now).
    pub(super) fn remove_partials_of(&self, slot_name: &str) {
        let prefix = format!("{slot_name}-");
        let _ = self.clean_tmp_matching(&prefix, &|n| partial_id(n, slot_name).is_none());
    }
}

/// The sidecar's path of the partial at `part`.
pub(super) fn sidecar_of(part: &Path) -> PathBuf {
    let mut s = part.as_os_str().to_os_string();
    s.push(SIDECAR);
    PathBuf::from(s)
}

/// Removes a partial copy and its sidecar (either may be missing).
pub(super) fn remove_partial(part: &Path) {
    let _ = std::fs::remove_file(part);
    let _ = std::fs::remove_file(sidecar_of(part));
}

/// Whether an attempt that failed with `e` leaves its partial for the next one: only after
/// the tier's passing error (its fetch has returned, so nothing writes the partial any more).
pub(super) fn keeps_partial(e: &TierError) -> bool {
    matches!(e, TierError::Io { .. } | TierError::Unreachable { .. }) && !is_samples_own(e)
}

/// The sample id of a partial copy's (or its sidecar's) name in `TMP/` of slot `slot_name`;
/// `None` for any other name.
pub(super) fn partial_id(name: &str, slot_name: &str) -> Option<u32> {
    let rest = name.strip_prefix(slot_name)?.strip_prefix('-')?;
    let rest = rest.strip_suffix(SIDECAR).unwrap_or(rest);
    rest.strip_suffix(PART)?.parse().ok()
}

/// Whether `name` in `TMP/` is a partial copy or a sidecar, of any slot.
pub(super) fn is_partial_name(name: &str) -> bool {
    slot_of(name).is_some()
}

/// The slot of a partial copy's (or its sidecar's) name in `TMP/`; `None` for any other name.
pub(super) fn slot_of(name: &str) -> Option<&str> {
    let (slot, _) = name.rsplit_once('-')?;
    partial_id(name, slot).map(|_| slot)
}

/// What a partial copy of `sample` records of its source in its sidecar.
fn sidecar_text(sample: &SampleRef) -> String {
    format!(
        "metfs partial 1\nboot {}\nsize {}\nversion {}\npath {}\n",
        boot_id(),
        sample.size,
        sample.version,
        sample.path
    )
}

/// This boot's id (empty where the kernel does not say it).
fn boot_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    })
}

#[cfg(test)]
mod tests;
