//! Seals: a quick resume after a clean shutdown, without trusting bytes nobody has checked.
//!
//! A resume normally re-reads every journaled copy of a slot for its CRC (`stage`), which costs
//! one read of the whole cache at every start: minutes for a million small files. At a clean
//! shutdown the daemon instead *seals* each complete slot ([`Stager::seal`]): it writes
//! `SLOTS/<name>.seal` with the journal's length and CRC-32 and, for every directory of the
//! slot, its inode number, mtime and ctime. The next start takes every seal at once
//! ([`Stager::take_seals`]): each is read, deleted, and kept in memory only if the journal and
//! every directory are exactly as sealed. Staging such a slot then keeps its journaled copies
//! without reading them ([`StageReport::resumed`] counts them as usual), and registers them in
//! a [`CopyChecks`]: the first open of each copy reads it once and compares its CRC with the
//! journal's before any byte is served ([`CopyChecks::check`]).
//!
//! What each part catches:
//! * a copy deleted, added, renamed or replaced while unmounted changes its directory's mtime
//!   and ctime (ctime cannot be set back from user space): the seal does not match, and the
//!   slot gets the full check;
//! * a journal appended to or rewritten changes its length or CRC: the same;
//! * a copy changed in place (same name, same inode: `dd conv=notrunc`, a bit flipped on the
//!   disk) leaves its directory as it was: its first open reads it, finds the CRC wrong,
//!   answers an I/O error instead of the bytes, and deletes the copy so that nothing passes its
//!   bytes on; the slot is not sealed again, so the next start's full check fetches it anew.
//!
//! Seals are deleted as they are taken, at start, before anything can change a slot: a daemon
//! that crashes later leaves no seal behind, and the start after a crash checks every copy as
//! before. A slot staged with a transform, or in container mode, is never sealed.

use std::os::unix::fs::MetadataExt;
use std::sync::atomic::AtomicUsize;

use super::{
    cache_err, crc_of_open_file, JournalBatch, Landing, Miss, Progress, StageError, Stager,
};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The seal format's version: a seal of another version is ignored (the full check runs).
const SEAL_VERSION: u32 = 1;

/// What a seal file holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Seal {
    v: u32,
    /// The journal's length in bytes.
    journal_len: u64,
    /// CRC-32 of the journal's bytes.
    journal_crc: u32,
    /// Every directory of the slot, the slot's own first (path `""`), parents before children.
    dirs: Vec<SealedDir>,
}

/// A directory of a sealed slot, as `lstat` showed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SealedDir {
    /// Relative to the slot's directory.
    path: String,
    ino: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl SealedDir {
    fn of(path: String, m: &std::fs::Metadata) -> Self {
        Self {
            path,
            ino: m.ino(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// The copies of one slot kept on the strength of its seal and not read yet. Each is checked
/// the first time it is opened; the check is one read of the copy, paid once per start.
#[derive(Debug)]
pub struct CopyChecks {
    slot: String,
    dir: PathBuf,
    /// (sample, journaled CRC), sorted by sample.
    crcs: Box<[(u32, u32)]>,
    /// One bit per entry of `crcs`: checked and found good.
    good: Box<[AtomicU64]>,
    /// One bit per entry of `crcs`: found damaged (the copy was deleted).
    damaged: Box<[AtomicU64]>,
    damaged_count: AtomicUsize,
    /// Held while a damaged copy is fetched again, so concurrent opens fetch it once.
    repairing: tokio::sync::Mutex<()>,
}

/// What [`CopyChecks::state`] says of a sample's copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyState {
    /// Checked at staging, or at an earlier open: serve it.
    Good,
    /// Read it and compare its CRC with this one before serving it ([`CopyChecks::check`]).
    Unchecked(u32),
    /// Found damaged and deleted, not fetched again yet ([`Stager::repair`]).
    Damaged,
}

fn bit(bits: &[AtomicU64], i: usize) -> bool {
    bits[i / 64].load(Ordering::Acquire) & (1 << (i % 64)) != 0
}

fn set_bit(bits: &[AtomicU64], i: usize) -> bool {
    let mask = 1 << (i % 64);
    bits[i / 64].fetch_or(mask, Ordering::AcqRel) & mask == 0
}

impl CopyChecks {
    fn new(slot: &str, dir: PathBuf, mut crcs: Vec<(u32, u32)>) -> Self {
        crcs.sort_unstable();
        let words = crcs.len().div_ceil(64);
        let zeros = || (0..words).map(|_| AtomicU64::new(0)).collect();
        Self {
            slot: slot.to_string(),
            dir,
            crcs: crcs.into_boxed_slice(),
            good: zeros(),
            damaged: zeros(),
            damaged_count: AtomicUsize::new(0),
            repairing: tokio::sync::Mutex::new(()),
        }
    }

    fn index(&self, sample: u32) -> Option<usize> {
        self.crcs.binary_search_by_key(&sample, |e| e.0).ok()
    }

    /// The slot these copies are in.
    pub fn slot(&self) -> &str {
        &self.slot
    }

    /// Whether `sample`'s copy may be served as it is.
    pub fn state(&self, sample: u32) -> CopyState {
        match self.index(sample) {
            None => CopyState::Good,
            Some(i) if bit(&self.damaged, i) => CopyState::Damaged,
            Some(i) if bit(&self.good, i) => CopyState::Good,
            Some(i) => CopyState::Unchecked(self.crcs[i].1),
        }
    }

    /// Reads `file` (sample `sample`'s copy, at `rel` in the slot) whole and compares its CRC
    /// with the journal's. A good copy is marked so and never read again; a damaged one is
    /// deleted, logged once, and refused from then on. Blocking.
    pub fn check(&self, sample: u32, rel: &str, file: &std::fs::File) -> Result<(), StageError> {
        let Some(i) = self.index(sample) else {
            return Ok(());
        };
        if bit(&self.good, i) {
            return Ok(());
        }
        let damaged = |reason: String| StageError::Damaged {
            path: self.dir.join(rel).display().to_string(),
            reason,
        };
        if bit(&self.damaged, i) {
            return Err(damaged("found damaged at an earlier open".into()));
        }
        let want = self.crcs[i].1;
        let got = crc_of_open_file(file).map_err(|e| damaged(format!("reading it: {e}")))?;
        if got == want {
            set_bit(&self.good, i);
            return Ok(());
        }
        let reason = format!("its CRC-32 is {got:08x}, the journal's {want:08x}");
        if set_bit(&self.damaged, i) {
            self.damaged_count.fetch_add(1, Ordering::Relaxed);
            let path = self.dir.join(rel);
            // Deleted, so that neither a donor link nor a later seal passes the bytes on.
            let _ = std::fs::remove_file(&path);
            tracing::error!(path = %path.display(), %reason, "a staged copy changed on disk while the cache was unmounted; its bytes are not served, and it is fetched again");
        }
        Err(damaged(reason))
    }

    /// Marks `sample`'s copy good again: it was fetched anew.
    fn repaired(&self, sample: u32) {
        let Some(i) = self.index(sample) else {
            return;
        };
        let mask = 1 << (i % 64);
        if self.damaged[i / 64].fetch_and(!mask, Ordering::AcqRel) & mask != 0 {
            self.damaged_count.fetch_sub(1, Ordering::Relaxed);
        }
        set_bit(&self.good, i);
    }

    /// Copies found damaged and not fetched again.
    pub fn damaged(&self) -> usize {
        self.damaged_count.load(Ordering::Relaxed)
    }

    /// Copies not checked yet.
    pub fn unchecked(&self) -> usize {
        let marked: u32 = self
            .good
            .iter()
            .chain(self.damaged.iter())
            .map(|w| w.load(Ordering::Relaxed).count_ones())
            .sum();
        self.crcs.len() - marked as usize
    }
}

impl Stager {
    fn seal_path(&self, name: &str) -> PathBuf {
        self.slots_dir.join(format!("{name}.seal"))
    }

    /// Length and CRC-32 of slot `name`'s journal.
    fn journal_digest(&self, name: &str) -> std::io::Result<(u64, u32)> {
        let journal = std::fs::read(self.journal(name).path())?;
        Ok((journal.len() as u64, crc32fast::hash(&journal)))
    }

    /// Why `seal` does not describe slot `name` as it is now, if it does not. Only the sealed
    /// directories are looked at, one `lstat` each, never listed: an entry added to, removed
    /// from or renamed in any of them (a directory included) changes that directory's mtime
    /// and ctime, and a directory replaced changes its inode.
    fn seal_holds(&self, name: &str, seal: &Seal) -> Result<(), String> {
        let digest = self
            .journal_digest(name)
            .map_err(|e| format!("the journal cannot be read: {e}"))?;
        if digest != (seal.journal_len, seal.journal_crc) {
            return Err("its journal changed".into());
        }
        // A seal is read back as untrusted input: the slot's own directory first, and only
        // relative paths below it.
        if seal.dirs.first().is_none_or(|d| !d.path.is_empty()) {
            return Err("it does not list the slot's directory".into());
        }
        let root = self.slot_path(name);
        for d in &seal.dirs {
            if d.path.starts_with('/') || d.path.split('/').any(|c| c == "..") {
                return Err(format!("it lists a path outside the slot: {:?}", d.path));
            }
            let m = std::fs::symlink_metadata(root.join(&d.path))
                .map_err(|e| format!("{:?}: {e}", d.path))?;
            if !m.is_dir() || SealedDir::of(d.path.clone(), &m) != *d {
                return Err(format!("its directory {:?} changed", d.path));
            }
        }
        Ok(())
    }

    /// The seal slot `name` would have now: its journal's digest and its directories.
    fn current_seal(&self, name: &str) -> std::io::Result<Seal> {
        let (journal_len, journal_crc) = self.journal_digest(name)?;
        let root = self.slot_path(name);
        let mut dirs = vec![SealedDir::of(
            String::new(),
            &std::fs::symlink_metadata(&root)?,
        )];
        let mut i = 0;
        while i < dirs.len() {
            let rel = dirs[i].path.clone();
            let mut subs = Vec::new();
            for e in std::fs::read_dir(root.join(&rel))? {
                let e = e?;
                // The entry's own type: a symlink to a directory is not walked.
                if e.file_type()?.is_dir() {
                    let Some(n) = e.file_name().to_str().map(str::to_string) else {
                        continue;
                    };
                    let sub = if rel.is_empty() {
                        n
                    } else {
                        format!("{rel}/{n}")
                    };
                    subs.push(sub);
                }
            }
            subs.sort();
            for sub in subs {
                let m = std::fs::symlink_metadata(root.join(&sub))?;
                dirs.push(SealedDir::of(sub, &m));
            }
            i += 1;
        }
        Ok(Seal {
            v: SEAL_VERSION,
            journal_len,
            journal_crc,
            dirs,
        })
    }

    /// Seals slot `name` for a quick resume (module docs). Only a complete slot of plain
    /// copies, none found damaged, is sealed; returns whether it was. Call it at a clean
    /// shutdown, when nothing stages or evicts any more. Blocking.
    pub fn seal(&self, name: &str) -> Result<bool, StageError> {
        let path = self.seal_path(name);
        let damaged = self.copy_checks(name).is_some_and(|c| c.damaged() > 0);
        if self.transform.is_some() || damaged || !self.is_complete(name) {
            let _ = std::fs::remove_file(&path);
            return Ok(false);
        }
        let seal = self.current_seal(name).map_err(cache_err(&path))?;
        let body = serde_json::to_vec(&seal).expect("a seal serialises");
        metfs_durable::write(&path, &body, metfs_durable::Durability::File).map_err(|e| {
            StageError::Cache {
                path: path.display().to_string(),
                source: std::io::Error::new(e.io_error().kind(), e.to_string()),
            }
        })?;
        Ok(true)
    }

    /// Reads and deletes every seal; remembers the slots whose journal and directories are as
    /// sealed, for [`Stager::stage`] to resume without reading their copies. Returns their
    /// names. Call it once at start, before anything stages or evicts.
    pub fn take_seals(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        let Ok(rd) = std::fs::read_dir(&self.slots_dir) else {
            return names;
        };
        let mut seals: Vec<(String, PathBuf)> = rd
            .flatten()
            .filter_map(|e| {
                let file = e.file_name().to_str()?.to_string();
                let name = file.strip_suffix(".seal")?.to_string();
                Some((name, e.path()))
            })
            .collect();
        seals.sort();
        for (name, path) in seals {
            let read = std::fs::read(&path);
            let _ = std::fs::remove_file(&path);
            let verdict = match read {
                Err(e) => Err(format!("unreadable: {e}")),
                Ok(bytes) => match serde_json::from_slice::<Seal>(&bytes) {
                    Err(e) => Err(format!("not a seal: {e}")),
                    Ok(s) if s.v != SEAL_VERSION => Err(format!("version {}", s.v)),
                    Ok(s) => self.seal_holds(&name, &s),
                },
            };
            match verdict {
                Ok(()) => names.push(name),
                Err(why) => {
                    tracing::warn!(slot = %name, %why, "the slot's seal does not hold; every copy is checked");
                }
            }
        }
        if let Ok(d) = std::fs::File::open(&self.slots_dir) {
            // The seals' deletion is durable before anything can change a slot, so a crash
            // later never finds a seal describing the slot as it was.
            let _ = d.sync_all();
        }
        self.sealed.lock().unwrap().extend(names.iter().cloned());
        names
    }

    /// Fetches sample `id` of slot `name` again from the tier, after [`CopyChecks::check`]
    /// found its copy damaged and deleted it: fetched into `tmp/` and checked as staging does,
    /// made durable, renamed into the slot and journaled (the journal ends with `complete`
    /// again). Concurrent repairs of one copy fetch it once. The copy is then good to serve.
    pub async fn repair(&self, name: &str, id: u32) -> Result<(), StageError> {
        let Some(checks) = self.copy_checks(name) else {
            return Ok(());
        };
        let _one = checks.repairing.lock().await;
        if checks.state(id) == CopyState::Good {
            return Ok(());
        }
        let dir = self.slot_path(name);
        let f = match self
            .stage_one(
                name,
                &dir,
                id,
                &Mutex::default(),
                &Progress::default(),
                Landing::Tmp,
            )
            .await
        {
            Ok(f) => f,
            Err(Miss::Slot(e)) => return Err(e),
            // A repair is never staged deferring; the arm keeps the match whole.
            Err(Miss::Sample(why)) | Err(Miss::Deferred(why)) => {
                return Err(StageError::Damaged {
                    path: dir.join(self.catalog.path(id)).display().to_string(),
                    reason: format!("it cannot be fetched again: {why}"),
                })
            }
        };
        let fsync = self.cfg.fsync;
        let tmp = f.tmp.clone().expect("a repair lands in tmp/");
        let dst = f.dst.clone();
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            if fsync {
                std::fs::File::open(&tmp)?.sync_all()?;
            }
            std::fs::rename(&tmp, &dst)
        })
        .await
        .expect("repair task panicked")
        .map_err(cache_err(&f.dst))?;
        let journal = self.journal(name);
        let mut w = journal.append().map_err(cache_err(journal.path()))?;
        let mut line = JournalBatch::with_capacity(1);
        line.staged(id, f.crc);
        w.write(&line).map_err(cache_err(journal.path()))?;
        w.complete().map_err(cache_err(journal.path()))?;
        checks.repaired(id);
        tracing::info!(path = %f.dst.display(), "the damaged copy was fetched again from the tier");
        Ok(())
    }

    /// Whether slot `name` was found sealed at start and not staged since; consumes it.
    pub(super) fn take_sealed(&self, name: &str) -> bool {
        self.sealed.lock().unwrap().remove(name)
    }

    /// Registers `crcs` (sample, journaled CRC) as copies of slot `name` to check at first open.
    pub(super) fn register_checks(&self, name: &str, crcs: Vec<(u32, u32)>) {
        let checks = Arc::new(CopyChecks::new(name, self.slot_path(name), crcs));
        self.checks.lock().unwrap().insert(name.to_string(), checks);
    }

    /// The copies of slot `name` still to check at their first open, if it was resumed from
    /// its seal.
    pub fn copy_checks(&self, name: &str) -> Option<Arc<CopyChecks>> {
        self.checks.lock().unwrap().get(name).cloned()
    }

    /// Forgets slot `name`'s seal and checks (it is being evicted or staged afresh).
    pub(super) fn forget_seal(&self, name: &str) {
        self.sealed.lock().unwrap().remove(name);
        self.checks.lock().unwrap().remove(name);
        let _ = std::fs::remove_file(self.seal_path(name));
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{all, assert_slot_equals_source, setup};
    use super::*;
    use crate::stager::EVICTED;
    use metfs_tier::catalog::Catalog;
    use metfs_tier::pacer::Pacer;
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    /// The same cache as `st`'s, as a new daemon would open it: nothing carried in memory.
    fn restart(st: &Stager) -> Stager {
        Stager::new(
            st.tier.clone(),
            st.catalog.clone(),
            st.slots_dir.clone(),
            st.tmp_dir.clone(),
            st.cfg.clone(),
            Pacer::unlimited(),
        )
    }

    /// Overwrites one byte of `path` in place: same inode, same size, directory untouched.
    fn flip_in_place(path: &Path, at: u64) {
        use std::os::unix::fs::FileExt;
        let mut m = std::fs::metadata(path).unwrap().permissions();
        m.set_mode(0o600);
        std::fs::set_permissions(path, m).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        let mut b = [0u8];
        f.read_exact_at(&mut b, at).unwrap();
        f.write_all_at(&[b[0] ^ 0xff], at).unwrap();
    }

    #[tokio::test]
    async fn a_sealed_slot_resumes_unread_and_each_copy_is_checked_at_its_first_open() {
        let (d, st, cat) = setup(12).await;
        let spec = all(&cat, "s");
        st.stage(&spec, Arc::default()).await.unwrap();
        assert!(st.seal("s").unwrap());
        let victim = 7u32;
        flip_in_place(&st.slot_path("s").join(cat.path(victim)), 3);

        let st2 = restart(&st);
        assert_eq!(st2.take_seals(), vec!["s".to_string()]);
        assert!(
            !st2.seal_path("s").exists(),
            "a seal is deleted as it is taken"
        );
        let r = st2.stage(&spec, Arc::default()).await.unwrap();
        assert_eq!((r.fetched, r.resumed), (0, 12));
        let checks = st2.copy_checks("s").expect("copies to check at first open");
        assert_eq!(checks.unchecked(), 12);
        let open = |id: u32| std::fs::File::open(st2.slot_path("s").join(cat.path(id)));
        checks.check(1, &cat.path(1), &open(1).unwrap()).unwrap();
        assert_eq!(checks.state(1), CopyState::Good);
        assert!(matches!(checks.state(victim), CopyState::Unchecked(_)));
        let e = checks
            .check(victim, &cat.path(victim), &open(victim).unwrap())
            .unwrap_err();
        assert!(matches!(e, StageError::Damaged { .. }), "{e}");
        assert!(e.to_string().contains(&cat.path(victim)), "{e}");
        assert_eq!(checks.state(victim), CopyState::Damaged);
        assert!(open(victim).is_err(), "a damaged copy is deleted");
        assert_eq!((checks.damaged(), checks.unchecked()), (1, 10));
        // A slot with a damaged copy is not sealed again: the next start checks every copy and
        // fetches the damaged one anew.
        assert!(!st2.seal("s").unwrap());
        let st3 = restart(&st);
        assert!(st3.take_seals().is_empty());
        let r = st3.stage(&spec, Arc::default()).await.unwrap();
        assert_eq!((r.fetched, r.resumed), (1, 11));
        assert!(st3.copy_checks("s").is_none());
        assert_slot_equals_source(&st3, &cat, &d.path().join("src"), "s");
    }

    #[tokio::test]
    async fn a_seal_does_not_hold_once_the_slot_or_its_journal_changed() {
        type Change = fn(&Stager, &Catalog);
        let changes: [(&str, Change); 6] = [
            ("a copy deleted", |st, cat| {
                std::fs::remove_file(st.slot_path("s").join(cat.path(4))).unwrap()
            }),
            ("a copy replaced by rename", |st, cat| {
                let p = st.slot_path("s").join(cat.path(4));
                let tmp = p.with_extension("new");
                std::fs::write(&tmp, b"other bytes").unwrap();
                std::fs::rename(&tmp, &p).unwrap();
            }),
            ("the journal appended to", |st, _| {
                let mut j = st.journal("s").append().unwrap();
                let mut b = JournalBatch::with_capacity(1);
                b.staged(4, 0);
                j.write(&b).unwrap();
            }),
            ("a directory added", |st, _| {
                std::fs::create_dir(st.slot_path("s").join("c0/new")).unwrap()
            }),
            ("a seal listing a path outside the slot", |st, _| {
                let p = st.seal_path("s");
                let mut v: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
                v["dirs"][1]["path"] = "../..".into();
                std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
            }),
            ("the seal damaged", |st, _| {
                std::fs::write(st.seal_path("s"), b"{\"v\":1}").unwrap()
            }),
        ];
        for (what, change) in changes {
            let (d, st, cat) = setup(9).await;
            let spec = all(&cat, "s");
            st.stage(&spec, Arc::default()).await.unwrap();
            assert!(st.seal("s").unwrap());
            change(&st, &cat);
            let st2 = restart(&st);
            assert!(st2.take_seals().is_empty(), "{what}: the seal held");
            assert!(!st2.seal_path("s").exists(), "{what}");
            let r = st2.stage(&spec, Arc::default()).await.unwrap();
            assert!(st2.copy_checks("s").is_none(), "{what}");
            assert_eq!(r.fetched + r.resumed, 9, "{what}");
            assert_slot_equals_source(&st2, &cat, &d.path().join("src"), "s");
        }
    }

    #[tokio::test]
    async fn only_a_complete_slot_is_sealed_and_eviction_forgets_the_seal() {
        let (_d, st, cat) = setup(6).await;
        let spec = all(&cat, "s");
        st.stage(&spec, Arc::default()).await.unwrap();
        std::fs::create_dir_all(st.slot_path("half")).unwrap();
        let mut j = st.journal("half").append().unwrap();
        let mut b = JournalBatch::with_capacity(1);
        b.staged(0, 1);
        j.write(&b).unwrap();
        assert!(!st.seal("half").unwrap(), "an incomplete slot was sealed");
        assert!(st.seal("s").unwrap());
        st.evict("s").unwrap();
        assert!(!st.seal_path("s").exists());
        assert!(restart(&st).take_seals().is_empty());
    }

    #[tokio::test]
    async fn a_slot_evicted_in_the_background_is_gone_at_once_and_staging_waits_for_its_space() {
        let (d, st, cat) = setup(30).await;
        st.stage(&all(&cat, "old"), Arc::default()).await.unwrap();
        st.evict_in_background("old").unwrap();
        assert!(!st.slot_path("old").exists());
        assert!(!st.journal("old").path().exists());
        assert!(st.present_slots().is_empty());
        let r = st.stage(&all(&cat, "new"), Arc::default()).await.unwrap();
        assert_eq!(r.fetched, 30);
        // Staging fetched only after the deletion ended, so tmp/ holds nothing of it now.
        assert!(std::fs::read_dir(&st.tmp_dir).unwrap().next().is_none());
        assert_slot_equals_source(&st, &cat, &d.path().join("src"), "new");

        // A deletion a stopped daemon left in tmp/ is finished by the next start's cleanup.
        let left = st.tmp_dir.join(format!("{EVICTED}gone.3/a/b"));
        std::fs::create_dir_all(&left).unwrap();
        std::fs::write(left.join("f"), b"x").unwrap();
        let st2 = restart(&st);
        st2.clean_tmp().unwrap();
        st2.evictions_done().await;
        assert!(std::fs::read_dir(&st.tmp_dir).unwrap().next().is_none());
    }

    #[test]
    fn bits_mark_once() {
        let c = CopyChecks::new("s", PathBuf::from("/x"), vec![(9, 1), (3, 2), (70, 3)]);
        assert_eq!(c.state(3), CopyState::Unchecked(2));
        assert_eq!(c.state(4), CopyState::Good);
        assert_eq!(c.unchecked(), 3);
        assert!(set_bit(&c.good, c.index(70).unwrap()));
        assert!(!set_bit(&c.good, c.index(70).unwrap()));
        assert_eq!(c.state(70), CopyState::Good);
        assert_eq!(c.unchecked(), 2);
    }
}
