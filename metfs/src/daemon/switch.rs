//! The view switch and the feedback that drives it: `pass_end`, `advance`, `apply`, the
//! kernel invalidation after a switch, and the stall-free rf.

use crate::config::{MountConfig, ReadPath};
use crate::daemon::pacing::pass_start;
use crate::daemon::session::{session_mut, session_ref, Left, Next, Session};
use crate::daemon::setup::{build_policy, learned_replay, start_recording};
use crate::daemon::Daemon;
use crate::events::EventLog;
use metfs_feedback::config::PolicyKind;
use metfs_feedback::policy::{JobSignals, Verdict};
use metfs_fs::fs::FsCore;
use metfs_fs::view::View;
use metfs_protocol::event::Event;
use metfs_protocol::{event, Choice, Decision, ErrorCode, Metrics, ProtocolError};
use std::sync::Arc;
use std::time::Instant;

impl Daemon {
    /// Switches session `name`'s view to its successor if it is staged. Returns whether it
    /// switched.
    pub(super) async fn try_switch(&self, name: &str) -> bool {
        let t0 = Instant::now();
        let (old, new, recorded, retired_batch, nested) = {
            let mut ss = self.sessions.lock().unwrap();
            let Some(s) = ss.get(name) else {
                return false;
            };
            if self.mode.holds_back(&self.store, &ss, s) {
                return false;
            }
            let s = ss.get_mut(name).expect("present");
            let Some(succ) = s.successor() else {
                return false;
            };
            let Next::Ready {
                target,
                slot,
                view: prebuilt,
                ..
            } = s.next()
            else {
                return false;
            };
            if *target != succ {
                return false;
            }
            let (slot, prebuilt) = (slot.clone(), prebuilt.clone());
            let view = self.successor_view(s, succ, &slot, prebuilt);
            debug_assert_eq!(view.slot, slot);
            let old = if s.schedule().nested_views() {
                self.surface.core().switch_job(name, view.clone())
            } else {
                Some(self.surface.core().switch(view.clone()))
            };
            // What the retired slot may be kept for: the mini-epoch after the new one (not
            // known yet from a queue); on a shared mount, what the other jobs have drawn.
            let after = match s.schedule_mut().kept_for(&self.store, succ) {
                Some(after) => after,
                None => self.mode.advance_job(name),
            };
            if let Some(old) = &old {
                self.store.retire_slot(old.generation, &old.slot, &after);
            }
            // Of the view being left: measured before the meter counts it.
            let stall_free_rf = s.stall_free_rf();
            let left = s.switch_to(succ, view.clone());
            emit_switch(&self.events, s, succ, &left, stall_free_rf);
            let from_lobby = left.from_lobby;
            let recorded = s.history().filter(|_| !from_lobby).map(|h| {
                h.store
                    .lock()
                    .unwrap()
                    .record_mini_epoch(h.run, left.record)
                    .inspect_err(|e| tracing::warn!(error = %e, "cannot record the rf history"))
                    .is_ok()
            });
            (
                old,
                view,
                recorded == Some(true),
                left.batch,
                s.schedule().nested_views(),
            )
        };
        self.mode.retired(retired_batch);
        let locked = t0.elapsed();
        self.save_session_soon(name, recorded);
        tracing::info!(
            session = name,
            epoch = new.epoch,
            mini_epoch = new.mini_epoch,
            generation = new.generation,
            files = new.file_count(),
            "mini-epoch is now current"
        );
        self.after_switch(name, old, nested).await;
        tracing::debug!(
            locked_us = locked.as_micros() as u64,
            total_us = t0.elapsed().as_micros() as u64,
            "switch timing (under the sessions' lock; until the kernel's entries are dropped)"
        );
        true
    }

    /// The view of session `s`'s successor `succ` in `slot`: the one built when its staging
    /// ended (`prebuilt`) if it is still of the generation the switch gives, else built now.
    fn successor_view(
        &self,
        s: &mut Session,
        succ: (u64, u32),
        slot: &str,
        prebuilt: Option<Arc<View>>,
    ) -> Arc<View> {
        match prebuilt {
            Some(v)
                if self
                    .mode
                    .prebuilt_fits((v.generation, &v.slot), s.generation(), slot) =>
            {
                v
            }
            _ => {
                let generation = self.mode.generation_after(s.generation());
                let members = s.view_members(&self.store, succ);
                let v = self.store.view_for(&members, succ, generation, slot);
                Arc::new(if s.schedule().nested_views() {
                    v.nested()
                } else {
                    v
                })
            }
        }
    }

    /// After session `name`'s switch away from `old` (a view under `MNT/<name>` if
    /// `nested`): the kernel's entries of the old view dropped, then its slot evicted once
    /// drained, or its kernel references released.
    async fn after_switch(&self, name: &str, old: Option<Arc<View>>, nested: bool) {
        // Drop the kernel's cached entries of the old view before anyone hears of the switch.
        // Every entry the old view gave out as current was delivered before `switch` returned
        // (the core's reply gate), so this reaches all of them.
        // On a shared mount the job's directory is the one entry to drop: every path into
        // the old view goes through it.
        let names = match (&old, nested) {
            (_, true) => vec![name.to_string()],
            (Some(old), false) => old.root_names(),
            (None, false) => Vec::new(),
        };
        self.surface.forget_root_entries(names).await;
        // The kernel knows none of the new view's files yet: list them for it (`prime.rs`).
        self.prime(name);
        let me = self.me.lock().unwrap().upgrade();
        let Some(old) = old else {
            self.life.bump();
            return;
        };
        if self.surface.core().is_drained(&old) {
            // Deleting a large slot takes a while; the caller must not wait for it. The stager
            // waits (the slot stays in `draining` until its files are gone), so the budget holds.
            if let Some(me) = me {
                let gen = old.generation;
                tokio::spawn(async move { me.evict_view(gen).await });
            } else {
                self.evict_view(old.generation).await;
            }
        } else if self.surface.read_path_now() == ReadPath::Cached {
            tokio::spawn(self.surface.clone().release_kernel_refs(old.generation));
        }
        self.life.bump();
    }

    /// Waits until session `name`'s successor is staged (or the daemon shuts down) and
    /// switches.
    pub(super) async fn switch_blocking(&self, name: &str) -> Result<(), ProtocolError> {
        let t = Instant::now();
        let r = loop {
            let mut rx = self.life.subscribe();
            // A job blocked for staging is not idle (a shared mount drops idle jobs).
            self.mode.touch(name);
            if self.try_switch(name).await {
                break Ok(());
            }
            if self.life.is_shutting_down() {
                break Err(ProtocolError::new(
                    ErrorCode::ShuttingDown,
                    "the daemon is shutting down",
                ));
            }
            if let Err(e) = session_ref(&self.sessions.lock().unwrap(), name) {
                break Err(e);
            }
            let _ = rx.changed().await;
        };
        if let Some(s) = self.sessions.lock().unwrap().get_mut(name) {
            s.blocked_for(t.elapsed().as_secs_f64());
        }
        r
    }

    /// Handles `pass_end` for session `name`: the policy decides from the metrics, the job's
    /// `signals` (progress, fresh-data loss), whether the successor is staged and the
    /// stall-free rf. Signals out of range are refused before anything changes.
    pub async fn pass_end(
        &self,
        name: &str,
        job: Option<String>,
        metrics: Metrics,
        signals: JobSignals,
        block: bool,
    ) -> Result<Decision, ProtocolError> {
        let bad = |e: metfs_feedback::policy::PolicyError| {
            ProtocolError::new(ErrorCode::BadMetrics, e.to_string())
        };
        signals.check(&metrics).map_err(bad)?;
        let (reason, want, first_pass_of, handed) = {
            let mut ss = self.sessions.lock().unwrap();
            let s = session_mut(&mut ss, name)?;
            if let Some(j) = job.filter(|_| !s.schedule().in_shared_store()) {
                adopt_job(&self.cfg, s, j)?;
            }
            let stall_free = s.stall_free_rf();
            let d = s.decide(&metrics, signals, stall_free).map_err(bad)?;
            let secs = pass_start(s).elapsed().as_secs_f64();
            s.pass_ended(&metrics, &d, secs);
            self.events.emit(Event::PassEnd(event::PassEnd {
                epoch: s.epoch(),
                mini_epoch: s.mini_epoch(),
                sequence: s.sequence(),
                pass: s.passes(),
                verdict: d.verdict,
                score: d.score,
                view_bytes: s.view().bytes(),
                secs: Some(secs),
            }));
            s.check_stall_free(
                (self.cfg.policy.kind == PolicyKind::Fixed).then_some(self.cfg.policy.rf),
            );
            // After a first pass on the cached path the view's data lives in the mount's page
            // cache, and the slot files' pages are a second copy (dropped below unless the
            // view is retired now: opening every file of a view costs a core for a while,
            // which a switch must not compete with).
            let first = (s.passes() == 1 && self.surface.read_path_now() == ReadPath::Cached)
                .then(|| s.view().clone());
            if d.verdict == Verdict::Advance {
                s.want_advance();
            }
            // What the mode does after a pass (from a queue, `after-pass` DONE marks).
            let handed = self.mode.pass_ended(s);
            (d.reason, s.advance_wanted(), first, handed)
        };
        if handed {
            // The staging loop sends the DONE mark.
            self.life.bump();
        }
        let decision = if !want {
            Choice::Repeat
        } else if self.try_switch(name).await {
            Choice::Advance
        } else if block {
            self.switch_blocking(name).await?;
            Choice::Advance
        } else {
            let mut ss = self.sessions.lock().unwrap();
            let s = session_mut(&mut ss, name)?;
            s.take_bonus_pass();
            Choice::Wait
        };
        if let Some(view) = first_pass_of.filter(|_| decision != Choice::Advance) {
            tokio::task::spawn_blocking(move || FsCore::drop_slot_pages(&view));
        }
        self.events
            .emit(Event::Decision(event::DecisionEvent { decision }));
        if self.mode.saves_every_pass() {
            self.write_share_durably().await;
        }
        // The next pass starts now: time spent blocked for staging is not part of a pass, or
        // pacing would read its own stalls as slow passes and stage slower still.
        let mut ss = self.sessions.lock().unwrap();
        session_mut(&mut ss, name)?.restart_pass_clock();
        self.pacing.retune(self.store.stager.pacer(), &ss);
        let mut out = session_ref(&ss, name)?.decision(decision);
        out.reason = Some(reason);
        Ok(out)
    }

    /// Handles `advance` for session `name`: switches now if the successor is staged;
    /// otherwise blocks (`wait`) or answers `wait` and advances at the next pass end that
    /// finds it staged.
    pub async fn advance(&self, name: &str, wait: bool) -> Result<Decision, ProtocolError> {
        session_mut(&mut self.sessions.lock().unwrap(), name)?.want_advance();
        let decision = if self.try_switch(name).await {
            Choice::Advance
        } else if wait {
            self.switch_blocking(name).await?;
            Choice::Advance
        } else {
            Choice::Wait
        };
        let ss = self.sessions.lock().unwrap();
        Ok(session_ref(&ss, name)?.decision(decision))
    }

    /// Handles `apply` for session `name`: a follower moves to exactly (epoch, mini_epoch).
    /// Applies run one at a time, each reading the position only once the one before has
    /// moved it: the second of a node's ranks to apply a decision finds the view there already.
    pub async fn apply(
        &self,
        name: &str,
        epoch: u64,
        mini_epoch: u32,
        wait: bool,
    ) -> Result<Decision, ProtocolError> {
        let _one = self.apply_one.lock().await;
        let (cur, succ, queue) = {
            let ss = self.sessions.lock().unwrap();
            let s = session_ref(&ss, name)?;
            (s.position(), s.successor(), s.schedule().by_sequence())
        };
        if queue {
            // From a queue each node's batches are its own: ranks agree on the sequence
            // number, and the epoch is whichever the node's batch came from.
            return if mini_epoch == cur.1 {
                let mut ss = self.sessions.lock().unwrap();
                let s = session_mut(&mut ss, name)?;
                s.end_pass();
                Ok(s.decision(Choice::Repeat))
            } else if mini_epoch == cur.1.wrapping_add(1) {
                self.advance(name, wait).await
            } else {
                Err(ProtocolError::new(
                    ErrorCode::BadRequest,
                    format!(
                        "cannot apply mini-epoch {mini_epoch}: this node (dynamic sharding) is at mini-epoch {} and can only move to {}",
                        cur.1,
                        cur.1.wrapping_add(1)
                    ),
                ))
            };
        }
        if (epoch, mini_epoch) == cur {
            let mut ss = self.sessions.lock().unwrap();
            let s = session_mut(&mut ss, name)?;
            s.end_pass();
            return Ok(s.decision(Choice::Repeat));
        }
        match succ {
            Some(t) if t == (epoch, mini_epoch) => self.advance(name, wait).await,
            // A plan's successor is always known.
            _ => Err(ProtocolError::new(
                ErrorCode::BadRequest,
                format!(
                    "cannot apply epoch {epoch} mini-epoch {mini_epoch}: this node is at epoch {} mini-epoch {} and can only move to {}",
                    cur.0,
                    cur.1,
                    succ.map_or("its successor, once known".to_string(), |t| format!(
                        "epoch {} mini-epoch {}",
                        t.0, t.1
                    ))
                ),
            )),
        }
    }
}

/// The log's events of a switch of session `s` to `succ`, leaving `left`: `stall_rf` when
/// bonus passes raised its rf, then `switch`.
fn emit_switch(
    events: &EventLog,
    s: &Session,
    succ: (u64, u32),
    left: &Left,
    stall_free_rf: Option<u32>,
) {
    if left.bonus > 0 && left.passes > 0 {
        events.emit(Event::StallRf(event::StallRf {
            epoch: left.epoch,
            mini_epoch: left.mini_epoch,
            sequence: left.sequence,
            policy_rf: left.passes.saturating_sub(left.bonus),
            effective_rf: left.passes,
            bonus_passes: left.bonus,
            stall_free_rf,
        }));
    }
    events.emit(Event::Switch(event::Switch {
        epoch: succ.0,
        mini_epoch: succ.1,
        generation: s.generation(),
        sequence: s.sequence(),
        prev_rf: left.record.rf,
        prev_wanted_rf: left.record.wanted_rf,
    }));
}

/// Takes the client's job key for the session's rf history. Before anything is recorded
/// the run is re-keyed (and a learned policy reloads that job's schedule); later a
/// different key is an error, since one run has one key.
fn adopt_job(cfg: &MountConfig, s: &mut Session, job: String) -> Result<(), ProtocolError> {
    if job == s.job() {
        return Ok(());
    }
    let fresh = s.passes() == 0 && s.record().scores.is_empty();
    let untouched = fresh
        && s.history().is_none_or(|h| {
            h.store
                .lock()
                .unwrap()
                .run(h.run)
                .is_none_or(|r| r.mini_epochs.is_empty())
        });
    if !untouched {
        return Err(ProtocolError::new(
            ErrorCode::BadRequest,
            format!(
                "job `{job}`: this mount already records job `{}`; one mount serves one job key",
                s.job()
            ),
        ));
    }
    let mut schedule = None;
    let mut run = None;
    if let Some(h) = s.history() {
        let mut store = h.store.lock().unwrap();
        let (replay, sched) = learned_replay(&cfg.policy, &store, &h.dataset, &job, None)
            .map_err(|e| ProtocolError::new(ErrorCode::BadRequest, format!("job `{job}`: {e}")))?
            .unzip();
        let id = start_recording(&mut store, &h.dataset, &job, None, replay.clone()).0;
        run = Some((id, replay));
        schedule = sched;
    }
    let policy = if cfg.policy.kind == PolicyKind::Learned {
        Some(
            build_policy(cfg, schedule)
                .map_err(|e| ProtocolError::new(ErrorCode::Internal, e.to_string()))?,
        )
    } else {
        None
    };
    tracing::info!(job = %job, "job key for the rf history");
    s.rekey(job, run, policy);
    Ok(())
}
