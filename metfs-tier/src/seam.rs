//! The seam between the stager and a storage system: [`CapacityTier`], what a tier lists
//! into ([`Listing`], [`Catalogued`]), what it is asked to fetch ([`SampleRef`],
//! [`GroupMember`]) and what a copy came to ([`Copied`]); and [`start_writeback`], which
//! tiers call as they write.

use std::sync::Arc;

use async_trait::async_trait;

use crate::catalog::{Catalog, CatalogEntry, DirStamp};
use crate::error::local;
use crate::pacer::Pacer;
use crate::TierError;

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

/// How much of a copy is known to be written: every byte before [`Written::get`] is in the
/// destination. A tier raises it as a copy's prefix grows ([`CapacityTier::fetch_from`]); one
/// that writes pieces in parallel raises it as the pieces before it are done, so it may trail
/// what the file holds, never lead it. A caller that keeps an interrupted copy continues it
/// from here, not from the file's length (which a later piece may have extended past a hole).
#[derive(Debug, Default)]
pub struct Written(std::sync::atomic::AtomicU64);

impl Written {
    /// A copy whose first `from` bytes are in place.
    pub fn new(from: u64) -> Self {
        Self(std::sync::atomic::AtomicU64::new(from))
    }

    /// Records that the first `to` bytes are written (never lowers it).
    pub fn raise(&self, to: u64) {
        self.0.fetch_max(to, std::sync::atomic::Ordering::Release);
    }

    /// How many leading bytes are written.
    pub fn get(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }
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
    /// into a [`CatalogBuilder`](crate::catalog::CatalogBuilder) as it lists overrides it, so that a source of ten
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

    /// Continues a copy of `sample` whose first `from` bytes `dest` already holds (0: none of
    /// it): copies bytes `from..size` into `dest` at their own offsets, pacing with `pacer`,
    /// and raises `written` as the copy's prefix grows, so that a copy cut short again (an
    /// error, the fetch dropped, the process killed) is continued from there. The bytes may be
    /// written in any order: `written` says how far they are all in place. Returns
    /// `Some(bytes written)` (`size - from`), checked as [`CapacityTier::fetch`] checks a whole
    /// copy (a sample changed since cataloguing is [`TierError::Changed`]); `None`, having
    /// written nothing, where the tier cannot serve a range or pin the version it continues
    /// (the caller then fetches the whole sample). The default is `None`. Whether `dest`'s
    /// prefix is of the catalogued version is the caller's to know.
    async fn fetch_from(
        &self,
        _sample: &SampleRef,
        _dest: Arc<std::fs::File>,
        _from: u64,
        _pacer: &Pacer,
        _written: Arc<Written>,
    ) -> Result<Option<u64>, TierError> {
        Ok(None)
    }

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

/// What one sample's copy in a [`CapacityTier::fetch_group`] came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Copied {
    /// Bytes written.
    pub bytes: u64,
    /// CRC-32 of the bytes written, when the tier saw them pass; `None` when the caller must
    /// read the copy back for it.
    pub crc: Option<u32>,
}
