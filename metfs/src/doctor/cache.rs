//! The cache directory: usable by this user (writable, private or ours to make private, not
//! held by another daemon), on which file system, and with room for the budget.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use metfs_plan::size::format_bytes;

use super::Check;

/// Where the cache should be, in every fix that moves it.
const LOCAL: &str = "--cache on node-local storage (local NVMe, or /dev/shm)";

/// How a file system serves a node-local cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// A disk of this node.
    Local,
    /// Memory (tmpfs, ramfs): fast, and the budget comes out of RAM.
    Memory,
    /// Shared over the network: every read and write crosses it.
    Network,
    /// Some FUSE file system (often a network one: sshfs, GlusterFS, CVMFS).
    Fuse,
    /// A magic number not in the table.
    Unknown,
}

/// The name and kind of a file system from `statfs`'s `f_type` (linux/magic.h and the
/// parallel file systems' own numbers).
pub(super) fn fs_type(magic: u32) -> (&'static str, Kind) {
    use Kind::*;
    match magic {
        0xEF53 => ("ext4 (ext2/3/4)", Local),
        0x5846_5342 => ("xfs", Local),
        0x9123_683E => ("btrfs", Local),
        0x2FC1_2FC1 => ("zfs", Local),
        0xF2F5_2010 => ("f2fs", Local),
        0xCA45_1A4E => ("bcachefs", Local),
        0x794C_7630 => ("overlay", Local),
        0x0102_1994 => ("tmpfs", Memory),
        0x8584_58F6 => ("ramfs", Memory),
        0x6969 => ("nfs", Network),
        0x0BD0_0BD0 => ("lustre", Network),
        0x4750_4653 => ("gpfs", Network),
        0x1983_0326 => ("beegfs", Network),
        0x00C3_6400 => ("ceph", Network),
        0xFF53_4D42 => ("cifs", Network),
        0xFE53_4D42 => ("smb2", Network),
        0x517B => ("smb", Network),
        0x0102_1997 => ("9p", Network),
        0x5346_414F => ("afs", Network),
        0x2003_0528 => ("orangefs", Network),
        0x0116_1970 => ("gfs2", Network),
        0x7461_636F => ("ocfs2", Network),
        0x6573_5546 => ("fuse", Fuse),
        _ => ("unknown", Unknown),
    }
}

/// Why a cache directory of `mode` owned by `owner` cannot be made private by `me`, as the
/// mount's `make_private` refuses it: a shared (sticky) directory, or another user's open to
/// others.
pub(super) fn not_private(mode: u32, owner: u32, me: u32) -> Option<String> {
    let mode = mode & 0o7777;
    (mode & 0o077 != 0 && (mode & 0o1000 != 0 || owner != me)).then(|| {
        format!(
            "a shared directory (mode {mode:o}, owner uid {owner}) cannot hold the cache, which \
             must be private"
        )
    })
}

/// The directory itself: writable, private (or ours to make private), and not in use by
/// another daemon (its lock, tested with a shared lock that is dropped at once).
pub(super) fn directory(cache: &Path) -> Check {
    const NAME: &str = "cache";
    let at = cache.display();
    let md = match std::fs::metadata(cache) {
        Ok(md) => md,
        Err(e) => return Check::fail(NAME, format!("{at}: {e}"), LOCAL),
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if let Some(why) = not_private(md.permissions().mode(), md.uid(), me) {
        return Check::fail(
            NAME,
            format!("{at}: {why}"),
            format!("name a directory of your own inside it (mkdir -m 0700 {at}/metfs)"),
        );
    }
    if let Err(e) = access(cache, libc::W_OK | libc::X_OK) {
        return Check::fail(
            NAME,
            format!("{at} is not writable by uid {me} ({e})"),
            format!("{LOCAL}, in a directory the user owns"),
        );
    }
    if let Some(pid) = held_by(&cache.join("metfs.lock")) {
        return Check::fail(
            NAME,
            format!("{at} is in use by another metfs daemon (pid {pid})"),
            "`metfs umount` its mount first, or give each mount its own --cache",
        );
    }
    let private = if md.permissions().mode() & 0o077 == 0 {
        "private"
    } else {
        "made private (0700) at the mount"
    };
    Check::ok(NAME, format!("{at}: writable, {private}, not in use"))
}

fn access(p: &Path, mode: libc::c_int) -> std::io::Result<()> {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: access on a valid C string.
    if unsafe { libc::access(c.as_ptr(), mode) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The pid written in a cache's lock while a daemon holds it.
fn held_by(lock: &Path) -> Option<String> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(lock).ok()?;
    // SAFETY: flock on a descriptor we own; a lock we get is released when `f` closes.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } == 0 {
        return None;
    }
    let pid = std::fs::read_to_string(lock).unwrap_or_default();
    Some(pid.trim().to_string())
}

/// `statfs` of the cache: its type and the bytes available to this user.
fn statfs(cache: &Path) -> std::io::Result<(u32, u64)> {
    let c = std::ffi::CString::new(cache.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: a zeroed statfs is a valid out-parameter; the path is a valid C string.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let unit = if st.f_frsize > 0 {
        st.f_frsize
    } else {
        st.f_bsize
    } as u64;
    // f_type is a signed word; the magic numbers are 32-bit.
    Ok((
        (st.f_type as u64 & 0xFFFF_FFFF) as u32,
        st.f_bavail as u64 * unit,
    ))
}

/// The cache's file system: node-local is right, a network one is a warning.
pub(super) fn file_system(cache: &Path) -> Check {
    match statfs(cache) {
        Ok((magic, _)) => judge_file_system(magic),
        Err(e) => Check::warn("cache-fs", format!("statfs failed: {e}"), LOCAL),
    }
}

fn judge_file_system(magic: u32) -> Check {
    const NAME: &str = "cache-fs";
    let (name, kind) = fs_type(magic);
    match kind {
        Kind::Local => Check::ok(NAME, format!("{name}, node-local")),
        Kind::Memory => Check::ok(
            NAME,
            format!("{name}: memory, so the budget comes out of RAM"),
        ),
        Kind::Network => Check::warn(
            NAME,
            format!("{name}: a network file system; the cache should be node-local"),
            LOCAL,
        ),
        Kind::Fuse => Check::warn(
            NAME,
            format!(
                "{name}: a FUSE file system, often a network one; the cache should be node-local"
            ),
            LOCAL,
        ),
        Kind::Unknown => Check::ok(
            NAME,
            format!("file system type {magic:#x} (not in the table)"),
        ),
    }
}

/// Free space against the budget. The cache's own files (a previous run's slots, which a
/// remount resumes from) count in the budget, so they count as room too.
pub(super) fn space(cache: &Path, budget: u64) -> Check {
    match statfs(cache) {
        Ok((_, free)) => {
            let own = if free < budget { footprint(cache) } else { 0 };
            judge_space(free, own, budget)
        }
        Err(e) => Check::warn("cache-space", format!("statfs failed: {e}"), LOCAL),
    }
}

fn judge_space(free: u64, own: u64, budget: u64) -> Check {
    const NAME: &str = "cache-space";
    let b = format_bytes;
    let own_text = if own > 0 {
        format!(" (and {} of the cache's own files)", b(own))
    } else {
        String::new()
    };
    let found = format!("{} free{own_text} for a budget of {}", b(free), b(budget));
    if free.saturating_add(own) >= budget {
        return Check::ok(NAME, found);
    }
    let room = free.saturating_add(own);
    let lower = if room > 0 {
        format!("lower --budget to at most {}, ", b(room))
    } else {
        String::new()
    };
    Check::fail(
        NAME,
        format!("{found}: the budget does not fit"),
        format!("{lower}free space there, or {LOCAL} with more room"),
    )
}

/// Bytes the files under `dir` take on disk (at most a million entries are counted).
fn footprint(dir: &Path) -> u64 {
    let mut total = 0u64;
    let mut todo = vec![dir.to_path_buf()];
    let mut seen = 0usize;
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            seen += 1;
            if seen > 1_000_000 {
                return total;
            }
            let Ok(md) = e.metadata() else { continue };
            if md.is_dir() {
                todo.push(e.path());
            }
            total += md.blocks() * 512;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Status;

    #[test]
    fn file_systems_are_named_and_network_ones_warned_of() {
        assert_eq!(fs_type(0xEF53), ("ext4 (ext2/3/4)", Kind::Local));
        assert_eq!(fs_type(0x0102_1994).1, Kind::Memory);
        assert_eq!(fs_type(0x0BD0_0BD0), ("lustre", Kind::Network));
        assert_eq!(fs_type(0x6969).0, "nfs");
        assert_eq!(fs_type(0x9123_683E).0, "btrfs");
        assert_eq!(fs_type(0x794C_7630).0, "overlay");
        assert_eq!(fs_type(0x1234).1, Kind::Unknown);
        assert_eq!(judge_file_system(0x5846_5342).status, Status::Ok);
        let c = judge_file_system(0x6969);
        assert_eq!(c.status, Status::Warn);
        assert!(c.fix.unwrap().contains("node-local"));
        assert_eq!(judge_file_system(0x6573_5546).status, Status::Warn);
    }

    #[test]
    fn the_budget_must_fit_in_the_free_space_and_the_caches_own_files() {
        assert_eq!(judge_space(10 << 20, 0, 8 << 20).status, Status::Ok);
        let c = judge_space(1 << 20, 0, 2 << 20);
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.found.contains("1.00 MiB free for a budget of 2.00 MiB"),
            "{c:?}"
        );
        assert!(c
            .fix
            .unwrap()
            .contains("lower --budget to at most 1.00 MiB"));
        let c = judge_space(0, 0, 2 << 20);
        assert!(
            c.fix.as_deref().unwrap().starts_with("free space there"),
            "{c:?}"
        );
        // A remount's slots already take part of the budget.
        let c = judge_space(1 << 20, 1 << 20, 2 << 20);
        assert_eq!(c.status, Status::Ok);
        assert!(c.found.contains("of the cache's own files"), "{c:?}");
    }

    #[test]
    fn a_shared_directory_is_refused_as_the_mount_refuses_it() {
        assert!(not_private(0o1777, 0, 1000).is_some());
        assert!(not_private(0o755, 0, 1000).is_some());
        // Our own: the mount tightens it to 0700.
        assert!(not_private(0o755, 1000, 1000).is_none());
        assert!(not_private(0o700, 0, 1000).is_none());
    }
}
