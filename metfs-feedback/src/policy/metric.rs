//! The score a policy judges a pass by: [`MetricTerm`] (a metric as sent, or its complement
//! `1 - metric`) and [`WeightedScore`], the weighted sum of Fig. 6. A metric the score needs
//! and `pass_end` did not send is an error naming it, and a sum that is not finite is an
//! error too, so every score a policy sees is a finite number.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::PolicyError;
use crate::Metrics;

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

/// The paper's default score terms (Fig. 6), as written in a config file or on a command line.
pub const DEFAULT_TERMS: &str = "loss,1-accuracy,1-val_accuracy";

/// The paper's default score terms: `loss`, `1 - accuracy`, `1 - val_accuracy` (Fig. 6).
pub fn default_terms() -> Vec<MetricTerm> {
    DEFAULT_TERMS
        .split(',')
        .map(|t| t.parse().expect("the default terms parse"))
        .collect()
}
