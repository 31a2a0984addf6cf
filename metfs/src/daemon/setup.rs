//! Setting up a mount: the cache's checks and lock, the tier, the catalog, the rf policy and
//! history, the resumed position, and the first mini-epoch staged before the mount goes live.

use super::*;

/// Retired slots a shared mount keeps on the node per job share, at most. Jobs over one
/// dataset take their common samples in the same round, so their slots are links of the same
/// files: many slots of few bytes each, which only the budget should bound.
const MAX_HELD_PER_SHARE: usize = 16;

/// How the mount fetches again a copy of a sealed slot that its first open found damaged: the
/// stager's repair, run to completion on the daemon's runtime from the FUSE thread that asked
/// (a runtime thread, in tests that call the core directly, gives its place up meanwhile).
pub(super) fn copy_repair(stager: &Stager) -> crate::fs::CopyRepair {
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

/// The rf history file of the mount (`--history`), or `None` (logged) if it cannot be used.
pub(super) fn open_history_store(cfg: &MountConfig) -> Option<HistoryStore> {
    if let Some(dir) = cfg.history.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    match HistoryStore::open(&cfg.history) {
        Ok((store, warnings)) => {
            for w in warnings {
                tracing::warn!("{w}");
            }
            Some(store)
        }
        Err(e) => {
            tracing::warn!(error = %e, "rf history unavailable; this run is not recorded");
            None
        }
    }
}

/// What a `learned` policy replays for (dataset, job): the earlier run, why, and its rf
/// schedule; nothing for the other policies. `exclude` is a resumed run, which must not
/// replay itself. The error (a `learned_metric` no earlier run recorded) names the setting.
pub(super) fn learned_replay(
    policy: &PolicyConfig,
    store: &HistoryStore,
    dataset: &str,
    job: &str,
    exclude: Option<RunId>,
) -> Result<Option<(Replay, Vec<u32>)>, String> {
    if policy.kind != PolicyKind::Learned {
        return Ok(None);
    }
    let metric = policy.replay_metric().map_err(|e| e.to_string())?;
    let replay = store
        .replay(dataset, job, exclude, &metric)
        .map_err(|e| e.to_string())?;
    match &replay {
        Some((r, _)) => tracing::info!(job, "learned replays {r}"),
        None => tracing::info!(job, "learned: no earlier run to replay"),
    }
    Ok(replay)
}

/// Starts (or resumes) a run of (dataset, job) in `store` and records on it what it replays.
pub(super) fn start_recording(
    store: &mut HistoryStore,
    dataset: &str,
    job: &str,
    previous: Option<RunId>,
    replay: Option<Replay>,
) -> (RunId, bool) {
    let (run, resumed) = store.resume_or_start(dataset, job, previous);
    // Cannot fail: the run was just found or started.
    let _ = store.set_replayed(run, replay);
    (run, resumed)
}

pub(super) fn open_history(
    cfg: &MountConfig,
    dataset: &str,
    job: &str,
    previous: Option<RunId>,
) -> Result<(Option<History>, Option<Vec<u32>>), DaemonError> {
    let Some(mut store) = open_history_store(cfg) else {
        return Ok((None, None));
    };
    let (replay, schedule) = learned_replay(&cfg.policy, &store, dataset, job, previous)
        .map_err(|e| DaemonError::Setup(format!("rf policy: {e}")))?
        .unzip();
    let (run, resumed) = start_recording(&mut store, dataset, job, previous, replay.clone());
    tracing::info!(history = %cfg.history.display(), run = %run, resumed, job, "recording rf history");
    Ok((
        Some(History {
            store: Arc::new(Mutex::new(store)),
            dataset: dataset.to_string(),
            run,
            replay,
        }),
        schedule,
    ))
}

pub(super) fn build_policy(
    cfg: &MountConfig,
    schedule: Option<Vec<u32>>,
) -> Result<Box<dyn RfPolicy>, DaemonError> {
    if cfg.policy.kind == PolicyKind::Learned {
        tracing::info!(
            mini_epochs = schedule.as_ref().map_or(0, Vec::len),
            "learned rf schedule"
        );
    }
    feedback::config::build_policy(&cfg.policy, schedule)
        .map_err(|e| DaemonError::Setup(format!("rf policy: {e}")))
}

pub(super) fn lock_cache(paths: &CachePaths) -> Result<std::fs::File, DaemonError> {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&paths.lock)
        .map_err(|e| DaemonError::Cache {
            path: paths.root.display().to_string(),
            reason: e.to_string(),
        })?;
    // SAFETY: flock on an fd we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let mut pid = String::new();
        let _ = f.read_to_string(&mut pid);
        return Err(DaemonError::CacheBusy(
            paths.root.display().to_string(),
            pid.trim().to_string(),
        ));
    }
    let _ = f.set_len(0);
    let _ = f.seek(std::io::SeekFrom::Start(0));
    let _ = write!(f, "{}", std::process::id());
    Ok(f)
}

/// Writes `state.json` atomically, fsynced before the rename: after a crash it is the old
/// position or the new one, whole.
pub(super) fn write_saved_state(
    path: &Path,
    saved: &SavedState,
) -> Result<(), durable::DurableError> {
    durable::write(
        path,
        &serde_json::to_vec(saved).unwrap(),
        durable::Durability::File,
    )
}

/// Makes the cache directory private (0700): staged copies of protected source files live in
/// it. A wider one is tightened with a warning; a shared one (sticky, like `/tmp` or
/// `/dev/shm`) or one of another user is refused, since tightening it would lock others out.
pub(super) fn make_private(root: &Path) -> Result<(), DaemonError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let bad = |reason: String| DaemonError::Cache {
        path: root.display().to_string(),
        reason,
    };
    let md = std::fs::metadata(root).map_err(|e| bad(e.to_string()))?;
    let mode = md.mode() & 0o7777;
    if mode & 0o077 == 0 {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if mode & 0o1000 != 0 || md.uid() != me {
        return Err(bad(format!(
            "a shared directory (mode {mode:o}, owner uid {}) cannot hold the cache, which must \
             be private; name a directory of your own inside it",
            md.uid()
        )));
    }
    tracing::warn!(path = %root.display(), mode = format!("{mode:o}"), "the cache directory was accessible to other users; making it private (0700)");
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| bad(format!("cannot make it private (0700): {e}")))
}

/// Checks that the cache directory exists and is a directory.
pub fn check_cache_dir(cache: &Path) -> Result<(), DaemonError> {
    let bad = |reason: String| DaemonError::Cache {
        path: cache.display().to_string(),
        reason,
    };
    match std::fs::metadata(cache) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(bad(
            "is not a directory (give a directory on node-local storage)".into(),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(bad(
            "does not exist (create it on node-local storage first)".into(),
        )),
        Err(e) => Err(bad(e.to_string())),
    }
}

/// `p` with symlinks resolved; for a path that cannot be resolved itself (a dead mount), its
/// resolved parent joined with its name.
pub(super) fn resolved(p: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(p).ok().or_else(|| {
        let parent = std::fs::canonicalize(p.parent()?).ok()?;
        Some(parent.join(p.file_name()?))
    })
}

/// Refuses a layout where the source, the cache and the mountpoint overlap (after resolving
/// symlinks): a cache inside the source would be catalogued as samples by a later listing (and
/// serve metfs's own lock file); a source inside the cache would be deleted by its cleanup; a
/// mountpoint inside either hides or loops back into what the daemon reads. Each error names
/// both paths.
pub fn check_places(cfg: &MountConfig, mountpoint: &Path) -> Result<(), DaemonError> {
    check_cache_dir(&cfg.cache)?;
    let mut places: Vec<(&str, &Path, PathBuf)> = Vec::new();
    if !cfg.source.contains("://") {
        if let Some(p) = resolved(Path::new(&cfg.source)) {
            places.push(("source", Path::new(&cfg.source), p));
        }
    }
    if let Some(p) = resolved(&cfg.cache) {
        places.push(("cache directory", &cfg.cache, p));
    }
    if let Some(p) = resolved(mountpoint) {
        places.push(("mountpoint", mountpoint, p));
    }
    for (i, (a, a_path, a_res)) in places.iter().enumerate() {
        for (b, b_path, b_res) in &places[i + 1..] {
            let (inner, inner_path, inner_res, outer, outer_path, outer_res) =
                if a_res.starts_with(b_res) {
                    (a, a_path, a_res, b, b_path, b_res)
                } else if b_res.starts_with(a_res) {
                    (b, b_path, b_res, a, a_path, a_res)
                } else {
                    continue;
                };
            let at = |given: &Path, res: &Path| {
                if given == res {
                    given.display().to_string()
                } else {
                    format!("{} (resolved: {})", given.display(), res.display())
                }
            };
            let how = if inner_res == outer_res {
                "is the same directory as"
            } else {
                "is inside"
            };
            return Err(DaemonError::Setup(format!(
                "the {inner} {} {how} the {outer} {}; give them separate directories",
                at(inner_path, inner_res),
                at(outer_path, outer_res),
            )));
        }
    }
    Ok(())
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
    /// tests hand the daemon an in-memory or fault-injecting tier (`prefetcher::tier::testing`)
    /// and drive its fault handling without a file system or server to break. `cfg.source`
    /// still goes into the plan's fingerprint and the messages; give it the tier's URL.
    pub async fn prepare_with_tier(
        cfg: MountConfig,
        show_progress: bool,
        tier: Arc<dyn CapacityTier>,
    ) -> Result<(Arc<Daemon>, std::fs::File), DaemonError> {
        Self::prepare_on(cfg, show_progress, Some(tier)).await
    }

    /// [`Daemon::prepare`]'s phases, on `tier` or (`None`) the tier `cfg.source` names, opened
    /// after the cache as a mount always has (so a mount with both wrong reports the cache).
    async fn prepare_on(
        cfg: MountConfig,
        show_progress: bool,
        tier: Option<Arc<dyn CapacityTier>>,
    ) -> Result<(Arc<Daemon>, std::fs::File), DaemonError> {
        let (paths, lock) = open_cache(&cfg)?;
        let tier = match tier {
            Some(tier) => tier,
            None => open_tier(&cfg.source, &cfg.s3, cfg.stager.timeout_secs)?,
        };
        let (mut catalog, reused, containers) = load_catalog(&*tier, &paths.catalog, &cfg).await?;
        if catalog.is_empty() {
            return Err(DaemonError::Empty(cfg.source.clone()));
        }
        if (needs_labels(cfg.compose) || cfg.share.enabled) && catalog.labels().is_none() {
            // A shared mount's jobs may ask for a subset by label.
            catalog.label_by_first_dir();
        }
        let catalog_bytes = if reused {
            std::fs::metadata(&paths.catalog)
                .map(|m| m.len())
                .unwrap_or(0)
        } else {
            // The old catalog goes first: with its replacement written beside it, the two
            // would take more than the one the budget reserves.
            let _ = std::fs::remove_file(&paths.catalog);
            catalog.save(&paths.catalog)?
        };
        let Planned {
            budget,
            footprints,
            plan_cfg,
            nm,
            aggregate,
        } = plan_dataset(&cfg, &catalog, catalog_bytes, containers.as_ref())?;
        let fingerprint = fingerprint_for(&cfg, budget.slot_bytes, nm, &catalog);
        let saved = saved_position(&cfg, &paths, &fingerprint, nm)?;
        let pacer = Pacer::with_rate(match cfg.prefetch_rate {
            PrefetchRate::Fixed(r) => Some(r),
            // The first mini-epoch is staged at full speed (the job is waiting for it); pacing
            // starts after it (see below).
            PrefetchRate::Auto | PrefetchRate::Unlimited => None,
        });
        let catalog = Arc::new(catalog);
        let stager = Stager::new(
            tier.clone(),
            catalog.clone(),
            paths.slots.clone(),
            paths.tmp.clone(),
            cfg.stager.clone(),
            pacer,
        )
        .with_transform(Transformer::new(&cfg.transform)?);
        stager.clean_tmp()?;
        if cfg.share.enabled {
            let daemon = Self::prepare_shared(
                cfg,
                paths,
                tier.url().to_string(),
                catalog,
                footprints,
                budget,
                stager,
            )
            .await?;
            return Ok((daemon, lock));
        }
        let queue = join_queue(&cfg, &catalog, &footprints, budget.slot_bytes).await?;
        let (epoch, mini_epoch, generation, sequence) = match &saved {
            Some(s) => {
                tracing::info!(
                    epoch = s.epoch,
                    mini_epoch = s.mini_epoch,
                    "resuming where the last mount stopped"
                );
                (s.epoch, s.mini_epoch, s.generation, s.sequence)
            }
            None => match &queue {
                Some((_, first)) => (first.epoch, 0, 1, 0),
                None => (0, 0, 1, 0),
            },
        };
        let cur = (epoch, mini_epoch);
        let succ = successor(cur, nm);
        // Slots that belong to neither the current nor the successor mini-epoch are stale.
        // They are deleted in the background: a retired slot of 500k files takes minutes to
        // delete, and the mount need not wait for it (staging fetches nothing until it is).
        for name in stager.present_slots() {
            if saved.is_none() || (name != slot_name(cur) && name != slot_name(succ)) {
                stager.evict_in_background(&name)?;
            }
        }
        if saved.is_none() {
            // Journals (and seals) without slot directories, from a different plan.
            if let Ok(rd) = std::fs::read_dir(&paths.slots) {
                for e in rd.flatten() {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        // The slots kept whose seal holds resume without reading their copies.
        let sealed = stager.take_seals();
        if !sealed.is_empty() {
            tracing::info!(slots = ?sealed, "sealed at the last clean shutdown");
        }
        let dataset_key = fingerprint.dataset_key();
        let job = saved
            .as_ref()
            .and_then(|s| s.job.clone())
            .unwrap_or_else(|| cfg.job.clone());
        let (history, schedule) =
            open_history(&cfg, &dataset_key, &job, saved.as_ref().and_then(|s| s.run))?;
        let policy = build_policy(&cfg, schedule)?;
        if saved.is_none() {
            // Saved before the first mini-epoch is staged: a daemon killed while staging it
            // then finds its plan on restart and resumes the slot from its journal, instead of
            // discarding it as a slot of an unknown plan.
            let first = SavedState {
                fingerprint: SavedFingerprint::Current(fingerprint.clone()),
                epoch,
                mini_epoch,
                generation,
                sequence,
                run: history.as_ref().map(|h| h.run),
                job: Some(job.clone()),
            };
            if let Err(e) = write_saved_state(&paths.state, &first) {
                tracing::error!(error = %e, path = %paths.state.display(), "cannot save the position");
            }
        }
        let set = SampleSet {
            sizes: &footprints,
            labels: catalog.labels(),
            clusters: catalog.clusters(),
        };
        let plan = match &aggregate {
            Some(_) => None,
            None => Some(Arc::new(planner::plan_epoch(&set, &plan_cfg, epoch)?)),
        };
        let (members, members_bytes, shown) = match (&queue, &aggregate, &plan) {
            (Some((_, first)), _, _) => (first.samples.clone(), first.bytes, None),
            (None, Some(a), _) => {
                let (c, bytes) = a.cache(epoch);
                (c, bytes, Some(a.share(epoch)))
            }
            (None, None, Some(plan)) => {
                let me = &plan.mini_epochs[mini_epoch as usize];
                (me.samples.clone(), me.bytes, None)
            }
            (None, None, None) => unreachable!("a plan is made unless aggregate"),
        };
        let spec = SlotSpec {
            name: slot_name(cur),
            samples: members.clone(),
            // A resumed run's successor slot may hold samples of the current one.
            reuse_from: if saved.is_some() {
                vec![slot_name(succ)]
            } else {
                Vec::new()
            },
        };
        tracing::info!(
            mini_epochs = nm,
            slot_bytes = %format_bytes(budget.slot_bytes),
            reserve = %format_bytes(budget.reserve),
            epoch, mini_epoch,
            files = members.len(),
            bytes = %format_bytes(members_bytes),
            "staging the first mini-epoch"
        );
        let t = Instant::now();
        let progress: Arc<Progress> = Arc::default();
        let bar = show_progress.then(|| progress_bar(progress.clone()));
        let report = match &containers {
            Some(c) => stager.stage_containers(&spec, c.clone(), progress).await,
            None => stager.stage(&spec, progress).await,
        };
        if let Some((bar, task)) = bar {
            task.abort();
            bar.finish_and_clear();
        }
        let report = report?;
        if cfg.prefetch_rate == PrefetchRate::Auto {
            // Just-in-time pacing starts as a trickle: the first pass end sets the real rate.
            stager.pacer().set_rate(Some(AUTO_TRICKLE));
        }
        tracing::info!(
            fetched = report.fetched,
            resumed = report.resumed,
            failed = report.failed.len(),
            secs = t.elapsed().as_secs_f64(),
            "mini-epoch staged"
        );
        first_slot_usable(&cfg, &catalog, &stager, &spec, members.len(), &report)?;
        let store = Store::new(
            paths.clone(),
            catalog.clone(),
            footprints,
            containers,
            budget,
            stager,
        );
        store.note_failed(
            report
                .failed
                .iter()
                .map(|(id, why)| (catalog.path(*id), why.clone())),
        );
        let view = Arc::new(store.view_for(
            shown.as_deref().unwrap_or(&members),
            cur,
            generation,
            &slot_name(cur),
        ));
        let mean_sample = catalog.total_bytes() / (catalog.len() as u64).max(1);
        let read_path =
            cfg.read_path
                .resolve(budget.slot_bytes, mean_sample, crate::config::mem_total());
        if cfg.read_path == ReadPath::Auto {
            tracing::info!(
                read_path = read_path.name(),
                slot_bytes = %format_bytes(budget.slot_bytes),
                mean_sample = %format_bytes(mean_sample),
                "read path chosen: cached for samples under 1 MiB when a slot fits in half of the node's memory, else passthrough (pread without CAP_SYS_ADMIN)"
            );
        }
        let fs = Arc::new(FsCore::new(
            view.clone(),
            FsSettings {
                max_open_files: cfg.max_open_files,
                max_backing_ids: cfg.max_backing_ids,
                track_kernel_refs: read_path == ReadPath::Cached,
            },
        ));
        fs.set_copy_repair(copy_repair(&store.stager));
        store.begin_slot(&slot_name(cur), &members);
        store.note_links(&slot_name(cur), &report);
        let schedule = match (&queue, &aggregate) {
            (Some((_, first)), _) => Schedule::Queue {
                batches: QueueState {
                    batches: BTreeMap::from([(0, first.clone())]),
                    ..Default::default()
                },
                mini_epochs: nm,
            },
            (None, Some(a)) => Schedule::Aggregate(a.clone()),
            (None, None) => Schedule::Plan(Plans::new(plan_cfg, nm, plan.map(|p| (epoch, p)))),
        };
        let session = Session::new(
            DEFAULT_SESSION.to_string(),
            job,
            schedule,
            Some(Persist {
                fingerprint,
                file: paths.state.clone(),
            }),
            Start {
                epoch,
                mini_epoch,
                passes: 0,
                generation,
                sequence,
            },
            policy,
            history,
            view,
        );
        let daemon = Self::assemble(Parts {
            tier_url: tier.url().to_string(),
            queue: queue.map(|(feed, _)| feed),
            shared: None,
            paths,
            store,
            sessions: BTreeMap::from([(DEFAULT_SESSION.to_string(), session)]),
            fs,
            read_path,
            cfg,
        });
        daemon.save_state(DEFAULT_SESSION);
        if let Some(a) = &aggregate {
            daemon.write_exchange_spec(a)?;
        }
        daemon.events.emit(Event::Start(event::Start {
            dataset_bytes: daemon.store.catalog.total_bytes(),
            dataset_files: daemon.store.catalog.len() as u64,
            mini_epochs: nm,
            view_bytes: daemon.fs.current().bytes(),
            rf_policy: daemon.cfg.policy.kind.to_string(),
            budget_bytes: daemon.store.budget.budget,
            node_rank: daemon.cfg.node_rank,
            nodes: daemon.cfg.nodes,
            epoch,
            mini_epoch,
        }));
        Ok((daemon, lock))
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
    queue: Option<QueueFeed>,
    shared: Option<Shared>,
}

impl Daemon {
    fn assemble(p: Parts) -> Arc<Daemon> {
        let (changed, _) = watch::channel(0u64);
        let daemon = Arc::new(Daemon {
            tier_url: p.tier_url,
            me: Mutex::new(std::sync::Weak::new()),
            persisting: Mutex::new(()),
            queue: p.queue,
            shared: p.shared,
            paths: p.paths,
            store: p.store,
            sessions: Mutex::new(p.sessions),
            fs: p.fs,
            read_path: p.read_path,
            active_read_path: Arc::new(ActiveReadPath::new(p.read_path)),
            shutting_down: Default::default(),
            events: crate::events::EventLog::open(&p.cfg.run_dir),
            changed,
            kernel: Mutex::new(None),
            mountpoint: Mutex::new(PathBuf::new()),
            started: Instant::now(),
            shutdown: tokio::sync::Notify::new(),
            apply_one: tokio::sync::Mutex::new(()),
            cfg: p.cfg,
        });
        *daemon.me.lock().unwrap() = Arc::downgrade(&daemon);
        daemon
    }

    /// The rest of [`Daemon::prepare`] for a shared mount (`--share`, the `share` module):
    /// the jobs of the save file (`share.json`, if it is of these settings) are resumed, each
    /// from its kept slots, and wait for their `hello`; every other slot of an earlier run is
    /// removed.
    #[allow(clippy::too_many_arguments)]
    async fn prepare_shared(
        cfg: MountConfig,
        paths: CachePaths,
        tier_url: String,
        catalog: Arc<Catalog>,
        footprints: Vec<u64>,
        budget: Budget,
        stager: Stager,
    ) -> Result<Arc<Daemon>, DaemonError> {
        let transform = cfg.transform.identity();
        let settings = ShareSettings {
            source: cfg.source.to_string(),
            catalog: format!("{:016x}", aggregate::catalog_digest(&catalog)),
            slot_bytes: budget.slot_bytes,
            jobs: cfg.share.jobs,
            seed: cfg.seed,
            transform: (!transform.is_empty()).then_some(transform),
        };
        let saved = match share_state::load_share_state(&paths.share, cfg.reset)? {
            Some(s) if s.version == SHARE_STATE_VERSION && s.settings == settings => Some(s),
            Some(s) => {
                tracing::info!(
                    path = %paths.share.display(),
                    jobs = s.jobs.len(),
                    "the source, the budget, share.jobs, the seed or the transform changed since the jobs' places were saved; every job starts over"
                );
                None
            }
            None => None,
        };
        // The kept slots: each saved job's current one and its prepared next one.
        let keep: std::collections::BTreeSet<String> = saved
            .iter()
            .flat_map(|s| &s.jobs)
            .flat_map(|j| [Some(j.slot()), j.next_slot()])
            .flatten()
            .collect();
        for name in stager.present_slots() {
            if !keep.contains(&name) {
                stager.evict_in_background(&name)?;
            }
        }
        if let Ok(rd) = std::fs::read_dir(&paths.slots) {
            for e in rd.flatten() {
                // Journals and seals of the kept slots stay (`<slot>.journal`, `<slot>.seal`).
                let file = e.file_name();
                let kept = file
                    .to_str()
                    .and_then(|f| f.rsplit_once('.'))
                    .is_some_and(|(slot, _)| keep.contains(slot));
                if !kept {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        let _ = std::fs::remove_file(&paths.state);
        // Kept slots whose seal holds (a clean shutdown) resume without reading their copies.
        let sealed = stager.take_seals();
        if !sealed.is_empty() {
            tracing::info!(slots = ?sealed, "sealed at the last clean shutdown");
        }
        let view_bytes = budget.slot_bytes / u64::from(cfg.share.jobs);
        if let Some((id, &size)) = footprints.iter().enumerate().find(|(_, &f)| f > view_bytes) {
            return Err(DaemonError::BudgetTooSmall {
                budget: format!(
                    "{} shared by {} jobs",
                    format_bytes(cfg.budget),
                    cfg.share.jobs
                ),
                path: catalog.path(id as u32),
                size: format_bytes(size),
                needed: format_bytes(
                    size.saturating_mul(2 * u64::from(cfg.share.jobs))
                        .saturating_add(budget.reserve),
                ),
                reserve: format_bytes(budget.reserve),
            });
        }
        let restarts = saved.as_ref().map_or(0, |s| s.restarts + 1);
        // After a restart the sampler draws from a stream of its own (`Cohort`'s doc).
        let seed = if restarts == 0 {
            cfg.seed
        } else {
            planrng::splitmix64(&mut (cfg.seed ^ restarts.rotate_left(32)))
        };
        let mut shared = Shared::new(cfg.share.clone(), &budget, footprints.clone(), seed);
        shared.settings = settings;
        shared.restarts = restarts;
        shared.history = open_history_store(&cfg).map(|s| Arc::new(Mutex::new(s)));
        let mean_sample = catalog.total_bytes() / (catalog.len() as u64).max(1);
        let read_path =
            cfg.read_path
                .resolve(budget.slot_bytes, mean_sample, crate::config::mem_total());
        if cfg.prefetch_rate == PrefetchRate::Auto {
            // Several jobs pace one stager: each staging runs at full speed (the stall-free
            // pacing of one job does not apply to a cohort).
            stager.pacer().set_rate(None);
        }
        let mut store = Store::new(
            paths.clone(),
            catalog.clone(),
            footprints,
            None,
            budget,
            stager,
        );
        // The budget bounds what kept slots hold (`Store::room_for`); the count only bounds
        // the book's work and the journals a staging reads.
        store.max_held = MAX_HELD_PER_SHARE * cfg.share.jobs as usize;
        store.room_on_demand = true;
        // The root stands for this empty view; jobs' views take generations from 2 on.
        let lobby = Arc::new(View::from_files(&[], 1, 0, 0, "", &paths.slots));
        let fs = Arc::new(FsCore::new_shared(
            lobby,
            FsSettings {
                max_open_files: cfg.max_open_files,
                max_backing_ids: cfg.max_backing_ids,
                track_kernel_refs: read_path == ReadPath::Cached,
            },
        ));
        fs.set_copy_repair(copy_repair(&store.stager));
        tracing::info!(
            jobs = cfg.share.jobs,
            view_bytes = %format_bytes(view_bytes),
            pace = %cfg.share.pace,
            "shared store ready: jobs join with `hello` and their name"
        );
        let daemon = Self::assemble(Parts {
            tier_url,
            queue: None,
            shared: Some(shared),
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
            rf_policy: daemon.cfg.policy.kind.to_string(),
            budget_bytes: daemon.store.budget.budget,
            node_rank: daemon.cfg.node_rank,
            nodes: daemon.cfg.nodes,
            epoch: 0,
            mini_epoch: 0,
        }));
        if let Some(saved) = saved {
            daemon.resume_jobs(saved).await;
        }
        Ok(daemon)
    }
}

/// The cache's first phase: checked, made private and locked (the lock is held for the daemon's
/// life), its `slots/` and `tmp/` directories made, and the temporaries of a daemon killed while
/// it replaced its state or catalog removed.
fn open_cache(cfg: &MountConfig) -> Result<(CachePaths, std::fs::File), DaemonError> {
    let paths = CachePaths::new(&cfg.cache);
    check_cache_dir(&paths.root)?;
    make_private(&paths.root)?;
    let lock = lock_cache(&paths)?;
    for d in [&paths.slots, &paths.tmp] {
        // A symlink here would lead slot deletions and tmp cleanup out of the cache: it is
        // removed (never its target) and a private directory made in its place.
        if std::fs::symlink_metadata(d).is_ok_and(|m| !m.is_dir()) {
            tracing::warn!(path = %d.display(), "not a directory (a symlink?) in the cache; replacing it");
            let _ = std::fs::remove_file(d);
        }
        prefetcher::stager::create_private_dir(d).map_err(|e| DaemonError::Cache {
            path: d.display().to_string(),
            reason: e.to_string(),
        })?;
    }
    // Temporaries of a daemon killed while it replaced these files (under the lock, no
    // other daemon writes them).
    for f in [&paths.state, &paths.share, &paths.catalog] {
        if let Err(e) = durable::remove_leftovers(f) {
            tracing::warn!(path = %f.display(), error = %e, "cannot remove leftover temporary files");
        }
    }
    Ok((paths, lock))
}

/// What the plan depends on: a saved position is resumed only under the same.
fn fingerprint_for(cfg: &MountConfig, slot_bytes: u64, nm: u32, catalog: &Catalog) -> Fingerprint {
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
        plan: if cfg.dds.url.is_some() {
            PlanKind::Dds
        } else if cfg.aggregate.enabled {
            PlanKind::Aggregate {
                extra: cfg.aggregate.extra,
            }
        } else {
            PlanKind::Static
        },
    }
}

/// The saved position to resume, if there is one for this plan: none with `--reset`, with a
/// queue (its shards say where the job is), or under another fingerprint (said in the log); an
/// unreadable state file, or one whose position the plan does not have, is an error naming it.
fn saved_position(
    cfg: &MountConfig,
    paths: &CachePaths,
    fingerprint: &Fingerprint,
    nm: u32,
) -> Result<Option<SavedState>, DaemonError> {
    Ok(match load_state(&paths.state, cfg.reset)? {
        Some(_) if cfg.dds.url.is_some() => None,
        Some(s) if s.fingerprint.matches(fingerprint) => {
            s.check_plan(nm).map_err(|e| match e {
                DaemonError::CorruptState { reason, .. } => DaemonError::CorruptState {
                    path: paths.state.display().to_string(),
                    reason,
                },
                e => e,
            })?;
            Some(s)
        }
        Some(s) => {
            tracing::info!(
                epoch = s.epoch,
                mini_epoch = s.mini_epoch,
                "the dataset or the plan settings changed since the saved position; starting at epoch 0"
            );
            None
        }
        None => None,
    })
}

/// With a queue (`--dds`): joins it as a new incarnation of this node and claims the first
/// batch; `None` without one.
async fn join_queue(
    cfg: &MountConfig,
    catalog: &Catalog,
    footprints: &[u64],
    slot_bytes: u64,
) -> Result<Option<(QueueFeed, crate::dds::Batch)>, DaemonError> {
    Ok(match cfg.dds.queue_url()? {
        Some(url) => {
            let q = crate::dds::Queue::connect(&url, &cfg.dds.etcd_options()).await?;
            let samples = crate::dds::dataset::samples(catalog, footprints.to_vec());
            let meta = crate::dds::dataset::queue_meta(
                catalog,
                &samples,
                cfg.compose,
                cfg.seed,
                slot_bytes,
                cfg.dds.shards_per_slot,
            )?;
            let (meta, made) = q.init(&meta).await?;
            let node = cfg.dds.node(cfg.node_rank);
            let mut worker = crate::dds::Worker::join(
                q,
                meta,
                Arc::new(samples),
                crate::dds::WorkerConfig {
                    node: node.clone(),
                    lease_ttl: cfg.dds.lease_ttl(),
                    depth: 2,
                    last_epoch: None,
                },
            )
            .await?;
            tracing::info!(
                queue = %url,
                node,
                incarnation = worker.holder().inc,
                made,
                shard_done = %cfg.dds.shard_done,
                "dds: joined the shard queue"
            );
            let first = QueueFeed::first_batch(&mut worker, slot_bytes).await?;
            Some((
                QueueFeed::new(url.to_string(), cfg.dds.shard_done, worker),
                first,
            ))
        }
        None => None,
    })
}

/// Samples of the first mini-epoch left out are reported; a first mini-epoch with none staged
/// at all is a wrong source or manifest, not a dataset to train on: its slot is deleted and the
/// mount fails naming the source (or manifest) and one sample's error.
fn first_slot_usable(
    cfg: &MountConfig,
    catalog: &Catalog,
    stager: &Stager,
    spec: &SlotSpec,
    members: usize,
    report: &StageReport,
) -> Result<(), DaemonError> {
    if let Some((id, why)) = report.failed.first() {
        let (k, n) = (report.failed.len(), members);
        let what = match &cfg.manifest {
            Some(m) => format!("manifest {}", m.display()),
            None => format!("source {}", cfg.source),
        };
        if k >= n {
            let _ = stager.evict(&spec.name);
            let hint = if cfg.manifest.is_some() {
                "; does the manifest belong to this source?"
            } else {
                ""
            };
            return Err(DaemonError::Setup(format!(
                "{what}: none of the {n} samples of the first mini-epoch could be staged from {} ({k} missing or unreadable, e.g. `{}`: {why}){hint}",
                cfg.source,
                catalog.path(*id)
            )));
        }
        tracing::warn!(
            "{what}: {k} of the first mini-epoch's {n} samples are missing or unreadable at the source and are left out (`metfs status` lists them)"
        );
    }
    Ok(())
}

/// What the plan of a plain, queue or aggregate mount is made from.
struct Planned {
    budget: Budget,
    /// Per sample: the bytes it may take in a slot (a transform's output at its most).
    footprints: Vec<u64>,
    plan_cfg: PlanConfig,
    /// Mini-epochs per epoch (1 in aggregate mode).
    nm: u32,
    aggregate: Option<Arc<aggregate::Aggregate>>,
}

/// The budget split, each sample's footprint and the number of mini-epochs; a sample larger
/// than a slot is an error naming it and the budget it would need.
fn plan_dataset(
    cfg: &MountConfig,
    catalog: &Catalog,
    catalog_bytes: u64,
    containers: Option<&Arc<Containers>>,
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
    let footprints: Vec<u64> = if containers.is_some() {
        catalog.sizes().to_vec()
    } else {
        // A transformed sample is planned at what its output may take (the transform
        // refuses a larger one), so the budget holds whatever it writes.
        catalog
            .sizes()
            .iter()
            .map(|&s| cfg.transform.footprint(s))
            .collect()
    };
    let plan_cfg = PlanConfig {
        strategy: cfg.compose,
        seed: cfg.seed,
        slot_bytes: budget.slot_bytes,
        mini_epochs: cfg.mini_epochs,
        node_rank: cfg.node_rank,
        nodes: cfg.nodes,
        cluster_copies: cfg.cluster_copies,
    };
    let set = SampleSet {
        sizes: &footprints,
        labels: catalog.labels(),
        clusters: catalog.clusters(),
    };
    let nm = match planner::mini_epoch_count(&set, &plan_cfg) {
        Ok(n) => n,
        Err(PlanError::SampleTooLarge { sample, size, .. }) => {
            return Err(DaemonError::BudgetTooSmall {
                budget: format_bytes(cfg.budget),
                path: catalog.path(sample),
                size: format_bytes(size),
                needed: format_bytes(size.saturating_mul(2).saturating_add(budget.reserve)),
                reserve: format_bytes(budget.reserve),
            })
        }
        Err(e) => return Err(e.into()),
    };
    // Aggregate-cache mode: one mini-epoch per epoch, from the `shuffle` planner.
    let aggregate = if cfg.aggregate.enabled {
        Some(Arc::new(aggregate::Aggregate::new(
            cfg,
            footprints.clone(),
            budget.slot_bytes,
        )?))
    } else {
        None
    };
    let nm = if aggregate.is_some() { 1 } else { nm };
    Ok(Planned {
        budget,
        footprints,
        plan_cfg,
        nm,
        aggregate,
    })
}
