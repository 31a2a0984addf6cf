//! The kernel's caches as the daemon sees them: [`KernelCache`], the few notifications a view
//! switch sends so that the kernel forgets entries of a retired view. The trait lives with the
//! FUSE adapter that implements it (`metfs_fs::kernel`, crate `metfs-fs`) and is re-exported
//! here; tests implement it with a recorder, so the switch is tested without a mount and the
//! daemon imports nothing from `fuser`.

pub use metfs_fs::kernel::KernelCache;
