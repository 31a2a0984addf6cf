//! The run's event log: `RUN_DIR/events.jsonl`, one JSON object per line, read by
//! `metfs report`.
//!
//! Each line is one [`Record`] of the protocol ([`metfs_protocol::event`]: `start`, `pass_end`,
//! `decision`, `staged`, `stage_failed`, `switch`, `stall_rf`, `tier`, the cumulative tier bytes
//! every few seconds while staging, and `job_not_resumed`, a shared mount's saved job whose place
//! a restart could not resume), with `v`, `t` (Unix seconds) and `event`. The file rotates to
//! `events.1.jsonl` at [`ROTATE_BYTES`] ([`crate::rotate`], shared with the daemon's log), so the
//! two files stay within their share of the budget's reserve (the run directory lives in the cache
//! by default). Writing is best-effort: a full disk must not stop training, so an event that cannot
//! be written is dropped whole (no half line is left), the failure is logged once per outage, and
//! every later event retries.
//!
//! Writes happen on a thread of the log's own, never on the caller's: the daemon emits events
//! while it holds its sessions lock, and a run directory whose writes stall (a full or hung
//! file system, a FIFO nobody reads) must delay no `pass_end`. [`EventLog::emit`] queues the
//! line and waits at most [`WRITE_WAIT`] for it to be written, so that in the normal case a
//! reader of the file after a reply sees the events of that reply; once a wait runs out, emits
//! stop waiting until the writer has caught up. A queue of [`QUEUE_LINES`] that is full drops
//! the new event (logged once per backlog). [`EventLog::close`] drains the queue at shutdown,
//! within a time limit.
//!
//! Invariant: lines reach the file in the order of their `emit` calls.

use metfs_fs::lock_order::{Level, OrderedMutex};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::rotate::Rotating;
use metfs_protocol::{Event, Record, Version};

/// Size at which `events.jsonl` rotates.
pub const ROTATE_BYTES: u64 = 512 << 10;

/// How long an emit waits for its line to be written. A write to a local file takes
/// microseconds; this bounds what a stalled run directory costs a reply, once.
pub const WRITE_WAIT: Duration = Duration::from_millis(100);

/// Lines queued for the writer at most (a run emits a few per pass; this is minutes of a
/// stalled disk).
pub const QUEUE_LINES: usize = 4096;

/// A line for the writer, with its sequence number.
type Line = (u64, Vec<u8>);

/// Appends events to a run directory (see the module doc).
pub struct EventLog {
    path: PathBuf,
    /// The writer's queue and the number of lines sent into it; `None` once closed.
    queue: OrderedMutex<Option<(SyncSender<Line>, u64)>>,
    shared: Arc<Progress>,
    /// Signalled by the writer thread when it has written everything and ended.
    done: OrderedMutex<Option<Receiver<()>>>,
}

/// What the writer has done, shared with emitters.
struct Progress {
    /// Lines written (or dropped by a failed write), by sequence number.
    written: Mutex<u64>,
    wrote: Condvar,
    /// A wait for the writer ran out: emitters do not wait until it catches up.
    stalled: AtomicBool,
    /// Lines sent, for the writer to know when it has caught up.
    sent: AtomicU64,
    /// Whether the queue was found full (logged once per backlog).
    full: AtomicBool,
}

/// Unix time in seconds.
pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl EventLog {
    /// An event log in `dir` (created if missing). The file is opened by the writer thread, so
    /// a run directory that blocks blocks only that thread.
    pub fn open(dir: &Path) -> Self {
        let _ = std::fs::create_dir_all(dir);
        let path = dir.join("events.jsonl");
        let rotated = dir.join("events.1.jsonl");
        Self::with_writer(path.clone(), move || {
            Rotating::open(path, rotated, ROTATE_BYTES)
        })
    }

    fn with_writer(path: PathBuf, open: impl FnOnce() -> Rotating + Send + 'static) -> Self {
        let (tx, rx) = mpsc::sync_channel::<Line>(QUEUE_LINES);
        let (done_tx, done_rx) = mpsc::channel();
        let shared = Arc::new(Progress {
            written: Mutex::new(0),
            wrote: Condvar::new(),
            stalled: AtomicBool::new(false),
            sent: AtomicU64::new(0),
            full: AtomicBool::new(false),
        });
        let progress = shared.clone();
        let shown = path.clone();
        let spawned = std::thread::Builder::new()
            .name("metfs-events".into())
            .spawn(move || {
                let mut log = open();
                let mut failing = false;
                for (seq, line) in rx {
                    if log.append(&line) {
                        if failing {
                            failing = false;
                            tracing::info!(path = %shown.display(), "the run's event log is written again");
                        }
                    } else if !failing {
                        failing = true;
                        tracing::warn!(path = %shown.display(), "cannot write the run's event log; report data is incomplete until it can");
                    }
                    *progress.written.lock().unwrap_or_else(|e| e.into_inner()) = seq;
                    progress.wrote.notify_all();
                    if seq == progress.sent.load(Ordering::Acquire) {
                        progress.stalled.store(false, Ordering::Release);
                        progress.full.store(false, Ordering::Release);
                    }
                }
                let _ = done_tx.send(());
            });
        let queue = match spawned {
            Ok(_) => Some((tx, 0)),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the event log's writer; no events are recorded");
                None
            }
        };
        Self {
            path,
            queue: OrderedMutex::new(Level::EventQueue, queue),
            shared,
            done: OrderedMutex::new(Level::EventDone, Some(done_rx)),
        }
    }

    /// Appends one event, stamped with the time and the protocol version (see the module doc
    /// for how long this may wait: [`WRITE_WAIT`] at most).
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
        let seq = {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            let Some((tx, sent)) = q.as_mut() else {
                return;
            };
            let seq = *sent + 1;
            match tx.try_send((seq, line.into_bytes())) {
                Ok(()) => {
                    *sent = seq;
                    self.shared.sent.store(seq, Ordering::Release);
                }
                Err(TrySendError::Full(_)) => {
                    if !self.shared.full.swap(true, Ordering::AcqRel) {
                        tracing::warn!(path = %self.path.display(), "the run's event log is {QUEUE_LINES} lines behind its writes; new events are dropped until it catches up");
                    }
                    return;
                }
                Err(TrySendError::Disconnected(_)) => return,
            }
            seq
        };
        if self.shared.stalled.load(Ordering::Acquire) {
            return;
        }
        if !self.wait_written(seq, WRITE_WAIT) && !self.shared.stalled.swap(true, Ordering::AcqRel)
        {
            tracing::warn!(path = %self.path.display(), "the run's event log is slow to write; events are written behind the replies until it catches up");
        }
    }

    /// Waits up to `limit` for every event emitted so far to be written; returns whether they
    /// were.
    pub fn flush(&self, limit: Duration) -> bool {
        self.wait_written(self.shared.sent.load(Ordering::Acquire), limit)
    }

    /// Waits up to `limit` for the writer to have written line `seq`; returns whether it has.
    fn wait_written(&self, seq: u64, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut written = self
            .shared
            .written
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        while *written < seq {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            written = self
                .shared
                .wrote
                .wait_timeout(written, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// Stops taking events and waits up to `limit` for the queued ones to be written. Returns
    /// whether they all were. Later events are dropped.
    pub fn close(&self, limit: Duration) -> bool {
        drop(self.queue.lock().unwrap_or_else(|e| e.into_inner()).take());
        let Some(done) = self.done.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return true;
        };
        let ok = done.recv_timeout(limit).is_ok();
        if !ok {
            tracing::warn!(path = %self.path.display(), "the run's event log was not written out within {limit:?}; its last events are lost");
        }
        ok
    }
}

impl Drop for EventLog {
    fn drop(&mut self) {
        self.close(Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metfs_protocol::event::{Start, Tier};
    use serde_json::Value;

    fn start() -> Event {
        Event::Start(Start {
            dataset_bytes: 10,
            dataset_files: 1,
            mini_epochs: 3,
            view_bytes: 5,
            rf_policy: metfs_protocol::PolicyKind::Fixed,
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
        let f2 = full.clone();
        let log = EventLog::with_writer(full, move || {
            Rotating::open(f2, "/nonexistent/x".into(), u64::MAX)
        });
        for _ in 0..3 {
            log.emit(Event::Tier(Tier { tier_bytes_read: 1 }));
        }
        assert!(log.close(Duration::from_secs(10)), "every line was tried");
    }

    /// A run directory whose writes block (here a FIFO nobody reads, whose open blocks) delays
    /// no emitter beyond one [`WRITE_WAIT`], and the queue bounds what is held.
    #[test]
    fn a_blocked_run_directory_does_not_block_emitters() {
        let d = tempfile::tempdir().unwrap();
        let fifo = d.path().join("events.jsonl");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo on a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let log = EventLog::open(d.path());
        let t = Instant::now();
        for _ in 0..(QUEUE_LINES + 100) {
            log.emit(start());
        }
        let took = t.elapsed();
        assert!(
            took < WRITE_WAIT * 20,
            "{} emits took {took:?} with the writer blocked",
            QUEUE_LINES + 100
        );
        assert!(
            !log.close(Duration::from_millis(50)),
            "nothing could be written"
        );
        // Unblock the writer so that its thread ends: open the FIFO for reading, and read it
        // to its end.
        let mut r = std::fs::File::open(&fifo).unwrap();
        let mut text = String::new();
        std::io::Read::read_to_string(&mut r, &mut text).unwrap();
        assert_eq!(
            text.lines().count(),
            QUEUE_LINES,
            "the queue's lines, in full"
        );
    }

    #[test]
    fn writes_and_rotates() {
        let d = tempfile::tempdir().unwrap();
        let log = EventLog::open(d.path());
        log.emit(start());
        assert!(log.flush(Duration::from_secs(30)));
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
        assert!(log.close(Duration::from_secs(30)));
        assert!(d.path().join("events.1.jsonl").exists());
        assert!(
            std::fs::metadata(d.path().join("events.jsonl"))
                .unwrap()
                .len()
                <= ROTATE_BYTES
        );
    }
}
