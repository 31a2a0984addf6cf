//! Taking samples from the node's own store: a sample of the slot being staged that another
//! slot of the stager (the current or a draining one) already holds is hard-linked from it, or
//! copied where the file system refuses the link, instead of being fetched from the tier again.
//!
//! A donor's copy is taken only when the donor's journal lists it (it was committed complete,
//! checked against the catalogued identity of the sample, size and mtime or ETag, and its CRC
//! recorded), it is still a regular file of the catalogued size, and its CRC, read again now,
//! is the journaled one. That read is local and cheap next to a fetch, and it is needed: a hard
//! link shares one inode, so a copy damaged in place in one slot is damaged in every slot it was
//! linked into, and a restart that finds it bad in one slot would otherwise link the same bad
//! bytes back from another. A donor that fails the check is passed over (its own slot's check
//! finds it when that slot is staged or resumed). Donors are slots of this
//! stager, staged from the same catalog: a catalog rebuilt because the source changed changes
//! the daemon's fingerprint, and slots of another fingerprint are deleted at start, so a sample
//! id names the same version of the same file in every slot. The journaled CRC carries over to
//! the new slot's journal, so a restart checks a taken copy like a fetched one; a copy (not a
//! link) is checked against it before it enters the slot.
//!
//! A hard link is one file with two names: it takes space once while both slots exist and
//! stays, owned by the new slot alone, when the donor is evicted. [`StageReport::linked`] lists
//! the linked samples per donor so that a caller counting the cache's bytes counts them once.

use super::{
    cache_err, crc_of_file, create_private_dir, JournalBatch, JournalWriter, Progress, SlotSpec,
    StageError, StageReport, Stager,
};
use std::collections::{HashMap, HashSet};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::Ordering;

/// What [`Stager::take_from_donors`] did.
pub(super) struct Taken {
    /// Samples still to fetch from the tier.
    pub todo: Vec<u32>,
    /// Samples taken: id, CRC-32 of the copy, donor slot, and whether it is a hard link.
    pub taken: Vec<(u32, u32, String, bool)>,
}

/// Errors of `link(2)` that say the file system will not link this file (as opposed to the
/// donor having gone): a copy is made instead.
fn link_refused(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMLINK) | Some(libc::EPERM) | Some(libc::EXDEV) | Some(libc::EOPNOTSUPP)
    )
}

impl Stager {
    /// Takes every sample of `todo` that a slot of `slot.reuse_from` holds a journaled copy of
    /// into `dir` (`slot`'s directory). A sample whose donor copy is missing, differs in size or
    /// fails to link and to copy is left in `todo`, to be fetched. Blocking.
    pub(super) fn take_from_donors(&self, slot: &SlotSpec, dir: &Path, todo: Vec<u32>) -> Taken {
        let donors: Vec<(String, HashMap<u32, u32>)> = slot
            .reuse_from
            .iter()
            .filter(|d| **d != slot.name)
            .map(|d| (d.clone(), self.journal(d).read().staged))
            .filter(|(_, j)| !j.is_empty())
            .collect();
        let mut out = Taken {
            todo: Vec::with_capacity(todo.len()),
            taken: Vec::new(),
        };
        let mut made_dirs = HashSet::<String>::new();
        for id in todo {
            let rel = self.catalog.path(id);
            let size = self.catalog.size(id);
            let found = donors.iter().find_map(|(name, staged)| {
                let crc = *staged.get(&id)?;
                let src = self.slot_path(name).join(&rel);
                // lstat: a donor entry replaced by a symlink is never followed.
                let m = std::fs::symlink_metadata(&src).ok()?;
                (m.is_file() && m.len() == size && crc_of_file(&src).is_ok_and(|c| c == crc))
                    .then_some((name, src, crc))
            });
            let Some((donor, src, crc)) = found else {
                out.todo.push(id);
                continue;
            };
            let dst = dir.join(&rel);
            let (rel_dir, _) = self.catalog.dir_and_name(id);
            if !rel_dir.is_empty() && !made_dirs.contains(rel_dir) {
                if create_private_dir(&dir.join(rel_dir)).is_err() {
                    // The fetch path meets the same problem and reports it.
                    out.todo.push(id);
                    continue;
                }
                made_dirs.insert(rel_dir.to_string());
            }
            // An unjournaled leftover of an interrupted run may hold the name.
            let _ = std::fs::remove_file(&dst);
            let linked = match std::fs::hard_link(&src, &dst) {
                Ok(()) => Some(true),
                Err(e) if link_refused(&e) => self
                    .copy_checked(&slot.name, id, &src, &dst, crc)
                    .then_some(false),
                Err(e) => {
                    tracing::debug!(sample = %rel, donor = %donor, error = %e, "cannot take the sample from the node's store; fetching it");
                    None
                }
            };
            match linked {
                Some(l) => out.taken.push((id, crc, donor.clone(), l)),
                None => out.todo.push(id),
            }
        }
        out
    }

    /// Copies `src` to `dst` through a temporary file, keeping it only when its CRC is `crc`
    /// (made durable first when the stager fsyncs). False on any failure; nothing is left.
    pub(super) fn copy_checked(
        &self,
        slot: &str,
        id: u32,
        src: &Path,
        dst: &Path,
        crc: u32,
    ) -> bool {
        let seq = self.attempt_seq.fetch_add(1, Ordering::Relaxed);
        // Named like a fetch's temporary, so the slot's cleanup finds a leftover.
        let tmp = self.tmp_dir.join(format!("{slot}-{id}.r{seq}"));
        let ok = (|| -> std::io::Result<bool> {
            std::fs::copy(src, &tmp)?;
            if crc_of_file(&tmp)? != crc {
                return Ok(false);
            }
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o400))?;
            if self.cfg.fsync {
                std::fs::File::open(&tmp)?.sync_all()?;
            }
            std::fs::rename(&tmp, dst)?;
            Ok(true)
        })()
        .unwrap_or(false);
        if !ok {
            let _ = std::fs::remove_file(&tmp);
        }
        ok
    }
}

impl Stager {
    /// Takes what `todo` asks for from the node's other slots into `dir` (module docs),
    /// journals and counts it, and returns the samples still to fetch.
    pub(super) async fn reuse_into(
        &self,
        slot: &SlotSpec,
        dir: &Path,
        todo: Vec<u32>,
        journal: &mut JournalWriter,
        report: &mut StageReport,
        progress: &Progress,
    ) -> Result<Vec<u32>, StageError> {
        let jpath = self.journal(&slot.name).path().to_path_buf();
        let (st, spec, d) = (self.clone(), slot.clone(), dir.to_path_buf());
        let t = tokio::task::spawn_blocking(move || st.take_from_donors(&spec, &d, todo))
            .await
            .expect("reuse task panicked");
        let mut lines = JournalBatch::with_capacity(t.taken.len());
        for (id, crc, donor, linked) in t.taken {
            let size = self.catalog.size(id);
            lines.staged(id, crc);
            report.reused += 1;
            report.bytes_reused += size;
            progress.files_done.fetch_add(1, Ordering::Relaxed);
            for c in [
                &progress.bytes_done,
                &progress.bytes_settled,
                &progress.bytes_reused,
            ] {
                c.fetch_add(size, Ordering::Relaxed);
            }
            if linked {
                progress.bytes_linked.fetch_add(size, Ordering::Relaxed);
                report.linked.entry(donor).or_default().push(id);
            }
        }
        self.reused_bytes
            .fetch_add(report.bytes_reused, Ordering::Relaxed);
        journal.write(&lines).map_err(cache_err(&jpath))?;
        if report.reused > 0 {
            tracing::info!(slot = %slot.name, samples = report.reused, bytes = report.bytes_reused, "samples taken from the node's store instead of the tier");
        }
        Ok(t.todo)
    }
}
