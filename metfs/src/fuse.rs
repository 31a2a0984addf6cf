//! The FUSE adapter: a thin translation from `fuser` callbacks to [`FsCore`] calls.
//!
//! Everything that decides anything lives in the core; this file converts types, maps
//! [`FsError`] to errno, and chooses the read path at open:
//! * **passthrough**: the kernel reads the slot file directly (`open_backing` +
//!   `opened_passthrough`). Backing ids are cached per (generation, node) in the core and kept
//!   while their view lives, because registering an id per open costs about a third of
//!   small-file throughput. Without CAP_SYS_ADMIN the kernel refuses `open_backing` with EPERM;
//!   the adapter then switches to pread for good and logs it once.
//! * **pread**: reads come to the daemon, which `pread`s the slot file; `FOPEN_KEEP_CACHE` keeps
//!   the kernel's page cache across opens, which is safe because slot files never change.
//!
//! Entry and attribute TTLs are long (an hour): within a generation nothing changes, and a
//! switch invalidates the root's entries explicitly (see `daemon`).

use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fuser::{
    BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, Request,
};

use crate::fs::{Attr, FsCore, FsError};

/// How long the kernel may cache entries and attributes within one generation.
const TTL: Duration = Duration::from_secs(3600);

/// The `fuser::Filesystem` over a shared [`FsCore`].
pub struct FuseAdapter {
    core: Arc<FsCore>,
    passthrough: Arc<AtomicBool>,
    uid: u32,
    gid: u32,
}

impl FuseAdapter {
    /// An adapter; `passthrough` says whether to try kernel passthrough, and is cleared if the
    /// kernel refuses it (so the daemon can report the read path in use).
    pub fn new(core: Arc<FsCore>, passthrough: Arc<AtomicBool>) -> Self {
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        Self {
            core,
            passthrough,
            uid,
            gid,
        }
    }

    fn file_attr(&self, a: &Attr) -> FileAttr {
        FileAttr {
            ino: INodeNo(a.ino),
            size: a.size,
            blocks: a.size.div_ceil(512),
            atime: self.core.mtime,
            mtime: self.core.mtime,
            ctime: self.core.mtime,
            crtime: self.core.mtime,
            kind: if a.is_dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            },
            perm: if a.is_dir { 0o555 } else { 0o444 },
            nlink: if a.is_dir { 2 } else { 1 },
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            flags: 0,
            blksize: 131072,
        }
    }
}

fn errno(e: FsError) -> Errno {
    Errno::from_i32(e.errno())
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if self.passthrough.load(Ordering::Relaxed) {
            let ok = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
                && config.set_max_stack_depth(1).is_ok();
            if !ok {
                tracing::info!("kernel does not offer FUSE passthrough; reads use pread");
                self.passthrough.store(false, Ordering::Relaxed);
            }
        }
        let _ = config.set_max_readahead(1 << 20);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let Some(name) = name.to_str() else {
            return reply.error(Errno::ENOENT);
        };
        match self.core.lookup(parent.0, name) {
            Ok(a) => reply.entry(&TTL, &self.file_attr(&a), Generation(a.generation)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.core.getattr(ino.0) {
            Ok(a) => reply.attr(&TTL, &self.file_attr(&a)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.0 & libc::O_ACCMODE != libc::O_RDONLY {
            return reply.error(Errno::from_i32(libc::EROFS));
        }
        if self.passthrough.load(Ordering::Relaxed) {
            match self.core.open_cached_backing(ino.0) {
                Ok(Some((fh, id))) => {
                    if let Ok(id) = id.downcast::<BackingId>() {
                        return reply.opened_passthrough(FileHandle(fh), FopenFlags::empty(), &id);
                    }
                    self.core.release(fh);
                }
                Ok(None) => {}
                Err(e) => return reply.error(errno(e)),
            }
        }
        let opened = match self.core.open(ino.0) {
            Ok(o) => o,
            Err(e) => return reply.error(errno(e)),
        };
        if self.passthrough.load(Ordering::Relaxed) {
            let cached = self
                .core
                .backing(opened.key)
                .and_then(|b| b.downcast::<BackingId>().ok());
            let id = match cached {
                Some(id) => Some(id),
                None => match reply.open_backing(&*opened.file) {
                    Ok(id) => Some(Arc::new(id)),
                    Err(e) => {
                        if self.passthrough.swap(false, Ordering::Relaxed) {
                            tracing::warn!(
                                error = %e,
                                "kernel refused a passthrough backing file (needs CAP_SYS_ADMIN); reads use pread from now on"
                            );
                        }
                        None
                    }
                },
            };
            if let Some(id) = id {
                self.core.set_backing(opened.key, opened.fh, id.clone());
                return reply.opened_passthrough(FileHandle(opened.fh), FopenFlags::empty(), &id);
            }
        }
        reply.opened(FileHandle(opened.fh), FopenFlags::FOPEN_KEEP_CACHE);
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.core.read(fh.0, offset, size) {
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
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
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
        match self.core.readdir(ino.0, fh.0, offset) {
            Ok(entries) => {
                for e in entries {
                    let kind = if e.is_dir {
                        FileType::Directory
                    } else {
                        FileType::RegularFile
                    };
                    if reply.add(INodeNo(e.ino), e.next_offset, kind, &e.name) {
                        break;
                    }
                }
                reply.ok();
            }
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

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let v = self.core.current();
        let blocks = v.bytes().div_ceil(4096);
        reply.statfs(blocks, 0, 0, v.file_count() as u64, 0, 4096, 255, 4096);
    }
}
