//! Repeating-factor policies: after each pass over the current mini-epoch, repeat or advance?
//!
//! A policy sees the metrics of the pass that just ended and the state of the current
//! mini-epoch and answers [`Verdict::Repeat`] or [`Verdict::Advance`]. It does not know whether
//! the next mini-epoch is staged: the daemon turns an `Advance` into `wait` (keep repeating, no
//! stall) until it is, and latches the wish so that the first pass after staging completes
//! advances. The policy keeps being called on every pass meanwhile, so its statistics stay
//! complete; it may even change its mind, which the daemon ignores. [`Bounded`] wraps every
//! policy so that `rf_min` and `rf_max` always hold.
//!
//! The policies (paper 001, section III.C):
//!
//! * [`Fixed`]: exactly `rf` passes per mini-epoch (the paper's baseline).
//! * [`Score`]: Fig. 6. A score is a weighted sum of metrics ([`WeightedScore`]); the mini-epoch
//!   is left after `wait_th` consecutive passes whose score is not strictly below the best.
//! * [`Bollinger`]: III.C.2. The mini-epoch is left when the score falls below the lower
//!   Bollinger band `MA - K * std` of the previous `N` scores.
//! * [`Learned`]: replays the rf sequence an earlier run recorded in the rf history ("remember
//!   the optimal strategy for given dataset and model"): the run that ended best by a
//!   [`ReplayMetric`] (the history chooses it), falling back to another policy where the
//!   recorded sequence runs out.
//! * [`Paced`]: not the paper's. Never advances before fresh data is staged, caps rf by a
//!   bound that grows with the run's progress (§V.A), and between the two repeats only while a
//!   held-out loss (`val_loss`, or the fresh-data loss of each new mini-epoch) still improves
//!   per repeated pass by a set fraction of what a fresh pass gives.
//!
//! Invariants every policy keeps:
//!
//! * A metric the score needs and `pass_end` did not send is [`PolicyError::MissingMetric`]
//!   on that pass (so on the very first pass), never a silent zero. A policy returns an error
//!   before changing any of its state, so a failed pass leaves it as it was.
//! * Scores are finite (a weighted sum that overflows is [`PolicyError::NonFiniteScore`]), so
//!   every number in a `reason` is a JSON number.
//! * [`RfPolicy::on_advance`] is the only place per-mini-epoch state is reset.
//!
//! Layout: this module holds the seam ([`RfPolicy`], [`Verdict`], [`PassState`],
//! [`PolicyDecision`], [`PolicyKind`]), the error and [`Scope`]; `reason` holds each policy's
//! [`Reason`]; `metric` holds the score ([`MetricTerm`],
//! [`WeightedScore`]); each policy has its own file (`fixed`, `score`, `bollinger`, `learned`,
//! `paced`, `bounded`) and takes its parameters as constructor arguments. The policies never import
//! [`crate::config`]: the dependency points one way, from the config that builds policies to
//! the policies it builds.

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use statrs::statistics::Statistics;
use thiserror::Error;

use crate::Metrics;

mod bollinger;
mod bounded;
mod fixed;
mod learned;
mod metric;
mod paced;
mod reason;
mod saved;
mod score;

pub use bollinger::{Bollinger, CurrentPoint, Spread};
pub use bounded::Bounded;
pub use fixed::Fixed;
pub use learned::{Learned, ReplayMetric};
pub use metric::{default_terms, MetricTerm, WeightedScore, DEFAULT_TERMS};
pub use paced::{Paced, PacedParams, PacedState, SMOOTHING};
pub use reason::{Bound, Bounds, HeldOut, LearnedSource, PacedWhy, Reason};
pub use saved::PolicyState;
pub use score::Score;

/// Errors of the policy module.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum PolicyError {
    /// A metric the policy needs is missing from `pass_end`.
    #[error(
        "policy `{policy}` needs metric `{metric}`, which pass_end did not send (it sent: {sent})"
    )]
    MissingMetric {
        /// The policy that needs the metric.
        policy: &'static str,
        /// The metric's name.
        metric: String,
        /// The metric names `pass_end` did send, comma-separated (or `no metrics`).
        sent: String,
    },
    /// A parameter is out of range.
    #[error("policy parameter `{name}`: {reason}")]
    BadParameter {
        /// The parameter (its config key).
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A signal of the pass beside its metrics (`progress`, `val_loss`, `fresh_loss`) is out
    /// of range.
    #[error("pass_end field `{field}`: {reason}")]
    BadSignal {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The weighted score of a pass is not a finite number (the weighted sum overflowed).
    #[error("policy `{policy}`: the score of this pass is not finite ({detail})")]
    NonFiniteScore {
        /// The policy computing the score.
        policy: &'static str,
        /// The terms of the score, for diagnosis.
        detail: String,
    },
}

/// What a policy wants after a pass (also the `verdict` of a `pass_end` event).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Run another pass over the current mini-epoch.
    Repeat,
    /// Move on to the next mini-epoch (as soon as it is staged).
    Advance,
}

/// The state of the current mini-epoch when a pass ends, with what the daemon and the job know
/// beside the metrics: whether fresh data is there to read, the stall-free rf, how far the run
/// is, and held-out signals. The optional fields are `None` when nobody said (a job that sends
/// no budget, a daemon that has not measured its bandwidths yet, a test).
///
/// Invariant, checked by [`PassState::check`] before any policy sees it (the [`Bounded`]
/// wrapper every daemon policy wears calls it first, so a refused pass changes no state):
/// `progress` lies in [0, 1] and the held-out losses are finite.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PassState {
    /// Passes completed over the current mini-epoch, including the one that just ended (>= 1).
    pub passes: u32,
    /// Position of the current mini-epoch in the whole run (0, 1, 2, ... across epochs).
    pub sequence: u64,
    /// Whether the next mini-epoch is fully staged, so an advance would switch now.
    pub next_ready: Option<bool>,
    /// The stall-free rf `ceil(EB1 / B2)` once the daemon has measured both rates: fewer
    /// passes than this and the job outruns the tier.
    pub stall_free_rf: Option<u32>,
    /// The elapsed fraction of the job's budget (passes, samples or epochs, as the job counts
    /// it), in [0, 1], when the job says it (`pass_end`'s `progress`).
    pub progress: Option<f64>,
    /// The validation loss of this pass, when the job sent the metric `val_loss`.
    pub val_loss: Option<f64>,
    /// The fresh-data loss: the loss of the first batches of this mini-epoch's first pass,
    /// computed before they were trained on (`pass_end`'s `fresh_loss`; sent with a first pass).
    pub fresh_loss: Option<f64>,
}

impl PassState {
    /// The state of pass `passes` of mini-epoch `sequence`, with nothing else known.
    pub fn new(passes: u32, sequence: u64) -> Self {
        Self {
            passes,
            sequence,
            ..Self::default()
        }
    }

    /// Refuses a progress outside [0, 1] and a held-out loss that is not finite, naming the
    /// field.
    pub fn check(&self) -> Result<(), PolicyError> {
        if let Some(p) = self.progress {
            if !(0.0..=1.0).contains(&p) {
                return Err(PolicyError::BadSignal {
                    field: "progress",
                    reason: format!("{p} is outside [0, 1] (the elapsed fraction of the run)"),
                });
            }
        }
        for (field, v) in [("val_loss", self.val_loss), ("fresh_loss", self.fresh_loss)] {
            if let Some(v) = v.filter(|v| !v.is_finite()) {
                return Err(PolicyError::BadSignal {
                    field,
                    reason: format!("{v} is not a finite number"),
                });
            }
        }
        Ok(())
    }
}

/// What a job says of a pass beside its metrics (`pass_end`'s `progress` and `fresh_loss`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct JobSignals {
    /// The elapsed fraction of the job's budget, in [0, 1].
    pub progress: Option<f64>,
    /// The fresh-data loss of this mini-epoch's first pass.
    pub fresh_loss: Option<f64>,
}

impl JobSignals {
    /// The pass state of pass `passes` of mini-epoch `sequence` with these signals and the
    /// metric `val_loss` of `metrics`, the rest unknown.
    pub fn state(self, passes: u32, sequence: u64, metrics: &Metrics) -> PassState {
        PassState {
            progress: self.progress,
            fresh_loss: self.fresh_loss,
            val_loss: metrics.get("val_loss").copied(),
            ..PassState::new(passes, sequence)
        }
    }

    /// [`PassState::check`] of these signals with `metrics`' `val_loss`: a caller refuses a
    /// bad pass before it changes anything of its own.
    pub fn check(self, metrics: &Metrics) -> Result<(), PolicyError> {
        self.state(1, 0, metrics).check()
    }
}

/// A policy's answer and why, as reported in the `pass_end` response (`reason`).
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyDecision {
    /// Repeat or advance.
    pub verdict: Verdict,
    /// Why, naming the policy (`{"policy": "score", "best": .., ..}` as JSON).
    pub reason: Reason,
    /// The score this pass got, for policies that compute one (recorded in the rf history).
    pub score: Option<f64>,
}

/// The seam between the daemon and a repeating-factor policy.
pub trait RfPolicy: Send {
    /// Which policy this is (a wrapper such as [`Bounded`] answers its inner policy's).
    fn kind(&self) -> PolicyKind;
    /// Short name (`fixed`, `score`, `bollinger`, `learned`, `paced`): the kind's spelling.
    fn name(&self) -> &'static str {
        self.kind().as_str()
    }
    /// Decides after a pass. `state.passes` counts the pass that just ended.
    fn on_pass_end(
        &mut self,
        metrics: &Metrics,
        state: &PassState,
    ) -> Result<PolicyDecision, PolicyError>;
    /// Called when the view has switched to the next mini-epoch, to reset per-mini-epoch state.
    fn on_advance(&mut self) {}
    /// The rf this policy expects to use for the current mini-epoch (for prefetch pacing).
    fn expected_rf(&self) -> f64;
    /// What this policy has learned so far, to be saved (a shared mount's save file) and
    /// given back to [`RfPolicy::restore`] of the same policy after a restart. A policy that
    /// learns nothing saves its name alone.
    fn state(&self) -> PolicyState {
        PolicyState::named(self.name())
    }
    /// Continues from a saved [`RfPolicy::state`]. A state of another policy, or with a value
    /// out of range, is an error naming the field, and leaves the policy as it was.
    fn restore(&mut self, state: &PolicyState) -> Result<(), PolicyError> {
        state.check_name(self.name())
    }
}

/// Which policy decides (the config's `rf_policy`, also the protocol's); its spelling,
/// `as_str` and parsing are in [`crate::config`].
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    /// Exactly `rf` passes per mini-epoch.
    #[default]
    Fixed,
    /// Score-based adaptive rf (paper Fig. 6).
    Score,
    /// Bollinger-band adaptive rf (paper III.C.2).
    Bollinger,
    /// Replay of a recorded rf schedule, then `learned_fallback`.
    Learned,
    /// Staging-aware, progress-capped, held-out-driven adaptive rf (`policy::Paced`).
    Paced,
}

/// Whether a statistic lives for the whole run or restarts with every mini-epoch.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Kept across mini-epochs for the whole run (the paper's Fig. 6 keeps `best` this way).
    #[default]
    Run,
    /// Reset at every advance.
    PerMiniEpoch,
}

impl Scope {
    /// The config spelling (`run`, `per_mini_epoch`).
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Run => "run",
            Scope::PerMiniEpoch => "per_mini_epoch",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Scope {
    type Err = String;
    /// Accepts `run` and `per_mini_epoch` (also spelled `per-mini-epoch`, as on a command line).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "run" => Ok(Scope::Run),
            "per_mini_epoch" | "per-mini-epoch" => Ok(Scope::PerMiniEpoch),
            other => Err(format!(
                "unknown scope `{other}`; expected `run` or `per_mini_epoch`"
            )),
        }
    }
}

/// Which exit from the Bollinger band ends a mini-epoch.
///
/// The paper advances when the score "fluctuates out of the normal range" without saying
/// which side; with the score lower-is-better, leaving below is a sudden improvement and
/// leaving above a sudden setback. Both readings are kept: `below` (the default, what the
/// project measured first) and `either`. A score that is better *higher* (an accuracy given
/// weight +1) breaks out upwards: `above`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum BandSide {
    /// Advance when the score falls below `MA - K * std`.
    #[default]
    Below,
    /// Advance when the score leaves the band on either side.
    Either,
    /// Advance when the score rises above `MA + K * std` (a higher-is-better score's breakout).
    Above,
}

impl BandSide {
    /// The config spelling (`below`, `either`).
    pub fn as_str(self) -> &'static str {
        match self {
            BandSide::Below => "below",
            BandSide::Either => "either",
            BandSide::Above => "above",
        }
    }
}

impl fmt::Display for BandSide {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for BandSide {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "below" => Ok(BandSide::Below),
            "either" => Ok(BandSide::Either),
            "above" => Ok(BandSide::Above),
            other => Err(format!(
                "unknown band side `{other}`; expected `below`, `either` or `above`"
            )),
        }
    }
}

/// How many completed mini-epochs [`RfTracker`] averages: enough to smooth one odd mini-epoch,
/// few enough to follow the trend the paper describes (rf tends to grow as training settles).
const RF_MEMORY: usize = 8;

/// Remembers the rf of recent mini-epochs, for [`RfPolicy::expected_rf`] of adaptive policies.
#[derive(Debug, Clone, PartialEq)]
struct RfTracker {
    /// `passes` of the latest pass of the current mini-epoch (0 before its first pass).
    current: u32,
    /// The rf of the last [`RF_MEMORY`] completed mini-epochs.
    recent: VecDeque<u32>,
    /// What to expect before any mini-epoch completed.
    prior: f64,
}

impl RfTracker {
    fn new(prior: f64) -> Self {
        Self {
            current: 0,
            recent: VecDeque::new(),
            prior,
        }
    }
    fn saw(&mut self, passes: u32) {
        self.current = passes;
    }
    fn advanced(&mut self) {
        // A forced advance before any pass tells nothing about the rf this policy chooses.
        if self.current > 0 {
            if self.recent.len() == RF_MEMORY {
                self.recent.pop_front();
            }
            self.recent.push_back(self.current);
        }
        self.current = 0;
    }
    fn expected(&self) -> f64 {
        if self.recent.is_empty() {
            self.prior
        } else {
            self.recent.iter().map(|&r| r as f64).mean()
        }
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod variants_tests;
