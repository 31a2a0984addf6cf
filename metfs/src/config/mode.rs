//! The mount's mode: plain, dynamic sharding (`--dds`), aggregate cache (`--aggregate`) or a
//! shared store (`--share`), each with its own settings.
//!
//! The settings layer keeps one table per mode (`[dds]`, `[aggregate]`, `[share]`), so a file
//! may turn two on; [`Mode::resolve`] picks the one asked for and refuses two, naming the
//! setting that turned the second on. The resolved [`super::MountConfig`] holds one [`Mode`],
//! so a mount with two modes cannot be expressed past this point, and the daemon asks the mode
//! what to do rather than testing each table's switch.
//!
//! **Invariant:** a [`Mode`] carries only settings that were checked: a `Dds` mode's queue
//! address parses, and no mode is combined with a setting it cannot serve (HDF5 container
//! rows, a transform in aggregate mode).

use super::aggregate::AggregateConfig;
use super::check::Check;
use super::share::ShareConfig;
use super::{ConfigError, MountSettings};
use metfs_dds::{DdsConfig, DdsUrl};
use metfs_plan::planner::MAX_JOBS;

/// What a mount serves and where its mini-epochs come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    /// One job; each node plans its own share of every epoch.
    Plain,
    /// One job; mini-epochs are batches of shards claimed from a queue in etcd.
    Dds(Box<DdsMode>),
    /// One job; the nodes hold the dataset together and exchange each epoch's shares.
    Aggregate(AggregateConfig),
    /// Several jobs on one staged store, each joining with `hello`.
    Shared(ShareConfig),
}

/// Dynamic sharding's settings with the queue's parsed address.
#[derive(Debug, Clone, PartialEq)]
pub struct DdsMode {
    /// The queue's address (`dds.url`, parsed).
    pub url: DdsUrl,
    /// The rest of `[dds]`.
    pub settings: DdsConfig,
}

impl Mode {
    /// Whether a staging the tier keeps failing may leave the failing samples out and carry
    /// them to a later mini-epoch (defer, `stager.defer_after_secs`): a plain mount's, a
    /// dynamic-sharding node's (its samples are its claim's, carried into its next claim) and
    /// an aggregate node's (its share's, carried into its next epoch; a peer that asks the
    /// exchange for one is sent it as missing and takes it from the tier). A shared store's
    /// mini-epochs are drawn for several jobs at once, which expect every sample.
    pub fn defers(&self) -> bool {
        !matches!(self, Mode::Shared(_))
    }

    /// The mode's name, as its flag says it (for logs and messages).
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Dds(_) => "dds",
            Mode::Aggregate(_) => "aggregate",
            Mode::Shared(_) => "share",
        }
    }

    /// Dynamic sharding's settings, in that mode.
    pub fn dds(&self) -> Option<&DdsMode> {
        match self {
            Mode::Dds(d) => Some(d.as_ref()),
            _ => None,
        }
    }

    /// Aggregate mode's settings, in that mode.
    pub fn aggregate(&self) -> Option<&AggregateConfig> {
        match self {
            Mode::Aggregate(a) => Some(a),
            _ => None,
        }
    }

    /// A shared mount's settings, in that mode.
    pub fn shared(&self) -> Option<&ShareConfig> {
        match self {
            Mode::Shared(s) => Some(s),
            _ => None,
        }
    }

    /// The mode the settings ask for. Every mode's table is checked whether or not it is
    /// turned on (a bad value is an error even where it would not be used, as before modes
    /// were one setting), then two modes, or a mode with what it cannot serve, are refused.
    pub(super) fn resolve(s: &MountSettings, check: &Check) -> Result<Mode, ConfigError> {
        let url = check_dds(s, check)?;
        check_share(s, check)?;
        check_aggregate(s, check)?;
        refuse_combinations(s, check)?;
        Ok(if let Some(url) = url {
            Mode::Dds(Box::new(DdsMode {
                url,
                settings: s.dds.clone(),
            }))
        } else if s.share.enabled {
            Mode::Shared(s.share.clone())
        } else if s.aggregate.enabled {
            Mode::Aggregate(s.aggregate.clone())
        } else {
            Mode::Plain
        })
    }
}

/// `[dds]`: the queue's address parses (returned, if given), and a slot takes a shard.
fn check_dds(s: &MountSettings, check: &Check) -> Result<Option<DdsUrl>, ConfigError> {
    let url = s
        .dds
        .queue_url()
        .map_err(|e| check.invalid("dds.url", e.to_string()))?;
    if url.is_some() && s.hdf5_container {
        return Err(check.invalid(
            "dds.url",
            "dynamic sharding takes samples, not HDF5 container rows",
        ));
    }
    if s.dds.shards_per_slot == 0 {
        return Err(check.invalid("dds.shards_per_slot", "must be at least 1"));
    }
    Ok(url)
}

/// `[share]`: the job count one dependent sampler holds, a positive idle time.
fn check_share(s: &MountSettings, check: &Check) -> Result<(), ConfigError> {
    if s.share.jobs == 0 || s.share.jobs as usize > MAX_JOBS {
        return Err(check.invalid(
            "share.jobs",
            format!(
                "{} must be between 1 and {MAX_JOBS} (the jobs one dependent sampler holds)",
                s.share.jobs
            ),
        ));
    }
    if s.share.idle_secs == 0 {
        return Err(check.invalid("share.idle_secs", "must be at least 1"));
    }
    let cap = s.share.held_open_cap;
    if !(cap > 0.0 && cap <= 1.0) {
        return Err(check.invalid(
            "share.held_open_cap",
            format!("{cap} must be above 0 and at most 1: a fraction of a job's share (more than the share would let one frozen reader hold what the other jobs need)"),
        ));
    }
    Ok(())
}

/// `[aggregate]`: `extra` is a probability, the exchange's timeout positive.
fn check_aggregate(s: &MountSettings, check: &Check) -> Result<(), ConfigError> {
    let a = &s.aggregate;
    if !(0.0..=1.0).contains(&a.extra) {
        return Err(check.invalid(
            "aggregate.extra",
            format!("{} is not a probability (0 to 1)", a.extra),
        ));
    }
    if a.timeout_secs == 0 {
        return Err(check.invalid("aggregate.timeout_secs", "must be at least 1"));
    }
    Ok(())
}

/// Refuses two modes, or a mode with what it cannot serve: the first conflict found, named by
/// the setting that turned the later mode on (`share.enabled`, then `aggregate.enabled`).
fn refuse_combinations(s: &MountSettings, check: &Check) -> Result<(), ConfigError> {
    let dds = s.dds.url.is_some();
    if s.share.enabled {
        let other = if s.hdf5_container {
            Some("HDF5 container mode")
        } else if dds {
            Some("dynamic sharding (dds.url)")
        } else {
            None
        };
        if let Some(other) = other {
            return Err(check.invalid(
                "share.enabled",
                format!("a shared mount cannot be combined with {other}"),
            ));
        }
    }
    if s.aggregate.enabled {
        let other = if s.share.enabled {
            Some("a shared mount (share.enabled)")
        } else if dds {
            Some("dynamic sharding (dds.url)")
        } else if s.hdf5_container {
            Some("HDF5 container mode")
        } else if s.transform.command.is_some() {
            Some("a transform (transform.command): peers exchange the source's bytes")
        } else {
            None
        };
        if let Some(other) = other {
            return Err(check.invalid(
                "aggregate.enabled",
                format!("aggregate-cache mode cannot be combined with {other}"),
            ));
        }
    }
    Ok(())
}
