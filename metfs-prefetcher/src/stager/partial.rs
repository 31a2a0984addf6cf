//! Partial copies of large samples, continued instead of fetched again.
//!
//! A sample of at least [`RESUME_MIN_BYTES`] with a catalogued version is copied into
//! `TMP/<slot>-<id>.part` (whatever the slot's `Landing`; the committer renames it into the
//! slot), and before the copy's first byte its **sidecar** `TMP/<slot>-<id>.part.src` is
//! written: the sample's path, size and version, the boot the copy was written in, and its
//! **mark**, how many leading bytes of the copy are known to be written. The copy is made with
//! [`metfs_tier::CapacityTier::fetch_from`], whose [`Written`] the stager writes into the mark
//! as the copy goes (at each look of the stall watch, and when an attempt fails). An attempt
//! at that sample (a retry after the tier's passing error, the slot staged again after a
//! failure, a restart after `kill -9`) that finds both continues the copy from its mark; only
//! the rest is read from the tier and counted. A tier that cannot serve a range answers `None`,
//! and the copy starts again at 0.
//!
//! Invariants:
//! * A partial is continued only when its sidecar is, byte for byte, the one this attempt would
//!   write. A partial of another version of the sample (its size or stamp changed), of another
//!   sample under the same id (another catalog), or from before a reboot (whose unsynced tail
//!   may be lost) is removed and the copy starts at 0. A `.part` without its sidecar is never
//!   continued.
//! * A copy continues from its mark, never from its length: a tier may write pieces in
//!   parallel (S3's ranged GETs), so the file may hold a later piece past a hole. The mark
//!   trails what is written (it is raised only once every byte before it is in place), and the
//!   partial is cut to it before the rest is fetched. The tier pins the version it continues
//!   (S3's `If-Match`, POSIX's size and stamp checked before and after), so the prefix and the
//!   rest are of one version.
//! * The copy's journaled CRC is read back from the whole file, as every large copy's is.
//! * The sidecar goes once the copy is complete, before the copy is handed to the committer.
//! * A partial is kept only when its fetch ended with the tier's passing error. A fetch dropped
//!   (its slot failed) or timed out (its blocking copy may still write), or one that failed for
//!   the sample's own reason or the cache's, takes the partial and its sidecar with it. (A
//!   piece of a failed parallel fetch may still land after the failure: it writes the pinned
//!   version's own bytes at their own offsets, past the mark, so it changes nothing that is
//!   continued.)
//! * Partials outlive a staging only as this slot's, and only while it is not complete: a
//!   staging keeps those of the samples it still has to fetch and removes the rest, one that
//!   completes and an eviction of the slot remove them all, and a start removes those of a
//!   slot that is gone.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use metfs_tier::{SampleRef, TierError, Written};

use super::copy::{create_copy, is_samples_own};
use super::{cache_err, Landing, Miss, Stager};

/// Smallest sample whose interrupted copy is continued: a smaller one costs little to fetch
/// again, and its sidecar would cost a create and an unlink per copy.
pub const RESUME_MIN_BYTES: u64 = 8 << 20;

/// Suffix of a partial copy's name in `TMP/`.
const PART: &str = ".part";

/// Suffix added to a partial's name for its sidecar.
const SIDECAR: &str = ".src";

/// The file an attempt at a sample writes: where it is, the file, how many of its leading
/// bytes are the sample's already, and for a partial copy the mark in its sidecar.
pub(super) struct Attempt {
    pub(super) path: PathBuf,
    pub(super) file: std::fs::File,
    pub(super) from: u64,
    pub(super) mark: Option<Mark>,
}

/// The last line of a partial's sidecar: how many leading bytes of the copy are written, at a
/// fixed width, so that it is rewritten in place with one `pwrite` (a line within one page,
/// which a killed process leaves whole).
pub(super) struct Mark {
    side: std::fs::File,
    at: u64,
    last: u64,
}

impl Mark {
    /// Records in the sidecar that the copy's first `written` bytes are in place (a mark is
    /// never lowered). A failed write leaves the older, lower mark, which is still true.
    pub(super) fn record(&mut self, written: &Written) {
        use std::os::unix::fs::FileExt;
        let n = written.get();
        if n > self.last
            && self
                .side
                .write_all_at(mark_line(n).as_bytes(), self.at)
                .is_ok()
        {
            self.last = n;
        }
    }
}

/// The mark's line for `n` bytes.
fn mark_line(n: u64) -> String {
    format!("written {n:020}\n")
}

/// The mark a sidecar's text `side` holds after the identity `expected`; `None` when the
/// sidecar is of another copy or its mark is not whole.
fn read_mark(side: &[u8], expected: &str) -> Option<u64> {
    let line = std::str::from_utf8(side.strip_prefix(expected.as_bytes())?).ok()?;
    let digits = line.strip_prefix("written ")?.strip_suffix('\n')?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
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
    ) -> Result<Attempt, Miss> {
        let (tmp, r) = if self.resumable(sample) {
            let tmp = self.tmp_dir.join(format!("{slot_name}-{id}"));
            match self.open_partial(slot_name, id, sample) {
                Ok(a) => return Ok(a),
                Err(e) => (tmp, Err(e)),
            }
        } else {
            let tmp = self.landing_path(slot_name, id, dst, landing);
            let r = create_copy(&tmp, landing);
            (tmp, r)
        };
        match r {
            Ok(file) => Ok(Attempt {
                path: tmp,
                file,
                from: 0,
                mark: None,
            }),
            Err(e) if e.raw_os_error() == Some(libc::ENAMETOOLONG) => Err(Miss::Sample(format!(
                "`{}`: creating {}: {e}",
                sample.path,
                tmp.display()
            ))),
            Err(e) => Err(Miss::Slot(cache_err(&tmp)(e))),
        }
    }

    /// Opens the partial copy of sample `id` of `slot_name` for an attempt: the one left by an
    /// earlier attempt at this very sample, cut to its mark and continued from there, or a new
    /// one (its sidecar written first) from 0.
    pub(super) fn open_partial(
        &self,
        slot_name: &str,
        id: u32,
        sample: &SampleRef,
    ) -> std::io::Result<Attempt> {
        let path = self.tmp_dir.join(format!("{slot_name}-{id}{PART}"));
        let side = sidecar_of(&path);
        let expected = sidecar_text(sample);
        let open_rw = |p: &Path| std::fs::OpenOptions::new().read(true).write(true).open(p);
        let mark = std::fs::read(&side)
            .ok()
            .and_then(|s| read_mark(&s, &expected));
        if let (Some(mark), Ok(md)) = (mark, std::fs::symlink_metadata(&path)) {
            if md.is_file() && mark < sample.size {
                let file = open_rw(&path)?;
                let from = mark.min(md.len());
                file.set_len(from)?;
                return Ok(Attempt {
                    path,
                    file,
                    from,
                    mark: Some(Mark {
                        side: open_rw(&side)?,
                        at: expected.len() as u64,
                        last: mark,
                    }),
                });
            }
        }
        remove_partial(&path);
        let mut side_file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&side)?;
        std::io::Write::write_all(
            &mut side_file,
            (expected.clone() + &mark_line(0)).as_bytes(),
        )?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        Ok(Attempt {
            path,
            file,
            from: 0,
            mark: Some(Mark {
                side: side_file,
                at: expected.len() as u64,
                last: 0,
            }),
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
