//! The daemon's life: when it started, whether it is shutting down, and the one signal that
//! something changed (a switch, a staging's end, a job's arrival or departure).
//!
//! Waiters (a blocking `pass_end`, the staging loop, a job waiting for its first view) watch
//! [`Lifecycle::subscribe`] and look again at whatever they wait for on every change; the
//! counter's value means nothing. A shutdown is a change too, so every waiter wakes to see it.
//!
//! Invariant: once [`Lifecycle::begin_shutdown`] ran, [`Lifecycle::is_shutting_down`] stays
//! true; the control socket answers every later request `shutting_down`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tokio::sync::{watch, Notify};

/// See the module doc.
pub struct Lifecycle {
    started: Instant,
    shutting_down: AtomicBool,
    changed: watch::Sender<u64>,
    shutdown: Notify,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            shutting_down: AtomicBool::new(false),
            changed: watch::channel(0u64).0,
            shutdown: Notify::new(),
        }
    }
}

impl Lifecycle {
    /// When the daemon started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Whether a shutdown has begun (a `shutdown` request, SIGTERM, an unmount).
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Tells every waiter that something changed.
    pub(super) fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    /// A receiver that wakes at each later change.
    pub(super) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Starts shutting down: blocked callers are released with `shutting_down`, and
    /// [`Lifecycle::shutdown_requested`] returns.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.bump();
        self.shutdown.notify_waiters();
        self.shutdown.notify_one();
    }

    /// Returns once a shutdown was asked for (at once if one was asked before any waiter).
    pub async fn shutdown_requested(&self) {
        self.shutdown.notified().await
    }
}
