//! The staging loop ([`StagingLoop`], a task of its own): stages each session's successor into
//! its slot as the budget allows, one at a time, backs off on slot failures, carries deferred
//! samples, builds the successor's view ahead of its switch, and evicts drained slots. Pacing
//! the tier is `pacing.rs`'s.
//!
//! Invariants: one staging runs at a time (the stager stages one slot at a time, and the
//! budget counts one slot being staged per session); a session's `Next` leaves `Staging` only
//! through [`StagingLoop`]'s hand-over; nothing of a new slot is written while a retired slot
//! still takes space, unless the mode checks each staging's own room (a shared mount).

use super::store::{self, Room, Stop};
use crate::daemon::session::{Carry, Next, Session};
use crate::daemon::{aggregate, deferred, Daemon};
use metfs_fs::view::View;
use metfs_plan::size::format_bytes;
use metfs_prefetcher::stager::{Progress, SlotSpec, StageReport};
use metfs_protocol::event;
use metfs_protocol::event::Event;
use metfs_tier::backoff::doubled;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A slot to stage for a session's successor.
struct StagingJob {
    session: String,
    target: (u64, u32),
    spec: SlotSpec,
    progress: Arc<Progress>,
    /// The mini-epoch's bytes.
    bytes: u64,
}

/// Failures in a row of the last target that failed, and when the first was: the pause
/// before its next try grows with them, and past the defer bound the next try defers.
#[derive(Default)]
struct Retries(Option<((u64, u32), u32, Instant)>);

impl Retries {
    /// Counts a failure of `target`; returns the failures in a row, this one included, and
    /// when the first of them happened.
    fn fail(&mut self, target: (u64, u32)) -> (u32, Instant) {
        let (failures, since) = match self.0 {
            Some((t, n, since)) if t == target => (n + 1, since),
            _ => (1, Instant::now()),
        };
        self.0 = Some((target, failures, since));
        (failures, since)
    }

    fn succeeded(&mut self) {
        self.0 = None;
    }
}

/// The staging loop: a task of its own that stages each session's successor in turn, one
/// at a time, and hands the outcome to the session. It owns the count of failures in a row
/// (the pause before a retry grows with it); everything else it reads and writes is the
/// daemon's, under the daemon's locks.
pub(super) struct StagingLoop {
    d: Arc<Daemon>,
    retries: Retries,
}

impl StagingLoop {
    /// The loop of daemon `d`, nothing failed yet.
    pub(super) fn new(d: Arc<Daemon>) -> Self {
        Self {
            d,
            retries: Retries::default(),
        }
    }

    /// Stages the sessions' successors forever, one at a time; run as a task.
    pub(super) async fn run(mut self) {
        let mut rx = self.d.life.subscribe();
        loop {
            if self.d.life.is_shutting_down() {
                return;
            }
            // The mode's round (a queue's DONE marks and claim, outside every lock; a cohort's
            // draws); it may ask to be woken sooner.
            let mode_pause = self
                .d
                .mode
                .before_round(&self.d.sessions, &self.d.store)
                .await;
            match self.next_staging() {
                Some(job) => self.run_staging(job).await,
                None => {
                    // A failed slot is retried after its pause even if nothing else changes.
                    let wake = self.retry_due().min(mode_pause.unwrap_or(Duration::MAX));
                    let wake = wake.max(Duration::from_millis(50));
                    let _ = tokio::time::timeout(wake, rx.changed()).await;
                }
            }
        }
    }

    /// The first session's successor to stage now, marked staging (`begin_staging`).
    fn next_staging(&self) -> Option<StagingJob> {
        let mut ss = self.d.sessions.lock().unwrap();
        // No byte of a new slot while a retired one still takes space (the budget). (On a
        // shared mount each staging checks its own room instead: one job's frozen reader must
        // not stop the others.)
        if !self.d.mode.stages_while_draining() && self.d.store.is_draining() {
            return None;
        }
        let job = ss.values_mut().find_map(|s| self.begin_staging(s))?;
        // The rate left from the previous staging (possibly the cap, if it ran late) must not
        // carry over into this one until the next tick.
        self.d.pacing.retune(self.d.store.stager.pacer(), &ss);
        Some(job)
    }

    /// How long until the first failed slot is due again (at most 5 s).
    fn retry_due(&self) -> Duration {
        self.d
            .sessions
            .lock()
            .unwrap()
            .values()
            .filter_map(|s| match s.next() {
                Next::Failed { at, pause, .. } => Some(pause.saturating_sub(at.elapsed())),
                _ => None,
            })
            .min()
            .unwrap_or(Duration::from_secs(5))
    }

    /// Stages `job` (after the exchange's inbox is filled, in aggregate mode) and hands the
    /// result to its session: its successor ready, or failed until a pause has passed.
    async fn run_staging(&mut self, job: StagingJob) {
        let StagingJob {
            session: name,
            target,
            spec,
            progress,
            bytes,
        } = job;
        tracing::info!(
            session = %name,
            epoch = target.0,
            mini_epoch = target.1,
            files = spec.samples.len(),
            bytes = %format_bytes(bytes),
            "staging the next mini-epoch"
        );
        let exchange = match self.d.mode.exchange_for(target) {
            Some(a) => {
                let stop = || self.d.life.is_shutting_down();
                Some(
                    a.wait_for_exchange(&self.d.paths.slots, target.0, &stop, &self.d.store)
                        .await,
                )
            }
            None => None,
        };
        if exchange.is_some() && self.d.life.is_shutting_down() {
            return;
        }
        let result = self.d.store.stage(&spec, progress).await;
        if exchange.is_some() && result.is_ok() {
            aggregate::Aggregate::close_inbox(&self.d.paths.slots, target.0);
        }
        let next = match result {
            Ok(report) => {
                self.retries.succeeded();
                // In aggregate mode the wait for the exchange is part of filling the slot.
                let waited = exchange.map_or(0.0, |w| w.secs);
                self.staged(&spec, target, bytes, &report, waited);
                self.carry_deferred(&name, &spec, target, &report);
                Next::Ready {
                    target,
                    slot: spec.name.clone(),
                    report,
                    view: self.prebuild_view(&name, target).await,
                }
            }
            Err(e) => {
                let (failures, since) = self.retries.fail(target);
                self.staging_failed(&e, target, failures, since)
            }
        };
        self.hand_over(&name, &spec.name, next).await;
        // A staging's per-file transients are freed by now (the view's build included).
        let _ = tokio::task::spawn_blocking(super::memory::release_freed_heap).await;
    }

    /// Logs and records a staged slot: its failed samples, the `staged` event.
    fn staged(
        &self,
        spec: &SlotSpec,
        target: (u64, u32),
        bytes: u64,
        report: &StageReport,
        exchange_secs: f64,
    ) {
        tracing::info!(
            slot = %spec.name,
            epoch = target.0,
            mini_epoch = target.1,
            fetched = report.fetched,
            resumed = report.resumed,
            reused = report.reused,
            failed = report.failed.len(),
            secs = report.elapsed.as_secs_f64(),
            "next mini-epoch staged"
        );
        let catalog = &self.d.store.catalog;
        self.d.store.note_failed(
            report
                .failed
                .iter()
                .map(|(id, why)| (catalog.path(*id), why.clone())),
        );
        self.d.events.emit(Event::Staged(event::Staged {
            epoch: target.0,
            mini_epoch: target.1,
            bytes,
            bytes_fetched: report.bytes_fetched,
            bytes_reused: report.bytes_reused,
            secs: report.elapsed.as_secs_f64() + exchange_secs,
        }));
    }

    /// Hands session `name` what the staging of `spec` deferred (carried into the next
    /// mini-epochs) and recovered (given at last), with an event for each.
    fn carry_deferred(
        &self,
        name: &str,
        spec: &SlotSpec,
        target: (u64, u32),
        report: &StageReport,
    ) {
        let deferred = self.d.store.whole_samples(&report.deferred);
        let Carry {
            added,
            carried: deferred,
            recovered,
            extras,
        } = match self.d.sessions.lock().unwrap().get_mut(name) {
            Some(s) => s.deferred_staged(&self.d.store, target, &spec.samples, &deferred),
            None => return,
        };
        let catalog = &self.d.store.catalog;
        self.d.store.left_out_extras(&extras);
        let class_shift = deferred::class_shift(self.d.cfg.compose, catalog, &added, &deferred);
        if let Some(c) = &class_shift {
            tracing::warn!(session = %name, epoch = target.0, mini_epoch = target.1, class = %c.class, samples = c.samples, classes_moved = c.classes_moved, "carried samples moved this mini-epoch's composition off its plan (samples of the class beyond its share; negative: short of it)");
        }
        let paths = |ids: &[u32]| ids.iter().take(10).map(|&id| catalog.path(id)).collect();
        if !deferred.is_empty() {
            let error = report
                .failed
                .iter()
                .find(|(id, _)| *id == deferred[0])
                .map_or(String::new(), |(_, why)| why.clone());
            tracing::warn!(session = %name, samples = deferred.len(), first = %catalog.path(deferred[0]), "samples deferred to a later mini-epoch: the tier kept failing on them");
            self.d.events.emit(Event::Deferred(event::Deferred {
                epoch: target.0,
                mini_epoch: target.1,
                samples: deferred.len() as u64,
                paths: paths(&deferred),
                error,
                class_shift: class_shift.clone(),
            }));
        }
        if !recovered.is_empty() {
            tracing::info!(session = %name, samples = recovered.len(), "deferred samples recovered");
            self.d
                .store
                .forget_failed(recovered.iter().map(|&id| catalog.path(id)));
            self.d.events.emit(Event::Recovered(event::Recovered {
                epoch: target.0,
                mini_epoch: target.1,
                samples: recovered.len() as u64,
                paths: paths(&recovered),
                class_shift,
            }));
        }
    }

    /// A failed staging of `target`, the `failures`-th in a row: logged, recorded, and paused.
    /// The slot keeps what it committed and is resumed after a pause that grows with each
    /// failure in a row (2 s, 4 s, ... at most 60 s): a full disk or a source outage passes in
    /// its own time, and retrying it flat out would only flood the log and the tier.
    fn staging_failed(
        &self,
        e: &metfs_prefetcher::stager::StageError,
        target: (u64, u32),
        failures: u32,
        since: Instant,
    ) -> Next {
        let pause = doubled(
            Duration::from_secs(2),
            Duration::from_secs(60),
            failures - 1,
        );
        let cause = if e.is_out_of_space() {
            "the cache is out of space; free space on its file system"
        } else {
            "the tier or the cache failed"
        };
        tracing::error!(
            error = %e,
            epoch = target.0,
            mini_epoch = target.1,
            failures,
            retry_in_secs = pause.as_secs(),
            "staging the next mini-epoch failed: {cause}; the current view keeps serving (bonus passes) and staging resumes after the pause"
        );
        self.d.events.emit(Event::StageFailed(event::StageFailed {
            epoch: target.0,
            mini_epoch: target.1,
            error: e.to_string(),
            out_of_space: e.is_out_of_space(),
            failures,
            retry_in_secs: pause.as_secs(),
        }));
        self.d.store.note_error(e.to_string());
        Next::Failed {
            target,
            error: e.to_string(),
            at: Instant::now(),
            failures,
            since,
            pause,
        }
    }

    /// Hands the outcome of staging `slot` to session `name`, counting a staged slot in its
    /// meter; a session gone meanwhile (its job left the shared mount) has its slot deleted.
    async fn hand_over(&self, name: &str, slot: &str, next: Next) {
        let (gone, staged) = match self.d.sessions.lock().unwrap().get_mut(name) {
            Some(s) => {
                let staged = s.schedule().in_shared_store() && matches!(next, Next::Ready { .. });
                s.staging_ended(next);
                (false, staged)
            }
            None => (true, false),
        };
        if staged {
            // A restart keeps a staged next view only if the save file names it.
            self.d.save_session_soon(name, false);
        }
        if gone {
            self.d.store.drop_slot(slot).await;
        }
        self.d.life.bump();
    }

    /// Builds the view of session `name`'s staged successor `target` for the generation a
    /// switch would give it now, off the async threads: building a 20,000-file view reads the
    /// slot's journal and takes milliseconds the switch should not.
    async fn prebuild_view(&self, name: &str, target: (u64, u32)) -> Option<Arc<View>> {
        let (members, generation, after, slot, nested) = {
            let mut ss = self.d.sessions.lock().unwrap();
            let s = ss.get_mut(name)?;
            // The switch also looks one mini-epoch further (what the retired slot may keep):
            // that epoch's plan is made here too, unless it is already known.
            let after = s.schedule().plan_wanted(target);
            let generation = self.d.mode.generation_after(s.generation());
            (
                s.view_members(&self.d.store, target),
                generation,
                after,
                s.slot_of(target),
                s.schedule().nested_views(),
            )
        };
        let me = self.d.clone();
        let (view, after) = tokio::task::spawn_blocking(move || {
            let view = me.store.view_for(&members, target, generation, &slot);
            let view = Arc::new(if nested { view.nested() } else { view });
            let after = after.and_then(|(epoch, cfg)| {
                let p = me.store.plan_epoch(&cfg, epoch).ok()?;
                Some((epoch, Arc::new(p)))
            });
            (view, after)
        })
        .await
        .ok()?;
        if let Some((epoch, plan)) = after {
            if let Some(s) = self.d.sessions.lock().unwrap().get_mut(name) {
                s.schedule_mut().remember_plan(epoch, plan);
            }
        }
        Some(view)
    }

    /// Starts staging session `s`'s successor unless it is staged, being staged, or waiting
    /// out a failure: marks it `Staging`, counts its slot in the store, and returns what to
    /// stage.
    fn begin_staging(&self, s: &mut Session) -> Option<StagingJob> {
        let target = s.successor()?;
        let busy = match s.next() {
            Next::Ready { target: t, .. } => *t == target,
            Next::Staging { .. } => true,
            Next::Failed {
                target: t,
                at,
                pause,
                ..
            } => *t == target && at.elapsed() < *pause,
            Next::Idle => false,
        };
        if busy {
            return None;
        }
        // A target the tier has failed for the defer bound is staged deferring, where the mode
        // defers.
        let defer = self.d.cfg.mode.defers()
            && matches!(s.next(), Next::Failed { target: t, since, .. }
                if *t == target && since.elapsed().as_secs() >= self.d.store.stager.config().defer_after_secs);
        let (samples, bytes) = s.members(&self.d.store, target);
        // Where the mode asks (a shared mount), the files on the node and this slot must fit
        // the budget, held slots let go to make room (the staging waits for their deletion).
        match self.d.mode.room(&self.d.store, &samples) {
            Room::Fits => {}
            Room::Wait => return None,
            Room::Trim(t) => {
                self.trim_soon(t);
                return None;
            }
        }
        let slot = s.slot_of(target);
        let progress: Arc<Progress> = Arc::default();
        // Known before the stager starts, so the first rate is paced to it.
        progress.bytes_total.store(bytes, Ordering::Relaxed);
        s.staging_started(target, slot.clone(), progress.clone());
        self.d.store.begin_slot(&slot, &samples);
        // The store adds its slots as donors (`Store::stage`); the mode may add its own (in
        // aggregate mode the inbox the exchange fills, opened now that its bytes are counted).
        let reuse_from = self.d.mode.before_staging(&self.d.paths.slots, target);
        let spec = SlotSpec {
            name: slot,
            samples,
            reuse_from,
            defer,
        };
        Some(StagingJob {
            session: s.name().to_string(),
            target,
            spec,
            progress,
            bytes,
        })
    }

    /// Deletes the files of samples trimmed from held slots on a blocking thread, then tells
    /// the store and wakes the staging loop (the staging that asked for the room retries).
    fn trim_soon(&self, trim: store::Trim) {
        let d = self.d.clone();
        tokio::task::spawn_blocking(move || {
            let t0 = Instant::now();
            let ok = trim.run();
            tracing::debug!(
                samples = trim.samples,
                secs = t0.elapsed().as_secs_f64(),
                ok,
                "trimmed held slots"
            );
            d.store.trimmed(&trim, ok);
            d.life.bump();
        });
    }
}

impl Daemon {
    /// Evicts retired views whose last handle closed; run as a task.
    pub(super) async fn drain_loop(
        self: Arc<Self>,
        mut rx: tokio::sync::mpsc::UnboundedReceiver<u64>,
    ) {
        while let Some(gen) = rx.recv().await {
            // Each on its own task: the eviction of a slot held as a donor waits until it is
            // let go, which must not delay the eviction of another slot behind it (staging
            // waits for that one, and only staging lets held slots go).
            let me = self.clone();
            tokio::spawn(async move { me.evict_view(gen).await });
        }
    }

    /// Deletes a retired view's slot once nothing reads the view ([`Store::evict_retired`]).
    pub(super) async fn evict_view(&self, gen: u64) {
        let me = self.me.lock().unwrap().clone();
        let stop: Stop = Arc::new(move || me.upgrade().is_some_and(|d| d.life.is_shutting_down()));
        // Nothing reads the view any more (its last handle, lease and kernel reference are
        // gone): its cached descriptors and backing ids go now, not when the slot is deleted,
        // so that a sample trimmed from the slot while it is held frees its blocks when it is
        // unlinked. Checked again as the view is forgotten: a lease taken since it was found
        // drained keeps it, and that lease's end asks again.
        let retire = || self.surface.core().retire_drained(gen);
        if self.store.evict_retired(gen, retire, stop).await {
            self.life.bump();
        }
    }
}

/// A terminal progress bar following a staging run.
pub(super) fn progress_bar(
    progress: Arc<Progress>,
) -> (indicatif::ProgressBar, tokio::task::JoinHandle<()>) {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "staging mini-epoch {bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta} ({msg} files)",
        )
        .expect("static template"),
    );
    let b = bar.clone();
    let task = tokio::spawn(async move {
        loop {
            b.set_length(progress.bytes_total.load(Ordering::Relaxed));
            b.set_position(progress.bytes_done.load(Ordering::Relaxed));
            b.set_message(format!(
                "{}/{}",
                progress.files_done.load(Ordering::Relaxed),
                progress.files_total.load(Ordering::Relaxed)
            ));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    (bar, task)
}
