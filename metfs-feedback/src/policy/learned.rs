//! [`Learned`]: replays the rf sequence an earlier run recorded in the rf history, and hands
//! over to a fallback policy where the recording runs out. The fallback sees every pass all
//! along, so it is warm when it takes over and a metric it lacks fails on the first pass.
//! [`ReplayMetric`] is how the run to replay is chosen: the earlier run that ended best by it.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{
    Bounds, LearnedSource, MetricTerm, PassState, PolicyDecision, PolicyError, PolicyState, Reason,
    RfPolicy, Verdict, WeightedScore,
};

use super::PolicyKind;
use crate::Metrics;

/// The metric that ranks earlier runs for `learned`, and which way is better.
///
/// Spelled `min:TERM` or `max:TERM`, TERM as in `score_metrics` (`NAME` or `1 - NAME`):
/// `min:val_loss`, `max:val_accuracy`. The direction is part of the spelling because a loss
/// improves downwards and an accuracy upwards, and a name alone does not say which it is;
/// guessing wrong would replay the worst run. Serialized as that spelling.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ReplayMetric {
    term: MetricTerm,
    higher_is_better: bool,
    named: bool,
}

impl ReplayMetric {
    /// What the score ranks by: its first term with a non-zero weight, better lower when the
    /// weight is positive (the score is minimised) and higher when it is negative. `None` only
    /// for a score whose weights are all zero, which [`WeightedScore::new`] refuses.
    pub fn of_score(score: &WeightedScore) -> Option<Self> {
        score
            .terms()
            .iter()
            .zip(score.weights())
            .find(|(_, w)| **w != 0.0)
            .map(|(t, w)| Self {
                term: t.clone(),
                higher_is_better: *w < 0.0,
                named: false,
            })
    }

    /// The term whose value is compared.
    pub fn term(&self) -> &MetricTerm {
        &self.term
    }

    /// Whether a larger value is better (`max:`).
    pub fn higher_is_better(&self) -> bool {
        self.higher_is_better
    }

    /// Whether the `learned_metric` setting named it (rather than the score implying it): a
    /// named metric that earlier runs did not record is a mistake worth refusing, an implied
    /// one merely leaves the runs uncompared.
    pub fn is_named(&self) -> bool {
        self.named
    }

    /// How value `a` ranks against value `b`: `Greater` when `a` is better.
    pub fn compare(&self, a: f64, b: f64) -> Ordering {
        if self.higher_is_better {
            a.total_cmp(&b)
        } else {
            b.total_cmp(&a)
        }
    }
}

impl FromStr for ReplayMetric {
    type Err = PolicyError;
    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let bad = |why: String| PolicyError::BadParameter {
            name: "learned_metric",
            reason: format!("`{spec}`: {why}"),
        };
        let s = spec.trim();
        let (higher_is_better, term) = if let Some(t) = s.strip_prefix("min:") {
            (false, t)
        } else if let Some(t) = s.strip_prefix("max:") {
            (true, t)
        } else {
            return Err(bad(
                "expected `min:TERM` (lower is better, a loss) or `max:TERM` (higher is better, \
                 an accuracy)"
                    .into(),
            ));
        };
        let term = term.parse::<MetricTerm>().map_err(|e| match e {
            PolicyError::BadParameter { reason, .. } => bad(reason),
            other => bad(other.to_string()),
        })?;
        Ok(Self {
            term,
            higher_is_better,
            named: true,
        })
    }
}

impl TryFrom<String> for ReplayMetric {
    type Error = PolicyError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<ReplayMetric> for String {
    fn from(m: ReplayMetric) -> String {
        m.to_string()
    }
}

impl fmt::Display for ReplayMetric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dir = if self.higher_is_better { "max" } else { "min" };
        write!(f, "{dir}:{}", self.term)
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
    fn kind(&self) -> PolicyKind {
        PolicyKind::Learned
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
                reason: Reason::Learned {
                    source: LearnedSource::History,
                    sequence: state.sequence,
                    rf: Some(rf),
                    passes: Some(state.passes),
                    schedule_len: len as u64,
                    fallback: None,
                    bounds: Bounds::default(),
                },
                score: fb.score,
            },
            None => PolicyDecision {
                verdict: fb.verdict,
                reason: Reason::Learned {
                    source: LearnedSource::Fallback,
                    sequence: state.sequence,
                    rf: None,
                    passes: None,
                    schedule_len: len as u64,
                    fallback: Some(Box::new(fb.reason)),
                    bounds: Bounds::default(),
                },
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
    fn state(&self) -> PolicyState {
        PolicyState {
            sequence: self.sequence,
            fallback: Some(Box::new(self.fallback.state())),
            ..PolicyState::named(self.name())
        }
    }
    fn restore(&mut self, state: &PolicyState) -> Result<(), PolicyError> {
        state.check_name(self.name())?;
        // The schedule is the history's, replayed afresh at each start; only the place in it
        // and the fallback's statistics are the run's own.
        if let Some(fb) = &state.fallback {
            self.fallback.restore(fb)?;
        }
        self.sequence = state.sequence;
        Ok(())
    }
}
