//! A file per fuzzing process for the loaders that read a path, in /dev/shm when there is one.

use std::path::PathBuf;

/// Writes `data` to this process's scratch file named `name` and returns its path.
pub fn scratch(name: &str, data: &[u8]) -> PathBuf {
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let p = dir.join(format!("metfs-fuzz-{}-{name}", std::process::id()));
    std::fs::write(&p, data).expect("scratch file");
    p
}
