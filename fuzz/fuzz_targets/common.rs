//! A file per fuzzing process for the loaders that read a path.
//!
//! The files go in `METFS_FUZZ_SCRATCH` when set (scripts/fuzz.sh makes a directory in
//! /dev/shm per run and removes it at exit, so nothing is left behind), else /dev/shm when
//! there is one, else the temporary directory.

use std::path::PathBuf;

/// Writes `data` to this process's scratch file named `name` and returns its path.
pub fn scratch(name: &str, data: &[u8]) -> PathBuf {
    let dir = match std::env::var_os("METFS_FUZZ_SCRATCH") {
        Some(d) => PathBuf::from(d),
        None if std::path::Path::new("/dev/shm").is_dir() => PathBuf::from("/dev/shm"),
        None => std::env::temp_dir(),
    };
    let p = dir.join(format!("metfs-fuzz-{}-{name}", std::process::id()));
    std::fs::write(&p, data).expect("scratch file");
    p
}
