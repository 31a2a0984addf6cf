//! [`PolicyState`]: what a policy has learned during a run, so that a restarted daemon (a
//! shared mount's save file) continues a job's policy where it was instead of relearning it.
//!
//! One flat struct for every policy rather than one type per policy: the daemon saves it
//! without knowing which policy it holds, and each policy reads back the fields it uses and
//! checks them ([`RfPolicy::restore`](super::RfPolicy::restore)); the others stay at their
//! defaults. It is read from a file, so every restore checks the policy's name and each value
//! (finite scores, a window no longer than the policy's) and refuses with the field's name.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::{PacedState, PolicyError, RfTracker, RF_MEMORY};

/// A policy's state (module docs). The fields a policy does not use are left at their
/// defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct PolicyState {
    /// The policy's [`name`](super::RfPolicy::name): a state restores only into the same.
    pub policy: String,
    /// `score`: the lowest score of its scope (`None` before any pass, +∞ in the policy).
    #[serde(default)]
    pub best: Option<f64>,
    /// `score`: passes of the current mini-epoch without improvement.
    #[serde(default)]
    pub wait: u32,
    /// `bollinger`: the last scores of its window, oldest first.
    #[serde(default)]
    pub window: Vec<f64>,
    /// Adaptive policies: passes of the current mini-epoch so far.
    #[serde(default)]
    pub passes: u32,
    /// Adaptive policies: the rf of the last completed mini-epochs, oldest first (what
    /// `expected_rf` averages, so prefetch pacing continues as before).
    #[serde(default)]
    pub recent_rf: Vec<u32>,
    /// `learned`: the sequence of the current mini-epoch, once a pass told it.
    #[serde(default)]
    pub sequence: Option<u64>,
    /// `learned`: its fallback policy's state.
    #[serde(default)]
    pub fallback: Option<Box<PolicyState>>,
    /// `paced`: its smoothed gains, last held-out values and target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paced: Option<PacedState>,
}

fn bad(name: &'static str, reason: String) -> PolicyError {
    PolicyError::BadParameter { name, reason }
}

impl PolicyState {
    /// A state with nothing but the policy's name (a policy that learns nothing: `fixed`).
    pub fn named(policy: &str) -> Self {
        Self {
            policy: policy.to_string(),
            ..Self::default()
        }
    }

    /// Refuses a state saved by another policy.
    pub(super) fn check_name(&self, policy: &'static str) -> Result<(), PolicyError> {
        if self.policy != policy {
            return Err(bad(
                "policy",
                format!(
                    "the saved state is of policy `{}`, this job's policy is `{policy}`",
                    self.policy
                ),
            ));
        }
        Ok(())
    }

    /// The saved best score: finite, or none.
    pub(super) fn best_score(&self) -> Result<f64, PolicyError> {
        match self.best {
            None => Ok(f64::INFINITY),
            Some(b) if b.is_finite() => Ok(b),
            Some(b) => Err(bad("best", format!("{b} is not a finite score"))),
        }
    }

    /// The saved window of scores, each finite and at most `window` of them.
    pub(super) fn scores(&self, window: usize) -> Result<VecDeque<f64>, PolicyError> {
        if self.window.len() > window {
            return Err(bad(
                "window",
                format!(
                    "{} scores saved, more than the policy's window of {window}",
                    self.window.len()
                ),
            ));
        }
        if let Some(s) = self.window.iter().find(|s| !s.is_finite()) {
            return Err(bad("window", format!("{s} is not a finite score")));
        }
        Ok(self.window.iter().copied().collect())
    }

    /// Writes the rf tracker's part of the state.
    pub(super) fn with_rf(mut self, rf: &RfTracker) -> Self {
        self.passes = rf.current;
        self.recent_rf = rf.recent.iter().copied().collect();
        self
    }

    /// Restores the rf tracker's part of the state into `rf`.
    pub(super) fn restore_rf(&self, rf: &mut RfTracker) -> Result<(), PolicyError> {
        if self.recent_rf.len() > RF_MEMORY {
            return Err(bad(
                "recent_rf",
                format!(
                    "{} mini-epochs saved, more than the {RF_MEMORY} remembered",
                    self.recent_rf.len()
                ),
            ));
        }
        if self.recent_rf.contains(&0) {
            return Err(bad(
                "recent_rf",
                "an rf of 0 (every rf is at least 1)".into(),
            ));
        }
        rf.current = self.passes;
        rf.recent = self.recent_rf.iter().copied().collect();
        Ok(())
    }
}
