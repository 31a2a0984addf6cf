//! The jobs' views from the one cohort: each job's next view drawn (run by the staging loop),
//! its move to it at a switch, whether a job is held back (`share.pace = wait`), and every
//! job's status.

use crate::config::share::SharePace;
use crate::daemon::session::{Session, Sessions};
use crate::daemon::share::{Shared, JOIN_WINDOW};
use crate::daemon::store::Store;
use metfs_plan::refcnt::cohort::Next as CohortNext;
use metfs_protocol::JobStatus;

impl Shared {
    /// Prepares the next view of every job that has none: drawn by the cohort, handed to the
    /// job's schedule as its successor (of sessions `ss`; a failed draw is noted in `store`). Run
    /// by the staging loop, under the sessions' lock.
    pub(in crate::daemon) fn serve_cohort(&self, ss: &mut Sessions, store: &Store) {
        let window_open = self
            .last_join
            .lock()
            .unwrap()
            .is_some_and(|t| t.elapsed() < JOIN_WINDOW);
        // The map's key is the session's name.
        for (name, s) in ss.iter_mut() {
            let seq = s.mini_epoch();
            let Some(drawn) = s.schedule_mut().drawn_mut() else {
                continue;
            };
            if !drawn.shown() && window_open {
                // Its first view waits for the jobs joining with it.
                continue;
            }
            if drawn.has_successor(seq) {
                continue;
            }
            let mut cohort = self.cohort.lock().unwrap();
            match cohort.prepare(name) {
                Ok(CohortNext::Stage { .. }) | Ok(CohortNext::Prepared) => {
                    let Some(v) = cohort.next_view(name) else {
                        continue;
                    };
                    // The schedule, the staging and the view take files.
                    drawn.draw_successor(seq, self.ids.drawn(store, v));
                }
                Ok(CohortNext::Wait) => {}
                Err(e) => {
                    tracing::error!(job = %name, error = %e, "cannot draw the job's next view");
                    store.note_error(format!("job {name}: {e}"));
                }
            }
        }
    }
    /// Moves job `name` to its next view in the cohort, at its switch; returns the files of
    /// what the other jobs have drawn ahead, which the slot it leaves may be kept for.
    pub(in crate::daemon) fn advance_job(&self, name: &str) -> Vec<u32> {
        let mut cohort = self.cohort.lock().unwrap();
        if let Err(e) = cohort.advance(name) {
            tracing::error!(job = name, error = %e, "the cohort cannot advance the job");
        }
        self.ids.members(cohort.drawn_ahead(name, None))
    }

    /// Whether session `s`'s switch must wait (`share.pace = wait`): its current view holds
    /// samples that a job free to move has drawn into a view of the same epoch and not staged,
    /// and that no other slot holds.
    ///
    /// Only jobs not held back themselves count. Two jobs of one epoch each hold samples the
    /// other drew ahead; if each waited for the other, neither would stage what the other
    /// waits for, and both would take bonus passes for ever (a third job, moving, hid the
    /// cycle from a rule that only asked whether *some* other job moves). A job held only by
    /// held jobs moves, stages its views, and so frees the ones it passed. Flags change only
    /// here, one job at a time under the sessions lock, so of any set of jobs waiting on each
    /// other the last one asked sees the rest held and goes: no set waits for ever.
    pub(in crate::daemon) fn holds_back(&self, store: &Store, ss: &Sessions, s: &Session) -> bool {
        if self.cfg.pace != SharePace::Wait || s.view().slot.is_empty() {
            return false;
        }
        // Lock order: cohort, then jobs (module docs of `daemon`).
        let cohort = self.cohort.lock().unwrap();
        let mut jobs = self.jobs.lock().unwrap();
        // Only what the others read in this same epoch of theirs: a job in its next epoch
        // wants every sample again, which no store smaller than the dataset keeps anyway,
        // and holding the slower job back for it would only stall both.
        let ahead = cohort.drawn_ahead_by(s.name(), Some(s.epoch()), |n| {
            ss.contains_key(n) && jobs.get(n).is_some_and(|m| !m.held_back)
        });
        drop(cohort);
        let current = s
            .schedule()
            .drawn()
            .and_then(|d| d.view(s.mini_epoch()))
            .map(|v| v.samples.clone())
            .unwrap_or_default();
        // The view's files against the cohort's samples: a file of a sample drawn ahead (an
        // always file is in every slot, and no sample's).
        let needed: Vec<u32> = current
            .into_iter()
            .filter(|&x| self.ids.of_file(x).is_some_and(|k| ahead.contains(&k)))
            .collect();
        // A slot the store would hold as a donor is no help: the next staging may let it go
        // before the slower job has linked from it.
        let held = !needed.is_empty() && !store.elsewhere(&s.view().slot, &needed);
        if let Some(m) = jobs.get_mut(s.name()) {
            m.held_back = held;
        }
        held
    }

    /// Every job of a shared mount, for `status`.
    pub(in crate::daemon) fn job_statuses(&self, ss: &Sessions) -> Vec<JobStatus> {
        let jobs = self.jobs.lock().unwrap();
        ss.values()
            .filter(|s| s.schedule().in_shared_store())
            .map(|s| {
                let meta = jobs.get(s.name());
                JobStatus {
                    name: s.name().to_string(),
                    epoch: s.epoch(),
                    mini_epoch: (!s.schedule().before_first_view()).then_some(s.mini_epoch()),
                    pass: s.passes(),
                    rf_policy: s.policy().kind(),
                    rf: s.policy().expected_rf(),
                    bonus_passes: s.bonus_passes(),
                    generation: s.generation(),
                    files: s.view().file_count() as u64,
                    view_bytes: s.view().bytes(),
                    samples: meta.map_or(0, |m| m.samples),
                    share_bytes: 2 * self.view_bytes,
                    next_ready: s.next_ready(),
                    held_back: meta.is_some_and(|m| m.held_back),
                    idle_secs: meta.map_or(0.0, |m| m.last_seen.elapsed().as_secs_f64()),
                    held_open_bytes: meta.map_or(0, |m| m.held_open.bytes),
                    revoked_bytes: meta.map_or(0, |m| m.held_open.revoked),
                }
            })
            .collect()
    }
}
