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
//! * backing files are opened read-only and kept in a bounded cache (`cache`); evicting an
//!   entry drops the last reference and closes the descriptor, so millions of files never
//!   exhaust descriptors. Passthrough backing ids (opaque to the core) are cached the same way,
//!   per view, and dropped when the view is retired, so a deleted slot's blocks are really
//!   freed.
//!
//! Layout: this file holds the types, the core's state and its construction; `views` the
//! switches and the retirement of views (drains, forgets), `dir` lookups and listings, `read`
//! opens and reads, `lease` [`ViewLease`], `cache` the bounded cache of backing files and ids.
//!
//! Locks, outermost first (a lock is taken only while holding locks earlier in the list):
//! `reply_gate` → `root_listings` → `views` → `handles` → the backing-id cache's turn of a
//! key (held while an id is registered) → `live_backing` → the caches' own locks (`cache`) →
//! `drained`. metfs's daemon takes the core's locks under its own, in the order its `daemon`
//! module documents. Each named lock is an ordered lock at its `lock_order::Level`, so a debug
//! build panics at the first one taken out of this order; the cache's turns and shards are
//! generic over their keys and stay outside the check.

mod cache;
mod dir;
mod lease;
mod read;
#[cfg(test)]
mod testing;
mod views;

use std::any::Any;
use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use thiserror::Error;

use crate::lock_order::{Level, OrderedMutex, OrderedRwLock};
use crate::view::{Miss, NodeKind, View, ROOT_INO};
use cache::BoundedCache;
pub use lease::ViewLease;

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
    /// A file of a retired view taken back from its readers ([`FsCore::revoke`]).
    #[error("the view was taken back: its reader held it past its job's cap")]
    Revoked,
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
            FsError::Revoked => libc::EIO,
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
    pub meta: Option<metfs_tier::catalog::Meta>,
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
    /// The process that opened it, as the kernel said (0: not known).
    pid: u32,
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
    /// On a shared mount: the job each retained view was shown to, by generation.
    owners: HashMap<u64, String>,
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
    views: OrderedRwLock<Views>,
    /// Held shared while an entry is resolved and replied, exclusively while the view switches.
    reply_gate: OrderedRwLock<()>,
    handles: OrderedMutex<HashMap<u64, Handle>>,
    /// On a shared mount: listings of the root, by handle (the jobs and their views when the
    /// listing was opened).
    root_listings: OrderedMutex<HashMap<u64, JobViews>>,
    next_fh: AtomicU64,
    /// Open backing files by (generation, node).
    files: BoundedCache<(u64, u32), Arc<File>>,
    settings: FsSettings,
    /// Passthrough backing ids by (generation, node).
    backing: BoundedCache<(u64, u32), Pinned>,
    /// Every backing id registered and not yet dropped (held by the cache or a handle), so an
    /// id evicted from the cache while open is reused, never registered twice.
    live_backing: OrderedMutex<HashMap<(u64, u32), std::sync::Weak<dyn Any + Send + Sync>>>,
    drained: OrderedMutex<Option<tokio::sync::mpsc::UnboundedSender<u64>>>,
    /// Bytes the daemon read for the kernel (pread path, cached-path misses).
    pub bytes_read: AtomicU64,
    /// Of `bytes_read`, those answered by splice from the slot file (see `fuse`).
    pub bytes_spliced: AtomicU64,
    /// Files opened through the mount.
    pub opens: AtomicU64,
    /// Lookups answered: each is a round trip the kernel waited for.
    pub lookups: AtomicU64,
    /// Time used as mtime/ctime of every node.
    pub mtime: SystemTime,
    /// Fetches a damaged copy of a sealed slot again (`set_copy_repair`).
    copy_repair: OnceLock<CopyRepair>,
}

/// Fetches sample `sample` of slot `slot` again from the tier, replacing a copy its first
/// open found damaged (`metfs_prefetcher::stager::Stager::repair`); blocking; the error says why it
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
            views: OrderedRwLock::new(
                Level::Views,
                Views {
                    current: initial,
                    jobs: None,
                    retained: HashMap::new(),
                    owners: HashMap::new(),
                },
            ),
            root_listings: OrderedMutex::new(Level::RootListings, HashMap::new()),
            reply_gate: OrderedRwLock::new(Level::ReplyGate, ()),
            handles: OrderedMutex::new(Level::Handles, HashMap::new()),
            next_fh: AtomicU64::new(1),
            files: BoundedCache::new(max_open_files),
            backing: BoundedCache::new(max_backing_ids),
            live_backing: OrderedMutex::new(Level::LiveBacking, HashMap::new()),
            settings,
            drained: OrderedMutex::new(Level::Drained, None),
            bytes_read: AtomicU64::new(0),
            bytes_spliced: AtomicU64::new(0),
            opens: AtomicU64::new(0),
            lookups: AtomicU64::new(0),
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
    pub fn reply_gate(&self) -> crate::lock_order::OrderedReadGuard<'_, ()> {
        self.reply_gate.read().unwrap_or_else(|e| e.into_inner())
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

    fn attr(&self, view: &View, idx: u32) -> Attr {
        attr_in(view, idx, self.is_current(view))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::testing::*;

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
        assert_eq!(core.open(d_ino, 0).unwrap_err().errno(), libc::EISDIR);
        assert_eq!(core.read(999, 0, 1).unwrap_err().errno(), libc::EBADF);
        assert_eq!(
            core.getattr(99 << 32 | 1).unwrap_err().errno(),
            libc::ESTALE
        );
    }
}
