//! A job's arrival and departure on a shared mount: the samples of its subset, its `hello`
//! ([`Shared::join`]) and admission into the cohort with a session of its own, its `leave`, the
//! deletion of a slot it never showed, and the dropping of jobs silent for
//! `share.idle_secs`.

use std::collections::HashSet;

use crate::config::ReadPath;
use crate::daemon::schedule::{job_slots, Drawn, Schedule};
use crate::daemon::session::{History, Next, Session, Start};
use crate::daemon::setup::{build_policy, learned_replay, start_recording};
use crate::daemon::share::{
    bad, check_job_name, dataset_key, mix, CohortIds, JobMeta, Shared, JOIN_WINDOW,
};
use crate::daemon::Daemon;
use metfs_feedback::policy::RfPolicy;
use metfs_fs::view::View;
use metfs_plan::size::format_bytes;
use metfs_protocol::JobShare;
use metfs_protocol::{ErrorCode, Hello, PolicyKind, ProtocolError, Subset};
use metfs_tier::catalog::Catalog;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Daemon {
    /// Answers `hello`: on a shared mount the job joins ([`Shared::join`]); a mount of one job
    /// greets it, refusing what only a shared mount takes (a subset, an rf policy of its own).
    pub async fn greet(
        &self,
        job: Option<String>,
        subset: Option<Subset>,
        rf_policy: Option<PolicyKind>,
        rf: Option<u32>,
        token: Option<String>,
    ) -> Result<Hello, ProtocolError> {
        if let Some(sh) = self.mode.shared() {
            return sh.join(self, job, subset, rf_policy, rf, token).await;
        }
        if subset.is_some() || rf_policy.is_some() || rf.is_some() {
            return Err(bad(
                "`subset`, `rf_policy` and `rf` in `hello` are for shared mounts (metfs mount --share); this mount serves one job with the mount's settings".into(),
            ));
        }
        Ok(self.surface.hello(job))
    }

    /// Job `name` leaves: its session, views and share go; the slots only it held are deleted
    /// once drained. Its rf history run is recorded as finished.
    pub async fn leave(&self, name: &str) -> Result<(), ProtocolError> {
        let sh = self.mode.shared().ok_or_else(|| {
            bad("`leave` is for shared mounts (--share); this mount serves one job".into())
        })?;
        sh.leave_as(self, name, true).await
    }
}

impl Shared {
    /// A job joins a shared mount (`hello` with its name): see the module doc. Answers once
    /// its first view is shown.
    pub(in crate::daemon) async fn join(
        &self,
        d: &Daemon,
        job: Option<String>,
        subset: Option<Subset>,
        rf_policy: Option<PolicyKind>,
        rf: Option<u32>,
        token: Option<String>,
    ) -> Result<Hello, ProtocolError> {
        let Some(name) = job else {
            return Err(bad(
                "this mount is shared between jobs (--share): `hello` must name the job (`job`, or METFS_JOB in the Python client)".into(),
            ));
        };
        check_job_name(&name)?;
        if d.life.is_shutting_down() {
            return Err(ProtocolError::new(
                ErrorCode::ShuttingDown,
                "the daemon is shutting down",
            ));
        }
        let present = self
            .jobs
            .lock()
            .unwrap()
            .get(&name)
            .map(|m| m.token.clone());
        let resumed = present.is_some();
        let token = match present {
            Some(t) if token.as_deref() == Some(t.as_str()) => {
                d.session_for(Some(&name))?;
                t
            }
            Some(_) => {
                return Err(bad(format!(
                    "a job named {name:?} is already on this shared mount; give each job its own name (METFS_JOB), or leave the other one first"
                )))
            }
            None => self.admit(d, &name, subset.as_ref(), rf_policy, rf)?,
        };
        // Its first view: drawn once no job has joined for the window, staged by the staging
        // loop, then shown here.
        tokio::time::sleep(JOIN_WINDOW).await;
        d.life.bump();
        let mut rx = d.life.subscribe();
        loop {
            // Waiting for its first view is not being idle.
            d.mode.touch(&name);
            if d.surface.core().job_view(&name).is_some() || d.try_switch(&name).await {
                break;
            }
            if d.life.is_shutting_down() {
                return Err(ProtocolError::new(
                    ErrorCode::ShuttingDown,
                    "the daemon is shutting down",
                ));
            }
            if !d.sessions.lock().unwrap().contains_key(&name) {
                return Err(bad(format!(
                    "job {name:?} left before its first view was staged"
                )));
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), rx.changed()).await;
        }
        let samples = self
            .jobs
            .lock()
            .unwrap()
            .get(&name)
            .map_or(0, |m| m.samples);
        let mut hello = d.surface.hello(Some(name.clone()));
        hello.share = Some(JobShare {
            path: d.surface.mountpoint().join(&name).display().to_string(),
            share_bytes: 2 * self.view_bytes,
            view_bytes: self.view_bytes,
            samples,
            token,
        });
        // A job whose saved place this start could not resume is told why, once: it starts
        // over at epoch 0, and would otherwise take that for its own position.
        if !resumed {
            hello.not_resumed = self.tell_not_resumed(&name);
        }
        Ok(hello)
    }

    /// Takes `name` into the cohort and makes its session; returns its token.
    fn admit(
        &self,
        d: &Daemon,
        name: &str,
        subset: Option<&Subset>,
        rf_policy: Option<PolicyKind>,
        rf: Option<u32>,
    ) -> Result<String, ProtocolError> {
        let dataset = subset_samples(&d.store.catalog, &self.ids, &d.cfg.source, name, subset)?;
        let cfg = d.cfg.with_job_policy(rf_policy, rf);
        let mut ss = d.sessions.lock().unwrap();
        if ss.contains_key(name) {
            return Err(bad(format!(
                "a job named {name:?} is already on this shared mount; give each job its own name (METFS_JOB)"
            )));
        }
        // The job's rf history: its own run, keyed by its name and its dataset (a subset is
        // another dataset), so `learned` replays what this job did on this data before.
        let dataset_key = dataset_key(&d.cfg.source, self.settings.samples.as_deref(), &dataset);
        let (replay, schedule) = match &self.history {
            Some(store) => learned_replay(
                &cfg.policy,
                &store.lock().unwrap(),
                &dataset_key,
                name,
                None,
            )
            .map_err(|e| bad(format!("job {name:?}: {e}")))?,
            None => None,
        }
        .unzip();
        let policy = build_policy(&cfg, schedule).map_err(|e| bad(format!("job {name:?}: {e}")))?;
        self.cohort
            .lock()
            .unwrap()
            .join(name, &dataset, self.dealt_bytes)
            .map_err(|e| {
                bad(format!(
                    "job {name:?} cannot join: {e} (the budget is shared by at most {} jobs, `share.jobs`; each takes {} when it joins)",
                    self.cfg.jobs,
                    format_bytes(2 * self.view_bytes)
                ))
            })?;
        // Started only once the join is sure, so that a refused join leaves no empty run.
        let history = self.history.as_ref().map(|store| History {
            store: store.clone(),
            run: start_recording(
                &mut store.lock().unwrap(),
                &dataset_key,
                name,
                None,
                replay.clone(),
            )
            .0,
            dataset: dataset_key.clone(),
            replay,
        });
        let generation = self.take_generation();
        let token = job_token(d.life.started(), generation);
        let session = job_session(&d.paths.slots, name, generation, policy, history);
        ss.insert(name.to_string(), session);
        *self.last_join.lock().unwrap() = Some(Instant::now());
        self.jobs.lock().unwrap().insert(
            name.to_string(),
            JobMeta {
                token: token.clone(),
                last_seen: Instant::now(),
                held_back: false,
                held_open: Default::default(),
                samples: dataset.len() as u64,
                subset: subset.cloned(),
                rf_policy,
                rf,
                dataset: dataset_key,
            },
        );
        drop(ss);
        tracing::info!(
            job = name,
            samples = dataset.len(),
            share = %format_bytes(2 * self.view_bytes),
            "job joined the shared store"
        );
        d.life.bump();
        Ok(token)
    }

    /// Job `name` leaves daemon `d` (as [`Daemon::leave`]); a job dropped for its silence
    /// (`finished` false) keeps its run unfinished in the rf history, as a killed single-job
    /// mount's.
    pub(in crate::daemon) async fn leave_as(
        &self,
        d: &Daemon,
        name: &str,
        finished: bool,
    ) -> Result<(), ProtocolError> {
        // Held from the snapshot of the rf history to its write (as `save_session`).
        let order = d.persisting.lock().unwrap_or_else(|e| e.into_inner());
        let (next_slot, current_slot, history) = {
            let mut ss = d.sessions.lock().unwrap();
            let s = ss
                .remove(name)
                .ok_or_else(|| bad(format!("job {name:?} is not on this shared mount")))?;
            let history = s.history().map(|h| {
                let mut store = h.store.lock().unwrap();
                if !s.record().scores.is_empty() {
                    let _ = store.record_mini_epoch(h.run, s.record().clone());
                }
                if finished {
                    let _ = store.finish_run(h.run);
                }
                store.encode()
            });
            if let Err(e) = self.cohort.lock().unwrap().leave(name) {
                tracing::warn!(job = name, error = %e, "the cohort did not know the job");
            }
            self.jobs.lock().unwrap().remove(name);
            let next_slot = match s.next() {
                Next::Ready { slot, .. } => Some(slot.clone()),
                _ => None,
            };
            (
                next_slot,
                (!s.view().slot.is_empty()).then(|| s.view().slot.clone()),
                history,
            )
        };
        if let Some(Err(e)) = history.map(|h| h.and_then(|h| h.write())) {
            tracing::warn!(job = name, error = %e, "cannot record the rf history");
        }
        drop(order);
        if let Some(old) = d.surface.core().remove_job(name) {
            d.store.retire_slot(old.generation, &old.slot, &[]);
            // As after a switch: the slot may be held as a donor, and its deletion waits for
            // that; nobody waits for the deletion.
            let me = d.me.lock().unwrap().upgrade();
            if let (true, Some(me)) = (d.surface.core().is_drained(&old), me) {
                let gen = old.generation;
                tokio::spawn(async move { me.evict_view(gen).await });
            } else if d.surface.read_path_now() == ReadPath::Cached {
                tokio::spawn(d.surface.clone().release_kernel_refs(old.generation));
            }
        }
        if let Some(slot) = next_slot {
            // Never shown, but the jobs that drew the same samples may still link from it:
            // retired like a view, it is kept as a donor while the room allows.
            let gen = self.take_generation();
            d.store.retire_slot(gen, &slot, &[]);
            let me = d.me.lock().unwrap().upgrade();
            if let Some(me) = me {
                tokio::spawn(async move { me.evict_view(gen).await });
            } else {
                d.store.drop_slot(&slot).await;
            }
        }
        d.surface.forget_root_entries(vec![name.to_string()]).await;
        tracing::info!(job = name, slot = ?current_slot, "job left the shared store");
        // The job leaves the save file too: a restart does not bring it back.
        match d.me.lock().unwrap().upgrade() {
            Some(me) => {
                tokio::task::spawn_blocking(move || me.write_share());
            }
            None => d.write_share(),
        }
        d.life.bump();
        Ok(())
    }

    /// Drops the jobs silent for longer than `share.idle_secs`; run by the monitor.
    pub(in crate::daemon) fn reap_idle(&self, d: &Arc<Daemon>) {
        let idle = Duration::from_secs(self.cfg.idle_secs);
        let gone: Vec<String> = self
            .jobs
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, m)| m.last_seen.elapsed() > idle)
            .map(|(n, _)| n.clone())
            .collect();
        for name in gone {
            tracing::warn!(
                job = %name,
                idle_secs = self.cfg.idle_secs,
                "dropping a job that sent no request for share.idle_secs: its share and views are released"
            );
            let d = d.clone();
            tokio::spawn(async move {
                if let Some(sh) = d.mode.shared() {
                    let _ = sh.leave_as(&d, &name, false).await;
                }
            });
        }
    }
}

/// A new job's token. Not a secret (the socket is the user's own): it tells a
/// reconnection from another process under the same name.
fn job_token(started: Instant, generation: u64) -> String {
    format!(
        "{:016x}",
        mix(u64::from(std::process::id()) ^ mix(started.elapsed().as_nanos() as u64))
            ^ mix(generation)
    )
}

/// A joining job's session: its first view (sequence 0) not drawn yet, an empty view
/// under `MNT/<name>` meanwhile.
fn job_session(
    slots: &Path,
    name: &str,
    generation: u64,
    policy: Box<dyn RfPolicy>,
    history: Option<History>,
) -> Session {
    let placeholder = Arc::new(View::from_files(&[], generation, 0, 0, "", slots).nested());
    Session::new(
        name.to_string(),
        name.to_string(),
        // Its first view is drawn with the jobs joining with it.
        Schedule::Job(Drawn::new(job_slots(name, generation))),
        None,
        Start {
            epoch: 0,
            mini_epoch: 0,
            passes: 0,
            generation,
            sequence: 0,
        },
        policy,
        history,
        placeholder,
    )
}

/// The samples (cohort ids of `ids`) of `subset` of `catalog` (all of it without one), each
/// checked: a manifest's paths, labels or a seeded fraction. Errors name job `job` and the
/// part of its subset at fault.
///
/// Where samples are groups of files, a manifest names files, and a group is in the subset if
/// **any** of its files is ([`CohortIds::of_files`]); labels are each group's (its first
/// file's), and a fraction is of the groups.
pub(super) fn subset_samples(
    catalog: &Catalog,
    ids: &CohortIds,
    source: &str,
    job: &str,
    subset: Option<&Subset>,
) -> Result<Vec<u32>, ProtocolError> {
    let n = ids.count(catalog);
    let Some(subset) = subset else {
        return Ok((0..n).collect());
    };
    let mut samples: Vec<u32> = if let Some(path) = &subset.manifest {
        let text = std::fs::read_to_string(path).map_err(|e| {
            bad(format!(
                "job {job:?}: subset manifest {path}: cannot read it: {e}"
            ))
        })?;
        let mut files = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let rel = line.trim_start_matches("./");
            match catalog.find(rel) {
                Some(id) => files.push(id),
                None => {
                    return Err(bad(format!(
                        "job {job:?}: subset manifest {path}, line {}: `{rel}` is not a sample of the source {}",
                        i + 1,
                        source
                    )))
                }
            }
        }
        ids.of_files(&files)
    } else if let Some(labels) = &subset.labels {
        let names = catalog.label_names();
        let per_sample = ids.labels(catalog).unwrap_or(&[]);
        let mut wanted = HashSet::new();
        for l in labels {
            match names.iter().position(|x| x == l) {
                Some(i) => {
                    wanted.insert(i as u32);
                }
                None => {
                    return Err(bad(format!(
                        "job {job:?}: subset label {l:?} is not a label of the source (labels are its first-level directories: {})",
                        names.iter().take(20).cloned().collect::<Vec<_>>().join(", ")
                    )))
                }
            }
        }
        (0..n)
            .filter(|&id| {
                per_sample
                    .get(id as usize)
                    .is_some_and(|l| wanted.contains(l))
            })
            .collect()
    } else {
        let f = subset.fraction.unwrap_or(1.0);
        let seed = subset.seed.unwrap_or(0);
        let k = ((f * n as f64).round() as u32).clamp(1, n);
        let mut all: Vec<u32> = (0..n).collect();
        all.sort_unstable_by_key(|&id| mix(seed ^ mix(u64::from(id))));
        all.truncate(k as usize);
        all
    };
    samples.sort_unstable();
    samples.dedup();
    if samples.is_empty() {
        return Err(bad(format!("job {job:?}: its subset holds no sample")));
    }
    Ok(samples)
}
