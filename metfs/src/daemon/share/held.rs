//! A frozen reader's cap (`share.held_open_cap`): how much of a job's share its readers may
//! hold in retired views.
//!
//! A reader that keeps files of a job's old views open (a process stopped in a debugger, a
//! loader worker that never closes) pins their slots: on a shared mount those bytes come out
//! of every job's room, and the joins and stagings of the others wait for them. So once a
//! second the monitor sums, per job, the bytes of its retired views a reader still holds, and
//! past the cap takes the oldest back ([`metfs_fs::fs::FsCore::revoke`]) until the job holds
//! at most the cap, the newest kept: their reads answer EIO from then on, and their slots go as
//! drained slots go. Each time, the job is reported: a `held_open_capped` event and a warning
//! in the log, both naming the holding processes where the kernel named them at their opens
//! (not on the cached path, which has no opens), and its `status` (`held_open_bytes`,
//! `revoked_bytes`).
//!
//! # Invariants
//!
//! * A job holds at most its cap of retired views within a second of passing it, but for what
//!   the daemon cannot take back: a view read through passthrough opens (the kernel reads the
//!   slot file itself) or leased direct paths (the reader opened the files). Those are
//!   reported as `unrevocable_bytes` and keep their bytes.
//! * Views are taken back oldest first: the newest views a reader holds keep their bytes.
//! * Only retired views are ever taken back, never a job's current view.

use crate::daemon::share::Shared;
use crate::daemon::Daemon;
use metfs_protocol::event::{self, Event};

/// What a job's readers hold of its retired views, for `status`.
#[derive(Debug, Default, Clone, Copy)]
pub(in crate::daemon) struct HeldOpen {
    /// Bytes of its retired views a reader still held at the last look (after any taking
    /// back).
    pub(in crate::daemon) bytes: u64,
    /// Bytes of its views taken back so far.
    pub(in crate::daemon) revoked: u64,
    /// Bytes past the cap the daemon could not take back at the last look: reported when
    /// they change, not at every look.
    unrevocable: u64,
}

impl Shared {
    /// The most bytes of retired views one job's readers may hold: `share.held_open_cap` of
    /// its share (two views).
    pub(super) fn held_open_cap(&self) -> u64 {
        (self.cfg.held_open_cap * (2 * self.view_bytes) as f64) as u64
    }

    /// Applies the cap to every job (module docs); run by the monitor.
    pub(in crate::daemon) fn cap_held_open(&self, d: &Daemon) {
        let fs = d.surface.fs();
        let cap = self.held_open_cap();
        let names: Vec<String> = self.jobs.lock().unwrap().keys().cloned().collect();
        for name in names {
            let views = fs.held_views_of(&name);
            let before: u64 = views.iter().map(|v| v.bytes()).sum();
            let mut held = before;
            let (mut generations, mut revoked, mut unrevocable) = (Vec::new(), 0, 0);
            let mut pids = Vec::new();
            for v in &views {
                if held <= cap {
                    break;
                }
                pids.extend(fs.holders(v.generation));
                if fs.revoke(v.generation) {
                    held -= v.bytes();
                    revoked += v.bytes();
                    generations.push(v.generation);
                } else {
                    unrevocable += v.bytes();
                }
            }
            let told = match self.jobs.lock().unwrap().get_mut(&name) {
                Some(m) => {
                    let h = &mut m.held_open;
                    h.bytes = held;
                    h.revoked += revoked;
                    std::mem::replace(&mut h.unrevocable, unrevocable) == unrevocable
                }
                None => continue,
            };
            if generations.is_empty() && (unrevocable == 0 || told) {
                continue;
            }
            pids.sort_unstable();
            pids.dedup();
            tracing::warn!(
                job = %name,
                pids = ?pids,
                held_bytes = before,
                cap_bytes = cap,
                views = ?generations,
                revoked_bytes = revoked,
                unrevocable_bytes = unrevocable,
                "a reader of the job held more of its retired views than share.held_open_cap; the oldest were taken back (their reads answer EIO)"
            );
            d.events.emit(Event::HeldOpenCapped(event::HeldOpenCapped {
                job: name,
                held_bytes: before,
                cap_bytes: cap,
                generations,
                revoked_bytes: revoked,
                unrevocable_bytes: unrevocable,
                pids,
            }));
        }
    }
}
