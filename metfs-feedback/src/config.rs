//! The rf policy configuration: which policy decides when the view advances, and its knobs.
//!
//! [`PolicyConfig`] is the one declaration of the policy settings: its `serde` form is read
//! from a mount's config file and environment, and with the `clap` feature (which the `metfs`
//! binary turns on) the same fields are the flags `--rf-policy`, `--rf`, `--rf-min`, ...
//! (the key with dashes; each flag's id is its key, `kind` being the key `rf_policy`). Each
//! field's doc comment is its help text and its default is the [`Default`] impl's (the flags
//! show it). Every field has a default, so an empty table is a valid config (the paper's
//! baseline, fixed rf 4). Unknown keys are an error rather than silently ignored, because a
//! misspelt knob would otherwise run an experiment with a default nobody asked for. The lists
//! (`score_metrics`, `score_weights`) are read as arrays or as one comma-separated string, as
//! on a command line or in an environment variable.
//!
//! [`PolicyConfig::validate`] checks every field and names the offending key;
//! [`build_policy`] validates and returns the policy already wrapped in
//! [`Bounded`], so `rf_min <= rf <= rf_max` holds for every policy the daemon runs.
//!
//! Metric terms (`loss`, `1 - accuracy`) are parsed when the config is read, so a malformed
//! term fails at mount time, not at the first `pass_end`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

#[cfg(feature = "clap")]
use crate::policy::DEFAULT_TERMS;
use crate::policy::{
    default_terms, BandSide, Bollinger, Bounded, CurrentPoint, Fixed, Learned, MetricTerm, Paced,
    PacedParams, PolicyError, ReplayMetric, RfPolicy, Scope, Score, Spread, WeightedScore,
};

/// Errors of the config module: a key whose value cannot be used.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ConfigError {
    /// The value of `key` is invalid.
    #[error("rf policy config `{key}`: {reason}")]
    Invalid {
        /// The config key (the command-line flag is the same with dashes).
        key: &'static str,
        /// What is wrong and, where it helps, what would be right.
        reason: String,
    },
    /// A policy refused its parameters (a check [`PolicyConfig::validate`] has no twin for).
    #[error(transparent)]
    Policy(#[from] PolicyError),
}

fn invalid(key: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        reason: reason.into(),
    }
}

pub use crate::policy::PolicyKind;

/// The policies `learned` may fall back to (not `learned` itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FallbackKind {
    /// Exactly `rf` passes per mini-epoch.
    Fixed,
    /// Score-based adaptive rf.
    #[default]
    Score,
    /// Bollinger-band adaptive rf.
    Bollinger,
}

impl PolicyKind {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::Fixed => "fixed",
            PolicyKind::Score => "score",
            PolicyKind::Bollinger => "bollinger",
            PolicyKind::Learned => "learned",
            PolicyKind::Paced => "paced",
        }
    }
}

impl FallbackKind {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FallbackKind::Fixed => "fixed",
            FallbackKind::Score => "score",
            FallbackKind::Bollinger => "bollinger",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for FallbackKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PolicyKind {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "fixed" => Ok(PolicyKind::Fixed),
            "score" => Ok(PolicyKind::Score),
            "bollinger" => Ok(PolicyKind::Bollinger),
            "learned" => Ok(PolicyKind::Learned),
            "paced" => Ok(PolicyKind::Paced),
            other => Err(invalid(
                "kind",
                format!(
                    "unknown policy `{other}`; expected fixed, score, bollinger, learned or paced"
                ),
            )),
        }
    }
}

impl FromStr for FallbackKind {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "fixed" => Ok(FallbackKind::Fixed),
            "score" => Ok(FallbackKind::Score),
            "bollinger" => Ok(FallbackKind::Bollinger),
            other => Err(invalid(
                "learned_fallback",
                format!("unknown policy `{other}`; expected fixed, score or bollinger"),
            )),
        }
    }
}

/// The rf policy configuration. Every field is optional in the file; defaults below.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// Which policy decides: `fixed`, `score`, `bollinger`, `learned` or `paced` (the key
    /// `rf_policy`; `kind` is accepted too).
    ///
    /// Default `fixed`: the paper's baseline, the only policy that needs no metrics from the
    /// job (a job without a metrics callback still trains), and on the fixed-rf front by
    /// definition. benches/rf_front.py found no adaptive policy above that front on both of its
    /// workloads (docs/EXPERIMENTS.md): `score` with `score_metrics = ["val_loss"]` and
    /// `best_scope = "per_mini_epoch"` was above it on one and on it on the other, `paced` on
    /// it or below, Bollinger below. So the default stays the simplest policy on the front.
    #[serde(rename = "rf_policy", alias = "kind")]
    #[cfg_attr(
        feature = "clap",
        arg(id = "rf_policy", long = "rf-policy", default_value_t)
    )]
    pub kind: PolicyKind,

    /// Passes per mini-epoch for `fixed` (and for `learned` falling back to `fixed`).
    ///
    /// Default 4: a modest fixed rf the paper finds safe for most models (EfficientNet-B0
    /// stays within 1 % of the baseline up to (nm, rf) = (32, 32), ResNet-50 loses about 1 %
    /// at (64, 64)), while already cutting capacity-tier reads fourfold.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DEFAULT_RF))]
    pub rf: u32,

    /// Fewest passes per mini-epoch, whatever the policy says.
    ///
    /// Default 1: the paper's policies may leave a mini-epoch after any pass, so no floor is
    /// imposed. Raise it to guarantee an I/O saving of at least `rf_min`x.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DEFAULT_RF_MIN))]
    pub rf_min: u32,

    /// Most passes per mini-epoch, whatever the policy says.
    ///
    /// Default 128: the largest rf the paper evaluates ((nm, rf) = (128, 128)), where Fig. 11
    /// shows adaptive policies occasionally reaching it; it also exceeds B1/B2 = 26 TB/s /
    /// 400 GB/s = 65 of the paper's Summit example, so the cap never forces an I/O stall there.
    /// A policy that never advances (a score that keeps improving) stops here.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DEFAULT_RF_MAX))]
    pub rf_max: u32,

    /// Terms of the score for `score` and `bollinger`: each `NAME` or `1 - NAME` (`1-NAME`),
    /// naming metrics the job sends in `pass_end`; lower score is better.
    ///
    /// Default `["loss", "1 - accuracy", "1 - val_accuracy"]`: the paper's Fig. 6 (the metric
    /// names Keras reports). A job that validates only every few passes must leave
    /// `val_accuracy` out: a missing metric is an error, never a silent zero.
    #[serde(deserialize_with = "de_terms")]
    #[cfg_attr(feature = "clap", arg(long, value_delimiter = ',', default_value = DEFAULT_TERMS))]
    pub score_metrics: Vec<MetricTerm>,

    /// One weight per term of `score_metrics`; `score = Σ weight · term` [default: 1 each].
    ///
    /// Default: 1.0 for every term (omitted from the file), the plain sum the paper uses as its
    /// example, which also fits a custom `score_metrics` without listing weights.
    #[serde(deserialize_with = "de_weights")]
    #[cfg_attr(feature = "clap", arg(long, value_delimiter = ','))]
    pub score_weights: Option<Vec<f64>>,

    /// `score`: consecutive passes without a strictly better score before advancing
    /// (`wait_th` of Fig. 6).
    ///
    /// Default 3: one noisy pass (validation accuracy jitters by a few tenths of a percent
    /// between passes) must not end a mini-epoch, while a mini-epoch that has stopped helping
    /// costs at most three extra passes. It is also the patience range (2 to 5) commonly
    /// used for early stopping, which Fig. 6 mirrors.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DEFAULT_SCORE_WAIT))]
    pub score_wait: u32,

    /// `score`: whether the best score is kept for the whole run (`run`) or restarts at every
    /// mini-epoch (`per_mini_epoch`).
    ///
    /// Default `run`: Fig. 6 keeps `self.score` in the callback for the whole training, so a
    /// mini-epoch is repeated only while it still brings the model to a new best. With
    /// `per_mini_epoch` the first pass of every mini-epoch counts as an improvement, so every
    /// mini-epoch runs at least `score_wait + 1` passes.
    #[cfg_attr(feature = "clap", arg(long, default_value_t))]
    pub best_scope: Scope,

    /// `bollinger`: N, the number of previous scores the moving average and standard deviation
    /// are taken over (at least 2).
    ///
    /// Default 5: the band must follow a loss curve that changes scale within a few
    /// mini-epochs, and must exist early (the policy repeats until N scores exist); 5 scores
    /// are the fewest that still give a usable spread estimate (4 degrees of freedom).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DEFAULT_BOLLINGER_WINDOW))]
    pub bollinger_window: u32,

    /// `bollinger`: K, the band half-width in standard deviations (> 0).
    ///
    /// Default 2.0: the classic Bollinger width, the paper's "normal range". For a score that
    /// only jitters, a pass then falls below the band with probability about 7 % (Student t
    /// with 4 degrees of freedom), so a flat mini-epoch is left after about 14 passes; a
    /// sudden drop leaves at once. 1.0 would leave after about 5 passes of noise.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DEFAULT_BOLLINGER_K))]
    pub bollinger_k: f64,

    /// `bollinger`: whether the window spans the run (`run`) or is emptied at every advance
    /// (`per_mini_epoch`).
    ///
    /// Default `run`: the band is the score's recent range of fluctuation whatever mini-epoch
    /// produced it, so a new mini-epoch can be judged from its first pass; `per_mini_epoch`
    /// forces at least `bollinger_window + 1` passes on every mini-epoch.
    #[cfg_attr(feature = "clap", arg(long, default_value_t))]
    pub bollinger_scope: Scope,

    /// `bollinger`: which exit from the band ends a mini-epoch: `below` (the score falls
    /// below `MA - K * std`), `either` (also when it rises above `MA + K * std`) or `above`
    /// (only then: a higher-is-better score, such as `val_accuracy` with weight 1).
    ///
    /// Default `below`: a lower-is-better score that drops out of its range is the breakout
    /// the paper's rule describes; `either` also leaves a mini-epoch whose score jumps up (a
    /// setback), which the paper's wording allows. docs/EXPERIMENTS.md measures both on the
    /// CNN study.
    #[cfg_attr(feature = "clap", arg(long, default_value_t))]
    pub bollinger_side: BandSide,

    /// `bollinger`: the band's standard deviation, `sample` (divisor N - 1) or `population`
    /// (divisor N).
    ///
    /// Default `sample`: the window is a small sample of a noisy score, and the unbiased
    /// estimate keeps the band from being too narrow for small N; `population` is the trader's
    /// band, one of the paper's possible readings, kept to be measured.
    #[cfg_attr(feature = "clap", arg(long, default_value_t))]
    pub bollinger_std: Spread,

    /// `bollinger`: whether the band is computed with the score it judges (`included`: the
    /// N - 1 previous scores and the current one) or from the N previous scores (`excluded`).
    ///
    /// Default `excluded`: with the current point inside, one score can be at most
    /// (N-1)/sqrt(N) standard deviations from the mean (1.79 for N = 5), so K = 2 never fires
    /// for small N; `included` with N = 20 is the chart's reading, kept to be measured.
    #[cfg_attr(feature = "clap", arg(long, default_value_t))]
    pub bollinger_current: CurrentPoint,

    /// `paced`: the cap on rf at the start of the run (progress 0), and for a job that sends no
    /// `progress`.
    ///
    /// Default 4: the fixed rf this project's default already trusts (it reached the
    /// time-to-accuracy target of benches/tta.py), and well inside what the paper finds safe
    /// early, when convergence is most sensitive to rf (§V.A).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DEFAULT_PACED_CAP_START))]
    pub paced_cap_start: u32,

    /// `paced`: the cap on rf at the end of the run (progress 1); the cap grows linearly
    /// between `paced_cap_start` and this with the job's `progress`.
    ///
    /// Default 32: the largest rf at which the paper's EfficientNet-B0 stays within 1 % of its
    /// baseline ((nm, rf) = (32, 32)); ResNet-50 loses about 1 % at 64, so 32 is safe for both
    /// even if a whole run were spent there.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DEFAULT_PACED_CAP_END))]
    pub paced_cap_end: u32,

    /// `paced`: past the stall-free rf, a repeat is made only while the held-out loss improved
    /// over a repeated pass by at least this fraction of its improvement over a fresh pass
    /// (in [0, 1]; 0 repeats while it does not get worse, 1 almost never repeats).
    ///
    /// Default 0.5: a repeated pass costs the same compute as a fresh one but no tier bytes;
    /// at half a fresh pass's gain, two repeats buy what one fresh pass does while reading
    /// nothing, the even trade between the two budgets. Measurements pending
    /// (docs/EXPERIMENTS.md).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DEFAULT_PACED_GAIN_FRACTION))]
    pub paced_gain_fraction: f64,

    /// `learned`: the policy deciding where the recorded schedule runs out (or when there is
    /// none yet): `fixed`, `score` or `bollinger`, with the knobs above.
    ///
    /// Default `score`: the first `learned` run has no history and is itself recorded, so an
    /// adaptive fallback is what makes the recorded schedule worth replaying; `score` is the
    /// policy the paper pairs with remembering the strategy.
    #[cfg_attr(feature = "clap", arg(long, default_value_t))]
    pub learned_fallback: FallbackKind,

    /// `learned`: the metric that picks the earlier run to replay, `min:TERM` (lower is
    /// better, a loss) or `max:TERM` (higher is better, an accuracy), TERM as in
    /// `score_metrics`; the run with the best final value is replayed [default: the first
    /// score term].
    ///
    /// Default: the first term of `score_metrics` with a non-zero weight, lower being better
    /// when its weight is positive (the score is minimised) and higher when negative, so the
    /// run replayed is the one that ended best at what the score policy optimised (with the
    /// paper's terms, the lowest final training loss). Name a validation metric here when the
    /// job sends one: it says more about the model than a training loss. A run's final value
    /// is the metric's value in the last mini-epoch that recorded it. Finished runs (a shared
    /// mount's jobs that left) are ranked before the others; a plain mount's runs never finish
    /// and are ranked among themselves. When no run recorded the metric, the latest finished
    /// run is replayed, else the one that got furthest; a metric named here that the earlier
    /// runs did not record, while they recorded others, is refused at mount.
    #[cfg_attr(feature = "clap", arg(long))]
    pub learned_metric: Option<ReplayMetric>,
}

/// Default of [`PolicyConfig::rf`].
pub const DEFAULT_RF: u32 = 4;
/// Default of [`PolicyConfig::rf_min`].
pub const DEFAULT_RF_MIN: u32 = 1;
/// Default of [`PolicyConfig::rf_max`].
pub const DEFAULT_RF_MAX: u32 = 128;
/// Default of [`PolicyConfig::score_wait`].
pub const DEFAULT_SCORE_WAIT: u32 = 3;
/// Default of [`PolicyConfig::bollinger_window`].
pub const DEFAULT_BOLLINGER_WINDOW: u32 = 5;
/// Default of [`PolicyConfig::bollinger_k`].
pub const DEFAULT_BOLLINGER_K: f64 = 2.0;
/// Default of [`PolicyConfig::paced_cap_start`].
pub const DEFAULT_PACED_CAP_START: u32 = 4;
/// Default of [`PolicyConfig::paced_cap_end`].
pub const DEFAULT_PACED_CAP_END: u32 = 32;
/// Default of [`PolicyConfig::paced_gain_fraction`].
pub const DEFAULT_PACED_GAIN_FRACTION: f64 = 0.5;

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            kind: PolicyKind::Fixed,
            rf: DEFAULT_RF,
            rf_min: DEFAULT_RF_MIN,
            rf_max: DEFAULT_RF_MAX,
            score_metrics: default_terms(),
            score_weights: None,
            score_wait: DEFAULT_SCORE_WAIT,
            best_scope: Scope::Run,
            bollinger_window: DEFAULT_BOLLINGER_WINDOW,
            bollinger_k: DEFAULT_BOLLINGER_K,
            bollinger_scope: Scope::Run,
            bollinger_side: BandSide::Below,
            bollinger_std: Spread::Sample,
            bollinger_current: CurrentPoint::Excluded,
            paced_cap_start: DEFAULT_PACED_CAP_START,
            paced_cap_end: DEFAULT_PACED_CAP_END,
            paced_gain_fraction: DEFAULT_PACED_GAIN_FRACTION,
            learned_fallback: FallbackKind::Score,
            learned_metric: None,
        }
    }
}

/// The policy a config actually runs (after resolving `learned`'s fallback).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Base {
    Fixed,
    Score,
    Bollinger,
    Paced,
}

impl From<FallbackKind> for Base {
    fn from(k: FallbackKind) -> Self {
        match k {
            FallbackKind::Fixed => Base::Fixed,
            FallbackKind::Score => Base::Score,
            FallbackKind::Bollinger => Base::Bollinger,
        }
    }
}

impl PolicyConfig {
    /// The weights in effect: `score_weights`, or 1.0 per term.
    pub fn weights(&self) -> Vec<f64> {
        self.score_weights
            .clone()
            .unwrap_or_else(|| vec![1.0; self.score_metrics.len()])
    }

    /// The metric `learned` ranks earlier runs by: `learned_metric`, else the score's first
    /// term with a non-zero weight.
    pub fn replay_metric(&self) -> Result<ReplayMetric, ConfigError> {
        if let Some(m) = &self.learned_metric {
            return Ok(m.clone());
        }
        ReplayMetric::of_score(&self.weighted_score()?).ok_or_else(|| {
            invalid(
                "score_weights",
                "all weights are zero, so no term ranks earlier runs",
            )
        })
    }

    /// The deciding policy: `kind`, or `learned_fallback` for `learned`.
    fn base(&self) -> Base {
        match self.kind {
            PolicyKind::Fixed => Base::Fixed,
            PolicyKind::Score => Base::Score,
            PolicyKind::Bollinger => Base::Bollinger,
            PolicyKind::Learned => self.learned_fallback.into(),
            PolicyKind::Paced => Base::Paced,
        }
    }

    /// The parameters of `paced`.
    pub fn paced_params(&self) -> PacedParams {
        PacedParams {
            cap_start: self.paced_cap_start,
            cap_end: self.paced_cap_end,
            gain_fraction: self.paced_gain_fraction,
        }
    }

    /// The score, built from `score_metrics` and the weights.
    pub fn weighted_score(&self) -> Result<WeightedScore, ConfigError> {
        WeightedScore::new(self.score_metrics.clone(), self.weights()).map_err(|e| match e {
            PolicyError::BadParameter { name, reason } => invalid(name, reason),
            other => invalid("score_metrics", other.to_string()),
        })
    }

    /// Checks every field; the error names the key.
    ///
    /// Fields of a policy that is not in use are checked too (a bad value is a mistake
    /// wherever it is), except the checks that relate them to `rf_min` / `rf_max`, which only
    /// matter for the policy that runs.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.rf == 0 {
            return Err(invalid("rf", "must be at least 1"));
        }
        if self.rf_min == 0 {
            return Err(invalid("rf_min", "must be at least 1"));
        }
        if self.rf_max < self.rf_min {
            return Err(invalid(
                "rf_max",
                format!(
                    "must be at least rf_min ({}), got {}",
                    self.rf_min, self.rf_max
                ),
            ));
        }
        for (i, a) in self.score_metrics.iter().enumerate() {
            if self.score_metrics[..i].contains(a) {
                return Err(invalid(
                    "score_metrics",
                    format!("`{a}` is listed twice; weight it in score_weights instead"),
                ));
            }
        }
        self.weighted_score()?;
        if self.score_wait == 0 {
            return Err(invalid(
                "score_wait",
                "must be at least 1 (1 advances on the first pass without improvement)",
            ));
        }
        if self.bollinger_window < 2 {
            return Err(invalid(
                "bollinger_window",
                format!(
                    "must be at least 2 (a standard deviation needs two scores), got {}",
                    self.bollinger_window
                ),
            ));
        }
        if !(self.bollinger_k.is_finite() && self.bollinger_k > 0.0) {
            return Err(invalid(
                "bollinger_k",
                format!(
                    "must be a finite number greater than 0, got {}",
                    self.bollinger_k
                ),
            ));
        }
        Paced::new(self.paced_params()).map_err(|e| match e {
            PolicyError::BadParameter { name, reason } => invalid(name, reason),
            other => ConfigError::Policy(other),
        })?;
        self.validate_bounds()
    }

    /// The checks that relate the running policy's knobs to `rf_min` / `rf_max`.
    fn validate_bounds(&self) -> Result<(), ConfigError> {
        // With the current score in its window the band fills one pass sooner.
        let fill = match self.bollinger_current {
            CurrentPoint::Excluded => self.bollinger_window,
            CurrentPoint::Included => self.bollinger_window - 1,
        };
        match self.base() {
            Base::Fixed if self.rf < self.rf_min || self.rf > self.rf_max => Err(invalid(
                "rf",
                format!(
                    "{} is outside [rf_min, rf_max] = [{}, {}]; adjust rf or the bound",
                    self.rf, self.rf_min, self.rf_max
                ),
            )),
            Base::Bollinger
                if self.bollinger_scope == Scope::PerMiniEpoch && fill >= self.rf_max =>
            {
                Err(invalid(
                    "bollinger_window",
                    format!(
                        "{} with bollinger_scope = per_mini_epoch: the band would never fill \
                         before rf_max ({}) ends the mini-epoch; use a smaller window, a larger \
                         rf_max or bollinger_scope = run",
                        self.bollinger_window, self.rf_max
                    ),
                ))
            }
            Base::Paced if self.rf_min > self.paced_cap_start => Err(invalid(
                "paced_cap_start",
                format!(
                    "{} is below rf_min ({}): the floor would exceed the cap; raise \
                     paced_cap_start or lower rf_min",
                    self.paced_cap_start, self.rf_min
                ),
            )),
            Base::Paced if self.paced_cap_end > self.rf_max => Err(invalid(
                "paced_cap_end",
                format!(
                    "{} is above rf_max ({}), which would cut the cap short; lower \
                     paced_cap_end or raise rf_max",
                    self.paced_cap_end, self.rf_max
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// A list given as a TOML array or as one comma-separated string (a command line's or an
/// environment variable's spelling).
#[derive(Deserialize)]
#[serde(untagged)]
enum ListOrText<T> {
    Items(Vec<T>),
    Text(String),
}

fn de_terms<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<MetricTerm>, D::Error> {
    // Terms are read as strings and parsed here, so that a bad term is named in the error
    // (an untagged enum would only say that no variant matched).
    match ListOrText::<String>::deserialize(d)? {
        ListOrText::Items(v) => v
            .iter()
            .map(|t| t.parse::<MetricTerm>())
            .collect::<Result<_, _>>()
            .map_err(serde::de::Error::custom),
        ListOrText::Text(t) => parse_metric_list(&t).map_err(serde::de::Error::custom),
    }
}

fn de_weights<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<f64>>, D::Error> {
    match Option::<ListOrText<f64>>::deserialize(d)? {
        None => Ok(None),
        Some(ListOrText::Items(v)) => Ok(Some(v)),
        Some(ListOrText::Text(t)) => parse_weight_list(&t)
            .map(Some)
            .map_err(serde::de::Error::custom),
    }
}

/// Parses a comma-separated list of metric terms (`--score-metrics loss,1-accuracy`).
pub fn parse_metric_list(s: &str) -> Result<Vec<MetricTerm>, ConfigError> {
    s.split(',')
        .map(|t| {
            t.parse::<MetricTerm>()
                .map_err(|e| invalid("score_metrics", e.to_string()))
        })
        .collect()
}

/// Parses a comma-separated list of weights (`--score-weights 1,0.5,0.5`).
pub fn parse_weight_list(s: &str) -> Result<Vec<f64>, ConfigError> {
    s.split(',')
        .map(|w| {
            let w = w.trim();
            w.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite())
                .ok_or_else(|| {
                    invalid(
                        "score_weights",
                        format!("`{w}` is not a finite number; expected e.g. 1,0.5,0.5"),
                    )
                })
        })
        .collect()
}

fn build_base(cfg: &PolicyConfig, base: Base) -> Result<Box<dyn RfPolicy>, ConfigError> {
    Ok(match base {
        Base::Fixed => Box::new(Fixed::new(cfg.rf)?),
        Base::Score => Box::new(Score::new(
            cfg.weighted_score()?,
            cfg.score_wait,
            cfg.best_scope,
        )?),
        Base::Bollinger => Box::new(
            Bollinger::new(
                cfg.weighted_score()?,
                cfg.bollinger_window as usize,
                cfg.bollinger_k,
                cfg.bollinger_scope,
            )?
            .with_side(cfg.bollinger_side)
            .with_reading(cfg.bollinger_std, cfg.bollinger_current),
        ),
        Base::Paced => Box::new(Paced::new(cfg.paced_params())?),
    })
}

/// Validates `cfg` and builds its policy, wrapped in [`Bounded`] (`rf_min`, `rf_max`).
///
/// `learned_schedule` is the rf sequence to replay for `kind = learned` (from
/// `HistoryStore::replay`, ranked by [`PolicyConfig::replay_metric`]); `None` or empty means no
/// history yet, so the fallback decides every mini-epoch (and that run becomes the history).
/// Other kinds ignore it.
pub fn build_policy(
    cfg: &PolicyConfig,
    learned_schedule: Option<Vec<u32>>,
) -> Result<Box<dyn RfPolicy>, ConfigError> {
    cfg.validate()?;
    let inner: Box<dyn RfPolicy> = match cfg.kind {
        PolicyKind::Learned => Box::new(Learned::new(
            learned_schedule.unwrap_or_default(),
            build_base(cfg, cfg.base())?,
        )?),
        _ => build_base(cfg, cfg.base())?,
    };
    Ok(Box::new(Bounded::new(inner, cfg.rf_min, cfg.rf_max)?))
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
