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

    /// No handle, lease or (when tracked) kernel reference to a file holds `view`.
    fn unheld(&self, view: &View) -> bool {
        view.open_handles() == 0
            && view.leases() == 0
            && (!self.settings.track_kernel_refs || view.file_refs() == 0)
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
}
