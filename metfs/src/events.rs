//! The run's event log: `RUN_DIR/events.jsonl`, one JSON object per line, read by
//! `metfs report`.
//!
//! Each line is one [`Record`] of the protocol ([`crate::protocol::event`]: `start`, `pass_end`,
//! `decision`, `staged`, `stage_failed`, `switch`, and `tier`, the cumulative tier bytes every few
//! seconds while staging), with `v`, `t` (Unix seconds) and `event`. The file rotates to
//! `events.1.jsonl` at [`ROTATE_BYTES`] ([`crate::rotate`], shared with the daemon's log), so the
//! two files stay within their share of the budget's reserve (the run directory lives in the cache
//! by default). Writing is best-effort: a full disk must not stop training, so an event that cannot
//! be written is dropped whole (no half line is left), the failure is logged once per outage, and
//! every later event retries.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::protocol::{Event, Record, Version};
use crate::rotate::Rotating;

/// Size at which `events.jsonl` rotates.
pub const ROTATE_BYTES: u64 = 512 << 10;

/// Appends events to a run directory.
pub struct EventLog {
    path: PathBuf,
    /// The file, and whether writing it is failing now (logged once per outage).
    inner: Mutex<(Rotating, bool)>,
}

/// Unix time in seconds.
pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl EventLog {
    /// An event log in `dir` (created if missing).
    pub fn open(dir: &Path) -> Self {
        let _ = std::fs::create_dir_all(dir);
        let path = dir.join("events.jsonl");
        let log = Rotating::open(path.clone(), dir.join("events.1.jsonl"), ROTATE_BYTES);
        Self {
            path,
            inner: Mutex::new((log, false)),
        }
    }

    /// Appends one event, stamped with the time and the protocol version.
    pub fn emit(&self, event: Event) {
        let record = Record {
            v: Version,
            t: now(),
            event,
        };
        let Ok(mut line) = serde_json::to_string(&record) else {
            return;
        };
        line.push('\n');
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let ok = g.0.append(line.as_bytes());
        if ok {
            if g.1 {
                g.1 = false;
                tracing::info!(path = %self.path.display(), "the run's event log is written again");
            }
        } else if !g.1 {
            g.1 = true;
            tracing::warn!(path = %self.path.display(), "cannot write the run's event log; report data is incomplete until it can");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::event::{Start, Tier};
    use serde_json::Value;

    fn start() -> Event {
        Event::Start(Start {
            dataset_bytes: 10,
            dataset_files: 1,
            mini_epochs: 3,
            view_bytes: 5,
            rf_policy: "fixed".into(),
            budget_bytes: 100,
            node_rank: 0,
            nodes: 1,
            epoch: 0,
            mini_epoch: 0,
        })
    }

    /// `/dev/full` fails every write: events are dropped, never half-written, never fatal.
    #[test]
    fn a_full_disk_drops_events() {
        let full = std::path::PathBuf::from("/dev/full");
        let log = EventLog {
            path: full.clone(),
            inner: Mutex::new((
                Rotating::open(full, "/nonexistent/x".into(), u64::MAX),
                false,
            )),
        };
        for _ in 0..3 {
            log.emit(Event::Tier(Tier { tier_bytes_read: 1 }));
        }
        assert!(log.inner.lock().unwrap().1, "the failure is noted");
    }

    #[test]
    fn writes_and_rotates() {
        let d = tempfile::tempdir().unwrap();
        let log = EventLog::open(d.path());
        log.emit(start());
        let text = std::fs::read_to_string(d.path().join("events.jsonl")).unwrap();
        let v: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(v["event"], "start");
        assert_eq!(v["mini_epochs"], 3);
        assert_eq!(v["v"], 1);
        let r: Record = serde_json::from_value(v).unwrap();
        assert_eq!(r.event, start());
        for _ in 0..5000 {
            log.emit(start());
        }
        assert!(d.path().join("events.1.jsonl").exists());
        assert!(
            std::fs::metadata(d.path().join("events.jsonl"))
                .unwrap()
                .len()
                <= ROTATE_BYTES
        );
    }
}
