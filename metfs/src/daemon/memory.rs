//! Whether a dataset's catalog fits in the memory the daemon may use, checked before the
//! catalog is built.
//!
//! The daemon holds about [`BYTES_PER_FILE`] per catalogued file plus its path: the catalog,
//! the plan's order, the store's bookkeeping, the current and next views, and what the heap
//! keeps of a staging's and a listing's transient allocations: 137-146 B per file of RSS
//! measured at 1M files with `benches/scale.py` (docs/BENCHMARKS.md, "Scale"), with large
//! blocks kept out of the heap ([`keep_large_blocks_apart`]) and freed heap handed back after
//! the catalog's build and each staging ([`release_freed_heap`]); of which the structures
//! themselves, counted by `metfs/examples/memscale.rs`, are about 120 B, the views 6 B of them
//! since they share the catalog's names. The figure keeps the margin of the highest RSS
//! measured before those two (277 B). Without a check, a manifest of more files than the node
//! can hold ends in the kernel's OOM killer or an allocation abort halfway through the mount,
//! with nothing said of why. So the number of files is known first (a manifest's lines are
//! counted, a listing's entries are in hand before the catalog is built from them) and the
//! mount is refused, with the number it needs and what is available, when they do not fit.
//!
//! What is available is the least of: `--memory-limit`; `MemAvailable` (`/proc/meminfo`);
//! the memory cgroup's limit less its usage (v2 `memory.max`, v1 `memory.limit_in_bytes`), the
//! limit a Slurm job's cgroup sets; and `RLIMIT_AS` less the address space already used. Any
//! that cannot be read is left out; with none, nothing is refused.

use std::io::Read;
use std::path::Path;

use super::DaemonError;
use metfs_plan::size::format_bytes;

/// Memory the daemon holds per catalogued file, besides its path: the highest RSS per file
/// measured (module doc), with both views live and a staging just finished, rounded up.
pub const BYTES_PER_FILE: u64 = 300;

/// The memory a mount may plan for, and where the figure comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Available {
    /// Bytes.
    pub bytes: u64,
    /// What set it (`--memory-limit`, `MemAvailable`, ...).
    pub what: &'static str,
}

/// The least of what the node and the settings allow (module docs); `None` when nothing says.
pub fn available(limit: Option<u64>) -> Option<Available> {
    let mut all: Vec<Available> = Vec::new();
    let mut add = |bytes: Option<u64>, what: &'static str| {
        if let Some(bytes) = bytes {
            all.push(Available { bytes, what });
        }
    };
    add(limit, "--memory-limit");
    add(meminfo_available(), "MemAvailable");
    add(cgroup_room(), "the memory cgroup's limit less its usage");
    add(
        address_space_room(),
        "the address-space limit (RLIMIT_AS) less what is mapped",
    );
    all.into_iter().min_by_key(|a| a.bytes)
}

/// Hands the heap pages the allocator has freed but keeps back to the kernel. Called after
/// the phases that free most: the catalog's build (a listing's entries, a manifest's lines)
/// and each staging (its per-file transients, a view's build). glibc keeps freed memory in
/// its arenas for reuse, and at 1M files that was about 85 B per catalogued file of RSS
/// nothing used (docs/BENCHMARKS.md, "Scale"). It walks the heap (milliseconds at 1M files),
/// so it runs on a blocking thread where the caller is async.
pub fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages of glibc's heap to the kernel; it touches no
    // allocation in use.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Large blocks go to their own mappings, always: at or above [`LARGE_BLOCK_BYTES`] an
/// allocation is `mmap`ed and its pages go back to the kernel the moment it is freed.
///
/// glibc starts with a threshold of 128 KiB but raises it (up to 32 MiB) each time a block
/// above it is freed, so after the first view or plan is dropped the daemon's large vectors (a
/// view's nodes, a slot's members, a staging's queue: megabytes at 1M files) come from the
/// arenas. Freed there, they are reused for the small, long-lived allocations made meanwhile
/// (a staging's bookkeeping, a switch's), and the pages those pin cannot be given back even by
/// [`release_freed_heap`]. Fixing the threshold keeps the arenas to small objects: at 200,000
/// files the RSS a pass, a switch, a walk and the next staging add fell from 13-19 MB to 5-6 MB
/// (docs/BENCHMARKS.md, "Scale"). The cost is a system call per large allocation, which the
/// daemon makes a few of per staging.
pub fn keep_large_blocks_apart() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's threshold for future allocations.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES as libc::c_int);
    }
}

/// The size from which an allocation gets its own mapping ([`keep_large_blocks_apart`]):
/// above the largest I/O buffers the daemon allocates per call (a copy's 1 MiB buffer, a
/// read's reply of up to 1 MiB), which a mapping apiece would make a fault per page, and
/// below the per-file vectors that matter at scale (a view's or a slot's are 2-4 MB at 500k
/// files per view).
pub const LARGE_BLOCK_BYTES: usize = 2 << 20;

fn read_small(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

fn meminfo_available() -> Option<u64> {
    kib_field(&read_small("/proc/meminfo")?, "MemAvailable:")
}

/// A `Name:   1234 kB` field of a /proc file, in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    let kib: u64 = line[name.len()..].split_whitespace().next()?.parse().ok()?;
    Some(kib * 1024)
}

fn cgroup_room() -> Option<u64> {
    let own = read_small("/proc/self/cgroup")?;
    let number = |p: String| read_small(&p).and_then(|s| s.trim().parse::<u64>().ok());
    for line in own.lines() {
        let mut f = line.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        let (limit, usage) = if controllers.is_empty() {
            let d = format!("/sys/fs/cgroup{path}");
            (
                number(format!("{d}/memory.max")),
                number(format!("{d}/memory.current")),
            )
        } else if controllers.split(',').any(|c| c == "memory") {
            let d = format!("/sys/fs/cgroup/memory{path}");
            (
                number(format!("{d}/memory.limit_in_bytes")),
                number(format!("{d}/memory.usage_in_bytes")),
            )
        } else {
            continue;
        };
        // "max" (v2) does not parse; v1 says "no limit" with a number near 2^63.
        if let Some(limit) = limit.filter(|&l| l < 1 << 60) {
            return Some(limit.saturating_sub(usage.unwrap_or(0)));
        }
    }
    None
}

fn address_space_room() -> Option<u64> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut rl) } != 0
        || rl.rlim_cur == libc::RLIM_INFINITY
    {
        return None;
    }
    let used = kib_field(&read_small("/proc/self/status")?, "VmSize:").unwrap_or(0);
    Some(rl.rlim_cur.saturating_sub(used))
}

/// Memory a mount of `files` files whose paths take `path_bytes` needs.
pub fn needed(files: u64, path_bytes: u64) -> u64 {
    files
        .saturating_mul(BYTES_PER_FILE)
        .saturating_add(path_bytes)
}

/// Refuses a dataset of `files` files (paths of `path_bytes` in all) that does not fit in what
/// [`available`] says; `what` names the dataset (the manifest or the source).
pub fn check_fits(
    what: &str,
    files: u64,
    path_bytes: u64,
    limit: Option<u64>,
) -> Result<(), DaemonError> {
    let need = needed(files, path_bytes);
    match available(limit) {
        Some(a) if need > a.bytes => Err(DaemonError::Setup(format!(
            "{what}: its {files} files (counted by lines for a manifest) need about {} of memory for the catalog, the plan and the views (about {BYTES_PER_FILE} B per file plus its path), and {} is available ({}); mount a subset (a manifest), or give the daemon more memory",
            format_bytes(need),
            format_bytes(a.bytes),
            a.what
        ))),
        _ => Ok(()),
    }
}

/// Lines and bytes of a manifest, counted before it is parsed (one line per sample, a header
/// at most besides): a few hundred milliseconds for ten million lines.
pub fn count_manifest(path: &Path) -> std::io::Result<(u64, u64)> {
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let (mut lines, mut bytes, mut last) = (0u64, 0u64, b'\n');
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        lines += buf[..n].iter().filter(|&&b| b == b'\n').count() as u64;
        bytes += n as u64;
        last = buf[n - 1];
    }
    if last != b'\n' {
        lines += 1;
    }
    Ok((lines, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_figure_wins_and_a_dataset_over_it_is_refused_with_the_numbers() {
        let a = available(Some(1 << 20)).unwrap();
        assert_eq!((a.bytes, a.what), (1 << 20, "--memory-limit"));
        // This machine's own figure is at least found (MemAvailable always is on Linux).
        assert!(available(None).is_some());
        let e = check_fits("manifest m.csv", 10_000, 200_000, Some(1 << 20))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("manifest m.csv") && e.contains("10000 files"),
            "{e}"
        );
        assert!(e.contains("--memory-limit"), "{e}");
        check_fits("manifest m.csv", 100, 2_000, Some(1 << 20)).unwrap();
    }

    #[test]
    fn a_manifest_is_counted_by_lines() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("m.csv");
        std::fs::write(&p, "path,size\na,1\nb,2").unwrap();
        assert_eq!(count_manifest(&p).unwrap(), (3, 17));
        std::fs::write(&p, "a,1\n").unwrap();
        assert_eq!(count_manifest(&p).unwrap(), (1, 4));
        std::fs::write(&p, "").unwrap();
        assert_eq!(count_manifest(&p).unwrap(), (0, 0));
    }

    #[test]
    fn proc_fields_are_read_in_bytes() {
        let text = "MemTotal:       24000000 kB\nMemAvailable:   12345 kB\n";
        assert_eq!(kib_field(text, "MemAvailable:"), Some(12345 * 1024));
        assert_eq!(kib_field(text, "VmSize:"), None);
    }
}
