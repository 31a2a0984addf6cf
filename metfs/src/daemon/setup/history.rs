//! The rf history and policy of a mount: the history file, a `learned` policy's replay,
//! and the run a session records.

use crate::config::MountConfig;
use crate::daemon::session::History;
use crate::daemon::DaemonError;
use metfs_feedback::config::{PolicyConfig, PolicyKind};
use metfs_feedback::history::{HistoryStore, Replay, RunId};
use metfs_feedback::policy::RfPolicy;
use metfs_fs::lock_order::{Level, OrderedMutex};
use std::sync::Arc;

pub(in crate::daemon) fn open_history_store(cfg: &MountConfig) -> Option<HistoryStore> {
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
pub(in crate::daemon) fn learned_replay(
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
pub(in crate::daemon) fn start_recording(
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

pub(in crate::daemon) fn open_history(
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
            store: Arc::new(OrderedMutex::new(Level::History, store)),
            dataset: dataset.to_string(),
            run,
            replay,
        }),
        schedule,
    ))
}

pub(in crate::daemon) fn build_policy(
    cfg: &MountConfig,
    schedule: Option<Vec<u32>>,
) -> Result<Box<dyn RfPolicy>, DaemonError> {
    if cfg.policy.kind == PolicyKind::Learned {
        tracing::info!(
            mini_epochs = schedule.as_ref().map_or(0, Vec::len),
            "learned rf schedule"
        );
    }
    metfs_feedback::config::build_policy(&cfg.policy, schedule)
        .map_err(|e| DaemonError::Setup(format!("rf policy: {e}")))
}
