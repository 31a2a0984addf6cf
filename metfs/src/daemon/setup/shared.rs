//! The setup of a shared mount (`--share`, the daemon's `share` module): the jobs of the save
//! file (`share.json`, if it is of these settings) are resumed, each from its kept slots, and
//! wait for their `hello`; every other slot of an earlier run is removed.

use crate::config::share::ShareConfig;
use crate::config::{MountConfig, PrefetchRate};
use crate::daemon::mode::ModeState;
use crate::daemon::samples::Samples;
use crate::daemon::setup::plan::Planned;
use crate::daemon::setup::{
    copy_repair, fs_settings, open_history_store, resolve_read_path, Parts,
};
use crate::daemon::share::state::{SavedShare, ShareSettings, SHARE_STATE_VERSION};
use crate::daemon::share::{CohortIds, Shared};
use crate::daemon::store::Store;
use crate::daemon::{aggregate, share, CachePaths, Daemon, DaemonError};
use metfs_fs::fs::FsCore;
use metfs_fs::lock_order::{Level, OrderedMutex};
use metfs_fs::view::View;
use metfs_plan::budget::Budget;
use metfs_plan::size::format_bytes;
use metfs_prefetcher::stager::Stager;
use metfs_protocol::event::Event;
use metfs_protocol::{event, NotResumed};
use metfs_tier::catalog::Catalog;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Retired slots a shared mount keeps on the node per job share, at most. Jobs over one
/// dataset take their common samples in the same round, so their slots are links of the same
/// files: many slots of few bytes each, which only the budget should bound.
const MAX_HELD_PER_SHARE: usize = 16;

impl Daemon {
    /// The rest of [`Daemon::prepare`] for a shared mount (module docs).
    pub(super) async fn prepare_shared(
        cfg: MountConfig,
        share: ShareConfig,
        paths: CachePaths,
        tier_url: String,
        catalog: Arc<Catalog>,
        planned: Planned,
        stager: Stager,
    ) -> Result<Arc<Daemon>, DaemonError> {
        let Planned {
            budget,
            footprints,
            samples,
            ..
        } = planned;
        let settings = share_settings(&cfg, share.jobs, &catalog, &budget, samples.as_deref());
        let (saved, mut refused) = saved_share(&cfg, &paths, &settings)?;
        let ids = CohortIds::new(samples.clone());
        let dealt_bytes = check_share_fits(&cfg, share.jobs, &catalog, &footprints, &ids, &budget)?;
        let restarts = saved.as_ref().map_or(0, |s| s.restarts + 1);
        // After a restart the sampler draws from a stream of its own (`Cohort`'s doc).
        let seed = if restarts == 0 {
            cfg.seed
        } else {
            metfs_planrng::splitmix64(&mut (cfg.seed ^ restarts.rotate_left(32)))
        };
        let mut shared = Shared::new(share.clone(), &budget, &footprints, ids, seed);
        shared.settings = settings;
        shared.dealt_bytes = dealt_bytes;
        shared.restarts = restarts;
        shared.history =
            open_history_store(&cfg).map(|s| Arc::new(OrderedMutex::new(Level::History, s)));
        let read_path = resolve_read_path(&cfg, &catalog, &budget, false);
        if cfg.prefetch_rate == PrefetchRate::Auto {
            // Several jobs pace one stager: each staging runs at full speed (the stall-free
            // pacing of one job does not apply to a cohort).
            stager.pacer().set_rate(None);
        }
        let view_bytes = budget.slot_bytes / u64::from(share.jobs);
        // With samples, each job's view holds whole samples and the always files, and a
        // format's view its index rewritten into its slot (`Store::view_for`).
        let mut store = Store::new(paths.clone(), catalog, footprints, None, budget, stager)
            .with_samples(samples);
        keep_only_saved_slots(&store, &paths, saved.as_ref())?;
        // The budget bounds what kept slots hold (`Store::room_for`); the count only bounds
        // the book's work and the journals a staging reads.
        store.max_held = MAX_HELD_PER_SHARE * share.jobs as usize;
        store.room_on_demand = true;
        // The root stands for this empty view; jobs' views take generations from 2 on.
        let lobby = Arc::new(View::from_files(&[], 1, 0, 0, "", &paths.slots));
        let fs = Arc::new(FsCore::new_shared(lobby, fs_settings(&cfg, read_path)));
        fs.set_copy_repair(copy_repair(&store.stager));
        tracing::info!(
            jobs = share.jobs,
            view_bytes = %format_bytes(view_bytes),
            pace = %share.pace,
            "shared store ready: jobs join with `hello` and their name"
        );
        let daemon = Self::assemble(Parts {
            tier_url,
            mode: ModeState::Shared(Box::new(shared)),
            paths,
            store,
            sessions: BTreeMap::new(),
            fs,
            read_path,
            cfg,
        });
        daemon.events.emit(Event::Start(event::Start {
            dataset_bytes: daemon.store.catalog.total_bytes(),
            dataset_files: daemon.store.catalog.len() as u64,
            mini_epochs: 0,
            view_bytes: 0,
            rf_policy: daemon.cfg.policy.kind,
            budget_bytes: daemon.store.budget.budget,
            node_rank: daemon.cfg.node_rank,
            nodes: daemon.cfg.nodes,
            epoch: 0,
            mini_epoch: 0,
        }));
        let sh = daemon.mode.shared().expect("a shared mount has its jobs");
        if let Some(saved) = saved {
            refused.extend(sh.resume_jobs(&daemon, saved).await);
        }
        sh.note_not_resumed(&daemon, refused);
        Ok(daemon)
    }
}

/// The settings a save file is kept under: a change of any of them starts every job over.
fn share_settings(
    cfg: &MountConfig,
    jobs: u32,
    catalog: &Catalog,
    budget: &Budget,
    samples: Option<&Samples>,
) -> ShareSettings {
    let transform = cfg.transform.identity();
    // A format detected at the defaults changes the samples as much as a setting does.
    let samples = match (cfg.samples.fingerprint(), samples.and_then(Samples::format)) {
        (set, Some(format)) => Some(format!(
            "{};detected={}",
            set.unwrap_or_default(),
            format.name()
        )),
        (set, None) => set,
    };
    ShareSettings {
        source: cfg.source.to_string(),
        catalog: format!("{:016x}", aggregate::catalog_digest(catalog)),
        slot_bytes: budget.slot_bytes,
        jobs,
        seed: cfg.seed,
        transform: (!transform.is_empty()).then_some(transform),
        samples,
    }
}

/// The save file's jobs to resume: none with `--reset`, without a save file, or under other
/// settings, whose jobs are returned with what changed (each is told when it joins again); an
/// unreadable one is an error naming it.
fn saved_share(
    cfg: &MountConfig,
    paths: &CachePaths,
    settings: &ShareSettings,
) -> Result<(Option<SavedShare>, Vec<NotResumed>), DaemonError> {
    Ok(
        match share::state::load_share_state(&paths.share, cfg.reset)? {
            Some(s) if s.version == SHARE_STATE_VERSION && s.settings == *settings => {
                (Some(s), Vec::new())
            }
            Some(s) => {
                let why = if s.version != SHARE_STATE_VERSION {
                    format!(
                        "its place was saved in layout version {} of share.json, this daemon reads {SHARE_STATE_VERSION}",
                        s.version
                    )
                } else {
                    format!(
                        "the mount's {} changed since its place was saved",
                        share::state::changed_settings(&s.settings, settings)
                    )
                };
                let refused = s.jobs.iter().map(|j| share::not_resumed(j, &why)).collect();
                (None, refused)
            }
            None => (None, Vec::new()),
        },
    )
}

/// Removes every slot (and journal and seal) but the saved jobs' current and prepared next
/// ones, and the state file of a plain mount.
fn keep_only_saved_slots(
    store: &Store,
    paths: &CachePaths,
    saved: Option<&SavedShare>,
) -> Result<(), DaemonError> {
    let keep: std::collections::BTreeSet<String> = saved
        .iter()
        .flat_map(|s| &s.jobs)
        .flat_map(|j| [Some(j.slot()), j.next_slot()])
        .flatten()
        .collect();
    store.remove_slots_except(|slot| keep.contains(slot))?;
    let _ = std::fs::remove_file(&paths.state);
    Ok(())
}

/// Every sample fits a job's view (half its share) beside the always files: the error names
/// the first that does not (a group by its first file) and the budget it would need; always
/// files that leave no room in a view are an error naming them. Returns the bytes the cohort
/// may deal into a view.
fn check_share_fits(
    cfg: &MountConfig,
    jobs: u32,
    catalog: &Catalog,
    footprints: &[u64],
    ids: &CohortIds,
    budget: &Budget,
) -> Result<u64, DaemonError> {
    let view_bytes = budget.slot_bytes / u64::from(jobs);
    let dealt = ids.dealt(catalog, cfg.budget, view_bytes)?;
    let always = view_bytes - dealt;
    let sizes = ids.sizes(footprints);
    match sizes.iter().enumerate().find(|(_, &f)| f > dealt) {
        Some((id, &size)) => {
            let files = ids.members([id as u32]);
            let path = match files.len() {
                1 => catalog.path(files[0]),
                n => format!("{} (a sample of {n} files)", catalog.path(files[0])),
            };
            Err(DaemonError::BudgetTooSmall {
                budget: format!("{} shared by {} jobs", format_bytes(cfg.budget), jobs),
                path,
                size: format_bytes(size),
                needed: format_bytes(
                    size.saturating_add(always)
                        .saturating_mul(2 * u64::from(jobs))
                        .saturating_add(budget.reserve),
                ),
                reserve: format_bytes(budget.reserve),
            })
        }
        None => Ok(dealt),
    }
}
