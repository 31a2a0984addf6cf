//! Pacing the tier: how fast the stager fetches a session's successor.
//!
//! With `prefetch_rate = auto` the rate is set just in time: fast enough that the successor
//! is staged a margin before the current mini-epoch is expected to end, no faster, so that a
//! job sharing the tier with others takes from it only what it needs. It is retuned four times
//! a second (`monitor_loop`), at each staging's start and at each pass end; rate changes cost
//! nothing (see the stager's `Pacer`). Before the first pass can be timed it trickles.
//!
//! Invariant: with a fixed `prefetch_rate` nothing here touches the pacer; the rate set at
//! mount stays.

use crate::config::PrefetchRate;
use crate::daemon::session::{Next, Session, Sessions};
use metfs_tier::pacer::{JustInTime, Pacer};
use std::time::Instant;

/// Staging rate of `prefetch_rate = auto` before the first pass has been timed.
pub const AUTO_TRICKLE: u64 = 256 << 10;
/// Share of the current mini-epoch's expected duration that just-in-time pacing keeps as slack:
/// staging aims to finish when 95% of it has passed, and so runs at 1/0.95 = 1.05x the average
/// rate the mini-epoch needs. With rf >= 4 that is at least a fifth of a pass to absorb a slow
/// pass before it turns into a `wait`, and staging that falls behind anyway runs at the cap.
pub const PACING_MARGIN: f64 = 0.05;

/// When session `s`'s running pass began: the later of the previous pass end (or the mount)
/// and the first lookup in its current view. A job that spends a minute loading its model
/// before its first read does not make its first pass look a minute longer.
pub(super) fn pass_start(s: &Session) -> Instant {
    match s.view().first_touch() {
        Some(t) if t > s.meter().pass_started => t,
        _ => s.meter().pass_started,
    }
}

/// The expected pass duration of session `s`: the mean of the timed passes, or before any
/// pass has ended, an estimate from how far the first pass has come (the share of the view's
/// files looked up so far), once it has run for a moment over a few percent of the files.
pub(super) fn pass_estimate(s: &Session) -> Option<f64> {
    if let Some(p) = s.meter().mean_pass() {
        return Some(p);
    }
    let view = &s.view();
    let since = view.first_touch()?.elapsed().as_secs_f64();
    let share = view.touched_files() as f64 / view.file_count().max(1) as f64;
    (since >= 0.2 && share >= 0.02).then(|| since / share)
}

/// How the staging rate follows the sessions (see the module doc).
pub(super) struct Pacing {
    /// `prefetch_rate = auto`: paced just in time; otherwise the rate set at mount stays.
    auto: bool,
    /// `prefetch_rate_max`: the most a just-in-time rate may be (`None`: unlimited).
    cap: Option<u64>,
}

impl Pacing {
    /// Pacing for the mount's `prefetch_rate` and `prefetch_rate_max`.
    pub(super) fn new(rate: PrefetchRate, cap: Option<u64>) -> Self {
        Self {
            auto: rate == PrefetchRate::Auto,
            cap,
        }
    }

    /// The just-in-time staging rate ([`JustInTime`]) for session `s`: what finishes its
    /// successor `PACING_MARGIN` of the current mini-epoch's expected duration before it is
    /// expected to end, capped. A trickle until the pass duration can be estimated; the cap
    /// (or unlimited) when staging is late.
    pub(super) fn rate_for(&self, s: &Session) -> Option<u64> {
        let cap = self.cap;
        let Next::Staging { progress, .. } = s.next() else {
            return cap;
        };
        let Some(pass_secs) = pass_estimate(s) else {
            // No deadline to pace to yet; trickle rather than burst at the cap.
            return Some(AUTO_TRICKLE);
        };
        let jit = JustInTime {
            // Bytes move into a slot a batch at a time; pacing follows them file by file.
            bytes_left: progress.bytes_to_fetch(),
            pass_secs,
            expected_rf: s.policy().expected_rf(),
            passes_done: s.passes() as f64,
            pass_elapsed: pass_start(s).elapsed().as_secs_f64(),
            margin: PACING_MARGIN,
            cap,
        };
        let rate = jit.rate();
        tracing::trace!(?jit, ?rate, "just-in-time pacing");
        rate
    }

    /// Sets `pacer`'s rate when pacing is just in time: paced to the session whose successor
    /// is being staged (the stager stages one slot at a time).
    pub(super) fn retune(&self, pacer: &Pacer, ss: &Sessions) {
        if !self.auto {
            return;
        }
        let staging = ss
            .values()
            .find(|s| s.staging_slot().is_some())
            .or_else(|| ss.values().next());
        if let Some(s) = staging {
            pacer.set_rate(self.rate_for(s));
        }
    }
}
