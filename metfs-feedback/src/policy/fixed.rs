//! [`Fixed`]: the paper's baseline, exactly `rf` passes per mini-epoch. It needs no metrics,
//! which makes it the default and the policy of a job that sends none.

use super::{Bounds, PassState, PolicyDecision, PolicyError, Reason, RfPolicy, Verdict};

use super::PolicyKind;
use crate::Metrics;

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
    fn kind(&self) -> PolicyKind {
        PolicyKind::Fixed
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
            reason: Reason::Fixed {
                rf: self.rf,
                passes: state.passes,
                bounds: Bounds::default(),
            },
            score: None,
        })
    }
    fn expected_rf(&self) -> f64 {
        self.rf as f64
    }
}
