//! [`Bollinger`]: the Bollinger-band adaptive rf of paper section III.C.2. The mini-epoch is
//! left when the score of a pass falls below `MA - K * std` of the `N` scores before it; the
//! moving statistics come from `statrs`. The choices the paper leaves open are documented on
//! the type, and each is a setting ([`Spread`], [`CurrentPoint`], [`BandSide`], [`Scope`]), so
//! the paper's other readings can be measured beside the defaults.

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use statrs::statistics::Statistics;

use super::{
    BandSide, Bounds, PassState, PolicyDecision, PolicyError, PolicyState, Reason, RfPolicy,
    RfTracker, Scope, Verdict, WeightedScore,
};

use super::PolicyKind;
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
///   [`BandSide::Either`] also advances when the score rises above `MA + K * std`, and
///   [`BandSide::Above`] only then (a higher-is-better score).
/// * **The other readings** are settings ([`Bollinger::with_reading`]): [`Spread::Population`]
///   (divisor `N`) and [`CurrentPoint::Included`] (the band over the `N - 1` previous scores
///   and this one, as a trader's chart draws it). With the current point inside, the score can
///   never be more than `(N-1)/sqrt(N)` population standard deviations from the mean (4.25
///   for `N = 20`), so `K = 2` can fire for `N >= 6` only.
#[derive(Debug, Clone, PartialEq)]
pub struct Bollinger {
    score: WeightedScore,
    window: usize,
    k: f64,
    scope: Scope,
    side: BandSide,
    spread: Spread,
    current_point: CurrentPoint,
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
            spread: Spread::Sample,
            current_point: CurrentPoint::Excluded,
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

    /// The same policy with the band's spread and window read as given.
    pub fn with_reading(mut self, spread: Spread, current_point: CurrentPoint) -> Self {
        self.spread = spread;
        self.current_point = current_point;
        // With the current score inside, the band exists one pass sooner.
        let first = match current_point {
            CurrentPoint::Excluded => self.window + 1,
            CurrentPoint::Included => self.window,
        };
        self.rf = RfTracker::new(first as f64);
        self
    }

    /// The band `(ma, std, lower, upper)` of the previous scores' window, once it is full.
    pub fn band(&self) -> Option<(f64, f64, f64, f64)> {
        (self.recent.len() >= self.window).then(|| self.band_of(self.recent.iter().copied()))
    }

    /// The band a pass scoring `current` is judged against, once its window is full.
    fn band_for(&self, current: f64) -> Option<(f64, f64, f64, f64)> {
        match self.current_point {
            CurrentPoint::Excluded => self.band(),
            CurrentPoint::Included => {
                let need = self.window - 1;
                (self.recent.len() >= need).then(|| {
                    let skip = self.recent.len() - need;
                    let xs = self.recent.iter().skip(skip).copied();
                    self.band_of(xs.chain(std::iter::once(current)))
                })
            }
        }
    }

    fn band_of(&self, xs: impl Iterator<Item = f64> + Clone) -> (f64, f64, f64, f64) {
        let ma = xs.clone().mean();
        let std = match self.spread {
            Spread::Sample => xs.std_dev(),
            Spread::Population => xs.population_std_dev(),
        };
        (ma, std, ma - self.k * std, ma + self.k * std)
    }
}

impl RfPolicy for Bollinger {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Bollinger
    }
    fn on_pass_end(
        &mut self,
        metrics: &Metrics,
        state: &PassState,
    ) -> Result<PolicyDecision, PolicyError> {
        let current = self.score.eval(metrics, "bollinger")?;
        self.rf.saw(state.passes);
        let (verdict, reason) = match self.band_for(current) {
            None => (
                Verdict::Repeat,
                Reason::Bollinger {
                    filling: true,
                    have: Some(self.recent.len() as u64),
                    ma: None,
                    std: None,
                    lower: None,
                    upper: None,
                    current,
                    window: self.window as u64,
                    k: self.k,
                    window_scope: self.scope,
                    side: None,
                    spread: None,
                    current_point: None,
                    passes: state.passes,
                    bounds: Bounds::default(),
                },
            ),
            Some((ma, std, lower, upper)) => (
                if self.side.leaves(current, lower, upper) {
                    Verdict::Advance
                } else {
                    Verdict::Repeat
                },
                Reason::Bollinger {
                    filling: false,
                    have: None,
                    ma: Some(ma),
                    std: Some(std),
                    lower: Some(lower),
                    upper: Some(upper),
                    current,
                    window: self.window as u64,
                    k: self.k,
                    window_scope: self.scope,
                    side: Some(self.side),
                    spread: Some(self.spread),
                    current_point: Some(self.current_point),
                    passes: state.passes,
                    bounds: Bounds::default(),
                },
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

impl BandSide {
    /// Whether a score of `current` leaves the band `[lower, upper]` on this side.
    fn leaves(self, current: f64, lower: f64, upper: f64) -> bool {
        match self {
            BandSide::Below => current < lower,
            BandSide::Either => current < lower || current > upper,
            BandSide::Above => current > upper,
        }
    }
}

/// Which standard deviation the band's width is taken from.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Spread {
    /// The sample standard deviation (divisor `N - 1`): the default, see [`Bollinger`].
    #[default]
    Sample,
    /// The population standard deviation (divisor `N`), as a trader's Bollinger band has it.
    Population,
}

/// Whether the band is computed with the score it judges.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum CurrentPoint {
    /// Over the `N` scores before this pass: the default, see [`Bollinger`].
    #[default]
    Excluded,
    /// Over the `N - 1` scores before this pass and this pass's.
    Included,
}

macro_rules! spelled {
    ($t:ty, $what:literal, $($v:path => $s:literal),+) => {
        impl $t {
            /// The config spelling.
            pub fn as_str(self) -> &'static str {
                match self { $($v => $s),+ }
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s.trim() {
                    $($s => Ok($v),)+
                    other => Err(format!(
                        concat!("unknown ", $what, " `{}`; expected ", $("`", $s, "` "),+),
                        other
                    )),
                }
            }
        }
    };
}

spelled!(Spread, "spread", Spread::Sample => "sample", Spread::Population => "population");
spelled!(
    CurrentPoint,
    "current point",
    CurrentPoint::Excluded => "excluded",
    CurrentPoint::Included => "included"
);
