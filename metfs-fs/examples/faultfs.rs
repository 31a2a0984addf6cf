//! `faultfs`: a read-only FUSE passthrough of a directory that answers `EIO` for a chosen set
//! of files, a test tool for the faults of a POSIX tier that last (a Lustre OST down: the
//! files striped on it fail, every other file reads as before).
//!
//! ```text
//! faultfs SRC MNT CONTROL [--stats FILE]
//! ```
//!
//! Mounts SRC read-only at MNT. CONTROL lists paths relative to SRC, one a line; `open` and
//! `read` of a listed file answer `EIO` (lookups, attributes and listings still work, as they
//! do on Lustre, whose metadata server stays up while an OST is down). A test ends the fault
//! by emptying CONTROL. Prints `mounted` on stdout once the mount serves requests, so that a
//! test waits for that line rather than for a sleep, and exits with status 0 when MNT is
//! unmounted. With `--stats`, FILE holds the counts of `EIO` answers as JSON, rewritten at
//! each one and at exit.
//!
//! Design:
//! * The file system under test (metfs's POSIX tier) sees a real kernel mount: its ordinary
//!   `openat2`, `read` and `fstat` calls meet the error, with no mock of the tier in-process.
//! * CONTROL is checked on every `open` and `read` by one `stat`; it is read again only when
//!   its size, change time or inode differ, so a rewrite (even one within the kernel's coarse
//!   timestamp granularity, which changes the size) takes effect at the next call.
//! * Inode numbers are handed out on first sight of a path and kept for the mount's life
//!   (test datasets are small), so a path keeps its number across lookups: metfs's checks of a
//!   sample's identity and version before and after a copy see a stable file.
//! * A directory's listing is taken whole at `opendir` and paged from that snapshot, so the
//!   offsets `readdir` hands back stay valid however the kernel splits the listing.
//! * Opens reply without `FOPEN_KEEP_CACHE`: the kernel drops a file's cached pages at each
//!   open, so the reads that follow reach this process and meet a fault that began meanwhile.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::fs::File;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, Request,
};

/// How long the kernel may keep entries and attributes: the source never changes under a
/// test, only whether its files fail, which `open` and `read` decide on every call.
const TTL: Duration = Duration::from_secs(60);

/// Paths relative to SRC by inode number (the root, "", is inode 1) and back.
#[derive(Default)]
struct Inodes {
    paths: Vec<PathBuf>,
    by_path: HashMap<PathBuf, u64>,
}

impl Inodes {
    fn ino(&mut self, rel: &Path) -> u64 {
        if let Some(&ino) = self.by_path.get(rel) {
            return ino;
        }
        self.paths.push(rel.to_path_buf());
        let ino = self.paths.len() as u64;
        self.by_path.insert(rel.to_path_buf(), ino);
        ino
    }

    fn path(&self, ino: u64) -> Option<PathBuf> {
        self.paths.get(ino.checked_sub(1)? as usize).cloned()
    }
}

/// The dead paths as last read from CONTROL, and what CONTROL looked like then.
#[derive(Default)]
struct DeadSet {
    key: Option<(u64, u64, i64, i64)>,
    paths: HashSet<Vec<u8>>,
}

/// An open file, or a directory's listing taken at `opendir`.
enum Handle {
    File { file: Arc<File>, rel: PathBuf },
    Dir(Vec<(u64, FileType, std::ffi::OsString)>),
}

#[derive(Default)]
struct Counts {
    eio_opens: u64,
    eio_reads: u64,
    opens: u64,
}

struct FaultFs {
    src: PathBuf,
    control: PathBuf,
    stats: Option<PathBuf>,
    inodes: Mutex<Inodes>,
    handles: Mutex<HashMap<u64, Handle>>,
    next_fh: AtomicU64,
    dead: Mutex<DeadSet>,
    counts: Mutex<Counts>,
}

fn errno(e: &std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

fn kind(ft: std::fs::FileType) -> FileType {
    if ft.is_dir() {
        FileType::Directory
    } else if ft.is_symlink() {
        FileType::Symlink
    } else {
        FileType::RegularFile
    }
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    let t = Duration::new(secs.unsigned_abs(), nsecs as u32);
    if secs >= 0 {
        SystemTime::UNIX_EPOCH + t
    } else {
        SystemTime::UNIX_EPOCH - t
    }
}

/// The source's attributes under this mount's inode number; write bits cleared, since the
/// mount is read-only.
fn attr(ino: u64, md: &std::fs::Metadata) -> FileAttr {
    let mtime = time(md.mtime(), md.mtime_nsec());
    FileAttr {
        ino: INodeNo(ino),
        size: md.size(),
        blocks: md.blocks(),
        atime: time(md.atime(), md.atime_nsec()),
        mtime,
        ctime: time(md.ctime(), md.ctime_nsec()),
        crtime: mtime,
        kind: kind(md.file_type()),
        perm: (md.mode() & 0o7555) as u16,
        nlink: md.nlink() as u32,
        uid: md.uid(),
        gid: md.gid(),
        rdev: md.rdev() as u32,
        flags: 0,
        blksize: md.blksize() as u32,
    }
}

impl FaultFs {
    fn new(src: PathBuf, control: PathBuf, stats: Option<PathBuf>) -> Self {
        let mut inodes = Inodes::default();
        inodes.ino(Path::new(""));
        Self {
            src,
            control,
            stats,
            inodes: Mutex::new(inodes),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            dead: Mutex::new(DeadSet::default()),
            counts: Mutex::new(Counts::default()),
        }
    }

    fn rel(&self, ino: INodeNo) -> Result<PathBuf, Errno> {
        self.inodes.lock().unwrap().path(ino.0).ok_or(Errno::ENOENT)
    }

    /// Whether `rel` is listed in CONTROL now (a missing CONTROL lists nothing).
    fn is_dead(&self, rel: &Path) -> bool {
        let mut dead = self.dead.lock().unwrap();
        let key = std::fs::metadata(&self.control)
            .ok()
            .map(|m| (m.ino(), m.size(), m.ctime(), m.ctime_nsec()));
        if key != dead.key {
            let text = std::fs::read(&self.control).unwrap_or_default();
            dead.paths = text
                .split(|&b| b == b'\n')
                .filter(|l| !l.is_empty())
                .map(<[u8]>::to_vec)
                .collect();
            dead.key = key;
        }
        dead.paths.contains(rel.as_os_str().as_bytes())
    }

    /// Counts one `EIO` answer and rewrites the stats file.
    fn count_eio(&self, read: bool) {
        let mut c = self.counts.lock().unwrap();
        if read {
            c.eio_reads += 1;
        } else {
            c.eio_opens += 1;
        }
        self.write_stats(&c);
    }

    /// Writes the counts to a temporary name and renames it over the stats file, so that a
    /// reader never sees a partial file.
    fn write_stats(&self, c: &Counts) {
        let Some(path) = &self.stats else { return };
        let tmp = path.with_extension("tmp");
        let json = format!(
            "{{\"eio_opens\": {}, \"eio_reads\": {}, \"opens\": {}}}\n",
            c.eio_opens, c.eio_reads, c.opens
        );
        if std::fs::write(&tmp, json).is_ok() {
            let _ = std::fs::rename(&tmp, path);
        }
    }

    fn add_handle(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().unwrap().insert(fh, h);
        fh
    }

    /// A directory's entries, `.` and `..` first, each with its inode number.
    fn listing(&self, rel: &Path) -> std::io::Result<Vec<(u64, FileType, std::ffi::OsString)>> {
        let mut names: Vec<(std::ffi::OsString, FileType)> = Vec::new();
        for e in std::fs::read_dir(self.src.join(rel))? {
            let e = e?;
            names.push((e.file_name(), kind(e.file_type()?)));
        }
        names.sort_by(|a, b| a.0.cmp(&b.0));
        let mut inodes = self.inodes.lock().unwrap();
        let own = inodes.ino(rel);
        let parent = inodes.ino(rel.parent().unwrap_or(Path::new("")));
        let mut out = vec![
            (own, FileType::Directory, ".".into()),
            (parent, FileType::Directory, "..".into()),
        ];
        for (name, k) in names {
            out.push((inodes.ino(&rel.join(&name)), k, name));
        }
        Ok(out)
    }
}

impl Filesystem for FaultFs {
    fn destroy(&mut self) {
        let c = self.counts.lock().unwrap();
        self.write_stats(&c);
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let rel = match self.rel(parent) {
            Ok(p) => p.join(name),
            Err(e) => return reply.error(e),
        };
        match std::fs::symlink_metadata(self.src.join(&rel)) {
            Ok(md) => {
                let ino = self.inodes.lock().unwrap().ino(&rel);
                reply.entry(&TTL, &attr(ino, &md), Generation(0));
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let rel = match self.rel(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        match std::fs::symlink_metadata(self.src.join(rel)) {
            Ok(md) => reply.attr(&TTL, &attr(ino.0, &md)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.rel(ino) {
            Ok(rel) => match std::fs::read_link(self.src.join(rel)) {
                Ok(t) => reply.data(t.as_os_str().as_bytes()),
                Err(e) => reply.error(errno(&e)),
            },
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.0 & libc::O_ACCMODE != libc::O_RDONLY {
            return reply.error(Errno::from_i32(libc::EROFS));
        }
        let rel = match self.rel(ino) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        if self.is_dead(&rel) {
            self.count_eio(false);
            return reply.error(Errno::EIO);
        }
        match File::open(self.src.join(&rel)) {
            Ok(file) => {
                self.counts.lock().unwrap().opens += 1;
                let fh = self.add_handle(Handle::File {
                    file: Arc::new(file),
                    rel,
                });
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(errno(&e)),
        }
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
        let handles = self.handles.lock().unwrap();
        let Some(Handle::File { file, rel }) = handles.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        // The read itself runs without the handles' lock, so reads of other files go on.
        let (file, rel) = (file.clone(), rel.clone());
        drop(handles);
        if self.is_dead(&rel) {
            self.count_eio(true);
            return reply.error(Errno::EIO);
        }
        let mut buf = vec![0; size as usize];
        let mut n = 0;
        while n < buf.len() {
            match file.read_at(&mut buf[n..], offset + n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return reply.error(errno(&e)),
            }
        }
        reply.data(&buf[..n]);
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
        self.handles.lock().unwrap().remove(&fh.0);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let listed = self.rel(ino).map(|rel| self.listing(&rel));
        match listed {
            Ok(Ok(entries)) => {
                let fh = self.add_handle(Handle::Dir(entries));
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Ok(Err(e)) => reply.error(errno(&e)),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let handles = self.handles.lock().unwrap();
        let Some(Handle::Dir(entries)) = handles.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        for (i, (ino, k, name)) in entries.iter().enumerate().skip(offset as usize) {
            // The offset of an entry is that of the one after it.
            if reply.add(INodeNo(*ino), i as u64 + 1, *k, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.handles.lock().unwrap().remove(&fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let c = std::ffi::CString::new(self.src.as_os_str().as_bytes()).unwrap();
        // SAFETY: statvfs is plain data, for which all zeroes is a valid value.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: a valid C string and a struct of the right type that statvfs fills in.
        if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
            return reply.error(errno(&std::io::Error::last_os_error()));
        }
        reply.statfs(
            s.f_blocks,
            s.f_bfree,
            s.f_bavail,
            s.f_files,
            s.f_ffree,
            s.f_bsize as u32,
            s.f_namemax as u32,
            s.f_frsize as u32,
        );
    }
}

fn usage() -> ! {
    eprintln!("usage: faultfs SRC MNT CONTROL [--stats FILE]");
    std::process::exit(2);
}

fn main() -> std::io::Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut stats = None;
    if let Some(i) = args.iter().position(|a| a == "--stats") {
        if i + 1 >= args.len() {
            usage();
        }
        stats = Some(PathBuf::from(args.remove(i + 1)));
        args.remove(i);
    }
    let [src, mnt, control] = <[String; 3]>::try_from(args).unwrap_or_else(|_| usage());
    let src = std::fs::canonicalize(src)?;
    let fs = FaultFs::new(src, PathBuf::from(control), stats);
    let mut cfg = fuser::Config::default();
    cfg.mount_options = vec![
        fuser::MountOption::FSName("faultfs".into()),
        fuser::MountOption::Subtype("faultfs".into()),
        fuser::MountOption::RO,
    ];
    // Several threads, so that one slow or failing request does not hold up the others, as
    // the stager reads several samples at once.
    cfg.n_threads = Some(4);
    // `Session::new` returns after the kernel's INIT: the mount serves requests from here on.
    let session = fuser::Session::new(fs, &mnt, &cfg)?;
    let mut out = std::io::stdout();
    writeln!(out, "mounted")?;
    out.flush()?;
    // Returns once the kernel ends the session (an unmount).
    session.run()
}
