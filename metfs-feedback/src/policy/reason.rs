//! Why a policy decided as it did ([`PolicyDecision::reason`](super::PolicyDecision)): one
//! shape per policy, told apart by `policy`. The `pass_end` reply carries it and the rf history
//! records it (as JSON). A field that only some of a policy's decisions have is left out of
//! the others, never `null`; a field that may be unknown is `null`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{BandSide, CurrentPoint, PolicyKind, Scope, Spread};

/// Why a policy decided as it did, by its `policy`. Any of them may carry [`Bounds`]: the
/// `rf_min` or `rf_max` that overrode the policy's verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "policy", rename_all = "snake_case")]
pub enum Reason {
    /// Exactly `rf` passes per mini-epoch.
    Fixed {
        /// The rf.
        rf: u32,
        /// Passes over the mini-epoch so far.
        passes: u32,
        #[serde(flatten)]
        bounds: Bounds,
    },
    /// Advances once the score has not improved on `best` for `wait_th` passes.
    Score {
        /// The best score so far (lower is better), over `best_scope`.
        best: f64,
        /// This pass's score.
        current: f64,
        /// This pass improved on the best.
        improved: bool,
        /// Passes in a row without an improvement.
        wait: u32,
        /// Passes without an improvement that end a mini-epoch.
        wait_th: u32,
        /// Whether `best` is kept for the run or per mini-epoch.
        best_scope: Scope,
        /// Passes over the mini-epoch so far.
        passes: u32,
        #[serde(flatten)]
        bounds: Bounds,
    },
    /// Advances when the score leaves the Bollinger band of the last `window` scores on
    /// `side`. While the window fills, `filling` is true and `have` counts its scores;
    /// afterwards the band (`ma`, `std`, `lower`, `upper`) and how it is drawn (`side`,
    /// `spread`, `current_point`) are given instead.
    Bollinger {
        /// The window is not full yet: the policy repeats.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        filling: bool,
        /// Scores in the window while it fills.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(with = "u64")]
        have: Option<u64>,
        /// The band's centre: the window's moving average.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(with = "f64")]
        ma: Option<f64>,
        /// The window's standard deviation.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(with = "f64")]
        std: Option<f64>,
        /// The band's lower bound, `ma - k * std`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(with = "f64")]
        lower: Option<f64>,
        /// The band's upper bound, `ma + k * std`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(with = "f64")]
        upper: Option<f64>,
        /// This pass's score.
        current: f64,
        /// Scores in a full window.
        window: u64,
        /// The band's width in standard deviations.
        k: f64,
        /// Whether the window is kept for the run or per mini-epoch.
        window_scope: Scope,
        /// Which exit from the band advances.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(with = "BandSide")]
        side: Option<BandSide>,
        /// Which standard deviation the width is taken from.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(with = "Spread")]
        spread: Option<Spread>,
        /// Whether the band is computed with the score it judges.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(with = "CurrentPoint")]
        current_point: Option<CurrentPoint>,
        /// Passes over the mini-epoch so far.
        passes: u32,
        #[serde(flatten)]
        bounds: Bounds,
    },
    /// Replays a recorded rf schedule (`source` `history`: advance after `rf` passes), then
    /// decides as its fallback policy (`source` `fallback`, its reason in `fallback`).
    Learned {
        /// Where this decision came from.
        source: LearnedSource,
        /// The mini-epoch's number in the run (its index in the schedule).
        sequence: u64,
        /// From the history: the recorded rf.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(with = "u32")]
        rf: Option<u32>,
        /// From the history: passes over the mini-epoch so far.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(with = "u32")]
        passes: Option<u32>,
        /// Mini-epochs the schedule covers.
        schedule_len: u64,
        /// From the fallback: its reason.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schemars(with = "Reason")]
        fallback: Option<Box<Reason>>,
        #[serde(flatten)]
        bounds: Bounds,
    },
    /// Staging-aware, progress-capped, held-out-driven rf: `why` names the rule that decided.
    Paced {
        /// The rule that decided.
        why: PacedWhy,
        /// The cap on rf at this point of the run.
        cap: u32,
        /// The run's progress the job sent, in [0, 1]; `null` when it sent none.
        progress: Option<f64>,
        /// Whether the next mini-epoch was staged; `null` when not known.
        next_ready: Option<bool>,
        /// ceil(EB1 / B2), once both are measured.
        stall_free_rf: Option<u32>,
        /// With `why` `held_out`: the held-out rule's account; `null` otherwise.
        held_out: Option<HeldOut>,
        /// Passes over the mini-epoch so far.
        passes: u32,
        #[serde(flatten)]
        bounds: Bounds,
    },
}

/// The bounds on rf that overrode a policy's verdict (`rf_min`, `rf_max`): all three present
/// when one did, none otherwise.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Bounds {
    /// Which bound overrode the verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Bound")]
    pub bound: Option<Bound>,
    /// The lower bound on passes per mini-epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "u32")]
    pub rf_min: Option<u32>,
    /// The upper bound on passes per mini-epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "u32")]
    pub rf_max: Option<u32>,
}

/// Which bound on rf overrode a policy's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    /// Fewer passes than `rf_min`: an advance became a repeat.
    RfMin,
    /// `rf_max` passes: a repeat became an advance.
    RfMax,
}

/// Where a `learned` decision came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LearnedSource {
    /// The recorded schedule.
    History,
    /// The fallback policy, past the schedule's end.
    Fallback,
}

/// The rule that decided a `paced` verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PacedWhy {
    /// The next mini-epoch is not staged: repeat.
    Staging,
    /// Fewer passes than the stall-free rf: repeat.
    StallFree,
    /// The cap is reached: advance.
    Cap,
    /// The held-out signals decided (see `held_out`).
    HeldOut,
}

/// The held-out rule of `paced`, by the signal it used (`rule`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "rule", rename_all = "snake_case")]
pub enum HeldOut {
    /// The validation loss: repeat while a repeat is expected to gain at least `need`.
    ValLoss {
        /// The gain a repeat is expected to bring; `null` before one is measured.
        gain: Option<f64>,
        /// The gain a repeat must bring; `null` before a fresh pass's gain is measured.
        need: Option<f64>,
        /// The smoothed gain of a mini-epoch's first pass.
        fresh_gain: Option<f64>,
    },
    /// The fresh-data loss: repeat up to the target rf it steers.
    FreshLoss {
        /// The target rf.
        target: u32,
        /// The smoothed held-out gain per pass between fresh-data losses.
        fresh_per_pass: Option<f64>,
    },
    /// No held-out signal yet: repeat up to the cap.
    Schedule,
}

impl Reason {
    /// The policy that gave this reason.
    pub fn policy(&self) -> PolicyKind {
        match self {
            Reason::Fixed { .. } => PolicyKind::Fixed,
            Reason::Score { .. } => PolicyKind::Score,
            Reason::Bollinger { .. } => PolicyKind::Bollinger,
            Reason::Learned { .. } => PolicyKind::Learned,
            Reason::Paced { .. } => PolicyKind::Paced,
        }
    }

    /// The bounds that overrode the verdict, if any did.
    pub fn bounds(&self) -> &Bounds {
        match self {
            Reason::Fixed { bounds, .. }
            | Reason::Score { bounds, .. }
            | Reason::Bollinger { bounds, .. }
            | Reason::Learned { bounds, .. }
            | Reason::Paced { bounds, .. } => bounds,
        }
    }

    /// The bounds, to set when one overrides the verdict.
    pub fn bounds_mut(&mut self) -> &mut Bounds {
        match self {
            Reason::Fixed { bounds, .. }
            | Reason::Score { bounds, .. }
            | Reason::Bollinger { bounds, .. }
            | Reason::Learned { bounds, .. }
            | Reason::Paced { bounds, .. } => bounds,
        }
    }

    /// As JSON, as the reply and the rf history write it (a number that is not finite is
    /// `null`).
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// The reason as its JSON text.
impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.to_json())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every shape reads back as written, and the JSON keeps the keys the untyped reasons had:
    /// a shape's own fields only, the bounds only when one overrode the verdict.
    #[test]
    fn reasons_round_trip_with_only_their_own_fields() {
        let bounded = Bounds {
            bound: Some(Bound::RfMax),
            rf_min: Some(1),
            rf_max: Some(3),
        };
        let fixed = Reason::Fixed {
            rf: 2,
            passes: 1,
            bounds: Bounds::default(),
        };
        let all = [
            fixed.clone(),
            Reason::Learned {
                source: LearnedSource::Fallback,
                sequence: 4,
                rf: None,
                passes: None,
                schedule_len: 3,
                fallback: Some(Box::new(fixed.clone())),
                bounds: bounded,
            },
            Reason::Bollinger {
                filling: true,
                have: Some(2),
                ma: None,
                std: None,
                lower: None,
                upper: None,
                current: 0.5,
                window: 5,
                k: 2.0,
                window_scope: Scope::Run,
                side: None,
                spread: None,
                current_point: None,
                passes: 2,
                bounds: Bounds::default(),
            },
            Reason::Paced {
                why: PacedWhy::HeldOut,
                cap: 4,
                progress: None,
                next_ready: Some(true),
                stall_free_rf: None,
                held_out: Some(HeldOut::FreshLoss {
                    target: 2,
                    fresh_per_pass: None,
                }),
                passes: 1,
                bounds: Bounds::default(),
            },
        ];
        for r in &all {
            let back: Reason = serde_json::from_value(r.to_json()).unwrap();
            assert_eq!(&back, r);
        }
        assert_eq!(
            all[1].to_json(),
            json!({"policy": "learned", "source": "fallback", "sequence": 4, "schedule_len": 3,
                   "fallback": {"policy": "fixed", "rf": 2, "passes": 1},
                   "bound": "rf_max", "rf_min": 1, "rf_max": 3})
        );
        assert_eq!(
            all[2].to_json(),
            json!({"policy": "bollinger", "filling": true, "have": 2, "current": 0.5,
                   "window": 5, "k": 2.0, "window_scope": "run", "passes": 2})
        );
        assert_eq!(
            all[3].to_json(),
            json!({"policy": "paced", "why": "held_out", "cap": 4, "progress": null,
                   "next_ready": true, "stall_free_rf": null, "passes": 1,
                   "held_out": {"rule": "fresh_loss", "target": 2, "fresh_per_pass": null}})
        );
        assert_eq!(all[1].policy(), PolicyKind::Learned);
        assert_eq!(all[1].bounds().bound, Some(Bound::RfMax));
    }
}
