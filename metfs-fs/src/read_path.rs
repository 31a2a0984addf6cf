//! The read path of a mount: the setting (`read_path`), what `auto` resolves to, and the path
//! in use now, which the FUSE adapter may have to fall back from. The setting's flag, key and
//! variable are declared with the other settings in `metfs::config` (with the `clap` feature,
//! [`ReadPath`] is a flag value); this module holds what the adapter and the daemon share.

use serde::{Deserialize, Serialize};

/// How reads of staged files reach the kernel (see [`crate::fuse`] for the measured
/// trade-offs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum ReadPath {
    /// `cached` for samples under [`CACHED_MAX_MEAN_SAMPLE`] on average when a slot fits in
    /// half of the node's memory (repeated passes are then served from the page cache with no
    /// round trip per file), `passthrough` otherwise: large files amortize the round trip of
    /// each open, and the kernel reads them from the slot file's page cache or the NVMe
    /// without a copy through the daemon (measured in `docs/BENCHMARKS.md`).
    #[default]
    Auto,
    /// The kernel sends no `open` and caches file pages for the view's life: after the first
    /// read of a file, reads never reach the daemon. Cache misses are read by the daemon, which
    /// drops the slot file's own pages afterwards so that memory holds each byte once.
    Cached,
    /// Kernel FUSE passthrough (CAP_SYS_ADMIN, kernel >= 6.9): the kernel reads the slot file
    /// itself; each `open` is one round trip to the daemon. Falls back to `pread` if the kernel
    /// refuses.
    Passthrough,
    /// Every `open` and every cache miss goes through the daemon, which `pread`s the slot file;
    /// the page cache is kept across opens.
    Pread,
}

/// Largest mean sample size for which `auto` picks the cached read path. Measured here: at
/// 128 KiB the cached path reads warm files 3x faster than passthrough and cold ones within
/// 10%; at 4 MiB passthrough is 5-25% faster both cold and warm (the kernel copies from the
/// slot file's large folios, and one round trip per open is amortized over 4 MiB).
pub const CACHED_MAX_MEAN_SAMPLE: u64 = 1 << 20;

/// Whether this process has CAP_SYS_ADMIN, which FUSE passthrough needs (bit 21 of the
/// effective capabilities in /proc/self/status).
fn may_passthrough() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << 21) != 0)
}

impl ReadPath {
    /// The path `auto` stands for, given a slot's size, the mean sample size and the node's
    /// memory (bytes).
    pub fn resolve(self, slot_bytes: u64, mean_sample: u64, mem_total: Option<u64>) -> ReadPath {
        match self {
            ReadPath::Auto => match mem_total {
                Some(m) if slot_bytes <= m / 2 && mean_sample < CACHED_MAX_MEAN_SAMPLE => {
                    ReadPath::Cached
                }
                // Without CAP_SYS_ADMIN the kernel refuses passthrough at the first open:
                // an ordinary user gets pread straight away (and `status` says so).
                _ if may_passthrough() => ReadPath::Passthrough,
                _ => ReadPath::Pread,
            },
            other => other,
        }
    }

    /// The name used in logs, status and flags.
    pub fn name(self) -> &'static str {
        match self {
            ReadPath::Auto => "auto",
            ReadPath::Cached => "cached",
            ReadPath::Passthrough => "passthrough",
            ReadPath::Pread => "pread",
        }
    }
}

/// The read path a mount uses now, shared between the daemon (which reports it) and the FUSE
/// adapter (which may have to fall back): it starts as the resolved path and only ever falls
/// back to [`ReadPath::Pread`], when the kernel turns out not to support the chosen one.
#[derive(Debug)]
pub struct ActiveReadPath(std::sync::atomic::AtomicU8);

impl ActiveReadPath {
    /// The path chosen at mount (resolved, never `auto`).
    pub fn new(path: ReadPath) -> Self {
        Self(std::sync::atomic::AtomicU8::new(path as u8))
    }

    /// The path in use now.
    pub fn get(&self) -> ReadPath {
        match self.0.load(std::sync::atomic::Ordering::Relaxed) {
            x if x == ReadPath::Cached as u8 => ReadPath::Cached,
            x if x == ReadPath::Passthrough as u8 => ReadPath::Passthrough,
            x if x == ReadPath::Auto as u8 => ReadPath::Auto,
            _ => ReadPath::Pread,
        }
    }

    /// Falls back to `pread`; true if this call changed the path (so that only one caller
    /// logs it).
    pub fn fall_back(&self) -> bool {
        self.0
            .swap(ReadPath::Pread as u8, std::sync::atomic::Ordering::Relaxed)
            != ReadPath::Pread as u8
    }
}

/// The node's memory in bytes (`MemTotal` of `/proc/meminfo`).
pub fn mem_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn active_read_path_only_falls_back_to_pread() {
        for p in [ReadPath::Cached, ReadPath::Passthrough, ReadPath::Pread] {
            let a = ActiveReadPath::new(p);
            assert_eq!(a.get(), p);
            assert_eq!(a.fall_back(), p != ReadPath::Pread);
            assert_eq!(a.get(), ReadPath::Pread);
            assert!(!a.fall_back(), "a second fall-back changes nothing");
        }
    }

    #[test]
    fn auto_read_path_follows_memory_and_sample_size() {
        let gib = 1u64 << 30;
        let auto = ReadPath::Auto;
        assert_eq!(
            auto.resolve(4 * gib, 128 << 10, Some(16 * gib)),
            ReadPath::Cached
        );
        // Otherwise passthrough where the kernel allows it (CAP_SYS_ADMIN), else pread.
        let direct = if may_passthrough() {
            ReadPath::Passthrough
        } else {
            ReadPath::Pread
        };
        // A slot larger than half the memory: every pass reads the NVMe.
        assert_eq!(auto.resolve(9 * gib, 128 << 10, Some(16 * gib)), direct);
        // Large samples.
        assert_eq!(auto.resolve(4 * gib, 4 << 20, Some(16 * gib)), direct);
        // Unknown memory: the path that never doubles memory use.
        assert_eq!(auto.resolve(1, 1, None), direct);
        assert_eq!(
            ReadPath::Pread.resolve(1, 1, Some(16 * gib)),
            ReadPath::Pread
        );
    }
}
