//! The kernel's caches as the daemon sees them: the few notifications a view switch sends so
//! that the kernel forgets entries of a retired view. The daemon (`metfs::daemon`, which
//! re-exports this trait) speaks only to this trait; [`crate::fuse`] implements it over the
//! FUSE session's notifier, and tests implement it with a recorder, so the switch is tested
//! without a mount and the daemon imports nothing from `fuser`.

use std::io;

/// What the daemon asks of the kernel's entry and inode caches after a switch. Every call may
/// fail (the mount is gone, the kernel lacks the notification); the daemon treats a failure as
/// "nothing was dropped" and never as fatal.
pub trait KernelCache: Send + Sync {
    /// Drops the cached entry `name` of directory `parent`.
    fn inval_entry(&self, parent: u64, name: &str) -> io::Result<()>;

    /// Drops the cached attributes and data of inode `ino`.
    fn inval_inode(&self, ino: u64) -> io::Result<()>;

    /// Drops every unused cached entry of each of `inodes`, in order (children before their
    /// directories), never an entry of another inode under the same name. Kernels without
    /// this notification fail it (EINVAL or ENOSYS); the daemon then falls back to
    /// [`KernelCache::inval_entry`].
    fn prune(&self, inodes: &[u64]) -> io::Result<()>;
}
