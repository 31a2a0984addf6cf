//! [`Score`]: the score-based adaptive rf of paper Fig. 6. The mini-epoch is left after
//! `wait_th` consecutive passes whose score is not strictly below the best; `wait` restarts
//! at every advance, and whether `best` does too is its [`Scope`].

use super::{
    Bounds, PassState, PolicyDecision, PolicyError, PolicyState, Reason, RfPolicy, RfTracker,
    Scope, Verdict, WeightedScore,
};

use super::PolicyKind;
use crate::Metrics;

/// Score-based adaptive rf (paper Fig. 6).
///
/// After every pass: `if current < best { best = current; wait = 0 } else { wait += 1 }`, and
/// the policy advances when `wait >= wait_th` (only on a pass without improvement, as in
/// Fig. 6, where the check sits in the `else` branch). Improvement is strict: an equal score is
/// not an improvement.
///
/// `wait` counts passes over the *current* mini-epoch, so it restarts at 0 at every advance
/// ("if the score does not improve on repeating over mini-epoch i ... early stop on this
/// mini-epoch"); carrying it over would make every later mini-epoch advance after its first
/// non-improving pass. Whether `best` restarts too is [`Scope`]:
///
/// * [`Scope::Run`] (the default, as in Fig. 6, where `self.score` lives in the callback for the
///   whole training): a mini-epoch is repeated only while it still takes the model to a new
///   best. A mini-epoch can then be left after `wait_th` passes.
/// * [`Scope::PerMiniEpoch`]: `best` restarts at +∞, so the first pass of every mini-epoch is an
///   improvement and every mini-epoch runs at least `wait_th + 1` passes. This measures only
///   progress within the mini-epoch, where a training loss keeps falling as the model fits the
///   repeated samples, so it tends towards larger rf.
#[derive(Debug, Clone, PartialEq)]
pub struct Score {
    score: WeightedScore,
    wait_th: u32,
    scope: Scope,
    /// Lowest score so far (+∞ before the first pass of the scope).
    best: f64,
    /// Consecutive passes of this mini-epoch without improvement.
    wait: u32,
    rf: RfTracker,
}

impl Score {
    /// A score policy advancing after `wait_th >= 1` passes without improvement.
    pub fn new(score: WeightedScore, wait_th: u32, scope: Scope) -> Result<Self, PolicyError> {
        if wait_th == 0 {
            return Err(PolicyError::BadParameter {
                name: "score_wait",
                reason: "must be at least 1 (1 advances on the first pass without improvement)"
                    .into(),
            });
        }
        // Before any mini-epoch completes, expect the fewest passes the rule allows: pacing
        // prefetch for the fastest plausible consumption never makes the job wait.
        let prior = match scope {
            Scope::Run => wait_th as f64,
            Scope::PerMiniEpoch => wait_th as f64 + 1.0,
        };
        Ok(Self {
            score,
            wait_th,
            scope,
            best: f64::INFINITY,
            wait: 0,
            rf: RfTracker::new(prior),
        })
    }

    /// The lowest score in the current scope, if any pass was scored.
    pub fn best(&self) -> Option<f64> {
        self.best.is_finite().then_some(self.best)
    }

    /// Consecutive passes of the current mini-epoch without improvement.
    pub fn wait(&self) -> u32 {
        self.wait
    }
}

impl RfPolicy for Score {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Score
    }
    fn on_pass_end(
        &mut self,
        metrics: &Metrics,
        state: &PassState,
    ) -> Result<PolicyDecision, PolicyError> {
        let current = self.score.eval(metrics, "score")?;
        self.rf.saw(state.passes);
        let improved = current < self.best;
        if improved {
            self.best = current;
            self.wait = 0;
        } else {
            self.wait += 1;
        }
        let verdict = if !improved && self.wait >= self.wait_th {
            Verdict::Advance
        } else {
            Verdict::Repeat
        };
        Ok(PolicyDecision {
            verdict,
            reason: Reason::Score {
                best: self.best,
                current,
                improved,
                wait: self.wait,
                wait_th: self.wait_th,
                best_scope: self.scope,
                passes: state.passes,
                bounds: Bounds::default(),
            },
            score: Some(current),
        })
    }
    fn on_advance(&mut self) {
        self.wait = 0;
        if self.scope == Scope::PerMiniEpoch {
            self.best = f64::INFINITY;
        }
        self.rf.advanced();
    }
    fn expected_rf(&self) -> f64 {
        self.rf.expected()
    }
    fn state(&self) -> PolicyState {
        PolicyState {
            best: self.best(),
            wait: self.wait,
            ..PolicyState::named(self.name())
        }
        .with_rf(&self.rf)
    }
    fn restore(&mut self, state: &PolicyState) -> Result<(), PolicyError> {
        state.check_name(self.name())?;
        let best = state.best_score()?;
        let mut rf = self.rf.clone();
        state.restore_rf(&mut rf)?;
        (self.best, self.wait, self.rf) = (best, state.wait, rf);
        Ok(())
    }
}
