//! [`Paced`]: an adaptive rf that knows the tier and the training's phase.
//!
//! The paper's policies judge a pass by a score of the mini-epoch being repeated, which keeps
//! falling as the model fits it, so they tell little about whether repeating still helps the
//! model on data it has not seen (docs/EXPERIMENTS.md measured `score` at its wait floor and
//! `bollinger` at `rf_max`). `Paced` decides from what a repeat is for and what it costs:
//!
//! 1. **No fresh data, no advance.** While the next mini-epoch is not staged (`next_ready`
//!    false), or, when the daemon does not say, fewer passes than the stall-free rf
//!    `ceil(EB1/B2)` have run, it repeats: an advance could only wait.
//! 2. **A cap that grows with the run** (paper §V.A: convergence is most sensitive to rf early,
//!    so rf should grow as training progresses): `cap = cap_start + (cap_end - cap_start) *
//!    progress`, rounded down, with `progress` the elapsed fraction of the job's budget it
//!    sends (`cap_start` when it sends none). At the cap it advances (once staged).
//! 3. **Repeat only while it still pays, measured on held-out data.** Between the floor and the
//!    cap it repeats while the held-out loss improves per repeated pass by at least
//!    `gain_fraction` of what a fresh pass gives:
//!    * with `val_loss` on every pass: a repeat's gain is the fall of `val_loss` over that
//!      pass, a fresh pass's gain the fall over the first pass of a mini-epoch (smoothed over
//!      mini-epochs, [`SMOOTHING`]); after a first pass, the smoothed gain of past first
//!      repeats predicts whether a repeat is worth trying (tried while nothing is known);
//!    * with only the fresh-data loss (one value per mini-epoch, at its first pass), the gain of
//!      each repeat cannot be told apart, so the policy steers a target rf between mini-epochs
//!      instead: the held-out gain per pass of the mini-epoch just left, `(F_prev - F) /
//!      passes_prev`, is compared with its smoothed value over earlier mini-epochs; at least
//!      `gain_fraction` of it and the target grows by one (repetition did not dilute the gain
//!      per pass), less and it halves (additive increase, multiplicative decrease, so a
//!      harmful rf is left fast). The target starts at `cap_start`;
//!    * with neither, the cap alone decides (rf = cap, the §V.A schedule).
//!
//! Invariants: a pass whose signals are out of range is refused by [`PassState::check`] before
//! any state changes; every number in a reason is finite; the state that shapes later
//! decisions (smoothed gains, last held-out values, the target) is saved and restored.

use serde::{Deserialize, Serialize};

use super::{
    Bounds, HeldOut, PacedWhy, PassState, PolicyDecision, PolicyError, PolicyState, Reason,
    RfPolicy, RfTracker, Verdict,
};

use super::PolicyKind;
use crate::Metrics;

/// Weight of the newest observation in the smoothed gains: about the last three mini-epochs
/// count, enough to ride out a validation loss's pass-to-pass jitter, few enough to follow the
/// gains shrinking as training converges.
pub const SMOOTHING: f64 = 0.3;

/// The parameters of [`Paced`] (config keys `paced_*`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PacedParams {
    /// The cap on rf at the start of the run (progress 0), >= 1.
    pub cap_start: u32,
    /// The cap on rf at the end of the run (progress 1), >= `cap_start`.
    pub cap_end: u32,
    /// A repeat must gain at least this fraction of a fresh pass's held-out gain, in [0, 1].
    pub gain_fraction: f64,
}

/// What `Paced` has learned (saved in [`PolicyState::paced`]).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct PacedState {
    /// `val_loss` of the latest pass that sent one.
    #[serde(default)]
    pub last_val: Option<f64>,
    /// Smoothed fall of `val_loss` over a mini-epoch's first pass.
    #[serde(default)]
    pub fresh_gain: Option<f64>,
    /// Smoothed fall of `val_loss` over a mini-epoch's second pass (its first repeat).
    #[serde(default)]
    pub repeat_gain: Option<f64>,
    /// The fresh-data loss of the current (or latest) mini-epoch.
    #[serde(default)]
    pub last_fresh: Option<f64>,
    /// Smoothed held-out gain per pass between fresh-data losses.
    #[serde(default)]
    pub fresh_per_pass: Option<f64>,
    /// The target rf steered by fresh-data losses (0: not started, `cap_start` is used).
    #[serde(default)]
    pub target: u32,
}

/// The paced adaptive rf (module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Paced {
    params: PacedParams,
    learned: PacedState,
    rf: RfTracker,
}

fn smooth(old: Option<f64>, x: f64) -> f64 {
    old.map_or(x, |o| o + SMOOTHING * (x - o))
}

impl Paced {
    /// A paced policy; the parameters are checked, the error naming the config key.
    pub fn new(params: PacedParams) -> Result<Self, PolicyError> {
        let bad = |name, reason: String| Err(PolicyError::BadParameter { name, reason });
        if params.cap_start == 0 {
            return bad("paced_cap_start", "must be at least 1".into());
        }
        if params.cap_end < params.cap_start {
            return bad(
                "paced_cap_end",
                format!(
                    "{} is below paced_cap_start ({}): the cap may only grow with progress",
                    params.cap_end, params.cap_start
                ),
            );
        }
        if !(0.0..=1.0).contains(&params.gain_fraction) {
            return bad(
                "paced_gain_fraction",
                format!("{} is outside [0, 1]", params.gain_fraction),
            );
        }
        Ok(Self {
            params,
            learned: PacedState::default(),
            // Before a mini-epoch completes, expect the fewest passes the rule allows (one,
            // when staging keeps up): pacing prefetch for that never makes the job wait.
            rf: RfTracker::new(1.0),
        })
    }

    /// The cap at `progress` (`cap_start` when the job sends none).
    pub fn cap(&self, progress: Option<f64>) -> u32 {
        let p = self.params;
        let grown = f64::from(p.cap_end - p.cap_start) * progress.unwrap_or(0.0).clamp(0.0, 1.0);
        p.cap_start + grown.floor() as u32
    }

    /// What the policy has learned so far.
    pub fn learned(&self) -> &PacedState {
        &self.learned
    }

    /// Takes in the held-out signals of this pass; returns the gain of this pass on
    /// `val_loss` (when it and the previous value are known).
    fn observe(&mut self, state: &PassState) -> Option<f64> {
        let l = &mut self.learned;
        if let (Some(f), 1) = (state.fresh_loss, state.passes) {
            // The first fresh loss of a mini-epoch after one that had one: the held-out gain
            // per pass of the mini-epoch left, which steers the target.
            if let (Some(prev), Some(&passes)) = (l.last_fresh, self.rf.recent.back()) {
                let g = (prev - f) / f64::from(passes);
                let target = if l.target == 0 {
                    self.params.cap_start
                } else {
                    l.target
                };
                let keeps = l
                    .fresh_per_pass
                    .is_none_or(|avg| g >= self.params.gain_fraction * avg.max(0.0));
                l.target = if keeps {
                    target.saturating_add(1).min(self.params.cap_end)
                } else {
                    (target / 2).max(1)
                };
                l.fresh_per_pass = Some(smooth(l.fresh_per_pass, g));
            }
            l.last_fresh = Some(f);
        }
        let v = state.val_loss?;
        let gain = l.last_val.map(|prev| prev - v);
        l.last_val = Some(v);
        match (gain, state.passes) {
            (Some(g), 1) => l.fresh_gain = Some(smooth(l.fresh_gain, g)),
            (Some(g), 2) => l.repeat_gain = Some(smooth(l.repeat_gain, g)),
            _ => {}
        }
        gain
    }

    /// The held-out rule between the floor and the cap: repeat, and why.
    fn held_out(&self, state: &PassState, gain: Option<f64>) -> (bool, HeldOut) {
        let l = &self.learned;
        let need = |fresh: Option<f64>| fresh.map(|f| self.params.gain_fraction * f.max(0.0));
        if state.val_loss.is_some() {
            let need = need(l.fresh_gain);
            // After a first pass, past first repeats predict this one's worth.
            let expect = if state.passes == 1 {
                l.repeat_gain
            } else {
                gain
            };
            let repeat = match (expect, need) {
                (Some(g), Some(n)) => g >= n,
                // Nothing to compare yet: try the repeat (the cap still bounds it).
                _ => true,
            };
            return (
                repeat,
                HeldOut::ValLoss {
                    gain: expect,
                    need,
                    fresh_gain: l.fresh_gain,
                },
            );
        }
        if l.last_fresh.is_some() {
            let target = if l.target == 0 {
                self.params.cap_start
            } else {
                l.target
            };
            return (
                state.passes < target,
                HeldOut::FreshLoss {
                    target,
                    fresh_per_pass: l.fresh_per_pass,
                },
            );
        }
        (true, HeldOut::Schedule)
    }
}

impl RfPolicy for Paced {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Paced
    }

    fn on_pass_end(
        &mut self,
        _metrics: &Metrics,
        state: &PassState,
    ) -> Result<PolicyDecision, PolicyError> {
        state.check()?;
        self.rf.saw(state.passes);
        let gain = self.observe(state);
        let cap = self.cap(state.progress);
        let staged = state.next_ready;
        let floor = state.stall_free_rf.unwrap_or(1);
        let (verdict, why, detail) = if staged == Some(false) {
            (Verdict::Repeat, PacedWhy::Staging, None)
        } else if staged.is_none() && state.passes < floor {
            (Verdict::Repeat, PacedWhy::StallFree, None)
        } else if state.passes >= cap {
            (Verdict::Advance, PacedWhy::Cap, None)
        } else {
            let (repeat, detail) = self.held_out(state, gain);
            let v = if repeat {
                Verdict::Repeat
            } else {
                Verdict::Advance
            };
            (v, PacedWhy::HeldOut, Some(detail))
        };
        Ok(PolicyDecision {
            verdict,
            reason: Reason::Paced {
                why,
                cap,
                progress: state.progress,
                next_ready: staged,
                stall_free_rf: state.stall_free_rf,
                held_out: detail,
                passes: state.passes,
                bounds: Bounds::default(),
            },
            score: state.val_loss.or(state.fresh_loss),
        })
    }

    fn on_advance(&mut self) {
        self.rf.advanced();
    }

    fn expected_rf(&self) -> f64 {
        self.rf.expected()
    }

    fn state(&self) -> PolicyState {
        PolicyState {
            paced: Some(self.learned),
            ..PolicyState::named(self.name())
        }
        .with_rf(&self.rf)
    }

    fn restore(&mut self, state: &PolicyState) -> Result<(), PolicyError> {
        state.check_name(self.name())?;
        let learned = state.paced.unwrap_or_default();
        let bad = |name, v: f64| PolicyError::BadParameter {
            name,
            reason: format!("{v} is not a finite number"),
        };
        for (name, v) in [
            ("paced.last_val", learned.last_val),
            ("paced.fresh_gain", learned.fresh_gain),
            ("paced.repeat_gain", learned.repeat_gain),
            ("paced.last_fresh", learned.last_fresh),
            ("paced.fresh_per_pass", learned.fresh_per_pass),
        ] {
            if let Some(v) = v.filter(|v| !v.is_finite()) {
                return Err(bad(name, v));
            }
        }
        if learned.target > self.params.cap_end {
            return Err(PolicyError::BadParameter {
                name: "paced.target",
                reason: format!(
                    "{} is above paced_cap_end ({})",
                    learned.target, self.params.cap_end
                ),
            });
        }
        let mut rf = self.rf.clone();
        state.restore_rf(&mut rf)?;
        (self.learned, self.rf) = (learned, rf);
        Ok(())
    }
}

#[cfg(test)]
#[path = "paced_tests.rs"]
mod tests;
