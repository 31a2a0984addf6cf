//! The FUSE adapter: a thin translation from `fuser` callbacks to [`FsCore`] calls.
//!
//! Everything that decides anything lives in the core; this file converts types, maps
//! [`FsError`] to errno, and implements the read path chosen at mount ([`ReadPath`]):
//! * **cached**: `open` answers ENOSYS, after which the kernel sends no `open`, `flush` or
//!   `release` for the connection's life and keeps each file's pages in the page cache
//!   (`FOPEN_KEEP_CACHE` is the kernel's default without opens). Reads that miss the cache come
//!   with no handle and are served by inode; once a file is cached, opening and reading it never
//!   reaches the daemon, which is what native speed on repeated passes needs: measured here,
//!   one round trip per open cost over half of the warm small-file rate. Views are pinned by
//!   the kernel's references (lookups minus forgets) instead of handles (see [`crate::fs`]).
//!   A kernel without zero-message opens would take ENOSYS as a failed open, so on such a
//!   kernel the adapter serves pread instead, decided once at `init`.
//! * **passthrough**: the kernel reads the slot file directly (`open_backing` +
//!   `opened_passthrough`). Backing ids are cached per (generation, node) in the core and kept
//!   while their view lives, because registering an id per open costs about a third of
//!   small-file throughput; concurrent first opens of a file share one id (the kernel fails an
//!   open that names a second backing file for an inode already open with EIO). Without CAP_SYS_ADMIN the kernel refuses `open_backing` with EPERM;
//!   the adapter then switches to pread for good and logs it once.
//! * **pread**: reads come to the daemon, which `pread`s the slot file; `FOPEN_KEEP_CACHE` keeps
//!   the kernel's page cache across opens, which is safe because slot files never change.
//!
//! Every read the daemon serves (cached-path misses, pread) is answered by splicing the slot
//! file's pages into the device (`splice`), with a buffer only where that cannot be set up.
//!
//! Either fall-back is recorded in the [`ActiveReadPath`] shared with the daemon, so that
//! `metfs status` reports the path actually serving reads.
//!
//! Requests a read-only filesystem without extended attributes does not serve are answered
//! as such a filesystem answers them, quietly (fuser's defaults log a warning per request, and
//! Python's `open()` alone sends an ioctl): ioctl ENOTTY, getxattr ENODATA, listxattr an
//! empty list, access granted for reading (write bits are never set), fsync a no-op, and
//! ENOSYS for poll, lseek and bmap (the kernel then stops sending them). Nothing per request
//! logs above debug.
//!
//! Entry and attribute TTLs are long (an hour): within a generation nothing changes, and a
//! switch invalidates the root's entries explicitly (metfs's `daemon`, through
//! [`KernelCache`]). Entries of a view that is
//! no longer current get a zero TTL, so the kernel drops them once unused and forgets the
//! inodes, which lets the view drain.

mod splice;

use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, PollEvents,
    PollFlags, PollNotifier, ReplyAttr, ReplyBmap, ReplyData, ReplyDirectory, ReplyDirectoryPlus,
    ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen, ReplyPoll, ReplyStatfs, ReplyXattr,
    Request,
};

use metfs_tier::catalog::Meta;

use crate::fs::{Attr, FsCore, FsError};
use crate::kernel::KernelCache;
use crate::read_path::{ActiveReadPath, ReadPath};

/// How long the kernel may cache entries and attributes within one generation.
const TTL: Duration = Duration::from_secs(3600);

/// `FUSE_NOTIFY_PRUNE` (protocol 7.45, kernel 6.18): drop the kernel's unused entries of the
/// given inodes. fuser 0.18 has no call for it, so it is written to the device directly.
const FUSE_NOTIFY_PRUNE: i32 = 9;

/// Most node ids per prune message (the kernel copies them in batches of 512).
const PRUNE_BATCH: usize = 512;

/// Sends cache notifications to the kernel: fuser's own (entry and inode invalidation) plus
/// `prune`, written on a duplicate of the session's device descriptor.
#[derive(Clone)]
pub struct KernelNotifier {
    inner: fuser::Notifier,
    dev: Option<Arc<OwnedFd>>,
}

impl KernelNotifier {
    /// A notifier for `session`; call before the session is spawned.
    pub fn new<FS: fuser::Filesystem>(session: &fuser::Session<FS>) -> Self {
        Self {
            inner: session.notifier(),
            dev: session.as_fd().try_clone_to_owned().ok().map(Arc::new),
        }
    }
}

/// The daemon's view of the kernel's caches, over the session's notifier.
impl KernelCache for KernelNotifier {
    fn inval_entry(&self, parent: u64, name: &str) -> std::io::Result<()> {
        self.inner.inval_entry(INodeNo(parent), name.as_ref())
    }

    fn inval_inode(&self, ino: u64) -> std::io::Result<()> {
        self.inner.inval_inode(INodeNo(ino), 0, 0)
    }

    /// Written to the device directly (fuser 0.18 has no call for `FUSE_NOTIFY_PRUNE`).
    /// Entries in use stay, and inodes the kernel does not hold are skipped. Fails with EINVAL
    /// or ENOSYS on kernels before 6.18.
    fn prune(&self, nodes: &[u64]) -> std::io::Result<()> {
        let Some(dev) = &self.dev else {
            return Err(std::io::Error::from_raw_os_error(libc::ENOSYS));
        };
        for chunk in nodes.chunks(PRUNE_BATCH) {
            // fuse_out_header { len, error = notify code, unique = 0 }, then
            // fuse_notify_prune_out { count, padding, spare }, then the node ids.
            let len = 16 + 16 + 8 * chunk.len();
            let mut msg = Vec::with_capacity(len);
            msg.extend_from_slice(&(len as u32).to_ne_bytes());
            msg.extend_from_slice(&FUSE_NOTIFY_PRUNE.to_ne_bytes());
            msg.extend_from_slice(&0u64.to_ne_bytes());
            msg.extend_from_slice(&(chunk.len() as u32).to_ne_bytes());
            msg.extend_from_slice(&0u32.to_ne_bytes());
            msg.extend_from_slice(&0u64.to_ne_bytes());
            for n in chunk {
                msg.extend_from_slice(&n.to_ne_bytes());
            }
            // SAFETY: one write of a buffer we own to a descriptor we own; the device takes a
            // whole message per write.
            let r = unsafe { libc::write(dev.as_raw_fd(), msg.as_ptr().cast(), msg.len()) };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// The `fuser::Filesystem` over a shared [`FsCore`].
pub struct FuseAdapter {
    core: Arc<FsCore>,
    /// The read path in use, shared with the daemon, which reports it.
    path: Arc<ActiveReadPath>,
    /// Splices read replies once the session's device is known (see [`SpliceReplies`]).
    splicer: Arc<OnceLock<splice::Splicer>>,
    /// Called once when the session ends, whoever ended it.
    on_end: Option<Box<dyn FnOnce() + Send + Sync>>,
    uid: u32,
    gid: u32,
}

/// Lets reads the daemon serves be answered by splice once the session is made; until then
/// (and if it cannot be set up) they are answered from a buffer.
#[derive(Clone)]
pub struct SpliceReplies(Arc<OnceLock<splice::Splicer>>);

impl SpliceReplies {
    /// Starts splicing replies into `session`'s device. The session must read every request
    /// on that one descriptor (`clone_fd` off): the kernel takes a reply only on the
    /// descriptor that read its request.
    pub fn start<FS: fuser::Filesystem>(
        &self,
        session: &fuser::Session<FS>,
    ) -> std::io::Result<()> {
        let _ = self.0.set(splice::Splicer::new(session.as_fd())?);
        Ok(())
    }
}

impl FuseAdapter {
    /// An adapter serving reads on `path` (resolved, not `auto`); the adapter moves it to
    /// `pread` if the kernel does not support the chosen path, so that the daemon reports the
    /// path actually in use.
    pub fn new(core: Arc<FsCore>, path: Arc<ActiveReadPath>) -> Self {
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        Self {
            core,
            path,
            splicer: Arc::new(OnceLock::new()),
            on_end: None,
            uid,
            gid,
        }
    }

    /// Calls `f` once the session has ended: after an unmount by the daemon, and also after
    /// one from outside (`umount`, `fusermount3 -u`), which the daemon learns of only so.
    pub fn on_session_end(&mut self, f: impl FnOnce() + Send + Sync + 'static) {
        self.on_end = Some(Box::new(f));
    }

    /// The handle that turns on splice replies once the session exists.
    pub fn splice_replies(&self) -> SpliceReplies {
        SpliceReplies(self.splicer.clone())
    }

    /// The attributes the kernel sees: the source's mode without write bits, owner and times
    /// where the catalog has them (see `docs/SEMANTICS.md`, "What stat shows"), else 0444 or
    /// 0555, the mounting user and the mount time.
    fn file_attr(&self, a: &Attr) -> FileAttr {
        let (default_perm, kind, nlink) = if a.is_dir {
            (0o555, FileType::Directory, 2)
        } else {
            (0o444, FileType::RegularFile, 1)
        };
        let ns = |t: i64| {
            if t >= 0 {
                SystemTime::UNIX_EPOCH + Duration::from_nanos(t as u64)
            } else {
                SystemTime::UNIX_EPOCH - Duration::from_nanos(t.unsigned_abs())
            }
        };
        let (perm, uid, gid, mtime, ctime) = match a.meta {
            Some(m) => (
                (m.mode & 0o7777 & !0o222) as u16,
                if m.uid == Meta::NO_OWNER {
                    self.uid
                } else {
                    m.uid
                },
                if m.gid == Meta::NO_OWNER {
                    self.gid
                } else {
                    m.gid
                },
                ns(m.mtime_ns),
                ns(m.ctime_ns),
            ),
            None => (
                default_perm,
                self.uid,
                self.gid,
                self.core.mtime,
                self.core.mtime,
            ),
        };
        FileAttr {
            ino: INodeNo(a.ino),
            size: a.size,
            blocks: a.size.div_ceil(512),
            atime: mtime,
            mtime,
            ctime,
            crtime: mtime,
            kind,
            perm,
            nlink,
            uid,
            gid,
            rdev: 0,
            flags: 0,
            blksize: 131072,
        }
    }
}

fn errno(e: FsError) -> Errno {
    Errno::from_i32(e.errno())
}

/// How long the kernel may keep an entry or attributes of `a`.
fn ttl(a: &Attr) -> Duration {
    if a.current {
        TTL
    } else {
        Duration::ZERO
    }
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if self.path.get() == ReadPath::Cached
            && !config
                .capabilities()
                .contains(InitFlags::FUSE_NO_OPEN_SUPPORT)
        {
            // An old kernel would take ENOSYS from open as a failure, not as "no opens".
            self.path.fall_back();
            tracing::warn!(
                "kernel does not support zero-message opens; the cached read path falls back to pread"
            );
        }
        if self.path.get() == ReadPath::Passthrough {
            let ok = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
                && config.set_max_stack_depth(1).is_ok();
            if !ok {
                self.path.fall_back();
                tracing::info!("kernel does not offer FUSE passthrough; reads use pread");
            }
        }
        // The kernel offers the mount's own readahead (128 KiB unless root raised the mount's
        // `read_ahead_kb`) and takes no more; asking for 1 MiB keeps whatever it offers.
        let _ = config.set_max_readahead(1 << 20);
        // Listings return each entry's attributes too, so that a reader that lists a directory
        // and then opens its files (as dataset loaders do) needs no lookup round trip per file.
        if config
            .add_capabilities(InitFlags::FUSE_DO_READDIRPLUS)
            .is_err()
        {
            tracing::info!("kernel does not offer READDIRPLUS; each file costs one lookup");
        }
        Ok(())
    }

    fn destroy(&mut self) {
        if let Some(f) = self.on_end.take() {
            f();
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let Some(name) = name.to_str() else {
            return reply.error(Errno::ENOENT);
        };
        let _gate = self.core.reply_gate();
        match self.core.lookup(parent.0, name) {
            Ok(a) => reply.entry(&ttl(&a), &self.file_attr(&a), Generation(a.generation)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.core.getattr(ino.0) {
            Ok(a) => reply.attr(&ttl(&a), &self.file_attr(&a)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.0 & libc::O_ACCMODE != libc::O_RDONLY {
            return reply.error(Errno::from_i32(libc::EROFS));
        }
        let path = self.path.get();
        if path == ReadPath::Cached {
            // The kernel takes ENOSYS as "no opens needed" for the rest of the connection.
            return reply.error(Errno::ENOSYS);
        }
        if path == ReadPath::Passthrough {
            let opened = self.core.open_passthrough(ino.0, req.pid(), |file| {
                reply
                    .open_backing(file)
                    .map(|id| Arc::new(id) as crate::fs::Pinned)
            });
            match opened {
                Ok(Ok((fh, id))) => {
                    if let Ok(id) = id.downcast::<BackingId>() {
                        return reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &id);
                    }
                    self.core.release(fh);
                }
                Ok(Err(e)) => {
                    if self.path.fall_back() {
                        tracing::warn!(
                            error = %e,
                            "kernel refused a passthrough backing file (needs CAP_SYS_ADMIN); reads use pread from now on"
                        );
                    }
                }
                Err(e) => return reply.error(errno(e)),
            }
        }
        let opened = match self.core.open(ino.0, req.pid()) {
            Ok(o) => o,
            Err(e) => return reply.error(errno(e)),
        };
        reply.opened(FileHandle(opened.fh), FopenFlags::FOPEN_KEEP_CACHE);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.core.forget(ino.0, nlookup);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Nothing to flush on a read-only mount; ENOSYS stops the kernel sending it at all.
        reply.error(Errno::ENOSYS);
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        // Handles start at 1: a read without one comes from the cached path.
        let src = match self.core.read_source(fh.0, ino.0, offset, size) {
            Ok(x) => x,
            Err(e) => return reply.error(errno(e)),
        };
        let len = src.len as usize;
        if let (true, Some(s)) = (len > 0, self.splicer.get()) {
            if s.reply(req.unique().0, &src.file, offset, len) {
                self.core.count_spliced(len);
                // The request is answered. Dropping the reply would send a second one
                // (fuser answers EIO for a reply never sent); it holds only the channel's
                // reference count, so forgetting it frees nothing but leaves that count
                // raised, which keeps the device open until the process ends.
                std::mem::forget(reply);
                return;
            }
        }
        match self.core.pread(&src.file, offset, src.len) {
            Ok(buf) => reply.data(&buf),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.core.release(fh.0);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.core.opendir(ino.0) {
            Ok(fh) => {
                // A view's directories never change: the kernel may keep their listings, so a
                // walk repeated within a generation never reaches the daemon. The root is the
                // one directory whose listing changes, and every switch invalidates it (see
                // metfs's `daemon::switch`); a shared mount's root lists the jobs, which come
                // and go without a switch, so it is listed afresh each time.
                let flags = if ino.0 == crate::view::ROOT_INO && self.core.is_shared() {
                    FopenFlags::empty()
                } else {
                    FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE
                };
                reply.opened(FileHandle(fh), flags)
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = self.core.readdir(ino.0, fh.0, offset, false, |e| {
            let kind = if e.attr.is_dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            reply.add(INodeNo(e.attr.ino), e.next_offset, kind, e.name)
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _gate = self.core.reply_gate();
        let r = self.core.readdir(ino.0, fh.0, offset, true, |e| {
            reply.add(
                INodeNo(e.attr.ino),
                e.next_offset,
                e.name,
                &ttl(&e.attr),
                &self.file_attr(&e.attr),
                Generation(e.attr.generation),
            )
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.core.release(fh.0);
        reply.ok();
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        // What a regular file on any filesystem answers to a terminal or device ioctl.
        reply.error(Errno::from_i32(libc::ENOTTY));
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        reply.error(Errno::from_i32(libc::ENODATA));
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: ReplyXattr) {
        if size == 0 {
            reply.size(0);
        } else {
            reply.data(&[]);
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        if let Err(e) = self.core.getattr(ino.0) {
            return reply.error(errno(e));
        }
        if mask.contains(AccessFlags::W_OK) {
            return reply.error(Errno::from_i32(libc::EROFS));
        }
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Nothing is ever written.
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn poll(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _ph: PollNotifier,
        _events: PollEvents,
        _flags: PollFlags,
        reply: ReplyPoll,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: i64,
        _whence: i32,
        reply: ReplyLseek,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn bmap(&self, _req: &Request, _ino: INodeNo, _blocksize: u32, _idx: u64, reply: ReplyBmap) {
        reply.error(Errno::ENOSYS);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let v = self.core.current();
        let blocks = v.bytes().div_ceil(4096);
        reply.statfs(blocks, 0, 0, v.file_count() as u64, 0, 4096, 255, 4096);
    }
}
