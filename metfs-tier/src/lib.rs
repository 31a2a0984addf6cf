//! Capacity tiers: where the dataset lives.
//!
//! [`CapacityTier`] is the seam between the stager and a storage system. A tier lists its
//! samples and copies one sample into a file the stager owns, checking that the bytes it copies
//! are the bytes the catalog describes (size, and version: mtime for POSIX, ETag for S3).
//!
//! [`PosixTier`] reads a directory (Lustre, GPFS, NFS, local) with plain file I/O and
//! `copy_file_range`, which lets the kernel move the bytes without a round trip through user
//! space and beats `object_store`'s `LocalFileSystem` (which streams through buffers) for this
//! workload; see `docs/BENCHMARKS.md` for the staging-vs-`cp` numbers.
//!
//! Invariants:
//! * the source is never written (files are opened read-only, directories only listed);
//! * a symlink is followed only when its target, fully resolved, lies inside the source root;
//!   others are skipped at listing and refused at fetch, so a view never shows data from
//!   outside the source;
//! * a sample whose size or version differs from the catalog at fetch time, or changes while it
//!   is copied, is an error ([`TierError::Changed`]); the stager never renames such a copy into
//!   a slot;
//! * a source file is opened with `O_NONBLOCK` and its type checked on the open descriptor, so a
//!   FIFO or device put where a sample was catalogued (or named by a manifest) is refused
//!   ([`TierError::NotRegular`]) instead of blocking the open or the read forever;
//! * a sample that is missing while the source root is missing too (renamed away, its file
//!   system unmounted, another file system mounted in its place) is an outage of the whole
//!   source ([`TierError::Unreachable`], which the stager retries), not a deleted sample.
//!
//! The crate also holds what a tier lists into and paces by: [`catalog`] (every sample of the
//! dataset, stored compactly: interned directories, one string arena, integer ids), [`pacer`]
//! (the staging rate's token bucket) and the S3 tier, [`s3`]. Of the workspace it depends on
//! `metfs-durable` and the pure `metfs-plan` (byte sizes; the catalog implements its
//! `CatalogSamples`, which the budget and the digests read).
//!
//! Every `unsafe` block says why it is sound in a `// SAFETY:` comment (enforced below).
//!
//! With the `testing` feature, the `testing` module holds an in-memory tier and a wrapper that injects
//! faults into any tier (outages, a full cache, hangs, changed samples), for tests.

#![deny(clippy::undocumented_unsafe_blocks)]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use thiserror::Error;

use crate::catalog::{
    validate_rel_path, Catalog, CatalogBuilder, CatalogEntry, CatalogError, DirStamp, Meta,
};
use crate::pacer::Pacer;

pub mod backoff;
pub mod catalog;
pub mod pacer;
pub mod s3;
#[cfg(feature = "testing")]
pub mod testing;

/// Errors of capacity tiers.
#[derive(Debug, Error)]
pub enum TierError {
    /// The source itself is missing or not usable.
    #[error("source {url}: {reason}")]
    BadSource { url: String, reason: String },
    /// A sample is gone.
    #[error("{url}: sample `{path}` no longer exists")]
    NotFound { url: String, path: String },
    /// A sample changed since the catalog was made, or while it was copied.
    #[error("{url}: sample `{path}` changed since it was catalogued (expected {expected}, found {found}); remount to re-catalogue (from a catalog file: make it again with `metfs catalog`)")]
    Changed {
        url: String,
        path: String,
        expected: String,
        found: String,
    },
    /// A sample resolves to somewhere outside the source.
    #[error("{url}: sample `{path}` resolves outside the source and is not served")]
    Escapes { url: String, path: String },
    /// Credentials were refused.
    #[error("{url}: access denied: {reason}")]
    Auth { url: String, reason: String },
    /// The tier could not be reached (after retries).
    #[error("{url}: unreachable: {reason}")]
    Unreachable { url: String, reason: String },
    /// Any other I/O failure on one sample.
    #[error("{url}: `{path}`: {source}")]
    Io {
        url: String,
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A catalogued sample is no longer a regular file (a FIFO, socket or device in its place).
    #[error("{url}: sample `{path}` is not a regular file ({kind}) and is not served")]
    NotRegular {
        url: String,
        path: String,
        kind: String,
    },
    /// A tier operation made no progress for too long (a hung file system or server).
    #[error("{url}: `{path}`: no progress for {secs} s")]
    Timeout {
        url: String,
        path: String,
        secs: u64,
    },
    /// Writing the local copy failed (cache full, disk error).
    #[error("writing the cache copy of `{path}`: {source}")]
    Local {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The listed samples do not make a catalog (a bad path, the same path twice, more samples
    /// than ids).
    #[error(transparent)]
    Catalog(#[from] crate::catalog::CatalogError),
}

/// Starts writeback of `len` bytes at `off` of a file being staged (0 = to the end), without
/// waiting for it. Tiers call it as they write, so that the disk writes while the rest
/// downloads and the stager's `syncfs` finds little left; a large object would otherwise be
/// written out only after its last byte arrived (the HDF5 row stager calls it too). Errors
/// only mean writeback starts later.
pub fn start_writeback(file: &std::fs::File, off: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: a hint on a descriptor the caller holds open.
    unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            off as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        );
    }
}

thread_local! {
    /// The buffer a blocking thread copies small files through, made once per thread.
    static SMALL_BUF: std::cell::RefCell<Vec<u8>> =
        std::cell::RefCell::new(vec![0; SMALL_FILE_BYTES as usize]);
}

/// Largest file the POSIX tier copies through a buffer and leaves to the stager's batched
/// `syncfs` without starting its writeback itself, and whose copy's CRC the stager reads on
/// the staging task rather than on a blocking thread.
pub const SMALL_FILE_BYTES: u64 = 64 << 10;

/// A listing of a tier.
#[derive(Debug, Default)]
pub struct Listing {
    /// Every servable sample.
    pub entries: Vec<CatalogEntry>,
    /// Directory modification times (POSIX), to decide later whether a saved catalog is current.
    pub dir_stamps: Vec<DirStamp>,
    /// Entries that were left out, with why (symlinks out of the source, special files, ...).
    pub skipped: Vec<(String, String)>,
}

/// A source listed straight into a catalog ([`CapacityTier::catalog`]).
#[derive(Debug)]
pub struct Catalogued {
    /// Every servable sample, with the directory stamps of a POSIX source.
    pub catalog: Catalog,
    /// Entries that were left out, with why (as [`Listing::skipped`]).
    pub skipped: Vec<(String, String)>,
}

/// What the stager asks a tier to fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleRef {
    /// Relative path (validated).
    pub path: String,
    /// Expected size in bytes.
    pub size: u64,
    /// Expected version (mtime ns or ETag); empty to skip the check.
    pub version: String,
    /// The copy will be made durable: start its writeback as it is written, so that the disk
    /// writes while the rest downloads (a cache on tmpfs, or staging without `fsync`, gains
    /// nothing from it).
    pub durable: bool,
}

/// The seam between the stager and a storage system.
#[async_trait]
pub trait CapacityTier: Send + Sync + 'static {
    /// The source URL, safe to log (never holds secrets).
    fn url(&self) -> &str;

    /// Lists every sample.
    async fn list(&self) -> Result<Listing, TierError>;

    /// Lists every sample into a [`Catalog`] (with the directory stamps), and what was left
    /// out. The default builds it from [`CapacityTier::list`]; a tier that can push each sample
    /// into a [`catalog::CatalogBuilder`] as it lists overrides it, so that a source of ten
    /// million files never exists as ten million [`CatalogEntry`] values (about 280 B each
    /// against the catalog's ~40).
    async fn catalog(&self) -> Result<Catalogued, TierError> {
        let l = self.list().await?;
        let mut catalog = Catalog::from_entries(self.url(), l.entries)?;
        catalog.set_dir_stamps(l.dir_stamps);
        Ok(Catalogued {
            catalog,
            skipped: l.skipped,
        })
    }

    /// Whether `catalog` (made earlier from this source) still describes it, cheaply.
    async fn catalog_is_current(&self, catalog: &Catalog) -> Result<bool, TierError>;

    /// What tells the source now from `catalog` (made earlier from it) at the cost of one
    /// stat or one request, never a listing; `None` when that finds no difference. A mount
    /// from a catalog file refuses a stale one with it; changes it cannot see are caught per
    /// sample at staging. The default sees none.
    async fn catalog_stamp_differs(&self, _catalog: &Catalog) -> Result<Option<String>, TierError> {
        Ok(None)
    }

    /// Copies `sample` into `dest` (an empty, writable file), pacing with `pacer`; returns the
    /// number of bytes written. Fails with [`TierError::Changed`] when the bytes are not the
    /// catalogued ones. For a [`SampleRef::durable`] copy it starts writeback of what it writes
    /// as it goes (`start_writeback`), so that making a batch durable costs the stager little.
    async fn fetch(
        &self,
        sample: &SampleRef,
        dest: Arc<std::fs::File>,
        pacer: &Pacer,
    ) -> Result<u64, TierError>;

    /// How many small samples (at most [`SMALL_FILE_BYTES`] each) the stager should hand to
    /// one [`CapacityTier::fetch_group`] call. 1, the default, means one [`CapacityTier::fetch`]
    /// per sample: a tier whose fetches wait on the network gains nothing from grouping them.
    fn group_files(&self) -> usize {
        1
    }

    /// Copies each sample of `group` into a file of its own, as [`CapacityTier::fetch`] does,
    /// and returns one result per sample, in order. Each member's file comes from its
    /// [`GroupMember::open`] just before the copy is written and closed once its
    /// [`GroupMember::finish`] has run, so that the tier holds one copy open at a time, not one
    /// per member (how many the caller keeps open beforehand is the caller's to bound). `copied` grows by one as each sample is done, so that the caller can tell a
    /// stalled group from a slow one. The default fetches the members concurrently; a tier that
    /// copies with blocking system calls does the whole group on one blocking thread (one
    /// handoff per group, not one per file) and returns each copy's CRC-32, computed from the
    /// bytes as they were written, so that the copy need not be read back.
    async fn fetch_group(
        &self,
        group: Vec<GroupMember>,
        pacer: &Pacer,
        copied: Arc<std::sync::atomic::AtomicU64>,
    ) -> Vec<Result<Copied, TierError>> {
        let fetches = group.into_iter().map(|m| {
            let copied = copied.clone();
            async move {
                let path = m.sample.path.clone();
                let r = async {
                    let dest = Arc::new((m.open)().map_err(|e| local(&path, e))?);
                    let bytes = self.fetch(&m.sample, dest.clone(), pacer).await?;
                    if bytes == m.sample.size {
                        (m.finish)(&dest).map_err(|e| local(&path, e))?;
                    }
                    Ok(Copied { bytes, crc: None })
                }
                .await;
                copied.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                r
            }
        });
        futures::future::join_all(fetches).await
    }
}

/// One sample of a [`CapacityTier::fetch_group`], with how its copy is made and finished.
pub struct GroupMember {
    /// The sample.
    pub sample: SampleRef,
    /// Gives the empty, writable file the copy is written to (makes it, or opens one made
    /// beforehand); called on the thread that writes it, right before. An error fails this
    /// member with [`TierError::Local`].
    pub open: OpenCopy,
    /// Runs on a complete copy of the catalogued size before it is closed (the stager makes
    /// it read-only). An error fails this member with [`TierError::Local`].
    pub finish: FinishCopy,
}

/// Gives the file a [`GroupMember`]'s copy is written to.
pub type OpenCopy = Box<dyn FnOnce() -> std::io::Result<std::fs::File> + Send>;

/// Finishes a [`GroupMember`]'s complete copy before it is closed.
pub type FinishCopy = Box<dyn FnOnce(&std::fs::File) -> std::io::Result<()> + Send>;

impl std::fmt::Debug for GroupMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupMember")
            .field("sample", &self.sample)
            .finish_non_exhaustive()
    }
}

/// A [`TierError::Local`] about `path`'s copy.
fn local(path: &str, source: std::io::Error) -> TierError {
    TierError::Local {
        path: path.to_string(),
        source,
    }
}

/// What one sample's copy in a [`CapacityTier::fetch_group`] came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copied {
    /// Bytes written.
    pub bytes: u64,
    /// CRC-32 of the bytes written, when the tier saw them pass; `None` when the caller must
    /// read the copy back for it.
    pub crc: Option<u32>,
}

/// Small samples a [`PosixTier`] copies per blocking call ([`CapacityTier::group_files`]).
/// Handing each file of 1-4 KiB to a blocking thread and back cost 12% of the daemon's CPU
/// while it staged 500,000 of them (two futex wakeups per file); 16 files per handoff make that
/// negligible, while 32 concurrent groups still keep the source's disk queue as deep as 32
/// single fetches did.
pub const POSIX_GROUP_FILES: usize = 16;

/// What a walk of a POSIX source found besides its files.
struct Walked {
    dir_stamps: Vec<DirStamp>,
    skipped: Vec<(String, String)>,
}

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

    fn list_blocking(&self, progress: &std::sync::atomic::AtomicU64) -> Result<Listing, TierError> {
        let mut entries = Vec::new();
        let Walked {
            dir_stamps,
            skipped,
        } = self.walk(progress, &mut |rel, md| {
            entries.push(CatalogEntry {
                path: rel.to_string(),
                size: md.len(),
                version: posix_version(md),
                label: None,
                cluster: None,
                meta: Some(Meta::from_metadata(md)),
            });
            Ok(())
        })?;
        Ok(Listing {
            entries,
            dir_stamps,
            skipped,
        })
    }

    /// The listing pushed into a catalog builder entry by entry: no `CatalogEntry` is made.
    fn catalog_blocking(
        &self,
        progress: &std::sync::atomic::AtomicU64,
    ) -> Result<Catalogued, TierError> {
        let mut b = CatalogBuilder::default();
        let build_err = |e| TierError::Catalog(CatalogError::from_build(&self.url, e));
        let Walked {
            dir_stamps,
            skipped,
        } = self.walk(progress, &mut |rel, md| {
            b.push(rel, md.len(), &posix_version(md), None, None)
                .map_err(build_err)?;
            b.push_meta(Some(Meta::from_metadata(md)));
            Ok(())
        })?;
        let mut catalog = b.finish(&self.url).map_err(build_err)?;
        catalog.set_dir_stamps(dir_stamps);
        Ok(Catalogued { catalog, skipped })
    }

    /// Walks the source depth first, calling `on_file` with the relative path and metadata of
    /// every servable file (a symlink's are its target's); returns every directory's stamp and
    /// what was left out, with why.
    fn walk(
        &self,
        progress: &std::sync::atomic::AtomicU64,
        on_file: &mut dyn FnMut(&str, &std::fs::Metadata) -> Result<(), TierError>,
    ) -> Result<Walked, TierError> {
        let mut dir_stamps = Vec::new();
        let mut skipped = Vec::new();
        let mut stack: Vec<(PathBuf, String)> = vec![(self.root.clone(), String::new())];
        while let Some((dir, rel)) = stack.pop() {
            let md = std::fs::metadata(&dir).map_err(|e| self.io_err(&rel, e))?;
            dir_stamps.push(DirStamp {
                dir: rel.clone(),
                mtime_ns: mtime_ns(&md),
                meta: Some(Meta::from_metadata(&md)),
            });
            let rd = std::fs::read_dir(&dir).map_err(|e| self.io_err(&rel, e))?;
            // One buffer for every child's relative path: most children are files, whose path
            // the callback copies where it keeps it.
            let mut child_rel = String::with_capacity(rel.len() + 64);
            for ent in rd {
                progress.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let ent = ent.map_err(|e| self.io_err(&rel, e))?;
                let name = ent.file_name();
                let Some(name) = name.to_str() else {
                    skipped.push((
                        format!("{rel}/{}", name.to_string_lossy()),
                        "name is not UTF-8".into(),
                    ));
                    continue;
                };
                child_rel.clear();
                if !rel.is_empty() {
                    child_rel.push_str(&rel);
                    child_rel.push('/');
                }
                child_rel.push_str(name);
                let path = ent.path();
                let lmd = ent.metadata().map_err(|e| self.io_err(&child_rel, e))?;
                let ft = lmd.file_type();
                if ft.is_dir() {
                    stack.push((path, child_rel.clone()));
                } else if ft.is_file() {
                    on_file(&child_rel, &lmd)?;
                } else if ft.is_symlink() {
                    match std::fs::canonicalize(&path) {
                        Ok(target) if target.starts_with(&self.root) => {
                            match std::fs::metadata(&target) {
                                Ok(md) if md.is_file() => on_file(&child_rel, &md)?,
                                Ok(_) => skipped.push((
                                    child_rel.clone(),
                                    "symlink to a directory is not followed (cycles)".into(),
                                )),
                                Err(e) => {
                                    skipped.push((child_rel.clone(), format!("symlink: {e}")))
                                }
                            }
                        }
                        Ok(target) => skipped.push((
                            child_rel.clone(),
                            format!("symlink leads outside the source (to {})", target.display()),
                        )),
                        Err(e) => {
                            skipped.push((child_rel.clone(), format!("dangling symlink: {e}")))
                        }
                    }
                } else {
                    skipped.push((child_rel.clone(), "not a regular file".to_string()));
                }
            }
        }
        Ok(Walked {
            dir_stamps,
            skipped,
        })
    }

    /// One member of a group: its file made, the sample copied and hashed, the copy finished
    /// and closed.
    fn fetch_member(&self, m: GroupMember, pacer: &Pacer) -> Result<Copied, TierError> {
        let path = &m.sample.path;
        let dest = (m.open)().map_err(|e| local(path, e))?;
        let mut crc = None;
        // `fetch_blocking` returns only a complete copy of the catalogued size (a short one is
        // `TierError::Changed`), so what reaches `finish` is complete, as the trait asks.
        let bytes = self.fetch_blocking(&m.sample, &dest, pacer, Some(&mut crc))?;
        (m.finish)(&dest).map_err(|e| local(path, e))?;
        Ok(Copied {
            bytes,
            crc: crc.map(|h| h.finalize()),
        })
    }

    /// Copies `sample` into `dest`. With `crc`, the bytes are hashed as they are written,
    /// which only a copy through a buffer can do: `crc` is then `Some` on return, and `None`
    /// when the copy took `copy_file_range` (a large file).
    fn fetch_blocking(
        &self,
        sample: &SampleRef,
        dest: &std::fs::File,
        pacer: &Pacer,
        mut crc: Option<&mut Option<crc32fast::Hasher>>,
    ) -> Result<u64, TierError> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::FileTypeExt;
        // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever. It
        // changes nothing for the regular files that pass the type check below.
        let src = self.open_source(&sample.path)?;
        let first_md = src.metadata().map_err(|e| self.io_err(&sample.path, e))?;
        let ft = first_md.file_type();
        if !ft.is_file() {
            let kind = if ft.is_fifo() {
                "a FIFO"
            } else if ft.is_socket() {
                "a socket"
            } else if ft.is_char_device() || ft.is_block_device() {
                "a device"
            } else if ft.is_dir() {
                "a directory"
            } else {
                "not a file"
            };
            return Err(TierError::NotRegular {
                url: self.url.clone(),
                path: sample.path.clone(),
                kind: kind.into(),
            });
        }
        let check = |md: &std::fs::Metadata| -> Result<(), TierError> {
            let found_v = posix_version(md);
            if md.len() != sample.size || (!sample.version.is_empty() && found_v != sample.version)
            {
                return Err(TierError::Changed {
                    url: self.url.clone(),
                    path: sample.path.clone(),
                    expected: format!("{} bytes, mtime {}", sample.size, sample.version),
                    found: format!("{} bytes, mtime {}", md.len(), found_v),
                });
            }
            Ok(())
        };
        check(&first_md)?;
        let chunk = pacer.chunk_bytes();
        let (mut off_in, mut off_out): (i64, i64) = (0, 0);
        // A small file is read and written through a buffer: `copy_file_range` sets up an
        // in-kernel splice per call, which costs more than copying a few pages.
        let small = sample.size <= SMALL_FILE_BYTES;
        let mut use_cfr = !small;
        let mut hasher = crc.as_ref().map(|_| crc32fast::Hasher::new());
        let mut buf: Vec<u8> = Vec::new();
        while (off_out as u64) < sample.size {
            let want = (sample.size - off_out as u64).min(chunk);
            pacer.consume_blocking(want);
            let n = if use_cfr {
                // SAFETY: both fds are open for the duration of the call; offsets are ours.
                let r = unsafe {
                    libc::copy_file_range(
                        src.as_raw_fd(),
                        &mut off_in,
                        dest.as_raw_fd(),
                        &mut off_out,
                        want as usize,
                        0,
                    )
                };
                if r < 0 {
                    let e = std::io::Error::last_os_error();
                    match e.raw_os_error() {
                        Some(libc::EXDEV)
                        | Some(libc::ENOSYS)
                        | Some(libc::EINVAL)
                        | Some(libc::EOPNOTSUPP) => {
                            use_cfr = false;
                            continue;
                        }
                        _ => return Err(local(&sample.path, e)),
                    }
                }
                // The bytes never pass through here: the caller reads the copy for its CRC.
                hasher = None;
                r as u64
            } else {
                use std::os::unix::fs::FileExt;
                let mut copy = |buf: &mut [u8]| -> Result<u64, TierError> {
                    let r = src
                        .read_at(buf, off_in as u64)
                        .map_err(|e| self.io_err(&sample.path, e))?;
                    dest.write_all_at(&buf[..r], off_out as u64)
                        .map_err(|e| local(&sample.path, e))?;
                    if let Some(h) = hasher.as_mut() {
                        h.update(&buf[..r]);
                    }
                    off_in += r as i64;
                    off_out += r as i64;
                    Ok(r as u64)
                };
                if want <= SMALL_FILE_BYTES {
                    // The thread's own buffer: a new one per small file cost a page fault and
                    // the zeroing of fresh pages per file, 7% of the daemon's CPU while it
                    // staged 500,000 files of 1-4 KiB (the allocator hands the top of a
                    // thread's heap back to the kernel between files).
                    SMALL_BUF.with(|b| copy(&mut b.borrow_mut()[..want as usize]))?
                } else {
                    buf.resize(want.min(1 << 20) as usize, 0);
                    copy(&mut buf)?
                }
            };
            if n == 0 {
                break; // source shrank; the check below reports it
            }
            // A small file's few pages are left to the batch's `syncfs`, which writes many
            // of them out together; one writeback request per file costs a system call and
            // an I/O of its own.
            if sample.durable && !small {
                start_writeback(dest, off_out as u64 - n, n);
            }
        }
        check(&src.metadata().map_err(|e| self.io_err(&sample.path, e))?)?;
        if off_out as u64 != sample.size {
            return Err(TierError::Changed {
                url: self.url.clone(),
                path: sample.path.clone(),
                expected: format!("{} bytes", sample.size),
                found: format!("{off_out} bytes read"),
            });
        }
        if let Some(out) = crc.as_mut() {
            **out = hasher;
        }
        Ok(off_out as u64)
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
        tokio::task::spawn_blocking(move || me.fetch_blocking(&sample, &dest, &pacer, None))
            .await
            .expect("fetch task panicked")
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

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, PosixTier) {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("src");
        std::fs::create_dir_all(src.join("a/b")).unwrap();
        std::fs::write(src.join("a/b/x.bin"), vec![7u8; 10_000]).unwrap();
        std::fs::write(src.join("top file é"), b"hello").unwrap();
        std::fs::write(src.join("empty"), b"").unwrap();
        std::fs::write(d.path().join("secret"), b"outside").unwrap();
        std::os::unix::fs::symlink(d.path().join("secret"), src.join("leak")).unwrap();
        std::os::unix::fs::symlink(src.join("top file é"), src.join("alias")).unwrap();
        let t = PosixTier::new(&src).unwrap();
        (d, t)
    }

    #[tokio::test]
    async fn a_group_copies_each_sample_and_hashes_what_it_wrote() {
        let (d, t) = setup();
        let big = vec![3u8; SMALL_FILE_BYTES as usize + 10];
        std::fs::write(d.path().join("src/big"), &big).unwrap();
        let l = t.list().await.unwrap();
        let entry = |p: &str| l.entries.iter().find(|e| e.path == p).unwrap().clone();
        let want = ["a/b/x.bin", "top file é", "empty", "big", "gone"];
        std::fs::write(d.path().join("src/gone"), b"soon gone").unwrap();
        let l2 = t.list().await.unwrap();
        let gone = l2
            .entries
            .iter()
            .find(|e| e.path == "gone")
            .unwrap()
            .clone();
        std::fs::remove_file(d.path().join("src/gone")).unwrap();
        let out = tempfile::tempdir().unwrap();
        let group: Vec<GroupMember> = want
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let e = if *p == "gone" { gone.clone() } else { entry(p) };
                let path = out.path().join(i.to_string());
                GroupMember {
                    sample: SampleRef {
                        path: e.path,
                        size: e.size,
                        version: e.version,
                        durable: false,
                    },
                    open: Box::new(move || std::fs::File::create(path)),
                    finish: Box::new(|f: &std::fs::File| {
                        use std::os::unix::fs::PermissionsExt;
                        f.set_permissions(std::fs::Permissions::from_mode(0o400))
                    }),
                }
            })
            .collect();
        let copied = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let r = t
            .fetch_group(group, &Pacer::unlimited(), copied.clone())
            .await;
        assert_eq!(copied.load(std::sync::atomic::Ordering::Relaxed), 5);
        for (i, p) in want.iter().enumerate().take(4) {
            let bytes = std::fs::read(out.path().join(i.to_string())).unwrap();
            assert_eq!(bytes, std::fs::read(d.path().join("src").join(p)).unwrap());
            let c = r[i].as_ref().unwrap();
            assert_eq!(c.bytes, bytes.len() as u64);
            // A large file is copied in the kernel: its bytes are never seen, so not hashed.
            let crc = (*p != "big").then(|| crc32fast::hash(&bytes));
            assert_eq!(c.crc, crc, "{p}");
            // Finished (made read-only) once complete.
            let md = std::fs::metadata(out.path().join(i.to_string())).unwrap();
            assert_eq!(md.mode() & 0o777, 0o400, "{p}");
        }
        // A copy that failed is not finished.
        let md = std::fs::metadata(out.path().join("4")).unwrap();
        assert_ne!(md.mode() & 0o777, 0o400);
        assert!(
            matches!(r[4], Err(TierError::NotFound { .. })),
            "{:?}",
            r[4]
        );
        assert_eq!(t.group_files(), POSIX_GROUP_FILES);
    }

    #[tokio::test]
    async fn lists_and_skips_escaping_symlinks() {
        let (_d, t) = setup();
        let l = t.list().await.unwrap();
        let mut paths: Vec<_> = l.entries.iter().map(|e| e.path.as_str()).collect();
        paths.sort();
        assert_eq!(paths, vec!["a/b/x.bin", "alias", "empty", "top file é"]);
        assert!(l
            .skipped
            .iter()
            .any(|(p, why)| p == "leak" && why.contains("outside")));
    }

    /// The catalog listed straight into a builder is the one built from the listing, entry
    /// for entry (paths, sizes, versions, owners and modes, directory stamps), and it leaves
    /// out what the listing leaves out, with the same reasons.
    #[tokio::test]
    async fn a_catalog_listed_straight_into_the_builder_is_the_one_from_the_listing() {
        let (d, t) = setup();
        let src = d.path().join("src");
        for i in 0..50 {
            std::fs::create_dir_all(src.join(format!("c{}", i % 7))).unwrap();
            std::fs::write(src.join(format!("c{}/f{i}", i % 7)), vec![1u8; i]).unwrap();
        }
        std::os::unix::fs::symlink(&src, src.join("a/loop")).unwrap();
        let l = t.list().await.unwrap();
        let mut from_list = Catalog::from_entries(t.url(), l.entries).unwrap();
        from_list.set_dir_stamps(l.dir_stamps);
        let streamed = t.catalog().await.unwrap();
        assert_eq!(streamed.catalog.len(), 54);
        assert_eq!(streamed.catalog, from_list);
        assert_eq!(streamed.skipped, l.skipped);
        assert!(streamed
            .skipped
            .iter()
            .any(|(p, why)| p == "a/loop" && why.contains("directory")));
    }

    #[tokio::test]
    async fn fetch_copies_and_verifies() {
        let (d, t) = setup();
        let l = t.list().await.unwrap();
        let e = l.entries.iter().find(|e| e.path == "a/b/x.bin").unwrap();
        let dst = d.path().join("out");
        let f = Arc::new(std::fs::File::create(&dst).unwrap());
        let s = SampleRef {
            path: e.path.clone(),
            size: e.size,
            version: e.version.clone(),
            durable: true,
        };
        assert_eq!(t.fetch(&s, f, &Pacer::unlimited()).await.unwrap(), 10_000);
        assert_eq!(std::fs::read(&dst).unwrap(), vec![7u8; 10_000]);
        // Changed file.
        std::fs::write(t.root().join("a/b/x.bin"), vec![1u8; 10]).unwrap();
        let f = Arc::new(std::fs::File::create(&dst).unwrap());
        let err = t.fetch(&s, f, &Pacer::unlimited()).await.unwrap_err();
        assert!(matches!(err, TierError::Changed { .. }), "{err}");
        // Escaping symlink refused at fetch too.
        let f = Arc::new(std::fs::File::create(&dst).unwrap());
        let s = SampleRef {
            path: "leak".into(),
            size: 7,
            version: String::new(),
            durable: true,
        };
        assert!(matches!(
            t.fetch(&s, f, &Pacer::unlimited()).await,
            Err(TierError::Escapes { .. })
        ));
    }

    /// The one-call open beneath the root refuses every way out (relative and absolute
    /// symlinks, symlinked directories), and the slow path it falls back to still serves
    /// what stays inside, an absolute symlink included.
    #[tokio::test]
    async fn fetch_follows_links_only_within_the_root() {
        let (d, t) = setup();
        let src = t.root().to_path_buf();
        std::os::unix::fs::symlink("../../secret", src.join("a/up")).unwrap();
        std::os::unix::fs::symlink(d.path(), src.join("a/outdir")).unwrap();
        std::os::unix::fs::symlink("b/x.bin", src.join("a/rel")).unwrap();
        let fetch = |path: &str, size: u64| {
            let t = t.clone();
            let dst = d.path().join("out");
            let s = SampleRef {
                path: path.into(),
                size,
                version: String::new(),
                durable: true,
            };
            async move {
                let f = Arc::new(std::fs::File::create(&dst).unwrap());
                let r = t.fetch(&s, f, &Pacer::unlimited()).await;
                (r, std::fs::read(&dst).unwrap())
            }
        };
        for escaping in ["a/up", "a/outdir/secret", "leak"] {
            let (r, got) = fetch(escaping, 7).await;
            assert!(
                matches!(r, Err(TierError::Escapes { .. })),
                "{escaping}: {r:?}"
            );
            assert!(
                got.is_empty(),
                "{escaping}: bytes from outside were written"
            );
        }
        // Relative within: the fast path. Absolute within: refused by RESOLVE_BENEATH, served
        // by the fallback.
        let (r, got) = fetch("a/rel", 10_000).await;
        assert_eq!(r.unwrap(), 10_000);
        assert_eq!(got, vec![7u8; 10_000]);
        let (r, got) = fetch("alias", 5).await;
        assert_eq!(r.unwrap(), 5);
        assert_eq!(got, b"hello");
    }

    #[tokio::test]
    async fn catalog_currency_follows_directory_changes() {
        let (_d, t) = setup();
        let l = t.list().await.unwrap();
        let mut cat = Catalog::from_entries(t.url(), l.entries).unwrap();
        cat.set_dir_stamps(l.dir_stamps);
        assert!(t.catalog_is_current(&cat).await.unwrap());
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(t.root().join("a/new"), b"x").unwrap();
        assert!(!t.catalog_is_current(&cat).await.unwrap());
        // The one-stat check sees the root only: a change below it is left to staging.
        assert_eq!(t.catalog_stamp_differs(&cat).await.unwrap(), None);
        std::fs::write(t.root().join("new"), b"x").unwrap();
        let what = t.catalog_stamp_differs(&cat).await.unwrap().unwrap();
        assert!(what.contains("modified at"), "{what}");
    }

    #[tokio::test]
    async fn a_tier_operation_without_progress_times_out() {
        let t0 = std::time::Instant::now();
        let r = watched(
            "src",
            "(listing)",
            std::time::Duration::from_secs(1),
            |_| {
                std::thread::sleep(std::time::Duration::from_secs(3));
                Ok(())
            },
        )
        .await;
        assert!(matches!(r, Err(TierError::Timeout { .. })), "{r:?}");
        assert!(t0.elapsed() < std::time::Duration::from_secs(3));
        // Steady progress keeps an operation alive past the timeout.
        let r = watched("src", "(listing)", std::time::Duration::from_secs(1), |p| {
            for _ in 0..15 {
                std::thread::sleep(std::time::Duration::from_millis(100));
                p.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(7)
        })
        .await;
        assert_eq!(r.unwrap(), 7);
    }

    #[tokio::test]
    async fn a_missing_source_root_is_an_outage_not_a_deleted_sample() {
        let (d, t) = setup();
        let f = Arc::new(std::fs::File::create(d.path().join("out")).unwrap());
        let s = SampleRef {
            path: "empty".into(),
            size: 0,
            version: String::new(),
            durable: false,
        };
        std::fs::rename(t.root(), d.path().join("away")).unwrap();
        let err = t
            .fetch(&s, f.clone(), &Pacer::unlimited())
            .await
            .unwrap_err();
        assert!(matches!(err, TierError::Unreachable { .. }), "{err}");
        std::fs::rename(d.path().join("away"), t.root()).unwrap();
        std::fs::remove_file(t.root().join("empty")).unwrap();
        let err = t.fetch(&s, f, &Pacer::unlimited()).await.unwrap_err();
        assert!(matches!(err, TierError::NotFound { .. }), "{err}");
    }

    #[test]
    fn missing_source() {
        let err = PosixTier::new(Path::new("/nonexistent/metfs")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/metfs"));
    }
}
