//! A shared mount's restarts: the snapshot of every job's place and its write to the save file
//! (`share.json`), and at start the resumption of the saved jobs from their kept slots.

use std::collections::HashSet;

use super::state::write_share_state;
use crate::daemon::schedule::{Drawn, Schedule};
use crate::daemon::session::{History, Session, Sessions, Start};
use crate::daemon::setup::{build_policy, learned_replay, start_recording};
use crate::daemon::share::join::subset_samples;
use crate::daemon::share::state::{SavedJob, SavedShare, SHARE_STATE_VERSION};
use crate::daemon::share::{dataset_key, JobMeta, Shared};
use crate::daemon::{Daemon, Store};
use metfs_fs::view::View;
use metfs_prefetcher::stager::SlotSpec;
use metfs_protocol::event::Event;
use metfs_protocol::NotResumed;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Saved job `j` was not resumed, for `reason`.
pub(in crate::daemon) fn not_resumed(j: &SavedJob, reason: impl ToString) -> NotResumed {
    NotResumed {
        job: j.name.clone(),
        reason: reason.to_string(),
        epoch: j.epoch,
        mini_epoch: j.mini_epoch,
        passes: j.passes,
    }
}

impl Daemon {
    /// Writes the save file (`share.json`) of a shared mount. Blocking (the caller is a
    /// blocking thread or the shutdown).
    pub(in crate::daemon) fn write_share(&self) {
        let _order = self.persisting.lock().unwrap_or_else(|e| e.into_inner());
        self.write_share_locked();
    }

    /// Writes the save file before a shared mount's `pass_end` answers: the pass, the rf
    /// policy's state and the cohort place it answers with are on disk first, so a `kill -9`
    /// after any answer resumes every job at the pass it was told (a save after a switch alone
    /// lost the passes since). Waits on a blocking thread, never under a lock.
    pub(in crate::daemon) async fn write_share_durably(&self) {
        let me = self.me.lock().unwrap().upgrade();
        match me {
            Some(me) => {
                let _ = tokio::task::spawn_blocking(move || me.write_share()).await;
            }
            None => self.write_share(),
        }
    }

    /// As [`Daemon::write_share`], with `persisting` held by the caller.
    pub(in crate::daemon) fn write_share_locked(&self) {
        let Some(sh) = self.mode.shared() else { return };
        let saved = sh.snapshot(&self.sessions.lock().unwrap());
        if let Err(e) = write_share_state(&self.paths.share, &saved) {
            tracing::error!(error = %e, path = %self.paths.share.display(), "cannot save the jobs' places");
        }
    }
}

impl Shared {
    /// At start: resumes every job of the save file (`share.json`) from its kept slots. Each
    /// waits for its `hello` with its name and token, and is dropped as a silent job would be
    /// if none comes within `share.idle_secs`. A job that cannot be resumed (its subset no
    /// longer gives its dataset, its kept slot cannot be staged, its place does not check) is
    /// let go and returned with the reason ([`Shared::note_not_resumed`]); it starts over
    /// when it joins again.
    pub(in crate::daemon) async fn resume_jobs(
        &self,
        d: &Daemon,
        saved: SavedShare,
    ) -> Vec<NotResumed> {
        let mut refused = Vec::new();
        let top = saved
            .jobs
            .iter()
            .map(|j| j.generation)
            .fold(saved.generation, u64::max);
        self.generation.store(top, Ordering::SeqCst);
        // Every kept slot is in the book before any is checked, so that each is a donor of the
        // others (a sample two jobs share is one file).
        let present: HashSet<String> = d.store.stager.present_slots().into_iter().collect();
        // The cohort's places are of samples, the store's slots of files.
        for j in &saved.jobs {
            let cur = j.cohort.current.as_ref().expect("checked when read");
            d.store
                .begin_slot(&j.slot(), &self.ids.drawn(&d.store, cur).samples);
            if let (Some(next), Some(slot)) = (&j.cohort.next, j.next_slot()) {
                if present.contains(&slot) {
                    d.store
                        .begin_slot(&slot, &self.ids.drawn(&d.store, next).samples);
                }
            }
        }
        for j in &saved.jobs {
            match self.resume_job(d, j).await {
                Ok(fetched) => tracing::info!(
                    job = %j.name,
                    epoch = j.epoch,
                    mini_epoch = j.mini_epoch,
                    generation = j.generation,
                    fetched,
                    idle_secs = self.cfg.idle_secs,
                    "job resumed from its kept slots; it is dropped unless its hello (name and token) comes within share.idle_secs"
                ),
                Err(e) => {
                    let _ = self.cohort.lock().unwrap().leave(&j.name);
                    for slot in [Some(j.slot()), j.next_slot()].into_iter().flatten() {
                        d.store.discard(&slot);
                    }
                    refused.push(not_resumed(j, e));
                }
            }
        }
        d.write_share();
        refused
    }

    /// Records the saved jobs this start did not resume: each is logged, recorded as a
    /// `job_not_resumed` event, listed in `status`, and told why in its next `hello`, so that
    /// a job that starts over at epoch 0 never takes that for its saved position.
    pub(in crate::daemon) fn note_not_resumed(&self, d: &Daemon, refused: Vec<NotResumed>) {
        for n in &refused {
            tracing::warn!(
                job = %n.job,
                epoch = n.epoch,
                mini_epoch = n.mini_epoch,
                passes = n.passes,
                error = %n.reason,
                "cannot resume the job; it starts over when it joins again, and its hello says why"
            );
            d.events.emit(Event::JobNotResumed(n.clone()));
        }
        let _ = self.not_resumed.set(
            refused
                .into_iter()
                .map(|n| (n, std::sync::atomic::AtomicBool::new(false)))
                .collect(),
        );
    }

    /// Resumes one saved job (see [`Shared::resume_jobs`]); returns how many samples of its
    /// current view were fetched from the tier (none when its kept slot was whole).
    async fn resume_job(&self, d: &Daemon, j: &SavedJob) -> Result<u64, String> {
        let name = j.name.as_str();
        let dataset = subset_samples(
            &d.store.catalog,
            &self.ids,
            &d.cfg.source,
            name,
            j.subset.as_ref(),
        )
        .map_err(|e| e.message)?;
        if dataset_key(&d.cfg.source, self.settings.samples.as_deref(), &dataset) != j.dataset {
            return Err("its subset no longer gives the dataset it read".into());
        }
        let cfg = d.cfg.with_job_policy(j.rf_policy, j.rf);
        let (replay, schedule) = match &self.history {
            Some(store) => {
                learned_replay(&cfg.policy, &store.lock().unwrap(), &j.dataset, name, j.run)?
            }
            None => None,
        }
        .unzip();
        let mut policy = build_policy(&cfg, schedule).map_err(|e| e.to_string())?;
        if let Err(e) = policy.restore(&j.policy) {
            tracing::warn!(job = name, error = %e, "the job's saved rf policy state does not fit its policy; the policy starts afresh");
        }
        self.cohort
            .lock()
            .unwrap()
            .rejoin(name, &dataset, self.dealt_bytes, j.cohort.clone())
            .map_err(|e| e.to_string())?;
        // Its current view's files (the saved place holds samples).
        let cur = self.ids.drawn(
            &d.store,
            j.cohort.current.as_ref().expect("checked when read"),
        );
        let (view, fetched) = restage_kept(&d.store, j, &cur.samples).await?;
        let history = self.history.as_ref().map(|store| History {
            store: store.clone(),
            run: start_recording(
                &mut store.lock().unwrap(),
                &j.dataset,
                name,
                j.run,
                replay.clone(),
            )
            .0,
            dataset: j.dataset.clone(),
            replay,
        });
        let drawn = Drawn::resumed(j.slots().to_string(), j.mini_epoch, cur);
        let mut ss = d.sessions.lock().unwrap();
        d.surface.core().switch_job(name, view.clone());
        ss.insert(
            name.to_string(),
            Session::new(
                name.to_string(),
                name.to_string(),
                Schedule::Job(drawn),
                None,
                Start {
                    epoch: j.epoch,
                    mini_epoch: j.mini_epoch,
                    passes: j.passes,
                    generation: j.generation,
                    sequence: j.sequence,
                },
                policy,
                history,
                view,
            ),
        );
        self.jobs.lock().unwrap().insert(
            name.to_string(),
            JobMeta {
                token: j.token.clone(),
                last_seen: Instant::now(),
                held_back: false,
                held_open: Default::default(),
                samples: dataset.len() as u64,
                subset: j.subset.clone(),
                rf_policy: j.rf_policy,
                rf: j.rf,
                dataset: j.dataset.clone(),
            },
        );
        Ok(fetched)
    }

    /// Every job's place now, for the save file: taken under the sessions' lock, so that
    /// each job's position, policy and cohort place are of one moment. Jobs still waiting
    /// for their first view are left out (a restart has nothing of theirs to keep).
    pub(super) fn snapshot(&self, ss: &Sessions) -> SavedShare {
        let cohort = self.cohort.lock().unwrap();
        let jobs = self.jobs.lock().unwrap();
        let saved = ss
            .values()
            .filter(|s| s.schedule().drawn().is_some_and(Drawn::shown))
            .filter_map(|s| {
                let meta = jobs.get(s.name())?;
                let place = cohort.saved(s.name())?;
                place.current.as_ref()?;
                Some(SavedJob {
                    name: s.name().to_string(),
                    token: meta.token.clone(),
                    subset: meta.subset.clone(),
                    rf_policy: meta.rf_policy,
                    rf: meta.rf,
                    dataset: meta.dataset.clone(),
                    epoch: s.epoch(),
                    mini_epoch: s.mini_epoch(),
                    sequence: s.sequence(),
                    generation: s.generation(),
                    passes: s.passes(),
                    run: s.history().map(|h| h.run),
                    policy: s.policy().state(),
                    slots: s.schedule().drawn().map(|d| d.slots().to_string()),
                    cohort: place,
                })
            })
            .collect();
        SavedShare {
            version: SHARE_STATE_VERSION,
            settings: self.settings.clone(),
            generation: self.generation.load(Ordering::SeqCst),
            restarts: self.restarts,
            jobs: saved,
        }
    }
}

/// Job `j`'s kept slot, checked as a plain mount's resume checks its slot (the journal's
/// copies, unread if the slot's seal holds; only what is missing or damaged fetched
/// again), and its view at the saved generation; returns the view and the samples fetched.
async fn restage_kept(
    store: &Store,
    j: &SavedJob,
    samples: &[u32],
) -> Result<(Arc<View>, u64), String> {
    let slot = j.slot();
    let spec = SlotSpec {
        name: slot.clone(),
        samples: samples.to_vec(),
        reuse_from: Vec::new(),
        // A shared mount's views follow its cohort's plan: nothing is carried.
        defer: false,
    };
    let report = store
        .stage(&spec, Arc::default())
        .await
        .map_err(|e| format!("its kept slot {slot}: {e}"))?;
    let catalog = &store.catalog;
    store.note_failed(
        report
            .failed
            .iter()
            .map(|(id, why)| (catalog.path(*id), why.clone())),
    );
    let target = (j.epoch, j.mini_epoch);
    let view = Arc::new(
        store
            .view_for(samples, target, j.generation, &slot)
            .nested(),
    );
    Ok((view, report.fetched as u64))
}
