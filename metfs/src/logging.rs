//! Logging: `tracing` to stderr in the foreground, or to a size-capped file in the background.
//!
//! The log lives in the cache directory and so counts against the budget; the budget reserves
//! [`LOG_RESERVE`] for it and the event log. The writer rotates `metfs.log` to
//! `metfs.log.1` at [`LOG_ROTATE`], so the two files never exceed the reserve. `tracing-appender` rotates by
//! time only, hence this small writer.
//!
//! Writing a log line never fails and never panics. The log shares its disk with the slots, and
//! a full disk is a condition the daemon rides out (see DESIGN.md), so a line that cannot be
//! written is dropped and counted; the next line that can be written is preceded by a note with
//! the count. `tracing-subscriber`'s own report of a failed write goes to stderr with
//! `eprintln!`, which panics when stderr (the same log file, for the background daemon) is full
//! too, and the panic hook logged again: a double panic and an abort. So the subscriber's
//! internal error reports are off, and the panic hook writes through [`CappedWriter`] directly,
//! without blocking on it and ignoring any failure.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use tracing_subscriber::EnvFilter;

/// Size at which `metfs.log` rotates to `metfs.log.1`.
pub const LOG_ROTATE: u64 = 256 << 10;

/// Bytes of the cache budget the log and the run's event log may take: each rotates once, so
/// each takes at most two files of its rotation size (1.5 MiB in all).
pub const LOG_RESERVE: u64 = 2 * LOG_ROTATE + 2 * crate::events::ROTATE_BYTES;

/// The background daemon's log file.
struct Capped {
    path: PathBuf,
    file: Option<std::fs::File>,
    written: u64,
    limit: u64,
    /// Lines dropped since the last line that was written.
    dropped: u64,
}

impl Capped {
    fn open(&mut self) {
        self.file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .ok();
        self.written = std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0);
    }

    /// Writes one whole line (or drops it), never failing.
    fn line(&mut self, buf: &[u8]) {
        if self.written + buf.len() as u64 > self.limit {
            let old = self.path.with_extension("log.1");
            let _ = std::fs::rename(&self.path, old);
            self.open();
        }
        if self.file.is_none() {
            // The file could not be opened (e.g. no inode left): try again at each line.
            self.open();
        }
        if self.dropped > 0 {
            let note = format!(
                "metfs: {} log lines dropped: the log file could not be written (disk full?)\n",
                self.dropped
            );
            if !self.append(note.as_bytes()) {
                self.dropped += 1;
                return;
            }
            self.dropped = 0;
        }
        if !self.append(buf) {
            self.dropped += 1;
        }
    }

    /// Appends `buf` whole; on a failure truncates what was partly written, so that no line is
    /// left cut in half for the next one to continue.
    fn append(&mut self, buf: &[u8]) -> bool {
        let Some(f) = self.file.as_mut() else {
            return false;
        };
        // The file's length, not `written`: the daemon's stderr appends to the same file.
        let before = f.metadata().map(|m| m.len()).ok();
        match f.write_all(buf) {
            Ok(()) => {
                self.written += buf.len() as u64;
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

/// A `Write` over the log file that never fails (see the module docs).
#[derive(Clone)]
struct CappedWriter(Arc<Mutex<Capped>>);

impl CappedWriter {
    fn lock(&self) -> MutexGuard<'_, Capped> {
        // A panic while holding the lock cannot leave the writer inconsistent in a way that
        // matters more than losing the log.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.lock().line(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Rotates an existing log that is already over the cap (before a background start appends).
pub fn rotate(path: &Path) {
    if std::fs::metadata(path).map(|m| m.len()).unwrap_or(0) > LOG_ROTATE {
        let _ = std::fs::rename(path, path.with_extension("log.1"));
    }
}

/// Installs the subscriber: `RUST_LOG` filters (default `info`); a file when given.
pub fn init(file: Option<&PathBuf>) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    match file {
        None => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .log_internal_errors(false)
            .init(),
        Some(p) => {
            let mut c = Capped {
                path: p.clone(),
                file: None,
                written: 0,
                limit: LOG_ROTATE,
                dropped: 0,
            };
            c.open();
            let w = CappedWriter(Arc::new(Mutex::new(c)));
            let hook_writer = w.clone();
            tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_ansi(false)
                .log_internal_errors(false)
                .with_writer(move || w.clone())
                .init();
            std::panic::set_hook(Box::new(move |info| {
                // Not through `tracing` (whose writer may be the cause), and without waiting
                // for a lock that the panicking thread may hold.
                let msg = format!("metfs: panic: {info}\n");
                if let Ok(mut c) = hook_writer.0.try_lock() {
                    c.line(msg.as_bytes());
                }
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/dev/full` fails every write with ENOSPC: the writer reports success, counts the lost
    /// lines, and never panics.
    #[test]
    fn a_full_disk_drops_lines_and_counts_them() {
        let mut c = Capped {
            path: PathBuf::from("/dev/full"),
            file: None,
            written: 0,
            limit: u64::MAX,
            dropped: 0,
        };
        c.open();
        assert!(c.file.is_some());
        let mut w = CappedWriter(Arc::new(Mutex::new(c)));
        for _ in 0..3 {
            assert_eq!(w.write(b"a line\n").unwrap(), 7);
        }
        assert_eq!(w.lock().dropped, 3);
        // Space comes back: the note comes first, then the line.
        let dir = std::env::temp_dir().join(format!("metfs-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("metfs.log");
        {
            let mut c = w.lock();
            c.path = path.clone();
            c.open();
        }
        w.write_all(b"back\n").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text,
            "metfs: 3 log lines dropped: the log file could not be written (disk full?)\nback\n"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
