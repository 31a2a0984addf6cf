//! The mount as readers and the kernel see it: the filesystem core that serves the views, the
//! read path, the mountpoint and the kernel's caches of it, and what was listed for the kernel.
//!
//! [`Surface`] owns these and nothing else: it knows which views the core serves, never which
//! session or mode put them there. The daemon hands it a view at a switch (through the core)
//! and asks it to make the kernel forget the old one; the FUSE adapter gets the core and the
//! read path from it at mount.
//!
//! Invariants:
//! - The kernel is reached only through the [`KernelCache`] recorded by [`Surface::mounted`];
//!   before the mount there is none and every kernel step is skipped (the daemon tests run so).
//! - The mountpoint is empty until mounted; paths built from it are empty then too.
//! - The read path in use only ever moves from the one chosen at mount to `pread` (when the
//!   kernel refuses it), never back.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use metfs_fs::fs::FsCore;
use metfs_fs::lock_order::{Level, OrderedMutex};
use metfs_fs::view::View;
use metfs_protocol::{Draining, FilesForm, FilesView, Hello};

use crate::config::{ActiveReadPath, ReadPath};
use crate::daemon::KernelCache;

/// The mount's face (see the module doc).
pub struct Surface {
    fs: Arc<FsCore>,
    /// The read path chosen at mount (`auto` resolved).
    read_path: ReadPath,
    /// The read path in use: `read_path` until the kernel refuses it, then `pread`.
    active: Arc<ActiveReadPath>,
    /// The kernel's caches of the mount, once mounted.
    kernel: OrderedMutex<Option<Arc<dyn KernelCache>>>,
    mountpoint: OrderedMutex<PathBuf>,
    /// Entries listed through the mount for the kernel (`prime.rs`).
    primed: AtomicU64,
    /// The last generation whose listing for the kernel finished (0: none yet).
    primed_generation: AtomicU64,
}

impl Surface {
    /// A surface over `fs`, serving on `read_path`, not mounted yet.
    pub(super) fn new(fs: Arc<FsCore>, read_path: ReadPath) -> Self {
        Self {
            fs,
            read_path,
            active: Arc::new(ActiveReadPath::new(read_path)),
            kernel: OrderedMutex::new(Level::Kernel, None),
            mountpoint: OrderedMutex::new(Level::Mountpoint, PathBuf::new()),
            primed: AtomicU64::new(0),
            primed_generation: AtomicU64::new(0),
        }
    }

    /// The filesystem core, for the FUSE adapter.
    pub fn fs(&self) -> Arc<FsCore> {
        self.fs.clone()
    }

    /// The core, borrowed.
    pub(super) fn core(&self) -> &Arc<FsCore> {
        &self.fs
    }

    /// The read path in use, shared with the FUSE adapter (which falls back to `pread` if the
    /// kernel does not support the chosen path).
    pub fn active_read_path(&self) -> Arc<ActiveReadPath> {
        self.active.clone()
    }

    /// The read path chosen at mount.
    pub fn read_path(&self) -> ReadPath {
        self.read_path
    }

    /// The read path in use now.
    pub fn read_path_now(&self) -> ReadPath {
        self.active.get()
    }

    /// Records the mountpoint and the kernel's caches (what a switch invalidates) once
    /// mounted.
    pub fn mounted(&self, mountpoint: &Path, kernel: impl KernelCache + 'static) {
        *self.mountpoint.lock().unwrap() = mountpoint.to_path_buf();
        *self.kernel.lock().unwrap() = Some(Arc::new(kernel));
    }

    /// The mountpoint (empty before the mount).
    pub fn mountpoint(&self) -> PathBuf {
        self.mountpoint.lock().unwrap().clone()
    }

    /// The `hello` object of a plain request.
    pub fn hello(&self, job: Option<String>) -> Hello {
        Hello {
            protocol: metfs_protocol::VERSION,
            version: env!("CARGO_PKG_VERSION").to_string(),
            mountpoint: self.mountpoint().display().to_string(),
            job,
            share: None,
            not_resumed: None,
        }
    }

    /// The view the mount's root shows, its position and where it is mounted.
    pub(super) fn current_view(&self) -> (Arc<View>, u64, u32, String) {
        let view = self.fs.current();
        let mountpoint = self.mountpoint().display().to_string();
        let (epoch, mini_epoch) = (view.epoch, view.mini_epoch);
        (view, epoch, mini_epoch, mountpoint)
    }

    /// Counts a listing for the kernel: `entries` listed, and `generation` wholly if
    /// `finished`.
    pub(super) fn note_primed(&self, entries: u64, finished: Option<u64>) {
        self.primed.fetch_add(entries, Ordering::Relaxed);
        if let Some(generation) = finished {
            self.primed_generation.store(generation, Ordering::Relaxed);
        }
    }

    /// Entries listed for the kernel so far, and the last generation listed wholly.
    pub(super) fn primed(&self) -> (u64, u64) {
        (
            self.primed.load(Ordering::Relaxed),
            self.primed_generation.load(Ordering::Relaxed),
        )
    }

    /// What holds each retired view that is not evicted yet: open handles, the kernel's
    /// lookups (entries and inodes it still caches, on the cached read path) and a few of the
    /// paths it holds, so that a view that does not drain can be diagnosed from `status`.
    pub(super) fn draining_detail(&self) -> Vec<Draining> {
        self.fs
            .retained_views()
            .iter()
            .map(|v| {
                let held: Vec<String> = v
                    .referenced_nodes()
                    .into_iter()
                    .take(5)
                    .map(|i| v.rel_path(i))
                    .collect();
                Draining {
                    generation: v.generation,
                    slot: v.slot.clone(),
                    open_handles: v.open_handles() as u64,
                    leases: v.leases() as u64,
                    kernel_refs: v.kernel_refs(),
                    kernel_held: held,
                }
            })
            .collect()
    }

    /// Drops the kernel's cached entries of the root's `names` and the root's own attributes
    /// (after a switch, before anyone hears of it). Nothing before the mount.
    pub(super) async fn forget_root_entries(&self, names: Vec<String>) {
        let kernel = self.kernel.lock().unwrap().clone();
        let Some(n) = kernel else { return };
        let _ = tokio::task::spawn_blocking(move || {
            for name in names {
                let _ = n.inval_entry(metfs_fs::view::ROOT_INO, &name);
            }
            let _ = n.inval_inode(metfs_fs::view::ROOT_INO);
        })
        .await;
    }

    /// Lets the kernel forget a retired view's inodes (the cached read path, where they pin
    /// the view). Invalidating the root's entries at the switch drops every unused entry below
    /// them, but an entry in use then (a file open below a directory) stays, and so do entries
    /// replied after the switch with a zero TTL (lookups through an old directory, listings of
    /// a directory opened before the switch): expired, they still sit in the dentry cache,
    /// holding the view, until memory runs short. So every inode of the view the kernel still
    /// holds is pruned, deepest first (`FUSE_NOTIFY_PRUNE`: only that inode's unused entries go,
    /// never the current view's entry of the same name); those in use go once released.
    /// Repeated with a growing pause (at most a second) while the view is retained. Kernels
    /// without prune get the entries invalidated by name instead, except root entries whose
    /// name the current view also has (that would drop the current view's cached subtree).
    pub(super) async fn release_kernel_refs(self: Arc<Self>, generation: u64) {
        let mut pause = Duration::from_millis(20);
        let mut prune = true;
        loop {
            // Forgets of the entries dropped at the switch arrive in the meantime.
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(1));
            let Some(view) = self.fs.retained(generation) else {
                return;
            };
            let kernel = self.kernel.lock().unwrap().clone();
            let Some(n) = kernel else { return };
            let nodes = view.referenced_nodes();
            if nodes.is_empty() {
                continue;
            }
            let current = self.fs.current();
            let try_prune = prune;
            prune = tokio::task::spawn_blocking(move || {
                if try_prune {
                    let inos: Vec<u64> = nodes.iter().map(|&i| view.ino(i)).collect();
                    match n.prune(&inos) {
                        Ok(()) => return true,
                        Err(e) => {
                            tracing::debug!(error = %e, "kernel has no prune; invalidating by name")
                        }
                    }
                }
                for i in nodes {
                    let (parent, name) = (view.parent(i), view.name(i));
                    if parent == 0 && !view.is_nested() && current.lookup(0, name).is_ok() {
                        continue;
                    }
                    let _ = n.inval_entry(view.ino(parent), name);
                }
                false
            })
            .await
            .unwrap_or(try_prune);
        }
    }
}

/// A `files` answer over `view`: no list when the client already holds this generation's, else
/// the list in the form asked for.
pub(super) fn files_answer(
    view: &View,
    epoch: u64,
    mini_epoch: u32,
    mountpoint: String,
    known: Option<u64>,
    form: FilesForm,
) -> (FilesView, Option<Vec<u8>>) {
    let mut answer = FilesView {
        generation: view.generation,
        epoch,
        mini_epoch,
        mountpoint,
        files: Vec::new(),
        count: view.file_count() as u64,
        unchanged: false,
        packed: None,
        direct_root: None,
    };
    if known == Some(view.generation) {
        answer.unchanged = true;
        return (answer, None);
    }
    match form {
        FilesForm::List => {
            answer.files = view.file_paths();
            (answer, None)
        }
        FilesForm::Packed => {
            let (header, bytes) = view.packed_paths();
            answer.packed = Some(header);
            (answer, Some(bytes))
        }
    }
}
