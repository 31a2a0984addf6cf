//! Setting up a mount, in phases ([`Daemon::prepare`]):
//!
//! 1. **Cache** (`cache`): checked, made private and locked; stale temporaries removed.
//! 2. **Tier**: opened from `cfg.source`, or handed in (`Daemon::prepare_with_tier`).
//! 3. **Catalog**: loaded (or reused), labelled where a composition or a shared mount's
//!    subsets need labels, and saved.
//! 4. **Plan** (`plan`): the budget's split, each sample's footprint, the mini-epochs per
//!    epoch; the [`Fingerprint`] of all that, and the saved position if it matches.
//! 5. **Stager**: paced, transforming, its temporaries cleaned.
//! 6. By mode: a plain, queue or aggregate mount resumes or starts its one session and stages
//!    its first mini-epoch through [`Store::stage`] before the mount goes live (`first`); a
//!    shared mount resumes the jobs of its save file (`shared`).
//! 7. **Assembly** ([`Daemon::assemble`]): the parts become a daemon.
//!
//! **Invariant:** nothing is staged or deleted in the cache before its lock is held, and a
//! fresh plan's position is saved before its first mini-epoch is staged (a daemon killed while
//! staging it resumes the slot instead of discarding it).

use crate::config::{MountConfig, PrefetchRate, ReadPath};
use crate::daemon::mode::ModeState;
use crate::daemon::pacing::Pacing;
use crate::daemon::samples;
use crate::daemon::session::Sessions;
use crate::daemon::source::{load_catalog, needs_labels, open_tier};
use crate::daemon::store::Store;
use crate::daemon::{CachePaths, Daemon, DaemonError, Lifecycle, Surface};
use metfs_fs::fs::{FsCore, FsSettings};
use metfs_fs::lock_order::{Level, OrderedMutex};
use metfs_plan::budget::Budget;
use metfs_plan::size::format_bytes;
use metfs_prefetcher::hdf5::Containers;
use metfs_prefetcher::stager::Stager;
use metfs_prefetcher::transform::Transformer;
use metfs_tier::catalog::Catalog;
use metfs_tier::pacer::Pacer;
use metfs_tier::CapacityTier;
use std::sync::Arc;

mod cache;
mod first;
mod history;
mod plan;
mod shared;

pub(super) use cache::write_saved_state;
pub use cache::{check_cache_dir, check_places};
use cache::{open_cache, saved_position};
use first::First;
pub(super) use history::{
    build_policy, learned_replay, open_history, open_history_store, start_recording,
};
use plan::{fingerprint_for, plan_dataset};

/// How the mount fetches again a copy of a sealed slot that its first open found damaged: the
/// stager's repair, run to completion on the daemon's runtime from the FUSE thread that asked
/// (a runtime thread, in tests that call the core directly, gives its place up meanwhile).
pub(super) fn copy_repair(stager: &Stager) -> metfs_fs::fs::CopyRepair {
    let stager = stager.clone();
    let rt = tokio::runtime::Handle::current();
    Arc::new(move |slot: &str, sample: u32| {
        let fut = stager.repair(slot, sample);
        let done = match tokio::runtime::Handle::try_current() {
            Ok(_) => tokio::task::block_in_place(|| rt.block_on(fut)),
            Err(_) => rt.block_on(fut),
        };
        done.map_err(|e| e.to_string())
    })
}

impl Daemon {
    /// Prepares a mount: locks the cache, catalogues, plans, and stages the current mini-epoch.
    /// Returns the daemon and the lock file (hold it for the daemon's life).
    pub async fn prepare(
        cfg: MountConfig,
        show_progress: bool,
    ) -> Result<(Arc<Daemon>, std::fs::File), DaemonError> {
        Self::prepare_on(cfg, show_progress, None).await
    }

    /// As [`Daemon::prepare`], on `tier` instead of the tier `cfg.source` names: the seam where
    /// tests hand the daemon an in-memory or fault-injecting tier (`metfs_tier::testing`)
    /// and drive its fault handling without a file system or server to break. `cfg.source`
    /// still goes into the plan's fingerprint and the messages; give it the tier's URL.
    pub async fn prepare_with_tier(
        cfg: MountConfig,
        show_progress: bool,
        tier: Arc<dyn CapacityTier>,
    ) -> Result<(Arc<Daemon>, std::fs::File), DaemonError> {
        Self::prepare_on(cfg, show_progress, Some(tier)).await
    }

    /// [`Daemon::prepare`]'s phases (module docs), on `tier` or (`None`) the tier `cfg.source`
    /// names, opened after the cache as a mount always has (so a mount with both wrong reports
    /// the cache).
    async fn prepare_on(
        cfg: MountConfig,
        show_progress: bool,
        tier: Option<Arc<dyn CapacityTier>>,
    ) -> Result<(Arc<Daemon>, std::fs::File), DaemonError> {
        crate::daemon::memory::keep_large_blocks_apart();
        let (paths, lock) = open_cache(&cfg)?;
        let tier = match tier {
            Some(tier) => tier,
            None => open_tier(&cfg.source, &cfg.s3, cfg.stager.timeout_secs)?,
        };
        let (catalog, catalog_bytes, containers) = prepare_catalog(&*tier, &paths, &cfg).await?;
        // The listing's or manifest's transients are freed: give their pages back before the
        // first staging makes its own.
        let _ = tokio::task::spawn_blocking(crate::daemon::memory::release_freed_heap).await;
        let catalog = samples::select(&samples::SampleSource::of(&cfg), catalog)?;
        let deals_files = cfg
            .transform
            .command
            .is_some()
            .then(|| "a transform".to_string());
        let detected = match (&containers, deals_files) {
            (Some(_), _) => samples::Detected::default(),
            (None, Some(what)) => {
                samples::refuse_format_not_dealt(&cfg.samples, &catalog, &what)?;
                samples::Detected::default()
            }
            (None, None) => {
                samples::detect(&cfg.samples, &catalog, Some(&*tier), &paths.tmp).await?
            }
        };
        let planned = plan_dataset(&cfg, &catalog, catalog_bytes, containers.as_ref(), detected)?;
        if planned.samples.is_some() {
            // Grouping named every file once: give those pages back too.
            let _ = tokio::task::spawn_blocking(crate::daemon::memory::release_freed_heap).await;
        }
        let catalog = Arc::new(catalog);
        let stager = new_stager(&cfg, tier.clone(), catalog.clone(), &paths)?;
        let tier_url = tier.url().to_string();
        let daemon = if let Some(share) = cfg.mode.shared().cloned() {
            Self::prepare_shared(cfg, share, paths, tier_url, catalog, planned, stager).await?
        } else {
            let fingerprint =
                fingerprint_for(&cfg, planned.budget.slot_bytes, planned.nm, &catalog);
            let saved = saved_position(&cfg, &paths, &fingerprint, planned.nm)?;
            let store = Store::new(
                paths.clone(),
                catalog,
                planned.footprints.clone(),
                containers,
                planned.budget,
                stager,
            )
            .with_samples(planned.samples.clone());
            let first = First {
                cfg,
                paths,
                tier_url,
                store,
                planned,
                fingerprint,
                saved,
            };
            Self::prepare_session(first, show_progress).await?
        };
        Ok((daemon, lock))
    }
}

/// The catalog phase: loaded from the tier (or the cache's copy reused), labelled by first
/// directory where a composition or a shared mount's subsets need labels, and saved. Returns
/// it, the bytes its saved copy takes, and the containers of container mode.
async fn prepare_catalog(
    tier: &dyn CapacityTier,
    paths: &CachePaths,
    cfg: &MountConfig,
) -> Result<(Catalog, u64, Option<Arc<Containers>>), DaemonError> {
    let (mut catalog, reused, containers) = load_catalog(tier, &paths.catalog, cfg).await?;
    if catalog.is_empty() {
        return Err(DaemonError::Empty(cfg.source.clone()));
    }
    if (needs_labels(cfg.compose) || cfg.mode.shared().is_some()) && catalog.labels().is_none() {
        // A shared mount's jobs may ask for a subset by label.
        catalog.label_by_first_dir();
    }
    let catalog_bytes = if reused {
        std::fs::metadata(&paths.catalog)
            .map(|m| m.len())
            .unwrap_or(0)
    } else {
        // The old catalog goes first: with its replacement written beside it, the two would
        // take more than the one the budget reserves.
        let _ = std::fs::remove_file(&paths.catalog);
        catalog.save(&paths.catalog)?
    };
    Ok((catalog, catalog_bytes, containers))
}

/// The stager phase: the stager of the mount, paced at a fixed rate if one is set, with the
/// mount's transform, its temporaries of an earlier run removed.
fn new_stager(
    cfg: &MountConfig,
    tier: Arc<dyn CapacityTier>,
    catalog: Arc<Catalog>,
    paths: &CachePaths,
) -> Result<Stager, DaemonError> {
    let pacer = Pacer::with_rate(match cfg.prefetch_rate {
        PrefetchRate::Fixed(r) => Some(r),
        // The first mini-epoch is staged at full speed (the job is waiting for it); pacing
        // starts after it (`first`).
        PrefetchRate::Auto | PrefetchRate::Unlimited => None,
    });
    let stager = Stager::new(
        tier,
        catalog,
        paths.slots.clone(),
        paths.tmp.clone(),
        cfg.stager.clone(),
        pacer,
    )
    .with_transform(Transformer::new(&cfg.transform)?);
    stager.clean_tmp()?;
    Ok(stager)
}

/// The read path `cfg.read_path` resolves to for this dataset and budget (`auto`: said in the
/// log when `log_auto`).
fn resolve_read_path(
    cfg: &MountConfig,
    catalog: &Catalog,
    budget: &Budget,
    log_auto: bool,
) -> ReadPath {
    let mean_sample = catalog.total_bytes() / (catalog.len() as u64).max(1);
    let read_path =
        cfg.read_path
            .resolve(budget.slot_bytes, mean_sample, crate::config::mem_total());
    if log_auto && cfg.read_path == ReadPath::Auto {
        tracing::info!(
            read_path = read_path.name(),
            slot_bytes = %format_bytes(budget.slot_bytes),
            mean_sample = %format_bytes(mean_sample),
            "read path chosen: cached for samples under 1 MiB when a slot fits in half of the node's memory, else passthrough (pread without CAP_SYS_ADMIN)"
        );
    }
    read_path
}

/// The filesystem settings of a mount on `read_path`.
fn fs_settings(cfg: &MountConfig, read_path: ReadPath) -> FsSettings {
    FsSettings {
        max_open_files: cfg.max_open_files,
        max_backing_ids: cfg.max_backing_ids,
        track_kernel_refs: read_path == ReadPath::Cached,
    }
}

/// What a daemon is made of, for [`Daemon::assemble`].
struct Parts {
    cfg: MountConfig,
    paths: CachePaths,
    store: Store,
    sessions: Sessions,
    fs: Arc<FsCore>,
    read_path: ReadPath,
    tier_url: String,
    mode: ModeState,
}

impl Daemon {
    fn assemble(p: Parts) -> Arc<Daemon> {
        let daemon = Arc::new(Daemon {
            tier_url: p.tier_url,
            me: OrderedMutex::new(Level::Me, std::sync::Weak::new()),
            persisting: OrderedMutex::new(Level::Persisting, ()),
            mode: p.mode,
            paths: p.paths,
            store: p.store,
            sessions: OrderedMutex::new(Level::Sessions, p.sessions),
            surface: Arc::new(Surface::new(p.fs, p.read_path)),
            life: Lifecycle::default(),
            pacing: Pacing::new(p.cfg.prefetch_rate, p.cfg.prefetch_rate_max),
            events: crate::events::EventLog::open(&p.cfg.run_dir),
            apply_one: tokio::sync::Mutex::new(()),
            cfg: p.cfg,
        });
        *daemon.me.lock().unwrap() = Arc::downgrade(&daemon);
        daemon
    }
}
