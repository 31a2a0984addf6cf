//! The `[share]` settings: several jobs on one mount, one staged store (`metfs mount --share`).
//! The daemon's side is `crate::daemon`'s `share` module.

use serde::{Deserialize, Serialize};

/// What a job that runs ahead of the store does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum SharePace {
    /// It gets MET's `wait` (a bonus pass on its current view) rather than drop from the store
    /// what a slower job has drawn and not staged yet: the tier is read once.
    #[default]
    Wait,
    /// It moves on; the slower job fetches again what was dropped (the paper's alternative).
    Evict,
}

impl std::fmt::Display for SharePace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SharePace::Wait => "wait",
            SharePace::Evict => "evict",
        })
    }
}

/// Which samples of the retired slots kept on the node a staging deletes first when it needs
/// room (one by one; whole slots only when those still read must go too).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ShareEvict {
    /// RefCnt (paper 004): the samples the jobs still need least this epoch, then the oldest
    /// slot's.
    #[default]
    Refcnt,
    /// The oldest slot's samples, whatever the jobs still need: the baseline.
    Lru,
}

impl std::fmt::Display for ShareEvict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ShareEvict::Refcnt => "refcnt",
            ShareEvict::Lru => "lru",
        })
    }
}

/// Several jobs on one mount (`[share]` in the config file, `--share` and `--share-*` flags).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(default, deny_unknown_fields)]
pub struct ShareConfig {
    /// Serve several jobs from one staged store: each job joins with `hello` and its name and
    /// reads its own view at MNT/<job>; off: one job, its view at the mount's root.
    #[arg(id = "share.enabled", long = "share", action = clap::ArgAction::Set, num_args = 0..=1,
        require_equals = true, default_missing_value = "true", default_value_t = false)]
    pub enabled: bool,
    /// Jobs the budget is shared between, 1 to 256: each job joining gets 1/jobs of what the
    /// budget leaves after metadata, for its current and next views (so its views are at most
    /// half of that); a job that would pass the count is refused. 4 is one trial per GPU of a
    /// common node.
    #[arg(id = "share.jobs", long = "share-jobs",
        default_value_t = ShareConfig::default().jobs)]
    pub jobs: u32,
    /// What a job that runs ahead of the store does: `wait` (a bonus pass rather than
    /// dropping what a slower job still needs) or `evict`.
    #[arg(id = "share.pace", long = "share-pace", value_enum,
        default_value_t = ShareConfig::default().pace)]
    pub pace: SharePace,
    /// Which retired slot kept on the node goes first when a staging needs room: `refcnt`
    /// (the one the jobs still need least this epoch) or `lru` (the oldest), the baseline.
    #[arg(id = "share.evict", long = "share-evict", value_enum,
        default_value_t = ShareConfig::default().evict)]
    pub evict: ShareEvict,
    /// Seconds without a request after which a job is dropped and its share released (a
    /// killed trainer pins nothing for longer). Above the longest pass of any job: 900 s.
    #[arg(id = "share.idle_secs", long = "share-idle-secs",
        default_value_t = ShareConfig::default().idle_secs)]
    pub idle_secs: u64,
    /// Most of a job's share its readers may hold in retired views (a frozen reader keeping
    /// old files open), as a fraction, above 0 and at most 1. Past it the job's oldest held
    /// views are taken back (their reads answer EIO, their slots go) within a second, the
    /// newest kept, and the job is reported. 0.5 lets a reader hold one retired view whole (a
    /// view is half a share) while the job reads the next.
    #[arg(id = "share.held_open_cap", long = "share-held-open-cap",
        default_value_t = ShareConfig::default().held_open_cap)]
    pub held_open_cap: f64,
}

impl Default for ShareConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            jobs: 4,
            pace: SharePace::Wait,
            evict: ShareEvict::Refcnt,
            idle_secs: 900,
            held_open_cap: 0.5,
        }
    }
}
