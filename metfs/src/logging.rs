//! Logging: `tracing` to stderr in the foreground, or to a size-capped file in the background.
//!
//! The log lives in the cache directory and so counts against the budget; the budget reserves
//! [`crate::daemon::LOG_RESERVE`] for it and the event log. The writer rotates `metfs.log` to
//! `metfs.log.1` at [`LOG_ROTATE`], so the two files never exceed the reserve. `tracing-appender` rotates by
//! time only, hence this small writer.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tracing_subscriber::EnvFilter;

/// Size at which `metfs.log` rotates to `metfs.log.1`.
pub const LOG_ROTATE: u64 = 256 << 10;

struct Capped {
    path: PathBuf,
    file: Option<std::fs::File>,
    written: u64,
    limit: u64,
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
}

#[derive(Clone)]
struct CappedWriter(Arc<Mutex<Capped>>);

impl Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut c = self.0.lock().unwrap();
        if c.written + buf.len() as u64 > c.limit {
            let old = c.path.with_extension("log.1");
            let _ = std::fs::rename(&c.path, old);
            c.open();
        }
        c.written += buf.len() as u64;
        match c.file.as_mut() {
            Some(f) => f.write(buf),
            None => Ok(buf.len()),
        }
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
            .init(),
        Some(p) => {
            let mut c = Capped {
                path: p.clone(),
                file: None,
                written: 0,
                limit: LOG_ROTATE,
            };
            c.open();
            let w = CappedWriter(Arc::new(Mutex::new(c)));
            tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_ansi(false)
                .with_writer(move || w.clone())
                .init();
            std::panic::set_hook(Box::new(|info| {
                tracing::error!("panic: {info}");
            }));
        }
    }
}
