//! metfs's file system, the FUSE side of the daemon: what a mount shows and how reads reach
//! the slot files, without the daemon's staging, sessions or settings.
//!
//! * [`view`]: one generation's tree (a [`view::View`] over one slot), built from the catalog;
//! * [`fs`]: [`fs::FsCore`], the file system without FUSE (lookups, listings, opens and reads
//!   over the current and retired views, handles, [`fs::ViewLease`]), which tests drive as the
//!   kernel would;
//! * [`fuse`]: the thin `fuser` adapter over the core (errno mapping, the read paths, spliced
//!   replies), which implements [`kernel::KernelCache`];
//! * [`kernel`]: [`kernel::KernelCache`], the daemon's one seam to the kernel's caches, so the
//!   daemon imports nothing from `fuser`;
//! * [`read_path`]: how reads of staged files reach the kernel ([`read_path::ReadPath`]) and
//!   the path in use now ([`read_path::ActiveReadPath`]), shared by the daemon and the adapter.
//!
//! The `metfs` crate re-exports these modules at their old paths (`metfs_fs::view`, `metfs_fs::fs`,
//! `metfs_fs::fuse`).

pub mod fs;
pub mod fuse;
pub mod kernel;
pub mod lock_order;
pub mod read_path;
pub mod view;
