//! The source side of a mount: the capacity tier named by the source URL, and the catalog of
//! its samples (a listing, a manifest, a catalog file, or HDF5 containers), reused from the
//! cache while the source is unchanged. `metfs plan` uses these too; `file` makes and reads
//! catalog files (`metfs catalog`, `--catalog`), from which a mount never lists the tier.

use crate::config::MountConfig;
use crate::daemon::DaemonError;
use metfs_plan::planner::Strategy;
use metfs_plan::size::format_bytes;
use metfs_prefetcher::hdf5::Containers;
use metfs_tier::catalog::Catalog;
use metfs_tier::{CapacityTier, PosixTier};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

mod file;

pub use file::{make_catalog_file, mountable_catalog_file, MadeCatalog};

/// Opens the capacity tier named by a source URL.
pub fn open_tier(
    source: &str,
    s3: &metfs_tier::s3::S3Config,
    timeout_secs: u64,
) -> Result<Arc<dyn CapacityTier>, DaemonError> {
    if source.starts_with("s3://") {
        return Ok(Arc::new(metfs_tier::s3::S3Tier::new(source, s3.clone())?));
    }
    if source.contains("://") {
        return Err(DaemonError::Setup(format!(
            "source {source}: unknown scheme; use a directory or s3://bucket/prefix"
        )));
    }
    Ok(Arc::new(
        PosixTier::new(Path::new(source))?.with_timeout(timeout_secs),
    ))
}

pub(super) fn needs_labels(s: Strategy) -> bool {
    s == Strategy::Stratified
}

/// Builds (or reuses) the catalog of `tier`, saved at `path`.
pub async fn load_catalog(
    tier: &dyn CapacityTier,
    path: &Path,
    cfg: &MountConfig,
) -> Result<(Catalog, bool, Option<Arc<Containers>>), DaemonError> {
    if cfg.hdf5_container {
        if cfg.source.contains("://") {
            return Err(DaemonError::Setup(format!(
                "source {}: HDF5 container mode needs a POSIX source (rows are read as hyperslabs)",
                cfg.source
            )));
        }
        let listing = tier.list().await?;
        let files: Vec<String> = listing
            .entries
            .iter()
            .map(|e| e.path.clone())
            .filter(|p| {
                let l = p.to_ascii_lowercase();
                [".h5", ".hdf5", ".hdf", ".he5"]
                    .iter()
                    .any(|x| l.ends_with(x))
            })
            .collect();
        if files.is_empty() {
            return Err(DaemonError::Setup(format!(
                "source {}: no HDF5 files (.h5, .hdf5, .hdf, .he5) for container mode",
                cfg.source
            )));
        }
        let root = PathBuf::from(&cfg.source);
        let datasets = cfg.hdf5_datasets.clone();
        let label = cfg.label_dataset.clone();
        let c = tokio::task::spawn_blocking(move || {
            metfs_prefetcher::hdf5::open_containers(
                &root,
                &files,
                datasets.as_deref(),
                label.as_deref(),
            )
        })
        .await
        .expect("HDF5 inspection panicked")
        .map_err(|e| DaemonError::Setup(e.to_string()))?;
        let cat = c
            .catalog(tier.url())
            .map_err(|e| DaemonError::Setup(e.to_string()))?;
        tracing::info!(
            containers = c.files().len(),
            rows = c.samples(),
            "HDF5 container mode"
        );
        return Ok((cat, false, Some(Arc::new(c))));
    }
    let (mut cat, reused, labelled) = match &cfg.catalog {
        Some(file) => {
            let (cat, labels) = file::load_catalog_file(tier, file, cfg).await?;
            // Its HDF5 labels were read when it was made, if it was made with these.
            let same = cfg.label_hdf5.as_deref().map(file::hdf5_labels_origin) == labels;
            (cat, false, same)
        }
        None => {
            let (cat, reused) = load_plain_catalog(tier, path, cfg).await?;
            let labelled = reused && cat.labels().is_some();
            (cat, reused, labelled)
        }
    };
    if cfg.label_hdf5.is_some() && !labelled {
        label_by_hdf5(&mut cat, cfg).await?;
    }
    Ok((cat, reused, None))
}

/// Labels every sample by `cfg.label_hdf5`, read from its HDF5 file.
async fn label_by_hdf5(cat: &mut Catalog, cfg: &MountConfig) -> Result<(), DaemonError> {
    let Some(name) = cfg.label_hdf5.clone() else {
        return Ok(());
    };
    let root = PathBuf::from(&cfg.source);
    let paths: Vec<String> = (0..cat.len() as u32).map(|i| cat.path(i)).collect();
    let labels = tokio::task::spawn_blocking(move || {
        metfs_prefetcher::hdf5::read_scalar_labels(&root, paths.into_iter(), &name)
    })
    .await
    .expect("HDF5 label reading panicked")
    .map_err(|e| DaemonError::Setup(e.to_string()))?;
    cat.set_labels(labels);
    Ok(())
}

pub(super) async fn load_plain_catalog(
    tier: &dyn CapacityTier,
    path: &Path,
    cfg: &MountConfig,
) -> Result<(Catalog, bool), DaemonError> {
    if let Some(manifest) = &cfg.manifest {
        return Ok((read_manifest(manifest, cfg)?, false));
    }
    if let Ok(saved) = Catalog::load(path) {
        if saved.source() == tier.url() && tier.catalog_is_current(&saved).await? {
            tracing::info!(samples = saved.len(), "reusing the saved catalog");
            return Ok((saved, true));
        }
    }
    Ok((list_catalog(tier, cfg).await?, false))
}

/// The catalog of a manifest, labelled as `cfg` asks.
fn read_manifest(manifest: &Path, cfg: &MountConfig) -> Result<Catalog, DaemonError> {
    // A manifest replaces the listing; reading it is cheap next to listing millions of
    // files on a parallel file system's metadata server.
    let t = Instant::now();
    // Counted first: a manifest too large for the node is refused with its numbers rather
    // than ending the daemon in an allocation halfway through.
    if let Ok((lines, bytes)) = super::memory::count_manifest(manifest) {
        super::memory::check_fits(
            &format!("manifest {}", manifest.display()),
            lines,
            bytes,
            cfg.memory_limit,
        )?;
    }
    let mut cat = metfs_prefetcher::manifest::load_catalog(manifest)
        .map_err(|e| DaemonError::Setup(e.to_string()))?;
    if cfg.label_from_dirs || (needs_labels(cfg.compose) && cat.labels().is_none()) {
        cat.label_by_first_dir();
    }
    tracing::info!(
        manifest = %manifest.display(),
        samples = cat.len(),
        bytes = %format_bytes(cat.total_bytes()),
        secs = t.elapsed().as_secs_f64(),
        "catalogue read from the manifest"
    );
    Ok(cat)
}

/// The catalog of a listing of `tier`, checked against the memory the daemon may use and
/// labelled as `cfg` asks.
async fn list_catalog(tier: &dyn CapacityTier, cfg: &MountConfig) -> Result<Catalog, DaemonError> {
    let t = Instant::now();
    // Listed straight into the catalog: a POSIX source's entries are never held as a list.
    let listed = tier.catalog().await?;
    for (p, why) in &listed.skipped {
        tracing::warn!(path = %p, reason = %why, "not served");
    }
    let mut cat = listed.catalog;
    check_catalog_fits(&cat, cfg)?;
    if cfg.label_from_dirs || (needs_labels(cfg.compose) && cat.labels().is_none()) {
        cat.label_by_first_dir();
    }
    tracing::info!(
        samples = cat.len(),
        bytes = %format_bytes(cat.total_bytes()),
        secs = t.elapsed().as_secs_f64(),
        "catalogued the source"
    );
    Ok(cat)
}

/// The catalog takes a fraction of what the plan and views will: checked before those are
/// built.
fn check_catalog_fits(cat: &Catalog, cfg: &MountConfig) -> Result<(), DaemonError> {
    super::memory::check_fits(
        &format!("source {}", cfg.source),
        cat.len() as u64,
        (0..cat.len() as u32)
            .map(|i| {
                let (d, n) = cat.dir_and_name(i);
                (d.len() + usize::from(!d.is_empty()) + n.len()) as u64
            })
            .sum(),
        cfg.memory_limit,
    )?;
    Ok(())
}
