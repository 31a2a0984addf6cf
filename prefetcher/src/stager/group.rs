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
//! size. Each copy is created on the blocking thread right before it is written and closed
//! right after, so a group holds one copy open at a time: a staging holds no more
//! descriptors than it did with one fetch per file (a group that opened all its copies first
//! held up to 16 times as many, and a daemon capped near its needs ran out of descriptors for
//! its readers). Once a group is abandoned (its future dropped: the slot failed or the group
//! stalled), its thread, which may still be stuck in the tier, creates no more copies: the
//! drop and every creation take one lock ([`Copies`]), so no late copy can land at a path of a
//! slot that has since been staged again. A sample the group could not copy, for whatever reason, is handed to
//! [`Stager::stage_one`] after the group, which retries the tier's passing errors with backoff
//! and classifies the rest exactly as it would have without the group. A group whose blocking
//! call copies nothing for [`Stager::stall_limit`] fails the slot with
//! [`TierError::Timeout`], as a stalled single fetch does (`Stager::stall_watched`).

use super::stage::create_copy;
use super::*;
use crate::tier::{CreateCopy, GroupMember, SMALL_FILE_BYTES};

/// How [`Stager::groups`] splits a slot's samples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Group {
    /// A sample staged by [`Stager::stage_one`]: large, under a transform, or from a tier that
    /// copies one sample per call.
    Alone(u32),
    /// Consecutive small samples copied by one [`CapacityTier::fetch_group`].
    Small(Vec<u32>),
}

#[cfg(test)]
impl Group {
    /// The group's samples, in plan order.
    pub(super) fn ids(&self) -> &[u32] {
        match self {
            Group::Alone(id) => std::slice::from_ref(id),
            Group::Small(ids) => ids,
        }
    }
}

/// The copies a group has made and not yet handed over, and whether the group was abandoned.
/// Dropping it abandons the group: what was made is deleted, and nothing more is made.
struct Copies {
    state: Arc<Mutex<CopiesState>>,
}

#[derive(Default)]
struct CopiesState {
    abandoned: bool,
    /// Each member's copy, once made, until handed over or discarded.
    made: Vec<Option<PathBuf>>,
}

impl Copies {
    fn new(members: usize) -> Self {
        let state = CopiesState {
            abandoned: false,
            made: vec![None; members],
        };
        Copies {
            state: Arc::new(Mutex::new(state)),
        }
    }

    /// What makes member `i`'s copy at `path`, on the tier's thread.
    fn creator(&self, i: usize, path: PathBuf, landing: Landing) -> CreateCopy {
        let state = self.state.clone();
        Box::new(move || {
            let mut st = state.lock().unwrap();
            if st.abandoned {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::Interrupted,
                    "the group was abandoned",
                ));
            }
            let f = create_copy(&path, landing)?;
            st.made[i] = Some(path);
            Ok(f)
        })
    }

    /// Member `i`'s copy is handed over: it is no longer the group's to delete.
    fn keep(&self, i: usize) {
        self.state.lock().unwrap().made[i] = None;
    }

    /// Deletes member `i`'s copy, if it was made.
    fn discard(&self, i: usize) {
        if let Some(p) = self.state.lock().unwrap().made[i].take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for Copies {
    fn drop(&mut self) {
        let mut st = self.state.lock().unwrap();
        st.abandoned = true;
        for p in st.made.iter_mut().filter_map(Option::take) {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// One sample of a group, as the stager needs it once the tier is done.
struct Member {
    id: u32,
    rel: String,
    dst: PathBuf,
    tmp: PathBuf,
    size: u64,
}

impl Stager {
    /// The samples of `todo`, in order, in the groups they are staged in: consecutive small
    /// samples share a group of at most [`CapacityTier::group_files`]; any other sample is
    /// staged alone. With a transform every sample is (the transform reads each copy back
    /// anyway).
    pub(super) fn groups(&self, todo: Vec<u32>) -> Vec<Group> {
        let per_group = match self.transform {
            Some(_) => 1,
            None => self.tier.group_files().max(1),
        };
        let mut groups: Vec<Group> = Vec::new();
        for id in todo {
            if per_group == 1 || self.catalog.size(id) > SMALL_FILE_BYTES {
                groups.push(Group::Alone(id));
                continue;
            }
            match groups.last_mut() {
                Some(Group::Small(g)) if g.len() < per_group => g.push(id),
                _ => groups.push(Group::Small(vec![id])),
            }
        }
        groups
    }

    /// Stages one group of [`Stager::groups`]: returns each sample's outcome. Stops at the
    /// first failure of the slot as a whole (its outcome is the last one returned).
    pub(super) async fn stage_group(
        &self,
        slot_name: &str,
        dir: &Path,
        group: Group,
        made_dirs: &Mutex<HashSet<String>>,
        progress: &Progress,
        landing: Landing,
    ) -> Vec<(u32, Result<Fetched, Miss>)> {
        let ids = match group {
            Group::Alone(id) => {
                let r = self
                    .stage_one(slot_name, dir, id, made_dirs, progress, landing)
                    .await;
                return vec![(id, r)];
            }
            Group::Small(ids) => ids,
        };
        let mut out = Vec::with_capacity(ids.len());
        let copies = Copies::new(ids.len());
        let mut members = Vec::with_capacity(ids.len());
        let mut group = Vec::with_capacity(ids.len());
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
            group.push(GroupMember {
                create: copies.creator(members.len(), tmp.clone(), landing),
                // Read-only once complete, through the descriptor written (see the module docs
                // of `stager`).
                finish: Box::new(|f: &std::fs::File| {
                    f.set_permissions(std::fs::Permissions::from_mode(0o400))
                }),
                sample: sample.clone(),
            });
            members.push(Member {
                id,
                rel,
                dst,
                tmp,
                size: sample.size,
            });
        }
        if members.is_empty() {
            return out;
        }
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
                // The members' copies go with `copies`.
                let slot = Miss::Slot(StageError::Tier {
                    slot: slot_name.to_string(),
                    source: e,
                });
                out.push((members[0].id, Err(slot)));
                return out;
            }
        };
        // Samples the group could not copy: `stage_one` retries or says why.
        let mut alone = Vec::new();
        for (i, (m, r)) in members.into_iter().zip(results).enumerate() {
            let copy = match r {
                Ok(c) if c.bytes == m.size => c,
                _ => {
                    copies.discard(i);
                    alone.push(m.id);
                    continue;
                }
            };
            let crc = match copy.crc {
                Some(crc) => crc,
                None => match crc_of_file(&m.tmp) {
                    Ok(crc) => crc,
                    Err(e) => {
                        out.push((m.id, Err(Miss::Slot(cache_err(&m.tmp)(e)))));
                        return out;
                    }
                },
            };
            self.count_fetched(progress, m.size);
            copies.keep(i);
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
        drop(copies);
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_abandoned_group_deletes_its_copies_and_makes_no_more() {
        let d = tempfile::tempdir().unwrap();
        let (a, b, c) = (d.path().join("a"), d.path().join("b"), d.path().join("c"));
        let copies = Copies::new(3);
        let make_a = copies.creator(0, a.clone(), Landing::InPlace);
        let make_b = copies.creator(1, b.clone(), Landing::InPlace);
        // The tier's thread, stuck past the drop, would create this one last.
        let make_c = copies.creator(2, c.clone(), Landing::InPlace);
        make_a().unwrap();
        make_b().unwrap();
        copies.keep(0);
        drop(copies);
        assert!(
            a.exists(),
            "a copy handed over is not the group's to delete"
        );
        assert!(!b.exists(), "a copy made and not handed over is deleted");
        let late = make_c().unwrap_err();
        assert_eq!(late.kind(), std::io::ErrorKind::Interrupted);
        assert!(!c.exists(), "nothing is made once the group is abandoned");
    }

    #[test]
    fn a_discarded_copy_is_deleted_at_once() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a");
        let copies = Copies::new(1);
        copies.creator(0, a.clone(), Landing::Tmp)().unwrap();
        assert!(a.exists());
        copies.discard(0);
        assert!(!a.exists());
    }
}
