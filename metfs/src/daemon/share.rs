//! A shared mount (`metfs mount --share`): several jobs on one daemon and one staged store
//! (paper 004, JOADER).
//!
//! * **Jobs.** A job joins with `hello` and its name (`METFS_JOB` in the Python client), and
//!   optionally a subset of the source (a manifest, labels, or a fraction with a seed) and its
//!   own rf policy. It becomes a [`Session`] of that name whose view is the directory
//!   `MNT/<job>`; the mount's root lists the jobs. `hello` answers once the job's first view
//!   is staged and shown, as a plain mount goes live only with its first mini-epoch. A job
//!   leaves with `leave`, or is dropped after `share.idle_secs` without a request (a
//!   `kill -9`'d trainer pins nothing for longer). A second `hello` under a name present is
//!   refused unless it carries the token the first one was given (the client's reconnection).
//! * **Views from one sampler.** Each job's views (its mini-epochs, numbered by sequence like
//!   a queue's batches) come from the store's [`Cohort`]: dependent sampling (corrected
//!   Algorithm 1, `prefetcher::planner::dsa`) draws every job's views together, so jobs over
//!   overlapping datasets take their shared samples in the same round while each job's own
//!   order stays uniformly random.
//! * **One store.** A job's view is staged into a slot of its own (`<job>.e…-m…`), and every
//!   sample some slot of the store already holds is hard-linked from it, not fetched
//!   (`Store::stage` offers every slot as a donor): a sample two jobs read in the same round is
//!   read from the tier once and stored once, and the store counts each file once.
//! * **Shares.** The budget left after metadata is cut into `share.jobs` equal shares; a job
//!   takes one when it joins (its current and next views, so each of its views is at most half
//!   a share) and a join past the count is refused with the numbers. The shares granted never
//!   exceed the budget, so every job's pinned views fit whatever the others do. Retired slots
//!   are kept as donors (the store's held slots, up to two per share) whatever their bytes,
//!   and a staging that needs room takes it from them in RefCnt's order at the grain of
//!   samples (`Store::room_for`): single samples of kept slots nobody reads any more, those
//!   the fewest jobs still need this epoch (the cohort's reference counts) first, then the
//!   oldest slot's; whole slots only if that is not enough.
//! * **Pace.** With `share.pace = wait` (the default), a job whose view would retire while
//!   another job has drawn some of its samples into a view not staged yet (and no other slot
//!   holds them) is answered `wait` (a bonus pass) instead: it never makes a slower job read
//!   the tier again. It is never held back when every other job is held back too.
//!   With `evict` it moves on.
//!
//! Each job records its rf history as a run of its own in the mount's one history file
//! (`Shared::history`, one copy in memory that every job's writes snapshot), keyed by its name
//! and its dataset; `leave` marks the run finished, a job dropped for its silence leaves it
//! unfinished.
//!
//! * **Restarts.** Each job's place is saved in `CACHE/share.json` (`share_state`: name and
//!   token, subset, position, rf policy state, its place in the cohort) at every switch, when
//!   its next view is staged, at `leave` and at shutdown, written on a blocking thread after a
//!   snapshot under the sessions' lock. A daemon started on a file of the same settings keeps
//!   every saved job's current slot and prepared next slot (other slots are deleted as before),
//!   checks each current slot as a plain mount's resume does (its seal, else every journaled
//!   copy, fetching only what is missing), shows it at its saved generation, and restores the
//!   job's session, policy state, rf history run and cohort place ([`Cohort::rejoin`]): the job
//!   is present, and its `hello` with name and token is a reconnection. One without a `hello`
//!   is dropped after `share.idle_secs` like a silent job. The cohort's place holds each job's
//!   undrawn samples and drawn views, not the sampler's random state: the restored sampler
//!   draws from a fresh stream (seed and restart count), which keeps each job's order of what
//!   it has left uniform and never draws again what it drew this epoch; reproducing the old
//!   stream would also need the order of every job's requests, which no restart repeats.

use std::collections::HashSet;
use std::sync::atomic::AtomicU64;

use super::share_state::write_share_state;
use super::*;
use crate::config::share::{ShareConfig, SharePace};
use crate::protocol::{JobShare, JobStatus, Subset};
use prefetcher::refcnt::cohort::{Cohort, Next as CohortNext, Pace};

/// The jobs of a shared mount and their sampler.
pub(super) struct Shared {
    pub(super) cfg: ShareConfig,
    /// Every job's views, shares and references (lock after the sessions', before the store's).
    pub(super) cohort: Mutex<Cohort>,
    pub(super) jobs: Mutex<BTreeMap<String, JobMeta>>,
    /// The last generation handed out: generations are unique across jobs, since inode
    /// numbers carry them.
    generation: AtomicU64,
    /// Most bytes of one view of a job (half a share).
    pub(super) view_bytes: u64,
    /// The mount's rf history file, one copy for every job: each job records its own run under
    /// its name and its dataset (`None` if the file cannot be used).
    pub(super) history: Option<Arc<Mutex<HistoryStore>>>,
    /// When the last job joined: first views are drawn only [`JOIN_WINDOW`] after it.
    last_join: Mutex<Option<Instant>>,
    /// What the views depend on, saved with the jobs' places (`share.json`).
    pub(super) settings: ShareSettings,
    /// Restarts of this shared mount so far (saved).
    pub(super) restarts: u64,
}

/// Jobs joining within this of each other draw their first views together. A job that joins
/// after another has drawn views shares only part of each later view with it (dependent
/// sampling then keeps both orders uniform, so it takes the shared samples in the same round
/// only as often as that allows); the trials of a sweep start within a second of each other.
pub const JOIN_WINDOW: Duration = Duration::from_secs(1);

/// What the daemon keeps of a job besides its session.
pub(super) struct JobMeta {
    token: String,
    last_seen: Instant,
    pub(super) held_back: bool,
    samples: u64,
    /// What its `hello` asked for, saved so that a restart makes the same dataset and policy.
    subset: Option<Subset>,
    rf_policy: Option<String>,
    rf: Option<u32>,
    /// Its dataset's key (see [`dataset_key`]).
    dataset: String,
}

/// The key of a job's dataset, for the rf history and the save file: the source, the count
/// and a digest of the samples (a subset is another dataset).
fn dataset_key(source: &str, dataset: &[u32]) -> String {
    let mut h = prefetcher::digest::Fnv1a::new();
    for id in dataset {
        h.write(&id.to_le_bytes());
    }
    format!("{source}|share|{}|{:016x}", dataset.len(), h.finish())
}

impl Shared {
    pub(super) fn new(cfg: ShareConfig, budget: &Budget, footprints: Vec<u64>, seed: u64) -> Self {
        let view_bytes = budget.slot_bytes / u64::from(cfg.jobs.max(1));
        Self {
            // Whatever `share.pace`, the daemon holds a job back itself (`holds_back`): the
            // cohort's own pace models a pool of single samples, not the store's slots.
            cohort: Mutex::new(Cohort::new(
                2 * budget.slot_bytes,
                footprints,
                seed,
                Pace::Evict,
            )),
            jobs: Mutex::default(),
            // Generation 1 is the root's (empty) view.
            generation: AtomicU64::new(1),
            view_bytes,
            history: None,
            last_join: Mutex::new(None),
            settings: ShareSettings {
                source: String::new(),
                catalog: String::new(),
                slot_bytes: budget.slot_bytes,
                jobs: cfg.jobs,
                seed,
                transform: None,
            },
            restarts: 0,
            cfg,
        }
    }

    /// A generation no view has.
    pub(super) fn take_generation(&self) -> u64 {
        // After a wrap, 1 is the root's: skip it.
        let after = |g| match next_generation(g) {
            1 => 2,
            n => n,
        };
        let prev = self
            .generation
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |g| Some(after(g)))
            .expect("the update always succeeds");
        after(prev)
    }
}

/// Checks a job's name: it is a directory name under the mount and part of slot names.
pub fn check_job_name(name: &str) -> Result<(), ProtocolError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(ProtocolError::new(
            ErrorCode::BadRequest,
            format!(
                "job name {name:?} is not valid on a shared mount: use 1 to 64 letters, digits, `_`, `-` or `.`, not starting with `.` (it names the job's directory under the mount)"
            ),
        ))
    }
}

fn bad(message: String) -> ProtocolError {
    ProtocolError::new(ErrorCode::BadRequest, message)
}

/// A 64-bit mix (one SplitMix64 step from `x`), for the `fraction` subset's draw.
fn mix(mut x: u64) -> u64 {
    planrng::splitmix64(&mut x)
}

impl Daemon {
    /// Whether this is a shared mount (`--share`).
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// The session a request acts on: on a shared mount the job it names (required), else the
    /// default session. Counts as the job's sign of life.
    pub(crate) fn session_for(&self, job: Option<&str>) -> Result<String, ProtocolError> {
        let Some(sh) = &self.shared else {
            return Ok(DEFAULT_SESSION.to_string());
        };
        let Some(job) = job else {
            return Err(bad(
                "this mount is shared between jobs (--share): name the job (`job`, or METFS_JOB in the Python client)".into(),
            ));
        };
        match sh.jobs.lock().unwrap().get_mut(job) {
            Some(m) => {
                m.last_seen = Instant::now();
                Ok(job.to_string())
            }
            None => Err(bad(format!(
                "job {job:?} has not joined this shared mount (or was dropped after {} s without a request); send `hello` with its name first",
                sh.cfg.idle_secs
            ))),
        }
    }

    /// Counts as a sign of life of job `name` (a request, or waiting for staging for it).
    pub(super) fn touch_job(&self, name: &str) {
        if let Some(sh) = &self.shared {
            if let Some(m) = sh.jobs.lock().unwrap().get_mut(name) {
                m.last_seen = Instant::now();
            }
        }
    }

    /// The samples of `subset` (all of the source without one), each checked.
    fn subset_samples(
        &self,
        job: &str,
        subset: Option<&Subset>,
    ) -> Result<Vec<u32>, ProtocolError> {
        let catalog = &self.store.catalog;
        let n = catalog.len() as u32;
        let Some(subset) = subset else {
            return Ok((0..n).collect());
        };
        let mut ids: Vec<u32> = if let Some(path) = &subset.manifest {
            let text = std::fs::read_to_string(path).map_err(|e| {
                bad(format!(
                    "job {job:?}: subset manifest {path}: cannot read it: {e}"
                ))
            })?;
            let mut ids = Vec::new();
            for (i, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let rel = line.trim_start_matches("./");
                match catalog.find(rel) {
                    Some(id) => ids.push(id),
                    None => {
                        return Err(bad(format!(
                            "job {job:?}: subset manifest {path}, line {}: `{rel}` is not a sample of the source {}",
                            i + 1,
                            self.cfg.source
                        )))
                    }
                }
            }
            ids
        } else if let Some(labels) = &subset.labels {
            let names = catalog.label_names();
            let per_sample = catalog.labels().unwrap_or(&[]);
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
        ids.sort_unstable();
        ids.dedup();
        if ids.is_empty() {
            return Err(bad(format!("job {job:?}: its subset holds no sample")));
        }
        Ok(ids)
    }

    /// A job joins a shared mount (`hello` with its name): see the module doc. Answers once
    /// its first view is shown.
    pub async fn join(
        &self,
        job: Option<String>,
        subset: Option<Subset>,
        rf_policy: Option<String>,
        rf: Option<u32>,
        token: Option<String>,
    ) -> Result<Hello, ProtocolError> {
        let sh = self.shared.as_ref().expect("a shared mount");
        let Some(name) = job else {
            return Err(bad(
                "this mount is shared between jobs (--share): `hello` must name the job (`job`, or METFS_JOB in the Python client)".into(),
            ));
        };
        check_job_name(&name)?;
        if self.is_shutting_down() {
            return Err(ProtocolError::new(
                ErrorCode::ShuttingDown,
                "the daemon is shutting down",
            ));
        }
        let present = sh.jobs.lock().unwrap().get(&name).map(|m| m.token.clone());
        let token = match present {
            Some(t) if token.as_deref() == Some(t.as_str()) => {
                self.session_for(Some(&name))?;
                t
            }
            Some(_) => {
                return Err(bad(format!(
                    "a job named {name:?} is already on this shared mount; give each job its own name (METFS_JOB), or leave the other one first"
                )))
            }
            None => self.admit(&name, subset.as_ref(), rf_policy, rf)?,
        };
        // Its first view: drawn once no job has joined for the window, staged by the staging
        // loop, then shown here.
        tokio::time::sleep(JOIN_WINDOW).await;
        self.bump();
        let mut rx = self.changed.subscribe();
        loop {
            // Waiting for its first view is not being idle.
            self.touch_job(&name);
            if self.fs.job_view(&name).is_some() || self.try_switch(&name).await {
                break;
            }
            if self.is_shutting_down() {
                return Err(ProtocolError::new(
                    ErrorCode::ShuttingDown,
                    "the daemon is shutting down",
                ));
            }
            if !self.sessions.lock().unwrap().contains_key(&name) {
                return Err(bad(format!(
                    "job {name:?} left before its first view was staged"
                )));
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), rx.changed()).await;
        }
        let samples = sh.jobs.lock().unwrap().get(&name).map_or(0, |m| m.samples);
        let mut hello = self.hello(Some(name.clone()));
        hello.share = Some(JobShare {
            path: self.mountpoint().join(&name).display().to_string(),
            share_bytes: 2 * sh.view_bytes,
            view_bytes: sh.view_bytes,
            samples,
            token,
        });
        Ok(hello)
    }

    /// Takes `name` into the cohort and makes its session; returns its token.
    fn admit(
        &self,
        name: &str,
        subset: Option<&Subset>,
        rf_policy: Option<String>,
        rf: Option<u32>,
    ) -> Result<String, ProtocolError> {
        let sh = self.shared.as_ref().expect("a shared mount");
        let dataset = self.subset_samples(name, subset)?;
        let cfg = self.job_config(name, rf_policy.as_deref(), rf)?;
        let mut ss = self.sessions.lock().unwrap();
        if ss.contains_key(name) {
            return Err(bad(format!(
                "a job named {name:?} is already on this shared mount; give each job its own name (METFS_JOB)"
            )));
        }
        // The job's rf history: its own run, keyed by its name and its dataset (a subset is
        // another dataset), so `learned` replays what this job did on this data before.
        let dataset_key = dataset_key(&self.cfg.source, &dataset);
        let (replay, schedule) = match &sh.history {
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
        sh.cohort
            .lock()
            .unwrap()
            .join(name, &dataset, sh.view_bytes)
            .map_err(|e| {
                bad(format!(
                    "job {name:?} cannot join: {e} (the budget is shared by at most {} jobs, `share.jobs`; each takes {} when it joins)",
                    sh.cfg.jobs,
                    format_bytes(2 * sh.view_bytes)
                ))
            })?;
        // Started only once the join is sure, so that a refused join leaves no empty run.
        let history = sh.history.as_ref().map(|store| History {
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
        let generation = sh.take_generation();
        let placeholder =
            Arc::new(View::from_files(&[], generation, 0, 0, "", &self.paths.slots).nested());
        // Not a secret (the socket is the user's own): it tells a reconnection from another
        // process under the same name.
        let token = format!(
            "{:016x}",
            mix(u64::from(std::process::id()) ^ mix(self.started.elapsed().as_nanos() as u64))
                ^ mix(generation)
        );
        ss.insert(
            name.to_string(),
            Session::new(
                name.to_string(),
                name.to_string(),
                // Its first view (sequence 0) is drawn with the jobs joining with it.
                Schedule::Job(Drawn::default()),
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
            ),
        );
        *sh.last_join.lock().unwrap() = Some(Instant::now());
        sh.jobs.lock().unwrap().insert(
            name.to_string(),
            JobMeta {
                token: token.clone(),
                last_seen: Instant::now(),
                held_back: false,
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
            share = %format_bytes(2 * sh.view_bytes),
            "job joined the shared store"
        );
        self.bump();
        Ok(token)
    }

    /// Job `name` leaves: its session, views and share go; the slots only it held are deleted
    /// once drained. Its rf history run is recorded as finished.
    pub async fn leave(&self, name: &str) -> Result<(), ProtocolError> {
        self.leave_as(name, true).await
    }

    /// As [`Daemon::leave`]; a job dropped for its silence (`finished` false) keeps its run
    /// unfinished in the rf history, as a killed single-job mount's.
    async fn leave_as(&self, name: &str, finished: bool) -> Result<(), ProtocolError> {
        let sh = self.shared.as_ref().ok_or_else(|| {
            bad("`leave` is for shared mounts (--share); this mount serves one job".into())
        })?;
        // Held from the snapshot of the rf history to its write (as `save_session`).
        let order = self.persisting.lock().unwrap_or_else(|e| e.into_inner());
        let (next_slot, current_slot, history) = {
            let mut ss = self.sessions.lock().unwrap();
            let s = ss
                .remove(name)
                .ok_or_else(|| bad(format!("job {name:?} is not on this shared mount")))?;
            let history = s.history.as_ref().map(|h| {
                let mut store = h.store.lock().unwrap();
                if !s.record.scores.is_empty() {
                    let _ = store.record_mini_epoch(h.run, s.record.clone());
                }
                if finished {
                    let _ = store.finish_run(h.run);
                }
                store.encode()
            });
            if let Err(e) = sh.cohort.lock().unwrap().leave(name) {
                tracing::warn!(job = name, error = %e, "the cohort did not know the job");
            }
            sh.jobs.lock().unwrap().remove(name);
            let next_slot = match &s.next {
                Next::Ready { slot, .. } => Some(slot.clone()),
                _ => None,
            };
            (
                next_slot,
                (!s.view.slot.is_empty()).then(|| s.view.slot.clone()),
                history,
            )
        };
        if let Some(Err(e)) = history.map(|h| h.and_then(|h| h.write())) {
            tracing::warn!(job = name, error = %e, "cannot record the rf history");
        }
        drop(order);
        if let Some(old) = self.fs.remove_job(name) {
            self.store.retire_slot(old.generation, &old.slot, &[]);
            // As after a switch: the slot may be held as a donor, and its deletion waits for
            // that; nobody waits for the deletion.
            let me = self.me.lock().unwrap().upgrade();
            if let (true, Some(me)) = (self.fs.is_drained(&old), me) {
                let gen = old.generation;
                tokio::spawn(async move { me.evict_view(gen).await });
            } else if self.read_path_now() == ReadPath::Cached {
                if let Some(me) = self.me.lock().unwrap().upgrade() {
                    tokio::spawn(me.release_kernel_refs(old.generation));
                }
            }
        }
        if let Some(slot) = next_slot {
            // Never shown, but the jobs that drew the same samples may still link from it:
            // retired like a view, it is kept as a donor while the room allows.
            let gen = sh.take_generation();
            self.store.retire_slot(gen, &slot, &[]);
            let me = self.me.lock().unwrap().upgrade();
            if let Some(me) = me {
                tokio::spawn(async move { me.evict_view(gen).await });
            } else {
                self.drop_slot(&slot).await;
            }
        }
        let kernel = self.kernel.lock().unwrap().clone();
        if let Some(n) = kernel {
            let job = name.to_string();
            let _ = tokio::task::spawn_blocking(move || {
                let _ = n.inval_entry(crate::view::ROOT_INO, &job);
                let _ = n.inval_inode(crate::view::ROOT_INO);
            })
            .await;
        }
        tracing::info!(job = name, slot = ?current_slot, "job left the shared store");
        // The job leaves the save file too: a restart does not bring it back.
        match self.me.lock().unwrap().upgrade() {
            Some(me) => {
                tokio::task::spawn_blocking(move || me.write_share());
            }
            None => self.write_share(),
        }
        self.bump();
        Ok(())
    }

    /// Deletes a slot staged for a job that left before showing it.
    pub(super) async fn drop_slot(&self, slot: &str) {
        let stager = self.store.stager.clone();
        let name = slot.to_string();
        match tokio::task::spawn_blocking(move || stager.evict(&name)).await {
            Ok(Ok(())) => self.store.forget_slot(slot),
            other => {
                tracing::error!(slot, result = ?other.map(|r| r.err()), "cannot delete a slot of a job that left")
            }
        }
    }

    /// Drops the jobs silent for longer than `share.idle_secs`; run by the monitor.
    pub(super) fn reap_idle(self: &Arc<Self>) {
        let Some(sh) = &self.shared else { return };
        let idle = Duration::from_secs(sh.cfg.idle_secs);
        let gone: Vec<String> = sh
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
                idle_secs = sh.cfg.idle_secs,
                "dropping a job that sent no request for share.idle_secs: its share and views are released"
            );
            let me = self.clone();
            tokio::spawn(async move {
                let _ = me.leave_as(&name, false).await;
            });
        }
    }

    /// The mount's configuration with a job's own rf policy and rf from its `hello`.
    fn job_config(
        &self,
        name: &str,
        rf_policy: Option<&str>,
        rf: Option<u32>,
    ) -> Result<MountConfig, ProtocolError> {
        let mut cfg = self.cfg.clone();
        if let Some(p) = rf_policy {
            cfg.policy.kind = p
                .parse()
                .map_err(|e| bad(format!("job {name:?}: rf_policy {p:?}: {e}")))?;
        }
        if let Some(rf) = rf {
            cfg.policy.rf = rf;
        }
        Ok(cfg)
    }

    /// Every job's place now, for the save file: taken under the sessions' lock, so that
    /// each job's position, policy and cohort place are of one moment. Jobs still waiting
    /// for their first view are left out (a restart has nothing of theirs to keep).
    fn share_snapshot(&self, sh: &Shared, ss: &Sessions) -> SavedShare {
        let cohort = sh.cohort.lock().unwrap();
        let jobs = sh.jobs.lock().unwrap();
        let saved = ss
            .values()
            .filter(|s| s.schedule.drawn().is_some_and(Drawn::shown))
            .filter_map(|s| {
                let meta = jobs.get(&s.name)?;
                let place = cohort.saved(&s.name)?;
                place.current.as_ref()?;
                Some(SavedJob {
                    name: s.name.clone(),
                    token: meta.token.clone(),
                    subset: meta.subset.clone(),
                    rf_policy: meta.rf_policy.clone(),
                    rf: meta.rf,
                    dataset: meta.dataset.clone(),
                    epoch: s.epoch,
                    mini_epoch: s.mini_epoch,
                    sequence: s.sequence,
                    generation: s.generation,
                    passes: s.passes,
                    run: s.history.as_ref().map(|h| h.run),
                    policy: s.policy.state(),
                    cohort: place,
                })
            })
            .collect();
        SavedShare {
            version: SHARE_STATE_VERSION,
            settings: sh.settings.clone(),
            generation: sh.generation.load(Ordering::SeqCst),
            restarts: sh.restarts,
            jobs: saved,
        }
    }

    /// Writes the save file (`share.json`) of a shared mount. Blocking (the caller is a
    /// blocking thread or the shutdown).
    pub(super) fn write_share(&self) {
        let _order = self.persisting.lock().unwrap_or_else(|e| e.into_inner());
        self.write_share_locked();
    }

    /// As [`Daemon::write_share`], with `persisting` held by the caller.
    pub(super) fn write_share_locked(&self) {
        let Some(sh) = &self.shared else { return };
        let saved = self.share_snapshot(sh, &self.sessions.lock().unwrap());
        if let Err(e) = write_share_state(&self.paths.share, &saved) {
            tracing::error!(error = %e, path = %self.paths.share.display(), "cannot save the jobs' places");
        }
    }

    /// At start: resumes every job of the save file (`share.json`) from its kept slots. Each
    /// waits for its `hello` with its name and token, and is dropped as a silent job would be
    /// if none comes within `share.idle_secs`. A job that cannot be resumed (its subset no
    /// longer gives its dataset, its kept slot cannot be staged) is let go with a log line; it
    /// starts over when it joins again.
    pub(super) async fn resume_jobs(&self, saved: SavedShare) {
        let Some(sh) = &self.shared else { return };
        let top = saved
            .jobs
            .iter()
            .map(|j| j.generation)
            .fold(saved.generation, u64::max);
        sh.generation.store(top, Ordering::SeqCst);
        // Every kept slot is in the book before any is checked, so that each is a donor of the
        // others (a sample two jobs share is one file).
        let present: HashSet<String> = self.store.stager.present_slots().into_iter().collect();
        for j in &saved.jobs {
            let cur = j.cohort.current.as_ref().expect("checked when read");
            self.store.begin_slot(&j.slot(), &cur.samples);
            if let (Some(next), Some(slot)) = (&j.cohort.next, j.next_slot()) {
                if present.contains(&slot) {
                    self.store.begin_slot(&slot, &next.samples);
                }
            }
        }
        for j in &saved.jobs {
            match self.resume_job(j).await {
                Ok(fetched) => tracing::info!(
                    job = %j.name,
                    epoch = j.epoch,
                    mini_epoch = j.mini_epoch,
                    generation = j.generation,
                    fetched,
                    idle_secs = sh.cfg.idle_secs,
                    "job resumed from its kept slots; it is dropped unless its hello (name and token) comes within share.idle_secs"
                ),
                Err(e) => {
                    tracing::warn!(job = %j.name, error = %e, "cannot resume the job; it starts over when it joins again");
                    let _ = sh.cohort.lock().unwrap().leave(&j.name);
                    for slot in [Some(j.slot()), j.next_slot()].into_iter().flatten() {
                        self.store.forget_slot(&slot);
                        let _ = self.store.stager.evict_in_background(&slot);
                    }
                }
            }
        }
        self.write_share();
    }

    /// Resumes one saved job (see [`Daemon::resume_jobs`]); returns how many samples of its
    /// current view were fetched from the tier (none when its kept slot was whole).
    async fn resume_job(&self, j: &SavedJob) -> Result<u64, String> {
        let sh = self.shared.as_ref().expect("a shared mount");
        let name = j.name.as_str();
        let dataset = self
            .subset_samples(name, j.subset.as_ref())
            .map_err(|e| e.message)?;
        if dataset_key(&self.cfg.source, &dataset) != j.dataset {
            return Err("its subset no longer gives the dataset it read".into());
        }
        let cfg = self
            .job_config(name, j.rf_policy.as_deref(), j.rf)
            .map_err(|e| e.message)?;
        let (replay, schedule) = match &sh.history {
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
        sh.cohort
            .lock()
            .unwrap()
            .rejoin(name, &dataset, sh.view_bytes, j.cohort.clone())
            .map_err(|e| e.to_string())?;
        let cur = j.cohort.current.clone().expect("checked when read");
        let slot = j.slot();
        // Checked as a plain mount's resume checks its slot: the journal's copies (unread if
        // the slot's seal holds), and only what is missing or damaged fetched again.
        let spec = SlotSpec {
            name: slot.clone(),
            samples: cur.samples.clone(),
            reuse_from: Vec::new(),
        };
        let report = self
            .store
            .stage(&spec, Arc::default())
            .await
            .map_err(|e| format!("its kept slot {slot}: {e}"))?;
        let catalog = &self.store.catalog;
        self.store.note_failed(
            report
                .failed
                .iter()
                .map(|(id, why)| (catalog.path(*id), why.clone())),
        );
        let target = (j.epoch, j.mini_epoch);
        let view = Arc::new(
            self.store
                .view_for(&cur.samples, target, j.generation, &slot)
                .nested(),
        );
        let history = sh.history.as_ref().map(|store| History {
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
        let drawn = Drawn::resumed(
            j.mini_epoch,
            DrawnView {
                epoch: cur.epoch,
                samples: cur.samples.clone(),
                bytes: cur.bytes,
            },
        );
        let mut ss = self.sessions.lock().unwrap();
        self.fs.switch_job(name, view.clone());
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
        sh.jobs.lock().unwrap().insert(
            name.to_string(),
            JobMeta {
                token: j.token.clone(),
                last_seen: Instant::now(),
                held_back: false,
                samples: dataset.len() as u64,
                subset: j.subset.clone(),
                rf_policy: j.rf_policy.clone(),
                rf: j.rf,
                dataset: j.dataset.clone(),
            },
        );
        Ok(report.fetched as u64)
    }

    /// Prepares the next view of every job that has none: drawn by the cohort, handed to the
    /// job's schedule as its successor. Run by the staging loop.
    pub(super) fn serve_cohort(&self) {
        let Some(sh) = &self.shared else { return };
        let window_open = sh
            .last_join
            .lock()
            .unwrap()
            .is_some_and(|t| t.elapsed() < JOIN_WINDOW);
        let mut ss = self.sessions.lock().unwrap();
        for s in ss.values_mut() {
            let seq = s.mini_epoch;
            let Some(drawn) = s.schedule.drawn_mut() else {
                continue;
            };
            if !drawn.shown() && window_open {
                // Its first view waits for the jobs joining with it.
                continue;
            }
            if drawn.has_successor(seq) {
                continue;
            }
            let mut cohort = sh.cohort.lock().unwrap();
            match cohort.prepare(&s.name) {
                Ok(CohortNext::Stage { .. }) | Ok(CohortNext::Prepared) => {
                    let Some(v) = cohort.next_view(&s.name) else {
                        continue;
                    };
                    drawn.draw_successor(
                        seq,
                        DrawnView {
                            epoch: v.epoch,
                            samples: v.samples.clone(),
                            bytes: v.bytes,
                        },
                    );
                }
                Ok(CohortNext::Wait) => {}
                Err(e) => {
                    tracing::error!(job = %s.name, error = %e, "cannot draw the job's next view");
                    self.store.note_error(format!("job {}: {e}", s.name));
                }
            }
        }
    }

    /// Moves job `name` to its next view in the cohort, at its switch; returns what the other
    /// jobs have drawn ahead, which the slot it leaves may be kept for.
    pub(super) fn advance_job(&self, name: &str) -> Vec<u32> {
        let Some(sh) = &self.shared else {
            return Vec::new();
        };
        let mut cohort = sh.cohort.lock().unwrap();
        if let Err(e) = cohort.advance(name) {
            tracing::error!(job = name, error = %e, "the cohort cannot advance the job");
        }
        cohort.drawn_ahead(name, None).into_iter().collect()
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
    pub(super) fn holds_back(&self, ss: &Sessions, s: &Session) -> bool {
        let Some(sh) = &self.shared else { return false };
        if sh.cfg.pace != SharePace::Wait || s.view.slot.is_empty() {
            return false;
        }
        // Lock order: cohort, then jobs (module docs of `daemon`).
        let cohort = sh.cohort.lock().unwrap();
        let mut jobs = sh.jobs.lock().unwrap();
        // Only what the others read in this same epoch of theirs: a job in its next epoch
        // wants every sample again, which no store smaller than the dataset keeps anyway,
        // and holding the slower job back for it would only stall both.
        let ahead = cohort.drawn_ahead_by(&s.name, Some(s.epoch), |n| {
            ss.contains_key(n) && jobs.get(n).is_some_and(|m| !m.held_back)
        });
        drop(cohort);
        let current = s
            .schedule
            .drawn()
            .and_then(|d| d.view(s.mini_epoch))
            .map(|v| v.samples.clone())
            .unwrap_or_default();
        let needed: Vec<u32> = current.into_iter().filter(|x| ahead.contains(x)).collect();
        // A slot the store would hold as a donor is no help: the next staging may let it go
        // before the slower job has linked from it.
        let held = !needed.is_empty() && !self.store.elsewhere(&s.view.slot, &needed);
        if let Some(m) = jobs.get_mut(&s.name) {
            m.held_back = held;
        }
        held
    }

    /// Every job of a shared mount, for `status`.
    pub(super) fn job_statuses(&self, ss: &Sessions) -> Option<Vec<JobStatus>> {
        let sh = self.shared.as_ref()?;
        let jobs = sh.jobs.lock().unwrap();
        Some(
            ss.values()
                .filter(|s| s.schedule.is_job())
                .map(|s| {
                    let meta = jobs.get(&s.name);
                    JobStatus {
                        name: s.name.clone(),
                        epoch: s.epoch,
                        mini_epoch: (!s.schedule.before_first_view()).then_some(s.mini_epoch),
                        pass: s.passes,
                        rf_policy: s.policy.name().to_string(),
                        rf: s.policy.expected_rf(),
                        bonus_passes: s.bonus_passes,
                        generation: s.generation,
                        files: s.view.file_count() as u64,
                        view_bytes: s.view.bytes(),
                        samples: meta.map_or(0, |m| m.samples),
                        share_bytes: 2 * sh.view_bytes,
                        next_ready: s.next_ready(),
                        held_back: meta.is_some_and(|m| m.held_back),
                        idle_secs: meta.map_or(0.0, |m| m.last_seen.elapsed().as_secs_f64()),
                    }
                })
                .collect(),
        )
    }
}
