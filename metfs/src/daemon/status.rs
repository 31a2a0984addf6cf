//! What the daemon reports: the status, the files of the view, `hello` (the protocol's
//! [`Status`], [`FilesView`] and [`Hello`]), the metrics file, and the shutdown that persists
//! the position.

use crate::config::ReadPath;
use crate::daemon::session::{session_ref, Next, Session, Sessions};
use crate::daemon::surface::files_answer;
use crate::daemon::wire::{wire_compose, wire_read_path};
use crate::daemon::Daemon;
use metfs_fs::fs::ViewLease;
use metfs_fs::view::View;
use metfs_plan::budget::round_up;
use metfs_protocol::event::Event;
use metfs_protocol::{event, ErrorCode, FilesForm, FilesView, ProtocolError, Staging, Status};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

impl Daemon {
    /// Runs periodic work: just-in-time pacing, tier-bandwidth events, the metrics file.
    pub(super) async fn monitor_loop(self: Arc<Self>) {
        // Pacing is retuned four times a second: rate changes cost nothing (see `Pacer`), and
        // the first pass's estimate then takes effect within a quarter of a second.
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        let mut last_tier = u64::MAX;
        let mut n: u64 = 0;
        loop {
            tick.tick().await;
            n += 1;
            self.pacing
                .retune(self.store.stager.pacer(), &self.sessions.lock().unwrap());
            if n.is_multiple_of(8) {
                let tier = self.store.stager.tier_bytes_read();
                if tier != last_tier {
                    last_tier = tier;
                    self.events.emit(Event::Tier(event::Tier {
                        tier_bytes_read: tier,
                    }));
                }
            }
            if n.is_multiple_of(20) {
                self.write_metrics();
            }
            if n.is_multiple_of(4) {
                self.mode.tick(&self);
            }
        }
    }

    pub(super) fn write_metrics(&self) {
        let Some(path) = &self.cfg.metrics_file else {
            return;
        };
        let text = crate::metrics::render(&self.status());
        if let Err(e) = crate::metrics::write_atomic(path, &text) {
            tracing::warn!(path = %path.display(), error = %e, "cannot write the metrics file");
        }
    }
    /// The `status` object of the default session.
    /// On a shared mount, the store's state with every job and no job's position.
    pub fn status(&self) -> Status {
        let ss = self.sessions.lock().unwrap();
        let s = self
            .mode
            .default_status_session()
            .map(|name| session_ref(&ss, name).expect("the default session always exists"));
        self.status_from(&ss, s)
    }

    /// The `status` object a request asks for: of job `job` on a shared mount, else as
    /// [`Daemon::status`].
    pub fn status_for(&self, job: Option<&str>) -> Result<Status, ProtocolError> {
        match self.mode.status_session(job)? {
            Some(name) => self.status_of(&name),
            None => Ok(self.status()),
        }
    }

    /// The `status` object of session `name`: its position and policy, the store's budget and
    /// slots, and the daemon's read path and counters.
    pub fn status_of(&self, name: &str) -> Result<Status, ProtocolError> {
        let ss = self.sessions.lock().unwrap();
        let s = session_ref(&ss, name)?;
        Ok(self.status_from(&ss, Some(s)))
    }

    fn status_from(&self, ss: &Sessions, s: Option<&Session>) -> Status {
        let empty;
        let view = match s {
            Some(s) => s.view(),
            None => {
                empty = self.surface.core().current();
                &empty
            }
        };
        let draining_slots = self.store.draining_count();
        let defer_after = self
            .cfg
            .mode
            .defers()
            .then(|| Duration::from_secs(self.store.stager.config().defer_after_secs));
        let staging = staging_status(s.map(|s| s.next()), draining_slots, defer_after);
        let cache_bytes = self.cache_bytes(ss);
        let (last_error, failed_samples) = self.store.errors();
        let budget = self.store.budget;
        let mode = self.mode.status(ss);
        Status {
            epoch: s.map_or(0, |s| s.epoch()),
            mini_epoch: s.map_or(0, |s| s.mini_epoch()),
            mini_epochs: s.map_or(0, |s| s.schedule().mini_epochs()),
            pass: s.map_or(0, |s| s.passes()),
            rf: s.map_or(0.0, |s| s.policy().expected_rf()),
            rf_policy: s.map(|s| s.policy().kind()),
            job: s.map_or(String::new(), |s| s.job().to_string()),
            replay: s.and_then(|s| s.history()).and_then(|h| h.replay.clone()),
            advance_wanted: s.is_some_and(|s| s.advance_wanted()),
            generation: s.map_or(view.generation, |s| s.generation()),
            next_ready: s.is_some_and(|s| s.next_ready()),
            cache_bytes,
            budget_bytes: budget.budget,
            slot_bytes: budget.slot_bytes,
            reserve_bytes: budget.reserve,
            tier_bytes_read: self.store.stager.tier_bytes_read(),
            reused_bytes: self.store.stager.reused_bytes(),
            daemon_bytes_read: self.surface.core().bytes_read.load(Ordering::Relaxed),
            daemon_bytes_spliced: self.surface.core().bytes_spliced.load(Ordering::Relaxed),
            daemon_opens: self.surface.core().opens.load(Ordering::Relaxed),
            daemon_lookups: self.surface.core().lookups.load(Ordering::Relaxed),
            primed_entries: self.surface.primed().0,
            primed_generation: self.surface.primed().1,
            view_files: view.file_count() as u64,
            view_bytes: view.bytes(),
            dataset_files: self.store.catalog.len() as u64,
            dataset_bytes: self.store.catalog.total_bytes(),
            bonus_passes: s.map_or(0, |s| s.bonus_passes()),
            mini_epoch_bonus_passes: s.map_or(0, |s| s.meter().mini_epoch_bonus),
            effective_rf: s.and_then(|s| s.meter().effective_rf()),
            last_rf: s.and_then(|s| s.meter().last_rf),
            completed_mini_epochs: s.map_or(0, |s| s.meter().completed),
            stalled_mini_epochs: s.map_or(0, |s| s.meter().stalled),
            blocked_seconds: s.map_or(0.0, |s| s.meter().blocked_secs),
            pass_seconds: s.and_then(|s| s.meter().pass_secs.back().copied()),
            pass_seconds_mean: s.and_then(|s| s.meter().mean_pass()),
            b2_bytes_per_s: s.and_then(|s| s.meter().b2()),
            b2_recent_bytes_per_s: s.and_then(|s| s.meter().last_b2),
            eb1_bytes_per_s: s.and_then(|s| s.eb1()),
            stall_free_rf: s.and_then(|s| s.stall_free_rf()),
            prefetch_rate: self.store.stager.pacer().rate(),
            staging,
            kept_slots: self.store.kept_count() as u64,
            trimmed_samples: self.store.trimmed_count(),
            draining_slots: draining_slots as u64,
            draining: self.surface.draining_detail(),
            open_handles: self.surface.core().open_handles() as u64,
            passthrough: self.surface.read_path_now() == ReadPath::Passthrough,
            read_path: wire_read_path(self.surface.read_path_now()),
            last_error,
            failed_samples,
            deferred_samples: s.map_or(0, |s| s.deferred_counts().0),
            deferrals: s.map_or(0, |s| s.deferred_counts().1),
            recovered_samples: s.map_or(0, |s| s.deferred_counts().2),
            transform_failed: self.store.stager.transform().map(|t| t.failed()),
            dds: mode.dds,
            jobs: mode.jobs,
            not_resumed: mode.not_resumed,
            aggregate: mode.aggregate,
            source: self.tier_url.clone(),
            mountpoint: self.surface.mountpoint().display().to_string(),
            socket: self.cfg.socket.display().to_string(),
            node_rank: self.cfg.node_rank,
            nodes: self.cfg.nodes,
            compose: wire_compose(self.cfg.compose),
            uptime_s: self.life.started().elapsed().as_secs_f64(),
            pid: std::process::id(),
        }
    }

    /// What the cache takes on disk now: the slots staged, every staging's bytes so far, and
    /// the metadata files.
    fn cache_bytes(&self, ss: &Sessions) -> u64 {
        // Every session's slot being staged counts by its bytes so far, not its footprint.
        let staging_slots: Vec<&str> = ss.values().filter_map(|s| s.staging_slot()).collect();
        // Every session's staging so far (one on a plain mount); linked samples share their
        // donor's file: on disk once.
        let staging_bytes_done: u64 = ss
            .values()
            .filter_map(|s| match s.next() {
                Next::Staging { progress, .. } => Some(
                    progress
                        .bytes_done
                        .load(Ordering::Relaxed)
                        .saturating_sub(progress.bytes_linked.load(Ordering::Relaxed)),
                ),
                _ => None,
            })
            .sum();
        let staged_slots = self.store.slot_bytes_except(&staging_slots);
        let meta: u64 = [&self.paths.catalog, &self.paths.state, &self.cfg.log_file]
            .iter()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| round_up(m.len()))
            .sum();
        staged_slots + round_up(staging_bytes_done) + meta
    }

    /// The `files` object a request asks for: of job `job`'s view on a shared mount (which
    /// must name it), else of the view the mount's root shows; with [`FilesForm::Packed`] the
    /// bytes that follow its line.
    pub fn files(
        &self,
        job: Option<&str>,
        known: Option<u64>,
        form: FilesForm,
    ) -> Result<(FilesView, Option<Vec<u8>>), ProtocolError> {
        let (view, epoch, mini_epoch, mountpoint) = self.view_of(job)?;
        Ok(files_answer(
            &view, epoch, mini_epoch, mountpoint, known, form,
        ))
    }

    /// The view a `files` request of `job` reads, its position and where it is shown: job
    /// `job`'s under `MNT/<job>` on a shared mount, else the one the mount's root shows. Read
    /// under the sessions' lock and returned without it: a walk of a large view must not hold
    /// up every other request of every job.
    fn view_of(&self, job: Option<&str>) -> Result<(Arc<View>, u64, u32, String), ProtocolError> {
        let Some(name) = self.mode.files_session(job)? else {
            return Ok(self.surface.current_view());
        };
        let (view, epoch, mini_epoch) = {
            let ss = self.sessions.lock().unwrap();
            let s = session_ref(&ss, &name)?;
            (s.view().clone(), s.epoch(), s.mini_epoch())
        };
        let mountpoint = self.surface.mountpoint().join(&name).display().to_string();
        Ok((view, epoch, mini_epoch, mountpoint))
    }

    /// The `files` object with `direct` (of job `job` on a shared mount): the view's files and
    /// the slot directory that holds them, with a lease on the view taken into `held` (the
    /// connection's), replacing the lease it held. The lease is taken before the reply is
    /// built, so the slot named in it cannot be evicted while the client reads it; copies a
    /// seal vouched for are checked first, as their first open through the mount would.
    pub async fn files_direct(
        &self,
        job: Option<&str>,
        known: Option<u64>,
        form: FilesForm,
        held: &mut Option<ViewLease>,
    ) -> Result<(FilesView, Option<Vec<u8>>), ProtocolError> {
        let mut refused: Option<u64> = None;
        loop {
            let (view, epoch, mini_epoch, mountpoint) = self.view_of(job)?;
            // `None`: switched away and evicted since it was read; the next read finds the
            // view that replaced it. The same view refused twice is not shown at all (a job
            // of a shared mount still waiting for its first view): no lease to give.
            let Some(lease) = self.surface.core().lease(&view) else {
                if refused == Some(view.generation) {
                    return Err(ProtocolError::new(
                        ErrorCode::BadRequest,
                        format!(
                            "generation {} is not shown by the mount (yet): ask for `files` again once `status` shows the job's first view",
                            view.generation
                        ),
                    ));
                }
                refused = Some(view.generation);
                tokio::task::yield_now().await;
                continue;
            };
            let fs = self.surface.fs();
            let checked = view.clone();
            tokio::task::spawn_blocking(move || fs.check_copies(&checked))
                .await
                .map_err(|e| ProtocolError::new(ErrorCode::Internal, e.to_string()))?
                .map_err(|e| {
                    ProtocolError::new(
                        ErrorCode::Internal,
                        format!(
                            "slot {} has a damaged copy that could not be fetched again ({e}); read through the mount, which answers EIO for that file only",
                            view.slot
                        ),
                    )
                })?;
            *held = Some(lease);
            let (mut answer, payload) =
                files_answer(&view, epoch, mini_epoch, mountpoint, known, form);
            answer.direct_root = Some(view.slot_dir.display().to_string());
            return Ok((answer, payload));
        }
    }

    /// Saves every session's position and rf history (at shutdown).
    pub fn persist(&self) {
        let names: Vec<String> = self.sessions.lock().unwrap().keys().cloned().collect();
        for name in names {
            {
                let mut ss = self.sessions.lock().unwrap();
                let Some(s) = ss.get_mut(&name) else {
                    continue;
                };
                let rec = s.record().clone();
                if let Some(h) = s.history() {
                    if !rec.scores.is_empty() {
                        if let Err(e) = h.store.lock().unwrap().record_mini_epoch(h.run, rec) {
                            tracing::warn!(session = %name, error = %e, "cannot record the rf history");
                        }
                    }
                }
            }
            self.save_session(&name, true);
        }
    }
}

/// `status`'s account of a session's staging (`next`; none without a session). A failed
/// staging's next try defers when the failure will then have lasted `defer_after` (`None`:
/// the mode never defers), as the staging loop decides at that try.
fn staging_status(
    next: Option<&Next>,
    draining_slots: usize,
    defer_after: Option<Duration>,
) -> Staging {
    match next.unwrap_or(&Next::Idle) {
        Next::Idle if draining_slots == 0 => Staging::Idle,
        Next::Idle => Staging::Draining,
        Next::Staging {
            target,
            slot,
            progress,
            started,
        } => {
            let done = progress.bytes_done.load(Ordering::Relaxed);
            let total = progress.bytes_total.load(Ordering::Relaxed);
            let secs = started.elapsed().as_secs_f64();
            let fetched = progress.bytes_fetched.load(Ordering::Relaxed);
            let rate = if secs > 0.0 {
                fetched as f64 / secs
            } else {
                0.0
            };
            let eta = if rate > 0.0 {
                Some((total.saturating_sub(done)) as f64 / rate)
            } else {
                None
            };
            Staging::Staging {
                slot: slot.clone(),
                epoch: target.0,
                mini_epoch: target.1,
                files_done: progress.files_done.load(Ordering::Relaxed),
                files_total: progress.files_total.load(Ordering::Relaxed),
                bytes_done: done,
                bytes_total: total,
                bytes_per_s: rate,
                eta_s: eta,
                bytes_reused: progress.bytes_reused.load(Ordering::Relaxed),
                retries: progress.retries.load(Ordering::Relaxed),
                last_retry_error: progress.last_retry_error.lock().unwrap().clone(),
            }
        }
        Next::Ready {
            target,
            slot,
            report,
            ..
        } => Staging::Ready {
            slot: slot.clone(),
            epoch: target.0,
            mini_epoch: target.1,
            fetched: report.fetched,
            resumed: report.resumed,
            reused: report.reused,
            failed: report.failed.len() as u64,
            secs: report.elapsed.as_secs_f64(),
        },
        Next::Failed {
            target,
            error,
            at,
            failures,
            pause,
            since,
        } => Staging::Failed {
            epoch: target.0,
            mini_epoch: target.1,
            error: error.clone(),
            failures: *failures,
            retry_in_secs: pause.saturating_sub(at.elapsed()).as_secs_f64(),
            defers: defer_after.is_some_and(|d| at.saturating_duration_since(*since) + *pause >= d),
        },
    }
}

// The daemon's enums as the protocol spells them: their crates do not depend on
// `metfs-protocol`, so the conversions are here, each a match that a new variant fails.
