//! [`PosixTier`]: a directory (Lustre, GPFS, NFS, local) as a capacity tier. This module
//! opens a sample without leaving the root (`openat2(RESOLVE_BENEATH)`), tells a deleted
//! sample from an outage of the whole source, and implements [`CapacityTier`]; `walk` lists
//! the source, `copy` copies one sample.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;

use crate::catalog::{validate_rel_path, Catalog};
use crate::pacer::Pacer;
use crate::{
    CapacityTier, Catalogued, Copied, GroupMember, Listing, SampleRef, TierError, Written,
};

mod copy;
#[cfg(test)]
mod tests;
mod walk;

/// Small samples a [`PosixTier`] copies per blocking call ([`CapacityTier::group_files`]).
/// Handing each file of 1-4 KiB to a blocking thread and back cost 12% of the daemon's CPU
/// while it staged 500,000 of them (two futex wakeups per file); 16 files per handoff make that
/// negligible, while 32 concurrent groups still keep the source's disk queue as deep as 32
/// single fetches did.
pub const POSIX_GROUP_FILES: usize = 16;

/// A POSIX directory as a capacity tier.
#[derive(Debug, Clone)]
pub struct PosixTier {
    root: PathBuf,
    /// Device of the root when the tier was opened: a root on another device later means the
    /// source's file system is gone (unmounted, the bare mount point left).
    root_dev: u64,
    url: String,
    /// A listing or catalog check that makes no progress (no directory entry read) for this
    /// long fails with [`TierError::Timeout`] instead of hanging on a dead file system.
    timeout: std::time::Duration,
}

/// Default of [`PosixTier::with_timeout`]: as the stager's fetch timeout, 60 s, far beyond any
/// pause of a healthy parallel file system between two directory entries.
const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Runs `work` on a blocking thread, failing with [`TierError::Timeout`] when the counter it
/// bumps stands still for `timeout`. The thread itself cannot be stopped; it is abandoned.
async fn watched<T: Send + 'static>(
    url: &str,
    what: &str,
    timeout: std::time::Duration,
    work: impl FnOnce(&std::sync::atomic::AtomicU64) -> Result<T, TierError> + Send + 'static,
) -> Result<T, TierError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    let progress = Arc::new(AtomicU64::new(0));
    let p2 = progress.clone();
    let mut task = tokio::task::spawn_blocking(move || work(&p2));
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(250));
    let (mut last, mut since) = (0, std::time::Instant::now());
    loop {
        tokio::select! {
            r = &mut task => return r.expect("tier task panicked"),
            _ = tick.tick() => {
                let now = progress.load(Ordering::Relaxed);
                if now != last {
                    (last, since) = (now, std::time::Instant::now());
                } else if since.elapsed() >= timeout {
                    return Err(TierError::Timeout {
                        url: url.to_string(),
                        path: what.to_string(),
                        secs: since.elapsed().as_secs(),
                    });
                }
            }
        }
    }
}

fn mtime_ns(md: &std::fs::Metadata) -> i128 {
    md.mtime() as i128 * 1_000_000_000 + md.mtime_nsec() as i128
}

/// A time in nanoseconds since the epoch, as UTC with nanoseconds.
fn show_ns(ns: i128) -> String {
    i64::try_from(ns).map_or_else(
        |_| format!("{ns} ns"),
        |n| {
            chrono::DateTime::from_timestamp_nanos(n)
                .format("%Y-%m-%dT%H:%M:%S%.9fZ")
                .to_string()
        },
    )
}

/// The version string of a POSIX file: its modification time in nanoseconds.
pub fn posix_version(md: &std::fs::Metadata) -> String {
    mtime_ns(md).to_string()
}

impl PosixTier {
    /// Opens a source directory. The path is resolved once; the resolved root is what symlinks
    /// are checked against.
    pub fn new(root: &Path) -> Result<Self, TierError> {
        let url = root.display().to_string();
        let canon = std::fs::canonicalize(root).map_err(|e| TierError::BadSource {
            url: url.clone(),
            reason: format!("cannot open the source directory: {e}"),
        })?;
        let md = std::fs::metadata(&canon).map_err(|e| TierError::BadSource {
            url: url.clone(),
            reason: format!("cannot open the source directory: {e}"),
        })?;
        if !md.is_dir() {
            return Err(TierError::BadSource {
                url,
                reason: "not a directory".into(),
            });
        }
        Ok(Self {
            root: canon,
            root_dev: md.dev(),
            url,
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// Sets how long a listing or catalog check may go without progress (at least 1 s).
    pub fn with_timeout(mut self, secs: u64) -> Self {
        self.timeout = std::time::Duration::from_secs(secs.max(1));
        self
    }

    /// Whether the source root is there: the directory exists on the file system it was on
    /// when the tier was opened.
    fn root_present(&self) -> bool {
        std::fs::metadata(&self.root)
            .map(|m| m.is_dir() && m.dev() == self.root_dev)
            .unwrap_or(false)
    }

    /// The resolved source root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Opens sample `rel` for reading (non-blocking, so a FIFO cannot hang the open), never
    /// following a symbolic link out of the root.
    ///
    /// The common case is one `openat2(RESOLVE_BENEATH)` below a descriptor of the root, which
    /// the kernel refuses (EXDEV) for any resolution that would leave it. Resolving the path
    /// in user space instead (`realpath`: a `readlink` and a `stat` per component) cost ten
    /// system calls per small file, more than copying it. The slow path remains for what
    /// `RESOLVE_BENEATH` refuses although it stays inside (an absolute symlink to a file under
    /// the root) and where `openat2` is missing (kernels before 5.6) or filtered out.
    fn open_source(&self, rel: &str) -> Result<std::fs::File, TierError> {
        use std::os::unix::fs::OpenOptionsExt;
        validate_rel_path(rel).map_err(|_| TierError::Escapes {
            url: self.url.clone(),
            path: rel.to_string(),
        })?;
        match self.open_beneath(rel) {
            Ok(f) => return Ok(f),
            // EXDEV: a way out, or an absolute symlink; ENOSYS or EPERM: no `openat2` here
            // (before 5.6, or refused by a container's seccomp filter).
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EXDEV) | Some(libc::ENOSYS) | Some(libc::EPERM)
                ) => {}
            Err(e) => return Err(self.io_err(rel, e)),
        }
        let real = self.resolve(rel)?;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&real)
            .map_err(|e| self.io_err(rel, e))
    }

    /// `openat2(root, rel, O_RDONLY | O_NONBLOCK, RESOLVE_BENEATH)`. The root is opened for
    /// each call (an `O_PATH` open, no I/O) rather than kept: a kept descriptor would go on
    /// reading a source directory that was moved away or unmounted and mounted again.
    fn open_beneath(&self, rel: &str) -> std::io::Result<std::fs::File> {
        use std::os::fd::{FromRawFd, OwnedFd};
        use std::os::unix::ffi::OsStrExt;
        let c = |p: &[u8]| {
            std::ffi::CString::new(p).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))
        };
        let root_c = c(self.root.as_os_str().as_bytes())?;
        let rel_c = c(rel.as_bytes())?;
        // SAFETY: a NUL-terminated path; the descriptor returned is owned below.
        let rfd = unsafe {
            libc::open(
                root_c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if rfd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `rfd` was just opened and is owned by nothing else.
        let root = unsafe { OwnedFd::from_raw_fd(rfd) };
        // SAFETY: a plain C struct, all zeros being its defaults.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = (libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC) as u64;
        how.resolve = libc::RESOLVE_BENEATH;
        // SAFETY: valid descriptor, NUL-terminated path, and `how` of the size passed.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                std::os::fd::AsRawFd::as_raw_fd(&root),
                rel_c.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a new descriptor owned by nothing else.
        Ok(unsafe { std::fs::File::from_raw_fd(fd as i32) })
    }

    /// Resolves a relative sample path to a real path inside the root, or refuses it.
    fn resolve(&self, rel: &str) -> Result<PathBuf, TierError> {
        validate_rel_path(rel).map_err(|_| TierError::Escapes {
            url: self.url.clone(),
            path: rel.to_string(),
        })?;
        let p = self.root.join(rel);
        let canon = std::fs::canonicalize(&p).map_err(|e| self.io_err(rel, e))?;
        if !canon.starts_with(&self.root) {
            return Err(TierError::Escapes {
                url: self.url.clone(),
                path: rel.to_string(),
            });
        }
        Ok(canon)
    }

    /// The error for a failed access to sample `rel`. A missing sample is only reported as
    /// gone ([`TierError::NotFound`], which leaves it out of its slot for good) when the source
    /// root is present and the sample is still missing when looked at again: a missing root
    /// is an outage of the whole source, and a sample that reappeared was caught mid-outage.
    fn io_err(&self, rel: &str, e: std::io::Error) -> TierError {
        let missing =
            e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR);
        if missing && !self.root_present() {
            TierError::Unreachable {
                url: self.url.clone(),
                reason: format!(
                    "the source directory {} is missing or no longer mounted ({e})",
                    self.root.display()
                ),
            }
        } else if missing && std::fs::symlink_metadata(self.root.join(rel)).is_ok() {
            TierError::Io {
                url: self.url.clone(),
                path: rel.to_string(),
                source: std::io::Error::other(format!("{e}, and present again right after")),
            }
        } else if missing {
            TierError::NotFound {
                url: self.url.clone(),
                path: rel.to_string(),
            }
        } else {
            TierError::Io {
                url: self.url.clone(),
                path: rel.to_string(),
                source: e,
            }
        }
    }
}

#[async_trait]
impl CapacityTier for PosixTier {
    fn url(&self) -> &str {
        &self.url
    }

    async fn list(&self) -> Result<Listing, TierError> {
        let me = self.clone();
        watched(&self.url, "(listing)", self.timeout, move |p| {
            me.list_blocking(p)
        })
        .await
    }

    async fn catalog(&self) -> Result<Catalogued, TierError> {
        let me = self.clone();
        watched(&self.url, "(listing)", self.timeout, move |p| {
            me.catalog_blocking(p)
        })
        .await
    }

    async fn catalog_is_current(&self, catalog: &Catalog) -> Result<bool, TierError> {
        // A directory's mtime changes whenever an entry is added, removed or renamed in it, so
        // equal directory mtimes mean the same set of names. Content changes of existing files
        // are caught per file at fetch time (size + mtime), so one stat per directory suffices.
        let stamps = catalog.dir_stamps().to_vec();
        if stamps.is_empty() {
            return Ok(false);
        }
        let root = self.root.clone();
        watched(&self.url, "(catalog check)", self.timeout, move |p| {
            Ok(stamps.iter().all(|s| {
                p.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                std::fs::metadata(root.join(&s.dir))
                    .map(|md| mtime_ns(&md) == s.mtime_ns)
                    .unwrap_or(false)
            }))
        })
        .await
    }

    /// The root directory's mtime against the one the listing recorded: an entry added,
    /// removed or renamed at the top level changes it. One `stat`, which needs no right to
    /// list the root.
    async fn catalog_stamp_differs(&self, catalog: &Catalog) -> Result<Option<String>, TierError> {
        let Some(root) = catalog.dir_stamps().iter().find(|s| s.dir.is_empty()) else {
            return Ok(None);
        };
        let md = std::fs::metadata(&self.root).map_err(|e| self.io_err("", e))?;
        let now = mtime_ns(&md);
        Ok((now != root.mtime_ns).then(|| {
            format!(
                "the source directory was modified at {}, after the listing's {}",
                show_ns(now),
                show_ns(root.mtime_ns)
            )
        }))
    }

    async fn fetch(
        &self,
        sample: &SampleRef,
        dest: Arc<std::fs::File>,
        pacer: &Pacer,
    ) -> Result<u64, TierError> {
        let me = self.clone();
        let sample = sample.clone();
        let pacer = pacer.clone();
        tokio::task::spawn_blocking(move || {
            me.fetch_blocking(&sample, &dest, 0, &pacer, None, None)
        })
        .await
        .expect("fetch task panicked")
    }

    /// A `pread` (or `copy_file_range`) from `from` on: the POSIX tier serves any range, and
    /// writes in order, raising `written` after each chunk.
    async fn fetch_from(
        &self,
        sample: &SampleRef,
        dest: Arc<std::fs::File>,
        from: u64,
        pacer: &Pacer,
        written: Arc<Written>,
    ) -> Result<Option<u64>, TierError> {
        let me = self.clone();
        let sample = sample.clone();
        let pacer = pacer.clone();
        tokio::task::spawn_blocking(move || {
            me.fetch_blocking(&sample, &dest, from, &pacer, None, Some(&written))
        })
        .await
        .expect("fetch task panicked")
        .map(Some)
    }

    fn group_files(&self) -> usize {
        POSIX_GROUP_FILES
    }

    async fn fetch_group(
        &self,
        group: Vec<GroupMember>,
        pacer: &Pacer,
        copied: Arc<std::sync::atomic::AtomicU64>,
    ) -> Vec<Result<Copied, TierError>> {
        let me = self.clone();
        let pacer = pacer.clone();
        tokio::task::spawn_blocking(move || {
            group
                .into_iter()
                .map(|m| {
                    let r = me.fetch_member(m, &pacer);
                    copied.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    r
                })
                .collect()
        })
        .await
        .expect("fetch task panicked")
    }
}
