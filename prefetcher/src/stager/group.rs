//! Staging small samples a group at a time: the fast path of a tier that copies with blocking
//! system calls ([`CapacityTier::group_files`] > 1, the POSIX tier).
//!
//! A sample of a few KiB costs a handful of system calls to copy; handing each one to a
//! blocking thread and waking the staging task when it is done cost about as much again (12%
//! of the daemon's CPU while it staged 500,000 files of 1-4 KiB). A group hands up to
//! [`CapacityTier::group_files`] consecutive small samples of the plan to one blocking call,
//! which copies them one after the other and returns each copy's CRC-32, hashed from the bytes
//! as they were written, so that the copy is not read back either.
//!
//! **The group is only a fast path.** Every rule of a single fetch holds for each of its
//! samples: the copy is created where [`Landing`] says, is deleted if the group's future is
//! dropped (the slot failed), and enters its batch only when complete and of the catalogued
//! size. A sample the group could not copy, for whatever reason, is handed to
//! [`Stager::stage_one`] after the group, which retries the tier's passing errors with backoff
//! and classifies the rest exactly as it would have without the group. A group whose blocking
//! call copies nothing for [`Stager::stall_limit`] fails the slot with
//! [`TierError::Timeout`], as a stalled single fetch does (`Stager::stall_watched`).

use super::stage::{create_copy, Unfinished};
use super::*;
use crate::tier::SMALL_FILE_BYTES;

/// One sample of a group: its copy being written, and what the stager needs once it is.
struct Member {
    id: u32,
    rel: String,
    dst: PathBuf,
    tmp: PathBuf,
    size: u64,
    file: Arc<std::fs::File>,
    unfinished: Unfinished,
}

impl Stager {
    /// The samples of `todo`, in order, in the groups they are staged in: consecutive small
    /// samples share a group of at most [`CapacityTier::group_files`]; any other sample is a
    /// group of its own, staged by [`Stager::stage_one`]. With a transform every sample is its
    /// own group (the transform reads each copy back anyway).
    pub(super) fn groups(&self, todo: Vec<u32>) -> Vec<Vec<u32>> {
        let per_group = match self.transform {
            Some(_) => 1,
            None => self.tier.group_files().max(1),
        };
        if per_group == 1 {
            return todo.into_iter().map(|id| vec![id]).collect();
        }
        let mut groups: Vec<Vec<u32>> = Vec::new();
        let mut open = false;
        for id in todo {
            let small = self.catalog.size(id) <= SMALL_FILE_BYTES;
            match groups.last_mut() {
                Some(g) if open && small && g.len() < per_group => g.push(id),
                _ => groups.push(vec![id]),
            }
            open = small;
        }
        groups
    }

    /// Stages one group of [`Stager::groups`]: returns each sample's outcome. Stops at the
    /// first failure of the slot as a whole (its outcome is the last one returned).
    pub(super) async fn stage_group(
        &self,
        slot_name: &str,
        dir: &Path,
        ids: Vec<u32>,
        made_dirs: &Mutex<HashSet<String>>,
        progress: &Progress,
        landing: Landing,
    ) -> Vec<(u32, Result<Fetched, Miss>)> {
        let grouped = ids.len() > 1 || ids.first().is_some_and(|&id| self.is_grouped(id));
        if !grouped {
            let mut out = Vec::with_capacity(1);
            for id in ids {
                let r = self
                    .stage_one(slot_name, dir, id, made_dirs, progress, landing)
                    .await;
                out.push((id, r));
            }
            return out;
        }
        let mut out = Vec::with_capacity(ids.len());
        let mut members = Vec::with_capacity(ids.len());
        let mut group = Vec::with_capacity(ids.len());
        // Samples whose copy could not even be created here: `stage_one` says why (or, for a
        // passing condition, succeeds).
        let mut alone = Vec::new();
        for id in ids {
            let (rel, dst, sample) = match self.prepare_one(dir, id, made_dirs) {
                Ok(p) => p,
                Err(m) => {
                    let slot_failed = matches!(m, Miss::Slot(_));
                    out.push((id, Err(m)));
                    if slot_failed {
                        return out;
                    }
                    continue;
                }
            };
            let tmp = self.landing_path(slot_name, id, &dst, landing);
            let file = match create_copy(&tmp, landing) {
                Ok(f) => Arc::new(f),
                Err(_) => {
                    alone.push(id);
                    continue;
                }
            };
            group.push((sample.clone(), file.clone()));
            members.push(Member {
                id,
                rel,
                dst,
                unfinished: Unfinished(Some(tmp.clone())),
                tmp,
                size: sample.size,
                file,
            });
        }
        if !group.is_empty() {
            let copied = Arc::new(AtomicU64::new(0));
            let fetch = self.tier.fetch_group(group, &self.pacer, copied.clone());
            let what = || {
                let more = members.len() - 1;
                format!("{} (and {more} more of its group)", members[0].rel)
            };
            // Nothing copied for the stall limit fails the slot, as a hung single fetch does.
            let done = || copied.load(Ordering::Relaxed);
            let results = match self.stall_watched(fetch, done, what).await {
                Ok(r) => r,
                Err(e) => {
                    // The members' copies go with them (`Unfinished`).
                    let id = members[0].id;
                    out.push((
                        id,
                        Err(Miss::Slot(StageError::Tier {
                            slot: slot_name.to_string(),
                            source: e,
                        })),
                    ));
                    return out;
                }
            };
            for (mut m, r) in members.into_iter().zip(results) {
                let copy = match r {
                    Ok(c) if c.bytes == m.size => c,
                    // Left to `stage_one` once this copy is gone (`Unfinished`).
                    _ => {
                        alone.push(m.id);
                        continue;
                    }
                };
                let done = m
                    .file
                    .set_permissions(std::fs::Permissions::from_mode(0o400))
                    .and_then(|()| match copy.crc {
                        Some(crc) => Ok(crc),
                        None => crc_of_copy(&m.file, m.size),
                    });
                let crc = match done {
                    Ok(crc) => crc,
                    Err(e) => {
                        out.push((m.id, Err(Miss::Slot(cache_err(&m.tmp)(e)))));
                        return out;
                    }
                };
                self.count_fetched(progress, m.size);
                m.unfinished.finished();
                out.push((
                    m.id,
                    Ok(Fetched {
                        id: m.id,
                        tmp: (landing == Landing::Tmp).then_some(m.tmp),
                        dst: m.dst,
                        bytes: m.size,
                        crc,
                    }),
                ));
            }
        }
        for id in alone {
            let r = self
                .stage_one(slot_name, dir, id, made_dirs, progress, landing)
                .await;
            let slot_failed = matches!(r, Err(Miss::Slot(_)));
            out.push((id, r));
            if slot_failed {
                break;
            }
        }
        out
    }

    /// Whether sample `id` is staged in a group ([`Stager::groups`]) rather than alone.
    fn is_grouped(&self, id: u32) -> bool {
        self.transform.is_none()
            && self.tier.group_files() > 1
            && self.catalog.size(id) <= SMALL_FILE_BYTES
    }
}
