//! Opens and reads: handles that pin their view, the cache of open slot files (a copy a seal
//! vouched for is checked at its first open, and fetched again if damaged), the one
//! passthrough backing id per file and view, and the reads the daemon serves (by handle on
//! the pread path, by inode on the cached path).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use metfs_prefetcher::stager::CopyState;

use super::{CopyRepair, FsCore, FsError, Handle, NodeKind, Opened, Pinned, ReadSource, View};

impl FsCore {
    /// Opens file `ino` read-only for process `pid` (0: not known); the handle pins its view.
    pub fn open(&self, ino: u64, pid: u32) -> Result<Opened, FsError> {
        let (view, idx) = self.view_of(ino)?;
        if view.kind(idx) == NodeKind::Dir {
            return Err(FsError::IsDir);
        }
        let key = (view.generation, idx);
        let file = self.backing_file(&view, idx)?;
        let fh = self.new_handle(view, idx, pid, Some(file.clone()), None)?;
        Ok(Opened { fh, file, key })
    }

    /// Opens file `ino` for passthrough, for process `pid` (0: not known), with the one
    /// backing id of (view, file), registering
    /// it with `register` on first use. The kernel allows one backing file per inode while any
    /// passthrough open of it lives, and fails an open naming another with EIO; so concurrent
    /// first opens must share one id: registration runs once per key (later callers wait for
    /// it), and an id evicted from the cache while a handle still holds it is taken back from
    /// that handle rather than registered again. The inner `Err` is `register`'s error (a
    /// concurrent open that waited for a failed registration tries its own).
    #[allow(clippy::type_complexity)]
    pub fn open_passthrough<E>(
        &self,
        ino: u64,
        pid: u32,
        register: impl FnOnce(&File) -> Result<Pinned, E>,
    ) -> Result<Result<(u64, Pinned), E>, FsError> {
        let (view, idx) = self.view_of(ino)?;
        if view.kind(idx) == NodeKind::Dir {
            return Err(FsError::IsDir);
        }
        let key = (view.generation, idx);
        // A repeated open costs one hash lookup: no backing file is touched.
        let id = match self.backing.get(&key) {
            Some(id) => id,
            None => {
                let file = self.backing_file(&view, idx)?;
                let got = self.backing.get_or_try_insert_with(key, || {
                    let live = self.live_backing.lock().unwrap().get(&key).cloned();
                    if let Some(id) = live.and_then(|w| w.upgrade()) {
                        return Ok(id);
                    }
                    // No lock of the core held: the cache runs one registration per key at a
                    // time.
                    let id = register(&file)?;
                    self.live_backing
                        .lock()
                        .unwrap()
                        .insert(key, Arc::downgrade(&id));
                    Ok(id)
                });
                match got {
                    Ok(id) => id,
                    Err(e) => return Ok(Err(e)),
                }
            }
        };
        let fh = self.new_handle(view, idx, pid, None, Some(id.clone()))?;
        Ok(Ok((fh, id)))
    }

    /// Registers an open of node `idx` of `view`; the handle pins the view until released.
    fn new_handle(
        &self,
        view: Arc<View>,
        idx: u32,
        pid: u32,
        file: Option<Arc<File>>,
        pinned: Option<Pinned>,
    ) -> Result<u64, FsError> {
        let mut handles = self.handles.lock().unwrap();
        // Checked under the handles' lock, which `revoke` holds as it marks the view: no handle
        // of a view taken back is made after it strips the others.
        if view.revoked() {
            return Err(FsError::Revoked);
        }
        view.touch(idx);
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        view.handle_opened();
        self.opens.fetch_add(1, Ordering::Relaxed);
        handles.insert(
            fh,
            Handle {
                view,
                idx,
                pid,
                file,
                _pinned: pinned,
            },
        );
        Ok(fh)
    }

    /// The slot file of node `idx`, from the cache of open backing files. A copy its slot's
    /// seal vouched for is read once and its CRC checked before it first enters the cache
    /// (`metfs_prefetcher::stager` `seal` module): a damaged copy answers EIO, never its bytes.
    fn backing_file(&self, view: &View, idx: u32) -> Result<Arc<File>, FsError> {
        let key = (view.generation, idx);
        if let Some(f) = self.files.get(&key) {
            return Ok(f);
        }
        let open = || {
            File::open(view.backing_path(idx))
                .map_err(|e| FsError::Io(e.raw_os_error().unwrap_or(libc::EIO)))
        };
        let f = match (view.copy_checks(), view.kind(idx)) {
            (Some(c), NodeKind::File { sample, .. }) => match c.state(sample) {
                CopyState::Good => open()?,
                // An earlier repair failed (the tier was down): try again.
                CopyState::Damaged => {
                    self.repair_copy(view, sample)?;
                    open()?
                }
                CopyState::Unchecked(_) => {
                    let f = open()?;
                    // The check logs a damaged copy itself, once, and deletes it.
                    if c.check(sample, &view.rel_path(idx), &f).is_ok() {
                        f
                    } else {
                        self.repair_copy(view, sample)?;
                        open()?
                    }
                }
            },
            _ => open()?,
        };
        let f = Arc::new(f);
        self.files.insert(key, f.clone());
        Ok(f)
    }

    /// Reads and checks every copy of `view` that its slot's seal vouched for and no open has
    /// checked yet, fetching damaged ones again, as the first open of each would: a client
    /// about to read the slot's files directly never reaches that check. Nothing to do (and
    /// instant) for a slot staged or fully checked in this run. Blocking: call off the runtime.
    pub fn check_copies(&self, view: &View) -> Result<(), FsError> {
        let Some(c) = view.copy_checks() else {
            return Ok(());
        };
        if c.unchecked() == 0 && c.damaged() == 0 {
            return Ok(());
        }
        for idx in view.file_nodes() {
            if let NodeKind::File { sample, .. } = view.kind(idx) {
                if c.state(sample) != CopyState::Good {
                    self.backing_file(view, idx)?;
                }
            }
        }
        Ok(())
    }

    /// Has a damaged copy of `view`'s slot fetched again; EIO when that cannot be done.
    fn repair_copy(&self, view: &View, sample: u32) -> Result<(), FsError> {
        let Some(repair) = self.copy_repair.get() else {
            return Err(FsError::Io(libc::EIO));
        };
        repair(&view.slot, sample).map_err(|e| {
            tracing::error!(slot = %view.slot, error = %e, "a damaged copy could not be fetched again; reads of it fail (EIO) until it is");
            FsError::Io(libc::EIO)
        })
    }

    /// Sets how a damaged copy of a sealed slot is fetched again (once, by the daemon); without
    /// it, such a copy answers EIO.
    pub fn set_copy_repair(&self, repair: CopyRepair) {
        let _ = self.copy_repair.set(repair);
    }

    /// The slot file a read of `size` bytes at `offset` is served from. The read comes through
    /// handle `fh` (the pread path), or, with `fh` 0, by inode `ino` (the kernel sends no
    /// `open` on the cached path).
    pub fn read_source(
        &self,
        fh: u64,
        ino: u64,
        offset: u64,
        size: u32,
    ) -> Result<ReadSource, FsError> {
        let (file, len) = if fh != 0 {
            let handles = self.handles.lock().unwrap();
            let h = handles.get(&fh).ok_or(FsError::BadHandle)?;
            if h.view.revoked() {
                return Err(FsError::Revoked);
            }
            let file = h.file.clone().ok_or(FsError::BadHandle)?;
            (file, h.view.file_size(h.idx))
        } else {
            let (view, idx) = self.view_of(ino)?;
            if view.revoked() {
                return Err(FsError::Revoked);
            }
            let NodeKind::File { size, .. } = view.kind(idx) else {
                return Err(FsError::IsDir);
            };
            let file = self.backing_file(&view, idx)?;
            if offset == 0 {
                view.touch(idx);
            }
            (file, size)
        };
        Ok(ReadSource {
            file,
            len: len.saturating_sub(offset).min(u64::from(size)) as u32,
            file_size: len,
        })
    }

    /// Reads up to `size` bytes at `offset` through handle `fh` into a buffer (the core's read
    /// without FUSE; the adapter goes through [`FsCore::read_source`] to splice).
    pub fn read(&self, fh: u64, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
        let src = self.read_source(fh, 0, offset, size)?;
        self.pread(&src.file, offset, src.len)
    }

    /// Reads up to `size` bytes at `offset` of file `ino` without a handle (the kernel sends no
    /// `open` when the filesystem does not implement it).
    pub fn read_ino(&self, ino: u64, offset: u64, size: u32) -> Result<Vec<u8>, FsError> {
        let src = self.read_source(0, ino, offset, size)?;
        self.pread(&src.file, offset, src.len)
    }

    /// Reads `len` bytes at `offset` of a slot file (as [`FsCore::read_source`] gave them).
    pub fn pread(&self, file: &File, offset: u64, len: u32) -> Result<Vec<u8>, FsError> {
        let mut buf = vec![0u8; len as usize];
        let mut done = 0;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(FsError::Io(e.raw_os_error().unwrap_or(libc::EIO))),
            }
        }
        buf.truncate(done);
        self.count_read(done);
        Ok(buf)
    }

    /// Counts `n` bytes the daemon read for the kernel (the status's `daemon_bytes_read`).
    pub fn count_read(&self, n: usize) {
        self.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Counts `n` bytes the daemon answered by splice (read for the kernel too).
    pub fn count_spliced(&self, n: usize) {
        self.count_read(n);
        self.bytes_spliced.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Drops the page-cache pages of every slot file of `view`, once the kernel holds the
    /// view's data in the mount's own page cache (after a first pass on the cached read path),
    /// so that memory holds each byte once. Dropping per read would cost a sixth of a cold
    /// small-file read here; once per view, in the background during a warm pass, it costs
    /// nothing a reader waits for. Only for the cached path: on the others the slot files'
    /// pages are the only copy. Blocking: call from a blocking thread.
    pub fn drop_slot_pages(view: &View) {
        use std::os::fd::AsRawFd;
        for idx in view.file_nodes() {
            let Ok(file) = File::open(view.backing_path(idx)) else {
                continue;
            };
            // SAFETY: advice on a descriptor we hold. The pages are clean (slots are durable
            // before they are shown), so nothing is lost, only re-read if ever needed.
            unsafe {
                libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
            }
        }
    }

    /// Releases a file or directory handle.
    pub fn release(&self, fh: u64) {
        if self.root_listings.lock().unwrap().remove(&fh).is_some() {
            return;
        }
        let Some(h) = self.handles.lock().unwrap().remove(&fh) else {
            return;
        };
        if h.view.handle_closed() == 0 {
            self.notify_if_drained(&h.view);
        }
    }

    /// Open handles in total.
    pub fn open_handles(&self) -> usize {
        self.handles.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::testing::*;
    use crate::view::ROOT_INO;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn open_handle_keeps_old_bytes_across_switch() {
        let (d, c) = setup();
        let v1 = view(&d, &c, &[0, 1], 1, 0, "s1");
        let core = FsCore::new(v1, settings());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        core.set_drained_sender(tx);
        let dir = core.lookup(ROOT_INO, "d").unwrap();
        assert!(dir.is_dir);
        let f = core.lookup(dir.ino, "f").unwrap();
        assert_eq!(f.size, 100);
        let h = core.open(f.ino, 0).unwrap();
        let v2 = view(&d, &c, &[0, 1], 2, 1, "s2");
        core.switch(v2);
        // New lookups see the new view ...
        let dir2 = core.lookup(ROOT_INO, "d").unwrap();
        assert_eq!(dir2.generation, 2);
        let f2 = core.lookup(dir2.ino, "f").unwrap();
        let h2 = core.open(f2.ino, 0).unwrap();
        assert_eq!(core.read(h2.fh, 0, 4096).unwrap(), vec![2u8; 100]);
        // ... while the old handle reads the old bytes, and old inodes still resolve.
        assert_eq!(core.read(h.fh, 0, 4096).unwrap(), vec![1u8; 100]);
        assert_eq!(core.lookup(dir.ino, "f").unwrap().generation, 1);
        assert!(rx.try_recv().is_err());
        core.release(h.fh);
        assert_eq!(rx.try_recv().unwrap(), 1);
        assert!(core.retire_drained(1));
        assert_eq!(core.lookup(dir.ino, "f"), Err(FsError::Stale));
        core.release(h2.fh);
        assert!(rx.try_recv().is_err(), "current view never drains");
    }

    #[test]
    fn concurrent_first_opens_register_one_backing_id() {
        let (d, c) = setup();
        let v1 = view(&d, &c, &[0, 1], 1, 0, "s1");
        let core = Arc::new(FsCore::new(v1, settings()));
        let g = core.lookup(ROOT_INO, "g").unwrap();
        let registered = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (core, registered) = (core.clone(), registered.clone());
                std::thread::spawn(move || {
                    let (fh, id) = core
                        .open_passthrough(g.ino, 0, |_| {
                            registered.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(std::time::Duration::from_millis(20));
                            Ok::<Pinned, std::io::Error>(Arc::new(7u32))
                        })
                        .unwrap()
                        .unwrap();
                    assert_eq!(id.downcast_ref::<u32>(), Some(&7));
                    fh
                })
            })
            .collect();
        let fhs: Vec<u64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        assert_eq!(
            registered.load(Ordering::SeqCst),
            1,
            "one id per file and view"
        );
        assert_eq!(core.open_handles(), 8);
        for fh in fhs {
            core.release(fh);
        }
    }
}
