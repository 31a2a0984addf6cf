//! The data side of metfs: where samples come from and how they reach the cache.
//!
//! * [`tier`]: the [`tier::CapacityTier`] seam and its POSIX implementation; S3 lives in
//!   [`s3`]. A tier lists, and fetches one sample into a file the stager owns.
//! * [`catalog`]: every sample of the dataset, stored compactly (interned directories, one
//!   string arena, integer sample ids) so that ten million samples stay small.
//!
//!   These two, with [`pacer`] and [`size`], are the `metfs-tier` crate, re-exported here
//!   under the same paths: a tier builds and tests on its own, without the planner, the
//!   stager or HDF5.
//! * [`manifest`]: CSV / JSON-lines manifests that replace a listing of the tier.
//! * [`budget`]: how a node's cache budget splits into two slots and a metadata reserve (the
//!   planner's `slot_bytes`).
//! * [`planner`]: a pure function from (catalog, seed, epoch, node rank, node count, budget,
//!   strategy) to that epoch's mini-epochs; `planner::dependent_views` plans several jobs
//!   over overlapping datasets together (dependent sampling, paper 004).
//! * [`refcnt`]: several jobs on one store: the book (reference counts, pins, fixed shares of
//!   the budget) and its eviction order, each job's views with what to fetch, evict or wait
//!   for (`refcnt::cohort`), and a simulation of both (`refcnt::sim`).
//! * [`stager`]: copies one mini-epoch into its slot with bounded concurrency, verifies, fsyncs,
//!   renames, and journals progress so that a restart resumes.
//! * [`hdf5`]: per-sample HDF5 labels, and container files staged as mini-epochs of rows (a
//!   folder: the raw library calls in `ffi`, inspection, labels, row staging).
//! * [`transform`]: preprocessed mini-epochs: a user's program run as long-lived workers on
//!   each sample while it is staged (worker protocol, per-sample failures, identity).
//! * [`size`]: `512MiB`-style byte sizes and `SIZE/s` rates.
//! * [`digest`]: stable digests (FNV-1a, and the catalog's) for values that are stored or
//!   compared between nodes.
//!
//! This crate never depends on `metfs` or `feedback`.
//!
//! Every `unsafe` block says why it is sound in a `// SAFETY:` comment (enforced below). The
//! HDF5 ones all sit in `hdf5::ffi`; the rest are single `libc` calls on descriptors.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod hdf5;
pub mod manifest;
pub mod stager;
pub mod transform;

pub use metfs_tier as tier;
pub use metfs_tier::{catalog, pacer, s3};
