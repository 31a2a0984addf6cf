//! From layered settings to a [`MountConfig`]: the required settings, the values checked one
//! concern at a time (nodes, policy, counts, transform, catalog, HDF5), the mode
//! ([`Mode::resolve`]) and the derived defaults.
//!
//! Each check returns the first error it finds, naming the setting and where its value came
//! from ([`Check::invalid`]); the checks run in a fixed order, so a configuration with several
//! mistakes always reports the same one first.

use std::path::PathBuf;

use metfs_feedback::config::{PolicyConfig, PolicyKind};

use super::check::Check;
use super::mode::Mode;
use super::{ConfigError, Layers, MountConfig, MountSettings};

fn missing(key: &'static str) -> ConfigError {
    ConfigError::Missing {
        key,
        flag: key.replace('_', "-"),
        env: key.to_uppercase(),
    }
}

fn env_u32(name: &str) -> Option<u32> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// [`MountConfig::resolve`]'s work (see the module doc).
pub(super) fn resolve(layers: &Layers) -> Result<MountConfig, ConfigError> {
    let s = layers.settings()?;
    let check = Check::new(layers);
    let source = s.source.clone().ok_or_else(|| missing("source"))?;
    let cache = s.cache.clone().ok_or_else(|| missing("cache"))?;
    let cache = std::path::absolute(&cache).unwrap_or(cache);
    let budget = s.budget.ok_or_else(|| missing("budget"))?.0;
    let (node_rank, nodes) = nodes(&s, &check)?;
    let policy = policy(&s, layers, &check)?;
    check_counts(&s, &check)?;
    check_transform(&s, &check)?;
    let mode = Mode::resolve(&s, &check)?;
    let samples = super::samples::resolve(&s, &check)?;
    let catalog = catalog(&s, &check)?;
    check_hdf5_built(&s, &check)?;
    Ok(MountConfig {
        run_dir: s.run_dir.unwrap_or_else(|| cache.join("run")),
        prefetch_rate_max: s.prefetch_rate_max.map(|r| r.0),
        metrics_file: s.metrics_file,
        label_hdf5: s.label_hdf5,
        hdf5_container: s.hdf5_container,
        hdf5_datasets: s.hdf5_datasets.map(|l| {
            l.iter()
                .map(|x| x.trim().to_string())
                .filter(|x| !x.is_empty())
                .collect()
        }),
        label_dataset: s.label_dataset,
        s3: s.s3,
        socket: s.socket.unwrap_or_else(|| cache.join("metfs.sock")),
        log_file: s.log_file.unwrap_or_else(|| cache.join("metfs.log")),
        source: absolute_source(source),
        cache,
        budget,
        mini_epochs: s.mini_epochs,
        policy,
        history: s.history.unwrap_or_else(default_history),
        job: s.job,
        compose: s.compose,
        cluster_copies: s.cluster_copies,
        seed: s.seed,
        node_rank,
        nodes,
        manifest: s.manifest,
        catalog,
        label_from_dirs: s.label_from_dirs,
        samples,
        read_path: s.read_path,
        fuse_threads: s.fuse_threads,
        prime_entries: s.prime_entries,
        allow_other: s.allow_other,
        prefetch_rate: s.prefetch_rate,
        max_open_files: s.max_open_files,
        max_backing_ids: s.max_backing_ids,
        memory_limit: s.memory_limit.map(|m| m.0),
        stager: s.stager,
        transform: s.transform,
        control: s.control,
        mode,
        reset: false,
    })
}

/// The node's rank and the node count: given, else Slurm's, else 0 of 1.
fn nodes(s: &MountSettings, check: &Check) -> Result<(u32, u32), ConfigError> {
    let nodes = s.nodes.or_else(|| env_u32("SLURM_NNODES")).unwrap_or(1);
    let node_rank = s.node_rank.or_else(|| env_u32("SLURM_NODEID")).unwrap_or(0);
    if nodes == 0 {
        return Err(check.invalid("nodes", "0: a job has at least 1 node"));
    }
    if node_rank >= nodes {
        return Err(check.invalid(
            "node_rank",
            format!("node rank {node_rank} is not in 0..{nodes}"),
        ));
    }
    Ok((node_rank, nodes))
}

/// The rf policy, validated; a fixed rf above the default cap raises the cap (asking for rf
/// 256 means 256), a cap given explicitly stays.
fn policy(s: &MountSettings, layers: &Layers, check: &Check) -> Result<PolicyConfig, ConfigError> {
    let mut policy = s.policy.clone();
    if policy.kind == PolicyKind::Fixed && !layers.given("rf_max") {
        policy.rf_max = policy.rf_max.max(policy.rf);
    }
    policy.validate().map_err(|e| match e {
        metfs_feedback::config::ConfigError::Invalid { key, reason } => {
            check.invalid(if key == "kind" { "rf_policy" } else { key }, reason)
        }
        other => check.invalid("rf_policy", other.to_string()),
    })?;
    Ok(policy)
}

/// Counts that must be at least 1.
fn check_counts(s: &MountSettings, check: &Check) -> Result<(), ConfigError> {
    let at_least_one = [
        ("mini_epochs", s.mini_epochs == Some(0)),
        ("fuse_threads", s.fuse_threads == 0),
        ("control.max_connections", s.control.max_connections == 0),
        (
            "control.idle_timeout_secs",
            s.control.idle_timeout_secs == 0,
        ),
        ("stager.concurrency", s.stager.concurrency == 0),
    ];
    if let Some((key, _)) = at_least_one.iter().find(|(_, zero)| *zero) {
        return Err(check.invalid(key, "must be at least 1"));
    }
    let st = &s.stager;
    if st.defer_after_secs == 0 || st.defer_after_secs < st.retry_secs {
        return Err(check.invalid(
            "stager.defer_after_secs",
            format!(
                "{} s: at least stager.retry_secs ({} s), or a sample would be deferred before its retries end",
                st.defer_after_secs, st.retry_secs
            ),
        ));
    }
    Ok(())
}

/// `[transform]`: its command parses, its suffix is a name's, its counts and growth positive.
fn check_transform(s: &MountSettings, check: &Check) -> Result<(), ConfigError> {
    let t = &s.transform;
    if let Err(e) = t.argv() {
        return Err(check.invalid("transform.command", e.to_string()));
    }
    if t.suffix.contains('/') {
        return Err(check.invalid(
            "transform.suffix",
            format!("`{}` must not contain `/`", t.suffix),
        ));
    }
    if t.timeout_secs == 0 {
        return Err(check.invalid("transform.timeout_secs", "must be at least 1"));
    }
    if t.workers == Some(0) {
        return Err(check.invalid("transform.workers", "must be at least 1"));
    }
    if !(t.growth.is_finite() && t.growth > 0.0) {
        return Err(check.invalid(
            "transform.growth",
            format!("{} must be a positive number", t.growth),
        ));
    }
    Ok(())
}

/// The catalog file, if any (an empty path, `METFS_CATALOG=`, is none): it replaces the
/// listing, so neither a manifest nor container mode's rows go with it.
fn catalog(s: &MountSettings, check: &Check) -> Result<Option<PathBuf>, ConfigError> {
    let catalog = s.catalog.clone().filter(|p| !p.as_os_str().is_empty());
    if catalog.is_some() && (s.manifest.is_some() || s.hdf5_container) {
        let other = if s.manifest.is_some() {
            "a manifest (manifest): both replace the listing; give one"
        } else {
            "HDF5 container mode, which reads the containers' rows, not a catalog"
        };
        return Err(check.invalid(
            "catalog",
            format!("a catalog file cannot be combined with {other}"),
        ));
    }
    Ok(catalog)
}

/// Refuses HDF5 settings in a build without the `hdf5` feature, here, before anything is
/// mounted or staged, naming the setting.
fn check_hdf5_built(s: &MountSettings, check: &Check) -> Result<(), ConfigError> {
    if metfs_prefetcher::hdf5::AVAILABLE {
        return Ok(());
    }
    let asked = if s.hdf5_container {
        Some("hdf5_container")
    } else if s.label_hdf5.is_some() {
        Some("label_hdf5")
    } else {
        None
    };
    match asked {
        Some(key) => Err(check.invalid(
            key,
            "this metfs was built without the `hdf5` feature; rebuild it with the default \
             features to use HDF5",
        )),
        None => Ok(()),
    }
}

/// A POSIX source as an absolute path (a URL stays as given).
fn absolute_source(source: String) -> String {
    if source.contains("://") {
        return source;
    }
    std::path::absolute(&source)
        .map(|p| p.display().to_string())
        .unwrap_or(source)
}

fn default_history() -> PathBuf {
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("metfs").join("rf-history.json")
}
