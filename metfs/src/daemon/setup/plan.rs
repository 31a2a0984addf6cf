//! What the plan of a mount is made from: the budget's split, each sample's footprint, the
//! mini-epochs per epoch, and the fingerprint a saved position must match.

use crate::config::Mode;
use crate::config::MountConfig;
use crate::daemon::fingerprint::{Fingerprint, PlanKind};
use crate::daemon::samples::{dealt_slot_bytes, Dealing, Detected, SampleSource, Samples};
use crate::daemon::{aggregate, DaemonError};
use metfs_plan::budget::Budget;
use metfs_plan::budget::{footprints, Staged};
use metfs_plan::planner;
use metfs_plan::planner::{PlanConfig, PlanError, SampleSet};
use metfs_plan::size::format_bytes;
use metfs_prefetcher::hdf5::Containers;
use metfs_tier::catalog::Catalog;
use std::sync::Arc;

/// What the plan depends on: a saved position is resumed only under the same.
pub(super) fn fingerprint_for(
    cfg: &MountConfig,
    slot_bytes: u64,
    nm: u32,
    catalog: &Catalog,
) -> Fingerprint {
    let transform = cfg.transform.identity();
    Fingerprint {
        source: cfg.source.to_string(),
        slot_bytes,
        mini_epochs: nm,
        compose: cfg.compose_fingerprint(),
        seed: cfg.seed,
        node_rank: cfg.node_rank,
        nodes: cfg.nodes,
        catalog: format!("{:016x}", aggregate::catalog_digest(catalog)),
        transform: (!transform.is_empty()).then_some(transform),
        samples: cfg.samples.fingerprint(),
        plan: match &cfg.mode {
            Mode::Dds(_) => PlanKind::Dds,
            Mode::Aggregate(a) => PlanKind::Aggregate { extra: a.extra },
            Mode::Plain | Mode::Shared(_) => PlanKind::Static,
        },
    }
}

/// What the plan of a plain, queue or aggregate mount is made from.
pub(super) struct Planned {
    pub(super) budget: Budget,
    /// Per sample: the bytes it may take in a slot (a transform's output at its most).
    pub(super) footprints: Vec<u64>,
    /// The plan's settings; its `slot_bytes` are what may be dealt into a slot (less the
    /// files in every view), which also bounds a queue's claims.
    pub(super) plan_cfg: PlanConfig,
    /// Mini-epochs per epoch (1 in aggregate mode).
    pub(super) nm: u32,
    pub(super) aggregate: Option<Arc<aggregate::Aggregate>>,
    /// The samples when files are not each one (groups, always files, a format).
    pub(super) samples: Option<Arc<Samples>>,
}

/// The budget split, each sample's footprint and the number of mini-epochs; a sample larger
/// than a slot is an error naming it and the budget it would need.
pub(super) fn plan_dataset(
    cfg: &MountConfig,
    catalog: &Catalog,
    catalog_bytes: u64,
    containers: Option<&Arc<Containers>>,
    detected: Detected,
) -> Result<Planned, DaemonError> {
    // A container slot holds one HDF5 file per container: rows are packed, so they are not
    // rounded to blocks, and each file carries headers and chunk indexes (1 MiB allowed).
    let extra = containers.map_or(0, |c| 2 * c.files().len() as u64 * (1 << 20));
    let budget = Budget::new(
        cfg.budget,
        catalog,
        catalog_bytes,
        crate::logging::LOG_RESERVE.saturating_add(extra),
    )?;
    // A transformed sample is planned at what its output may take (the transform refuses a
    // larger one), so the budget holds whatever it writes.
    let staged = if containers.is_some() {
        Staged::Row
    } else {
        cfg.transform.staged()
    };
    let footprints = footprints(catalog.sizes(), staged);
    let samples =
        Samples::new(&SampleSource::of(cfg), catalog, &footprints, detected)?.map(Arc::new);
    let plan_cfg = PlanConfig {
        strategy: cfg.compose,
        seed: cfg.seed,
        slot_bytes: dealt_slot_bytes(samples.as_deref(), catalog, cfg.budget, budget.slot_bytes)?,
        mini_epochs: cfg.mini_epochs,
        node_rank: cfg.node_rank,
        nodes: cfg.nodes,
        cluster_copies: cfg.cluster_copies,
    };
    let set = match &samples {
        Some(s) => s.groups().sample_set(),
        None => SampleSet {
            sizes: &footprints,
            labels: catalog.labels(),
            clusters: catalog.clusters(),
        },
    };
    let nm = match planner::mini_epoch_count(&set, &plan_cfg) {
        Ok(n) => n,
        Err(PlanError::SampleTooLarge { sample, size, .. }) => {
            let path = match &samples {
                Some(s) if s.groups().members(sample).len() > 1 => format!(
                    "{} (a sample of {} files)",
                    catalog.path(s.groups().members(sample)[0]),
                    s.groups().members(sample).len()
                ),
                Some(s) => catalog.path(s.groups().members(sample)[0]),
                None => catalog.path(sample),
            };
            let always = samples.as_ref().map_or(0, |s| s.groups().always_bytes());
            return Err(DaemonError::BudgetTooSmall {
                budget: format_bytes(cfg.budget),
                path,
                size: format_bytes(size),
                needed: format_bytes(
                    size.saturating_add(always)
                        .saturating_mul(2)
                        .saturating_add(budget.reserve),
                ),
                reserve: format_bytes(budget.reserve),
            });
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(s) = &samples {
        s.check_splits(match cfg.mode {
            Mode::Shared(_) => Dealing::Drawn,
            Mode::Aggregate(_) => Dealing::Partitioned { nodes: cfg.nodes },
            _ => Dealing::Planned {
                mini_epochs: nm,
                stratified: cfg.compose == metfs_plan::planner::Strategy::Stratified,
            },
        })?;
    }
    // Aggregate-cache mode: one mini-epoch per epoch, from the `metfs-shuffle` planner.
    let aggregate = match cfg.mode.aggregate() {
        Some(a) => Some(Arc::new(aggregate::Aggregate::new(
            cfg,
            a,
            footprints.clone(),
            samples.as_ref().map(|s| s.groups().clone()),
            budget.slot_bytes,
        )?)),
        None => None,
    };
    let nm = if aggregate.is_some() { 1 } else { nm };
    Ok(Planned {
        budget,
        footprints,
        plan_cfg,
        nm,
        aggregate,
        samples,
    })
}
