//! The cache directory: its checks, its privacy and lock, the places a mount needs, and the
//! saved position.

use crate::config::MountConfig;
use crate::daemon::fingerprint::Fingerprint;
use crate::daemon::state::{load_state, SavedState};
use crate::daemon::{CachePaths, DaemonError};
use std::path::{Path, PathBuf};

fn lock_cache(paths: &CachePaths) -> Result<std::fs::File, DaemonError> {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&paths.lock)
        .map_err(|e| DaemonError::Cache {
            path: paths.root.display().to_string(),
            reason: e.to_string(),
        })?;
    // SAFETY: flock on an fd we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let mut pid = String::new();
        let _ = f.read_to_string(&mut pid);
        return Err(DaemonError::CacheBusy(
            paths.root.display().to_string(),
            pid.trim().to_string(),
        ));
    }
    let _ = f.set_len(0);
    let _ = f.seek(std::io::SeekFrom::Start(0));
    let _ = write!(f, "{}", std::process::id());
    Ok(f)
}

/// Writes `state.json` atomically, fsynced before the rename: after a crash it is the old
/// position or the new one, whole.
pub(in crate::daemon) fn write_saved_state(
    path: &Path,
    saved: &SavedState,
) -> Result<(), metfs_durable::DurableError> {
    metfs_durable::write(
        path,
        &serde_json::to_vec(saved).unwrap(),
        metfs_durable::Durability::File,
    )
}

/// Makes the cache directory private (0700): staged copies of protected source files live in
/// it. A wider one is tightened with a warning; a shared one (sticky, like `/tmp` or
/// `/dev/shm`) or one of another user is refused, since tightening it would lock others out.
fn make_private(root: &Path) -> Result<(), DaemonError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let bad = |reason: String| DaemonError::Cache {
        path: root.display().to_string(),
        reason,
    };
    let md = std::fs::metadata(root).map_err(|e| bad(e.to_string()))?;
    let mode = md.mode() & 0o7777;
    if mode & 0o077 == 0 {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if mode & 0o1000 != 0 || md.uid() != me {
        return Err(bad(format!(
            "a shared directory (mode {mode:o}, owner uid {}) cannot hold the cache, which must \
             be private; name a directory of your own inside it",
            md.uid()
        )));
    }
    tracing::warn!(path = %root.display(), mode = format!("{mode:o}"), "the cache directory was accessible to other users; making it private (0700)");
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| bad(format!("cannot make it private (0700): {e}")))
}

/// Checks that the cache directory exists and is a directory.
pub fn check_cache_dir(cache: &Path) -> Result<(), DaemonError> {
    let bad = |reason: String| DaemonError::Cache {
        path: cache.display().to_string(),
        reason,
    };
    match std::fs::metadata(cache) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(bad(
            "is not a directory (give a directory on node-local storage)".into(),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(bad(
            "does not exist (create it on node-local storage first)".into(),
        )),
        Err(e) => Err(bad(e.to_string())),
    }
}

/// `p` with symlinks resolved; for a path that cannot be resolved itself (a dead mount), its
/// resolved parent joined with its name.
fn resolved(p: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(p).ok().or_else(|| {
        let parent = std::fs::canonicalize(p.parent()?).ok()?;
        Some(parent.join(p.file_name()?))
    })
}

/// Refuses a layout where the source, the cache and the mountpoint overlap (after resolving
/// symlinks): a cache inside the source would be catalogued as samples by a later listing (and
/// serve metfs's own lock file); a source inside the cache would be deleted by its cleanup; a
/// mountpoint inside either hides or loops back into what the daemon reads. Each error names
/// both paths.
pub fn check_places(cfg: &MountConfig, mountpoint: &Path) -> Result<(), DaemonError> {
    check_cache_dir(&cfg.cache)?;
    let mut places: Vec<(&str, &Path, PathBuf)> = Vec::new();
    if !cfg.source.contains("://") {
        if let Some(p) = resolved(Path::new(&cfg.source)) {
            places.push(("source", Path::new(&cfg.source), p));
        }
    }
    if let Some(p) = resolved(&cfg.cache) {
        places.push(("cache directory", &cfg.cache, p));
    }
    if let Some(p) = resolved(mountpoint) {
        places.push(("mountpoint", mountpoint, p));
    }
    for (i, (a, a_path, a_res)) in places.iter().enumerate() {
        for (b, b_path, b_res) in &places[i + 1..] {
            let (inner, inner_path, inner_res, outer, outer_path, outer_res) =
                if a_res.starts_with(b_res) {
                    (a, a_path, a_res, b, b_path, b_res)
                } else if b_res.starts_with(a_res) {
                    (b, b_path, b_res, a, a_path, a_res)
                } else {
                    continue;
                };
            let at = |given: &Path, res: &Path| {
                if given == res {
                    given.display().to_string()
                } else {
                    format!("{} (resolved: {})", given.display(), res.display())
                }
            };
            let how = if inner_res == outer_res {
                "is the same directory as"
            } else {
                "is inside"
            };
            return Err(DaemonError::Setup(format!(
                "the {inner} {} {how} the {outer} {}; give them separate directories",
                at(inner_path, inner_res),
                at(outer_path, outer_res),
            )));
        }
    }
    Ok(())
}

/// The cache's first phase: checked, made private and locked (the lock is held for the daemon's
/// life), its `slots/` and `tmp/` directories made, and the temporaries of a daemon killed while
/// it replaced its state or catalog removed.
pub(super) fn open_cache(cfg: &MountConfig) -> Result<(CachePaths, std::fs::File), DaemonError> {
    let paths = CachePaths::new(&cfg.cache);
    check_cache_dir(&paths.root)?;
    make_private(&paths.root)?;
    let lock = lock_cache(&paths)?;
    for d in [&paths.slots, &paths.tmp] {
        // A symlink here would lead slot deletions and tmp cleanup out of the cache: it is
        // removed (never its target) and a private directory made in its place.
        if std::fs::symlink_metadata(d).is_ok_and(|m| !m.is_dir()) {
            tracing::warn!(path = %d.display(), "not a directory (a symlink?) in the cache; replacing it");
            let _ = std::fs::remove_file(d);
        }
        metfs_prefetcher::stager::create_private_dir(d).map_err(|e| DaemonError::Cache {
            path: d.display().to_string(),
            reason: e.to_string(),
        })?;
    }
    // Temporaries of a daemon killed while it replaced these files (under the lock, no
    // other daemon writes them).
    for f in [&paths.state, &paths.share, &paths.catalog] {
        if let Err(e) = metfs_durable::remove_leftovers(f) {
            tracing::warn!(path = %f.display(), error = %e, "cannot remove leftover temporary files");
        }
    }
    Ok((paths, lock))
}

/// The saved position to resume, if there is one for this plan: none with `--reset`, with a
/// queue (its shards say where the job is), or under another fingerprint (said in the log); an
/// unreadable state file, or one whose position the plan does not have, is an error naming it.
pub(super) fn saved_position(
    cfg: &MountConfig,
    paths: &CachePaths,
    fingerprint: &Fingerprint,
    nm: u32,
) -> Result<Option<SavedState>, DaemonError> {
    Ok(match load_state(&paths.state, cfg.reset)? {
        Some(_) if cfg.mode.dds().is_some() => None,
        Some(s) if s.fingerprint.matches(fingerprint) => {
            s.check_plan(nm).map_err(|e| match e {
                DaemonError::CorruptState { reason, .. } => DaemonError::CorruptState {
                    path: paths.state.display().to_string(),
                    reason,
                },
                e => e,
            })?;
            Some(s)
        }
        Some(s) => {
            tracing::info!(
                epoch = s.epoch,
                mini_epoch = s.mini_epoch,
                "the dataset or the plan settings changed since the saved position; starting at epoch 0"
            );
            None
        }
        None => None,
    })
}
