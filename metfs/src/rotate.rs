//! A size-capped, line-whole log file: the one rotator under the daemon's log (`logging`) and
//! the run's event log (`events`).
//!
//! The file rotates to one older file (`metfs.log.1`, `events.1.jsonl`) before a line would
//! take it past its cap, so the two files stay within the share of the budget's reserve
//! counted for them (`logging::LOG_RESERVE`). A line is appended whole or not at all: a write
//! that fails part-way (a full disk) is cut back to where it began, so no reader meets half a
//! line. Nothing here fails or panics: a file that cannot be opened is retried at the next
//! line, and the caller only learns whether its line was written. The size is read from the
//! file, not only counted, since the background daemon's stderr appends to the same log.
//!
//! Written by hand because those rules are the point: `tracing-appender` rotates by time only,
//! and the size-based rotators on crates.io (`file-rotate`, `rolling-file`) pass write errors
//! through to the caller and leave a partly written line in place, so meeting the rules with
//! one would mean wrapping it in what this module already is.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// A log file capped at `limit` bytes with one rotated predecessor.
#[derive(Debug)]
pub struct Rotating {
    path: PathBuf,
    rotated: PathBuf,
    limit: u64,
    file: Option<File>,
    len: u64,
}

impl Rotating {
    /// The log at `path`, rotating to `rotated` at `limit` bytes; opened (or created) now if
    /// it can be, else at the first line.
    pub fn open(path: PathBuf, rotated: PathBuf, limit: u64) -> Self {
        let mut r = Self {
            path,
            rotated,
            limit,
            file: None,
            len: 0,
        };
        r.reopen();
        r
    }

    /// The log's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file is open.
    pub fn is_open(&self) -> bool {
        self.file.is_some()
    }

    fn reopen(&mut self) {
        self.file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .ok();
        self.len = std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0);
    }

    /// Rotates the log if it is over its cap already (before another writer appends to it).
    pub fn rotate_if_over(path: &Path, rotated: &Path, limit: u64) {
        if std::fs::metadata(path).map(|m| m.len()).unwrap_or(0) > limit {
            let _ = std::fs::rename(path, rotated);
        }
    }

    /// Appends `line` whole, rotating first if it would pass the cap; returns whether it was
    /// written. Never fails otherwise.
    pub fn append(&mut self, line: &[u8]) -> bool {
        if self.len + line.len() as u64 > self.limit {
            let _ = std::fs::rename(&self.path, &self.rotated);
            self.reopen();
        }
        if self.file.is_none() {
            // It could not be opened (no inode left, directory gone): retried at every line.
            self.reopen();
        }
        let Some(f) = self.file.as_mut() else {
            return false;
        };
        // The file's length, not `len`: another writer (stderr) may append to the same file.
        let before = f.metadata().map(|m| m.len()).ok();
        match f.write_all(line) {
            Ok(()) => {
                self.len = before.unwrap_or(self.len) + line.len() as u64;
                true
            }
            Err(_) => {
                if let Some(len) = before {
                    let _ = f.set_len(len);
                }
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates_before_the_cap_and_keeps_lines_whole() {
        let d = tempfile::tempdir().unwrap();
        let (p, old) = (d.path().join("a.log"), d.path().join("a.log.1"));
        let mut r = Rotating::open(p.clone(), old.clone(), 100);
        for i in 0..30 {
            assert!(r.append(format!("line {i:02}\n").as_bytes()));
        }
        for f in [&p, &old] {
            let text = std::fs::read_to_string(f).unwrap();
            assert!(text.len() <= 100, "{}: {} bytes", f.display(), text.len());
            assert!(text.lines().all(|l| l.len() == 7), "{text:?}");
        }
        let last = std::fs::read_to_string(&p).unwrap();
        assert!(last.ends_with("line 29\n"), "{last:?}");
    }

    /// Another writer's appends (the daemon's stderr) count toward the cap.
    #[test]
    fn counts_what_others_append() {
        let d = tempfile::tempdir().unwrap();
        let (p, old) = (d.path().join("a.log"), d.path().join("a.log.1"));
        let mut r = Rotating::open(p.clone(), old.clone(), 100);
        assert!(r.append(b"mine\n"));
        let mut other = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        other.write_all(&[b'x'; 90]).unwrap();
        assert!(r.append(b"mine\n"));
        assert!(r.append(b"mine\n"));
        assert!(std::fs::metadata(&p).unwrap().len() <= 100);
        assert!(
            old.exists(),
            "rotated once the other writer's bytes were counted"
        );
    }

    /// `/dev/full` fails every write: nothing is written, nothing fails, nothing panics.
    #[test]
    fn a_full_disk_writes_nothing_and_never_fails() {
        let mut r = Rotating::open("/dev/full".into(), "/nonexistent/x".into(), u64::MAX);
        assert!(r.is_open());
        assert!(!r.append(b"a line\n"));
        // A directory that cannot hold the file: retried at every line, never an error.
        let mut r = Rotating::open("/nonexistent/a.log".into(), "/nonexistent/a.1".into(), 10);
        assert!(!r.is_open());
        assert!(!r.append(b"0123456789abc\n"));
    }
}
