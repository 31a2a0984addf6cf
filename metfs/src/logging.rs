//! Logging: `tracing` to stderr in the foreground, or to a size-capped file in the background.
//!
//! The log lives in the cache directory and so counts against the budget; the budget reserves
//! [`LOG_RESERVE`] for it and the event log. The writer rotates `metfs.log` to
//! `metfs.log.1` at [`LOG_ROTATE`] (through [`crate::rotate`], shared with the event log), so
//! the two files never exceed the reserve.
//!
//! Writing a log line never fails and never panics. The log shares its disk with the slots, and
//! a full disk is a condition the daemon rides out (ARCHITECTURE.md, Faults), so a line that cannot be
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

use crate::rotate::Rotating;

/// Size at which `metfs.log` rotates to `metfs.log.1`.
pub const LOG_ROTATE: u64 = 256 << 10;

/// Bytes of the cache budget the log and the run's event log may take: each rotates once, so
/// each takes at most two files of its rotation size (1.5 MiB in all).
pub const LOG_RESERVE: u64 = 2 * LOG_ROTATE + 2 * crate::events::ROTATE_BYTES;

/// The background daemon's log file, and the lines it lost.
struct Capped {
    log: Rotating,
    /// Lines dropped since the last line that was written.
    dropped: u64,
}

impl Capped {
    fn open(path: &Path) -> Self {
        Self {
            log: Rotating::open(path.to_path_buf(), rotated(path), LOG_ROTATE),
            dropped: 0,
        }
    }

    /// Writes one whole line (or drops it), never failing.
    fn line(&mut self, buf: &[u8]) {
        if self.dropped > 0 {
            let note = format!(
                "metfs: {} log lines dropped: the log file could not be written (disk full?)\n",
                self.dropped
            );
            if !self.log.append(note.as_bytes()) {
                self.dropped += 1;
                return;
            }
            self.dropped = 0;
        }
        if !self.log.append(buf) {
            self.dropped += 1;
        }
    }
}

/// Where `metfs.log` rotates to.
fn rotated(path: &Path) -> PathBuf {
    path.with_extension("log.1")
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
    Rotating::rotate_if_over(path, &rotated(path), LOG_ROTATE);
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
            let w = CappedWriter(Arc::new(Mutex::new(Capped::open(p))));
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
        let mut c = Capped::open(Path::new("/dev/full"));
        c.log = Rotating::open("/dev/full".into(), "/nonexistent/x".into(), u64::MAX);
        assert!(c.log.is_open());
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
            c.log = Rotating::open(path.clone(), rotated(&path), u64::MAX);
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
