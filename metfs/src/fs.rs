//! The filesystem core: lookup, getattr, readdir, open, read and release over the views,
//! independent of FUSE so that tests can drive it directly.
//!
//! Invariants:
//! * the root (inode 1) always resolves in the current view; any other inode resolves only in
//!   the view of its generation, and only while that view is retained. On a shared mount
//!   ([`FsCore::new_shared`]) the root lists the jobs, each job's current view is the
//!   directory of its name (its root an inode `generation << 32` of its own), and a switch of
//!   one job swaps that job's view only; generations are unique across jobs;
//! * a view switch ([`FsCore::switch`]) is one pointer swap under a write lock: a lookup sees
//!   the old view or the new one, never a mix;
//! * a handle pins its view: the view (and so its slot) is retained until the last handle on it
//!   is released, and the daemon is told (through the `drained` channel) when a retired view's
//!   last handle goes, so it can evict the slot;
//! * on the cached read path the kernel sends no `open` or `release`, so handles cannot be
//!   counted; the kernel's own references are counted instead (every entry replied to a lookup
//!   is one reference, every `forget` takes references back), and a retired view drains when
//!   the kernel holds none of its *file* inodes. An open file holds its inode, so this is at
//!   least as strict as counting handles. Directory inodes do not pin the slot: they reach no
//!   data once their files are forgotten, and the kernel may keep an old directory's dentry
//!   for reasons of its own (measured: 64 readers across 100 switches left a few retired
//!   directories held for minutes), so counting them let a stray dentry stall staging. Entries
//!   of a view that is no longer current are replied with a zero TTL, so the kernel lets them
//!   go as soon as nothing uses them;
//! * a lease pins its view as a handle does ([`ViewLease`]): a client that reads the slot's
//!   files directly, not through the mount, holds one while it may still open them. A lease
//!   is taken, and a retired view is forgotten ([`FsCore::retire_drained`]), under the views'
//!   lock, so a lease is either taken before the view is forgotten (which then waits for it)
//!   or refused; never given on a view whose slot is being deleted;
//! * a lookup that misses in a retired view answers ESTALE, so the kernel keeps no negative
//!   entry below an old directory (see [`FsCore::lookup`]);
//! * an entry replied as current (long TTL) never reaches the kernel after the switch that
//!   retired its view: replies that hand out entries are sent under [`FsCore::reply_gate`],
//!   which [`FsCore::switch`] takes exclusively. So the invalidation the daemon sends after a
//!   switch covers every long-lived entry of the old view; without the gate, an entry resolved
//!   just before the switch and delivered just after it would pin the old view (and show it)
//!   for the entry's whole TTL;
//! * backing files are opened read-only and kept in a bounded cache (`moka`); evicting an entry
//!   drops the last reference and closes the descriptor, so millions of files never exhaust
//!   descriptors. Passthrough backing ids (opaque to the core) are cached the same way, per
//!   view, and dropped when the view is retired, so a deleted slot's blocks are really freed.

use std::any::Any;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::SystemTime;

use thiserror::Error;

use crate::view::{Miss, NodeKind, View, ROOT_INO};
use prefetcher::stager::CopyState;

/// Errors at the filesystem boundary; each maps to one errno.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum FsError {
    /// No such file or directory.
    #[error("no such file or directory")]
    NotFound,
    /// The inode belongs to a view that has been retired.
    #[error("stale file handle")]
    Stale,
    /// Not a directory.
    #[error("not a directory")]
    NotDir,
    /// Is a directory.
    #[error("is a directory")]
    IsDir,
    /// Unknown file handle.
    #[error("bad file handle")]
    BadHandle,
    /// I/O error on the backing file.
    #[error("I/O error on a backing file")]
    Io(i32),
}

impl FsError {
    /// The errno the kernel gets.
    pub fn errno(self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::Stale => libc::ESTALE,
            FsError::NotDir => libc::ENOTDIR,
            FsError::IsDir => libc::EISDIR,
            FsError::BadHandle => libc::EBADF,
            FsError::Io(e) => e,
        }
    }
}

impl From<Miss> for FsError {
    fn from(m: Miss) -> Self {
        match m {
            Miss::NotFound => FsError::NotFound,
            Miss::NotDir => FsError::NotDir,
        }
    }
}

/// Attributes of a node, as the adapter reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    /// Inode number.
    pub ino: u64,
    /// Size in bytes (0 for directories).
    pub size: u64,
    /// Directory or regular file.
    pub is_dir: bool,
    /// Generation of the view the node belongs to.
    pub generation: u64,
    /// The node belongs to the current view (its entry may be cached for the view's life).
    pub current: bool,
    /// What `stat` showed at the source (mode, owner, times), when known.
    pub meta: Option<prefetcher::catalog::Meta>,
}

/// One directory entry returned by [`FsCore::readdir`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirEntry<'a> {
    /// Offset of the *next* entry (what readdir resumes from).
    pub next_offset: u64,
    /// Name.
    pub name: &'a str,
    /// Attributes (inode number, size, kind, generation).
    pub attr: Attr,
}

/// A file opened through the core.
#[derive(Debug, Clone)]
pub struct Opened {
    /// File handle to give the kernel.
    pub fh: u64,
    /// The backing file (read-only).
    pub file: Arc<File>,
    /// Cache key of the file: (generation, node).
    pub key: (u64, u32),
}

/// Something a handle keeps alive while it is open (a passthrough backing id).
pub type Pinned = Arc<dyn Any + Send + Sync>;

/// Where a read is served from ([`FsCore::read_source`]).
pub struct ReadSource {
    /// The slot file.
    pub file: Arc<File>,
    /// How many of the bytes asked for it holds (fewer only at its end).
    pub len: u32,
    /// Its size.
    pub file_size: u64,
}

struct Handle {
    view: Arc<View>,
    /// The node opened.
    idx: u32,
    file: Option<Arc<File>>,
    /// Passthrough backing id, kept registered while the handle lives (never read: holding it
    /// is the point).
    _pinned: Option<Pinned>,
}

struct Views {
    /// The current view (on a shared mount, an empty one the root stands for).
    current: Arc<View>,
    /// On a shared mount (`--share`): each job's current view, shown as the directory
    /// `MNT/<job>`; the root lists the jobs.
    jobs: Option<std::collections::BTreeMap<String, Arc<View>>>,
    retained: HashMap<u64, Arc<View>>,
}

impl Views {
    /// The current view of generation `gen`: the one view of a plain mount, or a job's.
    fn current_of(&self, gen: u64) -> Option<&Arc<View>> {
        if self.current.generation == gen {
            return Some(&self.current);
        }
        self.jobs.as_ref()?.values().find(|v| v.generation == gen)
    }
}

/// The jobs of a shared mount and their views, by name.
type JobViews = Vec<(String, Arc<View>)>;

/// Settings of the core.
#[derive(Debug, Clone)]
pub struct FsSettings {
    /// Most backing files kept open for the pread path.
    pub max_open_files: u64,
    /// Most passthrough backing ids kept.
    pub max_backing_ids: u64,
    /// A retired view drains only once the kernel holds none of its inodes (the cached read
    /// path, where handles are invisible).
    pub track_kernel_refs: bool,
}

/// The filesystem core. See the module docs.
pub struct FsCore {
    views: RwLock<Views>,
    /// Held shared while an entry is resolved and replied, exclusively while the view switches.
    reply_gate: RwLock<()>,
    handles: Mutex<HashMap<u64, Handle>>,
    /// On a shared mount: listings of the root, by handle (the jobs and their views when the
    /// listing was opened).
    root_listings: Mutex<HashMap<u64, JobViews>>,
    next_fh: AtomicU64,
    files: moka::sync::Cache<(u64, u32), Arc<File>>,
    settings: FsSettings,
    backing: moka::sync::Cache<(u64, u32), Pinned>,
    /// Every backing id registered and not yet dropped (held by the cache or a handle), so an
    /// id evicted from the cache while open is reused, never registered twice.
    live_backing: Mutex<HashMap<(u64, u32), std::sync::Weak<dyn Any + Send + Sync>>>,
    drained: Mutex<Option<tokio::sync::mpsc::UnboundedSender<u64>>>,
    /// Bytes the daemon read for the kernel (pread path, cached-path misses).
    pub bytes_read: AtomicU64,
    /// Of `bytes_read`, those answered by splice from the slot file (see `fuse`).
    pub bytes_spliced: AtomicU64,
    /// Files opened through the mount.
    pub opens: AtomicU64,
    /// Time used as mtime/ctime of every node.
    pub mtime: SystemTime,
    /// Fetches a damaged copy of a sealed slot again (`set_copy_repair`).
    copy_repair: OnceLock<CopyRepair>,
}

/// Fetches sample `sample` of slot `slot` again from the tier, replacing a copy its first
/// open found damaged (`prefetcher::stager::Stager::repair`); blocking; the error says why it
/// could not.
pub type CopyRepair = Arc<dyn Fn(&str, u32) -> Result<(), String> + Send + Sync>;

/// Raises this process's soft limit on open descriptors to its hard limit and returns the
/// soft limit now in force. An ordinary user's session typically starts at 1,024 (with a hard
/// limit far above), fewer than the backing files the read paths keep open.
pub fn raise_fd_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on a struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let want = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    lim.rlim_cur
}

impl FsCore {
    /// A core showing `initial`. The cache of open backing files keeps at most half the
    /// descriptors the process may open (see [`raise_fd_limit`]), whatever `settings` say: the
    /// stager, the control socket and the kernel's requests need the rest, and a full table
    /// fails every open and accept with EMFILE.
    pub fn new(initial: Arc<View>, settings: FsSettings) -> Self {
        let fd_share = (raise_fd_limit() / 2).max(64);
        if settings.max_open_files > fd_share {
            tracing::info!(
                max_open_files = fd_share,
                "keeping fewer backing files open than configured: the descriptor limit is low"
            );
        }
        let max_open_files = settings.max_open_files.min(fd_share);
        let max_backing_ids = settings.max_backing_ids;
        Self {
            views: RwLock::new(Views {
                current: initial,
                jobs: None,
                retained: HashMap::new(),
            }),
            root_listings: Mutex::new(HashMap::new()),
            reply_gate: RwLock::new(()),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            files: moka::sync::Cache::builder()
                .max_capacity(max_open_files)
                .support_invalidation_closures()
                .build(),
            backing: moka::sync::Cache::builder()
                .max_capacity(max_backing_ids)
                .support_invalidation_closures()
                .build(),
            live_backing: Mutex::new(HashMap::new()),
            settings,
            drained: Mutex::new(None),
            bytes_read: AtomicU64::new(0),
            bytes_spliced: AtomicU64::new(0),
            opens: AtomicU64::new(0),
            mtime: SystemTime::now(),
            copy_repair: OnceLock::new(),
        }
    }

    /// A core for a shared mount (`--share`): the root lists the jobs, each job's current view
    /// is the directory of its name. `lobby` is an empty view the root stands for (its
    /// generation is taken by no job's view).
    pub fn new_shared(lobby: Arc<View>, settings: FsSettings) -> Self {
        let core = Self::new(lobby, settings);
        core.views.write().unwrap().jobs = Some(Default::default());
        core
    }

    /// Whether this core serves a shared mount.
    pub fn is_shared(&self) -> bool {
        self.views.read().unwrap().jobs.is_some()
    }

    /// Job `name`'s current view on a shared mount.
    pub fn job_view(&self, name: &str) -> Option<Arc<View>> {
        self.views.read().unwrap().jobs.as_ref()?.get(name).cloned()
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

    /// The jobs of a shared mount and their current views, by name.
    pub fn job_views(&self) -> JobViews {
        self.views
            .read()
            .unwrap()
            .jobs
            .as_ref()
            .map(|j| j.iter().map(|(n, v)| (n.clone(), v.clone())).collect())
            .unwrap_or_default()
    }

    /// Where to report the generation of a retired view whose last handle was released.
    pub fn set_drained_sender(&self, tx: tokio::sync::mpsc::UnboundedSender<u64>) {
        *self.drained.lock().unwrap() = Some(tx);
    }

    /// The current view.
    pub fn current(&self) -> Arc<View> {
        self.views.read().unwrap().current.clone()
    }

    /// Hold this from resolving a lookup (or a READDIRPLUS batch) until its reply is sent, so
    /// that no entry of a view is delivered as current after the view was switched away.
    pub fn reply_gate(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.reply_gate.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes `next` current and retains the old view; returns the old view. Waits for replies
    /// in flight under [`FsCore::reply_gate`] (each a few microseconds).
    pub fn switch(&self, next: Arc<View>) -> Arc<View> {
        let _gate = self.reply_gate.write().unwrap_or_else(|e| e.into_inner());
        let mut v = self.views.write().unwrap();
        let old = std::mem::replace(&mut v.current, next);
        v.retained.insert(old.generation, old.clone());
        old
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

    /// Takes a lease on `view` (see [`ViewLease`]) if it is still shown or retained; `None`
    /// once it has been forgotten, its slot evicted or being evicted.
    pub fn lease(self: &Arc<Self>, view: &Arc<View>) -> Option<ViewLease> {
        let v = self.views.read().unwrap();
        let known =
            v.current_of(view.generation).is_some() || v.retained.contains_key(&view.generation);
        if !known {
            return None;
        }
        view.lease_taken();
        Some(ViewLease {
            fs: self.clone(),
            view: view.clone(),
        })
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

    fn drop_cached(&self, generation: u64) {
        self.files
            .invalidate_entries_if(move |k, _| k.0 == generation)
            .expect("invalidation closures are enabled");
        self.backing
            .invalidate_entries_if(move |k, _| k.0 == generation)
            .expect("invalidation closures are enabled");
        self.files.run_pending_tasks();
        self.backing.run_pending_tasks();
        self.live_backing
            .lock()
            .unwrap()
            .retain(|k, _| k.0 != generation);
    }

    fn view_of(&self, ino: u64) -> Result<(Arc<View>, u32), FsError> {
        let v = self.views.read().unwrap();
        if ino == ROOT_INO {
            return Ok((v.current.clone(), 0));
        }
        let gen = ino >> 32;
        let view = match v.current_of(gen) {
            Some(c) => c.clone(),
            None => v.retained.get(&gen).cloned().ok_or(FsError::Stale)?,
        };
        let idx = view.index_of(ino).ok_or(FsError::NotFound)?;
        Ok((view, idx))
    }

    fn is_current(&self, view: &View) -> bool {
        self.views
            .read()
            .unwrap()
            .current_of(view.generation)
            .is_some()
    }

    /// On a shared mount, the attributes of the job directory `name` in the root.
    fn lookup_job(&self, name: &str) -> Result<Attr, FsError> {
        let view = self.job_view(name).ok_or(FsError::NotFound)?;
        view.kernel_ref(0);
        Ok(attr_in(&view, 0, true))
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

    fn notify_if_drained(&self, view: &View) {
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

    fn attr(&self, view: &View, idx: u32) -> Attr {
        attr_in(view, idx, self.is_current(view))
    }

    /// Resolves `name` in directory `parent`. A miss in a retired view is ESTALE, not ENOENT:
    /// the kernel would cache ENOENT as a negative entry below the old directory, which holds
    /// that directory (and so the view) until memory runs short, and nothing can prune it. On
    /// ESTALE the kernel instead walks the path again revalidating every component, which
    /// reaches the current view (a path resolved just before a switch, looking up a name of the
    /// new view in a directory of the old one, then finds it).
    pub fn lookup(&self, parent: u64, name: &str) -> Result<Attr, FsError> {
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

    /// Opens file `ino` for passthrough with the one backing id of (view, file), registering
    /// it with `register` on first use. The kernel allows one backing file per inode while any
    /// passthrough open of it lives, and fails an open naming another with EIO; so concurrent
    /// first opens must share one id: registration runs once per key (later callers wait for
    /// it), and an id evicted from the cache while a handle still holds it is taken back from
    /// that handle rather than registered again. The inner `Err` is `register`'s error.
    #[allow(clippy::type_complexity)]
    pub fn open_passthrough<E: Send + Sync + 'static>(
        &self,
        ino: u64,
        register: impl FnOnce(&File) -> Result<Pinned, E>,
    ) -> Result<Result<(u64, Pinned), Arc<E>>, FsError> {
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
                let got = self.backing.try_get_with(key, || {
                    let live = self.live_backing.lock().unwrap().get(&key).cloned();
                    if let Some(id) = live.and_then(|w| w.upgrade()) {
                        return Ok(id);
                    }
                    // No lock held: `try_get_with` runs one registration per key at a time.
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
        let fh = self.new_handle(view, idx, None, Some(id.clone()));
        Ok(Ok((fh, id)))
    }

    /// Registers an open of node `idx` of `view`; the handle pins the view until released.
    fn new_handle(
        &self,
        view: Arc<View>,
        idx: u32,
        file: Option<Arc<File>>,
        pinned: Option<Pinned>,
    ) -> u64 {
        view.touch(idx);
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        view.handle_opened();
        self.opens.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().unwrap().insert(
            fh,
            Handle {
                view,
                idx,
                file,
                _pinned: pinned,
            },
        );
        fh
    }

    /// Opens file `ino` read-only; the handle pins its view.
    pub fn open(&self, ino: u64) -> Result<Opened, FsError> {
        let (view, idx) = self.view_of(ino)?;
        if view.kind(idx) == NodeKind::Dir {
            return Err(FsError::IsDir);
        }
        let key = (view.generation, idx);
        let file = self.backing_file(&view, idx)?;
        let fh = self.new_handle(view, idx, Some(file.clone()), None);
        Ok(Opened { fh, file, key })
    }

    /// The slot file of node `idx`, from the cache of open backing files. A copy its slot's
    /// seal vouched for is read once and its CRC checked before it first enters the cache
    /// (`prefetcher::stager` `seal` module): a damaged copy answers EIO, never its bytes.
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
            let file = h.file.clone().ok_or(FsError::BadHandle)?;
            (file, h.view.file_size(h.idx))
        } else {
            let (view, idx) = self.view_of(ino)?;
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

/// The attributes of node `idx` of `view`, which is (or is not) the current view.
fn attr_in(view: &View, idx: u32, current: bool) -> Attr {
    let (size, is_dir) = match view.kind(idx) {
        NodeKind::Dir => (0, true),
        NodeKind::File { size, .. } => (size, false),
    };
    Attr {
        ino: view.ino(idx),
        size,
        is_dir,
        generation: view.generation,
        current,
        meta: view.meta(idx),
    }
}

/// A client's hold on a view whose slot files it reads directly (`files` with `direct`): while
/// any lease is held the view's slot is not evicted, exactly as an open handle pins it.
/// Dropping the lease lets it go, and tells the daemon when that drains a retired view.
pub struct ViewLease {
    fs: Arc<FsCore>,
    view: Arc<View>,
}

impl ViewLease {
    /// The leased view.
    pub fn view(&self) -> &Arc<View> {
        &self.view
    }
}

impl std::fmt::Debug for ViewLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ViewLease")
            .field("generation", &self.view.generation)
            .field("slot", &self.view.slot)
            .finish()
    }
}

impl Drop for ViewLease {
    fn drop(&mut self) {
        if self.view.lease_ended() == 0 {
            self.fs.notify_if_drained(&self.view);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefetcher::catalog::{Catalog, CatalogEntry};

    fn setup() -> (tempfile::TempDir, Arc<Catalog>) {
        let d = tempfile::tempdir().unwrap();
        for (slot, byte) in [("s1", 1u8), ("s2", 2u8)] {
            std::fs::create_dir_all(d.path().join(slot).join("d")).unwrap();
            std::fs::write(d.path().join(slot).join("d/f"), vec![byte; 100]).unwrap();
            std::fs::write(d.path().join(slot).join("g"), vec![byte; 10]).unwrap();
        }
        let c = Catalog::from_entries(
            "t",
            vec![CatalogEntry::new("d/f", 100), CatalogEntry::new("g", 10)],
        )
        .unwrap();
        (d, Arc::new(c))
    }

    /// The view of `samples` staged in slot `slot` of `d`.
    fn view(
        d: &tempfile::TempDir,
        c: &Arc<Catalog>,
        samples: &[u32],
        generation: u64,
        mini_epoch: u32,
        slot: &str,
    ) -> Arc<View> {
        Arc::new(View::build(
            c,
            samples,
            generation,
            0,
            mini_epoch,
            slot,
            &d.path().join(slot),
        ))
    }

    fn list(core: &FsCore, fh: u64, offset: u64) -> Vec<String> {
        let mut names = Vec::new();
        core.readdir(ROOT_INO, fh, offset, false, |e| {
            names.push(e.name.to_string());
            false
        })
        .unwrap();
        names
    }

    fn settings() -> FsSettings {
        FsSettings {
            max_open_files: 16,
            max_backing_ids: 16,
            track_kernel_refs: false,
        }
    }

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
        let h = core.open(f.ino).unwrap();
        let v2 = view(&d, &c, &[0, 1], 2, 1, "s2");
        core.switch(v2);
        // New lookups see the new view ...
        let dir2 = core.lookup(ROOT_INO, "d").unwrap();
        assert_eq!(dir2.generation, 2);
        let f2 = core.lookup(dir2.ino, "f").unwrap();
        let h2 = core.open(f2.ino).unwrap();
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
    fn a_lease_pins_a_view_until_dropped_and_none_is_given_once_it_is_forgotten() {
        let (d, c) = setup();
        let v1 = view(&d, &c, &[0, 1], 1, 0, "s1");
        let core = Arc::new(FsCore::new(v1, settings()));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        core.set_drained_sender(tx);
        let lease = core.lease(&core.current()).unwrap();
        // The direct path is the slot's copy: the bytes the mount shows.
        let f = lease.view().slot_dir.join("d/f");
        assert_eq!(std::fs::read(&f).unwrap(), vec![1u8; 100]);
        let old = core.switch(view(&d, &c, &[0, 1], 2, 1, "s2"));
        assert!(!core.is_drained(&old), "the lease holds the retired view");
        assert!(!core.retire_drained(1), "a leased view is not forgotten");
        assert!(core.retained(1).is_some());
        assert_eq!(old.leases(), 1);
        // A second lease on the retired (still retained) view is given and counted.
        let second = core.lease(&old).unwrap();
        drop(lease);
        assert!(rx.try_recv().is_err(), "one lease still holds it");
        drop(second);
        assert_eq!(
            rx.try_recv().unwrap(),
            1,
            "the last lease's end drains the view"
        );
        assert!(core.retire_drained(1));
        assert!(
            core.lease(&old).is_none(),
            "a forgotten view takes no lease"
        );
        assert!(core.retire_drained(1), "nothing left to hold it");
        assert!(core.retire_drained(77), "a slot never shown may go");
        // The current view is never forgotten, leased or not.
        assert!(!core.retire_drained(2));
        let cur = core.lease(&core.current()).unwrap();
        assert_eq!(cur.view().generation, 2);
    }

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
    fn errors_map_to_errno() {
        let (d, c) = setup();
        let v1 = view(&d, &c, &[0, 1], 1, 0, "s1");
        let core = FsCore::new(v1, settings());
        assert_eq!(
            core.lookup(ROOT_INO, "zz").unwrap_err().errno(),
            libc::ENOENT
        );
        let g = core.lookup(ROOT_INO, "g").unwrap();
        assert_eq!(core.lookup(g.ino, "x").unwrap_err().errno(), libc::ENOTDIR);
        let d_ino = core.lookup(ROOT_INO, "d").unwrap().ino;
        assert_eq!(core.open(d_ino).unwrap_err().errno(), libc::EISDIR);
        assert_eq!(core.read(999, 0, 1).unwrap_err().errno(), libc::EBADF);
        assert_eq!(
            core.getattr(99 << 32 | 1).unwrap_err().errno(),
            libc::ESTALE
        );
    }

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
                        .open_passthrough(g.ino, |_| {
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
