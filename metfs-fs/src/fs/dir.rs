//! Lookups and listings, answered from the views in memory: a miss in a retired view is
//! ESTALE, a listing is of the one view its handle pinned, and on a shared mount the root
//! lists the jobs.

use std::sync::atomic::Ordering;

use super::{attr_in, Attr, DirEntry, FsCore, FsError, Handle};
use crate::view::{Miss, ROOT_INO};

impl FsCore {
    /// On a shared mount, the attributes of the job directory `name` in the root.
    fn lookup_job(&self, name: &str) -> Result<Attr, FsError> {
        let view = self.job_view(name).ok_or(FsError::NotFound)?;
        view.kernel_ref(0);
        Ok(attr_in(&view, 0, true))
    }

    /// Resolves `name` in directory `parent`. A miss in a retired view is ESTALE, not ENOENT:
    /// the kernel would cache ENOENT as a negative entry below the old directory, which holds
    /// that directory (and so the view) until memory runs short, and nothing can prune it. On
    /// ESTALE the kernel instead walks the path again revalidating every component, which
    /// reaches the current view (a path resolved just before a switch, looking up a name of the
    /// new view in a directory of the old one, then finds it).
    pub fn lookup(&self, parent: u64, name: &str) -> Result<Attr, FsError> {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        if parent == ROOT_INO && self.is_shared() {
            return self.lookup_job(name);
        }
        let (view, idx) = self.view_of(parent)?;
        let child = match view.lookup(idx, name) {
            Ok(c) => c,
            Err(Miss::NotFound) if !self.is_current(&view) => return Err(FsError::Stale),
            Err(e) => return Err(e.into()),
        };
        view.touch(child);
        // Counted before the reply: the kernel may forget the entry as soon as it has it.
        view.kernel_ref(child);
        Ok(self.attr(&view, child))
    }

    /// Attributes of `ino`.
    pub fn getattr(&self, ino: u64) -> Result<Attr, FsError> {
        let (view, idx) = self.view_of(ino)?;
        Ok(self.attr(&view, idx))
    }

    /// Pins the view of directory `ino` for a listing; returns a handle for [`FsCore::readdir`].
    pub fn opendir(&self, ino: u64) -> Result<u64, FsError> {
        if ino == ROOT_INO && self.is_shared() {
            let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
            self.root_listings
                .lock()
                .unwrap()
                .insert(fh, self.job_views());
            return Ok(fh);
        }
        let (view, idx) = self.view_of(ino)?;
        view.children(idx)?;
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        view.handle_opened();
        self.handles.lock().unwrap().insert(
            fh,
            Handle {
                view,
                idx,
                // A listing reaches no data: who holds it is not asked.
                pid: 0,
                file: None,
                _pinned: None,
            },
        );
        Ok(fh)
    }

    /// Lists directory `ino` from `offset` in the view pinned by `fh` (so one listing never
    /// mixes two views), `.` and `..` first, handing each entry to `add` until it returns true
    /// (the reply is full). With `plus`, every entry `add` took besides `.` and `..` gives the
    /// kernel a reference, as a lookup does (READDIRPLUS).
    pub fn readdir(
        &self,
        ino: u64,
        fh: u64,
        offset: u64,
        plus: bool,
        mut add: impl FnMut(&DirEntry) -> bool,
    ) -> Result<(), FsError> {
        if ino == ROOT_INO && self.is_shared() {
            let jobs = self
                .root_listings
                .lock()
                .unwrap()
                .get(&fh)
                .cloned()
                .ok_or(FsError::BadHandle)?;
            let root = self.views.read().unwrap().current.clone();
            let total = jobs.len() as u64 + 2;
            for off in offset..total {
                let (name, attr) = match off {
                    0 => (".", attr_in(&root, 0, true)),
                    1 => ("..", attr_in(&root, 0, true)),
                    _ => {
                        let (n, v) = &jobs[(off - 2) as usize];
                        (n.as_str(), attr_in(v, 0, self.is_current(v)))
                    }
                };
                let entry = DirEntry {
                    next_offset: off + 1,
                    name,
                    attr,
                };
                if add(&entry) {
                    break;
                }
                if plus && off >= 2 {
                    jobs[(off - 2) as usize].1.kernel_ref(0);
                }
            }
            return Ok(());
        }
        let view = self
            .handles
            .lock()
            .unwrap()
            .get(&fh)
            .map(|h| h.view.clone())
            .ok_or(FsError::BadHandle)?;
        let idx = if ino == ROOT_INO {
            0
        } else {
            view.index_of(ino).ok_or(FsError::Stale)?
        };
        let children = view.children(idx)?;
        let parent = view.parent(idx);
        let total = children.len() as u64 + 2;
        // One listing is of one view, current or not.
        let current = self.is_current(&view);
        for off in offset..total {
            let (node, name) = match off {
                0 => (idx, "."),
                1 => (parent, ".."),
                _ => {
                    let c = children.start + (off - 2) as u32;
                    (c, view.name(c))
                }
            };
            let entry = DirEntry {
                next_offset: off + 1,
                name,
                attr: attr_in(&view, node, current),
            };
            if add(&entry) {
                break;
            }
            if plus && off >= 2 {
                view.kernel_ref(node);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::testing::*;

    #[test]
    fn readdir_is_pinned_and_complete() {
        let (d, c) = setup();
        let v1 = view(&d, &c, &[0, 1], 1, 0, "s1");
        let core = FsCore::new(v1, settings());
        let fh = core.opendir(ROOT_INO).unwrap();
        let names = list(&core, fh, 0);
        assert_eq!(names, vec![".", "..", "d", "g"]);
        let v2 = view(&d, &c, &[1], 2, 1, "s2");
        core.switch(v2);
        // Resuming the listing after a switch still lists the pinned view.
        assert_eq!(list(&core, fh, 2), vec!["d", "g"]);
        core.release(fh);
        let fh = core.opendir(ROOT_INO).unwrap();
        assert_eq!(list(&core, fh, 0), vec![".", "..", "g"]);
    }

    #[test]
    fn a_miss_in_a_retired_view_is_stale() {
        let (d, c) = setup();
        let v1 = view(&d, &c, &[0, 1], 1, 0, "s1");
        let core = FsCore::new(v1, settings());
        let dir = core.lookup(ROOT_INO, "d").unwrap();
        assert_eq!(core.lookup(dir.ino, "zz"), Err(FsError::NotFound));
        core.switch(view(&d, &c, &[0, 1], 2, 1, "s2"));
        // ENOENT would leave a negative entry below the old directory, pinning its view.
        assert_eq!(core.lookup(dir.ino, "zz"), Err(FsError::Stale));
        assert_eq!(core.lookup(dir.ino, "f").unwrap().generation, 1);
        assert_eq!(core.retained_views().len(), 1);
    }

    #[test]
    fn readdirplus_counts_only_the_entries_sent() {
        let (d, c) = setup();
        let v1 = view(&d, &c, &[0, 1], 1, 0, "s1");
        let core = FsCore::new(v1.clone(), settings());
        let fh = core.opendir(ROOT_INO).unwrap();
        // The reply has room for ".", ".." and "d": "g" is not sent, so not referenced.
        let mut sent = Vec::new();
        core.readdir(ROOT_INO, fh, 0, true, |e| {
            if sent.len() == 3 {
                return true;
            }
            sent.push((e.name.to_string(), e.attr));
            false
        })
        .unwrap();
        assert_eq!(sent[2].0, "d");
        assert!(sent[2].1.is_dir && sent[2].1.current);
        assert_eq!(v1.kernel_refs(), 1, "only d: . and .. are not references");
        // Plain readdir gives no references.
        core.readdir(ROOT_INO, fh, 0, false, |_| false).unwrap();
        assert_eq!(v1.kernel_refs(), 1);
        core.release(fh);
    }
}
