//! The staging side of metfs: how samples reach a slot of the cache.
//!
//! * [`stager`]: copies one mini-epoch into its slot with bounded concurrency, verifies,
//!   fsyncs, renames, and journals progress so that a restart resumes; a slot's journal
//!   (`SlotJournal`, its one reader and writer), its seal, the naming of slots, reuse by hard
//!   link.
//! * [`transform`]: preprocessed mini-epochs: a user's program run as long-lived workers on
//!   each sample while it is staged (worker protocol, per-sample failures, identity).
//! * [`hdf5`]: per-sample HDF5 labels, and container files staged as mini-epochs of rows (a
//!   folder: the raw library calls in `ffi`, inspection, labels, row staging).
//! * [`manifest`]: CSV / JSON-lines manifests that replace a listing of the tier.
//!
//! What a slot holds is planned by `metfs-plan` (pure); the samples come from a `metfs-tier`
//! capacity tier and are described by its catalog. This crate never depends on `metfs` or
//! `metfs-feedback`.
//!
//! **Invariant:** a copy is part of a slot only once complete, verified, durable and
//! journaled, and a file of a slot that may be read (a complete one) is never rewritten in
//! place: copies arrive there by rename or hard link and leave by unlink.
//!
//! Every `unsafe` block says why it is sound in a `// SAFETY:` comment (enforced below). The
//! HDF5 ones all sit in `hdf5::ffi`; the rest are single `libc` calls on descriptors.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod hdf5;
pub mod manifest;
pub mod stager;
pub mod transform;
