//! Repeating-factor policies: after each pass over the current mini-epoch, repeat or advance?
//!
//! A policy sees the metrics of the pass that just ended and the state of the current
//! mini-epoch and answers [`Verdict::Repeat`] or [`Verdict::Advance`]. It does not know whether
//! the next mini-epoch is staged: the daemon turns an `Advance` into `wait` (keep repeating, no
//! stall) until it is, and latches the wish so that the first pass after staging completes
//! advances. [`Bounded`] wraps every policy so that `rf_min` and `rf_max` always hold.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use thiserror::Error;

use crate::protocol::Metrics;

/// Errors of the policy module.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum PolicyError {
    /// A metric the policy needs is missing from `pass_end`.
    #[error(
        "policy `{policy}` needs metric `{metric}`, which pass_end did not send (it sent: {sent})"
    )]
    MissingMetric {
        policy: &'static str,
        metric: String,
        sent: String,
    },
    /// A parameter is out of range.
    #[error("policy parameter `{name}`: {reason}")]
    BadParameter { name: &'static str, reason: String },
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

    fn st(passes: u32) -> PassState {
        PassState {
            passes,
            sequence: 0,
        }
    }

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
}
