//! [`Bollinger`]: the Bollinger-band adaptive rf of paper section III.C.2. The mini-epoch is
//! left when the score of a pass falls below `MA - K * std` of the `N` scores before it; the
//! moving statistics come from `statrs`. The choices the paper leaves open are documented on
//! the type.

use std::collections::VecDeque;

use serde_json::json;
use statrs::statistics::Statistics;

use super::{
    BandSide, PassState, PolicyDecision, PolicyError, PolicyState, RfPolicy, RfTracker, Scope,
    Verdict, WeightedScore,
};
use crate::Metrics;

/// Bollinger-band adaptive rf (paper section III.C.2).
///
/// The band is the `N`-period moving average `MA` of the score plus and minus `K` standard
/// deviations; the policy advances when the score of the pass that just ended is strictly
/// below `MA - K * std`, "fluctuating out of the normal range".
///
/// Choices the paper leaves open, and why:
///
/// * **The current score is not in the window it is compared against.** The band is computed
///   from the `N` scores *before* this pass, then this score joins the window. With the current
///   score included, one score among `N` can never sit more than `(N-1)/sqrt(N)` sample
///   standard deviations from their mean (1.79 for `N = 5`), so with `K = 2` the rule could
///   never fire.
/// * **Sample standard deviation** (statrs [`Statistics::std_dev`], divisor `N - 1`): the
///   window is a small sample of a noisy process whose spread we estimate, and the unbiased
///   estimator keeps the band from being too narrow for small `N` (for `N = 5` it is 12 %
///   wider than the population one, which would advance on noise more often).
/// * **The window spans the run by default** ([`Scope::Run`]): the band describes how the score
///   has been fluctuating lately, across mini-epoch boundaries, so a new mini-epoch can be left
///   as soon as its score breaks out. [`Scope::PerMiniEpoch`] empties the window at every
///   advance, so every mini-epoch runs at least `N + 1` passes.
/// * **Before the window holds `N` scores** the policy repeats (there is no band yet); the
///   reason says `"filling": true`. With the run scope this happens only at the start of the
///   run. `rf_max` (via [`Bounded`](super::Bounded)) still applies.
/// * A window of identical scores has `std = 0`: any strictly lower score then advances, an
///   equal one does not.
/// * **Which side** ([`BandSide`]): below the band by default; [`Bollinger::with_side`] with
///   [`BandSide::Either`] also advances when the score rises above `MA + K * std`.
#[derive(Debug, Clone, PartialEq)]
pub struct Bollinger {
    score: WeightedScore,
    window: usize,
    k: f64,
    scope: Scope,
    side: BandSide,
    /// The last `window` scores, oldest first, not including the pass being decided.
    pub(super) recent: VecDeque<f64>,
    rf: RfTracker,
}

impl Bollinger {
    /// A band over `window >= 2` scores, `k > 0` standard deviations wide.
    pub fn new(
        score: WeightedScore,
        window: usize,
        k: f64,
        scope: Scope,
    ) -> Result<Self, PolicyError> {
        if window < 2 {
            return Err(PolicyError::BadParameter {
                name: "bollinger_window",
                reason: format!(
                    "must be at least 2 (a standard deviation needs two scores), got {window}"
                ),
            });
        }
        if !(k.is_finite() && k > 0.0) {
            return Err(PolicyError::BadParameter {
                name: "bollinger_k",
                reason: format!("must be a finite number greater than 0, got {k}"),
            });
        }
        Ok(Self {
            score,
            window,
            k,
            scope,
            side: BandSide::Below,
            recent: VecDeque::new(),
            // The first mini-epoch needs window + 1 passes before the band exists.
            rf: RfTracker::new(window as f64 + 1.0),
        })
    }

    /// The same policy, advancing when the score leaves the band on `side`.
    pub fn with_side(mut self, side: BandSide) -> Self {
        self.side = side;
        self
    }

    /// The band `(ma, std, lower, upper)` of the current window, once it is full.
    pub fn band(&self) -> Option<(f64, f64, f64, f64)> {
        if self.recent.len() < self.window {
            return None;
        }
        let ma = self.recent.iter().mean();
        let std = self.recent.iter().std_dev();
        Some((ma, std, ma - self.k * std, ma + self.k * std))
    }
}

impl RfPolicy for Bollinger {
    fn name(&self) -> &'static str {
        "bollinger"
    }
    fn on_pass_end(
        &mut self,
        metrics: &Metrics,
        state: &PassState,
    ) -> Result<PolicyDecision, PolicyError> {
        let current = self.score.eval(metrics, "bollinger")?;
        self.rf.saw(state.passes);
        let (verdict, reason) = match self.band() {
            None => (
                Verdict::Repeat,
                json!({
                    "policy": "bollinger",
                    "filling": true,
                    "have": self.recent.len(),
                    "window": self.window,
                    "k": self.k,
                    "current": current,
                    "window_scope": self.scope.as_str(),
                    "passes": state.passes,
                }),
            ),
            Some((ma, std, lower, upper)) => (
                if current < lower || (self.side == BandSide::Either && current > upper) {
                    Verdict::Advance
                } else {
                    Verdict::Repeat
                },
                json!({
                    "policy": "bollinger",
                    "ma": ma,
                    "std": std,
                    "lower": lower,
                    "upper": upper,
                    "current": current,
                    "window": self.window,
                    "k": self.k,
                    "window_scope": self.scope.as_str(),
                    "side": self.side.as_str(),
                    "passes": state.passes,
                }),
            ),
        };
        if self.recent.len() == self.window {
            self.recent.pop_front();
        }
        self.recent.push_back(current);
        Ok(PolicyDecision {
            verdict,
            reason,
            score: Some(current),
        })
    }
    fn on_advance(&mut self) {
        if self.scope == Scope::PerMiniEpoch {
            self.recent.clear();
        }
        self.rf.advanced();
    }
    fn expected_rf(&self) -> f64 {
        self.rf.expected()
    }
    fn state(&self) -> PolicyState {
        PolicyState {
            window: self.recent.iter().copied().collect(),
            ..PolicyState::named(self.name())
        }
        .with_rf(&self.rf)
    }
    fn restore(&mut self, state: &PolicyState) -> Result<(), PolicyError> {
        state.check_name(self.name())?;
        let recent = state.scores(self.window)?;
        let mut rf = self.rf.clone();
        state.restore_rf(&mut rf)?;
        (self.recent, self.rf) = (recent, rf);
        Ok(())
    }
}
