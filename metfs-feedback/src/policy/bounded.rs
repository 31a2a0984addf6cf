//! [`Bounded`]: the wrapper that makes `rf_min <= passes per mini-epoch <= rf_max` hold around
//! any policy. Every policy the daemon runs is wrapped in one (by
//! [`crate::config::build_policy`]); the inner policy keeps seeing every pass.

use super::{
    Bound, Bounds, PassState, PolicyDecision, PolicyError, PolicyState, RfPolicy, Verdict,
};

use super::PolicyKind;
use crate::Metrics;

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
    fn kind(&self) -> PolicyKind {
        self.inner.kind()
    }
    fn on_pass_end(
        &mut self,
        metrics: &Metrics,
        state: &PassState,
    ) -> Result<PolicyDecision, PolicyError> {
        // Out-of-range signals are refused before any policy's state changes.
        state.check()?;
        // The inner policy always sees every pass, so its statistics stay complete.
        let mut d = self.inner.on_pass_end(metrics, state)?;
        let bound = if state.passes < self.rf_min && d.verdict == Verdict::Advance {
            d.verdict = Verdict::Repeat;
            Some(Bound::RfMin)
        } else if state.passes >= self.rf_max && d.verdict == Verdict::Repeat {
            d.verdict = Verdict::Advance;
            Some(Bound::RfMax)
        } else {
            None
        };
        if let Some(b) = bound {
            *d.reason.bounds_mut() = Bounds {
                bound: Some(b),
                rf_min: Some(self.rf_min),
                rf_max: Some(self.rf_max),
            };
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
    fn state(&self) -> PolicyState {
        self.inner.state()
    }
    fn restore(&mut self, state: &PolicyState) -> Result<(), PolicyError> {
        self.inner.restore(state)
    }
}
