//! [`Learned`]: replays the rf sequence an earlier run recorded in the rf history, and hands
//! over to a fallback policy where the recording runs out. The fallback sees every pass all
//! along, so it is warm when it takes over and a metric it lacks fails on the first pass.

use serde_json::json;

use super::{PassState, PolicyDecision, PolicyError, RfPolicy, Verdict};
use crate::Metrics;

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
