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
//!   the optimal strategy for given dataset and model"), falling back to another policy where
//!   the recorded sequence runs out.
//!
//! Invariants every policy keeps:
//!
//! * A metric the score needs and `pass_end` did not send is [`PolicyError::MissingMetric`]
//!   on that pass (so on the very first pass), never a silent zero. A policy returns an error
//!   before changing any of its state, so a failed pass leaves it as it was.
//! * Scores are finite (a weighted sum that overflows is [`PolicyError::NonFiniteScore`]), so
//!   every number in a `reason` is a JSON number.
//! * [`RfPolicy::on_advance`] is the only place per-mini-epoch state is reset.

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use statrs::statistics::Statistics;
use thiserror::Error;

use crate::config::ConfigError;
use crate::protocol::Metrics;

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
    /// The weighted score of a pass is not a finite number (the weighted sum overflowed).
    #[error("policy `{policy}`: the score of this pass is not finite ({detail})")]
    NonFiniteScore {
        /// The policy computing the score.
        policy: &'static str,
        /// The terms of the score, for diagnosis.
        detail: String,
    },
    /// The policy configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// What a policy wants after a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Run another pass over the current mini-epoch.
    Repeat,
    /// Move on to the next mini-epoch (as soon as it is staged).
    Advance,
}

/// The state of the current mini-epoch when a pass ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassState {
    /// Passes completed over the current mini-epoch, including the one that just ended (>= 1).
    pub passes: u32,
    /// Position of the current mini-epoch in the whole run (0, 1, 2, ... across epochs).
    pub sequence: u64,
}

/// A policy's answer and why, as reported in the `pass_end` response (`reason`).
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyDecision {
    /// Repeat or advance.
    pub verdict: Verdict,
    /// Why, as a JSON object that names the policy (`{"policy": "score", "best": .., ..}`).
    pub reason: Value,
    /// The score this pass got, for policies that compute one (recorded in the rf history).
    pub score: Option<f64>,
}

/// The seam between the daemon and a repeating-factor policy.
pub trait RfPolicy: Send {
    /// Short name (`fixed`, `score`, `bollinger`, `learned`).
    fn name(&self) -> &'static str;
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
}

/// Whether a statistic lives for the whole run or restarts with every mini-epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
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

/// One term of a score: a metric as sent, or its complement `1 - metric`.
///
/// Spelled `NAME` or `1 - NAME` (spaces optional: `1-NAME`), so the paper's default terms are
/// `loss`, `1 - accuracy` and `1 - val_accuracy`. A name is non-empty and has no whitespace
/// or comma (commas separate terms on the command line). Serialized as that spelling.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct MetricTerm {
    name: String,
    complement: bool,
}

impl MetricTerm {
    /// The term `name` as sent.
    pub fn plain(name: impl Into<String>) -> Result<Self, PolicyError> {
        let name = name.into();
        check_metric_name(&name, &name)?;
        Ok(Self {
            name,
            complement: false,
        })
    }

    /// The term `1 - name`.
    pub fn complement_of(name: impl Into<String>) -> Result<Self, PolicyError> {
        let mut t = Self::plain(name)?;
        t.complement = true;
        Ok(t)
    }

    /// The metric this term reads.
    pub fn metric(&self) -> &str {
        &self.name
    }

    /// Whether the term is `1 - metric`.
    pub fn is_complement(&self) -> bool {
        self.complement
    }

    /// The term's value for a metric value.
    pub fn apply(&self, value: f64) -> f64 {
        if self.complement {
            1.0 - value
        } else {
            value
        }
    }
}

fn bad_metric(spec: &str, why: &str) -> PolicyError {
    PolicyError::BadParameter {
        name: "score_metrics",
        reason: format!("`{spec}`: {why}; a term is NAME or `1 - NAME`"),
    }
}

fn check_metric_name(spec: &str, name: &str) -> Result<(), PolicyError> {
    if name.is_empty() {
        return Err(bad_metric(spec, "the metric name is empty"));
    }
    if name.chars().any(|c| c.is_whitespace() || c == ',') {
        return Err(bad_metric(
            spec,
            "a metric name cannot contain whitespace or commas",
        ));
    }
    if name.starts_with('-') || name.starts_with('+') {
        // Negation is not a term: a negative weight says the same thing without a second syntax.
        return Err(bad_metric(
            spec,
            "signs are not part of a term (use a negative weight in score_weights instead)",
        ));
    }
    Ok(())
}

impl FromStr for MetricTerm {
    type Err = PolicyError;
    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let s = spec.trim();
        // `1 - NAME`: a leading `1`, optional spaces, `-`. A name that merely starts with `1`
        // (`1st_loss`) has no `-` there and stays a plain name.
        if let Some(rest) = s.strip_prefix('1') {
            if let Some(name) = rest.trim_start().strip_prefix('-') {
                let name = name.trim();
                check_metric_name(spec, name)?;
                return Ok(Self {
                    name: name.to_string(),
                    complement: true,
                });
            }
        }
        check_metric_name(spec, s)?;
        Ok(Self {
            name: s.to_string(),
            complement: false,
        })
    }
}

impl TryFrom<String> for MetricTerm {
    type Error = PolicyError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<MetricTerm> for String {
    fn from(t: MetricTerm) -> String {
        t.to_string()
    }
}

impl fmt::Display for MetricTerm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.complement {
            write!(f, "1 - {}", self.name)
        } else {
            f.write_str(&self.name)
        }
    }
}

/// `score = Σ weight_i · term_i(metrics)`, the combination Fig. 6 computes with `np.dot`.
///
/// Lower is better: the paper's terms are a loss and error rates.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightedScore {
    terms: Vec<MetricTerm>,
    weights: Vec<f64>,
}

impl WeightedScore {
    /// A score over `terms` with one finite weight per term (not all zero, or the score would
    /// be constant and say nothing about training).
    pub fn new(terms: Vec<MetricTerm>, weights: Vec<f64>) -> Result<Self, PolicyError> {
        if terms.is_empty() {
            return Err(PolicyError::BadParameter {
                name: "score_metrics",
                reason: "needs at least one metric".into(),
            });
        }
        if weights.len() != terms.len() {
            return Err(PolicyError::BadParameter {
                name: "score_weights",
                reason: format!(
                    "{} weights for {} metrics ({}); give one weight per metric",
                    weights.len(),
                    terms.len(),
                    join(&terms)
                ),
            });
        }
        if let Some(w) = weights.iter().find(|w| !w.is_finite()) {
            return Err(PolicyError::BadParameter {
                name: "score_weights",
                reason: format!("weight {w} is not a finite number"),
            });
        }
        if weights.iter().all(|w| *w == 0.0) {
            return Err(PolicyError::BadParameter {
                name: "score_weights",
                reason: "all weights are zero, so the score would be constant".into(),
            });
        }
        Ok(Self { terms, weights })
    }

    /// The paper's default: `loss + (1 - accuracy) + (1 - val_accuracy)`.
    pub fn paper_default() -> Self {
        Self {
            terms: default_terms(),
            weights: vec![1.0; 3],
        }
    }

    /// The terms.
    pub fn terms(&self) -> &[MetricTerm] {
        &self.terms
    }

    /// The weights, one per term.
    pub fn weights(&self) -> &[f64] {
        &self.weights
    }

    /// The score of one pass. `policy` names the caller in errors.
    pub fn eval(&self, metrics: &Metrics, policy: &'static str) -> Result<f64, PolicyError> {
        let mut score = 0.0;
        for (term, w) in self.terms.iter().zip(&self.weights) {
            let Some(v) = metrics.get(term.metric()) else {
                let sent = if metrics.is_empty() {
                    "no metrics".to_string()
                } else {
                    metrics
                        .keys()
                        .map(String::as_str)
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                return Err(PolicyError::MissingMetric {
                    policy,
                    metric: term.metric().to_string(),
                    sent,
                });
            };
            score += w * term.apply(*v);
        }
        if !score.is_finite() {
            let detail = self
                .terms
                .iter()
                .zip(&self.weights)
                .map(|(t, w)| format!("{w} * ({t}) with {}={}", t.metric(), metrics[t.metric()]))
                .collect::<Vec<_>>()
                .join(" + ");
            return Err(PolicyError::NonFiniteScore { policy, detail });
        }
        Ok(score)
    }
}

fn join(terms: &[MetricTerm]) -> String {
    terms
        .iter()
        .map(|t| format!("`{t}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The paper's default score terms: `loss`, `1 - accuracy`, `1 - val_accuracy` (Fig. 6).
pub fn default_terms() -> Vec<MetricTerm> {
    vec![
        MetricTerm {
            name: "loss".into(),
            complement: false,
        },
        MetricTerm {
            name: "accuracy".into(),
            complement: true,
        },
        MetricTerm {
            name: "val_accuracy".into(),
            complement: true,
        },
    ]
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

/// The paper's baseline: exactly `rf` passes per mini-epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fixed {
    rf: u32,
}

impl Fixed {
    /// A fixed rf; `rf` must be at least 1.
    pub fn new(rf: u32) -> Result<Self, PolicyError> {
        if rf == 0 {
            return Err(PolicyError::BadParameter {
                name: "rf",
                reason: "must be at least 1".into(),
            });
        }
        Ok(Self { rf })
    }
}

impl RfPolicy for Fixed {
    fn name(&self) -> &'static str {
        "fixed"
    }
    fn on_pass_end(
        &mut self,
        _metrics: &Metrics,
        state: &PassState,
    ) -> Result<PolicyDecision, PolicyError> {
        let verdict = if state.passes >= self.rf {
            Verdict::Advance
        } else {
            Verdict::Repeat
        };
        Ok(PolicyDecision {
            verdict,
            reason: json!({"policy": "fixed", "rf": self.rf, "passes": state.passes}),
            score: None,
        })
    }
    fn expected_rf(&self) -> f64 {
        self.rf as f64
    }
}

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
    fn name(&self) -> &'static str {
        "score"
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
            reason: json!({
                "policy": "score",
                "best": self.best,
                "current": current,
                "improved": improved,
                "wait": self.wait,
                "wait_th": self.wait_th,
                "best_scope": self.scope.as_str(),
                "passes": state.passes,
            }),
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
}

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
///   run. `rf_max` (via [`Bounded`]) still applies.
/// * A window of identical scores has `std = 0`: any strictly lower score then advances, an
///   equal one does not.
#[derive(Debug, Clone, PartialEq)]
pub struct Bollinger {
    score: WeightedScore,
    window: usize,
    k: f64,
    scope: Scope,
    /// The last `window` scores, oldest first, not including the pass being decided.
    recent: VecDeque<f64>,
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
            recent: VecDeque::new(),
            // The first mini-epoch needs window + 1 passes before the band exists.
            rf: RfTracker::new(window as f64 + 1.0),
        })
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
                if current < lower {
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
}

/// Replays a learned rf schedule: mini-epoch `i` of the run (its [`PassState::sequence`]) runs
/// `schedule[i]` passes; past the end of the schedule, `fallback` decides.
///
/// The fallback sees every pass, also while the schedule is replayed, so that its statistics
/// (a Bollinger window, a best score) are warm when it takes over and so that a metric it needs
/// and the job does not send is an error on the first pass rather than hours later. Its score
/// is reported as this policy's score, so the history of a replayed run still has scores.
pub struct Learned {
    schedule: Vec<u32>,
    fallback: Box<dyn RfPolicy>,
    /// The sequence of the current mini-epoch, once a pass told it.
    sequence: Option<u64>,
}

impl Learned {
    /// Replays `schedule` (each rf >= 1; may be empty), then defers to `fallback`.
    pub fn new(schedule: Vec<u32>, fallback: Box<dyn RfPolicy>) -> Result<Self, PolicyError> {
        if let Some(i) = schedule.iter().position(|&rf| rf == 0) {
            return Err(PolicyError::BadParameter {
                name: "learned_schedule",
                reason: format!("rf of mini-epoch {i} is 0; every rf must be at least 1"),
            });
        }
        Ok(Self {
            schedule,
            fallback,
            sequence: None,
        })
    }

    /// The replayed schedule.
    pub fn schedule(&self) -> &[u32] {
        &self.schedule
    }

    fn recorded(&self, sequence: u64) -> Option<u32> {
        usize::try_from(sequence)
            .ok()
            .and_then(|i| self.schedule.get(i).copied())
    }
}

impl RfPolicy for Learned {
    fn name(&self) -> &'static str {
        "learned"
    }
    fn on_pass_end(
        &mut self,
        metrics: &Metrics,
        state: &PassState,
    ) -> Result<PolicyDecision, PolicyError> {
        let fb = self.fallback.on_pass_end(metrics, state)?;
        self.sequence = Some(state.sequence);
        let len = self.schedule.len();
        Ok(match self.recorded(state.sequence) {
            Some(rf) => PolicyDecision {
                verdict: if state.passes >= rf {
                    Verdict::Advance
                } else {
                    Verdict::Repeat
                },
                reason: json!({
                    "policy": "learned",
                    "source": "history",
                    "sequence": state.sequence,
                    "rf": rf,
                    "passes": state.passes,
                    "schedule_len": len,
                }),
                score: fb.score,
            },
            None => PolicyDecision {
                verdict: fb.verdict,
                reason: json!({
                    "policy": "learned",
                    "source": "fallback",
                    "sequence": state.sequence,
                    "schedule_len": len,
                    "fallback": fb.reason,
                }),
                score: fb.score,
            },
        })
    }
    fn on_advance(&mut self) {
        self.fallback.on_advance();
        self.sequence = self.sequence.map(|s| s + 1);
    }
    fn expected_rf(&self) -> f64 {
        // Before the first pass the sequence is unknown; a run normally starts at 0.
        match self.recorded(self.sequence.unwrap_or(0)) {
            Some(rf) => rf as f64,
            None => self.fallback.expected_rf(),
        }
    }
}

/// Enforces `rf_min <= passes per mini-epoch <= rf_max` around any policy.
pub struct Bounded {
    inner: Box<dyn RfPolicy>,
    rf_min: u32,
    rf_max: u32,
}

impl Bounded {
    /// Wraps `inner`; `1 <= rf_min <= rf_max` is required.
    pub fn new(inner: Box<dyn RfPolicy>, rf_min: u32, rf_max: u32) -> Result<Self, PolicyError> {
        if rf_min == 0 || rf_min > rf_max {
            return Err(PolicyError::BadParameter {
                name: "rf_min",
                reason: format!("need 1 <= rf_min <= rf_max, got rf_min={rf_min}, rf_max={rf_max}"),
            });
        }
        Ok(Self {
            inner,
            rf_min,
            rf_max,
        })
    }

    /// The lower bound on passes per mini-epoch.
    pub fn rf_min(&self) -> u32 {
        self.rf_min
    }

    /// The upper bound on passes per mini-epoch.
    pub fn rf_max(&self) -> u32 {
        self.rf_max
    }
}

impl RfPolicy for Bounded {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn on_pass_end(
        &mut self,
        metrics: &Metrics,
        state: &PassState,
    ) -> Result<PolicyDecision, PolicyError> {
        // The inner policy always sees every pass, so its statistics stay complete.
        let mut d = self.inner.on_pass_end(metrics, state)?;
        let bound = if state.passes < self.rf_min && d.verdict == Verdict::Advance {
            d.verdict = Verdict::Repeat;
            Some("rf_min")
        } else if state.passes >= self.rf_max && d.verdict == Verdict::Repeat {
            d.verdict = Verdict::Advance;
            Some("rf_max")
        } else {
            None
        };
        if let (Some(b), Value::Object(o)) = (bound, &mut d.reason) {
            o.insert("bound".into(), json!(b));
            o.insert("rf_min".into(), json!(self.rf_min));
            o.insert("rf_max".into(), json!(self.rf_max));
        }
        Ok(d)
    }
    fn on_advance(&mut self) {
        self.inner.on_advance()
    }
    fn expected_rf(&self) -> f64 {
        self.inner
            .expected_rf()
            .clamp(self.rf_min as f64, self.rf_max as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn st(passes: u32) -> PassState {
        PassState {
            passes,
            sequence: 0,
        }
    }

    fn at(sequence: u64, passes: u32) -> PassState {
        PassState { passes, sequence }
    }

    fn loss(x: f64) -> Metrics {
        [("loss".to_string(), x)].into_iter().collect()
    }

    /// A score that is just the loss, so test sequences are the scores themselves.
    fn loss_score() -> WeightedScore {
        WeightedScore::new(vec![MetricTerm::plain("loss").unwrap()], vec![1.0]).unwrap()
    }

    /// Feeds one mini-epoch's scores; returns the verdicts and the decisions' reasons.
    fn feed(p: &mut dyn RfPolicy, seq: u64, scores: &[f64]) -> Vec<(Verdict, Value)> {
        scores
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                let d = p.on_pass_end(&loss(s), &at(seq, i as u32 + 1)).unwrap();
                (d.verdict, d.reason)
            })
            .collect()
    }

    fn verdicts(v: &[(Verdict, Value)]) -> Vec<Verdict> {
        v.iter().map(|(v, _)| *v).collect()
    }

    use Verdict::{Advance as A, Repeat as R};

    #[test]
    fn fixed_advances_after_rf_passes() {
        let mut p = Fixed::new(3).unwrap();
        let m = Metrics::new();
        assert_eq!(p.on_pass_end(&m, &st(1)).unwrap().verdict, Verdict::Repeat);
        assert_eq!(p.on_pass_end(&m, &st(2)).unwrap().verdict, Verdict::Repeat);
        assert_eq!(p.on_pass_end(&m, &st(3)).unwrap().verdict, Verdict::Advance);
        assert_eq!(p.on_pass_end(&m, &st(4)).unwrap().verdict, Verdict::Advance);
        assert!(Fixed::new(0).is_err());
    }

    #[test]
    fn bounds_hold() {
        let m = Metrics::new();
        let mut b = Bounded::new(Box::new(Fixed::new(1).unwrap()), 2, 3).unwrap();
        let d = b.on_pass_end(&m, &st(1)).unwrap();
        assert_eq!(d.verdict, Verdict::Repeat);
        assert_eq!(d.reason["bound"], "rf_min");
        assert_eq!(b.on_pass_end(&m, &st(2)).unwrap().verdict, Verdict::Advance);
        let mut b = Bounded::new(Box::new(Fixed::new(10).unwrap()), 1, 3).unwrap();
        assert_eq!(b.on_pass_end(&m, &st(2)).unwrap().verdict, Verdict::Repeat);
        let d = b.on_pass_end(&m, &st(3)).unwrap();
        assert_eq!(d.verdict, Verdict::Advance);
        assert_eq!(d.reason["bound"], "rf_max");
        assert_eq!(b.expected_rf(), 3.0);
        assert!(Bounded::new(Box::new(Fixed::new(1).unwrap()), 3, 2).is_err());
    }

    #[test]
    fn metric_terms_parse() {
        let t: MetricTerm = "loss".parse().unwrap();
        assert_eq!((t.metric(), t.is_complement()), ("loss", false));
        for spec in [
            "1 - accuracy",
            "1-accuracy",
            "  1 -accuracy ",
            "1- accuracy",
        ] {
            let t: MetricTerm = spec.parse().unwrap();
            assert_eq!(
                (t.metric(), t.is_complement()),
                ("accuracy", true),
                "{spec}"
            );
            assert_eq!(t.to_string(), "1 - accuracy");
        }
        // A name that starts with 1 but has no `-` is a plain name.
        let t: MetricTerm = "1st_loss".parse().unwrap();
        assert_eq!((t.metric(), t.is_complement()), ("1st_loss", false));
        for (spec, needle) in [
            ("", "empty"),
            ("1 -", "empty"),
            ("1 - ", "empty"),
            ("2 - accuracy", "whitespace"),
            ("val acc", "whitespace"),
            ("a,b", "commas"),
            ("-loss", "negative weight"),
        ] {
            let e = spec.parse::<MetricTerm>().unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains("score_metrics"), "{spec}: {msg}");
            assert!(msg.contains(needle), "{spec}: {msg}");
        }
        // Serde uses the same spelling.
        let t: MetricTerm = serde_json::from_str("\"1-val_accuracy\"").unwrap();
        assert_eq!(serde_json::to_string(&t).unwrap(), "\"1 - val_accuracy\"");
        assert!(serde_json::from_str::<MetricTerm>("\"1 - \"").is_err());
    }

    #[test]
    fn weighted_score_is_the_dot_product_of_fig6() {
        let m: Metrics = [("loss", 0.5), ("accuracy", 0.8), ("val_accuracy", 0.7)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let s = WeightedScore::paper_default().eval(&m, "score").unwrap();
        assert!((s - (0.5 + 0.2 + 0.3)).abs() < 1e-12, "{s}");
        let w = WeightedScore::new(default_terms(), vec![1.0, 0.5, 2.0]).unwrap();
        let s = w.eval(&m, "score").unwrap();
        assert!((s - (0.5 + 0.1 + 0.6)).abs() < 1e-12, "{s}");

        assert!(WeightedScore::new(vec![], vec![]).is_err());
        let e = WeightedScore::new(default_terms(), vec![1.0]).unwrap_err();
        assert!(e.to_string().contains("score_weights"), "{e}");
        assert!(e.to_string().contains("1 weights for 3 metrics"), "{e}");
        assert!(WeightedScore::new(default_terms(), vec![0.0; 3]).is_err());
        assert!(WeightedScore::new(default_terms(), vec![1.0, f64::NAN, 1.0]).is_err());
    }

    #[test]
    fn missing_metric_is_a_clear_error_on_the_first_pass() {
        let mut p = Score::new(WeightedScore::paper_default(), 3, Scope::Run).unwrap();
        let m: Metrics = [("loss".to_string(), 0.5), ("acc".to_string(), 0.9)]
            .into_iter()
            .collect();
        let e = p.on_pass_end(&m, &st(1)).unwrap_err();
        assert_eq!(
            e,
            PolicyError::MissingMetric {
                policy: "score",
                metric: "accuracy".into(),
                sent: "acc, loss".into()
            }
        );
        let msg = e.to_string();
        assert!(
            msg.contains("`accuracy`") && msg.contains("acc, loss"),
            "{msg}"
        );
        // The failed pass changed nothing.
        assert_eq!((p.best(), p.wait()), (None, 0));

        let e = p.on_pass_end(&Metrics::new(), &st(1)).unwrap_err();
        assert!(e.to_string().contains("no metrics"), "{e}");

        let mut b = Bollinger::new(WeightedScore::paper_default(), 5, 2.0, Scope::Run).unwrap();
        let e = b.on_pass_end(&loss(1.0), &st(1)).unwrap_err();
        assert!(
            matches!(&e, PolicyError::MissingMetric { policy: "bollinger", metric, .. } if metric == "accuracy"),
            "{e}"
        );
        assert_eq!(b.recent.len(), 0);
    }

    #[test]
    fn overflowing_score_is_an_error() {
        let w = WeightedScore::new(vec![MetricTerm::plain("loss").unwrap()], vec![1e300]).unwrap();
        let mut p = Score::new(w, 3, Scope::Run).unwrap();
        let e = p.on_pass_end(&loss(1e300), &st(1)).unwrap_err();
        assert!(matches!(e, PolicyError::NonFiniteScore { .. }), "{e}");
        assert_eq!(p.best(), None);
    }

    #[test]
    fn score_counts_waits_exactly_as_fig6() {
        let mut p = Score::new(loss_score(), 3, Scope::Run).unwrap();
        // 5 improves (from +inf), 4 improves, 4 is equal (not an improvement: wait 1),
        // 4.5 is worse (wait 2), 4 is equal again (wait 3 >= wait_th: advance).
        let out = feed(&mut p, 0, &[5.0, 4.0, 4.0, 4.5, 4.0]);
        assert_eq!(verdicts(&out), [R, R, R, R, A]);
        let waits: Vec<_> = out
            .iter()
            .map(|(_, r)| r["wait"].as_u64().unwrap())
            .collect();
        assert_eq!(waits, [0, 0, 1, 2, 3]);
        assert_eq!(
            out[4].1,
            json!({"policy": "score", "best": 4.0, "current": 4.0, "improved": false,
                   "wait": 3, "wait_th": 3, "best_scope": "run", "passes": 5})
        );
        assert_eq!(out[1].1["improved"], true);
    }

    #[test]
    fn score_improvement_resets_wait() {
        let mut p = Score::new(loss_score(), 3, Scope::Run).unwrap();
        let out = feed(&mut p, 0, &[5.0, 6.0, 6.0, 4.0, 6.0, 6.0, 6.0]);
        assert_eq!(verdicts(&out), [R, R, R, R, R, R, A]);
        let waits: Vec<_> = out
            .iter()
            .map(|(_, r)| r["wait"].as_u64().unwrap())
            .collect();
        assert_eq!(waits, [0, 1, 2, 0, 1, 2, 3]);
        // Called again while the daemon waits for staging: still advance, wait keeps counting.
        let d = p.on_pass_end(&loss(6.0), &st(8)).unwrap();
        assert_eq!((d.verdict, d.reason["wait"].clone()), (A, json!(4)));
        // An improvement while waiting changes the policy's mind (the daemon has latched).
        let d = p.on_pass_end(&loss(3.0), &st(9)).unwrap();
        assert_eq!((d.verdict, d.score), (R, Some(3.0)));
    }

    #[test]
    fn score_wait_restarts_per_mini_epoch_and_best_follows_scope() {
        // Run scope: best (4.0) survives the advance, wait restarts at 0.
        let mut p = Score::new(loss_score(), 3, Scope::Run).unwrap();
        feed(&mut p, 0, &[5.0, 4.0, 4.0, 4.0, 4.0]);
        p.on_advance();
        assert_eq!((p.best(), p.wait()), (Some(4.0), 0));
        let out = feed(&mut p, 1, &[4.5, 4.2, 4.1]);
        assert_eq!(verdicts(&out), [R, R, A]); // rf = wait_th: never beat the run's best.
        p.on_advance();
        let out = feed(&mut p, 2, &[3.9, 4.0, 4.0, 4.0]);
        assert_eq!(verdicts(&out), [R, R, R, A]);

        // Per-mini-epoch scope: best restarts, so 4.5 is the first improvement.
        let mut p = Score::new(loss_score(), 3, Scope::PerMiniEpoch).unwrap();
        feed(&mut p, 0, &[5.0, 4.0, 4.0, 4.0, 4.0]);
        p.on_advance();
        assert_eq!((p.best(), p.wait()), (None, 0));
        let out = feed(&mut p, 1, &[4.5, 4.2, 4.1, 4.1, 4.1, 4.1]);
        assert_eq!(verdicts(&out), [R, R, R, R, R, A]);
        assert_eq!(out[5].1["best_scope"], "per_mini_epoch");
    }

    #[test]
    fn score_expected_rf_follows_completed_mini_epochs() {
        let mut p = Score::new(loss_score(), 3, Scope::Run).unwrap();
        assert_eq!(p.expected_rf(), 3.0);
        assert_eq!(
            Score::new(loss_score(), 3, Scope::PerMiniEpoch)
                .unwrap()
                .expected_rf(),
            4.0
        );
        feed(&mut p, 0, &[5.0, 4.0, 4.0, 4.0, 4.0]);
        p.on_advance();
        assert_eq!(p.expected_rf(), 5.0);
        feed(&mut p, 1, &[4.0, 4.0, 4.0]);
        p.on_advance();
        assert_eq!(p.expected_rf(), 4.0);
        // A forced advance before any pass does not count as an rf of 0.
        p.on_advance();
        assert_eq!(p.expected_rf(), 4.0);
        assert!(Score::new(loss_score(), 0, Scope::Run).is_err());
    }

    /// Sample mean and standard deviation computed longhand, for checking the band.
    fn longhand(xs: &[f64]) -> (f64, f64) {
        let n = xs.len() as f64;
        let ma = xs.iter().sum::<f64>() / n;
        let var = xs.iter().map(|x| (x - ma) * (x - ma)).sum::<f64>() / (n - 1.0);
        (ma, var.sqrt())
    }

    #[test]
    fn bollinger_fills_then_compares_against_the_previous_window() {
        let mut p = Bollinger::new(loss_score(), 5, 2.0, Scope::Run).unwrap();
        let out = feed(&mut p, 0, &[1.0, 0.9, 0.8, 0.85, 0.75]);
        assert_eq!(verdicts(&out), [R; 5]);
        for (i, (_, r)) in out.iter().enumerate() {
            assert_eq!(r["filling"], true);
            assert_eq!(r["have"], i);
        }
        // Window [1.0, 0.9, 0.8, 0.85, 0.75]: MA = 4.3 / 5 = 0.86; squared deviations
        // .0196 + .0016 + .0036 + .0001 + .0121 = .037; sample variance .037 / 4 = .00925;
        // std = 0.096177; lower = 0.86 - 2 * 0.096177 = 0.667646.
        let (ma, std, lower, upper) = p.band().unwrap();
        assert!((ma - 0.86).abs() < 1e-12);
        assert!((std - 0.00925f64.sqrt()).abs() < 1e-12);
        assert!((lower - 0.667_646).abs() < 1e-6, "{lower}");
        assert!((upper - 1.052_354).abs() < 1e-6, "{upper}");
        // 0.68 would be below a population-std band (0.86 - 2 * 0.086023 = 0.687953) but is
        // inside the sample-std band: repeat.
        let d = p.on_pass_end(&loss(0.68), &st(6)).unwrap();
        assert_eq!(d.verdict, R);
        assert!((d.reason["lower"].as_f64().unwrap() - lower).abs() < 1e-15);
        assert_eq!(d.reason["current"], 0.68);
        for key in ["ma", "std", "lower", "upper", "current", "window", "k"] {
            assert!(d.reason.get(key).is_some(), "{key}: {}", d.reason);
        }
        // 0.68 joined the window and 1.0 left it; the band is recomputed from those five.
        let w = [0.9, 0.8, 0.85, 0.75, 0.68];
        let (ma, std) = longhand(&w);
        let lower = ma - 2.0 * std;
        let (ma2, std2, lower2, _) = p.band().unwrap();
        assert!((ma2 - ma).abs() < 1e-12 && (std2 - std).abs() < 1e-12);
        assert!((lower2 - lower).abs() < 1e-12);
        // A score just above the lower band repeats; just below advances.
        let mut q = p.clone();
        assert_eq!(
            q.on_pass_end(&loss(lower + 1e-9), &st(7)).unwrap().verdict,
            R
        );
        let d = p.on_pass_end(&loss(lower - 1e-9), &st(7)).unwrap();
        assert_eq!(d.verdict, A);
        assert_eq!(d.score, Some(lower - 1e-9));
    }

    #[test]
    fn bollinger_current_score_is_not_in_its_own_band() {
        // The previous five scores are [1, 1, 1, 1, 1] (std 0) and the current is 0.99: a
        // breakout that including the current score in the window would hide.
        let mut p = Bollinger::new(loss_score(), 5, 2.0, Scope::Run).unwrap();
        feed(&mut p, 0, &[1.0; 5]);
        let d = p.on_pass_end(&loss(1.0), &st(6)).unwrap();
        assert_eq!(
            d.verdict, R,
            "equal to the band's lower edge is not below it"
        );
        assert_eq!(
            (d.reason["std"].as_f64(), d.reason["lower"].as_f64()),
            (Some(0.0), Some(1.0))
        );
        let d = p.on_pass_end(&loss(0.99), &st(7)).unwrap();
        assert_eq!(d.verdict, A);
        // With 0.99 in the window the largest possible z-score of one value among five is
        // (5 - 1) / sqrt(5) = 1.79 < K = 2: the rule could never fire.
        let (ma, std) = longhand(&[1.0, 1.0, 1.0, 1.0, 0.99]);
        assert!((ma - 0.99) / std < 2.0);
    }

    #[test]
    fn bollinger_window_scope() {
        // Run scope: the window survives the advance, so the next mini-epoch is judged at once.
        let mut p = Bollinger::new(loss_score(), 3, 1.0, Scope::Run).unwrap();
        feed(&mut p, 0, &[10.0, 9.0, 8.0]);
        p.on_advance();
        // Window [10, 9, 8]: MA 9, std 1, lower 8 (K = 1).
        let out = feed(&mut p, 1, &[7.5]);
        assert_eq!(verdicts(&out), [A]);
        assert_eq!(out[0].1["ma"], 9.0);
        assert_eq!(out[0].1["std"], 1.0);
        assert_eq!(out[0].1["lower"], 8.0);
        assert_eq!(out[0].1["upper"], 10.0);

        // Per-mini-epoch scope: the window empties at the advance and refills.
        let mut p = Bollinger::new(loss_score(), 3, 1.0, Scope::PerMiniEpoch).unwrap();
        feed(&mut p, 0, &[10.0, 9.0, 8.0]);
        p.on_advance();
        let out = feed(&mut p, 1, &[7.5, 7.0, 6.5, 5.0]);
        assert_eq!(verdicts(&out), [R, R, R, A]);
        assert_eq!(out[2].1["filling"], true);
        assert_eq!(out[3].1["window_scope"], "per_mini_epoch");
        assert_eq!(p.expected_rf(), 3.0);
    }

    #[test]
    fn bollinger_parameters() {
        assert!(Bollinger::new(loss_score(), 1, 2.0, Scope::Run).is_err());
        for k in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let e = Bollinger::new(loss_score(), 5, k, Scope::Run).unwrap_err();
            assert!(e.to_string().contains("bollinger_k"), "{e}");
        }
        let p = Bollinger::new(loss_score(), 5, 2.0, Scope::Run).unwrap();
        assert_eq!(p.expected_rf(), 6.0);
    }

    #[test]
    fn bollinger_under_bounded_stops_at_rf_max_while_filling() {
        let inner = Bollinger::new(loss_score(), 5, 2.0, Scope::Run).unwrap();
        let mut b = Bounded::new(Box::new(inner), 1, 3).unwrap();
        let out = feed(&mut b, 0, &[1.0, 0.9, 0.8]);
        assert_eq!(verdicts(&out), [R, R, A]);
        assert_eq!(out[2].1["bound"], "rf_max");
        assert_eq!(out[2].1["filling"], true);
    }

    #[test]
    fn learned_replays_then_falls_back() {
        let mut p = Learned::new(vec![2, 3], Box::new(Fixed::new(5).unwrap())).unwrap();
        assert_eq!(p.expected_rf(), 2.0);
        let out = feed(&mut p, 0, &[1.0, 1.0]);
        assert_eq!(verdicts(&out), [R, A]);
        assert_eq!(
            out[1].1,
            json!({"policy": "learned", "source": "history", "sequence": 0, "rf": 2,
                   "passes": 2, "schedule_len": 2})
        );
        p.on_advance();
        assert_eq!(p.expected_rf(), 3.0);
        assert_eq!(verdicts(&feed(&mut p, 1, &[1.0; 3])), [R, R, A]);
        p.on_advance();
        assert_eq!(p.expected_rf(), 5.0);
        let out = feed(&mut p, 2, &[1.0; 5]);
        assert_eq!(verdicts(&out), [R, R, R, R, A]);
        assert_eq!(out[4].1["source"], "fallback");
        assert_eq!(out[4].1["fallback"]["policy"], "fixed");
        assert_eq!(p.name(), "learned");
        assert!(Learned::new(vec![2, 0], Box::new(Fixed::new(5).unwrap())).is_err());
    }

    #[test]
    fn learned_follows_the_sequence_it_is_told() {
        // A resumed run starts at sequence 1: it replays schedule[1], not schedule[0].
        let mut p = Learned::new(vec![2, 4], Box::new(Fixed::new(9).unwrap())).unwrap();
        assert_eq!(verdicts(&feed(&mut p, 1, &[1.0; 4])), [R, R, R, A]);
        assert_eq!(p.expected_rf(), 4.0);
    }

    #[test]
    fn learned_fallback_sees_every_pass() {
        let fb = Score::new(WeightedScore::paper_default(), 3, Scope::Run).unwrap();
        let mut p = Learned::new(vec![2], Box::new(fb)).unwrap();
        // The score fallback needs accuracy even while the history is replayed.
        let e = p.on_pass_end(&loss(1.0), &st(1)).unwrap_err();
        assert!(matches!(e, PolicyError::MissingMetric { .. }), "{e}");

        let fb = Score::new(loss_score(), 2, Scope::Run).unwrap();
        let mut p = Learned::new(vec![2], Box::new(fb)).unwrap();
        let d = p.on_pass_end(&loss(3.0), &at(0, 1)).unwrap();
        assert_eq!(d.score, Some(3.0), "replayed passes still report the score");
        p.on_pass_end(&loss(2.0), &at(0, 2)).unwrap();
        p.on_advance();
        // The fallback's best (2.0) was learned during replay: two non-improving passes end
        // the mini-epoch.
        let out = feed(&mut p, 1, &[2.5, 2.0]);
        assert_eq!(verdicts(&out), [R, A]);
        assert_eq!(out[1].1["fallback"]["best"], 2.0);
    }

    #[test]
    fn learned_rf_is_bounded() {
        let l = Learned::new(vec![200, 1], Box::new(Fixed::new(4).unwrap())).unwrap();
        let mut b = Bounded::new(Box::new(l), 2, 128).unwrap();
        let d = b.on_pass_end(&loss(1.0), &at(0, 128)).unwrap();
        assert_eq!((d.verdict, d.reason["bound"].clone()), (A, json!("rf_max")));
        b.on_advance();
        let d = b.on_pass_end(&loss(1.0), &at(1, 1)).unwrap();
        assert_eq!((d.verdict, d.reason["bound"].clone()), (R, json!("rf_min")));
        assert_eq!(b.on_pass_end(&loss(1.0), &at(1, 2)).unwrap().verdict, A);
    }

    /// Answers a scripted verdict per pass, to drive [`Bounded`] with arbitrary decisions.
    struct Scripted(Vec<bool>, usize);

    impl RfPolicy for Scripted {
        fn name(&self) -> &'static str {
            "scripted"
        }
        fn on_pass_end(
            &mut self,
            _: &Metrics,
            _: &PassState,
        ) -> Result<PolicyDecision, PolicyError> {
            let advance = self.0[self.1 % self.0.len()];
            self.1 += 1;
            Ok(PolicyDecision {
                verdict: if advance { A } else { R },
                reason: json!({"policy": "scripted"}),
                score: None,
            })
        }
        fn expected_rf(&self) -> f64 {
            self.0.len() as f64 * 1000.0
        }
    }

    proptest! {
        /// Whatever the inner policy says, every mini-epoch ends within [rf_min, rf_max].
        #[test]
        fn bounded_rf_always_within_bounds(
            script in proptest::collection::vec(any::<bool>(), 1..64),
            rf_min in 1u32..10,
            extra in 0u32..20,
        ) {
            let rf_max = rf_min + extra;
            let mut b = Bounded::new(Box::new(Scripted(script, 0)), rf_min, rf_max).unwrap();
            prop_assert!(b.expected_rf() <= rf_max as f64);
            for seq in 0..10u64 {
                let mut passes = 0;
                loop {
                    passes += 1;
                    let d = b.on_pass_end(&Metrics::new(), &at(seq, passes)).unwrap();
                    if d.verdict == A {
                        break;
                    }
                    prop_assert!(passes < rf_max);
                }
                prop_assert!((rf_min..=rf_max).contains(&passes), "rf {}", passes);
                b.on_advance();
            }
        }

        /// A strictly decreasing score always improves, so `score` never advances before rf_max.
        #[test]
        fn decreasing_score_runs_to_rf_max(
            start in -1e3f64..1e3,
            steps in proptest::collection::vec(1e-6f64..10.0, 1..200),
            wait in 1u32..6,
            rf_max in 1u32..40,
            per in any::<bool>(),
        ) {
            let scope = if per { Scope::PerMiniEpoch } else { Scope::Run };
            let inner = Score::new(loss_score(), wait, scope).unwrap();
            let mut b = Bounded::new(Box::new(inner), 1, rf_max).unwrap();
            let (mut x, mut passes, mut seq) = (start, 0u32, 0u64);
            for step in steps {
                x -= step;
                passes += 1;
                let d = b.on_pass_end(&loss(x), &at(seq, passes)).unwrap();
                prop_assert_eq!(d.reason["wait"].as_u64(), Some(0));
                if passes < rf_max {
                    prop_assert_eq!(d.verdict, R);
                } else {
                    prop_assert_eq!(d.verdict, A);
                    b.on_advance();
                    passes = 0;
                    seq += 1;
                }
            }
        }

        /// The band agrees with a longhand sample mean / std over the previous N scores.
        #[test]
        fn bollinger_matches_longhand(
            scores in proptest::collection::vec(-100f64..100.0, 2..60),
            window in 2usize..8,
            k in 0.1f64..3.0,
        ) {
            let mut p = Bollinger::new(loss_score(), window, k, Scope::Run).unwrap();
            for (i, &s) in scores.iter().enumerate() {
                let d = p.on_pass_end(&loss(s), &st(i as u32 + 1)).unwrap();
                if i < window {
                    prop_assert_eq!(d.verdict, R);
                    prop_assert_eq!(&d.reason["filling"], &json!(true));
                } else {
                    let (ma, std) = longhand(&scores[i - window..i]);
                    let lower = ma - k * std;
                    let got = d.reason["lower"].as_f64().unwrap();
                    prop_assert!((got - lower).abs() <= 1e-9 * (1.0 + lower.abs()));
                    // Away from the edge, the verdict is the longhand one.
                    if (s - lower).abs() > 1e-9 * (1.0 + lower.abs()) {
                        prop_assert_eq!(d.verdict == A, s < lower);
                    }
                }
            }
        }

        /// A constant score never leaves the band below.
        #[test]
        fn bollinger_constant_score_never_advances(x in -1e6f64..1e6, n in 2usize..10) {
            let mut p = Bollinger::new(loss_score(), n, 2.0, Scope::Run).unwrap();
            for i in 0..40u32 {
                prop_assert_eq!(p.on_pass_end(&loss(x), &st(i + 1)).unwrap().verdict, R);
            }
        }

        /// Any term spelling that parses prints back to itself after a second parse.
        #[test]
        fn metric_term_roundtrip(name in "[A-Za-z_][A-Za-z0-9_./]{0,20}", complement in any::<bool>()) {
            let spec = if complement { format!("1-{name}") } else { name.clone() };
            let t: MetricTerm = spec.parse().unwrap();
            prop_assert_eq!(t.metric(), name.as_str());
            prop_assert_eq!(t.to_string().parse::<MetricTerm>().unwrap(), t);
        }
    }
}
