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
//! size. The group's copies are created empty on the staging task's thread and kept open
//! for the blocking thread to write, while the process's descriptors allow it
//! ([`KeptPlace`]); past that share each is closed at once and opened again by path on the
//! blocking thread right before it is written ([`Copies`]), so a daemon capped near its needs
//! keeps its descriptors for its readers. Once a group is abandoned (its future dropped: the
//! slot failed or the group stalled), its thread, which may still be stuck in the tier, opens
//! no more copies: the drop and every opening take one lock ([`Copies`]), so no late copy can
//! land at a path of a slot that has since been staged again. A sample the group could not copy, for whatever reason, is handed to
//! [`Stager::stage_one`] after the group, which retries the tier's passing errors with backoff
//! and classifies the rest exactly as it would have without the group. A group whose blocking
//! call copies nothing for [`Stager::stall_limit`] fails the slot with
//! [`TierError::Timeout`], as a stalled single fetch does (`Stager::stall_watched`).

use super::copy::create_copy;
use super::{cache_err, crc_of_file, Fetched, Landing, Miss, Progress, StageError, Stager};
use metfs_tier::TierError;
use metfs_tier::{GroupMember, OpenCopy, SMALL_FILE_BYTES};
use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Copies made and kept open for their group's blocking thread, in the whole process (several
/// stagers run at once in shared mode).
static KEPT_OPEN: AtomicUsize = AtomicUsize::new(0);

/// The share of the process's descriptor limit that copies kept open may take: one in
/// sixteen. The open backing files of the read path take at most half (`FsCore::new`); the
/// rest is the readers' kernel requests, the control socket and the single fetches. A staging
/// keeps at most `concurrency` x [`CapacityTier::group_files`] copies open (512 by default),
/// under a sixteenth of the usual hard limits the daemon raises its own to (systemd's default
/// is 524,288; 20,000 gives 1,250), so the share binds only where the limit is low.
const KEPT_OPEN_SHARE: u64 = 16;

/// How many copies may be kept open now. Read at each group rather than once: the limit can be
/// lowered under a running daemon (`prlimit`), and a staging must not take what its readers
/// then need.
fn kept_open_limit() -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills a struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 0;
    }
    usize::try_from(lim.rlim_cur / KEPT_OPEN_SHARE).unwrap_or(usize::MAX)
}

/// One place in the share of copies kept open, counted in [`KEPT_OPEN`] until dropped.
struct KeptPlace(());

impl KeptPlace {
    /// A place, if fewer than `limit` copies are kept open in the process.
    fn take(limit: usize) -> Option<Self> {
        KEPT_OPEN
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                (held < limit).then_some(held + 1)
            })
            .ok()
            .map(|_| KeptPlace(()))
    }
}

impl Drop for KeptPlace {
    fn drop(&mut self) {
        KEPT_OPEN.fetch_sub(1, Ordering::Relaxed);
    }
}

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
/// Dropping it abandons the group: what was made is deleted, and no copy is opened any more.
///
/// A copy is made (created empty) on the staging task's thread by [`Copies::make`], and handed
/// to the tier's thread by [`Copies::opener`] right before it is written. Creating a file takes
/// its directory's lock for writing; a plan's consecutive samples share a directory, so the
/// tier's many blocking threads creating their groups' copies queue on one lock (about 13%
/// more of the daemon's CPU while it staged 100,000 files of 1-4 KiB, docs/BENCHMARKS.md),
/// where the staging task's few threads create them one after the other. The copy is kept
/// open in between ([`KeptPlace`]) within the process's share of descriptors; past it, it is
/// closed and opened again by path on the tier's thread, which takes no directory lock but is
/// a second path walk and open per copy (about 12% of the CPU at 500,000 files).
struct Copies {
    state: Arc<Mutex<CopiesState>>,
}

#[derive(Default)]
struct CopiesState {
    abandoned: bool,
    /// Each member's copy, once made, until handed over or discarded.
    made: Vec<Option<Made>>,
}

/// A copy made and not yet handed over.
struct Made {
    path: PathBuf,
    /// Its descriptor and the place it holds in the share, when kept open; `None` once taken
    /// by the tier's thread, or when the share of descriptors was used up.
    open: Option<(std::fs::File, KeptPlace)>,
}

impl Copies {
    fn new(members: usize) -> Self {
        let state = CopiesState {
            abandoned: false,
            made: std::iter::repeat_with(|| None).take(members).collect(),
        };
        Copies {
            state: Arc::new(Mutex::new(state)),
        }
    }

    /// Makes member `i`'s copy at `path`, empty; keeps it open if fewer than `keep_limit`
    /// copies are kept open in the process ([`kept_open_limit`]), else closes it.
    fn make(
        &self,
        i: usize,
        path: PathBuf,
        landing: Landing,
        keep_limit: usize,
    ) -> std::io::Result<()> {
        let file = create_copy(&path, landing)?;
        // Without a place, `file` is closed here.
        let open = KeptPlace::take(keep_limit).map(|place| (file, place));
        self.state.lock().unwrap().made[i] = Some(Made { path, open });
        Ok(())
    }

    /// What opens member `i`'s copy, made by [`Copies::make`], for writing on the tier's
    /// thread. Fails once the group is abandoned: a thread stuck in the tier past the drop
    /// must not open a file that a later staging of the slot made at the same path.
    fn opener(&self, i: usize) -> OpenCopy {
        let state = self.state.clone();
        Box::new(move || {
            // Held while opening, so that the drop cannot come between the check and the open.
            let mut st = state.lock().unwrap();
            let gone =
                |why: &str| std::io::Error::new(std::io::ErrorKind::Interrupted, why.to_string());
            if st.abandoned {
                return Err(gone("the group was abandoned"));
            }
            let made = st.made[i]
                .as_mut()
                .ok_or_else(|| gone("the copy was not made"))?;
            match made.open.take() {
                // The place is given back: this is the one copy its group is writing.
                Some((file, _place)) => Ok(file),
                None => std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&made.path),
            }
        })
    }

    /// Member `i`'s copy is handed over: it is no longer the group's to delete.
    fn keep(&self, i: usize) {
        self.state.lock().unwrap().made[i] = None;
    }

    /// Deletes member `i`'s copy, if it was made.
    fn discard(&self, i: usize) {
        if let Some(m) = self.state.lock().unwrap().made[i].take() {
            let _ = std::fs::remove_file(m.path);
        }
    }
}

impl Drop for Copies {
    fn drop(&mut self) {
        let mut st = self.state.lock().unwrap();
        st.abandoned = true;
        // A kept descriptor closes with its `Made`.
        for m in st.made.iter_mut().filter_map(Option::take) {
            let _ = std::fs::remove_file(m.path);
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
        let keep_limit = kept_open_limit();
        let mut members = Vec::with_capacity(ids.len());
        let mut group = Vec::with_capacity(ids.len());
        // Samples the group does not copy: `stage_one` retries or says why.
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
            if copies
                .make(members.len(), tmp.clone(), landing, keep_limit)
                .is_err()
            {
                // `stage_one` says why (or, for a passing condition, succeeds).
                alone.push(id);
                continue;
            }
            group.push(GroupMember {
                open: copies.opener(members.len()),
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
            return self
                .stage_alone(slot_name, dir, alone, made_dirs, progress, landing, out)
                .await;
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
        if !self.take_copies(
            members, results, &copies, progress, landing, &mut out, &mut alone,
        ) {
            return out;
        }
        drop(copies);
        self.stage_alone(slot_name, dir, alone, made_dirs, progress, landing, out)
            .await
    }

    /// Takes a group's copies: a complete one (its CRC read back when the tier gave none) is
    /// kept, counted and added to `out`; another is discarded and its sample left to
    /// [`Stager::stage_one`] (`alone`). Returns `false` when the cache failed: the slot's
    /// failure is then the last outcome in `out`.
    #[allow(clippy::too_many_arguments)]
    fn take_copies(
        &self,
        members: Vec<Member>,
        results: Vec<Result<metfs_tier::Copied, TierError>>,
        copies: &Copies,
        progress: &Progress,
        landing: Landing,
        out: &mut Vec<(u32, Result<Fetched, Miss>)>,
        alone: &mut Vec<u32>,
    ) -> bool {
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
                        return false;
                    }
                },
            };
            self.count_fetched(progress, m.size, m.size);
            copies.keep(i);
            out.push((
                m.id,
                Ok(Fetched {
                    id: m.id,
                    tmp: (landing == Landing::Tmp).then_some(m.tmp),
                    dst: m.dst,
                    bytes: m.size,
                    read: m.size,
                    crc,
                }),
            ));
        }
        true
    }

    /// Stages each of `alone` with [`Stager::stage_one`] after the outcomes in `out`, all at
    /// once (at most `concurrency`); stops at the first failure of the slot as a whole, the
    /// others' fetches dropped with their partial copies.
    ///
    /// At once, not one after the other: each of them met an error of the tier in the group,
    /// and `stage_one` retries such a sample for up to `retry_secs`. One after the other, a
    /// group holding several dead files (an OST down) took `retry_secs` per file before the
    /// slot could complete without them: eight such files and the default 60 s held a
    /// mini-epoch's staging for eight minutes (`tests/stress/test_faults.py`, the POSIX dead
    /// files).
    #[allow(clippy::too_many_arguments)]
    async fn stage_alone(
        &self,
        slot_name: &str,
        dir: &Path,
        alone: Vec<u32>,
        made_dirs: &Mutex<HashSet<String>>,
        progress: &Progress,
        landing: Landing,
        mut out: Vec<(u32, Result<Fetched, Miss>)>,
    ) -> Vec<(u32, Result<Fetched, Miss>)> {
        use futures::StreamExt;
        let mut each = futures::stream::iter(alone)
            .map(|id| async move {
                let r = self
                    .stage_one(slot_name, dir, id, made_dirs, progress, landing)
                    .await;
                (id, r)
            })
            .buffer_unordered(self.cfg.concurrency.max(1));
        while let Some((id, r)) = each.next().await {
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
    use std::io::Write;

    /// Both ways a copy reaches the tier's thread: kept open, and closed then opened again.
    const LIMITS: [usize; 2] = [usize::MAX, 0];

    #[test]
    fn an_abandoned_group_deletes_its_copies_and_opens_no_more() {
        for limit in LIMITS {
            let d = tempfile::tempdir().unwrap();
            let (a, b, c) = (d.path().join("a"), d.path().join("b"), d.path().join("c"));
            let copies = Copies::new(3);
            for (i, p) in [&a, &b, &c].into_iter().enumerate() {
                copies.make(i, p.clone(), Landing::InPlace, limit).unwrap();
            }
            let open_a = copies.opener(0);
            let open_b = copies.opener(1);
            // The tier's thread, stuck past the drop, would open this one last.
            let open_c = copies.opener(2);
            open_a().unwrap().write_all(b"a").unwrap();
            open_b().unwrap();
            copies.keep(0);
            drop(copies);
            assert_eq!(
                std::fs::read(&a).unwrap(),
                b"a",
                "a copy handed over is not the group's to delete"
            );
            assert!(!b.exists(), "a copy made and not handed over is deleted");
            assert!(!c.exists(), "a copy made and never opened is deleted");
            // A later staging of the slot makes a copy at the same path: the late thread must
            // not write into it, through a kept descriptor or by path.
            std::fs::write(&c, b"later").unwrap();
            let late = open_c().unwrap_err();
            assert_eq!(late.kind(), std::io::ErrorKind::Interrupted);
            assert_eq!(std::fs::read(&c).unwrap(), b"later");
        }
    }

    #[test]
    fn a_copy_is_made_empty_and_handed_over_for_writing() {
        for limit in LIMITS {
            let d = tempfile::tempdir().unwrap();
            let a = d.path().join("a");
            let copies = Copies::new(1);
            copies.make(0, a.clone(), Landing::Tmp, limit).unwrap();
            assert_eq!(std::fs::metadata(&a).unwrap().len(), 0);
            // Made once: a second make at the same path in tmp/ is refused, not truncated.
            assert!(copies.make(0, a.clone(), Landing::Tmp, limit).is_err());
            let mut f = copies.opener(0)().unwrap();
            f.write_all(b"copy").unwrap();
            drop(f);
            assert_eq!(std::fs::read(&a).unwrap(), b"copy");
        }
    }

    #[test]
    fn copies_are_kept_open_only_within_the_share_of_descriptors() {
        let d = tempfile::tempdir().unwrap();
        let copies = Copies::new(2);
        copies
            .make(0, d.path().join("a"), Landing::InPlace, usize::MAX)
            .unwrap();
        copies
            .make(1, d.path().join("b"), Landing::InPlace, 0)
            .unwrap();
        let kept = |i: usize| {
            let st = copies.state.lock().unwrap();
            st.made[i].as_ref().unwrap().open.is_some()
        };
        assert!(kept(0), "room in the share: kept open");
        assert!(
            !kept(1),
            "no room: closed, opened again by path when written"
        );
        // A kept copy is the file at its path, not another one.
        copies.opener(0)().unwrap().write_all(b"x").unwrap();
        assert_eq!(std::fs::read(d.path().join("a")).unwrap(), b"x");
        // Other tests make and drop copies at the same time, so the count is checked only as
        // a bound: it never goes below zero (a wrapped counter would be huge).
        assert!(KEPT_OPEN.load(Ordering::Relaxed) < 1 << 20);
        assert!(
            kept_open_limit() >= 1,
            "a sixteenth of any usable descriptor limit"
        );
    }

    #[test]
    fn a_discarded_copy_is_deleted_at_once() {
        for limit in LIMITS {
            let d = tempfile::tempdir().unwrap();
            let a = d.path().join("a");
            let copies = Copies::new(1);
            copies.make(0, a.clone(), Landing::Tmp, limit).unwrap();
            assert!(a.exists());
            copies.discard(0);
            assert!(!a.exists());
            let gone = copies.opener(0)().unwrap_err();
            assert_eq!(gone.kind(), std::io::ErrorKind::Interrupted);
        }
    }
}
