//! Atomic replacement of a file, with the durability as an argument.
//!
//! [`write_with`] writes the new contents into a temporary file in the destination's own
//! directory (so the rename cannot cross file systems), optionally fsyncs it, renames it over
//! the destination, and optionally fsyncs the directory. A reader sees the old file or the
//! new one, never a mix or a half. The temporary file is `tempfile`'s (a unique name, created
//! 0600, deleted if anything fails before the rename), persisted with
//! [`tempfile::NamedTempFile::persist`]. A process killed mid-write can still leave one
//! behind: [`remove_leftovers`] deletes them, for callers that own the directory.
//!
//! This is a crate of its own because `metfs`, `metfs-prefetcher` and `metfs-feedback` all replace files
//! this way, and `metfs-prefetcher` and `metfs-feedback` never depend on each other. `tempfile` alone does
//! the write and the rename but not the fsyncs, nor errors that name the file.
//!
//! Not used for the stager's slot files: those are committed in batches with one `syncfs` per
//! batch and journaled (see `metfs_prefetcher::stager`), which per-file fsyncs would slow down.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use thiserror::Error;

/// How far a replacement must have reached the disk when the call returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Atomic for readers only: no fsync. After a crash the file may be old, new, or (on some
    /// file systems) empty. For files rebuilt anyway (a metrics snapshot, a registry entry).
    Atomic,
    /// The contents are fsynced before the rename: after a crash the file is the old one or
    /// the complete new one.
    File,
    /// As [`Durability::File`], and the directory is fsynced after the rename, so the new
    /// file itself survives a crash once the call returns.
    FileAndDir,
}

/// Why a replacement failed; every variant names the file.
#[derive(Debug, Error)]
pub enum DurableError {
    /// A step failed; the destination is unchanged (the temporary file is removed).
    #[error("{path}: cannot {op}: {source}")]
    Io {
        /// The destination.
        path: PathBuf,
        /// The step: `create a temporary file in its directory`, `write`, `fsync`, `rename
        /// the temporary file over`.
        op: &'static str,
        #[source]
        source: io::Error,
    },
    /// The new file is in place, but its directory could not be fsynced (some file systems
    /// refuse it), so the rename may not survive a crash.
    #[error("{path}: written, but its directory cannot be fsynced: {source}")]
    DirNotSynced {
        /// The destination.
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl DurableError {
    /// The underlying I/O error.
    pub fn io_error(&self) -> &io::Error {
        match self {
            DurableError::Io { source, .. } | DurableError::DirNotSynced { source, .. } => source,
        }
    }
}

/// The directory `path` is in (`.` for a bare name).
fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// The prefix of temporary files for `path`: `.NAME.` (hidden, and found by
/// [`remove_leftovers`]).
fn tmp_prefix(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!(".{name}.")
}

#[cfg(test)]
thread_local! {
    /// The fsyncs made on this thread, in order (tests only).
    static SYNCS: std::cell::RefCell<Vec<&'static str>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Records an fsync about to be made (tests check each durability level's).
fn synced(_what: &'static str) {
    #[cfg(test)]
    SYNCS.with(|s| s.borrow_mut().push(_what));
}

/// Replaces `path` with what `write` writes, atomically, with `durability`.
pub fn write_with(
    path: &Path,
    durability: Durability,
    write: impl FnOnce(&mut File) -> io::Result<()>,
) -> Result<(), DurableError> {
    let err = |op: &'static str| {
        move |source: io::Error| DurableError::Io {
            path: path.to_path_buf(),
            op,
            source,
        }
    };
    if path.file_name().is_none() {
        return Err(err("name a file")(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a file path",
        )));
    }
    let dir = dir_of(path);
    let mut tmp = tempfile::Builder::new()
        .prefix(&tmp_prefix(path))
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(err("create a temporary file in its directory"))?;
    write(tmp.as_file_mut()).map_err(err("write"))?;
    tmp.as_file_mut().flush().map_err(err("write"))?;
    if durability != Durability::Atomic {
        synced("file");
        tmp.as_file().sync_all().map_err(err("fsync"))?;
    }
    tmp.persist(path)
        .map_err(|e| err("rename the temporary file over")(e.error))?;
    if durability == Durability::FileAndDir {
        synced("dir");
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|source| DurableError::DirNotSynced {
                path: path.to_path_buf(),
                source,
            })?;
    }
    Ok(())
}

/// Replaces `path` with `contents`, atomically, with `durability`.
pub fn write(path: &Path, contents: &[u8], durability: Durability) -> Result<(), DurableError> {
    write_with(path, durability, |f| f.write_all(contents))
}

/// Deletes temporary files that a process killed while replacing `path` left in its
/// directory. Call only where no other process may be replacing `path` now (for example
/// under the lock of the directory's owner). Symlinks are removed, never followed.
pub fn remove_leftovers(path: &Path) -> io::Result<usize> {
    let prefix = tmp_prefix(path);
    let mut removed = 0;
    for e in std::fs::read_dir(dir_of(path))? {
        let e = e?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(&prefix) && name.ends_with(".tmp") {
            std::fs::remove_file(e.path())?;
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn every_durability_replaces_and_leaves_no_temporary() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("state.json");
        for (i, level) in [Durability::Atomic, Durability::File, Durability::FileAndDir]
            .into_iter()
            .enumerate()
        {
            let text = format!("version {i}");
            write(&p, text.as_bytes(), level).unwrap();
            assert_eq!(std::fs::read_to_string(&p).unwrap(), text, "{level:?}");
            assert_eq!(names(d.path()), ["state.json"], "{level:?}");
        }
        // The file is created private (tempfile's 0600), whatever the umask.
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn each_durability_level_makes_its_fsyncs() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("history.json");
        for (level, want) in [
            (Durability::Atomic, &[][..]),
            (Durability::File, &["file"][..]),
            (Durability::FileAndDir, &["file", "dir"][..]),
        ] {
            SYNCS.with(|s| s.borrow_mut().clear());
            write(&p, b"x", level).unwrap();
            assert_eq!(SYNCS.with(|s| s.borrow().clone()), want, "{level:?}");
        }
    }

    #[test]
    fn a_failed_write_leaves_the_old_file_and_no_temporary() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("catalog.bin");
        write(&p, b"old", Durability::File).unwrap();
        let e = write_with(&p, Durability::File, |f| {
            f.write_all(b"half")?;
            Err(io::Error::other("disk on fire"))
        })
        .unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("catalog.bin") && text.contains("cannot write"),
            "{text}"
        );
        assert!(text.contains("disk on fire"), "{text}");
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
        assert_eq!(names(d.path()), ["catalog.bin"]);
    }

    #[test]
    fn errors_name_the_path() {
        let d = tempfile::tempdir().unwrap();
        // The directory does not exist: the temporary file cannot be made.
        let p = d.path().join("missing").join("metrics.prom");
        let e = write(&p, b"x", Durability::Atomic).unwrap_err();
        assert!(
            e.to_string().contains(&p.display().to_string())
                && e.to_string().contains("temporary file"),
            "{e}"
        );
        assert_eq!(e.io_error().kind(), io::ErrorKind::NotFound);
        // A destination that is a directory: the rename fails, and nothing is left behind.
        let e = write(d.path(), b"x", Durability::File).unwrap_err();
        assert!(
            e.to_string().contains(&d.path().display().to_string()),
            "{e}"
        );
        let sub = d.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        let e = write(&sub, b"x", Durability::File).unwrap_err();
        assert!(e.to_string().contains("rename"), "{e}");
        assert_eq!(names(d.path()), ["sub"]);
    }

    #[test]
    fn leftovers_of_a_killed_writer_are_removed_and_nothing_else() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("state.json");
        write(&p, b"kept", Durability::File).unwrap();
        std::fs::write(d.path().join(".state.json.a1B2c3.tmp"), b"half").unwrap();
        std::fs::write(d.path().join(".catalog.bin.zz.tmp"), b"other").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.path().join(".state.json.x.tmp")).unwrap();
        assert_eq!(remove_leftovers(&p).unwrap(), 2);
        assert_eq!(names(d.path()), [".catalog.bin.zz.tmp", "state.json"]);
        assert!(Path::new("/etc/passwd").exists());
        assert_eq!(std::fs::read(&p).unwrap(), b"kept");
    }
}
