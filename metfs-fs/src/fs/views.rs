//! Switches and the retirement of views: a switch (of the mount's view, or of a job's on a
//! shared mount) retains the old view; the kernel's `forget`, a handle's release and a lease's
//! end may drain it; [`FsCore::retire_drained`] forgets a drained view, its inodes then stale
//! and its cached files and backing ids dropped. The invariants are the parent module's.

use std::sync::Arc;

use super::{FsCore, View};
use crate::view::ROOT_INO;

impl FsCore {
    /// Makes `next` current and retains the old view; returns the old view. Waits for replies
    /// in flight under [`FsCore::reply_gate`] (each a few microseconds).
    pub fn switch(&self, next: Arc<View>) -> Arc<View> {
        let _gate = self.reply_gate.write().unwrap_or_else(|e| e.into_inner());
        let mut v = self.views.write().unwrap();
        let old = std::mem::replace(&mut v.current, next);
        v.retained.insert(old.generation, old.clone());
        old
    }

    /// Makes `next` job `name`'s current view (its directory appears if it is new); the old
    /// view, if any, is retained and returned. As [`FsCore::switch`], under the reply gate.
    /// `next` must be [`View::nested`].
    pub fn switch_job(&self, name: &str, next: Arc<View>) -> Option<Arc<View>> {
        debug_assert!(next.is_nested());
        let _gate = self.reply_gate.write().unwrap_or_else(|e| e.into_inner());
        let mut v = self.views.write().unwrap();
        let old = v.jobs.as_mut()?.insert(name.to_string(), next);
        if let Some(old) = &old {
            v.retained.insert(old.generation, old.clone());
            v.owners.insert(old.generation, name.to_string());
        }
        old
    }

    /// Job `name` leaves the shared mount: its directory goes, its view is retained (until
    /// drained, as after a switch) and returned.
    pub fn remove_job(&self, name: &str) -> Option<Arc<View>> {
        let _gate = self.reply_gate.write().unwrap_or_else(|e| e.into_inner());
        let mut v = self.views.write().unwrap();
        let old = v.jobs.as_mut()?.remove(name)?;
        v.retained.insert(old.generation, old.clone());
        v.owners.insert(old.generation, name.to_string());
        Some(old)
    }

    /// Forgets a retired view if it is drained (see [`FsCore::is_drained`]): its inodes go
    /// stale and its cached files and backing ids are dropped. Returns whether its slot may
    /// go: a view that is current or held (a lease, a handle or a kernel reference taken since
    /// it was found drained) is left as it is, and its holder's release says when to try
    /// again. A generation the core does not know (already forgotten, or a slot staged and
    /// never shown) has nothing to forget and nothing can take a lease on it: its slot may go.
    /// Checked and forgotten under the views' lock, so no lease can be taken in between.
    pub fn retire_drained(&self, generation: u64) -> bool {
        {
            let mut v = self.views.write().unwrap();
            if v.current_of(generation).is_some() {
                return false;
            }
            let Some(view) = v.retained.get(&generation) else {
                return true;
            };
            if !self.unheld(view) {
                return false;
            }
            v.retained.remove(&generation);
            v.owners.remove(&generation);
        }
        self.drop_cached(generation);
        true
    }

    fn drop_cached(&self, generation: u64) {
        self.files.invalidate_if(|k| k.0 == generation);
        self.backing.invalidate_if(|k| k.0 == generation);
        self.live_backing
            .lock()
            .unwrap()
            .retain(|k, _| k.0 != generation);
    }

    /// Whether a view may be evicted: it is not current, no handle is open on it, and (when
    /// kernel references are tracked) the kernel holds none of its files (directories of a
    /// retired view reach no data; see [`View::file_refs`]).
    pub fn is_drained(&self, view: &View) -> bool {
        !self.is_current(view) && self.unheld(view)
    }

    /// No handle, lease or (when tracked) kernel reference to a file holds `view`. A view
    /// taken back ([`FsCore::revoke`]) is held by nothing: its handles and kernel references
    /// reach no data, and it took no lease.
    fn unheld(&self, view: &View) -> bool {
        view.revoked()
            || view.open_handles() == 0
                && view.leases() == 0
                && (!self.settings.track_kernel_refs || view.file_refs() == 0)
    }

    /// The retired views of job `name` still held by a reader (a handle, a lease or a kernel
    /// reference), oldest first.
    pub fn held_views_of(&self, name: &str) -> Vec<Arc<View>> {
        let v = self.views.read().unwrap();
        let mut out: Vec<Arc<View>> = v
            .owners
            .iter()
            .filter(|(_, job)| job.as_str() == name)
            .filter_map(|(g, _)| v.retained.get(g))
            .filter(|view| !self.unheld(view))
            .cloned()
            .collect();
        out.sort_by_key(|view| view.generation);
        out
    }

    /// The processes holding handles on view `generation`, as the kernel named them at their
    /// opens (none on the cached path, where the kernel sends no `open`), without repeats.
    pub fn holders(&self, generation: u64) -> Vec<u32> {
        let mut pids: Vec<u32> = self
            .handles
            .lock()
            .unwrap()
            .values()
            .filter(|h| h.view.generation == generation && h.pid != 0)
            .map(|h| h.pid)
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Takes retired view `generation` back from its readers, so that its slot may go while
    /// they still hold it: from now on a read of it answers EIO, the daemon's descriptors of
    /// its files are closed, and its handles and kernel references no longer hold it (it is
    /// sent on the drained channel). Refused (`false`) for a view that is current or not
    /// retained, and for one read where the daemon cannot take it back: under a lease (its
    /// files opened directly) or a passthrough open (the kernel reads the slot file itself).
    /// Marked under the views' write lock (no lease is taken meanwhile) and the handles' lock
    /// (no handle is made meanwhile).
    pub fn revoke(&self, generation: u64) -> bool {
        let view = {
            let v = self.views.write().unwrap();
            let Some(view) = v.retained.get(&generation).cloned() else {
                return false;
            };
            if v.current_of(generation).is_some() || view.leases() > 0 {
                return false;
            }
            let mut handles = self.handles.lock().unwrap();
            let mine = |h: &&mut super::Handle| h.view.generation == generation;
            if handles
                .values_mut()
                .filter(mine)
                .any(|h| h._pinned.is_some())
            {
                return false;
            }
            view.revoke();
            for h in handles.values_mut().filter(mine) {
                h.file = None;
            }
            view
        };
        self.drop_cached(generation);
        self.notify_if_drained(&view);
        true
    }

    /// Sends `view`'s generation on the `drained` channel if it has drained (a handle's
    /// release, a lease's end or a `forget` may have been its last hold).
    pub(super) fn notify_if_drained(&self, view: &View) {
        if self.is_drained(view) {
            if let Some(tx) = self.drained.lock().unwrap().as_ref() {
                let _ = tx.send(view.generation);
            }
        }
    }

    /// Takes back `n` lookups of `ino` (the kernel's `forget`). Inodes of views already retired
    /// are ignored: such a view drained with no reference left, so there is nothing to take.
    pub fn forget(&self, ino: u64, n: u64) {
        if ino == ROOT_INO {
            return;
        }
        let Ok((view, idx)) = self.view_of(ino) else {
            return;
        };
        if view.kernel_unref(idx, n) == 0 {
            self.notify_if_drained(&view);
        }
    }

    /// The retained (not current) view of `generation`, if any.
    pub fn retained(&self, generation: u64) -> Option<Arc<View>> {
        self.views
            .read()
            .unwrap()
            .retained
            .get(&generation)
            .cloned()
    }

    /// Every retained (retired, not yet drained) view, oldest first.
    pub fn retained_views(&self) -> Vec<Arc<View>> {
        let mut out: Vec<Arc<View>> = self
            .views
            .read()
            .unwrap()
            .retained
            .values()
            .cloned()
            .collect();
        out.sort_by_key(|v| v.generation);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::testing::*;
    use crate::fs::{FsError, FsSettings};

    #[test]
    fn kernel_references_pin_a_view_on_the_cached_path() {
        let (d, c) = setup();
        let v1 = view(&d, &c, &[0, 1], 1, 0, "s1");
        let core = FsCore::new(
            v1,
            FsSettings {
                track_kernel_refs: true,
                ..settings()
            },
        );
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        core.set_drained_sender(tx);
        // The kernel looks up d, then d/f twice (an entry that expired), and reads f by inode.
        let dir = core.lookup(ROOT_INO, "d").unwrap();
        assert!(dir.current);
        let f = core.lookup(dir.ino, "f").unwrap();
        core.lookup(dir.ino, "f").unwrap();
        assert_eq!(core.read_ino(f.ino, 0, 4096).unwrap(), vec![1u8; 100]);
        let v2 = view(&d, &c, &[0, 1], 2, 1, "s2");
        let old = core.switch(v2);
        assert!(!core.is_drained(&old), "the kernel still holds its inodes");
        // Old inodes keep reading old bytes, and their entries are no longer cacheable.
        assert_eq!(core.read_ino(f.ino, 0, 4096).unwrap(), vec![1u8; 100]);
        assert!(!core.lookup(dir.ino, "f").unwrap().current);
        core.forget(f.ino, 2);
        core.forget(dir.ino, 1);
        assert!(rx.try_recv().is_err(), "one lookup of f is still held");
        core.forget(f.ino, 1);
        assert_eq!(rx.try_recv().unwrap(), 1);
        assert!(core.is_drained(&old));
        assert!(core.retire_drained(1));
        assert_eq!(core.read_ino(f.ino, 0, 1).unwrap_err(), FsError::Stale);
        // Forgets of a retired view are ignored; the current view never drains.
        core.forget(f.ino, 1);
        let g = core.lookup(ROOT_INO, "g").unwrap();
        core.forget(g.ino, 1);
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn directories_alone_do_not_pin_a_retired_view() {
        let (d, c) = setup();
        let v1 = view(&d, &c, &[0, 1], 1, 0, "s1");
        let core = FsCore::new(
            v1,
            FsSettings {
                track_kernel_refs: true,
                ..settings()
            },
        );
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        core.set_drained_sender(tx);
        // The kernel holds d many times over (listings and lookups) and d/f once.
        let dir = core.lookup(ROOT_INO, "d").unwrap();
        for _ in 0..492 {
            core.lookup(ROOT_INO, "d").unwrap();
        }
        let f = core.lookup(dir.ino, "f").unwrap();
        let old = core.switch(view(&d, &c, &[0, 1], 2, 1, "s2"));
        assert!(!core.is_drained(&old), "f is still held");
        core.forget(f.ino, 1);
        // Only the directory is held now: it reaches no data, so the slot may go.
        assert_eq!(old.kernel_refs(), 493);
        assert_eq!(rx.try_recv().unwrap(), 1);
        assert!(core.is_drained(&old));
        assert!(core.retire_drained(1));
        assert_eq!(core.lookup(dir.ino, "f"), Err(FsError::Stale));
        core.forget(dir.ino, 493);
        assert!(rx.try_recv().is_err());
    }

    /// A job's retired view held by a reader is listed as held; taken back, its handle's reads
    /// answer EIO, it counts as drained (sent on the channel), it takes no new handle or
    /// lease, and it is gone from the held list, while a newer view the job's reader holds
    /// keeps reading. A view under a lease is not taken back.
    #[test]
    fn a_view_taken_back_reads_eio_and_holds_its_slot_no_longer() {
        let (d, c) = setup();
        let nested = |g, slot| {
            Arc::new(
                Arc::into_inner(view(&d, &c, &[0, 1], g, 0, slot))
                    .unwrap()
                    .nested(),
            )
        };
        let core = Arc::new(FsCore::new_shared(view(&d, &c, &[], 1, 0, ""), settings()));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        core.set_drained_sender(tx);
        let open_f = |core: &FsCore| {
            let job = core.lookup(ROOT_INO, "a").unwrap();
            let dir = core.lookup(job.ino, "d").unwrap();
            let f = core.lookup(dir.ino, "f").unwrap();
            core.open(f.ino, 4242).unwrap().fh
        };
        core.switch_job("a", nested(2, "s1"));
        let old_fh = open_f(&core);
        core.switch_job("a", nested(3, "s2"));
        let new_fh = open_f(&core);
        core.switch_job("a", nested(4, "s1"));
        let held: Vec<u64> = core
            .held_views_of("a")
            .iter()
            .map(|v| v.generation)
            .collect();
        assert_eq!(held, [2, 3]);
        assert_eq!(core.holders(2), [4242]);
        let old = core.retained(2).unwrap();
        assert!(!core.is_drained(&old));
        assert!(core.revoke(2));
        assert_eq!(core.read(old_fh, 0, 10).unwrap_err(), FsError::Revoked);
        assert_eq!(FsError::Revoked.errno(), libc::EIO);
        assert_eq!(core.read(new_fh, 0, 4).unwrap(), vec![2u8; 4]);
        assert_eq!(rx.try_recv().unwrap(), 2);
        assert!(core.is_drained(&old));
        assert!(core.lease(&old).is_none(), "no lease on a view taken back");
        let held: Vec<u64> = core
            .held_views_of("a")
            .iter()
            .map(|v| v.generation)
            .collect();
        assert_eq!(held, [3]);
        assert!(core.retire_drained(2));
        core.release(old_fh);
        // Under a lease a view is not taken back; the current view never is.
        let leased = core.retained(3).unwrap();
        let lease = core.lease(&leased).unwrap();
        assert!(!core.revoke(3));
        drop(lease);
        assert!(!core.revoke(4));
    }
}
