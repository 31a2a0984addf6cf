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
//!
//! Modules: `error` ([`TierError`]), `seam` ([`CapacityTier`] and what it lists into and is
//! asked to fetch), `posix` ([`PosixTier`]), [`backoff`] (retry with backoff, for the S3
//! listing, the stager and the daemon), [`catalog`], [`pacer`], [`s3`].

#![deny(clippy::undocumented_unsafe_blocks)]

mod error;
mod posix;
mod seam;

pub mod backoff;
pub mod catalog;
pub mod pacer;
pub mod s3;
#[cfg(feature = "testing")]
pub mod testing;

pub use error::TierError;
pub use posix::{posix_version, PosixTier, POSIX_GROUP_FILES};
pub use seam::{
    start_writeback, CapacityTier, Catalogued, Copied, FinishCopy, GroupMember, Listing, OpenCopy,
    SampleRef, Written, SMALL_FILE_BYTES,
};
